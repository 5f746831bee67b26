//! The Mosaic rules of memory: loads and stores of windows (`vector.load`,
//! `tpu.vector_store`) and of SMEM scalars (`memref.load`, `memref.store`), and those of
//! kernels that move their own data, in the forms JAX's Pallas TPU lowering emits (read from
//! its output for `paged_attention` and `all_gather`):
//!
//! - a copy window is a `tpu.memref_slice` of its operand (i32 offsets), followed, when the
//!   source and destination windows differ in their unit dims, by a `tpu.memref_squeeze` of
//!   each to the windows' common shape without unit dims;
//! - `async_copy` is `tpu.enqueue_dma source(..) target(..) target_semaphore(..)`; a remote
//!   copy adds `source_semaphore(..)` and `device_id(..)`;
//! - a wait is `tpu.wait_dma2 semaphore(..) src(..) dst(..)`; the wait of a remote copy's send
//!   side names its windows swapped and a placeholder device and core (`device_id(0)
//!   core_id(0)`), as Pallas' `wait_send` does; a receive side waits like a local copy (its
//!   semaphore is this device's);
//! - one semaphore of an array is a `tpu.memref_slice` and `tpu.memref_squeeze` to rank 0;
//!   `tpu.sem_signal` (with `device_id` for a remote signal), `tpu.sem_wait`, `tpu.sem_read`;
//!   the barrier semaphore is `tpu.sem_barrier` (the custom call then needs a
//!   `collective_id`);
//! - `run_scoped` is a `tpu.region` whose VMEM buffers are `memref.alloca`s and whose
//!   semaphores are `tpu.sem_alloc`s, yielding its results with `tpu.yield`.

use super::{memref_type, ref_type, results_prefix, value_type, vector_type, Emitter, R};
use crate::ir::{
    squeezed, Inst, Kernel, Loc, MemorySpace, Op, RefId, RefWindow, Region, RemoteDma, SemKind,
    SemRef, Slice, ValueId, ValueType,
};

/// The memref type of one semaphore of `kind`.
fn sem_type(kind: SemKind) -> String {
    memref_type(&[], crate::ir::DType::I32, MemorySpace::Semaphore(kind))
}

/// Whether the kernel communicates with other devices: remote copies or signals, or the
/// barrier semaphore (the custom call's `has_communication`).
pub(super) fn has_communication(k: &Kernel) -> bool {
    fn walk(r: &Region) -> bool {
        r.insts.iter().any(|inst| {
            matches!(
                inst.op,
                Op::DmaStart {
                    remote: Some(_),
                    ..
                } | Op::SemSignal {
                    device: Some(_),
                    ..
                }
            ) || inst.op.regions().into_iter().any(walk)
        })
    }
    walk(&k.body) || uses_barrier(k)
}

/// Whether the kernel uses the barrier semaphore.
pub(super) fn uses_barrier(k: &Kernel) -> bool {
    k.operands
        .iter()
        .any(|o| o.memory == MemorySpace::Semaphore(SemKind::Barrier))
}

