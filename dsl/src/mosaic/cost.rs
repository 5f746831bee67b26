//! The cost estimate a `tpu_custom_call` carries, computed from the kernel IR.

use std::collections::HashMap;

use crate::ir::{
    eval_scalar, CmpOp, Kernel, MemorySpace, Op, OperandRole, Region, UnaryOp, ValueId,
};
use crate::tpu_facts::tpu_tile;

/// Work of one kernel call, for XLA's scheduler (the custom call's `cost_estimate`).
///
/// An upper bound: every `when` body counts as taken, except that of `when`s on `x == a`,
/// `x == b`, ... for one `x` (exclusive) only the costliest counts. A loop whose bounds are
/// known from constants, the grid's size, the device id and enclosing loops' indices counts
/// its trips, walked one iteration at a time where its body holds a loop (so a causal key
/// loop bounded by the query loop's index counts the blocks it runs; on a mesh, the bounds
/// of device 0); loops with bounds read at run time (a loaded length) count once. Every
/// grid step that does work counts as fetching its input
/// blocks and writing its output blocks (the pipeline skips a fetch when the block index
/// does not change). The steps that do work are every step, or as many as the caller says
/// ([`crate::CallFacts::active_grid_steps`]). Operands left in HBM count the bytes of the
/// copies that read or write them, each time a copy starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CostEstimate {
    /// Multiply-adds count two; elementwise arithmetic and reductions one per element.
    pub flops: u64,
    /// Elements of `exp`, `log`, `tanh`, `sqrt` and `rsqrt`.
    pub transcendentals: u64,
    /// Bytes read from and written to HBM.
    pub bytes_accessed: u64,
    /// Bytes remote copies send to other devices.
    pub remote_bytes: u64,
}

pub(crate) fn estimate(k: &Kernel, active_steps: Option<u64>) -> CostEstimate {
    let grid: u64 = k.grid.iter().map(|&n| n as u64).product();
    let steps = active_steps.map_or(grid, |n| n.min(grid));
    let mut per_step = CostEstimate::default();
    let mut walk = Walk {
        known: HashMap::new(),
        budget: ENUMERATED_ITERATIONS,
    };
    region(k, &k.body, 1, &mut walk, &mut per_step);
    let mut bytes = 0u64;
    for o in &k.operands {
        let elems = |shape: &[usize]| shape.iter().map(|&n| n as u64).product::<u64>();
        let size = o.dtype.size_bytes() as u64;
        bytes += match o.role {
            OperandRole::Input | OperandRole::Output if o.memory == MemorySpace::Any => 0,
            OperandRole::Input | OperandRole::Output => elems(&o.block_sizes()) * size * steps,
            OperandRole::ScalarPrefetch => elems(&o.array_shape) * size,
            OperandRole::Scratch => 0,
        };
    }
    CostEstimate {
        flops: per_step.flops * steps,
        transcendentals: per_step.transcendentals * steps,
        bytes_accessed: bytes + per_step.bytes_accessed * steps,
        remote_bytes: per_step.remote_bytes * steps,
    }
}

/// Loop iterations the estimate walks one at a time (to count a loop whose bounds an
/// enclosing loop's index sets) before it multiplies a body's cost by its trips instead.
const ENUMERATED_ITERATIONS: u64 = 1 << 16;

/// What the walk knows: the scalars it could evaluate (constants, the grid's size, the device
/// id as 0, indices of loops walked one iteration at a time and what is computed from them),
/// and how many more iterations it may walk one at a time.
struct Walk {
    known: HashMap<ValueId, i64>,
    budget: u64,
}

/// Whether `r` holds a loop (at any depth).
fn has_loop(r: &Region) -> bool {
    r.insts.iter().any(|inst| {
        matches!(inst.op, Op::ForLoop { .. }) || inst.op.regions().into_iter().any(has_loop)
    })
}

