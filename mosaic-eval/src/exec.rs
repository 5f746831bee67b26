//! Runs parsed functions: values, memory and the semantics of each op.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::PoisonError;

use half::bf16;

use crate::op_error::{OpError, Operands};
use crate::parse::{Elem, Func, Op, OpKind, Type};
use crate::EvalError;

mod memory;

pub(crate) use memory::{Device, View};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Data {
    F(Vec<f32>),
    /// Integers and indices, wrapped to their width after every op.
    I(Vec<i64>),
    B(Vec<bool>),
}

/// A scalar (empty shape) or a vector, or the contents of a memref.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tensor {
    pub elem: Elem,
    pub shape: Vec<usize>,
    pub data: Data,
}

pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Every multi-index of `shape`, row-major.
pub(crate) fn indices(shape: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let n: usize = shape.iter().product();
    let mut idx = vec![0; shape.len()];
    (0..n).map(move |_| {
        let out = idx.clone();
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
        out
    })
}

fn round(elem: Elem, x: f32) -> f32 {
    if elem == Elem::BF16 {
        bf16::from_f32(x).to_f32()
    } else {
        x
    }
}

fn wrap(elem: Elem, x: i64) -> i64 {
    match elem {
        Elem::I32 => x as i32 as i64,
        Elem::I8 => x as i8 as i64,
        _ => x,
    }
}

impl Tensor {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// What uninitialised VMEM holds in tessera's interpreter
    /// ([`DType::garbage`](tessera_array::DType::garbage): NaN for floats, a sentinel for
    /// integers), so reads of unwritten memory give the same numbers.
    pub fn garbage(elem: Elem, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        let g = elem.dtype().garbage();
        let data = match elem {
            // Semaphores start at zero.
            Elem::DmaSem | Elem::Sem => Data::I(vec![0; n]),
            e if e.is_float() => Data::F(vec![g as f32; n]),
            Elem::I1 => Data::B(vec![g != 0.0; n]),
            _ => Data::I(vec![g as i64; n]),
        };
        Tensor {
            elem,
            shape: shape.to_vec(),
            data,
        }
    }

    pub fn scalar_int(elem: Elem, v: i64) -> Tensor {
        Tensor {
            elem,
            shape: vec![],
            data: Data::I(vec![wrap(elem, v)]),
        }
    }

    fn int(&self) -> Option<i64> {
        match &self.data {
            Data::I(v) if v.len() == 1 => Some(v[0]),
            _ => None,
        }
    }

    /// Flat offsets into `self` of the box of `sizes` at `starts`, row-major.
    fn box_offsets(&self, starts: &[usize], sizes: &[usize]) -> Vec<usize> {
        let st = strides(&self.shape);
        indices(sizes)
            .map(|idx| {
                idx.iter()
                    .zip(starts)
                    .zip(&st)
                    .map(|((i, s), t)| (i + s) * t)
                    .sum()
            })
            .collect()
    }

    pub fn window(&self, starts: &[usize], sizes: &[usize]) -> Tensor {
        let picks = self.box_offsets(starts, sizes);
        Tensor {
            elem: self.elem,
            shape: sizes.to_vec(),
            data: gather(&self.data, &picks),
        }
    }

    pub fn write_window(&mut self, starts: &[usize], src: &Tensor) {
        let targets = self.box_offsets(starts, &src.shape);
        match (&mut self.data, &src.data) {
            (Data::F(d), Data::F(s)) => targets.iter().zip(s).for_each(|(&t, &v)| d[t] = v),
            (Data::I(d), Data::I(s)) => targets.iter().zip(s).for_each(|(&t, &v)| d[t] = v),
            (Data::B(d), Data::B(s)) => targets.iter().zip(s).for_each(|(&t, &v)| d[t] = v),
            _ => unreachable!("checked: stores match the memref's element type"),
        }
    }
}

