//! Splash attention and the context-parallel programs compiled for TPU topologies by the real
//! TPU compiler (libtpu, compile-only, provisioned on first use), every kernel a Mosaic
//! `tpu_custom_call`. A covering subset of the matrix `scripts/tpu_compile_matrix.sh` runs in
//! full: every kernel (forward, dq + dkv, fused backward), both dtypes, every block
//! configuration, causal, local and segmented, both chips; every context-parallel strategy on
//! 4 devices; `tessera compile` and its refusals.

mod common;
use common::tessera;

use tessera::dsl::{DType, KernelCostEstimates, Lowering};
use tessera::hlo::Module;
use tessera::parallel::strategy::{AllGather, Ring, Ulysses, Usp};
use tessera::parallel::{ContextParallel, Strategy};
use tessera::splash::{
    splash_program, BlockSizes, Dims, Features, Mask, Pass, SplashAttention, SplashOptions,
};
use tessera::tpu::{CompileReport, TpuTopology};

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

fn compile(topology: &str, program: &Module) -> CompileReport {
    let report = TpuTopology::parse(&format!("tpu:{topology}"))
        .unwrap()
        .compile(program)
        .unwrap_or_else(|e| panic!("{topology} `{}`: {e}", program.name()));
    println!("{}", report.to_json());
    assert!(report.executable_bytes > 0);
    report
}

/// Compiles one splash program on 2 heads of 2048 tokens and checks which kernels it holds.
fn splash(
    topology: &str,
    dtype: DType,
    mask: Mask,
    (bq, bkv): (usize, usize),
    pass: Pass,
    fused: bool,
    segmented: bool,
) -> CompileReport {
    let blocks = BlockSizes::uniform(bq, bkv).with_fused_bwd(fused);
    let attn = SplashAttention::new(
        mask,
        dims(2, 2048),
        dtype,
        blocks,
        SplashOptions::default(),
        Lowering::tpu(),
    )
    .unwrap();
    let features = Features {
        segmented,
        sinks: false,
    };
    let program = splash_program(&attn, pass, features).unwrap();
    let report = compile(topology, &program);
    let expected: &[&str] = match (pass, fused) {
        (Pass::Forward | Pass::Inference, _) => &["splash_fwd"],
        (Pass::Backward, false) => &["splash_bwd_prep", "splash_dkv", "splash_dq"],
        (Pass::Backward, true) => &["splash_bwd_prep", "splash_bwd_fused", "splash_dq_reduce"],
        (Pass::ForwardBackward, _) => unreachable!("not in this suite"),
    };
    assert_eq!(report.kernels, expected);
    let memory = report.memory.expect("libtpu reports memory statistics");
    let element = dtype.size_bytes() as i64;
    // q, k, v (and the backward's out, dout) are arguments; f32 lse; int32 segment ids.
    let qkv = 3 * 2 * 2048 * 128 * element;
    let segments = if segmented { 2 * 2048 * 4 } else { 0 };
    let args = match pass {
        Pass::Forward | Pass::Inference => qkv,
        _ => qkv + 2 * 2 * 2048 * 128 * element + 2 * 2048 * 4,
    };
    assert_eq!(memory.argument_bytes, args + segments);
    // The forward's out, and its f32 lse unless it is left out (with the lse, the outputs
    // are a tuple, whose table libtpu counts too).
    let out = 2 * 2048 * 128 * element;
    match pass {
        Pass::Forward => assert!(memory.output_bytes >= out + 2 * 2048 * 4, "{memory:?}"),
        Pass::Inference => assert_eq!(memory.output_bytes, out),
        _ => {}
    }
    assert!(report.flops.is_some_and(|f| f > 0.0), "{report:?}");
    // Every kernel's compiled scoped VMEM is known and within the rules' 16 MiB budget.
    assert_eq!(report.kernel_vmem.len(), expected.len(), "{report:?}");
    assert!(report
        .kernel_vmem
        .iter()
        .all(|(_, b)| *b > 0 && *b <= 16 << 20));
    report
}

#[test]
fn splash_forward_bf16_causal_v5p_512() {
    splash(
        "v5p:2x2x1",
        DType::BF16,
        Mask::causal(),
        (512, 512),
        Pass::Forward,
        false,
        false,
    );
}

#[test]
fn splash_forward_f32_local_v5e_512_1024() {
    splash(
        "v5e:2x2",
        DType::F32,
        Mask::parse("local:256:0").unwrap(),
        (512, 1024),
        Pass::Forward,
        false,
        false,
    );
}

#[test]
fn splash_inference_f32_local_segmented_v5e_512_1024() {
    splash(
        "v5e:2x2",
        DType::F32,
        Mask::parse("local:256:0").unwrap(),
        (512, 1024),
        Pass::Inference,
        false,
        true,
    );
}

