//! The VJP rule of every op kind: given the cotangents of an op's results, the cotangents of
//! its operands, emitted with the builder's own ops.
//!
//! | op | cotangent of the operands (`ct` of the result `y`) |
//! |---|---|
//! | `negate`, `add`, `subtract` | `-ct`; `ct`, `ct`; `ct`, `-ct` |
//! | `multiply`, `divide` | `ct b`, `ct a`; `ct / b`, `-ct y / b` |
//! | `remainder` | `ct`, `-ct trunc(a / b)` |
//! | `power` | `ct b a^(b-1)` (0 where `b = 0`), `ct y log a` (0 where `a = 0`) |
//! | `maximum`, `minimum` | `ct` to the operand equal to `y`, split in halves on a tie (JAX's rule) |
//! | `atan2(a, b)` | `ct b / (a² + b²)`, `-ct a / (a² + b²)` |
//! | `abs`, `exponential`, `exponential_minus_one` | `ct sign(x)`, `ct y`, `ct (y + 1)` |
//! | `log`, `log_plus_one` | `ct / x`, `ct / (1 + x)` |
//! | `tanh`, `logistic` | `ct (1 - y²)`, `ct y (1 - y)` |
//! | `sqrt`, `rsqrt`, `cbrt` | `ct / 2y`, `-ct y / 2x`, `ct / 3y²` |
//! | `sine`, `cosine` | `ct cos x`, `-ct sin x` |
//! | `sign`, `floor`, `ceil`, `round_*`, `compare`, `is_finite`, integer and bool ops, `iota`, `constant`, `partition_id`, `replica_id` | none (piecewise constant or not float) |
//! | `select(p, t, f)` | `select(p, ct, 0)`, `select(p, 0, ct)` |
//! | `clamp(lo, x, hi)` | `ct` to `x` where `lo <= x <= hi`, else to the bound that won (summed when a bound is a scalar) |
//! | `convert` | `ct` converted back (float to float; none to or from integers) |
//! | `broadcast_in_dim` | `ct` summed over the broadcast dims |
//! | `reshape`, `transpose`, `reverse` | reshaped back, inverse permutation, reversed |
//! | `slice` | `ct` padded with zeros into the operand (strides as interior padding) |
//! | `dynamic_slice` | `dynamic_update_slice(0, ct, starts)` |
//! | `dynamic_update_slice` | `ct` with the window zeroed; the window of `ct` |
//! | `gather` (rows) | `ct` scatter-added at the (clamped) row indices into zeros |
//! | `scatter` (rows, adding) | `ct`; the rows of `ct` at the indices (zero for an index out of range) |
//! | `concatenate` | slices of `ct` |
//! | `pad(x, v)` | `ct` cropped and strided back; `sum(ct) - sum(ct_x)` |
//! | `dot_general` | `ct` contracted with the other operand over its free dims, transposed into place |
//! | `reduce` (sum, max, min) | `ct` broadcast; for max/min to the elements equal to the result, split evenly among ties (the init value counts as one) |
//! | `all_to_all`, `all_gather`, `reduce_scatter` (sum), `collective_permute`, `all_reduce` (sum) | their transposes (see the module docs) |
//!
//! Counted `while` loops are differentiated by `loops.rs`. `if`, `case`, `func.call`,
//! `custom_call`, other loops and reductions with other bodies have no rule: differentiating
//! through one is an error telling the user to wrap it in a custom VJP.

use crate::builder::FuncBuilder;
use crate::ops::{
    BinaryOp, CollectiveAttrs, ComparisonDirection, DotDims, Grouping, Op, OpKind, Precision,
    Reducer, Region, UnaryOp, Value,
};
use crate::{DType, HloError, TensorType};

use super::autodiff_error;

type Cts = Vec<Option<Value>>;

