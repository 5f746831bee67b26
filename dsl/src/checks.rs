//! Run-time index checks: every index a kernel computes at run time is proven in range at
//! instantiation or checked when the kernel runs, on every backend.
//!
//! A kernel slices its refs with values it computes: grid indices, loop indices, and scalars
//! it loads from SMEM (scalar prefetch: page tables, tile lists, slots). An index of the last
//! kind comes from the caller, and an out-of-range one would read or write past its buffer:
//! on a TPU, another buffer's HBM (another sequence's, another tenant's) or SMEM past a
//! table's row. After tracing, [`insert`] walks the kernel and, for each such index:
//!
//! - **proves** it in range where it can, by interval arithmetic over the i32 scalars
//!   ([`ranges`]): grid indices lie in `0..grid`, device ids in `0..devices`, a `fori_loop`'s
//!   index in `lo..hi` of its bounds' ranges, constants are themselves, and `+ - * / % min
//!   max select` combine ranges (`/` and `%` by a divisor range without 0). Anything loaded
//!   (SMEM, semaphore counts) or carried by a loop may be any i32. `i % 2` for a grid index
//!   `i`, `i * 8` for `i` in `0..G`, `min(x, n - 1)`... are proven; a loaded page number is
//!   not;
//! - **or guards** it: a check on the scalar path before the access. Where it fails the
//!   access is made at index 0 instead (in range: the window fits the ref, or the kernel
//!   would not have instantiated), so nothing outside the ref is touched, and the step's
//!   first failure is recorded without a branch (scalar selects into the step's check state,
//!   stored to SMEM once per region) and, at the step's end, written to the kernel's check
//!   flags, an extra output ([`KernelChecks`]): one row per grid step, zero where every
//!   check held. The runtime reads it after the run
//!   ([`take_failure`]) and turns the first failed row into an error naming the kernel, the
//!   check (operand, dim, the value and its bound), the kernel line and the grid step; the
//!   outputs are never handed back. The interpreter, mosaic-eval, the StableHLO path (CPU,
//!   GPU) and the Mosaic kernel (TPU) all run this same code.
//!
//! The indices checked: dynamic starts of windows (loads and stores of VMEM refs, both sides
//! of a copy), SMEM element indices (`get`, `set`), semaphore indices, the target device of a
//! remote copy or signal. A copy's wait is clamped like its start but not reported (the wait
//! only sizes the copy; its start was checked). Arithmetic on i32 scalars that feeds an
//! index or a `fori_loop` bound and whose range leaves i32 (`length + 15` for a loaded
//! `length`) is checked for overflow the same way. An author's `debug_check` also writes the
//! flags, with the run-time values its condition compares, so it holds on the StableHLO
//! path too (the interpreter and mosaic-eval stop at it first, with its message); an index
//! it bounds is clamped by its condition and reported by it.
//!
//! An author who has proven an index wraps it in [`unchecked_index`](crate::unchecked_index):
//! no check is made for that value (`Devices::next` and `prev` mark the ring neighbours
//! they compute that way, splash's index maps the entries of `MaskInfo`'s block tables).
//!
//! A block index map that reads scalar prefetch (the cache update's `|i| (slots[i], 0)`) is
//! guarded the same way: a block index not proven in range is clamped to block 0 inside the
//! map (the pipeline copies nothing past the array), and the map's scalar code runs again at
//! the start of the body at the step's grid ids, where its failure is recorded as the body's
//! are (a map with code other than scalar arithmetic and SMEM loads is clamped only).

use std::collections::{HashMap, HashSet};

use crate::array::HostArray;
use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    BinaryOp, BlockDim, CmpOp, DType, Inst, Kernel, Literal, Loc, MemorySpace, Op, Operand,
    OperandRole, RefId, RefWindow, Region, SemKind, SemRef, Slice, UnaryOp, ValueId, ValueType,
};
pub use crate::ir::{CheckFlags, CheckKind, CheckSite, KernelChecks, FLAG_WORDS};

/// An inclusive range of an i32 scalar, in i64 so that arithmetic on bounds cannot wrap.
type Range = (i64, i64);
const I32_RANGE: Range = (i32::MIN as i64, i32::MAX as i64);

fn within_i32(r: Range) -> bool {
    r.0 >= I32_RANGE.0 && r.1 <= I32_RANGE.1
}

fn is_i32_scalar(ty: &ValueType) -> bool {
    ty.dtype == DType::I32 && ty.is_scalar()
}

/// The range of every i32 scalar of `k`'s body (where a `when` narrows a value, its range
/// outside), and the arithmetic whose exact range leaves i32 (it may wrap at run time).
pub fn ranges(k: &Kernel) -> (HashMap<ValueId, Range>, HashSet<ValueId>) {
    let mut r = Ranges::new(k);
    r.region(&k.body);
    (r.of, r.may_wrap)
}

struct Ranges<'k> {
    k: &'k Kernel,
    of: HashMap<ValueId, Range>,
    may_wrap: HashSet<ValueId>,
    /// Bool scalars defined by a comparison or an `&`, for narrowing inside a `when`.
    compares: HashMap<ValueId, (CmpOp, ValueId, ValueId)>,
    conjunctions: HashMap<ValueId, (ValueId, ValueId)>,
}

impl<'k> Ranges<'k> {
    fn new(k: &'k Kernel) -> Self {
        Ranges {
            k,
            of: HashMap::new(),
            may_wrap: HashSet::new(),
            compares: HashMap::new(),
            conjunctions: HashMap::new(),
        }
    }

    fn get(&self, v: ValueId) -> Range {
        self.of.get(&v).copied().unwrap_or(I32_RANGE)
    }

    fn region(&mut self, region: &Region) {
        for inst in &region.insts {
            self.inst(inst);
        }
    }

    /// The ranges an instruction defines, its regions included (analysis only).
    fn inst(&mut self, inst: &Inst) {
        match &inst.op {
            Op::When {
                cond,
                then,
                otherwise,
            } => {
                let saved = self.enter_when(*cond);
                self.region(then);
                self.leave_when(saved);
                self.region(otherwise);
            }
            Op::ForLoop { lo, hi, init, body } => {
                self.for_loop(*lo, *hi, init, body, &inst.results)
            }
            Op::Scoped { body, .. } => self.region(body),
            _ => self.leaf(inst),
        }
    }

    /// Inside a `when`'s `then` the condition holds (`x >= c`, `x < c`, ...): narrows the
    /// values it bounds; returns the ranges to restore after the region.
    fn enter_when(&mut self, cond: ValueId) -> HashMap<ValueId, Range> {
        let saved = self.of.clone();
        self.assume(cond);
        saved
    }

    /// Restores the ranges from before a `then` region; values defined inside keep theirs
    /// (they are only visible there).
    fn leave_when(&mut self, saved: HashMap<ValueId, Range>) {
        let inner = std::mem::replace(&mut self.of, saved);
        for (v, r) in inner {
            self.of.entry(v).or_insert(r);
        }
    }

