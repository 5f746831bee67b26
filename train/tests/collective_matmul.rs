//! The fsdp train step with the all-gather matmul (`collective_matmul`) on 4 virtual CPU
//! devices: it trains to the same losses as the step that all-gathers each weight before a
//! dot, step by step, with the same gradient norms; and it is refused without fsdp.

use tessera_parallel::Names;
use tessera_runtime::Platform;
use tessera_train::{train_step_program, ModelConfig, StepMetrics, TrainConfig, Trainer};

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

/// `cfg` trained for `steps` steps with and without the all-gather matmul: each step's
/// losses within `1e-6` and gradient norms within `1e-5` relative, and the loss falls.
fn trains_like_the_gathered_matmuls(cfg: TrainConfig, steps: usize, what: &str) {
    let plain = run(cfg.clone(), steps);
    let fused = run(
        TrainConfig {
            collective_matmul: true,
            ..cfg
        },
        steps,
    );
    let mut loss_diff: f64 = 0.0;
    let mut norm_diff: f64 = 0.0;
    for (a, b) in fused.iter().zip(&plain) {
        loss_diff = loss_diff.max((a.loss - b.loss).abs());
        norm_diff = norm_diff.max((a.grad_norm - b.grad_norm).abs() / b.grad_norm);
    }
    eprintln!(
        "{what}: max |loss difference| = {loss_diff:.2e}, max relative gradient norm \
         difference = {norm_diff:.2e} over {steps} steps; losses {:?}",
        fused.iter().map(|m| m.loss).collect::<Vec<_>>()
    );
    for (a, b) in fused.iter().zip(&plain) {
        assert!(
            (a.loss - b.loss).abs() <= 1e-6,
            "{what}, step {}: loss {} with the all-gather matmul, {} without",
            a.step,
            a.loss,
            b.loss
        );
        assert!(
            (a.grad_norm - b.grad_norm).abs() <= 1e-5 * b.grad_norm,
            "{what}, step {}: gradient norm {} with the all-gather matmul, {} without",
            a.step,
            a.grad_norm,
            b.grad_norm
        );
    }
    let (first, last) = (fused[0].loss, fused[steps - 1].loss);
    assert!(last < first, "{what}: the loss went from {first} to {last}");
}

/// The tiny model (2 layers, 256 tokens a sequence) on fsdp 4 x context 1: every layer's
/// seven weight matrices are split four ways along their rows, which the kernel gathers
/// around the ring of the batch axis.
#[test]
fn tiny_fsdp_4_trains_like_the_gathered_matmuls() {
    let _serial = serial();
    let mut cfg = TrainConfig::new(ModelConfig::tiny());
    cfg.ici_fsdp_parallelism = 4;
    cfg.ici_context_parallelism = 1;
    cfg.warmup_steps = 1;
    cfg.learning_rate = 1e-2;
    cfg.validate().unwrap();
    trains_like_the_gathered_matmuls(cfg.with_default_blocks(), 5, "tiny, fsdp 4");
}

/// The step with the flag runs the kernel: its remote copies are `collective_permute`s
/// (the step without has none: Ulysses on one context device moves nothing else), and it
/// all-gathers less: each layer weight once, in the backward (for the input gradient), where
/// the step without gathers it in the forward and again in the backward loop's
/// rematerialised forward. Both reduce-scatter every weight gradient once.
#[test]
fn the_step_runs_the_kernel_in_place_of_the_weight_gathers() {
    let mut cfg = TrainConfig::new(ModelConfig::tiny());
    cfg.ici_fsdp_parallelism = 4;
    cfg.ici_context_parallelism = 1;
    let cfg = cfg.with_default_blocks();
    let ops = |cfg: &TrainConfig| {
        let (_, program) = train_step_program(cfg).unwrap();
        let text = program.to_mlir();
        let scatters = program
            .collectives()
            .iter()
            .filter(|c| c.collective.name() == "reduce_scatter")
            .count();
        let count = |op: &str| text.matches(&format!("\"stablehlo.{op}\"")).count();
        (count("collective_permute"), count("all_gather"), scatters)
    };
    let plain = ops(&cfg);
    let fused = ops(&TrainConfig {
        collective_matmul: true,
        ..cfg
    });
    eprintln!("(collective_permute, all_gather, reduce_scatter): plain {plain:?}, fused {fused:?}");
    assert_eq!(plain.0, 0, "{plain:?}");
    assert!(fused.0 > 0, "{fused:?}");
    assert!(fused.1 < plain.1, "{fused:?} vs {plain:?}");
    assert_eq!(fused.2, plain.2);
}