/// The cotangents of `op`'s operands given those of its results (`needs`: which operands want
/// one; the others may be `None`).
pub(super) fn op_vjp(
    f: &mut FuncBuilder<'_>,
    op: &Op,
    cts: &[Option<Value>],
    needs: &[bool],
) -> Result<Cts, HloError> {
    let x = &op.operands;
    let n = x.len();
    // Every op with a rule has one result; `backward` only calls with some cotangent.
    let single = || -> Result<Value, HloError> {
        match cts {
            [Some(ct)] => Ok(*ct),
            _ => Err(no_rule(op, "it has several results")),
        }
    };
    let need = |i: usize| needs.get(i).copied().unwrap_or(false);
    let y = op.results.first().copied();
    let out = match &op.kind {
        OpKind::Constant(_)
        | OpKind::Iota { .. }
        | OpKind::Compare { .. }
        | OpKind::PartitionId
        | OpKind::ReplicaId => vec![None; n],
        OpKind::Unary(u) => vec![unary(f, *u, x[0], result(op)?, single()?)?],
        OpKind::Binary(b) => binary(f, *b, x[0], x[1], result(op)?, single()?, need)?,
        OpKind::Select => {
            let ct = single()?;
            let zero = zeros_like(f, ct)?;
            vec![
                None,
                need(1).then(|| f.select(x[0], ct, zero)).transpose()?,
                need(2).then(|| f.select(x[0], zero, ct)).transpose()?,
            ]
        }
        OpKind::Clamp => clamp(f, x, single()?, need)?,
        OpKind::Convert => {
            let from = ty(f, x[0])?.dtype;
            let to = ty(f, y.unwrap_or(x[0]))?.dtype;
            if from.is_float() && to.is_float() {
                vec![Some(f.convert(single()?, from)?)]
            } else {
                vec![None]
            }
        }
        OpKind::BroadcastInDim {
            broadcast_dimensions,
        } => vec![Some(unbroadcast(f, single()?, x[0], broadcast_dimensions)?)],
        OpKind::Reshape => {
            let dims = ty(f, x[0])?.dims;
            vec![Some(f.reshape(single()?, &dims)?)]
        }
        OpKind::Transpose { permutation } => {
            let mut inverse = vec![0; permutation.len()];
            for (i, &p) in permutation.iter().enumerate() {
                inverse[p as usize] = i as i64;
            }
            vec![Some(f.transpose(single()?, &inverse)?)]
        }
        // The barrier only fixes the form of the forward; each cotangent passes through.
        OpKind::OptimizationBarrier => cts.to_vec(),
        OpKind::Reverse { dimensions } => vec![Some(f.reverse(single()?, dimensions)?)],
        OpKind::Slice {
            start_indices,
            limit_indices: _,
            strides,
        } => {
            vec![Some(unslice(f, single()?, x[0], start_indices, strides)?)]
        }
        OpKind::DynamicSlice { .. } => {
            let zero = zeros_like(f, x[0])?;
            let mut out = vec![Some(f.dynamic_update_slice(zero, single()?, &x[1..])?)];
            out.extend(vec![None; n - 1]);
            out
        }
        // Gather clamps its indices into range: the transpose adds at the clamped rows.
        OpKind::GatherRows { .. } => {
            let rows = clamped_rows(f, x[0], x[1])?;
            let zero = zeros_like(f, x[0])?;
            vec![Some(f.scatter_add_rows(zero, rows, single()?)?), None]
        }
        // Scatter skips an update whose index is out of range: its cotangent is zero.
        OpKind::ScatterAddRows { .. } => {
            let ct = single()?;
            let updates = if need(2) {
                let rows = clamped_rows(f, ct, x[1])?;
                let in_range = f.eq(rows, x[1])?;
                let t = ty(f, x[2])?;
                let in_range = f.broadcast_in_dim(in_range, &t.dims, &[0])?;
                let picked = f.gather_rows(ct, rows)?;
                let zero = zeros_like(f, picked)?;
                Some(f.select(in_range, picked, zero)?)
            } else {
                None
            };
            vec![Some(ct), None, updates]
        }
        OpKind::DynamicUpdateSlice => {
            let ct = single()?;
            let starts = &x[2..];
            let mut out = Vec::with_capacity(n);
            out.push(if need(0) {
                let zero = zeros_like(f, x[1])?;
                Some(f.dynamic_update_slice(ct, zero, starts)?)
            } else {
                None
            });
            out.push(if need(1) {
                let dims = ty(f, x[1])?.dims;
                Some(f.dynamic_slice(ct, starts, &dims)?)
            } else {
                None
            });
            out.extend(vec![None; n - 2]);
            out
        }
        OpKind::Concatenate { dimension } => {
            let ct = single()?;
            let full = ty(f, ct)?.dims;
            let d = *dimension as usize;
            let mut start = 0;
            let mut out = Vec::with_capacity(n);
            for (i, &xi) in x.iter().enumerate() {
                let size = ty(f, xi)?.dims[d];
                if need(i) {
                    let mut lo = vec![0; full.len()];
                    lo[d] = start;
                    let mut hi = full.clone();
                    hi[d] = start + size;
                    out.push(Some(f.slice(ct, &lo, &hi)?));
                } else {
                    out.push(None);
                }
                start += size;
            }
            out
        }
        OpKind::Pad {
            low,
            high,
            interior,
        } => unpad(f, single()?, low, high, interior, need)?,
        OpKind::DotGeneral { dims, precision } => {
            dot_general(f, single()?, x[0], x[1], dims, *precision, need)?
        }
        OpKind::Reduce { dimensions } => reduce(f, op, dimensions, single()?, need)?,
        OpKind::AllToAll {
            split_dimension,
            concat_dimension,
            attrs,
            ..
        } => vec![Some(f.all_to_all(
            single()?,
            *concat_dimension,
            *split_dimension,
            &attrs.replica_groups,
            grouping(attrs),
        )?)],
        OpKind::AllGather {
            all_gather_dim,
            attrs,
        } => vec![Some(f.reduce_scatter(
            single()?,
            *all_gather_dim,
            Reducer::Sum,
            &attrs.replica_groups,
            grouping(attrs),
        )?)],
        OpKind::ReduceScatter {
            scatter_dimension,
            attrs,
        } => {
            sum_body(op, "reduce_scatter")?;
            vec![Some(f.all_gather(
                single()?,
                *scatter_dimension,
                &attrs.replica_groups,
                grouping(attrs),
            )?)]
        }
        OpKind::AllReduce { attrs } => {
            sum_body(op, "all_reduce")?;
            vec![Some(f.all_reduce(
                single()?,
                Reducer::Sum,
                &attrs.replica_groups,
                grouping(attrs),
            )?)]
        }
        OpKind::CollectivePermute {
            source_target_pairs,
            channel,
        } => {
            let reversed: Vec<(i64, i64)> =
                source_target_pairs.iter().map(|&(s, t)| (t, s)).collect();
            let g = if channel.is_some() {
                Grouping::CrossPartition
            } else {
                Grouping::CrossReplica
            };
            vec![Some(f.collective_permute(single()?, &reversed, g)?)]
        }
        OpKind::While => {
            return Err(no_rule(
                op,
                "only counted loops are differentiable, through the loop rule",
            ))
        }
        OpKind::If | OpKind::Case => {
            return Err(no_rule(op, "autodiff does not differentiate into branches"))
        }
        OpKind::Call { callee } => {
            return Err(no_rule(
                op,
                &format!("autodiff does not differentiate into the callee @{callee}"),
            ))
        }
        OpKind::CustomCall(c) => {
            return Err(no_rule(
                op,
                &format!("the target `{}` is opaque to autodiff", c.call_target_name),
            ))
        }
    };
    Ok(out)
}

