//! The kernels of JAX's "Distributed computing in Pallas for TPUs" tutorial (see
//! `kernels.rs`), each run on the interpreter and on the CPU backend against its f64
//! reference: the collectives on 4 devices of a ring, the double-buffered pipeline on one.
//!
//! ```sh
//! cargo run --example distributed
//! ```

mod kernels;

use tessera::backend::{self, Backend};
use tessera::dsl::{DType, HostArray, KernelDef, KernelRules};

use kernels::*;

/// Devices of the ring.
const N: usize = 4;

/// A collective: its name, the kernel, each device's arguments and each device's expected
/// output.
type Case = (&'static str, KernelDef, Vec<Vec<HostArray>>, Vec<Vec<f64>>);

/// The largest absolute difference between `got` and `want` (infinite if their lengths
/// differ, NaN-propagating).
fn max_error(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, |m, e| if e.is_nan() { f64::NAN } else { m.max(e) })
}

/// Runs `def` on the `N`-device ring with `backend`; the largest error of any device's first
/// output against `want[d]`.
fn on_ring(
    def: &KernelDef,
    per_device: &[Vec<HostArray>],
    want: &[Vec<f64>],
    backend: Backend,
) -> Result<f64, Box<dyn std::error::Error>> {
    let outs =
        backend::run_on_devices(def, &ring_mesh(N), per_device, backend, &KernelRules::tpu())?;
    Ok(outs
        .iter()
        .zip(want)
        .map(|(o, w)| max_error(&o[0].to_f64_vec(), w))
        .fold(0.0, f64::max))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (rows, cols) = (8, 128);
    let shards: Vec<HostArray> = (0..N)
        .map(|d| HostArray::random(DType::F32, [rows, cols], d as u64))
        .collect();
    let blocks: Vec<HostArray> = (0..N)
        .map(|d| HostArray::random(DType::F32, [N, 16, cols], 10 + d as u64))
        .collect();
    let args = |arrays: &[HostArray]| -> Vec<Vec<HostArray>> {
        arrays.iter().map(|a| vec![a.clone()]).collect()
    };
    let gathered = all_gather_reference(&shards);
    let summed = all_reduce_reference(&shards);
    let cases: Vec<Case> = vec![
        (
            "right_permute",
            right_permute(),
            args(&shards),
            right_permute_reference(&shards),
        ),
        ("all_gather", all_gather(), args(&shards), vec![gathered; N]),
        ("all_reduce", all_reduce(), args(&shards), vec![summed; N]),
        (
            "reduce_scatter",
            reduce_scatter(),
            args(&blocks),
            reduce_scatter_reference(&blocks),
        ),
    ];
    let mut worst: f64 = 0.0;
    for (name, def, per_device, want) in &cases {
        for backend in Backend::everywhere() {
            let err = on_ring(def, per_device, want, backend)?;
            println!(
                "{name:<20} {N} devices  {:<10} max error {err:.3e}",
                backend.name()
            );
            worst = if err.is_nan() {
                f64::NAN
            } else {
                worst.max(err)
            };
        }
    }
    let x = HostArray::random(DType::F32, [64, 256], 99);
    let want = double_buffered_sum_reference(&x);
    for backend in Backend::everywhere() {
        let out = backend::run(
            &double_buffered_sum(),
            std::slice::from_ref(&x),
            backend,
            &KernelRules::tpu(),
        )?;
        let err = max_error(&out[0].to_f64_vec(), &want);
        println!(
            "double_buffered_sum  1 device   {:<10} max error {err:.3e}",
            backend.name()
        );
        worst = if err.is_nan() {
            f64::NAN
        } else {
            worst.max(err)
        };
    }
    // f32 sums of 4 or 8 terms against f64: a few ulps.
    if worst.is_nan() || worst > 1e-4 {
        return Err(format!("a kernel differs from its reference by {worst:e}").into());
    }
    Ok(())
}
