//! Literal tensors (the payload of `stablehlo.constant`) and their exact MLIR text form.
//!
//! The elements are a [`tessera_array::ArrayData`], the storage every tessera crate shares;
//! what this module adds is the splat form (one element standing for any shape) and the
//! rendering as MLIR text.

use std::fmt::Write as _;

use half::bf16;
use tessera_array::{bf16_from_f64, ArrayData};

use crate::{DType, HloError, HostArray, TensorType};

const CONSTANT: &str = "stablehlo.constant";

/// A constant tensor: dimensions plus row-major elements.
///
/// A literal holds either one element per position ([`Literal::from_array`]), or exactly one
/// element that is splatted over the whole shape ([`Literal::splat`], compact constants of any
/// size).
#[derive(Debug, Clone, PartialEq)]
pub struct Literal {
    dims: Vec<i64>,
    values: ArrayData,
}

impl Literal {
    fn new(dims: Vec<i64>, values: ArrayData) -> Result<Self, HloError> {
        let ty = TensorType::new(dims.clone(), values.dtype());
        let n = ty.num_elements().ok_or_else(|| HloError::Literal {
            op: CONSTANT,
            reason: format!("invalid dimensions {dims:?}"),
        })?;
        let len = values.len();
        if len as u64 != n as u64 && len != 1 {
            return Err(HloError::Literal {
                op: CONSTANT,
                reason: format!("{ty} needs {n} elements (or 1 to splat), got {len}"),
            });
        }
        Ok(Literal { dims, values })
    }

    /// A literal holding a host array's elements (rendered as a splat when they are all equal).
    pub fn from_array(array: &HostArray) -> Result<Self, HloError> {
        let dims = array
            .shape()
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(|_| HloError::Literal {
                op: CONSTANT,
                reason: format!("dimensions {:?} do not fit in i64", array.shape()),
            })?;
        Literal::new(dims, array.data().clone())
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
        if !ty.dtype.is_float() {
            check_integral(value, ty.dtype)?;
        }
        // One rounding from f64 (bf16 included), as MLIR's parser does for a decimal literal.
        let one = HostArray::from_f64(ty.dtype, [], &[value]).map_err(|e| HloError::Literal {
            op: CONSTANT,
            reason: e.to_string(),
        })?;
        Literal::new(ty.dims.clone(), one.into_data())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The stored elements (one, for a splat).
    pub fn values(&self) -> &ArrayData {
        &self.values
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.values.dtype()
    }

    /// The tensor type of this literal.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dims.clone(), self.dtype())
    }

    /// True when one element stands for the whole shape.
    pub fn is_splat(&self) -> bool {
        self.values.len() == 1
    }

