use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn scale(#[shape(8, 128)] x: Ref<f32>, factors: Vec<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    out.store(x.load() * factors[0]);
}

fn main() {}
