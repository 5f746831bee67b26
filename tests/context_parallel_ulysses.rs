//! Ulysses context parallelism on U CPU devices gives the single-device splash results,
//! forward and backward, for MHA and GQA (including fewer KV heads than devices).

mod common;

use common::{assert_close, random};
use tessera::context_parallel::Ulysses;
use tessera::dsl::{DType, HostArray, TargetRules};
use tessera::splash::{
    BlockSizes, Dims, Inputs, Interpreter, Mask, SplashAttention, SplashOptions,
};

fn dims(heads: usize, kv_heads: usize, seq: usize) -> Dims {
    Dims {
        batch: 1,
        heads,
        kv_heads,
        q_len: seq,
        kv_len: seq,
        head_dim: 64,
        head_dim_v: 64,
    }
}

/// Runs Ulysses on `degree` devices and the single-device splash on the interpreter, and
/// compares outputs, lse and gradients.
fn check(heads: usize, kv_heads: usize, degree: usize, mask: Mask) {
    let seq = 256;
    let d = dims(heads, kv_heads, seq);
    let q = random(DType::F32, &[1, heads, seq, 64], 1);
    let k = random(DType::F32, &[1, kv_heads, seq, 64], 2);
    let v = random(DType::F32, &[1, kv_heads, seq, 64], 3);
    let dout = random(DType::F32, &[1, heads, seq, 64], 4);
    let blocks = BlockSizes::uniform(128, 128);

    let single = SplashAttention::new(
        mask.clone(),
        d,
        DType::F32,
        blocks,
        SplashOptions::default(),
        TargetRules::tpu(),
    )
    .unwrap();
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: None,
        sinks: None,
    };
    let fwd = single.forward(&Interpreter, &x).unwrap();
    let grads = single.backward(&Interpreter, &x, &fwd, &dout).unwrap();

    let u = Ulysses {
        dims: d,
        dtype: DType::F32,
        mask,
        block_sizes: blocks,
        degree,
    };
    let what = format!("H={heads} KVH={kv_heads} U={degree}");
    let (out, lse) = u
        .forward(&q, &k, &v)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_close(
        &out.to_f64_vec(),
        &fwd.out.to_f64_vec(),
        2e-4,
        &format!("{what}: out"),
    );
    assert_close(
        &lse.to_f64_vec(),
        &fwd.lse.to_f64_vec(),
        2e-4,
        &format!("{what}: lse"),
    );
    let (dq, dk, dv) = u
        .backward(&q, &k, &v, &out, &lse, &dout)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for (name, got, want) in [
        ("dq", &dq, &grads.dq),
        ("dk", &dk, &grads.dk),
        ("dv", &dv, &grads.dv),
    ] {
        let scale = want.to_f64_vec().iter().fold(0f64, |m, x| m.max(x.abs()));
        assert_eq!(got.shape(), want.shape(), "{what}: {name} shape");
        assert_close(
            &got.to_f64_vec(),
            &want.to_f64_vec(),
            1e-3 * scale,
            &format!("{what}: {name}"),
        );
    }
}

#[test]
fn ulysses_mha_causal_on_4_devices() {
    check(8, 8, 4, Mask::causal());
}

#[test]
fn ulysses_gqa_with_fewer_kv_heads_than_devices() {
    // 2 KV heads on 4 devices: each KV head is replicated twice before the all-to-all.
    check(8, 2, 4, Mask::causal());
    let u = Ulysses {
        dims: dims(8, 2, 256),
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(128, 128),
        degree: 4,
    };
    let s = u.stats();
    assert_eq!((s.kv_replication, s.kv_heads_per_device), (2, 1));
}

#[test]
fn ulysses_local_window_on_2_devices() {
    check(4, 4, 2, Mask::local(64, 0));
}

#[test]
fn ulysses_kv_bytes_per_device_are_one_over_u() {
    let base = |degree| Ulysses {
        dims: dims(32, 32, 4096),
        dtype: DType::BF16,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(512, 512),
        degree,
    };
    let full = 32 * 4096 * 128 * 2;
    assert_eq!(
        base(16).stats().kv_bytes_per_device,
        full / 16,
        "2 of 32 heads per device"
    );
}

#[test]
fn invalid_degrees_are_named() {
    let u = Ulysses {
        dims: dims(6, 6, 256),
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(128, 128),
        degree: 4,
    };
    let e = u.validate().unwrap_err().to_string();
    assert!(
        e.contains("6 query heads are not divisible by the context degree 4"),
        "{e}"
    );
    let q = HostArray::zeros(DType::F32, [1, 6, 256, 64]);
    assert!(u.forward(&q, &q, &q).is_err());
}

#[test]
fn ulysses_programs_move_data_with_all_to_alls_only() {
    let u = Ulysses {
        dims: dims(8, 8, 256),
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(128, 128),
        degree: 4,
    };
    let count = |text: &str, op: &str| text.matches(&format!("\"stablehlo.{op}\"")).count();
    let fwd = u.forward_program().unwrap().to_mlir();
    // q, k, v in; out and lse back.
    assert_eq!(count(&fwd, "all_to_all"), 5, "{fwd}");
    assert_eq!(count(&fwd, "all_gather"), 0);
    assert_eq!(count(&fwd, "collective_permute"), 0);
    let bwd = u.backward_program().unwrap().to_mlir();
    // q, k, v, out, lse, dout in; dq, dk, dv back.
    assert_eq!(count(&bwd, "all_to_all"), 9);
    assert_eq!(count(&bwd, "all_gather"), 0);
    assert_eq!(count(&bwd, "collective_permute"), 0);
}
