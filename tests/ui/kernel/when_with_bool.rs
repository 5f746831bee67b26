// `when` takes a run-time condition; a Rust `bool` belongs in a Rust `if`.
use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn maybe_zero<const ZERO: bool>(#[shape(8, 128)] x: Ref<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    out.store(x.load());
    when(ZERO, || out.store(0.0));
}

fn main() {}