#[test]
fn splash_dq_dkv_f32_segmented_v5e_128() {
    splash(
        "v5e:2x2",
        DType::F32,
        Mask::causal(),
        (128, 128),
        Pass::Backward,
        false,
        true,
    );
}

#[test]
fn splash_fused_backward_bf16_local_segmented_v5p_512_1024() {
    splash(
        "v5p:2x2x1",
        DType::BF16,
        Mask::parse("local:256:0").unwrap(),
        (512, 1024),
        Pass::Backward,
        true,
        true,
    );
}

/// A context-parallel program for TPU: 4 heads, 1024 tokens, bf16, causal, segment ids.
fn context_parallel(strategy: Strategy) -> ContextParallel {
    ContextParallel {
        dims: dims(4, 1024),
        dtype: DType::BF16,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(256, 256),
        options: SplashOptions::default(),
        strategy,
        devices: 4,
        load_balance: false,
        lowering: Lowering::tpu(),
    }
}

/// The kernels are custom calls inside the program's manual computation (Shardy's
/// `sdy.manual_computation`, what `shard_map` emits), not inlined loops.
fn check_manual_custom_calls(module: &Module) {
    let text = module.to_mlir();
    assert_eq!(module.num_partitions(), 4);
    let manual = text
        .find("\"sdy.manual_computation\"")
        .expect("a manual computation");
    let call = text
        .find("call_target_name = \"tpu_custom_call\"")
        .expect("a Mosaic kernel");
    assert!(manual < call, "a kernel outside the manual computation");
    assert!(!text.contains("stablehlo.while"), "kernels were inlined");
}

#[test]
fn context_parallel_forward_programs_compile_on_4_devices() {
    for strategy in [
        Strategy::from(Ulysses),
        Strategy::from(AllGather),
        Strategy::from(Ring),
        Strategy::from(Usp {
            ulysses: 2,
            ring: 2,
        }),
    ] {
        let program = context_parallel(strategy.clone())
            .forward_program(true)
            .unwrap();
        check_manual_custom_calls(program.module());
        let report = compile("v5p:2x2x1", program.module());
        assert_eq!(report.devices, 4);
        assert_eq!(report.kernels, ["splash_fwd"], "{strategy}");
    }
}

#[test]
fn ring_forward_backward_compiles_on_4_v5e_devices() {
    let program = context_parallel(Strategy::from(Ring))
        .forward_backward_program(true)
        .unwrap();
    check_manual_custom_calls(program.module());
    let report = compile("v5e:2x2", program.module());
    // The forward kernel, then the gradient's backward kernels on its residuals.
    assert_eq!(
        report.kernels,
        ["splash_fwd", "splash_bwd_prep", "splash_dkv", "splash_dq"]
    );
}

#[test]
fn a_tpu_program_does_not_run_on_the_cpu() {
    let cp = context_parallel(Strategy::from(Ulysses));
    let q = tessera::dsl::HostArray::zeros(DType::BF16, [1, 4, 1024, 128]);
    let x = tessera::parallel::CpInputs {
        q: &q,
        k: &q,
        v: &q,
        segment_ids: None,
    };
    let err = cp
        .forward(tessera::backend::Platform::Cpu, &x)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("are Mosaic custom calls, which only TPU devices run"),
        "{err}"
    );
}

