//! The Mosaic rules of values: elementwise ops (`arith`, `math`), shapes (broadcasts,
//! reshapes as `vector.shape_cast`, repeats as `tpu.concatenate`, `tpu.iota`), dtype casts,
//! reductions (`vector.multi_reduction`) and matmuls (`tpu.matmul`), in the forms JAX's
//! Pallas TPU lowering emits.

use super::{value_type, Emitter};
use crate::ir::{BinaryOp, CmpOp, DType, Literal, Loc, ReduceOp, UnaryOp, ValueId, ValueType};

impl Emitter<'_> {
    /// An elementwise unary op (`arith`, `math`).
    pub(super) fn unary(&mut self, op: &UnaryOp, x: &ValueId, loc: Loc) -> String {
        let t = self.ty(*x);
        let (xs, ts) = (self.v(*x), value_type(t));
        let float = t.dtype.is_float();
        match op {
            UnaryOp::Neg if float => self.emit(&format!("arith.negf {xs} : {ts}"), loc),
            UnaryOp::Neg => {
                let zero = self.constant(Literal::Int(0), t, loc);
                self.emit(&format!("arith.subi {zero}, {xs} : {ts}"), loc)
            }
            UnaryOp::Exp => self.emit(&format!("math.exp {xs} : {ts}"), loc),
            UnaryOp::Log => self.emit(&format!("math.log {xs} : {ts}"), loc),
            UnaryOp::Tanh => self.emit(&format!("math.tanh {xs} : {ts}"), loc),
            UnaryOp::Sqrt => self.emit(&format!("math.sqrt {xs} : {ts}"), loc),
            UnaryOp::Rsqrt => self.emit(&format!("math.rsqrt {xs} : {ts}"), loc),
            UnaryOp::Abs if float => self.emit(&format!("math.absf {xs} : {ts}"), loc),
            UnaryOp::Abs => self.emit(&format!("math.absi {xs} : {ts}"), loc),
            UnaryOp::Not => {
                let one = self.constant(Literal::Bool(true), t, loc);
                self.emit(&format!("arith.xori {xs}, {one} : {ts}"), loc)
            }
        }
    }

    /// An elementwise binary op.
    pub(super) fn binary(
        &mut self,
        op: &BinaryOp,
        lhs: &ValueId,
        rhs: &ValueId,
        loc: Loc,
    ) -> String {
        let t = self.ty(*lhs);
        let name = binary_op(*op, t.dtype);
        let (a, b) = (self.v(*lhs), self.v(*rhs));
        self.emit(&format!("{name} {a}, {b} : {}", value_type(t)), loc)
    }

    /// An elementwise comparison (`arith.cmpf` / `arith.cmpi`).
    pub(super) fn compare(&mut self, op: &CmpOp, lhs: &ValueId, rhs: &ValueId, loc: Loc) -> String {
        let t = self.ty(*lhs);
        let (a, b) = (self.v(*lhs), self.v(*rhs));
        let (name, pred) = compare_op(*op, t.dtype);
        self.emit(&format!("{name} {pred}, {a}, {b} : {}", value_type(t)), loc)
    }

    /// `arith.select`.
    pub(super) fn select(
        &mut self,
        cond: &ValueId,
        on_true: &ValueId,
        on_false: &ValueId,
        loc: Loc,
    ) -> String {
        let (c, a, b) = (self.v(*cond), self.v(*on_true), self.v(*on_false));
        let t = self.ty(*on_true);
        let types = if t.is_scalar() {
            value_type(t)
        } else {
            format!("{}, {}", value_type(self.ty(*cond)), value_type(t))
        };
        self.emit(&format!("arith.select {c}, {a}, {b} : {types}"), loc)
    }

    /// `x` broadcast to `shape` (a scalar constant becomes a splat constant).
    pub(super) fn broadcast(&mut self, x: &ValueId, shape: &[usize], loc: Loc) -> String {
        let t = self.ty(*x);
        let to = ValueType::new(t.dtype, shape.to_vec());
        if t.shape == *shape {
            self.v(*x)
        } else if let Some(value) = self.scalar_constants.get(x).copied() {
            self.constant(value, &to, loc)
        } else {
            let xs = self.v(*x);
            self.vector_broadcast(&xs, t, &to, loc)
        }
    }

    /// `vector.broadcast` of the value `xs` of type `from` to `to`.
    fn vector_broadcast(&mut self, xs: &str, from: &ValueType, to: &ValueType, loc: Loc) -> String {
        self.emit(
            &format!(
                "vector.broadcast {xs} : {} to {}",
                value_type(from),
                value_type(to)
            ),
            loc,
        )
    }

    /// `x` repeated `times` times along `axis`.
    pub(super) fn repeat(&mut self, x: &ValueId, times: &usize, axis: &usize, loc: Loc) -> String {
        // As JAX lowers `pltpu.repeat`: one `tpu.concatenate` of the copies.
        let t = self.ty(*x);
        let xs = self.v(*x);
        if *times == 1 {
            xs
        } else {
            let mut shape = t.shape.clone();
            shape[*axis] *= times;
            let to = ValueType::new(t.dtype, shape);
            self.emit(
                &format!(
                    "tpu.concatenate {} in {axis} : {} -> {}",
                    vec![xs.as_str(); *times].join(", "),
                    vec![value_type(t); *times].join(", "),
                    value_type(&to)
                ),
                loc,
            )
        }
    }

    /// `x` reshaped to `shape`, in the casts Mosaic accepts.
    pub(super) fn reshape(&mut self, x: &ValueId, shape: &[usize], loc: Loc) -> String {
        let t = self.ty(*x);
        let xs = self.v(*x);
        let to = ValueType::new(t.dtype, shape.to_vec());
        if t.shape == *shape {
            xs
        } else if t.is_scalar() {
            self.vector_broadcast(&xs, t, &to, loc)
        } else if to.is_scalar() {
            let zeros = vec!["0"; t.rank()].join(", ");
            self.emit(
                &format!(
                    "vector.extract {xs}[{zeros}] : {} from {}",
                    t.dtype.mlir_name(),
                    value_type(t)
                ),
                loc,
            )
        } else if t.rank() == 2 && shape.len() == 2 && t.shape[0] != shape[0] {
            // A row as a column or back: through the 1-D vector (Mosaic casts a
            // rank-2 vector to rank 1 and back, not across its tiled dims at once).
            let flat = [t.shape.iter().product()];
            let line = self.shape_cast(&xs, &t.shape, &flat, t.dtype, loc);
            self.shape_cast(&line, &flat, shape, t.dtype, loc)
        } else {
            self.shape_cast(&xs, &t.shape, shape, t.dtype, loc)
        }
    }

    /// `tpu.iota` along `dim`, in `ty`'s dtype.
    pub(super) fn iota(&mut self, ty: &ValueType, dim: &usize, loc: Loc) -> String {
        let i32_ty = ValueType::new(DType::I32, ty.shape.clone());
        let iota = self.emit(
            &format!(
                "tpu.iota {{dimensions = array<i32: {dim}>}} : {}",
                value_type(&i32_ty)
            ),
            loc,
        );
        if ty.dtype == DType::I32 {
            iota
        } else {
            self.emit(
                &format!(
                    "arith.trunci {iota} : {} to {}",
                    value_type(&i32_ty),
                    value_type(ty)
                ),
                loc,
            )
        }
    }

    /// A reduction of `x` along `axis` (`vector.multi_reduction`; bf16 accumulates in f32).
    pub(super) fn reduce(
        &mut self,
        op: &ReduceOp,
        x: &ValueId,
        axis: &usize,
        out_ty: &ValueType,
        loc: Loc,
    ) -> String {
        let t = self.ty(*x);
        // bf16 accumulates in f32 and rounds once, as the interpreter does.
        let wide = t.dtype == DType::BF16;
        let (src, acc_dtype) = if wide {
            let w = ValueType::new(DType::F32, t.shape.clone());
            let xs = self.v(*x);
            let e = self.emit(
                &format!("arith.extf {xs} : {} to {}", value_type(t), value_type(&w)),
                loc,
            );
            (e, DType::F32)
        } else {
            (self.v(*x), t.dtype)
        };
        let in_ty = ValueType::new(acc_dtype, t.shape.clone());
        let acc_ty = ValueType::new(acc_dtype, out_ty.shape.clone());
        let (kind, init) = reduce_kind(*op, acc_dtype);
        let acc = self.constant(init, &acc_ty, loc);
        let red = self.emit(
            &format!(
                "vector.multi_reduction <{kind}>, {src}, {acc} [{axis}] : {} to {}",
                value_type(&in_ty),
                value_type(&acc_ty)
            ),
            loc,
        );
        if wide {
            self.emit(
                &format!(
                    "arith.truncf {red} : {} to {}",
                    value_type(&acc_ty),
                    value_type(out_ty)
                ),
                loc,
            )
        } else {
            red
        }
    }

    /// `tpu.matmul` of two 2-D values, either transposed.
    pub(super) fn dot(
        &mut self,
        lhs: &ValueId,
        rhs: &ValueId,
        transpose_lhs: &bool,
        transpose_rhs: &bool,
        out_ty: &ValueType,
        loc: Loc,
    ) -> String {
        let (a, b) = (self.v(*lhs), self.v(*rhs));
        let (ta, tb) = (self.ty(*lhs), self.ty(*rhs));
        let zero = match out_ty.dtype {
            DType::I32 => Literal::Int(0),
            _ => Literal::Float(0.0),
        };
        let acc = self.constant(zero, out_ty, loc);
        let (lc, ln) = if *transpose_lhs { (0, 1) } else { (1, 0) };
        let (rc, rn) = if *transpose_rhs { (1, 0) } else { (0, 1) };
        // f32 operands multiply at full f32 precision, as the interpreter does.
        let precision = if ta.dtype == DType::F32 {
            ", precision = #tpu.contract_precision<fp32>"
        } else {
            ""
        };
        self.emit(
            &format!(
                "tpu.matmul {a}, {b}, {acc} {{dimension_numbers = \
                 #tpu.dot_dimension_numbers<[{lc}], [{rc}], [{ln}], [{rn}], \
                 [0, {ln}, 1, {rn}], [], []>{precision}, transpose_lhs_hint = false}} : {}, {}, {} -> {}",
                value_type(ta),
                value_type(tb),
                value_type(out_ty),
                value_type(out_ty)
            ),
            loc,
        )
    }

    /// `x` converted to `to` with the interpreter's semantics (bools are 0 and 1; floats
    /// truncate toward zero into ints; nonzero is true).
    pub(super) fn cast(&mut self, x: ValueId, to: DType, loc: Loc) -> String {
        let t = self.ty(x);
        let from = t.dtype;
        let xs = self.v(x);
        if from == to {
            return xs;
        }
        let src = value_type(t);
        let dst_ty = ValueType::new(to, t.shape.clone());
        let dst = value_type(&dst_ty);
        let conv = |op: &str| format!("{op} {xs} : {src} to {dst}");
        match (from, to) {
            (DType::BF16, DType::F32) => self.emit(&conv("arith.extf"), loc),
            (DType::F32, DType::BF16) => self.emit(&conv("arith.truncf"), loc),
            (f, i) if f.is_float() && i.is_int() => self.emit(&conv("arith.fptosi"), loc),
            (i, f) if i.is_int() && f.is_float() => self.emit(&conv("arith.sitofp"), loc),
            (DType::I8, DType::I32) => self.emit(&conv("arith.extsi"), loc),
            (DType::I32, DType::I8) => self.emit(&conv("arith.trunci"), loc),
            (f, DType::Bool) => {
                let zero = self.constant(Literal::Int(0), t, loc);
                let (name, pred) = if f.is_float() {
                    ("arith.cmpf", "une")
                } else {
                    ("arith.cmpi", "ne")
                };
                self.emit(&format!("{name} {pred}, {xs}, {zero} : {src}"), loc)
            }
            (DType::Bool, i) if i.is_int() => self.emit(&conv("arith.extui"), loc),
            (DType::Bool, _) => {
                // bool -> i32 -> float.
                let wide = ValueType::new(DType::I32, t.shape.clone());
                let w = self.emit(
                    &format!("arith.extui {xs} : {src} to {}", value_type(&wide)),
                    loc,
                );
                self.emit(
                    &format!("arith.sitofp {w} : {} to {dst}", value_type(&wide)),
                    loc,
                )
            }
            (f, t) => unreachable!("every dtype pair is covered above: {f} -> {t}"),
        }
    }
}

