//! The user-facing splash attention: a configured attention (mask, shapes, block sizes,
//! options) whose forward and backward are plans of kernel stages, run on any
//! [`Executor`] (a [`Backend`]: the interpreter or a PJRT platform's devices) or lowered
//! into a larger StableHLO program.

use std::collections::HashMap;

use tessera_backend::{Backend, RunError};
use tessera_dsl::rules::ALIASED_READ_DISTANCE;
use tessera_dsl::{with_float_type, ArgSpec, DType, HostArray, KernelDef, KernelRules, Lowering};

use crate::block_sizes::{default_block, BlockSizes, NUM_LANES};
use crate::error::{InputError, MissingIn, OptionsError, PlanBug, SplashError};
use crate::kernels::{
    splash_bwd_fused, splash_bwd_prep, splash_dkv, splash_dq, splash_dq_reduce, splash_fwd,
    F32Bits, KernelConfig, PrepConfig, ReduceConfig,
};
use crate::mask::{BlockKind, MultiHeadMask, SeqOffsets};
use crate::mask_info::{BlockStats, Major, MaskInfo};

/// `def` without its segment-id operands when the call has none (a kernel that never fetches
/// them, where a placeholder array would be pipelined block by block).
fn with_segments(def: KernelDef, f: Features) -> KernelDef {
    if f.segmented {
        return def;
    }
    def.without("q_seg")
        .and_then(|d| d.without("kv_seg"))
        .expect("the splash kernels declare `q_seg` and `kv_seg` optional")
}

/// JAX's default mask value: the finite stand-in logit of masked entries.
pub const DEFAULT_MASK_VALUE: f32 = -0.7 * f32::MAX;

/// The sizes of an attention problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    pub batch: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `KVH` (divides `H`; `H` for MHA, 1 for MQA).
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    /// Head dim of queries and keys.
    pub head_dim: usize,
    /// Head dim of values (and outputs).
    pub head_dim_v: usize,
}

impl Dims {
    /// The dims of `q [B, H, Sq, D]`, `k [B, KVH, Skv, D]`, `v [B, KVH, Skv, Dv]`, checked.
    pub fn of(q: &[usize], k: &[usize], v: &[usize]) -> Result<Self, SplashError> {
        let bad = |e: InputError| Err(SplashError::Shape(e));
        let rank = |name, layout, shape: &[usize]| InputError::Rank {
            name,
            layout,
            shape: shape.to_vec(),
        };
        if q.len() != 4 {
            return bad(rank("q", "[B, H, S, D]", q));
        }
        if k.len() != 4 {
            return bad(rank("k", "[B, KVH, S, D]", k));
        }
        if v.len() != 4 {
            return bad(rank("v", "[B, KVH, S, D]", v));
        }
        let (qs, ks, vs) = (q.to_vec(), k.to_vec(), v.to_vec());
        if q.contains(&0) || k.contains(&0) || v.contains(&0) {
            return bad(InputError::Empty {
                q: qs,
                k: ks,
                v: vs,
            });
        }
        if k[0] != q[0] || v[0] != q[0] {
            return bad(InputError::BatchSizes {
                q: qs,
                k: ks,
                v: vs,
            });
        }
        if k[..3] != v[..3] {
            return bad(InputError::KeyValueShapes { k: ks, v: vs });
        }
        if k[3] != q[3] {
            return bad(InputError::HeadDims { q: qs, k: ks });
        }
        if q[1] % k[1] != 0 {
            return bad(InputError::KvHeadsOfShapes {
                heads: q[1],
                kv_heads: k[1],
            });
        }
        Ok(Dims {
            batch: q[0],
            heads: q[1],
            kv_heads: k[1],
            q_len: q[2],
            kv_len: k[2],
            head_dim: q[3],
            head_dim_v: v[3],
        })
    }

    /// Checks a call's arrays against these dims and `dtype` (q, k, v of dtype and finite,
    /// segment ids int32 `[B, S]`, sinks f32 `[H]` and finite); returns the features the call
    /// uses. Every entry point (one device or context parallel) checks its inputs here.
    pub fn check_inputs(&self, dtype: DType, x: &Inputs<'_>) -> Result<Features, SplashError> {
        let dims = Dims::of(x.q.shape(), x.k.shape(), x.v.shape())?;
        if dims != *self {
            return Err(SplashError::Shape(InputError::Dims {
                found: dims,
                configured: *self,
            }));
        }
        for (name, a) in [("q", x.q), ("k", x.k), ("v", x.v)] {
            if a.dtype() != dtype {
                return Err(SplashError::Shape(InputError::Dtype {
                    name,
                    found: a.dtype(),
                    configured: dtype,
                }));
            }
            check_finite(name, a)?;
        }
        if let Some(s) = x.segment_ids {
            for (name, a, len) in [("q", s.q, self.q_len), ("kv", s.kv, self.kv_len)] {
                let want = [self.batch, len];
                if a.dtype() != DType::I32 || a.shape() != want {
                    return Err(SplashError::Shape(InputError::SegmentIds {
                        name,
                        want: want.to_vec(),
                        dtype: a.dtype(),
                        shape: a.shape().to_vec(),
                    }));
                }
            }
        }
        if let Some(s) = x.sinks {
            if s.dtype() != DType::F32 || s.shape() != [self.heads] {
                return Err(SplashError::Shape(InputError::Sinks {
                    heads: self.heads,
                    dtype: s.dtype(),
                    shape: s.shape().to_vec(),
                }));
            }
            check_finite("sinks", s)?;
        }
        Ok(Features {
            segmented: x.segment_ids.is_some(),
            sinks: x.sinks.is_some(),
        })
    }

