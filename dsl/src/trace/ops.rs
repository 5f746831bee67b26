//! Tracer operations: arithmetic, math, comparisons, casts, shapes, dot, control flow.

use std::ops;

use super::state::{emit, trace_region, with_trace, Value};
use crate::ir::{
    broadcast_shapes, BinaryOp, CmpOp, DType, Literal, Loc, Op, ReduceOp, Region, UnaryOp,
    ValueType,
};

fn one(op: Op, loc: Loc) -> Value {
    emit(op, loc)[0]
}

/// A constant of `dtype` splatted to `shape`.
#[track_caller]
pub fn constant(dtype: DType, shape: &[usize], value: impl Into<ScalarLit>) -> Value {
    let lit = value.into().0;
    let lit = match (lit, dtype) {
        (Literal::Int(i), d) if d.is_float() => Literal::Float(i as f64),
        (l, _) => l,
    };
    one(
        Op::Constant {
            value: lit,
            ty: ValueType::new(dtype, shape),
        },
        Loc::caller(),
    )
}

/// Zeros of `dtype` and `shape`.
#[track_caller]
pub fn zeros(dtype: DType, shape: &[usize]) -> Value {
    let zero = match dtype {
        DType::Bool => Literal::Bool(false),
        d if d.is_float() => Literal::Float(0.0),
        _ => Literal::Int(0),
    };
    one(
        Op::Constant {
            value: zero,
            ty: ValueType::new(dtype, shape),
        },
        Loc::caller(),
    )
}

/// A Rust literal that takes the dtype of the value it meets (JAX's weak typing).
#[derive(Debug, Clone, Copy)]
pub struct ScalarLit(pub(crate) Literal);

macro_rules! scalar_lit_from {
    ($($t:ty => $v:ident as $as:ty),*) => {$(
        impl From<$t> for ScalarLit {
            fn from(x: $t) -> Self { ScalarLit(Literal::$v(x as $as)) }
        }
    )*};
}
scalar_lit_from!(f32 => Float as f64, f64 => Float as f64, i32 => Int as i64, i64 => Int as i64,
                 usize => Int as i64, u32 => Int as i64);
impl From<bool> for ScalarLit {
    fn from(b: bool) -> Self {
        ScalarLit(Literal::Bool(b))
    }
}

/// Anything usable where a tracer value is expected: a [`Value`] or a Rust literal.
pub trait IntoValue {
    /// The tracer value, when this is one (not a literal).
    fn as_value(&self) -> Option<Value>;
    /// Converts to a value; a literal becomes a scalar of `dtype` (default f32/i32/bool).
    #[track_caller]
    fn into_value_like(self, dtype: Option<DType>) -> Value;
}

impl IntoValue for Value {
    fn as_value(&self) -> Option<Value> {
        Some(*self)
    }
    fn into_value_like(self, _dtype: Option<DType>) -> Value {
        self
    }
}

impl IntoValue for &Value {
    fn as_value(&self) -> Option<Value> {
        Some(**self)
    }
    fn into_value_like(self, _dtype: Option<DType>) -> Value {
        *self
    }
}

macro_rules! into_value_lit {
    ($($t:ty),*) => {$(
        impl IntoValue for $t {
            fn as_value(&self) -> Option<Value> {
                None
            }
            #[track_caller]
            fn into_value_like(self, dtype: Option<DType>) -> Value {
                literal_like(ScalarLit::from(self).0, dtype)
            }
        }
    )*};
}
into_value_lit!(f32, f64, i32, i64, usize, u32, bool);

#[track_caller]
fn literal_like(lit: Literal, dtype: Option<DType>) -> Value {
    let dtype = match (dtype, lit) {
        (Some(d), _) => d,
        (None, Literal::Float(_)) => DType::F32,
        (None, Literal::Int(_)) => DType::I32,
        (None, Literal::Bool(_)) => DType::Bool,
    };
    let lit = match (lit, dtype) {
        (Literal::Int(i), d) if d.is_float() => Literal::Float(i as f64),
        (l, _) => l,
    };
    one(
        Op::Constant {
            value: lit,
            ty: ValueType::scalar(dtype),
        },
        Loc::caller(),
    )
}

