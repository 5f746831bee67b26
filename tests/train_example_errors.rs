//! The train example misused as a new user would (issues 23 and 37): each misuse gets one
//! sentence, an exit status below 124, no panic, and leaves nothing behind (no output, no
//! temporary file, an existing checkpoint untouched); a run that succeeds writes valid JSON
//! lines.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{assert_refused, train_example, Dir};
use tessera_train::checkpoint::{self, Checkpoint, Schedule};
use tessera_train::model::param_specs;
use tessera_train::{ModelConfig, TrainConfig};

/// Runs the example in `dir` with `args` (on cpu, the default).
fn train(dir: &Dir, args: &[&str]) -> Output {
    Command::new(train_example())
        .current_dir(&dir.0)
        .env_remove("TESSERA_GPU_PJRT_PLUGIN")
        .env_remove("TESSERA_NUM_PROCESSES")
        .args(args)
        .output()
        .unwrap()
}

/// Runs `args`, asserts a refusal containing `want` and that `dir` holds the files it held
/// before, with the same contents.
#[track_caller]
fn refused(dir: &Dir, args: &[&str], want: &str) {
    let before = contents(dir);
    let out = train(dir, args);
    assert_refused(&format!("{args:?}"), &out, want);
    assert!(
        contents(dir) == before,
        "{args:?} changed the files: {:?}",
        dir.files()
    );
}

/// Every file of `dir` with its bytes.
fn contents(dir: &Dir) -> Vec<(String, Vec<u8>)> {
    dir.files()
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(dir.0.join(&f)).unwrap_or_default();
            (f, bytes)
        })
        .collect()
}

/// The example's run with `--steps steps` and its other defaults (tiny, seed 0; a warmup of
/// 10 steps, or all of a shorter run).
fn example_config(steps: usize) -> TrainConfig {
    let mut cfg = TrainConfig::new(ModelConfig::tiny());
    cfg.steps = steps;
    cfg.learning_rate = 3e-3;
    cfg.warmup_steps = steps.min(10);
    cfg.seed = 0;
    cfg
}

/// A checkpoint of the example's tiny model at `step` of a `--steps steps` run, every value
/// `value`.
fn write_checkpoint(dir: &Dir, name: &str, steps: usize, step: usize, value: f32) {
    let cfg = example_config(steps);
    let specs = param_specs(&cfg.model);
    let tensors = specs
        .iter()
        .chain(&specs)
        .chain(&specs)
        .map(|s| vec![value; s.shape.iter().product()])
        .collect();
    let ck = Checkpoint {
        step,
        seed: 0,
        model: cfg.model.to_string(),
        schedule: Schedule::of(&cfg),
        tensors,
    };
    checkpoint::save(Path::new(&dir.path(name)), &specs, &ck).unwrap();
}

