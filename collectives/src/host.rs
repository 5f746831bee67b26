//! Host-side sharding: cut a global array into the per-device shards a sharding describes,
//! and assemble shards back (checking that replicas agree). Exact (byte copies), for any
//! element type.
//!
//! Semantics (JAX's `NamedSharding`): on a mesh with device ids row-major over the axes, the
//! device at coordinates `c` holds, for each dim split over axis `a`, block `c[a]` of that dim
//! (the dim cut into `size(a)` equal contiguous blocks), and the whole of every replicated dim.

use tessera_runtime::{ElementType, HostBuffer};

use crate::error::CollectiveError;
use crate::layout::{DimSpec, PartitionSpec};
use crate::mesh::{Mesh, MeshShape};
use crate::spmd::TensorLayout;

/// Device `device`'s shard of `global` under `spec`.
pub fn shard_of<M: MeshShape>(
    global: &HostBuffer,
    spec: &PartitionSpec,
    mesh: &Mesh<M>,
    device: usize,
) -> Result<HostBuffer, CollectiveError> {
    let layout = TensorLayout {
        spec: spec.clone(),
        varying: None,
    };
    let local = layout.local_dims(mesh, global.dims(), "shard")?;
    let coords = mesh.coords(device).ok_or_else(|| {
        CollectiveError::operand(
            "shard",
            format!(
                "device {device} is out of range: the mesh {mesh} has {} devices",
                mesh.num_devices()
            ),
        )
    })?;
    let start = block_start(spec, mesh, &coords, &local);
    let elem = global.element_type().size_in_bytes();
    let mut out = vec![0u8; byte_len(&local, elem)];
    let zero = vec![0; local.len()];
    copy_region(
        global.as_bytes(),
        Corner {
            dims: global.dims(),
            start: &start,
        },
        &mut out,
        Corner {
            dims: &local,
            start: &zero,
        },
        &local,
        elem,
    );
    Ok(HostBuffer::from_bytes(global.element_type(), &local, out)?)
}

/// Every device's shard of `global` under `spec`, in device-id order: the per-device inputs
/// of a program argument sharded as `spec`.
pub fn shard<M: MeshShape>(
    global: &HostBuffer,
    spec: &PartitionSpec,
    mesh: &Mesh<M>,
) -> Result<Vec<HostBuffer>, CollectiveError> {
    (0..mesh.num_devices())
        .map(|d| shard_of(global, spec, mesh, d))
        .collect()
}

/// Assembles the global array from every device's shard under `spec` (the inverse of
/// [`shard`]). Fails if the shard count is not the mesh's device count, if shards differ in
/// shape or element type, or if two devices that should hold the same replica hold
/// different data.
pub fn unshard<M: MeshShape>(
    shards: &[HostBuffer],
    spec: &PartitionSpec,
    mesh: &Mesh<M>,
) -> Result<HostBuffer, CollectiveError> {
    if shards.len() != mesh.num_devices() {
        return Err(CollectiveError::DeviceCount {
            context: "unshard: shards".into(),
            expected: mesh.num_devices(),
            actual: shards.len(),
        });
    }
    let first = &shards[0];
    let (element_type, local): (ElementType, Vec<i64>) =
        (first.element_type(), first.dims().to_vec());
    for (d, s) in shards.iter().enumerate() {
        if s.element_type() != element_type || s.dims() != local.as_slice() {
            return Err(CollectiveError::operand(
                "unshard",
                format!(
                    "device {d} holds {:?} {:?}, device 0 holds {element_type:?} {local:?}",
                    s.element_type(),
                    s.dims()
                ),
            ));
        }
    }
    let layout = TensorLayout {
        spec: spec.clone(),
        varying: None,
    };
    layout.validate(mesh, local.len(), "unshard")?;
    let global = layout.global_dims(mesh, &local)?;
    let elem = element_type.size_in_bytes();
    let mut out = vec![0u8; byte_len(&global, elem)];
    // Axes no dim is split over: devices that differ only along them hold replicas.
    let used: Vec<bool> = (0..mesh.sizes().len())
        .map(|i| {
            spec.dims()
                .iter()
                .any(|d| matches!(d, DimSpec::Split(a) if *a == mesh.axis_names()[i]))
        })
        .collect();
    let reference = |coords: &[usize]| -> usize {
        let c: Vec<usize> = coords
            .iter()
            .zip(&used)
            .map(|(&c, &u)| if u { c } else { 0 })
            .collect();
        mesh.device(&c).unwrap_or(0)
    };
    for (d, s) in shards.iter().enumerate() {
        let coords = mesh.coords(d).unwrap_or_default();
        if reference(&coords) == d {
            let start = block_start(spec, mesh, &coords, &local);
            let zero = vec![0; local.len()];
            let from = Corner {
                dims: &local,
                start: &zero,
            };
            let to = Corner {
                dims: &global,
                start: &start,
            };
            copy_region(s.as_bytes(), from, &mut out, to, &local, elem);
        }
    }
    let assembled = HostBuffer::from_bytes(element_type, &global, out)?;
    for (d, s) in shards.iter().enumerate() {
        let coords = mesh.coords(d).unwrap_or_default();
        let r = reference(&coords);
        if r != d && shards[r].as_bytes() != s.as_bytes() {
            return Err(CollectiveError::ReplicaMismatch {
                context: "unshard".into(),
                spec: spec.to_string(),
                device: d,
                reference: r,
            });
        }
    }
    Ok(assembled)
}

