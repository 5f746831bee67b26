//! Kernel -> StableHLO: the kernel expanded into plain StableHLO so it runs on any PJRT
//! backend (the XLA CPU plugin here, the CUDA plugin on a GPU machine).
//!
//! The grid becomes one counted `while` loop over the grid steps in the interpreter's order
//! (row-major, last dim fastest). Each step evaluates the index maps (reading scalar prefetch
//! from SMEM tables as on TPU), takes input blocks with `dynamic_slice`, runs the body with
//! scratch and output blocks as loop-carried values (stores become functional updates; `when`
//! becomes `stablehlo.if` and `fori_loop` a nested `while` carrying the refs they write), and
//! writes each output block back with `dynamic_update_slice`. Buffers start as the same
//! garbage the interpreter uses, so the two backends agree bit for bit on what is computed.
//!
//! One rule per IR op, in an exhaustive `match`: a new op is a build error here until it
//! has its lowering.

use std::collections::{BTreeSet, HashMap};

use tessera_hlo::{self as hlo, DotDims, FuncBuilder, HloError, Module, Reducer, TensorType};

use crate::error::{KernelError, Problem, ProblemKind};
use crate::interpret::garbage_literal;
use crate::ir::{
    BinaryOp, CmpOp, DType, Inst, Kernel, Literal, Loc, Op, OperandRole, ReduceOp, RefId, Region,
    Slice, UnaryOp, ValueId,
};

/// Lowers `k` into a module whose public `@main` takes the kernel's arguments (scalar
/// prefetch and inputs, in order) and returns its outputs.
pub fn lower_module(k: &Kernel) -> Result<Module, KernelError> {
    let mut module = Module::new(format!("tessera_{}", k.name));
    let mut f = module.func("main");
    let fail = |e: HloError| lower_error(k, "arguments", Loc::internal(), e);
    let mut args = Vec::new();
    for (_, o) in k
        .operands
        .iter()
        .enumerate()
        .filter(|(_, o)| is_arg(o.role))
    {
        args.push(f.arg(tensor_type(o.dtype, &o.array_shape)).map_err(fail)?);
    }
    let outs = lower_into(k, &mut f, &args)?;
    f.finish(&outs).map_err(fail)?;
    Ok(module)
}

/// Lowers `k` inline into the function being built by `f`, applied to `args` (scalar
/// prefetch and inputs as whole arrays, in order); returns the output arrays. This is how a
/// kernel composes into a larger program (collectives around it, autodiff).
pub fn lower_into(
    k: &Kernel,
    f: &mut FuncBuilder<'_>,
    args: &[hlo::Value],
) -> Result<Vec<hlo::Value>, KernelError> {
    let mut lower = Lower {
        k,
        env: HashMap::new(),
        refs: HashMap::new(),
        grid: Vec::new(),
    };
    lower.kernel(f, args)
}

fn is_arg(role: OperandRole) -> bool {
    matches!(role, OperandRole::Input | OperandRole::ScalarPrefetch)
}

fn tensor_type(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dims(shape), dtype)
}

fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

fn lower_error(k: &Kernel, op: &str, loc: Loc, e: HloError) -> KernelError {
    KernelError::new(
        &k.name,
        vec![Problem {
            kind: ProblemKind::Lower,
            subject: format!("`{op}`"),
            message: format!("lowering to StableHLO failed (a tessera bug; please report it): {e}"),
            loc: Some(loc),
        }],
    )
}

struct Lower<'k> {
    k: &'k Kernel,
    /// IR value -> StableHLO value.
    env: HashMap<ValueId, hlo::Value>,
    /// Current value of each ref the body sees: input blocks of this step, scratch and output
    /// block buffers (updated by stores), and whole SMEM tables.
    refs: HashMap<RefId, hlo::Value>,
    /// The grid indices of the current step (i32 scalars).
    grid: Vec<hlo::Value>,
}

type R<T> = Result<T, KernelError>;

