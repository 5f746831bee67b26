//! The operations of the kernel IR and their shape/dtype inference.
//!
//! Every op carries what it needs to infer its result types from its operands' types, so the
//! verifier can recompute and compare, and every backend is an exhaustive `match` over [`Op`].

use super::infer_error::{InferError, NotCopyableWhy, WantedSemaphore};
use super::types::{DType, Literal, RefId, SemKind, ValueId, ValueType};
use super::{MemorySpace, Operand, OperandRole};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Tanh,
    Sqrt,
    Rsqrt,
    Abs,
    /// Logical not of a bool.
    Not,
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Not => "not",
        }
    }

    fn accepts(self, d: DType) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs => !d.is_bool(),
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Sqrt | UnaryOp::Rsqrt => {
                d.is_float()
            }
            UnaryOp::Not => d.is_bool(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Remainder with the sign of the dividend (C / StableHLO semantics).
    Rem,
    Max,
    Min,
    And,
    Or,
    Xor,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
        }
    }

    fn accepts(self, d: DType) -> bool {
        match self {
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => d.is_bool() || d.is_int(),
            _ => !d.is_bool(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
        }
    }
}

/// One dimension of a load/store window into a ref's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slice {
    /// The whole dimension.
    Full,
    /// `len` elements from a compile-time `start`.
    Static { start: usize, len: usize },
    /// `len` (compile-time) elements from a run-time `start` (an i32 scalar).
    Dynamic { start: ValueId, len: usize },
}

impl Slice {
    pub fn len(self, dim: usize) -> usize {
        match self {
            Slice::Full => dim,
            Slice::Static { len, .. } | Slice::Dynamic { len, .. } => len,
        }
    }
}

/// A window of a ref that a copy reads or writes: the ref and one slice per dim of its view
/// (the whole array, for HBM operands and scratch).
#[derive(Debug, Clone, PartialEq)]
pub struct RefWindow {
    pub r: RefId,
    pub slices: Vec<Slice>,
}

/// One semaphore of a semaphore operand: the operand and one i32 index per dim of its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct SemRef {
    pub sem: RefId,
    pub index: Vec<ValueId>,
}

/// What makes a copy remote: the device it writes to and the sender's semaphore.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteDma {
    /// The target device's id (i32 scalar; row-major over the kernel's mesh).
    pub device: ValueId,
    /// Signalled on the sending device when the copy has read its source.
    pub send_sem: SemRef,
}

/// A nested block of instructions: the body of `when`, `fori_loop` and index maps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Region {
    /// Values bound on entry (loop index and carried values; grid indices for index maps).
    pub params: Vec<ValueId>,
    pub insts: Vec<Inst>,
    /// Values handed back on exit (next carried values; block indices for index maps).
    pub yields: Vec<ValueId>,
}

