//! Device meshes: the axes (a type) and their sizes (a value), device ids, replica groups.

use std::fmt;
use std::marker::PhantomData;

use crate::axis::MeshAxis;
pub use crate::axis::{HasAxis, MeshShape};
use crate::error::CollectiveError;

/// A device mesh: the axes of `M` with a size each. Device ids are row-major over the axes
/// (the last axis varies fastest): on a `data` x `context` mesh of 2 x 4, device 6 is
/// `data` 1, `context` 2.
pub struct Mesh<M> {
    sizes: Vec<usize>,
    _mesh: PhantomData<M>,
}

impl<M> Clone for Mesh<M> {
    fn clone(&self) -> Self {
        Mesh {
            sizes: self.sizes.clone(),
            _mesh: PhantomData,
        }
    }
}

impl<M> PartialEq for Mesh<M> {
    fn eq(&self, other: &Self) -> bool {
        self.sizes == other.sizes
    }
}

impl<M> Eq for Mesh<M> {}

impl<M: MeshShape> fmt::Debug for Mesh<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mesh{self}")
    }
}

impl<M: MeshShape> fmt::Display for Mesh<M> {
    /// `{data: 2, context: 4}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (name, size)) in M::AXES.iter().zip(&self.sizes).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name}: {size}")?;
        }
        f.write_str("}")
    }
}

impl<M: MeshShape> Mesh<M> {
    /// A mesh with one size per axis of `M`, major to minor.
    ///
    /// Fails if the number of sizes is not the number of axes, a size is 0, two axes share a
    /// name, or the device count does not fit a partition count (`u32`).
    pub fn new(sizes: impl AsRef<[usize]>) -> Result<Self, CollectiveError> {
        let sizes = sizes.as_ref().to_vec();
        let mesh_error = |reason: String| CollectiveError::Mesh { reason };
        if sizes.len() != M::AXES.len() {
            return Err(mesh_error(format!(
                "the mesh has {} axes {:?}, but {} sizes were given ({sizes:?})",
                M::AXES.len(),
                M::AXES,
                sizes.len()
            )));
        }
        for (name, &size) in M::AXES.iter().zip(&sizes) {
            if size == 0 {
                return Err(mesh_error(format!("axis `{name}` has size 0")));
            }
        }
        for (i, a) in M::AXES.iter().enumerate() {
            if M::AXES[..i].contains(a) {
                return Err(mesh_error(format!(
                    "two axes are named `{a}`; axis names must be distinct"
                )));
            }
        }
        let total = sizes
            .iter()
            .try_fold(1usize, |acc, &s| acc.checked_mul(s))
            .filter(|&n| u32::try_from(n).is_ok())
            .ok_or_else(|| mesh_error(format!("{sizes:?} is too many devices")))?;
        debug_assert!(total >= 1);
        Ok(Mesh {
            sizes,
            _mesh: PhantomData,
        })
    }

    /// The axis names, major to minor.
    pub fn axis_names(&self) -> &'static [&'static str] {
        M::AXES
    }

    /// The axis sizes, major to minor.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Number of devices (the product of the sizes).
    pub fn num_devices(&self) -> usize {
        self.sizes.iter().product()
    }

    /// The size of axis `A`.
    pub fn axis_size<A: MeshAxis>(&self) -> usize
    where
        M: HasAxis<A>,
    {
        self.sizes[<M as HasAxis<A>>::INDEX]
    }

    /// Axis `A` on this mesh: its size and replica groups.
    pub fn axis<A: MeshAxis>(&self) -> AxisGroups
    where
        M: HasAxis<A>,
    {
        self.groups_of(<M as HasAxis<A>>::INDEX)
    }

    /// The axis called `name` on this mesh (the untyped form of [`Mesh::axis`]).
    pub fn axis_by_name(&self, name: &str) -> Result<AxisGroups, CollectiveError> {
        let index =
            M::AXES
                .iter()
                .position(|a| *a == name)
                .ok_or_else(|| CollectiveError::Mesh {
                    reason: format!("the mesh {self} has no axis `{name}`"),
                })?;
        Ok(self.groups_of(index))
    }

    /// Index of an axis name, if the mesh has it.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        M::AXES.iter().position(|a| *a == name)
    }

    /// Mesh coordinates of a device id (row-major), or `None` if the id is out of range.
    pub fn coords(&self, device: usize) -> Option<Vec<usize>> {
        if device >= self.num_devices() {
            return None;
        }
        let mut coords = vec![0; self.sizes.len()];
        let mut rest = device;
        for (c, &s) in coords.iter_mut().zip(&self.sizes).rev() {
            *c = rest % s;
            rest /= s;
        }
        Some(coords)
    }

    /// The device id of mesh coordinates, or `None` if they do not fit the mesh.
    pub fn device(&self, coords: &[usize]) -> Option<usize> {
        if coords.len() != self.sizes.len() {
            return None;
        }
        let mut id = 0;
        for (&c, &s) in coords.iter().zip(&self.sizes) {
            if c >= s {
                return None;
            }
            id = id * s + c;
        }
        Some(id)
    }

    /// Distance in device ids between neighbours along axis `index`.
    pub(crate) fn stride(&self, index: usize) -> usize {
        self.sizes[index + 1..].iter().product()
    }

    fn groups_of(&self, index: usize) -> AxisGroups {
        let size = self.sizes[index];
        let stride = self.stride(index);
        let groups = (0..self.num_devices())
            .filter(|&d| (d / stride) % size == 0)
            .map(|base| (0..size).map(|j| (base + j * stride) as i64).collect())
            .collect();
        AxisGroups {
            name: M::AXES[index],
            index,
            size,
            stride,
            groups,
        }
    }
}

