//! Context-parallel splash attention: the sequence sharded over the devices of a `context`
//! mesh axis, forward and backward, with MaxText's strategies
//! (`context_parallel_strategy = ulysses | all_gather | ring`) and the Ulysses x ring hybrid.
//!
//! Every strategy takes the global `q [B, H, S, D]`, `k`, `v [B, KVH, S, D]` sequence-sharded
//! (device `r` holds positions `r S/U .. (r + 1) S/U`) and returns `out` and `lse` sharded the
//! same way; the forward + backward program also takes `dout` and returns `dq, dk, dv` beside
//! `out` and `lse`.
//!
//! - [`Strategy::Ulysses`] (DeepSpeed-Ulysses): an all-to-all re-shards q, k, v from sequence
//!   to heads, every device attends `H/U` heads over the whole sequence, the inverse
//!   all-to-all brings the output back. K/V per device: `1/U` of the heads.
//! - [`Strategy::AllGather`]: K and V are all-gathered along the sequence; every device
//!   attends its query shard against every key at its causal offset. The backward
//!   reduce-scatters dK/dV (the all-gather's transpose).
//! - [`Strategy::Ring`]: K/V shards travel around the ring (collective permutes); every step
//!   attends the local queries to the shard in hand and merges by logsumexp. The backward
//!   is a second ring: K/V go around again with their dK/dV accumulators.
//! - [`Strategy::Usp`]: a 2-D mesh, Ulysses over one axis and ring over the other.
//!
//! The programs are SPMD StableHLO built with the typed collectives (the sharding of every
//! tensor is in its type) with the splash kernels inlined (or, for TPU, as Mosaic custom
//! calls); devices whose blocks differ (the all-gather and ring strategies) share one kernel
//! through [`ShardedSplash`], which selects each device's block tables by its mesh
//! coordinate. They run on the devices of any [`Platform`] (the CPU plugin's virtual devices
//! here).
//!
//! Each forward + backward program is the forward and its reverse-mode gradient
//! ([`Spmd::vjp`]) in one program, as a training step runs them: every splash call is a
//! custom-VJP unit whose rule runs splash's backward kernels
//! ([`tessera_splash::lower_forward_on_shard`]) on the forward's residuals, every collective
//! is differentiated by its transpose, and the local glue (re-layouts) by tessera-hlo's op
//! rules. A ring (ring, USP's ring axis) is one custom-VJP unit whose rule is the backward
//! ring ([`ops::RingAttention::forward`]).

mod all_gather;
pub mod layer;
pub mod ops;
mod ring;
mod ulysses;
mod usp;

use std::collections::HashMap;
use std::fmt;

use tessera_collectives::axes::Context;
use tessera_collectives::{
    axis, mesh, CollectiveCall, CollectiveError, DTensor, Executable, Invariant, Layout, Mesh,
    MeshShape, Program, Replicated, Split, Spmd,
};
use tessera_dsl::{DType, HostArray, Target};
use tessera_hlo::{FuncBuilder, Module, Value};
use tessera_runtime::{HostBuffer, Platform};
use tessera_splash::{
    BlockSizes, Dims, Inputs, Mask, SegmentIds, SeqOffsets, ShardedSplash, SplashError,
    SplashOptions, Stage, Tensor,
};

mesh!(pub ContextMesh = [Context]);

axis!(
    /// The Ulysses (head-parallel) axis of a USP mesh.
    pub UlyssesAxis = "ulysses"
);
axis!(
    /// The ring axis of a USP mesh.
    pub RingAxis = "ring"
);
mesh!(pub UspMesh = [UlyssesAxis, RingAxis]);

