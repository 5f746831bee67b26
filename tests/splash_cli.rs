//! `tessera attention`: results against the f64 reference, `--stats`, and one-line errors
//! with a non-zero exit for bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::dsl::{DType, HostArray};
use tessera::npy::{read_npy, write_npy};
use tessera::reference::random;
use tessera::splash::reference::{self, RefInputs};
use tessera::splash::{Dims, Mask, MultiHeadMask, SeqOffsets};

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

/// Runs the CLI; returns (success, stdout, stderr lines that are not plugin logs).
fn run(args: &[&str]) -> (bool, String, Vec<String>) {
    let out = tessera().arg("attention").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error"))
        .map(str::to_string)
        .collect();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
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
        "64".into(),
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
    // 4 query blocks x 2 key blocks per head; the window of 64 reaches into the previous key
    // block only from query block 2: 1 + 1 + 2 + 1 blocks per head, all partial.
    assert_eq!(
        stdout.trim(),
        "{\"block_q\":64,\"block_kv\":128,\"kv_blocks_total\":32,\"kv_blocks_computed\":20,\
         \"kv_blocks_skipped\":12,\"kv_blocks_masked\":20}"
    );
    let mask: MultiHeadMask = Mask::local(64, 0).into();
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let r = RefInputs {
        dims: Dims::of(q.shape(), k.shape(), v.shape()).unwrap(),
        q: &qf,
        k: &kf,
        v: &vf,
        q_segment_ids: Some(&seg),
        kv_segment_ids: Some(&seg),
        sinks: None,
        mask: &mask,
        offsets: SeqOffsets::default(),
        scale: 0.2,
        soft_cap: Some(3.0),
    };
    let want = reference::forward(&r);
    let grads = reference::backward(&r, &dout.to_f64_vec());
    let err = |name: &str, want: &[f64]| {
        let got = read_npy(&d.join(name)).unwrap().to_f64_vec();
        let scale = if name.starts_with('d') {
            want.iter().map(|x| x.abs()).fold(0.0, f64::max)
        } else {
            1.0
        };
        got.iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f64::max)
            / scale
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
    let mask: MultiHeadMask = Mask::causal().into();
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let r = RefInputs {
        dims: Dims::of(q.shape(), k.shape(), v.shape()).unwrap(),
        q: &qf,
        k: &kf,
        v: &vf,
        q_segment_ids: Some(&seg),
        kv_segment_ids: Some(&seg),
        sinks: None,
        mask: &mask,
        offsets: SeqOffsets::default(),
        scale: 1.0 / 8.0,
        soft_cap: None,
    };
    let want = reference::forward(&r);
    let grads = reference::backward(&r, &dout.to_f64_vec());
    let inputs = [
        ("--q", save(&d, "q.npy", &q)),
        ("--k", save(&d, "k.npy", &k)),
        ("--v", save(&d, "v.npy", &v)),
        ("--segment-ids", save(&d, "seg.npy", &segs)),
        ("--dout", save(&d, "dout.npy", &dout)),
    ];
    let p = |n: &str| d.join(n).to_str().unwrap().to_string();
    for (strategy, devices, permutes, all_to_alls, balanced) in [
        ("ring", "4", true, false, false),
        ("usp:2x2", "4", true, true, false),
        ("all_gather", "2", false, false, false),
        ("ring", "2", true, false, true),
    ] {
        let mut args: Vec<String> = inputs
            .iter()
            .flat_map(|(flag, path)| [flag.to_string(), path.clone()])
            .collect();
        for (flag, value) in [
            ("--mask", "causal".to_string()),
            ("--strategy", strategy.to_string()),
            ("--devices", devices.to_string()),
            ("--dump-hlo", p("prog.mlir")),
            ("--out", p("out.npy")),
            ("--lse", p("lse.npy")),
            ("--dq", p("dq.npy")),
            ("--dk", p("dk.npy")),
            ("--dv", p("dv.npy")),
        ] {
            args.extend([flag.to_string(), value]);
        }
        args.push("--stats".into());
        if balanced {
            args.push("--load-balance".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, err) = run(&args);
        assert!(ok, "{strategy}: {err:?}");
        let read = |n: &str| read_npy(&d.join(n)).unwrap().to_f64_vec();
        let max_err = |got: Vec<f64>, want: &[f64]| {
            let scale = want.iter().map(|x| x.abs()).fold(0.0, f64::max).max(1.0);
            got.iter()
                .zip(want)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0, f64::max)
                / scale
        };
        assert!(
            max_err(read("out.npy"), &want.out) <= 2e-4,
            "{strategy}: out"
        );
        assert!(
            max_err(read("lse.npy"), &want.lse) <= 2e-4,
            "{strategy}: lse"
        );
        assert!(max_err(read("dq.npy"), &grads.dq) <= 1e-3, "{strategy}: dq");
        assert!(max_err(read("dk.npy"), &grads.dk) <= 1e-3, "{strategy}: dk");
        assert!(max_err(read("dv.npy"), &grads.dv) <= 1e-3, "{strategy}: dv");
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
            "the sequence length 128 is not divisible by the context degree 3",
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
            "does not support load balancing",
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
            "--strategy runs on the XLA CPU plugin's devices",
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
