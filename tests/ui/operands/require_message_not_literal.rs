//! The message of a precondition is a string literal (a format string over the sizes).
use tessera::prelude::*;

const WHY: &str = "S must be even";

#[tpu_kernel(grid = 1, require(S % 2 == 0, WHY))]
fn halves(#[shape(S, C)] x: Hbm<f32>, #[shape(S, C)] out: HbmMut<f32>) {
    let _ = (x, out);
}

fn main() {}