/// The error for an op without a rule.
fn no_rule(op: &Op, why: &str) -> HloError {
    autodiff_error(
        op.kind.name(),
        format!(
            "no VJP rule ({why}); build the computation inside FuncBuilder::custom_vjp with a \
             VjpRule that emits its backward"
        ),
    )
}

fn result(op: &Op) -> Result<Value, HloError> {
    op.results
        .first()
        .copied()
        .ok_or_else(|| no_rule(op, "it has no result"))
}

fn ty(f: &FuncBuilder<'_>, v: Value) -> Result<TensorType, HloError> {
    f.value_type(v).cloned()
}

fn zeros_like(f: &mut FuncBuilder<'_>, v: Value) -> Result<Value, HloError> {
    let t = ty(f, v)?;
    f.splat(0.0, t)
}

fn full_like(f: &mut FuncBuilder<'_>, v: Value, value: f64) -> Result<Value, HloError> {
    let t = ty(f, v)?;
    f.splat(value, t)
}

/// `pred` as 1.0 / 0.0 of `like`'s type.
fn indicator(f: &mut FuncBuilder<'_>, pred: Value, like: Value) -> Result<Value, HloError> {
    let one = full_like(f, like, 1.0)?;
    let zero = zeros_like(f, like)?;
    f.select(pred, one, zero)
}

