//! `input_output_aliases`: an output that is an input's buffer keeps the input's values where
//! the kernel does not store (JAX's block-sparse tutorial relies on it), on the interpreter,
//! the CPU plugin, mosaic-eval and for libtpu; without the alias, the blocks no grid step
//! stores are reported by name rather than returned as NaN. The input reads what earlier
//! steps wrote back (an accumulator cycled through 3 blocks, as tokamax's dQ partials), and
//! the interpreter refuses a read fewer than 3 steps after the write.

mod common;

use tessera::backend::{self, Backend};
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{ArgSpec, CallFacts, DType, HostArray, KernelRules, Lowering};
use tessera::prelude::*;
use tessera::runtime::{CompileOptions, Plugin};
use tessera_mosaic_eval::RunOptions;

/// `out[b] = 2 x[b] + 1` for the row blocks `b` listed in `blocks`; the other blocks of `out`
/// are `x`'s (the output is `x`'s buffer).
#[tpu_kernel(grid = N)]
fn update_listed_blocks(
    #[shape(N)] blocks: Smem<i32>,
    #[shape(R, C)]
    #[block((8, C), |i| (blocks.get([i]), 0))]
    x: Ref<f32>,
    #[shape(R, C)]
    #[block((8, C), |i| (blocks.get([i]), 0))]
    #[alias(x)]
    out: RefMut<f32>,
) {
    out.store(x.load() * 2.0 + 1.0);
}

/// [`update_listed_blocks`] without the alias: the blocks not listed are never stored.
#[tpu_kernel(grid = N)]
fn update_listed_blocks_unaliased(
    #[shape(N)] blocks: Smem<i32>,
    #[shape(R, C)]
    #[block((8, C), |i| (blocks.get([i]), 0))]
    x: Ref<f32>,
    #[shape(R, C)]
    #[block((8, C), |i| (blocks.get([i]), 0))]
    out: RefMut<f32>,
) {
    out.store(x.load() * 2.0 + 1.0);
}

/// Blocks 1 and 4 of 6 (rows 8-15 and 32-39 of 48), and `x`.
fn args() -> Vec<HostArray> {
    vec![
        HostArray::i32([2], vec![1, 4]).unwrap(),
        HostArray::random(DType::F32, [48, 128], 7),
    ]
}

