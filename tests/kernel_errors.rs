//! What users get wrong, and what they are told: hardware rules, coverage, VMEM, arguments,
//! traced mistakes, run-time bounds, races.

mod common;

use common::random;
use tessera::dsl::interpret::{run, InterpretOptions};
use tessera::dsl::prelude::*;
use tessera::dsl::{ArgSpec, HostArray, KernelError, KernelRules, ProblemKind};
use tessera::kernels::matmul;

fn f32s(shape: &[usize]) -> ArgSpec {
    ArgSpec::new(DType::F32, shape.to_vec())
}

fn instantiate_err(
    def: &tessera::dsl::KernelDef,
    args: &[ArgSpec],
    rules: &KernelRules,
) -> KernelError {
    match def.instantiate(args, rules) {
        Ok(k) => panic!("expected an error, got a kernel:\n{k}"),
        Err(e) => e,
    }
}

#[test]
fn tpu_tiling_names_the_operand_and_the_fix() {
    let e = instantiate_err(
        &matmul::<f32, 8, 8, 8>(),
        &[f32s(&[16, 16]), f32s(&[16, 16])],
        &KernelRules::tpu(),
    );
    assert!(e.has(ProblemKind::Tiling), "{e}");
    let text = e.to_string();
    assert!(text.contains("in_specs[0] (x)"), "{text}");
    assert!(text.contains("multiple of 128"), "{text}");
    // The same blocks are fine where TPU tiling does not apply.
    matmul::<f32, 8, 8, 8>()
        .instantiate(
            &[f32s(&[16, 16]), f32s(&[16, 16])],
            &KernelRules::portable(),
        )
        .unwrap();
}

#[test]
fn bf16_needs_sixteen_sublanes() {
    let args = [
        ArgSpec::new(DType::BF16, [64, 256]),
        ArgSpec::new(DType::BF16, [256, 128]),
    ];
    let e = instantiate_err(
        &matmul::<half::bf16, 8, 128, 128>(),
        &args,
        &KernelRules::tpu(),
    );
    assert!(e.to_string().contains("multiple of 16"), "{e}");
    matmul::<half::bf16, 16, 128, 128>()
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
}

#[test]
fn block_must_divide_the_array() {
    let e = instantiate_err(
        &matmul::<f32, 8, 8, 8>(),
        &[f32s(&[20, 16]), f32s(&[16, 16])],
        &KernelRules::portable(),
    );
    assert!(e.has(ProblemKind::Coverage), "{e}");
    assert!(
        e.to_string().contains("does not divide the array dim (20)"),
        "{e}"
    );
}

#[test]
fn argument_mistakes_are_named() {
    let def = matmul::<f32, 8, 8, 8>();
    let rules = KernelRules::portable();
    let e = instantiate_err(&def, &[f32s(&[16, 16])], &rules);
    assert!(e.to_string().contains("expected 2 arguments"), "{e}");
    let e = instantiate_err(
        &def,
        &[ArgSpec::new(DType::BF16, [16, 16]), f32s(&[16, 16])],
        &rules,
    );
    assert!(
        e.to_string()
            .contains("argument 0 (x): expected a f32 array, got bf16[16, 16]"),
        "{e}"
    );
    let e = instantiate_err(&def, &[f32s(&[16, 16, 1]), f32s(&[16, 16])], &rules);
    assert!(e.to_string().contains("expected a rank-2 array"), "{e}");
    let e = instantiate_err(&def, &[f32s(&[16, 24]), f32s(&[16, 16])], &rules);
    assert!(
        e.to_string().contains("y: dim 0 is 16 but `K` is 24"),
        "{e}"
    );
}

#[test]
fn vmem_budget_is_enforced_with_the_largest_buffers_named() {
    let def = matmul::<f32, 1024, 1024, 1024>();
    let args = [f32s(&[2048, 2048]), f32s(&[2048, 2048])];
    let e = instantiate_err(&def, &args, &KernelRules::tpu());
    assert!(e.has(ProblemKind::Vmem), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("28.00 MiB") && text.contains("16.00 MiB"),
        "{text}"
    );
    def.instantiate(&args, &KernelRules::tpu().with_vmem_limit(32 << 20))
        .unwrap();
}

/// A dtype mistake inside the body: reported with the kernel author's line.
#[tpu_kernel(grid = (R / 8,))]
fn adds_mixed_dtypes(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    n: Ref<i32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let sum = x.load() + n.load();
    out.store(sum * 2.0);
}