    /// The range an instruction without regions defines.
    fn leaf(&mut self, inst: &Inst) {
        let k = self.k;
        let exact: Option<Range> = match &inst.op {
            Op::ProgramId { axis } => Some((0, k.grid[*axis] as i64 - 1)),
            Op::NumPrograms { axis } => Some((k.grid[*axis] as i64, k.grid[*axis] as i64)),
            Op::Constant {
                value: Literal::Int(v),
                ..
            } => Some((*v, *v)),
            Op::DeviceId => Some((0, k.num_devices() as i64 - 1)),
            Op::Binary {
                op: BinaryOp::And,
                lhs,
                rhs,
            } if k.value_type(*lhs).dtype == DType::Bool => {
                self.conjunctions.insert(inst.results[0], (*lhs, *rhs));
                None
            }
            Op::Binary { op, lhs, rhs } => binary(*op, self.get(*lhs), self.get(*rhs)),
            Op::Unary {
                op: UnaryOp::Neg,
                x,
            } => {
                let (lo, hi) = self.get(*x);
                Some((-hi, -lo))
            }
            Op::Select {
                cond,
                on_true,
                on_false,
            } => {
                // Each side where it is chosen: `select(e.lt(n), e, 0)` is below `n`.
                let a = self.narrowed(*on_true, *cond, true);
                let b = self.narrowed(*on_false, *cond, false);
                Some((a.0.min(b.0), a.1.max(b.1)))
            }
            Op::Cast { x, .. } => match k.value_type(*x).dtype {
                DType::Bool => Some((0, 1)),
                DType::I32 => Some(self.get(*x)),
                _ => None,
            },
            Op::Compare { op, lhs, rhs } => {
                self.compares.insert(inst.results[0], (*op, *lhs, *rhs));
                None
            }
            _ => None,
        };
        let [result] = inst.results[..] else { return };
        let Some(exact) = exact else { return };
        if !is_i32_scalar(k.value_type(result)) {
            return;
        }
        if within_i32(exact) {
            self.of.insert(result, exact);
        } else {
            self.may_wrap.insert(result);
        }
    }
}

impl Ranges<'_> {
    /// The run-time i32 scalars a bool condition compares (through `&` and comparisons;
    /// constants left out), at most three, in order: what a failed `debug_check` reports.
    fn compared(&self, cond: ValueId) -> Vec<ValueId> {
        let mut out = Vec::new();
        let mut todo = vec![cond];
        while let Some(c) = todo.pop() {
            if let Some(&(a, b)) = self.conjunctions.get(&c) {
                todo.extend([b, a]);
            } else if let Some(&(_, lhs, rhs)) = self.compares.get(&c) {
                for v in [lhs, rhs] {
                    let (lo, hi) = self.get(v);
                    if is_i32_scalar(self.k.value_type(v)) && lo != hi && !out.contains(&v) {
                        out.push(v);
                    }
                }
            }
        }
        out.truncate(STATE_WORDS - 1);
        out
    }

    /// The range of `v` where `cond` is `holds`: narrowed where `cond` compares `v` (or is an
    /// `&` of such, where it holds).
    fn narrowed(&self, v: ValueId, cond: ValueId, holds: bool) -> Range {
        let r = self.get(v);
        if holds {
            if let Some(&(a, b)) = self.conjunctions.get(&cond) {
                let (x, y) = (self.narrowed(v, a, true), self.narrowed(v, b, true));
                return (x.0.max(y.0), x.1.min(y.1));
            }
        }
        let Some(&(op, lhs, rhs)) = self.compares.get(&cond) else {
            return r;
        };
        // `!(x < y)` is `x >= y`, ...
        let op = match (holds, op) {
            (true, op) => op,
            (false, CmpOp::Lt) => CmpOp::Ge,
            (false, CmpOp::Le) => CmpOp::Gt,
            (false, CmpOp::Gt) => CmpOp::Le,
            (false, CmpOp::Ge) => CmpOp::Lt,
            (false, CmpOp::Eq) => CmpOp::Ne,
            (false, CmpOp::Ne) => CmpOp::Eq,
        };
        let narrowed = if v == lhs {
            narrow(r, op, self.get(rhs))
        } else if v == rhs {
            narrow(r, flip(op), self.get(lhs))
        } else {
            r
        };
        // An empty range: that side is never chosen.
        if narrowed.0 <= narrowed.1 {
            narrowed
        } else {
            r
        }
    }

    /// The ranges `cond` narrows values to, where it holds.
    fn implied(&mut self, cond: ValueId) -> Vec<(ValueId, Range)> {
        let saved = self.of.clone();
        self.assume(cond);
        let narrowed = std::mem::replace(&mut self.of, saved);
        narrowed
            .into_iter()
            .filter(|(v, r)| self.of.get(v) != Some(r))
            .collect()
    }

    /// Narrows the ranges of the values `cond` (a bool scalar) bounds, assuming it holds:
    /// comparisons of a value with a bounded one, and `&` of such.
    fn assume(&mut self, cond: ValueId) {
        if let Some(&(a, b)) = self.conjunctions.get(&cond) {
            self.assume(a);
            self.assume(b);
            return;
        }
        let Some(&(op, lhs, rhs)) = self.compares.get(&cond) else {
            return;
        };
        if !is_i32_scalar(self.k.value_type(lhs)) {
            return;
        }
        let (a, b) = (self.get(lhs), self.get(rhs));
        let (na, nb) = (narrow(a, op, b), narrow(b, flip(op), a));
        // An empty range: the branch never runs; leave the ranges as they were.
        if na.0 <= na.1 && nb.0 <= nb.1 {
            self.of.insert(lhs, na);
            self.of.insert(rhs, nb);
        }
    }

    /// A `fori_loop` over `lo..hi`: its index lies in `lo.0 ..= hi.1 - 1`; its carried i32
    /// scalars in what `trips` iterations can make of their initial ranges, found by
    /// running the body's ranges to a fixed point (at most 256 rounds; a value
    /// still growing then may be any i32). A slot counter `(s + 1) % 2` or a step count
    /// `s + 1` over a loop of known trips is bounded that way.
    fn for_loop(
        &mut self,
        lo: ValueId,
        hi: ValueId,
        init: &[ValueId],
        body: &Region,
        results: &[ValueId],
    ) {
        let (lo, hi) = (self.get(lo), self.get(hi));
        const MAX_ROUNDS: i64 = 256;
        if let Some(&i) = body.params.first() {
            self.of.insert(i, (lo.0, (hi.1 - 1).max(lo.0)));
        }
        let trips = (hi.1 - lo.0).max(0);
        // (param, init, yield, result) of each carried i32 scalar.
        let carried: Vec<(ValueId, ValueId, ValueId, ValueId)> = body.params[1..]
            .iter()
            .zip(init)
            .zip(&body.yields)
            .zip(results)
            .map(|(((&p, &i), &y), &r)| (p, i, y, r))
            .filter(|(p, ..)| is_i32_scalar(self.k.value_type(*p)))
            .collect();
        let mut current: Vec<Range> = carried.iter().map(|(_, i, ..)| self.get(*i)).collect();
        let mut bounded = false;
        for _ in 0..=trips.min(MAX_ROUNDS) {
            for ((p, ..), r) in carried.iter().zip(&current) {
                self.of.insert(*p, *r);
            }
            self.region(body);
            let next: Vec<Range> = carried
                .iter()
                .zip(&current)
                .map(|((_, _, y, _), r)| {
                    let y = self.get(*y);
                    (r.0.min(y.0), r.1.max(y.1))
                })
                .collect();
            if next == current {
                bounded = true;
                break;
            }
            current = next;
        }
        if trips > MAX_ROUNDS && !bounded {
            for (p, ..) in &carried {
                self.of.remove(p);
            }
            self.region(body);
            current = vec![I32_RANGE; carried.len()];
        }
        // The results: the carried values after the last iteration.
        for ((.., out), r) in carried.iter().zip(&current) {
            self.of.insert(*out, *r);
        }
    }
}

