// A window's length is a vector shape: it must be a compile-time size.
use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn head(#[shape(8, 128)] x: Ref<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    let rows = x.at(&[ds(0, program_id(0)), all()]).load();
    out.store(rows);
}

fn main() {}
