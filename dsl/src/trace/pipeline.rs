//! `Pipeline`: a pipeline over HBM operands nested in a kernel body (Pallas'
//! `pltpu.emit_pipeline`). It has its own grid, and per operand a block shape and an index
//! map; each step's input blocks are copied into VMEM while earlier steps compute, and each
//! output block is copied back to HBM when the next step maps it to another block (so
//! consecutive steps on one output block accumulate in VMEM, as the outer grid's do).
//!
//! It is written with the ops every backend already runs — a `run_scoped` region holding
//! `buffers` VMEM slots and DMA semaphores per operand, a `fori_loop` over the flattened
//! grid, copy starts and waits under `when` — so the interpreter, the StableHLO path and
//! Mosaic lower it without rules of their own, and the protocol checks cover its copies.
//!
//! With `n` buffers, step `t` waits its input copies, starts those of step `t + n - 1` into
//! the slot step `t - 1` has finished with, runs the body on slot `t % n`, and, when the
//! output block changes after it, starts the copy back from the output's current slot and
//! waits the copy `n - 1` write-backs older, whose slot the next step takes. Input blocks are
//! fetched every step, even when consecutive steps map to the same block.

use std::marker::PhantomData;

use super::memory::{run_scoped_at, CopyDescriptor, Hbm, HbmMut, VmemWindow, VmemWindowMut};
use super::ops::{fori_loop_at, when_at};
use super::refs::{all, Element, Idx, IntoIndex};
use super::state::{with_trace, Value};
use crate::ir::{DType, Loc, MemorySpace, RefId, RefWindow, SemKind, SemRef, Slice};

/// The block indices an index map of a [`Pipeline`] returns, one per array dim: a tuple or
/// an array of i32 [`Value`]s and Rust integers.
pub trait BlockIndices {
    #[track_caller]
    fn block_indices(self) -> Vec<Value>;
}

impl<I: IntoIndex, const N: usize> BlockIndices for [I; N] {
    #[track_caller]
    fn block_indices(self) -> Vec<Value> {
        self.into_iter().map(IntoIndex::into_index).collect()
    }
}

macro_rules! block_indices_tuple {
    ($($n:ident),+) => {
        impl<$($n: IntoIndex),+> BlockIndices for ($($n,)+) {
            #[allow(non_snake_case)]
            #[track_caller]
            fn block_indices(self) -> Vec<Value> {
                let ($($n,)+) = self;
                vec![$($n.into_index()),+]
            }
        }
    };
}
block_indices_tuple!(A);
block_indices_tuple!(A, B);
block_indices_tuple!(A, B, C);
block_indices_tuple!(A, B, C, D);

/// An HBM operand a [`Pipeline`] reads blocks of: `&Hbm<T>` or `&HbmMut<T>`.
pub trait PipelineSource<'a, T: Element> {
    #[doc(hidden)]
    fn array(self) -> RefId;
}

impl<'a, T: Element> PipelineSource<'a, T> for &'a Hbm<T> {
    fn array(self) -> RefId {
        self.id()
    }
}

impl<'a, T: Element> PipelineSource<'a, T> for &'a HbmMut<T> {
    fn array(self) -> RefId {
        self.id()
    }
}

type IndexMap<'a> = Box<dyn Fn(&[Value]) -> Vec<Value> + 'a>;

/// One operand of a pipeline.
struct Stage<'a> {
    array: RefId,
    dtype: DType,
    block: Vec<usize>,
    index_map: IndexMap<'a>,
    output: bool,
}

/// A pipeline over HBM operands inside a kernel body (Pallas' `pltpu.emit_pipeline`): its
/// grid, then [`input`](Self::input) and [`output`](Self::output) blocks with their index
/// maps, then [`run`](Self::run) with the body, which sees one step's blocks in VMEM.
///
/// ```ignore
/// // out = x @ y over (M/BM, N/BN, K/BK) blocks, accumulating in f32 scratch.
/// let mut p = Pipeline::new(&[m / BM, n / BN, k / BK]);
/// let xb = p.input(&x, &[BM, BK], |g| (g[0], g[2]));
/// let yb = p.input(&y, &[BK, BN], |g| (g[2], g[1]));
/// let ob = p.output(&mut out, &[BM, BN], |g| (g[0], g[1]));
/// p.run(|step| {
///     let kk = step.indices()[2];
///     when(kk.eq(0), || acc.store(0.0));
///     acc.store(acc.load() + dot(step.input(xb).load(), step.input(yb).load()));
///     when(kk.eq((k / BK) as i32 - 1), || step.output(ob).store(acc.load().cast(T::DTYPE)));
/// });
/// ```
///
/// The borrows of the operands last until `run`: the body reaches them only through the
/// step's blocks. See the module documentation of `trace::pipeline` for the schedule.
pub struct Pipeline<'a> {
    /// This pipeline's number among the kernel's (its handles carry it).
    id: usize,
    grid: Vec<usize>,
    buffers: usize,
    stages: Vec<Stage<'a>>,
    problems: Vec<String>,
    loc: Loc,
}

