//! `RematPolicy::SaveAttention`: the layer loop's backward reads each layer's attention
//! residuals from the forward instead of re-running the q/k/v projections, the strategy's
//! exchange and the kernels' forward. The losses are those of the full re-run, the program
//! holds fewer collectives, and the memory estimate counts what is kept.

mod common;

use common::{assert_same_losses, micro};
use tessera_parallel::strategy::{AllGather, Ring, Ulysses};
use tessera_parallel::Strategy;
use tessera_train::{memory, train_step_program, RematPolicy, TrainConfig};

fn with_policy(mut cfg: TrainConfig, policy: RematPolicy) -> TrainConfig {
    cfg.remat_policy = policy;
    cfg
}

#[test]
fn saving_the_attention_trains_to_the_losses_of_the_full_re_run() {
    let steps = 4;
    for (name, strategy) in [
        ("ulysses", Strategy::from(Ulysses)),
        ("all_gather", Strategy::from(AllGather)),
        ("ring", Strategy::from(Ring)),
        (
            "ulysses_fused",
            Strategy::parse("ulysses_fused", 4).unwrap(),
        ),
    ] {
        let mut cfg = micro();
        cfg.model.layers = 2;
        cfg.strategy = strategy;
        assert_same_losses(
            &format!("{name}: save_attention vs full"),
            with_policy(cfg.clone(), RematPolicy::Full),
            with_policy(cfg, RematPolicy::SaveAttention),
            steps,
            1e-6,
        );
    }
}

#[test]
fn the_backward_runs_no_exchange_or_kernel_forward_again() {
    let count = |cfg: &TrainConfig, what: &str| {
        let (_, program) = train_step_program(cfg).unwrap();
        program.to_mlir().matches(what).count()
    };
    let mut cfg = micro();
    cfg.strategy = Strategy::from(Ulysses);
    let full = with_policy(cfg.clone(), RematPolicy::Full);
    let saved = with_policy(cfg, RematPolicy::SaveAttention);
    // Per layer (the loop body is in the text once): the forward's four all-to-alls (q, k,
    // v, the output), the re-run's four and the backward's four transposes; saving the
    // attention drops the re-run's.
    let a2a = "\"stablehlo.all_to_all\"";
    assert_eq!(count(&full, a2a) - count(&saved, a2a), 4);
    // Fewer dots: the re-run's q/k/v projections and the kernels' forward are gone.
    let dots = "stablehlo.dot_general";
    assert!(count(&saved, dots) < count(&full, dots) - 3);
}

#[test]
fn the_memory_estimate_counts_the_kept_attention() {
    let mut cfg = micro();
    cfg.strategy = Strategy::from(Ulysses);
    let full = memory::estimate(&with_policy(cfg.clone(), RematPolicy::Full));
    let saved = memory::estimate(&with_policy(cfg.clone(), RematPolicy::SaveAttention));
    assert_eq!(full.state_bytes, saved.state_bytes);
    // Per token and layer: q (4 heads), k and v (2 KV heads each), the kernels' output and
    // the projection's input (4 heads each) of 8 f32 values, and 4 f32 logsumexps.
    let layers = cfg.model.layers as f64;
    let tokens = cfg.per_device_batch_size * cfg.max_target_length as f64;
    let per_token = (4.0 + 2.0 * 2.0 + 4.0 + 4.0) * 8.0 * 4.0 + 4.0 * 4.0;
    let expected = tokens * layers * per_token;
    assert_eq!(saved.activation_bytes - full.activation_bytes, expected);
    // A strategy that gathers K and V keeps them whole: 4 copies on 4 devices.
    cfg.strategy = Strategy::from(AllGather);
    let gathered = memory::estimate(&with_policy(cfg, RematPolicy::SaveAttention));
    let extra = tokens * layers * 3.0 * 2.0 * 2.0 * 8.0 * 4.0;
    assert_eq!(gathered.activation_bytes - saved.activation_bytes, extra);
}
