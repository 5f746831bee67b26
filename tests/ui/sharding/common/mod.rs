//! The context-parallel configuration the `tessera_parallel::local_splash` cases build their
//! kernels from: 4 heads of 64 over a causal sequence of 256, on 2 devices.

use tessera_dsl::{DType, Lowering};
use tessera_parallel::{ContextParallel, Strategy};
use tessera_splash::{BlockSizes, Dims, Mask};

/// The global `[B, H, S, D]` of q, k and v.
pub const DIMS: [i64; 4] = [1, 4, 256, 64];

pub fn config(strategy: impl Into<Strategy>) -> ContextParallel {
    ContextParallel {
        dims: Dims {
            batch: 1,
            heads: 4,
            kv_heads: 4,
            q_len: 256,
            kv_len: 256,
            head_dim: 64,
            head_dim_v: 64,
        },
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(64, 64),
        options: Default::default(),
        strategy: strategy.into(),
        devices: 2,
        load_balance: false,
        lowering: Lowering::portable(),
    }
}
