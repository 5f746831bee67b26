//! `#[alias]` names an input declared before the output.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn update(
    #[shape(R, C)] x: Ref<f32>,
    #[shape(R, C)]
    #[alias(cache)]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {}
