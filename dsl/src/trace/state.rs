//! The thread-local trace state that tracer values append to, with what the manual-memory
//! API (`memory.rs`) remembers while a kernel is traced ([`MemoryTrace`]): the state sits
//! below the op, ref and memory builders, which all append to it.

use std::cell::RefCell;
use std::collections::HashSet;

use crate::ir::{
    infer, DeviceAxis, InferContext, Inst, Loc, Op, Operand, RefId, Region, ValueId, ValueType,
};

/// A value computed by a kernel while it is traced: a scalar (rank 0) or a vector/matrix.
///
/// It is a handle into the kernel being built; arithmetic on it appends IR ops.
#[derive(Clone, Copy, Debug)]
pub struct Value {
    pub(crate) id: ValueId,
}

/// A problem found while tracing, with the kernel author's source location.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceProblem {
    pub op: &'static str,
    pub loc: Loc,
    pub message: String,
}

pub(crate) struct TraceState {
    pub types: Vec<ValueType>,
    /// Innermost region last; the kernel body is at the bottom.
    pub regions: Vec<Region>,
    pub operands: Vec<Operand>,
    pub grid_rank: usize,
    pub problems: Vec<TraceProblem>,
    pub poisoned: HashSet<ValueId>,
    /// Values the author marked `unchecked_index`: no run-time check is made for them.
    pub unchecked: HashSet<ValueId>,
    /// What the manual-memory API tracks while tracing (mesh, scopes).
    pub memory: MemoryTrace,
}

/// What the manual-memory API remembers while a kernel is traced.
#[derive(Debug, Default)]
pub(crate) struct MemoryTrace {
    /// The mesh the kernel declared with [`Devices`](super::Devices) (empty: none).
    pub mesh: Vec<DeviceAxis>,
    /// Refs allocated by `run_scoped` regions, and those whose region is open.
    pub scoped: Vec<RefId>,
    pub live: Vec<RefId>,
    /// The barrier semaphore, once asked for.
    pub barrier: Option<RefId>,
    /// `run_scoped` regions traced so far (each scope's buffers are named by its number).
    pub scopes: usize,
    /// Pipelines traced so far (`Pipeline`s are numbered so that a step refuses another
    /// pipeline's block handles).
    pub pipelines: usize,
}

thread_local! {
    static TRACE: RefCell<Option<TraceState>> = const { RefCell::new(None) };
}

impl TraceState {
    pub fn new(grid_rank: usize) -> Self {
        TraceState {
            types: Vec::new(),
            regions: vec![Region::default()],
            operands: Vec::new(),
            grid_rank,
            problems: Vec::new(),
            poisoned: HashSet::new(),
            unchecked: HashSet::new(),
            memory: Default::default(),
        }
    }

    pub fn fresh(&mut self, ty: ValueType) -> ValueId {
        self.types.push(ty);
        ValueId((self.types.len() - 1) as u32)
    }

    pub fn problem(&mut self, op: &'static str, loc: Loc, message: String) {
        self.problems.push(TraceProblem { op, loc, message });
    }

    /// Installs `state` as the current trace while `f` runs, then hands it back.
    pub fn run<R>(state: TraceState, f: impl FnOnce() -> R) -> (TraceState, R) {
        /// Puts back the enclosing trace (nested instantiation) even if `f` unwinds.
        struct Restore(Option<TraceState>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let previous = self.0.take();
                TRACE.with(|t| *t.borrow_mut() = previous);
            }
        }
        let _restore = Restore(TRACE.with(|t| t.borrow_mut().replace(state)));
        let r = f();
        let state = TRACE
            .with(|t| t.borrow_mut().take())
            .expect("the trace state vanished");
        (state, r)
    }
}

impl InferContext for TraceState {
    fn value_type(&self, v: ValueId) -> &ValueType {
        &self.types[v.index()]
    }
    fn operand(&self, r: RefId) -> Option<&Operand> {
        self.operands.get(r.index())
    }
    fn grid_rank(&self) -> usize {
        self.grid_rank
    }
}

