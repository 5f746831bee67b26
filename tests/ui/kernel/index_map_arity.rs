// The index map takes one grid index per grid dimension.
use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8, N / 128))]
fn copy(
    #[shape(M, N)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(M, N)]
    #[block((8, 128), |i, j| (i, j))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