/// Where a device's block starts in the global array.
fn block_start<M: MeshShape>(
    spec: &PartitionSpec,
    mesh: &Mesh<M>,
    coords: &[usize],
    local: &[i64],
) -> Vec<i64> {
    spec.dims()
        .iter()
        .zip(local)
        .map(|(d, &l)| match d {
            DimSpec::Replicated => 0,
            DimSpec::Split(a) => {
                let i = mesh.index_of(a).map_or(0, |i| coords[i]);
                i as i64 * l
            }
        })
        .collect()
}

fn byte_len(dims: &[i64], elem: usize) -> usize {
    dims.iter().map(|&d| d.max(0) as usize).product::<usize>() * elem
}

/// Row-major element strides of `dims`.
fn strides(dims: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as usize;
    }
    s
}

/// An array's shape and the corner of a block in it.
#[derive(Clone, Copy)]
struct Corner<'a> {
    dims: &'a [i64],
    start: &'a [i64],
}

/// Copies a `block`-shaped region from `src` at `src_start` to `dst` at `dst_start`, one
/// contiguous row (last dim) at a time.
fn copy_region(
    src: &[u8],
    from: Corner<'_>,
    dst: &mut [u8],
    to: Corner<'_>,
    block: &[i64],
    elem: usize,
) {
    let rank = block.len();
    if rank == 0 {
        dst[..elem].copy_from_slice(&src[..elem]);
        return;
    }
    if block.iter().any(|&b| b <= 0) {
        return;
    }
    let (ss, ds) = (strides(from.dims), strides(to.dims));
    let row = block[rank - 1] as usize * elem;
    let mut index = vec![0i64; rank - 1];
    loop {
        let offset = |start: &[i64], strides: &[usize]| -> usize {
            let mut o = start[rank - 1] as usize * strides[rank - 1];
            for k in 0..rank - 1 {
                o += (start[k] + index[k]) as usize * strides[k];
            }
            o * elem
        };
        let (so, dof) = (offset(from.start, &ss), offset(to.start, &ds));
        dst[dof..dof + row].copy_from_slice(&src[so..so + row]);
        // Next row: increment the multi-index over the leading dims.
        let mut k = rank - 1;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            index[k] += 1;
            if index[k] < block[k] {
                break;
            }
            index[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axes::{Context, Data};

    crate::mesh!(Dc = [Data, Context]);

    fn iota(dims: &[i64]) -> HostBuffer {
        let n: i64 = dims.iter().product();
        let v: Vec<i32> = (0..n as i32).collect();
        HostBuffer::from_slice(dims, &v).unwrap()
    }

    #[test]
    fn shards_follow_the_spec() {
        let mesh = Mesh::<Dc>::new([2, 3]).unwrap();
        // [4, 6] split: dim 0 over data, dim 1 over context.
        let g = iota(&[4, 6]);
        let spec = PartitionSpec(vec![DimSpec::Split("data"), DimSpec::Split("context")]);
        let shards = shard(&g, &spec, &mesh).unwrap();
        // Device 4 = data 1, context 1: rows 2..4, cols 2..4.
        assert_eq!(shards[4].dims(), &[2, 2]);
        assert_eq!(shards[4].to_vec::<i32>().unwrap(), vec![14, 15, 20, 21]);
        assert_eq!(unshard(&shards, &spec, &mesh).unwrap(), g);

        // Replicated over data, dim 1 over context.
        let spec = PartitionSpec(vec![DimSpec::Replicated, DimSpec::Split("context")]);
        let shards = shard(&g, &spec, &mesh).unwrap();
        assert_eq!(shards[2], shards[5]);
        assert_eq!(
            shards[2].to_vec::<i32>().unwrap(),
            vec![4, 5, 10, 11, 16, 17, 22, 23]
        );
        assert_eq!(unshard(&shards, &spec, &mesh).unwrap(), g);
    }

    #[test]
    fn unshard_rejects_disagreeing_replicas() {
        let mesh = Mesh::<Dc>::new([2, 2]).unwrap();
        let g = iota(&[2, 4]);
        let spec = PartitionSpec(vec![DimSpec::Replicated, DimSpec::Split("context")]);
        let mut shards = shard(&g, &spec, &mesh).unwrap();
        shards[3] = HostBuffer::from_slice(&[2, 2], &[0i32, 0, 0, 0]).unwrap();
        let e = unshard(&shards, &spec, &mesh).unwrap_err().to_string();
        assert!(e.contains("device 3 and device 1"), "{e}");
    }

    #[test]
    fn shard_checks_divisibility_and_scalars_work() {
        let mesh = Mesh::<Dc>::new([2, 4]).unwrap();
        let spec = PartitionSpec(vec![DimSpec::Split("context")]);
        let e = shard(&iota(&[6]), &spec, &mesh).unwrap_err().to_string();
        assert!(
            e.contains("dim 0 (size 6)") && e.contains("`context` (size 4)"),
            "{e}"
        );
        let s = HostBuffer::scalar(7i32);
        let shards = shard(&s, &PartitionSpec(vec![]), &mesh).unwrap();
        assert_eq!(shards.len(), 8);
        assert_eq!(unshard(&shards, &PartitionSpec(vec![]), &mesh).unwrap(), s);
    }
}
