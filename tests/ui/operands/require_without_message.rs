//! A precondition carries the sentence its caller sees.
use tessera::prelude::*;

#[tpu_kernel(grid = 1, require(S % 2 == 0))]
fn halves(#[shape(S, C)] x: Hbm<f32>, #[shape(S, C)] out: HbmMut<f32>) {
    let _ = (x, out);
}

fn main() {}
