//! Block sparsity at the benchmark's size (S = 4096), through the block counters: causal
//! computes about half the key blocks of a full mask, local windows far fewer, and the
//! tables walk only non-empty blocks.

use tessera_dsl::{DType, TargetRules};
use tessera_splash::{BlockSizes, Dims, Mask, SplashAttention};

fn attention(mask: Mask, block: usize) -> SplashAttention {
    let dims = Dims {
        batch: 1,
        heads: 8,
        kv_heads: 8,
        q_len: 4096,
        kv_len: 4096,
        head_dim: 64,
        head_dim_v: 64,
    };
    SplashAttention::new(
        mask,
        dims,
        DType::F32,
        BlockSizes::uniform(block, block).with_fused_bwd(true),
        Default::default(),
        TargetRules::tpu(),
    )
    .unwrap()
}

#[test]
fn causal_computes_about_half_the_blocks_of_full() {
    for block in [128, 512] {
        let n = 4096 / block;
        let full = attention(Mask::Full, block).stats();
        let causal = attention(Mask::causal(), block).stats();
        assert_eq!(full.computed(), 8 * n * n);
        assert_eq!((full.partial, full.empty), (0, 0));
        assert_eq!(causal.computed(), 8 * n * (n + 1) / 2);
        assert_eq!(
            causal.partial,
            8 * n,
            "only diagonal blocks evaluate the mask"
        );
        assert_eq!(causal.empty, 8 * n * (n - 1) / 2);
        let ratio = causal.computed() as f64 / full.computed() as f64;
        assert!((0.5..0.57).contains(&ratio), "block {block}: ratio {ratio}");
    }
}

#[test]
fn local_windows_shrink_every_kernel_grid() {
    let a = attention(Mask::local(256, 0), 512);
    // Each query block sees its own key block and the previous one.
    assert_eq!(a.fwd_mask_info().width, 2);
    assert_eq!(a.stats().computed(), 8 * (2 * 8 - 1));
    // The fused backward keeps a slot per query block (every dq partial is written) ...
    assert_eq!(a.dkv_mask_info().width, 8);
    // ... the separate dK/dV kernel walks only the non-empty ones.
    let dims = a.dims();
    let sep = SplashAttention::new(
        Mask::local(256, 0),
        dims,
        DType::F32,
        BlockSizes::uniform(512, 512),
        Default::default(),
        TargetRules::tpu(),
    )
    .unwrap();
    assert_eq!(sep.dkv_mask_info().width, 2);
    assert_eq!(sep.dq_mask_info().unwrap().width, 2);
}
