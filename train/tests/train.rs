//! Training end to end on 4 virtual CPU devices, with a model small enough for CI: the
//! strategies agree on the loss step by step (MaxText's check: ulysses against all_gather on
//! the same data and init), the loss falls, and a run saved and resumed continues exactly.

mod common;

use common::{max_abs_diff, micro};
use tessera_parallel::strategy::{AllGather, Ring, Ulysses, Usp};
use tessera_parallel::Strategy;
use tessera_runtime::Platform;
use tessera_train::model::ParamSpec;
use tessera_train::{StepMetrics, TrainConfig, Trainer};

/// The tests that train run one at a time: each already uses every core (4 devices).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn run(cfg: TrainConfig, steps: usize) -> Vec<StepMetrics> {
    let mut t = Trainer::new(cfg, Platform::Cpu).unwrap();
    (0..steps).map(|_| t.train_step().unwrap()).collect()
}

/// `resumed` takes the steps of `expected` with the same losses (within 1e-5).
fn assert_continues(resumed: &mut Trainer, expected: &[StepMetrics]) {
    for b in expected {
        let a = resumed.train_step().unwrap();
        assert_eq!(a.step, b.step);
        assert!(
            (a.loss - b.loss).abs() <= 1e-5,
            "step {}: {} vs {}",
            a.step,
            a.loss,
            b.loss
        );
    }
}

fn losses(m: &[StepMetrics]) -> Vec<f64> {
    m.iter().map(|m| m.loss).collect()
}

