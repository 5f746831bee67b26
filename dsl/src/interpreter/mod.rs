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
//! - a load of scratch or of an output block that reads what a grid step of other `parallel`
//!   coordinates stored is an error naming the load's kernel line (state carried across a
//!   parallel dim: on a chip with two TensorCores the other core's buffers hold it, and any
//!   order of parallel steps is allowed); the check follows the sequential order, so it reports
//!   the same whether or not the grid is split between cores. Buffers that copies touch are
//!   left to the copy race detector ([`dma`]);
//! - under megacore rules ([`KernelRules::megacore`], v4 and v5p) the leading `parallel` grid
//!   dims are split between two simulated cores, each with its own scratch and output buffers
//!   (the first core runs the first half of those dims' iterations, the second the rest;
//!   buffers that copies touch stay shared);
//! - dynamic slices and block indices out of bounds are errors, not clamped;
//! - copies are asynchronous and several devices run interleaved; races, deadlocks and
//!   semaphores left non-zero are errors naming the lines involved ([`dma`] says how).
//!
//! `run` and `run_on_devices`, which take a kernel definition (instantiate it, then run it),
//! live in the public facade `interpret.rs`, above both this module and instantiation
//! (instantiation runs `check_coverage` here, which evaluates index maps with the
//! interpreter).

pub mod dma;
mod memory;
mod tensor;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use crate::array::HostArray;
use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    DType, DimSemantics, Inst, Kernel, Literal, Loc, MemorySpace, Op, OperandRole, RefId, Region,
    Slice, ValueId,
};
use crate::rules::{KernelRules, ALIASED_READ_DISTANCE};
use tensor::{for_each_index, Data, Tensor};

/// How the interpreter runs a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterpretOptions {
    /// Run `parallel` grid dims in an order shuffled with this seed (race detection).
    pub shuffle_parallel: Option<u64>,
    /// The rules the kernel is instantiated under (TPU rules by default).
    pub rules: KernelRules,
    /// Land each asynchronous copy at a random operation (seeded) between its start and the
    /// wait that needs it, instead of at that wait.
    pub copy_landing: Option<u64>,
    /// Interleave the devices of a multi-device kernel in an order drawn from this seed
    /// instead of round robin.
    pub schedule_seed: Option<u64>,
    /// Split the leading parallel grid dims between two cores; `None`: as the rules say
    /// ([`KernelRules::megacore`]).
    pub megacore: Option<bool>,
    /// Let loads read what steps of other parallel coordinates stored instead of refusing
    /// the kernel (to see what a chip would compute: with megacore, the second core reads
    /// its own garbage).
    pub allow_state_across_parallel: bool,
    /// Where `debug_print!` lines go; `None`: stderr.
    pub debug_log: Option<DebugLog>,
}

/// The lines a kernel's `debug_print!`s printed, each prefixed with the grid step (and the
/// device, on a mesh): `grid step [0, 1]: m = 3`. Clones share one log.
#[derive(Debug, Clone, Default)]
pub struct DebugLog(Arc<Mutex<Vec<String>>>);

impl DebugLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every line so far, in the order printed (devices of a mesh interleave).
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn push(&self, line: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }
}

