//! `debug_print!` and `debug_check` inside kernels: the interpreter and mosaic-eval print the
//! same lines with the grid step and stop a failing check at the kernel's line; the CPU
//! plugin (StableHLO) runs the kernel with the prints left out and refuses a failing check
//! through the kernel's check flags; libtpu compiles the TPU's log op and `cf.assert`.

mod common;

use tessera::backend::{self, Backend};
use tessera::dsl::interpret::{self, DebugLog, InterpretOptions};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelRules};
use tessera::prelude::*;
use tessera_mosaic_eval::RunOptions;

/// `out = 2 x`, row block by row block, printing each step's block index, its length from
/// the table and (for block 0) the block itself; checks each length against the block.
#[tpu_kernel(grid = N)]
fn doubled_with_prints(
    #[shape(N)] lengths: Smem<i32>,
    #[shape(R, C)]
    #[block((8, C), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R, C)]
    #[block((8, C), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let i = program_id(0);
    let length = lengths.get([i]);
    debug_check(length.le(8), "a length is at most the block's 8 rows");
    debug_print!("block {} of {}: length {}", i, num_programs(0), length);
    let block = x.load();
    when(i.eq(0), || debug_print!("first block: {}", block));
    out.store(block * 2.0);
}

/// Lengths (one per row block), and `x` with small integers so that the printed tile reads
/// the same everywhere.
fn args(lengths: Vec<i32>) -> Vec<HostArray> {
    let n = lengths.len();
    let x: Vec<f32> = (0..n * 8 * 128).map(|i| (i % 7) as f32).collect();
    vec![
        HostArray::i32([n], lengths).unwrap(),
        HostArray::f32([n * 8, 128], x).unwrap(),
    ]
}

fn doubled(x: &HostArray) -> Vec<f64> {
    x.to_f64_vec().iter().map(|v| 2.0 * v).collect()
}

fn interpreted(args: &[HostArray]) -> (Result<Vec<HostArray>, String>, Vec<String>) {
    let log = DebugLog::new();
    let options = InterpretOptions {
        debug_log: Some(log.clone()),
        ..InterpretOptions::default()
    };
    let out = interpret::run(&doubled_with_prints(), args, &options).map_err(|e| e.to_string());
    (out, log.lines())
}

fn mosaic_evaluated(args: &[HostArray]) -> (Result<Vec<HostArray>, String>, Vec<String>) {
    let log = tessera_mosaic_eval::DebugLog::default();
    let options = RunOptions {
        debug_log: Some(log.clone()),
        // One core, so that the steps print in the interpreter's order.
        megacore: false,
        ..RunOptions::default()
    };
    let out = common::mosaic_eval(&doubled_with_prints(), args, &KernelRules::tpu(), &options)
        .map_err(|e| e.to_string());
    let lines = log.lock().unwrap().clone();
    (out, lines)
}

#[test]
fn the_interpreter_prints_scalars_and_tiles_with_the_grid_step() {
    let args = args(vec![8, 3, 5]);
    let (out, lines) = interpreted(&args);
    common::assert_close(
        &out.unwrap()[0].to_f64_vec(),
        &doubled(&args[1]),
        0.0,
        "out",
    );
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert_eq!(lines[0], "grid step [0]: block 0 of 3: length 8");
    assert_eq!(lines[2], "grid step [1]: block 1 of 3: length 3");
    assert_eq!(lines[3], "grid step [2]: block 2 of 3: length 5");
    // The tile, numpy's nesting: 8 rows of 128.
    let tile = lines[1]
        .strip_prefix("grid step [0]: first block: ")
        .unwrap_or_else(|| panic!("{}", lines[1]));
    assert!(tile.starts_with("[[0, 1, 2, 3, 4, 5, 6, 0, 1,"), "{tile}");
    assert_eq!(tile.matches('[').count(), 9, "{tile}");
}

#[test]
fn mosaic_eval_prints_what_the_interpreter_prints() {
    let args = args(vec![8, 3, 5]);
    let (want_out, want) = interpreted(&args);
    let (out, lines) = mosaic_evaluated(&args);
    assert_eq!(out.unwrap(), want_out.unwrap());
    assert_eq!(lines, want);
}

