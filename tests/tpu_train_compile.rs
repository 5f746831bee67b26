//! `tessera compile train`: the tiny model's whole train step compiled by libtpu for
//! v5p:2x2x1 with each context-parallel strategy, its report checked; and the refusals that
//! come before any compile.

mod common;
use common::tessera;
use serde_json::Value;
use std::collections::BTreeSet;

/// Runs `tessera compile --target tpu:TOPOLOGY train ARGS`: success, stdout, stderr.
fn compile_train(topology: &str, args: &[&str]) -> (bool, String, String) {
    let target = format!("tpu:{topology}");
    let mut all = vec!["compile", "--target", &target, "train"];
    all.extend_from_slice(args);
    tessera(&all)
}

/// Runs `compile_train`, which must succeed: the report (the JSON last line) and stdout.
fn compiled(topology: &str, args: &[&str]) -> (Value, String) {
    let (ok, stdout, stderr) = compile_train(topology, args);
    assert!(ok, "{args:?}: {stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let report = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (report, stdout)
}

/// The names of the kernels a compile report lists.
fn kernel_names(report: &Value) -> BTreeSet<String> {
    let names = report["kernels"].as_array().unwrap().iter();
    names.map(|k| k.as_str().unwrap().to_string()).collect()
}

fn int(report: &Value, key: &str) -> i64 {
    report[key]
        .as_i64()
        .unwrap_or_else(|| panic!("`{key}` is not an integer in {report}"))
}

/// The tiny model (2 layers) on data 1 x context 4, its weights replicated
/// (`--shard-weights-over-context=false`): compiles with splash's kernels, and its last line
/// is the report, with the strategy's `collective`.
fn tiny_step(strategy: &str, collective: &str) {
    let report = tiny_step_with(strategy, &SPLASH);
    let moved = &report["collectives"][collective];
    assert!(
        moved["calls"].as_u64().is_some_and(|n| n >= 2)
            && moved["bytes_per_device"].as_u64() > Some(0),
        "{strategy}: no {collective} in {report}"
    );
}

/// The kernels of a step that attends with splash.
const SPLASH: [&str; 4] = ["splash_fwd", "splash_bwd_prep", "splash_dkv", "splash_dq"];

/// The tiny model's flags (2 layers, context 4) with `strategy`.
fn tiny_args(strategy: &str) -> Vec<&str> {
    vec![
        "--model",
        "tiny",
        "--layers",
        "2",
        "--ici-context-parallelism",
        "4",
        "--context-parallel-strategy",
        strategy,
    ]
}

/// [`tiny_step`] of a strategy whose attention runs `expected` kernels: the report.
fn tiny_step_with(strategy: &str, expected: &[&str]) -> Value {
    let mut args = tiny_args(strategy);
    args.push("--shard-weights-over-context=false");
    let (report, stdout) = compiled("v5p:2x2x1", &args);
    let kernels = kernel_names(&report);
    for kernel in expected {
        assert!(kernels.contains(*kernel), "{strategy}: {kernels:?}");
    }
    let [args, outs, temp, alias] = [
        "argument_bytes",
        "output_bytes",
        "temp_bytes",
        "alias_bytes",
    ]
    .map(|k| int(&report, k));
    assert_eq!(int(&report, "per_device_bytes"), args + outs + temp - alias);
    // Without fsdp every device holds the f32 parameters and both moments, all donated: the
    // aliased bytes are exactly 12 bytes a parameter (tiny: 459,392 parameters).
    assert_eq!(int(&report, "params"), 459_392);
    assert_eq!(alias, 12 * 459_392, "{report}");
    assert!(args > alias && outs >= alias, "{report}");
    assert!(int(&report, "code_bytes") > 0);
    assert_eq!(report["fits_hbm"], Value::Bool(true));
    assert!(
        report["flops"].as_f64().is_some_and(|f| f > 0.0),
        "{report}"
    );
    assert!(report["bytes_accessed"].as_f64().is_some_and(|b| b > 0.0));
    assert!(report["compile_s"].as_f64().is_some_and(|s| s > 0.0));
    // The gradient all-reduce over the 4 devices: f32 gradients and the loss, ring algorithm.
    assert_eq!(
        report["collectives"]["all_reduce"]["bytes_per_device"].as_u64(),
        Some(2 * 4 * (459_392 + 1) * 3 / 4)
    );
    assert!(report["predicted_step_s"].as_f64().is_some_and(|s| s > 0.0));
    assert!(report["predicted_mfu"]
        .as_f64()
        .is_some_and(|m| m > 0.0 && m < 1.0));
    assert!(report["breakdown"]["compute_matmul_s"].as_f64() > Some(0.0));
    assert!(stdout.contains("per device: arguments"), "{stdout}");
    // The compiler's estimate of the whole step: the 1-layer-per-iteration compile's cost
    // (its loop body counted once) plus one more layer, measured with 2 per iteration.
    let estimate = &report["compiler_step_estimate"];
    let number = |v: &Value| {
        v.as_f64()
            .unwrap_or_else(|| panic!("{strategy}: {estimate}"))
    };
    let per_layer = number(&estimate["per_layer_flops"]);
    assert!(per_layer > 0.0, "{strategy}: {estimate}");
    let step = number(&estimate["flops"]);
    assert!(
        (step - (number(&report["flops"]) + per_layer)).abs() <= 1e-6 * step,
        "{strategy}: {estimate}"
    );
    assert!(number(&estimate["optimal_seconds"]) > number(&report["optimal_seconds"]));
    assert!(
        stdout.contains("compiler's estimate of the whole step"),
        "{stdout}"
    );
    report
}

/// No estimate of the whole step for an odd number of layers (2 per iteration cannot
/// divide them) or when asked to skip it; the step still compiles.
#[test]
fn the_step_estimate_says_why_it_is_missing() {
    for (extra, why) in [
        (&["--layers", "3"][..], "even number of layers"),
        (&["--layers", "2", "--no-step-estimate"][..], "skipped"),
    ] {
        let mut args = vec![
            "--model",
            "tiny",
            "--ici-context-parallelism",
            "4",
            "--max-target-length",
            "128",
        ];
        args.extend_from_slice(extra);
        let (report, _) = compiled("v5p:2x2x1", &args);
        let none = report["compiler_step_estimate"]["none"]
            .as_str()
            .unwrap_or("");
        assert!(none.contains(why), "{extra:?}: {report}");
    }
}

#[test]
fn tiny_train_step_ulysses_compiles_for_v5p() {
    tiny_step("ulysses", "all_to_all");
}

/// The fused Ulysses kernels in the step as Mosaic custom calls: no all-to-all is left
/// (their remote copies are inside the kernels).
#[test]
fn tiny_train_step_ulysses_fused_compiles_for_v5p() {
    let report = tiny_step_with(
        "ulysses_fused",
        &["ulysses_attention", "ulysses_attention_bwd"],
    );
    assert!(
        report["collectives"]["all_to_all"].is_null(),
        "{}",
        report["collectives"]
    );
    println!("{report}");
}

#[test]
fn tiny_train_step_all_gather_compiles_for_v5p() {
    tiny_step("all_gather", "all_gather");
}

#[test]
fn tiny_train_step_ring_compiles_for_v5p() {
    tiny_step("ring", "ppermute");
}

/// fsdp 2 x context 2: the parameters and moments are split over fsdp x context, each
/// layer's weights all-gathered in the loop; the state per device is what its shards hold.
#[test]
fn tiny_train_step_with_fsdp_compiles_for_v5p() {
    let (report, _) = compiled(
        "v5p:2x2x1",
        &[
            "--model",
            "tiny",
            "--layers",
            "2",
            "--ici-fsdp-parallelism",
            "2",
            "--ici-context-parallelism",
            "2",
        ],
    );

    assert_eq!(int(&report, "fsdp"), 2);
    let state = int(&report, "state_bytes_per_device");
    // Everything but the norm scales (d_model floats each: 2 per layer and the final one) is
    // split over fsdp x context, 4 ways.
    let norms = 128 * (2 * 2 + 1);
    assert_eq!(state, 12 * ((459_392 - norms) / 4 + norms), "{report}");
    // Donated and aliased (the compiler may alias more than the state).
    assert!(int(&report, "alias_bytes") >= state, "{report}");
    assert!(
        report["collectives"]["all_gather"]["calls"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{report}"
    );
}

/// data 1 x context 4 with MaxText's default: the parameters and moments are split over the
/// context axis alone (the `embed` rule), each layer's weights all-gathered in the loop and
/// their gradients reduce-scattered, and the report says the default was taken.
#[test]
fn tiny_train_step_shards_its_weights_over_context_by_default() {
    let (report, stdout) = compiled(
        "v5p:2x2x1",
        &[
            "--model",
            "tiny",
            "--ici-context-parallelism",
            "4",
            "--no-step-estimate",
        ],
    );
    assert_eq!(report["shards_weights"], Value::Bool(true), "{report}");
    let norms = 128 * (2 * 2 + 1);
    assert_eq!(
        int(&report, "state_bytes_per_device"),
        12 * ((459_392 - norms) / 4 + norms),
        "{report}"
    );
    for collective in ["all_gather", "reduce_scatter"] {
        assert!(
            report["collectives"][collective]["calls"]
                .as_u64()
                .is_some_and(|n| n >= 1),
            "no {collective} in {report}"
        );
    }
    assert!(
        stdout.contains("weights split over the context axis (MaxText's embed rule"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(f32) per device: 0.00 GiB (sharded over the context axis)"),
        "{stdout}"
    );
}

#[test]
fn a_mesh_that_is_not_the_topology_is_refused() {
    let (ok, stdout, stderr) = compile_train(
        "v5p:2x2x1",
        &[
            "--ici-data-parallelism",
            "1",
            "--ici-context-parallelism",
            "2",
        ],
    );
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains(
            "--ici-data-parallelism 1 x --ici-context-parallelism 2 = 2 devices, but the \
             topology v5p:2x2x1 has 4; make their product 4"
        ),
        "{stderr}"
    );
}

#[test]
fn bad_combinations_are_refused_before_compiling() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--sa-block-q", "100"],
            "--sa-block-q 100 does not divide the 256 queries",
        ),
        (
            &[
                "--ici-data-parallelism",
                "2",
                "--ici-fsdp-parallelism",
                "2",
                "--ici-context-parallelism",
                "1",
            ],
            "both split the batch",
        ),
        (
            &[
                "--context-parallel-strategy",
                "ulysses",
                "--context-parallel-load-balance",
            ],
            "--context-parallel-load-balance balances the all_gather and ring strategies",
        ),
        (
            &[
                "--ici-data-parallelism",
                "2",
                "--ici-context-parallelism",
                "2",
                "--shard-weights-over-context",
            ],
            "--shard-weights-over-context splits the weights over the context axis, but \
             --ici-data-parallelism 2 replicates them over the batch axis",
        ),
    ];
    for (args, message) in cases {
        let (ok, _, stderr) = compile_train("v5p:2x2x1", args);
        assert!(!ok && stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("TPU compiler"), "{stderr}");
    }
}

