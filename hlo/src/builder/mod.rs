//! [`FuncBuilder`]: builds one function op by op, checking every operand as it goes.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::autodiff::{Counterparts, SavedLoop, VjpSpan};
use crate::module::{Func, Module};
use crate::ops::{Op, OpKind, Region, Sharding, Value};
use crate::{DType, HloError, HostArray, Literal, TensorType};

mod collective;
mod control;
mod copy;
mod elementwise;
mod shape;

pub use control::ScanOutput;

/// Process-wide counter so that values of different functions never alias.
static NEXT_FUNC_ID: AtomicU32 = AtomicU32::new(1);

const FUNC: &str = "func.func";

#[derive(Debug, Clone)]
struct ValueInfo {
    ty: TensorType,
    scope: usize,
}

#[derive(Debug, Clone, Copy)]
struct Scope {
    parent: Option<usize>,
    /// Values of enclosing scopes are not visible (reduction bodies).
    isolated: bool,
}

/// The ops of one open region (or of the function body).
#[derive(Debug)]
pub(crate) struct Frame {
    scope: usize,
    pub(crate) ops: Vec<Op>,
    /// Runs of `ops` built by [`FuncBuilder::custom_vjp`], differentiated as one unit.
    pub(crate) spans: Vec<VjpSpan>,
}

/// Builds one `func.func`. Made by [`Module::func`]; joins the module on [`FuncBuilder::finish`].
///
/// Every op method checks its operands (same function, in scope, shapes and dtypes) and
/// returns `Err(HloError)` naming the op and the mismatch instead of emitting invalid text.
/// Ops with regions (`reduce_with`, `while_loop`, `if_else`, `case`, `all_reduce_with`, ...)
/// take closures that receive this same builder, positioned inside the region.
///
/// ```
/// use tessera_hlo::{DType, Module, Reducer, TensorType};
///
/// let mut m = Module::new("rowsum");
/// let mut f = m.func("main");
/// let x = f.arg(TensorType::new([4, 8], DType::F32))?;
/// let s = f.reduce(x, &[1], Reducer::Sum)?;
/// assert_eq!(f.value_type(s)?, &TensorType::new([4], DType::F32));
/// f.finish(&[s])?;
/// # Ok::<(), tessera_hlo::HloError>(())
/// ```
#[derive(Debug)]
pub struct FuncBuilder<'m> {
    module: &'m mut Module,
    id: u32,
    name: String,
    public: bool,
    values: Vec<ValueInfo>,
    scopes: Vec<Scope>,
    frames: Vec<Frame>,
    args: Vec<Value>,
    arg_shardings: Vec<Option<Sharding>>,
    /// The custom-VJP spans of closed regions, by the region's first argument (copies of a
    /// region keep its spans; see `copy.rs`).
    region_spans: HashMap<Value, Vec<VjpSpan>>,
    /// Counted loops autodiff has rewritten to save their carries, by the loop's first result.
    pub(crate) saved_loops: HashMap<Value, SavedLoop>,
    /// While the rules of copied custom-VJP spans run (innermost last): each span's
    /// counterparts, through which every value those rules use is read (see
    /// [`FuncBuilder::counterpart`]).
    pub(crate) counterparts: Vec<Rc<Counterparts>>,
    /// Values marked with [`FuncBuilder::keep_for_backward`]: a counted loop's forward saves
    /// them and its backward reads them instead of recomputing them.
    pub(crate) kept: HashSet<Value>,
    /// In the backward of a loop, each kept value's saved copy (a row of the forward's save)
    /// -> the value the re-run body computes in its place, which the re-run reads no more:
    /// the two are one value for the cotangents, the saved one for the primal values.
    pub(crate) kept_copies: HashMap<Value, Value>,
    /// The inverse of `kept_copies`.
    pub(crate) kept_saves: HashMap<Value, Value>,
}

impl<'m> FuncBuilder<'m> {
    /// The module this function is built into.
    pub(crate) fn module_mut(&mut self) -> &mut Module {
        self.module
    }

