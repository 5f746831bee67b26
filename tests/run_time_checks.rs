//! Indices computed from run-time data are proven in range at instantiation or checked when
//! the kernel runs, on every backend. `gather_tiles` slices its HBM operand with a tile list
//! from SMEM: a tile outside `x` and a tile number whose row offset overflows i32 are refused
//! by the interpreter, the CPU plugin (through `backend::run`, `tessera run`), and mosaic-eval
//! running the Mosaic text, each with the kernel line, the value, its bound and the grid
//! step, and no output. Paged attention, run past every host check of its tables, is refused
//! the same way on the CPU plugin. (tests/memory_tpu_compile.rs compiles the guarded kernels
//! with libtpu for v5p; python/tests/test_kernels.py calls them from JAX.)

mod common;

use std::process::Command;

use common::{assert_one_line_error, assert_refused, with_i32, Dir};
use tessera::backend::{self, Backend};
use tessera::collective_kernels::memory::{gather_tiles, TILE_ROWS};
use tessera::dsl::checks::CheckKind;
use tessera::dsl::{ArgSpec, HostArray, KernelDef, KernelRules};
use tessera::registry;
use tessera_mosaic_eval::RunOptions;

/// `x`: 16 tiles of 8 rows, 256 columns.
fn x() -> HostArray {
    let v: Vec<f32> = (0..16 * TILE_ROWS * 256)
        .map(|i| (i % 97) as f32 * 0.5)
        .collect();
    HostArray::f32([16 * TILE_ROWS, 256], v).unwrap()
}

