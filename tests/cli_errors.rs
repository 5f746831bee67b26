//! Every error a user can cause on the `tessera` command line, tried as a new user would: one
//! line starting with `error:`, a non-zero exit, no panic, and no output file left behind.
//! Also: the XLA plugin's log lines stay off stderr unless asked for.

mod common;

use std::path::Path;
use std::process::Command;

use tessera::dsl::{DType, HostArray};
use tessera::reference::random;

use common::{assert_one_line_error, Dir};

/// The binary, with the environment that changes its logging removed.
fn tessera() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.env_remove("TF_CPP_MIN_LOG_LEVEL")
        .env_remove("TESSERA_VERBOSE")
        .env_remove("TESSERA_GPU_PJRT_PLUGIN");
    c
}

/// Runs `args`; asserts a one-line error containing `want`, and that the directory holds
/// only the files it held before (no output, no temporary file).
fn fails(dir: &Dir, args: &[String], want: &str) {
    let before = dir.files();
    let out = tessera().args(args).output().unwrap();
    assert_one_line_error(args, &out, want);
    assert_eq!(dir.files(), before, "{args:?} left files behind");
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `[1, 4, 128, 64]` q and dout, `[1, 2, 128, 64]` k and v, with NaN/inf variants.
struct Files {
    q: String,
    k: String,
    v: String,
    dout: String,
    short_dout: String,
    nan_dout: String,
    inf_q: String,
}

impl Files {
    /// `attention --q .. --k .. --v .. --out out`.
    fn attention(&self, q: &str, out: &str) -> Vec<String> {
        strings(&[
            "attention",
            "--q",
            q,
            "--k",
            &self.k,
            "--v",
            &self.v,
            "--out",
            out,
        ])
    }
}

fn attention_inputs(d: &Dir) -> Files {
    let with = |shape: [usize; 4], seed: u64, bad: f64| {
        let mut v = random(DType::F32, &shape, seed).to_f64_vec();
        v[3] = bad;
        HostArray::from_f64(DType::F32, shape, &v).unwrap()
    };
    Files {
        q: d.save("q.npy", &random(DType::F32, &[1, 4, 128, 64], 1)),
        k: d.save("k.npy", &random(DType::F32, &[1, 2, 128, 64], 2)),
        v: d.save("v.npy", &random(DType::F32, &[1, 2, 128, 64], 3)),
        dout: d.save("dout.npy", &random(DType::F32, &[1, 4, 128, 64], 4)),
        short_dout: d.save("short.npy", &random(DType::F32, &[1, 4, 64, 64], 4)),
        nan_dout: d.save("nan_dout.npy", &with([1, 4, 128, 64], 4, f64::NAN)),
        inf_q: d.save("inf_q.npy", &with([1, 4, 128, 64], 1, f64::INFINITY)),
    }
}

#[test]
fn attention_checks_every_input_and_output_before_computing() {
    let d = Dir::new("attention");
    let f = attention_inputs(&d);
    let (out, lse) = (d.path("out.npy"), d.path("lse.npy"));
    let (dq, dk, dv) = (d.path("dq.npy"), d.path("dk.npy"), d.path("dv.npy"));
    let grads = |dout: &str, dq: &str, dk: &str, dv: &str| {
        strings(&["--dout", dout, "--dq", dq, "--dk", dk, "--dv", dv])
    };
    let missing_dir = d.path("no-such-dir/lse.npy");
    let dir_slash = format!("{}/", d.0.display());
    let dir_plain = d.0.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            grads(&f.short_dout, &dq, &dk, &dv),
            "dout must be f32[1, 4, 128, 64] like the output",
        ),
        (
            grads(&f.nan_dout, &dq, &dk, &dv),
            "dout holds a non-finite value (NaN)",
        ),
        (strings(&["--lse", &missing_dir]), "does not exist"),
        (strings(&["--lse", &dir_plain]), "is a directory"),
        (strings(&["--lse", "/dev/null"]), "is not a regular file"),
        (grads(&f.dout, &dir_slash, &dk, &dv), "names a directory"),
        (grads(&f.dout, &missing_dir, &dk, &dv), "does not exist"),
        (strings(&["--lse", &out]), "name the same path"),
        (
            // The same file spelled another way.
            strings(&["--lse", &format!("{}/./out.npy", d.0.display())]),
            "name the same path",
        ),
        (grads(&f.dout, &dq, &dk, &dk), "--dk"),
        (strings(&["--lse", &f.q]), "is also the input --q"),
        (
            grads(&f.dout, &dq, &f.dout, &dv),
            "is also the input --dout",
        ),
        (
            strings(&["--strategy", "ring", "--devices", "2", "--dump-hlo", &f.k]),
            "is also the input --k",
        ),
    ];
    for (extra, want) in cases {
        let mut args = f.attention(&f.q, &out);
        args.extend(extra);
        fails(&d, &args, want);
    }
    assert!(!Path::new(&lse).exists());
    // A failure while computing (after the outputs were checked) leaves an existing output
    // as it was, and no temporary file.
    std::fs::write(&out, b"an earlier result").unwrap();
    let mut args = f.attention(&f.q, &out);
    args.extend(strings(&["--lse", &lse, "--backend", "gpu"]));
    fails(&d, &args, "the gpu backend needs a CUDA PJRT plugin");
    assert_eq!(std::fs::read(&out).unwrap(), b"an earlier result");
    assert!(!Path::new(&lse).exists());
}

