//! What Mosaic accepts inside a kernel, checked op by op when a kernel is instantiated under
//! TPU rules, so that a kernel that passes compiles for TPU. Each rule is one that libtpu's
//! Mosaic compiler was seen to enforce (`tests/mosaic_tpu_compile.rs` compiles a kernel
//! breaking each rule and expects the compiler to refuse it).

use crate::error::{Problem, ProblemKind};
use crate::ir::{DType, Inst, Kernel, Op, RefId, Region, ValueType};

/// Every operand and op of `k` that Mosaic would refuse, with its line and the fix.
pub fn check(k: &Kernel) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, o) in k.operands.iter().enumerate() {
        if o.dtype == DType::Bool {
            problems.push(Problem {
                kind: ProblemKind::TpuOp,
                subject: k.describe(RefId(i as u32)),
                message: "holds bool, which Mosaic cannot keep in memory; pass it as i32 (or \
                          i8) and compare it with 0 after loading"
                    .into(),
                loc: Some(o.loc),
            });
        }
        if let Some(b) = &o.block {
            region(k, &b.index_map, &mut problems);
        }
    }
    region(k, &k.body, &mut problems);
    problems.extend(super::mosaic_copies::check(k));
    problems
}

fn region(k: &Kernel, r: &Region, problems: &mut Vec<Problem>) {
    for inst in &r.insts {
        if let Some(message) = refusal(k, inst) {
            problems.push(Problem {
                kind: ProblemKind::TpuOp,
                subject: format!("`{}`", inst.op.name()),
                message,
                loc: Some(inst.loc),
            });
        }
        for nested in inst.op.regions() {
            region(k, nested, problems);
        }
    }
}

fn is_vector(t: &ValueType) -> bool {
    t.rank() >= 1
}

/// The last two dims of a shape, with missing leading dims as 1 (the dims TPU tiles).
fn tiled(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (1, *n),
        [.., a, b] => (*a, *b),
    }
}

/// Why Mosaic would refuse `inst`, or `None`.
fn refusal(k: &Kernel, inst: &Inst) -> Option<String> {
    let ty = |v| k.value_type(v);
    let results: Vec<&ValueType> = inst.results.iter().map(|&v| ty(v)).collect();
    let operands: Vec<&ValueType> = inst.op.operands().into_iter().map(ty).collect();
    let i8_vector = results
        .iter()
        .chain(&operands)
        .any(|t| t.dtype == DType::I8 && is_vector(t));
    match &inst.op {
        Op::Load { .. } | Op::Store { .. } => None,
        Op::Cast { x, to } => {
            let from = ty(*x);
            let narrow = |d: DType| d == DType::I8 && is_vector(from);
            let wide = |d: DType| matches!(d, DType::I32 | DType::F32);
            if (narrow(from.dtype) && !wide(*to)) || (narrow(*to) && !wide(from.dtype)) {
                Some(format!(
                    "Mosaic converts i8 vectors only to and from i32 or f32, not {} to {to}; \
                     cast through i32",
                    from.dtype
                ))
            } else {
                scalar_refusal(inst, &operands, &results)
            }
        }
        _ if i8_vector => Some(format!(
            "Mosaic computes on 32-bit (and 16-bit) vectors, not i8: `{}` on an i8 vector; \
             cast it to i32 after loading (`.cast(DType::I32)`)",
            inst.op.name()
        )),
        Op::Iota { ty, .. } if ty.rank() < 2 => Some(format!(
            "Mosaic makes iotas of rank 2 or more, not {:?}; use a shape like [1, {}] and \
             reshape",
            ty.shape,
            ty.shape.first().copied().unwrap_or(1)
        )),
        Op::Reduce { x, .. } if ty(*x).rank() < 2 => Some(format!(
            "Mosaic reduces vectors of rank 2 or more, not {:?} (a reduction to a scalar or \
             of a rank-1 vector); reshape to [1, n] first, or keep the dims of the earlier \
             reduction (`sum_keepdims`)",
            ty(*x).shape
        )),
        Op::Reshape { x, shape } => {
            let from = &ty(*x).shape;
            let keeps_tiles = !from.is_empty() && !shape.is_empty() && tiled(from) == tiled(shape);
            let adds_unit_lane = shape.len() == from.len() + 1
                && shape.last() == Some(&1)
                && shape[..from.len()] == from[..];
            // A row of 32-bit elements as a column or back (`(1, n)` <-> `(n, 1)`): a
            // shape cast through the 1-D vector, as JAX's splash turns its lane-dense
            // residual rows into columns.
            let row_column = ty(*x).dtype.size_bytes() == 4
                && matches!((&from[..], &shape[..]), ([1, a], [b, 1]) | ([a, 1], [1, b]) if a == b);
            // One 32-bit element out of a vector: `vector.extract` into a scalar register.
            let extracts_scalar =
                shape.is_empty() && from.iter().all(|&d| d == 1) && ty(*x).dtype.size_bytes() == 4;
            if from.is_empty()
                || keeps_tiles
                || adds_unit_lane
                || row_column
                || extracts_scalar
                || from == shape
            {
                scalar_refusal(inst, &operands, &results)
            } else {
                Some(format!(
                    "Mosaic reshapes vectors only when the last two dims stay the same (leading \
                     dims may change), a trailing dim of 1 is added, a 32-bit row becomes a \
                     column or back, or one 32-bit element becomes a scalar; {from:?} to {shape:?} \
                     changes the tiled dims; restructure the computation (e.g. load the block \
                     in the shape you need)"
                ))
            }
        }
        Op::DebugPrint { .. } => {
            let not_i32 = operands
                .iter()
                .find(|t| t.is_scalar() && t.dtype != DType::I32);
            not_i32.map(|t| {
                format!(
                    "the TPU's log formats i32 scalars only, not a {} scalar; cast it to i32 \
                     (`.cast(DType::I32)`), or print it as a tile (`debug_print!(\"x = {{}}\", \
                     tile)`)",
                    t.dtype
                )
            })
        }
        Op::Dot { lhs, .. } if !ty(*lhs).dtype.is_float() => Some(format!(
            "the MXU multiplies f32 or bf16 operands, not {}; cast the operands to bf16 or f32",
            ty(*lhs).dtype
        )),
        _ => scalar_refusal(inst, &operands, &results),
    }
}

/// Scalars live in the scalar unit, which computes on 32-bit values: arithmetic, compares
/// and selects on bf16 or i8 scalars are refused (constants and casts are fine: they become
/// vector constants or conversions when broadcast).
fn scalar_refusal(inst: &Inst, operands: &[&ValueType], results: &[&ValueType]) -> Option<String> {
    let computes = matches!(
        inst.op,
        Op::Unary { .. } | Op::Binary { .. } | Op::Compare { .. } | Op::Select { .. }
    );
    if !computes {
        return None;
    }
    let narrow = operands
        .iter()
        .chain(results)
        .find(|t| !is_vector(t) && matches!(t.dtype, DType::BF16 | DType::I8))?;
    Some(format!(
        "TPU scalars are 32-bit: `{}` computes on a {} scalar; compute it in {} and cast \
         the result",
        inst.op.name(),
        narrow.dtype,
        if narrow.dtype.is_float() {
            "f32"
        } else {
            "i32"
        }
    ))
}
