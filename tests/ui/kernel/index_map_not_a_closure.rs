use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8,))]
fn copy(
    #[shape(M, 128)]
    #[block((8, 128), (0, 0))]
    x: Ref<f32>,
    #[shape(M, 128)]
    #[block((8, 128))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
