//! Which grid steps run each top-level branch of a kernel: what reading a compiled kernel's
//! bundles as cycles needs besides the bundles (see the facade's `tpu::cost`).
//!
//! A Mosaic kernel is one loop over its grid; each top-level `when` becomes a branch around a
//! region of that loop's body, and so does each top-level `fori_loop` whose trip count is a
//! run-time value (libtpu's guard that skips it when `lo >= hi`). A `when` whose body only
//! prints scalars is no region: its `tpu.log` compiles to no bundles (measured, libtpu
//! 0.0.50.1 on v5p: paged attention's table checks). How often a region runs is how often its
//! condition holds, which [`KernelSchedule::of_kernel`] finds by evaluating the kernel's
//! top-level scalar code at every grid step: program ids, constants, integer arithmetic,
//! comparisons and reads of scalar-prefetch tables whose values the caller knows (splash's
//! block tables). A condition that needs anything else (a value computed from vectors, a
//! table not given) counts as holding at every step, and its path says it is not exact. The
//! schedule is a passing run's: the run-time checks' state reads as zero, so the branch that
//! copies a failed check to the flags ([`CHECK_FAILED_PATH`]) runs at no step.
//!
//! The counts are kept per index of the leading `parallel` grid dims (flattened, row-major),
//! because a chip with two TensorCores (v4, v5p) splits exactly those between its cores:
//! measured with libtpu 0.0.42.1 on v5p, the loop of a kernel whose leading parallel dims hold
//! `P` indices runs `ceil(P / 2)` of them on the busier core (B=3, H=3 splash forward: 5 of
//! the 9 `(b, h)` pairs), and a kernel with no leading parallel dim runs on one core.

use serde::{Deserialize, Serialize};
use tessera_array::ArrayData;

use crate::ir::{
    BinaryOp, CmpOp, DType, DimSemantics, Kernel, Literal, Op, OperandRole, RefId, UnaryOp, ValueId,
};
use crate::HostArray;

/// What the lowering knows of one argument of a kernel call (aligned with the call's
/// arguments: scalar-prefetch tables and inputs in declaration order).
#[derive(Debug, Clone, Copy, Default)]
pub enum ArgValues<'a> {
    /// A computed array (or a table whose values are not given).
    #[default]
    Unknown,
    /// A host array, the same on every device.
    Same(&'a HostArray),
    /// One host array per shard of an SPMD program; each device passes its own.
    PerShard(&'a [HostArray]),
}

/// How often each top-level branch of a kernel runs (a `when`, or the guard of a loop of
/// run-time trips; see the module docs): its grid, which dims are parallel, and per branch (in
/// program order) its runs at each index of the leading parallel dims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSchedule {
    /// The kernel's name.
    pub kernel: String,
    /// The grid, outermost dim first.
    pub grid: Vec<usize>,
    /// `"parallel"` or `"arbitrary"` per grid dim.
    pub dimension_semantics: Vec<String>,
    /// The top-level branches, in program order.
    pub paths: Vec<PathRuns>,
}

/// One top-level branch: a name for it and how often it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRuns {
    /// `init` (it runs at the first step of the innermost grid dims, every one of them),
    /// `finalize` (at their last step), or where the `when` or loop is written (`file:line`).
    pub path: String,
    /// Runs at each index of the leading parallel dims (flattened, row-major; one entry when
    /// the grid has no leading parallel dim).
    pub runs: Vec<u64>,
    /// Whether every run was evaluated; `false`: at some steps the condition could not be
    /// evaluated and counts as holding.
    #[serde(default = "exact_default")]
    pub exact: bool,
}

fn exact_default() -> bool {
    true
}

