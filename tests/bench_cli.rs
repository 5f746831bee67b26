//! `tessera bench kernels` and `tessera bench attention` at small sizes: every registered
//! kernel is measured against XLA's own dot (and against XLA's own program for the same
//! computation where the registry has one, and without its run-time checks where it makes
//! any), the JSON line comes last with the fields the bench promises, and `--profile` times
//! every kernel call.

use std::process::Command;

use tessera::registry::KERNELS;

/// Runs `tessera bench ARGS`; returns its stdout (panics on failure, with stderr).
fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tessera bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The number after `"key":` in `json` (its first occurrence).
fn number(json: &str, key: &str) -> f64 {
    let pattern = format!("\"{key}\":");
    let at = json
        .find(&pattern)
        .unwrap_or_else(|| panic!("no `{key}` in {json}"))
        + pattern.len();
    let rest = &json[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("`{key}` is not a number in {json}"))
}

fn last_line(stdout: &str) -> &str {
    let line = stdout.lines().last().expect("some output");
    assert!(
        line.starts_with('{') && line.ends_with('}'),
        "the last line is the JSON summary: {line}"
    );
    line
}

#[test]
fn bench_kernels_measures_every_registered_kernel_against_the_peak() {
    let out = bench(&[
        "kernels",
        "--matmul-size",
        "256",
        "--matmul-block",
        "128",
        "--seq",
        "256",
        "--heads",
        "2",
        "--block",
        "128",
        "--flash-block",
        "64",
        "--softmax-block",
        "8",
        "--kv-pages",
        "8",
        "--collective-size",
        "512",
        "--reps",
        "1",
        "--unchecked-too",
    ]);
    let json = last_line(&out);
    for peak in ["matmul_peak_gflops", "matmul_peak_bf16_gflops"] {
        assert!(number(json, peak) > 0.0, "{peak} in {json}");
    }
    // The peak runs before and after the work in every repetition; its slowest run over its
    // best is the spread (at least 1), printed with both.
    for spread in ["matmul_peak_spread", "matmul_peak_bf16_spread"] {
        assert!(number(json, spread) >= 1.0, "{spread} in {json}");
    }
    assert!(
        out.contains("the peak, xla dot f32: best")
            && out.contains("runs before and after the work"),
        "{out}"
    );
    // One entry's fields, `{...}`.
    let entry = |name: &str| -> &str {
        let key = format!("\"{name}\":{{");
        let at = json
            .find(&key)
            .unwrap_or_else(|| panic!("`{name}` missing from {json}"));
        let fields = &json[at + key.len()..];
        &fields[..fields.find('}').expect("a closing brace")]
    };
    for k in KERNELS {
        let fields = entry(k.name);
        assert!(number(fields, "best_s") > 0.0, "{}: {fields}", k.name);
        // The kernels that only move data have no GFLOP/s.
        let moves_data = [
            "cache_update",
            "gather_tiles",
            "ring_shift",
            "ring_all_gather",
            "all_gather",
            "all_to_all",
        ];
        if !moves_data.contains(&k.name) {
            assert!(number(fields, "gflops") > 0.0, "{}: {fields}", k.name);
            assert!(number(fields, "fraction_of_peak") > 0.0, "{}", k.name);
        }
    }
    // XLA's own program beside the kernels the registry has one for, timed in the same run,
    // and the kernel's time over it.
    for k in [
        "paged_attention",
        "ring_shift",
        "ring_all_gather",
        "all_gather",
        "all_to_all",
        "all_gather_matmul",
        "ulysses_attention",
    ] {
        assert!(number(entry(k), "over_xla") > 0.0, "{k}: {json}");
        assert!(number(entry(&format!("xla_{k}")), "best_s") > 0.0, "{k}");
    }
    assert!(out.contains("x XLA's time"), "{out}");
    // `--unchecked-too`: the kernels that check indices at run time again without the
    // checks, in the same run, with the checked time over the unchecked one; none for a
    // kernel whose indices are all proven.
    for k in ["paged_attention", "cache_update", "gather_tiles"] {
        let unchecked = entry(&format!("{k}_unchecked"));
        assert!(number(unchecked, "over_checked") > 0.0, "{k}: {json}");
    }
    for k in ["matmul", "ring_shift", "splash_fwd"] {
        assert!(!json.contains(&format!("\"{k}_unchecked\"")), "{k}: {json}");
    }
    assert!(
        out.contains("run-time checks off") && out.contains("the checks cost"),
        "{out}"
    );
    for dense in ["dense_attention_fwd", "dense_attention_fwdbwd"] {
        assert!(
            json.contains(&format!("\"{dense}\":{{")),
            "{dense} in {json}"
        );
    }
}

#[test]
fn bench_attention_reports_fractions_of_the_peak_and_a_profile() {
    let out = bench(&[
        "attention",
        "--heads",
        "2",
        "--seq",
        "256",
        "--block-q",
        "128",
        "--block-kv",
        "128",
        "--peak-size",
        "256",
        "--reps",
        "1",
        "--profile",
    ]);
    let json = last_line(&out);
    for key in [
        "fwd_speedup",
        "fwdbwd_speedup",
        "max_abs_diff",
        "kv_blocks_computed",
        "kv_blocks_total",
        "matmul_peak_gflops",
        "matmul_peak_bf16_gflops",
        "fwd_fraction_of_peak",
        "fwdbwd_fraction_of_peak",
    ] {
        assert!(number(json, key) >= 0.0, "{key} in {json}");
    }
    assert!(number(json, "fwd_fraction_of_peak") > 0.0);
    assert!(number(json, "matmul_peak_spread") >= 1.0, "{json}");
    // The profile times every kernel call of forward + backward (fused backward).
    for call in [
        "splash_fwd",
        "splash_bwd_prep",
        "splash_bwd_fused",
        "splash_dq_reduce",
    ] {
        let at = json.find("\"profile\":{").expect("a profile") + 10;
        assert!(number(&json[at..], call) > 0.0, "{call} in {json}");
    }
    assert!(out.contains("sum of the calls"), "{out}");
}
