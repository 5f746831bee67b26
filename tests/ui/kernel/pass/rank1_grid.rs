// A rank-1 grid may be written as a 1-tuple or as a bare expression.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (N / B,), dimension_semantics = (parallel,))]
fn double_tuple<const B: usize>(
    #[shape(N)]
    #[block((B,), |i| (i,))]
    x: Ref<f32>,
    #[shape(N)]
    #[block((B,), |i| (i,))]
    out: RefMut<f32>,
) {
    out.store(x.load() * 2.0);
}

#[tpu_kernel(grid = N / B, dimension_semantics = parallel)]
fn double_bare<const B: usize>(
    #[shape(N)]
    #[block(B, |i| i)]
    x: Ref<f32>,
    #[shape(N)]
    #[block(B, |i| i)]
    out: RefMut<f32>,
) {
    out.store(x.load() * 2.0);
}

fn main() {
    let args = [ArgSpec::new(DType::F32, [1024])];
    let a = double_tuple::<256>()
        .instantiate(&args, &KernelRules::portable())
        .unwrap();
    let b = double_bare::<256>()
        .instantiate(&args, &KernelRules::portable())
        .unwrap();
    assert_eq!(a.grid, [4]);
    assert_eq!(b.grid, [4]);
}
