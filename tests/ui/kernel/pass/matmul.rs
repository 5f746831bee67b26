// A tiled matmul with an f32 accumulator in scratch, generic over the input element type.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (M / BM, N / BN, K / BK), dimension_semantics = (parallel, parallel, arbitrary))]
pub fn matmul<T: Element, const BM: usize, const BN: usize, const BK: usize>(
    #[shape(M, K)]
    #[block((BM, BK), |i, j, kk| (i, kk))]
    x: Ref<T>,
    #[shape(K, N)]
    #[block((BK, BN), |i, j, kk| (kk, j))]
    y: Ref<T>,
    #[shape(M, N)]
    #[block((BM, BN), |i, j, kk| (i, j))]
    out: RefMut<f32>,
    #[scratch(BM, BN)] acc: Scratch<f32>,
) {
    when(program_id(2).eq(0), || acc.store(0.0));
    acc.store(acc.load() + dot(x.load(), y.load()));
    when(program_id(2).eq(num_programs(2) - 1), || {
        out.store(acc.load())
    });
}

fn main() {
    let f32_args = [
        ArgSpec::new(DType::F32, [256, 512]),
        ArgSpec::new(DType::F32, [512, 384]),
    ];
    let k = matmul::<f32, 128, 128, 128>()
        .instantiate(&f32_args, &KernelRules::tpu())
        .unwrap();
    assert_eq!(k.grid, [2, 3, 4]);
    let bf16_args = [
        ArgSpec::new(DType::BF16, [256, 512]),
        ArgSpec::new(DType::BF16, [512, 384]),
    ];
    matmul::<bf16, 128, 128, 256>()
        .instantiate(&bf16_args, &KernelRules::tpu())
        .unwrap();
}
