//! Hardware rules checked when a kernel is instantiated for a target.
//!
//! The TPU rules are what Mosaic enforces; the interpreter checks them too by default, so a
//! kernel that passes its tests here does not fail to compile for TPU. Portable targets
//! (StableHLO on CPU/GPU) may relax them.
//!
//! What the rules share with the Mosaic emitter of how Mosaic lays a kernel out
//! ([`tpu_tile`], [`vmem_bytes`], the semaphores remote copies send on) lives below both, in
//! `tpu_facts.rs`; the first two are re-exported here.

use crate::error::{Problem, ProblemKind};
use crate::ir::{BlockDim, Kernel, RefId};
use crate::tpu_facts::{semaphore_items, vmem_items, SEMAPHORE_MEMORY_BYTES};

mod mosaic_copies;
mod mosaic_ops;

pub use crate::tpu_facts::{tpu_tile, vmem_bytes, ALIASED_READ_DISTANCE};
pub use mosaic_ops::check as check_mosaic_ops;

/// Default scoped VMEM budget: v5e's 16 MiB default scoped limit.
pub const DEFAULT_VMEM_LIMIT_BYTES: usize = 16 << 20;

/// What a target requires of a kernel's blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelRules {
    pub name: &'static str,
    /// Enforce TPU (sublane, lane) tiling of the last two block dims.
    pub tpu_tiling: bool,
    /// Maximum bytes of VMEM for double-buffered blocks plus scratch, if limited.
    pub vmem_limit_bytes: Option<usize>,
    /// Check what Mosaic accepts inside a kernel body (see [`check_mosaic_ops`]).
    pub mosaic_ops: bool,
    /// The chip has two TensorCores that share one kernel's grid (megacore: v4, v5p): the
    /// leading `parallel` grid dims are split between them, each core with its own scratch
    /// and output buffers. The interpreter then runs the two halves as two cores.
    pub megacore: bool,
    /// Guard every run-time index the kernel cannot be proven to keep in range, and check
    /// the i32 arithmetic that feeds one for overflow (`crate::checks`; on by default).
    /// Off only to measure what the checks cost
    /// ([`KernelRules::without_run_time_checks`]): an unchecked kernel trusts its tables.
    pub run_time_checks: bool,
}

impl Default for KernelRules {
    fn default() -> Self {
        KernelRules::tpu()
    }
}

impl KernelRules {
    /// The rules Mosaic enforces on TPU, with v5e's default scoped VMEM budget: block
    /// tiling, the VMEM budget, and what Mosaic accepts inside a kernel body.
    pub fn tpu() -> Self {
        KernelRules {
            name: "tpu",
            tpu_tiling: true,
            vmem_limit_bytes: Some(DEFAULT_VMEM_LIMIT_BYTES),
            mosaic_ops: true,
            megacore: false,
            run_time_checks: true,
        }
    }

    /// The TPU rules of a chip whose two TensorCores split the parallel grid dims of a
    /// kernel (v4, v5p; see [`KernelRules::megacore`]).
    pub fn tpu_megacore() -> Self {
        KernelRules {
            name: "tpu-megacore",
            megacore: true,
            ..KernelRules::tpu()
        }
    }

    /// No tiling or VMEM rules: for StableHLO backends that have no such constraints.
    pub fn portable() -> Self {
        KernelRules {
            name: "portable",
            tpu_tiling: false,
            vmem_limit_bytes: None,
            mosaic_ops: false,
            megacore: false,
            run_time_checks: true,
        }
    }

    /// The same rules with another VMEM budget (`--xla_tpu_scoped_vmem_limit_kib`).
    pub fn with_vmem_limit(mut self, bytes: usize) -> Self {
        self.vmem_limit_bytes = Some(bytes);
        self
    }

    /// The same rules with no run-time index or overflow checks: an index the prover cannot
    /// bound is used as it comes, as in Pallas. For measuring what the checks cost beside
    /// the checked kernel (`tessera bench kernels --unchecked-too`); a kernel instantiated so
    /// trusts its page tables and lengths. An author's `debug_check` stays as Pallas'
    /// `debug_check` does: the interpreter and mosaic-eval refuse, the Mosaic kernel
    /// asserts (`cf.assert`), the StableHLO path leaves it out.
    pub fn without_run_time_checks(mut self) -> Self {
        self.run_time_checks = false;
        self
    }
}