    /// Checks an array shaped like the output (`dout`, or a forward's `out` handed back):
    /// `dtype[B, H, Sq, Dv]`, finite.
    pub fn check_output_like(
        &self,
        name: &str,
        dtype: DType,
        a: &HostArray,
    ) -> Result<(), SplashError> {
        let want = [self.batch, self.heads, self.q_len, self.head_dim_v];
        if a.shape() != want || a.dtype() != dtype {
            return Err(SplashError::Shape(InputError::OutputLike {
                name: name.to_string(),
                want_dtype: dtype,
                want: want.to_vec(),
                dtype: a.dtype(),
                shape: a.shape().to_vec(),
            }));
        }
        check_finite(name, a)
    }

    /// Checks a logsumexp handed back to a backward: f32 `[B, H, Sq]`, no NaN or `+inf`
    /// (`-inf` marks a row without a visible key).
    pub fn check_lse(&self, lse: &HostArray) -> Result<(), SplashError> {
        let want = [self.batch, self.heads, self.q_len];
        if lse.shape() != want || lse.dtype() != DType::F32 {
            return Err(SplashError::Shape(InputError::Lse {
                want: want.to_vec(),
                dtype: lse.dtype(),
                shape: lse.shape().to_vec(),
            }));
        }
        match lse
            .to_f64_vec()
            .iter()
            .position(|x| x.is_nan() || *x == f64::INFINITY)
        {
            Some(i) => Err(SplashError::Shape(InputError::LseValue {
                value: lse.to_f64_vec()[i],
                index: i,
            })),
            None => Ok(()),
        }
    }
}

/// Options beyond the mask and block sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplashOptions {
    /// Logits are `scale * q.k`; default `1 / sqrt(D)`.
    pub scale: Option<f32>,
    /// Logits are capped as `cap * tanh(logits / cap)` (Gemma 2's soft cap).
    pub soft_cap: Option<f32>,
    /// The finite logit masked entries stand for in the kernels' running max
    /// ([`DEFAULT_MASK_VALUE`], as JAX). Masked entries never get weight, so any finite value
    /// gives the same results (up to underflow when it exceeds the real logits by ~80).
    pub mask_value: f32,
    /// Where the queries and keys sit in the global sequence (sequence sharding).
    pub offsets: SeqOffsets,
    /// Trace both the full-block and the partial-block paths even when these tables have no
    /// block of one kind, so that every shard of a sequence-sharded attention (whose tables
    /// differ) runs the same kernels. Off: dead paths are left out of the IR.
    pub trace_all_paths: bool,
    /// Mark the forward's residuals (`q`, `k`, `v` as the kernel takes them, `out` and
    /// `lse`) with [`tessera_hlo::FuncBuilder::keep_for_backward`] where the context-parallel
    /// strategies (`tessera_parallel`) lower the attention as a custom-VJP unit: the
    /// backward of a loop holding it (a layer loop) reads them from the forward instead of
    /// re-running the kernel and whatever only fed its inputs (projections, a strategy's
    /// exchange). JAX's splash takes a `residual_checkpoint_name` for the same purpose. Off:
    /// the loop's backward re-runs the forward.
    pub keep_residuals: bool,
}

impl Default for SplashOptions {
    fn default() -> Self {
        SplashOptions {
            scale: None,
            soft_cap: None,
            mask_value: DEFAULT_MASK_VALUE,
            offsets: SeqOffsets::default(),
            trace_all_paths: false,
            keep_residuals: false,
        }
    }
}

/// Per-token segment ids (packed sequences): a query attends only to keys of its own
/// segment. `q [B, Sq]` and `kv [B, Skv]`, int32.
#[derive(Debug, Clone, Copy)]
pub struct SegmentIds<'a> {
    pub q: &'a HostArray,
    pub kv: &'a HostArray,
}

/// The arrays of one call.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// `[B, H, Sq, D]`.
    pub q: &'a HostArray,
    /// `[B, KVH, Skv, D]`.
    pub k: &'a HostArray,
    /// `[B, KVH, Skv, Dv]`.
    pub v: &'a HostArray,
    pub segment_ids: Option<SegmentIds<'a>>,
    /// Attention sinks `[H]` f32: one extra logit per head whose value vector is zero.
    pub sinks: Option<&'a HostArray>,
}

impl<'a> Inputs<'a> {
    /// `q`, `k` and `v` alone: no segment ids, no sinks (set those fields on the result).
    pub fn new(q: &'a HostArray, k: &'a HostArray, v: &'a HostArray) -> Self {
        Inputs {
            q,
            k,
            v,
            segment_ids: None,
            sinks: None,
        }
    }
}

