//! Literal tensors (the payload of `stablehlo.constant`) and their exact MLIR text form.

use std::fmt::Write as _;

use crate::{DType, HloError, TensorType};

const CONSTANT: &str = "stablehlo.constant";

/// Typed element storage of a [`Literal`]. bf16 is stored as raw bits.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bf16` elements, as raw bit patterns (see [`f32_to_bf16_bits`]).
    BF16(Vec<u16>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `i1` elements.
    Bool(Vec<bool>),
}

impl Elements {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Elements::F32(_) => DType::F32,
            Elements::BF16(_) => DType::BF16,
            Elements::I32(_) => DType::I32,
            Elements::I8(_) => DType::I8,
            Elements::Bool(_) => DType::Bool,
        }
    }

    /// Number of stored elements.
    pub fn len(&self) -> usize {
        match self {
            Elements::F32(v) => v.len(),
            Elements::BF16(v) => v.len(),
            Elements::I32(v) => v.len(),
            Elements::I8(v) => v.len(),
            Elements::Bool(v) => v.len(),
        }
    }

    /// True when no element is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as `f64` (exact for every supported dtype; bool is 0 or 1).
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        Some(match self {
            Elements::F32(v) => f64::from(*v.get(i)?),
            Elements::BF16(v) => f64::from(bf16_bits_to_f32(*v.get(i)?)),
            Elements::I32(v) => f64::from(*v.get(i)?),
            Elements::I8(v) => f64::from(*v.get(i)?),
            Elements::Bool(v) => f64::from(u8::from(*v.get(i)?)),
        })
    }

    fn render(&self, i: usize) -> String {
        match self {
            Elements::F32(v) => format_f32(v[i]),
            Elements::BF16(v) => format_bf16(v[i]),
            Elements::I32(v) => v[i].to_string(),
            Elements::I8(v) => v[i].to_string(),
            Elements::Bool(v) => v[i].to_string(),
        }
    }

    fn all_equal(&self) -> bool {
        fn eq<T: PartialEq>(v: &[T]) -> bool {
            v.windows(2).all(|w| w[0] == w[1])
        }
        match self {
            // Compare bits so that -0.0 and 0.0 (or different NaNs) are not merged.
            Elements::F32(v) => v.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()),
            Elements::BF16(v) => eq(v),
            Elements::I32(v) => eq(v),
            Elements::I8(v) => eq(v),
            Elements::Bool(v) => eq(v),
        }
    }
}

/// A constant tensor: dimensions plus row-major elements.
///
/// A literal holds either one element per position, or exactly one element that is splatted
/// over the whole shape (compact constants of any size).
#[derive(Debug, Clone, PartialEq)]
pub struct Literal {
    dims: Vec<i64>,
    elements: Elements,
}

impl Literal {
    /// A literal from dimensions and elements. The element count must equal the product of
    /// `dims`, or be 1 (a splat).
    pub fn new(dims: impl Into<Vec<i64>>, elements: Elements) -> Result<Self, HloError> {
        let dims = dims.into();
        let ty = TensorType::new(dims.clone(), elements.dtype());
        let n = ty.num_elements().ok_or_else(|| HloError::Literal {
            op: CONSTANT,
            reason: format!("invalid dimensions {dims:?}"),
        })?;
        let len = elements.len();
        if len as u64 != n as u64 && len != 1 {
            return Err(HloError::Literal {
                op: CONSTANT,
                reason: format!("{ty} needs {n} elements (or 1 to splat), got {len}"),
            });
        }
        Ok(Literal { dims, elements })
    }

    /// An `f32` literal.
    pub fn f32(dims: impl Into<Vec<i64>>, values: Vec<f32>) -> Result<Self, HloError> {
        Literal::new(dims, Elements::F32(values))
    }

    /// A `bf16` literal from `f32` values, rounded to nearest-even (NaN stays NaN).
    pub fn bf16(dims: impl Into<Vec<i64>>, values: &[f32]) -> Result<Self, HloError> {
        Literal::new(
            dims,
            Elements::BF16(values.iter().map(|&v| f32_to_bf16_bits(v)).collect()),
        )
    }

