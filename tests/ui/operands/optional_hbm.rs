//! Only pipelined inputs and scalar prefetch may be left out by a caller.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(#[shape(R, C)] x: Option<Hbm<f32>>, #[shape(8, 128)] out: HbmMut<f32>) {
    let _ = (x, out);
}

fn main() {}