/// The context-parallel path checks exactly what one device checks, for every strategy.
#[test]
fn every_strategy_checks_inputs_like_one_device() {
    let d = Dir::new("cp");
    let f = attention_inputs(&d);
    let out = d.path("out.npy");
    for strategy in [
        None,
        Some("ulysses"),
        Some("all-gather"),
        Some("ring"),
        Some("usp"),
    ] {
        let base = |q: &str| {
            let mut a = f.attention(q, &out);
            if let Some(s) = strategy {
                a.extend(strings(&["--strategy", s, "--devices", "2"]));
            }
            a
        };
        fails(&d, &base(&f.inf_q), "q holds a non-finite value (inf)");
        for (dout, want) in [
            (&f.nan_dout, "dout holds a non-finite value (NaN)"),
            (
                &f.short_dout,
                "dout must be f32[1, 4, 128, 64] like the output, got f32[1, 4, 64, 64]",
            ),
        ] {
            let mut args = base(&f.q);
            args.extend(strings(&[
                "--dout",
                dout,
                "--dq",
                &d.path("dq.npy"),
                "--dk",
                &d.path("dk.npy"),
                "--dv",
                &d.path("dv.npy"),
            ]));
            fails(&d, &args, want);
        }
    }
}

#[test]
fn sizes_and_counts_must_be_positive() {
    let d = Dir::new("positive");
    for (command, flag) in [
        ("context-parallel", "--heads"),
        ("context-parallel", "--kv-heads"),
        ("context-parallel", "--reps"),
        ("context-parallel", "--devices"),
        ("context-parallel", "--block"),
        ("attention", "--seq"),
        ("attention", "--reps"),
        ("attention", "--block-kv-bwd"),
    ] {
        fails(
            &d,
            &strings(&["bench", command, flag, "0"]),
            &format!("invalid value '0' for '{flag} "),
        );
    }
    let f = attention_inputs(&d);
    for flag in ["--block-q", "--block-kv"] {
        let mut args = f.attention(&f.q, &d.path("o.npy"));
        args.extend(strings(&[flag, "0"]));
        fails(&d, &args, "must be at least 1");
    }
    // A missing required argument is one line too, naming the arguments.
    fails(
        &d,
        &strings(&["attention", "--q", &f.q]),
        "the following required arguments were not provided: --k <K>",
    );
}

