//! `parallel` grid dims: the check that refuses a kernel whose scratch or output block carries
//! state across a parallel dim (interpreter and mosaic-eval, naming the kernel line), and the
//! megacore mode in which two simulated TensorCores split the leading parallel dims, each with
//! its own scratch (v4 and v5p rules).

mod common;

use common::{matmul_ref, random};
use tessera::dsl::interpret::{run, InterpretOptions};
use tessera::dsl::prelude::*;
use tessera::dsl::{HostArray, KernelDef, KernelError, KernelRules, ProblemKind};
use tessera_mosaic_eval::{EvalError, RunOptions};

/// A matmul that accumulates over `kk` in scratch with `kk` wrongly marked parallel (the
/// example kernel marks it `arbitrary`).
#[tpu_kernel(grid = (M / 128, N / 128, K / 128),
             dimension_semantics = (parallel, parallel, parallel))]
fn wrongly_parallel_matmul(
    #[shape(M, K)]
    #[block((128, 128), |i, j, kk| (i, kk))]
    x: Ref<f32>,
    #[shape(K, N)]
    #[block((128, 128), |i, j, kk| (kk, j))]
    y: Ref<f32>,
    #[shape(M, N)]
    #[block((128, 128), |i, j, kk| (i, j))]
    out: RefMut<f32>,
    #[scratch(128, 128)] acc: Scratch<f32>,
) {
    when(program_id(2).eq(0), || acc.store(0.0));
    acc.store(acc.load() + dot(x.load(), y.load()));
    when(program_id(2).eq(num_programs(2) - 1), || {
        out.store(acc.load())
    });
}

/// The line of this file that holds `text`.
fn line_of(text: &str) -> u32 {
    include_str!("megacore.rs")
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no line holds `{text}`")) as u32
        + 1
}

fn interpret(def: &KernelDef, args: &[HostArray], options: &InterpretOptions) -> KernelError {
    run(def, args, options).map(drop).unwrap_err()
}

fn megacore() -> InterpretOptions {
    InterpretOptions {
        rules: KernelRules::tpu_megacore(),
        ..InterpretOptions::default()
    }
}

/// Lowers `def` to Mosaic text (TPU rules) and runs it through mosaic-eval.
fn mosaic_eval(
    def: &KernelDef,
    args: &[HostArray],
    options: &RunOptions,
) -> Result<Vec<HostArray>, EvalError> {
    common::mosaic_eval(def, args, &KernelRules::tpu(), options)
}

fn matmul_args() -> [HostArray; 2] {
    [
        random(DType::F32, &[256, 384], 1),
        random(DType::F32, &[384, 256], 2),
    ]
}

#[test]
fn a_matmul_accumulating_over_a_parallel_dim_is_refused_with_its_line() {
    let args = matmul_args();
    let line = line_of("acc.store(acc.load() + dot(x.load(), y.load()));");
    // The interpreter, with one core (v5e rules) and with two (v5p rules): the check follows
    // the sequential order, so it reports the same either way.
    for options in [InterpretOptions::default(), megacore()] {
        let e = interpret(&wrongly_parallel_matmul(), &args, &options);
        println!("interpreter: {e}");
        let [p] = e.problems.as_slice() else {
            panic!("one problem expected: {e}")
        };
        assert_eq!(p.kind, ProblemKind::Run, "{e}");
        let loc = p.loc.expect("the load's location");
        assert!(loc.file.ends_with("megacore.rs"), "{e}");
        assert_eq!(loc.line, line, "{e}");
        assert!(
            p.subject.contains("scratch_shapes[0] (acc)")
                && p.message.contains("parallel dim 2 is 0 there, 1 here")
                && p.message.contains("mark the dim `arbitrary`"),
            "{e}"
        );
    }
    // mosaic-eval reads `dimension_semantics` from the Mosaic text and refuses the load at the
    // same kernel line (the op's `loc`).
    let e = mosaic_eval(&wrongly_parallel_matmul(), &args, &RunOptions::default()).unwrap_err();
    println!("mosaic-eval: {e}");
    match &e {
        EvalError::Run { loc, message } => {
            assert!(loc.contains(&format!("megacore.rs:{line}:")), "{e}");
            assert!(message.contains("parallel dim 2 is 0 there, 1 here"), "{e}");
        }
        other => panic!("expected a run error at the load, got {other}"),
    }
}

#[test]
fn the_example_matmul_passes_on_two_cores() {
    let args = matmul_args();
    let def = tessera::kernels::matmul::<f32, 128, 128, 128>();
    let want = matmul_ref(&args[0].to_f64_vec(), &args[1].to_f64_vec(), 256, 384, 256);
    let got = run(&def, &args, &megacore()).unwrap();
    common::assert_close(&got[0].to_f64_vec(), &want, 1e-3, "interpreter, two cores");
    let got = mosaic_eval(&def, &args, &RunOptions::default()).unwrap();
    common::assert_close(&got[0].to_f64_vec(), &want, 1e-3, "mosaic-eval, two cores");
}

/// A running sum carried in scratch across a grid dim wrongly marked parallel: sequentially it
/// computes prefix sums of row blocks; in any other order, or on two cores, it does not.
#[tpu_kernel(grid = (R / 8,), dimension_semantics = (parallel,))]
fn racy_prefix_sum(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
    #[scratch(8, 128)] running: Scratch<f32>,
) {
    when(program_id(0).eq(0), || running.store(0.0));
    running.store(running.load() + x.load());
    out.store(running.load());
}