/// Broadcasts two operands to a common shape (numpy rules), inserting broadcast ops.
#[track_caller]
fn broadcast_pair(op: &'static str, a: Value, b: Value) -> (Value, Value) {
    let loc = Loc::caller();
    if a.is_poisoned() || b.is_poisoned() {
        return (a, b);
    }
    let (sa, sb) = (a.shape(), b.shape());
    if sa == sb {
        return (a, b);
    }
    match broadcast_shapes(&sa, &sb) {
        Some(shape) => {
            let a = if sa == shape {
                a
            } else {
                one(
                    Op::Broadcast {
                        x: a.id,
                        shape: shape.clone(),
                    },
                    loc,
                )
            };
            let b = if sb == shape {
                b
            } else {
                one(Op::Broadcast { x: b.id, shape }, loc)
            };
            (a, b)
        }
        None => {
            with_trace(|t| {
                t.problem(
                    op,
                    loc,
                    format!("shapes {sa:?} and {sb:?} do not broadcast together"),
                )
            });
            let poisoned = poisoned_value();
            (poisoned, poisoned)
        }
    }
}

/// A placeholder for the result of an op that could not be built (already reported).
pub(crate) fn poisoned_value() -> Value {
    with_trace(|t| {
        let id = t.fresh(ValueType::scalar(DType::F32));
        t.poisoned.insert(id);
        Value { id }
    })
}

#[track_caller]
fn binary(op: BinaryOp, a: impl IntoValue, b: impl IntoValue) -> Value {
    let (a, b) = lift_pair(a, b);
    let (a, b) = broadcast_pair(op.name(), a, b);
    one(
        Op::Binary {
            op,
            lhs: a.id,
            rhs: b.id,
        },
        Loc::caller(),
    )
}

#[track_caller]
fn compare(op: CmpOp, a: impl IntoValue, b: impl IntoValue) -> Value {
    let (a, b) = lift_pair(a, b);
    let (a, b) = broadcast_pair(op.name(), a, b);
    one(
        Op::Compare {
            op,
            lhs: a.id,
            rhs: b.id,
        },
        Loc::caller(),
    )
}

/// Turns a pair of operands into values; a literal takes the other side's dtype.
#[track_caller]
fn lift_pair(a: impl IntoValue, b: impl IntoValue) -> (Value, Value) {
    // Values first, so literals can copy their dtype.
    if a.as_value().is_some() {
        let a = a.into_value_like(None);
        let b = b.into_value_like(Some(a.dtype()));
        (a, b)
    } else {
        let b = b.into_value_like(None);
        let a = a.into_value_like(Some(b.dtype()));
        (a, b)
    }
}

#[track_caller]
fn unary(op: UnaryOp, x: Value) -> Value {
    one(Op::Unary { op, x: x.id }, Loc::caller())
}

macro_rules! std_binop {
    ($Trait:ident, $method:ident, $op:expr) => {
        impl<R: IntoValue> ops::$Trait<R> for Value {
            type Output = Value;
            #[track_caller]
            fn $method(self, rhs: R) -> Value {
                binary($op, self, rhs)
            }
        }
        impl<R: IntoValue> ops::$Trait<R> for &Value {
            type Output = Value;
            #[track_caller]
            fn $method(self, rhs: R) -> Value {
                binary($op, *self, rhs)
            }
        }
        std_binop!(@lit $Trait, $method, $op, f32, f64, i32, i64, usize, bool);
    };
    (@lit $Trait:ident, $method:ident, $op:expr, $($t:ty),*) => {$(
        impl ops::$Trait<Value> for $t {
            type Output = Value;
            #[track_caller]
            fn $method(self, rhs: Value) -> Value {
                binary($op, self, rhs)
            }
        }
    )*};
}

std_binop!(Add, add, BinaryOp::Add);
std_binop!(Sub, sub, BinaryOp::Sub);
std_binop!(Mul, mul, BinaryOp::Mul);
std_binop!(Div, div, BinaryOp::Div);
std_binop!(Rem, rem, BinaryOp::Rem);
std_binop!(BitAnd, bitand, BinaryOp::And);
std_binop!(BitOr, bitor, BinaryOp::Or);
std_binop!(BitXor, bitxor, BinaryOp::Xor);

impl ops::Neg for Value {
    type Output = Value;
    #[track_caller]
    fn neg(self) -> Value {
        unary(UnaryOp::Neg, self)
    }
}

impl ops::Not for Value {
    type Output = Value;
    #[track_caller]
    fn not(self) -> Value {
        unary(UnaryOp::Not, self)
    }
}