/// The origin PR's configuration cut to 2 of llama2-7b's 32 layers: v5p:4x4x4 (64 chips,
/// fsdp 4 x context 16), 32K tokens, Ulysses, bf16 compute with f32 weights. The weights and
/// moments are split 64 ways, each layer's gathered inside the layer loop.
#[test]
fn llama2_7b_two_layers_compile_for_v5p_4x4x4() {
    let (report, _) = compiled(
        "v5p:4x4x4",
        &[
            "--model",
            "llama2-7b",
            "--layers",
            "2",
            "--max-target-length",
            "32768",
            "--ici-fsdp-parallelism",
            "4",
            "--ici-context-parallelism",
            "16",
            "--context-parallel-strategy",
            "ulysses",
            "--sa-block-q",
            "2048",
            "--sa-block-kv",
            "2048",
            "--sa-block-q-dkv",
            "1024",
            "--sa-block-kv-dkv",
            "1024",
            "--dtype",
            "bf16",
            // The tiny steps check the estimate; here it would double the compile time.
            "--no-step-estimate",
        ],
    );

    assert_eq!(int(&report, "devices"), 64);
    assert_eq!(report["fits_hbm"], Value::Bool(true), "{report}");
    // Every tensor but the norm scales (d_model 4096 each: 2 per layer and the final one) is
    // split over the 64 chips.
    let (params, norms) = (int(&report, "params"), 4096 * (2 * 2 + 1));
    assert_eq!(
        int(&report, "state_bytes_per_device"),
        12 * ((params - norms) / 64 + norms),
        "{report}"
    );
    assert!(report["optimal_seconds"].as_f64().is_some_and(|s| s > 0.0));
    assert!(report["predicted_step_s"].as_f64().is_some_and(|s| s > 0.0));
}

