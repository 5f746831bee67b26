//! A Mosaic kernel's cost as libtpu compiled it, read from libtpu's own scheduled bundles
//! (compile-only, no TPU): cycles per TensorCore, the work summed over cores, the MXU bound
//! and the scoped VMEM used.
//!
//! A TensorCore issues one VLIW bundle per cycle when nothing stalls, so the bundles a grid
//! step executes are that step's cycles. The grid is one loop; each top-level `when` is a
//! branch region inside it ([`KernelBundles`]); how often each region runs is the kernel's
//! [`KernelSchedule`] (tessera attaches it to every Mosaic call; for a peer's kernel it is
//! given). Per core:
//!
//! ```text
//! cycles = outside the loop + loop iterations x step + sum over whens of runs x region
//! ```
//!
//! where the loop iterations are the core's grid steps plus the pipeline's extra iterations
//! (the loop's trip count minus the busiest core's steps: 2 in every kernel measured), `step`
//! is the loop body without the `when` regions, and a region's bundles include the loops
//! inside it times their trip counts. Chips with two TensorCores (v4, v5p) split the leading
//! `parallel` grid dims between them ([`KernelSchedule::core_ranges`]); other kernels run on
//! one core. What this leaves out: waits for DMAs (a kernel with little compute per block is
//! bound by them, and this undercounts it), stalls on MXU results, and a region's internal
//! branches (counted as taken).

use std::path::Path;

use tessera_dsl::mosaic::KernelSchedule;
use tessera_runtime::DumpFile;

use super::bundles::{group_kernel_files, is_kernel_file};
pub use super::bundles::{DumpError, KernelBundles, Segment};

/// TensorCores per chip that a kernel's parallel grid dims are split over: v4 and v5p
/// (megacore) have 2, v5e and v6e 1.
pub fn tensorcores_per_chip(topology: &str) -> usize {
    match topology.split([':', '=', '_']).next().unwrap_or("") {
        "v4" | "v5p" => 2,
        _ => 1,
    }
}

/// One executed path of a grid step and what it costs on the busiest core.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PathCost {
    /// `outside loop`, `step` (the loop body without the `when`s), or the `when`'s name.
    pub path: String,
    /// Bundles of one run.
    pub bundles: u64,
    /// MXU slots of one run.
    pub mxu_slots: u64,
    /// Runs on the busiest core.
    pub runs: u64,
}

/// A kernel's cost read from its bundles.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelCost {
    /// The kernel's name.
    pub kernel: String,
    /// The HLO instruction libtpu compiled it as.
    pub instruction: String,
    /// The grid and its dimension semantics (empty when no schedule was known).
    pub grid: Vec<usize>,
    pub dimension_semantics: Vec<String>,
    /// TensorCores the grid runs on.
    pub cores: usize,
    /// Grid steps on the busiest core.
    pub steps_per_core: u64,
    /// Iterations of the grid loop from its exit test (steps plus the pipeline's), when
    /// constant.
    pub loop_trips: Option<u64>,
    /// The paths, `outside loop` and `step` first, then the `when`s in program order.
    pub paths: Vec<PathCost>,
    /// Cycles on the busiest core.
    pub cycles_per_core: u64,
    /// Cycles summed over the cores the kernel runs on.
    pub cycles_all_cores: u64,
    /// The busiest core's MXU slot uses over the MXU's slots per bundle: the fewest cycles
    /// the MXU work fits in.
    pub mxu_bound_per_core: u64,
    /// Fraction of the busiest core's MXU slots used, 0..1.
    pub mxu_utilisation: f64,
    /// Scoped VMEM the compiler gave the kernel, when known.
    pub scoped_vmem_bytes: Option<i64>,
    /// Every path's runs evaluated and matched to a branch region.
    pub exact: bool,
    /// Why the figures are an upper bound, when they are.
    pub caveat: Option<String>,
}

