// One mistake, one error: the kernel's function still exists for its callers.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (M / BM,), dimension_semantics = (parallel, parallel))]
fn copy<const BM: usize>(
    #[shape(M, 128)]
    #[block((BM, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(M, 128)]
    #[block((BM, 128), |i| (i, 0))]
    out: RefMut<f32>,
    #[comptime] scale: u32,
) {
    out.store(x.load() * scale as f32);
}

fn main() {
    let def = copy::<8>(2);
    let kernel = def.instantiate(&[ArgSpec::new(DType::F32, [64, 128])], &KernelRules::tpu());
    assert!(kernel.is_ok());
}