/// A mesh axis resolved on a concrete [`Mesh`]: what a collective over that axis needs.
///
/// `groups` are the replica groups (device ids): one group per combination of the other
/// axes' coordinates, in row-major order, each listing the devices along the axis in order.
/// On a `data` x `context` mesh of 2 x 4, `context` has groups `[[0, 1, 2, 3], [4, 5, 6, 7]]`
/// and `data` has `[[0, 4], [1, 5], [2, 6], [3, 7]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisGroups {
    name: &'static str,
    index: usize,
    size: usize,
    stride: usize,
    groups: Vec<Vec<i64>>,
}

impl AxisGroups {
    /// The axis name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Position of the axis in the mesh.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of devices along the axis (the size of each group).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Distance in device ids between neighbours along the axis.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The replica groups (device ids).
    pub fn groups(&self) -> &[Vec<i64>] {
        &self.groups
    }

    /// Number of devices of the whole mesh.
    pub fn num_devices(&self) -> usize {
        self.groups.len() * self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axes::{Context, Data, Fsdp};

    crate::mesh!(DataContext = [Data, Context]);
    crate::mesh!(Three = [Data, Fsdp, Context]);

    #[test]
    fn groups_follow_row_major_device_ids() {
        let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
        assert_eq!(
            mesh.axis::<Context>().groups(),
            &[vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(
            mesh.axis::<Data>().groups(),
            &[vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        assert_eq!(mesh.axis_by_name("data").unwrap(), mesh.axis::<Data>());
        assert_eq!(mesh.to_string(), "{data: 2, context: 4}");
    }

    #[test]
    fn three_axes() {
        let mesh = Mesh::<Three>::new([2, 3, 2]).unwrap();
        let fsdp = mesh.axis::<Fsdp>();
        assert_eq!(fsdp.stride(), 2);
        assert_eq!(
            fsdp.groups(),
            &[vec![0, 2, 4], vec![1, 3, 5], vec![6, 8, 10], vec![7, 9, 11]]
        );
        for d in 0..12 {
            let c = mesh.coords(d).unwrap();
            assert_eq!(mesh.device(&c), Some(d));
        }
        assert_eq!(mesh.coords(7), Some(vec![1, 0, 1]));
        assert_eq!(mesh.coords(12), None);
        assert_eq!(mesh.device(&[0, 3, 0]), None);
    }

    #[test]
    fn invalid_meshes_are_errors() {
        let e = Mesh::<DataContext>::new([2]).unwrap_err().to_string();
        assert!(e.contains("2 axes"), "{e}");
        let e = Mesh::<DataContext>::new([2, 0]).unwrap_err().to_string();
        assert!(e.contains("`context` has size 0"), "{e}");
        let e = Mesh::<DataContext>::new([usize::MAX, 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("too many devices"), "{e}");
        assert!(Mesh::<DataContext>::new([2, 2])
            .unwrap()
            .axis_by_name("fsdp")
            .is_err());
    }
}