impl Emitter<'_> {
    /// `vector.load` of a window of `src`, cast to the result's shape.
    pub(super) fn load(
        &mut self,
        src: &RefId,
        slices: &[Slice],
        ty: &ValueType,
        loc: Loc,
    ) -> String {
        let k = self.k;
        let (indices, shape) = self.window(*src, slices, loc);
        let r = self.refs[src].clone();
        let v = self.emit(
            &format!(
                "vector.load {r}[{}] : {}, {}",
                indices.join(", "),
                ref_type(k, *src),
                vector_type(&shape, ty.dtype)
            ),
            loc,
        );
        self.shape_cast(&v, &shape, &ty.shape, ty.dtype, loc)
    }

    /// `tpu.vector_store` of `value` into a window of `dst`.
    pub(super) fn store(&mut self, dst: &RefId, slices: &[Slice], value: &ValueId, loc: Loc) {
        let k = self.k;
        let (indices, shape) = self.window(*dst, slices, loc);
        let vt = self.ty(*value);
        let v = self.v(*value);
        let v = self.shape_cast(&v, &vt.shape, &shape, vt.dtype, loc);
        let r = self.refs[dst].clone();
        self.line(
            &format!(
                "tpu.vector_store {r}[{}], {v} {{strides = array<i32>}} : {}, {},",
                indices.join(", "),
                ref_type(k, *dst),
                vector_type(&shape, vt.dtype)
            ),
            loc,
        );
    }

    /// `memref.load` of one element of `src` (SMEM scalars).
    pub(super) fn load_scalar(&mut self, src: &RefId, indices: &[ValueId], loc: Loc) -> String {
        let k = self.k;
        let idx = self.index_values(indices, loc);
        let r = self.refs[src].clone();
        self.emit(
            &format!(
                "memref.load {r}[{}] : {}",
                idx.join(", "),
                ref_type(k, *src)
            ),
            loc,
        )
    }

    /// `memref.store` of one element into `dst`.
    pub(super) fn store_scalar(
        &mut self,
        dst: &RefId,
        indices: &[ValueId],
        value: &ValueId,
        loc: Loc,
    ) {
        let k = self.k;
        let idx = self.index_values(indices, loc);
        let (r, v) = (self.refs[dst].clone(), self.v(*value));
        self.line(
            &format!(
                "memref.store {v}, {r}[{}] : {}",
                idx.join(", "),
                ref_type(k, *dst)
            ),
            loc,
        );
    }

    /// Binds the barrier semaphore, when the kernel has one, at the top of the body.
    pub(super) fn barrier(&mut self) -> R<()> {
        let barrier = self
            .k
            .operands
            .iter()
            .position(|o| o.memory == MemorySpace::Semaphore(SemKind::Barrier));
        if let Some(i) = barrier {
            let loc = self.k.operands[i].loc;
            let name = self.emit(
                &format!("tpu.sem_barrier : {}", sem_type(SemKind::Barrier)),
                loc,
            );
            self.refs.insert(RefId(i as u32), name);
        }
        Ok(())
    }

    /// An i32 constant.
    fn i32_const(&mut self, v: usize, loc: Loc) -> String {
        self.emit(&format!("arith.constant {v} : i32"), loc)
    }

    /// A window of a copy as a memref: the operand itself when the window is all of it, else
    /// a `tpu.memref_slice`. Returns the memref and its shape.
    fn window_ref(&mut self, w: &RefWindow, loc: Loc) -> (String, Vec<usize>) {
        let o = self.k.operand(w.r);
        let full = o.array_shape.clone();
        let base = self.refs[&w.r].clone();
        if w.slices.iter().all(|s| matches!(s, Slice::Full)) {
            return (base, full);
        }
        let mut offsets = Vec::with_capacity(full.len());
        let mut shape = Vec::with_capacity(full.len());
        for (s, &n) in w.slices.iter().zip(&full) {
            offsets.push(match *s {
                Slice::Full => self.i32_const(0, loc),
                Slice::Static { start, .. } => self.i32_const(start, loc),
                Slice::Dynamic { start, .. } => self.v(start),
            });
            shape.push(s.len(n));
        }
        let (dtype, memory) = (o.dtype, o.memory);
        let name = self.emit(
            &format!(
                "tpu.memref_slice {base}[{}] : {} -> {}",
                offsets.join(", "),
                memref_type(&full, dtype, memory),
                memref_type(&shape, dtype, memory)
            ),
            loc,
        );
        (name, shape)
    }

    /// `tpu.memref_squeeze` of `m` (of `shape`) to `to` (`shape` without some unit dims).
    fn squeeze(&mut self, m: String, r: RefId, shape: &[usize], to: &[usize], loc: Loc) -> String {
        if shape == to {
            return m;
        }
        let o = self.k.operand(r);
        let (dtype, memory) = (o.dtype, o.memory);
        self.emit(
            &format!(
                "tpu.memref_squeeze {m} : {} -> {}",
                memref_type(shape, dtype, memory),
                memref_type(to, dtype, memory)
            ),
            loc,
        )
    }

    /// Both windows of a copy as memrefs of one shape (squeezed when their unit dims
    /// differ), with that memref type for each.
    fn copy_refs(
        &mut self,
        src: &RefWindow,
        dst: &RefWindow,
        loc: Loc,
    ) -> ((String, String), (String, String)) {
        let (s, ss) = self.window_ref(src, loc);
        let (d, ds) = self.window_ref(dst, loc);
        let (s, ss, d, ds) = if ss == ds {
            (s, ss.clone(), d, ds)
        } else {
            let mut common = squeezed(&ss);
            if common.is_empty() {
                common.push(1);
            }
            let s = self.squeeze(s, src.r, &ss, &common, loc);
            let d = self.squeeze(d, dst.r, &ds, &common, loc);
            (s, common.clone(), d, common)
        };
        let ty = |k: &Kernel, r: RefId, shape: &[usize]| {
            let o = k.operand(r);
            memref_type(shape, o.dtype, o.memory)
        };
        let st = ty(self.k, src.r, &ss);
        let dt = ty(self.k, dst.r, &ds);
        ((s, st), (d, dt))
    }

    /// One semaphore as a rank-0 memref, with its type.
    fn sem_ref(&mut self, sem: &SemRef, loc: Loc) -> (String, String) {
        let o = self.k.operand(sem.sem);
        let kind = o.memory.semaphore().expect("verified: a semaphore operand");
        let shape = o.array_shape.clone();
        let base = self.refs[&sem.sem].clone();
        let ty = sem_type(kind);
        if shape.is_empty() {
            return (base, ty);
        }
        let idx: Vec<String> = sem.index.iter().map(|&i| self.v(i)).collect();
        let ones = vec![1; shape.len()];
        let slice = self.emit(
            &format!(
                "tpu.memref_slice {base}[{}] : {} -> {}",
                idx.join(", "),
                memref_type(&shape, o.dtype, o.memory),
                memref_type(&ones, o.dtype, o.memory)
            ),
            loc,
        );
        let one = self.emit(
            &format!(
                "tpu.memref_squeeze {slice} : {} -> {ty}",
                memref_type(&ones, o.dtype, o.memory)
            ),
            loc,
        );
        (one, ty)
    }

    pub(super) fn dma_start(
        &mut self,
        src: &RefWindow,
        dst: &RefWindow,
        sem: &SemRef,
        remote: Option<&RemoteDma>,
        loc: Loc,
    ) {
        let ((s, st), (d, dt)) = self.copy_refs(src, dst, loc);
        let (recv, recv_t) = self.sem_ref(sem, loc);
        let mut line = format!("tpu.enqueue_dma source({s} : {st}) target({d} : {dt})");
        match remote {
            None => line.push_str(&format!(" target_semaphore({recv} : {recv_t})")),
            Some(r) => {
                let (send, send_t) = self.sem_ref(&r.send_sem, loc);
                let device = self.v(r.device);
                line.push_str(&format!(
                    " source_semaphore({send} : {send_t}) target_semaphore({recv} : {recv_t}) \
                     device_id({device})"
                ));
            }
        }
        self.line(&line, loc);
    }

    pub(super) fn dma_wait(&mut self, src: &RefWindow, dst: &RefWindow, sem: &SemRef, loc: Loc) {
        let ((s, st), (d, dt)) = self.copy_refs(src, dst, loc);
        let (m, mt) = self.sem_ref(sem, loc);
        if self.send_sems.may_be_send(sem) {
            let zero = self.i32_const(0, loc);
            self.line(
                &format!(
                    "tpu.wait_dma2 semaphore({m} : {mt}) src({d} : {dt}) dst({s} : {st}) \
                     device_id({zero}) core_id({zero})"
                ),
                loc,
            );
        } else {
            self.line(
                &format!("tpu.wait_dma2 semaphore({m} : {mt}) src({s} : {st}) dst({d} : {dt})"),
                loc,
            );
        }
    }

    pub(super) fn sem_signal(
        &mut self,
        sem: &SemRef,
        inc: ValueId,
        device: Option<ValueId>,
        loc: Loc,
    ) {
        let (m, mt) = self.sem_ref(sem, loc);
        let inc = self.v(inc);
        let to = device
            .map(|d| format!(" device_id {}", self.v(d)))
            .unwrap_or_default();
        self.line(&format!("tpu.sem_signal {m}, {inc}{to} : {mt}"), loc);
    }

    pub(super) fn sem_wait(&mut self, sem: &SemRef, value: ValueId, loc: Loc) {
        let (m, mt) = self.sem_ref(sem, loc);
        let n = self.v(value);
        self.line(&format!("tpu.sem_wait {m}, {n} : {mt}"), loc);
    }

    pub(super) fn sem_read(&mut self, sem: &SemRef, loc: Loc) -> String {
        let (m, mt) = self.sem_ref(sem, loc);
        self.emit(&format!("tpu.sem_read {m} : {mt} -> i32"), loc)
    }

    /// `run_scoped`: a `tpu.region` allocating `allocs`, yielding the body's yields.
    pub(super) fn scoped(&mut self, inst: &Inst, allocs: &[RefId], body: &Region) -> R<()> {
        let loc = inst.loc;
        let types: Vec<String> = inst
            .results
            .iter()
            .map(|&r| value_type(self.k.value_type(r)))
            .collect();
        let results = results_prefix(inst);
        self.open(&format!("{results}\"tpu.region\"() ({{"));
        for &a in allocs {
            let o = self.k.operand(a);
            let ty = memref_type(&o.array_shape, o.dtype, o.memory);
            let op = if o.memory.semaphore().is_some() {
                format!("tpu.sem_alloc : {ty}")
            } else {
                format!("memref.alloca() : {ty}")
            };
            let name = self.emit(&op, o.loc);
            self.refs.insert(a, name);
        }
        self.region(body)?;
        if body.yields.is_empty() {
            self.line("tpu.yield", loc);
        } else {
            let ys: Vec<String> = body.yields.iter().map(|&y| self.v(y)).collect();
            self.line(
                &format!("tpu.yield {} : {}", ys.join(", "), types.join(", ")),
                loc,
            );
        }
        self.depth -= 1;
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(&format!(
            "}}) : () -> ({}) {}\n",
            types.join(", "),
            super::loc_attr(loc)
        ));
        self.bind_results(inst);
        Ok(())
    }
}
