//! A transparent step-time model of the training step on a TPU slice: pure arithmetic over
//! the model's dims, the mesh, splash's own block tables and the chip's published peaks, so
//! that every number of a [`StepPrediction`] can be checked by hand.
//!
//! The step, per device (`T` tokens per device = sequences per fsdp shard x `S / cp`):
//!
//! * **Matmuls**: forward `2 T N_mm` (the `N_mm` matmul parameters, LM head included),
//!   backward twice that, plus the remat recompute of the matmuls whose outputs the backward
//!   needs: `2 T L (d hd (H + 2 KV) + 2 d mlp)` (q, k, v projections, left out when the
//!   attention is not re-run ([`StepSetup::remat_attention`]), and the two SwiGLU input
//!   matmuls; MaxText's `remat_policy=custom context=device` saves only the attention context,
//!   and the outputs of `wo` and of the out projection are never needed by the backward).
//! * **Attention**: the blocks splash computes after causal mask skipping, counted from
//!   [`MaskInfo`] at the run's block sizes and at each device's offsets: forward
//!   `4 bq bkv D` per computed (head, block), fused backward (`s`, `dp`, `dv`, `dk`, `dq`)
//!   `10 bq bkv D` per computed dK/dV block, and the forward once more when remat recomputes
//!   it (the splash residual `lse` is not a saved name, so the kernel reruns). Ulysses: each
//!   device holds the whole sequence and `H / cp` heads (identical on every device).
//!   All-gather: each device's queries against every key; the step waits for the busiest
//!   device. Ring: `cp` steps, at step `t` device `c` holds the keys of `c - t`; each step
//!   waits for its busiest device. With load balancing (MaxText's default, dual chunk swap)
//!   a device's shard is chunks `c` and `2 cp - 1 - c` of `2 cp`. What each device holds and
//!   where each of its kernel calls attends are the strategy's own rules
//!   ([`StepSetup::context_parallel`]: `local_dims`, `kernel_calls`), which also validate the
//!   setup; the collectives below are priced by how the strategy says its devices exchange
//!   keys and values (`ContextStrategy::exchange`: all-to-alls to heads, all-gathered keys,
//!   or a ring after optional all-to-alls). USP (`usp:UxR`) is ring attention over `R` devices on
//!   chunks of `S / R` tokens with `H / U` heads, after the Ulysses all-to-alls over `U`.
//! * **Compute time** = FLOPs / (peak x [`Efficiency`]): one efficiency for matmuls and one
//!   for attention blocks (both [`Efficiency::CALIBRATED`], see there).
//! * **Collectives**, each `bytes / bandwidth` where the bandwidth is the links the
//!   collective's mesh axes use on the torus (`2` links per wrapped torus axis, each
//!   [`Chip::ici_link_bandwidth`] per direction):
//!   - all-gather / reduce-scatter on `n` devices: `(n - 1) / n x full_bytes / (links x
//!     link_bw)` (the bidirectional ring algorithm on every axis);
//!   - all-to-all: `sum over destinations of (bytes / n x torus hops) / (links x link_bw)`
//!     (uniform load over the links);
//!   - collective permute to the ring neighbour: `bytes / link_bw` (one link, one direction);
//!   - USP: its ring takes the last torus axes, its Ulysses all-to-alls the context axes
//!     before them (each whole axes); the all-to-alls are exposed as Ulysses' are (q, out,
//!     dout, dq; k's and v's behind the projections), the ring permutes as ring's;
//!   - fsdp: the weights are sharded over fsdp x context (MaxText's `embed` axis rule names
//!     both), so the per-layer bf16 weight all-gather (forward, and again for the backward)
//!     and the fp32 gradient reduce-scatter run over the whole slice.
//! * **Overlap rules**: fsdp weight all-gathers and gradient reduce-scatters are prefetched /
//!   delayed by one layer, so they hide behind one layer's compute (only the excess is
//!   exposed). The collectives of the attention sit between the projections and the
//!   kernels, so only the layer's matmuls that neither feed them nor wait for them can hide
//!   them. K/V's collectives (Ulysses' k and v all-to-alls, all-gather's K/V all-gathers;
//!   in the backward dk's and dv's all-to-alls, the dK/dV reduce-scatter) run behind, in the
//!   forward and remat forward, the V and Q projections (`2 T d hd (KV + H)`: K's
//!   collective starts as soon as K is projected), and in the backward dq's two matmuls
//!   (`4 T d H hd`); only the excess is exposed. Ulysses' q, out, dout and dq all-to-alls are
//!   exposed. Ring permutes overlap with their step's attention compute: a step costs
//!   `max(compute, transfer)`.
//! * **Optimizer**: AdamW over this device's fp32 shard (params, 2 moments, gradient), bound
//!   by HBM: 28 bytes per parameter (read p, g, m, v; write p, m, v) / HBM bandwidth.
//!
//! Left out: the vector work outside attention (norms, RoPE, SwiGLU, the loss's softmax),
//! the embedding lookup, HBM-bound elementwise traffic, latency of small collectives,
//! pipeline bubbles of the ring's first/last step, and host overheads.