/// Normalises a possibly negative axis (`-1` is the last); `None` when out of range.
fn norm_axis(axis: isize, rank: usize) -> Option<usize> {
    let a = if axis < 0 { rank as isize + axis } else { axis };
    (0..rank as isize).contains(&a).then_some(a as usize)
}

impl Value {
    #[track_caller]
    pub fn exp(self) -> Value {
        unary(UnaryOp::Exp, self)
    }
    #[track_caller]
    pub fn log(self) -> Value {
        unary(UnaryOp::Log, self)
    }
    #[track_caller]
    pub fn tanh(self) -> Value {
        unary(UnaryOp::Tanh, self)
    }
    #[track_caller]
    pub fn sqrt(self) -> Value {
        unary(UnaryOp::Sqrt, self)
    }
    #[track_caller]
    pub fn rsqrt(self) -> Value {
        unary(UnaryOp::Rsqrt, self)
    }
    #[track_caller]
    pub fn abs(self) -> Value {
        unary(UnaryOp::Abs, self)
    }

    /// Elementwise maximum.
    #[track_caller]
    pub fn maximum(self, other: impl IntoValue) -> Value {
        binary(BinaryOp::Max, self, other)
    }

    /// Elementwise minimum.
    #[track_caller]
    pub fn minimum(self, other: impl IntoValue) -> Value {
        binary(BinaryOp::Min, self, other)
    }

    #[track_caller]
    pub fn eq(self, other: impl IntoValue) -> Value {
        compare(CmpOp::Eq, self, other)
    }
    #[track_caller]
    pub fn ne(self, other: impl IntoValue) -> Value {
        compare(CmpOp::Ne, self, other)
    }
    #[track_caller]
    pub fn lt(self, other: impl IntoValue) -> Value {
        compare(CmpOp::Lt, self, other)
    }
    #[track_caller]
    pub fn le(self, other: impl IntoValue) -> Value {
        compare(CmpOp::Le, self, other)
    }
    #[track_caller]
    pub fn gt(self, other: impl IntoValue) -> Value {
        compare(CmpOp::Gt, self, other)
    }
    #[track_caller]
    pub fn ge(self, other: impl IntoValue) -> Value {
        compare(CmpOp::Ge, self, other)
    }

    /// Converts to `dtype` (floats to ints truncate toward zero; to bool is `!= 0`).
    #[track_caller]
    pub fn cast(self, dtype: DType) -> Value {
        one(
            Op::Cast {
                x: self.id,
                to: dtype,
            },
            Loc::caller(),
        )
    }

    #[track_caller]
    pub fn reshape(self, shape: &[usize]) -> Value {
        one(
            Op::Reshape {
                x: self.id,
                shape: shape.to_vec(),
            },
            Loc::caller(),
        )
    }

    /// Broadcasts to `shape` under numpy rules.
    #[track_caller]
    pub fn broadcast_to(self, shape: &[usize]) -> Value {
        one(
            Op::Broadcast {
                x: self.id,
                shape: shape.to_vec(),
            },
            Loc::caller(),
        )
    }

    #[track_caller]
    fn reduce(self, op: ReduceOp, axis: isize, keepdims: bool) -> Value {
        let loc = Loc::caller();
        let shape = self.shape();
        let Some(axis) = norm_axis(axis, shape.len()) else {
            if !self.is_poisoned() {
                with_trace(|t| {
                    t.problem(
                        op.name(),
                        loc,
                        format!("axis {axis} is out of range for shape {shape:?}"),
                    )
                });
            }
            return poisoned_value();
        };
        let r = one(
            Op::Reduce {
                op,
                x: self.id,
                axis,
            },
            loc,
        );
        if keepdims && !r.is_poisoned() {
            let mut kept = shape;
            kept[axis] = 1;
            one(
                Op::Reshape {
                    x: r.id,
                    shape: kept,
                },
                loc,
            )
        } else {
            r
        }
    }