    pub(crate) fn new(module: &'m mut Module, name: String) -> Self {
        FuncBuilder {
            module,
            id: NEXT_FUNC_ID.fetch_add(1, Ordering::Relaxed),
            name,
            public: true,
            values: Vec::new(),
            scopes: vec![Scope {
                parent: None,
                isolated: false,
            }],
            frames: vec![Frame {
                scope: 0,
                ops: Vec::new(),
                spans: Vec::new(),
            }],
            args: Vec::new(),
            arg_shardings: Vec::new(),
            region_spans: HashMap::new(),
            saved_loops: HashMap::new(),
            counterparts: Vec::new(),
            kept: HashSet::new(),
            kept_copies: HashMap::new(),
            kept_saves: HashMap::new(),
        }
    }

    /// The function name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes the function public (the default) or private. `@main` must stay public.
    pub fn set_public(&mut self, public: bool) {
        self.public = public;
    }

    /// `mhlo.num_partitions` of the module being built.
    pub fn num_partitions(&self) -> u32 {
        self.module.num_partitions()
    }

    /// The mesh of the module being built (empty without one; see [`Module::set_mesh`]).
    pub fn mesh(&self) -> &[(String, u32)] {
        self.module.mesh()
    }

    /// `mhlo.num_replicas` of the module being built.
    pub fn num_replicas(&self) -> u32 {
        self.module.num_replicas()
    }

    /// Adds a function argument (a parameter of the program when this is `@main`). On a
    /// module with a mesh, `@main`'s arguments need [`FuncBuilder::arg_with_sharding`].
    pub fn arg(&mut self, ty: TensorType) -> Result<Value, HloError> {
        self.add_arg(ty, None)
    }

    /// Adds a function argument with an `mhlo.sharding` attribute (e.g. [`Sharding::Manual`]).
    pub fn arg_with_sharding(
        &mut self,
        ty: TensorType,
        sharding: Sharding,
    ) -> Result<Value, HloError> {
        self.add_arg(ty, Some(sharding))
    }

    fn add_arg(&mut self, ty: TensorType, sharding: Option<Sharding>) -> Result<Value, HloError> {
        let what = format!("argument #{}", self.args.len());
        ty.validate(FUNC, &what)?;
        self.module
            .check_sharding(&self.name, &what, &ty, sharding.as_ref())?;
        let v = self.new_value(ty, 0);
        self.args.push(v);
        self.arg_shardings.push(sharding);
        Ok(v)
    }

    /// The arguments added so far.
    pub fn args(&self) -> &[Value] {
        &self.args
    }

    /// The type of a value of this function.
    pub fn value_type(&self, v: Value) -> Result<&TensorType, HloError> {
        if v.func != self.id {
            return Err(HloError::Value {
                op: "value_type",
                what: format!("value %{}", v.id),
                reason: "belongs to another function".into(),
            });
        }
        self.values
            .get(v.index())
            .map(|i| &i.ty)
            .ok_or_else(|| HloError::Value {
                op: "value_type",
                what: format!("value %{}", v.id),
                reason: "is unknown".into(),
            })
    }

    /// A constant holding a host array (emitted as a splat when its elements are all equal).
    pub fn constant(&mut self, array: &HostArray) -> Result<Value, HloError> {
        self.literal(Literal::from_array(array)?)
    }

    /// A rank-0 constant (see [`Literal::scalar`] for the accepted values).
    pub fn scalar(&mut self, value: f64, dtype: DType) -> Result<Value, HloError> {
        self.literal(Literal::scalar(value, dtype)?)
    }

    /// A constant of type `ty` with every element equal to `value` (emitted as a splat).
    pub fn splat(&mut self, value: f64, ty: TensorType) -> Result<Value, HloError> {
        self.literal(Literal::splat(value, &ty)?)
    }

    pub(crate) fn literal(&mut self, literal: Literal) -> Result<Value, HloError> {
        let ty = literal.ty();
        Ok(self.emit1(OpKind::Constant(literal), vec![], ty, vec![]))
    }

    /// Ends the function, returning `results`, and adds it to the module.
    pub fn finish(self, results: &[Value]) -> Result<(), HloError> {
        let with: Vec<(Value, Option<Sharding>)> = results.iter().map(|&v| (v, None)).collect();
        self.finish_with_shardings(&with)
    }