use serde_json::json;
use tessera_dsl::{DType, Lowering};
use tessera_parallel::strategy::Exchange;
use tessera_parallel::{ContextParallel, Strategy};
use tessera_splash::{BlockSizes, Dims, Major, Mask, MaskInfo, SeqOffsets};

use crate::config::whole_sequences;
use crate::error::{Setting, SettingError};
use crate::flops::model_flops;
use crate::{ModelConfig, TrainError};

/// A TPU chip and the torus of the slice it is in.
#[derive(Debug, Clone, PartialEq)]
pub struct Chip {
    pub name: String,
    /// Dense bf16 matmul peak, FLOP/s.
    pub peak_bf16_flops: f64,
    /// HBM a program may use, bytes.
    pub hbm_bytes: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// ICI bandwidth of one link in one direction, bytes/s.
    pub ici_link_bandwidth: f64,
    /// The slice's torus, e.g. `[4, 4, 4]`.
    pub torus: Vec<usize>,
    /// Whether every torus axis wraps around (else hops are counted along a line).
    pub wraparound: bool,
}

impl Chip {
    /// TPU v5p (Google Cloud's "TPU v5p" page, docs.cloud.google.com/tpu/docs/v5p): 459
    /// bf16 TFLOP/s, 95 GiB HBM, 2765 GB/s HBM, 1200 GB/s bidirectional ICI per chip on a
    /// 3-D torus, i.e. 6 links of 200 GB/s bidirectional = 100 GB/s per direction each;
    /// "all 4x4x4 and larger slices have full 3D torus" (wraparound).
    pub fn v5p(torus: [usize; 3]) -> Chip {
        Chip {
            name: format!("v5p:{}x{}x{}", torus[0], torus[1], torus[2]),
            peak_bf16_flops: 459e12,
            hbm_bytes: 95.0 * (1u64 << 30) as f64,
            hbm_bandwidth: 2765e9,
            ici_link_bandwidth: 1200e9 / 6.0 / 2.0,
            torus: torus.to_vec(),
            wraparound: torus.iter().all(|&a| a >= 4),
        }
    }

    /// TPU v5e (docs.cloud.google.com/tpu/docs/v5e): 197 bf16 TFLOP/s, 16 GB HBM at 819
    /// GB/s, 400 GB/s bidirectional ICI per chip over 4 ICI ports on a 2-D torus, i.e. 50
    /// GB/s per link and direction; the 16x16 pod wraps around.
    pub fn v5e(torus: [usize; 2]) -> Chip {
        Chip {
            name: format!("v5e:{}x{}", torus[0], torus[1]),
            peak_bf16_flops: 197e12,
            hbm_bytes: 16e9,
            hbm_bandwidth: 819e9,
            ici_link_bandwidth: 400e9 / 4.0 / 2.0,
            torus: torus.to_vec(),
            wraparound: torus == [16, 16],
        }
    }

    /// Parses `v5p:AxBxC` or `v5e:AxB`.
    pub fn parse(s: &str) -> Result<Chip, TrainError> {
        let bad = || {
            TrainError::from(SettingError::NotASlice {
                text: s.to_string(),
            })
        };
        let (kind, dims) = s.split_once(':').ok_or_else(bad)?;
        let dims: Vec<usize> = dims
            .split('x')
            .map(|d| d.parse::<usize>().ok().filter(|&d| d > 0))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        match (kind, dims.as_slice()) {
            ("v5p", &[a, b, c]) => Ok(Chip::v5p([a, b, c])),
            ("v5e", &[a, b]) => Ok(Chip::v5e([a, b])),
            _ => Err(bad()),
        }
    }