/// The same cell with the fused Ulysses kernels (blocks 512, v5p's 48 MiB VMEM budget as
/// docs/tpu.md's rows): a head's gathered 32K tokens do not fit VMEM (the backward would
/// hold 64 MiB of q, k, v and dout), so the step runs the kernels that stage them in HBM;
/// no all-to-all is left outside them.
#[test]
fn llama2_7b_two_layers_with_fused_ulysses_at_32k_compile_for_v5p_4x4x4() {
    let args = [
        "--vmem-limit-kib",
        "49152",
        "--model",
        "llama2-7b",
        "--layers",
        "2",
        "--max-target-length",
        "32768",
        "--ici-fsdp-parallelism",
        "4",
        "--ici-context-parallelism",
        "16",
        "--context-parallel-strategy",
        "ulysses_fused",
        "--sa-block-q",
        "512",
        "--sa-block-kv",
        "512",
        "--sa-block-q-dkv",
        "512",
        "--sa-block-kv-dkv",
        "512",
        "--dtype",
        "bf16",
        "--no-step-estimate",
    ];
    let (report, _) = compiled("v5p:4x4x4", &args);
    assert_eq!(
        report["kernels"],
        serde_json::json!(["ulysses_attention_staged", "ulysses_attention_bwd_staged"]),
        "{report}"
    );
    assert!(report["collectives"]["all_to_all"].is_null(), "{report}");
    assert_eq!(report["fits_hbm"], Value::Bool(true), "{report}");
    for (kernel, vmem) in report["scoped_vmem_bytes"].as_object().unwrap() {
        let vmem = vmem.as_i64().unwrap();
        assert!(vmem <= 48 << 20, "{kernel}: {vmem} bytes of scoped VMEM");
    }
}

