//! SMEM scratch (`#[scratch(..)] t: Smem<T>`, Pallas' `pltpu.SMEM`): words the kernel writes
//! with `set` and reads with `get`, kept across grid steps, on the interpreter, the CPU
//! plugin, mosaic-eval and for libtpu.

mod common;

use tessera::dsl::{ArgSpec, DType, HostArray, KernelRules};
use tessera::prelude::*;

/// Block `i` of `out` (8 x 128) holds the running total of `lengths[0..=i]`, counted in an
/// SMEM word across the (sequential) grid steps; the second word counts the steps.
#[tpu_kernel(grid = N, dimension_semantics = (arbitrary,))]
fn running_totals(
    #[shape(N)] lengths: Smem<i32>,
    #[shape(N * 8, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
    #[scratch(2)] state: Smem<i32>,
) {
    let i = program_id(0);
    when(i.eq(0), || {
        state.set([0], 0);
        state.set([1], 0);
    });
    state.set([0], state.get([0]) + lengths.get([i]));
    state.set([1], state.get([1]) + 1);
    let total = state.get([0]) * state.get([1]) / (i + 1);
    out.store(total.cast(DType::F32));
}

#[test]
fn smem_scratch_keeps_words_across_grid_steps_on_every_backend() {
    let lengths = vec![3, 0, 7, 2, 5];
    let args = vec![HostArray::i32([5], lengths.clone()).unwrap()];
    let mut want = Vec::new();
    let mut total = 0;
    for l in lengths {
        total += l;
        want.extend(std::iter::repeat_n(total as f64, 8 * 128));
    }
    let cases = || {
        vec![(
            "running_totals",
            running_totals(),
            args.clone(),
            want.clone(),
        )]
    };
    common::cases_on_every_backend(cases(), 0.0);
    common::cases_on_mosaic_eval(cases(), 0.0);
    // libtpu compiles the SMEM scratch and its stores.
    common::cases_compile_for("tpu:v5p:2x2x1", cases());
    let k = running_totals()
        .instantiate(&[ArgSpec::of(&args[0])], &KernelRules::tpu())
        .unwrap();
    let text = tessera::dsl::mosaic::lower(&k).unwrap().text;
    assert!(text.contains("memref.store"), "{text}");
}

/// Writes into its scalar-prefetch table.
#[tpu_kernel(grid = 1)]
fn writes_its_prefetch(
    #[shape(1)] table: Smem<i32>,
    #[shape(8, 128)]
    #[block((8, 128), |i| (0, 0))]
    out: RefMut<f32>,
) {
    table.set([0], 1);
    out.store(0.0);
}

#[test]
fn a_scalar_prefetch_table_is_read_only() {
    let e = writes_its_prefetch()
        .instantiate(&[ArgSpec::new(DType::I32, [1])], &KernelRules::tpu())
        .unwrap_err()
        .to_string();
    assert!(e.contains("smem_scratch.rs:"), "{e}");
    assert!(
        e.contains(
            "`table` is not SMEM scratch: only `#[scratch(..)] table: Smem<T>` takes scalar stores"
        ),
        "{e}"
    );
}
