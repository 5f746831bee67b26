//! In-kernel collectives over a 4-device ring: the all-gather (JAX's `all_gather`: halves
//! travelling both ways), the all-to-all (every chunk in flight at once) and the all-gather
//! matmul, against their references on the
//! interpreter (4 interleaved devices) and on 4 CPU devices (one SPMD program); the Mosaic
//! lowering run by the evaluator on 4 devices equals the interpreter bit for bit. The
//! kernels that only copy, in every dtype their registry entries are checked at, equal their
//! references exactly on the interpreter and on CPU devices.

mod common;

use tessera::backend::{self, Backend};
use tessera::collective_kernels::collective::{
    all_gather, all_gather_matmul, all_gather_matmul_reference, all_gather_of,
    all_gather_reference, all_to_all, all_to_all_of, all_to_all_reference,
};
use tessera::collective_kernels::memory::{ring_mesh, RingMesh};
use tessera::dsl::axes::Context;
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{DType, HostArray, KernelDef, KernelRules};
use tessera::registry;

const N: usize = 4;

fn matmul_def(dtype: DType) -> KernelDef {
    match dtype {
        DType::BF16 => all_gather_matmul::<half::bf16, RingMesh, Context>(16, 128),
        _ => all_gather_matmul::<f32, RingMesh, Context>(16, 128),
    }
}

/// `x [32, 512]` on every device (different values), `w` row shards `[128, 256]`.
fn matmul_inputs(dtype: DType) -> Vec<Vec<HostArray>> {
    (0..N)
        .map(|d| {
            vec![
                HostArray::random(dtype, [32, 512], 10 + d as u64),
                HostArray::random(dtype, [128, 256], 20 + d as u64),
            ]
        })
        .collect()
}

/// The all-gather `def` of [16, 128] shards of `dtype` on 4 devices, on every backend: each
/// device's output is the shards in device order, bit for bit.
fn check_all_gather(def: &KernelDef, dtype: DType) {
    let per_device: Vec<Vec<HostArray>> = (0..N)
        .map(|d| vec![HostArray::random(dtype, [16, 128], d as u64)])
        .collect();
    let shards: Vec<HostArray> = per_device.iter().map(|a| a[0].clone()).collect();
    let want = all_gather_reference(&shards);
    assert_eq!(want.dtype(), dtype);
    for b in Backend::everywhere() {
        let out = backend::run_on_devices(def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        for (d, outs) in out.iter().enumerate() {
            assert_eq!(outs[0], want, "{b}, device {d}");
        }
    }
}

#[test]
fn all_gather_over_four_devices_matches_its_reference_on_every_backend() {
    check_all_gather(&all_gather::<RingMesh, Context>(), DType::F32);
}

/// `x [32, 128]` on every device (different values): four chunks of 8 rows, one f32 tile.
fn all_to_all_inputs(dtype: DType) -> Vec<Vec<HostArray>> {
    let rows = if dtype == DType::BF16 { 64 } else { 32 };
    (0..N)
        .map(|d| vec![HostArray::random(dtype, [rows, 128], 30 + d as u64)])
        .collect()
}

/// Device `d` gets chunk `d` of every device's `x`, in device order, bit for bit, on every
/// backend; in bf16 too (chunks of 16 rows, one bf16 tile).
#[test]
fn all_to_all_over_four_devices_matches_its_reference_on_every_backend() {
    let defs = [
        (all_to_all::<RingMesh, Context>(), DType::F32),
        (
            all_to_all_of::<half::bf16, RingMesh, Context>(),
            DType::BF16,
        ),
    ];
    for (def, dtype) in defs {
        let per_device = all_to_all_inputs(dtype);
        let shards: Vec<HostArray> = per_device.iter().map(|a| a[0].clone()).collect();
        let want = all_to_all_reference(&shards);
        // Not the identity: every device's output differs from its input.
        assert!(want.iter().zip(&shards).all(|(w, x)| w != x));
        for b in Backend::everywhere() {
            let out =
                backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b}: {e}"));
            for (d, outs) in out.iter().enumerate() {
                assert_eq!(outs[0], want[d], "{b} {dtype}, device {d}");
            }
        }
    }
}