fn binary_op(op: BinaryOp, dtype: DType) -> &'static str {
    if dtype.is_float() {
        match op {
            BinaryOp::Add => "arith.addf",
            BinaryOp::Sub => "arith.subf",
            BinaryOp::Mul => "arith.mulf",
            BinaryOp::Div => "arith.divf",
            BinaryOp::Rem => "arith.remf",
            BinaryOp::Max => "arith.maximumf",
            BinaryOp::Min => "arith.minimumf",
            // Verified: logical ops only on ints and bools.
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => unreachable!("logical op on floats"),
        }
    } else {
        match op {
            BinaryOp::Add => "arith.addi",
            BinaryOp::Sub => "arith.subi",
            BinaryOp::Mul => "arith.muli",
            BinaryOp::Div => "arith.divsi",
            BinaryOp::Rem => "arith.remsi",
            BinaryOp::Max => "arith.maxsi",
            BinaryOp::Min => "arith.minsi",
            BinaryOp::And => "arith.andi",
            BinaryOp::Or => "arith.ori",
            BinaryOp::Xor => "arith.xori",
        }
    }
}

/// The compare op and predicate: ordered float compares (false on NaN) except `ne`, which is
/// true on NaN as in Rust; bools compare unsigned (false < true).
fn compare_op(op: CmpOp, dtype: DType) -> (&'static str, &'static str) {
    if dtype.is_float() {
        let p = match op {
            CmpOp::Eq => "oeq",
            CmpOp::Ne => "une",
            CmpOp::Lt => "olt",
            CmpOp::Le => "ole",
            CmpOp::Gt => "ogt",
            CmpOp::Ge => "oge",
        };
        ("arith.cmpf", p)
    } else {
        let signed = !dtype.is_bool();
        let p = match (op, signed) {
            (CmpOp::Eq, _) => "eq",
            (CmpOp::Ne, _) => "ne",
            (CmpOp::Lt, true) => "slt",
            (CmpOp::Le, true) => "sle",
            (CmpOp::Gt, true) => "sgt",
            (CmpOp::Ge, true) => "sge",
            (CmpOp::Lt, false) => "ult",
            (CmpOp::Le, false) => "ule",
            (CmpOp::Gt, false) => "ugt",
            (CmpOp::Ge, false) => "uge",
        };
        ("arith.cmpi", p)
    }
}

/// The `vector.multi_reduction` kind and its neutral element.
fn reduce_kind(op: ReduceOp, dtype: DType) -> (&'static str, Literal) {
    if dtype.is_float() {
        match op {
            ReduceOp::Sum => ("add", Literal::Float(0.0)),
            ReduceOp::Max => ("maximumf", Literal::Float(f64::NEG_INFINITY)),
            ReduceOp::Min => ("minimumf", Literal::Float(f64::INFINITY)),
        }
    } else {
        let (lo, hi) = if dtype == DType::I8 {
            (i8::MIN as i64, i8::MAX as i64)
        } else {
            (i32::MIN as i64, i32::MAX as i64)
        };
        match op {
            ReduceOp::Sum => ("add", Literal::Int(0)),
            ReduceOp::Max => ("maxsi", Literal::Int(lo)),
            ReduceOp::Min => ("minsi", Literal::Int(hi)),
        }
    }
}