/// The range of `x` where `x op y` holds, `y` in its range.
fn narrow(x: Range, op: CmpOp, y: Range) -> Range {
    match op {
        CmpOp::Lt => (x.0, x.1.min(y.1 - 1)),
        CmpOp::Le => (x.0, x.1.min(y.1)),
        CmpOp::Gt => (x.0.max(y.0 + 1), x.1),
        CmpOp::Ge => (x.0.max(y.0), x.1),
        CmpOp::Eq => (x.0.max(y.0), x.1.min(y.1)),
        CmpOp::Ne => x,
    }
}

/// `op` with its sides swapped (`x < y` is `y > x`).
fn flip(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::Le => CmpOp::Ge,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::Ge => CmpOp::Le,
        other => other,
    }
}

/// The exact range of `a op b` (None: any i32).
fn binary(op: BinaryOp, a: Range, b: Range) -> Option<Range> {
    let corners = |f: fn(i64, i64) -> i64| {
        let c = [f(a.0, b.0), f(a.0, b.1), f(a.1, b.0), f(a.1, b.1)];
        (*c.iter().min().unwrap(), *c.iter().max().unwrap())
    };
    let divisor_without_zero = b.0 > 0 || b.1 < 0;
    match op {
        BinaryOp::Add => Some((a.0 + b.0, a.1 + b.1)),
        BinaryOp::Sub => Some((a.0 - b.1, a.1 - b.0)),
        BinaryOp::Mul => Some(corners(|x, y| x * y)),
        BinaryOp::Div if divisor_without_zero => Some(corners(|x, y| x / y)),
        BinaryOp::Rem if divisor_without_zero => {
            let m = b.0.abs().max(b.1.abs()) - 1;
            Some(if a.0 >= 0 {
                (0, a.1.min(m))
            } else if a.1 <= 0 {
                (a.0.max(-m), 0)
            } else {
                (a.0.max(-m), a.1.min(m))
            })
        }
        BinaryOp::Max => Some((a.0.max(b.0), a.1.max(b.1))),
        BinaryOp::Min => Some((a.0.min(b.0), a.1.min(b.1))),
        _ => None,
    }
}

/// One index use to prove or guard: the value, its valid range and what it indexes.
struct IndexUse {
    value: ValueId,
    max: i64,
    what: String,
}

/// The indices `op` uses, with their bounds (a window's start may go up to the dim minus the
/// window's length).
fn index_uses(k: &Kernel, op: &Op) -> Vec<IndexUse> {
    let mut uses = Vec::new();
    let window = |uses: &mut Vec<IndexUse>, r: RefId, slices: &[Slice], side: &str| {
        let o = k.operand(r);
        let view = o.view_shape();
        for (d, s) in slices.iter().enumerate() {
            if let Slice::Dynamic { start, len } = *s {
                uses.push(IndexUse {
                    value: start,
                    max: view[d] as i64 - len as i64,
                    what: format!("the start of {side}`{}`'s window along dim {d}", o.name),
                });
            }
        }
    };
    let elements = |uses: &mut Vec<IndexUse>, r: RefId, index: &[ValueId], what: &str| {
        let o = k.operand(r);
        for (d, &i) in index.iter().enumerate() {
            uses.push(IndexUse {
                value: i,
                max: o.array_shape[d] as i64 - 1,
                what: format!("{what} {d} of `{}`", o.name),
            });
        }
    };
    let device = |uses: &mut Vec<IndexUse>, v: ValueId| {
        uses.push(IndexUse {
            value: v,
            max: k.num_devices() as i64 - 1,
            what: "the target device".into(),
        })
    };
    match op {
        Op::Load { src: r, slices } | Op::Store { dst: r, slices, .. } => {
            window(&mut uses, *r, slices, "")
        }
        Op::LoadScalar { src: r, indices }
        | Op::StoreScalar {
            dst: r, indices, ..
        } => elements(&mut uses, *r, indices, "index"),
        Op::DmaStart {
            src, dst, remote, ..
        } => {
            window(&mut uses, src.r, &src.slices, "the copy's source ");
            window(&mut uses, dst.r, &dst.slices, "the copy's destination ");
            if let Some(remote) = remote {
                device(&mut uses, remote.device);
            }
        }
        Op::DmaWait { src, dst, .. } => {
            window(&mut uses, src.r, &src.slices, "the copy's source ");
            window(&mut uses, dst.r, &dst.slices, "the copy's destination ");
        }
        Op::SemSignal {
            device: Some(d), ..
        } => device(&mut uses, *d),
        _ => {}
    }
    for sem in op.semaphores() {
        elements(&mut uses, sem.sem, &sem.index, "semaphore index");
    }
    uses
}

/// Replaces the index values of `op` by `safe[old]` where given.
fn replace_indices(op: &mut Op, safe: &HashMap<ValueId, ValueId>) {
    let fix = |v: &mut ValueId| {
        if let Some(&s) = safe.get(v) {
            *v = s;
        }
    };
    let fix_slices = |slices: &mut Vec<Slice>| {
        for s in slices {
            if let Slice::Dynamic { start, .. } = s {
                fix(start);
            }
        }
    };
    let fix_sem = |s: &mut SemRef| s.index.iter_mut().for_each(fix);
    match op {
        Op::Load { slices, .. } | Op::Store { slices, .. } => fix_slices(slices),
        Op::LoadScalar { indices, .. } | Op::StoreScalar { indices, .. } => {
            indices.iter_mut().for_each(fix)
        }
        Op::DmaStart {
            src,
            dst,
            sem,
            remote,
        } => {
            fix_slices(&mut src.slices);
            fix_slices(&mut dst.slices);
            fix_sem(sem);
            if let Some(r) = remote {
                fix(&mut r.device);
                fix_sem(&mut r.send_sem);
            }
        }
        Op::DmaWait { src, dst, sem } => {
            fix_slices(&mut src.slices);
            fix_slices(&mut dst.slices);
            fix_sem(sem);
        }
        Op::SemSignal { sem, device, .. } => {
            fix_sem(sem);
            if let Some(d) = device {
                fix(d);
            }
        }
        Op::SemWait { sem, .. } | Op::SemRead { sem } => fix_sem(sem),
        _ => {}
    }
}