/// `[B, H, S/U, D]`: the sequence split over `context`.
type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H, S/U]` (logsumexp).
type SeqSharded3 = (Replicated, Replicated, Split<Context>);

/// Why a context-parallel call could not run.
#[derive(Debug, thiserror::Error)]
pub enum CpError {
    #[error("{strategy}: {message}")]
    Config { strategy: String, message: String },
    #[error(transparent)]
    Splash(#[from] SplashError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error(transparent)]
    Kernel(#[from] tessera_dsl::KernelError),
    /// (The message includes the cause, so it is not also a `source`: a chain printer would
    /// repeat it.)
    #[error("XLA runtime: {0}")]
    Runtime(tessera_runtime::Error),
    /// The platform's devices could not be had (none on this machine, too few, ...).
    #[error(transparent)]
    Devices(tessera_runtime::Error),
    #[error("{0}")]
    Host(String),
    /// A program with Mosaic kernels compiled for a platform that does not run them.
    #[error(
        "the program's kernels ({}) are Mosaic custom calls, which only TPU devices run; \
         build it for {platform} with tessera_parallel::kernel_target",
        kernels.join(", ")
    )]
    MosaicOffTpu {
        /// The platform it was compiled for.
        platform: Platform,
        /// Its Mosaic kernels.
        kernels: Vec<String>,
    },
}

impl From<tessera_runtime::Error> for CpError {
    fn from(e: tessera_runtime::Error) -> Self {
        CpError::Runtime(e)
    }
}

/// How the attention is split over the context devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// All-to-all from sequence to heads and back (DeepSpeed-Ulysses).
    Ulysses,
    /// K/V all-gathered along the sequence.
    AllGather,
    /// K/V passed around a ring, partial results merged by logsumexp.
    Ring,
    /// Ulysses over `ulysses` devices times ring over `ring` devices.
    Usp { ulysses: usize, ring: usize },
}

impl Strategy {
    /// Parses the CLI form: `ulysses`, `all-gather` (or MaxText's `all_gather`), `ring`,
    /// `usp:UxR`, or `usp` alone, which splits `devices` into the most square `U x R` (the
    /// larger factor on Ulysses).
    pub fn parse(s: &str, devices: usize) -> Result<Strategy, CpError> {
        let err = |m: String| CpError::Config {
            strategy: "strategy".into(),
            message: m,
        };
        Ok(match s {
            "ulysses" => Strategy::Ulysses,
            "all-gather" | "all_gather" => Strategy::AllGather,
            "ring" => Strategy::Ring,
            "usp" => {
                let ring = (1..=devices)
                    .filter(|r| devices % r == 0 && r * r <= devices)
                    .max()
                    .unwrap_or(1);
                Strategy::Usp {
                    ulysses: devices / ring.max(1),
                    ring,
                }
            }
            _ => {
                let Some(split) = s.strip_prefix("usp:") else {
                    return Err(err(format!(
                        "unknown strategy `{s}`; expected ulysses, all-gather (all_gather), \
                         ring, usp or usp:UxR"
                    )));
                };
                let parsed = split
                    .split_once('x')
                    .and_then(|(u, r)| Some((u.parse().ok()?, r.parse().ok()?)));
                match parsed {
                    Some((ulysses, ring)) if ulysses > 0 && ring > 0 => {
                        Strategy::Usp { ulysses, ring }
                    }
                    _ => {
                        return Err(err(format!(
                            "`{s}`: expected usp:UxR with positive degrees, e.g. usp:2x2"
                        )))
                    }
                }
            }
        })
    }

    /// The queries and keys each kernel call sees of a sequence of `seq` on `devices` devices
    /// (what the block sizes must divide); with `load_balance` each device's shard is two
    /// chunks attended separately.
    pub fn local_lengths(&self, seq: usize, devices: usize, load_balance: bool) -> (usize, usize) {
        let n = devices.max(1);
        let part = if load_balance { seq / (2 * n) } else { seq / n };
        match *self {
            Strategy::Ulysses => (seq, seq),
            Strategy::AllGather => (part, seq),
            Strategy::Ring => (part, part),
            Strategy::Usp { ring, .. } => (seq / ring, seq / ring),
        }
    }

    /// The devices the strategy's degrees multiply to, when it fixes them (USP).
    pub fn fixed_devices(&self) -> Option<usize> {
        match *self {
            Strategy::Usp { ulysses, ring } => Some(ulysses * ring),
            _ => None,
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Ulysses => f.write_str("ulysses"),
            Strategy::AllGather => f.write_str("all-gather"),
            Strategy::Ring => f.write_str("ring"),
            Strategy::Usp { ulysses, ring } => write!(f, "usp:{ulysses}x{ring}"),
        }
    }
}

/// The global arrays of a call.
#[derive(Debug, Clone, Copy)]
pub struct CpInputs<'a> {
    /// `[B, H, S, D]`.
    pub q: &'a HostArray,
    /// `[B, KVH, S, D]`.
    pub k: &'a HostArray,
    /// `[B, KVH, S, Dv]`.
    pub v: &'a HostArray,
    /// `[B, S]` int32, shared by queries and keys (packed sequences).
    pub segment_ids: Option<&'a HostArray>,
}

/// A context-parallel attention: the global problem, its mask, the strategy and the devices.
#[derive(Debug, Clone)]
pub struct ContextParallel {
    /// The global dims (`heads`, `kv_heads`, `q_len = kv_len = S`).
    pub dims: Dims,
    pub dtype: DType,
    /// One mask shared by every head (positions are global).
    pub mask: Mask,
    pub block_sizes: BlockSizes,
    /// Scale, soft cap and mask value (the offsets are set per device).
    pub options: SplashOptions,
    pub strategy: Strategy,
    /// The context-parallel degree: devices on the context axis (for USP, `U x R`).
    pub devices: usize,
    /// Causal load balancing (MaxText's `context_parallel_load_balance`) for all-gather and
    /// ring: the sequence is cut into `2U` chunks and device `r` holds chunks `r` and
    /// `2U - 1 - r` (zigzag), so under a causal mask every device has the same work. The
    /// arrays stay in natural order for the caller; the programs take them in zigzag order.
    pub load_balance: bool,
    /// What the kernels are lowered for: [`Target::portable`] (inline StableHLO, runs on CPU
    /// and GPU) or [`Target::tpu`] (Mosaic custom calls inside the manual-sharded program, for
    /// TPU devices or a TPU topology); [`crate::kernel_target`] gives the one for a platform.
    pub target: Target,
}

/// One collective of a program and what it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveStat {
    /// `all_to_all`, `all_gather`, `reduce_scatter`, `ppermute`, ...
    pub name: &'static str,
    /// The mesh axis it runs over.
    pub axis: String,
    /// The per-device operand shape and dtype.
    pub operand: String,
    /// Bytes each device sends (see `CollectiveCall::bytes_sent_per_device`).
    pub bytes_per_device: usize,
}

/// What each device holds and moves, for `--stats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpStats {
    pub strategy: Strategy,
    pub devices: usize,
    /// KV heads each device's attention holds.
    pub kv_heads_per_device: usize,
    /// Keys per KV head each device's attention holds at once.
    pub kv_len_per_device: usize,
    /// Bytes of K and V each device's attention holds at once.
    pub kv_bytes_per_device: usize,
    /// How many times each KV head was replicated for Ulysses (1: none).
    pub kv_replication: usize,
    /// Forward key blocks each device computes (every head and batch element, skipped
    /// blocks not counted): the work balance across devices.
    pub blocks_per_device: Vec<usize>,
    /// The collectives of the forward program.
    pub forward: Vec<CollectiveStat>,
    /// The collectives of the forward + backward program.
    pub forward_backward: Vec<CollectiveStat>,
}