    /// An `i32` literal.
    pub fn i32(dims: impl Into<Vec<i64>>, values: Vec<i32>) -> Result<Self, HloError> {
        Literal::new(dims, Elements::I32(values))
    }

    /// An `i8` literal.
    pub fn i8(dims: impl Into<Vec<i64>>, values: Vec<i8>) -> Result<Self, HloError> {
        Literal::new(dims, Elements::I8(values))
    }

    /// A `bool` (`i1`) literal.
    pub fn bool(dims: impl Into<Vec<i64>>, values: Vec<bool>) -> Result<Self, HloError> {
        Literal::new(dims, Elements::Bool(values))
    }

    /// A rank-0 literal of `dtype` holding `value`.
    ///
    /// Floats are rounded to the dtype (infinities and NaN allowed); integers must be integral
    /// and in range; `bool` accepts 0 and 1.
    pub fn scalar(value: f64, dtype: DType) -> Result<Self, HloError> {
        Literal::splat(value, &TensorType::scalar(dtype))
    }

    /// A literal of type `ty` with every element equal to `value` (see [`Literal::scalar`]).
    pub fn splat(value: f64, ty: &TensorType) -> Result<Self, HloError> {
        let elements = match ty.dtype {
            // `as f32` rounds to nearest-even; bf16 is rounded straight from f64 (one rounding).
            DType::F32 => Elements::F32(vec![value as f32]),
            DType::BF16 => Elements::BF16(vec![f64_to_bf16_bits(value)]),
            DType::I32 => Elements::I32(vec![int_value(value, ty.dtype)? as i32]),
            DType::I8 => Elements::I8(vec![int_value(value, ty.dtype)? as i8]),
            DType::Bool => Elements::Bool(vec![int_value(value, ty.dtype)? != 0]),
        };
        Literal::new(ty.dims.clone(), elements)
    }

    /// The dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The stored elements (one, for a splat).
    pub fn elements(&self) -> &Elements {
        &self.elements
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.elements.dtype()
    }

    /// The tensor type of this literal.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dims.clone(), self.dtype())
    }

    /// True when one element stands for the whole shape.
    pub fn is_splat(&self) -> bool {
        self.elements.len() == 1
    }

    /// All elements, row-major and expanded (a splat repeated), as `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let n = self.ty().num_elements().unwrap_or(0) as usize;
        (0..n)
            .map(|i| {
                let j = if self.is_splat() { 0 } else { i };
                self.elements.get_f64(j).unwrap_or(f64::NAN)
            })
            .collect()
    }

    /// The MLIR attribute text, e.g. `dense<[1.0, 2.0]> : tensor<2xf32>`.
    pub fn to_mlir(&self) -> String {
        let ty = self.ty();
        let n = ty.num_elements().unwrap_or(0);
        let body = if n == 0 {
            String::new()
        } else if self.is_splat() || self.elements.all_equal() {
            self.elements.render(0)
        } else {
            let mut out = String::new();
            let mut next = 0usize;
            self.render_nested(0, &mut next, &mut out);
            out
        };
        format!("dense<{body}> : {ty}")
    }

    fn render_nested(&self, depth: usize, next: &mut usize, out: &mut String) {
        if depth == self.dims.len() {
            out.push_str(&self.elements.render(*next));
            *next += 1;
            return;
        }
        out.push('[');
        for i in 0..self.dims[depth] {
            if i > 0 {
                out.push_str(", ");
            }
            self.render_nested(depth + 1, next, out);
        }
        out.push(']');
    }
}

fn int_value(value: f64, dtype: DType) -> Result<i64, HloError> {
    let (lo, hi) = match dtype {
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
        DType::I8 => (f64::from(i8::MIN), f64::from(i8::MAX)),
        _ => (0.0, 1.0),
    };
    if value.fract() != 0.0 || !(lo..=hi).contains(&value) {
        return Err(HloError::Literal {
            op: CONSTANT,
            reason: format!("{value} is not a valid {dtype} value (range {lo}..={hi}, integral)"),
        });
    }
    Ok(value as i64)
}

