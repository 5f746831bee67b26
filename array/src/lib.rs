//! tessera-array: the element types ([`DType`]) and the dense host array ([`HostArray`]) that
//! every tessera crate speaks. Kernels take and return them on the interpreter, StableHLO
//! constants are built from them (`tessera-hlo`), and the runtime copies them to and from
//! device buffers (`tessera-runtime`, the one place that maps a [`DType`] to a PJRT element
//! type). A leaf crate, so that no layer has to depend on another just to share an array.

use std::fmt;

use half::bf16;

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

    /// Parses a compute dtype, one that kernels, attention and the train step compute in:
    /// `f32` or `bf16` (also JAX's spellings `float32` and `bfloat16`). The one parser of
    /// `--dtype` values and `dtype=` parameters; each caller names its own flag in its message.
    pub fn compute_from_name(name: &str) -> Option<DType> {
        match name {
            "float32" => Some(DType::F32),
            "bfloat16" => Some(DType::BF16),
            _ => DType::from_name(name).filter(|d| d.is_float()),
        }
    }

    /// What kernel memory that was never written holds (scratch, and output blocks before
    /// their first store), as an `f64`: NaN for floats, a sentinel for integers (`i8::MIN`,
    /// `i32::MIN + 0x5a5a`), `true` (1) for bool. Every backend that runs kernels on the host
    /// (the interpreter, the StableHLO lowering's fresh buffers, the Mosaic evaluator) fills
    /// such memory with it, so a kernel that reads what it never wrote shows it, identically.
    pub fn garbage(self) -> f64 {
        match self {
            DType::F32 | DType::BF16 => f64::NAN,
            DType::I32 => (i32::MIN + 0x5a5a) as f64,
            DType::I8 => i8::MIN as f64,
            DType::Bool => 1.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Rounds an `f64` to the nearest `bf16`, ties to even, in one rounding step: the value an MLIR
/// parser gives a decimal literal of a bf16 tensor, and the one conversion from `f64` to
/// `bf16` in tessera.
///
/// `half::bf16::from_f64` drops the low 32 bits of the `f64` before rounding, so a value just
/// above a midpoint between two bf16 numbers (by less than 2^-20 of it) rounds to even instead
/// of up; this corrects that one case.
pub fn bf16_from_f64(x: f64) -> bf16 {
    let rounded = bf16::from_f64(x);
    let away = bf16::from_bits(rounded.to_bits().wrapping_add(1));
    if !x.is_finite() || !away.is_finite() || rounded.to_f64().abs() > x.abs() {
        // NaN and infinities, the largest finite magnitude, and a result already rounded away
        // from zero are exact.
        return rounded;
    }
    // Both neighbours have at most 8 significant bits, so their midpoint is exact in f64.
    let midpoint = (rounded.to_f64() + away.to_f64()) / 2.0;
    if x.abs() > midpoint.abs() {
        away
    } else {
        rounded
    }
}

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
            DType::BF16 => ArrayData::BF16(values.iter().map(|&v| bf16_from_f64(v)).collect()),
            DType::I32 => ArrayData::I32(values.iter().map(|&v| v as i32).collect()),
            DType::I8 => ArrayData::I8(values.iter().map(|&v| v as i8).collect()),
            DType::Bool => ArrayData::Bool(values.iter().map(|&v| v != 0.0).collect()),
        };
        Self::new(shape, data)
    }

    /// Deterministic pseudo-random values uniform in [-1, 1), converted to `dtype` (for tests,
    /// benchmarks and references; the same seed gives the same array everywhere).
    pub fn random(dtype: DType, shape: impl Into<Vec<usize>>, seed: u64) -> Self {
        let shape = shape.into();
        let mut rng = fastrand::Rng::with_seed(seed);
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n).map(|_| rng.f64() * 2.0 - 1.0).collect();
        Self::from_f64(dtype, shape, &values).expect("the shape matches the values")
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

