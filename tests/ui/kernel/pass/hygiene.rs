// Generated names never clash with the user's: parameters and shape names may look like them.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (__g / 8,), name = "hygienic")]
fn hygiene(
    #[shape(__g, __b)]
    #[block((8, __b), |__t| (__t, 0))]
    __shape_x: Ref<f32>,
    #[shape(__g, __b)]
    #[block((8, __b), |__map| (__map, 0))]
    __block_out: RefMut<f32>,
    #[comptime] __body: u32,
) {
    __block_out.store(__shape_x.load() * __body as f32);
}

fn main() {
    let args = [ArgSpec::new(DType::F32, [16, 128])];
    let k = hygiene(2).instantiate(&args, &KernelRules::tpu()).unwrap();
    assert_eq!(k.name, "hygienic");
}
