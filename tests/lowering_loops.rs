//! The StableHLO lowering's loop nest keeps the interpreter's pipeline semantics: blocks
//! fetched and written back at the loop level where their index changes, a fresh (garbage)
//! output buffer when the block index changes and not when it repeats, `when`s on the first
//! or last grid step run once outside the loops in the right order, and a transposed-left
//! matmul computed in the form XLA runs fast gives the same products. One test per backend
//! (`tessera::test_device!`): the interpreter, cpu, and with their features gpu and tpu.

mod common;

use common::{assert_close, random};
use tessera::backend::{run, Backend};
use tessera::dsl::prelude::*;
use tessera::dsl::stablehlo::vectorised_dims;
use tessera::dsl::{ArgSpec, HostArray, KernelDef, KernelRules};

fn on(backend: Backend, def: &KernelDef, args: &[HostArray]) -> Vec<f64> {
    run(def, args, backend, &KernelRules::tpu()).unwrap_or_else(|e| panic!("{backend}: {e}"))[0]
        .to_f64_vec()
}

/// Two consecutive steps share each output block (its index map is not the grid index): the
/// first stores the top half, the second the bottom half, so the buffer must survive the
/// repeated index for both halves to reach the array.
#[tpu_kernel(grid = (R / 16,), dimension_semantics = (arbitrary,))]
fn halves_of_one_block(
    #[shape(R, 128)]
    #[block((16, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R / 2, 128)]
    #[block((16, 128), |i| (i / 2, 0))]
    out: RefMut<f32>,
) {
    let i = program_id(0);
    when((i % 2).eq(0), || {
        out.at(&[ds(0, 8), all()])
            .store(x.at(&[ds(0, 8), all()]).load())
    });
    when((i % 2).eq(1), || {
        out.at(&[ds(8, 8), all()])
            .store(x.at(&[ds(8, 8), all()]).load())
    });
}

tessera::test_device!(an_output_block_index_that_repeats_keeps_its_buffer: interpret, cpu, gpu, tpu);

fn an_output_block_index_that_repeats_keeps_its_buffer(backend: Backend) {
    let x = random(DType::F32, &[8 * 16, 128], 3);
    let def = halves_of_one_block();
    let xs = x.to_f64_vec();
    // Output block b: rows 0..8 of input block 2b, rows 8..16 of input block 2b + 1.
    let want: Vec<f64> = (0..4 * 16 * 128)
        .map(|e| {
            let (block, row, col) = (e / (16 * 128), e / 128 % 16, e % 128);
            let from = 2 * block + usize::from(row >= 8);
            xs[(from * 16 + row) * 128 + col]
        })
        .collect();
    assert_eq!(on(backend, &def, &[x]), want, "{backend}");
}

/// Stores only half of each output block: the other half is what a fresh buffer holds
/// (garbage, NaN), not what the previous block left there.
#[tpu_kernel(grid = (R / 16,), dimension_semantics = (arbitrary,))]
fn half_of_each_block(
    #[shape(R, 128)]
    #[block((16, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((16, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let i = program_id(0);
    // Even blocks store their top half, odd blocks their bottom half.
    when((i % 2).eq(0), || {
        out.at(&[ds(0, 8), all()])
            .store(x.at(&[ds(0, 8), all()]).load())
    });
    when((i % 2).eq(1), || {
        out.at(&[ds(8, 8), all()])
            .store(x.at(&[ds(8, 8), all()]).load())
    });
}

// Not on TPU: there an unwritten block holds whatever the memory held, not NaN.
tessera::test_device!(a_new_output_block_starts_as_garbage: interpret, cpu, gpu);

/// The compiled backends return the garbage; the interpreter, the reference, refuses to
/// return an output some of whose elements no step stored, naming the blocks.
fn a_new_output_block_starts_as_garbage(backend: Backend) {
    let x = random(DType::F32, &[4 * 16, 128], 4);
    let def = half_of_each_block();
    let xs = x.to_f64_vec();
    let args = [x];
    if backend == Backend::Interpret {
        let e = run(&def, &args, backend, &KernelRules::tpu())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("4 of its 4 blocks are not wholly stored by any grid step"),
            "{e}"
        );
        return;
    }
    for (e, v) in on(backend, &def, &args).iter().enumerate() {
        let (block, row) = (e / (16 * 128), e / 128 % 16);
        let stored = (block % 2 == 0) == (row < 8);
        assert_eq!(v.is_nan(), !stored, "{backend}, element {e}");
        if stored {
            assert_eq!(*v, xs[e], "{backend}, element {e}");
        }
    }
}

