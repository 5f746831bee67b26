//! Semaphores count; they hold no elements.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
    #[scratch(2)] sems: DmaSem<i32>,
) {
    let _ = (x, out, sems);
}

fn main() {}
