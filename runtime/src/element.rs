//! Element types and host-side buffers.

use std::fmt;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::ffi;

/// Element type of a buffer (the subset of `PJRT_Buffer_Type` tessera moves between host and
/// device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElementType {
    /// Boolean (`i1` in StableHLO), one byte per element, 0 or 1.
    Pred,
    /// Signed 8-bit integer.
    I8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl ElementType {
    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            Self::Pred | Self::I8 | Self::U8 => 1,
            Self::F16 | Self::BF16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::F64 => 8,
        }
    }

    /// The StableHLO spelling of the type (`f32`, `bf16`, `i32`, `i8`, `i1`, ...).
    pub const fn mlir_name(self) -> &'static str {
        match self {
            Self::Pred => "i1",
            Self::I8 => "i8",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::U8 => "ui8",
            Self::U32 => "ui32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::F32 => "f32",
            Self::F64 => "f64",
        }
    }

    /// The raw `PJRT_Buffer_Type`.
    pub const fn to_raw(self) -> ffi::PJRT_Buffer_Type {
        match self {
            Self::Pred => ffi::PJRT_Buffer_Type_PRED,
            Self::I8 => ffi::PJRT_Buffer_Type_S8,
            Self::I32 => ffi::PJRT_Buffer_Type_S32,
            Self::I64 => ffi::PJRT_Buffer_Type_S64,
            Self::U8 => ffi::PJRT_Buffer_Type_U8,
            Self::U32 => ffi::PJRT_Buffer_Type_U32,
            Self::F16 => ffi::PJRT_Buffer_Type_F16,
            Self::BF16 => ffi::PJRT_Buffer_Type_BF16,
            Self::F32 => ffi::PJRT_Buffer_Type_F32,
            Self::F64 => ffi::PJRT_Buffer_Type_F64,
        }
    }

    /// Maps a raw `PJRT_Buffer_Type`.
    pub fn from_raw(raw: ffi::PJRT_Buffer_Type) -> Result<Self> {
        Ok(match raw {
            ffi::PJRT_Buffer_Type_PRED => Self::Pred,
            ffi::PJRT_Buffer_Type_S8 => Self::I8,
            ffi::PJRT_Buffer_Type_S32 => Self::I32,
            ffi::PJRT_Buffer_Type_S64 => Self::I64,
            ffi::PJRT_Buffer_Type_U8 => Self::U8,
            ffi::PJRT_Buffer_Type_U32 => Self::U32,
            ffi::PJRT_Buffer_Type_F16 => Self::F16,
            ffi::PJRT_Buffer_Type_BF16 => Self::BF16,
            ffi::PJRT_Buffer_Type_F32 => Self::F32,
            ffi::PJRT_Buffer_Type_F64 => Self::F64,
            raw => return Err(Error::UnsupportedElementType { raw }),
        })
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// A Rust type that is the host representation of an [`ElementType`]. Conversions go through
/// little-endian bytes (the layout PJRT uses on every supported host), with no `unsafe`.
pub trait NativeType: Copy + 'static {
    /// The element type this Rust type represents.
    const ELEMENT_TYPE: ElementType;
    /// Appends the element's bytes.
    fn write_bytes(self, out: &mut Vec<u8>);
    /// Reads one element from exactly `size_in_bytes` bytes.
    fn read_bytes(bytes: &[u8]) -> Self;
}

macro_rules! native_number {
    ($($t:ty => $e:ident),* $(,)?) => {
        $(
            impl NativeType for $t {
                const ELEMENT_TYPE: ElementType = ElementType::$e;
                fn write_bytes(self, out: &mut Vec<u8>) {
                    out.extend_from_slice(&self.to_le_bytes());
                }
                fn read_bytes(bytes: &[u8]) -> Self {
                    let mut raw = [0u8; core::mem::size_of::<$t>()];
                    raw.copy_from_slice(bytes);
                    <$t>::from_le_bytes(raw)
                }
            }
        )*
    };
}

native_number!(
    i8 => I8, i32 => I32, i64 => I64, u8 => U8, u32 => U32,
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
);

impl NativeType for bool {
    const ELEMENT_TYPE: ElementType = ElementType::Pred;
    fn write_bytes(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_bytes(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// Number of elements of `dims`, checked: no negative dimension, no overflow.
pub(crate) fn element_count(dims: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| Error::InvalidDims {
            dims: dims.to_vec(),
            reason: "a dimension is negative",
        })?;
        n = n.checked_mul(d).ok_or_else(|| Error::InvalidDims {
            dims: dims.to_vec(),
            reason: "the element count overflows",
        })?;
    }
    Ok(n)
}

/// Bytes needed by a dense array of `element_type` with `dims`.
pub(crate) fn byte_size(element_type: ElementType, dims: &[i64]) -> Result<usize> {
    element_count(dims)?
        .checked_mul(element_type.size_in_bytes())
        .ok_or_else(|| Error::InvalidDims {
            dims: dims.to_vec(),
            reason: "the byte size overflows",
        })
}

/// A dense, row-major (major-to-minor) array in host memory: element type, dimensions and
/// little-endian bytes. What goes to a device and what comes back from one.
#[derive(Clone, PartialEq, Eq)]
pub struct HostBuffer {
    element_type: ElementType,
    dims: Vec<i64>,
    data: Vec<u8>,
}

impl HostBuffer {
    /// Wraps raw bytes; fails with [`Error::BufferSize`] if their length does not match the
    /// shape.
    pub fn from_bytes(element_type: ElementType, dims: &[i64], data: Vec<u8>) -> Result<Self> {
        let expected = byte_size(element_type, dims)?;
        if data.len() != expected {
            return Err(Error::BufferSize {
                element_type,
                dims: dims.to_vec(),
                expected_bytes: expected,
                actual_bytes: data.len(),
            });
        }
        Ok(Self {
            element_type,
            dims: dims.to_vec(),
            data,
        })
    }

