//! `tessera attention`: results against the f64 reference (also for queries and keys of
//! different lengths), `--stats`, and one-line errors with a non-zero exit for bad input;
//! `tessera kernels` and `tessera ir` for the splash kernels.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::dsl::{DType, HostArray};
use tessera::npy::{read_npy, write_npy};
use tessera::reference::random;
use tessera::splash::reference::{self, RefForward, RefGrads, RefInputs};
use tessera::splash::{Dims, Mask, MultiHeadMask};

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-splash-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn save(d: &Path, name: &str, a: &HostArray) -> String {
    let p = d.join(name);
    write_npy(&p, a).unwrap();
    p.to_str().unwrap().to_string()
}

/// Runs `tessera attention`; returns (success, stdout, stderr lines). The plugin's log lines
/// are off by default, so stderr holds only tessera's own lines.
fn run(args: &[&str]) -> (bool, String, Vec<String>) {
    let out = tessera()
        .env_remove("TF_CPP_MIN_LOG_LEVEL")
        .env_remove("TESSERA_VERBOSE")
        .arg("attention")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

/// `--out D/out.npy`, `--lse D/lse.npy` and the gradients' likewise.
fn output_flags(d: &Path) -> [(&'static str, String); 5] {
    ["--out", "--lse", "--dq", "--dk", "--dv"].map(|flag| {
        let path = d.join(format!("{}.npy", &flag[2..]));
        (flag, path.to_str().unwrap().to_string())
    })
}

/// Command-line arguments: each (flag, value) pair of every list, in order.
fn flag_args(lists: &[&[(&str, String)]]) -> Vec<String> {
    lists
        .iter()
        .flat_map(|l| l.iter())
        .flat_map(|(flag, value)| [flag.to_string(), value.clone()])
        .collect()
}

/// The f64 reference's forward and gradients of `sum(out * dout)` for the arrays given, with
/// segment ids shared by queries and keys.
fn reference_results(
    [q, k, v, dout]: [&HostArray; 4],
    segment_ids: Option<&[i32]>,
    mask: Mask,
    scale: f64,
    soft_cap: Option<f64>,
) -> (RefForward, RefGrads) {
    let mask: MultiHeadMask = mask.into();
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let r = RefInputs {
        q_segment_ids: segment_ids,
        kv_segment_ids: segment_ids,
        soft_cap,
        ..RefInputs::new(
            Dims::of(q.shape(), k.shape(), v.shape()).unwrap(),
            (&qf, &kf, &vf),
            &mask,
            scale,
        )
    };
    (
        reference::forward(&r),
        reference::backward(&r, &dout.to_f64_vec()),
    )
}

#[test]
fn forward_gradients_and_stats_match_the_reference() {
    let d = dir("ok");
    let (b, h, kvh, s, hd) = (1, 4, 2, 256, 64);
    let q = random(DType::F32, &[b, h, s, hd], 1);
    let k = random(DType::F32, &[b, kvh, s, hd], 2);
    let v = random(DType::F32, &[b, kvh, s, hd], 3);
    let dout = random(DType::F32, &[b, h, s, hd], 4);
    let seg: Vec<i32> = (0..s as i32).map(|i| i / 100).collect();
    let segs = HostArray::i32([b, s], seg.clone()).unwrap();
    let p = |n: &str| d.join(n).to_str().unwrap().to_string();
    let args = [
        "--q".into(),
        save(&d, "q.npy", &q),
        "--k".into(),
        save(&d, "k.npy", &k),
        "--v".into(),
        save(&d, "v.npy", &v),
        "--segment-ids".into(),
        save(&d, "seg.npy", &segs),
        "--mask".into(),
        "local:64:0".into(),
        "--soft-cap".into(),
        "3".into(),
        "--scale".into(),
        "0.2".into(),
        "--block-q".into(),
        "128".into(),
        "--block-kv".into(),
        "128".into(),
        "--out".into(),
        p("out.npy"),
        "--lse".into(),
        p("lse.npy"),
        "--dout".into(),
        save(&d, "dout.npy", &dout),
        "--dq".into(),
        p("dq.npy"),
        "--dk".into(),
        p("dk.npy"),
        "--dv".into(),
        p("dv.npy"),
        "--stats".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, err) = run(&args);
    assert!(ok, "{err:?}");
    // 2 query blocks x 2 key blocks per head; the window of 64 reaches into the previous key
    // block from query block 1: 1 + 2 blocks per head, all partial.
    assert_eq!(
        stdout.trim(),
        "{\"block_q\":128,\"block_kv\":128,\"kv_blocks_total\":16,\"kv_blocks_computed\":12,\
         \"kv_blocks_skipped\":4,\"kv_blocks_masked\":12}"
    );
    let (want, grads) = reference_results(
        [&q, &k, &v, &dout],
        Some(&seg[..]),
        Mask::local(64, 0),
        0.2,
        Some(3.0),
    );
    let err = |name: &str, want: &[f64]| {
        let got = read_npy(&d.join(name)).unwrap().to_f64_vec();
        let scale = if name.starts_with('d') {
            want.iter().map(|x| x.abs()).fold(0.0, f64::max)
        } else {
            1.0
        };
        common::max_abs_diff(&got, want).0 / scale
    };
    assert_eq!(read_npy(&d.join("lse.npy")).unwrap().shape(), &[b, h, s]);
    assert!(err("out.npy", &want.out) <= 2e-4);
    assert!(err("lse.npy", &want.lse) <= 2e-4);
    assert!(err("dq.npy", &grads.dq) <= 1e-3);
    assert!(err("dk.npy", &grads.dk) <= 1e-3);
    assert!(err("dv.npy", &grads.dv) <= 1e-3);
    let _ = std::fs::remove_dir_all(&d);
}

/// `--strategy` on CPU devices gives the reference's results, writes the programs that ran
/// and reports what each device holds and sends.
#[test]
fn context_parallel_strategies_match_the_reference() {
    let d = dir("cp");
    let (b, h, kvh, s, hd) = (1, 4, 2, 256, 64);
    let q = random(DType::F32, &[b, h, s, hd], 1);
    let k = random(DType::F32, &[b, kvh, s, hd], 2);
    let v = random(DType::F32, &[b, kvh, s, hd], 3);
    let dout = random(DType::F32, &[b, h, s, hd], 4);
    let seg: Vec<i32> = (0..s as i32).map(|i| i / 100).collect();
    let segs = HostArray::i32([b, s], seg.clone()).unwrap();
    let (want, grads) = reference_results(
        [&q, &k, &v, &dout],
        Some(&seg[..]),
        Mask::causal(),
        1.0 / 8.0,
        None,
    );
    let inputs = [
        ("--q", save(&d, "q.npy", &q)),
        ("--k", save(&d, "k.npy", &k)),
        ("--v", save(&d, "v.npy", &v)),
        ("--segment-ids", save(&d, "seg.npy", &segs)),
        ("--dout", save(&d, "dout.npy", &dout)),
    ];
    let p = |n: &str| d.join(n).to_str().unwrap().to_string();
    let outputs = output_flags(&d);
    for (strategy, devices, permutes, all_to_alls, balanced) in [
        ("ring", "4", true, false, false),
        ("usp:2x2", "4", true, true, false),
        ("all_gather", "2", false, false, false),
        ("all_gather", "4", false, false, true),
        ("ring", "2", true, false, true),
    ] {
        let mut args = flag_args(&[
            &inputs,
            &[
                ("--mask", "causal".to_string()),
                ("--strategy", strategy.to_string()),
                ("--devices", devices.to_string()),
                ("--dump-hlo", p("prog.mlir")),
            ],
            &outputs,
        ]);
        args.push("--stats".into());
        if balanced {
            args.push("--load-balance".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, err) = run(&args);
        assert!(ok, "{strategy}: {err:?}");
        let read = |n: &str| read_npy(&d.join(n)).unwrap().to_f64_vec();
        assert!(
            rel_err(&read("out.npy"), &want.out) <= 2e-4,
            "{strategy}: out"
        );
        assert!(
            rel_err(&read("lse.npy"), &want.lse) <= 2e-4,
            "{strategy}: lse"
        );
        assert!(
            rel_err(&read("dq.npy"), &grads.dq) <= 1e-3,
            "{strategy}: dq"
        );
        assert!(
            rel_err(&read("dk.npy"), &grads.dk) <= 1e-3,
            "{strategy}: dk"
        );
        assert!(
            rel_err(&read("dv.npy"), &grads.dv) <= 1e-3,
            "{strategy}: dv"
        );
        for file in ["prog.mlir", "prog.bwd.mlir"] {
            let text = std::fs::read_to_string(d.join(file)).unwrap();
            assert!(
                text.contains("mhlo.num_partitions = 4") || devices != "4",
                "{file}"
            );
            assert_eq!(
                text.contains("\"stablehlo.collective_permute\""),
                permutes,
                "{strategy}: {file}"
            );
            assert_eq!(
                text.contains("\"stablehlo.all_to_all\""),
                all_to_alls,
                "{strategy}: {file}"
            );
        }
        assert!(
            stdout.contains(&format!("\"strategy\":\"{}\"", strategy.replace('_', "-"))),
            "{stdout}"
        );
        assert!(stdout.contains("kv_bytes_per_device"), "{stdout}");
        assert!(
            stdout.contains("forward key blocks computed per device"),
            "{stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_input_gets_one_line_and_a_failure_exit() {
    let d = dir("bad");
    let q = save(&d, "q.npy", &random(DType::F32, &[1, 3, 128, 64], 1));
    let k = save(&d, "k.npy", &random(DType::F32, &[1, 2, 128, 64], 2));
    let k1 = save(&d, "k1.npy", &random(DType::F32, &[1, 1, 128, 64], 2));
    let k32 = save(&d, "k32.npy", &random(DType::F32, &[1, 1, 128, 32], 2));
    let short = save(&d, "short.npy", &random(DType::F32, &[1, 1, 64, 64], 2));
    let mut nan = random(DType::F32, &[1, 3, 128, 64], 1).to_f64_vec();
    nan[77] = f64::NAN;
    let qnan = save(
        &d,
        "qnan.npy",
        &HostArray::from_f64(DType::F32, [1, 3, 128, 64], &nan).unwrap(),
    );
    let out = d.join("out.npy").to_str().unwrap().to_string();
    let missing = d.join("missing.npy").to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--q", &q, "--k", &k, "--v", &k], "not divisible"),
        (vec!["--q", &q, "--k", &k32, "--v", &k32], "head dim"),
        (vec!["--q", &q, "--k", &k1, "--v", &short], "must agree"),
        (
            vec!["--q", &q, "--k", &k1, "--v", &k1, "--block-q", "48"],
            "block_q, block_q_dkv, block_q_dq = 48, which does not divide",
        ),
        (vec!["--q", &qnan, "--k", &k1, "--v", &k1], "non-finite"),
        (vec!["--q", &missing, "--k", &k1, "--v", &k1], "cannot open"),
        (
            vec!["--q", &q, "--k", &k1, "--v", &k1, "--mask", "window:3"],
            "bad mask",
        ),
        (
            vec!["--q", &q, "--k", &k1, "--v", &k1, "--strategy", "ulysses"],
            "3 query heads are not divisible by the Ulysses degree 4",
        ),
        (
            vec![
                "--q",
                &q,
                "--k",
                &k1,
                "--v",
                &k1,
                "--strategy",
                "ring",
                "--devices",
                "3",
            ],
            "ring: the sequence length 128 is not divisible by the 3 sequence shards (--devices 3)",
        ),
        (
            vec!["--q", &q, "--k", &k1, "--v", &k1, "--strategy", "rings"],
            "unknown strategy `rings`",
        ),
        (
            vec![
                "--q",
                &q,
                "--k",
                &k1,
                "--v",
                &k1,
                "--strategy",
                "usp",
                "--load-balance",
            ],
            "--load-balance balances the all-gather and ring strategies, not usp:2x2",
        ),
        (
            vec![
                "--q",
                &q,
                "--k",
                &k1,
                "--v",
                &k1,
                "--strategy",
                "ring",
                "--backend",
                "interpret",
            ],
            "the interpreter runs kernels alone; use --backend cpu, gpu or tpu",
        ),
    ];
    for (mut args, want) in cases {
        args.extend(["--out", &out]);
        let (ok, _, err) = run(&args);
        assert!(!ok, "{args:?} succeeded");
        assert_eq!(err.len(), 1, "{args:?}: {err:?}");
        assert!(err[0].contains(want), "{args:?}: {}", err[0]);
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Max |got - want| over the largest |want| (at least 1).
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().map(|x| x.abs()).fold(0.0, f64::max).max(1.0);
    common::max_abs_diff(got, want).0 / scale
}

/// Splash allows queries and keys of different lengths (cross attention, or a query chunk
/// against a longer context): the CLI accepts them and gives the reference's results.
#[test]
fn queries_and_keys_of_different_lengths_match_the_reference() {
    let d = dir("lengths");
    let (b, h, kvh, sq, skv, hd) = (1, 4, 2, 128, 384, 64);
    let q = random(DType::F32, &[b, h, sq, hd], 11);
    let k = random(DType::F32, &[b, kvh, skv, hd], 12);
    let v = random(DType::F32, &[b, kvh, skv, hd], 13);
    let dout = random(DType::F32, &[b, h, sq, hd], 14);
    let files = [
        ("--q", save(&d, "q.npy", &q)),
        ("--k", save(&d, "k.npy", &k)),
        ("--v", save(&d, "v.npy", &v)),
        ("--dout", save(&d, "dout.npy", &dout)),
    ];
    let outputs = output_flags(&d);
    // (mask, backend and kernel flags): the interpreter with separate backward kernels, the
    // XLA CPU plugin with the fused one.
    for (mask_arg, mask, extra) in [
        ("causal:200", Mask::Causal { offset: 200 }, vec![]),
        (
            "local:96:32",
            Mask::local(96, 32),
            vec!["--backend", "cpu", "--fused-bwd", "--block-kv", "128"],
        ),
    ] {
        let mut args = flag_args(&[&files, &[("--mask", mask_arg.to_string())], &outputs]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, err) = run(&args);
        assert!(ok, "{mask_arg}: {err:?}");
        assert!(err.is_empty(), "{mask_arg}: {err:?}");
        let (want, grads) = reference_results([&q, &k, &v, &dout], None, mask, 1.0 / 8.0, None);
        let read = |n: &str| read_npy(&d.join(n)).unwrap();
        assert_eq!(read("out.npy").shape(), &[b, h, sq, hd]);
        assert_eq!(read("dk.npy").shape(), &[b, kvh, skv, hd]);
        for (name, want, tol) in [
            ("out.npy", &want.out, 2e-4),
            ("lse.npy", &want.lse, 2e-4),
            ("dq.npy", &grads.dq, 1e-3),
            ("dk.npy", &grads.dk, 1e-3),
            ("dv.npy", &grads.dv, 1e-3),
        ] {
            let e = rel_err(&read(name).to_f64_vec(), want);
            assert!(e <= tol, "{mask_arg}: {name} error {e:.2e} > {tol:.0e}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The names of the splash kernels in the registry.
fn splash_kernels() -> impl Iterator<Item = &'static str> {
    tessera::registry::KERNELS
        .iter()
        .map(|k| k.name)
        .filter(|n| n.starts_with("splash_"))
}

#[test]
fn kernels_lists_the_splash_kernels_and_their_parameters() {
    let out = tessera().arg("kernels").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        splash_kernels().count() >= 6,
        "the splash kernels are registered"
    );
    for name in splash_kernels() {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name}  "))),
            "{name} missing:\n{text}"
        );
    }
    for param in ["BQ", "BKVC", "mask", "segmented", "SKV"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{param} "))),
            "{param} missing"
        );
    }
}

/// `tessera ir` prints the verified IR of every splash kernel and, with `--emit stablehlo`,
/// a StableHLO module that the XLA CPU plugin compiles.
#[test]
fn ir_prints_splash_kernels_and_their_stablehlo() {
    use tessera::runtime::{Client, CompileOptions};
    let client = Client::cpu_shared(1).unwrap();
    for name in splash_kernels() {
        let ir = |extra: &[&str]| {
            let out = tessera()
                .args([
                    "ir",
                    name,
                    "-p",
                    "SQ=256",
                    "-p",
                    "SKV=384",
                    "-p",
                    "mask=local:100:0",
                ])
                .args(extra)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} {extra:?}: {stderr}");
            assert_eq!(stderr, "", "{name} {extra:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let text = ir(&[]);
        assert!(text.starts_with(&format!("kernel @{name}<")), "{text}");
        let module = ir(&["--emit", "stablehlo"]);
        assert!(
            module.starts_with(&format!("module @tessera_{name} ")),
            "{module}"
        );
        client
            .compile(&module, &CompileOptions::single_device())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The forward takes the sizes given (q [1, 4, 256, 64], k [1, 2, 384, 64]).
    let out = tessera()
        .args([
            "ir",
            "splash_fwd",
            "-p",
            "SQ=256",
            "-p",
            "SKV=384",
            "--emit",
            "stablehlo",
        ])
        .output()
        .unwrap();
    let module = String::from_utf8_lossy(&out.stdout);
    assert!(
        module.contains("tensor<1x4x256x64xf32>, %arg9: tensor<1x2x384x64xf32>"),
        "{module}"
    );
    // Bad parameters are one-line errors.
    for (param, want) in [
        ("BQ=48", "block_q"),
        ("mask=window:3", "bad mask `window:3`"),
        ("KVH=3", "not divisible"),
        ("soft_cap=-1", "expected none or a positive number"),
        ("nope=1", "has no parameter `nope`"),
    ] {
        let out = tessera()
            .args(["ir", "splash_dkv", "-p", param])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{param}");
        assert_eq!(stderr.lines().count(), 1, "{param}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(want),
            "{param}: {stderr}"
        );
    }
}
