// Scalar prefetch comes first; index maps read it to pick blocks at run time.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (N,), dimension_semantics = (arbitrary,))]
fn gather_rows(
    #[shape(N)] order: Smem<i32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (order.get([i]), 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

fn main() {
    let args = [
        ArgSpec::new(DType::I32, [4]),
        ArgSpec::new(DType::F32, [32, 128]),
    ];
    let k = gather_rows()
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
    assert_eq!(k.grid, [4]);
}
