use tessera::prelude::*;

#[tpu_kernel(grid = (N,))]
fn gather(
    #[shape(R, 128)]
    #[block((8, 128), |i| (order.get([i]), 0))]
    x: Ref<f32>,
    #[shape(N)] order: Smem<i32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