/// Rounds an `f32` to the nearest `bf16` (ties to even) and returns its bits. NaN stays a
/// quiet NaN with the same sign.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// The `f32` value of `bf16` bits (exact).
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rounds an `f64` to the nearest `bf16` (ties to even) in a single rounding step, as MLIR's
/// parser does for a decimal literal of a bf16 tensor.
fn f64_to_bf16_bits(x: f64) -> u16 {
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    if x.is_nan() {
        return sign | 0x7FC0;
    }
    let a = x.abs();
    let val = |b: u16| f64::from(bf16_bits_to_f32(b));
    // Halfway between the largest finite bf16 and 2^128: at or above it rounds to infinity.
    let overflow = val(0x7F7F) + 2f64.powi(119);
    if a >= overflow {
        return sign | 0x7F80;
    }
    // Start near the answer, then settle on the neighbours lo <= a < hi (both exact in f64).
    let mut b = ((a as f32).to_bits() >> 16) as u16;
    while b > 0 && val(b) > a {
        b -= 1;
    }
    while b < 0x7F7F && val(b + 1) <= a {
        b += 1;
    }
    let hi = if b == 0x7F7F {
        2f64.powi(128)
    } else {
        val(b + 1)
    };
    let mid = (val(b) + hi) / 2.0; // exact: both have at most 8 significant bits
    let r = if a < mid || (a == mid && b % 2 == 0) {
        b
    } else {
        b + 1
    };
    sign | r
}

/// Formats an `f32` as an MLIR float literal that parses back to exactly the same value:
/// the shortest decimal that round-trips, hex bits (`0x7F800000`) for inf and NaN.
pub fn format_f32(x: f32) -> String {
    if !x.is_finite() {
        return format!("0x{:08X}", x.to_bits());
    }
    shortest_decimal(f64::from(x), |s| (s as f32).to_bits() == x.to_bits())
}

/// Formats `bf16` bits as an MLIR float literal that parses back to the same bf16 value
/// (MLIR parses a decimal as `f64`, then rounds once to bf16); hex bits for inf and NaN.
pub fn format_bf16(bits: u16) -> String {
    let x = bf16_bits_to_f32(bits);
    if !x.is_finite() {
        return format!("0x{bits:04X}");
    }
    shortest_decimal(f64::from(x), |s| f64_to_bf16_bits(s) == bits)
}

/// The shortest scientific rendering of `v` accepted by `round_trips`, written the way MLIR's
/// float literal grammar wants it (always with a `.`), positional when the exponent is small.
fn shortest_decimal(v: f64, round_trips: impl Fn(f64) -> bool) -> String {
    let mut sci = format!("{v:e}");
    for prec in 0..17 {
        let s = format!("{v:.prec$e}");
        if s.parse::<f64>().is_ok_and(&round_trips) {
            sci = s;
            break;
        }
    }
    pretty_float(&sci)
}