    /// Chips in the slice.
    pub fn chips(&self) -> usize {
        self.torus.iter().product()
    }
}

/// The fraction of the bf16 peak that matmuls and attention blocks reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Efficiency {
    pub matmul: f64,
    pub attention: f64,
}

impl Efficiency {
    /// One efficiency for both, calibrated on ONE documented point: the origin PR's
    /// llama3.1-8b 8K (cp=4) all-gather cell on v5p-128, 61.2% MFU, the cell where
    /// attention and context collectives weigh least. There the model's FLOPs at peak take
    /// 4.642 s, its K/V collectives hide behind the projections and the optimizer takes
    /// 0.001 s; 61.2% MFU is a 6.004 s step, so `4.642 / (6.004 - 0.001) = 0.773` (the test
    /// `calibration_cell_is_reproduced` checks it). Every other cell is a prediction.
    pub const CALIBRATED: Efficiency = Efficiency {
        matmul: 0.773,
        attention: 0.773,
    };
}

/// What runs: the model, the sequence, the mesh, the strategy and splash's blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSetup {
    pub model: ModelConfig,
    /// Tokens per sequence (`max_target_length`).
    pub seq_len: usize,
    /// MaxText's `per_device_batch_size` (may be fractional: 0.5 = one sequence per 2 chips).
    pub per_device_batch: f64,
    /// `ici_fsdp_parallelism`.
    pub fsdp: usize,
    /// `ici_context_parallelism`.
    pub context: usize,
    /// Ulysses, all-gather or ring.
    pub strategy: Strategy,
    /// `context_parallel_load_balance` (all-gather and ring; MaxText's default is true).
    pub load_balance: bool,
    /// Splash's blocks: forward `block_q` x `block_kv`, fused backward `block_q_dkv` x
    /// `block_kv_dkv`.
    pub blocks: BlockSizes,
    /// Whether the backward reruns the attention forward (remat of everything but the
    /// attention context, as in the origin PR), and with it the q, k and v projections;
    /// off with [`crate::RematPolicy::SaveAttention`].
    pub remat_attention: bool,
}

impl StepSetup {
    /// One sequence's attention as a context-parallel configuration (causal), whose strategy
    /// says what each device holds and where each kernel call attends.
    pub fn context_parallel(&self) -> ContextParallel {
        let m = &self.model;
        ContextParallel {
            dims: Dims {
                batch: 1,
                heads: m.heads,
                kv_heads: m.kv_heads,
                q_len: self.seq_len,
                kv_len: self.seq_len,
                head_dim: m.head_dim,
                head_dim_v: m.head_dim,
            },
            dtype: DType::BF16,
            mask: Mask::causal(),
            block_sizes: self.blocks,
            options: Default::default(),
            strategy: self.strategy.clone(),
            devices: self.context,
            load_balance: self.load_balance,
            lowering: Lowering::portable(),
        }
    }
}

/// Seconds of each part of the step (see the module docs for the equations).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepBreakdown {
    pub compute_matmul_s: f64,
    /// Attention blocks on the critical path (the busiest device; ring: sum of its steps).
    pub compute_attention_s: f64,
    /// Exposed seconds of the fsdp weight all-gathers.
    pub fsdp_all_gather_s: f64,
    /// Exposed seconds of the fsdp gradient reduce-scatters.
    pub fsdp_reduce_scatter_s: f64,
    /// Exposed seconds of the context strategy's collectives (all-to-alls, K/V all-gathers
    /// and dK/dV reduce-scatters, or the ring permutes beyond their step's compute).
    pub context_collectives_s: f64,
    pub optimizer_s: f64,
}

