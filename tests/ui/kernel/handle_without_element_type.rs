use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn copy(#[shape(8, 128)] x: Ref, #[shape(8, 128)] out: RefMut<f32>) {
    out.store(x.load());
}

fn main() {}