/// An input of a [`Pipeline`]: [`PipelineStep::input`] gives the step's block.
#[derive(Debug)]
pub struct PipelineInput<T> {
    pipeline: usize,
    stage: usize,
    _t: PhantomData<T>,
}

/// An output of a [`Pipeline`]: [`PipelineStep::output`] gives the step's block.
#[derive(Debug)]
pub struct PipelineOutput<T> {
    pipeline: usize,
    stage: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for PipelineInput<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PipelineInput<T> {}
impl<T> Clone for PipelineOutput<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PipelineOutput<T> {}

/// One step of a running [`Pipeline`]: its grid indices and its blocks in VMEM.
#[derive(Debug)]
pub struct PipelineStep {
    pipeline: usize,
    indices: Vec<Value>,
    /// Per stage: its VMEM slots and the slot this step uses.
    slots: Vec<(RefId, Value)>,
}

impl PipelineStep {
    /// The step's indices on the pipeline's grid (i32 scalars).
    pub fn indices(&self) -> &[Value] {
        &self.indices
    }

    /// The step's block of an input, to load (it stays valid for the step only).
    #[track_caller]
    pub fn input<T: Element>(&self, input: PipelineInput<T>) -> VmemWindow<'_, T> {
        let (buf, slot) = self.slot(input.pipeline, input.stage, Loc::caller());
        VmemWindow::of(buf, &slot_window(buf, slot))
    }

    /// The step's block of an output, to store into (and load back: consecutive steps on
    /// one block see what earlier ones stored).
    #[track_caller]
    pub fn output<T: Element>(&self, output: PipelineOutput<T>) -> VmemWindowMut<'_, T> {
        let (buf, slot) = self.slot(output.pipeline, output.stage, Loc::caller());
        VmemWindowMut::of(buf, &slot_window(buf, slot))
    }

    /// The buffer and slot of `stage`, or a problem at `loc` when the handle is another
    /// pipeline's (the window given then is this pipeline's first, never used: the kernel
    /// is refused).
    fn slot(&self, pipeline: usize, stage: usize, loc: Loc) -> (RefId, Value) {
        if pipeline != self.pipeline {
            with_trace(|t| {
                t.problem(
                    "emit_pipeline",
                    loc,
                    "this block handle belongs to another pipeline; take the blocks of a step \
                     from the handles its own pipeline's `input` and `output` returned"
                        .to_string(),
                )
            });
            return self.slots[0];
        }
        self.slots[stage]
    }
}

/// `[slot, :, :, ..]` of a buffer of slots: the slot's block, its dim squeezed.
fn slot_window(buf: RefId, slot: Value) -> Vec<Idx> {
    let rank = with_trace(|t| t.operands[buf.index()].array_shape.len());
    let mut idx = vec![slot.into()];
    idx.extend((1..rank).map(|_| all()));
    idx
}

impl std::fmt::Debug for Pipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let blocks: Vec<(RefId, &[usize], bool)> = (self.stages.iter())
            .map(|s| (s.array, s.block.as_slice(), s.output))
            .collect();
        f.debug_struct("Pipeline")
            .field("grid", &self.grid)
            .field("buffers", &self.buffers)
            .field("blocks (array, block, output)", &blocks)
            .finish_non_exhaustive()
    }
}

impl<'a> Pipeline<'a> {
    /// A pipeline over `grid` (row-major, last dim fastest), double-buffered.
    #[track_caller]
    pub fn new(grid: &[usize]) -> Self {
        let mut problems = Vec::new();
        if grid.is_empty() {
            problems.push("the pipeline's grid has no dims; give at least one".to_string());
        }
        let id = with_trace(|t| {
            t.memory.pipelines += 1;
            t.memory.pipelines
        });
        Pipeline {
            id,
            grid: grid.to_vec(),
            buffers: 2,
            stages: Vec::new(),
            problems,
            loc: Loc::caller(),
        }
    }