fn gather(data: &Data, picks: &[usize]) -> Data {
    match data {
        Data::F(v) => Data::F(picks.iter().map(|&i| v[i]).collect()),
        Data::I(v) => Data::I(picks.iter().map(|&i| v[i]).collect()),
        Data::B(v) => Data::B(picks.iter().map(|&i| v[i]).collect()),
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Val {
    T(Rc<Tensor>),
    /// A memref: an index into the machine's buffers.
    Ref(usize),
    /// A window of a buffer (`tpu.memref_slice`, `tpu.memref_squeeze`).
    View(Rc<View>),
}

/// Memory (every memref's contents) and the functions of a module.
pub(crate) struct Machine<'m> {
    pub funcs: &'m HashMap<String, Func>,
    pub buffers: Vec<Tensor>,
    /// What the parallel-state check knows, when it runs.
    pub check: Option<ParallelCheck>,
    /// This device among the devices running the kernel, when there are several.
    pub device: Option<Device<'m>>,
    /// The grid step being run (for what `tpu.log` prints and `cf.assert` reports).
    pub step: Vec<usize>,
    /// Where `tpu.log` and `tpu.log_buffer` lines go; `None`: stderr.
    pub debug_log: Option<crate::DebugLog>,
}

/// The tag of an element no grid step has stored.
pub(crate) const UNWRITTEN: i64 = -1;

/// Which buffers carry state from step to step (scratch, resident output blocks) and, per
/// element, the parallel coordinates of the step that stored it last, so that a load of what
/// a step of other parallel coordinates stored is refused.
pub(crate) struct ParallelCheck {
    /// The `parallel` grid dims and the grid.
    pub parallel: Vec<usize>,
    pub grid: Vec<usize>,
    /// Per buffer: what it is (for messages) and its tags (i64 tensors, the flattened
    /// parallel coordinates of the step that stored each element, or [`UNWRITTEN`]); `None`
    /// for buffers that hold no state (input blocks, SMEM tables).
    pub tags: Vec<Option<(String, Tensor)>>,
    /// The current step's flattened parallel coordinates.
    pub current: i64,
}

impl ParallelCheck {
    /// Parallel coordinates (one per parallel dim of `step`) as one number.
    pub fn id(&self, step: &[usize]) -> i64 {
        self.parallel
            .iter()
            .fold(0, |acc, &d| acc * self.grid[d] as i64 + step[d] as i64)
    }

    fn coords(&self, mut id: i64) -> Vec<i64> {
        let mut out = vec![0; self.parallel.len()];
        for (c, &d) in out.iter_mut().zip(&self.parallel).rev() {
            *c = id % self.grid[d] as i64;
            id /= self.grid[d] as i64;
        }
        out
    }

    /// Tags of a buffer nothing was stored in.
    pub fn unwritten(shape: &[usize]) -> Tensor {
        Tensor {
            elem: Elem::I32,
            shape: shape.to_vec(),
            data: Data::I(vec![UNWRITTEN; shape.iter().product()]),
        }
    }

    fn stored(&mut self, b: usize, starts: &[usize], sizes: &[usize]) {
        // Buffers allocated after the check was set up (a region's) hold no state across steps.
        if let Some(Some((_, tags))) = self.tags.get_mut(b) {
            let n = sizes.iter().product();
            tags.write_window(
                starts,
                &Tensor {
                    elem: Elem::I32,
                    shape: sizes.to_vec(),
                    data: Data::I(vec![self.current; n]),
                },
            );
        }
    }

    fn load(&self, loc: &str, b: usize, starts: &[usize], sizes: &[usize]) -> R<()> {
        let Some(Some((what, tags))) = self.tags.get(b) else {
            return Ok(());
        };
        let Data::I(ids) = tags.window(starts, sizes).data else {
            unreachable!("tags are integers")
        };
        let Some(&other) = ids.iter().find(|&&t| t != UNWRITTEN && t != self.current) else {
            return Ok(());
        };
        let (there, here) = (self.coords(other), self.coords(self.current));
        let dims: Vec<String> = self
            .parallel
            .iter()
            .zip(there.iter().zip(&here))
            .filter(|(_, (a, b))| a != b)
            .map(|(d, (a, b))| format!("parallel dim {d} is {a} there, {b} here"))
            .collect();
        Err(fail(
            loc,
            format!(
                "reads {what}, which a grid step of other parallel coordinates stored ({}): \
                 parallel iterations may run in any order, and on chips with two TensorCores \
                 (v4, v5p) on another core with its own buffers; mark the dim `arbitrary`",
                dims.join(", ")
            ),
        ))
    }
}

pub(crate) type R<T> = Result<T, EvalError>;

pub(crate) fn fail(loc: &str, message: impl Into<String>) -> EvalError {
    EvalError::Run {
        loc: loc.to_string(),
        message: message.into(),
    }
}

/// An op's own refusal at `loc`.
pub(crate) fn op_failed(loc: &str, error: OpError) -> EvalError {
    EvalError::Op {
        loc: loc.to_string(),
        error,
    }
}

/// Result of running a block: fell through, or hit a terminator with values.
pub(crate) enum Flow {
    Next,
    Yield(Vec<Val>),
    Return(Vec<Val>),
}

/// A tensor as `debug_print!` shows values (tessera-array's display of a host array).
fn render(t: &Tensor) -> String {
    crate::to_host(t.clone(), t.elem.dtype())
        .map(|a| a.to_string())
        .unwrap_or_else(|e| format!("<{e}>"))
}

/// `tag` with each `$N` replaced by `values[N]` (the TPU log's placeholders).
fn fill_placeholders(tag: &str, values: &[String]) -> String {
    let mut out = String::new();
    let mut chars = tag.chars().peekable();
    while let Some(c) = chars.next() {
        let mut digits = String::new();
        while c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            digits.extend(chars.next());
        }
        match digits.parse::<usize>().ok().and_then(|i| values.get(i)) {
            Some(v) => out.push_str(v),
            None => {
                out.push(c);
                out.push_str(&digits);
            }
        }
    }
    out
}

