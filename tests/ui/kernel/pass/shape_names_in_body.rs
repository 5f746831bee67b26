// The names `#[shape]` binds are `usize`s in the body too, as a Pallas kernel reads `x.shape`:
// here the row length `C` divides the sum of squares.
use tessera::dsl::interpret::{run, InterpretOptions};
use tessera::dsl::HostArray;
use tessera::prelude::*;

#[tpu_kernel(grid = (R / 8,), dimension_semantics = (parallel,))]
fn mean_square(
    #[shape(R, C)]
    #[block((8, C), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R, 1)]
    #[block((8, 1), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let x = x.load();
    out.store((x * x).sum_keepdims(-1) / C as f32);
    assert_eq!(R % 8, 0);
}

fn main() {
    let x = HostArray::f32([16, 256], vec![2.0; 16 * 256]).unwrap();
    let out = run(&mean_square(), &[x], &InterpretOptions::default()).unwrap();
    assert_eq!(out[0].to_f32_vec(), vec![4.0; 16]);
}