/// What [`ContextParallel::forward_backward`] returns: the forward's results and the
/// gradients of `sum(out * dout)`, global arrays.
#[derive(Debug, Clone)]
pub struct CpForwardBackward {
    /// `[B, H, S, Dv]`.
    pub out: HostArray,
    /// `[B, H, S]`, f32.
    pub lse: HostArray,
    /// Like `q`.
    pub dq: HostArray,
    /// Like `k`.
    pub dk: HostArray,
    /// Like `v`.
    pub dv: HostArray,
}

impl fmt::Display for CpStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "strategy {} on {} devices", self.strategy, self.devices)?;
        write!(
            f,
            "per device K/V held by the attention: {} KV heads x {} keys = {} bytes",
            self.kv_heads_per_device, self.kv_len_per_device, self.kv_bytes_per_device
        )?;
        if self.kv_replication > 1 {
            write!(
                f,
                " (each KV head replicated {}x to reach the degree)",
                self.kv_replication
            )?;
        }
        writeln!(f)?;
        let most = self.blocks_per_device.iter().copied().max().unwrap_or(0);
        let total: usize = self.blocks_per_device.iter().sum();
        writeln!(
            f,
            "forward key blocks computed per device: {:?} (busiest {:.2}x the mean)",
            self.blocks_per_device,
            most as f64 * self.blocks_per_device.len() as f64 / total.max(1) as f64
        )?;
        for (pass, list) in [
            ("forward", &self.forward),
            ("forward + backward", &self.forward_backward),
        ] {
            let total: usize = list.iter().map(|c| c.bytes_per_device).sum();
            writeln!(
                f,
                "{pass}: {} collectives, {total} bytes sent per device",
                list.len()
            )?;
            for c in list {
                writeln!(
                    f,
                    "  {:<15} over {:<8} {:<28} {:>12} bytes per device",
                    c.name, c.axis, c.operand, c.bytes_per_device
                )?;
            }
        }
        Ok(())
    }
}

/// A built SPMD program of either mesh, with the order in which it takes the sequence.
pub struct CpProgram {
    program: MeshProgram,
    view: HostView,
}

enum MeshProgram {
    Context(Program<ContextMesh>),
    Usp(Program<UspMesh>),
}

/// How the global arrays a program takes are laid out along the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostView {
    /// As the caller has them.
    Natural,
    /// USP: the sequence as `[R, S/R]` (a reshape; see `usp`).
    UspPieces { ring: usize },
    /// Load balancing: `2U` chunks in the order `0, 2U-1, 1, 2U-2, ..`, so device `r`'s
    /// shard is chunks `r` and `2U - 1 - r`.
    Zigzag { devices: usize },
}

/// The sequence dim of a program array: 1 for segment ids `[B, S]`, else 2.
fn seq_dim(rank: usize) -> usize {
    if rank == 2 {
        1
    } else {
        2
    }
}

/// The zigzag chunk order on `devices` devices: slot `i` holds natural chunk `order[i]`.
fn zigzag_order(devices: usize) -> Vec<usize> {
    (0..devices)
        .flat_map(|r| [r, 2 * devices - 1 - r])
        .collect()
}

/// `a` with its sequence dim cut into `order.len()` chunks, chunk `i` of the result being
/// chunk `order[i]` of `a`.
fn permute_chunks(a: &HostArray, order: &[usize]) -> HostArray {
    let shape = a.shape();
    let dim = seq_dim(shape.len());
    let outer: usize = shape[..dim].iter().product();
    let chunk = shape[dim] / order.len() * shape[dim + 1..].iter().product::<usize>();
    let values = a.to_f64_vec();
    let mut out = Vec::with_capacity(values.len());
    for o in 0..outer {
        let base = o * chunk * order.len();
        for &c in order {
            out.extend_from_slice(&values[base + c * chunk..base + (c + 1) * chunk]);
        }
    }
    HostArray::from_f64(a.dtype(), shape.to_vec(), &out).expect("a permutation keeps the shape")
}

impl HostView {
    /// A caller's array as the program takes it.
    fn program_order(self, a: &HostArray) -> HostArray {
        match self {
            HostView::Natural => a.clone(),
            HostView::UspPieces { ring } => usp::to_pieces(a, ring),
            HostView::Zigzag { devices } => permute_chunks(a, &zigzag_order(devices)),
        }
    }

    /// A program's result as the caller wants it.
    fn caller_order(self, a: HostArray) -> HostArray {
        match self {
            HostView::Natural => a,
            HostView::UspPieces { .. } => usp::from_pieces(&a),
            HostView::Zigzag { devices } => permute_chunks(&a, &zigzag_inverse(devices)),
        }
    }
}

impl fmt::Debug for CpProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpProgram")
            .field("view", &self.view)
            .field("collectives", &self.collectives().len())
            .finish_non_exhaustive()
    }
}

