//! The StableHLO rules of kernels that move their own data.
//!
//! - HBM inputs are the argument arrays; HBM outputs, `Vmem` scratch and regular semaphores
//!   (an i32 count each, from zero) are values the grid loops carry, like scratch.
//! - A local copy is a `dynamic_slice` of its source and a `dynamic_update_slice` of its
//!   destination, where it starts; its wait is nothing. A kernel the interpreter finds
//!   race-free reads neither window between the two, so landing at the start is exact.
//! - Semaphore signals, waits and reads update and read the carried counts; DMA semaphores
//!   are not modelled (nothing reads them but waits, which always succeed here).
//! - Inside an SPMD program (one partition per device, [`super::lower_into_spmd`]) the device
//!   id is the partition id, and a remote copy is a `collective_permute` at the copy's grid
//!   step: every device runs the same grid in lockstep, so the copy is one collective of all
//!   devices. The permutation is computed at lowering: the target device must be a function
//!   of the device's mesh position and constants (`next`, `prev`, `at(i)` of a mesh axis) and
//!   every device may receive from at most one. The destination offsets may differ per device
//!   (the sender's offsets travel with the data). A remote copy or signal may sit in a `when`
//!   or `fori_loop` only if its condition or bounds are the same on every device (they depend
//!   on no device id, load or semaphore read). Remote signals are permutes of the increment.

use std::collections::{HashMap, HashSet};

use tessera_hlo::{self as hlo, ComparisonDirection, FuncBuilder, Grouping, HloError, TensorType};

use super::{dims, garbage, lower_error, Lower, R};
use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    eval_scalar, DType, Inst, Kernel, MemorySpace, Op, Operand, OperandRole, RefId, RefWindow,
    Region, SemKind, SemRef, Slice, ValueId,
};

/// Whether an operand without a block is carried through the grid loops: HBM outputs, VMEM
/// scratch and regular semaphores (DMA semaphores are not modelled).
pub(super) fn carried_unblocked(o: &Operand) -> bool {
    match (o.role, o.memory) {
        (OperandRole::Output, MemorySpace::Any) => true,
        (OperandRole::Scratch, MemorySpace::Semaphore(SemKind::Dma)) => false,
        (OperandRole::Scratch, _) => true,
        _ => false,
    }
}

/// A fresh buffer for a carried operand: garbage, or zero counts for a semaphore.
pub(super) fn fresh(
    b: &mut FuncBuilder<'_>,
    o: &Operand,
    shape: &[i64],
) -> Result<hlo::Value, HloError> {
    match o.memory {
        MemorySpace::Semaphore(_) => b.splat(0.0, TensorType::new(shape.to_vec(), DType::I32)),
        _ => garbage(b, o.dtype, shape),
    }
}

/// The refs an op writes as the StableHLO lowering sees them (what `when` and `fori_loop`
/// must carry): copy destinations, regular semaphores, scoped allocations.
pub(super) fn written_by(op: &Op) -> Vec<RefId> {
    match op {
        Op::DmaStart { dst, .. } => vec![dst.r],
        Op::SemSignal { sem, .. } | Op::SemWait { sem, .. } => vec![sem.sem],
        Op::Scoped { allocs, .. } => allocs.clone(),
        _ => Vec::new(),
    }
}

/// Where each value defined in `r` (nested regions too) is defined.
pub(super) fn definitions(r: &Region) -> HashMap<ValueId, &Inst> {
    let mut out = HashMap::new();
    fn walk<'a>(r: &'a Region, out: &mut HashMap<ValueId, &'a Inst>) {
        for inst in &r.insts {
            for &v in &inst.results {
                out.insert(v, inst);
            }
            for nested in inst.op.regions() {
                walk(nested, out);
            }
        }
    }
    walk(r, &mut out);
    out
}

fn spmd_error(k: &Kernel, inst: &Inst, message: String) -> KernelError {
    KernelError::new(
        &k.name,
        vec![Problem {
            kind: ProblemKind::Lower,
            subject: format!("`{}`", inst.op.name()),
            message,
            loc: Some(inst.loc),
        }],
    )
}