/// fsdp 2 x context 2 with a small model: every weight dim splits evenly over both axes.
fn micro_fsdp_2_by_context_2() -> TrainConfig {
    let model = ModelConfig {
        vocab: 32,
        d_model: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        mlp_dim: 64,
        rope_theta: 10_000.0,
        norm_eps: 1e-6,
    };
    let mut cfg = TrainConfig::new(model);
    cfg.max_target_length = 64;
    cfg.ici_fsdp_parallelism = 2;
    cfg.ici_context_parallelism = 2;
    cfg.warmup_steps = 1;
    cfg.learning_rate = 1e-2;
    cfg.seed = 3;
    cfg.with_default_blocks()
}

/// fsdp 2 x context 2: the weights' columns are split over the context axis too, gathered
/// (plainly) before the kernel gathers the rows over the batch axis.
#[test]
fn fsdp_2_by_context_2_trains_like_the_gathered_matmuls() {
    let _serial = serial();
    let cfg = micro_fsdp_2_by_context_2();
    trains_like_the_gathered_matmuls(cfg, 5, "fsdp 2 x context 2");
}

/// bf16 compute: the kernel multiplies bf16 shards and accumulates in f32 like the dot, but
/// adds the shards' products in another order, so the losses agree to bf16's precision, not
/// to the bit; the loss falls.
#[test]
fn bf16_with_the_collective_matmul_tracks_the_gathered_matmuls() {
    let _serial = serial();
    let mut cfg = micro_fsdp_2_by_context_2();
    cfg.dtype = tessera_hlo::DType::BF16;
    let steps = 5;
    let plain = run(cfg.clone(), steps);
    let fused = run(
        TrainConfig {
            collective_matmul: true,
            ..cfg
        },
        steps,
    );
    let diff = fused
        .iter()
        .zip(&plain)
        .map(|(a, b)| (a.loss - b.loss).abs())
        .fold(0.0, f64::max);
    eprintln!("bf16, fsdp 2 x context 2: max |loss difference| = {diff:.2e} over {steps} steps");
    assert!(diff <= 2e-3, "{fused:?} vs {plain:?}");
    assert!(fused[steps - 1].loss < fused[0].loss, "{fused:?}");
}

/// The flag names of a command line (what `--collective-matmul` and the fsdp flag are
/// called there).
struct Flags;

impl Names for Flags {
    fn flag(&self, key: &str) -> Option<&str> {
        match key {
            "collective_matmul" => Some("--collective-matmul"),
            "fsdp" => Some("--ici-fsdp-parallelism"),
            _ => None,
        }
    }
}

#[test]
fn the_collective_matmul_without_fsdp_is_refused_in_one_sentence() {
    for (data, context) in [(1, 4), (2, 2)] {
        let mut cfg = TrainConfig::new(ModelConfig::tiny());
        cfg.ici_data_parallelism = data;
        cfg.ici_context_parallelism = context;
        cfg.collective_matmul = true;
        let e = cfg.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "collective_matmul replaces the matmuls of fsdp's all-gathered weights, but the \
             fsdp degree is 1; leave it out, or shard the weights (fsdp degree above 1)"
        );
        assert_eq!(
            e.describe(&Flags),
            "--collective-matmul replaces the matmuls of fsdp's all-gathered weights, but \
             --ici-fsdp-parallelism is 1; leave it out, or shard the weights \
             (--ici-fsdp-parallelism above 1)"
        );
        let trainer = Trainer::new(cfg, Platform::Cpu);
        assert!(trainer.is_err(), "a trainer was built without fsdp");
    }
}