    /// Copies typed elements; fails with [`Error::BufferSize`] if `data.len()` is not the
    /// product of `dims`.
    pub fn from_slice<T: NativeType>(dims: &[i64], data: &[T]) -> Result<Self> {
        let count = element_count(dims)?;
        if data.len() != count {
            let size = T::ELEMENT_TYPE.size_in_bytes();
            return Err(Error::BufferSize {
                element_type: T::ELEMENT_TYPE,
                dims: dims.to_vec(),
                expected_bytes: count.saturating_mul(size),
                actual_bytes: data.len().saturating_mul(size),
            });
        }
        let mut bytes = Vec::with_capacity(count * T::ELEMENT_TYPE.size_in_bytes());
        for &x in data {
            x.write_bytes(&mut bytes);
        }
        Ok(Self {
            element_type: T::ELEMENT_TYPE,
            dims: dims.to_vec(),
            data: bytes,
        })
    }

    /// A rank-0 array.
    pub fn scalar<T: NativeType>(value: T) -> Self {
        let mut bytes = Vec::new();
        value.write_bytes(&mut bytes);
        Self {
            element_type: T::ELEMENT_TYPE,
            dims: Vec::new(),
            data: bytes,
        }
    }

    /// Element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Dimensions, major to minor.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.data.len() / self.element_type.size_in_bytes()
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// Consumes the buffer, returning its bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    /// Copies the elements out as `T`; fails with [`Error::ElementTypeMismatch`] if `T` is not
    /// the buffer's element type.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        if T::ELEMENT_TYPE != self.element_type {
            return Err(Error::ElementTypeMismatch {
                expected: T::ELEMENT_TYPE,
                actual: self.element_type,
            });
        }
        Ok(self
            .data
            .chunks_exact(self.element_type.size_in_bytes())
            .map(T::read_bytes)
            .collect())
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("element_type", &self.element_type)
            .field("dims", &self.dims)
            .field("bytes", &self.data.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_type() {
        let b = HostBuffer::from_slice(&[2], &[1.5f32, -2.0]).unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
        let b =
            HostBuffer::from_slice(&[3], &[bf16::from_f32(1.0), bf16::ZERO, bf16::MAX]).unwrap();
        assert_eq!(b.as_bytes().len(), 6);
        assert_eq!(b.to_vec::<bf16>().unwrap()[2], bf16::MAX);
        let b = HostBuffer::from_slice(&[2, 1], &[true, false]).unwrap();
        assert_eq!(b.as_bytes(), &[1, 0]);
        assert_eq!(b.to_vec::<bool>().unwrap(), vec![true, false]);
        let b = HostBuffer::from_slice(&[1], &[-7i8]).unwrap();
        assert_eq!(b.to_vec::<i8>().unwrap(), vec![-7]);
        let b = HostBuffer::scalar(42i32);
        assert_eq!(b.dims(), &[] as &[i64]);
        assert_eq!(b.to_vec::<i32>().unwrap(), vec![42]);
    }

    #[test]
    fn shape_errors_are_results() {
        assert!(matches!(
            HostBuffer::from_slice(&[2, 2], &[1.0f32; 3]),
            Err(Error::BufferSize {
                expected_bytes: 16,
                actual_bytes: 12,
                ..
            })
        ));
        assert!(matches!(
            HostBuffer::from_bytes(ElementType::BF16, &[3], vec![0; 5]),
            Err(Error::BufferSize {
                expected_bytes: 6,
                ..
            })
        ));
        assert!(matches!(
            HostBuffer::from_slice(&[-1], &[0i32; 0]),
            Err(Error::InvalidDims { .. })
        ));
        assert!(matches!(
            HostBuffer::from_bytes(ElementType::F64, &[i64::MAX, i64::MAX], vec![]),
            Err(Error::InvalidDims { .. })
        ));
        let b = HostBuffer::from_slice(&[1], &[1i32]).unwrap();
        assert!(matches!(
            b.to_vec::<f32>(),
            Err(Error::ElementTypeMismatch { .. })
        ));
    }

    #[test]
    fn raw_round_trip() {
        for t in [
            ElementType::Pred,
            ElementType::I8,
            ElementType::I32,
            ElementType::I64,
            ElementType::U8,
            ElementType::U32,
            ElementType::F16,
            ElementType::BF16,
            ElementType::F32,
            ElementType::F64,
        ] {
            assert_eq!(ElementType::from_raw(t.to_raw()).unwrap(), t);
        }
        assert!(matches!(
            ElementType::from_raw(14),
            Err(Error::UnsupportedElementType { .. })
        ));
    }
}
