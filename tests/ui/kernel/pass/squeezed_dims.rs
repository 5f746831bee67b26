// `None` squeezes a block dim: the body sees the block without it.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (H, S / BS), dimension_semantics = (parallel, parallel))]
fn per_head_scale<const BS: usize>(
    #[shape(H, S, D)]
    #[block((None, BS, D), |h, s| (h, s, 0))]
    x: Ref<f32>,
    #[shape(H, S, D)]
    #[block((None, BS, D), |h, s| (h, s, 0))]
    out: RefMut<f32>,
) {
    assert_eq!(x.shape(), [BS, 128]);
    out.store(x.load() * 0.5);
}

fn main() {
    let args = [ArgSpec::new(DType::F32, [4, 256, 128])];
    let k = per_head_scale::<64>()
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
    assert_eq!(k.grid, [4, 4]);
}
