use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn double_in_place(#[shape(8, 128)] x: Ref<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    x.store(x.load() * 2.0);
    out.store(x.load());
}

fn main() {}