    /// Ends the function like [`FuncBuilder::finish`], with an optional `mhlo.sharding` per
    /// result.
    pub fn finish_with_shardings(
        mut self,
        results: &[(Value, Option<Sharding>)],
    ) -> Result<(), HloError> {
        let func_err = |name: &str, reason: String| HloError::Func {
            func: name.into(),
            reason,
        };
        for (i, (v, sharding)) in results.iter().enumerate() {
            let what = format!("result #{i}");
            let ty = self
                .check_value("func.return", &what, *v)
                .map_err(|e| func_err(&self.name, e.to_string()))?;
            self.module
                .check_sharding(&self.name, &what, &ty, sharding.as_ref())?;
        }
        let frame = self
            .frames
            .pop()
            .ok_or_else(|| func_err(&self.name, "no body".into()))?;
        let func = Func {
            id: self.id,
            name: self.name,
            public: self.public,
            arg_shardings: self.arg_shardings,
            result_shardings: results.iter().map(|(_, s)| s.clone()).collect(),
            body: Region {
                args: self.args,
                ops: frame.ops,
                results: results.iter().map(|(v, _)| *v).collect(),
            },
            values: self.values.into_iter().map(|i| i.ty).collect(),
        };
        self.module.add_func(func)
    }

    // ----- internals shared by the op files -----

    fn current_scope(&self) -> usize {
        self.frames.last().map_or(0, |f| f.scope)
    }

    fn new_value(&mut self, ty: TensorType, scope: usize) -> Value {
        let id = self.values.len() as u32;
        self.values.push(ValueInfo { ty, scope });
        Value { func: self.id, id }
    }

    fn visible(&self, scope: usize) -> bool {
        let mut s = self.current_scope();
        loop {
            if s == scope {
                return true;
            }
            let info = self.scopes[s];
            if info.isolated {
                return false;
            }
            match info.parent {
                Some(p) => s = p,
                None => return false,
            }
        }
    }

    /// The innermost open region (the function body outside any region).
    pub(crate) fn frame(&self) -> &Frame {
        self.frames
            .last()
            .expect("a builder always has its body frame")
    }

    /// The op defining `v` among the ops of the open regions (the function body and the
    /// regions being built), if an op defines it there.
    pub(crate) fn defining_op(&self, v: Value) -> Option<&Op> {
        let v = self.counterpart(v);
        self.frames
            .iter()
            .rev()
            .flat_map(|f| f.ops.iter().rev())
            .find(|op| op.results.contains(&v))
    }

    pub(crate) fn frame_mut(&mut self) -> &mut Frame {
        self.frames
            .last_mut()
            .expect("a builder always has its body frame")
    }

    /// Checks that `v` may be used here and returns its type.
    pub(crate) fn check_value(
        &self,
        op: &'static str,
        what: &str,
        v: Value,
    ) -> Result<TensorType, HloError> {
        let err = |reason: String| HloError::Value {
            op,
            what: what.to_string(),
            reason,
        };
        let v = self.counterpart(v);
        if v.func != self.id {
            return Err(err("belongs to another function or module".into()));
        }
        let info = self
            .values
            .get(v.index())
            .ok_or_else(|| err("is unknown".into()))?;
        if !self.visible(info.scope) {
            return Err(err(format!(
                "({}) is not in scope here: it is defined in a region that is closed, or \
                 outside a region that cannot capture values (reduction bodies)",
                info.ty
            )));
        }
        Ok(info.ty.clone())
    }

    /// The value that stands for `v` where it is used: while the rule of a custom-VJP span
    /// that [`FuncBuilder::copy_region`] copied runs, a value of the region the span was
    /// copied from (one the rule captured, e.g. an index the loop body computed) is read as
    /// its copy, the only one in scope in the backward; otherwise `v` itself.
    pub(crate) fn counterpart(&self, v: Value) -> Value {
        self.counterparts
            .iter()
            .rev()
            .fold(v, |v, map| map.get(&v).copied().unwrap_or(v))
    }

    /// Checks operand `index` of `op`.
    fn operand(&self, op: &'static str, index: usize, v: Value) -> Result<TensorType, HloError> {
        self.check_value(op, &format!("operand #{index}"), v)
    }

