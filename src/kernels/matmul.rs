//! Tiled matrix multiplication with an f32 accumulator in scratch.

use tessera_dsl::prelude::*;

/// `out = x @ y`, blocked `BM x BK` by `BK x BN`, accumulating over the `arbitrary` k axis.
#[tpu_kernel(grid = (M / BM, N / BN, K / BK),
             dimension_semantics = (parallel, parallel, arbitrary))]
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