#[test]
fn with_the_check_allowed_two_cores_compute_half_the_answer() {
    let x = random(DType::F32, &[64, 128], 9);
    let args = std::slice::from_ref(&x);
    let line = line_of("running.store(running.load() + x.load());");
    let e = interpret(&racy_prefix_sum(), args, &InterpretOptions::default());
    assert_eq!(e.problems[0].loc.map(|l| l.line), Some(line), "{e}");

    let allow = |megacore| InterpretOptions {
        megacore: Some(megacore),
        allow_state_across_parallel: true,
        ..InterpretOptions::default()
    };
    let one_core = run(&racy_prefix_sum(), args, &allow(false)).unwrap();
    let two_cores = run(&racy_prefix_sum(), args, &allow(true)).unwrap();
    let (one, two) = (one_core[0].to_f64_vec(), two_cores[0].to_f64_vec());
    // One core: the prefix sums; the second core starts from its own uninitialised scratch
    // (NaN) at row block 4 of 8.
    let x = x.to_f64_vec();
    let mut sum = [0f64; 8 * 128];
    for b in 0..8 {
        for (i, s) in sum.iter_mut().enumerate() {
            *s += x[b * 1024 + i];
        }
        common::assert_close(&one[b * 1024..(b + 1) * 1024], &sum, 1e-4, "one core");
    }
    assert_eq!(two[..4 * 1024], one[..4 * 1024], "the first core's half");
    assert!(
        two[4 * 1024..].iter().all(|v| v.is_nan()),
        "the second core's half"
    );
    // Shuffled parallel order: other results.
    let shuffled = InterpretOptions {
        shuffle_parallel: Some(1),
        ..allow(false)
    };
    assert_ne!(run(&racy_prefix_sum(), args, &shuffled).unwrap(), one_core);

    // mosaic-eval refuses it at the same line, and computes the same halves when allowed.
    let e = mosaic_eval(&racy_prefix_sum(), args, &RunOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains(&format!("megacore.rs:{line}:")),
        "{e}"
    );
    let run_eval = |megacore| {
        let options = RunOptions {
            megacore,
            allow_state_across_parallel: true,
            ..RunOptions::default()
        };
        mosaic_eval(&racy_prefix_sum(), args, &options).unwrap()[0].to_f64_vec()
    };
    let same = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    };
    assert!(same(&run_eval(false), &one), "mosaic-eval, one core");
    assert!(same(&run_eval(true), &two), "mosaic-eval, two cores");
}

/// A matmul that accumulates in its f32 output block, with no scratch (Pallas' own example
/// does this): the block stays in VMEM while `kk` walks, holding what earlier steps stored.
#[tpu_kernel(grid = (M / 128, N / 128, K / 128),
             dimension_semantics = (parallel, parallel, arbitrary))]
fn matmul_into_output(
    #[shape(M, K)]
    #[block((128, 128), |i, j, kk| (i, kk))]
    x: Ref<f32>,
    #[shape(K, N)]
    #[block((128, 128), |i, j, kk| (kk, j))]
    y: Ref<f32>,
    #[shape(M, N)]
    #[block((128, 128), |i, j, kk| (i, j))]
    out: RefMut<f32>,
) {
    when(program_id(2).eq(0), || out.store(0.0));
    out.store(out.load() + dot(x.load(), y.load()));
}

/// The same with `kk` wrongly marked parallel.
#[tpu_kernel(grid = (M / 128, N / 128, K / 128),
             dimension_semantics = (parallel, parallel, parallel))]
fn wrongly_parallel_matmul_into_output(
    #[shape(M, K)]
    #[block((128, 128), |i, j, kk| (i, kk))]
    x: Ref<f32>,
    #[shape(K, N)]
    #[block((128, 128), |i, j, kk| (kk, j))]
    y: Ref<f32>,
    #[shape(M, N)]
    #[block((128, 128), |i, j, kk| (i, j))]
    out: RefMut<f32>,
) {
    when(program_id(2).eq(0), || out.store(0.0));
    let sum = out.load();
    out.store(sum + dot(x.load(), y.load()));
}

#[test]
fn an_output_block_read_back_holds_what_earlier_steps_stored() {
    let args = matmul_args();
    let want = matmul_ref(&args[0].to_f64_vec(), &args[1].to_f64_vec(), 256, 384, 256);
    let def = matmul_into_output();
    for (what, options) in [
        ("one core", InterpretOptions::default()),
        ("two cores", megacore()),
    ] {
        let got = run(&def, &args, &options).unwrap_or_else(|e| panic!("{what}: {e}"));
        common::assert_close(&got[0].to_f64_vec(), &want, 1e-3, what);
    }
    let got = mosaic_eval(&def, &args, &RunOptions::default()).unwrap();
    common::assert_close(&got[0].to_f64_vec(), &want, 1e-3, "mosaic-eval");
    // StableHLO on the CPU plugin: the block is carried through the loop over `kk`.
    common::cases_on_every_backend(vec![("matmul_into_output", def, args.to_vec(), want)], 1e-3);

    // Across a parallel dim the read is refused at its line, as a scratch's is.
    let line = line_of("let sum = out.load();");
    let e = interpret(
        &wrongly_parallel_matmul_into_output(),
        &args,
        &InterpretOptions::default(),
    );
    let [p] = e.problems.as_slice() else {
        panic!("one problem expected: {e}")
    };
    assert_eq!(p.loc.map(|l| l.line), Some(line), "{e}");
    assert!(
        p.message.contains("reads output block state")
            && p.message.contains("parallel dim 2 is 0 there, 1 here"),
        "{e}"
    );
}