/// Sum of every element: a scalar.
fn sum_all(f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, HloError> {
    let rank = ty(f, x)?.rank() as i64;
    if rank == 0 {
        return Ok(x);
    }
    f.reduce(x, &(0..rank).collect::<Vec<_>>(), Reducer::Sum)
}

fn unary(
    f: &mut FuncBuilder<'_>,
    u: UnaryOp,
    x: Value,
    y: Value,
    ct: Value,
) -> Result<Option<Value>, HloError> {
    let d = match u {
        UnaryOp::Neg => return Ok(Some(f.neg(ct)?)),
        UnaryOp::Abs => f.sign(x)?,
        UnaryOp::Exp => y,
        UnaryOp::Expm1 => {
            let one = full_like(f, y, 1.0)?;
            f.add(y, one)?
        }
        UnaryOp::Log => return Ok(Some(f.div(ct, x)?)),
        UnaryOp::Log1p => {
            let one = full_like(f, x, 1.0)?;
            let x1 = f.add(x, one)?;
            return Ok(Some(f.div(ct, x1)?));
        }
        UnaryOp::Tanh => {
            let one = full_like(f, y, 1.0)?;
            let y2 = f.mul(y, y)?;
            f.sub(one, y2)?
        }
        UnaryOp::Logistic => {
            let one = full_like(f, y, 1.0)?;
            let rest = f.sub(one, y)?;
            f.mul(y, rest)?
        }
        UnaryOp::Sqrt => {
            let two = full_like(f, y, 2.0)?;
            let twice = f.mul(two, y)?;
            return Ok(Some(f.div(ct, twice)?));
        }
        UnaryOp::Rsqrt => {
            let half = full_like(f, y, -0.5)?;
            let r = f.div(y, x)?;
            f.mul(half, r)?
        }
        UnaryOp::Cbrt => {
            let three = full_like(f, y, 3.0)?;
            let y2 = f.mul(y, y)?;
            let d = f.mul(three, y2)?;
            return Ok(Some(f.div(ct, d)?));
        }
        UnaryOp::Sin => f.cos(x)?,
        UnaryOp::Cos => {
            let s = f.sin(x)?;
            f.neg(s)?
        }
        UnaryOp::Sign
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::RoundNearestEven
        | UnaryOp::RoundNearestAfz
        | UnaryOp::IsFinite
        | UnaryOp::Not
        | UnaryOp::Popcnt
        | UnaryOp::Clz => return Ok(None),
    };
    Ok(Some(f.mul(ct, d)?))
}

fn binary(
    f: &mut FuncBuilder<'_>,
    b: BinaryOp,
    lhs: Value,
    rhs: Value,
    y: Value,
    ct: Value,
    need: impl Fn(usize) -> bool,
) -> Result<Cts, HloError> {
    if !ty(f, y)?.dtype.is_float() {
        return Ok(vec![None, None]);
    }
    let (l, r) = (need(0), need(1));
    Ok(match b {
        BinaryOp::Add => vec![Some(ct), Some(ct)],
        BinaryOp::Sub => vec![Some(ct), r.then(|| f.neg(ct)).transpose()?],
        BinaryOp::Mul => vec![
            l.then(|| f.mul(ct, rhs)).transpose()?,
            r.then(|| f.mul(ct, lhs)).transpose()?,
        ],
        BinaryOp::Div => {
            let dl = l.then(|| f.div(ct, rhs)).transpose()?;
            let dr = if r {
                let cy = f.mul(ct, y)?;
                let q = f.div(cy, rhs)?;
                Some(f.neg(q)?)
            } else {
                None
            };
            vec![dl, dr]
        }
        BinaryOp::Rem => {
            let dr = if r {
                // rem(a, b) = a - trunc(a / b) b.
                let q = f.div(lhs, rhs)?;
                let s = f.sign(q)?;
                let a = f.abs(q)?;
                let fl = f.floor(a)?;
                let t = f.mul(s, fl)?;
                let ct_t = f.mul(ct, t)?;
                Some(f.neg(ct_t)?)
            } else {
                None
            };
            vec![Some(ct), dr]
        }
        BinaryOp::Pow => {
            let zero = zeros_like(f, y)?;
            let dl = if l {
                let one = full_like(f, y, 1.0)?;
                let bm1 = f.sub(rhs, one)?;
                let p = f.pow(lhs, bm1)?;
                let d = f.mul(rhs, p)?;
                let b0 = f.eq(rhs, zero)?;
                let d = f.select(b0, zero, d)?;
                Some(f.mul(ct, d)?)
            } else {
                None
            };
            let dr = if r {
                let lg = f.log(lhs)?;
                let d = f.mul(y, lg)?;
                let a0 = f.eq(lhs, zero)?;
                let d = f.select(a0, zero, d)?;
                Some(f.mul(ct, d)?)
            } else {
                None
            };
            vec![dl, dr]
        }
        BinaryOp::Max | BinaryOp::Min => {
            // The operand equal to the result takes the cotangent; on a tie each takes half.
            let half = full_like(f, y, 0.5)?;
            let one = full_like(f, y, 1.0)?;
            let zero = zeros_like(f, y)?;
            let l_eq = f.eq(lhs, y)?;
            let r_eq = f.eq(rhs, y)?;
            let mut out = Vec::with_capacity(2);
            for (want, mine, other) in [(l, l_eq, r_eq), (r, r_eq, l_eq)] {
                out.push(if want {
                    let share = f.select(other, half, one)?;
                    let w = f.select(mine, share, zero)?;
                    Some(f.mul(ct, w)?)
                } else {
                    None
                });
            }
            out
        }
        BinaryOp::Atan2 => {
            let a2 = f.mul(lhs, lhs)?;
            let b2 = f.mul(rhs, rhs)?;
            let den = f.add(a2, b2)?;
            let s = f.div(ct, den)?;
            let dl = l.then(|| f.mul(s, rhs)).transpose()?;
            let dr = if r {
                let t = f.mul(s, lhs)?;
                Some(f.neg(t)?)
            } else {
                None
            };
            vec![dl, dr]
        }
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightArithmetic
        | BinaryOp::ShiftRightLogical => vec![None, None],
    })
}

/// `clamp(lo, x, hi) = min(max(x, lo), hi)`: `x` takes the cotangent where it passes through
/// (`lo <= x`, and `max(x, lo) <= hi`), else the bound that won; a scalar bound sums it.
fn clamp(
    f: &mut FuncBuilder<'_>,
    x: &[Value],
    ct: Value,
    need: impl Fn(usize) -> bool,
) -> Result<Cts, HloError> {
    let (lo, v, hi) = (x[0], x[1], x[2]);
    let t = ty(f, v)?;
    if !t.dtype.is_float() {
        return Ok(vec![None; 3]);
    }
    let full = |f: &mut FuncBuilder<'_>, b: Value| -> Result<Value, HloError> {
        if ty(f, b)?.is_scalar() && !t.is_scalar() {
            f.broadcast_in_dim(b, &t.dims, &[])
        } else {
            Ok(b)
        }
    };
    let lo_full = full(f, lo)?;
    let hi_full = full(f, hi)?;
    let zero = zeros_like(f, ct)?;
    let raised = f.max(v, lo_full)?;
    let capped = f.gt(raised, hi_full)?;
    let below = f.lt(v, lo_full)?;
    let ct_raised = f.select(capped, zero, ct)?;
    let mut out = Vec::with_capacity(3);
    for (i, bound, sel) in [(0, lo, (below, ct_raised)), (2, hi, (capped, ct))] {
        out.push(if need(i) {
            let g = f.select(sel.0, sel.1, zero)?;
            Some(if ty(f, bound)?.is_scalar() {
                sum_all(f, g)?
            } else {
                g
            })
        } else {
            None
        });
    }
    let ct_x = need(1)
        .then(|| f.select(below, zero, ct_raised))
        .transpose()?;
    Ok(vec![out[0], ct_x, out[1]])
}