/// One instruction: an op, the values it defines and where the kernel author wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Inst {
    pub op: Op,
    pub results: Vec<ValueId>,
    pub loc: super::Loc,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Index of the current grid step along `axis` (i32 scalar).
    ProgramId {
        axis: usize,
    },
    /// Size of the grid along `axis` (i32 scalar).
    NumPrograms {
        axis: usize,
    },
    /// A constant splatted to `ty`.
    Constant {
        value: Literal,
        ty: ValueType,
    },
    /// Loads a window of a VMEM ref's block.
    Load {
        src: RefId,
        slices: Vec<Slice>,
    },
    /// Stores `value` into a window of a VMEM output or scratch ref.
    Store {
        dst: RefId,
        slices: Vec<Slice>,
        value: ValueId,
    },
    /// Reads one element of an SMEM ref (i32 scalar indices).
    LoadScalar {
        src: RefId,
        indices: Vec<ValueId>,
    },
    /// Writes the scalar `value` into one element of SMEM scratch (i32 scalar indices).
    StoreScalar {
        dst: RefId,
        indices: Vec<ValueId>,
        value: ValueId,
    },
    Unary {
        op: UnaryOp,
        x: ValueId,
    },
    Binary {
        op: BinaryOp,
        lhs: ValueId,
        rhs: ValueId,
    },
    Compare {
        op: CmpOp,
        lhs: ValueId,
        rhs: ValueId,
    },
    Select {
        cond: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    },
    Cast {
        x: ValueId,
        to: DType,
    },
    /// Broadcasts `x` to `shape`, aligning trailing dims (numpy rules; each dim equal or 1).
    Broadcast {
        x: ValueId,
        shape: Vec<usize>,
    },
    Reshape {
        x: ValueId,
        shape: Vec<usize>,
    },
    /// `times` copies of `x` side by side along `axis` (Pallas' `pltpu.repeat`): that dim
    /// grows `times`-fold, element `i` of the result is element `i % n` of `x` (`n` its
    /// size).
    Repeat {
        x: ValueId,
        times: usize,
        axis: usize,
    },
    /// Integer indices along `dim` of `ty`.
    Iota {
        ty: ValueType,
        dim: usize,
    },
    /// Reduces `x` along `axis`, removing that axis.
    Reduce {
        op: ReduceOp,
        x: ValueId,
        axis: usize,
    },
    /// Rank-2 matrix product with optional transposes; floats accumulate and return f32,
    /// integers accumulate and return i32.
    Dot {
        lhs: ValueId,
        rhs: ValueId,
        transpose_lhs: bool,
        transpose_rhs: bool,
    },
    /// Runs `then` when the bool scalar `cond` is true, else `otherwise` (empty when the
    /// kernel wrote no `else`: `when` rather than `when_else`). Defines no values.
    When {
        cond: ValueId,
        then: Region,
        otherwise: Region,
    },
    /// `for i in lo..hi` with loop-carried values; `body.params` are `[i, carried...]`, its
    /// yields the next carried values, and the results the final ones.
    ForLoop {
        lo: ValueId,
        hi: ValueId,
        init: Vec<ValueId>,
        body: Region,
    },
    /// This device's id on the kernel's mesh (i32 scalar, row-major over its axes; 0 without
    /// a mesh).
    DeviceId,
    /// Starts an asynchronous copy of `src` into `dst` (same element count and dtype). When it
    /// lands, `sem` (a DMA semaphore, on the device that holds `dst`) counts its bytes; a
    /// remote copy writes `dst` on another device and also signals `send_sem` here.
    DmaStart {
        src: RefWindow,
        dst: RefWindow,
        sem: SemRef,
        remote: Option<RemoteDma>,
    },
    /// Waits until DMA semaphore `sem` counts the bytes of a copy of `src` into `dst`, and
    /// takes them.
    DmaWait {
        src: RefWindow,
        dst: RefWindow,
        sem: SemRef,
    },
    /// Adds `inc` (i32 scalar) to a regular semaphore, on `device` when given.
    SemSignal {
        sem: SemRef,
        inc: ValueId,
        device: Option<ValueId>,
    },
    /// Waits until a regular semaphore counts at least `value` (i32 scalar), and takes it.
    SemWait {
        sem: SemRef,
        value: ValueId,
    },
    /// The current count of a semaphore (i32 scalar).
    SemRead {
        sem: SemRef,
    },
    /// Runs `body` with the scratch operands `allocs` (VMEM buffers, semaphores) allocated
    /// for it alone: fresh on entry, and semaphores back at zero with no copy in flight on
    /// exit. Yields values (the results).
    Scoped {
        allocs: Vec<RefId>,
        body: Region,
    },
    /// Prints `args` where `format` has its `{}` placeholders (one per arg): scalars, or one
    /// vector whose placeholder ends the format. Defines no values.
    DebugPrint {
        format: String,
        args: Vec<ValueId>,
    },
    /// Stops the run with `message` when the bool scalar `cond` is false.
    DebugCheck {
        cond: ValueId,
        message: String,
    },
}

