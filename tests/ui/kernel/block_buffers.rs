use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8,))]
fn copy(
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0), buffers = 3)]
    x: Ref<f32>,
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0), buffered = 1)]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
