//! The interpreter: runs an instantiated kernel over its grid on host arrays, with the same
//! block pipeline semantics as Pallas on TPU. It is the reference the other backends are
//! tested against, so it is strict where hardware is undefined:
//!
//! - scratch and output buffers start as garbage (NaN), so reading what was never written shows;
//! - an output block is written back when its block index changes (as the TPU pipeline does);
//!   two grid steps that differ in a `parallel` dim writing back the same output block is a race
//!   and an error;
//! - with [`InterpretOptions::shuffle_parallel`], `parallel` grid dims run in a shuffled order,
//!   so a kernel that carries state across parallel iterations gives different results;
//! - dynamic slices and block indices out of bounds are errors, not clamped.

mod tensor;

use std::collections::HashMap;

use crate::array::HostArray;
use crate::error::{KernelError, Problem, ProblemKind};
use crate::instantiate::{ArgSpec, KernelDef};
use crate::ir::{
    DimSemantics, Inst, Kernel, Loc, MemorySpace, Op, OperandRole, RefId, Region, Slice, ValueId,
};
use crate::rules::TargetRules;
pub(crate) use tensor::garbage_literal;
use tensor::{for_each_index, Tensor};

/// How the interpreter runs a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterpretOptions {
    /// Run `parallel` grid dims in an order shuffled with this seed (race detection).
    pub shuffle_parallel: Option<u64>,
    /// The rules the kernel is instantiated under (TPU rules by default).
    pub rules: TargetRules,
}

impl InterpretOptions {
    pub fn shuffled(seed: u64) -> Self {
        InterpretOptions {
            shuffle_parallel: Some(seed),
            ..Self::default()
        }
    }
}

/// Instantiates `def` for `args` and runs it. `args` are the kernel's arguments in order
/// (scalar-prefetch arrays, then inputs); returns the outputs in order.
pub fn run(
    def: &KernelDef,
    args: &[HostArray],
    options: &InterpretOptions,
) -> Result<Vec<HostArray>, KernelError> {
    let specs: Vec<_> = args.iter().map(ArgSpec::of).collect();
    let kernel = def.instantiate(&specs, &options.rules)?;
    run_kernel(&kernel, args, options)
}

/// Runs an instantiated kernel on `args` (scalar prefetch and inputs, in declaration order).
pub fn run_kernel(
    k: &Kernel,
    args: &[HostArray],
    options: &InterpretOptions,
) -> Result<Vec<HostArray>, KernelError> {
    let fail = |subject: String, message: String, loc: Option<Loc>| {
        KernelError::new(
            &k.name,
            vec![Problem {
                kind: ProblemKind::Run,
                subject,
                message,
                loc,
            }],
        )
    };
    // Bind arguments to operands.
    let arg_refs: Vec<RefId> = (0..k.operands.len() as u32)
        .map(RefId)
        .filter(|r| {
            matches!(
                k.operand(*r).role,
                OperandRole::Input | OperandRole::ScalarPrefetch
            )
        })
        .collect();
    if arg_refs.len() != args.len() {
        return Err(fail(
            "arguments".into(),
            format!("expected {} arrays, got {}", arg_refs.len(), args.len()),
            None,
        ));
    }
    let mut arrays: HashMap<RefId, Tensor> = HashMap::new();
    for (&r, a) in arg_refs.iter().zip(args) {
        let o = k.operand(r);
        if a.dtype() != o.dtype || a.shape() != o.array_shape.as_slice() {
            return Err(fail(
                k.describe(r),
                format!(
                    "the kernel was instantiated for {}[{:?}], got {}[{:?}]",
                    o.dtype,
                    o.array_shape,
                    a.dtype(),
                    a.shape()
                ),
                None,
            ));
        }
        arrays.insert(r, Tensor::from_host(a));
    }
    let mut m = Machine {
        k,
        arrays,
        buffers: HashMap::new(),
        env: vec![None; k.types.len()],
        step: Vec::new(),
    };
    for (i, o) in k.operands.iter().enumerate() {
        let r = RefId(i as u32);
        match o.role {
            OperandRole::Output => {
                m.arrays.insert(r, Tensor::garbage(o.dtype, &o.array_shape));
            }
            OperandRole::Scratch => {
                m.buffers
                    .insert(r, Tensor::garbage(o.dtype, &o.array_shape));
            }
            _ => {}
        }
    }

    // Output block currently resident per output with the parallel coordinates of the steps
    // that own it, and who wrote each block back.
    let mut resident: HashMap<RefId, (Vec<usize>, Vec<usize>)> = HashMap::new();
    let mut writers: HashMap<(RefId, Vec<usize>), Vec<usize>> = HashMap::new();
    let order = grid_order(k, options.shuffle_parallel);
    let parallel: Vec<usize> = (0..k.grid.len())
        .filter(|&d| k.semantics[d] == DimSemantics::Parallel)
        .collect();
    for step in order {
        m.step = step.clone();
        // Fetch input blocks; switch output blocks.
        for (i, o) in k.operands.iter().enumerate() {
            let r = RefId(i as u32);
            let Some(b) = &o.block else { continue };
            let bidx = m.block_index(r, &b.index_map, &step)?;
            let sizes = o.block_sizes();
            let starts: Vec<usize> = bidx.iter().zip(&sizes).map(|(i, s)| i * s).collect();
            match o.role {
                OperandRole::Input => {
                    let block = m.arrays[&r].window(&starts, &sizes);
                    m.buffers.insert(r, block.reshape(&o.view_shape()));
                }
                OperandRole::Output => {
                    let par: Vec<usize> = parallel.iter().map(|&d| step[d]).collect();
                    match resident.get(&r) {
                        Some((held, owner)) if *held == bidx => {
                            if *owner != par {
                                return Err(m.race(r, &bidx, &parallel, owner, &par));
                            }
                        }
                        _ => {
                            if let Some((prev, owner)) = resident.remove(&r) {
                                m.write_back(r, &prev, &owner, &mut writers, &parallel)?;
                            }
                            m.buffers
                                .insert(r, Tensor::garbage(o.dtype, &o.view_shape()));
                            resident.insert(r, (bidx, par));
                        }
                    }
                }
                _ => {}
            }
        }
        let body = &k.body;
        m.region(body, &[])?;
    }
    let outputs: Vec<RefId> = k
        .operands_with(OperandRole::Output)
        .map(|(r, _)| r)
        .collect();
    for &r in &outputs {
        if let Some((prev, owner)) = resident.remove(&r) {
            m.write_back(r, &prev, &owner, &mut writers, &parallel)?;
        }
    }
    Ok(outputs
        .into_iter()
        .map(|r| {
            m.arrays
                .remove(&r)
                .expect("outputs are allocated")
                .into_host()
        })
        .collect())
}

