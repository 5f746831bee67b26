//! Kernels that move their own data, on every backend against their references: a
//! double-buffered gather from an HBM operand (one device) and a ring shift of remote copies
//! over 4 devices (4 CPU devices for the StableHLO backend: one SPMD program, the remote
//! copy a `collective_permute`).

mod common;

use tessera::backend::{self, Backend};
use tessera::collective_kernels::memory::{
    gather_tiles, gather_tiles_reference, ring_mesh, ring_shift, ring_shift_reference, TILE_ROWS,
};
use tessera::dsl::{HostArray, KernelRules};

fn array(rows: usize, cols: usize, seed: usize) -> HostArray {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 31 + seed * 17) % 199) as f32 * 0.25 - 20.0)
        .collect();
    HostArray::f32([rows, cols], v).unwrap()
}

#[test]
fn gather_tiles_matches_its_reference_on_every_backend() {
    let x = array(16 * TILE_ROWS, 256, 3);
    let order = vec![9, 0, 15, 15, 4, 2, 11];
    let tiles = HostArray::i32([order.len()], order.clone()).unwrap();
    let want = gather_tiles_reference(&order, &x);
    for b in Backend::everywhere() {
        let out = backend::run(
            &gather_tiles(),
            &[tiles.clone(), x.clone()],
            b,
            &KernelRules::tpu(),
        )
        .unwrap_or_else(|e| panic!("{b}: {e}"));
        assert_eq!(out[0].shape(), &[order.len() * TILE_ROWS, 256], "{b}");
        assert_eq!(out[0].to_f64_vec(), want, "{b}");
    }
}

#[test]
fn ring_shift_over_four_devices_matches_its_reference_on_every_backend() {
    let per_device: Vec<Vec<HostArray>> = (0..4).map(|d| vec![array(8, 128, d)]).collect();
    let inputs: Vec<HostArray> = per_device.iter().map(|a| a[0].clone()).collect();
    let want = ring_shift_reference(&inputs);
    for b in Backend::everywhere() {
        let out = backend::run_on_devices(
            &ring_shift(),
            &ring_mesh(4),
            &per_device,
            b,
            &KernelRules::tpu(),
        )
        .unwrap_or_else(|e| panic!("{b}: {e}"));
        assert_eq!(out.len(), 4, "{b}");
        for (d, outs) in out.iter().enumerate() {
            assert_eq!(outs[0], want[d], "{b}, device {d}");
        }
    }
}

/// The interpreter's landing points and device interleavings change nothing in a race-free
/// kernel.
#[test]
fn landing_points_and_interleavings_do_not_change_the_results() {
    use tessera::dsl::interpret::{self, InterpretOptions};
    let per_device: Vec<Vec<HostArray>> = (0..4).map(|d| vec![array(8, 128, d)]).collect();
    let inputs: Vec<HostArray> = per_device.iter().map(|a| a[0].clone()).collect();
    let want = ring_shift_reference(&inputs);
    let x = array(8 * TILE_ROWS, 128, 5);
    let order = vec![3, 3, 7, 0, 1];
    let tiles = HostArray::i32([order.len()], order.clone()).unwrap();
    for seed in 0..8 {
        let options = InterpretOptions {
            copy_landing: Some(seed),
            schedule_seed: Some(seed + 100),
            ..Default::default()
        };
        let out = interpret::run_on_devices(&ring_shift(), &ring_mesh(4), &per_device, &options)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for (d, outs) in out.iter().enumerate() {
            assert_eq!(outs[0], want[d], "seed {seed}, device {d}");
        }
        let gathered = interpret::run_on_devices(
            &tessera::collective_kernels::memory::ring_all_gather(),
            &ring_mesh(4),
            &per_device,
            &options,
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let all = tessera::collective_kernels::memory::ring_all_gather_reference(&inputs);
        assert!(gathered.iter().all(|outs| outs[0] == all), "seed {seed}");
        let out = interpret::run(&gather_tiles(), &[tiles.clone(), x.clone()], &options)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(
            out[0].to_f64_vec(),
            gather_tiles_reference(&order, &x),
            "seed {seed}"
        );
    }
}

/// Remote copies in a loop whose destination offsets differ per device (each device forwards
/// a different slot): the StableHLO lowering sends the sender's offsets with the data.
#[test]
fn ring_all_gather_over_four_devices_matches_its_reference_on_every_backend() {
    use tessera::collective_kernels::memory::{ring_all_gather, ring_all_gather_reference};
    let per_device: Vec<Vec<HostArray>> = (0..4).map(|d| vec![array(8, 128, d)]).collect();
    let shards: Vec<HostArray> = per_device.iter().map(|a| a[0].clone()).collect();
    let want = ring_all_gather_reference(&shards);
    for b in Backend::everywhere() {
        let out = backend::run_on_devices(
            &ring_all_gather(),
            &ring_mesh(4),
            &per_device,
            b,
            &KernelRules::tpu(),
        )
        .unwrap_or_else(|e| panic!("{b}: {e}"));
        for (d, outs) in out.iter().enumerate() {
            assert_eq!(outs[0], want, "{b}, device {d}");
        }
    }
}

/// The Mosaic lowering of the memory kernels, run by the evaluator (several devices for the
/// remote copies), equals the interpreter bit for bit.
#[test]
fn mosaic_eval_agrees_with_the_interpreter() {
    use tessera::collective_kernels::memory::ring_all_gather;
    use tessera::dsl::interpret::{self, InterpretOptions};
    let x = array(16 * TILE_ROWS, 256, 3);
    let tiles = HostArray::i32([7], vec![9, 0, 15, 15, 4, 2, 11]).unwrap();
    let args = vec![tiles, x];
    let want = interpret::run(&gather_tiles(), &args, &InterpretOptions::default()).unwrap();
    assert_eq!(
        common::mosaic_eval_on_mesh(&gather_tiles(), &[], &[args])[0],
        want
    );
    let per_device: Vec<Vec<HostArray>> = (0..4).map(|d| vec![array(8, 128, d)]).collect();
    for def in [ring_shift(), ring_all_gather()] {
        let want = interpret::run_on_devices(
            &def,
            &ring_mesh(4),
            &per_device,
            &InterpretOptions::default(),
        )
        .unwrap();
        assert_eq!(
            common::mosaic_eval_on_mesh(&def, &ring_mesh(4), &per_device),
            want,
            "{}",
            def.name()
        );
    }
}
