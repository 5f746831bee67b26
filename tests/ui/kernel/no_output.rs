use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn load_only(#[shape(8, 128)] x: Ref<f32>, #[scratch(8, 128)] acc: Scratch<f32>) {
    acc.store(x.load());
}

fn main() {}