impl<'k> Lower<'k> {
    fn err(&self, inst: &Inst) -> impl Fn(HloError) -> KernelError + 'k {
        let (k, name, loc) = (self.k, inst.op.name(), inst.loc);
        move |e| lower_error(k, name, loc, e)
    }

    fn kernel_err(&self) -> impl Fn(HloError) -> KernelError + 'k {
        let k = self.k;
        move |e| lower_error(k, "grid", k.loc, e)
    }

    fn kernel(&mut self, f: &mut FuncBuilder<'_>, args: &[hlo::Value]) -> R<Vec<hlo::Value>> {
        let k = self.k;
        let e = self.kernel_err();
        let arg_refs: Vec<RefId> = (0..k.operands.len() as u32)
            .map(RefId)
            .filter(|r| is_arg(k.operand(*r).role))
            .collect();
        if arg_refs.len() != args.len() {
            return Err(KernelError::single(
                &k.name,
                ProblemKind::Argument,
                "arguments",
                format!("expected {} arrays, got {}", arg_refs.len(), args.len()),
            ));
        }
        // Whole arrays by ref (inputs, prefetch); carried state in a fixed order.
        let mut arrays: HashMap<RefId, hlo::Value> =
            arg_refs.iter().copied().zip(args.iter().copied()).collect();
        let outputs: Vec<RefId> = k
            .operands_with(OperandRole::Output)
            .map(|(r, _)| r)
            .collect();
        let scratch: Vec<RefId> = k
            .operands_with(OperandRole::Scratch)
            .map(|(r, _)| r)
            .collect();
        let mut init = Vec::new();
        for &r in &outputs {
            let o = k.operand(r);
            init.push(garbage(f, o.dtype, &o.array_shape).map_err(&e)?);
        }
        for &r in outputs.iter().chain(&scratch) {
            let o = k.operand(r);
            init.push(garbage(f, o.dtype, &o.view_shape()).map_err(&e)?);
        }
        let steps: usize = k.grid.iter().product();
        let lo = f.scalar(0.0, DType::I32).map_err(&e)?;
        let hi = f.scalar(steps as f64, DType::I32).map_err(&e)?;
        let n_out = outputs.len();
        let prefetch: Vec<RefId> = k
            .operands_with(OperandRole::ScalarPrefetch)
            .map(|(r, _)| r)
            .collect();
        let result = f.fori_loop(lo, hi, &init, |b, step, carried| -> R<Vec<hlo::Value>> {
            let e = self.kernel_err();
            self.grid = grid_indices(b, step, &k.grid).map_err(&e)?;
            self.refs.clear();
            for &r in &prefetch {
                self.refs.insert(r, arrays[&r]);
            }
            let (out_arrays, buffers) = carried.split_at(n_out);
            for (&r, &v) in outputs.iter().chain(&scratch).zip(buffers) {
                self.refs.insert(r, v);
            }
            // Input blocks of this step.
            let mut out_offsets = HashMap::new();
            for (i, o) in k.operands.iter().enumerate() {
                let r = RefId(i as u32);
                let Some(mapping) = &o.block else { continue };
                let offsets = self.block_offsets(b, r, &mapping.index_map)?;
                match o.role {
                    OperandRole::Input => {
                        let block = b
                            .dynamic_slice(arrays[&r], &offsets, &dims(&o.block_sizes()))
                            .map_err(&e)?;
                        let block = b.reshape(block, &dims(&o.view_shape())).map_err(&e)?;
                        self.refs.insert(r, block);
                    }
                    OperandRole::Output => {
                        out_offsets.insert(r, offsets);
                    }
                    _ => {}
                }
            }
            self.region(b, &k.body, &[])?;
            // Write output blocks through to their arrays.
            let mut next = Vec::with_capacity(carried.len());
            for (&r, &array) in outputs.iter().zip(out_arrays) {
                let o = k.operand(r);
                let block = b
                    .reshape(self.refs[&r], &dims(&o.block_sizes()))
                    .map_err(&e)?;
                next.push(
                    b.dynamic_update_slice(array, block, &out_offsets[&r])
                        .map_err(&e)?,
                );
            }
            for &r in outputs.iter().chain(&scratch) {
                next.push(self.refs[&r]);
            }
            Ok(next)
        })?;
        arrays.clear();
        Ok(result[..n_out].to_vec())
    }

    /// Element offsets of the block the index map selects at this step.
    fn block_offsets(
        &mut self,
        b: &mut FuncBuilder<'_>,
        r: RefId,
        map: &Region,
    ) -> R<Vec<hlo::Value>> {
        let grid = self.grid.clone();
        let block_idx = self.region(b, map, &grid)?;
        let sizes = self.k.operand(r).block_sizes();
        let e = self.kernel_err();
        block_idx
            .iter()
            .zip(&sizes)
            .map(|(&i, &s)| {
                let s = b.scalar(s as f64, DType::I32)?;
                b.mul(i, s)
            })
            .collect::<Result<Vec<_>, HloError>>()
            .map_err(e)
    }

    /// Lowers a region with `args` bound to its params; returns the lowered yields.
    fn region(
        &mut self,
        b: &mut FuncBuilder<'_>,
        r: &Region,
        args: &[hlo::Value],
    ) -> R<Vec<hlo::Value>> {
        for (&p, &a) in r.params.iter().zip(args) {
            self.env.insert(p, a);
        }
        for inst in &r.insts {
            self.inst(b, inst)?;
        }
        Ok(r.yields.iter().map(|y| self.env[y]).collect())
    }

    fn v(&self, id: ValueId) -> hlo::Value {
        self.env[&id]
    }

    fn starts(
        &self,
        b: &mut FuncBuilder<'_>,
        slices: &[Slice],
    ) -> Result<Vec<hlo::Value>, HloError> {
        slices
            .iter()
            .map(|s| match *s {
                Slice::Full => b.scalar(0.0, DType::I32),
                Slice::Static { start, .. } => b.scalar(start as f64, DType::I32),
                Slice::Dynamic { start, .. } => Ok(self.v(start)),
            })
            .collect()
    }

    fn inst(&mut self, b: &mut FuncBuilder<'_>, inst: &Inst) -> R<()> {
        let e = self.err(inst);
        let k = self.k;
        let result_ty = |i: usize| k.value_type(inst.results[i]).clone();
        let out: hlo::Value = match &inst.op {
            Op::ProgramId { axis } => self.grid[*axis],
            Op::NumPrograms { axis } => b.scalar(k.grid[*axis] as f64, DType::I32).map_err(e)?,
            Op::Constant { value, ty } => {
                let v = match *value {
                    Literal::Float(x) => x,
                    Literal::Int(i) => i as f64,
                    Literal::Bool(t) => f64::from(u8::from(t)),
                };
                b.splat(v, tensor_type(ty.dtype, &ty.shape)).map_err(e)?
            }
            Op::Load { src, slices } => {
                let base = self.refs[src];
                if slices.iter().all(|s| *s == Slice::Full) {
                    base
                } else {
                    let view = k.operand(*src).view_shape();
                    let sizes: Vec<i64> = slices
                        .iter()
                        .zip(&view)
                        .map(|(s, &n)| s.len(n) as i64)
                        .collect();
                    let starts = self.starts(b, slices).map_err(&e)?;
                    b.dynamic_slice(base, &starts, &sizes).map_err(e)?
                }
            }
            Op::Store { dst, slices, value } => {
                let v = self.v(*value);
                let next = if slices.iter().all(|s| *s == Slice::Full) {
                    v
                } else {
                    let starts = self.starts(b, slices).map_err(&e)?;
                    b.dynamic_update_slice(self.refs[dst], v, &starts)
                        .map_err(e)?
                };
                self.refs.insert(*dst, next);
                return Ok(());
            }
            Op::LoadScalar { src, indices } => {
                let table = self.refs[src];
                let starts: Vec<hlo::Value> = indices.iter().map(|i| self.v(*i)).collect();
                let one = b
                    .dynamic_slice(table, &starts, &vec![1; starts.len()])
                    .map_err(&e)?;
                b.reshape(one, &[]).map_err(e)?
            }
            Op::Unary { op, x } => {
                let x = self.v(*x);
                match op {
                    UnaryOp::Neg => b.neg(x),
                    UnaryOp::Exp => b.exp(x),
                    UnaryOp::Log => b.log(x),
                    UnaryOp::Tanh => b.tanh(x),
                    UnaryOp::Sqrt => b.sqrt(x),
                    UnaryOp::Rsqrt => b.rsqrt(x),
                    UnaryOp::Abs => b.abs(x),
                    UnaryOp::Not => b.not(x),
                }
                .map_err(e)?
            }
            Op::Binary { op, lhs, rhs } => {
                let (l, r) = (self.v(*lhs), self.v(*rhs));
                let op = match op {
                    BinaryOp::Add => hlo::BinaryOp::Add,
                    BinaryOp::Sub => hlo::BinaryOp::Sub,
                    BinaryOp::Mul => hlo::BinaryOp::Mul,
                    BinaryOp::Div => hlo::BinaryOp::Div,
                    BinaryOp::Rem => hlo::BinaryOp::Rem,
                    BinaryOp::Max => hlo::BinaryOp::Max,
                    BinaryOp::Min => hlo::BinaryOp::Min,
                    BinaryOp::And => hlo::BinaryOp::And,
                    BinaryOp::Or => hlo::BinaryOp::Or,
                    BinaryOp::Xor => hlo::BinaryOp::Xor,
                };
                b.binary(op, l, r).map_err(e)?
            }
            Op::Compare { op, lhs, rhs } => {
                let dir = match op {
                    CmpOp::Eq => hlo::ComparisonDirection::Eq,
                    CmpOp::Ne => hlo::ComparisonDirection::Ne,
                    CmpOp::Lt => hlo::ComparisonDirection::Lt,
                    CmpOp::Le => hlo::ComparisonDirection::Le,
                    CmpOp::Gt => hlo::ComparisonDirection::Gt,
                    CmpOp::Ge => hlo::ComparisonDirection::Ge,
                };
                b.compare(dir, self.v(*lhs), self.v(*rhs)).map_err(e)?
            }
            Op::Select {
                cond,
                on_true,
                on_false,
            } => b
                .select(self.v(*cond), self.v(*on_true), self.v(*on_false))
                .map_err(e)?,
            Op::Cast { x, to } => b.convert(self.v(*x), *to).map_err(e)?,
            Op::Broadcast { x, shape } => {
                let from = k.value_type(*x).rank();
                let mapping: Vec<i64> = ((shape.len() - from)..shape.len())
                    .map(|d| d as i64)
                    .collect();
                b.broadcast_in_dim(self.v(*x), &dims(shape), &mapping)
                    .map_err(e)?
            }
            Op::Reshape { x, shape } => b.reshape(self.v(*x), &dims(shape)).map_err(e)?,
            Op::Iota { ty, dim } => b
                .iota(tensor_type(ty.dtype, &ty.shape), *dim as i64)
                .map_err(e)?,
            Op::Reduce { op, x, axis } => {
                let reducer = match op {
                    ReduceOp::Sum => Reducer::Sum,
                    ReduceOp::Max => Reducer::Max,
                    ReduceOp::Min => Reducer::Min,
                };
                let x_ty = k.value_type(*x).dtype;
                let axis = [*axis as i64];
                if x_ty == DType::BF16 && *op == ReduceOp::Sum {
                    // Accumulate in f32 and round once, as TPUs (and the interpreter) do.
                    let wide = b.convert(self.v(*x), DType::F32).map_err(&e)?;
                    let s = b.reduce(wide, &axis, reducer).map_err(&e)?;
                    b.convert(s, DType::BF16).map_err(e)?
                } else {
                    b.reduce(self.v(*x), &axis, reducer).map_err(e)?
                }
            }
            Op::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => {
                let dims = DotDims::contracting(
                    [if *transpose_lhs { 0 } else { 1 }],
                    [if *transpose_rhs { 1 } else { 0 }],
                );
                b.dot_general(self.v(*lhs), self.v(*rhs), &dims, result_ty(0).dtype, None)
                    .map_err(e)?
            }
            Op::When { cond, then } => {
                let written: Vec<RefId> = written_refs(then).into_iter().collect();
                if written.is_empty() {
                    // Nothing observable happens inside: loads and arithmetic only.
                    return Ok(());
                }
                let before: Vec<hlo::Value> = written.iter().map(|r| self.refs[r]).collect();
                let cond = self.v(*cond);
                let after = b.if_else(
                    cond,
                    |b| -> R<Vec<hlo::Value>> {
                        self.region(b, then, &[])?;
                        Ok(written.iter().map(|r| self.refs[r]).collect())
                    },
                    |_| Ok(before.clone()),
                )?;
                for (r, v) in written.iter().zip(after) {
                    self.refs.insert(*r, v);
                }
                return Ok(());
            }
            Op::ForLoop { lo, hi, init, body } => {
                let written: Vec<RefId> = written_refs(body).into_iter().collect();
                let n = init.len();
                let mut carried: Vec<hlo::Value> = init.iter().map(|v| self.v(*v)).collect();
                carried.extend(written.iter().map(|r| self.refs[r]));
                let (lo, hi) = (self.v(*lo), self.v(*hi));
                let out = b.fori_loop(lo, hi, &carried, |b, i, args| -> R<Vec<hlo::Value>> {
                    for (r, &v) in written.iter().zip(&args[n..]) {
                        self.refs.insert(*r, v);
                    }
                    let mut params = vec![i];
                    params.extend_from_slice(&args[..n]);
                    let mut next = self.region(b, body, &params)?;
                    next.extend(written.iter().map(|r| self.refs[r]));
                    Ok(next)
                })?;
                for (r, &v) in written.iter().zip(&out[n..]) {
                    self.refs.insert(*r, v);
                }
                for (&res, &v) in inst.results.iter().zip(&out[..n]) {
                    self.env.insert(res, v);
                }
                return Ok(());
            }
        };
        self.env.insert(inst.results[0], out);
        Ok(())
    }
}

