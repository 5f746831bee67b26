//! SMEM scratch (`#[scratch(..)] t: Smem<T>`, Pallas' `pltpu.SMEM`): words the kernel writes
//! with `set` and reads with `get`, kept across grid steps, on the interpreter, the CPU
//! plugin, mosaic-eval and for libtpu.

mod common;

use tessera::backend::{self, Backend};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelRules, Lowering};
use tessera::prelude::*;
use tessera::runtime::{CompileOptions, Plugin};
use tessera_mosaic_eval::RunOptions;

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
    let args = [HostArray::i32([5], lengths.clone()).unwrap()];
    let mut want = Vec::new();
    let mut total = 0;
    for l in lengths {
        total += l;
        want.extend(std::iter::repeat_n(total as f64, 8 * 128));
    }
    for b in Backend::ALL {
        let out = backend::run(&running_totals(), &args, b, &KernelRules::tpu())
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        common::assert_close(&out[0].to_f64_vec(), &want, 0.0, b.name());
    }
    let out = common::mosaic_eval(
        &running_totals(),
        &args,
        &KernelRules::tpu(),
        &RunOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    common::assert_close(&out[0].to_f64_vec(), &want, 0.0, "mosaic-eval");
    // libtpu compiles the SMEM scratch and its stores.
    let k = running_totals()
        .instantiate(&[ArgSpec::of(&args[0])], &KernelRules::tpu())
        .unwrap();
    let module = Lowering::tpu().lower_module(&k).unwrap().to_mlir();
    assert!(module.contains("tpu_custom_call"));
    let text = tessera::dsl::mosaic::lower(&k).unwrap().text;
    assert!(text.contains("memref.store"), "{text}");
    let plugin = Plugin::libtpu()
        .unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"));
    plugin
        .topology("v5p:2x2x1")
        .unwrap()
        .compile(&module, &CompileOptions::manual_partitions(1).unwrap())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
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