/// The transpose of `broadcast_in_dim`: sums `ct` over the dims the broadcast added or
/// expanded (size 1 to more) and puts the rest back in the operand's order and shape.
fn unbroadcast(
    f: &mut FuncBuilder<'_>,
    ct: Value,
    x: Value,
    bd: &[i64],
) -> Result<Value, HloError> {
    let xt = ty(f, x)?;
    let out = ty(f, ct)?.dims;
    let kept: Vec<usize> = (0..bd.len())
        .filter(|&i| !(xt.dims[i] == 1 && out[bd[i] as usize] != 1))
        .collect();
    let summed: Vec<i64> = (0..out.len() as i64)
        .filter(|d| !kept.iter().any(|&i| bd[i] == *d))
        .collect();
    let mut s = if summed.is_empty() {
        ct
    } else {
        f.reduce(ct, &summed, Reducer::Sum)?
    };
    // `s` holds the kept operand dims in the order of their result dims.
    let mut order = kept.clone();
    order.sort_by_key(|&i| bd[i]);
    if order != kept {
        let perm: Vec<i64> = kept
            .iter()
            .map(|i| order.iter().position(|o| o == i).unwrap_or(0) as i64)
            .collect();
        s = f.transpose(s, &perm)?;
    }
    if ty(f, s)?.dims != xt.dims {
        s = f.reshape(s, &xt.dims)?;
    }
    Ok(s)
}

