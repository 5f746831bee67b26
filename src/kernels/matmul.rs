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

/// [`matmul`] with its operands left in HBM and the blocking done by a pipeline nested in
/// the body ([`Pipeline`], Pallas' `emit_pipeline`) over `(M / bm, N / bn, K / bk)` blocks
/// (`blocks = (bm, bn, bk)`) with `buffers` VMEM buffers per operand: the kernel has one
/// grid step; the pipeline copies the `x` and `y` blocks of the next steps into VMEM while
/// a step computes, and each `out` block back to HBM once its last k step has accumulated
/// into it (consecutive steps on one output block keep it in VMEM).
#[tpu_kernel(grid = 1)]
pub fn pipelined_matmul<T: Element>(
    #[shape(M, K)] x: Hbm<T>,
    #[shape(K, N)] y: Hbm<T>,
    #[shape(M, N)] mut out: HbmMut<f32>,
    #[comptime] blocks: (usize, usize, usize),
    #[comptime] buffers: usize,
) {
    let (bm, bn, bk) = blocks;
    let mut pipeline = Pipeline::new(&[M / bm, N / bn, K / bk]).buffers(buffers);
    let xb = pipeline.input(&x, &[bm, bk], |g| (g[0], g[2]));
    let yb = pipeline.input(&y, &[bk, bn], |g| (g[2], g[1]));
    let ob = pipeline.output(&mut out, &[bm, bn], |g| (g[0], g[1]));
    pipeline.run(|step| {
        let acc = step.output(ob);
        when(step.indices()[2].eq(0), || acc.store(0.0));
        acc.store(acc.load() + dot(step.input(xb).load(), step.input(yb).load()));
    });
}