    /// Appends an op to the innermost open region and returns its results.
    fn emit(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        result_types: Vec<TensorType>,
        regions: Vec<Region>,
    ) -> Vec<Value> {
        let operands = operands.into_iter().map(|v| self.counterpart(v)).collect();
        let scope = self.current_scope();
        let results: Vec<Value> = result_types
            .into_iter()
            .map(|ty| self.new_value(ty, scope))
            .collect();
        let op = Op {
            kind,
            operands,
            results: results.clone(),
            regions,
        };
        if let Some(frame) = self.frames.last_mut() {
            frame.ops.push(op);
        }
        results
    }

    fn emit1(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        result_type: TensorType,
        regions: Vec<Region>,
    ) -> Value {
        let r = self.emit(kind, operands, vec![result_type], regions);
        r[0]
    }

    /// Builds a single-block region with block arguments of `arg_types`; `f` fills it and
    /// returns the values the region yields. Returns the region and the yielded types.
    fn region<E, F>(
        &mut self,
        op: &'static str,
        what: &str,
        arg_types: &[TensorType],
        isolated: bool,
        f: F,
    ) -> Result<(Region, Vec<TensorType>), E>
    where
        E: From<HloError>,
        F: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        let scope = self.scopes.len();
        self.scopes.push(Scope {
            parent: Some(self.current_scope()),
            isolated,
        });
        let args: Vec<Value> = arg_types
            .iter()
            .map(|t| self.new_value(t.clone(), scope))
            .collect();
        self.frames.push(Frame {
            scope,
            ops: Vec::new(),
            spans: Vec::new(),
        });
        let out = f(self, &args);
        let checked = out.and_then(|results| {
            let results: Vec<Value> = results.into_iter().map(|v| self.counterpart(v)).collect();
            let types = results
                .iter()
                .enumerate()
                .map(|(i, &v)| self.check_value(op, &format!("{what} result #{i}"), v))
                .collect::<Result<Vec<_>, HloError>>()?;
            Ok((results, types))
        });
        let frame = self.frames.pop();
        let (results, types) = checked?;
        let ops = match frame {
            Some(frame) => {
                if let (Some(&first), false) = (args.first(), frame.spans.is_empty()) {
                    self.region_spans.insert(first, frame.spans);
                }
                frame.ops
            }
            None => Vec::new(),
        };
        Ok((Region { args, ops, results }, types))
    }
}

// ----- small validation helpers -----

/// Checks that `dims` are distinct dimensions of a rank-`rank` tensor.
fn check_dims(
    op: &'static str,
    attr: &'static str,
    dims: &[i64],
    rank: usize,
) -> Result<(), HloError> {
    let mut seen = vec![false; rank];
    for &d in dims {
        if d < 0 || d as u64 >= rank as u64 {
            return Err(HloError::attr(
                op,
                attr,
                format!("dimension {d} out of range for rank {rank} (in {dims:?})"),
            ));
        }
        if std::mem::replace(&mut seen[d as usize], true) {
            return Err(HloError::attr(
                op,
                attr,
                format!("dimension {d} repeated (in {dims:?})"),
            ));
        }
    }
    Ok(())
}

/// Checks that `d` is a dimension of a rank-`rank` tensor.
fn check_dim(op: &'static str, attr: &'static str, d: i64, rank: usize) -> Result<usize, HloError> {
    if d < 0 || d as u64 >= rank as u64 {
        return Err(HloError::attr(
            op,
            attr,
            format!("dimension {d} out of range for rank {rank}"),
        ));
    }
    Ok(d as usize)
}

/// Checks that an attribute list has one entry per dimension.
fn check_len(
    op: &'static str,
    attr: &'static str,
    list: &[i64],
    rank: usize,
) -> Result<(), HloError> {
    if list.len() != rank {
        return Err(HloError::attr(
            op,
            attr,
            format!("has {} entries for an operand of rank {rank}", list.len()),
        ));
    }
    Ok(())
}

/// `size * factor` for a result dimension, or an error naming the op on overflow.
fn grow(op: &'static str, size: i64, factor: i64) -> Result<i64, HloError> {
    size.checked_mul(factor)
        .ok_or_else(|| HloError::shape(op, format!("result dimension {size} x {factor} overflows")))
}

/// Checks that the operand is a rank-0 tensor.
fn check_scalar(op: &'static str, what: &str, ty: &TensorType) -> Result<(), HloError> {
    if !ty.is_scalar() {
        return Err(HloError::shape(
            op,
            format!("{what} must be a scalar (rank 0), got {ty}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