impl Op {
    /// The op's name in the IR text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::ProgramId { .. } => "program_id",
            Op::NumPrograms { .. } => "num_programs",
            Op::Constant { .. } => "constant",
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::LoadScalar { .. } => "load_scalar",
            Op::StoreScalar { .. } => "store_scalar",
            Op::Unary { op, .. } => op.name(),
            Op::Binary { op, .. } => op.name(),
            Op::Compare { op, .. } => op.name(),
            Op::Select { .. } => "select",
            Op::Cast { .. } => "cast",
            Op::Broadcast { .. } => "broadcast",
            Op::Reshape { .. } => "reshape",
            Op::Repeat { .. } => "repeat",
            Op::Iota { .. } => "iota",
            Op::Reduce { op, .. } => op.name(),
            Op::Dot { .. } => "dot",
            Op::When { .. } => "when",
            Op::ForLoop { .. } => "fori_loop",
            Op::DeviceId => "device_id",
            Op::DmaStart { remote: None, .. } => "async_copy",
            Op::DmaStart {
                remote: Some(_), ..
            } => "remote_copy",
            Op::DmaWait { .. } => "wait_copy",
            Op::SemSignal { .. } => "semaphore_signal",
            Op::SemWait { .. } => "semaphore_wait",
            Op::SemRead { .. } => "semaphore_read",
            Op::Scoped { .. } => "run_scoped",
            Op::DebugPrint { .. } => "debug_print",
            Op::DebugCheck { .. } => "debug_check",
        }
    }

    /// The SSA values this op reads directly (not counting values used inside its regions).
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Op::ProgramId { .. }
            | Op::NumPrograms { .. }
            | Op::Constant { .. }
            | Op::Iota { .. } => vec![],
            Op::Load { slices, .. } => dynamic_starts(slices),
            Op::Store { slices, value, .. } => {
                let mut v = dynamic_starts(slices);
                v.push(*value);
                v
            }
            Op::LoadScalar { indices, .. } => indices.clone(),
            Op::StoreScalar { indices, value, .. } => {
                let mut v = indices.clone();
                v.push(*value);
                v
            }
            Op::Unary { x, .. }
            | Op::Cast { x, .. }
            | Op::Broadcast { x, .. }
            | Op::Reshape { x, .. }
            | Op::Repeat { x, .. }
            | Op::Reduce { x, .. } => vec![*x],
            Op::Binary { lhs, rhs, .. }
            | Op::Compare { lhs, rhs, .. }
            | Op::Dot { lhs, rhs, .. } => {
                vec![*lhs, *rhs]
            }
            Op::Select {
                cond,
                on_true,
                on_false,
            } => vec![*cond, *on_true, *on_false],
            Op::When { cond, .. } => vec![*cond],
            Op::ForLoop { lo, hi, init, .. } => {
                let mut v = vec![*lo, *hi];
                v.extend(init);
                v
            }
            Op::DeviceId | Op::Scoped { .. } => vec![],
            Op::DmaStart {
                src,
                dst,
                sem,
                remote,
            } => {
                let mut v = dynamic_starts(&src.slices);
                v.extend(dynamic_starts(&dst.slices));
                v.extend(&sem.index);
                if let Some(r) = remote {
                    v.push(r.device);
                    v.extend(&r.send_sem.index);
                }
                v
            }
            Op::DmaWait { src, dst, sem } => {
                let mut v = dynamic_starts(&src.slices);
                v.extend(dynamic_starts(&dst.slices));
                v.extend(&sem.index);
                v
            }
            Op::SemSignal { sem, inc, device } => {
                let mut v = sem.index.clone();
                v.push(*inc);
                v.extend(device);
                v
            }
            Op::SemWait { sem, value } => {
                let mut v = sem.index.clone();
                v.push(*value);
                v
            }
            Op::SemRead { sem } => sem.index.clone(),
            Op::DebugPrint { args, .. } => args.clone(),
            Op::DebugCheck { cond, .. } => vec![*cond],
        }
    }

    /// The refs this op reads, writes or signals directly (not inside its regions).
    pub fn refs(&self) -> Vec<RefId> {
        match self {
            Op::Load { src, .. } | Op::LoadScalar { src, .. } => vec![*src],
            Op::Store { dst, .. } | Op::StoreScalar { dst, .. } => vec![*dst],
            Op::DmaStart { src, dst, .. } | Op::DmaWait { src, dst, .. } => {
                let mut v = vec![src.r, dst.r];
                v.extend(self.semaphores().iter().map(|s| s.sem));
                v
            }
            Op::Scoped { allocs, .. } => allocs.clone(),
            _ => self.semaphores().iter().map(|s| s.sem).collect(),
        }
    }

    /// The semaphores this op uses.
    pub fn semaphores(&self) -> Vec<&SemRef> {
        match self {
            Op::DmaStart { sem, remote, .. } => {
                let mut v = vec![sem];
                if let Some(r) = remote {
                    v.push(&r.send_sem);
                }
                v
            }
            Op::DmaWait { sem, .. }
            | Op::SemSignal { sem, .. }
            | Op::SemWait { sem, .. }
            | Op::SemRead { sem } => vec![sem],
            _ => vec![],
        }
    }

    /// Nested regions, in order.
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            Op::When {
                then, otherwise, ..
            } => vec![then, otherwise],
            Op::ForLoop { body, .. } | Op::Scoped { body, .. } => vec![body],
            _ => vec![],
        }
    }
}