impl Machine<'_> {
    /// One line of `tpu.log` output, prefixed with the grid step (and the device, when
    /// several run), as tessera's interpreter prints `debug_print!`.
    fn print(&self, text: String) {
        let on = match &self.device {
            Some(d) => format!("device {}, ", d.id),
            None => String::new(),
        };
        let line = format!("{on}grid step {:?}: {text}", self.step);
        match &self.debug_log {
            Some(log) => log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line),
            None => eprintln!("{line}"),
        }
    }

    /// Writes `value` into buffer `b` at `starts` (in bounds, same element type; `op` names
    /// the store in errors) and records it for the parallel-state check.
    fn store(&mut self, loc: &str, b: usize, starts: &[i64], value: &Tensor, op: &str) -> R<()> {
        let buf = &mut self.buffers[b];
        let starts = in_bounds(starts, &value.shape, &buf.shape).map_err(|e| op_failed(loc, e))?;
        if buf.elem != value.elem {
            return Err(fail(loc, format!("{op}: element types differ")));
        }
        buf.write_window(&starts, value);
        if let Some(check) = &mut self.check {
            check.stored(b, &starts, &value.shape);
        }
        Ok(())
    }

    /// Calls `name` with `args`; returns what it returns.
    pub fn call(&mut self, name: &str, args: Vec<Val>) -> R<Vec<Val>> {
        let funcs = self.funcs;
        let f = funcs
            .get(name)
            .ok_or_else(|| fail(name, format!("no function @{name}")))?;
        if f.args.len() != args.len() {
            return Err(fail(
                name,
                format!(
                    "@{name} takes {} arguments, got {}",
                    f.args.len(),
                    args.len()
                ),
            ));
        }
        let mut env: HashMap<String, Val> = HashMap::new();
        for ((n, _), a) in f.args.iter().zip(args) {
            env.insert(n.clone(), a);
        }
        match self.block(&f.body, &mut env)? {
            Flow::Return(v) => Ok(v),
            _ => Err(fail(name, format!("@{name} ends without `return`"))),
        }
    }

    pub(crate) fn block(&mut self, ops: &[Op], env: &mut HashMap<String, Val>) -> R<Flow> {
        for op in ops {
            match self.op(op, env)? {
                Flow::Next => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Next)
    }

    fn op(&mut self, op: &Op, env: &mut HashMap<String, Val>) -> R<Flow> {
        let loc = op.loc.as_str();
        let get = |env: &HashMap<String, Val>, n: &str| -> R<Rc<Tensor>> {
            match env.get(n) {
                Some(Val::T(t)) => Ok(Rc::clone(t)),
                Some(Val::Ref(_) | Val::View(_)) => {
                    Err(fail(loc, format!("{n} is a memref, not a value")))
                }
                None => Err(fail(loc, format!("{n} is not defined"))),
            }
        };
        let mem = |env: &HashMap<String, Val>, n: &str| -> R<usize> {
            match env.get(n) {
                Some(Val::Ref(b)) => Ok(*b),
                _ => Err(fail(loc, format!("{n} is not a memref"))),
            }
        };
        let index_list = |env: &HashMap<String, Val>, ns: &[String]| -> R<Vec<i64>> {
            ns.iter()
                .map(|n| {
                    get(env, n)?
                        .int()
                        .ok_or_else(|| fail(loc, format!("{n} is not an integer scalar")))
                })
                .collect()
        };
        let out: Tensor = match &op.kind {
            OpKind::Constant { literal, ty } => {
                constant(literal, ty).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Binary { name, a, b, ty } => {
                let (a, b) = (get(env, a)?, get(env, b)?);
                check_type(&a, ty, loc)?;
                check_type(&b, ty, loc)?;
                binary(name, &a, &b).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Unary { name, x, ty } => {
                let x = get(env, x)?;
                check_type(&x, ty, loc)?;
                unary(name, &x).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Compare {
                float,
                pred,
                a,
                b,
                ty,
            } => {
                let (a, b) = (get(env, a)?, get(env, b)?);
                check_type(&a, ty, loc)?;
                check_type(&b, ty, loc)?;
                compare(*float, pred, &a, &b).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Select { cond, a, b, ty } => {
                let (c, a, b) = (get(env, cond)?, get(env, a)?, get(env, b)?);
                check_type(&a, ty, loc)?;
                check_type(&b, ty, loc)?;
                select(&c, &a, &b).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Cast { name, x, to } => {
                let x = get(env, x)?;
                cast(name, &x, to).map_err(|e| op_failed(loc, e))?
            }
            OpKind::VectorLoad {
                mem: m,
                indices,
                ty,
            } => {
                let b = mem(env, m)?;
                let buf = &self.buffers[b];
                let starts = index_list(env, indices)?;
                let sizes = ty.shape().to_vec();
                let starts =
                    in_bounds(&starts, &sizes, &buf.shape).map_err(|e| op_failed(loc, e))?;
                if buf.elem != ty.elem() {
                    return Err(fail(loc, "vector.load: element types differ"));
                }
                if let (Some(check), false) = (&self.check, op.unused) {
                    check.load(loc, b, &starts, &sizes)?;
                }
                buf.window(&starts, &sizes)
            }
            OpKind::VectorStore {
                mem: m,
                indices,
                value,
            } => {
                let v = get(env, value)?;
                let (b, starts) = (mem(env, m)?, index_list(env, indices)?);
                self.store(loc, b, &starts, &v, "tpu.vector_store")?;
                return Ok(Flow::Next);
            }
            OpKind::MemrefLoad { mem: m, indices } => {
                let b = mem(env, m)?;
                let buf = &self.buffers[b];
                let starts = index_list(env, indices)?;
                let ones = vec![1; starts.len()];
                let starts =
                    in_bounds(&starts, &ones, &buf.shape).map_err(|e| op_failed(loc, e))?;
                if let (Some(check), false) = (&self.check, op.unused) {
                    check.load(loc, b, &starts, &ones)?;
                }
                let mut t = buf.window(&starts, &ones);
                t.shape.clear();
                t
            }
            OpKind::MemrefStore {
                mem: m,
                indices,
                value,
            } => {
                let v = get(env, value)?;
                let (b, starts) = (mem(env, m)?, index_list(env, indices)?);
                if !v.shape.is_empty() {
                    return Err(fail(loc, "memref.store: needs a scalar"));
                }
                // One element: the scalar as a window of ones.
                let mut word = (*v).clone();
                word.shape = vec![1; starts.len()];
                self.store(loc, b, &starts, &word, "memref.store")?;
                return Ok(Flow::Next);
            }
            OpKind::Broadcast { x, to } => {
                let x = get(env, x)?;
                broadcast(&x, to.shape()).map_err(|e| op_failed(loc, e))?
            }
            OpKind::ShapeCast { x, to } => {
                let x = get(env, x)?;
                if x.len() != to.shape().iter().product::<usize>() || x.elem != to.elem() {
                    return Err(fail(
                        loc,
                        "vector.shape_cast changes the element count or type",
                    ));
                }
                Tensor {
                    shape: to.shape().to_vec(),
                    ..(*x).clone()
                }
            }
            OpKind::Extract { x, position } => {
                let x = get(env, x)?;
                if position.len() != x.shape.len()
                    || position.iter().zip(&x.shape).any(|(p, n)| p >= n)
                {
                    return Err(fail(loc, "vector.extract: position out of range"));
                }
                let mut t = x.window(position, &vec![1; position.len()]);
                t.shape.clear();
                t
            }
            OpKind::Iota { dim, ty } => {
                let shape = ty.shape();
                if *dim >= shape.len() || ty.elem() != Elem::I32 {
                    return Err(fail(
                        loc,
                        "tpu.iota: needs an i32 vector and a dim in range",
                    ));
                }
                Tensor {
                    elem: Elem::I32,
                    shape: shape.to_vec(),
                    data: Data::I(indices(shape).map(|i| i[*dim] as i64).collect()),
                }
            }
            OpKind::MultiReduction {
                kind,
                src,
                acc,
                dims,
                ty,
            } => {
                let (src, acc) = (get(env, src)?, get(env, acc)?);
                check_type(&acc, ty, loc)?;
                reduce(kind, &src, &acc, dims).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Concatenate { sources, dim, ty } => {
                let parts = sources.iter().map(|n| get(env, n)).collect::<R<Vec<_>>>()?;
                concatenate(&parts, *dim, ty).map_err(|e| op_failed(loc, e))?
            }
            OpKind::Matmul {
                lhs,
                rhs,
                acc,
                lhs_contract,
                rhs_contract,
                ty,
            } => {
                let (a, b, c) = (get(env, lhs)?, get(env, rhs)?, get(env, acc)?);
                check_type(&c, ty, loc)?;
                matmul(&a, &b, &c, *lhs_contract, *rhs_contract).map_err(|e| op_failed(loc, e))?
            }
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                let c = get(env, cond)?;
                match (&c.data, c.shape.is_empty()) {
                    (Data::B(v), true) => {
                        let region = if v[0] { then } else { otherwise };
                        match self.block(region, env)? {
                            Flow::Next | Flow::Yield(_) => {}
                            Flow::Return(_) => return Err(fail(loc, "`return` inside scf.if")),
                        }
                    }
                    _ => return Err(fail(loc, "scf.if needs an i1 scalar condition")),
                }
                return Ok(Flow::Next);
            }
            OpKind::For {
                iv,
                lo,
                hi,
                step,
                iter_args,
                body,
            } => {
                let scalar = |n: &str| -> R<(Elem, i64)> {
                    let t = get(env, n)?;
                    Ok((
                        t.elem,
                        t.int()
                            .ok_or_else(|| fail(loc, "scf.for bounds must be integers"))?,
                    ))
                };
                let ((elem, lo), (_, hi), (_, step)) = (scalar(lo)?, scalar(hi)?, scalar(step)?);
                if step <= 0 {
                    return Err(fail(loc, "scf.for needs a positive step"));
                }
                let mut carried: Vec<Val> = iter_args
                    .iter()
                    .map(|(_, init)| {
                        env.get(init)
                            .cloned()
                            .ok_or_else(|| fail(loc, format!("{init} is not defined")))
                    })
                    .collect::<R<_>>()?;
                let mut i = lo;
                while i < hi {
                    env.insert(iv.clone(), Val::T(Rc::new(Tensor::scalar_int(elem, i))));
                    for ((name, _), v) in iter_args.iter().zip(&carried) {
                        env.insert(name.clone(), v.clone());
                    }
                    match self.block(body, env)? {
                        Flow::Yield(v) if v.len() == carried.len() => carried = v,
                        Flow::Next if carried.is_empty() => {}
                        _ => return Err(fail(loc, "scf.for body must yield its carried values")),
                    }
                    i += step;
                }
                if carried.len() != op.results.len() {
                    return Err(fail(
                        loc,
                        "scf.for results and carried values differ in number",
                    ));
                }
                for (r, v) in op.results.iter().zip(carried) {
                    env.insert(r.clone(), v);
                }
                return Ok(Flow::Next);
            }
            OpKind::Mem(m) => return self.mem_op(m, op, env),
            OpKind::Log {
                tag,
                formatted,
                values,
            } => {
                let values = values
                    .iter()
                    .map(|v| Ok(render(&*get(env, v)?)))
                    .collect::<R<Vec<String>>>()?;
                let text = if *formatted {
                    fill_placeholders(tag, &values)
                } else {
                    std::iter::once(tag.clone())
                        .chain(values)
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                self.print(text);
                return Ok(Flow::Next);
            }
            OpKind::LogBuffer { mem: m, tag } => {
                let contents = render(&self.buffers[mem(env, m)?]);
                self.print(format!("{tag}{contents}"));
                return Ok(Flow::Next);
            }
            OpKind::Assert { cond, message } => {
                let c = get(env, cond)?;
                return match (&c.data, c.shape.is_empty()) {
                    (Data::B(v), true) if v[0] => Ok(Flow::Next),
                    (Data::B(_), true) => Err(fail(
                        loc,
                        format!(
                            "debug_check: failed: {message} (at grid step {:?})",
                            self.step
                        ),
                    )),
                    _ => Err(fail(loc, "cf.assert needs an i1 scalar condition")),
                };
            }
            OpKind::Yield { values } | OpKind::Return { values } => {
                let vals = values
                    .iter()
                    .map(|v| {
                        env.get(v)
                            .cloned()
                            .ok_or_else(|| fail(loc, format!("{v} is not defined")))
                    })
                    .collect::<R<Vec<_>>>()?;
                return Ok(if matches!(op.kind, OpKind::Yield { .. }) {
                    Flow::Yield(vals)
                } else {
                    Flow::Return(vals)
                });
            }
        };
        match op.results.as_slice() {
            [r] => {
                env.insert(r.clone(), Val::T(Rc::new(out)));
                Ok(Flow::Next)
            }
            _ => Err(fail(loc, "expected one result")),
        }
    }
}

fn check_type(t: &Tensor, ty: &Type, loc: &str) -> R<()> {
    if t.elem != ty.elem() || t.shape != ty.shape() {
        return Err(fail(
            loc,
            format!(
                "operand is {:?}{:?} but the op says {ty:?}",
                t.elem, t.shape
            ),
        ));
    }
    Ok(())
}

/// Window starts checked against the buffer; negative or past-the-end windows are errors
/// (Mosaic does not check them; the evaluator does).
fn in_bounds(starts: &[i64], sizes: &[usize], shape: &[usize]) -> Result<Vec<usize>, OpError> {
    if starts.len() != shape.len() || sizes.len() != shape.len() {
        return Err(OpError::WindowRank {
            indices: starts.len(),
            window_rank: sizes.len(),
            memref_rank: shape.len(),
        });
    }
    starts
        .iter()
        .zip(sizes)
        .zip(shape)
        .map(|((&s, &n), &d)| {
            if s < 0 || s as usize + n > d {
                Err(OpError::WindowOutside {
                    start: s,
                    end: s + n as i64,
                    size: d,
                })
            } else {
                Ok(s as usize)
            }
        })
        .collect()
}

fn scalar_literal(lit: &str, elem: Elem) -> Result<Data, OpError> {
    let bad = || OpError::Literal {
        literal: lit.to_string(),
        elem: elem.name(),
    };
    Ok(match elem {
        Elem::F32 | Elem::BF16 => {
            let x = if let Some(hex) = lit.strip_prefix("0x") {
                let bits = u32::from_str_radix(hex, 16).map_err(|_| bad())?;
                if elem == Elem::BF16 {
                    bf16::from_bits(u16::try_from(bits).map_err(|_| bad())?).to_f32()
                } else {
                    f32::from_bits(bits)
                }
            } else {
                if !lit.contains('.') {
                    return Err(OpError::FloatLiteralWithoutDot {
                        literal: lit.to_string(),
                    });
                }
                lit.parse::<f32>().map_err(|_| bad())?
            };
            Data::F(vec![round(elem, x)])
        }
        Elem::I1 => Data::B(vec![match lit {
            "true" => true,
            "false" => false,
            _ => return Err(bad()),
        }]),
        _ => Data::I(vec![wrap(elem, lit.parse::<i64>().map_err(|_| bad())?)]),
    })
}

fn constant(lit: &str, ty: &Type) -> Result<Tensor, OpError> {
    let one = scalar_literal(lit.trim(), ty.elem())?;
    let n: usize = ty.shape().iter().product();
    let data = match one {
        Data::F(v) => Data::F(vec![v[0]; n]),
        Data::I(v) => Data::I(vec![v[0]; n]),
        Data::B(v) => Data::B(vec![v[0]; n]),
    };
    Ok(Tensor {
        elem: ty.elem(),
        shape: ty.shape().to_vec(),
        data,
    })
}

fn binary(name: &str, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    let refuse = |operands| OpError::Operands {
        op: name.to_string(),
        operands,
    };
    let e = a.elem;
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            let f: fn(f32, f32) -> f32 = match name {
                "arith.addf" => |x, y| x + y,
                "arith.subf" => |x, y| x - y,
                "arith.mulf" => |x, y| x * y,
                "arith.divf" => |x, y| x / y,
                "arith.remf" => |x, y| x % y,
                "arith.maximumf" => |x, y| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else {
                        x.max(y)
                    }
                },
                "arith.minimumf" => |x, y| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else {
                        x.min(y)
                    }
                },
                _ => return Err(refuse(Operands::Floats)),
            };
            Data::F(x.iter().zip(y).map(|(&x, &y)| round(e, f(x, y))).collect())
        }
        (Data::I(x), Data::I(y)) => {
            let mut out = Vec::with_capacity(x.len());
            for (&x, &y) in x.iter().zip(y) {
                out.push(wrap(
                    e,
                    match name {
                        "arith.addi" => x.wrapping_add(y),
                        "arith.subi" => x.wrapping_sub(y),
                        "arith.muli" => x.wrapping_mul(y),
                        "arith.divsi" | "arith.remsi" if y == 0 => {
                            return Err(OpError::DivisionByZero {
                                op: name.to_string(),
                            })
                        }
                        "arith.divsi" => x / y,
                        "arith.remsi" => x % y,
                        "arith.maxsi" => x.max(y),
                        "arith.minsi" => x.min(y),
                        "arith.andi" => x & y,
                        "arith.ori" => x | y,
                        "arith.xori" => x ^ y,
                        _ => return Err(refuse(Operands::Integers)),
                    },
                ));
            }
            Data::I(out)
        }
        (Data::B(x), Data::B(y)) => {
            let f: fn(bool, bool) -> bool = match name {
                "arith.andi" => |x, y| x & y,
                "arith.ori" => |x, y| x | y,
                "arith.xori" => |x, y| x ^ y,
                _ => return Err(refuse(Operands::I1)),
            };
            Data::B(x.iter().zip(y).map(|(&x, &y)| f(x, y)).collect())
        }
        _ => return Err(OpError::OperandElems),
    };
    Ok(Tensor {
        elem: e,
        shape: a.shape.clone(),
        data,
    })
}

fn unary(name: &str, x: &Tensor) -> Result<Tensor, OpError> {
    let e = x.elem;
    let data = match (&x.data, name) {
        (Data::I(v), "math.absi") => {
            Data::I(v.iter().map(|&v| wrap(e, v.wrapping_abs())).collect())
        }
        (Data::F(v), _) => {
            let f: fn(f32) -> f32 = match name {
                "arith.negf" => |x| -x,
                "math.exp" => f32::exp,
                "math.log" => f32::ln,
                "math.tanh" => f32::tanh,
                "math.sqrt" => f32::sqrt,
                "math.rsqrt" => |x| 1.0 / x.sqrt(),
                "math.absf" => f32::abs,
                _ => {
                    return Err(OpError::Operands {
                        op: name.to_string(),
                        operands: Operands::Floats,
                    })
                }
            };
            Data::F(v.iter().map(|&x| round(e, f(x))).collect())
        }
        _ => {
            return Err(OpError::Elem {
                op: name.to_string(),
                elem: e.name(),
            })
        }
    };
    Ok(Tensor {
        elem: e,
        shape: x.shape.clone(),
        data,
    })
}

fn compare(float: bool, pred: &str, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    let int_predicate = |operands| OpError::IntPredicate {
        pred: pred.to_string(),
        operands,
    };
    use std::cmp::Ordering::*;
    let out: Vec<bool> = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) if float => {
            let f: fn(f32, f32) -> bool = match pred {
                "oeq" => |x, y| x == y,
                "une" => |x, y| x != y,
                "olt" => |x, y| x < y,
                "ole" => |x, y| x <= y,
                "ogt" => |x, y| x > y,
                "oge" => |x, y| x >= y,
                _ => {
                    return Err(OpError::FloatPredicate {
                        pred: pred.to_string(),
                    })
                }
            };
            x.iter().zip(y).map(|(&x, &y)| f(x, y)).collect()
        }
        (Data::I(x), Data::I(y)) if !float => {
            let f: fn(std::cmp::Ordering) -> bool = match pred {
                "eq" => |o| o == Equal,
                "ne" => |o| o != Equal,
                "slt" => |o| o == Less,
                "sle" => |o| o != Greater,
                "sgt" => |o| o == Greater,
                "sge" => |o| o != Less,
                _ => return Err(int_predicate(Operands::Integers)),
            };
            x.iter().zip(y).map(|(x, y)| f(x.cmp(y))).collect()
        }
        (Data::B(x), Data::B(y)) if !float => {
            let f: fn(std::cmp::Ordering) -> bool = match pred {
                "eq" => |o| o == Equal,
                "ne" => |o| o != Equal,
                "ult" => |o| o == Less,
                "ule" => |o| o != Greater,
                "ugt" => |o| o == Greater,
                "uge" => |o| o != Less,
                _ => return Err(int_predicate(Operands::I1)),
            };
            x.iter().zip(y).map(|(x, y)| f(x.cmp(y))).collect()
        }
        _ => return Err(OpError::CompareOperands),
    };
    Ok(Tensor {
        elem: Elem::I1,
        shape: a.shape.clone(),
        data: Data::B(out),
    })
}