    /// Sum along `axis` (negative counts from the end), removing it.
    #[track_caller]
    pub fn sum(self, axis: isize) -> Value {
        self.reduce(ReduceOp::Sum, axis, false)
    }
    /// Maximum along `axis`, removing it.
    #[track_caller]
    pub fn max(self, axis: isize) -> Value {
        self.reduce(ReduceOp::Max, axis, false)
    }
    /// Minimum along `axis`, removing it.
    #[track_caller]
    pub fn min(self, axis: isize) -> Value {
        self.reduce(ReduceOp::Min, axis, false)
    }
    /// Sum along `axis`, keeping it with size 1.
    #[track_caller]
    pub fn sum_keepdims(self, axis: isize) -> Value {
        self.reduce(ReduceOp::Sum, axis, true)
    }
    /// Maximum along `axis`, keeping it with size 1.
    #[track_caller]
    pub fn max_keepdims(self, axis: isize) -> Value {
        self.reduce(ReduceOp::Max, axis, true)
    }
    /// Minimum along `axis`, keeping it with size 1.
    #[track_caller]
    pub fn min_keepdims(self, axis: isize) -> Value {
        self.reduce(ReduceOp::Min, axis, true)
    }
}

/// The index of the current grid step along `axis` (an i32 scalar).
#[track_caller]
pub fn program_id(axis: usize) -> Value {
    one(Op::ProgramId { axis }, Loc::caller())
}

/// The number of grid steps along `axis` (an i32 scalar).
#[track_caller]
pub fn num_programs(axis: usize) -> Value {
    one(Op::NumPrograms { axis }, Loc::caller())
}

/// Elementwise `cond ? on_true : on_false`, broadcasting all three.
#[track_caller]
pub fn select(cond: Value, on_true: impl IntoValue, on_false: impl IntoValue) -> Value {
    let loc = Loc::caller();
    let (t, f) = lift_pair(on_true, on_false);
    let (t, f) = broadcast_pair("select", t, f);
    let (c, t) = broadcast_pair("select", cond, t);
    let (c, f) = broadcast_pair("select", c, f);
    let (t, _) = broadcast_pair("select", t, f);
    one(
        Op::Select {
            cond: c.id,
            on_true: t.id,
            on_false: f.id,
        },
        loc,
    )
}

/// Elementwise maximum.
#[track_caller]
pub fn maximum(a: impl IntoValue, b: impl IntoValue) -> Value {
    binary(BinaryOp::Max, a, b)
}

/// Elementwise minimum.
#[track_caller]
pub fn minimum(a: impl IntoValue, b: impl IntoValue) -> Value {
    binary(BinaryOp::Min, a, b)
}

/// `times` copies of `x` side by side along `axis` (negative counts from the end), like
/// Pallas' `pltpu.repeat`: `repeat(x, 2, 1)` of `[a, b]` rows is `[a, b, a, b]`. On TPU
/// it is a `tpu.concatenate` of the copies, cheapest when the repeated dim is whole tiles
/// (a multiple of 128 on lanes, of 8 on sublanes: each copy is whole vregs): a value kept
/// lane-replicated at 128 wide meets a wider one by a repeat instead of a lane broadcast.
#[track_caller]
pub fn repeat(x: Value, times: usize, axis: isize) -> Value {
    let loc = Loc::caller();
    let shape = x.shape();
    let Some(axis) = norm_axis(axis, shape.len()) else {
        if !x.is_poisoned() {
            with_trace(|t| {
                t.problem(
                    "repeat",
                    loc,
                    format!("axis {axis} is out of range for shape {shape:?}"),
                )
            });
        }
        return poisoned_value();
    };
    one(
        Op::Repeat {
            x: x.id,
            times,
            axis,
        },
        loc,
    )
}

/// Integer indices along `dim` of an array of `shape` (like `jax.lax.broadcasted_iota`).
#[track_caller]
pub fn iota(dtype: DType, shape: &[usize], dim: usize) -> Value {
    one(
        Op::Iota {
            ty: ValueType::new(dtype, shape),
            dim,
        },
        Loc::caller(),
    )
}

/// Matrix product `a @ b` (rank 2); floats accumulate in and return f32.
#[track_caller]
pub fn dot(a: Value, b: Value) -> Value {
    dot_general(a, b, false, false)
}

/// `a @ b^T`, the product attention uses for `q k^T`.
#[track_caller]
pub fn dot_nt(a: Value, b: Value) -> Value {
    dot_general(a, b, false, true)
}

/// `a^T @ b`.
#[track_caller]
pub fn dot_tn(a: Value, b: Value) -> Value {
    dot_general(a, b, true, false)
}

/// Matrix product with explicit transposes of either side.
#[track_caller]
pub fn dot_general(a: Value, b: Value, transpose_lhs: bool, transpose_rhs: bool) -> Value {
    one(
        Op::Dot {
            lhs: a.id,
            rhs: b.id,
            transpose_lhs,
            transpose_rhs,
        },
        Loc::caller(),
    )
}