impl KernelCost {
    /// The cost of a kernel read from its bundles and their schedule, on a chip with
    /// `chip_cores` TensorCores.
    pub fn new(b: &KernelBundles, chip_cores: usize) -> Self {
        let mut caveats = Vec::new();
        let Some(s) = b.schedule.as_ref() else {
            caveats.push(
                "no schedule of the kernel's `when`s: every region counted at every loop \
                 iteration"
                    .to_string(),
            );
            let trips = b.loop_trips.unwrap_or(1);
            let cycles = b.outside_loop.bundles + trips * b.step.bundles;
            let slots = b.outside_loop.mxu_slots + trips * b.step.mxu_slots;
            return KernelCost {
                kernel: b.kernel.clone(),
                instruction: b.instruction.clone(),
                grid: Vec::new(),
                dimension_semantics: Vec::new(),
                cores: 1,
                steps_per_core: trips,
                loop_trips: b.loop_trips,
                paths: vec![
                    path("outside loop", b.outside_loop, 1),
                    path("step", b.step, trips),
                ],
                cycles_per_core: cycles,
                cycles_all_cores: cycles,
                mxu_bound_per_core: slots.div_ceil(b.mxu_capacity.max(1)),
                mxu_utilisation: utilisation(slots, b.mxu_capacity, cycles),
                scoped_vmem_bytes: None,
                exact: false,
                caveat: Some(caveats.join("; ")),
            };
        };
        let ranges = s.core_ranges(chip_cores);
        let per_index = s.steps_per_parallel_index();
        let steps: Vec<u64> = ranges.iter().map(|r| r.len() as u64 * per_index).collect();
        let busiest_steps = steps.iter().copied().max().unwrap_or(0);
        let extra = match b.loop_trips {
            Some(t) if t >= busiest_steps => t - busiest_steps,
            Some(t) => {
                caveats.push(format!(
                    "the grid loop runs {t} iterations where the schedule gives {busiest_steps} \
                     steps on the busiest core"
                ));
                0
            }
            None => {
                caveats.push("the grid loop's trip count is not a constant".into());
                0
            }
        };
        let whens = match &b.whens {
            Some(w) if w.len() == s.paths.len() => Some(w),
            _ => {
                if !s.paths.is_empty() {
                    caveats.push(format!(
                        "the bundles show {} branch regions in the grid loop where the kernel has \
                         {} top-level `when`s: every region counted at every step",
                        b.regions_found,
                        s.paths.len()
                    ));
                }
                None
            }
        };
        for p in s.paths.iter().filter(|p| !p.exact) {
            caveats.push(format!(
                "`{}` counted at every step where its condition could not be evaluated",
                p.path
            ));
        }
        // Cycles and MXU slots of each core, and each path's runs there.
        let per_core: Vec<(u64, u64, Vec<u64>)> = ranges
            .iter()
            .zip(&steps)
            .filter(|(r, _)| !r.is_empty())
            .map(|(r, &n)| {
                let iterations = n + extra;
                let mut cycles = b.outside_loop.bundles + iterations * b.step.bundles;
                let mut slots = b.outside_loop.mxu_slots + iterations * b.step.mxu_slots;
                let mut runs = vec![1, iterations];
                if let Some(w) = whens {
                    for (p, seg) in s.paths.iter().zip(w) {
                        let n: u64 = p.runs[r.clone()].iter().sum();
                        cycles += n * seg.bundles;
                        slots += n * seg.mxu_slots;
                        runs.push(n);
                    }
                }
                (cycles, slots, runs)
            })
            .collect();
        let (cycles, slots, runs) = per_core
            .iter()
            .max_by_key(|(c, _, _)| *c)
            .cloned()
            .unwrap_or_default();
        let mut paths = vec![
            path(
                "outside loop",
                b.outside_loop,
                runs.first().copied().unwrap_or(0),
            ),
            path("step", b.step, runs.get(1).copied().unwrap_or(0)),
        ];
        if let Some(w) = whens {
            for (i, (p, seg)) in s.paths.iter().zip(w).enumerate() {
                paths.push(path(&p.path, *seg, runs[2 + i]));
            }
        }
        KernelCost {
            kernel: b.kernel.clone(),
            instruction: b.instruction.clone(),
            grid: s.grid.clone(),
            dimension_semantics: s.dimension_semantics.clone(),
            cores: per_core.len(),
            steps_per_core: busiest_steps,
            loop_trips: b.loop_trips,
            paths,
            cycles_per_core: cycles,
            cycles_all_cores: per_core.iter().map(|(c, _, _)| c).sum(),
            mxu_bound_per_core: slots.div_ceil(b.mxu_capacity.max(1)),
            mxu_utilisation: utilisation(slots, b.mxu_capacity, cycles),
            scoped_vmem_bytes: None,
            exact: caveats.is_empty(),
            caveat: (!caveats.is_empty()).then(|| caveats.join("; ")),
        }
    }