/// Per-device counts of one step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCounts {
    /// Matmul FLOPs (forward, backward, remat).
    pub matmul_flops: f64,
    /// Attention FLOPs on the critical path (busiest device).
    pub attention_flops: f64,
    /// Forward attention blocks (head x block) the busiest device computes per layer.
    pub attention_blocks_fwd: usize,
    /// Fused-backward blocks the busiest device computes per layer.
    pub attention_blocks_bwd: usize,
    /// Bytes each device gathers in one layer's fsdp weight all-gather (bf16, full layer).
    pub fsdp_gather_bytes_per_layer: f64,
    /// Bytes of one layer's gradients reduce-scattered (fp32, full layer).
    pub fsdp_reduce_bytes_per_layer: f64,
    /// Per layer and device: bytes each context collective handles (Ulysses: the local
    /// input of every all-to-all, summed; all-gather: the gathered K/V plus the
    /// reduce-scattered dK/dV, full size; ring: every permute's payload, summed).
    pub context_bytes_per_layer: f64,
    /// Bytes of the optimizer's HBM traffic.
    pub optimizer_bytes: f64,
}

/// A predicted step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPrediction {
    pub predicted_step_s: f64,
    pub breakdown: StepBreakdown,
    pub counts: StepCounts,
    /// MaxText's model FLOPs per device (`6 x params x tokens + attention`).
    pub model_flops: f64,
    /// `model_flops / (predicted_step_s x peak)`.
    pub predicted_mfu: f64,
    /// `model_flops / predicted_step_s`, TFLOP/s per device, as the PR reports it.
    pub tflops_per_device: f64,
}

impl StepPrediction {
    /// One line of JSON.
    pub fn to_json(&self) -> String {
        let b = &self.breakdown;
        let c = &self.counts;
        json!({
            "predicted_step_s": self.predicted_step_s,
            "predicted_mfu": self.predicted_mfu,
            "tflops_per_device": self.tflops_per_device,
            "model_flops": self.model_flops,
            "breakdown": {
                "compute_matmul_s": b.compute_matmul_s,
                "compute_attention_s": b.compute_attention_s,
                "fsdp_all_gather_s": b.fsdp_all_gather_s,
                "fsdp_reduce_scatter_s": b.fsdp_reduce_scatter_s,
                "context_collectives_s": b.context_collectives_s,
                "optimizer_s": b.optimizer_s,
            },
            "counts": {
                "matmul_flops": c.matmul_flops,
                "attention_flops": c.attention_flops,
                "attention_blocks_fwd": c.attention_blocks_fwd,
                "attention_blocks_bwd": c.attention_blocks_bwd,
                "fsdp_gather_bytes_per_layer": c.fsdp_gather_bytes_per_layer,
                "fsdp_reduce_bytes_per_layer": c.fsdp_reduce_bytes_per_layer,
                "context_bytes_per_layer": c.context_bytes_per_layer,
                "optimizer_bytes": c.optimizer_bytes,
            },
        })
        .to_string()
    }
}

/// bf16 activations and weights as gathered.
const BF16: f64 = 2.0;
/// fp32 gradients and optimizer state.
const F32: f64 = 4.0;

/// Torus links and hop distances of a group of mesh axes.
#[derive(Debug, Clone, PartialEq)]
struct Axes {
    dims: Vec<usize>,
    wrap: bool,
}

impl Axes {
    fn devices(&self) -> usize {
        self.dims.iter().product()
    }

    /// Outgoing links (2 per axis longer than 1).
    fn links(&self) -> usize {
        self.dims.iter().filter(|&&a| a > 1).count() * 2
    }

    /// Hops from device 0 to every device, summed (dimension-order routing).
    fn hop_sum(&self) -> usize {
        let per_axis = |a: usize| -> usize {
            (0..a)
                .map(|k| if self.wrap { k.min(a - k) } else { k })
                .sum()
        };
        let n = self.devices();
        self.dims.iter().map(|&a| per_axis(a) * (n / a)).sum()
    }

    /// All-gather (or reduce-scatter) whose full result is `bytes`.
    fn gather_s(&self, bytes: f64, link_bw: f64) -> f64 {
        let n = self.devices() as f64;
        if n <= 1.0 {
            return 0.0;
        }
        (n - 1.0) / n * bytes / (self.links() as f64 * link_bw)
    }

    /// All-to-all of `bytes` held by each device.
    fn all_to_all_s(&self, bytes: f64, link_bw: f64) -> f64 {
        let n = self.devices() as f64;
        if n <= 1.0 {
            return 0.0;
        }
        bytes / n * self.hop_sum() as f64 / (self.links() as f64 * link_bw)
    }
}