/// Forward results.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// `[B, H, Sq, Dv]`.
    pub out: HostArray,
    /// `[B, H, Sq]` f32; `-inf` for rows without a visible key (and no sink).
    pub lse: HostArray,
}

/// Gradients of `sum(out * dout)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    pub dq: HostArray,
    pub dk: HostArray,
    pub dv: HostArray,
    /// `[H]` f32, when the call had sinks.
    pub dsinks: Option<HostArray>,
}

/// The arrays a plan's stages pass between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tensor {
    /// `[B, H, Sq, D]`.
    Q,
    /// `[B, KVH, Skv, D]`.
    K,
    /// `[B, KVH, Skv, Dv]`.
    V,
    /// Query segment ids as `[B, 1, Sq]` (a reshape of `[B, Sq]`).
    QSegments,
    /// Key segment ids as `[B, 1, Skv]` (a reshape of `[B, Skv]`).
    KvSegments,
    /// `[H]` f32.
    Sinks,
    /// `[B, H, Sq, Dv]`.
    Out,
    /// `[B, H, 1, Sq]` f32 (a reshape of the user's `[B, H, Sq]`: lane-dense rows).
    Lse,
    /// `[B, H, Sq, Dv]`.
    DOut,
    /// `rowsum(out * dout)`, `[B, H, 1, Sq]` f32.
    Di,
    /// The fused backward's dQ per key block, `[Skv / block_kv_dkv, B, H, Sq, D]` in q's
    /// dtype (bf16 halves the fused backward's temporaries; the sum over key blocks is f32).
    DqPartial,
    Dq,
    Dk,
    Dv,
    /// `[H, 1, 1]` f32.
    DSinks,
}

/// One argument of a stage.
#[derive(Debug, Clone)]
pub enum StageArg {
    /// A host array fixed by the configuration (tables, offsets, placeholders).
    Const(HostArray),
    /// An array of the computation.
    Tensor(Tensor),
    /// One host array per shard of an SPMD program, all of one shape; each device uses the
    /// one of its shard (the tables of a [`ShardedSplash`](crate::ShardedSplash)).
    PerShard(Vec<HostArray>),
    /// An array of zeros (a splat where lowered, a host array only where run on the host):
    /// the fused backward's dQ partials start from it.
    Zeros(ArgSpec),
}

/// One kernel launch: the kernel, its arguments (scalar prefetch then inputs), the tensors
/// its outputs become, and the lowering it is instantiated and lowered for.
#[derive(Debug, Clone)]
pub struct Stage {
    pub def: KernelDef,
    pub args: Vec<StageArg>,
    pub outputs: Vec<Tensor>,
    pub lowering: Lowering,
    /// The grid steps that do work, where the mask says (the blocks it computes; a skipped
    /// block's step does nothing): the Mosaic call's cost estimate counts these.
    pub active_steps: Option<u64>,
}

/// What a call uses beyond q, k, v (each changes the kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features {
    pub segmented: bool,
    pub sinks: bool,
}

/// Runs one kernel on host arrays: a [`Backend`], or a test's wrapper around one that watches
/// or perturbs the kernels a plan runs.
pub trait Executor {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &KernelRules,
    ) -> Result<Vec<HostArray>, SplashError>;
}

/// Splash attention's plans run their kernels on any backend.
impl Executor for Backend {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &KernelRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        tessera_backend::run(def, args, *self, rules).map_err(|e| match e {
            RunError::Kernel(k) => SplashError::Kernel(k),
            other => SplashError::Backend(Box::new(other)),
        })
    }
}

/// A configured splash attention: mask, shapes, dtype, block sizes and options, with the
/// block-sparsity tables of its forward and backward kernels.
#[derive(Debug, Clone)]
pub struct SplashAttention {
    dims: Dims,
    dtype: DType,
    mask: MultiHeadMask,
    block_sizes: BlockSizes,
    options: SplashOptions,
    scale: f32,
    lowering: Lowering,
    fwd_info: MaskInfo,
    dq_info: Option<MaskInfo>,
    dkv_info: MaskInfo,
}