impl CpProgram {
    fn context(program: Program<ContextMesh>, view: HostView) -> Self {
        CpProgram {
            program: MeshProgram::Context(program),
            view,
        }
    }

    /// The StableHLO text that runs.
    pub fn to_mlir(&self) -> String {
        match &self.program {
            MeshProgram::Context(p) => p.to_mlir(),
            MeshProgram::Usp(p) => p.to_mlir(),
        }
    }

    /// The StableHLO module (its `mhlo.num_partitions` is the number of devices).
    pub fn module(&self) -> &Module {
        match &self.program {
            MeshProgram::Context(p) => p.module(),
            MeshProgram::Usp(p) => p.module(),
        }
    }

    /// The collectives, in program order.
    pub fn collectives(&self) -> &[CollectiveCall] {
        match &self.program {
            MeshProgram::Context(p) => p.collectives(),
            MeshProgram::Usp(p) => p.collectives(),
        }
    }

    fn collective_stats(&self) -> Vec<CollectiveStat> {
        self.collectives()
            .iter()
            .map(|c| CollectiveStat {
                name: c.collective.name(),
                axis: c.collective.axis().name().to_string(),
                operand: c.input_type.to_string(),
                bytes_per_device: c.bytes_sent_per_device(),
            })
            .collect()
    }

    /// Compiles for the first devices of `platform`, one per device of the mesh. A program
    /// with Mosaic kernels compiles only for TPU.
    pub fn compile(&self, platform: Platform) -> Result<CpExecutable, CpError> {
        let kernels = self.module().tpu_kernel_names();
        if !kernels.is_empty() && !platform.takes_mosaic_kernels() {
            return Err(CpError::MosaicOffTpu { platform, kernels });
        }
        let exe = match &self.program {
            MeshProgram::Context(p) => MeshExecutable::Context(compile_on(p, platform)?),
            MeshProgram::Usp(p) => MeshExecutable::Usp(compile_on(p, platform)?),
        };
        Ok(CpExecutable {
            exe,
            view: self.view,
        })
    }

    /// Compiles for `platform` and runs once on global host arrays.
    pub fn run(
        &self,
        platform: Platform,
        inputs: &[&HostArray],
    ) -> Result<Vec<HostArray>, CpError> {
        self.compile(platform)?.run(inputs)
    }
}

fn compile_on<M: MeshShape>(
    program: &Program<M>,
    platform: Platform,
) -> Result<Executable<M>, CpError> {
    let client = platform
        .client(program.mesh().num_devices())
        .map_err(CpError::Devices)?;
    Ok(program.compile(&client)?)
}

/// A compiled [`CpProgram`].
#[allow(missing_debug_implementations)] // wraps a loaded PJRT executable
pub struct CpExecutable {
    exe: MeshExecutable,
    view: HostView,
}

enum MeshExecutable {
    Context(Executable<ContextMesh>),
    Usp(Executable<UspMesh>),
}

impl CpExecutable {
    /// Runs on global host arrays (in natural order): shards them over the devices, runs,
    /// and assembles the global results.
    pub fn run(&self, inputs: &[&HostArray]) -> Result<Vec<HostArray>, CpError> {
        let buffers = inputs
            .iter()
            .map(|a| HostBuffer::from_array(&self.view.program_order(a)))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = match &self.exe {
            MeshExecutable::Context(e) => e.run_global(&buffers)?,
            MeshExecutable::Usp(e) => e.run_global(&buffers)?,
        };
        outs.iter()
            .map(|b| Ok(self.view.caller_order(b.to_array()?)))
            .collect()
    }
}

impl ContextParallel {
    fn config_error(&self, message: String) -> CpError {
        CpError::Config {
            strategy: self.strategy.to_string(),
            message,
        }
    }

    /// Checks the configuration with a message naming the culprit and the fix (MaxText's
    /// rules, with KV replication for Ulysses when `KVH < U`).
    pub fn validate(&self) -> Result<(), CpError> {
        let (d, n) = (self.dims, self.devices);
        let err = |m: String| Err(self.config_error(m));
        if n == 0 {
            return err("the context degree must be at least 1".into());
        }
        let sizes = [
            ("batch", d.batch),
            ("heads", d.heads),
            ("kv_heads", d.kv_heads),
            ("q_len", d.q_len),
            ("kv_len", d.kv_len),
            ("head_dim", d.head_dim),
            ("head_dim_v", d.head_dim_v),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return err(format!("{name} is 0; every dim must be at least 1"));
        }
        if let Some(fixed) = self.strategy.fixed_devices() {
            if fixed != n {
                return err(format!(
                    "the degrees multiply to {fixed} devices but {n} were given; use \
                     --devices {fixed} or another usp:UxR"
                ));
            }
        }
        if d.q_len != d.kv_len {
            return err(format!(
                "q and kv lengths differ ({} and {}); context parallelism is for \
                 self-attention",
                d.q_len, d.kv_len
            ));
        }
        if d.q_len % n != 0 {
            return err(format!(
                "the sequence length {} is not divisible by the context degree {n}; pad the \
                 sequence to a multiple of {n}",
                d.q_len
            ));
        }
        if self.load_balance {
            if !matches!(self.strategy, Strategy::AllGather | Strategy::Ring) {
                return err(
                    "does not support load balancing (context_parallel_load_balance); it \
                     balances the all-gather and ring strategies"
                        .into(),
                );
            }
            if d.q_len % (2 * n) != 0 {
                return err(format!(
                    "load balancing cuts the sequence into 2 x {n} chunks, but the sequence \
                     length {} is not divisible by {}; pad the sequence to a multiple of {}",
                    d.q_len,
                    2 * n,
                    2 * n
                ));
            }
        }
        let ulysses = self.ulysses_degree();
        if ulysses > 1 {
            self.validate_heads(ulysses)?;
        }
        let (q_local, kv_local) = self.local_lengths();
        let b = self.block_sizes;
        let blocks = [
            ("block_q", b.block_q, q_local),
            ("block_kv", b.block_kv, kv_local),
            ("block_q_dkv", b.block_q_dkv, q_local),
            ("block_kv_dkv", b.block_kv_dkv, kv_local),
        ]
        .into_iter()
        .chain(
            (!b.use_fused_bwd_kernel)
                .then_some([
                    ("block_q_dq", b.block_q_dq, q_local),
                    ("block_kv_dq", b.block_kv_dq, kv_local),
                ])
                .into_iter()
                .flatten(),
        );
        for (name, block, len) in blocks {
            if block == 0 || len % block != 0 {
                return err(format!(
                    "{name} = {block} does not divide the {len} {} each attention call on a \
                     device holds ({} / {}); use a {name} that divides {len}",
                    if name.contains("kv") {
                        "keys"
                    } else {
                        "queries"
                    },
                    d.q_len,
                    d.q_len / len,
                ));
            }
        }
        Ok(())
    }

