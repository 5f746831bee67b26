//! Only pipelined inputs, scalar prefetch and outputs may be left out by a caller: an HBM
//! input may not.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(#[shape(R, C)] x: Option<Hbm<f32>>, #[shape(8, 128)] out: HbmMut<f32>) {
    let _ = (x, out);
}

fn main() {}