/// numpy's nesting of brackets, elements as Rust prints them (`1.5`, `-3`, `true`): the form
/// `debug_print!` shows a tile in (the interpreter and mosaic-eval print alike).
impl fmt::Display for HostArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let element = |i: usize| -> String {
            match &self.data {
                ArrayData::F32(v) => v[i].to_string(),
                ArrayData::BF16(v) => v[i].to_f32().to_string(),
                ArrayData::I32(v) => v[i].to_string(),
                ArrayData::I8(v) => v[i].to_string(),
                ArrayData::Bool(v) => v[i].to_string(),
            }
        };
        fn nest(
            f: &mut fmt::Formatter<'_>,
            shape: &[usize],
            offset: usize,
            element: &dyn Fn(usize) -> String,
        ) -> fmt::Result {
            let Some((&n, inner)) = shape.split_first() else {
                return f.write_str(&element(offset));
            };
            let stride: usize = inner.iter().product();
            f.write_str("[")?;
            for i in 0..n {
                if i > 0 {
                    f.write_str(", ")?;
                }
                nest(f, inner, offset + i * stride, element)?;
            }
            f.write_str("]")
        }
        nest(f, &self.shape, 0, &element)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_nested_like_numpy() {
        let a = HostArray::i32([2, 3], vec![1, 2, 3, 4, 5, -6]).unwrap();
        assert_eq!(a.to_string(), "[[1, 2, 3], [4, 5, -6]]");
        let s = HostArray::f32(Vec::<usize>::new(), vec![1.5]).unwrap();
        assert_eq!(s.to_string(), "1.5");
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("f64"), None);
    }

    /// The nearest bf16 by exhaustive search over the neighbours of `x`, ties to even.
    fn nearest_bf16(x: f64) -> u16 {
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        let a = x.abs();
        // Past the midpoint between the largest finite bf16 and 2^128, the result is infinity.
        if a >= bf16::MAX.to_f64() + 2f64.powi(119) {
            return sign | 0x7F80;
        }
        let (mut best, mut best_err) = (0u16, f64::INFINITY);
        let start = (bf16::from_f32(a as f32).to_bits()).saturating_sub(2);
        for b in start..=(start + 4).min(0x7F7F) {
            let err = (bf16::from_bits(b).to_f64() - a).abs();
            if err < best_err || (err == best_err && b % 2 == 0) {
                (best, best_err) = (b, err);
            }
        }
        sign | best
    }

    #[test]
    fn f64_to_bf16_rounds_once() {
        assert_eq!(bf16_from_f64(1.0).to_bits(), 0x3F80);
        assert_eq!(bf16_from_f64(-1.0).to_bits(), 0xBF80);
        assert_eq!(bf16_from_f64(1e300).to_bits(), 0x7F80);
        assert!(bf16_from_f64(f64::NAN).is_nan());
        // Just above the midpoint of 1.0 and its successor rounds up; `half` alone rounds to
        // even here because it never sees the 1e-12.
        assert_eq!(bf16_from_f64(1.0 + 1.0 / 256.0 + 1e-12).to_bits(), 0x3F81);
        assert_eq!(bf16::from_f64(1.0 + 1.0 / 256.0 + 1e-12).to_bits(), 0x3F80);
        assert_eq!(bf16_from_f64(1.0 + 1.0 / 256.0).to_bits(), 0x3F80);
        assert_eq!(bf16_from_f64(1.0 + 3.0 / 256.0).to_bits(), 0x3F82);
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..100_000 {
            // Values near midpoints, subnormals and everything in between.
            let b = rng.u16(0..0x7F7F);
            let mid = (bf16::from_bits(b).to_f64() + bf16::from_bits(b + 1).to_f64()) / 2.0;
            let x = match rng.u8(0..3) {
                0 => mid * (1.0 + (rng.f64() - 0.5) * 1e-9),
                1 => mid,
                _ => f64::from_bits(rng.u64(..)),
            };
            if x.is_finite() {
                assert_eq!(bf16_from_f64(x).to_bits(), nearest_bf16(x), "{x:e}");
                assert_eq!(bf16_from_f64(-x).to_bits(), nearest_bf16(-x), "{x:e}");
            }
        }
    }

    #[test]
    fn sizes_match_tpu_storage() {
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(DType::Bool.mlir_name(), "i1");
    }
}