    fn validate_heads(&self, u: usize) -> Result<(), CpError> {
        let d = self.dims;
        let err = |m: String| Err(self.config_error(m));
        if d.heads % u != 0 {
            return err(format!(
                "{} query heads are not divisible by the Ulysses degree {u}; use a degree \
                 that divides the heads",
                d.heads
            ));
        }
        if d.kv_heads < u && u % d.kv_heads != 0 {
            return err(format!(
                "{} KV heads cannot be replicated evenly to the Ulysses degree {u}; use a \
                 degree that is a multiple of the KV heads",
                d.kv_heads
            ));
        }
        if d.kv_heads >= u && d.kv_heads % u != 0 {
            return err(format!(
                "{} KV heads are not divisible by the Ulysses degree {u}",
                d.kv_heads
            ));
        }
        Ok(())
    }

    /// Queries and keys each device's attention kernel sees (per head).
    fn local_lengths(&self) -> (usize, usize) {
        self.strategy
            .local_lengths(self.dims.q_len, self.devices, self.load_balance)
    }

    /// Chunks of each device's shard attended separately: 2 with load balancing, else 1.
    fn parts(&self) -> usize {
        if self.load_balance {
            2
        } else {
            1
        }
    }

    /// The host-side order of the sequence the programs take.
    fn host_view(&self) -> HostView {
        match self.strategy {
            Strategy::Usp { ring, .. } => HostView::UspPieces { ring },
            _ if self.load_balance => HostView::Zigzag {
                devices: self.devices,
            },
            _ => HostView::Natural,
        }
    }

    /// The 1-D mesh of the ulysses, all-gather and ring programs.
    fn context_mesh(&self) -> Result<Mesh<ContextMesh>, CpError> {
        Ok(Mesh::<ContextMesh>::new([self.devices])?)
    }

    /// The Ulysses degree (1 for the strategies without a head all-to-all).
    fn ulysses_degree(&self) -> usize {
        match self.strategy {
            Strategy::Ulysses => self.devices,
            Strategy::Usp { ulysses, .. } => ulysses,
            Strategy::AllGather | Strategy::Ring => 1,
        }
    }

    /// How often each KV head is replicated so the Ulysses all-to-all can split them.
    fn kv_replication(&self) -> usize {
        let u = self.ulysses_degree();
        if self.dims.kv_heads < u {
            u / self.dims.kv_heads
        } else {
            1
        }
    }

    /// The dims each device's attention kernel sees.
    fn local_dims(&self) -> Dims {
        let d = self.dims;
        let u = self.ulysses_degree();
        let (q_len, kv_len) = self.local_lengths();
        Dims {
            heads: d.heads / u,
            kv_heads: d.kv_heads * self.kv_replication() / u,
            q_len,
            kv_len,
            ..d
        }
    }

    /// One splash attention per shard at `offsets[shard]` (local dims), for the target.
    fn sharded_splash(&self, offsets: &[SeqOffsets]) -> Result<ShardedSplash, CpError> {
        Ok(ShardedSplash::new(
            self.mask.clone(),
            self.local_dims(),
            self.dtype,
            self.block_sizes,
            self.options,
            self.target.clone(),
            offsets,
        )?)
    }

    /// Per-device K/V, replication and the bytes every collective of both programs moves.
    pub fn stats(&self) -> Result<CpStats, CpError> {
        self.validate()?;
        let ld = self.local_dims();
        let d = self.dims;
        let kv_bytes = d.batch * ld.kv_heads * ld.kv_len * (d.head_dim + d.head_dim_v);
        Ok(CpStats {
            strategy: self.strategy,
            devices: self.devices,
            kv_heads_per_device: ld.kv_heads,
            kv_len_per_device: ld.kv_len,
            kv_bytes_per_device: kv_bytes * self.dtype.size_bytes(),
            kv_replication: self.kv_replication(),
            blocks_per_device: self.blocks_per_device()?,
            forward: self.forward_program(false)?.collective_stats(),
            forward_backward: self.forward_backward_program(false)?.collective_stats(),
        })
    }

