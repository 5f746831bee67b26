//! Kernel -> StableHLO: the kernel expanded into plain StableHLO so it runs on any PJRT
//! backend (the XLA CPU plugin here, the CUDA plugin on a GPU machine).
//!
//! The grid becomes a nest of counted `while` loops, one per grid dim (size-one dims need
//! none), visiting the steps in the interpreter's order (row-major, last dim fastest). Each
//! operand's block is handled at the outermost loop level where its block index can change
//! (`schedule`): an input block is taken with `dynamic_slice` there (once per query block,
//! say, not once per key step), an output block gets a fresh garbage buffer there and is
//! written back with `dynamic_update_slice` when that loop iteration ends, as the TPU
//! pipeline (and the interpreter) writes back when the block index changes; an innermost
//! input read only inside `when`s is sliced inside them, so steps that skip their work fetch
//! nothing. The body runs in
//! the innermost loop with scratch and output blocks as loop-carried values (stores become
//! functional updates; `when` becomes `stablehlo.if` and `fori_loop` a nested `while`
//! carrying the refs they write). A `when` whose condition is "the first (last) step of the
//! innermost loops" runs once before (after) those loops instead of as an `if` at every step.
//! Buffers start as the same garbage the interpreter uses, so the two backends agree bit for
//! bit on what is computed.
//!
//! Leading `parallel` grid dims are vectorised into batch dims where the kernel allows it
//! (`plan`): the loop then runs over the remaining dims only and every op works on all
//! batch elements at once, so XLA gets large ops instead of tiny loop bodies. A dim qualifies
//! when each operand's index map passes it through unchanged to one array dim with a block
//! size of one (or does not use it), and nothing data-dependent (dynamic slice starts, SMEM
//! indices, loop bounds) depends on it; `when` on a batched condition becomes a masked
//! update. Kernels that do not qualify keep the sequential loop.
//!
//! One rule per IR op, in an exhaustive `match`: a new op is a build error here until it
//! has its lowering.

use std::collections::{BTreeSet, HashMap};

mod memory;
mod plan;
mod schedule;

use plan::Plan;
use schedule::Schedule;

use tessera_hlo::{
    self as hlo, DotDims, FuncBuilder, HloError, Module, Precision, Reducer, TensorType,
};

use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    garbage_literal, BinaryOp, CmpOp, DType, Inst, Kernel, Literal, Loc, Op, OperandRole, ReduceOp,
    RefId, Region, Slice, UnaryOp, ValueId,
};

/// Lowers `k` into a module whose public `@main` takes the kernel's arguments (scalar
/// prefetch and inputs, in order) and returns its outputs.
pub fn lower_module(k: &Kernel) -> Result<Module, KernelError> {
    module_with(k, lower_into)
}

/// A module `tessera_<kernel>` whose public `@main` takes the kernel's arguments (scalar
/// prefetch and inputs, in order) and returns what `lower` makes of the kernel applied to
/// them.
pub(crate) fn module_with(
    k: &Kernel,
    lower: impl FnOnce(
        &Kernel,
        &mut FuncBuilder<'_>,
        &[hlo::Value],
    ) -> Result<Vec<hlo::Value>, KernelError>,
) -> Result<Module, KernelError> {
    let mut module = Module::new(format!("tessera_{}", k.name));
    let mut f = module.func("main");
    let fail = |e: HloError| lower_error(k, "arguments", Loc::internal(), e);
    let mut args = Vec::new();
    for r in k.argument_refs() {
        let o = k.operand(r);
        args.push(f.arg(tensor_type(o.dtype, &o.array_shape)).map_err(fail)?);
    }
    let outs = lower(k, &mut f, &args)?;
    f.finish(&outs).map_err(fail)?;
    Ok(module)
}

/// Lowers `k` inline into the function being built by `f`, applied to `args` (scalar
/// prefetch and inputs as whole arrays, in order); returns the output arrays. This is how a
/// kernel composes into a larger program (collectives around it, autodiff).
pub fn lower_into(
    k: &Kernel,
    f: &mut FuncBuilder<'_>,
    args: &[hlo::Value],
) -> Result<Vec<hlo::Value>, KernelError> {
    if k.num_devices() > 1 {
        return Err(memory::needs_spmd(k));
    }
    Lower::new(k, false).kernel(f, args)
}

/// Lowers a kernel that runs on a device mesh (remote copies and signals, device ids) into
/// the SPMD function being built by `f`: a manually partitioned program whose partition
/// ids are the kernel's device ids (row-major over its mesh, one partition per device), with
/// `args` this device's arguments. Remote copies become `collective_permute`s at the copy's
/// grid step (every device runs the grid in lockstep); the `stablehlo::memory` module says
/// which patterns this covers.
pub fn lower_into_spmd(
    k: &Kernel,
    f: &mut FuncBuilder<'_>,
    args: &[hlo::Value],
) -> Result<Vec<hlo::Value>, KernelError> {
    memory::check_spmd(k, f.num_partitions() as usize)?;
    Lower::new(k, true).kernel(f, args)
}

/// Lowers a kernel that runs on a device mesh into a manually partitioned module: one
/// partition per device, `@main` taking and returning each device's arrays
/// (`mhlo.sharding = "{manual}"`).
pub fn lower_module_spmd(k: &Kernel) -> Result<Module, KernelError> {
    module_spmd_with(k, lower_into_spmd)
}

/// [`lower_module_spmd`] without the sharding annotations of `@main`'s arguments and results:
/// the per-device body, for a program that is already manually partitioned over the kernel's
/// devices (a JAX `shard_map` body, into which tessera-jax merges `@main`).
pub fn lower_module_spmd_body(k: &Kernel) -> Result<Module, KernelError> {
    partitioned_module(k, None, lower_into_spmd)
}