/// A schedule that does not describe a grid (read from a file, e.g. a peer's kernel).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Not a schedule in JSON.
    #[error("not a kernel schedule ({message}); expected JSON like {{\"kernel\": \"k\", \"grid\": [8, 4], \"dimension_semantics\": [\"parallel\", \"arbitrary\"], \"paths\": [{{\"path\": \"init\", \"runs\": [1, 1, 1, 1, 1, 1, 1, 1]}}]}}")]
    Json { message: String },
    /// The semantics do not match the grid.
    #[error(
        "the schedule of `{kernel}` has {semantics} dimension semantics for a grid of {dims} \
         dims; give one per grid dim, each \"parallel\" or \"arbitrary\""
    )]
    Semantics {
        kernel: String,
        semantics: usize,
        dims: usize,
    },
    /// A path's runs are not one per index of the leading parallel dims, or exceed the steps.
    #[error(
        "path `{path}` of `{kernel}` gives {given} run counts; the grid's leading parallel dims \
         have {expected} indices, each with at most {steps} steps: give one count per index"
    )]
    Runs {
        kernel: String,
        path: String,
        given: usize,
        expected: usize,
        steps: u64,
    },
}

/// The path of the branch that copies a failed run-time check to the flags
/// (`crate::checks`): no step of a run whose checks pass runs it.
pub const CHECK_FAILED_PATH: &str = "check failed";

/// More step evaluations than this and every `when` counts as running at every step (a grid
/// of millions of steps; evaluating would take seconds).
const MAX_EVALUATIONS: u64 = 1 << 24;

