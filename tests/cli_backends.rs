//! `--backend interpret|cpu|gpu|tpu` on `tessera run`, `tessera attention`, `tessera demo` and
//! the train example: a device this machine lacks is refused with one sentence, a non-zero exit and no
//! output left behind; so is a multi-process request the platform cannot honour; cpu runs.
//!
//! A machine with TPU chips (`tessera::runtime::tpu_chips`) runs the tpu cases instead of
//! refusing them; the gpu cases run with `TESSERA_GPU_PJRT_PLUGIN` removed, so they are
//! refused everywhere.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{assert_one_line_error, train_example, Dir};
use tessera::dsl::DType;
use tessera::reference::random;

const NO_TPU: &str = "error: no TPU chips found on this machine (no TPU among the PCI devices \
                      in /sys/bus/pci/devices); the tpu backend runs on a TPU VM";
const NO_GPU: &str = "error: the gpu backend needs a CUDA PJRT plugin";

/// `program` with `args`, without the environment that chooses a GPU plugin or processes.
fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(program);
    c.env_remove("TESSERA_GPU_PJRT_PLUGIN")
        .env_remove("TESSERA_NUM_PROCESSES")
        .args(args)
        .envs(env.iter().copied());
    c.output().unwrap()
}

fn tessera(args: &[&str], env: &[(&str, &str)]) -> Output {
    run(Path::new(env!("CARGO_BIN_EXE_tessera")), args, env)
}

#[track_caller]
fn refused(out: &Output, want: &str) {
    assert_one_line_error(&[], out, want);
}

#[track_caller]
fn succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `name` in `d`: a random f32 array of `shape`.
fn array(d: &Dir, name: &str, shape: &[usize], seed: u64) -> String {
    d.save(name, &random(DType::F32, shape, seed))
}

fn has_tpu() -> bool {
    tessera::runtime::tpu_chips() > 0
}

