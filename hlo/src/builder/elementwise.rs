//! Elementwise ops, compare, select, clamp, convert, iota.

use super::{check_dim, FuncBuilder};
use crate::ops::{BinaryOp, ComparisonDirection, ComparisonType, OpKind, UnaryOp, Value};
use crate::{DType, HloError, TensorType};

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&mut self, x: Value) -> Result<Value, HloError> {
                self.unary(UnaryOp::$op, x)
            }
        )*
    };
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&mut self, lhs: Value, rhs: Value) -> Result<Value, HloError> {
                self.binary(BinaryOp::$op, lhs, rhs)
            }
        )*
    };
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident => $dir:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&mut self, lhs: Value, rhs: Value) -> Result<Value, HloError> {
                self.compare(ComparisonDirection::$dir, lhs, rhs)
            }
        )*
    };
}

impl FuncBuilder<'_> {
    /// An elementwise unary op. The result has the operand's type (`i1` for `IsFinite`).
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, HloError> {
        let name = op.op_name();
        let ty = self.operand(name, 0, x)?;
        let class = op.accepts();
        if !class.contains(ty.dtype) {
            return Err(HloError::dtype(name, "operand", ty.dtype, class.describe()));
        }
        let result = if op == UnaryOp::IsFinite {
            ty.with_dtype(DType::Bool)
        } else {
            ty
        };
        Ok(self.emit1(OpKind::Unary(op), vec![x], result, vec![]))
    }

    unary_methods! {
        /// `stablehlo.negate`.
        neg => Neg;
        /// `stablehlo.abs`.
        abs => Abs;
        /// `stablehlo.sign`.
        sign => Sign;
        /// `stablehlo.exponential`.
        exp => Exp;
        /// `stablehlo.exponential_minus_one`.
        expm1 => Expm1;
        /// `stablehlo.log`.
        log => Log;
        /// `stablehlo.log_plus_one`.
        log1p => Log1p;
        /// `stablehlo.tanh`.
        tanh => Tanh;
        /// `stablehlo.logistic` (sigmoid).
        logistic => Logistic;
        /// `stablehlo.sqrt`.
        sqrt => Sqrt;
        /// `stablehlo.rsqrt`.
        rsqrt => Rsqrt;
        /// `stablehlo.cbrt`.
        cbrt => Cbrt;
        /// `stablehlo.sine`.
        sin => Sin;
        /// `stablehlo.cosine`.
        cos => Cos;
        /// `stablehlo.floor`.
        floor => Floor;
        /// `stablehlo.ceil`.
        ceil => Ceil;
        /// `stablehlo.round_nearest_even`.
        round_nearest_even => RoundNearestEven;
        /// `stablehlo.round_nearest_afz`.
        round_nearest_afz => RoundNearestAfz;
        /// `stablehlo.is_finite` (result `i1`).
        is_finite => IsFinite;
        /// `stablehlo.not` (bitwise on integers, logical on bool).
        not => Not;
        /// `stablehlo.popcnt`.
        popcnt => Popcnt;
        /// `stablehlo.count_leading_zeros`.
        clz => Clz;
    }

    /// An elementwise binary op. Both operands must have the same type (no implicit
    /// broadcasting: use [`FuncBuilder::broadcast_in_dim`]).
    pub fn binary(&mut self, op: BinaryOp, lhs: Value, rhs: Value) -> Result<Value, HloError> {
        let name = op.op_name();
        let l = self.operand(name, 0, lhs)?;
        let r = self.operand(name, 1, rhs)?;
        if l != r {
            return Err(HloError::mismatch(name, "operand types differ", &l, &r));
        }
        let class = op.accepts();
        if !class.contains(l.dtype) {
            return Err(HloError::dtype(name, "operands", l.dtype, class.describe()));
        }
        Ok(self.emit1(OpKind::Binary(op), vec![lhs, rhs], l, vec![]))
    }

    binary_methods! {
        /// `stablehlo.add`.
        add => Add;
        /// `stablehlo.subtract`.
        sub => Sub;
        /// `stablehlo.multiply`.
        mul => Mul;
        /// `stablehlo.divide`.
        div => Div;
        /// `stablehlo.remainder`.
        rem => Rem;
        /// `stablehlo.power`.
        pow => Pow;
        /// `stablehlo.maximum`.
        max => Max;
        /// `stablehlo.minimum`.
        min => Min;
        /// `stablehlo.atan2`.
        atan2 => Atan2;
        /// `stablehlo.and`.
        and => And;
        /// `stablehlo.or`.
        or => Or;
        /// `stablehlo.xor`.
        xor => Xor;
        /// `stablehlo.shift_left`.
        shift_left => ShiftLeft;
        /// `stablehlo.shift_right_arithmetic`.
        shift_right_arithmetic => ShiftRightArithmetic;
        /// `stablehlo.shift_right_logical`.
        shift_right_logical => ShiftRightLogical;
    }

    /// `stablehlo.compare` with the natural comparison type of the dtype (FLOAT, SIGNED, or
    /// UNSIGNED for bool). The result is `i1` with the operands' shape.
    pub fn compare(
        &mut self,
        direction: ComparisonDirection,
        lhs: Value,
        rhs: Value,
    ) -> Result<Value, HloError> {
        let dtype = self.operand("stablehlo.compare", 0, lhs)?.dtype;
        self.compare_with_type(direction, lhs, rhs, ComparisonType::default_for(dtype))
    }

    /// `stablehlo.compare` with an explicit comparison type (e.g. TOTALORDER on floats).
    pub fn compare_with_type(
        &mut self,
        direction: ComparisonDirection,
        lhs: Value,
        rhs: Value,
        compare_type: ComparisonType,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.compare";
        let l = self.operand(OP, 0, lhs)?;
        let r = self.operand(OP, 1, rhs)?;
        if l != r {
            return Err(HloError::mismatch(OP, "operand types differ", &l, &r));
        }
        if !compare_type.allows(l.dtype) {
            return Err(HloError::dtype(
                OP,
                "operands",
                l.dtype,
                format!(
                    "a type that compare_type {} applies to",
                    compare_type.as_str()
                ),
            ));
        }
        let result = l.with_dtype(DType::Bool);
        Ok(self.emit1(
            OpKind::Compare {
                direction,
                compare_type,
            },
            vec![lhs, rhs],
            result,
            vec![],
        ))
    }

    compare_methods! {
        /// `compare EQ`.
        eq => Eq;
        /// `compare NE`.
        ne => Ne;
        /// `compare LT`.
        lt => Lt;
        /// `compare LE`.
        le => Le;
        /// `compare GT`.
        gt => Gt;
        /// `compare GE`.
        ge => Ge;
    }

    /// `stablehlo.select(pred, on_true, on_false)`: `pred` is `i1`, either scalar or with the
    /// shape of the branches, which have the same type.
    pub fn select(
        &mut self,
        pred: Value,
        on_true: Value,
        on_false: Value,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.select";
        let p = self.operand(OP, 0, pred)?;
        let t = self.operand(OP, 1, on_true)?;
        let f = self.operand(OP, 2, on_false)?;
        if p.dtype != DType::Bool {
            return Err(HloError::dtype(OP, "pred", p.dtype, "i1 (bool)"));
        }
        if t != f {
            return Err(HloError::mismatch(
                OP,
                "on_true and on_false types differ",
                &t,
                &f,
            ));
        }
        if !p.is_scalar() && p.dims != t.dims {
            return Err(HloError::shape(
                OP,
                format!("pred {p} must be a scalar or have the shape of the branches {t}"),
            ));
        }
        Ok(self.emit1(OpKind::Select, vec![pred, on_true, on_false], t, vec![]))
    }

    /// `stablehlo.clamp(min, operand, max)`: `min`/`max` have the operand's dtype and are
    /// scalars or have its shape.
    pub fn clamp(&mut self, min: Value, x: Value, max: Value) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.clamp";
        let lo = self.operand(OP, 0, min)?;
        let t = self.operand(OP, 1, x)?;
        let hi = self.operand(OP, 2, max)?;
        for (what, b) in [("min", &lo), ("max", &hi)] {
            if b.dtype != t.dtype {
                return Err(HloError::mismatch(
                    OP,
                    format!("{what} dtype differs"),
                    b,
                    &t,
                ));
            }
            if !b.is_scalar() && b.dims != t.dims {
                return Err(HloError::shape(
                    OP,
                    format!("{what} {b} must be a scalar or have the operand's shape {t}"),
                ));
            }
        }
        if t.dtype.is_bool() {
            return Err(HloError::dtype(
                OP,
                "operand",
                t.dtype,
                "a float or integer type",
            ));
        }
        Ok(self.emit1(OpKind::Clamp, vec![min, x, max], t, vec![]))
    }

    /// `stablehlo.convert` to another element type (same shape). Float to int truncates.
    pub fn convert(&mut self, x: Value, dtype: DType) -> Result<Value, HloError> {
        let t = self.operand("stablehlo.convert", 0, x)?;
        Ok(self.emit1(OpKind::Convert, vec![x], t.with_dtype(dtype), vec![]))
    }

    /// `stablehlo.iota`: a tensor of type `ty` counting 0, 1, ... along `dimension`.
    pub fn iota(&mut self, ty: TensorType, dimension: i64) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.iota";
        ty.validate(OP, "result type")?;
        check_dim(OP, "iota_dimension", dimension, ty.rank())?;
        if ty.dtype.is_bool() {
            return Err(HloError::dtype(
                OP,
                "result",
                ty.dtype,
                "a float or integer type",
            ));
        }
        Ok(self.emit1(OpKind::Iota { dimension }, vec![], ty, vec![]))
    }
}