    /// A short table: the paths with their bundles and runs, then the totals.
    pub fn table(&self) -> String {
        let grid: Vec<String> = self.grid.iter().map(|g| g.to_string()).collect();
        let mut t = format!(
            "{} ({}): grid {} ({}), {} TensorCore{}, {} steps on the busiest{}\n",
            self.kernel,
            self.instruction,
            if grid.is_empty() {
                "?".into()
            } else {
                grid.join("x")
            },
            self.dimension_semantics.join(", "),
            self.cores,
            if self.cores == 1 { "" } else { "s" },
            self.steps_per_core,
            self.loop_trips
                .map_or(String::new(), |n| format!(" (loop runs {n})")),
        );
        t.push_str(&format!(
            "  {:<24} {:>9} {:>9} {:>13} {:>9}\n",
            "path", "bundles", "runs", "cycles", "MXU slots"
        ));
        for p in &self.paths {
            t.push_str(&format!(
                "  {:<24} {:>9} {:>9} {:>13} {:>9}\n",
                p.path,
                p.bundles,
                p.runs,
                p.bundles * p.runs,
                p.mxu_slots
            ));
        }
        t.push_str(&format!(
            "  cycles per core {} (all cores {})",
            self.cycles_per_core, self.cycles_all_cores
        ));
        if self.mxu_bound_per_core > 0 {
            t.push_str(&format!(
                "; MXU bound {} ({:.2}x), MXU slots {:.0}% used",
                self.mxu_bound_per_core,
                self.cycles_per_core as f64 / self.mxu_bound_per_core as f64,
                100.0 * self.mxu_utilisation
            ));
        } else {
            t.push_str("; no MXU work");
        }
        if let Some(b) = self.scoped_vmem_bytes {
            t.push_str(&format!(
                "; scoped VMEM {:.2} MiB",
                b as f64 / (1u64 << 20) as f64
            ));
        }
        if let Some(c) = &self.caveat {
            t.push_str(&format!("\n  upper bound: {c}"));
        }
        t
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a kernel cost is plain data")
    }
}

fn path(name: &str, s: Segment, runs: u64) -> PathCost {
    PathCost {
        path: name.to_string(),
        bundles: s.bundles,
        mxu_slots: s.mxu_slots,
        runs,
    }
}

fn utilisation(slots: u64, capacity: u64, cycles: u64) -> f64 {
    if cycles == 0 {
        0.0
    } else {
        slots as f64 / (capacity.max(1) * cycles) as f64
    }
}

/// Whether libtpu's dump file `name` is one the cost reading uses.
pub fn is_cost_file(name: &str) -> bool {
    is_kernel_file(name)
}

/// The costs of the Mosaic kernels among libtpu's dump files of one compile, each with the
/// schedule tessera attached (or the one in `schedules` of its kernel name, for a peer's
/// kernel), on a chip with `chip_cores` TensorCores.
pub fn kernel_costs(
    files: Vec<(String, String)>,
    schedules: &[KernelSchedule],
    chip_cores: usize,
) -> Result<Vec<KernelCost>, DumpError> {
    let mut costs = Vec::new();
    for (_, f) in group_kernel_files(files) {
        costs.push(KernelCost::new(
            &KernelBundles::read(&f, schedules)?,
            chip_cores,
        ));
    }
    Ok(costs)
}