/// The line of memory.rs (gather_tiles' source) that starts with `start`, as a location names
/// it (`memory.rs:LINE:`).
fn memory_line(start: &str) -> String {
    let source = include_str!("../kernels/collective/src/memory.rs");
    let at = source
        .lines()
        .position(|l| l.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no `{start}` in memory.rs"));
    format!("kernels/collective/src/memory.rs:{}:", at + 1)
}

/// The errors of `def` on `args` from every backend that runs here and from mosaic-eval
/// (each run must fail), with the backend's name.
fn refusals(def: &KernelDef, args: &[HostArray]) -> Vec<(&'static str, String)> {
    let rules = KernelRules::tpu();
    let mut errors: Vec<(&'static str, String)> = Backend::everywhere()
        .map(|b| {
            let e = backend::run(def, args, b, &rules).map(drop).unwrap_err();
            (b.name(), e.to_string())
        })
        .collect();
    let evaluated = common::mosaic_eval(def, args, &rules, &RunOptions::default())
        .map(drop)
        .unwrap_err();
    errors.push(("mosaic-eval", evaluated.to_string()));
    errors
}

/// Tile lists with one bad entry (tile 2: its copy is started by grid step 1, one step
/// ahead), each with what the error says: the kernel line and the check with its values.
fn bad_tiles() -> Vec<(Vec<i32>, String, String)> {
    let started = memory_line("when(next.lt(num_programs(0))");
    let window = |start: i64| {
        format!(
            "run-time check: the start of the copy's source `x`'s window along dim 0 is {start} \
             at grid step [1], outside 0 to 120; the access was not made and the outputs were \
             discarded"
        )
    };
    vec![
        (vec![9, 0, 16, 4], started.clone(), window(128)),
        (vec![9, 0, -1, 4], started, window(-8)),
        (
            vec![9, 0, 1 << 29, 4],
            memory_line("let tile = [ds(tiles.get([i]) * rows as i32"),
            "run-time check: 536870912 * 8 overflows i32 at grid step [1], and the result feeds \
             an index or a loop bound; the outputs were discarded"
                .into(),
        ),
    ]
}

#[test]
fn gather_tiles_checks_its_tile_windows_and_their_arithmetic() {
    let specs = [
        ArgSpec::of(&HostArray::i32([4], vec![0; 4]).unwrap()),
        ArgSpec::of(&x()),
    ];
    let k = gather_tiles()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap();
    // Each copy's source window (the start at `g == 0` and the one a step ahead; the waits
    // are clamped the same way, unreported) and each `tile * rows` that feeds one (the
    // waits' too) are checked; the tile list's own indices (`g`, `g + 1` under `g + 1 <
    // G`), the buffer's slots (`g % 2`), the semaphores and the flags' own row are proven.
    let kinds: Vec<String> = k.checks.sites.iter().map(|s| s.kind.to_string()).collect();
    let window = "the start of the copy's source `x`'s window along dim 0 in 0 to 120";
    assert_eq!(
        kinds,
        [
            "`*` within i32",
            window,
            "`*` within i32",
            window,
            "`*` within i32"
        ],
        "{k}"
    );
    assert!(matches!(
        k.checks.sites[1].kind,
        CheckKind::Index { max: 120, .. }
    ));
    assert_eq!(k.checks.proven, 10, "{k}");
    assert!(
        k.to_string()
            .contains("checks: 5 at run time, 10 indices proven in range, 0 marked unchecked"),
        "{k}"
    );
}

#[test]
fn rules_without_run_time_checks_leave_the_kernel_as_written() {
    let specs = [
        ArgSpec::of(&HostArray::i32([4], vec![0; 4]).unwrap()),
        ArgSpec::of(&x()),
    ];
    let rules = KernelRules::tpu().without_run_time_checks();
    let k = gather_tiles().instantiate(&specs, &rules).unwrap();
    assert!(k.checks.sites.is_empty() && k.checks.flags.is_none(), "{k}");
    let checked = gather_tiles()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap();
    // No flags (and their zeros), no semaphore, no check state: the operands the author
    // declared.
    assert_eq!(k.operands.len() + 4, checked.operands.len(), "{k}");
    // The kernel then trusts its tile list: tile 16 is clamped by the CPU plugin's dynamic
    // slice (a wrong answer, as in Pallas), not refused.
    let args = vec![HostArray::i32([4], vec![9, 0, 16, 4]).unwrap(), x()];
    assert!(backend::run(&gather_tiles(), &args, Backend::CPU, &rules).is_ok());
}

#[test]
fn gather_tiles_refuses_a_bad_tile_on_every_backend_and_in_mosaic_eval() {
    let x = x();
    for (tiles, line, message) in bad_tiles() {
        let args = vec![
            HostArray::i32([tiles.len()], tiles.clone()).unwrap(),
            x.clone(),
        ];
        for (what, e) in refusals(&gather_tiles(), &args) {
            assert!(
                e.contains("kernel `gather_tiles`: "),
                "{what} {tiles:?}: {e}"
            );
            assert!(e.contains(&line), "{what} {tiles:?}: want {line} in {e}");
            assert!(
                e.contains(&message),
                "{what} {tiles:?}: want `{message}` in {e}"
            );
        }
    }
}

#[test]
fn tessera_run_refuses_a_bad_tile_on_cpu_and_writes_nothing() {
    let d = Dir::new("run-time-checks");
    let x = d.save("x.npy", &x());
    for (i, (tiles, line, message)) in bad_tiles().into_iter().enumerate() {
        let t = d.save(
            &format!("tiles{i}.npy"),
            &HostArray::i32([tiles.len()], tiles).unwrap(),
        );
        for backend in ["interpret", "cpu"] {
            let out = d.path(&format!("out{i}-{backend}.npy"));
            let args: Vec<String> = [
                "run",
                "gather_tiles",
                "--backend",
                backend,
                "-i",
                &t,
                "-i",
                &x,
                "-o",
                &out,
            ]
            .map(String::from)
            .to_vec();
            let before = d.files();
            let result = Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(&args)
                .output()
                .unwrap();
            assert_one_line_error(&args, &result, &message);
            assert_refused(backend, &result, &line);
            assert_eq!(d.files(), before, "{backend}: files written");
        }
    }
}

/// Paged attention run past the host checks of its tables (`validate_tables`): the kernel
/// itself refuses a page outside the pool and a length past the table on the CPU plugin,
/// as the interpreter does (tests/paged_attention.rs).
#[test]
fn paged_attention_checks_its_tables_itself_on_cpu() {
    let instance = registry::find("paged_attention")
        .unwrap()
        .instance(&[])
        .unwrap();
    let args = instance.inputs(1).unwrap().remove(0);
    let source = include_str!("../kernels/paged/src/paged_attention.rs");
    let line_of = |start: &str| {
        let at = source
            .lines()
            .position(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no `{start}` in paged_attention.rs"));
        format!("paged_attention.rs:{}:", at + 1)
    };
    // Sequence 2 (64 tokens: entries 0 to 3, one block) starts its copies at step [2, 0].
    let mut cases = Vec::new();
    for page in [64, 100, -1, i32::MIN, i32::MAX] {
        cases.push((
            with_i32(&args, 4, 2 * 8 + 3, page),
            line_of("copy.start();"),
            format!(
                "the start of the copy's source `k_pages`'s window along dim 1 is {page} at \
                 grid step [2, 0], outside 0 to 63; the access was not made"
            ),
        ));
    }
    for length in [129, -1, i32::MIN, i32::MAX] {
        cases.push((
            with_i32(&args, 3, 1, length),
            line_of("debug_check(length_ok"),
            format!(
                "debug_check failed at grid step [1, 0]: lengths[b] is outside 0..=128 (8 \
                 pages of 16 tokens per sequence) (the value it compares: {length})"
            ),
        ));
    }
    for (bad, line, message) in cases {
        let e = backend::run(instance.def(), &bad, Backend::CPU, &KernelRules::tpu())
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&line), "want {line} in {e}");
        assert!(e.contains(&message), "want `{message}` in {e}");
    }
}

/// The cache update's block index map reads its slots (scalar prefetch): a slot outside the
/// cache is clamped inside the map, so the pipeline never writes past the cache, and checked
/// in the body, refused on every backend and in mosaic-eval with the operand's line, the
/// value and the grid step.
#[test]
fn cache_update_refuses_a_slot_outside_the_cache() {
    use tessera::paged::cache_update::cache_update;
    let cache = HostArray::f32([64, 128], (0..64 * 128).map(|i| i as f32).collect()).unwrap();
    let new = HostArray::f32([24, 128], vec![-1.0; 24 * 128]).unwrap();
    let source = include_str!("../kernels/paged/src/cache_update.rs");
    let line = source
        .lines()
        .position(|l| l.trim_start().starts_with("out: RefMut<T>"))
        .unwrap();
    let k = cache_update::<f32>()
        .instantiate(
            &[
                ArgSpec::of(&HostArray::i32([3], vec![0; 3]).unwrap()),
                ArgSpec::of(&cache),
                ArgSpec::of(&new),
            ],
            &KernelRules::tpu(),
        )
        .unwrap();
    let kinds: Vec<String> = k.checks.sites.iter().map(|s| s.kind.to_string()).collect();
    assert_eq!(
        kinds,
        ["the block index of `out` along dim 0 (its index map) in 0 to 7"],
        "{k}"
    );
    for slot in [8, 100, -1, i32::MIN] {
        let args = vec![
            HostArray::i32([3], vec![6, slot, 3]).unwrap(),
            cache.clone(),
            new.clone(),
        ];
        let want = format!(
            "run-time check: the block index of `out` along dim 0 (its index map) is {slot} at \
             grid step [1], outside 0 to 7"
        );
        for (what, e) in refusals(&cache_update::<f32>(), &args) {
            assert!(e.contains(&want), "{what} {slot}: want `{want}` in {e}");
            let at = format!("kernels/paged/src/cache_update.rs:{}:", line + 1);
            assert!(e.contains(&at), "{what} {slot}: want {at} in {e}");
        }
    }
}