/// Runs `f` on the current trace.
///
/// # Panics
/// When called outside kernel instantiation: tracer values only exist inside a kernel body
/// or index map, so this is a bug in the calling code, not a user input problem.
pub(crate) fn with_trace<R>(f: impl FnOnce(&mut TraceState) -> R) -> R {
    TRACE.with(|t| {
        let mut t = t.borrow_mut();
        let state = t.as_mut().expect(
            "tessera tracer values can only be used inside a #[tpu_kernel] body or index map \
             while the kernel is being instantiated",
        );
        f(state)
    })
}

/// Runs `f` on the current trace, or returns `None` outside kernel instantiation (for
/// `Drop` impls, which may run after a trace ended).
pub(crate) fn try_with_trace<R>(f: impl FnOnce(&mut TraceState) -> R) -> Option<R> {
    TRACE
        .try_with(|t| t.try_borrow_mut().ok().and_then(|mut t| t.as_mut().map(f)))
        .ok()
        .flatten()
}

/// How many values `op` defines when it is ill-formed (so the trace can continue).
fn result_count(op: &Op) -> usize {
    match op {
        Op::Store { .. }
        | Op::When { .. }
        | Op::DmaStart { .. }
        | Op::DmaWait { .. }
        | Op::SemSignal { .. }
        | Op::SemWait { .. }
        | Op::DebugPrint { .. }
        | Op::DebugCheck { .. } => 0,
        Op::ForLoop { init, .. } => init.len(),
        Op::Scoped { body, .. } => body.yields.len(),
        _ => 1,
    }
}

/// Appends `op` to the innermost region, inferring its result types.
pub(crate) fn emit(op: Op, loc: Loc) -> Vec<Value> {
    with_trace(|t| {
        let poisoned_input = op.operands().iter().any(|v| t.poisoned.contains(v));
        let (types, poisoned) = if poisoned_input {
            (None, true)
        } else {
            match infer(&op, t) {
                Ok(types) => (Some(types), false),
                Err(error) => {
                    t.problem(op.name(), loc, error.to_string());
                    (None, true)
                }
            }
        };
        let types = types
            .unwrap_or_else(|| vec![ValueType::scalar(crate::ir::DType::F32); result_count(&op)]);
        let results: Vec<ValueId> = types.into_iter().map(|ty| t.fresh(ty)).collect();
        if poisoned {
            t.poisoned.extend(results.iter().copied());
        } else {
            let region = t
                .regions
                .last_mut()
                .expect("a region is always open while tracing");
            region.insts.push(Inst {
                op,
                results: results.clone(),
                loc,
            });
        }
        results.into_iter().map(|id| Value { id }).collect()
    })
}

/// Traces `f` into a new region whose params have the given types; returns the region and
/// what `f` returned.
pub(crate) fn trace_region<R>(
    param_types: Vec<ValueType>,
    f: impl FnOnce(&[Value]) -> R,
) -> (Region, R) {
    let params: Vec<ValueId> = with_trace(|t| {
        let params: Vec<ValueId> = param_types.into_iter().map(|ty| t.fresh(ty)).collect();
        t.regions.push(Region {
            params: params.clone(),
            ..Region::default()
        });
        params
    });
    let values: Vec<Value> = params.iter().map(|&id| Value { id }).collect();
    let r = f(&values);
    let region = with_trace(|t| t.regions.pop().expect("region stack underflow"));
    (region, r)
}

impl Value {
    /// The value's type (dtype and shape), known while tracing.
    pub fn ty(&self) -> ValueType {
        with_trace(|t| t.types[self.id.index()].clone())
    }

    pub fn shape(&self) -> Vec<usize> {
        self.ty().shape
    }

    pub fn dtype(&self) -> crate::ir::DType {
        self.ty().dtype
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        with_trace(|t| t.poisoned.contains(&self.id))
    }
}