#[test]
fn attention_runs_on_cpu_and_refuses_missing_devices() {
    let d = Dir::new("attention");
    let q = array(&d, "q.npy", &[1, 2, 256, 64], 1);
    let k = array(&d, "k.npy", &[1, 2, 256, 64], 2);
    let v = array(&d, "v.npy", &[1, 2, 256, 64], 3);
    let out = d.path("out.npy");
    let inputs = d.files();
    let attention = |extra: &[&str]| {
        let mut args = vec![
            "attention",
            "--q",
            &q,
            "--k",
            &k,
            "--v",
            &v,
            "--out",
            &out,
            "--mask",
            "causal",
        ];
        args.extend(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let strategy = ["--strategy", "ring", "--devices", "2"];
    for extra in [&[][..], &strategy[..]] {
        let with = |backend: &str| {
            let mut a = attention(extra);
            a.extend(["--backend".to_string(), backend.to_string()]);
            a
        };
        let args = with("gpu");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&tessera(&args, &[]), NO_GPU);
        assert_eq!(d.files(), inputs, "{args:?} left a file");
        let args = with("tpu");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if has_tpu() {
            succeeded(&tessera(&args, &[]));
        } else {
            refused(&tessera(&args, &[]), NO_TPU);
            assert_eq!(d.files(), inputs, "{args:?} left a file");
        }
        let args = with("cpu");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(
            &tessera(&args, &[("TESSERA_NUM_PROCESSES", "2")]),
            "error: TESSERA_NUM_PROCESSES=2 asks for 2 processes, but tessera runs cpu \
             programs in one process: the XLA CPU plugin has no collectives across processes",
        );
        assert_eq!(d.files(), inputs, "{args:?} left a file");
        succeeded(&tessera(&args, &[]));
        assert!(Path::new(&out).is_file());
        std::fs::remove_file(&out).unwrap();
    }
    let mut args = attention(&strategy);
    args.extend(["--backend".to_string(), "interpret".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        &tessera(&args, &[]),
        "error: --strategy runs one SPMD program on a platform's devices, and the interpreter \
         runs kernels alone; use --backend cpu, gpu or tpu",
    );
    assert_eq!(d.files(), inputs);
}

#[test]
fn run_refuses_missing_devices() {
    let d = Dir::new("run");
    let x = array(&d, "x.npy", &[256, 256], 1);
    let o = d.path("o.npy");
    let inputs = d.files();
    let args = |backend: &'static str| {
        [
            "run",
            "matmul",
            "-i",
            &x,
            "-i",
            &x,
            "-o",
            &o,
            "--backend",
            backend,
        ]
        .map(String::from)
    };
    refused(
        &tessera(&args("gpu").each_ref().map(|s| s.as_str()), &[]),
        NO_GPU,
    );
    assert_eq!(d.files(), inputs);
    let tpu = args("tpu");
    let tpu = tpu.each_ref().map(|s| s.as_str());
    if has_tpu() {
        succeeded(&tessera(&tpu, &[]));
    } else {
        refused(&tessera(&tpu, &[]), NO_TPU);
        assert_eq!(d.files(), inputs);
    }
    refused(
        &tessera(
            &["run", "matmul", "-i", &x, "-o", &o, "--backend", "npu"],
            &[],
        ),
        "error: invalid value 'npu' for '--backend <BACKEND>': unknown backend `npu`; expected \
         interpret, cpu, gpu or tpu",
    );
}

/// `tessera demo --backend B`: a device this machine lacks is refused before any kernel runs
/// (what the demo checks on interpret and cpu, every registered case against its reference, is
/// each family's `check_family` test and tests/kernels_backends.rs).
#[test]
fn demo_refuses_missing_devices() {
    refused(&tessera(&["demo", "--backend", "gpu"], &[]), NO_GPU);
    if !has_tpu() {
        refused(
            &tessera(&["demo", "--backend", "interpret", "--backend", "tpu"], &[]),
            NO_TPU,
        );
    }
}

/// The train example: cpu trains (a micro model, two steps), the others are refused before
/// anything is built or written.
#[test]
fn train_example_runs_on_cpu_and_refuses_missing_devices() {
    let d = Dir::new("train");
    let plot = d.path("loss.svg");
    let log = d.path("log.json");
    let micro = [
        "--steps",
        "2",
        "--vocab",
        "32",
        "--d-model",
        "32",
        "--layers",
        "1",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "8",
        "--mlp-dim",
        "64",
        "--max-target-length",
        "64",
        "--ici-context-parallelism",
        "2",
        "--peak-tflops",
        "1",
        "--plot",
        &plot,
        "--log-json",
        &log,
    ];
    let example = train_example();
    let with = |backend: &'static str| {
        let mut a = vec!["--backend", backend];
        a.extend(micro);
        a
    };
    refused(&run(&example, &with("gpu"), &[]), NO_GPU);
    if has_tpu() {
        succeeded(&run(&example, &with("tpu"), &[]));
        for f in [&plot, &log] {
            std::fs::remove_file(f).unwrap();
        }
    } else {
        refused(&run(&example, &with("tpu"), &[]), NO_TPU);
    }
    refused(
        &run(&example, &with("interpret"), &[]),
        "error: --backend interpret runs kernels alone; the train step is one SPMD program",
    );
    refused(
        &run(&example, &with("cpu"), &[("TESSERA_NUM_PROCESSES", "4")]),
        "error: TESSERA_NUM_PROCESSES=4 asks for 4 processes, but tessera runs cpu programs \
         in one process",
    );
    refused(
        &run(&example, &with("cpu"), &[("TESSERA_NUM_PROCESSES", "two")]),
        "error: TESSERA_NUM_PROCESSES=\"two\" is not a process count; unset it or set it to 1",
    );
    assert!(d.files().is_empty(), "a refusal left {:?}", d.files());
    let out = run(&example, &with("cpu"), &[]);
    succeeded(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("2 cpu devices"), "{stdout}");
    assert_eq!(stdout.matches("completed step: ").count(), 2, "{stdout}");
    assert_eq!(d.files(), ["log.json", "loss.svg"]);
}