/// Checks that `format` has one `{}` per argument and no other braces (`{{`/`}}` escape one).
fn check_print_format(format: &str, args: usize) -> Result<(), InferError> {
    let placeholders = print_format_pieces(format)?.len() - 1;
    if placeholders != args {
        return Err(InferError::PrintPlaceholders {
            format: format.to_string(),
            placeholders,
            values: args,
        });
    }
    Ok(())
}

/// The literal text between the `{}` placeholders of a print format (one more piece than
/// placeholders), with `{{` and `}}` unescaped.
pub(crate) fn print_format_pieces(format: &str) -> Result<Vec<String>, InferError> {
    let mut pieces = vec![String::new()];
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('{', Some('}')) => {
                chars.next();
                pieces.push(String::new());
            }
            ('{', Some('{')) | ('}', Some('}')) => {
                chars.next();
                pieces.last_mut().expect("never empty").push(c);
            }
            ('{' | '}', _) => {
                return Err(InferError::PrintLoneBrace {
                    format: format.to_string(),
                    brace: c,
                })
            }
            _ => pieces.last_mut().expect("never empty").push(c),
        }
    }
    Ok(pieces)
}

/// Fills the `{}` placeholders of a checked print format with `values`.
pub(crate) fn format_print(format: &str, values: &[String]) -> String {
    let pieces = print_format_pieces(format).unwrap_or_else(|_| vec![format.to_string()]);
    let mut out = String::new();
    for (i, piece) in pieces.iter().enumerate() {
        out.push_str(piece);
        if let Some(v) = values.get(i).filter(|_| i + 1 < pieces.len()) {
            out.push_str(v);
        }
    }
    out
}

/// The run-time start values among `slices`.
pub(crate) fn dynamic_starts(slices: &[Slice]) -> Vec<ValueId> {
    slices
        .iter()
        .filter_map(|s| match s {
            Slice::Dynamic { start, .. } => Some(*start),
            _ => None,
        })
        .collect()
}

/// What inference needs to know about the kernel around an op.
pub trait InferContext {
    fn value_type(&self, v: ValueId) -> &ValueType;
    fn operand(&self, r: RefId) -> Option<&Operand>;
    fn grid_rank(&self) -> usize;
}

/// One i32 scalar index per dim of the SMEM ref `r`.
fn check_smem_indices(
    ctx: &dyn InferContext,
    r: &Operand,
    indices: &[ValueId],
) -> Result<(), InferError> {
    if indices.len() != r.array_shape.len() {
        return Err(InferError::SmemIndexCount {
            name: r.name.clone(),
            rank: r.array_shape.len(),
            indices: indices.len(),
        });
    }
    for &i in indices {
        expect_i32_scalar(ctx, i, "an SMEM index")?;
    }
    Ok(())
}

/// Checks that `v`, described as `what`, is an i32 scalar.
fn expect_i32_scalar(
    ctx: &dyn InferContext,
    v: ValueId,
    what: &'static str,
) -> Result<(), InferError> {
    let t = ctx.value_type(v);
    if t.dtype != DType::I32 || !t.is_scalar() {
        return Err(InferError::NotI32Scalar {
            what,
            got: t.clone(),
        });
    }
    Ok(())
}

fn window_shape(
    ctx: &dyn InferContext,
    r: &Operand,
    slices: &[Slice],
) -> Result<Vec<usize>, InferError> {
    let view = r.view_shape();
    if slices.len() != view.len() {
        return Err(InferError::AccessRank {
            name: r.name.clone(),
            block: view,
            indices: slices.len(),
        });
    }
    let mut shape = Vec::with_capacity(view.len());
    for (dim, (s, &n)) in slices.iter().zip(&view).enumerate() {
        match *s {
            Slice::Full => {}
            Slice::Static { start, len } => {
                if start + len > n || len == 0 {
                    return Err(InferError::StaticSliceOutside {
                        start,
                        end: start + len,
                        dim,
                        name: r.name.clone(),
                        block: n,
                    });
                }
            }
            Slice::Dynamic { start, len } => {
                expect_i32_scalar(ctx, start, "a dynamic slice start")?;
                if len > n || len == 0 {
                    return Err(InferError::DynamicSliceTooLong {
                        len,
                        dim,
                        name: r.name.clone(),
                        block: n,
                    });
                }
            }
        }
        shape.push(s.len(n));
    }
    Ok(shape)
}

