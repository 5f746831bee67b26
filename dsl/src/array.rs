//! Host arrays: the inputs and outputs of kernels run on the host (interpreter, tests, CLI).

use half::bf16;

use crate::instantiate::ArgSpec;
use crate::ir::DType;

/// The elements of a [`HostArray`], row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayData {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I8(Vec<i8>),
    Bool(Vec<bool>),
}

impl ArrayData {
    pub fn len(&self) -> usize {
        match self {
            ArrayData::F32(v) => v.len(),
            ArrayData::BF16(v) => v.len(),
            ArrayData::I32(v) => v.len(),
            ArrayData::I8(v) => v.len(),
            ArrayData::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            ArrayData::F32(_) => DType::F32,
            ArrayData::BF16(_) => DType::BF16,
            ArrayData::I32(_) => DType::I32,
            ArrayData::I8(_) => DType::I8,
            ArrayData::Bool(_) => DType::Bool,
        }
    }
}

/// A shape that does not match the number of elements given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("shape {shape:?} holds {expected} elements but {actual} were given")]
pub struct ShapeError {
    pub shape: Vec<usize>,
    pub expected: usize,
    pub actual: usize,
}

/// A dense row-major array in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostArray {
    shape: Vec<usize>,
    data: ArrayData,
}

impl HostArray {
    pub fn new(shape: impl Into<Vec<usize>>, data: ArrayData) -> Result<Self, ShapeError> {
        let shape = shape.into();
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(ShapeError {
                shape,
                expected,
                actual: data.len(),
            });
        }
        Ok(HostArray { shape, data })
    }

    pub fn f32(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self, ShapeError> {
        Self::new(shape, ArrayData::F32(data))
    }

    pub fn bf16(shape: impl Into<Vec<usize>>, data: Vec<bf16>) -> Result<Self, ShapeError> {
        Self::new(shape, ArrayData::BF16(data))
    }

    pub fn i32(shape: impl Into<Vec<usize>>, data: Vec<i32>) -> Result<Self, ShapeError> {
        Self::new(shape, ArrayData::I32(data))
    }

    /// An array of `dtype` from f64 values, rounding/converting each (tests, references).
    pub fn from_f64(
        dtype: DType,
        shape: impl Into<Vec<usize>>,
        values: &[f64],
    ) -> Result<Self, ShapeError> {
        let data = match dtype {
            DType::F32 => ArrayData::F32(values.iter().map(|&v| v as f32).collect()),
            DType::BF16 => ArrayData::BF16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
            DType::I32 => ArrayData::I32(values.iter().map(|&v| v as i32).collect()),
            DType::I8 => ArrayData::I8(values.iter().map(|&v| v as i8).collect()),
            DType::Bool => ArrayData::Bool(values.iter().map(|&v| v != 0.0).collect()),
        };
        Self::new(shape, data)
    }

    /// Zeros (false for bool).
    pub fn zeros(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        let shape = shape.into();
        let n: usize = shape.iter().product();
        let data = match dtype {
            DType::F32 => ArrayData::F32(vec![0.0; n]),
            DType::BF16 => ArrayData::BF16(vec![bf16::ZERO; n]),
            DType::I32 => ArrayData::I32(vec![0; n]),
            DType::I8 => ArrayData::I8(vec![0; n]),
            DType::Bool => ArrayData::Bool(vec![false; n]),
        };
        HostArray { shape, data }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn data(&self) -> &ArrayData {
        &self.data
    }

    pub fn into_data(self) -> ArrayData {
        self.data
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The dtype and shape, as kernel instantiation wants them.
    pub fn spec(&self) -> ArgSpec {
        ArgSpec::new(self.dtype(), self.shape.clone())
    }

    /// Every element as f64 (exact for every dtype here).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            ArrayData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            ArrayData::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            ArrayData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            ArrayData::I8(v) => v.iter().map(|&x| x as f64).collect(),
            ArrayData::Bool(v) => v.iter().map(|&x| if x { 1.0 } else { 0.0 }).collect(),
        }
    }

    /// Every element as f32 (exact except for large i32).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.to_f64_vec().into_iter().map(|x| x as f32).collect()
    }
}