#[test]
fn trace_errors_point_at_the_kernel_line_once() {
    let args = [f32s(&[16, 128]), ArgSpec::new(DType::I32, [16, 128])];
    let e = instantiate_err(&adds_mixed_dtypes(), &args, &KernelRules::tpu());
    assert_eq!(e.problems.len(), 1, "one mistake, one message: {e}");
    let p = &e.problems[0];
    assert_eq!(p.kind, ProblemKind::Trace);
    let loc = p.loc.expect("traced problems carry a location");
    assert!(loc.file.ends_with("kernel_errors.rs"), "{loc}");
    let line = include_str!("kernel_errors.rs")
        .lines()
        .position(|l| l.contains("let sum = x.load() + n.load();"))
        .unwrap() as u32
        + 1;
    assert_eq!(loc.line, line, "{e}");
    assert!(
        p.message.contains("operands differ in dtype: f32 and i32"),
        "{e}"
    );
}

/// Reads a window at a run-time offset that can leave the block.
#[tpu_kernel(grid = (1,))]
fn shifted_window(
    #[shape(8, 128)] x: Ref<f32>,
    #[shape(8, 128)] shift: Ref<i32>,
    #[shape(8, 128)] out: RefMut<f32>,
) {
    let start = shift.at(&[ds(0, 1), ds(0, 1)]).load().reshape(&[]);
    out.at(&[ds(0, 1), all()])
        .store(x.at(&[ds(start, 1), all()]).load());
    out.at(&[ds(1, 7), all()]).store(0.0);
}

/// The window's start is loaded at run time: checked when the kernel runs, on every
/// backend, with the kernel line, the value and its bound.
#[test]
fn dynamic_slices_out_of_bounds_are_run_time_errors() {
    use tessera::backend::{self, Backend};
    let x = random(DType::F32, &[8, 128], 1);
    let ok = HostArray::i32([8, 128], vec![7; 1024]).unwrap();
    let bad = HostArray::i32([8, 128], vec![8; 1024]).unwrap();
    let line = 1 + include_str!("kernel_errors.rs")
        .lines()
        .position(|l| l.trim_start().starts_with(".store(x.at(&[ds(start, 1)"))
        .unwrap();
    for b in Backend::everywhere() {
        let rules = KernelRules::tpu();
        let out = backend::run(&shifted_window(), &[x.clone(), ok.clone()], b, &rules)
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        assert_eq!(out[0].to_f32_vec()[..128], x.to_f32_vec()[7 * 128..], "{b}");
        let e = backend::run(&shifted_window(), &[x.clone(), bad.clone()], b, &rules)
            .map(drop)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "kernel `shifted_window`: tests/kernel_errors.rs:{line}:45: run-time check: the \
                 start of `x`'s window along dim 0 is 8 at grid step [0], outside 0 to 7; the \
                 access was not made and the outputs were discarded (check the run-time data \
                 it comes from, or mark an index proven with `unchecked_index`)"
            ),
            "{b}"
        );
    }
}

/// A race: two parallel steps write the same output block.
#[tpu_kernel(grid = (R / 8,), dimension_semantics = (parallel,))]
fn racy_shared_output(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(8, 128)]
    #[block((8, 128), |i| (0, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

#[test]
fn two_parallel_steps_writing_one_output_block_is_a_race() {
    let x = random(DType::F32, &[16, 128], 2);
    let e = run(&racy_shared_output(), &[x], &InterpretOptions::default())
        .map(drop)
        .unwrap_err();
    assert!(e.to_string().contains("race: output block [0, 0]"), "{e}");
}

/// An output block the grid never visits.
#[tpu_kernel(grid = (1,))]
fn writes_half(
    #[shape(16, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(16, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

#[test]
fn unwritten_output_blocks_are_coverage_errors() {
    let e = instantiate_err(&writes_half(), &[f32s(&[16, 128])], &KernelRules::tpu());
    assert!(e.has(ProblemKind::Coverage), "{e}");
    assert!(e.to_string().contains("output block [1, 0]"), "{e}");
}

/// An index map that runs one block past the end of its array.
#[tpu_kernel(grid = (R / 8,))]
fn shifted_blocks(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i + 1, 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(x.load());
}

#[test]
fn index_maps_out_of_bounds_are_caught_at_instantiation() {
    let e = instantiate_err(&shifted_blocks(), &[f32s(&[32, 128])], &KernelRules::tpu());
    assert!(e.has(ProblemKind::Coverage), "{e}");
    let text = e.to_string();
    assert!(text.contains("in_specs[0] (x)"), "{text}");
    assert!(
        text.contains("block index 4 for dim 0, which has 4 blocks of 8"),
        "{text}"
    );
    assert!(text.contains("grid step [3]"), "{text}");
}