impl KernelSchedule {
    /// Evaluates the conditions of `k`'s top-level branches at every grid step, reading the
    /// scalar-prefetch tables `args` gives (aligned with the kernel call's arguments). With
    /// per-shard tables, the shard whose branches run most is kept (the busiest device).
    pub fn of_kernel(k: &Kernel, args: &[ArgValues<'_>]) -> Self {
        let whens = top_level_branches(k);
        let semantics = k.semantics.iter().map(|s| s.name().to_string()).collect();
        let lead = leading_parallel(&k.semantics);
        let parallel: usize = k.grid[..lead].iter().product();
        let steps: u64 = k.grid.iter().map(|&n| n as u64).product();
        let shards = args
            .iter()
            .filter_map(|a| match a {
                ArgValues::PerShard(s) => Some(s.len()),
                _ => None,
            })
            .max()
            .unwrap_or(1)
            .max(1);
        let mut best: Option<(u64, Vec<PathRuns>)> = None;
        if steps.saturating_mul(shards as u64) <= MAX_EVALUATIONS {
            for shard in 0..shards {
                let tables = prefetch_tables(k, args, shard);
                let paths = evaluate(k, &whens, &tables, lead, parallel);
                let total: u64 = paths.iter().flat_map(|p| &p.runs).sum();
                if best.as_ref().is_none_or(|(t, _)| total > *t) {
                    best = Some((total, paths));
                }
            }
        }
        let paths = best.map(|(_, p)| p).unwrap_or_else(|| {
            let per_index = steps / parallel.max(1) as u64;
            whens
                .iter()
                .map(|(_, loc)| PathRuns {
                    path: loc.clone(),
                    runs: vec![per_index; parallel.max(1)],
                    exact: false,
                })
                .collect()
        });
        KernelSchedule {
            kernel: k.name.clone(),
            grid: k.grid.clone(),
            dimension_semantics: semantics,
            paths,
        }
    }

    /// Reads a schedule written by [`KernelSchedule::to_json`] (or by hand, for a kernel
    /// tessera did not lower) and checks it against its grid.
    pub fn from_json(text: &str) -> Result<Self, ScheduleError> {
        let s: KernelSchedule = serde_json::from_str(text).map_err(|e| ScheduleError::Json {
            message: e.to_string(),
        })?;
        s.check()?;
        Ok(s)
    }

    /// Reads a JSON list of schedules, or one schedule, each checked.
    pub fn list_from_json(text: &str) -> Result<Vec<Self>, ScheduleError> {
        let json = |e: serde_json::Error| ScheduleError::Json {
            message: e.to_string(),
        };
        let list: Vec<KernelSchedule> = match serde_json::from_str(text) {
            Ok(list) => list,
            Err(_) => vec![serde_json::from_str(text).map_err(json)?],
        };
        for s in &list {
            s.check()?;
        }
        Ok(list)
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a schedule is plain data")
    }

    fn check(&self) -> Result<(), ScheduleError> {
        if self.dimension_semantics.len() != self.grid.len()
            || self
                .dimension_semantics
                .iter()
                .any(|s| s != "parallel" && s != "arbitrary")
        {
            return Err(ScheduleError::Semantics {
                kernel: self.kernel.clone(),
                semantics: self.dimension_semantics.len(),
                dims: self.grid.len(),
            });
        }
        let parallel = self.parallel_indices();
        let steps = self.steps_per_parallel_index();
        for p in &self.paths {
            if p.runs.len() != parallel || p.runs.iter().any(|&r| r > steps) {
                return Err(ScheduleError::Runs {
                    kernel: self.kernel.clone(),
                    path: p.path.clone(),
                    given: p.runs.len(),
                    expected: parallel,
                    steps,
                });
            }
        }
        Ok(())
    }

    /// Indices of the leading parallel dims (their sizes multiplied; 1 when there is none).
    pub fn parallel_indices(&self) -> usize {
        let lead = self
            .dimension_semantics
            .iter()
            .take_while(|s| *s == "parallel")
            .count();
        self.grid[..lead].iter().product()
    }

    /// Grid steps per index of the leading parallel dims.
    pub fn steps_per_parallel_index(&self) -> u64 {
        let all: u64 = self.grid.iter().map(|&n| n as u64).product();
        all / self.parallel_indices().max(1) as u64
    }

    /// The leading-parallel indices each of `cores` TensorCores runs: contiguous ranges of
    /// `ceil(P / cores)` (the last core may get fewer, or none).
    pub fn core_ranges(&self, cores: usize) -> Vec<std::ops::Range<usize>> {
        let p = self.parallel_indices();
        let cores = if p > 1 { cores.max(1) } else { 1 };
        let share = p.div_ceil(cores);
        (0..cores)
            .map(|c| (c * share).min(p)..((c + 1) * share).min(p))
            .collect()
    }
}

/// How many leading grid dims are parallel.
fn leading_parallel(semantics: &[DimSemantics]) -> usize {
    semantics
        .iter()
        .take_while(|s| **s == DimSemantics::Parallel)
        .count()
}

/// The top-level branches: their condition and where each is written.
fn top_level_branches(k: &Kernel) -> Vec<(Guard, String)> {
    let loc = |inst: &crate::ir::Inst| format!("{}:{}", short_file(inst.loc.file), inst.loc.line);
    let constant = |v: &ValueId| {
        k.body
            .insts
            .iter()
            .any(|i| i.results.first() == Some(v) && matches!(i.op, Op::Constant { .. }))
    };
    k.body
        .insts
        .iter()
        .filter_map(|inst| match &inst.op {
            Op::When {
                cond,
                then,
                otherwise,
            } if !(prints_only(k, then) && prints_only(k, otherwise)) => {
                Some((Guard::When(*cond), loc(inst)))
            }
            Op::ForLoop { lo, hi, .. } if !(constant(lo) && constant(hi)) => {
                Some((Guard::Loop { lo: *lo, hi: *hi }, loc(inst)))
            }
            _ => None,
        })
        .collect()
}

/// A branch region of the compiled grid loop: a top-level `when`, or the guard libtpu puts
/// around a top-level loop whose trip count is a run-time value (it skips the loop when
/// `lo >= hi`; measured with libtpu 0.0.50.1 on v5p, paged attention's loop over page blocks).
#[derive(Debug, Clone, Copy)]
enum Guard {
    When(ValueId),
    Loop { lo: ValueId, hi: ValueId },
}

impl Guard {
    /// Whether the region runs, from the top-level scalars at a grid step.
    fn holds(self, values: &[Scalar]) -> Scalar {
        match self {
            Guard::When(cond) => values[cond.index()],
            Guard::Loop { lo, hi } => match (values[lo.index()], values[hi.index()]) {
                (Scalar::Int(lo), Scalar::Int(hi)) => Scalar::Bool(lo < hi),
                _ => Scalar::Unknown,
            },
        }
    }