/// [`kernel_costs`] of the files a compile returned.
pub fn costs_of_dumps(files: &[DumpFile], chip_cores: usize) -> Result<Vec<KernelCost>, DumpError> {
    kernel_costs(
        files
            .iter()
            .map(|f| (f.name.clone(), f.text.clone()))
            .collect(),
        &[],
        chip_cores,
    )
}

/// The costs of the Mosaic kernels libtpu dumped into `dir` (`--xla_jf_dump_to`; files
/// directly in it), with their scoped VMEM from XLA's `*after_codegen.txt` dumps anywhere
/// under `dir` (`XLA_FLAGS=--xla_dump_to=DIR/... --xla_dump_hlo_as_text`) when present.
pub fn read_dump_dir(
    dir: &Path,
    schedules: &[KernelSchedule],
    chip_cores: usize,
) -> Result<Vec<KernelCost>, DumpError> {
    let io = |cause| DumpError::Io {
        dir: dir.to_path_buf(),
        cause,
    };
    let mut files = Vec::new();
    let mut vmem = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).map_err(io)? {
            let entry = entry.map_err(io)?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                pending.push(path);
            } else if d == dir && is_kernel_file(&name) {
                files.push((name, std::fs::read_to_string(&path).map_err(io)?));
            } else if name.ends_with("after_codegen.txt") {
                vmem.extend(scoped_vmem_by_instruction(
                    &std::fs::read_to_string(&path).map_err(io)?,
                ));
            }
        }
    }
    files.sort();
    let mut costs = kernel_costs(files, schedules, chip_cores)?;
    for c in &mut costs {
        c.scoped_vmem_bytes = vmem
            .iter()
            .filter(|(i, _)| *i == c.instruction)
            .map(|(_, b)| *b)
            .max();
    }
    Ok(costs)
}

/// The scoped VMEM (memory space 1) of each instruction of an HLO text dump that says how
/// much it used (`used_scoped_memory_configs` in its backend config).
pub fn scoped_vmem_by_instruction(hlo: &str) -> Vec<(String, i64)> {
    const USED: &str = "\"used_scoped_memory_configs\":[";
    let mut found = Vec::new();
    for (at, _) in hlo.match_indices(USED) {
        let list = &hlo[at + USED.len()..];
        let list = &list[..list.find(']').unwrap_or(list.len())];
        let Some(bytes) = used_scoped_vmem(list) else {
            continue;
        };
        // The instruction is the last `%NAME = ` at the start of a line before the list.
        let before = &hlo[..at];
        let name = before.lines().rev().find_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("ROOT ").unwrap_or(line);
            let rest = line.strip_prefix('%')?;
            let end = rest.find(" = ")?;
            Some(rest[..end].to_string())
        });
        if let Some(name) = name {
            found.push((name, bytes));
        }
    }
    found
}

