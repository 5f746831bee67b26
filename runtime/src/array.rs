//! The one conversion between tessera's host arrays ([`HostArray`], typed, shared by every
//! crate) and PJRT host buffers ([`HostBuffer`], raw little-endian bytes of any element type a
//! plugin returns), and the one mapping between [`DType`] and [`ElementType`].
//!
//! Two types because they do different jobs: a [`HostArray`] holds the element types tessera
//! computes with, typed, for kernels and references; a [`HostBuffer`] is what crosses the C
//! API, including element types tessera never computes with (`f64`, `u32`, ...) that a
//! plugin may still return.

use tessera_array::{ArrayData, DType, HostArray};

use crate::client::LoadedExecutable;
use crate::element::{ElementType, HostBuffer};
use crate::error::{Error, Result};

impl From<DType> for ElementType {
    fn from(dtype: DType) -> Self {
        match dtype {
            DType::F32 => ElementType::F32,
            DType::BF16 => ElementType::BF16,
            DType::I32 => ElementType::I32,
            DType::I8 => ElementType::I8,
            DType::Bool => ElementType::Pred,
        }
    }
}

impl ElementType {
    /// The tessera dtype of this element type, where tessera has one.
    pub fn dtype(self) -> Option<DType> {
        Some(match self {
            ElementType::F32 => DType::F32,
            ElementType::BF16 => DType::BF16,
            ElementType::I32 => DType::I32,
            ElementType::I8 => DType::I8,
            ElementType::Pred => DType::Bool,
            _ => return None,
        })
    }
}

impl HostBuffer {
    /// A host array's elements as a buffer of the matching element type.
    pub fn from_array(a: &HostArray) -> Result<Self> {
        let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
        match a.data() {
            ArrayData::F32(v) => HostBuffer::from_slice(&dims, v),
            ArrayData::BF16(v) => HostBuffer::from_slice(&dims, v),
            ArrayData::I32(v) => HostBuffer::from_slice(&dims, v),
            ArrayData::I8(v) => HostBuffer::from_slice(&dims, v),
            ArrayData::Bool(v) => HostBuffer::from_slice(&dims, v),
        }
    }

    /// The buffer as a host array; fails for element types tessera does not compute with.
    pub fn to_array(&self) -> Result<HostArray> {
        let dtype = self.element_type().dtype().ok_or(Error::NotAnArrayType {
            element_type: self.element_type(),
        })?;
        let data = match dtype {
            DType::F32 => ArrayData::F32(self.to_vec()?),
            DType::BF16 => ArrayData::BF16(self.to_vec()?),
            DType::I32 => ArrayData::I32(self.to_vec()?),
            DType::I8 => ArrayData::I8(self.to_vec()?),
            DType::Bool => ArrayData::Bool(self.to_vec()?),
        };
        let shape: Vec<usize> = self.dims().iter().map(|&d| d as usize).collect();
        HostArray::new(shape, data).map_err(|_| Error::InvalidDims {
            dims: self.dims().to_vec(),
            reason: "the buffer's element count does not match its dims",
        })
    }
}

impl LoadedExecutable {
    /// [`execute_host`](LoadedExecutable::execute_host) on host arrays: copies list `i` to
    /// device `i`, runs, and returns every device's outputs as arrays.
    pub fn execute_arrays<L: AsRef<[HostArray]>>(
        &self,
        argument_lists: &[L],
    ) -> Result<Vec<Vec<HostArray>>> {
        let buffers = argument_lists
            .iter()
            .map(|list| list.as_ref().iter().map(HostBuffer::from_array).collect())
            .collect::<Result<Vec<Vec<_>>>>()?;
        self.execute_host(&buffers)?
            .iter()
            .map(|list| list.iter().map(HostBuffer::to_array).collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_round_trip_through_buffers() {
        for dtype in DType::ALL {
            let a = HostArray::from_f64(dtype, [2, 3], &[0.0, 1.0, -2.0, 3.0, 0.0, 1.0]).unwrap();
            let b = HostBuffer::from_array(&a).unwrap();
            assert_eq!(b.element_type(), ElementType::from(dtype));
            assert_eq!(b.element_type().dtype(), Some(dtype));
            assert_eq!(b.to_array().unwrap(), a);
        }
    }

    #[test]
    fn element_types_without_a_dtype_are_refused() {
        let b = HostBuffer::from_slice(&[2], &[1.0f64, 2.0]).unwrap();
        let e = b.to_array().unwrap_err().to_string();
        assert!(e.contains("f64"), "{e}");
    }
}
