//! One input's buffer becomes one output.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn update(
    #[shape(R, C)] x: Ref<f32>,
    #[shape(R, C)]
    #[alias(x)]
    out: RefMut<f32>,
    #[shape(R, C)]
    #[alias(x)]
    again: RefMut<f32>,
) {
    out.store(x.load());
    again.store(x.load());
}

fn main() {}