#[test]
fn every_strategy_trains_to_the_same_losses_as_all_gather() {
    let _serial = serial();
    let steps = 5;
    let mut reference = micro();
    reference.strategy = Strategy::from(AllGather);
    let reference = losses(&run(reference, steps));
    assert!(
        reference[steps - 1] < reference[0],
        "the loss falls: {reference:?}"
    );
    let mut cases: Vec<(&str, TrainConfig)> = Vec::new();
    for (name, strategy) in [
        ("ulysses", Strategy::from(Ulysses)),
        ("ring", Strategy::from(Ring)),
        (
            "usp:2x2",
            Strategy::from(Usp {
                ulysses: 2,
                ring: 2,
            }),
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
    // No parallelism: the same global batch of whole sequences on one device, no
    // collectives.
    let mut single = micro();
    single.ici_context_parallelism = 1;
    single.per_device_batch_size = 4.0;
    cases.push(("one device", single));
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
    let mut first = Trainer::new(cfg.clone(), Platform::Cpu).unwrap();
    for _ in 0..3 {
        first.train_step().unwrap();
    }
    first.save(&path).unwrap();
    let mut resumed = Trainer::resume(cfg.clone(), &path, Platform::Cpu).unwrap();
    assert_eq!(resumed.step_count(), 3);
    assert_continues(&mut resumed, &uninterrupted[3..]);
    // Another seed would not continue the same data.
    let mut other = cfg;
    other.seed = 4;
    let err = Trainer::resume(other, &path, Platform::Cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("it was saved with seed = 3"), "{err}");
}

/// `cfg` on data 2 x context 2 (parallelism `dp`) or fsdp 2 x context 2.
fn on_batch_axis(mut cfg: TrainConfig, fsdp: bool) -> TrainConfig {
    cfg.ici_context_parallelism = 2;
    if fsdp {
        cfg.ici_fsdp_parallelism = 2;
    } else {
        cfg.ici_data_parallelism = 2;
    }
    cfg
}

#[test]
fn fsdp_trains_to_the_same_losses_as_data_parallelism() {
    let _serial = serial();
    let steps = 5;
    let mut reference = micro();
    reference.strategy = Strategy::from(AllGather);
    let reference = losses(&run(reference, steps));
    // With ulysses and ring the weights are split 2 x 2 (fsdp x context); usp:1x2 keeps them
    // replicated over its ring axis, whose gradient shards still need their sum.
    let usp = Strategy::from(Usp {
        ulysses: 1,
        ring: 2,
    });
    for (name, strategy) in [
        ("ulysses", Strategy::from(Ulysses)),
        ("ring", Strategy::from(Ring)),
        ("usp:1x2", usp),
    ] {
        let mut cfg = micro();
        cfg.strategy = strategy;
        let data = losses(&run(on_batch_axis(cfg.clone(), false), steps));
        let fsdp = losses(&run(on_batch_axis(cfg, true), steps));
        let (to_data, to_reference) = (max_abs_diff(&fsdp, &data), max_abs_diff(&fsdp, &reference));
        eprintln!(
            "{name} fsdp 2 x context 2: max |loss - data 2 x context 2| = {to_data:.2e}, \
             max |loss - all_gather on 4| = {to_reference:.2e} over {steps} steps"
        );
        assert!(to_data <= 1e-5, "{name}: fsdp {fsdp:?} vs data {data:?}");
        assert!(
            to_reference <= 1e-3,
            "{name}: fsdp {fsdp:?} vs all_gather {reference:?}"
        );
    }
}

/// Two layers per loop iteration (what `tessera compile train` compiles to measure a layer)
/// compute the same step as one: the same losses, with fsdp splitting the stacked weights.
#[test]
fn two_layers_per_loop_iteration_train_like_one() {
    let _serial = serial();
    let steps = 3;
    let mut cfg = on_batch_axis(micro(), true);
    cfg.model.layers = 4;
    let one = losses(&run(cfg.clone(), steps));
    cfg.layers_per_iteration = 2;
    let two = losses(&run(cfg.clone(), steps));
    let diff = max_abs_diff(&one, &two);
    eprintln!("1 vs 2 layers per iteration: max |loss difference| = {diff:.2e}");
    assert!(diff <= 1e-5, "{one:?} vs {two:?}");
    cfg.layers_per_iteration = 3;
    let e = Trainer::new(cfg, Platform::Cpu)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("3 layers per loop iteration do not divide the 4 layers"),
        "{e}"
    );
}

/// The bytes of the f32 parameters and both AdamW moments one device holds when every tensor
/// but the norm scales is split `ways` ways.
fn state_bytes(specs: &[ParamSpec], ways: usize) -> usize {
    let elements = |sharded: bool| -> usize {
        specs
            .iter()
            .filter(|s| s.fsdp_dim.is_some() == sharded)
            .map(|s| s.shape.iter().product::<usize>())
            .sum()
    };
    3 * 4 * (elements(true) / ways + elements(false))
}

#[test]
fn fsdp_shards_the_state_and_resumes_exactly() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fsdp_step3.safetensors");
    let mut cfg = on_batch_axis(micro(), true);
    cfg.steps = 6;
    let uninterrupted = run(cfg.clone(), 6);
    let mut first = Trainer::new(cfg.clone(), Platform::Cpu).unwrap();
    // Every tensor but the norm scales (d_model floats each) is split in four: fsdp 2 x
    // context 2.
    let specs = first.param_specs().to_vec();
    let expected = state_bytes(&specs, 4);
    let fsdp_bytes = first.state_bytes_per_device();
    let replicated_bytes = Trainer::new(on_batch_axis(micro(), false), Platform::Cpu)
        .unwrap()
        .state_bytes_per_device();
    eprintln!(
        "state per device: replicated {replicated_bytes} B, fsdp 2 x context 2 {fsdp_bytes} B"
    );
    assert_eq!(fsdp_bytes, expected);
    assert_eq!(replicated_bytes, state_bytes(&specs, 1));
    for _ in 0..3 {
        first.train_step().unwrap();
    }
    first.save(&path).unwrap();
    // The checkpoint holds the full arrays: a replicated run loads it too.
    let mut replicated = on_batch_axis(micro(), false);
    replicated.steps = 6;
    let mut replicated = Trainer::resume(replicated, &path, Platform::Cpu).unwrap();
    assert_continues(&mut replicated, &uninterrupted[3..4]);
    let saved = first.state_on_host().unwrap();
    for (t, s) in saved.iter().zip(specs.iter().cycle()) {
        assert_eq!(t.len(), s.shape.iter().product::<usize>(), "{}", s.name);
    }
    let mut resumed = Trainer::resume(cfg.clone(), &path, Platform::Cpu).unwrap();
    assert_eq!(resumed.state_on_host().unwrap(), saved);
    assert_continues(&mut resumed, &uninterrupted[3..]);
}