/// The error for lowering a multi-device kernel outside an SPMD program.
pub(super) fn needs_spmd(k: &Kernel) -> KernelError {
    KernelError::single(
        &k.name,
        ProblemKind::Lower,
        "mesh",
        format!(
            "the kernel runs on {} devices; lower it into an SPMD program with one partition \
             per device (`stablehlo::lower_into_spmd` or `lower_module_spmd`)",
            k.num_devices()
        ),
    )
}

/// Whether `r` (or a region nested in it) holds a remote copy or signal.
fn has_remote(r: &Region) -> bool {
    r.insts.iter().any(|i| {
        matches!(
            i.op,
            Op::DmaStart {
                remote: Some(_),
                ..
            } | Op::SemSignal {
                device: Some(_),
                ..
            }
        ) || i.op.regions().into_iter().any(has_remote)
    })
}

/// Values that may differ between devices: device ids, loads, SMEM and semaphore reads, and
/// everything computed from them.
fn varying(r: &Region, out: &mut HashSet<ValueId>) {
    for inst in &r.insts {
        let source = matches!(
            inst.op,
            Op::DeviceId | Op::Load { .. } | Op::LoadScalar { .. } | Op::SemRead { .. }
        );
        if source || inst.op.operands().iter().any(|v| out.contains(v)) {
            out.extend(inst.results.iter().copied());
        }
        if let Op::ForLoop { init, body, .. } = &inst.op {
            // Carried values vary if they start varying or the body makes them vary.
            for (&p, i) in body.params[1..].iter().zip(init) {
                if out.contains(i) {
                    out.insert(p);
                }
            }
            varying(body, out);
            for (&p, y) in body.params[1..].iter().zip(&body.yields) {
                if out.contains(y) && out.insert(p) {
                    varying(body, out);
                }
            }
            for (&res, y) in inst.results.iter().zip(&body.yields) {
                if out.contains(y) {
                    out.insert(res);
                }
            }
        } else {
            for nested in inst.op.regions() {
                varying(nested, out);
            }
        }
    }
}

/// Checks that `k` can be lowered into an SPMD program of `partitions` partitions: one per
/// device, remote operations only under conditions and loop bounds every device agrees on.
pub(super) fn check_spmd(k: &Kernel, partitions: usize) -> Result<(), KernelError> {
    if partitions != k.num_devices() {
        return Err(KernelError::single(
            &k.name,
            ProblemKind::Lower,
            "mesh",
            format!(
                "the kernel runs on {} devices but the SPMD program has {partitions} \
                 partitions; its partitions must be the kernel's devices",
                k.num_devices()
            ),
        ));
    }
    let mut vary = HashSet::new();
    varying(&k.body, &mut vary);
    fn walk(k: &Kernel, r: &Region, vary: &HashSet<ValueId>) -> Result<(), KernelError> {
        for inst in &r.insts {
            match &inst.op {
                Op::When {
                    cond,
                    then,
                    otherwise,
                } if (has_remote(then) || has_remote(otherwise)) && vary.contains(cond) => {
                    return Err(spmd_error(
                        k,
                        inst,
                        "a remote copy or signal under a `when` whose condition may differ \
                         between devices is not lowered to StableHLO (the devices would not \
                         all take part in its collective); compute the condition from grid and \
                         loop indices only"
                            .into(),
                    ))
                }
                Op::ForLoop { lo, hi, body, .. }
                    if has_remote(body) && (vary.contains(lo) || vary.contains(hi)) =>
                {
                    return Err(spmd_error(
                        k,
                        inst,
                        "a remote copy or signal in a `fori_loop` whose bounds may differ \
                         between devices is not lowered to StableHLO; give it bounds every \
                         device agrees on"
                            .into(),
                    ))
                }
                _ => {}
            }
            for nested in inst.op.regions() {
                walk(k, nested, vary)?;
            }
        }
        Ok(())
    }
    walk(k, &k.body, &vary)
}

impl<'k> Lower<'k> {
    /// The value of scalar `v` on device `d`, if it depends only on the device id and
    /// constants.
    fn on_device(
        &self,
        v: ValueId,
        d: usize,
        memo: &mut HashMap<ValueId, Option<i64>>,
    ) -> Option<i64> {
        if let Some(&known) = memo.get(&v) {
            return known;
        }
        let inst = self.defs.get(&v)?;
        let value = match &inst.op {
            Op::DeviceId => Some(d as i64),
            op => {
                let mut args = HashMap::new();
                for x in op.operands() {
                    args.insert(x, self.on_device(x, d, memo));
                }
                eval_scalar(self.k, op, &|x| args.get(&x).copied().flatten())
            }
        };
        memo.insert(v, value);
        value
    }

