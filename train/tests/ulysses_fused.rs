//! The train step with `ulysses_fused` (the all-to-alls inside the attention kernels) on 4
//! virtual CPU devices: the tiny model trains to the losses of the step with plain Ulysses
//! (XLA's all-to-alls around splash) within 1e-3 over 20 steps, and its step moves q, k, v
//! and the output by the kernels' remote copies, with no all-to-all left.

use tessera_parallel::Strategy;
use tessera_runtime::Platform;
use tessera_train::{train_step_program, ModelConfig, StepMetrics, TrainConfig, Trainer};

/// The tiny model (2 layers, 8 heads of 16, 4 KV heads, 256 tokens) on 4 context devices.
fn tiny(strategy: &str) -> TrainConfig {
    let mut cfg = TrainConfig::new(ModelConfig::tiny());
    cfg.strategy = Strategy::parse(strategy, 4).unwrap();
    cfg.warmup_steps = 2;
    cfg.learning_rate = 1e-2;
    cfg.with_default_blocks()
}

fn run(cfg: TrainConfig, steps: usize) -> Vec<StepMetrics> {
    let mut t = Trainer::new(cfg, Platform::Cpu).unwrap();
    (0..steps).map(|_| t.train_step().unwrap()).collect()
}

#[test]
fn tiny_trains_like_ulysses_over_20_steps() {
    let steps = 20;
    let plain = run(tiny("ulysses"), steps);
    let fused = run(tiny("ulysses_fused"), steps);
    let worst = fused
        .iter()
        .zip(&plain)
        .map(|(a, b)| (a.loss - b.loss).abs())
        .fold(0.0, f64::max);
    eprintln!(
        "max |loss difference| over {steps} steps: {worst:.2e}; losses {:?}",
        fused.iter().map(|m| m.loss).collect::<Vec<_>>()
    );
    for (a, b) in fused.iter().zip(&plain) {
        assert!(
            (a.loss - b.loss).abs() <= 1e-3,
            "step {}: loss {} with the fused kernels, {} with ulysses",
            a.step,
            a.loss,
            b.loss
        );
    }
    let (first, last) = (fused[0].loss, fused[steps - 1].loss);
    assert!(last < first, "the loss went from {first} to {last}");
}

#[test]
fn the_fused_step_exchanges_heads_by_remote_copies_only() {
    let count = |cfg: &TrainConfig, op: &str| {
        let (_, program) = train_step_program(cfg).unwrap();
        let text = program.to_mlir();
        text.matches(&format!("\"stablehlo.{op}\"")).count()
    };
    let (plain, fused) = (tiny("ulysses"), tiny("ulysses_fused"));
    assert!(count(&plain, "all_to_all") > 0);
    assert_eq!(count(&plain, "collective_permute"), 0);
    assert_eq!(count(&fused, "all_to_all"), 0);
    assert!(count(&fused, "collective_permute") > 0);
}
