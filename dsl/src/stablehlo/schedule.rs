//! The loop nest a kernel's grid becomes: one counted loop per looped grid dim (outermost
//! first), each block fetched and written back at the outermost loop level where its block
//! index can change, and `when`s that select the first or last step of the innermost loops
//! hoisted out of those loops.
//!
//! Levels: level `L` is the point inside the loops over dims `..L` (all grid indices before
//! `L` known) and before the loop over dim `L`; level `nb` (the first looped dim) is before
//! every loop and level `n` (the grid's rank) is one grid step. An operand whose index map
//! depends on looped dims `D` lives at level `max(D) + 1` (`nb` when `D` is empty): its block
//! index cannot change inside the loops below that level.
//!
//! This is exact with respect to the interpreter (the TPU pipeline): an input block is the
//! same window whenever its index is the same, so fetching it once per level is fetching it
//! at every step; an output block is written back, and a fresh (garbage) buffer taken, when
//! its index changes, which at its level is at every iteration when the index map passes the
//! innermost grid index it depends on straight through (consecutive indices differ, and so do
//! the last and the first on a wrap), and is checked at run time otherwise.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::ir::{BinaryOp, CmpOp, Kernel, Literal, Op, OperandRole, RefId, Region, ValueId};

use super::plan::dependents;

/// Where each operand's block and each hoisted `when` goes in the loop nest.
#[derive(Debug, Clone, Default)]
pub(crate) struct Schedule {
    /// The level of every blocked operand (see the module docs).
    pub level: HashMap<RefId, usize>,
    /// Outputs whose block index may repeat across iterations at their level: they compare
    /// the index with the previous one and take a fresh buffer only when it changed.
    pub tracked: BTreeSet<RefId>,
    /// Top-level body `when`s run once before the loop over their level's dim (their
    /// condition says "the first step of every loop from this level in"), in body order.
    pub first: Vec<Hoisted>,
    /// Top-level body `when`s run once after the loop over their level's dim (the last step
    /// of every loop from this level in), in body order.
    pub last: Vec<Hoisted>,
    /// Top-level body values computed without touching a block: what hoisted `when`s may
    /// use from outside, recomputed where they run.
    pub pure: HashSet<ValueId>,
    /// Inputs of the innermost level that the body reads only inside top-level `when`s:
    /// sliced inside the `when`s that read them, so a step that computes nothing (a skipped
    /// block) fetches nothing.
    pub deferred: BTreeSet<RefId>,
}

/// A body `when` that runs at a loop level instead of at every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hoisted {
    /// Its index among the body's top-level instructions.
    pub inst: usize,
    /// The level it runs at: before (or after) the loop over this grid dim.
    pub level: usize,
}

impl Schedule {
    /// Whether body instruction `i` runs outside the loops instead of at every step.
    pub fn hoisted(&self, i: usize) -> bool {
        self.first.iter().chain(&self.last).any(|h| h.inst == i)
    }
}

