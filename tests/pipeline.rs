//! `Pipeline` (Pallas' `emit_pipeline`): a pipeline over HBM operands nested in a kernel
//! body, on the interpreter, the CPU plugin, mosaic-eval and for libtpu, against f64
//! references.

mod common;

use common::Case;
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelRules};
use tessera::kernels::pipelined_matmul;
use tessera::prelude::*;

/// `x @ y` in f64.
fn reference_matmul(x: &HostArray, y: &HostArray) -> Vec<f64> {
    let (m, k, n) = (x.shape()[0], x.shape()[1], y.shape()[1]);
    common::matmul_ref(&x.to_f64_vec(), &y.to_f64_vec(), m, k, n)
}

fn matmul_args() -> Vec<HostArray> {
    vec![
        HostArray::random(DType::F32, [32, 384], 1),
        HostArray::random(DType::F32, [384, 256], 2),
    ]
}

/// Runs `cases` on the interpreter and the CPU plugin and through mosaic-eval against their
/// references, and compiles them with libtpu for v5p.
fn everywhere(cases: impl Fn() -> Vec<Case>, tol: f64) {
    common::cases_on_every_backend(cases(), tol);
    common::cases_on_mosaic_eval(cases(), tol);
    common::cases_compile_for("tpu:v5p:2x2x1", cases());
}

#[test]
fn the_pipelined_matmul_matches_the_reference_everywhere() {
    let args = matmul_args();
    let want = reference_matmul(&args[0], &args[1]);
    everywhere(
        || {
            [2, 3]
                .map(|buffers| -> Case {
                    let def = pipelined_matmul::<f32>((8, 128, 128), buffers);
                    ("pipelined_matmul", def, args.clone(), want.clone())
                })
                .to_vec()
        },
        1e-4,
    );
}

/// The interpreter lands each copy at a random operation between its start and its wait
/// (seeded): no seed finds a race, so no step reads a block before its copy has landed or
/// overwrites a slot a copy still reads.
#[test]
fn no_landing_order_of_the_copies_races() {
    let args = matmul_args();
    let want = reference_matmul(&args[0], &args[1]);
    for buffers in [2, 3, 4] {
        let def = pipelined_matmul::<f32>((8, 128, 128), buffers);
        for seed in 0..4 {
            let options = InterpretOptions {
                copy_landing: Some(seed),
                ..InterpretOptions::default()
            };
            let out = interpret::run(&def, &args, &options)
                .unwrap_or_else(|e| panic!("{buffers} buffers, seed {seed}: {e}"));
            let what = format!("{buffers} buffers, seed {seed}");
            common::assert_close(&out[0].to_f64_vec(), &want, 1e-4, &what);
        }
    }
}

/// Row sums of `x` (f32 `[R, C]` in HBM) into `out` (`[R, 128]`, every lane the row's sum),
/// over a pipeline whose steps walk the columns innermost: consecutive steps accumulate in
/// one output block, which is copied back once, when the row block changes.
#[tpu_kernel(grid = 1)]
fn row_sums(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, 128)] mut out: HbmMut<f32>,
    #[comptime] buffers: usize,
) {
    let mut pipeline = Pipeline::new(&[R / 8, C / 128]).buffers(buffers);
    let xb = pipeline.input(&x, &[8, 128], |g| [g[0], g[1]]);
    let ob = pipeline.output(&mut out, &[8, 128], |g| (g[0], 0));
    pipeline.run(|step| {
        let sums = step.output(ob);
        when(step.indices()[1].eq(0), || sums.store(0.0));
        let row = step.input(xb).load().sum_keepdims(1);
        sums.store(sums.load() + row.broadcast_to(&[8, 128]));
    });
}

#[test]
fn consecutive_steps_on_one_output_block_accumulate_in_vmem() {
    let x = HostArray::random(DType::F32, [24, 512], 3);
    let rows: Vec<f64> = x.to_f64_vec().chunks(512).map(|r| r.iter().sum()).collect();
    let want: Vec<f64> = rows.iter().flat_map(|&s| [s; 128]).collect();
    everywhere(
        || {
            [2, 3]
                .map(|buffers| -> Case {
                    ("row_sums", row_sums(buffers), vec![x.clone()], want.clone())
                })
                .to_vec()
        },
        1e-4,
    );
}

#[test]
fn blocks_that_do_not_tile_and_a_single_buffer_are_refused_with_the_fix() {
    let specs = [ArgSpec::new(DType::F32, [24, 500])];
    let e = row_sums(2)
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blocks of [8, 128] do not tile `x` of shape [24, 500]"),
        "{e}"
    );
    assert!(e.contains("pipeline.rs:"), "{e}");
    let specs = [ArgSpec::new(DType::F32, [24, 512])];
    let e = row_sums(1)
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 or more buffers per operand, not 1"), "{e}");
}

/// Two pipelines, the second's body reading a block through the first's handle.
#[tpu_kernel(grid = 1)]
fn crossed_pipelines(
    #[shape(8, 128)] x: Hbm<f32>,
    #[shape(8, 128)] mut out: HbmMut<f32>,
    #[shape(8, 128)] mut other: HbmMut<f32>,
) {
    let mut first = Pipeline::new(&[1]);
    let xb = first.input(&x, &[8, 128], |_| (0, 0));
    let ob = first.output(&mut out, &[8, 128], |_| (0, 0));
    first.run(|step| step.output(ob).store(step.input(xb).load()));
    let mut second = Pipeline::new(&[1]);
    let other_block = second.output(&mut other, &[8, 128], |_| (0, 0));
    second.run(|step| step.output(other_block).store(step.input(xb).load()));
}

#[test]
fn a_step_refuses_another_pipelines_handle() {
    let e = crossed_pipelines()
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &KernelRules::tpu())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("this block handle belongs to another pipeline"),
        "{e}"
    );
}

/// An integer index in `.at()` drops its dimension (Pallas' `buf[slot]`): the window of a
/// `[2, 8, 128]` buffer at `[slot, :, :]` loads and stores `[8, 128]` values.
#[tpu_kernel(grid = 1)]
fn swap_halves(
    #[shape(2, 8, 128)]
    #[block((2, 8, 128), |i| (0, 0, 0))]
    x: Ref<f32>,
    #[shape(2, 8, 128)]
    #[block((2, 8, 128), |i| (0, 0, 0))]
    out: RefMut<f32>,
) {
    let first = x.at(&[0.into(), all(), all()]).load();
    let one = constant(DType::I32, &[], 1);
    let second = x.at(&[one.into(), all(), all()]).load();
    out.at(&[0.into(), all(), all()]).store(second * 2.0);
    out.at(&[one.into(), all(), all()]).store(first);
}

#[test]
fn integer_indices_squeeze_their_dimension() {
    let x = HostArray::random(DType::F32, [2, 8, 128], 4);
    let v = x.to_f64_vec();
    let (a, b) = v.split_at(8 * 128);
    let want: Vec<f64> = b.iter().map(|x| 2.0 * x).chain(a.iter().copied()).collect();
    everywhere(
        || vec![("swap_halves", swap_halves(), vec![x.clone()], want.clone())],
        0.0,
    );
}
