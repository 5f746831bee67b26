use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8, N / 128), dimension_semantics = (parallel,))]
fn copy(
    #[shape(M, N)]
    #[block((8, 128), |i, j| (i, j))]
    x: Ref<f32>,
    #[shape(M, N)]
    #[block((8, 128), |i, j| (i, j))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
