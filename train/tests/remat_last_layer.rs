//! `TrainConfig::remat_last_layer` off: the layer loop's last iteration runs after the loop
//! and its backward reads the activations of its own forward instead of re-running it. The
//! step computes what the full re-run computes: the same losses under every strategy, with
//! one or several layers per iteration, with either remat policy, with the weights sharded,
//! and with one layer (no loop left).

mod common;

use common::{assert_same_losses, micro};
use tessera_parallel::strategy::{AllGather, Ring, Ulysses};
use tessera_parallel::Strategy;
use tessera_train::{train_step_program, RematPolicy, TrainConfig};

fn with_last_layer_rerun(mut cfg: TrainConfig, rerun: bool) -> TrainConfig {
    cfg.remat_last_layer = rerun;
    cfg
}

/// Losses of 4 steps with and without the last layer's re-run: equal up to f32 rounding
/// (the kept activations are what the re-run recomputes), and falling.
fn assert_kept_like_rerun(name: &str, cfg: TrainConfig) {
    assert_same_losses(
        &format!("{name}: kept vs re-run"),
        with_last_layer_rerun(cfg.clone(), true),
        with_last_layer_rerun(cfg, false),
        4,
        1e-6,
    );
}

#[test]
fn keeping_the_last_layer_trains_to_the_losses_of_the_full_re_run() {
    for (name, strategy) in [
        ("ulysses", Strategy::from(Ulysses)),
        ("all_gather", Strategy::from(AllGather)),
        ("ring", Strategy::from(Ring)),
        ("usp:2x2", Strategy::parse("usp:2x2", 4).unwrap()),
        (
            "ulysses_fused",
            Strategy::parse("ulysses_fused", 4).unwrap(),
        ),
    ] {
        let mut cfg = micro();
        // Two layers in the loop, the third after it.
        cfg.model.layers = 3;
        cfg.strategy = strategy;
        assert_kept_like_rerun(name, cfg);
    }
}

#[test]
fn keeping_the_last_layer_works_with_every_loop_shape_and_policy() {
    let mut one_layer = micro();
    one_layer.model.layers = 1;
    assert_kept_like_rerun("1 layer (no loop)", one_layer);

    let mut two_per_iteration = micro();
    two_per_iteration.model.layers = 4;
    two_per_iteration.layers_per_iteration = 2;
    assert_kept_like_rerun("4 layers, 2 per iteration", two_per_iteration);

    let mut saved = micro();
    saved.model.layers = 2;
    saved.remat_policy = RematPolicy::SaveAttention;
    assert_kept_like_rerun("save_attention", saved);

    let mut fused = micro();
    fused.model.layers = 2;
    fused.sa_use_fused_bwd_kernel = true;
    assert_kept_like_rerun("fused splash backward", fused);
}

/// The weights split over fsdp (gathered inside the loop, and for the last layer after it),
/// also through the all-gather matmul kernel, and over the context axis alone.
#[test]
fn keeping_the_last_layer_works_with_sharded_weights() {
    let mut fsdp = micro();
    fsdp.model.layers = 2;
    fsdp.ici_fsdp_parallelism = 2;
    fsdp.ici_context_parallelism = 2;
    assert_kept_like_rerun("fsdp 2 x context 2", fsdp.clone());

    let mut kernel = fsdp;
    kernel.collective_matmul = true;
    assert_kept_like_rerun("fsdp 2 x context 2, all-gather matmul", kernel);

    let mut over_context = micro();
    over_context.model.layers = 2;
    over_context.shard_weights_over_context = true;
    assert_kept_like_rerun("weights over context", over_context);
}

/// With one layer nothing is left to loop over: the step without the last layer's re-run
/// has neither the layer loop nor its backward loop (nor the loops of the re-run copy of
/// the layer inside that backward loop).
#[test]
fn a_one_layer_step_without_the_re_run_has_no_layer_loop() {
    let loops = |rerun: bool| {
        let mut cfg = micro();
        cfg.model.layers = 1;
        let (_, program) = train_step_program(&with_last_layer_rerun(cfg, rerun)).unwrap();
        program.to_mlir().matches("stablehlo.while").count()
    };
    let (rerun, kept) = (loops(true), loops(false));
    assert!(
        kept + 2 <= rerun,
        "the forward and backward layer loops: {rerun} loops with the re-run, {kept} without"
    );
}