/// MaxText's fractional `--per-device-batch-size`: 0.25 on 4 context devices is one sequence
/// a step, split over the context axis, here with USP (Ulysses 2 x ring 2), whose step-time
/// prediction is printed; the unset flags take MaxText's defaults (bf16), said so.
#[test]
fn a_fractional_batch_compiles_with_usp_and_its_prediction() {
    let (report, stdout) = compiled(
        "v5p:2x2x1",
        &[
            "--model",
            "tiny",
            "--ici-context-parallelism",
            "4",
            "--per-device-batch-size",
            "0.25",
            "--context-parallel-strategy",
            "usp:2x2",
            "--no-step-estimate",
        ],
    );
    assert_eq!(int(&report, "global_batch"), 1, "{report}");
    assert_eq!(report["per_device_batch_size"].as_f64(), Some(0.25));
    assert_eq!(report["dtype"], "bf16", "{report}");
    assert!(
        stdout.contains("defaults chosen: compute dtype bf16 (MaxText's default"),
        "{stdout}"
    );
    assert!(
        report["predicted_step_s"].as_f64().is_some_and(|s| s > 0.0),
        "{report}"
    );
    assert!(report["breakdown"]["context_collectives_s"].as_f64() > Some(0.0));
    assert!(stdout.contains("predicted (step-time model"), "{stdout}");
}

