//! Only an output is an input's buffer.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn update(
    #[shape(R, C)] x: Ref<f32>,
    #[shape(R, C)]
    #[alias(x)]
    y: Ref<f32>,
    #[shape(R, C)] out: RefMut<f32>,
) {
    out.store(x.load() + y.load());
}

fn main() {}
