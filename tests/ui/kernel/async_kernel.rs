use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
async fn copy(#[shape(8, 128)] x: Ref<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    out.store(x.load());
}

fn main() {}