/// With one device on the batch axis, the weights split over the context axis alone
/// (MaxText's `embed` rule without fsdp) train to the replicated run's losses, 4 ways for each
/// strategy (usp:2x2: rows over its ring axis, the other dim over its Ulysses axis), each
/// device holding its share of the state. On a data-parallel batch axis the split is refused.
#[test]
fn weights_split_over_context_train_to_the_replicated_losses() {
    let _serial = serial();
    let steps = 5;
    let usp = Strategy::from(Usp {
        ulysses: 2,
        ring: 2,
    });
    for (name, strategy, ways) in [
        ("ulysses", Strategy::from(Ulysses), 4),
        ("ring", Strategy::from(Ring), 4),
        ("usp:2x2", usp, 4),
    ] {
        let mut cfg = micro();
        cfg.strategy = strategy;
        let replicated = losses(&run(cfg.clone(), steps));
        cfg.shard_weights_over_context = true;
        assert!(cfg.shards_weights() && !cfg.fsdp());
        let mut t = Trainer::new(cfg, Platform::Cpu).unwrap();
        let expected = state_bytes(t.param_specs(), ways);
        assert_eq!(t.state_bytes_per_device(), expected, "{name}");
        let split: Vec<f64> = (0..steps).map(|_| t.train_step().unwrap().loss).collect();
        let diff = max_abs_diff(&split, &replicated);
        eprintln!(
            "{name}: weights over context ({ways} ways): max |loss - replicated| = {diff:.2e} \
             over {steps} steps"
        );
        assert!(diff <= 1e-6, "{name}: {split:?} vs {replicated:?}");
    }
    let mut data = on_batch_axis(micro(), false);
    data.shard_weights_over_context = true;
    let e = data.validate().unwrap_err().to_string();
    assert!(
        e.contains("splits the weights over the context axis, but the data degree 2 replicates"),
        "{e}"
    );
}

/// MaxText's fractional `per_device_batch_size`: 0.25 on 4 context devices is one sequence a
/// step, split over the context axis; it trains as that one sequence does on one device.
#[test]
fn a_fractional_per_device_batch_trains_one_sequence_over_the_context_axis() {
    let _serial = serial();
    let mut split = micro();
    split.per_device_batch_size = 0.25;
    split.validate().unwrap();
    assert_eq!((split.global_batch(), split.sequences_per_shard()), (1, 1));
    let mut single = micro();
    single.ici_context_parallelism = 1;
    single.per_device_batch_size = 1.0;
    assert_eq!(single.global_batch(), 1);
    let (got, expected) = (losses(&run(split, 2)), losses(&run(single, 2)));
    let diff = max_abs_diff(&got, &expected);
    assert!(diff <= 1e-3, "{got:?} vs one device {expected:?}");
}

/// A fraction of a sequence per device is accepted when the context axis covers it (each
/// batch shard gets whole sequences), refused otherwise with one sentence.
#[test]
fn fractional_batches_are_accepted_only_in_whole_sequences_per_shard() {
    let accepted: [(f64, usize, usize, usize); 4] = [
        // (per device, data, context, global batch)
        (0.25, 1, 4, 1),
        (0.5, 2, 2, 2),
        (0.75, 1, 4, 3),
        (2.0, 2, 2, 8),
    ];
    for (per_device, data, context, global) in accepted {
        let mut cfg = micro();
        cfg.per_device_batch_size = per_device;
        cfg.ici_data_parallelism = data;
        cfg.ici_context_parallelism = context;
        cfg.validate()
            .unwrap_or_else(|e| panic!("{per_device} on {data}x{context}: {e}"));
        assert_eq!(
            cfg.global_batch(),
            global,
            "{per_device} on {data}x{context}"
        );
    }
    let refused: [(f64, usize, usize, &str); 4] = [
        (
            0.1,
            1,
            4,
            "per_device_batch_size = 0.1 x the context degree 4 gives each of the 1 batch \
             shards 0.4 sequences; the context devices split one sequence, but a batch shard \
             needs whole sequences: use a multiple of 0.25 (1 / the context degree)",
        ),
        (0.25, 2, 2, "each of the 2 batch shards 0.5 sequences"),
        (
            0.0,
            1,
            4,
            "per_device_batch_size = 0 is not a positive number",
        ),
        (f64::NAN, 1, 4, "is not a positive number"),
    ];
    for (per_device, data, context, expected) in refused {
        let mut cfg = micro();
        cfg.per_device_batch_size = per_device;
        cfg.ici_data_parallelism = data;
        cfg.ici_context_parallelism = context;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(expected), "{err}\n  expected: {expected}");
        assert!(!err.contains('\n'), "one sentence: {err}");
    }
}