    fn reads(self) -> Vec<ValueId> {
        match self {
            Guard::When(cond) => vec![cond],
            Guard::Loop { lo, hi } => vec![lo, hi],
        }
    }
}

/// Whether a region holds nothing but `debug_print`s of scalars and the scalar arithmetic
/// they print (a vector's print stores it to a buffer: bundles).
fn prints_only(k: &Kernel, r: &crate::ir::Region) -> bool {
    r.insts.iter().all(|i| match &i.op {
        Op::DebugPrint { args, .. } => args.iter().all(|&a| k.value_type(a).is_scalar()),
        op => matches!(
            op,
            Op::Constant { .. }
                | Op::ProgramId { .. }
                | Op::NumPrograms { .. }
                | Op::Binary { .. }
                | Op::Compare { .. }
                | Op::Unary { .. }
                | Op::Select { .. }
                | Op::Cast { .. }
                | Op::LoadScalar { .. }
        ),
    })
}

/// The file name without its directories.
fn short_file(file: &str) -> &str {
    file.rsplit(['/', '\\']).next().unwrap_or(file)
}

/// The known scalar-prefetch tables of one shard, by operand position (`None` where unknown).
fn prefetch_tables<'a>(
    k: &Kernel,
    args: &[ArgValues<'a>],
    shard: usize,
) -> Vec<Option<&'a HostArray>> {
    let mut tables = vec![None; k.operands.len()];
    let called = k
        .operands
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o.role, OperandRole::Input | OperandRole::ScalarPrefetch));
    for ((i, o), a) in called.zip(args) {
        if o.role == OperandRole::ScalarPrefetch {
            tables[i] = match a {
                ArgValues::Unknown => None,
                ArgValues::Same(x) => Some(*x),
                ArgValues::PerShard(s) => s.get(shard).or(s.last()),
            };
        }
    }
    tables
}

/// A scalar of the kernel's top-level code at one grid step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scalar {
    Int(i64),
    Bool(bool),
    Unknown,
}

/// Runs of each branch per leading-parallel index, evaluated at every grid step.
fn evaluate(
    k: &Kernel,
    whens: &[(Guard, String)],
    tables: &[Option<&HostArray>],
    lead: usize,
    parallel: usize,
) -> Vec<PathRuns> {
    let n = k.grid.len();
    let mut runs = vec![vec![0u64; parallel.max(1)]; whens.len()];
    let mut exact = vec![true; whens.len()];
    // Whether each `when` holds exactly at the first (last) step of the innermost `d` dims.
    let mut first = vec![vec![true; n + 1]; whens.len()];
    let mut last = vec![vec![true; n + 1]; whens.len()];
    let mut values = vec![Scalar::Unknown; k.types.len()];
    let mut idx = vec![0usize; n];
    let steps: usize = k.grid.iter().product();
    for step in 0..steps {
        let mut rest = step;
        for d in (0..n).rev() {
            idx[d] = rest % k.grid[d];
            rest /= k.grid[d];
        }
        let p = idx[..lead]
            .iter()
            .zip(&k.grid[..lead])
            .fold(0, |acc, (&i, &g)| acc * g + i);
        for inst in &k.body.insts {
            if let Some(&r) = inst.results.first() {
                values[r.index()] = eval(k, &inst.op, &idx, &values, tables);
            }
        }
        for (w, (guard, _)) in whens.iter().enumerate() {
            let holds = match guard.holds(&values) {
                Scalar::Bool(b) => b,
                _ => {
                    exact[w] = false;
                    true
                }
            };
            if holds {
                runs[w][p] += 1;
            }
            for d in 1..=n {
                let inner = n - d..n;
                first[w][d] &= holds == idx[inner.clone()].iter().all(|&i| i == 0);
                last[w][d] &= holds == inner.clone().all(|j| idx[j] + 1 == k.grid[j]);
            }
        }
    }
    let from_tables = read_tables(k, |_| true);
    let from_state = read_tables(k, |src| k.checks.flags.is_some_and(|f| f.state == src));
    whens
        .iter()
        .enumerate()
        .map(|(w, (guard, loc))| {
            // Named by what it computes only when its condition is of program ids alone (a
            // table's entries may coincide with the first steps).
            let by_ids = exact[w] && !guard.reads().iter().any(|v| from_tables[v.index()]);
            let reports_failure = guard.reads().iter().any(|v| from_state[v.index()]);
            let path = if reports_failure {
                CHECK_FAILED_PATH.to_string()
            } else if by_ids && first[w][1..].iter().any(|&b| b) {
                "init".to_string()
            } else if by_ids && last[w][1..].iter().any(|&b| b) {
                "finalize".to_string()
            } else {
                loc.clone()
            };
            PathRuns {
                path,
                runs: std::mem::take(&mut runs[w]),
                exact: exact[w],
            }
        })
        .collect()
}