    /// Forward key blocks each device computes over all its kernel calls.
    fn blocks_per_device(&self) -> Result<Vec<usize>, CpError> {
        let calls: Vec<Vec<SeqOffsets>> = match self.strategy {
            Strategy::Ulysses => vec![vec![SeqOffsets::default()]],
            Strategy::AllGather => (0..self.parts())
                .map(|h| ops::all_gather_offsets(self, h))
                .collect(),
            Strategy::Ring => ops::ring_offsets(self, self.devices),
            Strategy::Usp { ring, .. } => ops::ring_offsets(self, ring),
        };
        let mut per_shard = vec![0; calls[0].len()];
        for offsets in &calls {
            for (i, shard) in self.sharded_splash(offsets)?.shards().iter().enumerate() {
                per_shard[i] += shard.stats().computed();
            }
        }
        // Shards are positions on the context (or, for USP, the ring) axis; Ulysses devices
        // all run the one call.
        Ok((0..self.devices)
            .map(|d| per_shard[d % per_shard.len()])
            .collect())
    }

    /// The forward SPMD program: global `q, k, v` (and `segment_ids [B, S]` int32 when
    /// `segmented`) in, `out [B, H, S, Dv]` and `lse [B, H, S]` out.
    pub fn forward_program(&self, segmented: bool) -> Result<CpProgram, CpError> {
        self.validate()?;
        let (s, view) = (segmented, self.host_view());
        Ok(match self.strategy {
            Strategy::Ulysses => CpProgram::context(ulysses::forward(self, s)?, view),
            Strategy::AllGather => CpProgram::context(all_gather::forward(self, s)?, view),
            Strategy::Ring => CpProgram::context(ring::forward(self, s)?, view),
            Strategy::Usp { .. } => CpProgram {
                program: MeshProgram::Usp(usp::forward(self, s)?),
                view,
            },
        })
    }

    /// The forward + backward SPMD program: global `q, k, v, dout` (and `segment_ids` when
    /// `segmented`) in, `out, lse, dq, dk, dv` out (`dq, dk, dv`: the gradient of
    /// `sum(out * dout)`).
    pub fn forward_backward_program(&self, segmented: bool) -> Result<CpProgram, CpError> {
        self.validate()?;
        let (s, view) = (segmented, self.host_view());
        Ok(match self.strategy {
            Strategy::Ulysses => CpProgram::context(ulysses::forward_backward(self, s)?, view),
            Strategy::AllGather => CpProgram::context(all_gather::forward_backward(self, s)?, view),
            Strategy::Ring => CpProgram::context(ring::forward_backward(self, s)?, view),
            Strategy::Usp { .. } => CpProgram {
                program: MeshProgram::Usp(usp::forward_backward(self, s)?),
                view,
            },
        })
    }

    /// Checks a call's global arrays with the same checks as a single-device splash
    /// attention (shapes against `dims`, dtype, finite values, segment ids int32 `[B, S]`),
    /// so every strategy validates its inputs alike, before anything is compiled.
    pub fn check_inputs(&self, x: &CpInputs<'_>) -> Result<(), CpError> {
        let inputs = Inputs {
            q: x.q,
            k: x.k,
            v: x.v,
            segment_ids: x.segment_ids.map(|s| SegmentIds { q: s, kv: s }),
            sinks: None,
        };
        self.dims.check_inputs(self.dtype, &inputs)?;
        Ok(())
    }

    /// Checks a backward's output cotangent: shaped like the output, finite.
    pub fn check_dout(&self, dout: &HostArray) -> Result<(), CpError> {
        Ok(self.dims.check_output_like("dout", self.dtype, dout)?)
    }

    /// Forward on `devices` devices of `platform`: `out` and `lse` of the global inputs.
    pub fn forward(
        &self,
        platform: Platform,
        x: &CpInputs<'_>,
    ) -> Result<(HostArray, HostArray), CpError> {
        self.check_inputs(x)?;
        let mut inputs = vec![x.q, x.k, x.v];
        inputs.extend(x.segment_ids);
        let outs = self
            .forward_program(x.segment_ids.is_some())?
            .run(platform, &inputs)?;
        let [out, lse]: [HostArray; 2] = outs
            .try_into()
            .map_err(|_| CpError::Host("the forward program returns out and lse".into()))?;
        Ok((out, lse))
    }

    /// Forward and backward on `devices` devices of `platform` in one program: `out`, `lse`
    /// and the global `dq`, `dk`, `dv` of `sum(out * dout)`.
    pub fn forward_backward(
        &self,
        platform: Platform,
        x: &CpInputs<'_>,
        dout: &HostArray,
    ) -> Result<CpForwardBackward, CpError> {
        self.check_inputs(x)?;
        self.check_dout(dout)?;
        let mut inputs = vec![x.q, x.k, x.v, dout];
        inputs.extend(x.segment_ids);
        let outs = self
            .forward_backward_program(x.segment_ids.is_some())?
            .run(platform, &inputs)?;
        let [out, lse, dq, dk, dv]: [HostArray; 5] = outs.try_into().map_err(|_| {
            CpError::Host("the forward + backward program returns out, lse, dq, dk, dv".into())
        })?;
        Ok(CpForwardBackward {
            out,
            lse,
            dq,
            dk,
            dv,
        })
    }

