//! Tensor types of StableHLO values.

use std::fmt;

use crate::{DType, HloError};

/// The type of a StableHLO value: a statically shaped tensor. Scalars are rank 0 (`dims` empty).
///
/// Displays as its MLIR spelling, e.g. `tensor<4x8xf32>` or `tensor<i32>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Dimension sizes, outermost first. Every size must be non-negative.
    pub dims: Vec<i64>,
    /// Element type.
    pub dtype: DType,
}

impl TensorType {
    /// A tensor type with the given dimensions and element type.
    pub fn new(dims: impl Into<Vec<i64>>, dtype: DType) -> Self {
        TensorType {
            dims: dims.into(),
            dtype,
        }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dims: Vec::new(),
            dtype,
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// True for rank-0 types.
    pub fn is_scalar(&self) -> bool {
        self.dims.is_empty()
    }

    /// Number of elements, or `None` if a dimension is negative or the product overflows `i64`.
    pub fn num_elements(&self) -> Option<i64> {
        self.dims.iter().try_fold(
            1i64,
            |acc, &d| if d < 0 { None } else { acc.checked_mul(d) },
        )
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dims: self.dims.clone(),
            dtype,
        }
    }

    /// `n` of this type stacked along a new leading dimension: `[n, dims...]`.
    pub fn stacked(&self, n: i64) -> Self {
        let mut dims = Vec::with_capacity(self.dims.len() + 1);
        dims.push(n);
        dims.extend_from_slice(&self.dims);
        TensorType {
            dims,
            dtype: self.dtype,
        }
    }

    /// Checks that every dimension is non-negative and the element count fits in `i64`.
    pub(crate) fn validate(&self, op: &'static str, what: &str) -> Result<(), HloError> {
        if self.num_elements().is_none() {
            return Err(HloError::Shape {
                op,
                reason: format!(
                    "{what} has invalid dimensions {:?} (negative or too many elements)",
                    self.dims
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype.mlir_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_counts() {
        let t = TensorType::new([4, 8], DType::F32);
        assert_eq!(t.to_string(), "tensor<4x8xf32>");
        assert_eq!(t.num_elements(), Some(32));
        assert_eq!(TensorType::scalar(DType::Bool).to_string(), "tensor<i1>");
        assert_eq!(
            TensorType::new([0, 3], DType::BF16).to_string(),
            "tensor<0x3xbf16>"
        );
        assert_eq!(TensorType::new([-1], DType::I8).num_elements(), None);
        assert_eq!(
            TensorType::new([i64::MAX, 2], DType::I8).num_elements(),
            None
        );
    }
}