/// Refs stored to anywhere inside `r` (including nested regions), in id order.
fn written_refs(r: &Region) -> BTreeSet<RefId> {
    let mut out = BTreeSet::new();
    for inst in &r.insts {
        if let Op::Store { dst, .. } = inst.op {
            out.insert(dst);
        }
        for nested in inst.op.regions() {
            out.extend(written_refs(nested));
        }
    }
    out
}

/// The grid indices of flat step `step` (row-major, last dim fastest), as i32 scalars.
fn grid_indices(
    b: &mut FuncBuilder<'_>,
    step: hlo::Value,
    grid: &[usize],
) -> Result<Vec<hlo::Value>, HloError> {
    let mut out = Vec::with_capacity(grid.len());
    let mut stride: usize = grid.iter().product();
    for &n in grid {
        stride /= n;
        let s = b.scalar(stride as f64, DType::I32)?;
        let q = b.div(step, s)?;
        let n = b.scalar(n as f64, DType::I32)?;
        out.push(b.rem(q, n)?);
    }
    Ok(out)
}

/// A buffer filled with the interpreter's garbage (NaN for floats), so both backends compute
/// the same thing even for a kernel that reads what it never wrote.
fn garbage(b: &mut FuncBuilder<'_>, dtype: DType, shape: &[usize]) -> Result<hlo::Value, HloError> {
    let v = match garbage_literal(dtype) {
        Literal::Float(x) => x,
        Literal::Int(i) => i as f64,
        Literal::Bool(t) => f64::from(u8::from(t)),
    };
    b.splat(v, tensor_type(dtype, shape))
}

/// Errors of the StableHLO builder's own region plumbing (a `while` or `if` it could not
/// assemble); op-level errors are converted with the op and location instead.
impl From<HloError> for KernelError {
    fn from(e: HloError) -> Self {
        KernelError::single(
            "<stablehlo>",
            ProblemKind::Lower,
            "stablehlo",
            format!("lowering to StableHLO failed (a tessera bug; please report it): {e}"),
        )
    }
}
