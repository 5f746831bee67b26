// An index map may compute its result in a block; literal indices are Rust integers.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (M / 8, 2), dimension_semantics = (parallel, parallel))]
fn copy_halves(
    #[shape(M, 256)]
    #[block((8, 128), |i, j| {
        let row = i;
        (row, j)
    })]
    x: Ref<f32>,
    #[shape(M, 256)]
    #[block((8, 128), |i, j| (i, j))]
    out: RefMut<f32>,
    #[shape(M, 128)]
    #[block((8, 128), |i, j| (i, 0))]
    first: RefMut<f32>,
) {
    out.store(x.load());
    when(program_id(1).eq(0), || first.store(x.load()));
}

fn main() {
    let args = [ArgSpec::new(DType::F32, [64, 256])];
    let k = copy_halves()
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
    assert_eq!(k.grid, [8, 2]);
}
