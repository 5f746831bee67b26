//! Reverse-mode autodiff through counted loops (the `stablehlo.while` of
//! [`FuncBuilder::scan`] and of [`FuncBuilder::fori_loop`] with constant bounds).
//!
//! A loop is *counted* when one carried value is an `i32` counter that starts at a constant,
//! the condition is `counter < bound` with a constant bound (in the condition, outside the
//! loop, or a carried value the body passes through unchanged), and the body's next counter
//! is `counter + 1`. Its trip count `N` is then known when the program is built.
//!
//! Forward: the loop is rewritten in place to also carry one `[N, ...]` buffer per carried
//! value the backward needs, written with `dynamic_update_slice` at the iteration index
//! before the body runs (the value entering each iteration). Not saved: the counter
//! (recomputed), carried values the body passes through unchanged (their initial value
//! serves), and buffers the body only writes with `dynamic_update_slice` (e.g. a scan's
//! stacked outputs: their backward needs no value). The forward thus holds `N` copies of the
//! carry; of the values inside the body, only those marked with
//! [`FuncBuilder::keep_for_backward`] are saved (one more `[N, ...]` buffer each).
//!
//! Backward: a scan over the iterations in reverse whose body reads the saved carry of the
//! iteration, re-runs a copy of the loop body on it and differentiates that copy with the
//! ordinary rules (a nested counted loop is handled the same way). In the copy, the ops that
//! read a kept value read its saved row, and so do the rules; the copy's own op computing it
//! still passes the cotangent on (the saved row and the copy are one value for the reverse
//! sweep), and pruning removes it and what only fed it once nothing reads its result. The
//! backward carries the carry's cotangent and one accumulator per value the loop body reads
//! from outside that carries a cotangent (e.g. stacked weights); a cotangent that is a zero
//! array with one window written (`dynamic_slice`'s rule) is added into the accumulator's
//! window only, so reading layer `i` of a `[L, ...]` stack costs one layer per iteration,
//! not the whole stack.

use std::collections::{HashMap, HashSet};

use crate::builder::FuncBuilder;
use crate::ops::{BinaryOp, ComparisonDirection, Op, OpKind, Region, Value};
use crate::{ArrayData, DType, HloError};

use super::{autodiff_error, outer_reads};

const WHILE: &str = "stablehlo.while";

/// How the backward gets a carried value's value at an iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// The counter: `lower + i`.
    Counter,
    /// Passed through unchanged: the loop's initial value.
    Invariant,
    /// Saved: slice `i` of the loop's extra result `#n + index`.
    Saved(usize),
    /// Only written by `dynamic_update_slice`: its value is never read, zeros stand in.
    WriteOnly,
}

/// A counted loop autodiff has rewritten to save its carries (keyed in the builder by the
/// loop's first result).
#[derive(Debug, Clone)]
pub(crate) struct SavedLoop {
    /// The counter's initial value.
    lower: i32,
    /// The number of iterations.
    trips: i32,
    /// One per carried value of the loop as built.
    carries: Vec<Carry>,
    /// The values of the rewritten loop's body marked with
    /// [`FuncBuilder::keep_for_backward`], each with the index of the loop result that
    /// holds it stacked over the iterations.
    kept: Vec<(Value, usize)>,
}