/// A run-time condition for [`when`]: a traced bool scalar.
#[diagnostic::on_unimplemented(
    message = "`when` takes a run-time condition (a traced bool `Value`), not `{Self}`",
    label = "this is known at compile time",
    note = "for a compile-time condition use a Rust `if`: it specialises the kernel"
)]
pub trait RunTimeCond {
    fn into_cond(self) -> Value;
}

impl RunTimeCond for Value {
    fn into_cond(self) -> Value {
        self
    }
}

/// Runs `body` only when the run-time bool scalar `cond` is true.
///
/// For compile-time conditions use a plain Rust `if`: it specialises the kernel instead.
#[track_caller]
pub fn when(cond: impl RunTimeCond, body: impl FnOnce()) {
    when_at(cond, body, Loc::caller())
}

/// [`when`] attributed to `loc` (for ops that trace control flow on the author's behalf).
pub(crate) fn when_at(cond: impl RunTimeCond, body: impl FnOnce(), loc: Loc) {
    let cond = cond.into_cond();
    let (then, ()) = trace_region(Vec::new(), |_| body());
    emit(
        Op::When {
            cond: cond.id,
            then,
            otherwise: Region::default(),
        },
        loc,
    );
}

/// Prints run-time values from inside a kernel; what [`debug_print!`](macro@crate::debug_print)
/// calls. `format` has one `{}` per value (`{{` and `}}` print a brace): scalars, or one
/// tile whose `{}` ends the format.
///
/// Where the line goes: the interpreter prints it with the grid step (to stderr, or to
/// [`InterpretOptions::debug_log`](crate::interpret::InterpretOptions::debug_log)), as
/// mosaic-eval does; on TPU it is the chip's log op (`tpu.log`, `tpu.log_buffer` for a
/// tile; scalars must be i32 there), which libtpu prints when the program is compiled with
/// `xla_tpu_enable_log_recorder`; the StableHLO path (XLA on CPU or GPU) leaves it out.
#[track_caller]
pub fn debug_print(format: &str, values: &[Value]) {
    emit(
        Op::DebugPrint {
            format: format.to_string(),
            args: values.iter().map(|v| v.id).collect(),
        },
        Loc::caller(),
    );
}

/// A run-time assertion inside a kernel (Pallas' `pl.debug_check`): when the bool scalar
/// `cond` is false, the run stops with `message`, this line and the grid step.
///
/// ```ignore
/// debug_check(table.at(i).ge(0), "page indices are never negative");
/// ```
///
/// The interpreter and mosaic-eval check it; on TPU it lowers to `cf.assert`, which
/// stops the chip; the StableHLO path (XLA on CPU or GPU) leaves it out.
#[track_caller]
pub fn debug_check(cond: impl RunTimeCond, message: &str) {
    let cond = cond.into_cond();
    emit(
        Op::DebugCheck {
            cond: cond.id,
            message: message.to_string(),
        },
        Loc::caller(),
    );
}

/// Marks the i32 scalar `index` as proven in range by the kernel's author: tessera makes no
/// run-time check where it indexes a ref (see [`crate::checks`]), and returns it unchanged.
///
/// Every index a kernel computes from run-time data (a table loaded from SMEM) is otherwise
/// checked before the access it feeds, on every backend, unless tessera proves it in range
/// from the shapes. Use this only for values whose range the kernel's own inputs guarantee
/// and something else checks (a table the host built and validated, as splash's `MaskInfo`
/// builds its block tables):
/// an index marked here that is out of range reads or writes past its buffer on a TPU.
///
/// ```ignore
/// let block = unchecked_index(kv_blocks.get([h, i, j]));
/// ```
pub fn unchecked_index(index: Value) -> Value {
    with_trace(|t| t.unchecked.insert(index.id));
    index
}

/// Runs `then` when the run-time bool scalar `cond` is true, else `otherwise`: `if`/`else` on
/// a run-time value (`scf.if` with an `else` region on TPU, as `lax.cond` in a Pallas kernel).
///
/// ```ignore
/// when_else(
///     kj.eq(0),
///     || acc.store(dot(x.load(), y.load())),
///     || acc.store(acc.load() + dot(x.load(), y.load())),
/// );
/// ```
#[track_caller]
pub fn when_else(cond: impl RunTimeCond, then: impl FnOnce(), otherwise: impl FnOnce()) {
    let cond = cond.into_cond();
    let loc = Loc::caller();
    let (then, ()) = trace_region(Vec::new(), |_| then());
    let (otherwise, ()) = trace_region(Vec::new(), |_| otherwise());
    emit(
        Op::When {
            cond: cond.id,
            then,
            otherwise,
        },
        loc,
    );
}

