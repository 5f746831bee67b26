//! Writing a kernel and running it: a SwiGLU gate `out = silu(a) * b` over blocks of rows,
//! run by the interpreter (the reference semantics) and by the XLA CPU plugin (the kernel
//! lowered to StableHLO), checked against plain Rust.
//!
//! ```sh
//! cargo run --release --example kernel
//! ```

use tessera::backend::{self, Backend};
use tessera::dsl::{DType, HostArray, KernelRules};
use tessera::prelude::*;

/// `out = a * sigmoid(a) * b`, `BR` rows per grid step, computed in f32.
#[tpu_kernel(grid = (R / BR,), dimension_semantics = (parallel,))]
pub fn swiglu<T: Element, const BR: usize>(
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    a: Ref<T>,
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    b: Ref<T>,
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    out: RefMut<T>,
) {
    let a = a.load().cast(DType::F32);
    let b = b.load().cast(DType::F32);
    out.store((a / (1.0 + (-a).exp()) * b).cast(T::DTYPE));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A 256 x 128 problem in blocks of 8 rows: a grid of 32 steps.
    let def = swiglu::<f32, 8>();
    let a = HostArray::random(DType::F32, [256, 128], 1);
    let b = HostArray::random(DType::F32, [256, 128], 2);
    let want: Vec<f64> = a
        .to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(&a, b)| a / (1.0 + (-a).exp()) * b)
        .collect();
    for backend in [Backend::Interpret, Backend::CPU] {
        let out = backend::run(&def, &[a.clone(), b.clone()], backend, &KernelRules::tpu())?;
        let err = out[0]
            .to_f64_vec()
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f64::max);
        println!("swiglu on {:<9} max |err| {err:.1e}", backend.name());
        assert!(err < 1e-5, "{} disagrees with plain Rust", backend.name());
    }
    Ok(())
}
