//! `TrainConfig::sa_use_fused_bwd_kernel`: splash's fused backward (dK, dV and dQ partials in
//! one kernel, the partials summed after it) in the train step trains to the losses of the
//! separate dK/dV and dQ kernels under every strategy that runs splash's backward, with
//! fewer products in the program.

mod common;

use common::{assert_same_losses, micro};
use tessera_parallel::strategy::{AllGather, Ring, Ulysses};
use tessera_parallel::Strategy;
use tessera_train::{train_step_program, TrainConfig};

fn with_fused(mut cfg: TrainConfig, fused: bool) -> TrainConfig {
    cfg.sa_use_fused_bwd_kernel = fused;
    cfg
}

#[test]
fn the_fused_backward_trains_to_the_losses_of_the_separate_kernels() {
    let steps = 4;
    for (name, strategy) in [
        ("ulysses", Strategy::from(Ulysses)),
        ("all_gather", Strategy::from(AllGather)),
        ("ring", Strategy::from(Ring)),
        ("usp:2x2", Strategy::parse("usp:2x2", 4).unwrap()),
    ] {
        let mut cfg = micro();
        cfg.strategy = strategy;
        // Ulysses' device holds the whole 64 tokens: 4 key blocks of 16, more than the 3 dQ
        // partials, so a partial takes two key blocks' contributions.
        // f32: dQ summed in another order.
        assert_same_losses(
            &format!("{name}: fused vs separate"),
            with_fused(cfg.clone(), false),
            with_fused(cfg, true),
            steps,
            1e-5,
        );
    }
}

/// The separate kernels compute the scores and their gradient twice (the dK/dV kernel's
/// four products, the dQ kernel's three); the fused one once (five).
#[test]
fn the_fused_backward_runs_fewer_products() {
    let dots = |cfg: &TrainConfig| {
        let (_, program) = train_step_program(cfg).unwrap();
        program.to_mlir().matches("stablehlo.dot_general").count()
    };
    let mut cfg = micro();
    cfg.strategy = Strategy::from(Ulysses);
    let separate = dots(&with_fused(cfg.clone(), false));
    let fused = dots(&with_fused(cfg, true));
    assert!(
        fused < separate,
        "fused backward: {fused} dots, separate: {separate}"
    );
}