/// Values a [`fori_loop`] can carry from one iteration to the next.
pub trait Carry: Sized {
    fn flatten(&self) -> Vec<Value>;
    /// Rebuilds a carry of the same structure as `self` from `values`.
    fn rebuild(&self, values: &mut dyn Iterator<Item = Value>) -> Self;
}

impl Carry for () {
    fn flatten(&self) -> Vec<Value> {
        Vec::new()
    }
    fn rebuild(&self, _: &mut dyn Iterator<Item = Value>) -> Self {}
}

impl Carry for Value {
    fn flatten(&self) -> Vec<Value> {
        vec![*self]
    }
    fn rebuild(&self, values: &mut dyn Iterator<Item = Value>) -> Self {
        values.next().unwrap_or(*self)
    }
}

impl Carry for Vec<Value> {
    fn flatten(&self) -> Vec<Value> {
        self.clone()
    }
    fn rebuild(&self, values: &mut dyn Iterator<Item = Value>) -> Self {
        self.iter().map(|v| values.next().unwrap_or(*v)).collect()
    }
}

macro_rules! carry_tuple {
    ($($n:ident),+) => {
        impl<$($n: Carry),+> Carry for ($($n,)+) {
            #[allow(non_snake_case)]
            fn flatten(&self) -> Vec<Value> {
                let ($($n,)+) = self;
                let mut v = Vec::new();
                $(v.extend($n.flatten());)+
                v
            }
            #[allow(non_snake_case)]
            fn rebuild(&self, values: &mut dyn Iterator<Item = Value>) -> Self {
                let ($($n,)+) = self;
                ($($n.rebuild(values),)+)
            }
        }
    };
}
carry_tuple!(A);
carry_tuple!(A, B);
carry_tuple!(A, B, C);
carry_tuple!(A, B, C, D);
carry_tuple!(A, B, C, D, E);

/// `for i in lo..hi { carry = body(i, carry) }` at run time (not unrolled); returns the final
/// carry. Bounds are i32 scalars or Rust integers. For compile-time trip counts a Rust `for`
/// loop unrolls instead.
#[track_caller]
pub fn fori_loop<C: Carry>(
    lo: impl IntoValue,
    hi: impl IntoValue,
    init: C,
    body: impl FnOnce(Value, C) -> C,
) -> C {
    fori_loop_at(lo, hi, init, body, Loc::caller())
}

/// [`fori_loop`] attributed to `loc`.
#[track_caller]
pub(crate) fn fori_loop_at<C: Carry>(
    lo: impl IntoValue,
    hi: impl IntoValue,
    init: C,
    body: impl FnOnce(Value, C) -> C,
    loc: Loc,
) -> C {
    let lo = lo.into_value_like(Some(DType::I32));
    let hi = hi.into_value_like(Some(DType::I32));
    let init_values = init.flatten();
    let mut param_types = vec![ValueType::scalar(DType::I32)];
    param_types.extend(init_values.iter().map(|v| v.ty()));
    let (mut region, yielded) = trace_region(param_types, |params| {
        let carry = init.rebuild(&mut params[1..].iter().copied());
        body(params[0], carry)
    });
    let yielded_values = yielded.flatten();
    region.yields = yielded_values.iter().map(|v| v.id).collect();
    let any_poisoned = yielded_values.iter().any(|v| v.is_poisoned());
    let results = if any_poisoned {
        // The problem inside the body is already recorded; keep tracing without the loop.
        with_trace(|t| {
            yielded_values
                .iter()
                .map(|v| {
                    let id = t.fresh(t.types[v.id.index()].clone());
                    t.poisoned.insert(id);
                    Value { id }
                })
                .collect()
        })
    } else {
        emit(
            Op::ForLoop {
                lo: lo.id,
                hi: hi.id,
                init: init_values.iter().map(|v| v.id).collect(),
                body: region,
            },
            loc,
        )
    };
    init.rebuild(&mut results.into_iter())
}