/// The values that feed an index or a loop bound through arithmetic (where an overflow
/// matters).
fn feeding_indices(k: &Kernel) -> HashSet<ValueId> {
    let mut defs: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    let mut roots = Vec::new();
    fn walk(
        k: &Kernel,
        region: &Region,
        defs: &mut HashMap<ValueId, Vec<ValueId>>,
        roots: &mut Vec<ValueId>,
    ) {
        for inst in &region.insts {
            match &inst.op {
                Op::Binary { .. } | Op::Select { .. } | Op::Unary { .. } | Op::Cast { .. } => {
                    for &r in &inst.results {
                        defs.insert(r, inst.op.operands());
                    }
                }
                Op::ForLoop { lo, hi, .. } => roots.extend([*lo, *hi]),
                op => roots.extend(index_uses(k, op).iter().map(|u| u.value)),
            }
            for r in inst.op.regions() {
                walk(k, r, defs, roots);
            }
        }
    }
    walk(k, &k.body, &mut defs, &mut roots);
    let mut seen = HashSet::new();
    while let Some(v) = roots.pop() {
        if seen.insert(v) {
            roots.extend(defs.get(&v).into_iter().flatten());
        }
    }
    seen
}

/// Proves or guards every run-time index of `k` (see the module docs); `unchecked` are the
/// values the author marked with `unchecked_index`. A kernel with nothing to guard is
/// returned as it was; otherwise with the check-flag operands and [`Kernel::checks`] set.
pub fn insert(mut k: Kernel, unchecked: &HashSet<ValueId>) -> Kernel {
    let feeding = feeding_indices(&k);
    // The flags' operands, declared after the kernel's own (added only if something is
    // checked).
    let next = k.operands.len() as u32;
    let refs = FlagRefs {
        init: RefId(next),
        flags: RefId(next + 1),
        sem: RefId(next + 2),
        state: RefId(next + 3),
    };
    let body = std::mem::take(&mut k.body);
    // The block index maps that read run-time data (scalar prefetch), taken out while the
    // kernel is read and put back guarded.
    let maps: Vec<(usize, Region)> = k
        .operands
        .iter_mut()
        .enumerate()
        .filter_map(|(i, o)| {
            let block = o.block.as_mut()?;
            let reads = block
                .index_map
                .insts
                .iter()
                .any(|inst| matches!(inst.op, Op::LoadScalar { .. }));
            reads.then(|| (i, std::mem::take(&mut block.index_map)))
        })
        .collect();
    let (body, types, sites, proven, unchecked_uses, maps) = {
        let mut g = Guards {
            ranges: Ranges::new(&k),
            feeding,
            unchecked,
            sites: Vec::new(),
            proven: 0,
            unchecked_uses: 0,
            types: k.types.clone(),
            checked: Vec::new(),
            reported: Vec::new(),
            state: Vec::new(),
            state_changed: false,
            words_used: 1,
            refs,
            grid: k.grid.clone(),
        };
        let mut prologue = Vec::new();
        let maps: Vec<(usize, Region)> = maps
            .into_iter()
            .map(|(i, map)| {
                let (map, report) = g.index_map(&k, i, map);
                prologue.extend(report);
                (i, map)
            })
            .collect();
        let mut body = g.region(&k, body);
        body.insts.splice(0..0, prologue);
        if !g.sites.is_empty() {
            g.frame_step(&mut body, k.loc);
        }
        (body, g.types, g.sites, g.proven, g.unchecked_uses, maps)
    };
    for (i, map) in maps {
        if let Some(block) = k.operands[i].block.as_mut() {
            block.index_map = map;
        }
    }
    k.body = body;
    k.types = types;
    k.checks = KernelChecks {
        flags: None,
        sites,
        proven,
        unchecked: unchecked_uses,
    };
    if k.checks.sites.is_empty() {
        return k;
    }
    let shape = KernelChecks::flags_shape(&k.grid);
    let operand = |name: &str, role, memory, shape: Vec<usize>| Operand {
        name: name.into(),
        role,
        dtype: DType::I32,
        memory,
        array_shape: shape,
        block: None,
        aliases: None,
        loc: k.loc,
    };
    k.operands.push(operand(
        "check_flags_init",
        OperandRole::Input,
        MemorySpace::Any,
        shape.clone(),
    ));
    k.operands.push(Operand {
        aliases: Some(refs.init),
        ..operand("check_flags", OperandRole::Output, MemorySpace::Any, shape)
    });
    k.operands.push(operand(
        "check_sem",
        OperandRole::Scratch,
        MemorySpace::Semaphore(SemKind::Dma),
        vec![],
    ));
    k.operands.push(operand(
        "check_state",
        OperandRole::Scratch,
        MemorySpace::Smem,
        vec![1, FLAG_WORDS],
    ));
    k.checks.flags = Some(CheckFlags {
        init: refs.init,
        flags: refs.flags,
        state: refs.state,
    });
    k
}

#[derive(Debug, Clone, Copy)]
struct FlagRefs {
    init: RefId,
    flags: RefId,
    sem: RefId,
    /// The step's check state: one SMEM row of the flags' width, `[[check number + 1 (0:
    /// none), values.., unused..]]`; a failed step copies it to its row of the flags (a DMA
    /// moves whole 512-byte rows).
    state: RefId,
}

/// Words of the check state: the check's number and up to three values.
const STATE_WORDS: usize = 4;

struct Guards<'a> {
    ranges: Ranges<'a>,
    feeding: HashSet<ValueId>,
    unchecked: &'a HashSet<ValueId>,
    sites: Vec<CheckSite>,
    proven: usize,
    unchecked_uses: usize,
    types: Vec<ValueType>,
    /// Per open region, the indices checked there with their bound and clamped value: a
    /// later access in the region or inside it reuses them.
    checked: Vec<HashMap<(ValueId, i64), ValueId>>,
    /// Per open region, the ranges an author's `debug_check` there reports its values
    /// outside of: an index within such a range needs a clamp but no report of its own.
    reported: Vec<HashMap<ValueId, (Range, ValueId)>>,
    /// The current region's copy of the check state's first words (loaded at its first
    /// record), and whether its records changed them since they were stored.
    state: Vec<ValueId>,
    state_changed: bool,
    /// The most words a check records (its number and values).
    words_used: usize,
    refs: FlagRefs,
    grid: Vec<usize>,
}