    /// The `(source, target)` device pairs of a remote operation whose target is `device`.
    fn pairs(&self, inst: &Inst, device: ValueId) -> R<Vec<(i64, i64)>> {
        let n = self.k.num_devices();
        let mut pairs = Vec::with_capacity(n);
        let mut targets = HashSet::new();
        for d in 0..n {
            let mut memo = HashMap::new();
            let Some(t) = self.on_device(device, d, &mut memo) else {
                return Err(spmd_error(
                    self.k,
                    inst,
                    "for the StableHLO lowering, the target device of a remote copy or signal \
                     must be computed from the device's mesh position and constants only \
                     (`next`, `prev` or `at` of a mesh axis), not from grid or loop indices or \
                     data"
                        .into(),
                ));
            };
            if !(0..n as i64).contains(&t) {
                return Err(spmd_error(
                    self.k,
                    inst,
                    format!("device {d} targets device {t}, outside the mesh of {n} devices"),
                ));
            }
            if !targets.insert(t) {
                return Err(spmd_error(
                    self.k,
                    inst,
                    format!(
                        "several devices target device {t}; the StableHLO lowering needs every \
                         device to receive from at most one (a permutation)"
                    ),
                ));
            }
            pairs.push((d as i64, t));
        }
        Ok(pairs)
    }

    fn window_starts(
        &self,
        b: &mut FuncBuilder<'_>,
        w: &RefWindow,
    ) -> Result<Vec<hlo::Value>, HloError> {
        w.slices
            .iter()
            .map(|s| match *s {
                Slice::Full => b.scalar(0.0, DType::I32),
                Slice::Static { start, .. } => b.scalar(start as f64, DType::I32),
                Slice::Dynamic { start, .. } => Ok(self.v(start)),
            })
            .collect()
    }

    fn copy_window_sizes(&self, w: &RefWindow) -> Vec<i64> {
        let view = self.k.operand(w.r).view_shape();
        w.slices
            .iter()
            .zip(&view)
            .map(|(s, &n)| s.len(n) as i64)
            .collect()
    }

    /// The window `w` of its ref, shaped like `like`'s window.
    fn read_window(
        &self,
        b: &mut FuncBuilder<'_>,
        w: &RefWindow,
        like: &RefWindow,
    ) -> Result<hlo::Value, HloError> {
        let starts = self.window_starts(b, w)?;
        let x = b.dynamic_slice(self.refs[&w.r], &starts, &self.copy_window_sizes(w))?;
        b.reshape(x, &self.copy_window_sizes(like))
    }

    /// The flat index of a semaphore as an i32 value (0 for a single one).
    fn sem_index(&self, sem: &SemRef) -> Vec<hlo::Value> {
        sem.index.iter().map(|&i| self.v(i)).collect()
    }

    /// Adds `amount` (i32 scalar) to semaphore `sem` at `index`.
    fn sem_add(
        &mut self,
        b: &mut FuncBuilder<'_>,
        sem: RefId,
        index: &[hlo::Value],
        amount: hlo::Value,
    ) -> Result<(), HloError> {
        let counts = self.refs[&sem];
        let next = if index.is_empty() {
            b.add(counts, amount)?
        } else {
            let ones = vec![1; index.len()];
            let old = b.dynamic_slice(counts, index, &ones)?;
            let amount = b.reshape(amount, &ones)?;
            let new = b.add(old, amount)?;
            b.dynamic_update_slice(counts, new, index)?
        };
        self.refs.insert(sem, next);
        Ok(())
    }