/// The transpose of `slice`: `ct` padded with zeros back to the operand's shape.
fn unslice(
    f: &mut FuncBuilder<'_>,
    ct: Value,
    x: Value,
    start: &[i64],
    strides: &[i64],
) -> Result<Value, HloError> {
    let xt = ty(f, x)?;
    let ct_dims = ty(f, ct)?.dims;
    if ct_dims.contains(&0) {
        return f.splat(0.0, xt);
    }
    let zero = f.scalar(0.0, xt.dtype)?;
    let mut low = Vec::with_capacity(start.len());
    let mut high = Vec::with_capacity(start.len());
    let mut interior = Vec::with_capacity(start.len());
    for d in 0..start.len() {
        let last = start[d] + (ct_dims[d] - 1) * strides[d];
        low.push(start[d]);
        high.push(xt.dims[d] - 1 - last);
        interior.push(strides[d] - 1);
    }
    f.pad(ct, zero, &low, &high, &interior)
}

/// The transpose of `pad`: `ct` cropped by the edge padding and strided past the interior
/// padding; the padding value's cotangent is what is left of `ct`'s sum.
fn unpad(
    f: &mut FuncBuilder<'_>,
    ct: Value,
    low: &[i64],
    high: &[i64],
    interior: &[i64],
    need: impl Fn(usize) -> bool,
) -> Result<Cts, HloError> {
    let dtype = ty(f, ct)?.dtype;
    let zero = f.scalar(0.0, dtype)?;
    let neg = |v: &[i64]| v.iter().map(|x| -x).collect::<Vec<_>>();
    let cropped = f.pad(ct, zero, &neg(low), &neg(high), &vec![0; low.len()])?;
    let dims = ty(f, cropped)?.dims;
    let strides: Vec<i64> = interior.iter().map(|i| i + 1).collect();
    let ct_x = f.slice_strided(cropped, &vec![0; dims.len()], &dims, &strides)?;
    let ct_v = if need(1) {
        let total = sum_all(f, ct)?;
        let inner = sum_all(f, ct_x)?;
        Some(f.sub(total, inner)?)
    } else {
        None
    };
    Ok(vec![need(0).then_some(ct_x), ct_v])
}

/// One operand of a `dot_general`: its type and its batch, free and contracting dims.
struct DotSide<'a> {
    t: &'a TensorType,
    batch: &'a [i64],
    free: &'a [i64],
    contracting: &'a [i64],
}