fn select(c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    let Data::B(cv) = &c.data else {
        return Err(OpError::SelectCondition);
    };
    let pick = |i: usize| if c.shape.is_empty() { cv[0] } else { cv[i] };
    if !c.shape.is_empty() && c.shape != a.shape {
        return Err(OpError::SelectConditionShape);
    }
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Data::F(
            (0..x.len())
                .map(|i| if pick(i) { x[i] } else { y[i] })
                .collect(),
        ),
        (Data::I(x), Data::I(y)) => Data::I(
            (0..x.len())
                .map(|i| if pick(i) { x[i] } else { y[i] })
                .collect(),
        ),
        (Data::B(x), Data::B(y)) => Data::B(
            (0..x.len())
                .map(|i| if pick(i) { x[i] } else { y[i] })
                .collect(),
        ),
        _ => return Err(OpError::SelectBranches),
    };
    Ok(Tensor {
        elem: a.elem,
        shape: a.shape.clone(),
        data,
    })
}

fn cast(name: &str, x: &Tensor, to: &Type) -> Result<Tensor, OpError> {
    if x.shape != to.shape() {
        return Err(OpError::CastShape {
            op: name.to_string(),
        });
    }
    let te = to.elem();
    let data = match (name, &x.data) {
        ("arith.extf", Data::F(v)) | ("arith.truncf", Data::F(v)) if te.is_float() => {
            Data::F(v.iter().map(|&x| round(te, x)).collect())
        }
        ("arith.sitofp", Data::I(v)) if te.is_float() => {
            Data::F(v.iter().map(|&x| round(te, x as f32)).collect())
        }
        // Truncates toward zero, saturating (NaN gives 0), as the interpreter does; MLIR leaves
        // out-of-range values undefined.
        ("arith.fptosi", Data::F(v)) => Data::I(
            v.iter()
                .map(|&x| match te {
                    Elem::I8 => x as i8 as i64,
                    _ => x as i32 as i64,
                })
                .collect(),
        ),
        ("arith.extsi" | "arith.trunci" | "arith.index_cast", Data::I(v)) => {
            Data::I(v.iter().map(|&x| wrap(te, x)).collect())
        }
        ("arith.extui", Data::B(v)) => Data::I(v.iter().map(|&x| x as i64).collect()),
        _ => {
            return Err(OpError::Cast {
                op: name.to_string(),
                from: x.elem.name(),
                to: te.name(),
            })
        }
    };
    Ok(Tensor {
        elem: te,
        shape: x.shape.clone(),
        data,
    })
}

