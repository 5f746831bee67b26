//! How often each top-level `when` of a kernel runs (`KernelSchedule::of_kernel`), evaluated
//! per grid step from program ids and the scalar-prefetch tables the caller knows, checked
//! against counts made here from the same table.

use tessera_dsl::mosaic::{ArgValues, KernelSchedule};
use tessera_dsl::prelude::*;
use tessera_dsl::{ArgSpec, HostArray, KernelRules};

/// Per head `h` and key block `j`: initialise at `j == 0`, accumulate where `kinds[h, j] == 2`,
/// also where `kinds[h, j] == 1`, finalize at the last `j`.
#[tpu_kernel(grid = (H, N), dimension_semantics = (parallel, arbitrary))]
fn accumulate(
    #[shape(H, N)] kinds: Smem<i32>,
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h, j| (h, 0, 0))]
    x: Ref<f32>,
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h, j| (h, 0, 0))]
    out: RefMut<f32>,
    #[scratch(8, 128)] acc: Scratch<f32>,
) {
    let (h, j) = (program_id(0), program_id(1));
    when(j.eq(0), || acc.store(0.0));
    let kind = kinds.get([h, j]);
    when(kind.eq(2), || acc.store(acc.load() + x.load()));
    when(kind.eq(1), || acc.store(acc.load() + x.load() * 0.5));
    when(j.eq(num_programs(1) - 1), || out.store(acc.load()));
}

const HEADS: usize = 3;
const BLOCKS: usize = 4;

fn kernel() -> std::sync::Arc<tessera_dsl::Kernel> {
    let specs = [
        ArgSpec::new(DType::I32, [HEADS, BLOCKS]),
        ArgSpec::new(DType::F32, [HEADS, 8, 128]),
    ];
    accumulate()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap()
}

/// Kind 1 exactly at `j == 0` (so it coincides with the first steps), kind 2 at the key
/// blocks `1 ..= h` of head `h`.
fn kinds(extra: usize) -> (Vec<i32>, HostArray) {
    let mut k = vec![0; HEADS * BLOCKS];
    for h in 0..HEADS {
        k[h * BLOCKS] = 1;
        for j in 1..=(h + extra).min(BLOCKS - 1) {
            k[h * BLOCKS + j] = 2;
        }
    }
    (k.clone(), HostArray::i32([HEADS, BLOCKS], k).unwrap())
}

fn count(table: &[i32], kind: i32) -> Vec<u64> {
    (0..HEADS)
        .map(|h| {
            table[h * BLOCKS..(h + 1) * BLOCKS]
                .iter()
                .filter(|&&k| k == kind)
                .count() as u64
        })
        .collect()
}

#[test]
fn whens_are_counted_per_parallel_index_from_the_tables() {
    let k = kernel();
    let (table, array) = kinds(0);
    let s = KernelSchedule::of_kernel(&k, &[ArgValues::Same(&array), ArgValues::Unknown]);
    assert_eq!(s.grid, vec![HEADS, BLOCKS]);
    assert_eq!(s.dimension_semantics, vec!["parallel", "arbitrary"]);
    let paths: Vec<&str> = s.paths.iter().map(|p| p.path.as_str()).collect();
    // The table's `kind == 1` holds exactly at the first steps, but it reads a table: it is
    // named by its line, not `init`.
    assert_eq!(paths[0], "init");
    assert_eq!(paths[3], "finalize");
    assert!(paths[1].starts_with("schedule.rs:") && paths[2].starts_with("schedule.rs:"));
    assert_ne!(paths[1], paths[2]);
    assert_eq!(s.paths[0].runs, vec![1; HEADS]);
    assert_eq!(s.paths[1].runs, count(&table, 2));
    assert_eq!(s.paths[2].runs, count(&table, 1));
    assert_eq!(s.paths[3].runs, vec![1; HEADS]);
    assert!(s.paths.iter().all(|p| p.exact));
    assert_eq!(KernelSchedule::from_json(&s.to_json()).unwrap(), s);
}

#[test]
fn unknown_tables_count_every_step_and_shards_keep_the_busiest() {
    let k = kernel();
    let s = KernelSchedule::of_kernel(&k, &[]);
    assert!(s.paths[0].exact && s.paths[3].exact);
    assert!(!s.paths[1].exact && !s.paths[2].exact);
    assert_eq!(s.paths[1].runs, vec![BLOCKS as u64; HEADS]);
    let (light, a) = kinds(0);
    let (heavy, b) = kinds(2);
    let shards = [a, b];
    let s = KernelSchedule::of_kernel(&k, &[ArgValues::PerShard(&shards), ArgValues::Unknown]);
    assert_ne!(count(&light, 2), count(&heavy, 2));
    assert_eq!(s.paths[1].runs, count(&heavy, 2));
}

/// Per head `h`: `trips[h]` accumulations of `x` in a loop (libtpu guards a loop whose trip
/// count is a run-time value with a branch that skips it), a check that only prints, and a
/// loop of constant trips (no branch).
#[tpu_kernel(grid = H, dimension_semantics = (parallel,))]
fn looped(
    #[shape(H)] trips: Smem<i32>,
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h| (h, 0, 0))]
    x: Ref<f32>,
    #[shape(H, 8, 128)]
    #[block((None, 8, 128), |h| (h, 0, 0))]
    out: RefMut<f32>,
) {
    let h = program_id(0);
    let n = trips.get([h]);
    when(n.lt(0), || debug_print!("head {} has {} trips", h, n));
    let sum = fori_loop(0, n, zeros(DType::F32, &[8, 128]), |_, acc| acc + x.load());
    let doubled = fori_loop(0, 2, sum, |_, acc| acc + acc);
    out.store(doubled);
}

#[test]
fn a_loop_of_run_time_trips_is_a_path_and_a_check_that_only_prints_is_not() {
    let specs = [
        ArgSpec::new(DType::I32, [HEADS]),
        ArgSpec::new(DType::F32, [HEADS, 8, 128]),
    ];
    let k = looped().instantiate(&specs, &KernelRules::tpu()).unwrap();
    let trips = HostArray::i32([HEADS], vec![0, 3, 1]).unwrap();
    let s = KernelSchedule::of_kernel(&k, &[ArgValues::Same(&trips), ArgValues::Unknown]);
    let line = include_str!("schedule.rs")
        .lines()
        .position(|l| l.contains("let sum = fori_loop(0, n,"))
        .unwrap();
    let paths: Vec<&str> = s.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, vec![format!("schedule.rs:{}", line + 1)]);
    assert_eq!(s.paths[0].runs, vec![0, 1, 1]);
    assert!(s.paths[0].exact);
}
