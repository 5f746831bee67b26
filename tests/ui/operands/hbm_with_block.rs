//! An operand left in HBM is not pipelined by the grid: it has no block spec.
use tessera::prelude::*;

#[tpu_kernel(grid = (R / 8,))]
fn copy(
    #[shape(R, C)]
    #[block((8, C), |i| (i, 0))]
    x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
) {
    let _ = (x, out);
}

fn main() {}