/// The grid steps in execution order: row-major, with `parallel` dims permuted when shuffled.
fn grid_order(k: &Kernel, shuffle: Option<u64>) -> Vec<Vec<usize>> {
    let perms: Vec<Vec<usize>> = k
        .grid
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            let mut p: Vec<usize> = (0..n).collect();
            if let (Some(seed), DimSemantics::Parallel) = (shuffle, k.semantics[d]) {
                let mut rng = fastrand::Rng::with_seed(seed.wrapping_add(d as u64 * 0x9e37_79b9));
                rng.shuffle(&mut p);
            }
            p
        })
        .collect();
    let mut order = Vec::with_capacity(k.grid.iter().product());
    for_each_index(&k.grid, |_, idx| {
        order.push(idx.iter().enumerate().map(|(d, &i)| perms[d][i]).collect());
    });
    order
}

struct Machine<'k> {
    k: &'k Kernel,
    /// Whole arrays: inputs, scalar prefetch, outputs.
    arrays: HashMap<RefId, Tensor>,
    /// What the body sees: input/output blocks, scratch, keyed by ref.
    buffers: HashMap<RefId, Tensor>,
    env: Vec<Option<Tensor>>,
    step: Vec<usize>,
}

impl Machine<'_> {
    fn error(&self, loc: Loc, subject: impl Into<String>, message: String) -> KernelError {
        KernelError::new(
            &self.k.name,
            vec![Problem {
                kind: ProblemKind::Run,
                subject: subject.into(),
                message: format!("{message} (at grid step {:?})", self.step),
                loc: Some(loc),
            }],
        )
    }

    fn block_index(
        &mut self,
        r: RefId,
        map: &Region,
        step: &[usize],
    ) -> Result<Vec<usize>, KernelError> {
        let args: Vec<Tensor> = step.iter().map(|&i| Tensor::scalar_i32(i as i32)).collect();
        let out = self.region(map, &args)?;
        let o = self.k.operand(r);
        let sizes = o.block_sizes();
        let mut idx = Vec::with_capacity(out.len());
        for (d, t) in out.iter().enumerate() {
            let i = t.as_i32();
            let blocks = o.array_shape[d] / sizes[d];
            if i < 0 || i as usize >= blocks {
                return Err(self.error(
                    o.loc,
                    self.k.describe(r),
                    format!("the index map gives block index {i} for dim {d}, which has {blocks} blocks of {}", sizes[d]),
                ));
            }
            idx.push(i as usize);
        }
        Ok(idx)
    }

    fn race(
        &self,
        r: RefId,
        bidx: &[usize],
        parallel: &[usize],
        a: &[usize],
        b: &[usize],
    ) -> KernelError {
        self.error(
            self.k.operand(r).loc,
            self.k.describe(r),
            format!(
                "race: output block {bidx:?} is written by grid steps whose parallel dims {parallel:?} \
                 differ ({a:?} and {b:?}); mark the dim `arbitrary` or give each parallel step its own block"
            ),
        )
    }

    /// Copies a resident output block back to its array, checking no other parallel step
    /// wrote that block before.
    fn write_back(
        &mut self,
        r: RefId,
        bidx: &[usize],
        owner: &[usize],
        writers: &mut HashMap<(RefId, Vec<usize>), Vec<usize>>,
        parallel: &[usize],
    ) -> Result<(), KernelError> {
        let o = self.k.operand(r);
        if let Some(prev) = writers.insert((r, bidx.to_vec()), owner.to_vec()) {
            if prev != owner {
                return Err(self.race(r, bidx, parallel, &prev, owner));
            }
        }
        let sizes = o.block_sizes();
        let starts: Vec<usize> = bidx.iter().zip(&sizes).map(|(i, s)| i * s).collect();
        let block = self.buffers[&r].reshape(&sizes);
        self.arrays
            .get_mut(&r)
            .expect("outputs are allocated")
            .write_window(&starts, &block);
        Ok(())
    }

    fn get(&self, v: ValueId) -> &Tensor {
        self.env[v.index()]
            .as_ref()
            .expect("verified: values are defined before use")
    }

    fn set(&mut self, v: ValueId, t: Tensor) {
        self.env[v.index()] = Some(t);
    }

    /// Runs a region with `args` bound to its params; returns its yields.
    fn region(&mut self, r: &Region, args: &[Tensor]) -> Result<Vec<Tensor>, KernelError> {
        for (&p, a) in r.params.iter().zip(args) {
            self.set(p, a.clone());
        }
        for inst in &r.insts {
            self.inst(inst)?;
        }
        Ok(r.yields.iter().map(|&y| self.get(y).clone()).collect())
    }

    fn starts(
        &self,
        inst: &Inst,
        r: RefId,
        slices: &[Slice],
    ) -> Result<(Vec<usize>, Vec<usize>), KernelError> {
        let view = self.k.operand(r).view_shape();
        let mut starts = Vec::with_capacity(slices.len());
        let mut sizes = Vec::with_capacity(slices.len());
        for (d, (s, &n)) in slices.iter().zip(&view).enumerate() {
            let (start, len) = match *s {
                Slice::Full => (0, n),
                Slice::Static { start, len } => (start, len),
                Slice::Dynamic { start, len } => {
                    let st = self.get(start).as_i32();
                    if st < 0 || st as usize + len > n {
                        return Err(self.error(
                            inst.loc,
                            format!("`{}` of {}", inst.op.name(), self.k.describe(r)),
                            format!(
                                "dynamic slice {st}..{} of dim {d} is outside the block size {n}",
                                st as i64 + len as i64
                            ),
                        ));
                    }
                    (st as usize, len)
                }
            };
            starts.push(start);
            sizes.push(len);
        }
        Ok((starts, sizes))
    }

    fn inst(&mut self, inst: &Inst) -> Result<(), KernelError> {
        let out = match &inst.op {
            Op::ProgramId { axis } => Tensor::scalar_i32(self.step[*axis] as i32),
            Op::NumPrograms { axis } => Tensor::scalar_i32(self.k.grid[*axis] as i32),
            Op::Constant { value, ty } => Tensor::splat(ty.dtype, &ty.shape, *value),
            Op::Load { src, slices } => {
                let (starts, sizes) = self.starts(inst, *src, slices)?;
                self.buffers[src].window(&starts, &sizes)
            }
            Op::Store { dst, slices, value } => {
                let (starts, _) = self.starts(inst, *dst, slices)?;
                let v = self.get(*value).clone();
                self.buffers
                    .get_mut(dst)
                    .expect("blocks are resident")
                    .write_window(&starts, &v);
                return Ok(());
            }
            Op::LoadScalar { src, indices } => {
                let o = self.k.operand(*src);
                let table = if o.role == OperandRole::Scratch {
                    &self.buffers[src]
                } else {
                    &self.arrays[src]
                };
                let mut starts = Vec::with_capacity(indices.len());
                for (d, &i) in indices.iter().enumerate() {
                    let i = self.get(i).as_i32();
                    if i < 0 || i as usize >= o.array_shape[d] {
                        return Err(self.error(
                            inst.loc,
                            format!("`load_scalar` of {}", self.k.describe(*src)),
                            format!(
                                "index {i} is out of bounds for dim {d} of size {}",
                                o.array_shape[d]
                            ),
                        ));
                    }
                    starts.push(i as usize);
                }
                table.window(&starts, &vec![1; starts.len()]).reshape(&[])
            }
            Op::Unary { op, x } => self.get(*x).unary(*op),
            Op::Binary { op, lhs, rhs } => self.get(*lhs).binary(*op, self.get(*rhs)),
            Op::Compare { op, lhs, rhs } => self.get(*lhs).compare(*op, self.get(*rhs)),
            Op::Select {
                cond,
                on_true,
                on_false,
            } => Tensor::select(self.get(*cond), self.get(*on_true), self.get(*on_false)),
            Op::Cast { x, to } => self.get(*x).cast(*to),
            Op::Broadcast { x, shape } => self.get(*x).broadcast(shape),
            Op::Reshape { x, shape } => self.get(*x).reshape(shape),
            Op::Iota { ty, dim } => Tensor::iota(ty.dtype, &ty.shape, *dim),
            Op::Reduce { op, x, axis } => self.get(*x).reduce(*op, *axis),
            Op::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => self
                .get(*lhs)
                .dot(self.get(*rhs), *transpose_lhs, *transpose_rhs),
            Op::When {
                cond,
                then,
                otherwise,
            } => {
                let taken = if self.get(*cond).as_bool() {
                    then
                } else {
                    otherwise
                };
                self.region(taken, &[])?;
                return Ok(());
            }
            Op::ForLoop { lo, hi, init, body } => {
                let (lo, hi) = (self.get(*lo).as_i32(), self.get(*hi).as_i32());
                let mut carry: Vec<Tensor> = init.iter().map(|&v| self.get(v).clone()).collect();
                for i in lo..hi {
                    let mut args = vec![Tensor::scalar_i32(i)];
                    args.extend(carry);
                    carry = self.region(body, &args)?;
                }
                for (&r, t) in inst.results.iter().zip(carry) {
                    self.set(r, t);
                }
                return Ok(());
            }
        };
        self.set(inst.results[0], out);
        Ok(())
    }
}