/// `vector.broadcast`: trailing dims aligned, each source dim equal or 1.
fn broadcast(x: &Tensor, shape: &[usize]) -> Result<Tensor, OpError> {
    if x.shape.len() > shape.len() {
        return Err(OpError::BroadcastToLowerRank);
    }
    let off = shape.len() - x.shape.len();
    for (d, &n) in x.shape.iter().enumerate() {
        if n != 1 && n != shape[d + off] {
            return Err(OpError::Broadcast {
                from: x.shape.clone(),
                to: shape.to_vec(),
            });
        }
    }
    let st = strides(&x.shape);
    let picks: Vec<usize> = indices(shape)
        .map(|idx| {
            x.shape
                .iter()
                .enumerate()
                .map(|(d, &n)| if n == 1 { 0 } else { idx[d + off] * st[d] })
                .sum()
        })
        .collect();
    Ok(Tensor {
        elem: x.elem,
        shape: shape.to_vec(),
        data: gather(&x.data, &picks),
    })
}

fn reduce(kind: &str, src: &Tensor, acc: &Tensor, dims: &[usize]) -> Result<Tensor, OpError> {
    let refuse = |operands| OpError::ReductionKind {
        kind: kind.to_string(),
        operands,
    };
    let kept: Vec<usize> = (0..src.shape.len()).filter(|d| !dims.contains(d)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&d| src.shape[d]).collect();
    if out_shape != acc.shape || dims.iter().any(|&d| d >= src.shape.len()) {
        return Err(OpError::ReductionAccumulator);
    }
    let red_shape: Vec<usize> = dims.iter().map(|&d| src.shape[d]).collect();
    let st = strides(&src.shape);
    let e = src.elem;
    let mut data = acc.data.clone();
    for (o, oidx) in indices(&out_shape).enumerate() {
        let base: usize = kept.iter().zip(&oidx).map(|(&d, &i)| i * st[d]).sum();
        for ridx in indices(&red_shape) {
            let at = base
                + dims
                    .iter()
                    .zip(&ridx)
                    .map(|(&d, &i)| i * st[d])
                    .sum::<usize>();
            match (&mut data, &src.data) {
                (Data::F(a), Data::F(s)) => {
                    let (x, y) = (a[o], s[at]);
                    a[o] = match kind {
                        "add" => x + y,
                        "maximumf" => {
                            if x.is_nan() || y.is_nan() {
                                f32::NAN
                            } else {
                                x.max(y)
                            }
                        }
                        "minimumf" => {
                            if x.is_nan() || y.is_nan() {
                                f32::NAN
                            } else {
                                x.min(y)
                            }
                        }
                        _ => return Err(refuse(Operands::Floats)),
                    };
                }
                (Data::I(a), Data::I(s)) => {
                    let (x, y) = (a[o], s[at]);
                    a[o] = wrap(
                        e,
                        match kind {
                            "add" => x.wrapping_add(y),
                            "maxsi" => x.max(y),
                            "minsi" => x.min(y),
                            _ => return Err(refuse(Operands::Integers)),
                        },
                    );
                }
                _ => return Err(OpError::ReductionElem),
            }
        }
    }
    if let Data::F(v) = &mut data {
        v.iter_mut().for_each(|x| *x = round(e, *x));
    }
    Ok(Tensor {
        elem: acc.elem,
        shape: out_shape,
        data,
    })
}