#[test]
fn run_checks_parameters_outputs_and_inputs() {
    let d = Dir::new("run");
    let x = d.save("x.npy", &random(DType::F32, &[256, 128], 1));
    let y = d.save("y.npy", &random(DType::F32, &[128, 128], 2));
    let o = d.path("o.npy");
    let run = |extra: &[&str]| {
        let mut a = strings(&["run", "matmul", "-i", &x, "-i", &y]);
        a.extend(strings(extra));
        a
    };
    fails(
        &d,
        &run(&["-p", "M=128", "-o", &o]),
        "parameter M=128 disagrees with argument `x` f32[256, 128], whose dim 0 is 256",
    );
    fails(
        &d,
        &run(&["-p", "K=64", "-o", &o]),
        "parameter K=64 disagrees with argument `x`",
    );
    fails(
        &d,
        &run(&["-p", "M=0", "-o", &o]),
        "expected a positive integer",
    );
    fails(
        &d,
        &run(&["-o", &o, "-o", &d.path("p.npy")]),
        "has 1 output, got 2",
    );
    fails(&d, &run(&["-o", &y]), "is also the input `y`");
    fails(
        &d,
        &run(&["-o", &d.path("nowhere/o.npy")]),
        "does not exist",
    );
    // Sizes that agree with the inputs are fine.
    let out = tessera()
        .args(run(&[
            "-p", "M=256", "-p", "K=128", "-p", "BM=64", "-o", &o,
        ]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tessera::npy::read_npy(Path::new(&o)).unwrap().shape(),
        &[256, 128]
    );
}

#[test]
fn plugin_override_problems_are_named_once() {
    let d = Dir::new("plugin");
    let x = d.save("x.npy", &random(DType::F32, &[128, 128], 1));
    let garbage = d.path("garbage.so");
    std::fs::write(&garbage, b"not a library").unwrap();
    let o = d.path("o.npy");
    for (plugin, want) in [
        (d.0.to_str().unwrap(), "TESSERA_PJRT_PLUGIN="),
        ("/dev/null", "is not a regular file"),
        (garbage.as_str(), "cannot load PJRT plugin"),
    ] {
        let args = strings(&[
            "run",
            "matmul",
            "-i",
            &x,
            "-i",
            &x,
            "-o",
            &o,
            "--backend",
            "cpu",
        ]);
        let before = d.files();
        let out = tessera()
            .env("TESSERA_PJRT_PLUGIN", plugin)
            .args(&args)
            .output()
            .unwrap();
        assert_one_line_error(&args, &out, want);
        assert_eq!(d.files(), before);
        let line = String::from_utf8_lossy(&out.stderr).to_string();
        if plugin == d.0.to_str().unwrap() {
            assert!(line.contains("is a directory"), "{line}");
        }
        // The loader's reason appears once, not again as the error's cause.
        if plugin == garbage {
            assert_eq!(line.matches("file too short").count(), 1, "{line}");
        }
    }
}

/// A successful context-parallel run (whose programs make the plugin log its partitioner)
/// prints nothing on stderr; `-v` and TESSERA_VERBOSE let the plugin's lines through.
#[test]
fn quiet_by_default_verbose_on_request() {
    let d = Dir::new("quiet");
    let f = attention_inputs(&d);
    let args = strings(&[
        "attention",
        "--q",
        &f.q,
        "--k",
        &f.k,
        "--v",
        &f.v,
        "--strategy",
        "ring",
        "--devices",
        "2",
        "--out",
        &d.path("out.npy"),
    ]);
    let out = tessera().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    for verbose in [
        tessera().arg("-v").args(&args).output().unwrap(),
        tessera()
            .env("TESSERA_VERBOSE", "1")
            .args(&args)
            .output()
            .unwrap(),
    ] {
        assert!(verbose.status.success());
        let stderr = String::from_utf8_lossy(&verbose.stderr);
        assert!(stderr.contains("Shardy"), "{stderr}");
        assert!(stderr.contains("cpu_device_count"), "{stderr}");
    }
}