/// Fractions the context axis does not cover are refused before compiling, in one sentence
/// naming the flags; ring takes MaxText's load balancing unless told otherwise.
#[test]
fn fractional_batches_the_context_does_not_cover_are_refused() {
    let (ok, _, stderr) = compile_train(
        "v5p:2x2x1",
        &[
            "--ici-context-parallelism",
            "2",
            "--ici-data-parallelism",
            "2",
            "--per-device-batch-size",
            "0.25",
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains(
            "--per-device-batch-size 0.25 x --ici-context-parallelism 2 gives each of the 2 \
             batch shards 0.5 sequences; the context devices split one sequence, but a batch \
             shard needs whole sequences: use a multiple of 0.5"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let (ok, _, stderr) = compile_train("v5p:2x2x1", &["--per-device-batch-size", "one"]);
    assert!(
        !ok && stderr.contains("--per-device-batch-size"),
        "{stderr}"
    );
}

/// `--sa-block-q auto` (and the other block flags) ask `tessera tune`'s search: the blocks it
/// chose are printed and compiled; a block given explicitly keeps its value.
#[test]
fn auto_blocks_are_chosen_by_the_tuner() {
    let (report, stdout) = compiled(
        "v5p:2x2x1",
        &[
            "--model",
            "tiny",
            "--layers",
            "2",
            "--ici-context-parallelism",
            "4",
            "--sa-block-q",
            "auto",
            "--sa-block-kv",
            "auto",
            "--sa-block-q-dkv",
            "auto",
            "--sa-block-kv-dkv",
            "128",
            "--no-step-estimate",
        ],
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("auto blocks (tessera tune"))
        .unwrap_or_else(|| panic!("{stdout}"));
    // Ulysses on 4 devices: each device attends the whole 256 tokens of the 4 sequences of
    // its batch shard with 2 of the 8 heads.
    assert!(line.contains("B=4 H=2 KV=1 Q=256 K=256 D=16"), "{line}");
    let blocks = stdout
        .lines()
        .find(|l| l.starts_with("train step:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(blocks.contains("kv_dkv 128"), "{blocks}");
    for b in ["q ", "kv ", "q_dkv "] {
        let value: usize = blocks
            .split("splash blocks ")
            .nth(1)
            .and_then(|rest| rest.split(b).nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{b}: {blocks}"));
        assert!([128, 256].contains(&value), "{b}{value}: {blocks}");
    }
    assert!(report["kernels"].as_array().is_some_and(|k| !k.is_empty()));
}

/// `--remat-policy save_attention` on the tiny Ulysses step: libtpu compiles it, its cost
/// analysis counts less work (the backward's re-run of the q, k, v projections and the
/// attention's forward are gone) and the step-time model drops the attention's re-run.
#[test]
fn tiny_train_step_saving_the_attention_compiles_for_v5p() {
    let step = |policy: &str| {
        let mut args = tiny_args("ulysses");
        args.extend(["--remat-policy", policy, "--no-step-estimate"]);
        compiled("v5p:2x2x1", &args).0
    };
    let (full, saved) = (step("full"), step("save_attention"));
    let number = |r: &Value, key: &str| r[key].as_f64().unwrap();
    assert!(
        number(&saved, "flops") < number(&full, "flops"),
        "{full}\n{saved}"
    );
    assert!(
        number(&saved, "temp_bytes") > number(&full, "temp_bytes"),
        "{full}\n{saved}"
    );
    let predicted = |r: &Value| number(r, "predicted_step_s");
    assert!(predicted(&saved) < predicted(&full), "{full}\n{saved}");
    assert_eq!(saved["fits_hbm"], Value::Bool(true), "{saved}");
}

/// `--sa-use-fused-bwd-kernel` on the tiny Ulysses and ring steps: libtpu compiles splash's
/// fused backward (and its dQ partials' reduction) inside the layer loop (and the ring's
/// step loop) in place of the dK/dV and dQ kernels, and its cost analysis counts less work
/// (the scores and their gradient once).
#[test]
fn tiny_train_step_with_the_fused_backward_compiles_for_v5p() {
    let named = |names: &[&str]| names.iter().map(|k| k.to_string()).collect();
    let fused_kernels = [
        "splash_fwd",
        "splash_bwd_prep",
        "splash_bwd_fused",
        "splash_dq_reduce",
    ];
    let flops = |r: &Value| r["flops"].as_f64().unwrap();
    for strategy in ["ulysses", "ring"] {
        let step = |fused: &str| {
            let mut args = tiny_args(strategy);
            args.extend([fused, "--no-step-estimate"]);
            compiled("v5p:2x2x1", &args).0
        };
        let separate = step("--sa-use-fused-bwd-kernel=false");
        let fused = step("--sa-use-fused-bwd-kernel");
        assert_eq!(kernel_names(&separate), named(&SPLASH), "{separate}");
        assert_eq!(kernel_names(&fused), named(&fused_kernels), "{fused}");
        assert!(flops(&fused) < flops(&separate), "{separate}\n{fused}");
        assert_eq!(fused["fits_hbm"], Value::Bool(true), "{fused}");
    }
}

/// `--remat-last-layer=false` (the train example's default) on the tiny Ulysses step: libtpu
/// compiles it with the last layer after the layer loop, where its backward reads the
/// forward's activations, with the same kernels, and it fits.
#[test]
fn tiny_train_step_without_the_last_layers_re_run_compiles_for_v5p() {
    let mut args = tiny_args("ulysses");
    args.extend(["--remat-last-layer=false", "--no-step-estimate"]);
    let (report, _) = compiled("v5p:2x2x1", &args);
    let splash: BTreeSet<String> = SPLASH.map(String::from).into();
    assert_eq!(kernel_names(&report), splash, "{report}");
    assert_eq!(report["fits_hbm"], Value::Bool(true), "{report}");
}