    pub(super) fn memory_inst(&mut self, b: &mut FuncBuilder<'_>, inst: &Inst) -> R<()> {
        let k = self.k;
        let e = self.err(inst);
        match &inst.op {
            Op::DeviceId => {
                let id = if self.spmd {
                    b.partition_id()
                } else {
                    b.scalar(0.0, DType::I32).map_err(&e)?
                };
                self.env.insert(inst.results[0], id);
            }
            Op::DmaStart {
                src,
                dst,
                remote: None,
                ..
            } => {
                let data = self.read_window(b, src, dst).map_err(&e)?;
                let starts = self.window_starts(b, dst).map_err(&e)?;
                let next = b
                    .dynamic_update_slice(self.refs[&dst.r], data, &starts)
                    .map_err(&e)?;
                self.refs.insert(dst.r, next);
            }
            Op::DmaStart {
                src,
                dst,
                remote: Some(remote),
                ..
            } => {
                let pairs = self.pairs(inst, remote.device)?;
                let permute = |b: &mut FuncBuilder<'_>, x: hlo::Value| {
                    b.collective_permute(x, &pairs, Grouping::CrossPartition)
                };
                let data = self.read_window(b, src, dst).map_err(&e)?;
                let starts = self.window_starts(b, dst).map_err(&e)?;
                let got = b.scalar(1.0, DType::I32).map_err(&e)?;
                let got = permute(b, got).map_err(&e)?;
                let data = permute(b, data).map_err(&e)?;
                let starts: Vec<hlo::Value> = starts
                    .into_iter()
                    .map(|s| permute(b, s))
                    .collect::<Result<_, _>>()
                    .map_err(&e)?;
                let old = self.refs[&dst.r];
                let landed = b.dynamic_update_slice(old, data, &starts).map_err(&e)?;
                let zero = b.scalar(0.0, DType::I32).map_err(&e)?;
                let got = b.compare(ComparisonDirection::Ne, got, zero).map_err(&e)?;
                let shape = dims(&k.operand(dst.r).view_shape());
                let mask = b.broadcast_in_dim(got, &shape, &[]).map_err(&e)?;
                let next = b.select(mask, landed, old).map_err(&e)?;
                self.refs.insert(dst.r, next);
            }
            Op::DmaWait { .. } => {}
            Op::SemSignal { sem, inc, device } => {
                let index = self.sem_index(sem);
                let amount = self.v(*inc);
                match device {
                    None => self.sem_add(b, sem.sem, &index, amount).map_err(&e)?,
                    Some(dev) => {
                        let pairs = self.pairs(inst, *dev)?;
                        let mut permute = |x: hlo::Value| {
                            b.collective_permute(x, &pairs, Grouping::CrossPartition)
                        };
                        let amount = permute(amount).map_err(&e)?;
                        let index: Vec<hlo::Value> = index
                            .into_iter()
                            .map(&mut permute)
                            .collect::<Result<_, _>>()
                            .map_err(&e)?;
                        // A device that receives nothing adds 0 (at index 0).
                        self.sem_add(b, sem.sem, &index, amount).map_err(&e)?;
                    }
                }
            }
            Op::SemWait { sem, value } => {
                let index = self.sem_index(sem);
                let amount = b.neg(self.v(*value)).map_err(&e)?;
                self.sem_add(b, sem.sem, &index, amount).map_err(&e)?;
            }
            Op::SemRead { sem } => {
                let o = k.operand(sem.sem);
                let value = if o.memory == MemorySpace::Semaphore(SemKind::Dma) {
                    // DMA semaphores are not modelled: every copy has landed and been waited.
                    b.scalar(0.0, DType::I32).map_err(&e)?
                } else {
                    let index = self.sem_index(sem);
                    let counts = self.refs[&sem.sem];
                    if index.is_empty() {
                        counts
                    } else {
                        let ones = vec![1; index.len()];
                        let one = b.dynamic_slice(counts, &index, &ones).map_err(&e)?;
                        b.reshape(one, &[]).map_err(&e)?
                    }
                };
                self.env.insert(inst.results[0], value);
            }
            Op::Scoped { allocs, body } => {
                for &r in allocs {
                    let o = k.operand(r);
                    if carried_unblocked(o) {
                        let fresh = fresh(b, o, &dims(&o.array_shape)).map_err(&e)?;
                        self.refs.insert(r, fresh);
                    }
                }
                let yields = self.region(b, body, &[])?;
                for (&r, v) in inst.results.iter().zip(yields) {
                    self.env.insert(r, v);
                }
            }
            other => {
                return Err(lower_error(
                    k,
                    other.name(),
                    inst.loc,
                    HloError::Module {
                        reason: "not a memory op".into(),
                    },
                ))
            }
        }
        Ok(())
    }
}