    /// `[B, H, S, D]` and friends as program dims.
    fn global_dims(&self) -> GlobalDims {
        let d = self.dims;
        let i = |x: usize| x as i64;
        GlobalDims {
            seq: [i(d.batch), i(d.q_len)],
            q: [i(d.batch), i(d.heads), i(d.q_len), i(d.head_dim)],
            k: [i(d.batch), i(d.kv_heads), i(d.kv_len), i(d.head_dim)],
            v: [i(d.batch), i(d.kv_heads), i(d.kv_len), i(d.head_dim_v)],
            out: [i(d.batch), i(d.heads), i(d.q_len), i(d.head_dim_v)],
        }
    }
}

/// The global shapes of a call's arrays.
struct GlobalDims {
    /// `[B, S]` (segment ids).
    seq: [i64; 2],
    q: [i64; 4],
    k: [i64; 4],
    v: [i64; 4],
    out: [i64; 4],
}

/// Lowers a splash forward plan into `f` as a custom-VJP unit whose backward is the
/// `backward` plan, each kernel for the plan's target (inline, or a Mosaic custom call inside
/// the manual-sharded region); `shard` selects the per-shard tables. Errors in the
/// collectives' form.
fn lower_forward(
    f: &mut FuncBuilder<'_>,
    forward: &[Stage],
    backward: Vec<Stage>,
    env: &mut HashMap<Tensor, Value>,
    shard: Option<Value>,
) -> Result<(), CollectiveError> {
    tessera_splash::lower_forward_on_shard(f, forward, backward, env, shard)
        .map_err(|e| CollectiveError::local(e.to_string()))
}

/// A forward's `out` and `lse`, sharded as `S` and `S3`.
type OutLse<'p, M, S, S3> = (DTensor<'p, M, S>, DTensor<'p, M, S3>);

/// Ends a backward program: the gradients of `sum(out * dout)` with respect to `q`, `k`, `v`
/// (reverse-mode autodiff of the forward built in the program), each returned split like its
/// input, and the forward ops they do not need (the output re-shardings) left out.
fn output_gradients<'p, M: MeshShape, S: Layout<M>>(
    p: &'p Spmd<'_, M>,
    out: &DTensor<'p, M, S>,
    dout: &DTensor<'p, M, S>,
    [q, k, v]: [&DTensor<'p, M, S>; 3],
) -> Result<(), CollectiveError> {
    for g in p.vjp(&[out], &[dout], &[q, k, v])? {
        p.declare::<S, Invariant>(g)?.output::<S>()?;
    }
    p.prune()
}

/// Declares the arguments of a forward + backward program on the context mesh,
/// sequence-sharded, in the order every strategy takes them: `q, k, v, dout`.
fn forward_backward_args<'p>(
    cp: &ContextParallel,
    p: &'p Spmd<'_, ContextMesh>,
) -> Result<[DTensor<'p, ContextMesh, SeqSharded>; 4], CollectiveError> {
    let g = cp.global_dims();
    let q = p.arg(g.q, cp.dtype)?;
    let k = p.arg(g.k, cp.dtype)?;
    let v = p.arg(g.v, cp.dtype)?;
    let dout = p.arg(g.out, cp.dtype)?;
    Ok([q, k, v, dout])
}

/// The whole `[B, S]` segment ids, in natural order, on every device of a context mesh
/// (every strategy all-gathers them: 4 bytes a token, against K/V's `2 D` elements per KV
/// head).
fn gather_segments<'p>(
    cp: &ContextParallel,
    p: &'p Spmd<'_, ContextMesh>,
) -> Result<DTensor<'p, ContextMesh, ops::WholeSegmentIds<Replicated>>, CollectiveError> {
    let seg = p.arg::<(Replicated, Split<Context>)>(cp.global_dims().seq, DType::I32)?;
    let full = seg.all_gather::<Context, 1>()?;
    if !cp.load_balance {
        return Ok(full);
    }
    // Gathered in zigzag order; the kernels' positions are natural.
    full.map_local(|f, x| reorder_chunks(f, x, 1, &zigzag_inverse(cp.devices)))
}

/// Whole `[B, S]` segment ids in a program, sliced per device and step.
#[derive(Debug, Clone, Copy)]
struct Segments {
    full: Value,
}

impl Segments {
    /// Positions `start .. start + len` (all when `start` is `None`) as the kernels' query
    /// `[B, len, 1]` or key `[B, 1, len]` segment ids.
    fn slice(
        &self,
        f: &mut FuncBuilder<'_>,
        start: Option<Value>,
        len: usize,
        queries: bool,
    ) -> Result<Value, CollectiveError> {
        let b = f.value_type(self.full)?.dims[0];
        let len = len as i64;
        let x = match start {
            Some(start) => {
                let zero = f.scalar(0.0, DType::I32)?;
                f.dynamic_slice(self.full, &[zero, start], &[b, len])?
            }
            None => self.full,
        };
        let dims = if queries { [b, len, 1] } else { [b, 1, len] };
        Ok(f.reshape(x, &dims)?)
    }

    /// Adds the query and key segment ids of an attention of `q_len` queries from `q_start`
    /// and `kv_len` keys from `kv_start` to a plan's environment.
    fn add_to(
        &self,
        f: &mut FuncBuilder<'_>,
        env: &mut HashMap<Tensor, Value>,
        (q_start, q_len): (Option<Value>, usize),
        (kv_start, kv_len): (Option<Value>, usize),
    ) -> Result<(), CollectiveError> {
        let q = self.slice(f, q_start, q_len, true)?;
        let kv = self.slice(f, kv_start, kv_len, false)?;
        env.extend([(Tensor::QSegments, q), (Tensor::KvSegments, kv)]);
        Ok(())
    }
}

