use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn double(#[shape(8, 128)] x: Ref<f32>) -> Value {
    x.load() * 2.0
}

fn main() {}