/// Checks block tiling, exact coverage, the VMEM budget and (for TPU) the ops of the body
/// and the semaphore memory; returns every problem found.
pub fn check(k: &Kernel, rules: &KernelRules) -> Vec<Problem> {
    let mut problems = Vec::new();
    if rules.mosaic_ops {
        problems.extend(mosaic_ops::check(k));
    }
    for (i, o) in k.operands.iter().enumerate() {
        let r = RefId(i as u32);
        let Some(b) = &o.block else { continue };
        let what = k.describe(r);
        let rank = o.array_shape.len();
        for (d, (&bd, &n)) in b.block_shape.iter().zip(&o.array_shape).enumerate() {
            let size = bd.size();
            if size == 0 || n % size != 0 {
                problems.push(Problem {
                    kind: ProblemKind::Coverage,
                    subject: what.clone(),
                    message: format!(
                        "block dim {d} ({size}) does not divide the array dim ({n}) of shape {:?}; \
                         choose a block size that divides {n}",
                        o.array_shape
                    ),
                    loc: Some(o.loc),
                });
            }
        }
        if rules.tpu_tiling && rank >= 1 {
            let (sub, lane) = tpu_tile(o.dtype);
            let checks: Vec<(usize, usize, &str)> = if rank == 1 {
                vec![(0, lane, "lane")]
            } else {
                vec![(rank - 2, sub, "sublane"), (rank - 1, lane, "lane")]
            };
            for (d, mult, kind) in checks {
                let (bd, n) = (b.block_shape[d], o.array_shape[d]);
                let size = bd.size();
                let ok = size == n || (bd != BlockDim::Squeezed && size % mult == 0);
                if !ok {
                    problems.push(Problem {
                        kind: ProblemKind::Tiling,
                        subject: what.clone(),
                        message: format!(
                            "block dim {d} is {size} but on TPU the {kind} dim of a {} block must be \
                             a multiple of {mult} or equal the array dim ({n}); use a block of {} \
                             or {n} (or KernelRules::portable() for non-TPU backends)",
                            o.dtype,
                            round_up(size.max(1), mult)
                        ),
                        loc: Some(o.loc),
                    });
                }
            }
        }
    }
    if rules.mosaic_ops {
        let items = semaphore_items(k);
        let total: usize = items.iter().map(|(_, b)| b).sum();
        if total > SEMAPHORE_MEMORY_BYTES {
            let top = largest(items, |b| format!("{} ({b} B)", b / 4));
            problems.push(Problem {
                kind: ProblemKind::SemaphoreMemory,
                subject: "semaphores".into(),
                message: format!(
                    "{} semaphores need {total} B of semaphore memory but a TPU kernel has {} \
                     B (4 B each; libtpu's memory space `sflag`); largest: {top}; use fewer, \
                     e.g. one DMA semaphore for copies that are waited together (it counts \
                     bytes)",
                    total / 4,
                    SEMAPHORE_MEMORY_BYTES,
                ),
                loc: Some(k.loc),
            });
        }
    }
    if let Some(limit) = rules.vmem_limit_bytes {
        let items = vmem_items(k);
        let total: usize = items.iter().map(|(_, b)| b).sum();
        if total > limit {
            let top = largest(items, human_bytes);
            problems.push(Problem {
                kind: ProblemKind::Vmem,
                subject: "vmem".into(),
                message: format!(
                    "blocks and scratch need {} of VMEM (blocks double-buffered unless single-buffered) but the \
                     target allows {}; largest: {top}; use smaller blocks or raise the limit \
                     (KernelRules::with_vmem_limit)",
                    human_bytes(total),
                    human_bytes(limit),
                ),
                loc: Some(k.loc),
            });
        }
    }
    problems
}

/// The three largest of `(operand, bytes)` items, each as `operand` and `size(bytes)`,
/// for a budget's message.
fn largest(mut items: Vec<(String, usize)>, size: impl Fn(usize) -> String) -> String {
    items.sort_by_key(|item| std::cmp::Reverse(item.1));
    let top: Vec<String> = items
        .iter()
        .take(3)
        .map(|(n, b)| format!("{n} {}", size(*b)))
        .collect();
    top.join(", ")
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// Bytes as KiB/MiB for messages.
pub fn human_bytes(b: usize) -> String {
    if b >= 1 << 20 && b % (1 << 10) == 0 {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}