/// The natural chunk that part `part` of shard `shard` holds, of `ring` shards: with one
/// part per shard the shard itself; with two (zigzag load balancing) chunks `shard` and
/// `2 ring - 1 - shard` of `2 ring`.
fn chunk_of(shard: usize, part: usize, ring: usize) -> usize {
    if part == 0 {
        shard
    } else {
        2 * ring - 1 - shard
    }
}

/// In a program, [`chunk_of`]`((shard + shift) mod ring, part, ring) * len`: where that
/// part starts in the natural sequence.
fn part_start(
    f: &mut FuncBuilder<'_>,
    shard: Value,
    shift: usize,
    ring: usize,
    part: usize,
    len: usize,
) -> Result<Value, CollectiveError> {
    let shift = f.scalar(shift as f64, DType::I32)?;
    let ring_size = f.scalar(ring as f64, DType::I32)?;
    let x = f.add(shard, shift)?;
    let mut chunk = f.rem(x, ring_size)?;
    if part == 1 {
        let last = f.scalar((2 * ring - 1) as f64, DType::I32)?;
        chunk = f.sub(last, chunk)?;
    }
    let len = f.scalar(len as f64, DType::I32)?;
    Ok(f.mul(chunk, len)?)
}

/// Part `part` of `parts` equal parts of a local value's sequence dim (2).
fn seq_part(
    f: &mut FuncBuilder<'_>,
    x: Value,
    part: usize,
    parts: usize,
) -> Result<Value, CollectiveError> {
    if parts == 1 {
        return Ok(x);
    }
    let dims = f.value_type(x)?.dims.clone();
    let len = dims[2] / parts as i64;
    let mut start = vec![0; dims.len()];
    start[2] = part as i64 * len;
    let mut limit = dims.clone();
    limit[2] = start[2] + len;
    Ok(f.slice(x, &start, &limit)?)
}

/// Concatenates the parts of a sequence back along dim 2.
fn seq_concat(f: &mut FuncBuilder<'_>, parts: &[Value]) -> Result<Value, CollectiveError> {
    if parts.len() == 1 {
        return Ok(parts[0]);
    }
    Ok(f.concatenate(parts, 2)?)
}

/// `x` with dim `dim` cut into `order.len()` chunks, chunk `i` of the result being chunk
/// `order[i]` of `x` (the in-program twin of [`permute_chunks`]).
fn reorder_chunks(
    f: &mut FuncBuilder<'_>,
    x: Value,
    dim: usize,
    order: &[usize],
) -> Result<Value, CollectiveError> {
    let dims = f.value_type(x)?.dims.clone();
    let len = dims[dim] / order.len() as i64;
    let mut chunks = Vec::with_capacity(order.len());
    for &c in order {
        let mut start = vec![0; dims.len()];
        start[dim] = c as i64 * len;
        let mut limit = dims.clone();
        limit[dim] = start[dim] + len;
        chunks.push(f.slice(x, &start, &limit)?);
    }
    Ok(f.concatenate(&chunks, dim as i64)?)
}

/// The inverse of [`zigzag_order`]: zigzag slot of every natural chunk.
fn zigzag_inverse(devices: usize) -> Vec<usize> {
    let order = zigzag_order(devices);
    let mut inverse = vec![0; order.len()];
    for (slot, &chunk) in order.iter().enumerate() {
        inverse[chunk] = slot;
    }
    inverse
}

/// `lse [B, H, S]` as the kernels' `[B, H, S, 1]`.
fn lse_to_kernel(f: &mut FuncBuilder<'_>, lse: Value) -> Result<Value, CollectiveError> {
    let t = f.value_type(lse)?.clone();
    let mut dims = t.dims.clone();
    dims.push(1);
    Ok(f.reshape(lse, &dims)?)
}

/// The kernels' `[B, H, S, 1]` as `lse [B, H, S]`.
fn lse_from_kernel(f: &mut FuncBuilder<'_>, lse: Value) -> Result<Value, CollectiveError> {
    let t = f.value_type(lse)?.clone();
    Ok(f.reshape(lse, &t.dims[..3])?)
}

/// Repeats each head `rep` times along dim 1 (`[B, KVH, ...] -> [B, KVH*rep, ...]`), so head
/// `j` becomes heads `j*rep .. j*rep + rep`.
fn replicate_heads<'p, M: MeshShape, S, V>(
    x: &DTensor<'p, M, S, V>,
    rep: usize,
) -> Result<DTensor<'p, M, S, V>, CollectiveError> {
    if rep == 1 {
        return Ok(x.clone());
    }
    x.map_local(|f, v| {
        let d = f.value_type(v)?.dims.clone();
        let wide: Vec<i64> = [&d[..2], &[rep as i64], &d[2..]].concat();
        let keep: Vec<i64> = [0, 1].into_iter().chain(3..wide.len() as i64).collect();
        let wide = f.broadcast_in_dim(v, &wide, &keep)?;
        let merged: Vec<i64> = [&[d[0], d[1] * rep as i64], &d[2..]].concat();
        Ok(f.reshape(wide, &merged)?)
    })
}
