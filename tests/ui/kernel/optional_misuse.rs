use tessera::prelude::*;

#[tpu_kernel(grid = (R / 8,))]
fn k(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(N, 128)] extra: Option<Ref<f32>>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    #[alias(x)]
    again: Option<RefMut<f32>>,
    #[scratch(8, 128)] acc: Option<Scratch<f32>>,
) {
}

fn main() {}
