//! Element types shared by every tessera layer (kernel IR, StableHLO, host arrays).

use std::fmt;

/// The element types tessera kernels and programs compute with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 single precision float (`f32`).
    F32,
    /// bfloat16: 8-bit exponent, 7-bit mantissa (`bf16`).
    BF16,
    /// Signed 32-bit integer (`i32`).
    I32,
    /// Signed 8-bit integer (`i8`).
    I8,
    /// Boolean, `i1` in MLIR (one byte on device).
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order (for tests and listings).
    pub const ALL: [DType; 5] = [DType::F32, DType::BF16, DType::I32, DType::I8, DType::Bool];

    /// Size of one element in bytes, as stored on device (bool is one byte).
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 => 2,
            DType::I8 | DType::Bool => 1,
        }
    }

    /// The MLIR element type spelling used in StableHLO and Mosaic text (`f32`, `bf16`, `i1`, ...).
    pub const fn mlir_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::Bool => "i1",
        }
    }

    /// The user-facing name (`f32`, `bf16`, `i32`, `i8`, `bool`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::Bool => "bool",
        }
    }

    /// True for the floating-point types (`f32`, `bf16`).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16)
    }

    /// True for the (signed) integer types (`i32`, `i8`); false for `bool`.
    pub const fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I8)
    }

    /// True for `bool`.
    pub const fn is_bool(self) -> bool {
        matches!(self, DType::Bool)
    }

    /// Parses a user-facing name, as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("f64"), None);
    }

    #[test]
    fn sizes_match_tpu_storage() {
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(DType::Bool.mlir_name(), "i1");
    }
}