    /// The MLIR attribute text, e.g. `dense<[1.0, 2.0]> : tensor<2xf32>`.
    pub fn to_mlir(&self) -> String {
        let ty = self.ty();
        let n = ty.num_elements().unwrap_or(0);
        let body = if n == 0 {
            String::new()
        } else if self.is_splat() || all_equal(&self.values) {
            render(&self.values, 0)
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
            out.push_str(&render(&self.values, *next));
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

/// Element `i` in MLIR's literal syntax.
fn render(values: &ArrayData, i: usize) -> String {
    match values {
        ArrayData::F32(v) => format_f32(v[i]),
        ArrayData::BF16(v) => format_bf16(v[i]),
        ArrayData::I32(v) => v[i].to_string(),
        ArrayData::I8(v) => v[i].to_string(),
        ArrayData::Bool(v) => v[i].to_string(),
    }
}

/// Whether every element is the same (floats by their bits, so that -0.0 and 0.0, or different
/// NaNs, are not merged into a splat).
fn all_equal(values: &ArrayData) -> bool {
    fn same<T, K: PartialEq>(v: &[T], key: impl Fn(&T) -> K) -> bool {
        v.windows(2).all(|w| key(&w[0]) == key(&w[1]))
    }
    match values {
        ArrayData::F32(v) => same(v, |x| x.to_bits()),
        ArrayData::BF16(v) => same(v, |x| x.to_bits()),
        ArrayData::I32(v) => same(v, |&x| x),
        ArrayData::I8(v) => same(v, |&x| x),
        ArrayData::Bool(v) => same(v, |&x| x),
    }
}

/// Checks that `value` is a valid element of the integer or bool type `dtype`.
fn check_integral(value: f64, dtype: DType) -> Result<(), HloError> {
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
    Ok(())
}

/// Formats an `f32` as an MLIR float literal that parses back to exactly the same value:
/// the shortest decimal that round-trips, hex bits (`0x7F800000`) for inf and NaN.
fn format_f32(x: f32) -> String {
    if !x.is_finite() {
        return format!("0x{:08X}", x.to_bits());
    }
    shortest_decimal(f64::from(x), |s| (s as f32).to_bits() == x.to_bits())
}

/// Formats a `bf16` as an MLIR float literal that parses back to the same bf16 value (MLIR
/// rounds a decimal once to bf16); hex bits for inf and NaN.
fn format_bf16(x: bf16) -> String {
    if !x.is_finite() {
        return format!("0x{:04X}", x.to_bits());
    }
    shortest_decimal(x.to_f64(), |s| bf16_from_f64(s).to_bits() == x.to_bits())
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
    fn bf16_formatting_parses_back_to_the_same_value() {
        assert_eq!(format_bf16(bf16::from_f32(0.1)), "0.1");
        assert_eq!(format_bf16(bf16::ONE), "1.0");
        assert_eq!(format_bf16(bf16::INFINITY), "0x7F80");
        assert_eq!(format_bf16(bf16::NEG_INFINITY), "0xFF80");
        assert_eq!(format_bf16(bf16::from_bits(0x7FC0)), "0x7FC0");
        for b in (0u16..0x7F80)
            .step_by(7)
            .chain([0x0001, 0x007F, 0x0080, 0x7F7F])
        {
            let s = format_bf16(bf16::from_bits(b));
            assert_eq!(bf16_from_f64(s.parse::<f64>().unwrap()).to_bits(), b, "{s}");
        }
    }

    #[test]
    fn literal_text() {
        let lit = |a: Result<HostArray, tessera_array::ShapeError>| {
            Literal::from_array(&a.unwrap()).unwrap().to_mlir()
        };
        assert_eq!(
            lit(HostArray::f32(
                [2, 2],
                vec![1.0, 2.0, 3.0, f32::NEG_INFINITY]
            )),
            "dense<[[1.0, 2.0], [3.0, 0xFF800000]]> : tensor<2x2xf32>"
        );
        assert_eq!(
            lit(HostArray::i32([3], vec![7, 7, 7])),
            "dense<7> : tensor<3xi32>"
        );
        assert_eq!(
            lit(HostArray::new([2], ArrayData::Bool(vec![true, false]))),
            "dense<[true, false]> : tensor<2xi1>"
        );
        assert_eq!(
            lit(HostArray::f32([2], vec![0.0, -0.0])),
            "dense<[0.0, -0.0]> : tensor<2xf32>"
        );
        assert_eq!(
            lit(HostArray::bf16(
                [2],
                vec![bf16::from_f32(0.1), bf16::NEG_INFINITY]
            )),
            "dense<[0.1, 0xFF80]> : tensor<2xbf16>"
        );
        assert_eq!(
            lit(HostArray::f32([0, 3], vec![])),
            "dense<> : tensor<0x3xf32>"
        );
        let l = Literal::scalar(-3.0, DType::I8).unwrap();
        assert_eq!(l.to_mlir(), "dense<-3> : tensor<i8>");
        let l = Literal::splat(0.5, &TensorType::new([4, 4], DType::BF16)).unwrap();
        assert!(l.is_splat());
        assert_eq!(l.to_mlir(), "dense<0.5> : tensor<4x4xbf16>");
        // A bf16 splat is rounded once from the f64 (an f32 detour would round down).
        let l = Literal::scalar(1.0 + 1.0 / 256.0 + 1e-12, DType::BF16).unwrap();
        assert_eq!(l.values(), &ArrayData::BF16(vec![bf16::from_bits(0x3F81)]));
    }

    #[test]
    fn literal_errors_name_the_op() {
        let e = Literal::new(vec![2, 2], ArrayData::F32(vec![1.0, 2.0])).unwrap_err();
        assert!(e.to_string().starts_with("stablehlo.constant:"), "{e}");
        assert!(e.to_string().contains("needs 4 elements"), "{e}");
        let e = Literal::scalar(1.5, DType::I32).unwrap_err();
        assert!(e.to_string().starts_with("stablehlo.constant:"), "{e}");
        let e = Literal::scalar(300.0, DType::I8).unwrap_err();
        assert!(e.to_string().contains("not a valid i8"), "{e}");
        let e = Literal::scalar(2.0, DType::Bool).unwrap_err();
        assert!(e.to_string().contains("not a valid bool"), "{e}");
        let e = Literal::splat(1.0, &TensorType::new([-1], DType::F32)).unwrap_err();
        assert!(e.to_string().contains("invalid dimensions"), "{e}");
    }
}
