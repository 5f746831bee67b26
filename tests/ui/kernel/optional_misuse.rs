use tessera::prelude::*;

#[tpu_kernel(grid = (R / 8,))]
fn k(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(N, 128)] extra: Option<Ref<f32>>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: Option<RefMut<f32>>,
) {
}

fn main() {}