/// Largest grid whose index maps are evaluated exhaustively at instantiation.
const COVERAGE_CHECK_MAX_STEPS: usize = 1 << 18;

/// Checks, for every blocked operand whose index map reads no SMEM (so it depends on the grid
/// indices alone), that every block index is in bounds and that every output block is written.
/// Index maps that read scalar prefetch are checked at run time instead.
pub(crate) fn check_coverage(k: &Kernel) -> Vec<Problem> {
    let steps: usize = k.grid.iter().product();
    if steps == 0 || steps > COVERAGE_CHECK_MAX_STEPS {
        return Vec::new();
    }
    let mut problems = Vec::new();
    for (i, o) in k.operands.iter().enumerate() {
        let r = RefId(i as u32);
        let Some(b) = &o.block else { continue };
        if o.memory != MemorySpace::Vmem || reads_smem(&b.index_map) {
            continue;
        }
        let mut m = Machine {
            k,
            arrays: HashMap::new(),
            buffers: HashMap::new(),
            env: vec![None; k.types.len()],
            step: Vec::new(),
        };
        let sizes = o.block_sizes();
        let blocks: Vec<usize> = o
            .array_shape
            .iter()
            .zip(&sizes)
            .map(|(n, s)| n / s.max(&1))
            .collect();
        let mut seen = vec![false; blocks.iter().product()];
        let mut failed = false;
        for_each_index(&k.grid, |_, step| {
            if failed {
                return;
            }
            m.step = step.to_vec();
            match m.block_index(r, &b.index_map, step) {
                Ok(idx) => {
                    let flat = idx
                        .iter()
                        .zip(tensor::strides(&blocks))
                        .map(|(i, s)| i * s)
                        .sum::<usize>();
                    seen[flat] = true;
                }
                Err(e) => {
                    failed = true;
                    problems.extend(e.problems.into_iter().map(|p| Problem {
                        kind: ProblemKind::Coverage,
                        ..p
                    }));
                }
            }
        });
        if !failed && o.role == OperandRole::Output {
            if let Some(missing) = seen.iter().position(|s| !s) {
                let mut idx = vec![0; blocks.len()];
                let mut rem = missing;
                for (d, s) in tensor::strides(&blocks).iter().enumerate() {
                    idx[d] = rem / s;
                    rem %= s;
                }
                problems.push(Problem {
                    kind: ProblemKind::Coverage,
                    subject: k.describe(r),
                    message: format!(
                        "output block {idx:?} (of {blocks:?} blocks of {sizes:?}) is never written: \
                         the grid {:?} and the index map do not cover the output",
                        k.grid
                    ),
                    loc: Some(o.loc),
                });
            }
        }
    }
    problems
}

fn reads_smem(r: &Region) -> bool {
    r.insts.iter().any(|i| {
        matches!(i.op, Op::LoadScalar { .. }) || i.op.regions().into_iter().any(reads_smem)
    })
}