/// `when`s on the first and last steps of the innermost loops (hoisted out of them), one that
/// selects many steps (`j == 0` holds for every `k`: not hoisted), and unconditional work in
/// between; each update doubles and adds, so any change of order shows.
#[tpu_kernel(grid = (R / 8, J, K), dimension_semantics = (arbitrary, arbitrary, arbitrary))]
fn guarded_steps<const J: usize, const K: usize>(
    #[shape(R, 128)]
    #[block((8, 128), |i, j, k| (i, 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i, j, k| (i, 0))]
    out: RefMut<f32>,
    #[scratch(8, 128)] acc: Scratch<f32>,
) {
    let (i, j, k) = (program_id(0), program_id(1), program_id(2));
    let (last_j, last_k) = (num_programs(1) - 1, num_programs(2) - 1);
    when(i.eq(0) & j.eq(0) & k.eq(0), || acc.store(1.0));
    when(j.eq(0) & k.eq(0), || acc.store(acc.load() * 2.0 + 1.0));
    when(k.eq(0), || acc.store(acc.load() * 2.0 + 2.0));
    when(j.eq(0), || acc.store(acc.load() + 3.0));
    acc.store(acc.load() * 0.5 + x.load());
    when(k.eq(last_k), || acc.store(acc.load() - 1.0));
    when(j.eq(last_j) & k.eq(last_k), || out.store(acc.load()));
}

tessera::test_device!(first_and_last_step_whens_run_in_order: interpret, cpu, gpu, tpu);

/// Against the interpreter, exactly (the interpreter's own results are checked finite).
fn first_and_last_step_whens_run_in_order(backend: Backend) {
    let x = random(DType::F32, &[2 * 8, 128], 5);
    // Grid (2, 3, 2).
    let def = guarded_steps::<3, 2>();
    let args = [x];
    let interpreted = on(Backend::Interpret, &def, &args);
    assert!(interpreted.iter().all(|v| v.is_finite()));
    assert_eq!(on(backend, &def, &args), interpreted, "{backend}");
}

/// `out[h] = a[h]^T b[h]` with the wider operand transposed, per head.
#[tpu_kernel(grid = (H,), dimension_semantics = (parallel,))]
fn heads_of_tn_products(
    #[shape(H, KD, M)]
    #[block((None, KD, M), |h| (h, 0, 0))]
    a: Ref<f32>,
    #[shape(H, KD, N)]
    #[block((None, KD, N), |h| (h, 0, 0))]
    b: Ref<f32>,
    #[shape(H, M, N)]
    #[block((None, M, N), |h| (h, 0, 0))]
    out: RefMut<f32>,
) {
    out.store(dot_tn(a.load(), b.load()));
}

/// The same products with the heads as an `arbitrary` dim (a loop, not batch dims).
#[tpu_kernel(grid = (H,), dimension_semantics = (arbitrary,))]
fn looped_tn_products(
    #[shape(H, KD, M)]
    #[block((None, KD, M), |h| (h, 0, 0))]
    a: Ref<f32>,
    #[shape(H, KD, N)]
    #[block((None, KD, N), |h| (h, 0, 0))]
    b: Ref<f32>,
    #[shape(H, M, N)]
    #[block((None, M, N), |h| (h, 0, 0))]
    out: RefMut<f32>,
) {
    out.store(dot_tn(a.load(), b.load()));
}

tessera::test_device!(transposed_left_products_match_batched_and_looped: interpret, cpu, gpu, tpu);

fn transposed_left_products_match_batched_and_looped(backend: Backend) {
    let (h, kd, m, n) = (3, 64, 256, 128);
    let a = random(DType::F32, &[h, kd, m], 7);
    let b = random(DType::F32, &[h, kd, n], 8);
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let want: Vec<f64> = (0..h * m * n)
        .map(|e| {
            let (head, row, col) = (e / (m * n), e / n % m, e % n);
            (0..kd)
                .map(|c| av[(head * kd + c) * m + row] * bv[(head * kd + c) * n + col])
                .sum()
        })
        .collect();
    let args = [a, b];
    for (def, batched) in [(heads_of_tn_products(), 1), (looped_tn_products(), 0)] {
        let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
        let k = def.instantiate(&specs, &KernelRules::tpu()).unwrap();
        assert_eq!(vectorised_dims(&k), batched, "{}", def.name());
        let got = on(backend, &def, &args);
        assert_close(&got, &want, 1e-4, &format!("{} on {backend}", def.name()));
    }
}
