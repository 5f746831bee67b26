//! The fused Ulysses attention forward (`ulysses_attention_of`: the all-to-alls of q, k, v and
//! of the output inside the kernel, overlapping the attention) over a 4-device ring, against
//! dense f64 attention over the whole sequence (written apart from the kernel), on the
//! interpreter (copies landing at random points, devices interleaved at random), on 4 CPU
//! devices (one SPMD program, the remote copies as `collective_permute`s) and in the Mosaic
//! evaluator; compiled by libtpu for v5p (4 chips).

mod common;

use tessera::backend::{self, Backend};
use tessera::collective_kernels::memory::{ring_mesh, RingMesh};
use tessera::collective_kernels::ulysses::{
    ulysses_attention, ulysses_attention_of, ulysses_attention_reference,
};
use tessera::dsl::axes::Context;
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelDef, KernelRules};

const N: usize = 4;

/// Every device's `q, k, v [H, SL, D]` (different values per device and tensor).
fn inputs(dtype: DType, heads: usize, rows: usize, d: usize) -> Vec<Vec<HostArray>> {
    (0..N)
        .map(|dev| {
            (0..3)
                .map(|t| HostArray::random(dtype, [heads, rows, d], 100 * t + dev as u64))
                .collect()
        })
        .collect()
}

fn reference(per_device: &[Vec<HostArray>], causal: bool) -> Vec<Vec<f64>> {
    let tensor = |t: usize| -> Vec<HostArray> { per_device.iter().map(|x| x[t].clone()).collect() };
    ulysses_attention_reference(&tensor(0), &tensor(1), &tensor(2), causal)
}

fn max_error(got: &HostArray, want: &[f64]) -> f64 {
    got.to_f64_vec()
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f64::max)
}

/// 12 heads (3 per device: each head's exchange overlaps the head before, and the third
/// waits for its buffer to be free) of 32 rows per device (128 in all), blocks of 8.
fn case(causal: bool) -> (KernelDef, Vec<Vec<HostArray>>) {
    (
        ulysses_attention::<RingMesh, Context>(8, causal),
        inputs(DType::F32, 12, 32, 128),
    )
}

#[test]
fn matches_dense_f64_attention_on_every_backend() {
    for causal in [true, false] {
        let (def, per_device) = case(causal);
        let want = reference(&per_device, causal);
        for b in Backend::everywhere() {
            let out =
                backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b} causal {causal}: {e}"));
            for (d, outs) in out.iter().enumerate() {
                let err = max_error(&outs[0], &want[d]);
                assert!(
                    err <= 1e-5,
                    "{b} causal {causal}, device {d}: max error {err:e}"
                );
            }
        }
    }
}

#[test]
fn bf16_matches_dense_f64_attention_on_every_backend() {
    let def = ulysses_attention_of::<half::bf16, RingMesh, Context>(16, true);
    let per_device = inputs(DType::BF16, 4, 32, 128);
    let want = reference(&per_device, true);
    for b in Backend::everywhere() {
        let out = backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        for (d, outs) in out.iter().enumerate() {
            let err = max_error(&outs[0], &want[d]);
            assert!(err <= 2e-2, "{b}, device {d}: max error {err:e}");
        }
    }
}

/// Copies landing anywhere between their start and their wait, and other interleavings of
/// the devices, find no race or deadlock and change nothing.
#[test]
fn landing_points_and_interleavings_do_not_change_the_result() {
    let (def, per_device) = case(true);
    let want =
        interpret::run_on_devices(&def, &ring_mesh(N), &per_device, &Default::default()).unwrap();
    for seed in 0..4 {
        let options = InterpretOptions {
            copy_landing: Some(seed),
            schedule_seed: Some(seed + 50),
            ..Default::default()
        };
        let got = interpret::run_on_devices(&def, &ring_mesh(N), &per_device, &options)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(got, want, "seed {seed}");
    }
}

/// The Mosaic lowering, run by the evaluator on 4 devices, equals the interpreter bit for bit.
#[test]
fn mosaic_eval_on_four_devices_agrees_with_the_interpreter() {
    let (def, per_device) = case(true);
    let want =
        interpret::run_on_devices(&def, &ring_mesh(N), &per_device, &Default::default()).unwrap();
    assert_eq!(
        common::mosaic_eval_on_mesh(&def, &ring_mesh(N), &per_device),
        want
    );
}

/// libtpu compiles it for the 4 chips of v5p:2x2x1 (f32 and bf16; 8 heads of 512 rows per
/// chip, 2048 in all, blocks of 256), and reports its kernel's cost.
#[test]
fn libtpu_compiles_it_for_four_v5p_chips() {
    let topology = tessera::tpu::TpuTopology::parse("tpu:v5p:2x2x1").unwrap();
    for (def, dtype) in [
        (
            ulysses_attention::<RingMesh, Context>(256, true),
            DType::F32,
        ),
        (
            ulysses_attention_of::<half::bf16, RingMesh, Context>(256, true),
            DType::BF16,
        ),
    ] {
        let args = vec![ArgSpec::new(dtype, [8, 512, 128]); 3];
        let report = topology
            .compile_kernel_on(&def, &args, &ring_mesh(N))
            .unwrap_or_else(|e| panic!("{dtype}: {e}"));
        assert_eq!(report.kernels, ["ulysses_attention"], "{dtype}");
        println!("{dtype}: {report:?}");
    }
}