/// `tpu.concatenate`: the parts agree in element type and in every dim but `dim`, whose
/// sizes add up to the result's.
fn concatenate(parts: &[Rc<Tensor>], dim: usize, ty: &Type) -> Result<Tensor, OpError> {
    let shape = ty.shape();
    let fits = |t: &Tensor| {
        t.elem == ty.elem()
            && t.shape.len() == shape.len()
            && (0..shape.len()).all(|d| d == dim || t.shape[d] == shape[d])
    };
    if dim >= shape.len()
        || !parts.iter().all(|t| fits(t))
        || parts.iter().map(|t| t.shape[dim]).sum::<usize>() != shape[dim]
    {
        return Err(OpError::Concatenate {
            parts: parts.iter().map(|t| t.shape.clone()).collect(),
            shape: shape.to_vec(),
            dim,
        });
    }
    let mut out = Tensor::garbage(ty.elem(), shape);
    let mut at = vec![0; shape.len()];
    for t in parts {
        out.write_window(&at, t);
        at[dim] += t.shape[dim];
    }
    Ok(out)
}

/// `acc + lhs . rhs` with the given contracting dims, products and sums in f32 (i32 for
/// integers), summed in order of the contracting index.
fn matmul(a: &Tensor, b: &Tensor, acc: &Tensor, ca: usize, cb: usize) -> Result<Tensor, OpError> {
    if a.shape.len() != 2 || b.shape.len() != 2 || ca > 1 || cb > 1 {
        return Err(OpError::MatmulRank);
    }
    let (m, k) = (a.shape[1 - ca], a.shape[ca]);
    let (kb, n) = (b.shape[cb], b.shape[1 - cb]);
    if k != kb || acc.shape != [m, n] {
        return Err(OpError::MatmulShapes);
    }
    let a_at = |i: usize, p: usize| if ca == 1 { i * k + p } else { p * m + i };
    let b_at = |p: usize, j: usize| if cb == 0 { p * n + j } else { j * k + p };
    let data = match (&a.data, &b.data, &acc.data) {
        (Data::F(x), Data::F(y), Data::F(c)) => {
            let mut sum = vec![0f32; m * n];
            for i in 0..m {
                for p in 0..k {
                    let xv = x[a_at(i, p)];
                    for j in 0..n {
                        sum[i * n + j] += xv * y[b_at(p, j)];
                    }
                }
            }
            Data::F(
                c.iter()
                    .zip(sum)
                    .map(|(&c, s)| round(acc.elem, c + s))
                    .collect(),
            )
        }
        (Data::I(x), Data::I(y), Data::I(c)) => {
            let mut sum = vec![0i64; m * n];
            for i in 0..m {
                for p in 0..k {
                    for j in 0..n {
                        sum[i * n + j] =
                            wrap(Elem::I32, sum[i * n + j] + x[a_at(i, p)] * y[b_at(p, j)]);
                    }
                }
            }
            Data::I(
                c.iter()
                    .zip(sum)
                    .map(|(&c, s)| wrap(acc.elem, c + s))
                    .collect(),
            )
        }
        _ => return Err(OpError::MatmulTypes),
    };
    Ok(Tensor {
        elem: acc.elem,
        shape: vec![m, n],
        data,
    })
}