/// Infers the result types of `op`, or explains why it is ill-formed.
pub fn infer(op: &Op, ctx: &dyn InferContext) -> Result<Vec<ValueType>, InferError> {
    let ty = |v: ValueId| ctx.value_type(v).clone();
    let operand = |r: RefId| known_operand(ctx, r);
    Ok(match op {
        Op::ProgramId { axis } | Op::NumPrograms { axis } => {
            if *axis >= ctx.grid_rank() {
                return Err(InferError::GridAxisOutOfRange {
                    axis: *axis,
                    grid_rank: ctx.grid_rank(),
                });
            }
            vec![ValueType::scalar(DType::I32)]
        }
        Op::Constant { value, ty } => {
            if !value.fits(ty.dtype) {
                return Err(InferError::LiteralDoesNotFit {
                    value: *value,
                    dtype: ty.dtype,
                });
            }
            vec![ty.clone()]
        }
        Op::Load { src, slices } => {
            let r = operand(*src)?;
            if r.memory != MemorySpace::Vmem {
                return Err(InferError::LoadNotVmem {
                    name: r.name.clone(),
                    memory: r.memory,
                });
            }
            vec![ValueType::new(r.dtype, window_shape(ctx, r, slices)?)]
        }
        Op::Store { dst, slices, value } => {
            let r = operand(*dst)?;
            match r.role {
                OperandRole::Output | OperandRole::Scratch => {}
                OperandRole::Input | OperandRole::ScalarPrefetch => {
                    return Err(InferError::StoreToInput {
                        name: r.name.clone(),
                    })
                }
            }
            if r.memory != MemorySpace::Vmem {
                return Err(InferError::StoreNotVmem {
                    name: r.name.clone(),
                    memory: r.memory,
                });
            }
            let window = window_shape(ctx, r, slices)?;
            let v = ty(*value);
            if v.dtype != r.dtype {
                return Err(InferError::StoreDtype {
                    value: v.dtype,
                    name: r.name.clone(),
                    dtype: r.dtype,
                });
            }
            if v.shape != window {
                return Err(InferError::StoreShape {
                    value: v.shape,
                    window,
                    name: r.name.clone(),
                });
            }
            vec![]
        }
        Op::LoadScalar { src, indices } => {
            let r = operand(*src)?;
            if r.memory != MemorySpace::Smem {
                return Err(InferError::ScalarLoadNotSmem {
                    name: r.name.clone(),
                    memory: r.memory,
                });
            }
            check_smem_indices(ctx, r, indices)?;
            vec![ValueType::scalar(r.dtype)]
        }
        Op::StoreScalar {
            dst,
            indices,
            value,
        } => {
            let r = operand(*dst)?;
            if r.memory != MemorySpace::Smem || r.role != OperandRole::Scratch {
                return Err(InferError::ScalarStoreNotSmemScratch {
                    name: r.name.clone(),
                });
            }
            check_smem_indices(ctx, r, indices)?;
            let t = ctx.value_type(*value);
            if !t.is_scalar() || t.dtype != r.dtype {
                return Err(InferError::ScalarStoreType {
                    name: r.name.clone(),
                    dtype: r.dtype,
                    value: t.clone(),
                });
            }
            vec![]
        }
        Op::Unary { op, x } => {
            let t = ty(*x);
            if !op.accepts(t.dtype) {
                return Err(InferError::UndefinedFor {
                    op: op.name(),
                    dtype: t.dtype,
                });
            }
            vec![t]
        }
        Op::Binary { op, lhs, rhs } => {
            let (a, b) = (ty(*lhs), ty(*rhs));
            same_type(&a, &b)?;
            if !op.accepts(a.dtype) {
                return Err(InferError::UndefinedFor {
                    op: op.name(),
                    dtype: a.dtype,
                });
            }
            vec![a]
        }
        Op::Compare { lhs, rhs, .. } => {
            let (a, b) = (ty(*lhs), ty(*rhs));
            same_type(&a, &b)?;
            vec![ValueType::new(DType::Bool, a.shape)]
        }
        Op::Select {
            cond,
            on_true,
            on_false,
        } => {
            let (c, a, b) = (ty(*cond), ty(*on_true), ty(*on_false));
            same_type(&a, &b)?;
            if c.dtype != DType::Bool || c.shape != a.shape {
                return Err(InferError::SelectCondition {
                    shape: a.shape,
                    cond: c,
                });
            }
            vec![a]
        }
        Op::Cast { x, to } => vec![ValueType::new(*to, ty(*x).shape)],
        Op::Broadcast { x, shape } => {
            let t = ty(*x);
            if !broadcastable(&t.shape, shape) {
                return Err(InferError::Broadcast {
                    from: t.shape,
                    to: shape.clone(),
                });
            }
            vec![ValueType::new(t.dtype, shape.clone())]
        }
        Op::Reshape { x, shape } => {
            let t = ty(*x);
            if t.num_elements() != shape.iter().product::<usize>() {
                return Err(InferError::Reshape {
                    elements: t.num_elements(),
                    from: t.shape,
                    to: shape.clone(),
                });
            }
            vec![ValueType::new(t.dtype, shape.clone())]
        }
        Op::Repeat { x, times, axis } => {
            let t = ty(*x);
            if *axis >= t.rank() {
                return Err(InferError::RepeatAxis {
                    axis: *axis,
                    shape: t.shape,
                });
            }
            if *times == 0 {
                return Err(InferError::RepeatNone { shape: t.shape });
            }
            let mut shape = t.shape.clone();
            shape[*axis] *= times;
            vec![ValueType::new(t.dtype, shape)]
        }
        Op::Iota { ty, dim } => {
            if !ty.dtype.is_int() {
                return Err(InferError::IotaDtype { dtype: ty.dtype });
            }
            if *dim >= ty.rank() {
                return Err(InferError::IotaDim {
                    dim: *dim,
                    shape: ty.shape.clone(),
                });
            }
            vec![ty.clone()]
        }
        Op::Reduce { op, x, axis } => {
            let t = ty(*x);
            if *axis >= t.rank() {
                return Err(InferError::ReduceAxis {
                    axis: *axis,
                    shape: t.shape,
                });
            }
            if t.dtype.is_bool() {
                return Err(InferError::UndefinedFor {
                    op: op.name(),
                    dtype: DType::Bool,
                });
            }
            let mut shape = t.shape.clone();
            shape.remove(*axis);
            vec![ValueType::new(t.dtype, shape)]
        }
        Op::Dot {
            lhs,
            rhs,
            transpose_lhs,
            transpose_rhs,
        } => {
            let (a, b) = (ty(*lhs), ty(*rhs));
            if a.rank() != 2 || b.rank() != 2 {
                return Err(InferError::DotRank { lhs: a, rhs: b });
            }
            if a.dtype != b.dtype {
                return Err(InferError::DotDtypes {
                    lhs: a.dtype,
                    rhs: b.dtype,
                });
            }
            let (m, ka) = if *transpose_lhs {
                (a.shape[1], a.shape[0])
            } else {
                (a.shape[0], a.shape[1])
            };
            let (kb, n) = if *transpose_rhs {
                (b.shape[1], b.shape[0])
            } else {
                (b.shape[0], b.shape[1])
            };
            if ka != kb {
                return Err(InferError::DotContraction {
                    lhs: a,
                    lhs_transposed: *transpose_lhs,
                    lhs_k: ka,
                    rhs: b,
                    rhs_transposed: *transpose_rhs,
                    rhs_k: kb,
                });
            }
            let out = match a.dtype {
                d if d.is_float() => DType::F32,
                d if d.is_int() => DType::I32,
                d => {
                    return Err(InferError::UndefinedFor {
                        op: "dot",
                        dtype: d,
                    })
                }
            };
            vec![ValueType::new(out, vec![m, n])]
        }
        Op::When {
            cond,
            then,
            otherwise,
        } => {
            let c = ty(*cond);
            if c != ValueType::scalar(DType::Bool) {
                return Err(InferError::WhenCondition { cond: c });
            }
            if !then.yields.is_empty() || !otherwise.yields.is_empty() {
                return Err(InferError::WhenYields);
            }
            vec![]
        }
        Op::ForLoop { lo, hi, init, body } => {
            expect_i32_scalar(ctx, *lo, "the loop's lower bound")?;
            expect_i32_scalar(ctx, *hi, "the loop's upper bound")?;
            if body.params.len() != init.len() + 1 {
                return Err(InferError::LoopParams);
            }
            expect_i32_scalar(ctx, body.params[0], "the loop index")?;
            if body.yields.len() != init.len() {
                return Err(InferError::LoopYields {
                    yields: body.yields.len(),
                    carried: init.len(),
                });
            }
            let mut out = Vec::new();
            for (k, ((&i, &p), &y)) in init
                .iter()
                .zip(&body.params[1..])
                .zip(&body.yields)
                .enumerate()
            {
                let (ti, tp, tyy) = (ty(i), ty(p), ty(y));
                if ti != tp || ti != tyy {
                    return Err(InferError::CarriedType {
                        index: k,
                        start: ti,
                        yields: tyy,
                    });
                }
                out.push(ti);
            }
            out
        }
        Op::DeviceId => vec![ValueType::scalar(DType::I32)],
        Op::DmaStart {
            src,
            dst,
            sem,
            remote,
        } => {
            check_copy(ctx, src, dst)?;
            check_sem(ctx, sem, &[SemKind::Dma], "the copy's semaphore")?;
            if let Some(r) = remote {
                expect_i32_scalar(ctx, r.device, "the target device")?;
                check_sem(ctx, &r.send_sem, &[SemKind::Dma], "the send semaphore")?;
            }
            vec![]
        }
        Op::DmaWait { src, dst, sem } => {
            check_copy(ctx, src, dst)?;
            check_sem(ctx, sem, &[SemKind::Dma], "the semaphore of a copy wait")?;
            vec![]
        }
        Op::SemSignal { sem, inc, device } => {
            let kinds = [SemKind::Regular, SemKind::Barrier];
            check_sem(ctx, sem, &kinds, "a signalled semaphore")?;
            expect_i32_scalar(ctx, *inc, "the increment")?;
            if let Some(d) = device {
                expect_i32_scalar(ctx, *d, "the target device")?;
            }
            vec![]
        }
        Op::SemWait { sem, value } => {
            let kinds = [SemKind::Regular, SemKind::Barrier];
            check_sem(ctx, sem, &kinds, "a waited semaphore")?;
            expect_i32_scalar(ctx, *value, "the count to wait for")?;
            vec![]
        }
        Op::SemRead { sem } => {
            let kinds = [SemKind::Dma, SemKind::Regular, SemKind::Barrier];
            check_sem(ctx, sem, &kinds, "a read semaphore")?;
            vec![ValueType::scalar(DType::I32)]
        }
        Op::Scoped { allocs, body } => {
            for &r in allocs {
                let o = operand(r)?;
                let ok = o.role == OperandRole::Scratch
                    && matches!(
                        o.memory,
                        MemorySpace::Vmem | MemorySpace::Semaphore(SemKind::Dma | SemKind::Regular)
                    );
                if !ok {
                    return Err(InferError::NotScopedAllocatable {
                        name: o.name.clone(),
                    });
                }
            }
            body.yields.iter().map(|&v| ty(v)).collect()
        }
        Op::DebugPrint { format, args } => {
            check_print_format(format, args.len())?;
            let vectors = args.iter().filter(|&&a| !ctx.value_type(a).is_scalar());
            if vectors.count() > 0 && (args.len() > 1 || !format.ends_with("{}")) {
                return Err(InferError::PrintVector);
            }
            vec![]
        }
        Op::DebugCheck { cond, .. } => {
            let t = ctx.value_type(*cond);
            if t.dtype != DType::Bool || !t.is_scalar() {
                return Err(InferError::CheckCondition { cond: t.clone() });
            }
            vec![]
        }
    })
}

