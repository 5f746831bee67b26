//! `tessera tune --target tpu:v5p:2x2x1`: a handful of splash and matmul candidates compiled
//! by libtpu, ranked by cycles per core, cached on disk (a second run compiles nothing).

mod common;
use common::tessera;
use serde_json::Value;

/// Runs `tessera tune ARGS`, which must succeed: its JSON last line and stdout.
fn tune(args: &[&str]) -> (Value, String) {
    let mut all = vec!["tune", "--target", "tpu:v5p:2x2x1"];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = tessera(&all);
    assert!(ok, "{args:?}: {stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let report = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (report, stdout)
}

fn cycles(c: &Value, key: &str) -> u64 {
    c["cost"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {c}"))
}

#[test]
fn attention_blocks_are_ranked_by_cycles_and_cached() {
    let args = [
        "--max-block",
        "256",
        "attention",
        "--heads",
        "2",
        "--seq-len",
        "512",
        "--head-dim",
        "128",
    ];
    let mut fresh = vec!["--no-cache"];
    fresh.extend_from_slice(&args);
    let (report, stdout) = tune(&fresh);
    let candidates = report["candidates"].as_array().unwrap();
    // 128 and 256 for each of q and kv.
    assert_eq!(candidates.len(), 4, "{stdout}");
    assert!(stdout.contains("4 compiled now"), "{stdout}");
    let best = |key: &str| {
        candidates
            .iter()
            .min_by_key(|c| cycles(c, key))
            .map(|c| c["blocks"].as_str().unwrap().to_string())
            .unwrap()
    };
    let fwd = format!(
        "bq={} bkv={}",
        report["block_q"].as_u64().unwrap(),
        report["block_kv"].as_u64().unwrap()
    );
    let bwd = format!(
        "bq={} bkv={}",
        report["block_q_dkv"].as_u64().unwrap(),
        report["block_kv_dkv"].as_u64().unwrap()
    );
    assert_eq!(fwd, best("fwd_cycles"), "{stdout}");
    assert_eq!(bwd, best("bwd_cycles"), "{stdout}");
    assert!(stdout.contains("choice: --sa-block-q"), "{stdout}");
    for c in candidates {
        assert!(
            cycles(c, "fwd_cycles") > 0 && cycles(c, "bwd_cycles") > 0,
            "{c}"
        );
    }
    // The same tune again: every candidate from the cache, the same figures.
    let (again, stdout) = tune(&args);
    assert!(stdout.contains("0 compiled now"), "{stdout}");
    assert_eq!(again, report);
}

#[test]
fn matmul_blocks_are_tuned() {
    let (report, stdout) = tune(&[
        "--no-cache",
        "--max-block",
        "256",
        "kernel",
        "matmul",
        "-p",
        "M=256",
        "-p",
        "N=256",
        "-p",
        "K=256",
        "-p",
        "dtype=bf16",
        "--tune",
        "BN",
        "--tune",
        "BK",
    ]);
    let candidates = report["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 4, "{stdout}");
    let best = candidates
        .iter()
        .min_by_key(|c| cycles(c, "fwd_cycles"))
        .unwrap();
    assert_eq!(report["choice"], best["params"], "{stdout}");
}