/// Two handles are equal when they share one log.
impl PartialEq for DebugLog {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DebugLog {}

impl InterpretOptions {
    pub fn shuffled(seed: u64) -> Self {
        InterpretOptions {
            shuffle_parallel: Some(seed),
            ..Self::default()
        }
    }
}

/// Runs an instantiated kernel on `args` (scalar prefetch and inputs, in declaration order).
pub fn run_kernel(
    k: &Kernel,
    args: &[HostArray],
    options: &InterpretOptions,
) -> Result<Vec<HostArray>, KernelError> {
    if k.num_devices() > 1 {
        return Err(KernelError::single(
            &k.name,
            ProblemKind::Argument,
            "mesh",
            format!(
                "the kernel runs on {} devices; run it with one argument list per device \
                 (`interpret::run_kernel_on_devices`)",
                k.num_devices()
            ),
        ));
    }
    let mut outs = run_devices(k, &[args], options)?;
    Ok(outs.pop().unwrap_or_default())
}

/// Runs an instantiated kernel on every device of its mesh (one argument list per device),
/// as interleaved instances; see [`dma`] for how copies, semaphores and races are modelled.
pub fn run_kernel_on_devices(
    k: &Kernel,
    per_device: &[Vec<HostArray>],
    options: &InterpretOptions,
) -> Result<Vec<Vec<HostArray>>, KernelError> {
    let args: Vec<&[HostArray]> = per_device.iter().map(Vec::as_slice).collect();
    run_devices(k, &args, options)
}

fn run_devices(
    k: &Kernel,
    per_device: &[&[HostArray]],
    options: &InterpretOptions,
) -> Result<Vec<Vec<HostArray>>, KernelError> {
    let n = k.num_devices();
    if per_device.len() != n {
        return Err(KernelError::single(
            &k.name,
            ProblemKind::Argument,
            "arguments",
            format!(
                "the kernel runs on {n} devices but {} argument lists were given",
                per_device.len()
            ),
        ));
    }
    // A kernel with run-time checks takes the zeros its check flags start from too.
    let with_init: Vec<Vec<HostArray>> = per_device
        .iter()
        .map(|args| {
            let mut args = args.to_vec();
            args.extend(crate::checks::flags_init(k));
            args
        })
        .collect();
    let world = dma::World::new(k, options.copy_landing, options.schedule_seed);
    let mut devices = Vec::with_capacity(n);
    for (d, args) in with_init.iter().enumerate() {
        devices.push(Device::bind(k, d, args, &world)?);
    }
    let results: Vec<Result<Vec<Option<HostArray>>, KernelError>> = if n == 1 {
        devices
            .into_iter()
            .map(|dev| dev.run(&world, options))
            .collect()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = devices
                .into_iter()
                .map(|dev| {
                    let world = &world;
                    s.spawn(move || dev.run(world, options))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };
    if let Some(f) = world.failure() {
        return Err(f);
    }
    let mut outs = Vec::with_capacity(n);
    for r in results {
        outs.push(r?);
    }
    world.exit_check()?;
    let mut outs: Vec<Vec<HostArray>> = outs
        .into_iter()
        .enumerate()
        .map(|(d, device_outs)| {
            k.operands_with(OperandRole::Output)
                .zip(device_outs)
                .map(|((r, _), out)| out.unwrap_or_else(|| world.take_array(d, r).into_host()))
                .collect()
        })
        .collect();
    for device_outs in &mut outs {
        crate::checks::take_failure(k, device_outs)?;
    }
    Ok(outs)
}

/// One device's instance of a kernel, bound to its arguments.
struct Device<'k> {
    k: &'k Kernel,
    index: usize,
    arrays: HashMap<RefId, Tensor>,
    /// The outputs that alias an input, holding its values: what they start as.
    aliased: HashMap<RefId, Tensor>,
}

impl<'k> Device<'k> {
    /// Binds the arguments (scalar prefetch and inputs, in order) of device `d`; HBM
    /// operands and the buffers copies touch go to the shared world.
    fn bind(
        k: &'k Kernel,
        d: usize,
        args: &[HostArray],
        world: &dma::World<'k>,
    ) -> Result<Self, KernelError> {
        let fail = |subject: String, message: String| {
            KernelError::new(
                &k.name,
                vec![Problem {
                    kind: ProblemKind::Run,
                    subject,
                    message,
                    loc: None,
                }],
            )
        };
        let arg_refs = k.all_argument_refs();
        let on = if k.num_devices() > 1 {
            format!(" (device {d})")
        } else {
            String::new()
        };
        if arg_refs.len() != args.len() {
            return Err(fail(
                format!("arguments{on}"),
                format!("expected {} arrays, got {}", arg_refs.len(), args.len()),
            ));
        }
        let mut arrays = HashMap::new();
        let mut shared = Vec::new();
        for (&r, a) in arg_refs.iter().zip(args) {
            let o = k.operand(r);
            if a.dtype() != o.dtype || a.shape() != o.array_shape.as_slice() {
                return Err(fail(
                    format!("{}{on}", k.describe(r)),
                    format!(
                        "the kernel was instantiated for {}[{:?}], got {}[{:?}]",
                        o.dtype,
                        o.array_shape,
                        a.dtype(),
                        a.shape()
                    ),
                ));
            }
            if world.shared.contains(&r) {
                shared.push((r, Tensor::from_host(a)));
            } else {
                arrays.insert(r, Tensor::from_host(a));
            }
        }
        // An output aliasing an input starts as the input's values (its buffer).
        let mut aliased: HashMap<RefId, Tensor> = k
            .operands_with(OperandRole::Output)
            .filter_map(|(r, o)| {
                let at = arg_refs.iter().position(|&a| Some(a) == o.aliases)?;
                Some((r, Tensor::from_host(&args[at])))
            })
            .collect();
        let mut scoped = HashSet::new();
        crate::ir::scoped_allocs(&k.body, &mut |_, r| {
            scoped.insert(r);
        });
        for (i, o) in k.operands.iter().enumerate() {
            let r = RefId(i as u32);
            let is_buffer = matches!(o.role, OperandRole::Output | OperandRole::Scratch);
            if world.shared.contains(&r) && is_buffer && !scoped.contains(&r) {
                let initial = aliased
                    .remove(&r)
                    .unwrap_or_else(|| Tensor::garbage(o.dtype, &o.array_shape));
                shared.push((r, initial));
            }
        }
        world.allocate(d, shared);
        Ok(Device {
            k,
            index: d,
            arrays,
            aliased,
        })
    }

    /// Runs the whole grid; returns the outputs this device holds (`None` for HBM outputs,
    /// which the world holds).
    fn run(
        self,
        world: &dma::World<'k>,
        options: &InterpretOptions,
    ) -> Result<Vec<Option<HostArray>>, KernelError> {
        let d = self.index;
        world.enter(d)?;
        let result = self.grid(world, options);
        match result {
            Ok(outs) => {
                world.finish(d)?;
                Ok(outs)
            }
            Err(e) => Err(world.record(e)),
        }
    }

    fn grid(
        self,
        world: &dma::World<'k>,
        options: &InterpretOptions,
    ) -> Result<Vec<Option<HostArray>>, KernelError> {
        let k = self.k;
        let mut aliased = self.aliased;
        let mut m = Machine::new(k, self.arrays, Some((world, self.index)));
        m.check_parallel_state = !options.allow_state_across_parallel;
        m.debug_log = options.debug_log.clone();
        // The local scratch buffers (not semaphores, not in the shared world).
        let mut scratch = Vec::new();
        for (i, o) in k.operands.iter().enumerate() {
            let r = RefId(i as u32);
            if world.shared.contains(&r) {
                continue;
            }
            match o.role {
                OperandRole::Output => {
                    let initial = aliased
                        .remove(&r)
                        .unwrap_or_else(|| Tensor::garbage(o.dtype, &o.array_shape));
                    m.arrays.insert(r, initial);
                    m.tags.insert(r, Tensor::unwritten(&o.view_shape()));
                }
                OperandRole::Scratch if o.memory.semaphore().is_none() => {
                    m.buffers
                        .insert(r, Tensor::garbage(o.dtype, &o.array_shape));
                    m.tags.insert(r, Tensor::unwritten(&o.array_shape));
                    scratch.push(r);
                }
                _ => {}
            }
        }

        // Output block currently resident per output with the parallel coordinates of the
        // steps that own it, and who wrote each block back.
        let mut resident: HashMap<RefId, (Vec<usize>, Vec<usize>)> = HashMap::new();
        let mut writers: HashMap<(RefId, Vec<usize>), Vec<usize>> = HashMap::new();
        // The output block each output's tags describe: resident in the sequential order,
        // which the check follows whether or not the grid is split between cores.
        let mut tagged_block: HashMap<RefId, Vec<usize>> = HashMap::new();
        // Per blocked output, which of its elements some step stored (folded from the tags
        // when the tagged block changes, and at the end).
        let mut stored = StoredElements::new(k);
        // An input an output aliases reads its blocks from that output's buffer, which holds
        // what earlier steps wrote back (the caller's values where none has); the last step
        // each of the output's blocks was resident at says whether that write-back is done.
        let read_through: HashMap<RefId, RefId> = k
            .operands_with(OperandRole::Output)
            .filter_map(|(r, o)| Some((o.aliases?, r)))
            .filter(|(_, out)| m.arrays.contains_key(out))
            .collect();
        let mut last_resident: HashMap<(RefId, Vec<usize>), usize> = HashMap::new();
        let parallel = m.parallel.clone();
        let outputs: Vec<RefId> = k
            .operands_with(OperandRole::Output)
            .map(|(r, _)| r)
            .collect();
        let megacore = options.megacore.unwrap_or(options.rules.megacore);
        let (order, second_core) =
            split_between_cores(k, grid_order(k, options.shuffle_parallel), megacore);
        for (n, step) in order.into_iter().enumerate() {
            if second_core == Some(n) {
                // The second core starts with its own scratch and output buffers; the first
                // has written its output blocks back.
                for &r in &outputs {
                    if let Some((prev, owner)) = resident.remove(&r) {
                        m.write_back(r, &prev, &owner, &mut writers, &parallel)?;
                    }
                }
                for &r in &scratch {
                    let o = k.operand(r);
                    m.buffers
                        .insert(r, Tensor::garbage(o.dtype, &o.array_shape));
                }
            }
            m.step = step.clone();
            let par: Vec<usize> = parallel.iter().map(|&d| step[d]).collect();
            m.par_id = m.par_id_of(&par);
            // A race found while switching output blocks is reported after the body, unless
            // the body fails first: a load of state carried across the parallel dim names the
            // line.
            let mut race = None;
            // Fetch input blocks; switch output blocks.
            for (i, o) in k.operands.iter().enumerate() {
                let r = RefId(i as u32);
                let Some(b) = &o.block else { continue };
                let bidx = m.block_index(r, &b.index_map, &step)?;
                let sizes = o.block_sizes();
                let starts: Vec<usize> = bidx.iter().zip(&sizes).map(|(i, s)| i * s).collect();
                match o.role {
                    OperandRole::Input => {
                        let source = match read_through.get(&r) {
                            Some(&out) => {
                                if let Some(&s) = last_resident.get(&(out, bidx.clone())) {
                                    if n - s < ALIASED_READ_DISTANCE {
                                        return Err(m.aliased_read_too_soon(r, out, &bidx, n, s));
                                    }
                                }
                                out
                            }
                            None => r,
                        };
                        let block = m.arrays[&source].window(&starts, &sizes);
                        m.buffers.insert(r, block.reshape(&o.view_shape()));
                    }
                    OperandRole::Output => {
                        if tagged_block.get(&r) != Some(&bidx) {
                            if let Some(prev) = tagged_block.get(&r) {
                                stored.fold(k, r, prev, &m.tags[&r]);
                            }
                            m.tags.insert(r, Tensor::unwritten(&o.view_shape()));
                            tagged_block.insert(r, bidx.clone());
                        }
                        match resident.get(&r) {
                            Some((held, owner)) if *held == bidx => {
                                if *owner != par && race.is_none() {
                                    race = Some(m.race(r, &bidx, &parallel, owner, &par));
                                }
                            }
                            _ => {
                                if let Some((prev, owner)) = resident.remove(&r) {
                                    m.write_back(r, &prev, &owner, &mut writers, &parallel)?;
                                }
                                m.buffers
                                    .insert(r, Tensor::garbage(o.dtype, &o.view_shape()));
                                resident.insert(r, (bidx, par.clone()));
                            }
                        }
                    }
                    _ => {}
                }
            }
            for out in read_through.values() {
                if let Some((held, _)) = resident.get(out) {
                    last_resident.insert((*out, held.clone()), n);
                }
            }
            let body = &k.body;
            m.region(body, &[])?;
            if let Some(e) = race {
                return Err(e);
            }
        }
        for &r in &outputs {
            if let Some((prev, owner)) = resident.remove(&r) {
                m.write_back(r, &prev, &owner, &mut writers, &parallel)?;
            }
            if let Some(prev) = tagged_block.get(&r) {
                stored.fold(k, r, prev, &m.tags[&r]);
            }
        }
        stored.check(k)?;
        Ok(outputs
            .into_iter()
            .map(|r| m.arrays.remove(&r).map(Tensor::into_host))
            .collect())
    }
}

/// Which elements of each blocked output without an alias the grid's steps stored: an
/// element no step stores holds garbage (NaN) when the kernel ends, which a kernel means only
/// by mistake (a grid that skips blocks needs `input_output_aliases`), so it is reported.
struct StoredElements {
    /// Per output, one flag per element of the whole array (row-major).
    stored: HashMap<RefId, Vec<bool>>,
}

impl StoredElements {
    fn new(k: &Kernel) -> Self {
        let stored = k
            .operands_with(OperandRole::Output)
            .filter(|(_, o)| o.block.is_some() && o.aliases.is_none())
            .map(|(r, o)| (r, vec![false; o.array_shape.iter().product()]))
            .collect();
        StoredElements { stored }
    }

    /// Marks what `tags` (output `r`'s block `bidx`, in its view shape) say was stored. The
    /// view is the block with its squeezed dims dropped: the same elements in the same
    /// row-major order as the block with those dims of size 1.
    fn fold(&mut self, k: &Kernel, r: RefId, bidx: &[usize], tags: &Tensor) {
        let Some(flags) = self.stored.get_mut(&r) else {
            return;
        };
        let Data::I(ids) = &tags.data else {
            unreachable!("tags are i32")
        };
        let o = k.operand(r);
        let sizes = o.block_sizes();
        for_each_index(&sizes, |e, idx| {
            if ids[e] == UNWRITTEN {
                return;
            }
            flags[element_of_block(&o.array_shape, &sizes, bidx, idx)] = true;
        });
    }

    /// Refuses outputs with elements no step stored, naming the output and its blocks.
    fn check(&self, k: &Kernel) -> Result<(), KernelError> {
        let mut problems = Vec::new();
        for (&r, flags) in &self.stored {
            if flags.iter().all(|&f| f) {
                continue;
            }
            let o = k.operand(r);
            let sizes = o.block_sizes();
            let blocks: Vec<usize> = o
                .array_shape
                .iter()
                .zip(&sizes)
                .map(|(n, s)| n / s)
                .collect();
            let mut unwritten = Vec::new();
            for_each_index(&blocks, |_, b| {
                let mut whole = true;
                for_each_index(&sizes, |_, i| {
                    whole &= flags[element_of_block(&o.array_shape, &sizes, b, i)];
                });
                if !whole {
                    unwritten.push(format!("{b:?}"));
                }
            });
            let total: usize = blocks.iter().product();
            let shown = unwritten.len().min(8);
            let more = if unwritten.len() > shown { ", ..." } else { "" };
            problems.push(Problem {
                kind: ProblemKind::Run,
                subject: k.describe(r),
                message: format!(
                    "{} of its {total} blocks are not wholly stored by any grid step, so they \
                     end as garbage (NaN): blocks {}{more}; store every block the grid visits, \
                     or make `{}` an alias of an input (`#[alias(x)]`, Pallas' \
                     `input_output_aliases`) so that what the kernel does not store keeps the \
                     input's values",
                    unwritten.len(),
                    unwritten[..shown].join(", "),
                    o.name
                ),
                loc: Some(o.loc),
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(KernelError::new(&k.name, problems))
        }
    }
}

/// The row-major position in an array of `shape` of element `idx` of block `bidx` (blocks of
/// `sizes`).
fn element_of_block(shape: &[usize], sizes: &[usize], bidx: &[usize], idx: &[usize]) -> usize {
    idx.iter()
        .zip(bidx.iter().zip(sizes))
        .zip(shape)
        .fold(0, |acc, ((&i, (&b, &s)), &n)| acc * n + b * s + i)
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

/// The grid steps in the order the cores run them, and where the second core starts: with
/// `megacore`, the leading parallel dims' iterations are split in two halves (the first
/// `ceil(n / 2)` of their row-major order on the first core); each core keeps the order of
/// its steps in `order`.
fn split_between_cores(
    k: &Kernel,
    order: Vec<Vec<usize>>,
    megacore: bool,
) -> (Vec<Vec<usize>>, Option<usize>) {
    let lead = k
        .semantics
        .iter()
        .take_while(|s| **s == DimSemantics::Parallel)
        .count();
    let n: usize = k.grid[..lead].iter().product();
    if !megacore || n < 2 {
        return (order, None);
    }
    let first_core = |step: &[usize]| {
        let flat = step[..lead]
            .iter()
            .zip(&k.grid[..lead])
            .fold(0, |acc, (&i, &g)| acc * g + i);
        flat < n.div_ceil(2)
    };
    let (first, second): (Vec<_>, Vec<_>) = order.into_iter().partition(|s| first_core(s));
    let at = first.len();
    (first.into_iter().chain(second).collect(), Some(at))
}

struct Machine<'k, 'w> {
    k: &'k Kernel,
    /// Whole arrays: inputs, scalar prefetch, outputs (not those in the shared world).
    arrays: HashMap<RefId, Tensor>,
    /// What the body sees: input/output blocks, scratch, keyed by ref.
    buffers: HashMap<RefId, Tensor>,
    env: Vec<Option<Tensor>>,
    step: Vec<usize>,
    /// The shared world of copies and semaphores, and this device's index in it (`None`
    /// when only index maps are evaluated).
    dev: Option<(&'w dma::World<'k>, usize)>,
    /// The `parallel` grid dims.
    parallel: Vec<usize>,
    /// Per local scratch buffer and resident output block, for each element the parallel
    /// coordinates (flattened, [`Machine::par_id_of`]) of the step that last stored it, or
    /// [`UNWRITTEN`].
    tags: HashMap<RefId, Tensor>,
    /// The current step's parallel coordinates, flattened.
    par_id: i32,
    /// Refuse loads of what other parallel coordinates stored.
    check_parallel_state: bool,
    /// Where `debug_print!` lines go (`None`: stderr).
    debug_log: Option<DebugLog>,
}

/// The tag of an element no step has stored.
const UNWRITTEN: i32 = -1;

impl Tensor {
    /// Tags of a buffer nothing was stored in.
    fn unwritten(shape: &[usize]) -> Tensor {
        Tensor::splat(DType::I32, shape, Literal::Int(UNWRITTEN as i64))
    }
}

impl<'k, 'w> Machine<'k, 'w> {
    fn new(
        k: &'k Kernel,
        arrays: HashMap<RefId, Tensor>,
        dev: Option<(&'w dma::World<'k>, usize)>,
    ) -> Self {
        Machine {
            k,
            arrays,
            buffers: HashMap::new(),
            env: vec![None; k.types.len()],
            step: Vec::new(),
            dev,
            parallel: (0..k.grid.len())
                .filter(|&d| k.semantics[d] == DimSemantics::Parallel)
                .collect(),
            tags: HashMap::new(),
            par_id: 0,
            check_parallel_state: false,
            debug_log: None,
        }
    }

    /// The parallel coordinates `par` (one per parallel dim) as one number.
    fn par_id_of(&self, par: &[usize]) -> i32 {
        par.iter()
            .zip(&self.parallel)
            .fold(0, |acc, (&i, &d)| acc * self.k.grid[d] + i) as i32
    }

    /// The parallel coordinates of a tag.
    fn par_of_id(&self, mut id: i32) -> Vec<usize> {
        let mut par = vec![0; self.parallel.len()];
        for (p, &d) in par.iter_mut().zip(&self.parallel).rev() {
            let g = self.k.grid[d] as i32;
            *p = (id % g) as usize;
            id /= g;
        }
        par
    }

    /// Records that the current step stored the box `starts` + `sizes` of `r`.
    fn stored(&mut self, r: RefId, starts: &[usize], sizes: &[usize]) {
        if let Some(tags) = self.tags.get_mut(&r) {
            tags.write_window(
                starts,
                &Tensor::splat(DType::I32, sizes, Literal::Int(self.par_id as i64)),
            );
        }
    }

    /// Refuses a load of the box `starts` + `sizes` of `r` when a step of other parallel
    /// coordinates stored any of it.
    fn check_load(
        &self,
        inst: &Inst,
        r: RefId,
        starts: &[usize],
        sizes: &[usize],
    ) -> Result<(), KernelError> {
        if !self.check_parallel_state {
            return Ok(());
        }
        let Some(tags) = self.tags.get(&r) else {
            return Ok(());
        };
        let window = tags.window(starts, sizes);
        let Data::I(ids) = &window.data else {
            unreachable!("tags are i32")
        };
        let Some(&other) = ids.iter().find(|&&t| t != UNWRITTEN && t != self.par_id) else {
            return Ok(());
        };
        let (there, here) = (self.par_of_id(other), self.par_of_id(self.par_id));
        let dims: Vec<String> = self
            .parallel
            .iter()
            .zip(there.iter().zip(&here))
            .filter(|(_, (a, b))| a != b)
            .map(|(d, (a, b))| format!("parallel dim {d} is {a} there, {b} here"))
            .collect();
        let what = match self.k.operand(r).role {
            OperandRole::Scratch => "scratch",
            _ => "output block",
        };
        Err(self.error(
            inst.loc,
            format!("`{}` of {}", inst.op.name(), self.k.describe(r)),
            format!(
                "reads {what} state stored by a grid step of other parallel coordinates \
                 ({}): parallel iterations may run in any order, and on chips with two \
                 TensorCores (v4, v5p) on another core with its own buffers; mark the dim \
                 `arbitrary`, or store the buffer in every iteration before reading it",
                dims.join(", ")
            ),
        ))
    }

    /// The element `indices` of the SMEM ref `r` names, or an error naming the bad index.
    fn smem_index(
        &self,
        inst: &Inst,
        r: RefId,
        indices: &[ValueId],
    ) -> Result<Vec<usize>, KernelError> {
        let o = self.k.operand(r);
        let mut starts = Vec::with_capacity(indices.len());
        for (d, &i) in indices.iter().enumerate() {
            let i = self.get(i).as_i32();
            if i < 0 || i as usize >= o.array_shape[d] {
                return Err(self.error(
                    inst.loc,
                    format!("`{}` of {}", inst.op.name(), self.k.describe(r)),
                    format!(
                        "index {i} is out of bounds for dim {d} of size {}",
                        o.array_shape[d]
                    ),
                ));
            }
            starts.push(i as usize);
        }
        Ok(starts)
    }

    fn error(&self, loc: Loc, subject: impl Into<String>, message: String) -> KernelError {
        let on = match self.dev {
            Some((w, d)) if w.devices() > 1 => format!(" on device {d}"),
            _ => String::new(),
        };
        KernelError::new(
            &self.k.name,
            vec![Problem {
                kind: ProblemKind::Run,
                subject: subject.into(),
                message: format!("{message} (at grid step {:?}{on})", self.step),
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

    /// An input read through an alias a block its output held fewer than
    /// [`ALIASED_READ_DISTANCE`] steps before.
    fn aliased_read_too_soon(
        &self,
        input: RefId,
        output: RefId,
        bidx: &[usize],
        step: usize,
        held: usize,
    ) -> KernelError {
        let out = &self.k.operand(output).name;
        self.error(
            self.k.operand(input).loc,
            self.k.describe(input),
            format!(
                "grid step {step} reads block {bidx:?} of the buffer `{out}` aliases, which \
                 `{out}` held at step {held}, {} step(s) before: Mosaic's pipeline fetches a \
                 step's input blocks before the previous steps' output blocks are written \
                 back, so a block read through an alias must have been written at least \
                 {ALIASED_READ_DISTANCE} steps before (cycle through {ALIASED_READ_DISTANCE} or \
                 more blocks between a write and the read of the same block)",
                step - held
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
            Op::Load { src, slices } if self.is_shared(*src) => {
                let (starts, sizes) = self.starts(inst, *src, slices)?;
                self.shared_load(*src, dma::Window { starts, sizes }, inst.loc)?
            }
            Op::Load { src, slices } => {
                let (starts, sizes) = self.starts(inst, *src, slices)?;
                self.check_load(inst, *src, &starts, &sizes)?;
                self.buffers[src].window(&starts, &sizes)
            }
            Op::Store { dst, slices, value } if self.is_shared(*dst) => {
                let (starts, sizes) = self.starts(inst, *dst, slices)?;
                let v = self.get(*value).clone();
                self.shared_store(*dst, dma::Window { starts, sizes }, v, inst.loc)?;
                return Ok(());
            }
            Op::Store { dst, slices, value } => {
                let (starts, _) = self.starts(inst, *dst, slices)?;
                let v = self.get(*value).clone();
                self.stored(*dst, &starts, &v.shape);
                self.buffers
                    .get_mut(dst)
                    .expect("blocks are resident")
                    .write_window(&starts, &v);
                return Ok(());
            }
            // SMEM scratch that copies touch (the run-time checks' state) lives in the shared
            // world, as VMEM scratch that copies touch does.
            Op::LoadScalar { src, indices } if self.is_shared(*src) => {
                let starts = self.smem_index(inst, *src, indices)?;
                let sizes = vec![1; starts.len()];
                self.shared_load(*src, dma::Window { starts, sizes }, inst.loc)?
                    .reshape(&[])
            }
            Op::StoreScalar {
                dst,
                indices,
                value,
            } if self.is_shared(*dst) => {
                let starts = self.smem_index(inst, *dst, indices)?;
                let ones = vec![1; starts.len()];
                let word = self.get(*value).reshape(&ones);
                self.shared_store(
                    *dst,
                    dma::Window {
                        starts,
                        sizes: ones,
                    },
                    word,
                    inst.loc,
                )?;
                return Ok(());
            }
            Op::LoadScalar { src, indices } => {
                let starts = self.smem_index(inst, *src, indices)?;
                let table = if self.k.operand(*src).role == OperandRole::Scratch {
                    &self.buffers[src]
                } else {
                    &self.arrays[src]
                };
                let ones = vec![1; starts.len()];
                self.check_load(inst, *src, &starts, &ones)?;
                table.window(&starts, &ones).reshape(&[])
            }
            Op::StoreScalar {
                dst,
                indices,
                value,
            } => {
                let starts = self.smem_index(inst, *dst, indices)?;
                let ones = vec![1; starts.len()];
                let word = self.get(*value).reshape(&ones);
                self.buffers
                    .get_mut(dst)
                    .expect("scratch is allocated")
                    .write_window(&starts, &word);
                self.stored(*dst, &starts, &ones);
                return Ok(());
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
            Op::Repeat { x, times, axis } => self.get(*x).repeat(*times, *axis),
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
            Op::DeviceId => Tensor::scalar_i32(self.dev.map_or(0, |(_, d)| d) as i32),
            Op::DmaStart { .. }
            | Op::DmaWait { .. }
            | Op::SemSignal { .. }
            | Op::SemWait { .. }
            | Op::Scoped { .. } => return self.memory_op(inst),
            Op::SemRead { sem } => {
                let key = self.sem_key(inst, sem)?;
                let (world, d) = self.world();
                let count = world.sync(d, |w, g| Ok(w.read_sem(g, key)))?;
                Tensor::scalar_i32(count as i32)
            }
            Op::DebugPrint { format, args } => {
                let values: Vec<String> = args
                    .iter()
                    .map(|&a| self.get(a).clone().into_host().to_string())
                    .collect();
                let on = match self.dev {
                    Some((w, d)) if w.devices() > 1 => format!("device {d}, "),
                    _ => String::new(),
                };
                let line = format!(
                    "{on}grid step {:?}: {}",
                    self.step,
                    crate::ir::format_print(format, &values)
                );
                match &self.debug_log {
                    Some(log) => log.push(line),
                    None => eprintln!("{line}"),
                }
                return Ok(());
            }
            Op::DebugCheck { cond, message } => {
                if self.get(*cond).as_bool() {
                    return Ok(());
                }
                return Err(self.error(inst.loc, "debug_check", format!("failed: {message}")));
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
        let mut m = Machine::new(k, HashMap::new(), None);
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
