//! Training end to end on 4 virtual CPU devices, with a model small enough for CI: the
//! strategies agree on the loss step by step (MaxText's check: ulysses against all_gather on
//! the same data and init), the loss falls, and a run saved and resumed continues exactly.

use tessera_parallel::Strategy;
use tessera_train::{ModelConfig, StepMetrics, TrainConfig, Trainer};

fn micro() -> TrainConfig {
    let model = ModelConfig {
        vocab: 32,
        d_model: 32,
        layers: 1,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        mlp_dim: 64,
        rope_theta: 10_000.0,
        norm_eps: 1e-6,
    };
    let mut cfg = TrainConfig::new(model);
    cfg.steps = 5;
    cfg.max_target_length = 64;
    cfg.sa_block_q = 16;
    cfg.sa_block_kv = 16;
    cfg.sa_block_q_dkv = 16;
    cfg.sa_block_kv_dkv = 16;
    cfg.warmup_steps = 1;
    cfg.learning_rate = 1e-2;
    cfg.seed = 3;
    cfg
}

/// The tests that train run one at a time: each already uses every core (4 devices).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn run(cfg: TrainConfig, steps: usize) -> Vec<StepMetrics> {
    let mut t = Trainer::new(cfg).unwrap();
    (0..steps).map(|_| t.train_step().unwrap()).collect()
}

fn losses(m: &[StepMetrics]) -> Vec<f64> {
    m.iter().map(|m| m.loss).collect()
}

#[test]
fn every_strategy_trains_to_the_same_losses_as_all_gather() {
    let _serial = serial();
    let steps = 5;
    let mut reference = micro();
    reference.strategy = Strategy::AllGather;
    let reference = losses(&run(reference, steps));
    assert!(
        reference[steps - 1] < reference[0],
        "the loss falls: {reference:?}"
    );
    let mut cases: Vec<(&str, TrainConfig)> = Vec::new();
    for (name, strategy) in [
        ("ulysses", Strategy::Ulysses),
        ("ring", Strategy::Ring),
        (
            "usp:2x2",
            Strategy::Usp {
                ulysses: 2,
                ring: 2,
            },
        ),
    ] {
        let mut cfg = micro();
        cfg.strategy = strategy;
        cases.push((name, cfg));
    }
    // The batch split over `data` instead: the same global batch and tokens.
    let mut dp = micro();
    dp.ici_data_parallelism = 2;
    dp.ici_context_parallelism = 2;
    cases.push(("ulysses data 2 x context 2", dp));
    for (name, cfg) in cases {
        let got = losses(&run(cfg, steps));
        let diff = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        eprintln!("{name}: max |loss - all_gather| = {diff:.2e} over {steps} steps");
        assert!(diff <= 1e-3, "{name}: {got:?} vs all_gather {reference:?}");
    }
}

#[test]
fn a_resumed_run_continues_exactly() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step3.safetensors");
    let mut cfg = micro();
    cfg.steps = 6;
    let uninterrupted = run(cfg.clone(), 6);
    let mut first = Trainer::new(cfg.clone()).unwrap();
    for _ in 0..3 {
        first.train_step().unwrap();
    }
    first.save(&path).unwrap();
    let mut resumed = Trainer::resume(cfg.clone(), &path).unwrap();
    assert_eq!(resumed.step_count(), 3);
    let rest: Vec<StepMetrics> = (0..3).map(|_| resumed.train_step().unwrap()).collect();
    for (a, b) in rest.iter().zip(&uninterrupted[3..]) {
        assert_eq!(a.step, b.step);
        assert!(
            (a.loss - b.loss).abs() <= 1e-5,
            "step {}: {} vs {}",
            a.step,
            a.loss,
            b.loss
        );
    }
    // Another seed would not continue the same data.
    let mut other = cfg;
    other.seed = 4;
    let err = Trainer::resume(other, &path).unwrap_err().to_string();
    assert!(err.contains("--seed 3"), "{err}");
}

/// A change to a valid configuration.
type Change = Box<dyn Fn(&mut TrainConfig)>;

#[test]
fn bad_combinations_are_named_before_compiling() {
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|c| c.ici_context_parallelism = 8),
            "4 query heads (--heads) are not divisible by 8",
        ),
        (
            Box::new(|c| c.max_target_length = 72),
            "--sa-block-q 16 does not divide",
        ),
        (
            Box::new(|c| c.max_target_length = 66),
            "--max-target-length 66 is not divisible by the 4 sequence shards",
        ),
        (
            Box::new(|c| c.load_balance = true),
            "--context-parallel-load-balance balances the all_gather and ring strategies",
        ),
        (
            Box::new(|c| {
                c.strategy = Strategy::Usp {
                    ulysses: 2,
                    ring: 4,
                }
            }),
            "--ici-context-parallelism 8",
        ),
        (
            Box::new(|c| c.model.kv_heads = 3),
            "--heads 4 is not a multiple of --kv-heads 3",
        ),
    ];
    for (change, expected) in cases {
        let mut cfg = micro();
        change(&mut cfg);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(expected), "{err}\n  expected: {expected}");
        assert!(!err.contains('\n'), "one sentence: {err}");
    }
}