/// Instructions being built at one place of a region, with fresh values.
struct Emit<'g, 'a> {
    g: &'g mut Guards<'a>,
    insts: Vec<Inst>,
    loc: Loc,
}

impl Emit<'_, '_> {
    fn op(&mut self, op: Op, ty: ValueType) -> ValueId {
        let v = ValueId(self.g.types.len() as u32);
        self.g.types.push(ty);
        self.insts.push(Inst {
            op,
            results: vec![v],
            loc: self.loc,
        });
        v
    }

    fn int(&mut self, value: i64) -> ValueId {
        let ty = ValueType::scalar(DType::I32);
        self.op(
            Op::Constant {
                value: Literal::Int(value),
                ty: ty.clone(),
            },
            ty,
        )
    }

    fn cmp(&mut self, op: CmpOp, lhs: ValueId, rhs: ValueId) -> ValueId {
        self.op(Op::Compare { op, lhs, rhs }, ValueType::scalar(DType::Bool))
    }

    fn cmp_int(&mut self, op: CmpOp, lhs: ValueId, rhs: i64) -> ValueId {
        let rhs = self.int(rhs);
        self.cmp(op, lhs, rhs)
    }

    fn bin(&mut self, op: BinaryOp, lhs: ValueId, rhs: ValueId, dtype: DType) -> ValueId {
        self.op(Op::Binary { op, lhs, rhs }, ValueType::scalar(dtype))
    }

    /// `cond ? on_true : on_false` of i32 scalars.
    fn select(&mut self, cond: ValueId, on_true: ValueId, on_false: ValueId) -> ValueId {
        self.op(
            Op::Select {
                cond,
                on_true,
                on_false,
            },
            ValueType::scalar(DType::I32),
        )
    }

    /// `lo <= v && v <= hi`.
    fn within(&mut self, v: ValueId, lo: i64, hi: i64) -> ValueId {
        let a = self.cmp_int(CmpOp::Ge, v, lo);
        let b = self.cmp_int(CmpOp::Le, v, hi);
        self.bin(BinaryOp::And, a, b, DType::Bool)
    }

    /// Records check `site` with `values`, to be reported where `ok` is false and nothing
    /// failed before it in this step (the first failure is the one reported): folded into
    /// the region's copy of the check state with a compare, an `or` and a select per word
    /// (no branch, no memory access: the scalar path's work beside the step's vector
    /// work), stored once per region (`Guards::flush_state`).
    fn report_unless(&mut self, ok: ValueId, site: usize, values: &[ValueId]) {
        let number = self.int(site as i64 + 1);
        let words: Vec<ValueId> = std::iter::once(number)
            .chain(values.iter().copied())
            .collect();
        self.g.words_used = self.g.words_used.max(words.len());
        while self.g.state.len() < words.len() {
            let word = self.state_word(self.g.state.len());
            self.g.state.push(word);
        }
        let failed_before = self.cmp_int(CmpOp::Ne, self.g.state[0], 0);
        let keep = self.bin(BinaryOp::Or, ok, failed_before, DType::Bool);
        for (word, &v) in words.iter().enumerate() {
            self.g.state[word] = self.select(keep, self.g.state[word], v);
        }
        self.g.state_changed = true;
    }

    /// Word `word` of the step's check state (SMEM).
    fn state_word(&mut self, word: usize) -> ValueId {
        let (row, at) = (self.int(0), self.int(word as i64));
        let src = self.g.refs.state;
        self.op(
            Op::LoadScalar {
                src,
                indices: vec![row, at],
            },
            ValueType::scalar(DType::I32),
        )
    }

    fn set_state_word(&mut self, word: usize, value: ValueId) {
        let (row, at) = (self.int(0), self.int(word as i64));
        let dst = self.g.refs.state;
        self.insts.push(Inst {
            op: Op::StoreScalar {
                dst,
                indices: vec![row, at],
                value,
            },
            results: vec![],
            loc: self.loc,
        });
    }

    /// The step's epilogue: where a check failed, its state is copied to the step's row of
    /// the flags (a DMA from SMEM, in a branch no passing step takes).
    fn write_failures(&mut self) {
        let number = self.state_word(0);
        let failed = self.cmp_int(CmpOp::Ne, number, 0);
        let mut branch = Emit {
            g: &mut *self.g,
            insts: Vec::new(),
            loc: self.loc,
        };
        branch.write_row();
        let then = Region {
            insts: branch.insts,
            ..Region::default()
        };
        self.insts.push(Inst {
            op: Op::When {
                cond: failed,
                then,
                otherwise: Region::default(),
            },
            results: vec![],
            loc: self.loc,
        });
    }

    /// Copies the check state (SMEM) to this grid step's row of the flags. A DMA moves the
    /// whole 512-byte row and each step clears only the words the checks use, so the row's
    /// other words are zeroed first, by a copy of the step's row of the flags (still the
    /// zeros they start from: only this step writes it). No VMEM: the checks add nothing to
    /// the kernel's scoped VMEM.
    fn write_row(&mut self) {
        let refs = self.g.refs;
        let grid = self.g.grid.clone();
        // The step, row-major over the grid.
        let mut step = self.int(0);
        for (axis, &n) in grid.iter().enumerate() {
            let size = self.int(n as i64);
            let scaled = self.bin(BinaryOp::Mul, step, size, DType::I32);
            let id = self.op(Op::ProgramId { axis }, ValueType::scalar(DType::I32));
            step = self.bin(BinaryOp::Add, scaled, id, DType::I32);
        }
        let words: Vec<ValueId> = (0..self.g.words_used).map(|w| self.state_word(w)).collect();
        let state = RefWindow {
            r: refs.state,
            slices: vec![Slice::Full, Slice::Full],
        };
        let row = RefWindow {
            r: refs.flags,
            slices: vec![
                Slice::Dynamic {
                    start: step,
                    len: 1,
                },
                Slice::Full,
            ],
        };
        self.copy(row.clone(), state.clone());
        for (w, v) in words.into_iter().enumerate() {
            self.set_state_word(w, v);
        }
        self.copy(state, row);
    }

    /// A copy from `src` to `dst`, waited at once.
    fn copy(&mut self, src: RefWindow, dst: RefWindow) {
        let sem = SemRef {
            sem: self.g.refs.sem,
            index: vec![],
        };
        for op in [
            Op::DmaStart {
                src: src.clone(),
                dst: dst.clone(),
                sem: sem.clone(),
                remote: None,
            },
            Op::DmaWait { src, dst, sem },
        ] {
            self.insts.push(Inst {
                op,
                results: vec![],
                loc: self.loc,
            });
        }
    }
}

