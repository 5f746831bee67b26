use tessera::prelude::*;

#[tpu_kernel(dimension_semantics = (parallel,))]
fn copy(#[shape(M, N)] x: Ref<f32>, #[shape(M, N)] out: RefMut<f32>) {
    out.store(x.load());
}

#[tpu_kernel]
fn copy_again(#[shape(M, N)] x: Ref<f32>, #[shape(M, N)] out: RefMut<f32>) {
    out.store(x.load());
}

fn main() {}
