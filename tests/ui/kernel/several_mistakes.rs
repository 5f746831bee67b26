// Independent mistakes are all reported in one compile.
use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8, 1), dimension_semantics = (parallel, paralel))]
fn copy(
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(M, 128)]
    #[block((8, 128, 1), |i, j| (i, j))]
    out: RefMut<f32>,
    #[scratch(8, 128)] acc: Scratch,
) {
    acc.store(x.load());
    out.store(acc.load());
}

fn main() {}