/// Maps mesh axes of `sizes` (slowest first) onto the torus: the last group takes the last
/// torus axes (MaxText's context axis is the faster-varying one; USP's ring axis is the
/// fastest), the one before it the axes before those, and so on; each group must be whole
/// axes and all of them the whole torus.
fn torus_groups(chip: &Chip, sizes: &[usize]) -> Option<Vec<Axes>> {
    let mut end = chip.torus.len();
    let mut groups = Vec::with_capacity(sizes.len());
    for (g, &size) in sizes.iter().enumerate().rev() {
        let mut start = end;
        let mut product = 1;
        // The first group takes every axis left (some of length 1 perhaps).
        while product < size || (g == 0 && start > 0) {
            if start == 0 {
                return None;
            }
            start -= 1;
            product *= chip.torus[start];
        }
        if product != size {
            return None;
        }
        groups.push(Axes {
            dims: chip.torus[start..end].to_vec(),
            wrap: chip.wraparound,
        });
        end = start;
    }
    groups.reverse();
    Some(groups)
}

/// Maps `fsdp x context` onto the torus: context takes the last torus axes (MaxText's
/// context axis is the faster-varying one), fsdp the rest; each must be whole axes.
fn mesh_axes(chip: &Chip, fsdp: usize, context: usize) -> Result<(Axes, Axes), TrainError> {
    match torus_groups(chip, &[fsdp, context]).as_deref() {
        Some([f, c]) => Ok((f.clone(), c.clone())),
        _ => Err(SettingError::MeshNotOnTorus {
            fsdp,
            context,
            chip: chip.name.clone(),
            torus: chip.torus.clone(),
        }
        .into()),
    }
}

/// Forward and fused-backward blocks (heads x blocks) computed for `q_len` queries at
/// `q_off` against `kv_len` keys at `kv_off`, per head.
fn blocks(
    b: &BlockSizes,
    q: (usize, usize),
    kv: (usize, usize),
) -> Result<(usize, usize), TrainError> {
    let info = |bq, bkv, major| {
        MaskInfo::new(
            &Mask::causal().into(),
            1,
            q.1,
            kv.1,
            SeqOffsets { q: q.0, kv: kv.0 },
            bq,
            bkv,
            major,
            true,
        )
        .map(|i| i.stats.computed())
        .map_err(|source| {
            TrainError::from(SettingError::Blocks {
                block_q: bq,
                block_kv: bkv,
                q_len: q.1,
                kv_len: kv.1,
                source: Box::new(source),
            })
        })
    };
    Ok((
        info(b.block_q, b.block_kv, Major::Q)?,
        info(b.block_q_dkv, b.block_kv_dkv, Major::Kv)?,
    ))
}

/// Forward and fused-backward blocks (per head) of the kernel calls of one step on shard
/// `shard`, each call of `lens` queries and keys at the shard's offsets.
fn step_blocks(
    b: &BlockSizes,
    step: &[Vec<SeqOffsets>],
    shard: usize,
    (q_len, kv_len): (usize, usize),
) -> Result<(usize, usize), TrainError> {
    let mut total = (0, 0);
    for call in step {
        let o = call[shard % call.len()];
        let (f, bw) = blocks(b, (o.q, q_len), (o.kv, kv_len))?;
        total = (total.0 + f, total.1 + bw);
    }
    Ok(total)
}