/// A manually partitioned module of one partition per device of `k`'s mesh, whose `@main`
/// takes and returns each device's arrays, with `lower` applying the kernel to them.
pub(crate) fn module_spmd_with(
    k: &Kernel,
    lower: impl FnOnce(
        &Kernel,
        &mut FuncBuilder<'_>,
        &[hlo::Value],
    ) -> Result<Vec<hlo::Value>, KernelError>,
) -> Result<Module, KernelError> {
    partitioned_module(k, Some(hlo::Sharding::Manual), lower)
}

/// A module of one partition per device of `k`'s mesh whose `@main` takes and returns each
/// device's arrays, annotated with `sharding` when given.
fn partitioned_module(
    k: &Kernel,
    sharding: Option<hlo::Sharding>,
    lower: impl FnOnce(
        &Kernel,
        &mut FuncBuilder<'_>,
        &[hlo::Value],
    ) -> Result<Vec<hlo::Value>, KernelError>,
) -> Result<Module, KernelError> {
    let mut module = Module::new(format!("tessera_{}", k.name));
    let fail = |e: HloError| lower_error(k, "arguments", Loc::internal(), e);
    module
        .set_num_partitions(k.num_devices() as u32)
        .map_err(fail)?;
    let mut f = module.func("main");
    let mut args = Vec::new();
    for r in k.argument_refs() {
        let o = k.operand(r);
        let ty = tensor_type(o.dtype, &o.array_shape);
        args.push(
            match &sharding {
                Some(s) => f.arg_with_sharding(ty, s.clone()),
                None => f.arg(ty),
            }
            .map_err(fail)?,
        );
    }
    let outs = lower(k, &mut f, &args)?;
    let outs: Vec<_> = outs.into_iter().map(|v| (v, sharding.clone())).collect();
    f.finish_with_shardings(&outs).map_err(fail)?;
    Ok(module)
}

/// `args` (the caller's arguments of `k`) and, for a kernel with run-time checks, the zeros
/// its check flags start from ([`crate::checks`]): the arguments the kernel's operands take.
/// Arguments that already hold them are returned as they are.
pub fn with_flags_init(
    k: &Kernel,
    f: &mut FuncBuilder<'_>,
    args: &[hlo::Value],
) -> Result<Vec<hlo::Value>, KernelError> {
    let mut args = args.to_vec();
    if let Some(flags) = k.checks.flags {
        if args.len() == k.argument_refs().len() {
            let o = k.operand(flags.init);
            let zeros = f
                .splat(0.0, tensor_type(o.dtype, &o.array_shape))
                .map_err(|e| lower_error(k, "check flags", Loc::internal(), e))?;
            args.push(zeros);
        }
    }
    Ok(args)
}

fn tensor_type(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dims(shape), dtype)
}

fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

fn lower_error(k: &Kernel, op: &str, loc: Loc, e: HloError) -> KernelError {
    KernelError::new(
        &k.name,
        vec![Problem {
            kind: ProblemKind::Lower,
            subject: format!("`{op}`"),
            message: format!("lowering to StableHLO failed (a tessera bug; please report it): {e}"),
            loc: Some(loc),
        }],
    )
}

struct Lower<'k> {
    k: &'k Kernel,
    plan: Plan,
    /// Sizes of the batch dims (the vectorised leading grid dims).
    bsizes: Vec<i64>,
    /// IR value -> StableHLO value.
    env: HashMap<ValueId, hlo::Value>,
    /// Current value of each ref the body sees: input blocks of this step, scratch and output
    /// block buffers (updated by stores), and whole SMEM tables.
    refs: HashMap<RefId, hlo::Value>,
    /// The grid indices of the current step (i32 scalars); `None` for batch dims.
    grid: Vec<Option<hlo::Value>>,
    /// Where blocks are fetched and written back, and which `when`s leave the loops.
    sched: Schedule,
    /// The loop level being lowered: grid indices before it are set.
    depth: usize,
    /// The kernel's argument arrays (scalar prefetch and inputs).
    arrays: HashMap<RefId, hlo::Value>,
    outputs: Vec<RefId>,
    scratch: Vec<RefId>,
    /// Each output array as written so far.
    out_arrays: HashMap<RefId, hlo::Value>,
    /// Each output's current block offsets.
    out_offsets: HashMap<RefId, Vec<hlo::Value>>,
    /// The previous block offsets of tracked outputs.
    prev_offsets: HashMap<RefId, Vec<hlo::Value>>,
    /// Whether the kernel is lowered into an SPMD program (device ids are partition ids).
    spmd: bool,
    /// Where each value of the body is defined (for remote copies' target devices).
    defs: HashMap<ValueId, &'k Inst>,
}

type R<T> = Result<T, KernelError>;

impl<'k> Lower<'k> {
    fn new(k: &'k Kernel, spmd: bool) -> Self {
        let manual = k.moves_own_data();
        // Kernels that move their own data keep their loops as written: no vectorised dims,
        // no hoisted `when`s (copies and semaphores keep their order).
        let plan = if manual {
            plan::Plan::default()
        } else {
            plan::plan(k)
        };
        let bsizes = k.grid[..plan.nb].iter().map(|&n| n as i64).collect();
        let mut sched = schedule::schedule(k, plan.nb);
        if manual {
            sched.first.clear();
            sched.last.clear();
        }
        Lower {
            k,
            plan,
            bsizes,
            env: HashMap::new(),
            refs: HashMap::new(),
            grid: Vec::new(),
            sched,
            depth: 0,
            arrays: HashMap::new(),
            outputs: Vec::new(),
            scratch: Vec::new(),
            out_arrays: HashMap::new(),
            out_offsets: HashMap::new(),
            prev_offsets: HashMap::new(),
            spmd,
            defs: if manual {
                memory::definitions(&k.body)
            } else {
                HashMap::new()
            },
        }
    }

    fn nb(&self) -> usize {
        self.plan.nb
    }