/// The shape with its unit dims dropped: windows of a copy must agree in this shape.
pub fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// Checks a semaphore reference: a semaphore operand of one of `kinds`, indexed by one i32
/// scalar per dim.
fn check_sem(
    ctx: &dyn InferContext,
    sem: &SemRef,
    kinds: &[SemKind],
    what: &'static str,
) -> Result<(), InferError> {
    let o = known_operand(ctx, sem.sem)?;
    let Some(kind) = o.memory.semaphore() else {
        return Err(InferError::NotASemaphore {
            what,
            name: o.name.clone(),
            memory: o.memory,
        });
    };
    if !kinds.contains(&kind) {
        let wanted = if kinds.contains(&SemKind::Dma) {
            WantedSemaphore::Dma
        } else {
            WantedSemaphore::Regular
        };
        return Err(InferError::SemaphoreKind {
            what,
            wanted,
            name: o.name.clone(),
            memory: o.memory,
        });
    }
    if sem.index.len() != o.array_shape.len() {
        return Err(InferError::SemaphoreIndexCount {
            name: o.name.clone(),
            shape: o.array_shape.clone(),
            indices: sem.index.len(),
        });
    }
    for &i in &sem.index {
        expect_i32_scalar(ctx, i, "a semaphore index")?;
    }
    Ok(())
}

