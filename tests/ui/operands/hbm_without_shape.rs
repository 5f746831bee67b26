//! Every argument names its shape, HBM operands too.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(x: Hbm<f32>, #[shape(8, 128)] out: HbmMut<f32>) {
    let _ = (x, out);
}

fn main() {}