    fn err(&self, inst: &Inst) -> impl Fn(HloError) -> KernelError + 'k {
        let (k, name, loc) = (self.k, inst.op.name(), inst.loc);
        move |e| lower_error(k, name, loc, e)
    }

    fn kernel_err(&self) -> impl Fn(HloError) -> KernelError + 'k {
        let k = self.k;
        move |e| lower_error(k, "grid", k.loc, e)
    }

    /// `shape` with the batch dims in front when `batched`.
    fn shape_of(&self, shape: &[usize], batched: bool) -> Vec<i64> {
        let mut out = if batched {
            self.bsizes.clone()
        } else {
            Vec::new()
        };
        out.extend(dims(shape));
        out
    }

    fn kernel(&mut self, f: &mut FuncBuilder<'_>, args: &[hlo::Value]) -> R<Vec<hlo::Value>> {
        let k = self.k;
        let e = self.kernel_err();
        let args = &with_flags_init(k, f, args)?;
        let arg_refs = k.all_argument_refs();
        if arg_refs.len() != args.len() {
            return Err(KernelError::single(
                &k.name,
                ProblemKind::Argument,
                "arguments",
                format!("expected {} arrays, got {}", arg_refs.len(), args.len()),
            ));
        }
        self.arrays = arg_refs.iter().copied().zip(args.iter().copied()).collect();
        // Blocked outputs are written back block by block; HBM outputs are whole arrays the
        // body writes (by copies) and are carried like scratch.
        self.outputs = k
            .operands_with(OperandRole::Output)
            .filter(|(_, o)| o.block.is_some())
            .map(|(r, _)| r)
            .collect();
        self.scratch = k
            .operands
            .iter()
            .enumerate()
            .filter(|(_, o)| memory::carried_unblocked(o))
            .map(|(i, _)| RefId(i as u32))
            .collect();
        for (r, _) in k.operands_with(OperandRole::ScalarPrefetch) {
            self.refs.insert(r, self.arrays[&r]);
        }
        for (r, o) in k.operands_with(OperandRole::Input) {
            if o.block.is_none() {
                self.refs.insert(r, self.arrays[&r]);
            }
        }
        // An output aliasing an input starts as the input's values (its buffer), others as
        // garbage.
        for r in self.outputs.clone() {
            let o = k.operand(r);
            let array = match o.aliases {
                Some(input) => self.arrays[&input],
                None => garbage(f, o.dtype, &dims(&o.array_shape)).map_err(&e)?,
            };
            self.out_arrays.insert(r, array);
        }
        for r in self.outputs.iter().chain(&self.scratch) {
            let o = k.operand(*r);
            let buffer = match o.aliases {
                Some(input) if o.block.is_none() => self.arrays[&input],
                _ => {
                    let shape = self.shape_of(&o.view_shape(), self.plan.ref_batched(k, *r));
                    memory::fresh(f, o, &shape).map_err(&e)?
                }
            };
            self.refs.insert(*r, buffer);
        }
        // No block index is negative: the first comparison always sees a change.
        let none = f.scalar(-1.0, DType::I32).map_err(&e)?;
        for &r in &self.sched.tracked {
            let rank = k.operand(r).array_shape.len();
            self.prev_offsets.insert(r, vec![none; rank]);
        }
        self.grid = vec![None; k.grid.len()];
        self.level(f, self.nb())?;
        Ok(k.operands_with(OperandRole::Output)
            .map(|(r, o)| match o.block {
                Some(_) => self.out_arrays[&r],
                None => self.refs[&r],
            })
            .collect())
    }

    /// The values the grid loops carry: output arrays, output and scratch buffers, and the
    /// last block offsets of tracked outputs.
    fn carried(&self) -> Vec<hlo::Value> {
        let mut v: Vec<hlo::Value> = self.outputs.iter().map(|r| self.out_arrays[r]).collect();
        v.extend(
            self.outputs
                .iter()
                .chain(&self.scratch)
                .map(|r| self.refs[r]),
        );
        for r in &self.sched.tracked {
            v.extend(self.prev_offsets[r].iter().copied());
        }
        v
    }

    /// Binds the values [`Self::carried`] lists (inside a loop, or after it).
    fn bind(&mut self, values: &[hlo::Value]) {
        let mut it = values.iter().copied();
        let mut next = || it.next().expect("one value per carried slot");
        for r in self.outputs.clone() {
            self.out_arrays.insert(r, next());
        }
        for r in self.outputs.clone().into_iter().chain(self.scratch.clone()) {
            self.refs.insert(r, next());
        }
        for r in self.sched.tracked.clone() {
            let rank = self.prev_offsets[&r].len();
            let offsets = (0..rank).map(|_| next()).collect();
            self.prev_offsets.insert(r, offsets);
        }
    }

    /// Level `d` of the loop nest ([`schedule`]): fetches the blocks whose index is fixed from
    /// here on, runs the `when`s hoisted to before the loop over dim `d`, the loop (or, at the
    /// innermost level, one grid step), the `when`s hoisted to after it, and writes back the
    /// output blocks of this level.
    fn level(&mut self, b: &mut FuncBuilder<'_>, d: usize) -> R<()> {
        let k = self.k;
        let e = self.kernel_err();
        self.depth = d;
        for (i, o) in k.operands.iter().enumerate() {
            let r = RefId(i as u32);
            let Some(mapping) = &o.block else { continue };
            if self.sched.level[&r] != d {
                continue;
            }
            let offsets = self.block_offsets(b, r, &mapping.index_map)?;
            match o.role {
                OperandRole::Input if self.sched.deferred.contains(&r) => {
                    // Sliced by the `when`s that read it.
                    self.refs.remove(&r);
                }
                OperandRole::Input => {
                    let block = self
                        .input_block(b, r, self.input_array(r), &offsets)
                        .map_err(&e)?;
                    self.refs.insert(r, block);
                }
                OperandRole::Output => {
                    self.fresh_output_buffer(b, r, &offsets).map_err(&e)?;
                    self.out_offsets.insert(r, offsets);
                }
                _ => {}
            }
        }
        let first: Vec<usize> = self
            .sched
            .first
            .iter()
            .filter(|h| h.level == d)
            .map(|h| h.inst)
            .collect();
        for i in first {
            self.hoisted_when(b, i, d, false)?;
        }
        let n = k.grid.len();
        if d == n {
            for (i, inst) in k.body.insts.iter().enumerate() {
                if !self.sched.hoisted(i) {
                    self.inst(b, inst)?;
                }
            }
        } else if k.grid[d] == 1 {
            self.grid[d] = Some(b.scalar(0.0, DType::I32).map_err(&e)?);
            self.level(b, d + 1)?;
        } else {
            let lo = b.scalar(0.0, DType::I32).map_err(&e)?;
            let hi = b.scalar(k.grid[d] as f64, DType::I32).map_err(&e)?;
            let init = self.carried();
            let out = b.fori_loop(lo, hi, &init, |b, i, carried| -> R<Vec<hlo::Value>> {
                self.bind(carried);
                self.grid[d] = Some(i);
                self.level(b, d + 1)?;
                Ok(self.carried())
            })?;
            self.bind(&out);
        }
        self.depth = d;
        let last: Vec<usize> = self
            .sched
            .last
            .iter()
            .filter(|h| h.level == d)
            .map(|h| h.inst)
            .collect();
        for i in last {
            self.hoisted_when(b, i, d, true)?;
        }
        for r in self.outputs.clone() {
            if self.sched.level[&r] != d {
                continue;
            }
            let block = self.output_block(b, r, self.refs[&r]).map_err(&e)?;
            let array = b
                .dynamic_update_slice(self.out_arrays[&r], block, &self.out_offsets[&r])
                .map_err(&e)?;
            self.out_arrays.insert(r, array);
        }
        Ok(())
    }

    /// The array input `r`'s blocks are read from: the values of the output aliasing it as
    /// earlier steps left them (the caller's where none wrote), else the argument.
    fn input_array(&self, r: RefId) -> hlo::Value {
        self.outputs
            .iter()
            .find(|&&out| self.k.operand(out).aliases == Some(r))
            .map_or(self.arrays[&r], |out| self.out_arrays[out])
    }

    /// A fresh (garbage) buffer for output `r` whose block is at `offsets` now, as the
    /// interpreter takes one when the block index changes; a tracked output keeps its buffer
    /// when the index is the one it had.
    fn fresh_output_buffer(
        &mut self,
        b: &mut FuncBuilder<'_>,
        r: RefId,
        offsets: &[hlo::Value],
    ) -> Result<(), HloError> {
        let o = self.k.operand(r);
        let shape = self.shape_of(&o.view_shape(), self.plan.ref_batched(self.k, r));
        let fresh = garbage(b, o.dtype, &shape)?;
        let buffer = match self.prev_offsets.get(&r) {
            None => fresh,
            Some(prev) => {
                let mut changed = None;
                for (&now, &before) in offsets.iter().zip(prev) {
                    let ne = b.compare(hlo::ComparisonDirection::Ne, now, before)?;
                    changed = Some(match changed {
                        None => ne,
                        Some(c) => b.or(c, ne)?,
                    });
                }
                let changed = changed.expect("blocks have at least one dim");
                let mask = b.broadcast_in_dim(changed, &shape, &[])?;
                let buffer = b.select(mask, fresh, self.refs[&r])?;
                self.prev_offsets.insert(r, offsets.to_vec());
                buffer
            }
        };
        self.refs.insert(r, buffer);
        Ok(())
    }

    /// Runs body `when` `i` once at level `d` (before the loop over dim `d`, or after it when
    /// `after`), where its condition holds: the grid indices from `d` on are their first
    /// (last) values. The pure values it may use are recomputed here.
    fn hoisted_when(&mut self, b: &mut FuncBuilder<'_>, i: usize, d: usize, after: bool) -> R<()> {
        let k = self.k;
        let e = self.kernel_err();
        let saved = self.grid.clone();
        for dim in d..k.grid.len() {
            let at = if after { k.grid[dim] - 1 } else { 0 };
            self.grid[dim] = Some(b.scalar(at as f64, DType::I32).map_err(&e)?);
        }
        for inst in &k.body.insts {
            if !inst.results.is_empty() && inst.results.iter().all(|v| self.sched.pure.contains(v))
            {
                self.inst(b, inst)?;
            }
        }
        let Op::When { then, .. } = &k.body.insts[i].op else {
            unreachable!("only whens are hoisted");
        };
        self.region(b, then, &[])?;
        self.grid = saved;
        Ok(())
    }

    /// The sizes of the window an operand's block takes from its array: block sizes, with the
    /// array dims that carry batch dims taken whole.
    fn window_sizes(&self, r: RefId) -> Vec<i64> {
        let o = self.k.operand(r);
        let bd = self.plan.batch_dims.get(&r);
        o.block_sizes()
            .iter()
            .enumerate()
            .map(|(a, &s)| match bd.and_then(|m| m[a]) {
                Some(_) => o.array_shape[a] as i64,
                None => s as i64,
            })
            .collect()
    }

    /// Takes an input's block for this step, laid out as the body sees it: batch dims first
    /// (broadcast when the input does not vary along one), then the block's view.
    fn input_block(
        &self,
        b: &mut FuncBuilder<'_>,
        r: RefId,
        array: hlo::Value,
        offsets: &[hlo::Value],
    ) -> Result<hlo::Value, HloError> {
        let o = self.k.operand(r);
        let window = b.dynamic_slice(array, offsets, &self.window_sizes(r))?;
        if !self.plan.ref_batched(self.k, r) {
            return b.reshape(window, &dims(&o.view_shape()));
        }
        let map = &self.plan.batch_dims[&r];
        // Batch-mapped array dims first (in batch order), then the others in order.
        let mut present: Vec<(usize, usize)> = map
            .iter()
            .enumerate()
            .filter_map(|(a, d)| d.map(|d| (d, a)))
            .collect();
        present.sort();
        let mut perm: Vec<i64> = present.iter().map(|&(_, a)| a as i64).collect();
        perm.extend(
            (0..map.len())
                .filter(|a| map[*a].is_none())
                .map(|a| a as i64),
        );
        let t = b.transpose(window, &perm)?;
        let mut compact: Vec<i64> = present.iter().map(|&(d, _)| self.bsizes[d]).collect();
        compact.extend(dims(&o.view_shape()));
        let t = b.reshape(t, &compact)?;
        let view_rank = o.view_shape().len();
        let mut mapping: Vec<i64> = present.iter().map(|&(d, _)| d as i64).collect();
        mapping.extend((0..view_rank).map(|i| (self.nb() + i) as i64));
        b.broadcast_in_dim(t, &self.shape_of(&o.view_shape(), true), &mapping)
    }

    /// An output buffer as the window to write back into its array (inverse of
    /// `input_block` for an operand that uses every batch dim).
    fn output_block(
        &self,
        b: &mut FuncBuilder<'_>,
        r: RefId,
        buffer: hlo::Value,
    ) -> Result<hlo::Value, HloError> {
        let o = self.k.operand(r);
        if self.nb() == 0 {
            return b.reshape(buffer, &dims(&o.block_sizes()));
        }
        let map = &self.plan.batch_dims[&r];
        let sizes = o.block_sizes();
        // [batch..., non-batch block dims...] then transposed into array-dim order.
        let rest: Vec<usize> = (0..map.len()).filter(|a| map[*a].is_none()).collect();
        let mut compact = self.bsizes.clone();
        compact.extend(rest.iter().map(|&a| sizes[a] as i64));
        let t = b.reshape(buffer, &compact)?;
        let perm: Vec<i64> = (0..map.len())
            .map(|a| match map[a] {
                Some(d) => d as i64,
                None => (self.nb() + rest.iter().position(|&x| x == a).expect("listed")) as i64,
            })
            .collect();
        b.transpose(t, &perm)
    }

    /// Element offsets of the window the index map selects at this step (zero on batch dims).
    fn block_offsets(
        &mut self,
        b: &mut FuncBuilder<'_>,
        r: RefId,
        map: &Region,
    ) -> R<Vec<hlo::Value>> {
        let e = self.kernel_err();
        let zero = b.scalar(0.0, DType::I32).map_err(&e)?;
        // Dims from the current level on are not set yet (the map does not depend on them).
        let grid: Vec<hlo::Value> = self
            .grid
            .iter()
            .enumerate()
            .map(|(d, g)| g.filter(|_| d < self.depth).unwrap_or(zero))
            .collect();
        let block_idx = self.region(b, map, &grid)?;
        let sizes = self.k.operand(r).block_sizes();
        block_idx
            .iter()
            .zip(&sizes)
            .map(|(&i, &s)| {
                let s = b.scalar(s as f64, DType::I32)?;
                b.mul(i, s)
            })
            .collect::<Result<Vec<_>, HloError>>()
            .map_err(e)
    }

    /// Lowers the region of a `when`, first slicing the deferred input blocks it reads that
    /// no enclosing region has sliced (dropped again after it: they exist only inside).
    fn when_region(&mut self, b: &mut FuncBuilder<'_>, then: &Region) -> R<()> {
        let e = self.kernel_err();
        let mut sliced = Vec::new();
        for r in self.sched.deferred.clone() {
            if self.refs.contains_key(&r) || !reads(then, r) {
                continue;
            }
            let map = &self.k.operand(r).block.as_ref().expect("blocked").index_map;
            let offsets = self.block_offsets(b, r, map)?;
            let block = self
                .input_block(b, r, self.input_array(r), &offsets)
                .map_err(&e)?;
            self.refs.insert(r, block);
            sliced.push(r);
        }
        self.region(b, then, &[])?;
        for r in sliced {
            self.refs.remove(&r);
        }
        Ok(())
    }

    /// Lowers a region with `args` bound to its params; returns the lowered yields.
    fn region(
        &mut self,
        b: &mut FuncBuilder<'_>,
        r: &Region,
        args: &[hlo::Value],
    ) -> R<Vec<hlo::Value>> {
        for (&p, &a) in r.params.iter().zip(args) {
            self.env.insert(p, a);
        }
        for inst in &r.insts {
            self.inst(b, inst)?;
        }
        Ok(r.yields.iter().map(|y| self.env[y]).collect())
    }

    fn v(&self, id: ValueId) -> hlo::Value {
        self.env[&id]
    }

    fn is_batched(&self, id: ValueId) -> bool {
        self.plan.batched.contains(&id)
    }

    /// `id`'s value with the batch dims in front, broadcasting an unbatched value.
    fn batched(&self, b: &mut FuncBuilder<'_>, id: ValueId) -> Result<hlo::Value, HloError> {
        if self.is_batched(id) || self.nb() == 0 {
            return Ok(self.v(id));
        }
        self.broadcast_to_batch(b, self.v(id), &self.k.value_type(id).shape)
    }

    fn broadcast_to_batch(
        &self,
        b: &mut FuncBuilder<'_>,
        v: hlo::Value,
        shape: &[usize],
    ) -> Result<hlo::Value, HloError> {
        let mapping: Vec<i64> = (0..shape.len()).map(|i| (self.nb() + i) as i64).collect();
        b.broadcast_in_dim(v, &self.shape_of(shape, true), &mapping)
    }

    /// The operands of an elementwise op, all batched when the result is.
    fn elementwise(
        &self,
        b: &mut FuncBuilder<'_>,
        inst: &Inst,
        ids: &[ValueId],
    ) -> Result<Vec<hlo::Value>, HloError> {
        let out_batched = inst.results.first().is_some_and(|r| self.is_batched(*r));
        ids.iter()
            .map(|&id| {
                if out_batched {
                    self.batched(b, id)
                } else {
                    Ok(self.v(id))
                }
            })
            .collect()
    }

    fn starts(
        &self,
        b: &mut FuncBuilder<'_>,
        slices: &[Slice],
        batched: bool,
    ) -> Result<Vec<hlo::Value>, HloError> {
        let mut out = Vec::with_capacity(slices.len() + self.nb());
        if batched {
            for _ in 0..self.nb() {
                out.push(b.scalar(0.0, DType::I32)?);
            }
        }
        for s in slices {
            out.push(match *s {
                Slice::Full => b.scalar(0.0, DType::I32)?,
                Slice::Static { start, .. } => b.scalar(start as f64, DType::I32)?,
                Slice::Dynamic { start, .. } => self.v(start),
            });
        }
        Ok(out)
    }

    fn inst(&mut self, b: &mut FuncBuilder<'_>, inst: &Inst) -> R<()> {
        let e = self.err(inst);
        let k = self.k;
        let nb = self.nb() as i64;
        let out_batched = inst.results.first().is_some_and(|r| self.is_batched(*r));
        let out: hlo::Value = match &inst.op {
            Op::ProgramId { axis } => match self.grid[*axis] {
                Some(g) => g,
                None => b
                    .iota(
                        TensorType::new(self.bsizes.clone(), DType::I32),
                        *axis as i64,
                    )
                    .map_err(e)?,
            },
            Op::NumPrograms { axis } => b.scalar(k.grid[*axis] as f64, DType::I32).map_err(e)?,
            Op::Constant { value, ty } => b
                .splat(literal_f64(*value), tensor_type(ty.dtype, &ty.shape))
                .map_err(e)?,
            Op::Load { src, slices } => {
                let base = self.refs[src];
                if slices.iter().all(|s| *s == Slice::Full) {
                    base
                } else {
                    let view = k.operand(*src).view_shape();
                    let lens: Vec<usize> =
                        slices.iter().zip(&view).map(|(s, &n)| s.len(n)).collect();
                    let starts = self.starts(b, slices, out_batched).map_err(&e)?;
                    b.dynamic_slice(base, &starts, &self.shape_of(&lens, out_batched))
                        .map_err(e)?
                }
            }
            Op::Store { dst, slices, value } => {
                let ref_batched = self.plan.ref_batched(k, *dst);
                let v = if ref_batched {
                    self.batched(b, *value).map_err(&e)?
                } else {
                    self.v(*value)
                };
                let next = if slices.iter().all(|s| *s == Slice::Full) {
                    v
                } else {
                    let starts = self.starts(b, slices, ref_batched).map_err(&e)?;
                    b.dynamic_update_slice(self.refs[dst], v, &starts)
                        .map_err(e)?
                };
                self.refs.insert(*dst, next);
                return Ok(());
            }
            Op::LoadScalar { src, indices } => {
                let table = self.refs[src];
                let starts: Vec<hlo::Value> = indices.iter().map(|i| self.v(*i)).collect();
                let one = b
                    .dynamic_slice(table, &starts, &vec![1; starts.len()])
                    .map_err(&e)?;
                b.reshape(one, &[]).map_err(e)?
            }
            Op::StoreScalar {
                dst,
                indices,
                value,
            } => {
                let starts: Vec<hlo::Value> = indices.iter().map(|i| self.v(*i)).collect();
                let one = b
                    .reshape(self.v(*value), &vec![1; starts.len()])
                    .map_err(&e)?;
                let next = b
                    .dynamic_update_slice(self.refs[dst], one, &starts)
                    .map_err(e)?;
                self.refs.insert(*dst, next);
                return Ok(());
            }
            Op::Unary { op, x } => {
                let x = self.v(*x);
                match op {
                    UnaryOp::Neg => b.neg(x),
                    UnaryOp::Exp => b.exp(x),
                    UnaryOp::Log => b.log(x),
                    UnaryOp::Tanh => b.tanh(x),
                    UnaryOp::Sqrt => b.sqrt(x),
                    UnaryOp::Rsqrt => b.rsqrt(x),
                    UnaryOp::Abs => b.abs(x),
                    UnaryOp::Not => b.not(x),
                }
                .map_err(e)?
            }
            Op::Binary { op, lhs, rhs } => {
                let xs = self.elementwise(b, inst, &[*lhs, *rhs]).map_err(&e)?;
                let op = match op {
                    BinaryOp::Add => hlo::BinaryOp::Add,
                    BinaryOp::Sub => hlo::BinaryOp::Sub,
                    BinaryOp::Mul => hlo::BinaryOp::Mul,
                    BinaryOp::Div => hlo::BinaryOp::Div,
                    BinaryOp::Rem => hlo::BinaryOp::Rem,
                    BinaryOp::Max => hlo::BinaryOp::Max,
                    BinaryOp::Min => hlo::BinaryOp::Min,
                    BinaryOp::And => hlo::BinaryOp::And,
                    BinaryOp::Or => hlo::BinaryOp::Or,
                    BinaryOp::Xor => hlo::BinaryOp::Xor,
                };
                b.binary(op, xs[0], xs[1]).map_err(e)?
            }
            Op::Compare { op, lhs, rhs } => {
                let xs = self.elementwise(b, inst, &[*lhs, *rhs]).map_err(&e)?;
                let dir = match op {
                    CmpOp::Eq => hlo::ComparisonDirection::Eq,
                    CmpOp::Ne => hlo::ComparisonDirection::Ne,
                    CmpOp::Lt => hlo::ComparisonDirection::Lt,
                    CmpOp::Le => hlo::ComparisonDirection::Le,
                    CmpOp::Gt => hlo::ComparisonDirection::Gt,
                    CmpOp::Ge => hlo::ComparisonDirection::Ge,
                };
                b.compare(dir, xs[0], xs[1]).map_err(e)?
            }
            Op::Select {
                cond,
                on_true,
                on_false,
            } => {
                let xs = self
                    .elementwise(b, inst, &[*cond, *on_true, *on_false])
                    .map_err(&e)?;
                b.select(xs[0], xs[1], xs[2]).map_err(e)?
            }
            Op::Cast { x, to } => b.convert(self.v(*x), *to).map_err(e)?,
            Op::Broadcast { x, shape } => {
                let from = k.value_type(*x).rank();
                let x_batched = self.is_batched(*x);
                let lead = if x_batched { nb } else { 0 };
                let mut mapping: Vec<i64> = (0..lead).collect();
                mapping.extend(((shape.len() - from)..shape.len()).map(|d| d as i64 + lead));
                b.broadcast_in_dim(self.v(*x), &self.shape_of(shape, x_batched), &mapping)
                    .map_err(e)?
            }
            Op::Reshape { x, shape } => b
                .reshape(self.v(*x), &self.shape_of(shape, out_batched))
                .map_err(e)?,
            Op::Repeat { x, times, axis } => {
                // Broadcast to `[.., times, n, ..]` (a new dim before `axis`), then merge the
                // two: element `t * n + i` is `x[i]`.
                let x_ty = k.value_type(*x);
                let lead = if out_batched { nb } else { 0 };
                let mut wide = x_ty.shape.clone();
                wide.insert(*axis, *times);
                let mapping: Vec<i64> = (0..lead)
                    .chain((0..x_ty.rank() as i64).map(|d| lead + d + i64::from(d >= *axis as i64)))
                    .collect();
                let copies = b
                    .broadcast_in_dim(self.v(*x), &self.shape_of(&wide, out_batched), &mapping)
                    .map_err(&e)?;
                let shape = &k.value_type(inst.results[0]).shape;
                b.reshape(copies, &self.shape_of(shape, out_batched))
                    .map_err(e)?
            }
            Op::Iota { ty, dim } => b
                .iota(tensor_type(ty.dtype, &ty.shape), *dim as i64)
                .map_err(e)?,
            Op::Reduce { op, x, axis } => {
                let reducer = match op {
                    ReduceOp::Sum => Reducer::Sum,
                    ReduceOp::Max => Reducer::Max,
                    ReduceOp::Min => Reducer::Min,
                };
                let x_ty = k.value_type(*x).dtype;
                let axis = [*axis as i64 + if out_batched { nb } else { 0 }];
                if x_ty == DType::BF16 && *op == ReduceOp::Sum {
                    // Accumulate in f32 and round once, as TPUs (and the interpreter) do.
                    let wide = b.convert(self.v(*x), DType::F32).map_err(&e)?;
                    let s = b.reduce(wide, &axis, reducer).map_err(&e)?;
                    b.convert(s, DType::BF16).map_err(e)?
                } else {
                    b.reduce(self.v(*x), &axis, reducer).map_err(e)?
                }
            }
            Op::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => {
                let xs = self.elementwise(b, inst, &[*lhs, *rhs]).map_err(&e)?;
                let lead = if out_batched { nb } else { 0 };
                let batch: Vec<i64> = (0..lead).collect();
                let acc = k.value_type(inst.results[0]).dtype;
                let (m, n) = (k.value_type(*lhs).shape[1], k.value_type(*rhs).shape[1]);
                // An f32 dot is an f32 dot on every backend, as in the interpreter and in
                // Mosaic: XLA's GPU compiler otherwise runs DEFAULT-precision f32 dots in
                // TF32 (measured on an H200: a 256x512x384 matmul 3e-2 off float64, 1.4e-5
                // with HIGHEST). The CPU compiler computes f32 either way.
                let precision = (k.value_type(*lhs).dtype == DType::F32)
                    .then_some([Precision::Highest, Precision::Highest]);
                if *transpose_lhs && !*transpose_rhs && m > n {
                    // `lhs^T rhs` with the wider operand on the left runs about half as fast
                    // on XLA CPU as `rhs^T lhs` (measured: [512, 512]^T [512, 64]): compute
                    // that and transpose the (smaller) result; the barrier keeps XLA from
                    // folding the transpose back into the dot.
                    let dims = DotDims::new(batch.clone(), batch.clone(), [lead], [lead]);
                    let t = b
                        .dot_general(xs[1], xs[0], &dims, acc, precision)
                        .map_err(&e)?;
                    let t = b.optimization_barrier(t).map_err(&e)?;
                    let mut perm = batch;
                    perm.extend([lead + 1, lead]);
                    b.transpose(t, &perm).map_err(e)?
                } else {
                    let dims = DotDims::new(
                        batch.clone(),
                        batch,
                        [lead + i64::from(!*transpose_lhs)],
                        [lead + i64::from(*transpose_rhs)],
                    );
                    b.dot_general(xs[0], xs[1], &dims, acc, precision)
                        .map_err(e)?
                }
            }
            Op::When {
                cond,
                then,
                otherwise,
            } => {
                let mut written = written_refs(then);
                written.extend(written_refs(otherwise));
                let written: Vec<RefId> = written.into_iter().collect();
                if written.is_empty() {
                    // Nothing observable happens inside: loads and arithmetic only.
                    return Ok(());
                }
                let before: Vec<hlo::Value> = written.iter().map(|r| self.refs[r]).collect();
                if self.is_batched(*cond) {
                    // Per batch element: run both bodies for all, keep the writes of the one
                    // `cond` selects.
                    self.when_region(b, then)?;
                    let taken: Vec<hlo::Value> = written.iter().map(|r| self.refs[r]).collect();
                    for (r, &old) in written.iter().zip(&before) {
                        self.refs.insert(*r, old);
                    }
                    self.when_region(b, otherwise)?;
                    for (r, &new) in written.iter().zip(&taken) {
                        let o = k.operand(*r);
                        let shape = self.shape_of(&o.view_shape(), true);
                        let mask = b
                            .broadcast_in_dim(self.v(*cond), &shape, &(0..nb).collect::<Vec<_>>())
                            .map_err(&e)?;
                        let kept = b.select(mask, new, self.refs[r]).map_err(&e)?;
                        self.refs.insert(*r, kept);
                    }
                    return Ok(());
                }
                let cond = self.v(*cond);
                // Each branch starts from the blocks as they were before the `when`.
                let this = std::cell::RefCell::new(&mut *self);
                let branch = |b: &mut FuncBuilder<'_>, body: &Region| -> R<Vec<hlo::Value>> {
                    let mut this = this.borrow_mut();
                    for (r, &old) in written.iter().zip(&before) {
                        this.refs.insert(*r, old);
                    }
                    this.when_region(b, body)?;
                    Ok(written.iter().map(|r| this.refs[r]).collect())
                };
                let after = b.if_else(cond, |b| branch(b, then), |b| branch(b, otherwise))?;
                for (r, v) in written.iter().zip(after) {
                    self.refs.insert(*r, v);
                }
                return Ok(());
            }
            Op::DeviceId
            | Op::DmaStart { .. }
            | Op::DmaWait { .. }
            | Op::SemSignal { .. }
            | Op::SemWait { .. }
            | Op::SemRead { .. }
            | Op::Scoped { .. } => return self.memory_inst(b, inst),
            // XLA has no print or assertion that every PJRT backend runs, so this path leaves
            // them out; the interpreter and mosaic-eval print and check.
            Op::DebugPrint { .. } | Op::DebugCheck { .. } => return Ok(()),
            Op::ForLoop { lo, hi, init, body } => {
                let written: Vec<RefId> = written_refs(body).into_iter().collect();
                let n = init.len();
                let mut carried = Vec::with_capacity(n + written.len());
                for &v in init {
                    // Carried values are batched whenever the kernel is vectorised.
                    carried.push(self.batched(b, v).map_err(&e)?);
                }
                carried.extend(written.iter().map(|r| self.refs[r]));
                let (lo, hi) = (self.v(*lo), self.v(*hi));
                let out = b.fori_loop(lo, hi, &carried, |b, i, args| -> R<Vec<hlo::Value>> {
                    for (r, &v) in written.iter().zip(&args[n..]) {
                        self.refs.insert(*r, v);
                    }
                    let mut params = vec![i];
                    params.extend_from_slice(&args[..n]);
                    let yields = self.region(b, body, &params)?;
                    let mut next = Vec::with_capacity(yields.len() + written.len());
                    for (&y, &id) in yields.iter().zip(&body.yields) {
                        next.push(if self.is_batched(id) || self.nb() == 0 {
                            y
                        } else {
                            self.broadcast_to_batch(b, y, &k.value_type(id).shape)?
                        });
                    }
                    next.extend(written.iter().map(|r| self.refs[r]));
                    Ok(next)
                })?;
                for (r, &v) in written.iter().zip(&out[n..]) {
                    self.refs.insert(*r, v);
                }
                for (&res, &v) in inst.results.iter().zip(&out[..n]) {
                    self.env.insert(res, v);
                }
                return Ok(());
            }
        };
        self.env.insert(inst.results[0], out);
        Ok(())
    }
}