/// The counter, its initial value and the trip count of a counted loop, or why it is not one.
fn counted(f: &FuncBuilder<'_>, op: &Op) -> Result<(usize, i32, i32), String> {
    let [cond, body] = &op.regions[..] else {
        return Err("it does not have a condition and a body".into());
    };
    let local = |r: &Region, v: Value| r.ops.iter().find(|o| o.results.contains(&v)).cloned();
    let constant = |r: &Region, v: Value| -> Option<i32> {
        let def = local(r, v).or_else(|| f.defining_op(v).cloned())?;
        match &def.kind {
            OpKind::Constant(lit) if lit.dims().is_empty() => match lit.values() {
                ArrayData::I32(x) => x.first().copied(),
                _ => None,
            },
            _ => None,
        }
    };
    let test = cond
        .results
        .first()
        .and_then(|&c| local(cond, c))
        .ok_or("its condition is not computed inside it")?;
    let (OpKind::Compare { direction, .. }, &[lhs, rhs]) = (&test.kind, &test.operands[..]) else {
        return Err("its condition is not a comparison `counter < bound`".into());
    };
    if *direction != ComparisonDirection::Lt {
        return Err(format!(
            "its condition compares with {direction:?}, not `counter < bound`"
        ));
    }
    let counter = cond
        .args
        .iter()
        .position(|&a| a == lhs)
        .ok_or("the left side of its condition is not a carried value")?;
    let upper = match cond.args.iter().position(|&a| a == rhs) {
        Some(j) if body.results.get(j) == body.args.get(j) => constant(cond, op.operands[j]),
        Some(_) => None,
        None => constant(cond, rhs),
    }
    .ok_or("its bound is not an i32 constant (a run-time bound has no trip count to save)")?;
    let lower = constant(cond, op.operands[counter])
        .ok_or("its counter does not start at an i32 constant")?;
    let next = local(body, body.results[counter]);
    let steps_by_one = next.is_some_and(|n| {
        n.kind == OpKind::Binary(BinaryOp::Add)
            && match n.operands[..] {
                [a, b] => {
                    let arg = body.args[counter];
                    (a == arg && constant(body, b) == Some(1))
                        || (b == arg && constant(body, a) == Some(1))
                }
                _ => false,
            }
    });
    if !steps_by_one {
        return Err("its body does not step the counter by `counter + 1`".into());
    }
    let trips = i64::from(upper) - i64::from(lower);
    Ok((counter, lower, trips.clamp(0, i64::from(i32::MAX)) as i32))
}

/// Whether the body only writes carried value `j` with `dynamic_update_slice` (operand 0)
/// and passes the written buffer on as carried value `j`.
fn write_only(body: &Region, j: usize) -> bool {
    let mut buffers: HashSet<Value> = HashSet::from([body.args[j]]);
    for op in &body.ops {
        for (p, v) in op.operands.iter().enumerate() {
            if buffers.contains(v) {
                if op.kind == OpKind::DynamicUpdateSlice && p == 0 {
                    buffers.insert(op.results[0]);
                } else {
                    return false;
                }
            }
        }
        if !op.regions.is_empty()
            && outer_reads(std::slice::from_ref(op))
                .iter()
                .any(|v| buffers.contains(v))
        {
            return false;
        }
    }
    body.results
        .iter()
        .enumerate()
        .all(|(k, r)| k == j || !buffers.contains(r))
}

/// The values `body` reads from outside itself (not its arguments).
fn body_reads(body: &Region) -> Vec<Value> {
    let defined: HashSet<Value> = body
        .ops
        .iter()
        .flat_map(|o| o.results.iter().copied())
        .chain(body.args.iter().copied())
        .collect();
    let mut reads = outer_reads(&body.ops);
    for &r in &body.results {
        if !defined.contains(&r) && !reads.contains(&r) {
            reads.push(r);
        }
    }
    reads.retain(|v| !body.args.contains(v));
    reads
}

/// The error for a `while` autodiff cannot differentiate.
fn not_counted(why: &str) -> HloError {
    autodiff_error(
        WHILE,
        format!(
            "no VJP rule for this loop ({why}); autodiff differentiates counted loops: an i32 \
             counter from a constant, `counter < constant`, `counter + 1` (FuncBuilder::scan, \
             or fori_loop with constant bounds); build other loops inside \
             FuncBuilder::custom_vjp with a VjpRule that emits their backward"
        ),
    )
}

