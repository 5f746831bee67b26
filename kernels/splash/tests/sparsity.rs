//! Block sparsity at the benchmark's size (S = 4096), through the block counters: causal
//! computes about half the key blocks of a full mask, local windows far fewer, and the
//! tables walk only non-empty blocks.

use tessera_dsl::{DType, KernelRules};
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
        KernelRules::tpu(),
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
    // Each query block sees its own key block and the previous one: the forward's compacted
    // grid walks those 15 blocks in one row.
    let fwd = a.fwd_mask_info();
    assert_eq!((fwd.rows, fwd.width), (1, 2 * 8 - 1));
    assert_eq!(a.stats().computed(), 8 * (2 * 8 - 1));
    // The fused backward keeps a slot per query block (every dq partial is written) ...
    assert_eq!(a.dkv_mask_info().width, 8);
    // ... the separate dK/dV kernel walks only the non-empty ones, and dQ's grid is
    // compacted as the forward's.
    let dims = a.dims();
    let sep = SplashAttention::new(
        Mask::local(256, 0),
        dims,
        DType::F32,
        BlockSizes::uniform(512, 512),
        Default::default(),
        KernelRules::tpu(),
    )
    .unwrap();
    assert_eq!(sep.dkv_mask_info().width, 2);
    let dq = sep.dq_mask_info().unwrap();
    assert_eq!((dq.rows, dq.width), (1, 2 * 8 - 1));
}

/// The `flops` of every `tpu_custom_call`'s cost estimate in a module's text.
fn custom_call_flops(text: &str) -> Vec<u64> {
    text.match_indices("flops")
        .map(|(i, _)| {
            let digits: String = text[i..]
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(|c| c.is_ascii_digit())
                .collect();
            digits.parse().unwrap()
        })
        .collect()
}

#[test]
fn mosaic_cost_estimates_count_each_computed_block_once() {
    use std::collections::HashMap;
    use tessera_dsl::Lowering;
    use tessera_hlo::{Module, TensorType};
    use tessera_splash::{lower_stages, Features, Tensor};

    let (n, d) = (8, 128);
    let dims = Dims {
        batch: 1,
        heads: 2,
        kv_heads: 2,
        q_len: 128 * n,
        kv_len: 128 * n,
        head_dim: d,
        head_dim_v: d,
    };
    for (mask, computed) in [
        (Mask::Full, 2 * n * n),
        (Mask::causal(), 2 * n * (n + 1) / 2),
    ] {
        let a = SplashAttention::new(
            mask,
            dims,
            DType::BF16,
            BlockSizes::uniform(128, 128),
            Default::default(),
            Lowering::tpu(),
        )
        .unwrap();
        let plan = a.forward_plan(Features::default());
        assert_eq!(plan[0].active_steps, Some(computed as u64));
        let mut m = Module::new("cost");
        let mut f = m.func("main");
        let qkv = TensorType::new([1, 2, 128 * n as i64, d as i64], DType::BF16);
        let mut env = HashMap::new();
        for t in [Tensor::Q, Tensor::K, Tensor::V] {
            env.insert(t, f.arg(qkv.clone()).unwrap());
        }
        lower_stages(&mut f, &plan, &mut env).unwrap();
        let out = [env[&Tensor::Out], env[&Tensor::Lse]];
        f.finish(&out).unwrap();
        let flops = custom_call_flops(&m.to_mlir());
        assert_eq!(flops.len(), 1, "{flops:?}");
        // Each computed block: q k^T and p v, 2 x 2 x 128^2 x 128, plus the softmax's
        // elementwise work; the full and masked branches of a step count once, the steps of
        // skipped blocks not at all.
        let matmuls = (computed * 4 * 128 * 128 * d) as u64;
        assert!(
            flops[0] >= matmuls && flops[0] < matmuls * 3 / 2,
            "{} flops for {matmuls} of matmuls",
            flops[0]
        );
    }
}
