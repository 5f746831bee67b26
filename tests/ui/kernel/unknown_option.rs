use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8,), block_size = 8)]
fn copy(
    #[shape(M, N)]
    #[block((8, N), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(M, N)]
    #[block((8, N), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