impl FuncBuilder<'_> {
    /// Rewrites the counted loop `frame.ops[index]` in place to save its carries, and records
    /// it in `saved_loops`. Its results keep their values; the saves are extra results.
    pub(super) fn save_loop_carries(&mut self, index: usize) -> Result<(), HloError> {
        let op = self.frame().ops[index].clone();
        let (counter, lower, trips) = counted(self, &op).map_err(|why| not_counted(&why))?;
        let (cond, body) = (op.regions[0].clone(), op.regions[1].clone());
        let n = op.operands.len();
        let mut saved = Vec::new();
        let carries: Vec<Carry> = (0..n)
            .map(|j| {
                if j == counter {
                    Carry::Counter
                } else if body.results[j] == body.args[j] {
                    Carry::Invariant
                } else if write_only(&body, j) {
                    Carry::WriteOnly
                } else {
                    saved.push(j);
                    Carry::Saved(saved.len() - 1)
                }
            })
            .collect();
        // Kept values the body computes itself (not in a nested region).
        let kept: Vec<Value> = body
            .ops
            .iter()
            .flat_map(|o| o.results.iter().copied())
            .filter(|v| self.kept.contains(v))
            .collect();
        let mut record = SavedLoop {
            lower,
            trips,
            carries,
            kept: Vec::new(),
        };
        if trips > 0 && (!saved.is_empty() || !kept.is_empty()) {
            let start = self.frame().ops.len();
            let mut init = op.operands.clone();
            for &j in &saved {
                let t = self.value_type(op.operands[j])?.clone();
                init.push(self.splat(0.0, t.stacked(i64::from(trips)))?);
            }
            for &v in &kept {
                let t = self.value_type(v)?.clone();
                init.push(self.splat(0.0, t.stacked(i64::from(trips)))?);
            }
            let mut kept_copies = Vec::with_capacity(kept.len());
            self.while_loop(
                &init,
                |b, args| -> Result<Value, HloError> { Ok(b.copy_region(&cond, &args[..n])?[0]) },
                |b, args| {
                    let (mut next, copies) =
                        b.copy_region_with(&body, &args[..n], &HashMap::new())?;
                    let i = b.iteration(args[counter], lower)?;
                    for (s, &j) in saved.iter().enumerate() {
                        next.push(b.set_stacked_row(args[n + s], i, args[j])?);
                    }
                    for (k, v) in kept.iter().enumerate() {
                        let copy = copies[v];
                        let buffer = args[n + saved.len() + k];
                        next.push(b.set_stacked_row(buffer, i, copy)?);
                        kept_copies.push((copy, n + saved.len() + k));
                    }
                    Ok(next)
                },
            )?;
            record.kept = kept_copies;
            // The zero buffers and the new loop (last) replace the loop as built, which keeps
            // its result values.
            let frame = self.frame_mut();
            let mut emitted: Vec<Op> = frame.ops.drain(start..).collect();
            let Some(mut rewritten) = emitted.pop() else {
                return Err(not_counted("the rewritten loop was not emitted"));
            };
            rewritten.results[..n].copy_from_slice(&op.results);
            let inserted = emitted.len();
            emitted.push(rewritten);
            frame.ops.splice(index..=index, emitted);
            for span in &mut frame.spans {
                if span.ops.start > index {
                    span.ops.start += inserted;
                }
                if span.ops.end > index {
                    span.ops.end += inserted;
                }
            }
        }
        self.saved_loops.insert(op.results[0], record);
        Ok(())
    }

    /// The cotangents of a saved counted loop's operands and of the values its body reads
    /// from outside, as `(value, cotangent)` pairs (a value may come several times: the
    /// cotangents add up), given its results' cotangents.
    pub(super) fn loop_vjp(
        &mut self,
        op: &Op,
        cts: &[Option<Value>],
        active: &HashSet<Value>,
    ) -> Result<Vec<(Value, Option<Value>)>, HloError> {
        let saved = self
            .saved_loops
            .get(&op.results[0])
            .cloned()
            .ok_or_else(|| not_counted("it was not prepared for autodiff"))?;
        let n = saved.carries.len();
        let float = |f: &Self, v: Value| f.float_type(v).is_some();
        // Carried values whose cotangent flows through the iterations.
        let through: Vec<usize> = (0..n)
            .filter(|&j| {
                matches!(saved.carries[j], Carry::Saved(_) | Carry::WriteOnly)
                    && float(self, op.operands[j])
            })
            .collect();
        // Invariant carried values: the body reads their initial value, whose cotangent is
        // their result's plus what accumulates like that of a value the body captures.
        let invariant: Vec<usize> = (0..n)
            .filter(|&j| saved.carries[j] == Carry::Invariant && active.contains(&op.operands[j]))
            .collect();
        let body = op.regions[1].clone();
        let mut outer: Vec<Value> = Vec::new();
        let captured = body_reads(&body).into_iter().filter(|v| active.contains(v));
        for v in captured.chain(invariant.iter().map(|&j| op.operands[j])) {
            if !outer.contains(&v) {
                outer.push(v);
            }
        }
        let mut out: Vec<(Value, Option<Value>)> = invariant
            .iter()
            .map(|&j| (op.operands[j], cts[j]))
            .collect();
        if saved.trips == 0 {
            out.extend(through.iter().map(|&j| (op.operands[j], cts[j])));
            return Ok(out);
        }
        let mut init = Vec::with_capacity(through.len() + outer.len());
        for &j in &through {
            init.push(match cts[j] {
                Some(ct) => ct,
                None => self.zeros_of(op.operands[j])?,
            });
        }
        for &v in &outer {
            init.push(self.zeros_of(v)?);
        }
        let saves = op.results[n..].to_vec();
        let kept = saved.kept.clone();
        let done = self.scan(saved.trips as usize, &init, &[], |b, r, carry, _| {
            let last = b.scalar(f64::from(saved.trips - 1), DType::I32)?;
            let i = b.sub(last, r)?;
            let mut args = Vec::with_capacity(n);
            for (j, &kind) in saved.carries.iter().enumerate() {
                args.push(match kind {
                    Carry::Counter => {
                        if saved.lower == 0 {
                            i
                        } else {
                            let lower = b.scalar(f64::from(saved.lower), DType::I32)?;
                            b.add(i, lower)?
                        }
                    }
                    Carry::Invariant => op.operands[j],
                    Carry::Saved(s) => b.stacked_row(saves[s], i)?,
                    Carry::WriteOnly => b.zeros_of(op.operands[j])?,
                });
            }
            // The re-run reads the kept values from the forward's saves.
            let mut from_saves = HashMap::with_capacity(kept.len());
            for &(v, result) in &kept {
                from_saves.insert(v, b.stacked_row(op.results[result], i)?);
            }
            let (results, _) = b.copy_region_with(&body, &args, &from_saves)?;
            let outputs: Vec<Value> = through.iter().map(|&j| results[j]).collect();
            let mut wrt: Vec<Value> = through.iter().map(|&j| args[j]).collect();
            wrt.extend_from_slice(&outer);
            let grads = b.backward(&outputs, &carry[..through.len()], &wrt)?;
            let mut next = Vec::with_capacity(carry.len());
            for &x in &wrt[..through.len()] {
                next.push(match grads.get(&x) {
                    Some(&g) => g,
                    None => b.zeros_of(x)?,
                });
            }
            for (&v, &acc) in outer.iter().zip(&carry[through.len()..]) {
                next.push(match grads.get(&v) {
                    Some(&g) => b.add_into(acc, g)?,
                    None => acc,
                });
            }
            // The copy of the forward body feeds only the backward; drop what it does not use.
            b.prune(&next);
            Ok::<_, HloError>((next, vec![]))
        })?;
        for (k, &j) in through.iter().enumerate() {
            out.push((op.operands[j], Some(done.carry[k])));
        }
        for (&v, &acc) in outer.iter().zip(&done.carry[through.len()..]) {
            out.push((v, Some(acc)));
        }
        Ok(out)
    }

    /// The counter's iteration index: `counter - lower`.
    fn iteration(&mut self, counter: Value, lower: i32) -> Result<Value, HloError> {
        if lower == 0 {
            return Ok(counter);
        }
        let l = self.scalar(f64::from(lower), DType::I32)?;
        self.sub(counter, l)
    }

    fn zeros_of(&mut self, v: Value) -> Result<Value, HloError> {
        let t = self.value_type(v)?.clone();
        self.splat(0.0, t)
    }

    /// `acc + g`; when `g` is a zero array with one window written (`dynamic_slice`'s
    /// cotangent), only that window of `acc` is updated.
    pub(super) fn add_into(&mut self, acc: Value, g: Value) -> Result<Value, HloError> {
        let Some((update, starts)) = self.zero_window(g) else {
            return self.add(acc, g);
        };
        let dims = self.value_type(update)?.dims.clone();
        let old = self.dynamic_slice(acc, &starts, &dims)?;
        let new = self.add(old, update)?;
        self.dynamic_update_slice(acc, new, &starts)
    }

    /// The update and start indices of `g` when it is a zero array with one window written
    /// (`dynamic_update_slice` of a zero constant, computed in the region being built).
    pub(super) fn zero_window(&self, g: Value) -> Option<(Value, Vec<Value>)> {
        self.frame()
            .ops
            .iter()
            .rev()
            .find(|o| o.results.first() == Some(&g))
            .filter(|o| o.kind == OpKind::DynamicUpdateSlice && self.is_zero(o.operands[0]))
            .map(|o| (o.operands[1], o.operands[2..].to_vec()))
    }

    /// Whether `v` is a zero splat constant.
    fn is_zero(&self, v: Value) -> bool {
        self.defining_op(v).is_some_and(|o| match &o.kind {
            OpKind::Constant(lit) if lit.is_splat() => match lit.values() {
                ArrayData::F32(x) => x[0] == 0.0,
                ArrayData::BF16(x) => x[0].to_f64() == 0.0,
                _ => false,
            },
            _ => false,
        })
    }
}