    /// Keeps `n` VMEM buffers per operand (Pallas' `pl.Buffered(n)`): input copies run up to
    /// `n - 1` steps ahead, and up to `n - 1` output copies are in flight.
    pub fn buffers(mut self, n: usize) -> Self {
        if n < 2 {
            self.problems.push(format!(
                "a pipeline keeps 2 or more buffers per operand, not {n}: one buffer leaves \
                 nothing to overlap; use `buffers(2)` or more"
            ));
        }
        self.buffers = n;
        self
    }

    /// Reads `block`-shaped blocks of `array`, the one `index_map` gives for each step's
    /// grid indices.
    pub fn input<T: Element, B: BlockIndices>(
        &mut self,
        array: impl PipelineSource<'a, T>,
        block: &[usize],
        index_map: impl Fn(&[Value]) -> B + 'a,
    ) -> PipelineInput<T> {
        let stage = self.stage(array.array(), T::DTYPE, block, index_map, false);
        PipelineInput {
            pipeline: self.id,
            stage,
            _t: PhantomData,
        }
    }

    /// Writes `block`-shaped blocks of `array`, the one `index_map` gives for each step's
    /// grid indices; a block is copied back when the next step maps to another one (or the
    /// grid ends), so every block the map reaches must be stored by its steps.
    pub fn output<T: Element, B: BlockIndices>(
        &mut self,
        array: &'a mut HbmMut<T>,
        block: &[usize],
        index_map: impl Fn(&[Value]) -> B + 'a,
    ) -> PipelineOutput<T> {
        let stage = self.stage(array.id(), T::DTYPE, block, index_map, true);
        PipelineOutput {
            pipeline: self.id,
            stage,
            _t: PhantomData,
        }
    }

    fn stage<B: BlockIndices>(
        &mut self,
        array: RefId,
        dtype: DType,
        block: &[usize],
        index_map: impl Fn(&[Value]) -> B + 'a,
        output: bool,
    ) -> usize {
        let (name, shape) = with_trace(|t| {
            let o = &t.operands[array.index()];
            (o.name.clone(), o.array_shape.clone())
        });
        let fits = block.len() == shape.len()
            && block.iter().zip(&shape).all(|(&b, &n)| b > 0 && n % b == 0);
        if !fits {
            self.problems.push(format!(
                "blocks of {block:?} do not tile `{name}` of shape {shape:?}: give one block \
                 size per dim, each dividing the array's"
            ));
        }
        self.stages.push(Stage {
            array,
            dtype,
            block: block.to_vec(),
            index_map: Box::new(move |g| index_map(g).block_indices()),
            output,
        });
        self.stages.len() - 1
    }

    /// Runs the pipeline, calling `body` once (it is traced, not run) with a step whose
    /// blocks are the current ones.
    #[track_caller]
    pub fn run(self, body: impl FnOnce(&PipelineStep)) {
        let loc = Loc::caller();
        let mut problems = self.problems.clone();
        if self.stages.is_empty() {
            problems.push(
                "the pipeline has no inputs or outputs, so it moves nothing; give it at least \
                 one with `input` or `output`"
                    .to_string(),
            );
        }
        if !problems.is_empty() {
            with_trace(|t| {
                for p in problems {
                    t.problem("emit_pipeline", self.loc, p);
                }
            });
            return;
        }
        let steps: usize = self.grid.iter().product();
        if steps == 0 {
            return;
        }
        run_scoped_at(|scope| self.schedule(scope, steps, body, loc), loc)
    }