#[test]
fn bad_outputs_and_steps_are_refused_before_anything_runs() {
    let d = Dir::new("train-example-outputs");
    write_checkpoint(&d, "ck.safetensors", 3, 2, 0.01);
    write_checkpoint(&d, "nan.safetensors", 3, 2, f32::NAN);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--steps", "3", "--stop-at", "10"],
            "--stop-at 10 is outside 1..=3 (--steps 3)",
        ),
        (
            &["--steps", "3", "--stop-at", "0"],
            "--stop-at 0 is outside 1..=3 (--steps 3)",
        ),
        (
            &["--steps", "3", "--save", "/dev/null"],
            "--save /dev/null is not a regular file",
        ),
        (
            &["--steps", "3", "--save", "missing/ck.safetensors"],
            "--save missing/ck.safetensors: the directory missing does not exist",
        ),
        (
            &["--steps", "3", "--save", "."],
            "--save . names a directory",
        ),
        (
            &["--steps", "3", "--log-json", "log", "--plot", "log"],
            "--plot log and --log-json log name the same path",
        ),
        (
            &["--steps", "3", "--log-json", "x.svg"],
            "--plot x.svg and --log-json x.svg name the same path",
        ),
        (
            &[
                "--steps",
                "3",
                "--dump-hlo",
                "ck.safetensors",
                "--resume",
                "ck.safetensors",
            ],
            "--dump-hlo ck.safetensors is also the input --resume",
        ),
        (
            &[
                "--steps",
                "3",
                "--resume",
                "ck.safetensors",
                "--log-json",
                "ck.safetensors",
            ],
            "--log-json ck.safetensors is also the input --resume",
        ),
        (
            &[
                "--steps",
                "3",
                "--resume",
                "ck.safetensors",
                "--save",
                "ck.safetensors",
            ],
            "--save ck.safetensors is also the input --resume",
        ),
        (
            &["--steps", "4", "--resume", "ck.safetensors"],
            "it was saved with --steps 3, this run has --steps 4",
        ),
        (
            &[
                "--steps",
                "3",
                "--warmup-steps",
                "2",
                "--resume",
                "ck.safetensors",
            ],
            "it was saved with --warmup-steps 3, this run has --warmup-steps 2",
        ),
        // A warmup longer than the run (the default follows a short run: 3 steps here).
        (
            &["--steps", "3", "--warmup-steps", "100"],
            "--warmup-steps 100 is longer than the run (--steps 3): the learning rate would \
             never reach its peak, and the cosine after it would have no steps; use \
             --warmup-steps 3 or less, or more --steps",
        ),
        (
            &[
                "--steps",
                "3",
                "--warmup-steps",
                "4",
                "--save",
                "new.safetensors",
            ],
            "--warmup-steps 4 is longer than the run (--steps 3)",
        ),
        (
            &[
                "--steps",
                "3",
                "--learning-rate",
                "0.001",
                "--resume",
                "ck.safetensors",
            ],
            "it was saved with --learning-rate 0.003, this run has --learning-rate 0.001",
        ),
        (
            &[
                "--steps",
                "3",
                "--stop-at",
                "2",
                "--resume",
                "ck.safetensors",
            ],
            "--resume ck.safetensors is at step 2, at or past --stop-at 2",
        ),
        (
            &["--steps", "2", "--resume", "ck.safetensors"],
            "--resume ck.safetensors is at step 2, and --steps is 2",
        ),
        (
            &["--steps", "3", "--resume", "nan.safetensors"],
            "`embed` holds NaN, not a finite number",
        ),
        (
            &["--per-device-batch-size", "100000000"],
            "the train step needs about",
        ),
        (
            &["--vocab", "100000000000000000"],
            "the train step needs about",
        ),
        (
            &[
                "--heads",
                "4611686018427387904",
                "--head-dim",
                "4611686018427387904",
            ],
            "the train step needs about",
        ),
        (
            &["--max-target-length", "4611686018427387904"],
            "the train step needs about",
        ),
    ];
    for (args, want) in cases {
        refused(&d, args, want);
    }
}

#[test]
fn a_non_finite_gradient_stops_the_run_and_keeps_the_old_checkpoint() {
    let d = Dir::new("train-example-nan");
    // A checkpoint from before, where --save points: it must stay as it was.
    write_checkpoint(&d, "keep.safetensors", 3, 2, 0.01);
    refused(
        &d,
        &[
            "--steps",
            "5",
            "--learning-rate",
            "1e30",
            "--warmup-steps",
            "0",
            "--save",
            "keep.safetensors",
            "--log-json",
            "log.jsonl",
            "--dump-hlo",
            "step.mlir",
        ],
        "gave a non-finite",
    );
}

#[test]
fn a_run_writes_its_outputs_whole_and_its_log_as_json_lines() {
    let d = Dir::new("train-example-ok");
    let out = train(
        &d,
        &[
            "--steps",
            "3",
            "--stop-at",
            "2",
            "--save",
            "ck.safetensors",
            "--log-json",
            "log.jsonl",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.files(), ["ck.safetensors", "log.jsonl", "log.svg"]);
    let log = std::fs::read_to_string(d.0.join("log.jsonl")).unwrap();
    let steps: Vec<u64> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(v["loss"].as_f64().unwrap().is_finite(), "{l}");
            v["step"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(steps, [1, 2]);
    assert_eq!(
        checkpoint::saved_step(&d.0.join("ck.safetensors")).unwrap(),
        2
    );
}
