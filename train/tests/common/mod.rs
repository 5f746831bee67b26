//! What the train tests share.

use tessera_runtime::Platform;
use tessera_train::{ModelConfig, TrainConfig, Trainer};

/// A model small enough for CI (1 layer, 4 heads of 8, 2 KV heads), 64 tokens on 4 context
/// devices, blocks 16, 5 steps.
pub fn micro() -> TrainConfig {
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

/// The losses of the first `steps` steps of `cfg` on the CPU devices.
#[allow(dead_code)] // not every test file compares runs
pub fn losses(cfg: TrainConfig, steps: usize) -> Vec<f64> {
    let mut t = Trainer::new(cfg, Platform::Cpu).unwrap();
    (0..steps).map(|_| t.train_step().unwrap().loss).collect()
}

/// The largest `|a[i] - b[i]|`.
#[allow(dead_code)] // not every test file compares runs
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()))
}

/// Trains `reference` and `other` (one setting apart) for `steps` steps and asserts that
/// their losses agree within `tolerance` and that `reference`'s falls; `what` names the
/// comparison in the messages.
#[allow(dead_code)] // not every test file compares runs
pub fn assert_same_losses(
    what: &str,
    reference: TrainConfig,
    other: TrainConfig,
    steps: usize,
    tolerance: f64,
) {
    let expected = losses(reference, steps);
    let got = losses(other, steps);
    let diff = max_abs_diff(&expected, &got);
    eprintln!("{what}: max |loss difference| = {diff:.2e}");
    assert!(diff <= tolerance, "{what}: {got:?} vs {expected:?}");
    assert!(
        expected[steps - 1] < expected[0],
        "{what}: the loss falls: {expected:?}"
    );
}