/// Rows that do not split into one chunk per device are refused when the kernel is
/// instantiated, naming the rows and the devices.
#[test]
fn all_to_all_refuses_rows_that_do_not_split_over_the_devices() {
    let per_device: Vec<Vec<HostArray>> = (0..N)
        .map(|d| vec![HostArray::random(DType::F32, [34, 128], d as u64)])
        .collect();
    let e = match interpret::run_on_devices(
        &all_to_all::<RingMesh, Context>(),
        &ring_mesh(N),
        &per_device,
        &InterpretOptions::default(),
    ) {
        Ok(_) => panic!("34 rows were split over 4 devices"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("34 rows do not split into 4 equal chunks"),
        "{e}"
    );
}

#[test]
fn all_gather_matmul_over_four_devices_matches_its_reference_on_every_backend() {
    for dtype in [DType::F32, DType::BF16] {
        let per_device = matmul_inputs(dtype);
        let shards: Vec<HostArray> = per_device.iter().map(|a| a[1].clone()).collect();
        let tol = if dtype == DType::BF16 { 0.25 } else { 1e-3 };
        for b in Backend::everywhere() {
            let out = backend::run_on_devices(
                &matmul_def(dtype),
                &ring_mesh(N),
                &per_device,
                b,
                &KernelRules::tpu(),
            )
            .unwrap_or_else(|e| panic!("{b}: {e}"));
            for (d, outs) in out.iter().enumerate() {
                let want = all_gather_matmul_reference(&per_device[d][0], &shards);
                let err = common::max_error(&outs[0], &want);
                assert!(err <= tol, "{b} {dtype}, device {d}: max error {err:e}");
            }
        }
    }
}

#[test]
fn mosaic_eval_on_four_devices_agrees_with_the_interpreter() {
    let gather_inputs: Vec<Vec<HostArray>> = (0..N)
        .map(|d| vec![HostArray::random(DType::F32, [16, 128], d as u64)])
        .collect();
    let mut cases = vec![
        (all_gather::<RingMesh, Context>(), gather_inputs),
        (
            all_to_all::<RingMesh, Context>(),
            all_to_all_inputs(DType::F32),
        ),
    ];
    for dtype in [DType::F32, DType::BF16] {
        cases.push((matmul_def(dtype), matmul_inputs(dtype)));
    }
    for (def, per_device) in cases {
        let want = interpret::run_on_devices(
            &def,
            &ring_mesh(N),
            &per_device,
            &InterpretOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            common::mosaic_eval_on_mesh(&def, &ring_mesh(N), &per_device),
            want,
            "{}",
            def.name()
        );
    }
}

/// Copies landing anywhere between their start and their wait, and other interleavings of
/// the devices, find no race or deadlock and change nothing.
#[test]
fn landing_points_and_interleavings_do_not_change_the_results() {
    let gather_inputs: Vec<Vec<HostArray>> = (0..N)
        .map(|d| vec![HostArray::random(DType::F32, [16, 128], d as u64)])
        .collect();
    let cases = [
        (all_gather::<RingMesh, Context>(), gather_inputs),
        (
            all_to_all::<RingMesh, Context>(),
            all_to_all_inputs(DType::F32),
        ),
        (matmul_def(DType::F32), matmul_inputs(DType::F32)),
    ];
    for (def, per_device) in &cases {
        let want =
            interpret::run_on_devices(def, &ring_mesh(N), per_device, &Default::default()).unwrap();
        for seed in 0..6 {
            let options = InterpretOptions {
                copy_landing: Some(seed),
                schedule_seed: Some(seed + 50),
                ..Default::default()
            };
            let got = interpret::run_on_devices(def, &ring_mesh(N), per_device, &options)
                .unwrap_or_else(|e| panic!("{} seed {seed}: {e}", def.name()));
            assert_eq!(got, want, "{} seed {seed}", def.name());
        }
    }
}

/// bf16 shards through the all-gather: every device's output is the shards in device order,
/// bit for bit, on every backend (halves of 8 rows: half a bf16 tile).
#[test]
fn bf16_all_gather_over_four_devices_is_exact_on_every_backend() {
    check_all_gather(
        &all_gather_of::<half::bf16, RingMesh, Context>(),
        DType::BF16,
    );
}

/// Every registered case of the kernels that only copy (f32, bf16, i32, i8), on the
/// interpreter and on CPU devices: exactly the reference, with integer data over the whole
/// range of the dtype (not zeros).
#[test]
fn copy_kernels_are_exact_in_every_registered_dtype() {
    let mut dtypes = std::collections::BTreeSet::new();
    for name in [
        "gather_tiles",
        "ring_shift",
        "ring_all_gather",
        "all_gather",
        "all_to_all",
    ] {
        let info = registry::find(name).unwrap();
        for case in info.cases {
            let inst = info.instance(&case.given()).unwrap();
            let inputs = inst.inputs(1).unwrap();
            let data = inputs[0].last().unwrap();
            dtypes.insert(data.dtype());
            if !data.dtype().is_float() {
                let distinct: std::collections::BTreeSet<i64> =
                    data.to_f64_vec().iter().map(|&v| v as i64).collect();
                assert!(distinct.len() > 64, "{name} {}: {distinct:?}", inst.label());
            }
            for b in [Backend::Interpret, Backend::CPU] {
                let out = inst
                    .run(&inputs, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{name} {} on {b}: {e}", inst.label()));
                let err = inst.max_error(&inputs, &out).unwrap();
                assert_eq!(err, 0.0, "{name} {} on {b}", inst.label());
                for device in &out {
                    assert_eq!(device[0].dtype(), data.dtype(), "{name} {}", inst.label());
                }
            }
        }
    }
    let want = [DType::F32, DType::BF16, DType::I32, DType::I8];
    assert_eq!(dtypes, want.into_iter().collect());
}