/// Which values of the kernel's top-level code depend on a read (`load_scalar`) of a ref
/// `of` accepts.
fn read_tables(k: &Kernel, of: impl Fn(RefId) -> bool) -> Vec<bool> {
    let mut read = vec![false; k.types.len()];
    for inst in &k.body.insts {
        let depends = matches!(inst.op, Op::LoadScalar { src, .. } if of(src))
            || inst.op.operands().iter().any(|v| read[v.index()]);
        for r in &inst.results {
            read[r.index()] = depends;
        }
    }
    read
}

/// The value of one top-level op at the grid step `idx` (vectors and floats are unknown).
fn eval(
    k: &Kernel,
    op: &Op,
    idx: &[usize],
    values: &[Scalar],
    tables: &[Option<&HostArray>],
) -> Scalar {
    use Scalar::{Bool, Int, Unknown};
    let get = |v: &ValueId| values[v.index()];
    match op {
        Op::ProgramId { axis } => Int(idx[*axis] as i64),
        Op::NumPrograms { axis } => Int(k.grid[*axis] as i64),
        Op::Constant { value, ty } if ty.is_scalar() => match value {
            Literal::Int(i) => Int(*i),
            Literal::Bool(b) => Bool(*b),
            Literal::Float(_) => Unknown,
        },
        // The run-time checks' state stays zero in a run whose checks pass: the schedule is
        // that run's, and the branch that reports a failure never runs in it.
        Op::LoadScalar { src, .. } if k.checks.flags.is_some_and(|f| f.state == *src) => Int(0),
        Op::LoadScalar { src, indices } => {
            let Some(table) = tables.get(src.index()).copied().flatten() else {
                return Unknown;
            };
            let mut flat = 0usize;
            for (&i, &size) in indices.iter().zip(table.shape()) {
                match get(&i) {
                    Int(i) if i >= 0 && (i as usize) < size => flat = flat * size + i as usize,
                    _ => return Unknown,
                }
            }
            match table.data() {
                ArrayData::I32(v) => v.get(flat).map_or(Unknown, |&x| Int(x.into())),
                ArrayData::I8(v) => v.get(flat).map_or(Unknown, |&x| Int(x.into())),
                ArrayData::Bool(v) => v.get(flat).map_or(Unknown, |&x| Bool(x)),
                ArrayData::F32(_) | ArrayData::BF16(_) => Unknown,
            }
        }
        Op::Unary { op, x } => match (op, get(x)) {
            (UnaryOp::Neg, Int(a)) => Int(a.wrapping_neg()),
            (UnaryOp::Abs, Int(a)) => Int(a.wrapping_abs()),
            (UnaryOp::Not, Bool(a)) => Bool(!a),
            (UnaryOp::Not, Int(a)) => Int(!a),
            _ => Unknown,
        },
        Op::Binary { op, lhs, rhs } => match (get(lhs), get(rhs)) {
            (Int(a), Int(b)) => int_binary(*op, a, b).map_or(Unknown, |v| Int(wrap_i32(v))),
            (Bool(a), Bool(b)) => match op {
                BinaryOp::And => Bool(a && b),
                BinaryOp::Or => Bool(a || b),
                BinaryOp::Xor => Bool(a != b),
                _ => Unknown,
            },
            _ => Unknown,
        },
        Op::Compare { op, lhs, rhs } => match (get(lhs), get(rhs)) {
            (Int(a), Int(b)) => Bool(match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                CmpOp::Lt => a < b,
                CmpOp::Le => a <= b,
                CmpOp::Gt => a > b,
                CmpOp::Ge => a >= b,
            }),
            (Bool(a), Bool(b)) => match op {
                CmpOp::Eq => Bool(a == b),
                CmpOp::Ne => Bool(a != b),
                _ => Unknown,
            },
            _ => Unknown,
        },
        Op::Select {
            cond,
            on_true,
            on_false,
        } => match get(cond) {
            Bool(true) => get(on_true),
            Bool(false) => get(on_false),
            _ => Unknown,
        },
        Op::Cast { x, to } => match (get(x), to) {
            (Int(a), DType::I32) => Int(wrap_i32(a)),
            (Int(a), DType::I8) => Int(a as i8 as i64),
            (Int(a), DType::Bool) => Bool(a != 0),
            (Bool(a), DType::I32 | DType::I8) => Int(a as i64),
            (Bool(a), DType::Bool) => Bool(a),
            _ => Unknown,
        },
        _ => Unknown,
    }
}