/// The transpose of `dot_general` for both operands.
fn dot_general(
    f: &mut FuncBuilder<'_>,
    ct: Value,
    lhs: Value,
    rhs: Value,
    dims: &DotDims,
    precision: Option<[Precision; 2]>,
    need: impl Fn(usize) -> bool,
) -> Result<Cts, HloError> {
    let (lt, rt) = (ty(f, lhs)?, ty(f, rhs)?);
    if !lt.dtype.is_float() {
        return Ok(vec![None, None]);
    }
    let free = |rank: usize, batch: &[i64], contracting: &[i64]| -> Vec<i64> {
        (0..rank as i64)
            .filter(|d| !batch.contains(d) && !contracting.contains(d))
            .collect()
    };
    let lhs_free = free(lt.rank(), &dims.lhs_batch, &dims.lhs_contracting);
    let rhs_free = free(rt.rank(), &dims.rhs_batch, &dims.rhs_contracting);
    let l = DotSide {
        t: &lt,
        batch: &dims.lhs_batch,
        free: &lhs_free,
        contracting: &dims.lhs_contracting,
    };
    let r = DotSide {
        t: &rt,
        batch: &dims.rhs_batch,
        free: &rhs_free,
        contracting: &dims.rhs_contracting,
    };
    // `ct` is [batch, lhs free, rhs free] in the accumulation type; it meets the operands in
    // theirs.
    let nb = dims.lhs_batch.len() as i64;
    let (nl, nr) = (lhs_free.len() as i64, rhs_free.len() as i64);
    let ct_lhs_free: Vec<i64> = (nb..nb + nl).collect();
    let ct_rhs_free: Vec<i64> = (nb + nl..nb + nl + nr).collect();
    let ct_lhs = need(0)
        .then(|| dot_transpose(f, ct, rhs, &l, &r, &ct_rhs_free, precision))
        .transpose()?;
    let flipped = precision.map(|[a, b]| [b, a]);
    let ct_rhs = need(1)
        .then(|| dot_transpose(f, ct, lhs, &r, &l, &ct_lhs_free, flipped))
        .transpose()?;
    Ok(vec![ct_lhs, ct_rhs])
}

/// The cotangent of `this` operand of a `dot_general`: `ct` contracted with the `other`
/// operand over `other`'s free dims (`ct_other_free` in `ct`), accumulated in `ct`'s type
/// (the forward's) and returned in the operand's. The product holds the batch dims, this
/// side's free dims, then `other`'s contracting dims in increasing order, which are this
/// side's contracting dims, transposed back into place.
fn dot_transpose(
    f: &mut FuncBuilder<'_>,
    ct: Value,
    other: Value,
    this: &DotSide<'_>,
    other_side: &DotSide<'_>,
    ct_other_free: &[i64],
    precision: Option<[Precision; 2]>,
) -> Result<Value, HloError> {
    let acc = ty(f, ct)?.dtype;
    let ct = if acc == this.t.dtype {
        ct
    } else {
        f.convert(ct, this.t.dtype)?
    };
    let batch: Vec<i64> = (0..this.batch.len() as i64).collect();
    let d = DotDims::new(
        batch,
        other_side.batch.to_vec(),
        ct_other_free.to_vec(),
        other_side.free.to_vec(),
    );
    let g = f.dot_general(ct, other, &d, acc, precision)?;
    let mut sorted = other_side.contracting.to_vec();
    sorted.sort_unstable();
    // Which dim of this operand each dim of `g` is.
    let mut source: Vec<i64> = this.batch.to_vec();
    source.extend_from_slice(this.free);
    for c in &sorted {
        let k = other_side
            .contracting
            .iter()
            .position(|x| x == c)
            .unwrap_or_default();
        source.push(this.contracting[k]);
    }
    let perm: Vec<i64> = (0..this.t.rank() as i64)
        .map(|d| source.iter().position(|&s| s == d).unwrap_or_default() as i64)
        .collect();
    let g = if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        g
    } else {
        f.transpose(g, &perm)?
    };
    if acc == this.t.dtype {
        Ok(g)
    } else {
        f.convert(g, this.t.dtype)
    }
}

