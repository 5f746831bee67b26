//! What keeps a run from going silently wrong: a checkpoint stores its learning-rate schedule
//! and a resume with another one is refused naming the setting and both values; a checkpoint
//! holding a non-finite number is refused; `checkpoint::save` does not rename over a device;
//! a non-finite loss or gradient norm stops training naming the step; the memory estimate
//! refuses what cannot fit, in arithmetic that cannot overflow.

mod common;

use common::micro;
use tessera_parallel::LibraryNames;
use tessera_runtime::Platform;
use tessera_train::checkpoint::{self, saved_step, Checkpoint, Schedule};
use tessera_train::memory::{check_fits, estimate};
use tessera_train::model::param_specs;
use tessera_train::{Setting, SettingError, TrainConfig, TrainError, Trainer};

/// A checkpoint of `cfg` at step 2 whose tensors are `value` everywhere.
fn checkpoint_of(cfg: &TrainConfig, value: f32) -> Checkpoint {
    let specs = param_specs(&cfg.model);
    let tensors = specs
        .iter()
        .chain(&specs)
        .chain(&specs)
        .map(|s| vec![value; s.shape.iter().product()])
        .collect();
    Checkpoint {
        step: 2,
        seed: cfg.seed,
        model: cfg.model.to_string(),
        schedule: Schedule::of(cfg),
        tensors,
    }
}

#[test]
fn a_resume_with_another_schedule_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ck.safetensors");
    let cfg = micro();
    let specs = param_specs(&cfg.model);
    let ck = checkpoint_of(&cfg, 0.5);
    checkpoint::save(&path, &specs, &ck).unwrap();
    // Nothing but the checkpoint is left in the directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    assert_eq!(saved_step(&path).unwrap(), 2);
    assert_eq!(checkpoint::load(&path, &specs, &cfg).unwrap(), ck);
    type Change = fn(&mut TrainConfig);
    let cases: [(Change, Setting, &str, &str); 4] = [
        (|c| c.steps = 6, Setting::Steps, "5", "6"),
        (|c| c.warmup_steps = 0, Setting::WarmupSteps, "1", "0"),
        (
            |c| c.learning_rate = 3e-3,
            Setting::LearningRate,
            "0.01",
            "0.003",
        ),
        (
            |c| c.final_lr_fraction = 0.5,
            Setting::FinalLrFraction,
            "0.1",
            "0.5",
        ),
    ];
    for (change, want, saved_value, run_value) in cases {
        let mut other = cfg.clone();
        change(&mut other);
        let err = checkpoint::load(&path, &specs, &other).unwrap_err();
        let TrainError::Setting(e) = &err else {
            panic!("{err}")
        };
        let SettingError::CheckpointSchedule {
            setting,
            saved,
            run,
            ..
        } = e.as_ref()
        else {
            panic!("{err}")
        };
        assert_eq!(
            (*setting, saved.as_str(), run.as_str()),
            (want, saved_value, run_value)
        );
        let words = want.term().value(&LibraryNames, saved_value);
        let message = e.describe(&LibraryNames);
        assert!(
            message.contains(&format!("it was saved with {words}")),
            "{message}"
        );
    }
}

#[test]
fn a_checkpoint_holding_nan_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.safetensors");
    let cfg = micro();
    let specs = param_specs(&cfg.model);
    checkpoint::save(&path, &specs, &checkpoint_of(&cfg, f32::NAN)).unwrap();
    let err = checkpoint::load(&path, &specs, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`embed` holds NaN, not a finite number"),
        "{err}"
    );
}

#[test]
fn save_refuses_what_is_not_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = micro();
    let specs = param_specs(&cfg.model);
    let ck = checkpoint_of(&cfg, 0.5);
    for target in [std::path::Path::new("/dev/null"), dir.path()] {
        let err = checkpoint::save(target, &specs, &ck)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let null = std::fs::metadata("/dev/null").unwrap();
        assert!(null.file_type().is_char_device());
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_non_finite_gradient_stops_training_at_its_step() {
    let mut cfg = micro();
    // Adam's first update moves every weight by about the learning rate.
    cfg.learning_rate = 1e30;
    cfg.warmup_steps = 0;
    let mut t = Trainer::new(cfg, Platform::Cpu).unwrap();
    let first = t.train_step().unwrap();
    assert!(first.loss.is_finite() && first.grad_norm.is_finite());
    let err = (0..4).find_map(|_| t.train_step().err()).unwrap();
    let TrainError::NonFinite { step, value, .. } = &err else {
        panic!("{err}")
    };
    assert!(*step >= 2 && !value.is_finite(), "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("step {step} gave a non-finite ")),
        "{message}"
    );
}

#[test]
fn memory_estimates_refuse_what_cannot_fit_without_overflowing() {
    let cfg = micro();
    let e = estimate(&cfg);
    // 16 bytes a parameter; the activations grow with the tokens.
    let params = cfg.model.num_params() as f64;
    assert_eq!(e.state_bytes, 16.0 * params);
    let mut twice = cfg.clone();
    twice.per_device_batch_size = 2.0;
    assert_eq!(estimate(&twice).activation_bytes, 2.0 * e.activation_bytes);
    assert!(check_fits(&cfg, 4, 1e9, "this machine").is_ok());
    let mut huge = cfg.clone();
    huge.per_device_batch_size = 100_000_000.0;
    let message = check_fits(&huge, 4, 16e9, "this machine")
        .unwrap_err()
        .describe(&LibraryNames);
    assert!(
        message.starts_with("the train step needs about ")
            && message.contains("but this machine has 14.9 GiB"),
        "{message}"
    );
    // Dims whose products overflow any integer are estimated past it, not wrapped.
    let mut overflowing = cfg;
    overflowing.model.heads = usize::MAX;
    overflowing.model.head_dim = usize::MAX;
    overflowing.model.vocab = usize::MAX;
    assert!(estimate(&overflowing).per_device() > u64::MAX as f64);
    assert!(check_fits(&overflowing, usize::MAX, 1e30, "anywhere").is_err());
}