/// Predicts one training step of `setup` on `chip` (see the module docs).
pub fn predict_step(
    setup: &StepSetup,
    chip: &Chip,
    eff: Efficiency,
) -> Result<StepPrediction, TrainError> {
    let s = setup;
    let m = &s.model;
    let cp = s.context;
    let devices = s.fsdp * cp;
    for (setting, n) in [
        (Setting::FsdpParallelism, s.fsdp),
        (Setting::ContextParallelism, cp),
    ] {
        if n == 0 {
            return Err(SettingError::Zero { setting }.into());
        }
    }
    if devices != chip.chips() {
        return Err(SettingError::SliceChips {
            fsdp: s.fsdp,
            context: cp,
            chip: chip.name.clone(),
            chips: chip.chips(),
        }
        .into());
    }
    // The fsdp axes carry no collective of their own: the weights are sharded over the
    // whole slice. Mapping them still checks that the mesh fits the torus.
    let (_fsdp_axes, cp_axes) = mesh_axes(chip, s.fsdp, cp)?;
    let all_axes = Axes {
        dims: chip.torus.clone(),
        wrap: chip.wraparound,
    };
    // Each fsdp shard's whole sequences (a fraction of a sequence per device is split over
    // the context axis).
    let seqs_per_device = whole_sequences(s.per_device_batch, cp, s.fsdp)?;
    let sequences = (seqs_per_device * s.fsdp) as f64;
    // The strategy's own rules: what divides what, what each device holds, where each
    // kernel call attends.
    let attention = s.context_parallel();
    attention.check()?;
    // How the strategy's devices exchange keys and values: what the collectives cost.
    let exchange = s.strategy.exchange(cp);
    // USP's Ulysses all-to-alls run over its Ulysses axes (the context axes before the
    // ring's, which are the last torus axes).
    let ulysses_axes = match exchange {
        Exchange::Ring { ulysses, ring } if ulysses > 1 => {
            match torus_groups(chip, &[s.fsdp, ulysses, ring]).as_deref() {
                Some([_, u, _]) => Some(u.clone()),
                _ => {
                    return Err(SettingError::UlyssesRingNotOnTorus {
                        strategy: s.strategy.clone(),
                        ulysses,
                        ring,
                        chip: chip.name.clone(),
                        torus: chip.torus.clone(),
                    }
                    .into())
                }
            }
        }
        _ => None,
    };
    let local = attention.local_dims();
    let (heads_local, kv_heads_local) = (local.heads, local.kv_heads);
    let lens = attention.local_lengths();
    let calls = attention.kernel_calls();
    let (d, hd, layers) = (m.d_model, m.head_dim, m.layers as f64);
    let tokens = (seqs_per_device * s.seq_len / cp) as f64;
    let peak = chip.peak_bf16_flops;
    let link = chip.ici_link_bandwidth;

    // Matmuls. The q, k and v projections are recomputed with the attention only: their
    // outputs feed nothing else.
    let qkv_params = if s.remat_attention {
        d * hd * (m.heads + 2 * m.kv_heads)
    } else {
        0
    };
    let remat_params = qkv_params + 2 * d * m.mlp_dim;
    let matmul_flops =
        6.0 * tokens * m.matmul_params() as f64 + 2.0 * tokens * layers * remat_params as f64;
    let matmul_s = matmul_flops / (peak * eff.matmul);

    // Attention blocks: per layer, forward and backward seconds on the critical path.
    let b = &s.blocks;
    let fwd_block = 4.0 * (b.block_q * b.block_kv * hd) as f64;
    let bwd_block = 10.0 * (b.block_q_dkv * b.block_kv_dkv * hd) as f64;
    let attn_rate = peak * eff.attention;
    let fwd_passes = if s.remat_attention { 2.0 } else { 1.0 };
    // The layer's matmuls that K/V's collectives overlap (neither feeding them nor waiting
    // for them): in the forward (and remat forward) the V and Q projections, which run after
    // K's, whose collective starts first; in the backward dq's two matmuls (its weight and
    // input gradients). Only the excess of a transfer over them is exposed.
    let rate = peak * eff.matmul;
    let behind_fwd = 2.0 * tokens * (d * hd * (m.kv_heads + m.heads)) as f64 / rate;
    let behind_bwd = 4.0 * tokens * (d * hd * m.heads) as f64 / rate;
    let exposed = |transfer: f64, behind: f64| (transfer - behind).max(0.0);
    let per_seq = |blocks: (usize, usize)| {
        let h = heads_local * seqs_per_device;
        (blocks.0 * h, blocks.1 * h)
    };
    // The K (or V) each device holds for the ring steps or the all-gather: its tokens (a
    // ring chunk of `S / ring`: `S / cp` for ring and all-gather, a whole USP ring chunk after
    // the all-to-all) for the KV heads it keeps.
    let ring_devices = match exchange {
        Exchange::Ring { ring, .. } => ring,
        _ => cp,
    };
    let kv_shard_bytes =
        (seqs_per_device * s.seq_len / ring_devices * kv_heads_local * hd) as f64 * BF16;
    // The Ulysses all-to-alls of a layer (Ulysses; USP's over its Ulysses axes): their bytes
    // and exposed seconds. Local inputs: q and out with all heads, k and v with the KV heads
    // (replicated when fewer than the Ulysses degree), each [seqs, S / cp, heads, D].
    // Forward q, k, v, out; remat q, k, v; backward dout, dq, dk, dv. Those of q, out, dout
    // and dq are exposed; k's and v's (dk's and dv's) run behind the q side.
    let ulysses_all_to_alls = |axes: &Axes| {
        let tokens_local = seqs_per_device * s.seq_len / cp;
        let q_bytes = (tokens_local * m.heads * hd) as f64 * BF16;
        let kv_bytes = (tokens_local * m.kv_heads * attention.kv_replication() * hd) as f64 * BF16;
        let qkv = q_bytes + 2.0 * kv_bytes;
        let remat = if s.remat_attention { 1.0 } else { 0.0 };
        let bytes = qkv + q_bytes + remat * qkv + q_bytes + qkv;
        let q_s = axes.all_to_all_s(q_bytes, link);
        let kv_s = axes.all_to_all_s(2.0 * kv_bytes, link);
        let layer_s = (4.0 + remat) * q_s
            + (1.0 + remat) * exposed(kv_s, behind_fwd)
            + exposed(kv_s, behind_bwd);
        (bytes, layer_s)
    };
    let (blocks_fwd, blocks_bwd, attn_layer_s, context_layer_s, context_bytes) = match exchange {
        Exchange::Heads => {
            let (f, bw) = per_seq(step_blocks(b, &calls[0], 0, lens)?);
            let attn = (fwd_passes * f as f64 * fwd_block + bw as f64 * bwd_block) / attn_rate;
            let (bytes, layer_s) = ulysses_all_to_alls(&cp_axes);
            (f, bw, attn, layer_s, bytes)
        }
        Exchange::HeadsInKernel => {
            let (f, bw) = per_seq(step_blocks(b, &calls[0], 0, lens)?);
            let fwd_s = f as f64 * fwd_block / attn_rate;
            let bwd_s = bw as f64 * bwd_block / attn_rate;
            // Every array moves with all its query heads (GQA's KV heads repeated): q, k, v
            // in and out and lse (f32, one value a row) back in the forward (and its remat);
            // q, k, v, dout, lse and di in and dq, dk, dv back in the backward. One grid step
            // per local head of each sequence: the first head's rows wait for nothing to
            // hide behind, and the last chunk sent back waits for the kernel's end; the other
            // steps' copies run behind the head before (after), exposed where they take
            // longer than its attention.
            let tokens_local = seqs_per_device * s.seq_len / cp;
            let array = (tokens_local * m.heads * hd) as f64 * BF16;
            let row_stat = (tokens_local * m.heads) as f64 * 4.0;
            let steps = (seqs_per_device * heads_local).max(1) as f64;
            let hidden = |bytes: f64, attention_s: f64| {
                let transfer = cp_axes.all_to_all_s(bytes, link);
                transfer / steps + ((transfer - attention_s) * (steps - 1.0) / steps).max(0.0)
            };
            let (fwd_bytes, bwd_bytes) = (4.0 * array + row_stat, 7.0 * array + 2.0 * row_stat);
            let layer_s = fwd_passes * hidden(fwd_bytes, fwd_s) + hidden(bwd_bytes, bwd_s);
            (
                f,
                bw,
                fwd_passes * fwd_s + bwd_s,
                layer_s,
                fwd_passes * fwd_bytes + bwd_bytes,
            )
        }
        Exchange::AllKeys => {
            let mut worst = (0, 0, 0.0);
            for c in 0..cp {
                let (f, bw) = per_seq(step_blocks(b, &calls[0], c, lens)?);
                let t = (fwd_passes * f as f64 * fwd_block + bw as f64 * bwd_block) / attn_rate;
                if t > worst.2 {
                    worst = (f, bw, t);
                }
            }
            // The gathered K and V; forward (and remat) all-gathers, backward reduce-scatter.
            let full = 2.0 * kv_shard_bytes * cp as f64;
            let pass_s = cp_axes.gather_s(full, link);
            let layer_s = fwd_passes * exposed(pass_s, behind_fwd) + exposed(pass_s, behind_bwd);
            (
                worst.0,
                worst.1,
                worst.2,
                layer_s,
                (fwd_passes + 1.0) * full,
            )
        }
        Exchange::Ring { ring, .. } => {
            // Forward steps move K and V; backward steps move K, V, dK and dV.
            let kv_permute = if ring > 1 {
                2.0 * kv_shard_bytes / link
            } else {
                0.0
            };
            let (mut fwd_s, mut bwd_s, mut exposed) = (0.0, 0.0, 0.0);
            let (mut fwd_blocks, mut bwd_blocks) = (0, 0);
            for (t, calls) in calls.iter().enumerate() {
                let mut step = (0, 0);
                for c in 0..ring {
                    let (f, bw) = per_seq(step_blocks(b, calls, c, lens)?);
                    step = (step.0.max(f), step.1.max(bw));
                }
                fwd_blocks += step.0;
                bwd_blocks += step.1;
                let f = step.0 as f64 * fwd_block / attn_rate;
                let bw = step.1 as f64 * bwd_block / attn_rate;
                fwd_s += f;
                bwd_s += bw;
                if t + 1 < ring {
                    exposed +=
                        fwd_passes * (kv_permute - f).max(0.0) + (2.0 * kv_permute - bw).max(0.0);
                }
            }
            let permutes = ring.saturating_sub(1) as f64;
            let mut bytes = permutes * 2.0 * kv_shard_bytes * (fwd_passes + 2.0);
            // USP: the Ulysses all-to-alls around the ring.
            if let Some(axes) = &ulysses_axes {
                let (a2a_bytes, a2a_s) = ulysses_all_to_alls(axes);
                bytes += a2a_bytes;
                exposed += a2a_s;
            }
            (
                fwd_blocks,
                bwd_blocks,
                fwd_passes * fwd_s + bwd_s,
                exposed,
                bytes,
            )
        }
    };
    let attention_s = layers * attn_layer_s;
    let attention_flops =
        layers * (fwd_passes * blocks_fwd as f64 * fwd_block + blocks_bwd as f64 * bwd_block);

    // fsdp: weights gathered in bf16 for the forward and again for the backward, gradients
    // reduce-scattered in fp32; each hides behind one layer's compute.
    let layer_params = (d * hd * (2 * m.heads + 2 * m.kv_heads) + 3 * d * m.mlp_dim) as f64;
    let gather_bytes = layer_params * BF16;
    let reduce_bytes = layer_params * F32;
    let layer_compute = (matmul_s + attention_s) / layers;
    let gather_s = 2.0 * layers * (all_axes.gather_s(gather_bytes, link) - layer_compute).max(0.0);
    let reduce_s = layers * (all_axes.gather_s(reduce_bytes, link) - layer_compute).max(0.0);

    // AdamW over this device's fp32 shard.
    let optimizer_bytes = m.num_params() as f64 / devices as f64 * 7.0 * F32;
    let optimizer_s = optimizer_bytes / chip.hbm_bandwidth;

    let breakdown = StepBreakdown {
        compute_matmul_s: matmul_s,
        compute_attention_s: attention_s,
        fsdp_all_gather_s: gather_s,
        fsdp_reduce_scatter_s: reduce_s,
        context_collectives_s: layers * context_layer_s,
        optimizer_s,
    };
    let step = breakdown.compute_matmul_s
        + breakdown.compute_attention_s
        + breakdown.fsdp_all_gather_s
        + breakdown.fsdp_reduce_scatter_s
        + breakdown.context_collectives_s
        + breakdown.optimizer_s;
    let model = model_flops(m, sequences, s.seq_len) / devices as f64;
    Ok(StepPrediction {
        predicted_step_s: step,
        breakdown,
        counts: StepCounts {
            matmul_flops,
            attention_flops,
            attention_blocks_fwd: blocks_fwd,
            attention_blocks_bwd: blocks_bwd,
            fsdp_gather_bytes_per_layer: gather_bytes,
            fsdp_reduce_bytes_per_layer: reduce_bytes,
            context_bytes_per_layer: context_bytes,
            optimizer_bytes,
        },
        model_flops: model,
        predicted_mfu: model / (step * peak),
        tflops_per_device: model / step / 1e12,
    })
}
