//! Reverse-mode automatic differentiation of the programs a [`FuncBuilder`] builds.
//!
//! [`FuncBuilder::vjp`] appends to the function being built the backward of a forward computed
//! in it: given output values and their cotangents, it emits the ops computing the cotangents
//! (vector-Jacobian products) of chosen values, usually the arguments. [`FuncBuilder::grad`]
//! is the scalar-loss case (the seed is 1). The forward stays in the function, so a train
//! step is one function: forward, `grad`, update.
//!
//! ```
//! use tessera_hlo::{DType, Module, Reducer, TensorType};
//!
//! // loss = sum(tanh(x * w)); d loss / d w.
//! let mut m = Module::new("grad");
//! let mut f = m.func("main");
//! let x = f.arg(TensorType::new([4, 8], DType::F32))?;
//! let w = f.arg(TensorType::new([4, 8], DType::F32))?;
//! let xw = f.mul(x, w)?;
//! let t = f.tanh(xw)?;
//! let loss = f.reduce(t, &[0, 1], Reducer::Sum)?;
//! let dw = f.grad(loss, &[w])?;
//! f.finish(&[loss, dw[0]])?;
//! # Ok::<(), tessera_hlo::HloError>(())
//! ```
//!
//! Every op has a rule (see `rules.rs` for the list), applied once per op in reverse program
//! order; cotangents reaching a value from several uses are summed in that order, so the
//! backward is linear in the size of the forward and its text is deterministic. Only ops on a
//! path from the differentiated values to the outputs are differentiated: other ops (masks
//! built with `iota` and `compare`, loop counters, dead code) need no rule. Integer and bool
//! values carry no cotangent, nor do the results of piecewise-constant ops (`floor`, `sign`,
//! `compare`, float to int `convert`).
//!
//! # Custom VJPs
//!
//! [`FuncBuilder::custom_vjp`] builds a run of ops (e.g. a kernel lowered inline, whose grid is
//! a `stablehlo.while`) as one unit whose backward is a [`VjpRule`]: autodiff never looks
//! inside it and calls the rule instead. Ops with no rule of their own (`if`, `case`,
//! `func.call`, `custom_call`, a `while` that is not counted) are differentiable only inside
//! such a unit; reaching one is an error naming the op and this fix.
//!
//! # Counted loops
//!
//! A `stablehlo.while` whose trip count is fixed when the program is built (an `i32` counter
//! from a constant, `counter < constant`, `counter + 1`: [`FuncBuilder::scan`], or
//! [`FuncBuilder::fori_loop`] with constant bounds) is differentiated: the loop is rewritten
//! in place to also save, stacked `[N, ...]`, each iteration's incoming carried values (not
//! the counter, not values the body passes through unchanged, not buffers it only writes),
//! and the backward is one loop over the iterations in reverse that re-runs a copy of the
//! body on the saved carry and differentiates it with the ordinary rules. Values the body
//! reads from outside (stacked weights) accumulate their cotangents across iterations; a
//! row read with `dynamic_slice` at the counter is accumulated into that row only, and so
//! is a row read outside the loop (e.g. a last layer run after it) into the loop's
//! accumulated cotangent. The program text does not grow with `N`. See `loops.rs`.
//!
//! Values of the body marked with [`FuncBuilder::keep_for_backward`] are saved the same way
//! and read by the re-run instead of recomputed: what only fed them drops out of the
//! backward (JAX's `checkpoint_name` under a `save_only_these_names` policy).
//!
//! A custom-VJP unit in a loop body has its rule called on the copy: its inputs and outputs
//! are the copy's, and any other value of the body the rule captured (an index the body
//! computed from the counter, a table it sliced) is read as its copy too, since the forward
//! body's own values are not in scope in the backward loop.
//!
//! # Collectives
//!
//! In a manually partitioned program each device runs the function on its own values, and the
//! cotangents are per device: the program differentiated is `sum over devices of <output,
//! cotangent>`. A collective's rule is its transpose under that sum: `all_to_all` (split `s`,
//! concat `c`) goes back by the `all_to_all` (split `c`, concat `s`), `all_gather` by a sum
//! `reduce_scatter` and back, `collective_permute` by the reversed pairs, a sum `all_reduce`
//! by a sum `all_reduce`. (`tessera-collectives` wraps the collectives it emits in custom VJPs
//! carrying its own rules, which agree except for `psum`: there a replicated result's
//! cotangent is one value held by every device, JAX's convention, and the transpose is the
//! identity.)