/// The schedule of `k` whose first `nb` grid dims are vectorised (not looped).
pub(crate) fn schedule(k: &Kernel, nb: usize) -> Schedule {
    let n = k.grid.len();
    let looped = |d: usize| d >= nb && k.grid[d] > 1;
    let mut s = Schedule::default();
    // An input an output aliases is read from the output's values at every step: what
    // earlier steps wrote back ([`crate::rules::ALIASED_READ_DISTANCE`]).
    let read_through: BTreeSet<RefId> = k
        .operands_with(OperandRole::Output)
        .filter_map(|(_, o)| o.aliases)
        .collect();
    for (i, o) in k.operands.iter().enumerate() {
        let Some(b) = &o.block else { continue };
        let r = RefId(i as u32);
        if read_through.contains(&r) {
            s.level.insert(r, n);
            continue;
        }
        let map = &b.index_map;
        let deps: Vec<usize> = (0..n)
            .filter(|&d| looped(d))
            .filter(|&d| {
                let dep = dependents(map, &map.params[d..=d]);
                map.yields.iter().any(|y| dep.contains(y))
            })
            .collect();
        let level = deps.last().map_or(nb, |&d| d + 1);
        s.level.insert(r, level);
        if o.role == OperandRole::Output {
            if let Some(&d) = deps.last() {
                if !map.yields.contains(&map.params[d]) {
                    s.tracked.insert(r);
                }
            }
        }
    }
    let mut read_outside_whens = BTreeSet::new();
    for inst in &k.body.insts {
        match &inst.op {
            Op::When { .. } => {}
            Op::Load { src, .. } => {
                read_outside_whens.insert(*src);
            }
            op => {
                for r in op.regions() {
                    read_outside_whens.extend(refs_touched(r));
                }
            }
        }
    }
    s.deferred = s
        .level
        .iter()
        .filter(|&(r, &l)| {
            l == n && k.operand(*r).role == OperandRole::Input && !read_outside_whens.contains(r)
        })
        .map(|(r, _)| *r)
        .collect();
    s.pure = pure_values(&k.body);
    let hoister = Hoister {
        k,
        nb,
        level: &s.level,
        pure: &s.pure,
        defs: definitions(&k.body),
    };
    let (first, last) = hoister.hoist();
    s.first = first;
    s.last = last;
    s
}

/// Values of the top-level body computed without touching a block (no loads, stores or
/// nested regions), from other such values: what a hoisted `when` may use from outside.
fn pure_values(body: &Region) -> HashSet<ValueId> {
    let mut pure = HashSet::new();
    for inst in &body.insts {
        let touches_blocks = matches!(
            inst.op,
            Op::Load { .. }
                | Op::Store { .. }
                | Op::StoreScalar { .. }
                | Op::When { .. }
                | Op::ForLoop { .. }
        );
        if !touches_blocks && inst.op.operands().iter().all(|v| pure.contains(v)) {
            pure.extend(inst.results.iter().copied());
        }
    }
    pure
}

fn definitions(body: &Region) -> HashMap<ValueId, &Op> {
    body.insts
        .iter()
        .flat_map(|inst| inst.results.iter().map(move |&v| (v, &inst.op)))
        .collect()
}

/// Which end of the loops a hoisted `when` selects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    First,
    Last,
}

struct Hoister<'a> {
    k: &'a Kernel,
    nb: usize,
    level: &'a HashMap<RefId, usize>,
    pure: &'a HashSet<ValueId>,
    defs: HashMap<ValueId, &'a Op>,
}