impl SplashAttention {
    /// Validates everything and builds the forward, dQ and dK/dV tables. `dtype` is the
    /// element type of q, k, v (f32 or bf16); `lowering` the hardware rules the kernels are
    /// checked against (`KernelRules::tpu()` keeps them valid for TPU; kernels lowered
    /// inline) or a whole [`Lowering`] (`Lowering::tpu()`: kernels become Mosaic custom calls).
    pub fn new(
        mask: impl Into<MultiHeadMask>,
        dims: Dims,
        dtype: DType,
        block_sizes: BlockSizes,
        options: SplashOptions,
        lowering: impl Into<Lowering>,
    ) -> Result<Self, SplashError> {
        let mask = mask.into();
        let lowering = lowering.into();
        let rules = &lowering.rules;
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(SplashError::Shape(InputError::UnsupportedDtype { dtype }));
        }
        let sizes = [
            dims.batch,
            dims.heads,
            dims.kv_heads,
            dims.q_len,
            dims.kv_len,
            dims.head_dim,
            dims.head_dim_v,
        ];
        if sizes.contains(&0) {
            return Err(SplashError::Shape(InputError::NonPositiveDims { dims }));
        }
        if dims.heads % dims.kv_heads != 0 {
            return Err(SplashError::Shape(InputError::KvHeads {
                heads: dims.heads,
                kv_heads: dims.kv_heads,
            }));
        }
        let scale = options.scale.unwrap_or(1.0 / (dims.head_dim as f32).sqrt());
        if !scale.is_finite() {
            return Err(SplashError::Options(OptionsError::Scale { scale }));
        }
        if let Some(c) = options.soft_cap {
            if !(c.is_finite() && c > 0.0) {
                return Err(SplashError::Options(OptionsError::SoftCap { cap: c }));
            }
        }
        if !options.mask_value.is_finite() {
            return Err(SplashError::Options(OptionsError::MaskValue {
                value: options.mask_value,
            }));
        }
        let b = block_sizes;
        let info = |bq, bkv, major, shrink| {
            MaskInfo::new(
                &mask,
                dims.heads,
                dims.q_len,
                dims.kv_len,
                options.offsets,
                bq,
                bkv,
                major,
                shrink,
            )
        };
        b.validate(dims.q_len, dims.kv_len, rules)?;
        // The forward walks only the blocks it computes (its tables compacted).
        let fwd_info = info(b.block_q, b.block_kv, Major::Q, true)?
            .with_diagonal_sub_tiles(&mask, b.diagonal_block())
            .compacted();
        let dq_info = if b.use_fused_bwd_kernel {
            None
        } else {
            // dQ walks key blocks per query block; as Mosaic calls it computes
            // keys-by-queries tiles (`splash_dq`).
            // Its tables are compacted as the forward's: its grid walks only the blocks it
            // computes.
            let dq = info(b.block_q_dq, b.block_kv_dq, Major::Q, true)?
                .with_diagonal_sub_tiles(&mask, b.diagonal_block_dq());
            Some(if lowering.is_tpu() {
                dq.with_keys_by_queries_tiles().compacted()
            } else {
                dq.compacted()
            })
        };
        let dkv_info = info(
            b.block_q_dkv,
            b.block_kv_dkv,
            Major::Kv,
            !b.use_fused_bwd_kernel,
        )?
        .with_diagonal_sub_tiles(&mask, b.diagonal_block_dkv());
        Ok(SplashAttention {
            dims,
            dtype,
            mask,
            block_sizes,
            options,
            scale,
            lowering,
            fwd_info,
            dq_info,
            dkv_info,
        })
    }

    pub fn dims(&self) -> Dims {
        self.dims
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn mask(&self) -> &MultiHeadMask {
        &self.mask
    }

    pub fn block_sizes(&self) -> BlockSizes {
        self.block_sizes
    }

    pub fn options(&self) -> SplashOptions {
        self.options
    }

    /// The scale in use (the default resolved).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    pub fn rules(&self) -> &KernelRules {
        &self.lowering.rules
    }

    /// The lowering the kernels are checked against and lowered for.
    pub fn lowering(&self) -> &Lowering {
        &self.lowering
    }

    /// The forward kernel's tables.
    pub fn fwd_mask_info(&self) -> &MaskInfo {
        &self.fwd_info
    }

    /// The dQ kernel's tables (none with the fused backward).
    pub fn dq_mask_info(&self) -> Option<&MaskInfo> {
        self.dq_info.as_ref()
    }

    /// The dK/dV (or fused backward) kernel's tables.
    pub fn dkv_mask_info(&self) -> &MaskInfo {
        &self.dkv_info
    }

    /// Every table set (forward, dK/dV, then dQ when separate), for padding shards to one
    /// shape.
    pub(crate) fn mask_infos_mut(&mut self) -> Vec<&mut MaskInfo> {
        let mut infos = vec![&mut self.fwd_info, &mut self.dkv_info];
        infos.extend(self.dq_info.as_mut());
        infos
    }

    /// The forward's key blocks over the whole batch: computed (full + partial), skipped
    /// (empty) and masked (partial).
    pub fn stats(&self) -> BlockStats {
        self.fwd_info.stats.times(self.dims.batch)
    }

    /// The grid steps of a kernel over `info`'s tables that compute a block: one per
    /// computed (head, query block, key block) and batch element.
    fn computed_steps(&self, info: &MaskInfo) -> u64 {
        (info.stats.computed() * self.dims.batch) as u64
    }

    fn config(&self, info: &MaskInfo, bkv_compute: usize, f: Features) -> KernelConfig {
        KernelConfig {
            bq: info.block_q,
            bkv: info.block_kv,
            bkv_compute,
            scale: F32Bits::new(self.scale),
            soft_cap: self.options.soft_cap.map(F32Bits::new),
            mask_value: F32Bits::new(self.options.mask_value),
            mask: info.kernel_mask.clone(),
            per_head: info.per_head(),
            any_partial: self.options.trace_all_paths || info.stats.partial > 0,
            any_full: self.options.trace_all_paths || info.stats.full > 0,
            sinks: f.sinks,
            lanes: self.lanes(bkv_compute),
            keys_by_queries: info.keys_by_queries,
            diagonal_sub_tiles: None,
            queries_scaled_once: false,
        }
    }

    /// `cfg` tracing the diagonal path of `info`'s tables at sub-tile `sub` where they use it
    /// (or, for kernels shared by shards, wherever a shard's tables may use it), and the
    /// partial path only where a partial block is left.
    fn diagonal_config(&self, mut cfg: KernelConfig, info: &MaskInfo, sub: usize) -> KernelConfig {
        if self.options.trace_all_paths {
            let square = info.block_q == info.block_kv;
            cfg.diagonal_sub_tiles = Some(sub).filter(|&d| square && d < info.block_q);
        } else {
            cfg.diagonal_sub_tiles = info.diagonal_sub_tiles;
            cfg.any_partial = info.block_mask.contains(&BlockKind::Partial.code());
        }
        cfg
    }

    /// Lanes of the forward's running max and sum ([`KernelConfig::lanes`]): 128 when the
    /// kernels become Mosaic calls and the logits and accumulator are whole 128-lane tiles
    /// wide, else 1 (the StableHLO lowering keeps its cheaper `[bq, 1]` columns).
    fn lanes(&self, bkv_compute: usize) -> usize {
        let tiles = bkv_compute % NUM_LANES == 0 && self.dims.head_dim_v % NUM_LANES == 0;
        if self.lowering.is_tpu() && tiles {
            NUM_LANES
        } else {
            1
        }
    }

    /// Scalar-prefetch tables (`data_next`, `block_mask`, `mask_next`, then with `rows`
    /// `row_block` and `row_bounds`, then `head_class`).
    fn tables(&self, info: &MaskInfo, rows: bool) -> Vec<StageArg> {
        let shape = [info.table_heads, info.rows, info.width];
        let t = |v: &Vec<i32>| StageArg::Const(host_i32(&shape, v.clone()));
        let mut tables = vec![t(&info.data_next), t(&info.block_mask), t(&info.mask_next)];
        if rows {
            tables.extend([t(&info.row_block), t(&info.row_bounds)]);
        }
        tables.push(StageArg::Const(host_i32(
            &[self.dims.heads],
            info.head_class.clone(),
        )));
        tables
    }

    fn offsets(&self) -> StageArg {
        let o = self.options.offsets;
        StageArg::Const(host_i32(&[2], vec![o.q as i32, o.kv as i32]))
    }

    fn sinks(&self, f: Features) -> StageArg {
        if f.sinks {
            StageArg::Tensor(Tensor::Sinks)
        } else {
            StageArg::Const(HostArray::zeros(DType::F32, [self.dims.heads]))
        }
    }

    /// The segment ids, when the call has them (the kernels take them as optional operands).
    fn segments(&self, f: Features) -> Vec<StageArg> {
        if f.segmented {
            vec![
                StageArg::Tensor(Tensor::QSegments),
                StageArg::Tensor(Tensor::KvSegments),
            ]
        } else {
            Vec::new()
        }
    }

    /// The stored partial mask blocks (dense masks), or a 1x1 placeholder.
    fn mask_blocks(info: &MaskInfo) -> StageArg {
        let [rows, cols] = info.partial_block_shape();
        StageArg::Const(match (info.dense(), info.num_partial_blocks) {
            (true, 0) => HostArray::zeros(DType::I8, [1, rows, cols]),
            (true, n) => HostArray::new(
                [n, rows, cols],
                tessera_dsl::array::ArrayData::I8(info.partial_blocks.clone()),
            )
            .expect("partial blocks have their shape"),
            (false, _) => HostArray::zeros(DType::I8, [1, 1, 1]),
        })
    }

    /// The forward: one [`splash_fwd`] stage, `Q, K, V (, segments, sinks) -> Out, Lse`.
    pub fn forward_plan(&self, f: Features) -> Vec<Stage> {
        vec![self.forward_stage(f, true)]
    }

    /// The forward without its `lse` residual, for a forward no backward follows (JAX's
    /// splash with `save_residuals=False`): one [`splash_fwd`] stage, `Q, K, V (, segments,
    /// sinks) -> Out`. Below blocks of 2048 queries it also scales each query block once per
    /// row instead of every key block ([`KernelConfig::queries_scaled_once`]), which only a
    /// forward whose logits no backward recomputes may do (at 2048 it added 0.1-0.3%). By
    /// libtpu 0.0.50.1's bundles (v5p, bf16, causal, H 8, D 128), the two together take
    /// 8.7%, 6.4% and 4.9% off the forward's cycles per core at blocks 512, 1024 and 2048
    /// (S 4096), 7.3%, 4.8% and 2.8% (S 8192): the `lse` row's finalize code and its write
    /// back to HBM are gone.
    pub fn inference_plan(&self, f: Features) -> Vec<Stage> {
        vec![self.forward_stage(f, false)]
    }

    fn forward_stage(&self, f: Features, residuals: bool) -> Stage {
        let info = &self.fwd_info;
        let mut cfg = self.diagonal_config(
            self.config(info, self.block_sizes.block_kv_compute, f),
            info,
            self.block_sizes.diagonal_block(),
        );
        cfg.queries_scaled_once = !residuals && info.block_q < 2048;
        let def = with_float_type!(self.dtype, T => splash_fwd::<T>(cfg));
        let (def, outputs) = if residuals {
            (def, vec![Tensor::Out, Tensor::Lse])
        } else {
            let def = def
                .without("lse")
                .expect("the splash forward declares `lse` optional");
            (def, vec![Tensor::Out])
        };
        let def = with_segments(def, f);
        let mut args = self.tables(info, true);
        args.push(self.sinks(f));
        args.push(self.offsets());
        args.extend([Tensor::Q, Tensor::K, Tensor::V].map(StageArg::Tensor));
        args.extend(self.segments(f));
        args.push(Self::mask_blocks(info));
        Stage {
            def,
            args,
            outputs,
            lowering: self.lowering.clone(),
            active_steps: Some(self.computed_steps(info)),
        }
    }

    /// The backward: preprocessing (`Di`, `DSinks`), then dK/dV and dQ (separate kernels or
    /// the fused kernel and a reduction).
    pub fn backward_plan(&self, f: Features) -> Vec<Stage> {
        let b = self.block_sizes;
        let prep = PrepConfig {
            // Its `lse` and `di` blocks are rows: queries on lanes.
            bq: default_block(self.dims.q_len),
            sinks: f.sinks,
            rows_on_mxu: self.lowering.is_tpu(),
        };
        let prep_def = with_float_type!(self.dtype, T => splash_bwd_prep::<T>(prep));
        let mut stages = vec![Stage {
            def: prep_def,
            args: vec![
                self.sinks(f),
                StageArg::Tensor(Tensor::Out),
                StageArg::Tensor(Tensor::DOut),
                StageArg::Tensor(Tensor::Lse),
            ],
            outputs: vec![Tensor::Di, Tensor::DSinks],
            lowering: self.lowering.clone(),
            active_steps: None,
        }];
        let residuals = [Tensor::Lse, Tensor::DOut, Tensor::Di].map(StageArg::Tensor);
        let info = &self.dkv_info;
        let cfg = self.diagonal_config(
            self.config(info, b.block_kv_dkv_compute, f),
            info,
            b.diagonal_block_dkv(),
        );
        let mut args = self.tables(info, false);
        args.push(self.offsets());
        args.extend([Tensor::Q, Tensor::K, Tensor::V].map(StageArg::Tensor));
        args.extend(self.segments(f));
        args.push(Self::mask_blocks(info));
        args.extend(residuals.clone());
        if b.use_fused_bwd_kernel {
            args.push(StageArg::Zeros(self.tensor_spec(Tensor::DqPartial)));
            let def = with_segments(
                with_float_type!(self.dtype, T => splash_bwd_fused::<T>(cfg)),
                f,
            );
            stages.push(Stage {
                def,
                args,
                outputs: vec![Tensor::DqPartial, Tensor::Dk, Tensor::Dv],
                lowering: self.lowering.clone(),
                active_steps: Some(self.computed_steps(info)),
            });
            let bq = default_block(self.dims.q_len);
            let slots = self.dq_slots();
            let bytes = bq * self.dims.head_dim * self.dtype.size_bytes();
            let reduce = ReduceConfig {
                bq,
                per_step: dq_reduce_per_step(slots, bytes),
                partials: slots,
            };
            let def = with_float_type!(self.dtype, T => splash_dq_reduce::<T>(reduce));
            stages.push(Stage {
                def,
                args: vec![StageArg::Tensor(Tensor::DqPartial)],
                outputs: vec![Tensor::Dq],
                lowering: self.lowering.clone(),
                active_steps: None,
            });
        } else {
            let def = with_segments(with_float_type!(self.dtype, T => splash_dkv::<T>(cfg)), f);
            stages.push(Stage {
                def,
                args,
                outputs: vec![Tensor::Dk, Tensor::Dv],
                lowering: self.lowering.clone(),
                active_steps: Some(self.computed_steps(info)),
            });
            let info = self
                .dq_info
                .as_ref()
                .expect("separate backward has dq tables");
            let cfg = self.diagonal_config(
                self.config(info, b.dq_compute_block(), f),
                info,
                b.diagonal_block_dq(),
            );
            let def = with_segments(with_float_type!(self.dtype, T => splash_dq::<T>(cfg)), f);
            let mut args = self.tables(info, true);
            args.push(self.offsets());
            args.extend([Tensor::Q, Tensor::K, Tensor::V].map(StageArg::Tensor));
            args.extend(self.segments(f));
            args.push(Self::mask_blocks(info));
            args.extend(residuals);
            stages.push(Stage {
                def,
                args,
                outputs: vec![Tensor::Dq],
                lowering: self.lowering.clone(),
                active_steps: Some(self.computed_steps(info)),
            });
        }
        stages
    }

    /// Checks the call's arrays against the configuration; returns the features it uses.
    pub fn check_inputs(&self, x: &Inputs<'_>) -> Result<Features, SplashError> {
        self.dims.check_inputs(self.dtype, x)
    }

    /// Checks the output cotangent `dout` of a backward call: the output's dtype and shape,
    /// finite.
    pub fn check_dout(&self, dout: &HostArray) -> Result<(), SplashError> {
        self.dims.check_output_like("dout", self.dtype, dout)
    }

    /// How many dQ partials the fused backward keeps: one per key block up to
    /// [`ALIASED_READ_DISTANCE`] (3), which key block `j` adds to in turn (`j % slots`), so
    /// that a partial is read back at least 3 grid steps after it was written.
    pub fn dq_slots(&self) -> usize {
        (self.dims.kv_len / self.block_sizes.block_kv_dkv).clamp(1, ALIASED_READ_DISTANCE)
    }

    /// The dtype and shape of a plan tensor (what the kernels of [`Self::forward_plan`] and
    /// [`Self::backward_plan`] take and produce).
    pub fn tensor_spec(&self, t: Tensor) -> ArgSpec {
        let d = self.dims;
        let (b, h, kvh, sq, skv) = (d.batch, d.heads, d.kv_heads, d.q_len, d.kv_len);
        let (dt, f32) = (self.dtype, DType::F32);
        match t {
            Tensor::Q | Tensor::Dq => ArgSpec::new(dt, [b, h, sq, d.head_dim]),
            Tensor::K | Tensor::Dk => ArgSpec::new(dt, [b, kvh, skv, d.head_dim]),
            Tensor::V | Tensor::Dv => ArgSpec::new(dt, [b, kvh, skv, d.head_dim_v]),
            Tensor::Out | Tensor::DOut => ArgSpec::new(dt, [b, h, sq, d.head_dim_v]),
            Tensor::QSegments => ArgSpec::new(DType::I32, [b, 1, sq]),
            Tensor::KvSegments => ArgSpec::new(DType::I32, [b, 1, skv]),
            Tensor::Sinks => ArgSpec::new(f32, [h]),
            Tensor::Lse | Tensor::Di => ArgSpec::new(f32, [b, h, 1, sq]),
            Tensor::DqPartial => ArgSpec::new(dt, [self.dq_slots(), b, h, sq, d.head_dim]),
            Tensor::DSinks => ArgSpec::new(f32, [h, 1, 1]),
        }
    }

    /// The tensors of a call, as the plans name them.
    fn env(&self, x: &Inputs<'_>) -> HashMap<Tensor, HostArray> {
        let d = self.dims;
        let mut env = HashMap::from([
            (Tensor::Q, x.q.clone()),
            (Tensor::K, x.k.clone()),
            (Tensor::V, x.v.clone()),
        ]);
        if let Some(s) = x.segment_ids {
            env.insert(Tensor::QSegments, reshape(s.q, &[d.batch, 1, d.q_len]));
            env.insert(Tensor::KvSegments, reshape(s.kv, &[d.batch, 1, d.kv_len]));
        }
        if let Some(s) = x.sinks {
            env.insert(Tensor::Sinks, s.clone());
        }
        env
    }

    /// Runs the forward on `exec`.
    pub fn forward(&self, exec: &dyn Executor, x: &Inputs<'_>) -> Result<Forward, SplashError> {
        let f = self.check_inputs(x)?;
        let mut env = self.env(x);
        run_plan(&self.forward_plan(f), exec, self.rules(), &mut env)?;
        let d = self.dims;
        Ok(Forward {
            out: take(&mut env, Tensor::Out)?,
            lse: reshape(&take(&mut env, Tensor::Lse)?, &[d.batch, d.heads, d.q_len]),
        })
    }

    /// Runs the forward without its residual on `exec` ([`Self::inference_plan`]): `out`
    /// alone, for a forward no backward follows.
    pub fn inference(&self, exec: &dyn Executor, x: &Inputs<'_>) -> Result<HostArray, SplashError> {
        let f = self.check_inputs(x)?;
        let mut env = self.env(x);
        run_plan(&self.inference_plan(f), exec, self.rules(), &mut env)?;
        take(&mut env, Tensor::Out)
    }

    /// Runs the backward on `exec`: the gradients of `sum(out * dout)` given the forward's
    /// results.
    pub fn backward(
        &self,
        exec: &dyn Executor,
        x: &Inputs<'_>,
        fwd: &Forward,
        dout: &HostArray,
    ) -> Result<Grads, SplashError> {
        let f = self.check_inputs(x)?;
        self.check_dout(dout)?;
        let d = self.dims;
        let mut env = self.env(x);
        env.insert(Tensor::Out, fwd.out.clone());
        env.insert(
            Tensor::Lse,
            reshape(&fwd.lse, &[d.batch, d.heads, 1, d.q_len]),
        );
        env.insert(Tensor::DOut, dout.clone());
        run_plan(&self.backward_plan(f), exec, self.rules(), &mut env)?;
        let dsinks = take(&mut env, Tensor::DSinks)?;
        Ok(Grads {
            dq: take(&mut env, Tensor::Dq)?,
            dk: take(&mut env, Tensor::Dk)?,
            dv: take(&mut env, Tensor::Dv)?,
            dsinks: f.sinks.then(|| reshape(&dsinks, &[d.heads])),
        })
    }
}