mod loops;
mod rules;

pub(crate) use loops::SavedLoop;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::rc::Rc;

use crate::builder::FuncBuilder;
use crate::ops::{Op, OpKind, Value};
use crate::{HloError, TensorType};

/// The backward of a unit built with [`FuncBuilder::custom_vjp`].
///
/// ```
/// use std::rc::Rc;
/// use tessera_hlo::autodiff::{VjpCall, VjpRule};
/// use tessera_hlo::{DType, FuncBuilder, HloError, Module, TensorType, Value};
///
/// /// `y = x * x` computed however the forward likes; its backward `2 x dy`.
/// #[derive(Debug)]
/// struct Square;
///
/// impl VjpRule for Square {
///     fn name(&self) -> &str {
///         "square"
///     }
///     fn vjp(
///         &self,
///         f: &mut FuncBuilder<'_>,
///         call: &VjpCall<'_>,
///     ) -> Result<Vec<Option<Value>>, HloError> {
///         let Some(dy) = call.cotangents[0] else { return Ok(vec![None]) };
///         let two_x = f.add(call.inputs[0], call.inputs[0])?;
///         Ok(vec![Some(f.mul(two_x, dy)?)])
///     }
/// }
///
/// let mut m = Module::new("custom");
/// let mut f = m.func("main");
/// let x = f.arg(TensorType::new([4], DType::F32))?;
/// let y = f.custom_vjp(Rc::new(Square), &[x], |f, x| Ok::<_, HloError>(vec![f.mul(x[0], x[0])?]))?;
/// let dy = f.arg(TensorType::new([4], DType::F32))?;
/// let dx = f.vjp(&y, &[dy], &[x])?;
/// f.finish(&dx)?;
/// # Ok::<(), HloError>(())
/// ```
pub trait VjpRule: fmt::Debug {
    /// What error messages call the unit (e.g. `splash attention forward`).
    fn name(&self) -> &str;

    /// Emits into `f` the cotangents of the unit's inputs given those of its outputs: one
    /// entry per input, `None` for a zero cotangent (or an input that carries none). Each
    /// cotangent has its input's type.
    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, HloError>;
}

/// The error of the [`VjpRule`] named `rule` when its backward cannot be built (`reason`):
/// what a rule whose builder has its own error type returns from [`VjpRule::vjp`].
pub fn backward_failed(rule: &str, reason: impl fmt::Display) -> HloError {
    autodiff_error(
        "custom_vjp",
        format!("`{rule}`: building its backward: {reason}"),
    )
}

/// What a [`VjpRule`] is applied to.
#[derive(Debug, Clone, Copy)]
pub struct VjpCall<'a> {
    /// The unit's inputs (the forward values it was built from).
    pub inputs: &'a [Value],
    /// The unit's outputs (forward values, usable in the backward).
    pub outputs: &'a [Value],
    /// One per output: its cotangent, or `None` where it is zero (at least one is `Some`).
    pub cotangents: &'a [Option<Value>],
    /// One per input: whether its cotangent is used (a rule may skip the others).
    pub needed: &'a [bool],
}

/// A run of ops built by [`FuncBuilder::custom_vjp`].
#[derive(Debug, Clone)]
pub(crate) struct VjpSpan {
    pub(crate) rule: Rc<dyn VjpRule>,
    pub(crate) inputs: Vec<Value>,
    pub(crate) outputs: Vec<Value>,
    /// Indices of the span's ops in their frame.
    pub(crate) ops: Range<usize>,
    /// Empty for a span as built; for a copy (see `copy.rs`), the copy of every value of the
    /// regions it was copied from, which the rule reads in their place (it may hold values
    /// the forward computed outside the span, e.g. an index computed in a loop body).
    pub(crate) counterparts: Rc<Counterparts>,
}

/// Values of a copied region and their copies.
pub(crate) type Counterparts = HashMap<Value, Value>;