impl Hoister<'_> {
    /// The first-step and the last-step `when`s that can leave the loops.
    fn hoist(&self) -> (Vec<Hoisted>, Vec<Hoisted>) {
        let insts = &self.k.body.insts;
        let is_pure = |i: usize| insts[i].results.iter().all(|r| self.pure.contains(r));
        // First-step `when`s: a prefix of the body (pure instructions between them), outer
        // loops before inner ones so the order of their effects is kept.
        let mut first = Vec::new();
        let mut outer = self.nb;
        for (i, inst) in insts.iter().enumerate() {
            if let Some(d0) = self.hoistable(inst, End::First).filter(|&d0| d0 >= outer) {
                first.push(Hoisted { inst: i, level: d0 });
                outer = d0;
            } else if !is_pure(i) || insts[i].results.is_empty() {
                break;
            }
        }
        // Last-step `when`s: a suffix of the body, inner loops' before outer ones.
        let mut inner = self.nb;
        let mut last = Vec::new();
        for (i, inst) in insts.iter().enumerate().rev() {
            if first.iter().any(|h| h.inst == i) {
                break;
            }
            if let Some(d0) = self.hoistable(inst, End::Last).filter(|&d0| d0 >= inner) {
                last.push(Hoisted { inst: i, level: d0 });
                inner = d0;
            } else if !is_pure(i) || insts[i].results.is_empty() {
                break;
            }
        }
        last.reverse();
        (first, last)
    }

    /// The loop level `d0` a top-level `when` can run at instead of inside the loops: its
    /// condition selects exactly the first (last) step of every looped dim from `d0` in, and
    /// it touches only blocks that stay put across those loops.
    fn hoistable(&self, inst: &crate::ir::Inst, end: End) -> Option<usize> {
        // A `when` with an `else` runs at every step (one of its branches does).
        let Op::When {
            cond,
            then,
            otherwise,
        } = &inst.op
        else {
            return None;
        };
        if !otherwise.insts.is_empty() {
            return None;
        }
        let dims = self.end_dims(*cond, end)?;
        let d0 = *dims.iter().next()?;
        let n = self.k.grid.len();
        if d0 < self.nb || (d0..n).any(|d| !dims.contains(&d) && self.k.grid[d] > 1) {
            return None;
        }
        let (defined, used) = region_values(then);
        if used
            .iter()
            .any(|v| !defined.contains(v) && !self.pure.contains(v))
        {
            return None;
        }
        let stays = |r: &RefId| match self.k.operand(*r).role {
            OperandRole::Scratch | OperandRole::ScalarPrefetch => true,
            OperandRole::Input | OperandRole::Output => self.level[r] <= d0,
        };
        refs_touched(then).iter().all(stays).then_some(d0)
    }

    /// The grid dims whose first (last) index `cond` requires, when it is a conjunction of
    /// `program_id(d) == 0` (`== num_programs(d) - 1`) on looped dims.
    fn end_dims(&self, cond: ValueId, end: End) -> Option<BTreeSet<usize>> {
        match self.defs.get(&cond)? {
            Op::Binary {
                op: BinaryOp::And,
                lhs,
                rhs,
            } => {
                let mut a = self.end_dims(*lhs, end)?;
                a.extend(self.end_dims(*rhs, end)?);
                Some(a)
            }
            Op::Compare {
                op: CmpOp::Eq,
                lhs,
                rhs,
            } => {
                let (axis, other) = match (self.defs.get(lhs)?, self.defs.get(rhs)?) {
                    (Op::ProgramId { axis }, _) => (*axis, *rhs),
                    (_, Op::ProgramId { axis }) => (*axis, *lhs),
                    _ => return None,
                };
                let want = match end {
                    End::First => 0,
                    End::Last => self.k.grid[axis] as i64 - 1,
                };
                (self.constant(other)? == want).then(|| BTreeSet::from([axis]))
            }
            _ => None,
        }
    }

    /// The value of a scalar integer computed from constants and grid sizes.
    fn constant(&self, v: ValueId) -> Option<i64> {
        match self.defs.get(&v)? {
            Op::Constant {
                value: Literal::Int(x),
                ty,
            } if ty.is_scalar() => Some(*x),
            Op::NumPrograms { axis } => Some(self.k.grid[*axis] as i64),
            Op::Binary { op, lhs, rhs } => {
                let (a, b) = (self.constant(*lhs)?, self.constant(*rhs)?);
                match op {
                    BinaryOp::Add => a.checked_add(b),
                    BinaryOp::Sub => a.checked_sub(b),
                    BinaryOp::Mul => a.checked_mul(b),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// Values defined inside `r` (params and results, nested too) and values its ops use.
fn region_values(r: &Region) -> (HashSet<ValueId>, HashSet<ValueId>) {
    let mut defined: HashSet<ValueId> = r.params.iter().copied().collect();
    let mut used: HashSet<ValueId> = r.yields.iter().copied().collect();
    for inst in &r.insts {
        defined.extend(inst.results.iter().copied());
        used.extend(inst.op.operands());
        for nested in inst.op.regions() {
            let (d, u) = region_values(nested);
            defined.extend(d);
            used.extend(u);
        }
    }
    (defined, used)
}

/// Refs loaded or stored anywhere inside `r`.
fn refs_touched(r: &Region) -> BTreeSet<RefId> {
    let mut out = BTreeSet::new();
    for inst in &r.insts {
        match &inst.op {
            Op::Load { src, .. } | Op::LoadScalar { src, .. } => {
                out.insert(*src);
            }
            Op::Store { dst, .. } | Op::StoreScalar { dst, .. } => {
                out.insert(*dst);
            }
            _ => {}
        }
        for nested in inst.op.regions() {
            out.extend(refs_touched(nested));
        }
    }
    out
}