/// Integer arithmetic with C semantics (division truncates; `None` when dividing by zero).
fn int_binary(op: BinaryOp, a: i64, b: i64) -> Option<i64> {
    Some(match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => a.checked_div(b)?,
        BinaryOp::Rem => a.checked_rem(b)?,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
    })
}

/// `v` as the i32 the kernel computes.
fn wrap_i32(v: i64) -> i64 {
    v as i32 as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(grid: &[usize], semantics: &[&str], runs: Vec<u64>) -> KernelSchedule {
        KernelSchedule {
            kernel: "k".into(),
            grid: grid.to_vec(),
            dimension_semantics: semantics.iter().map(|s| s.to_string()).collect(),
            paths: vec![PathRuns {
                path: "init".into(),
                runs,
                exact: true,
            }],
        }
    }

    #[test]
    fn leading_parallel_dims_split_over_cores() {
        let s = schedule(
            &[3, 3, 4],
            &["parallel", "parallel", "arbitrary"],
            vec![4; 9],
        );
        assert_eq!(s.parallel_indices(), 9);
        assert_eq!(s.steps_per_parallel_index(), 4);
        assert_eq!(s.core_ranges(2), vec![0..5, 5..9]);
        assert_eq!(s.core_ranges(1), vec![0..9]);
        let s = schedule(&[4, 3], &["arbitrary", "parallel"], vec![2]);
        assert_eq!(s.parallel_indices(), 1);
        assert_eq!(s.core_ranges(2), vec![0..1]);
    }

    #[test]
    fn a_schedule_round_trips_and_is_checked() {
        let s = schedule(&[2, 4], &["parallel", "arbitrary"], vec![1, 1]);
        assert_eq!(KernelSchedule::from_json(&s.to_json()).unwrap(), s);
        let text = r#"{"kernel":"k","grid":[2,4],"dimension_semantics":["parallel","arbitrary"],
                       "paths":[{"path":"run","runs":[4,3]}]}"#;
        assert!(KernelSchedule::from_json(text).unwrap().paths[0].exact);
        let bad = schedule(&[2, 4], &["parallel", "arbitrary"], vec![1]);
        let e = KernelSchedule::from_json(&bad.to_json()).unwrap_err();
        assert!(e.to_string().contains("gives 1 run counts"), "{e}");
        let bad = schedule(&[2, 4], &["parallel", "arbitrary"], vec![5, 1]);
        assert!(KernelSchedule::from_json(&bad.to_json()).is_err());
        let bad = schedule(&[2, 4], &["parallel"], vec![1, 1]);
        let e = KernelSchedule::from_json(&bad.to_json()).unwrap_err();
        assert!(e.to_string().contains("1 dimension semantics"), "{e}");
        let list = format!("[{}, {}]", s.to_json(), s.to_json());
        assert_eq!(KernelSchedule::list_from_json(&list).unwrap().len(), 2);
        assert_eq!(
            KernelSchedule::list_from_json(&s.to_json()).unwrap(),
            vec![s]
        );
        let e = KernelSchedule::from_json("{").unwrap_err();
        assert!(e.to_string().contains("not a kernel schedule"), "{e}");
    }
}
