//! tessera-splash: splash (sparse flash) attention written as tessera kernels.
//!
//! Splash attention is JAX's block-sparse flash attention for TPU
//! (`jax.experimental.pallas.ops.tpu.splash_attention`): an online-softmax forward that also
//! returns the logsumexp, and a backward as separate dQ and dK/dV kernels or one fused kernel,
//! over masks whose empty blocks are never computed. Here every kernel is a `#[tpu_kernel]`
//! Rust function, so the same definitions run on the tessera interpreter, as StableHLO on any
//! PJRT backend, and (through Mosaic) on TPU.
//!
//! ```
//! use tessera_backend::Backend;
//! use tessera_dsl::{DType, HostArray, KernelRules};
//! use tessera_splash::{BlockSizes, Dims, Inputs, Mask, SplashAttention};
//!
//! let dims = Dims { batch: 1, heads: 2, kv_heads: 1, q_len: 256, kv_len: 256,
//!                   head_dim: 64, head_dim_v: 64 };
//! let attn = SplashAttention::new(Mask::causal(), dims, DType::F32,
//!                                 BlockSizes::uniform(128, 128), Default::default(),
//!                                 KernelRules::tpu())?;
//! // Causal: 3 of the 4 key blocks of each head are computed, 1 is skipped.
//! assert_eq!((attn.stats().computed(), attn.stats().empty), (6, 2));
//! let q = HostArray::zeros(DType::F32, [1, 2, 256, 64]);
//! let kv = HostArray::zeros(DType::F32, [1, 1, 256, 64]);
//! let x = Inputs::new(&q, &kv, &kv);
//! let fwd = attn.forward(&Backend::Interpret, &x)?;
//! assert_eq!(fwd.lse.shape(), &[1, 2, 256]);
//! # Ok::<(), tessera_splash::SplashError>(())
//! ```
//!
//! - [`Mask`] / [`MultiHeadMask`]: full, causal (with offset), local windows, chunked causal,
//!   dense masks and their `and`/`or`, shared or per head; positions are global
//!   ([`SeqOffsets`]) so sequence shards attend correctly.
//! - [`MaskInfo`]: the block classification (empty / partial / full) and the next-block
//!   tables the kernels read from scalar prefetch.
//! - [`BlockSizes`]: JAX's block sizes, validated against the sequence and TPU tiling.
//! - [`SplashAttention`]: forward (`out`, `lse`) and backward (`dq`, `dk`, `dv`, `dsinks`)
//!   as plans of kernel [`Stage`]s run by an [`Executor`] or lowered into larger programs.
//! - [`reference`](mod@reference): a dense float64 reference for the forward and the gradients.

mod attention;
mod block_sizes;
mod error;
mod flops;
pub mod kernels;
mod mask;
mod mask_info;
pub mod program;
pub mod reference;
pub mod registry;
mod sharded;

pub use attention::{
    reshape, run_plan, stage_specs, Dims, Executor, Features, Forward, Grads, Inputs, SegmentIds,
    SplashAttention, SplashOptions, Stage, StageArg, Tensor, DEFAULT_MASK_VALUE,
};
pub use block_sizes::{
    default_block, default_diagonal_block, default_dkv_diagonal_block, default_dq_compute_block,
    default_dq_diagonal_block, BlockSizes, MAX_DEFAULT_BLOCK, NUM_LANES,
};
pub use error::{
    BlockProblem, BlockSizeError, BlockSizeReason, BoxedError, InputError, MaskError,
    MaskParseError, MissingIn, OptionsError, PlanBug, SplashError,
};
pub use mask::{BlockKind, DenseMask, Mask, MaskExpr, MultiHeadMask, SeqOffsets, MAX_POSITION};
pub use mask_info::{
    BlockStats, KernelMask, Major, MaskInfo, DIAGONAL, MAX_COMPUTED_MASK_CLASSES, ROW_FIRST,
    ROW_LAST,
};
pub use program::{
    dense_program, lower_forward_on_shard, lower_stages, lower_stages_on_shard, splash_program,
    Pass,
};
pub use sharded::ShardedSplash;
