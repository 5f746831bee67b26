// A Rust `for` unrolls at instantiation: its bounds must be compile-time values.
use tessera::prelude::*;

#[tpu_kernel(grid = (4,))]
fn repeat(#[shape(8, 128)] x: Ref<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    let mut acc = x.load();
    for _ in 0..program_id(0) {
        acc = acc + x.load();
    }
    out.store(acc);
}

fn main() {}