#[test]
fn cli_compiles_attention_and_prints_json_last() {
    let dir = std::env::temp_dir().join(format!("tessera-compile-{}", std::process::id()));
    // An output's directory must exist (the Mosaic one is created, its parent must exist).
    std::fs::create_dir_all(&dir).unwrap();
    let hlo = dir.join("fwd.mlir");
    let (ok, stdout, stderr) = tessera(&[
        "compile",
        "--target",
        "tpu:v5e:2x2",
        "attention",
        "--heads",
        "2",
        "--seq-len",
        "1024",
        "--dtype",
        "bf16",
        "--mask",
        "causal",
        "--block-q",
        "256",
        "--block-kv",
        "512",
        "--pass",
        "forward",
        "--emit-mosaic",
        dir.to_str().unwrap(),
        "--emit-stablehlo",
        hlo.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap();
    assert!(
        last.starts_with("{\"topology\":\"v5e:2x2\",\"devices\":1,\"kernels\":[\"splash_fwd\"]")
    );
    for key in [
        "executable_bytes",
        "argument_bytes",
        "temp_bytes",
        "flops",
        "compile_seconds",
    ] {
        assert!(last.contains(&format!("\"{key}\":")), "{last}");
    }
    let mosaic = std::fs::read_to_string(dir.join("splash_fwd.mlir")).unwrap();
    assert!(mosaic.contains("tpu.core_type"), "{mosaic}");
    let text = std::fs::read_to_string(&hlo).unwrap();
    assert!(text.contains("kernel_name = \"splash_fwd\""));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_compiles_a_registered_kernel() {
    let (ok, stdout, stderr) = tessera(&["compile", "kernel", "matmul", "-p", "dtype=bf16"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .last()
            .unwrap()
            .contains("\"kernels\":[\"matmul\"]"),
        "{stdout}"
    );
}

/// What tessera's rules know is refused before the compiler, naming the culprit.
#[test]
fn cli_refuses_what_tesseras_rules_know() {
    let base = ["compile", "attention", "--heads", "2", "--seq-len", "1024"];
    let cases: &[(&[&str], &str)] = &[
        (&["--block-kv", "384"], "block_kv"),
        (&["--block-q", "8", "--dtype", "bf16"], "block_q"),
        (
            &[
                "--dtype",
                "f32",
                "--head-dim",
                "1024",
                "--block-q",
                "1024",
                "--block-kv",
                "1024",
                "--pass",
                "forward",
            ],
            "VMEM",
        ),
        (
            &["--strategy", "ulysses", "--devices", "3"],
            "not divisible",
        ),
        (&["--scale", "inf"], "scale inf is not finite"),
        (
            &["--strategy", "ulysses", "--pass", "inference"],
            "with --strategy ulysses use --pass forward",
        ),
    ];
    for (extra, culprit) in cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let (ok, stdout, stderr) = tessera(&args);
        assert!(!ok, "{args:?} compiled:\n{stdout}");
        let message = stderr.trim();
        assert!(message.starts_with("error: "), "{message}");
        assert!(message.contains(culprit), "{args:?}: {message}");
        assert!(!message.contains("TPU compiler rejected"), "{message}");
    }
    let (ok, _, stderr) = tessera(&["compile", "--target", "tpu:v9z:1", "kernel", "matmul"]);
    assert!(!ok);
    assert!(
        stderr.contains("`v9z` is not a TPU chip family tessera compiles for"),
        "{stderr}"
    );
    let (ok, _, stderr) = tessera(&["compile", "--target", "v5p", "kernel", "matmul"]);
    assert!(!ok);
    assert!(stderr.contains("expected tpu:TOPOLOGY"), "{stderr}");
}

/// Without their cost estimates (`--omit-kernel-cost-estimates`, as JAX's splash calls carry
/// none) libtpu prices the Mosaic calls at next to nothing; with them, at their work.
#[test]
fn kernel_cost_estimates_can_be_omitted_as_jaxs_splash_omits_them() {
    let forward = |cost_estimates| {
        let attn = SplashAttention::new(
            Mask::causal(),
            dims(2, 2048),
            DType::BF16,
            BlockSizes::uniform(512, 512),
            SplashOptions::default(),
            Lowering {
                cost_estimates,
                ..Lowering::tpu()
            },
        )
        .unwrap();
        splash_program(&attn, Pass::Forward, Features::default()).unwrap()
    };
    let counted = forward(KernelCostEstimates::Counted);
    let omitted = forward(KernelCostEstimates::Omitted);
    assert!(counted.to_string().contains("cost_estimate"));
    assert!(!omitted.to_string().contains("cost_estimate"));
    let (with, without) = (
        compile("v5p:2x2x1", &counted),
        compile("v5p:2x2x1", &omitted),
    );
    // The causal forward's matmuls alone: 2 heads, 2048^2 / 2 logits, 2 x 2 x 128 flops each.
    let matmul_flops = 2.0 * 2048.0 * 2048.0 / 2.0 * 4.0 * 128.0;
    assert!(with.flops.unwrap() >= matmul_flops, "{with:?}");
    assert!(
        without.flops.unwrap_or(0.0) < matmul_flops / 100.0,
        "{without:?}"
    );
    assert!(without.optimal_seconds.unwrap() < with.optimal_seconds.unwrap() / 10.0);

    let dir = std::env::temp_dir().join(format!("tessera-omit-costs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hlo = dir.join("fwd.mlir");
    let (ok, stdout, stderr) = tessera(&[
        "compile",
        "--omit-kernel-cost-estimates",
        "attention",
        "--heads",
        "2",
        "--seq-len",
        "1024",
        "--pass",
        "forward",
        "--emit-stablehlo",
        hlo.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&hlo).unwrap();
    assert!(text.contains("kernel_name = \"splash_fwd\"") && !text.contains("cost_estimate"));
    std::fs::remove_dir_all(&dir).unwrap();
}