fn literal_f64(l: Literal) -> f64 {
    match l {
        Literal::Float(x) => x,
        Literal::Int(i) => i as f64,
        Literal::Bool(t) => f64::from(u8::from(t)),
    }
}

/// Whether ref `x` is loaded anywhere inside `r` (including nested regions).
fn reads(r: &Region, x: RefId) -> bool {
    r.insts.iter().any(|inst| {
        matches!(inst.op, Op::Load { src, .. } if src == x)
            || inst.op.regions().into_iter().any(|nested| reads(nested, x))
    })
}

/// Refs stored to anywhere inside `r` (including nested regions), in id order.
fn written_refs(r: &Region) -> BTreeSet<RefId> {
    let mut out = BTreeSet::new();
    for inst in &r.insts {
        if let Op::Store { dst, .. } | Op::StoreScalar { dst, .. } = inst.op {
            out.insert(dst);
        }
        out.extend(memory::written_by(&inst.op));
        for nested in inst.op.regions() {
            out.extend(written_refs(nested));
        }
    }
    out
}

/// A buffer filled with the interpreter's garbage (NaN for floats), so both backends compute
/// the same thing even for a kernel that reads what it never wrote.
fn garbage(b: &mut FuncBuilder<'_>, dtype: DType, shape: &[i64]) -> Result<hlo::Value, HloError> {
    b.splat(
        literal_f64(garbage_literal(dtype)),
        TensorType::new(shape.to_vec(), dtype),
    )
}

/// Errors of the StableHLO builder's own region plumbing (a `while` or `if` it could not
/// assemble); op-level errors are converted with the op and location instead.
impl From<HloError> for KernelError {
    fn from(e: HloError) -> Self {
        KernelError::single(
            "<stablehlo>",
            ProblemKind::Lower,
            "stablehlo",
            format!("lowering to StableHLO failed (a tessera bug; please report it): {e}"),
        )
    }
}

/// How many leading grid dims the StableHLO lowering vectorises for `k` (0: a plain loop).
pub fn vectorised_dims(k: &Kernel) -> usize {
    plan::plan(k).nb
}