/// One step of the backward: a single op or a custom-VJP span.
#[derive(Debug)]
struct Unit {
    what: UnitKind,
    /// Values it reads from outside itself (operands, and values its regions capture).
    reads: Vec<Value>,
    results: Vec<Value>,
}

#[derive(Debug, Clone, Copy)]
enum UnitKind {
    /// `frame.ops[i]`.
    Op(usize),
    /// `frame.spans[i]`.
    Span(usize),
}

const VJP: &str = "autodiff";

fn autodiff_error(op: impl Into<String>, reason: impl Into<String>) -> HloError {
    HloError::Autodiff {
        op: op.into(),
        reason: reason.into(),
    }
}

impl FuncBuilder<'_> {
    /// Builds `forward` (which receives `inputs` and returns the unit's outputs) inline, as
    /// one unit whose backward is `rule`: [`FuncBuilder::vjp`] calls the rule instead of
    /// differentiating the ops inside. Values the body uses besides `inputs` (tables, indices)
    /// get no cotangent; using a value that is being differentiated that way is an error at
    /// [`FuncBuilder::vjp`] time. The emitted text is the body's, unchanged.
    pub fn custom_vjp<E, F>(
        &mut self,
        rule: Rc<dyn VjpRule>,
        inputs: &[Value],
        forward: F,
    ) -> Result<Vec<Value>, E>
    where
        E: From<HloError>,
        F: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        const OP: &str = "custom_vjp";
        for (i, &v) in inputs.iter().enumerate() {
            self.check_value(OP, &format!("`{}` input #{i}", rule.name()), v)?;
        }
        let inputs: Vec<Value> = inputs.iter().map(|&v| self.counterpart(v)).collect();
        let start = self.frame().ops.len();
        let outputs = forward(self, &inputs)?;
        let end = self.frame().ops.len();
        let defined: HashSet<Value> = self.frame().ops[start..end]
            .iter()
            .flat_map(|op| op.results.iter().copied())
            .collect();
        for (i, v) in outputs.iter().enumerate() {
            self.check_value(OP, &format!("`{}` output #{i}", rule.name()), *v)?;
            if !defined.contains(v) {
                return Err(autodiff_error(
                    OP,
                    format!(
                        "`{}`: output #{i} is not computed by the body (it is an input or an outer \
                         value); return only values the body's ops compute",
                        rule.name()
                    ),
                )
                .into());
            }
        }
        self.frame_mut().spans.push(VjpSpan {
            rule,
            inputs,
            outputs: outputs.clone(),
            ops: start..end,
            counterparts: Rc::default(),
        });
        Ok(outputs)
    }

    /// Reverse-mode autodiff: appends the ops computing the cotangents of `wrt` given the
    /// cotangents of `outputs` (one per output, of its type), and returns them (one per
    /// `wrt` value, of its type; zeros where no output depends on it).
    ///
    /// `outputs` and `wrt` are float values of the region being built (`wrt` usually the
    /// arguments); the ops differentiated are those of that region that lie between them. An
    /// op on that path without a VJP rule (`if`, `case`, `func.call`, `custom_call`, a
    /// reduction with a custom body, a `while` that is not a counted loop) is an error naming
    /// the op; wrap its computation in [`FuncBuilder::custom_vjp`]. A counted loop on the path
    /// is rewritten in place to save its carries (see the module docs).
    pub fn vjp(
        &mut self,
        outputs: &[Value],
        cotangents: &[Value],
        wrt: &[Value],
    ) -> Result<Vec<Value>, HloError> {
        if outputs.len() != cotangents.len() {
            return Err(autodiff_error(
                VJP,
                format!(
                    "{} outputs but {} cotangents; give one cotangent per output",
                    outputs.len(),
                    cotangents.len()
                ),
            ));
        }
        for (i, (&y, &ct)) in outputs.iter().zip(cotangents).enumerate() {
            let yt = self.check_value(VJP, &format!("output #{i}"), y)?;
            let ct_t = self.check_value(VJP, &format!("cotangent #{i}"), ct)?;
            if !yt.dtype.is_float() {
                return Err(autodiff_error(
                    VJP,
                    format!("output #{i} ({yt}) is not a float value; only floats have cotangents"),
                ));
            }
            if yt != ct_t {
                return Err(autodiff_error(
                    VJP,
                    format!("cotangent #{i} is {ct_t}, its output is {yt}; they must agree"),
                ));
            }
        }
        let mut wrt_types = Vec::with_capacity(wrt.len());
        for (i, &x) in wrt.iter().enumerate() {
            let t = self.check_value(VJP, &format!("wrt value #{i}"), x)?;
            if !t.dtype.is_float() {
                return Err(autodiff_error(
                    VJP,
                    format!(
                        "wrt value #{i} ({t}) is not a float value; only floats have cotangents"
                    ),
                ));
            }
            wrt_types.push(t);
        }
        // In a copied span's rule, the values it captured stand for their copies.
        let [outputs, cotangents, wrt] = [outputs, cotangents, wrt]
            .map(|vs| -> Vec<Value> { vs.iter().map(|&v| self.counterpart(v)).collect() });
        let cts = self.backward(&outputs, &cotangents, &wrt)?;
        wrt.iter()
            .zip(wrt_types)
            .map(|(x, t)| match cts.get(x) {
                Some(&ct) => Ok(ct),
                None => self.splat(0.0, t),
            })
            .collect()
    }

    /// Marks `v`, a float value computed in the body of a counted loop, to be kept for the
    /// loop's backward rather than recomputed (JAX's `checkpoint_name` under a
    /// `save_only_these_names` policy). When [`FuncBuilder::vjp`] differentiates the loop,
    /// its forward also saves `v` at every iteration (one `[N, ...]` buffer), and the copy of
    /// the body the backward re-runs reads the saved value instead: the ops that only fed it
    /// (a projection, a collective, a kernel's forward) are left out of the re-run, and rules
    /// that read it (e.g. a custom VJP's outputs) read the saved value. Cotangents flow
    /// through `v` as without the mark. The loop whose body computes `v` saves it: a value
    /// of an inner loop's body is saved by that loop, per inner iteration, where autodiff
    /// differentiates it; a value outside any loop is not saved (the mark changes nothing).
    /// Returns `v`.
    pub fn keep_for_backward(&mut self, v: Value) -> Result<Value, HloError> {
        let t = self.check_value(VJP, "kept value", v)?;
        if !t.dtype.is_float() {
            return Err(autodiff_error(
                VJP,
                format!("kept value {t} is not a float value; only floats have cotangents"),
            ));
        }
        self.kept.insert(v);
        Ok(v)
    }

    /// The gradient of a float scalar `loss` with respect to `wrt`: [`FuncBuilder::vjp`] with
    /// the cotangent 1.
    pub fn grad(&mut self, loss: Value, wrt: &[Value]) -> Result<Vec<Value>, HloError> {
        let t = self.check_value(VJP, "loss", loss)?;
        if !t.is_scalar() || !t.dtype.is_float() {
            return Err(autodiff_error(
                VJP,
                format!(
                    "grad needs a float scalar loss, got {t}; reduce it to a scalar or use vjp \
                     with a cotangent"
                ),
            ));
        }
        let one = self.scalar(1.0, t.dtype)?;
        self.vjp(&[loss], &[one], wrt)
    }

    /// Removes the ops of the region being built whose results nothing needs: neither
    /// `keep`, nor a later op, nor a region. Ops with side effects (`custom_call` with
    /// `has_side_effect`) stay, and a custom-VJP unit stays whole while any of its outputs
    /// is needed (its rule may read any of them). Returns the results of the removed ops.
    pub fn prune(&mut self, keep: &[Value]) -> Vec<Value> {
        let units = self.units();
        let mut live: HashSet<Value> = keep.iter().copied().collect();
        let mut keep_unit = vec![false; units.len()];
        for (u, unit) in units.iter().enumerate().rev() {
            let side_effect = match unit.what {
                UnitKind::Op(i) => has_side_effect(&self.frame().ops[i]),
                UnitKind::Span(s) => self.frame().ops[self.frame().spans[s].ops.clone()]
                    .iter()
                    .any(has_side_effect),
            };
            if side_effect || unit.results.iter().any(|r| live.contains(r)) {
                keep_unit[u] = true;
                live.extend(unit.reads.iter().copied());
            }
        }
        let mut keep_op = vec![false; self.frame().ops.len()];
        for (unit, &k) in units.iter().zip(&keep_unit) {
            if !k {
                continue;
            }
            match unit.what {
                UnitKind::Op(i) => keep_op[i] = true,
                UnitKind::Span(s) => {
                    for i in self.frame().spans[s].ops.clone() {
                        keep_op[i] = true;
                    }
                }
            }
        }
        // New index of every kept op, for the spans.
        let mut new_index = Vec::with_capacity(keep_op.len() + 1);
        let mut n = 0;
        for &k in &keep_op {
            new_index.push(n);
            n += usize::from(k);
        }
        new_index.push(n);
        let frame = self.frame_mut();
        let ops = std::mem::take(&mut frame.ops);
        let mut removed = Vec::new();
        for (op, k) in ops.into_iter().zip(keep_op) {
            if k {
                frame.ops.push(op);
            } else {
                removed.extend(op.results);
            }
        }
        frame.spans = std::mem::take(&mut frame.spans)
            .into_iter()
            .filter_map(|mut s| {
                s.ops = new_index[s.ops.start]..new_index[s.ops.end];
                (!s.ops.is_empty()).then_some(s)
            })
            .collect();
        removed
    }

    /// The ops of the current region grouped into units: an outermost custom-VJP span is one
    /// unit, every other op its own.
    fn units(&self) -> Vec<Unit> {
        let frame = self.frame();
        // The outermost span starting at each op.
        let mut span_at: HashMap<usize, usize> = HashMap::new();
        for (s, span) in frame.spans.iter().enumerate() {
            let e = span_at.entry(span.ops.start).or_insert(s);
            if frame.spans[*e].ops.end < span.ops.end {
                *e = s;
            }
        }
        let mut units = Vec::new();
        let mut i = 0;
        while i < frame.ops.len() {
            match span_at.get(&i) {
                Some(&s) if !frame.spans[s].ops.is_empty() => {
                    let span = &frame.spans[s];
                    units.push(Unit {
                        what: UnitKind::Span(s),
                        reads: outer_reads(&frame.ops[span.ops.clone()]),
                        results: span.outputs.clone(),
                    });
                    i = span.ops.end;
                }
                _ => {
                    let op = &frame.ops[i];
                    units.push(Unit {
                        what: UnitKind::Op(i),
                        reads: outer_reads(std::slice::from_ref(op)),
                        results: op.results.clone(),
                    });
                    i += 1;
                }
            }
        }
        units
    }

    /// The float type of `v`, if it is one (values that can carry a cotangent).
    fn float_type(&self, v: Value) -> Option<TensorType> {
        self.value_type(v)
            .ok()
            .filter(|t| t.dtype.is_float())
            .cloned()
    }

    /// The reverse sweep: the cotangent of every value between `wrt` and `outputs`.
    fn backward(
        &mut self,
        outputs: &[Value],
        cotangents: &[Value],
        wrt: &[Value],
    ) -> Result<HashMap<Value, Value>, HloError> {
        let units = self.units();
        // Forward: values that depend on `wrt` (floats only: nothing flows through integers).
        // A kept value's save and the re-run's copy of it are one value here (see
        // `kept_copies`): both are active, and what needs one needs the copy's producer.
        let mut active: HashSet<Value> = wrt.iter().copied().collect();
        let mut unit_active = vec![false; units.len()];
        for (u, unit) in units.iter().enumerate() {
            if unit.reads.iter().any(|v| active.contains(v)) {
                unit_active[u] = true;
                for &r in &unit.results {
                    if self.float_type(r).is_some() {
                        active.insert(r);
                        if let Some(&save) = self.kept_saves.get(&r) {
                            active.insert(save);
                        }
                    }
                }
            }
        }
        // Backward: values the outputs depend on.
        let mut needed: HashSet<Value> = outputs.iter().map(|&v| self.canonical(v)).collect();
        let mut unit_needed = vec![false; units.len()];
        for (u, unit) in units.iter().enumerate().rev() {
            if unit_active[u] && unit.results.iter().any(|r| needed.contains(r)) {
                unit_needed[u] = true;
                needed.extend(unit.reads.iter().map(|&v| self.canonical(v)));
            }
        }
        // Counted loops on the path are first rewritten to save their carries (once).
        let unsaved: Vec<usize> = units
            .iter()
            .zip(&unit_needed)
            .filter_map(|(unit, &needed)| match unit.what {
                UnitKind::Op(i) if needed && self.frame().ops[i].kind == OpKind::While => {
                    let first = self.frame().ops[i].results.first();
                    (!first.is_some_and(|r| self.saved_loops.contains_key(r))).then_some(i)
                }
                _ => None,
            })
            .collect();
        if !unsaved.is_empty() {
            // From the last: inserting before a loop leaves the earlier indices valid.
            for &i in unsaved.iter().rev() {
                self.save_loop_carries(i)?;
            }
            return self.backward(outputs, cotangents, wrt);
        }
        let mut cts: HashMap<Value, Value> = HashMap::new();
        for (&y, &ct) in outputs.iter().zip(cotangents) {
            if active.contains(&y) {
                self.accumulate(&mut cts, y, ct)?;
            }
        }
        for (u, unit) in units.iter().enumerate().rev() {
            if !unit_needed[u] {
                continue;
            }
            let result_cts: Vec<Option<Value>> = unit
                .results
                .iter()
                .map(|&r| cts.get(&self.canonical(r)).copied())
                .collect();
            if result_cts.iter().all(Option::is_none) {
                continue;
            }
            let (operands, operand_cts) = match unit.what {
                UnitKind::Op(i) if self.frame().ops[i].kind == OpKind::While => {
                    let op = self.frame().ops[i].clone();
                    self.loop_vjp(&op, &result_cts, &active)?
                        .into_iter()
                        .unzip()
                }
                UnitKind::Op(i) => {
                    let op = self.frame().ops[i].clone();
                    if let Some(&captured) = unit
                        .reads
                        .iter()
                        .find(|v| active.contains(v) && !op.operands.contains(v))
                    {
                        return Err(autodiff_error(
                            op.kind.name(),
                            format!(
                                "a region of this op uses a value being differentiated ({}) \
                                 that autodiff cannot follow into the region; compute it in a \
                                 custom VJP (FuncBuilder::custom_vjp)",
                                self.describe(captured)
                            ),
                        ));
                    }
                    let needs: Vec<bool> = op.operands.iter().map(|v| active.contains(v)).collect();
                    // The rule reads kept values' saves; cotangents go to the operands.
                    let mut primal_op = op.clone();
                    for v in primal_op.operands.iter_mut().chain(&mut primal_op.results) {
                        *v = self.primal(*v);
                    }
                    let operand_cts = rules::op_vjp(self, &primal_op, &result_cts, &needs)?;
                    (op.operands, operand_cts)
                }
                UnitKind::Span(s) => {
                    let span = self.frame().spans[s].clone();
                    if let Some(&captured) = unit
                        .reads
                        .iter()
                        .find(|v| active.contains(v) && !span.inputs.contains(v))
                    {
                        return Err(autodiff_error(
                            "custom_vjp",
                            format!(
                                "`{}`: the body uses a value being differentiated ({}) that is \
                                 not one of its inputs, so its cotangent would be lost; pass it \
                                 as an input",
                                span.rule.name(),
                                self.describe(captured)
                            ),
                        ));
                    }
                    let needs: Vec<bool> = span.inputs.iter().map(|v| active.contains(v)).collect();
                    let primal = |vs: &[Value]| -> Vec<Value> {
                        vs.iter().map(|&v| self.primal(v)).collect()
                    };
                    let (inputs, outputs) = (primal(&span.inputs), primal(&span.outputs));
                    let call = VjpCall {
                        inputs: &inputs,
                        outputs: &outputs,
                        cotangents: &result_cts,
                        needed: &needs,
                    };
                    // The rule of a copied span reads the copies of the values it captured.
                    self.counterparts.push(span.counterparts.clone());
                    let ruled = span.rule.vjp(self, &call).map(|cts| {
                        cts.into_iter()
                            .map(|ct| ct.map(|v| self.counterpart(v)))
                            .collect::<Vec<_>>()
                    });
                    self.counterparts.pop();
                    let operand_cts = ruled?;
                    if operand_cts.len() != span.inputs.len() {
                        return Err(autodiff_error(
                            "custom_vjp",
                            format!(
                                "`{}`: the rule returned {} cotangents for {} inputs",
                                span.rule.name(),
                                operand_cts.len(),
                                span.inputs.len()
                            ),
                        ));
                    }
                    (span.inputs, operand_cts)
                }
            };
            for (i, (&x, ct)) in operands.iter().zip(operand_cts).enumerate() {
                let Some(ct) = ct else { continue };
                if !active.contains(&x) {
                    continue;
                }
                let (want, got) = (self.value_type(x)?.clone(), self.value_type(ct)?.clone());
                if want != got {
                    let op = match unit.what {
                        UnitKind::Op(i) => self.frame().ops[i].kind.name().to_string(),
                        UnitKind::Span(s) => {
                            format!("custom_vjp `{}`", self.frame().spans[s].rule.name())
                        }
                    };
                    return Err(autodiff_error(
                        op,
                        format!(
                            "the cotangent of operand #{i} is {got}, the operand is {want}; a \
                             VJP rule must return cotangents of its operands' types"
                        ),
                    ));
                }
                self.accumulate(&mut cts, x, ct)?;
            }
        }
        Ok(cts)
    }

    /// Adds `ct` to the cotangent of `x`. Where one of the two is a zero array with one
    /// window written (`dynamic_slice`'s cotangent, e.g. a layer read from its stack after a
    /// layer loop) and the other is not, only that window of the other is updated, so the
    /// sum costs the window, not the whole array.
    fn accumulate(
        &mut self,
        cts: &mut HashMap<Value, Value>,
        x: Value,
        ct: Value,
    ) -> Result<(), HloError> {
        let x = self.canonical(x);
        let sum = match cts.get(&x) {
            Some(&prev) if self.zero_window(prev).is_some() && self.zero_window(ct).is_none() => {
                self.add_into(ct, prev)?
            }
            Some(&prev) => self.add_into(prev, ct)?,
            None => ct,
        };
        cts.insert(x, sum);
        Ok(())
    }

    /// The value a kept value's save stands for in the backward of a loop: the re-run's
    /// copy of it (cotangents are keyed by the copy); any other value itself.
    fn canonical(&self, v: Value) -> Value {
        *self.kept_copies.get(&v).unwrap_or(&v)
    }

    /// The value whose primal a rule reads for `v`: a kept value's save for the re-run's copy
    /// of it; any other value itself.
    fn primal(&self, v: Value) -> Value {
        *self.kept_saves.get(&v).unwrap_or(&v)
    }

    /// `%12 (tensor<4xf32>)` for messages.
    fn describe(&self, v: Value) -> String {
        match self.value_type(v) {
            Ok(t) => format!("value %{} of type {t}", v.index()),
            Err(_) => format!("value %{}", v.index()),
        }
    }
}

/// The values `ops` read that they do not define: operands of the ops and of the ops in
/// their regions, and values their regions return, less the values defined inside.
fn outer_reads(ops: &[Op]) -> Vec<Value> {
    fn walk(ops: &[Op], reads: &mut Vec<Value>, defined: &mut HashSet<Value>) {
        for op in ops {
            reads.extend(op.operands.iter().copied());
            for r in &op.regions {
                defined.extend(r.args.iter().copied());
                walk(&r.ops, reads, defined);
                reads.extend(r.results.iter().copied());
            }
            defined.extend(op.results.iter().copied());
        }
    }
    let mut reads = Vec::new();
    let mut defined = HashSet::new();
    walk(ops, &mut reads, &mut defined);
    let mut seen = HashSet::new();
    reads
        .into_iter()
        .filter(|v| !defined.contains(v) && seen.insert(*v))
        .collect()
}

fn has_side_effect(op: &Op) -> bool {
    match &op.kind {
        crate::OpKind::CustomCall(c) => c.has_side_effect,
        _ => op.regions.iter().any(|r| r.ops.iter().any(has_side_effect)),
    }
}