/// Checks one side of a copy and returns its window shape.
fn copy_side(
    ctx: &dyn InferContext,
    w: &RefWindow,
    writes: bool,
) -> Result<(DType, Vec<usize>), InferError> {
    let o = known_operand(ctx, w.r)?;
    let ok = match (o.memory, o.role) {
        (MemorySpace::Any, OperandRole::Input) => !writes,
        (MemorySpace::Any, OperandRole::Output) => true,
        (MemorySpace::Vmem, OperandRole::Scratch) => true,
        // SMEM scratch: the run-time checks' state, copied to the flags (`crate::checks`).
        (MemorySpace::Smem, OperandRole::Scratch) => true,
        _ => false,
    };
    if !ok {
        let why = match (o.memory, o.role) {
            (MemorySpace::Any, OperandRole::Input) => NotCopyableWhy::ReadOnlyInput,
            (MemorySpace::Vmem, OperandRole::Input | OperandRole::Output) => {
                NotCopyableWhy::PipelinedBlock
            }
            (m, _) => NotCopyableWhy::Memory(m),
        };
        return Err(InferError::NotCopyable {
            name: o.name.clone(),
            why,
        });
    }
    Ok((o.dtype, window_shape(ctx, o, &w.slices)?))
}

/// Checks the two windows of a copy: same dtype, same shape once unit dims are dropped.
fn check_copy(ctx: &dyn InferContext, src: &RefWindow, dst: &RefWindow) -> Result<(), InferError> {
    let (sd, ss) = copy_side(ctx, src, false)?;
    let (dd, ds) = copy_side(ctx, dst, true)?;
    let name = |r: RefId| ctx.operand(r).map(|o| o.name.clone()).unwrap_or_default();
    if sd != dd {
        return Err(InferError::CopyDtypes {
            src_dtype: sd,
            src: name(src.r),
            dst: name(dst.r),
            dst_dtype: dd,
        });
    }
    if squeezed(&ss) != squeezed(&ds) {
        return Err(InferError::CopyShapes {
            src_window: ss,
            src: name(src.r),
            dst_window: ds,
            dst: name(dst.r),
        });
    }
    Ok(())
}