impl Guards<'_> {
    /// Guards the block index map `map` of operand `i`, which reads run-time data: each
    /// block index not proven in range is clamped to block 0 inside the map (so the
    /// pipeline never copies past the array), and checked in the body: the map's scalar
    /// code again at the step's grid ids, its failures recorded as the body's are. Returns
    /// the guarded map and the body's instructions (placed first in the body).
    fn index_map(&mut self, k: &Kernel, i: usize, map: Region) -> (Region, Vec<Inst>) {
        let o = k.operand(RefId(i as u32));
        let Some(block) = &o.block else {
            return (map, Vec::new());
        };
        let mut ranges = Ranges::new(k);
        for (axis, &p) in map.params.iter().enumerate() {
            ranges.of.insert(p, (0, k.grid[axis] as i64 - 1));
        }
        ranges.region(&map);
        let Region {
            params,
            mut insts,
            yields,
        } = map;
        let mut guarded = Vec::with_capacity(yields.len());
        let mut checks = Vec::new();
        let mut clamps = Vec::new();
        for (d, &y) in yields.iter().enumerate() {
            let max = match block.block_shape[d] {
                BlockDim::Sized(n) => o.array_shape[d].div_ceil(n.max(1)) as i64 - 1,
                BlockDim::Squeezed => o.array_shape[d] as i64 - 1,
            };
            let r = ranges.get(y);
            if r.0 >= 0 && r.1 <= max {
                self.proven += 1;
                guarded.push(y);
            } else if self.unchecked.contains(&y) {
                self.unchecked_uses += 1;
                guarded.push(y);
            } else {
                let mut e = Emit {
                    g: self,
                    insts: Vec::new(),
                    loc: o.loc,
                };
                let ok = e.within(y, 0, max);
                let zero = e.int(0);
                guarded.push(e.select(ok, y, zero));
                clamps.append(&mut e.insts);
                checks.push((d, y, max));
            }
        }
        let report = self.report_index_map(o, &params, &insts, &checks);
        insts.append(&mut clamps);
        let map = Region {
            params,
            insts,
            yields: guarded,
        };
        (map, report)
    }

    /// The body's checks of an index map's block indices `checks` (`(dim, value, max)`):
    /// the map's scalar code cloned at the step's grid ids (none where the map holds other
    /// code: then the clamp stands alone).
    fn report_index_map(
        &mut self,
        o: &Operand,
        params: &[ValueId],
        insts: &[Inst],
        checks: &[(usize, ValueId, i64)],
    ) -> Vec<Inst> {
        if checks.is_empty() {
            return Vec::new();
        }
        let mut e = Emit {
            g: self,
            insts: Vec::new(),
            loc: o.loc,
        };
        let mut at: HashMap<ValueId, ValueId> = HashMap::new();
        for (axis, &p) in params.iter().enumerate() {
            let id = e.op(Op::ProgramId { axis }, ValueType::scalar(DType::I32));
            at.insert(p, id);
        }
        let v = |at: &HashMap<ValueId, ValueId>, x: ValueId| at.get(&x).copied();
        for inst in insts {
            let op = match &inst.op {
                Op::Constant { .. } | Op::ProgramId { .. } | Op::NumPrograms { .. } => {
                    Some(inst.op.clone())
                }
                Op::LoadScalar { src, indices } => indices
                    .iter()
                    .map(|&x| v(&at, x))
                    .collect::<Option<Vec<_>>>()
                    .map(|indices| Op::LoadScalar { src: *src, indices }),
                Op::Binary { op, lhs, rhs } => v(&at, *lhs)
                    .zip(v(&at, *rhs))
                    .map(|(lhs, rhs)| Op::Binary { op: *op, lhs, rhs }),
                Op::Compare { op, lhs, rhs } => v(&at, *lhs)
                    .zip(v(&at, *rhs))
                    .map(|(lhs, rhs)| Op::Compare { op: *op, lhs, rhs }),
                Op::Unary { op, x } => v(&at, *x).map(|x| Op::Unary { op: *op, x }),
                Op::Cast { x, to } => v(&at, *x).map(|x| Op::Cast { x, to: *to }),
                Op::Select {
                    cond,
                    on_true,
                    on_false,
                } => match (v(&at, *cond), v(&at, *on_true), v(&at, *on_false)) {
                    (Some(cond), Some(on_true), Some(on_false)) => Some(Op::Select {
                        cond,
                        on_true,
                        on_false,
                    }),
                    _ => None,
                },
                _ => None,
            };
            let ([result], Some(op)) = (&inst.results[..], op) else {
                // Code the clone does not take: the clamp in the map stands alone.
                return Vec::new();
            };
            let ty = e.g.types[result.index()].clone();
            let cloned = e.op(op, ty);
            at.insert(*result, cloned);
        }
        for &(d, y, max) in checks {
            let Some(&y) = at.get(&y) else { continue };
            let ok = e.within(y, 0, max);
            let site = e.g.site(
                o.loc,
                CheckKind::Index {
                    what: format!(
                        "the block index of `{}` along dim {d} (its index map)",
                        o.name
                    ),
                    max,
                },
            );
            e.report_unless(ok, site, &[y]);
        }
        e.insts
    }

    /// Frames a grid step's guarded `body`: the check state cleared first (SMEM scratch
    /// keeps the step before's), written to the flags last where a check failed.
    fn frame_step(&mut self, body: &mut Region, loc: Loc) {
        let mut e = Emit {
            g: self,
            insts: Vec::new(),
            loc,
        };
        // The words the checks use (the number and their values; a word is read only with
        // the number, but a load of one another step stored is a cross-step read).
        let used = e.g.words_used;
        let zero = e.int(0);
        for word in 0..used {
            e.set_state_word(word, zero);
        }
        let prologue = std::mem::take(&mut e.insts);
        e.write_failures();
        let epilogue = e.insts;
        body.insts.splice(0..0, prologue);
        body.insts.extend(epilogue);
    }

    /// Stores the region's copy of the check state where its records changed it, and
    /// forgets it (a nested region, or the code after this region, loads its own).
    fn flush_state(&mut self, loc: Loc) -> Vec<Inst> {
        let state = std::mem::take(&mut self.state);
        if !std::mem::take(&mut self.state_changed) {
            return Vec::new();
        }
        let mut e = Emit {
            g: self,
            insts: Vec::new(),
            loc,
        };
        for (word, v) in state.into_iter().enumerate() {
            e.set_state_word(word, v);
        }
        e.insts
    }

    fn site(&mut self, loc: Loc, kind: CheckKind) -> usize {
        self.sites.push(CheckSite { loc, kind });
        self.sites.len() - 1
    }

    fn region(&mut self, k: &Kernel, region: Region) -> Region {
        let Region {
            params,
            insts,
            yields,
        } = region;
        let mut out = Vec::with_capacity(insts.len());
        self.checked.push(HashMap::new());
        self.reported.push(HashMap::new());
        for mut inst in insts {
            let loc = inst.loc;
            let mut e = Emit {
                g: &mut *self,
                insts: Vec::new(),
                loc,
            };
            // Guards before the access.
            let reports = !matches!(inst.op, Op::DmaWait { .. });
            let mut safe = HashMap::new();
            for u in index_uses(k, &inst.op) {
                if safe.contains_key(&u.value) {
                    continue;
                }
                // Checked already by an access that dominates this one: its clamped value.
                let earlier =
                    e.g.checked
                        .iter()
                        .rev()
                        .find_map(|m| m.get(&(u.value, u.max)));
                if let Some(&clamped) = earlier {
                    safe.insert(u.value, clamped);
                    continue;
                }
                if e.g.unchecked.contains(&u.value) {
                    e.g.unchecked_uses += 1;
                    continue;
                }
                let r = e.g.ranges.get(u.value);
                if r.0 >= 0 && r.1 <= u.max {
                    e.g.proven += 1;
                    continue;
                }
                // An author's `debug_check` before it reports the value outside a range
                // within the bound: its condition guards the access and its report stands
                // for this one.
                let reported = e.g.reported.iter().rev().find_map(|m| m.get(&u.value));
                let author_cond = reported
                    .filter(|(r, _)| r.0 >= 0 && r.1 <= u.max)
                    .map(|&(_, cond)| cond);
                let ok = match author_cond {
                    Some(cond) => cond,
                    None => e.within(u.value, 0, u.max),
                };
                if reports && author_cond.is_none() {
                    let site = e.g.site(
                        loc,
                        CheckKind::Index {
                            what: u.what,
                            max: u.max,
                        },
                    );
                    e.report_unless(ok, site, &[u.value]);
                }
                let zero = e.int(0);
                let clamped = e.select(ok, u.value, zero);
                safe.insert(u.value, clamped);
                if let Some(m) = e.g.checked.last_mut() {
                    m.insert((u.value, u.max), clamped);
                }
            }
            replace_indices(&mut inst.op, &safe);
            if let Op::DebugCheck { cond, message } = &inst.op {
                let compared = e.g.ranges.compared(*cond);
                let site = e.g.site(
                    loc,
                    CheckKind::Author {
                        message: message.clone(),
                        compared: compared.len(),
                    },
                );
                e.report_unless(*cond, site, &compared);
                let implied = e.g.ranges.implied(*cond);
                if let Some(m) = e.g.reported.last_mut() {
                    m.extend(implied.into_iter().map(|(v, r)| (v, (r, *cond))));
                }
            }
            let mut pre = e.insts;
            // Nested regions, and the ranges this instruction defines. The nested regions
            // start without this region's copy of the check state; where they record
            // checks, the copy is stored before them (and loaded again after).
            let outer_state = std::mem::take(&mut self.state);
            let outer_changed = std::mem::take(&mut self.state_changed);
            let sites_before = self.sites.len();
            inst.op = self.nested(k, inst.op, &inst.results);
            self.state = outer_state;
            self.state_changed = outer_changed;
            if self.sites.len() > sites_before {
                pre.extend(self.flush_state(loc));
            }
            if inst.op.regions().is_empty() {
                self.ranges.leaf(&inst);
            }
            let overflow = self.overflow_check(&inst);
            out.append(&mut pre);
            out.push(inst);
            out.extend(overflow);
        }
        out.extend(self.flush_state(Loc::internal()));
        self.checked.pop();
        self.reported.pop();
        Region {
            params,
            insts: out,
            yields,
        }
    }

    /// `op` with its regions guarded, walked with the ranges that hold inside them.
    fn nested(&mut self, k: &Kernel, op: Op, results: &[ValueId]) -> Op {
        match op {
            Op::When {
                cond,
                then,
                otherwise,
            } => {
                let saved = self.ranges.enter_when(cond);
                let then = self.region(k, then);
                self.ranges.leave_when(saved);
                Op::When {
                    cond,
                    then,
                    otherwise: self.region(k, otherwise),
                }
            }
            Op::ForLoop { lo, hi, init, body } => {
                // The carried values' ranges first (the body analysed to a fixed point), then
                // the body walked once more with them.
                self.ranges.for_loop(lo, hi, &init, &body, results);
                Op::ForLoop {
                    lo,
                    hi,
                    init,
                    body: self.region(k, body),
                }
            }
            Op::Scoped { allocs, body } => Op::Scoped {
                allocs,
                body: self.region(k, body),
            },
            op => op,
        }
    }

    /// After `lhs op rhs` that may leave i32 and feeds an index or loop bound: the check.
    fn overflow_check(&mut self, inst: &Inst) -> Vec<Inst> {
        let Op::Binary { op, lhs, rhs } = inst.op else {
            return vec![];
        };
        let [result] = inst.results[..] else {
            return vec![];
        };
        if !self.ranges.may_wrap.contains(&result)
            || !self.feeding.contains(&result)
            || !matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul)
        {
            return vec![];
        }
        let (a, b) = (self.ranges.get(lhs), self.ranges.get(rhs));
        let mut e = Emit {
            g: self,
            insts: Vec::new(),
            loc: inst.loc,
        };
        let (min, max) = I32_RANGE;
        let ok = match (op, b) {
            // With a constant operand (the usual `length + 15`, `i * 8`): comparisons.
            (BinaryOp::Add, (c, c2)) if c == c2 && c >= 0 => e.cmp_int(CmpOp::Le, lhs, max - c),
            (BinaryOp::Add, (c, c2)) if c == c2 => e.cmp_int(CmpOp::Ge, lhs, min - c),
            (BinaryOp::Sub, (c, c2)) if c == c2 && c >= 0 => e.cmp_int(CmpOp::Ge, lhs, min + c),
            (BinaryOp::Sub, (c, c2)) if c == c2 => e.cmp_int(CmpOp::Le, lhs, max + c),
            (BinaryOp::Mul, (c, c2)) if c == c2 && c > 0 => e.within(lhs, min / c, max / c),
            _ if a.0 == a.1 && op != BinaryOp::Sub && a.0 > 0 => match op {
                BinaryOp::Add => e.cmp_int(CmpOp::Le, rhs, max - a.0),
                _ => e.within(rhs, min / a.0, max / a.0),
            },
            (BinaryOp::Add | BinaryOp::Sub, _) => {
                // Two's complement: a + b wraps iff a and b agree in sign and the result
                // does not (`(a ^ r) & (b ^ r) < 0`); a - b iff they differ and the result
                // differs from a (`(a ^ b) & (a ^ r) < 0`).
                let i32t = DType::I32;
                let ar = e.bin(BinaryOp::Xor, lhs, result, i32t);
                let other = if op == BinaryOp::Add {
                    e.bin(BinaryOp::Xor, rhs, result, i32t)
                } else {
                    e.bin(BinaryOp::Xor, lhs, rhs, i32t)
                };
                let both = e.bin(BinaryOp::And, ar, other, i32t);
                e.cmp_int(CmpOp::Ge, both, 0)
            }
            _ => {
                // a * b wraps iff a != 0 and r / a != b, or a == -1 and b == MIN (the
                // division by a safe divisor: 1 where a is 0 or -1).
                let i32t = DType::I32;
                let zero_or_minus_one = e.within(lhs, -1, 0);
                let one = e.int(1);
                let divisor = e.select(zero_or_minus_one, one, lhs);
                let back = e.bin(BinaryOp::Div, result, divisor, i32t);
                let exact = e.cmp(CmpOp::Eq, back, rhs);
                let b_min = e.cmp_int(CmpOp::Eq, rhs, min);
                let minus_one = e.cmp_int(CmpOp::Eq, lhs, -1);
                let wraps_minus_one = e.bin(BinaryOp::And, minus_one, b_min, DType::Bool);
                let not_wrapping_minus_one = e.op(
                    Op::Unary {
                        op: UnaryOp::Not,
                        x: wraps_minus_one,
                    },
                    ValueType::scalar(DType::Bool),
                );
                let ok_division = e.bin(BinaryOp::Or, zero_or_minus_one, exact, DType::Bool);
                e.bin(
                    BinaryOp::And,
                    ok_division,
                    not_wrapping_minus_one,
                    DType::Bool,
                )
            }
        };
        let symbol = match op {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            _ => "*",
        };
        let site = e.g.site(inst.loc, CheckKind::Overflow { op: symbol });
        e.report_unless(ok, site, &[lhs, rhs]);
        e.insts
    }
}

