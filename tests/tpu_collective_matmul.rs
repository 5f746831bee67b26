//! `tessera compile train --collective-matmul`: the fsdp train step with the all-gather
//! matmul kernel (one Mosaic `tpu_custom_call` per device and weight matmul) compiled by
//! libtpu for v5p:2x2x1, and the dims its Mosaic kernel cannot copy refused in one sentence
//! before anything is built.

mod common;
use common::tessera;
use serde_json::Value;

/// `tessera compile --target tpu:v5p:2x2x1 train --ici-fsdp-parallelism 4
/// --ici-context-parallelism 1 --collective-matmul` with `dims`: success, stdout, stderr.
fn compile(dims: &[&str]) -> (bool, String, String) {
    let mut args = vec![
        "compile",
        "--target",
        "tpu:v5p:2x2x1",
        "train",
        "--ici-fsdp-parallelism",
        "4",
        "--ici-context-parallelism",
        "1",
        "--collective-matmul",
        "--no-step-estimate",
    ];
    args.extend_from_slice(dims);
    tessera(&args)
}

/// Dims whose weight shards are whole 128-lane tiles on every device: d_model 512 and
/// heads x head_dim 512 (128 rows a device), mlp_dim 1024, KV heads 2 x 128.
#[test]
fn the_fsdp_step_with_the_collective_matmul_compiles_for_v5p() {
    let (ok, stdout, stderr) = compile(&[
        "--layers",
        "2",
        "--d-model",
        "512",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "128",
        "--mlp-dim",
        "1024",
    ]);
    assert!(ok, "{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let kernels: Vec<&str> = report["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(kernels.contains(&"all_gather_matmul"), "{report}");
    assert!(
        report["scoped_vmem_bytes"]["all_gather_matmul"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{report}"
    );
    assert_eq!(report["fits_hbm"], Value::Bool(true));
}

/// The tiny model's weights split four ways leave 32 rows a device.
#[test]
fn tiny_dims_are_refused_with_the_tile_rule() {
    let (ok, _, stderr) = compile(&[]);
    assert!(!ok);
    assert!(
        stderr.contains(
            "--collective-matmul on TPU copies the weight shards in whole 128-lane tiles, but \
             the --d-model rows (128) over 4 fsdp devices are 32 a device, not a multiple of \
             128; use dims whose shards are multiples of 128, or leave it out"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