#[test]
fn a_failing_check_stops_the_run_at_the_kernels_line_and_step() {
    let args = args(vec![8, 9, 5]);
    let (interpreted, lines) = interpreted(&args);
    // Step 0 printed; step 1 stopped before its print.
    assert_eq!(lines.len(), 2, "{lines:#?}");
    // The kernel's line of the check, as the errors name it.
    let line = 1 + include_str!("debug_print.rs")
        .lines()
        .position(|l| l.trim_start().starts_with("debug_check(length"))
        .unwrap();
    let at = format!("debug_print.rs:{line}:");
    for (backend, out) in [
        ("interpret", interpreted),
        ("mosaic-eval", mosaic_evaluated(&args).0),
    ] {
        let e = out.unwrap_err();
        assert!(e.contains(&at), "{backend}: {e}");
        assert!(
            e.contains("debug_check: failed: a length is at most the block's 8 rows"),
            "{backend}: {e}"
        );
        assert!(e.contains("at grid step [1]"), "{backend}: {e}");
    }
}

/// XLA has no print every PJRT backend runs: the StableHLO path leaves the prints out. The
/// check holds there too, through the kernel's check flags: the passing lengths run to the
/// right result, the failing ones are refused with the kernel line and the grid step.
#[test]
fn the_stablehlo_path_leaves_prints_out_and_keeps_the_checks() {
    let run = |lengths| {
        let args = args(lengths);
        let out = backend::run(
            &doubled_with_prints(),
            &args,
            Backend::CPU,
            &KernelRules::tpu(),
        );
        (args, out)
    };
    let (args, out) = run(vec![8, 3, 5]);
    let out = out.unwrap_or_else(|e| panic!("{e}"));
    common::assert_close(&out[0].to_f64_vec(), &doubled(&args[1]), 0.0, "cpu");
    let line = 1 + include_str!("debug_print.rs")
        .lines()
        .position(|l| l.trim_start().starts_with("debug_check(length"))
        .unwrap();
    let e = run(vec![8, 9, 5]).1.unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "kernel `doubled_with_prints`: tests/debug_print.rs:{line}:5: run-time check: \
             debug_check failed at grid step [1]: a length is at most the block's 8 rows (the \
             value it compares: 9); the outputs were discarded"
        )
    );
}

#[test]
fn mosaic_refuses_a_float_scalar_in_a_formatted_print() {
    #[tpu_kernel(grid = 1)]
    fn prints_a_float(
        #[shape(8, 128)]
        #[block((8, 128), |i| (i, 0))]
        x: Ref<f32>,
        #[shape(8, 128)]
        #[block((8, 128), |i| (i, 0))]
        out: RefMut<f32>,
    ) {
        let total = x.load().sum(1).sum(0);
        debug_print!("total {}", total);
        out.store(x.load());
    }
    let args = vec![HostArray::random(DType::F32, [8, 128], 1)];
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    let e = prints_a_float()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the TPU's log formats i32 scalars only, not a f32 scalar"),
        "{e}"
    );
    // The interpreter, under portable rules, prints it.
    let log = DebugLog::new();
    let options = InterpretOptions {
        debug_log: Some(log.clone()),
        rules: KernelRules::portable(),
        ..InterpretOptions::default()
    };
    interpret::run(&prints_a_float(), &args, &options).unwrap();
    let want: f64 = args[0].to_f64_vec().iter().sum();
    let line = &log.lines()[0];
    let got: f64 = line
        .strip_prefix("grid step [0]: total ")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((got - want).abs() < 1e-3, "{line} vs {want}");
}

#[test]
fn libtpu_compiles_the_log_op_and_the_assertion() {
    let args = args(vec![8, 3, 5]);
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    let k = doubled_with_prints()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap();
    let text = tessera::dsl::mosaic::lower(&k).unwrap().text;
    for op in ["\"tpu.log\"", "\"tpu.log_buffer\"", "cf.assert"] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
    let want = doubled(&args[1]);
    common::cases_compile_for(
        "tpu:v5p:2x2x1",
        vec![("doubled_with_prints", doubled_with_prints(), args, want)],
    );
}