/// The reducer a region applies, if it is one binary op of its two arguments.
fn reducer_of(region: &Region) -> Option<BinaryOp> {
    let [a, b] = region.args[..] else {
        return None;
    };
    let [op] = &region.ops[..] else {
        return None;
    };
    match (&op.kind, &op.operands[..], &region.results[..]) {
        (OpKind::Binary(k), &[x, y], &[r])
            if r == op.results[0] && ((x, y) == (a, b) || (x, y) == (b, a)) =>
        {
            Some(*k)
        }
        _ => None,
    }
}

fn sum_body(op: &Op, what: &str) -> Result<(), HloError> {
    match op.regions.first().and_then(reducer_of) {
        Some(BinaryOp::Add) => Ok(()),
        _ => Err(no_rule(op, &format!("only a sum {what} is differentiable"))),
    }
}

/// `stablehlo.reduce` with a sum, max or min body.
fn reduce(
    f: &mut FuncBuilder<'_>,
    op: &Op,
    dims: &[i64],
    ct: Value,
    need: impl Fn(usize) -> bool,
) -> Result<Cts, HloError> {
    let reducer = op.regions.first().and_then(reducer_of);
    let (&[x, init], Some(reducer)) = (&op.operands[..], reducer) else {
        return Err(no_rule(
            op,
            "only reductions of one input with a sum, max or min body are differentiable",
        ));
    };
    let xt = ty(f, x)?;
    if !xt.dtype.is_float() {
        return Ok(vec![None, None]);
    }
    let kept: Vec<i64> = (0..xt.rank() as i64)
        .filter(|d| !dims.contains(d))
        .collect();
    match reducer {
        BinaryOp::Add => {
            let ct_x = need(0)
                .then(|| f.broadcast_in_dim(ct, &xt.dims, &kept))
                .transpose()?;
            let ct_init = need(1).then(|| sum_all(f, ct)).transpose()?;
            Ok(vec![ct_x, ct_init])
        }
        BinaryOp::Max | BinaryOp::Min => {
            let y = op.results[0];
            let yt = ty(f, y)?;
            let y_full = f.broadcast_in_dim(y, &xt.dims, &kept)?;
            let hit = f.compare(ComparisonDirection::Eq, x, y_full)?;
            let hit = indicator(f, hit, x)?;
            let count = f.reduce(hit, dims, Reducer::Sum)?;
            let init_full = f.broadcast_in_dim(init, &yt.dims, &[])?;
            let init_hit = f.eq(init_full, y)?;
            let init_hit = indicator(f, init_hit, y)?;
            let count = f.add(count, init_hit)?;
            let share = f.div(ct, count)?;
            let ct_x = if need(0) {
                let share_full = f.broadcast_in_dim(share, &xt.dims, &kept)?;
                Some(f.mul(hit, share_full)?)
            } else {
                None
            };
            let ct_init = if need(1) {
                let s = f.mul(share, init_hit)?;
                Some(sum_all(f, s)?)
            } else {
                None
            };
            Ok(vec![ct_x, ct_init])
        }
        _ => Err(no_rule(
            op,
            "only reductions with a sum, max or min body are differentiable (a product's \
             derivative at zeros needs the other elements' products)",
        )),
    }
}

/// The grouping a collective was built with.
fn grouping(attrs: &CollectiveAttrs) -> Grouping {
    match (attrs.channel, attrs.use_global_device_ids) {
        (None, _) => Grouping::CrossReplica,
        (Some(_), true) => Grouping::FlattenedIds,
        (Some(_), false) => Grouping::CrossPartition,
    }
}

/// `indices` (`[N]` i32) clamped into the rows of `x`, as gather reads them.
fn clamped_rows(f: &mut FuncBuilder<'_>, x: Value, indices: Value) -> Result<Value, HloError> {
    let rows = ty(f, x)?.dims[0];
    let lo = f.scalar(0.0, DType::I32)?;
    let hi = f.scalar((rows - 1) as f64, DType::I32)?;
    f.clamp(lo, indices, hi)
}
