//! Programs on the devices of every platform (`tessera::backend::Platform`), one test per
//! platform (`tessera::test_device!`; gpu and tpu with the `gpu-tests` and `tpu-tests`
//! features): a context-parallel forward + backward against the f64 reference and a few
//! train steps, each built for its platform as the CLI and the trainer build it
//! (`tessera::parallel::kernel_lowering`: Mosaic custom calls on TPU).
//!
//! Without chips, the programs the tpu platform runs are compiled here for a TPU topology by
//! libtpu: the kernel program of `--backend tpu` and the context-parallel program (the train
//! step is `tests/tpu_train_compile.rs`'s, built by the same `train_step_program`).

mod common;

use common::{assert_close, random};
use tessera::backend::{kernel_program, Platform};
use tessera::dsl::{ArgSpec, DType, KernelRules, Lowering};
use tessera::parallel::{kernel_lowering, ContextParallel, CpInputs, Strategy};
use tessera::splash::reference::{self, RefInputs};
use tessera::splash::{BlockSizes, Dims, Mask};
use tessera::tpu::TpuTopology;
use tessera_train::{ModelConfig, TrainConfig, Trainer};

const SEQ: usize = 512;
const HEAD_DIM: usize = 128;

/// Ring attention on 2 devices of `platform`, causal, f32, blocks that tile on TPU.
fn ring_attention(platform: Platform) -> ContextParallel {
    ContextParallel {
        dims: Dims {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            q_len: SEQ,
            kv_len: SEQ,
            head_dim: HEAD_DIM,
            head_dim_v: HEAD_DIM,
        },
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(128, 128),
        options: Default::default(),
        strategy: Strategy::parse("ring", 2).expect("ring is a strategy"),
        devices: 2,
        load_balance: false,
        lowering: kernel_lowering(platform, &Lowering::portable()),
    }
}

tessera::test_device!(context_parallel_matches_the_reference: cpu, gpu, tpu);

/// `out`, `lse` within 2e-4 and the gradients within 1e-3 of the largest, as every splash
/// test checks them.
fn context_parallel_matches_the_reference(platform: Platform) {
    let cp = ring_attention(platform);
    let shape = [1, 2, SEQ, HEAD_DIM];
    let [q, k, v, dout] = [1, 2, 3, 4].map(|seed| random(DType::F32, &shape, seed));
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let mask = cp.mask.clone().into();
    let r = RefInputs::new(
        cp.dims,
        (&qf, &kf, &vf),
        &mask,
        1.0 / (HEAD_DIM as f64).sqrt(),
    );
    let want = reference::forward(&r);
    let grads = reference::backward(&r, &dout.to_f64_vec());
    let x = CpInputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: None,
    };
    let got = cp
        .forward_backward(platform, &x, &dout)
        .unwrap_or_else(|e| panic!("{platform}: {e}"));
    assert_close(&got.out.to_f64_vec(), &want.out, 2e-4, "out");
    assert_close(&got.lse.to_f64_vec(), &want.lse, 2e-4, "lse");
    for (name, g, w) in [
        ("dq", &got.dq, &grads.dq),
        ("dk", &got.dk, &grads.dk),
        ("dv", &got.dv, &grads.dv),
    ] {
        let largest = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert_close(&g.to_f64_vec(), w, 1e-3 * largest, name);
    }
}

tessera::test_device!(training_lowers_the_loss: cpu, gpu, tpu);

/// The tiny model with one layer, data 1 x context 2 (Ulysses), 5 steps: every loss and
/// gradient norm finite, the last loss below the first.
fn training_lowers_the_loss(platform: Platform) {
    let mut model = ModelConfig::preset("tiny").unwrap();
    model.layers = 1;
    let mut cfg = TrainConfig::new(model);
    cfg.steps = 5;
    cfg.max_target_length = 256;
    cfg.ici_context_parallelism = 2;
    cfg.warmup_steps = 1;
    cfg.learning_rate = 1e-2;
    let cfg = cfg.with_default_blocks();
    let mut trainer = Trainer::new(cfg, platform).unwrap_or_else(|e| panic!("{platform}: {e}"));
    let losses: Vec<f64> = (0..5)
        .map(|_| {
            let m = trainer.train_step().unwrap();
            assert!(m.loss.is_finite() && m.grad_norm.is_finite(), "{m:?}");
            m.loss
        })
        .collect();
    assert!(losses[4] < losses[0], "{platform}: {losses:?}");
}

#[test]
fn tpu_programs_compile_for_a_topology() {
    let target = TpuTopology::parse("tpu:v5e:2x2").unwrap();
    let args = [
        ArgSpec::new(DType::F32, [256, 512]),
        ArgSpec::new(DType::F32, [512, 256]),
    ];
    let kernel = tessera::kernels::matmul::<f32, 128, 128, 128>()
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
    let program = kernel_program(&kernel, Platform::Tpu).unwrap();
    assert_eq!(target.compile(&program).unwrap().kernels, ["matmul"]);
    assert!(kernel_program(&kernel, Platform::Cpu)
        .unwrap()
        .tpu_kernel_names()
        .is_empty());

    let program = ring_attention(Platform::Tpu)
        .forward_backward_program(false)
        .unwrap();
    let report = target.compile(program.module()).unwrap();
    assert_eq!(
        report.kernels,
        ["splash_fwd", "splash_bwd_prep", "splash_dkv", "splash_dq"]
    );
}

/// The one line a run without GPU and TPU tests prints about them (`test_device!`).
#[cfg(not(all(feature = "gpu-tests", feature = "tpu-tests")))]
#[test]
#[cfg_attr(
    all(not(feature = "gpu-tests"), not(feature = "tpu-tests")),
    ignore = "gpu and tpu device tests not compiled: run `cargo test --features \
              gpu-tests,tpu-tests` where the devices are"
)]
#[cfg_attr(
    all(feature = "gpu-tests", not(feature = "tpu-tests")),
    ignore = "tpu device tests not compiled: run `cargo test --features tpu-tests` on a \
              TPU VM"
)]
#[cfg_attr(
    all(not(feature = "gpu-tests"), feature = "tpu-tests"),
    ignore = "gpu device tests not compiled: run `cargo test --features gpu-tests` where \
              a GPU is"
)]
fn gpu_and_tpu_device_tests() {}