fn region(k: &Kernel, r: &Region, times: u64, walk: &mut Walk, cost: &mut CostEstimate) {
    // `cond -> x` for the conditions `x == constant` of this region, and the costliest
    // body so far of the `when`s on each such `x` (at most one of them runs).
    let mut equals: HashMap<ValueId, ValueId> = HashMap::new();
    let mut exclusive: HashMap<ValueId, CostEstimate> = HashMap::new();
    for inst in &r.insts {
        let elems = |v: ValueId| k.value_type(v).num_elements() as u64;
        if let [result] = inst.results[..] {
            let value = match &inst.op {
                Op::NumPrograms { axis } => Some(k.grid[*axis] as i64),
                Op::DeviceId => Some(0),
                op => eval_scalar(k, op, &|v| walk.known.get(&v).copied()),
            };
            // A value of an earlier iteration that this one cannot evaluate is forgotten.
            match value {
                Some(x) => walk.known.insert(result, x),
                None => walk.known.remove(&result),
            };
        }
        match &inst.op {
            Op::Dot {
                lhs, transpose_lhs, ..
            } => {
                let a = &k.value_type(*lhs).shape;
                let contracted = if *transpose_lhs { a[0] } else { a[1] } as u64;
                cost.flops += times * 2 * contracted * elems(inst.results[0]);
            }
            Op::Unary { op, x } => match op {
                UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Sqrt | UnaryOp::Rsqrt => {
                    cost.transcendentals += times * elems(*x);
                }
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not => cost.flops += times * elems(*x),
            },
            Op::Compare {
                op: CmpOp::Eq,
                lhs,
                rhs,
            } => {
                cost.flops += times * elems(*lhs);
                let x = match (walk.known.contains_key(lhs), walk.known.contains_key(rhs)) {
                    (false, true) => Some(*lhs),
                    (true, false) => Some(*rhs),
                    _ => None,
                };
                if let Some(x) = x {
                    equals.insert(inst.results[0], x);
                }
            }
            Op::Binary { lhs, .. } | Op::Compare { lhs, .. } => cost.flops += times * elems(*lhs),
            Op::Reduce { x, .. } => cost.flops += times * elems(*x),
            Op::When {
                then, otherwise, ..
            } if !otherwise.insts.is_empty() => {
                // One branch runs: count the costlier.
                let (mut a, mut b) = (CostEstimate::default(), CostEstimate::default());
                region(k, then, times, walk, &mut a);
                region(k, otherwise, times, walk, &mut b);
                let most = if b.flops + b.transcendentals > a.flops + a.transcendentals {
                    b
                } else {
                    a
                };
                cost.flops += most.flops;
                cost.transcendentals += most.transcendentals;
            }
            Op::When { cond, then, .. } => match equals.get(cond) {
                Some(x) => {
                    let mut body = CostEstimate::default();
                    region(k, then, times, walk, &mut body);
                    let most = exclusive.entry(*x).or_default();
                    if body.flops + body.transcendentals > most.flops + most.transcendentals {
                        *most = body;
                    }
                }
                None => region(k, then, times, walk, cost),
            },
            Op::ForLoop { lo, hi, body, .. } => {
                let index = body.params[0];
                match (walk.known.get(lo).copied(), walk.known.get(hi).copied()) {
                    (Some(l), Some(h)) => {
                        let trips = (h - l).max(0) as u64;
                        if has_loop(body) && trips <= walk.budget {
                            walk.budget -= trips;
                            for i in l..h {
                                walk.known.insert(index, i);
                                region(k, body, times, walk, cost);
                            }
                        } else {
                            walk.known.remove(&index);
                            region(k, body, times * trips, walk, cost);
                        }
                    }
                    _ => {
                        walk.known.remove(&index);
                        region(k, body, times, walk, cost);
                    }
                }
                walk.known.remove(&index);
            }
            Op::Scoped { body, .. } => region(k, body, times, walk, cost),
            // A copy reads or writes HBM on the sides that are HBM operands; a remote copy
            // sends its bytes (and writes the other device's memory, not this one's).
            Op::DmaStart {
                src, dst, remote, ..
            } => {
                let o = k.operand(src.r);
                let view = o.array_shape.clone();
                let window: u64 = src
                    .slices
                    .iter()
                    .zip(&view)
                    .map(|(s, &n)| s.len(n) as u64)
                    .product();
                let bytes = window * o.dtype.size_bytes() as u64;
                let in_hbm = |r| k.operand(r).memory == MemorySpace::Any;
                cost.bytes_accessed += times * bytes * u64::from(in_hbm(src.r));
                if remote.is_some() {
                    cost.remote_bytes += times * bytes;
                } else {
                    cost.bytes_accessed += times * bytes * u64::from(in_hbm(dst.r));
                }
            }
            Op::DeviceId
            | Op::DmaWait { .. }
            | Op::SemSignal { .. }
            | Op::SemWait { .. }
            | Op::SemRead { .. }
            | Op::DebugPrint { .. }
            | Op::DebugCheck { .. }
            | Op::StoreScalar { .. } => {}
            Op::ProgramId { .. }
            | Op::NumPrograms { .. }
            | Op::Constant { .. }
            | Op::Load { .. }
            | Op::Store { .. }
            | Op::LoadScalar { .. }
            | Op::Select { .. }
            | Op::Cast { .. }
            | Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::Repeat { .. }
            | Op::Iota { .. } => {}
        }
    }
    for body in exclusive.into_values() {
        cost.flops += body.flops;
        cost.transcendentals += body.transcendentals;
    }
}

/// Bytes of the largest vector value the kernel body defines, padded to TPU tiles. libtpu
/// keeps the values in vector registers and spills what does not fit to scoped VMEM, and
/// the room it takes is about one such value (measured on v5p: splash dQ at blocks 1024,
/// whose largest values are `[1024, 1024]` f32 score tiles of 4 MiB, spills 4.2 MiB).
pub(super) fn largest_value_bytes(k: &Kernel) -> usize {
    fn region(k: &Kernel, r: &Region) -> usize {
        let mut largest = 0;
        for inst in &r.insts {
            for &v in &inst.results {
                let t = k.value_type(v);
                if t.rank() >= 1 {
                    let (sub, lane) = tpu_tile(t.dtype);
                    let n = t.shape.len();
                    let rows = if n >= 2 { t.shape[n - 2] } else { 1 };
                    let lead: usize = t.shape[..n.saturating_sub(2)].iter().product();
                    let padded =
                        lead * rows.div_ceil(sub) * sub * t.shape[n - 1].div_ceil(lane) * lane;
                    largest = largest.max(padded * t.dtype.size_bytes().max(1));
                }
            }
            for r in inst.op.regions() {
                largest = largest.max(region(k, r));
            }
        }
        largest
    }
    region(k, &k.body)
}
