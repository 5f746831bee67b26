//! A precondition is a `bool` over the sizes.
use tessera::prelude::*;

#[tpu_kernel(grid = 1, require(S % 2, "{S} rows do not split in two halves"))]
fn halves(#[shape(S, C)] x: Hbm<f32>, #[shape(S, C)] out: HbmMut<f32>) {
    let _ = (x, out);
}

fn main() {}