/// Takes the check flags out of a run's `outputs` (the last output of a kernel with checks)
/// and, where a check failed, returns the error for the first failed grid step: the kernel,
/// the check, its values and bound, the kernel line and the step. A kernel without checks
/// leaves `outputs` as they are.
pub fn take_failure(k: &Kernel, outputs: &mut Vec<HostArray>) -> Result<(), KernelError> {
    let Some(checks) = k.checks.flags else {
        return Ok(());
    };
    let position = k
        .operands_with(OperandRole::Output)
        .position(|(r, _)| r == checks.flags);
    let Some(flags) = position
        .filter(|&p| p < outputs.len())
        .map(|p| outputs.remove(p))
    else {
        return Err(KernelError::single(
            &k.name,
            ProblemKind::Run,
            "check flags",
            "the run returned no check flags (a tessera bug; please report it)",
        ));
    };
    failure(k, &flags)
}

/// The error of the first failed row of `flags` (see [`take_failure`]).
pub fn failure(k: &Kernel, flags: &HostArray) -> Result<(), KernelError> {
    let checks = &k.checks;
    let want = checks.flags.map(|f| k.operand(f.flags).array_shape.clone());
    if want.as_deref() != Some(flags.shape()) || flags.dtype() != DType::I32 {
        let want = match want {
            Some(shape) => format!("i32{shape:?}"),
            None => "none: it makes no run-time checks".into(),
        };
        return Err(KernelError::single(
            &k.name,
            ProblemKind::Run,
            "check flags",
            format!(
                "the check flags given are {}{:?}; the kernel's are {want} (pass the flags \
                 output of this kernel's call)",
                flags.dtype().name(),
                flags.shape()
            ),
        ));
    }
    let words: Vec<i64> = flags.to_f64_vec().iter().map(|&w| w as i64).collect();
    for (step, row) in words.chunks(FLAG_WORDS).enumerate() {
        if row[0] == 0 {
            continue;
        }
        let site = usize::try_from(row[0] - 1)
            .ok()
            .and_then(|s| checks.sites.get(s));
        let Some(site) = site else {
            return Err(KernelError::single(
                &k.name,
                ProblemKind::Run,
                "check flags",
                format!(
                    "grid step {step} reports check {} of {} (a tessera bug)",
                    row[0],
                    checks.sites.len()
                ),
            ));
        };
        let at = grid_step(&k.grid, step);
        let message = match &site.kind {
            CheckKind::Index { what, max } => format!(
                "{what} is {} at grid step {at}, outside 0 to {max}; the access was not made \
                 and the outputs were discarded (check the run-time data it comes from, or mark \
                 an index proven with `unchecked_index`)",
                row[1]
            ),
            CheckKind::Overflow { op } => format!(
                "{} {op} {} overflows i32 at grid step {at}, and the result feeds an index or a \
                 loop bound; the outputs were discarded (check the run-time data it comes from)",
                row[1], row[2]
            ),
            CheckKind::Author { message, compared } => {
                let values: Vec<String> =
                    row[1..=*compared].iter().map(|v| v.to_string()).collect();
                let values = match values.len() {
                    0 => String::new(),
                    1 => format!(" (the value it compares: {})", values[0]),
                    _ => format!(" (the values it compares: {})", values.join(", ")),
                };
                format!(
                    "debug_check failed at grid step {at}: {message}{values}; the outputs were \
                     discarded"
                )
            }
        };
        return Err(KernelError::new(
            &k.name,
            vec![Problem {
                kind: ProblemKind::Run,
                subject: "run-time check".into(),
                message,
                loc: Some(site.loc),
            }],
        ));
    }
    Ok(())
}

