//! Semaphores are not pipelined: no block spec.
use tessera::prelude::*;

#[tpu_kernel(grid = (2,))]
fn copy(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
    #[scratch(2)]
    #[block((1,), |i| (i,))]
    sems: DmaSem,
) {
    let _ = (x, out, sems);
}

fn main() {}
