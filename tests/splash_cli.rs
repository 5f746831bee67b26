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