/// What the aliased kernel computes, in f64.
fn reference(x: &HostArray) -> Vec<f64> {
    x.to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let block = i / (8 * 128);
            if block == 1 || block == 4 {
                2.0 * v + 1.0
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn an_aliased_output_keeps_the_inputs_values_where_the_grid_does_not_store() {
    let args = args();
    let want = reference(&args[1]);
    for b in Backend::everywhere() {
        let out = backend::run(&update_listed_blocks(), &args, b, &KernelRules::tpu())
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        common::assert_close(&out[0].to_f64_vec(), &want, 1e-6, b.name());
    }
    let out = common::mosaic_eval(
        &update_listed_blocks(),
        &args,
        &KernelRules::tpu(),
        &RunOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    common::assert_close(&out[0].to_f64_vec(), &want, 1e-6, "mosaic-eval");
}

#[test]
fn the_ir_and_the_custom_call_name_the_alias() {
    let specs: Vec<ArgSpec> = args().iter().map(ArgSpec::of).collect();
    let k = update_listed_blocks()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap();
    assert!(k.to_string().contains("aliases x"), "{k}");
    // Operands of the call: the prefetch table (0), then x (1), then the zeros of the
    // kernel's check flags (2: its index map reads the table, so its block index is checked
    // at run time), which the flags (output 1) alias.
    let call = Lowering::tpu()
        .mosaic_call(&k, CallFacts::default())
        .unwrap();
    let aliases: Vec<(usize, usize)> = call
        .call
        .output_operand_aliases
        .iter()
        .map(|a| (a.output, a.operand))
        .collect();
    assert_eq!(aliases, [(0, 1), (1, 2)]);
    let module = Lowering::tpu().lower_module(&k).unwrap().to_mlir();
    assert!(module.contains("output_operand_aliases"), "{module}");
    // libtpu compiles the call with its alias.
    let plugin = Plugin::libtpu()
        .unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"));
    let topology = plugin.topology("v5p:2x2x1").expect("topology");
    let options = CompileOptions::manual_partitions(1).unwrap();
    topology
        .compile(&module, &options)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_output_the_grid_leaves_unstored_is_reported_with_its_blocks() {
    let e = interpret::run(
        &update_listed_blocks_unaliased(),
        &args(),
        &InterpretOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("out_specs[0] (out)"), "{e}");
    assert!(
        e.contains("4 of its 6 blocks are not wholly stored by any grid step"),
        "{e}"
    );
    assert!(e.contains("blocks [0, 0], [2, 0], [3, 0], [5, 0]"), "{e}");
    assert!(e.contains("`#[alias(x)]`"), "{e}");
    // mosaic-eval, which sees only the Mosaic text and the custom call's results.
    let e = common::mosaic_eval(
        &update_listed_blocks_unaliased(),
        &args(),
        &KernelRules::tpu(),
        &RunOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("output 0: 4 of its 6 blocks are never visited by the grid"),
        "{e}"
    );
    assert!(e.contains("blocks [0, 0], [2, 0], [3, 0], [5, 0]"), "{e}");
}

#[test]
fn an_alias_of_another_shape_is_refused() {
    // `out` is declared with the shape of `x`; an input of another dtype cannot be aliased.
    #[tpu_kernel(grid = 1)]
    fn widen(
        #[shape(R, C)] x: Ref<i32>,
        #[shape(R, C)]
        #[alias(x)]
        out: RefMut<f32>,
    ) {
        out.store(x.load().cast(DType::F32));
    }
    let e = widen()
        .instantiate(&[ArgSpec::new(DType::I32, [8, 128])], &KernelRules::tpu())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("aliases input `x` (i32[8, 128]) but is f32[8, 128]"),
        "{e}"
    );
}

/// `acc[i % cycle] += x[i]` at grid step `i` of `N`, through an input aliased to the
/// output: each block of `acc` is read back `cycle` steps after it was written.
#[tpu_kernel(grid = N)]
fn accumulate_in_a_cycle(
    #[shape(N, 8, C)]
    #[block((None, 8, C), |i| (i, 0, 0))]
    x: Ref<f32>,
    #[shape(R, C)]
    #[block((8, C), |i| (i % cycle, 0))]
    acc_in: Ref<f32>,
    #[shape(R, C)]
    #[block((8, C), |i| (i % cycle, 0))]
    #[alias(acc_in)]
    acc: RefMut<f32>,
    #[comptime] cycle: usize,
) {
    acc.store(acc_in.load() + x.load());
}

/// 12 steps' `x` and an `acc` of `cycle` blocks starting at 1.
fn cycle_args(cycle: usize) -> Vec<HostArray> {
    vec![
        HostArray::random(DType::F32, [12, 8, 128], 3),
        HostArray::from_f64(DType::F32, [8 * cycle, 128], &vec![1.0; 8 * cycle * 128]).unwrap(),
    ]
}

/// What [`accumulate_in_a_cycle`] leaves in `acc`, in f64.
fn cycle_reference(x: &HostArray, cycle: usize) -> Vec<f64> {
    let x = x.to_f64_vec();
    let block = 8 * 128;
    (0..cycle * block)
        .map(|e| {
            let (b, at) = (e / block, e % block);
            1.0 + (b..12)
                .step_by(cycle)
                .map(|i| x[i * block + at])
                .sum::<f64>()
        })
        .collect()
}

#[test]
fn an_aliased_input_reads_what_earlier_steps_wrote_back() {
    for cycle in [3, 4] {
        let args = cycle_args(cycle);
        let want = cycle_reference(&args[0], cycle);
        let def = accumulate_in_a_cycle(cycle);
        for b in Backend::everywhere() {
            let out = backend::run(&def, &args, b, &KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{} (cycle {cycle}): {e}", b.name()));
            common::assert_close(&out[0].to_f64_vec(), &want, 1e-5, b.name());
        }
        let out = common::mosaic_eval(&def, &args, &KernelRules::tpu(), &RunOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        common::assert_close(&out[0].to_f64_vec(), &want, 1e-5, "mosaic-eval");
    }
}

#[test]
fn a_read_too_soon_after_the_write_is_refused_by_the_interpreter() {
    let e = interpret::run(
        &accumulate_in_a_cycle(2),
        &cycle_args(2),
        &InterpretOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("acc_in"), "{e}");
    assert!(
        e.contains("grid step 2 reads block [0, 0] of the buffer `acc` aliases, which `acc` held at step 0, 2 step(s) before"),
        "{e}"
    );
    assert!(e.contains("at least 3 steps before"), "{e}");
}
