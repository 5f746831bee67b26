//! Which leading parallel grid dims the StableHLO lowering vectorises into batch dims.

use std::collections::{HashMap, HashSet};

use crate::ir::{
    dynamic_starts, BlockDim, DimSemantics, Kernel, Op, OperandRole, RefId, Region, ValueId,
};

/// The vectorisation plan of a kernel: `nb` leading grid dims become batch dims.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub nb: usize,
    /// For each blocked operand and array dim: the batch dim it is taken whole for, if any.
    pub batch_dims: HashMap<RefId, Vec<Option<usize>>>,
    /// IR values that carry the leading batch dims.
    pub batched: HashSet<ValueId>,
}

impl Plan {
    /// Whether the buffer the body sees for `r` carries batch dims.
    pub fn ref_batched(&self, k: &Kernel, r: RefId) -> bool {
        self.nb > 0
            && match k.operand(r).role {
                OperandRole::Scratch | OperandRole::Output => true,
                OperandRole::Input => self
                    .batch_dims
                    .get(&r)
                    .is_some_and(|m| m.iter().any(Option::is_some)),
                OperandRole::ScalarPrefetch => false,
            }
    }
}

/// The largest value a vectorised step may hold, in bytes (batch dims included): the size
/// of one core's L2 cache on the machines measured. Splash attention's forward at B=1, H=8,
/// S=4096, D=64 with 512 x 512 blocks (1 MiB of scores per head) ran slower with its eight
/// heads vectorised (8 MiB of scores per step) than as a loop over heads, while smaller
/// blocks gain from it (see docs/architecture.md for the numbers).
const VECTORISED_VALUE_BUDGET: usize = 2 << 20;

/// The largest prefix of leading parallel grid dims that can be vectorised (possibly none)
/// and keeps every batched value within [`VECTORISED_VALUE_BUDGET`].
pub(crate) fn plan(k: &Kernel) -> Plan {
    let leading = k
        .semantics
        .iter()
        .take_while(|s| **s == DimSemantics::Parallel)
        .count();
    (1..=leading)
        .rev()
        .filter_map(|nb| try_plan(k, nb))
        .find(|p| largest_batched_value(k, p) <= VECTORISED_VALUE_BUDGET)
        .unwrap_or_default()
}

/// The bytes of the largest value `p` makes carry batch dims (the batch dims included).
fn largest_batched_value(k: &Kernel, p: &Plan) -> usize {
    let batch: usize = k.grid[..p.nb].iter().product();
    p.batched
        .iter()
        .map(|&v| {
            let t = k.value_type(v);
            t.num_elements() * t.dtype.size_bytes() * batch
        })
        .max()
        .unwrap_or(0)
}

fn try_plan(k: &Kernel, nb: usize) -> Option<Plan> {
    let mut plan = Plan {
        nb,
        ..Plan::default()
    };
    for (i, o) in k.operands.iter().enumerate() {
        let Some(b) = &o.block else { continue };
        let map = &b.index_map;
        let vparams = &map.params[..nb];
        let dependent = dependents(map, vparams);
        let mut dims = vec![None; o.array_shape.len()];
        for (a, y) in map.yields.iter().enumerate() {
            if let Some(d) = vparams.iter().position(|p| p == y) {
                let whole_block =
                    matches!(b.block_shape[a], BlockDim::Squeezed | BlockDim::Sized(1));
                if !whole_block || dims.contains(&Some(d)) {
                    return None;
                }
                dims[a] = Some(d);
            } else if dependent.contains(y) {
                return None;
            }
        }
        if o.role == OperandRole::Output && (0..nb).any(|d| !dims.contains(&Some(d))) {
            // Batch elements would share an output block: not independent.
            return None;
        }
        plan.batch_dims.insert(crate::ir::RefId(i as u32), dims);
    }
    let batched_refs: HashSet<RefId> = (0..k.operands.len() as u32)
        .map(RefId)
        .filter(|r| plan.ref_batched(k, *r))
        .collect();
    let mut batched = HashSet::new();
    if !body_batched(k, &k.body, nb, &batched_refs, &mut batched) {
        return None;
    }
    plan.batched = batched;
    Some(plan)
}

/// Values of `r` that depend on any of `roots`.
pub(crate) fn dependents(r: &Region, roots: &[ValueId]) -> HashSet<ValueId> {
    let mut dep: HashSet<ValueId> = roots.iter().copied().collect();
    for inst in &r.insts {
        if inst.op.operands().iter().any(|v| dep.contains(v)) {
            dep.extend(inst.results.iter().copied());
        }
    }
    dep
}

/// Marks the batched values of a body region; false when something that must stay a
/// scalar (slice starts, SMEM indices, loop bounds) would depend on a batch dim.
fn body_batched(
    k: &Kernel,
    r: &Region,
    nb: usize,
    refs: &HashSet<RefId>,
    batched: &mut HashSet<ValueId>,
) -> bool {
    for inst in &r.insts {
        let any = |vs: &[ValueId], b: &HashSet<ValueId>| vs.iter().any(|v| b.contains(v));
        let out_batched = match &inst.op {
            Op::ProgramId { axis } => *axis < nb,
            Op::NumPrograms { .. } | Op::Constant { .. } | Op::Iota { .. } => false,
            Op::Load { src, slices }
            | Op::Store {
                dst: src, slices, ..
            } => {
                if any(&dynamic_starts(slices), batched) {
                    return false;
                }
                refs.contains(src)
            }
            // SMEM scratch is one word per element, sequential across steps: such kernels
            // loop over every grid step.
            Op::StoreScalar { .. } => return false,
            Op::LoadScalar { src, .. } if k.operand(*src).role == OperandRole::Scratch => {
                return false
            }
            Op::LoadScalar { indices, .. } => {
                if any(indices, batched) {
                    return false;
                }
                false
            }
            Op::When {
                then, otherwise, ..
            } => {
                if !body_batched(k, then, nb, refs, batched)
                    || !body_batched(k, otherwise, nb, refs, batched)
                {
                    return false;
                }
                false
            }
            Op::ForLoop { lo, hi, body, .. } => {
                if batched.contains(lo) || batched.contains(hi) {
                    return false;
                }
                // Carried values are always batched (simple, and correct).
                batched.extend(body.params[1..].iter().copied());
                if !body_batched(k, body, nb, refs, batched) {
                    return false;
                }
                true
            }
            other => any(&other.operands(), batched),
        };
        if out_batched {
            batched.extend(inst.results.iter().copied());
        }
    }
    let _ = k;
    true
}