/// Rewrites `-1.25e-3` style text into MLIR float syntax: `-0.00125`; large or tiny
/// magnitudes stay scientific but always carry a `.` (`1.0e-7`).
fn pretty_float(sci: &str) -> String {
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-5..=7).contains(&exp) {
        // Positional: the decimal point sits after `exp + 1` digits.
        let point = exp + 1;
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(digits);
        } else {
            let point = point as usize;
            if digits.len() > point {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            } else {
                out.push_str(digits);
                out.extend(std::iter::repeat_n('0', point - digits.len()));
                out.push_str(".0");
            }
        }
    } else {
        out.push_str(&digits[..1]);
        out.push('.');
        out.push_str(if digits.len() > 1 { &digits[1..] } else { "0" });
        let _ = write!(out, "e{exp}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_formatting_is_exact_and_readable() {
        assert_eq!(format_f32(1.0), "1.0");
        assert_eq!(format_f32(0.1), "0.1");
        assert_eq!(format_f32(-2.5), "-2.5");
        assert_eq!(format_f32(0.0), "0.0");
        assert_eq!(format_f32(-0.0), "-0.0");
        assert_eq!(format_f32(1234567.0), "1234567.0");
        assert_eq!(format_f32(1.0e-7), "1.0e-7");
        assert_eq!(format_f32(3.0e20), "3.0e20");
        assert_eq!(format_f32(0.00125), "0.00125");
        assert_eq!(format_f32(f32::INFINITY), "0x7F800000");
        assert_eq!(format_f32(f32::NEG_INFINITY), "0xFF800000");
        assert_eq!(format_f32(f32::NAN), "0x7FC00000");
        assert_eq!(format_f32(f32::MAX), "3.4028235e38");
        for x in [
            f32::MIN_POSITIVE,
            1.0e-45,
            0.3,
            16777217.0,
            123.456,
            -7.0e-30,
        ] {
            let s = format_f32(x);
            assert_eq!(s.parse::<f64>().unwrap() as f32, x, "{s}");
            assert!(s.contains('.'), "{s}");
        }
    }

    #[test]
    fn bf16_rounding_and_formatting() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7F80);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80); // rounds up to infinity
        assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3F80); // tie to even
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 / 256.0), 0x3F82); // tie to even (up)
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
        assert_eq!(format_bf16(f32_to_bf16_bits(0.1)), "0.1");
        assert_eq!(format_bf16(f32_to_bf16_bits(1.0)), "1.0");
        assert_eq!(format_bf16(0x7F80), "0x7F80");
        assert_eq!(format_bf16(0xFF80), "0xFF80");
        assert_eq!(format_bf16(0x7FC0), "0x7FC0");
        for b in (0u16..0x7F80)
            .step_by(7)
            .chain([0x0001, 0x007F, 0x0080, 0x7F7F])
        {
            let s = format_bf16(b);
            assert_eq!(f64_to_bf16_bits(s.parse::<f64>().unwrap()), b, "{s}");
        }
    }

    #[test]
    fn f64_to_bf16_single_rounding() {
        assert_eq!(f64_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f64_to_bf16_bits(-1.0), 0xBF80);
        assert_eq!(f64_to_bf16_bits(1e300), 0x7F80);
        // Just above the midpoint of 1.0 and its successor: rounds up (an f32 detour would not).
        assert_eq!(f64_to_bf16_bits(1.0 + 1.0 / 256.0 + 1e-12), 0x3F81);
        assert_eq!(f64_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
    }

    #[test]
    fn literal_text() {
        let l = Literal::f32([2, 2], vec![1.0, 2.0, 3.0, f32::NEG_INFINITY]).unwrap();
        assert_eq!(
            l.to_mlir(),
            "dense<[[1.0, 2.0], [3.0, 0xFF800000]]> : tensor<2x2xf32>"
        );
        let l = Literal::i32([3], vec![7, 7, 7]).unwrap();
        assert_eq!(l.to_mlir(), "dense<7> : tensor<3xi32>");
        let l = Literal::bool([2], vec![true, false]).unwrap();
        assert_eq!(l.to_mlir(), "dense<[true, false]> : tensor<2xi1>");
        let l = Literal::scalar(-3.0, DType::I8).unwrap();
        assert_eq!(l.to_mlir(), "dense<-3> : tensor<i8>");
        let l = Literal::splat(0.5, &TensorType::new([4, 4], DType::BF16)).unwrap();
        assert_eq!(l.to_mlir(), "dense<0.5> : tensor<4x4xbf16>");
        let l = Literal::f32([0, 3], vec![]).unwrap();
        assert_eq!(l.to_mlir(), "dense<> : tensor<0x3xf32>");
    }

    #[test]
    fn literal_errors_name_the_op() {
        let e = Literal::f32([2, 2], vec![1.0, 2.0]).unwrap_err();
        assert!(e.to_string().starts_with("stablehlo.constant:"), "{e}");
        assert!(e.to_string().contains("needs 4 elements"), "{e}");
        let e = Literal::scalar(1.5, DType::I32).unwrap_err();
        assert!(e.to_string().starts_with("stablehlo.constant:"), "{e}");
        let e = Literal::scalar(300.0, DType::I8).unwrap_err();
        assert!(e.to_string().contains("not a valid i8"), "{e}");
        let e = Literal::scalar(2.0, DType::Bool).unwrap_err();
        assert!(e.to_string().contains("not a valid bool"), "{e}");
        let e = Literal::f32([-1], vec![1.0]).unwrap_err();
        assert!(e.to_string().contains("invalid dimensions"), "{e}");
    }
}