/// Runs `stages` in order on host arrays, reading and writing `env`.
pub fn run_plan(
    stages: &[Stage],
    exec: &dyn Executor,
    rules: &KernelRules,
    env: &mut HashMap<Tensor, HostArray>,
) -> Result<(), SplashError> {
    for stage in stages {
        let args = stage
            .args
            .iter()
            .map(|a| match a {
                StageArg::Const(c) => Ok(c.clone()),
                StageArg::Tensor(t) => env.get(t).cloned().ok_or_else(|| {
                    SplashError::Internal(PlanBug::NotYetProduced {
                        kernel: stage.def.name().to_string(),
                        tensor: *t,
                    })
                }),
                StageArg::PerShard(_) => Err(SplashError::Internal(PlanBug::PerShardOnOneDevice {
                    kernel: stage.def.name().to_string(),
                })),
                StageArg::Zeros(spec) => Ok(HostArray::zeros(spec.dtype, spec.shape.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let outs = exec.run(&stage.def, &args, rules)?;
        if outs.len() != stage.outputs.len() {
            return Err(SplashError::Internal(PlanBug::OutputCount {
                kernel: stage.def.name().to_string(),
                returned: outs.len(),
                expected: stage.outputs.len(),
            }));
        }
        env.extend(stage.outputs.iter().copied().zip(outs));
    }
    Ok(())
}

/// The argument specs of a stage, given the specs of the tensors it reads.
pub fn stage_specs(stage: &Stage, tensor: impl Fn(Tensor) -> ArgSpec) -> Vec<ArgSpec> {
    stage
        .args
        .iter()
        .map(|a| match a {
            StageArg::Const(c) => ArgSpec::of(c),
            StageArg::Tensor(t) => tensor(*t),
            StageArg::PerShard(shards) => ArgSpec::of(&shards[0]),
            StageArg::Zeros(spec) => spec.clone(),
        })
        .collect()
}

fn take(env: &mut HashMap<Tensor, HostArray>, t: Tensor) -> Result<HostArray, SplashError> {
    env.remove(&t).ok_or_else(|| {
        SplashError::Internal(PlanBug::Missing {
            tensor: t,
            place: MissingIn::Stages,
        })
    })
}

fn host_i32(shape: &[usize], v: Vec<i32>) -> HostArray {
    HostArray::i32(shape.to_vec(), v).expect("table sizes match their shape")
}

/// `a` with another shape of the same size.
pub fn reshape(a: &HostArray, shape: &[usize]) -> HostArray {
    HostArray::new(shape.to_vec(), a.data().clone()).expect("reshape keeps the element count")
}

fn check_finite(name: &str, a: &HostArray) -> Result<(), SplashError> {
    let bad = match a.data() {
        tessera_dsl::array::ArrayData::F32(v) => v.iter().position(|x| !x.is_finite()),
        tessera_dsl::array::ArrayData::BF16(v) => v.iter().position(|x| !x.is_finite()),
        _ => None,
    };
    match bad {
        Some(i) => Err(SplashError::Shape(InputError::NonFinite {
            name: name.to_string(),
            value: a.to_f64_vec()[i],
            index: i,
        })),
        None => Ok(()),
    }
}

/// Input bytes one step of the dQ reduction reads at most (its block of dQ partials,
/// double-buffered in VMEM like any input block).
const DQ_REDUCE_STEP_BYTES: usize = 512 * 1024;

/// How many of `partials` dQ partials (of `bytes` each) the reduction sums per step: the most
/// that divide them and fit [`DQ_REDUCE_STEP_BYTES`], at least one. The fused backward's 3
/// partials of 128 KiB (512 rows, D 128, bf16) take one step (1.0 MiB of scoped VMEM). With a
/// partial per key block (S 8192, blocks 512: 16) one a step took 193,220 cycles per core on
/// v5p, four a step 39,240.
fn dq_reduce_per_step(partials: usize, bytes: usize) -> usize {
    (1..=partials)
        .rev()
        .find(|&n| partials % n == 0 && n * bytes <= DQ_REDUCE_STEP_BYTES)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::dq_reduce_per_step;

    #[test]
    fn the_dq_reduction_sums_the_most_partials_that_divide_them_and_fit() {
        const KIB: usize = 1024;
        assert_eq!(dq_reduce_per_step(8, 128 * KIB), 4);
        assert_eq!(dq_reduce_per_step(16, 128 * KIB), 4);
        assert_eq!(dq_reduce_per_step(6, 128 * KIB), 3);
        assert_eq!(dq_reduce_per_step(2, 64 * KIB), 2);
        assert_eq!(dq_reduce_per_step(4, 1024 * KIB), 1);
    }
}