/// Checks that two operands agree in dtype and shape.
fn same_type(a: &ValueType, b: &ValueType) -> Result<(), InferError> {
    if a.dtype != b.dtype {
        return Err(InferError::OperandDtypes {
            lhs: a.dtype,
            rhs: b.dtype,
        });
    }
    if a.shape != b.shape {
        return Err(InferError::OperandShapes {
            lhs: a.shape.clone(),
            rhs: b.shape.clone(),
        });
    }
    Ok(())
}

/// The operand `r` names, or an error for a ref the kernel does not have.
fn known_operand(ctx: &dyn InferContext, r: RefId) -> Result<&Operand, InferError> {
    ctx.operand(r).ok_or(InferError::UnknownRef {
        index: r.0 as usize,
    })
}

/// Whether `from` broadcasts to `to` under numpy rules (trailing alignment, dims equal or 1).
pub fn broadcastable(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len()
        && from
            .iter()
            .rev()
            .zip(to.iter().rev())
            .all(|(&f, &t)| f == t || f == 1)
}

/// The numpy broadcast of two shapes, if any.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_broadcasting() {
        assert_eq!(broadcast_shapes(&[8, 1], &[1, 128]), Some(vec![8, 128]));
        assert_eq!(broadcast_shapes(&[], &[4, 5]), Some(vec![4, 5]));
        assert_eq!(broadcast_shapes(&[3], &[4, 3]), Some(vec![4, 3]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
        assert!(broadcastable(&[1, 5], &[7, 5]));
        assert!(!broadcastable(&[7, 5], &[5]));
    }

    #[test]
    fn literals_fit_their_dtypes() {
        assert!(Literal::Int(127).fits(DType::I8));
        assert!(!Literal::Int(128).fits(DType::I8));
        assert!(Literal::Int(3).fits(DType::BF16));
        assert!(!Literal::Float(0.5).fits(DType::I32));
        assert!(!Literal::Bool(true).fits(DType::F32));
        assert_eq!(Literal::Float(2.0).to_string(), "2.0");
        assert_eq!(Literal::Float(f64::NEG_INFINITY).to_string(), "-inf");
    }
}