/// The largest VMEM (memory space 1) size in a `used_scoped_memory_configs` list's entries
/// (`{"memory_space":"1","offset":"0","size":"N"}, ...`).
pub fn used_scoped_vmem(list: &str) -> Option<i64> {
    list.split('}')
        .filter(|e| e.contains("\"memory_space\":\"1\""))
        .filter_map(|e| {
            e.split("\"size\":\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .and_then(|s| s.parse::<i64>().ok())
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_dsl::mosaic::PathRuns;

    fn bundles(whens: Option<Vec<Segment>>, schedule: Option<KernelSchedule>) -> KernelBundles {
        KernelBundles {
            instruction: "k.1".into(),
            kernel: "k".into(),
            schedule,
            total: 0,
            mxu_capacity: 4,
            outside_loop: Segment {
                bundles: 10,
                mxu_slots: 0,
            },
            step: Segment {
                bundles: 5,
                mxu_slots: 0,
            },
            regions_found: whens.as_ref().map_or(1, |w| w.len()),
            whens,
            loop_trips: Some(12),
        }
    }

    /// Grid (3 heads parallel, 4 key blocks): init and finalize once per head, compute at
    /// 2, 3 and 4 of the key blocks of the heads.
    fn schedule() -> KernelSchedule {
        KernelSchedule {
            kernel: "k".into(),
            grid: vec![3, 4],
            dimension_semantics: vec!["parallel".into(), "arbitrary".into()],
            paths: vec![
                PathRuns {
                    path: "init".into(),
                    runs: vec![1, 1, 1],
                    exact: true,
                },
                PathRuns {
                    path: "compute".into(),
                    runs: vec![2, 3, 4],
                    exact: true,
                },
            ],
        }
    }

    #[test]
    fn cycles_count_each_path_by_its_runs_on_the_busiest_core() {
        let mut b = bundles(
            Some(vec![
                Segment {
                    bundles: 7,
                    mxu_slots: 0,
                },
                Segment {
                    bundles: 100,
                    mxu_slots: 160,
                },
            ]),
            Some(schedule()),
        );
        // Two cores: heads 0-1 (8 steps) and head 2 (4 steps); the loop runs 12 = 8 + 4
        // pipeline iterations on the busiest core.
        let c = KernelCost::new(&b, 2);
        assert_eq!((c.cores, c.steps_per_core), (2, 8));
        let core0 = 10 + (8 + 4) * 5 + 2 * 7 + 5 * 100;
        let core1 = 10 + (4 + 4) * 5 + 7 + 4 * 100;
        assert_eq!(c.cycles_per_core, core0);
        assert_eq!(c.cycles_all_cores, core0 + core1);
        assert_eq!(c.mxu_bound_per_core, 5 * 160 / 4);
        assert!((c.mxu_utilisation - (5.0 * 160.0) / (4.0 * core0 as f64)).abs() < 1e-12);
        let runs: Vec<u64> = c.paths.iter().map(|p| p.runs).collect();
        assert_eq!(runs, vec![1, 12, 2, 5]);
        assert!(c.exact, "{:?}", c.caveat);
        // One core runs everything.
        b.loop_trips = Some(14);
        let c = KernelCost::new(&b, 1);
        assert_eq!(c.steps_per_core, 12);
        assert_eq!(c.cycles_per_core, 10 + 14 * 5 + 3 * 7 + 9 * 100);
        assert!(c.table().contains("cycles per core 1001"), "{}", c.table());
    }

    #[test]
    fn unmatched_regions_count_at_every_step() {
        let c = KernelCost::new(&bundles(None, Some(schedule())), 2);
        assert_eq!(c.cycles_per_core, 10 + 12 * 5);
        assert!(!c.exact);
        assert!(c.caveat.unwrap().contains("1 branch regions"));
        let c = KernelCost::new(&bundles(None, None), 2);
        assert_eq!(c.cycles_per_core, 10 + 12 * 5);
        assert!(c.caveat.unwrap().contains("no schedule"));
    }

    #[test]
    fn scoped_vmem_is_read_per_instruction() {
        let hlo = "ENTRY %main {\n  %iota.1 = s32[8] iota(), backend_config={\"used_scoped_memory_configs\":[{\"memory_space\":\"1\",\"offset\":\"0\",\"size\":\"1048576\"}]}\n  ROOT %k.1 = (f32[8]) custom-call(%a), frontend_attributes={x={\n\"y\"}}, backend_config={\"used_scoped_memory_configs\":[{\"memory_space\":\"0\",\"size\":\"9\"},{\"memory_space\":\"1\",\"offset\":\"0\",\"size\":\"3395584\"}]}\n}";
        assert_eq!(
            scoped_vmem_by_instruction(hlo),
            vec![("iota.1".into(), 1048576), ("k.1".into(), 3395584)]
        );
        assert_eq!(used_scoped_vmem(""), None);
    }

    #[test]
    fn megacore_chips() {
        assert_eq!(tensorcores_per_chip("v5p:2x2x1"), 2);
        assert_eq!(tensorcores_per_chip("v4:2x2x1"), 2);
        assert_eq!(tensorcores_per_chip("v5e:2x2"), 1);
        assert_eq!(tensorcores_per_chip("v6e:2x2"), 1);
    }
}