/// `[i, j, ..]`: the program ids of row-major step `step` of `grid` (as the interpreter
/// names a step).
fn grid_step(grid: &[usize], mut step: usize) -> String {
    let mut ids = vec![0; grid.len()];
    for (d, &n) in grid.iter().enumerate().rev() {
        ids[d] = step % n.max(1);
        step /= n.max(1);
    }
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    format!("[{}]", ids.join(", "))
}

/// The zeros the flags start from, for a kernel with checks.
pub fn flags_init(k: &Kernel) -> Option<HostArray> {
    let o = k.operand(k.checks.flags?.init);
    HostArray::from_f64(
        DType::I32,
        o.array_shape.clone(),
        &vec![0.0; o.array_shape.iter().product()],
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_combine_by_interval_arithmetic() {
        assert_eq!(binary(BinaryOp::Rem, (0, 99), (2, 2)), Some((0, 1)));
        assert_eq!(binary(BinaryOp::Rem, (-5, 3), (4, 4)), Some((-3, 3)));
        assert_eq!(binary(BinaryOp::Mul, (0, 7), (8, 8)), Some((0, 56)));
        assert_eq!(binary(BinaryOp::Div, (-7, 7), (2, 2)), Some((-3, 3)));
        assert_eq!(binary(BinaryOp::Div, (0, 7), (-1, 1)), None);
        assert_eq!(binary(BinaryOp::Min, (0, 70), (0, 9)), Some((0, 9)));
        assert_eq!(binary(BinaryOp::Xor, (0, 7), (0, 7)), None);
        assert_eq!(
            binary(BinaryOp::Add, I32_RANGE, (15, 15)).map(within_i32),
            Some(false)
        );
    }

    #[test]
    fn grid_steps_are_row_major() {
        assert_eq!(grid_step(&[4, 8], 0), "[0, 0]");
        assert_eq!(grid_step(&[4, 8], 13), "[1, 5]");
        assert_eq!(grid_step(&[3], 2), "[2]");
    }
}