/// A change to a valid configuration.
type Change = Box<dyn Fn(&mut TrainConfig)>;

#[test]
fn bad_combinations_are_named_before_compiling() {
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|c| c.ici_context_parallelism = 8),
            "ulysses: the 4 query heads are not divisible by the Ulysses degree 8",
        ),
        (
            Box::new(|c| c.max_target_length = 72),
            "ulysses: block_q = 16 does not divide the 72 queries each attention call holds",
        ),
        (
            Box::new(|c| c.max_target_length = 66),
            "the sequence length 66 is not divisible by the 4 sequence shards (the context degree 4)",
        ),
        (
            Box::new(|c| c.load_balance = true),
            "load balancing (load_balance) balances the all-gather and ring strategies, not ulysses",
        ),
        (
            Box::new(|c| {
                c.strategy = Strategy::from(Usp {
                    ulysses: 2,
                    ring: 4,
                })
            }),
            "usp:2x4 runs on 8 devices (the product of its degrees), but the context degree is 4",
        ),
        (
            Box::new(|c| c.model.kv_heads = 3),
            "the 4 query heads are not a multiple of the 3 KV heads",
        ),
        (
            Box::new(|c| c.ici_fsdp_parallelism = 3),
            "the fsdp degree 3 shards the parameters' d_model dim (32) over 3 devices",
        ),
        (
            Box::new(|c| {
                c.ici_fsdp_parallelism = 2;
                c.model.mlp_dim = 65;
            }),
            "the fsdp degree 2 shards the parameters' mlp_dim dim (65)",
        ),
        (
            Box::new(|c| {
                c.ici_fsdp_parallelism = 2;
                c.ici_context_parallelism = 2;
                c.model.vocab = 33;
            }),
            "the fsdp degree 2 also shards the parameters' vocab dim (33) over the 2 context \
             devices (the context degree 2)",
        ),
        (
            Box::new(|c| {
                c.ici_fsdp_parallelism = 2;
                c.ici_data_parallelism = 2;
            }),
            "the data degree 2 and the fsdp degree 2 both split the batch",
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

#[test]
fn bf16_compute_tracks_f32_and_the_loss_falls() {
    let _serial = serial();
    let steps = 5;
    // fsdp 2 x context 2, so each layer's weights are cast before their all-gathers.
    let f32_cfg = on_batch_axis(micro(), true);
    let mut bf16_cfg = f32_cfg.clone();
    bf16_cfg.dtype = tessera_hlo::DType::BF16;
    let f32_losses = losses(&run(f32_cfg, steps));
    let bf16_losses = losses(&run(bf16_cfg, steps));
    let diff = max_abs_diff(&bf16_losses, &f32_losses);
    eprintln!("bf16 {bf16_losses:?}\nf32 {f32_losses:?}\nmax |bf16 - f32| = {diff:.2e}");
    assert!(diff <= 1e-2, "bf16 {bf16_losses:?} vs f32 {f32_losses:?}");
    assert!(
        bf16_losses[steps - 1] < bf16_losses[0] - 0.1,
        "{bf16_losses:?}"
    );
}