    fn schedule(
        &self,
        scope: &mut super::memory::Scope,
        steps: usize,
        body: impl FnOnce(&PipelineStep),
        loc: Loc,
    ) {
        let n = self.buffers;
        let allocated: Vec<(RefId, RefId)> = (self.stages.iter().enumerate())
            .map(|(k, s)| {
                let mut shape = vec![n];
                shape.extend(&s.block);
                let dma = MemorySpace::Semaphore(SemKind::Dma);
                let buf = scope.alloc(
                    &format!("pipeline{k}"),
                    s.dtype,
                    MemorySpace::Vmem,
                    &shape,
                    loc,
                );
                let sems = scope.alloc(&format!("pipeline{k}_sems"), DType::I32, dma, &[n], loc);
                (buf, sems)
            })
            .collect();
        let copy_in = |k: usize, step: Value, slot: Value| {
            let (buf, sems) = allocated[k];
            CopyDescriptor::from_parts(
                self.block_window(k, step),
                slot_ref_window(buf, slot),
                sem_at(sems, slot),
            )
        };
        let copy_out = |k: usize, step: Value, slot: Value| {
            let (buf, sems) = allocated[k];
            CopyDescriptor::from_parts(
                slot_ref_window(buf, slot),
                self.block_window(k, step),
                sem_at(sems, slot),
            )
        };
        let inputs: Vec<usize> = (0..self.stages.len())
            .filter(|&k| !self.stages[k].output)
            .collect();
        let outputs: Vec<usize> = (0..self.stages.len())
            .filter(|&k| self.stages[k].output)
            .collect();
        let ahead = n - 1;
        // The first `n - 1` steps' inputs.
        for t in 0..ahead.min(steps) {
            let t = constant_i32(t);
            for &k in &inputs {
                copy_in(k, t, t).start_at(loc);
            }
        }
        let written_back = vec![constant_i32(0); outputs.len()];
        let written_back = fori_loop_at(
            0,
            steps as i32,
            written_back,
            |t, written_back: Vec<Value>| {
                let slot = t % n as i32;
                for &k in &inputs {
                    copy_in(k, t, slot).wait_at(loc);
                }
                let early = t + ahead as i32;
                when_at(
                    early.lt(steps as i32),
                    || {
                        for &k in &inputs {
                            copy_in(k, early, early % n as i32).start_at(loc);
                        }
                    },
                    loc,
                );
                let mut slots: Vec<(RefId, Value)> =
                    allocated.iter().map(|&(b, _)| (b, slot)).collect();
                for (&k, &count) in outputs.iter().zip(&written_back) {
                    slots[k].1 = count % n as i32;
                }
                body(&PipelineStep {
                    pipeline: self.id,
                    indices: self.unflatten(t),
                    slots,
                });
                // Write back the output blocks the next step leaves.
                let next = (t + 1).minimum(steps as i32 - 1);
                let last = (t + 1).eq(steps as i32);
                outputs
                    .iter()
                    .zip(written_back)
                    .map(|(&k, count)| {
                        let here = (self.stages[k].index_map)(&self.unflatten(t));
                        let there = (self.stages[k].index_map)(&self.unflatten(next));
                        let leaves = here
                            .iter()
                            .zip(&there)
                            .fold(last, |acc, (a, b)| acc | a.ne(*b));
                        when_at(
                            leaves,
                            || {
                                copy_out(k, t, count % n as i32).start_at(loc);
                                // The copy `n - 1` write-backs older frees the next slot. A
                                // wait names its copy by semaphore and size, and every block
                                // has this one's size, so this step's block stands in.
                                let older = count + 1 - n as i32;
                                when_at(
                                    older.ge(0),
                                    || copy_out(k, t, older % n as i32).wait_at(loc),
                                    loc,
                                );
                            },
                            loc,
                        );
                        count + leaves.cast(DType::I32)
                    })
                    .collect()
            },
            loc,
        );
        // The write-backs still in flight: the last `n - 1` (fewer if there were fewer); the
        // last step's block stands in for each one's (same size, see above).
        let last_step = constant_i32(steps - 1);
        for (&k, count) in outputs.iter().zip(written_back) {
            let first = (count + 1 - n as i32).maximum(0);
            fori_loop_at(
                first,
                count,
                (),
                |j, ()| copy_out(k, last_step, j % n as i32).wait_at(loc),
                loc,
            );
        }
    }

    /// The grid indices of flattened step `t` (row-major).
    fn unflatten(&self, t: Value) -> Vec<Value> {
        let mut indices = Vec::with_capacity(self.grid.len());
        let mut rest = t;
        for &g in self.grid.iter().rev() {
            indices.push(rest % g as i32);
            rest = rest / g as i32;
        }
        indices.reverse();
        indices
    }

    /// The window of stage `k`'s array that step `t` maps to.
    fn block_window(&self, k: usize, t: Value) -> RefWindow {
        let s = &self.stages[k];
        let block_index = (s.index_map)(&self.unflatten(t));
        RefWindow {
            r: s.array,
            slices: block_index
                .iter()
                .zip(&s.block)
                .map(|(&i, &b)| Slice::Dynamic {
                    start: (i * b as i32).id,
                    len: b,
                })
                .collect(),
        }
    }
}

fn constant_i32(i: usize) -> Value {
    super::ops::constant(DType::I32, &[], i as i32)
}

/// `[slot, :, ..]` of a buffer of slots, as a copy's window (unit dims are ignored there).
fn slot_ref_window(buf: RefId, slot: Value) -> RefWindow {
    let rank = with_trace(|t| t.operands[buf.index()].array_shape.len());
    let mut slices = vec![Slice::Dynamic {
        start: slot.id,
        len: 1,
    }];
    slices.extend((1..rank).map(|_| Slice::Full));
    RefWindow { r: buf, slices }
}

fn sem_at(sems: RefId, slot: Value) -> SemRef {
    SemRef {
        sem: sems,
        index: vec![slot.id],
    }
}
