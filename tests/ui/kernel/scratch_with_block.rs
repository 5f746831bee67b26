use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8,))]
fn copy(
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
    #[scratch(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    acc: Scratch<f32>,
) {
    acc.store(x.load());
    out.store(acc.load());
}

fn main() {}
