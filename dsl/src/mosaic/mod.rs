//! Kernel -> Mosaic: the kernel as a Mosaic TPU module (MLIR text), the body a TPU custom call
//! (`tpu_custom_call`) carries to libtpu.
//!
//! The module holds one `func.func` for the kernel body and one `transform_N` function per
//! blocked operand (its index map). The kernel function takes the grid indices (`i32`), then
//! the scalar-prefetch tables (SMEM memrefs), the input and output blocks (VMEM memrefs of the
//! block shape, squeezed dims kept as 1) and the scratch buffers, in that order, and carries
//! `dimension_semantics`, `iteration_bounds`, `scalar_prefetch`, `scratch_operands`,
//! `window_params` (block shape and index-map function per input and output) and
//! `tpu.core_type`. Bodies use the `arith`, `math`, `vector`, `memref`, `scf` and `tpu`
//! dialects; `when` is `scf.if`, `fori_loop` is `scf.for`, and every op carries the kernel
//! line it was traced from as its `loc`, so a compiler error names that line. Layouts are
//! left to Mosaic (the custom call sets `needs_layout_passes`).
//!
//! One rule per IR op, in an exhaustive `match`: a new op is a build error here until it has
//! its lowering. What Mosaic accepts inside a kernel is checked before lowering, when a kernel
//! is instantiated under [`KernelRules::tpu`](crate::KernelRules::tpu) (see
//! [`rules`](crate::rules)).

mod cost;
mod memory;
mod schedule;

use std::collections::HashMap;
use std::fmt::Write;

use crate::tpu_facts::SendSems;

pub(crate) use cost::estimate as cost_estimate;
pub use cost::CostEstimate;
pub use schedule::{ArgValues, KernelSchedule, PathRuns, ScheduleError};

use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    BinaryOp, BlockDim, CmpOp, DType, Inst, Kernel, Literal, Loc, MemorySpace, Op, OperandRole,
    ReduceOp, RefId, Region, SemKind, Slice, UnaryOp, ValueId, ValueType,
};

/// The `stable_mosaic.version` the emitted modules declare.
pub const MOSAIC_VERSION: u32 = 11;

/// One array a Mosaic kernel takes or returns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MosaicOperand {
    /// The kernel parameter's name.
    pub name: String,
    pub dtype: DType,
    /// The whole array's shape (row-major).
    pub shape: Vec<usize>,
}

/// A kernel lowered to Mosaic, with what a `tpu_custom_call` needs besides the module.
#[derive(Debug, Clone, PartialEq)]
pub struct MosaicKernel {
    /// The kernel's name (the custom call's `kernel_name` and the kernel function's symbol).
    pub name: String,
    /// The Mosaic module as MLIR text.
    pub text: String,
    /// The custom call's operands, in order: the scalar-prefetch tables, then the inputs.
    pub operands: Vec<MosaicOperand>,
    /// The custom call's results: the outputs, in order.
    pub results: Vec<MosaicOperand>,
    /// How many leading operands are scalar prefetch.
    pub scalar_prefetch: usize,
    /// An upper bound of the work of one call (every `when` counted as taken).
    pub cost: CostEstimate,
    /// VMEM the kernel's buffers take: double-buffered input and output blocks plus scratch.
    pub vmem_bytes: usize,
    /// The kernel talks to other devices (remote copies or signals, the barrier semaphore):
    /// the custom call's `has_communication`.
    pub has_communication: bool,
    /// The barrier semaphore's collective id, when the kernel uses it (the custom call's
    /// `collective_id`; kernels that may run at once need different ones).
    pub collective_id: Option<u32>,
    /// A scoped VMEM limit to compile the kernel with (the custom call's `vmem_limit_bytes`):
    /// its buffers plus room for two of its largest vector values (tile-padded) to spill,
    /// between [`MIN_VMEM_LIMIT_BYTES`] and [`MAX_VMEM_LIMIT_BYTES`]. Not more: XLA keeps
    /// the limit free for the whole call, so a generous one costs the program the VMEM its
    /// memory-space assignment would place operands in (measured on v5p, splash dQ at
    /// blocks 1024: asking 64 MiB kept its operands in HBM, 317 bundles of pipeline DMA per
    /// grid step and 8.48 MiB scoped; 16 MiB let XLA place them in VMEM as it does JAX's:
    /// 112 bundles and 6.46 MiB).
    pub vmem_limit_bytes: usize,
}

/// The least VMEM limit [`MosaicKernel::vmem_limit_bytes`] asks for (libtpu's default).
pub const MIN_VMEM_LIMIT_BYTES: usize = 16 << 20;
/// The most VMEM limit [`MosaicKernel::vmem_limit_bytes`] asks for: half of a v5e's or v6e's
/// VMEM, below a v5p's.
pub const MAX_VMEM_LIMIT_BYTES: usize = 64 << 20;

/// Lowers an instantiated kernel to a Mosaic module.
///
/// The kernel should have been instantiated under [`KernelRules::tpu`](crate::KernelRules::tpu):
/// those rules are what make the module compile; a kernel instantiated under other rules
/// lowers all the same but libtpu may refuse it.
pub fn lower(k: &Kernel) -> Result<MosaicKernel, KernelError> {
    for (i, o) in k.operands.iter().enumerate() {
        let supported = match o.role {
            OperandRole::Input | OperandRole::Output => {
                matches!(o.memory, MemorySpace::Vmem | MemorySpace::Any)
            }
            OperandRole::Scratch => o.memory != MemorySpace::Any,
            OperandRole::ScalarPrefetch => o.memory == MemorySpace::Smem,
        };
        if !supported {
            return Err(lower_error(
                k,
                &k.describe(RefId(i as u32)),
                o.loc,
                format!(
                    "a {} operand in {} memory has no Mosaic lowering",
                    o.role.name(),
                    o.memory.name()
                ),
            ));
        }
    }
    let order = func_order(k);
    let spec = |r: RefId| {
        let o = k.operand(r);
        MosaicOperand {
            name: o.name.clone(),
            dtype: o.dtype,
            shape: o.array_shape.clone(),
        }
    };
    let operands: Vec<MosaicOperand> = order
        .iter()
        .copied()
        .filter(|r| {
            matches!(
                k.operand(*r).role,
                OperandRole::ScalarPrefetch | OperandRole::Input
            )
        })
        .map(spec)
        .collect();
    let results: Vec<MosaicOperand> = k
        .operands_with(OperandRole::Output)
        .map(|(r, _)| spec(r))
        .collect();
    let scalar_prefetch = k.operands_with(OperandRole::ScalarPrefetch).count();
    let text = Emitter::new(k, &order).module()?;
    let vmem_bytes = crate::tpu_facts::vmem_bytes(k);
    Ok(MosaicKernel {
        name: k.name.clone(),
        text,
        operands,
        results,
        scalar_prefetch,
        cost: cost::estimate(k, None),
        has_communication: memory::has_communication(k),
        collective_id: memory::uses_barrier(k).then_some(0),
        vmem_bytes,
        vmem_limit_bytes: (vmem_bytes + 2 * cost::largest_value_bytes(k))
            .clamp(MIN_VMEM_LIMIT_BYTES, MAX_VMEM_LIMIT_BYTES),
    })
}

/// Where each operand of `k`'s Mosaic call comes from, as indices into the kernel's
/// arguments (scalar prefetch and inputs in declaration order): the scalar-prefetch tables
/// first, then the inputs.
pub fn call_operand_order(k: &Kernel) -> Vec<usize> {
    let roles: Vec<OperandRole> = k
        .operands
        .iter()
        .map(|o| o.role)
        .filter(|r| matches!(r, OperandRole::Input | OperandRole::ScalarPrefetch))
        .collect();
    [OperandRole::ScalarPrefetch, OperandRole::Input]
        .into_iter()
        .flat_map(|want| {
            roles
                .iter()
                .enumerate()
                .filter(move |(_, r)| **r == want)
                .map(|(i, _)| i)
        })
        .collect()
}

/// The arguments of `k` (`args`, in declaration order) in the order its Mosaic call takes
/// them ([`call_operand_order`]).
pub fn call_order<A: Clone>(k: &Kernel, args: &[A]) -> Vec<A> {
    call_operand_order(k)
        .into_iter()
        .map(|i| args[i].clone())
        .collect()
}

/// The operands in the kernel function's order: scalar prefetch, inputs, outputs, scratch.
/// Scratch that `run_scoped` regions allocate (`memref.alloca`, `tpu.sem_alloc`) and the
/// barrier semaphore (`tpu.sem_barrier`) are not parameters.
fn func_order(k: &Kernel) -> Vec<RefId> {
    let mut scoped = std::collections::HashSet::new();
    crate::ir::scoped_allocs(&k.body, &mut |_, r| {
        scoped.insert(r);
    });
    [
        OperandRole::ScalarPrefetch,
        OperandRole::Input,
        OperandRole::Output,
        OperandRole::Scratch,
    ]
    .iter()
    .flat_map(|role| k.operands_with(*role))
    .filter(|(r, o)| {
        !scoped.contains(r) && o.memory != MemorySpace::Semaphore(crate::ir::SemKind::Barrier)
    })
    .map(|(r, _)| r)
    .collect()
}

fn lower_error(k: &Kernel, subject: &str, loc: Loc, message: String) -> KernelError {
    KernelError::new(
        &k.name,
        vec![Problem {
            kind: ProblemKind::Lower,
            subject: subject.to_string(),
            message,
            loc: Some(loc),
        }],
    )
}

/// The MLIR type of a value: a scalar, or a vector of its shape.
fn value_type(t: &ValueType) -> String {
    if t.is_scalar() {
        t.dtype.mlir_name().to_string()
    } else {
        vector_type(&t.shape, t.dtype)
    }
}

fn vector_type(shape: &[usize], dtype: DType) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("vector<{}x{}>", dims.join("x"), dtype.mlir_name())
}

fn memref_type(shape: &[usize], dtype: DType, memory: MemorySpace) -> String {
    let mut s = String::from("memref<");
    for d in shape {
        let _ = write!(s, "{d}x");
    }
    let (elem, space) = match memory.semaphore() {
        Some(SemKind::Dma) => ("!tpu.dma_semaphore", "semaphore_mem"),
        Some(SemKind::Regular | SemKind::Barrier) => ("!tpu.semaphore", "semaphore_mem"),
        None => (dtype.mlir_name(), memory.name()),
    };
    let _ = write!(s, "{elem}, #tpu.memory_space<{space}>>");
    s
}

/// The shape a ref has inside the kernel function: its block (squeezed dims as 1) or the
/// whole buffer.
fn memref_shape(k: &Kernel, r: RefId) -> Vec<usize> {
    k.operand(r).block_sizes()
}

fn ref_type(k: &Kernel, r: RefId) -> String {
    let o = k.operand(r);
    memref_type(&memref_shape(k, r), o.dtype, o.memory)
}

/// An MLIR float literal that parses back to exactly `x` (always with a `.`, as MLIR needs);
/// non-finite values as their bit pattern in `dtype`.
pub(crate) fn float_literal(x: f32, dtype: DType) -> String {
    if !x.is_finite() {
        return match dtype {
            DType::BF16 => format!("0x{:04X}", half::bf16::from_f32(x).to_bits()),
            _ => format!("0x{:08X}", x.to_bits()),
        };
    }
    let s = format!("{x:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) if !mantissa.contains('.') => format!("{mantissa}.0e{exp}"),
        _ => s,
    }
}

/// A literal of `dtype` as MLIR spells it, rounded to the dtype as the interpreter rounds it.
fn literal(value: Literal, dtype: DType) -> String {
    match (value, dtype) {
        (Literal::Bool(b), _) => b.to_string(),
        (Literal::Float(x), d) if d.is_float() => float_literal(round(x as f32, d), d),
        (Literal::Int(i), d) if d.is_float() => float_literal(round(i as f32, d), d),
        (Literal::Int(i), DType::I8) => (i as i8).to_string(),
        (Literal::Int(i), _) => (i as i32).to_string(),
        // Verified: float literals only for float dtypes.
        (Literal::Float(x), _) => (x as i32).to_string(),
    }
}

fn round(x: f32, dtype: DType) -> f32 {
    if dtype == DType::BF16 {
        half::bf16::from_f32(x).to_f32()
    } else {
        x
    }
}

fn loc_attr(loc: Loc) -> String {
    format!(
        "loc({}:{}:{})",
        string_literal(loc.file),
        loc.line,
        loc.column
    )
}

/// `s` as an MLIR string literal: quoted, with `"`, `\` and control characters escaped.
fn string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Emitter<'k> {
    k: &'k Kernel,
    order: &'k [RefId],
    out: String,
    depth: usize,
    next_temp: usize,
    /// IR value -> its SSA name in the function being emitted.
    env: HashMap<ValueId, String>,
    /// Ref -> its SSA name (a function argument).
    refs: HashMap<RefId, String>,
    /// Scalar constants, so a broadcast of one becomes a dense vector constant.
    scalar_constants: HashMap<ValueId, Literal>,
    /// The semaphores remote copies count their sends on.
    send_sems: SendSems,
}

type R<T> = Result<T, KernelError>;

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel, order: &'k [RefId]) -> Self {
        Emitter {
            k,
            order,
            out: String::new(),
            depth: 0,
            next_temp: 0,
            env: HashMap::new(),
            refs: HashMap::new(),
            scalar_constants: HashMap::new(),
            send_sems: SendSems::of(k),
        }
    }

    fn ref_names(&self) -> HashMap<RefId, String> {
        let mut names = HashMap::new();
        let mut taken = std::collections::HashSet::new();
        for &r in self.order {
            let o = self.k.operand(r);
            let clean: String = o
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let mut name = format!("%{}_{clean}", o.role.name());
            if !taken.insert(name.clone()) {
                name = format!("{name}_{}", r.0);
                taken.insert(name.clone());
            }
            names.insert(r, name);
        }
        names
    }

    fn line(&mut self, text: &str, loc: Loc) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push(' ');
        self.out.push_str(&loc_attr(loc));
        self.out.push('\n');
    }

    fn open(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
        self.depth += 1;
    }

    fn close(&mut self, loc: Option<Loc>) {
        self.depth -= 1;
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push('}');
        if let Some(loc) = loc {
            self.out.push(' ');
            self.out.push_str(&loc_attr(loc));
        }
        self.out.push('\n');
    }

    fn temp(&mut self) -> String {
        self.next_temp += 1;
        format!("%t{}", self.next_temp)
    }

    /// Emits `%t = <rhs>` and returns `%t`.
    fn emit(&mut self, rhs: &str, loc: Loc) -> String {
        let t = self.temp();
        self.line(&format!("{t} = {rhs}"), loc);
        t
    }

    fn v(&self, id: ValueId) -> String {
        self.env[&id].clone()
    }

    fn ty(&self, id: ValueId) -> &'k ValueType {
        self.k.value_type(id)
    }

    fn module(mut self) -> R<String> {
        let k = self.k;
        let names = self.ref_names();
        self.refs = names.clone();
        let _ = writeln!(
            self.out,
            "module attributes {{stable_mosaic.version = {MOSAIC_VERSION} : i64}} {{"
        );
        self.depth = 1;
        // Kernel function signature.
        let mut args: Vec<String> = (0..k.grid.len()).map(|d| format!("%g{d}: i32")).collect();
        for &r in self.order {
            args.push(format!("{}: {}", names[&r], ref_type(k, r)));
        }
        let sems: Vec<String> = k
            .semantics
            .iter()
            .map(|s| format!("#tpu.dimension_semantics<{}>", s.name()))
            .collect();
        let bounds: Vec<String> = k.grid.iter().map(|n| n.to_string()).collect();
        let blocked: Vec<RefId> = self
            .order
            .iter()
            .copied()
            .filter(|r| k.operand(*r).block.is_some())
            .collect();
        // Blocked inputs and outputs name their index map; those left in HBM have `{}`.
        let mut blocks = 0;
        let windows: Vec<String> = self
            .order
            .iter()
            .filter(|r| {
                matches!(
                    k.operand(**r).role,
                    OperandRole::Input | OperandRole::Output
                )
            })
            .map(|&r| {
                if k.operand(r).block.is_none() {
                    return "{}".to_string();
                }
                let sizes: Vec<String> = memref_shape(k, r).iter().map(|d| d.to_string()).collect();
                blocks += 1;
                format!(
                    "{{transform_indices = @transform_{}, window_bounds = array<i64: {}>}}",
                    blocks - 1,
                    sizes.join(", ")
                )
            })
            .collect();
        let prefetch = k.operands_with(OperandRole::ScalarPrefetch).count();
        let scratch = self
            .order
            .iter()
            .filter(|r| k.operand(**r).role == OperandRole::Scratch)
            .count();
        self.open(&format!(
            "func.func @{}({}) attributes {{dimension_semantics = [{}], iteration_bounds = \
             array<i64: {}>, scalar_prefetch = {prefetch} : i64, scratch_operands = {scratch} : \
             i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{}]}} {{",
            symbol(&k.name),
            args.join(", "),
            sems.join(", "),
            bounds.join(", "),
            windows.join(", ")
        ));
        self.barrier()?;
        let body = &k.body;
        self.region(body)?;
        self.line("return", k.loc);
        self.close(Some(k.loc));
        // One index-map function per blocked operand: grid indices and SMEM tables in, block
        // indices out.
        let prefetch_refs: Vec<RefId> = k
            .operands_with(OperandRole::ScalarPrefetch)
            .map(|(r, _)| r)
            .collect();
        for (i, &r) in blocked.iter().enumerate() {
            let o = k.operand(r);
            let map = &o
                .block
                .as_ref()
                .expect("blocked operands have a mapping")
                .index_map;
            let mut args: Vec<String> = (0..k.grid.len()).map(|d| format!("%g{d}: i32")).collect();
            for &p in &prefetch_refs {
                args.push(format!("{}: {}", names[&p], ref_type(k, p)));
            }
            let results = vec!["i32"; o.array_shape.len()].join(", ");
            self.env.clear();
            self.open(&format!(
                "func.func @transform_{i}({}) -> ({results}) {{",
                args.join(", ")
            ));
            for (d, &p) in map.params.iter().enumerate() {
                self.env.insert(p, format!("%g{d}"));
            }
            self.region(map)?;
            let yields: Vec<String> = map.yields.iter().map(|y| self.v(*y)).collect();
            self.line(&format!("return {} : {results}", yields.join(", ")), o.loc);
            self.close(Some(o.loc));
        }
        self.depth = 0;
        self.out.push_str("}\n");
        Ok(self.out)
    }

    fn region(&mut self, r: &Region) -> R<()> {
        for inst in &r.insts {
            self.inst(inst)?;
        }
        Ok(())
    }

    fn index_const(&mut self, i: usize, loc: Loc) -> String {
        self.emit(&format!("arith.constant {i} : index"), loc)
    }

    /// The memref indices of a window and the shape of the vector it spans (squeezed dims
    /// as 1, so the vector has the memref's rank).
    fn window(&mut self, r: RefId, slices: &[Slice], loc: Loc) -> (Vec<String>, Vec<usize>) {
        let o = self.k.operand(r);
        let dims: Vec<BlockDim> = match &o.block {
            Some(b) => b.block_shape.clone(),
            None => o.array_shape.iter().map(|&n| BlockDim::Sized(n)).collect(),
        };
        let mut slices = slices.iter();
        let mut indices = Vec::with_capacity(dims.len());
        let mut shape = Vec::with_capacity(dims.len());
        for d in dims {
            match d {
                BlockDim::Squeezed => {
                    indices.push(self.index_const(0, loc));
                    shape.push(1);
                }
                BlockDim::Sized(n) => {
                    let s = *slices.next().expect("verified: one slice per view dim");
                    let index = match s {
                        Slice::Full => self.index_const(0, loc),
                        Slice::Static { start, .. } => self.index_const(start, loc),
                        Slice::Dynamic { start, .. } => {
                            let v = self.v(start);
                            self.emit(&format!("arith.index_cast {v} : i32 to index"), loc)
                        }
                    };
                    indices.push(index);
                    shape.push(s.len(n));
                }
            }
        }
        (indices, shape)
    }

    fn shape_cast(
        &mut self,
        x: &str,
        from: &[usize],
        to: &[usize],
        dtype: DType,
        loc: Loc,
    ) -> String {
        if from == to {
            return x.to_string();
        }
        self.emit(
            &format!(
                "vector.shape_cast {x} : {} to {}",
                vector_type(from, dtype),
                vector_type(to, dtype)
            ),
            loc,
        )
    }

    /// `debug_print!`: scalars go to the TPU's log op with `$0`, `$1`, ... for the
    /// placeholders (`formatted`); a vector is stored to a VMEM buffer of its own, in a
    /// region, whose contents `tpu.log_buffer` prints after the format's text (the rule
    /// Pallas follows too: the vector's placeholder ends the format).
    fn debug_print(&mut self, format: &str, args: &[ValueId], loc: Loc) -> R<()> {
        let pieces = crate::ir::print_format_pieces(format)
            .map_err(|e| lower_error(self.k, "`debug_print`", loc, e.to_string()))?;
        let vector = match args {
            [v] if !self.ty(*v).is_scalar() => Some(*v),
            _ => None,
        };
        let Some(v) = vector else {
            let mut tag = String::new();
            for (i, piece) in pieces.iter().enumerate() {
                tag.push_str(piece);
                if i + 1 < pieces.len() {
                    let _ = write!(tag, "${i}");
                }
            }
            let values: Vec<String> = args.iter().map(|&a| self.v(a)).collect();
            let types: Vec<String> = args.iter().map(|&a| value_type(self.ty(a))).collect();
            self.line(
                &format!(
                    "\"tpu.log\"({}) <{{formatted = {}, tag = {}}}> : ({}) -> ()",
                    values.join(", "),
                    !args.is_empty(),
                    string_literal(&tag),
                    types.join(", ")
                ),
                loc,
            );
            return Ok(());
        };
        let t = self.ty(v);
        let buffer = memref_type(&t.shape, t.dtype, MemorySpace::Vmem);
        let x = self.v(v);
        self.open("\"tpu.region\"() ({");
        let b = self.emit(&format!("memref.alloca() : {buffer}"), loc);
        let zero = self.emit("arith.constant 0 : index", loc);
        let zeros = vec![zero; t.rank()];
        self.line(
            &format!(
                "tpu.vector_store {b}[{}], {x} {{strides = array<i32>}} : {buffer}, {},",
                zeros.join(", "),
                value_type(t)
            ),
            loc,
        );
        self.line(
            &format!(
                "\"tpu.log_buffer\"({b}) <{{shape = array<i64: {}>, tag = {}}}> : ({buffer}) -> ()",
                t.shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                string_literal(&pieces[0])
            ),
            loc,
        );
        self.line("tpu.yield", loc);
        self.depth -= 1;
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out
            .push_str(&format!("}}) : () -> () {}\n", loc_attr(loc)));
        Ok(())
    }

    /// i32 scalars as the `index` values `memref.load` and `memref.store` take.
    fn index_values(&mut self, indices: &[ValueId], loc: Loc) -> Vec<String> {
        indices
            .iter()
            .map(|&i| {
                let v = self.v(i);
                self.emit(&format!("arith.index_cast {v} : i32 to index"), loc)
            })
            .collect()
    }

    /// A splat of `value` as a dense vector constant, or a scalar constant.
    fn constant(&mut self, value: Literal, ty: &ValueType, loc: Loc) -> String {
        let lit = literal(value, ty.dtype);
        if ty.is_scalar() && ty.dtype == DType::Bool {
            // A bool attribute carries its type: MLIR reads no `: i1` after it.
            self.emit(&format!("arith.constant {lit}"), loc)
        } else if ty.is_scalar() {
            self.emit(
                &format!("arith.constant {lit} : {}", ty.dtype.mlir_name()),
                loc,
            )
        } else {
            self.emit(
                &format!("arith.constant dense<{lit}> : {}", value_type(ty)),
                loc,
            )
        }
    }

    fn inst(&mut self, inst: &Inst) -> R<()> {
        let k = self.k;
        let loc = inst.loc;
        let result_ty = |i: usize| k.value_type(inst.results[i]);
        let out: String = match &inst.op {
            Op::ProgramId { axis } => format!("%g{axis}"),
            Op::NumPrograms { axis } => {
                self.emit(&format!("arith.constant {} : i32", k.grid[*axis]), loc)
            }
            Op::Constant { value, ty } => {
                if ty.is_scalar() {
                    self.scalar_constants.insert(inst.results[0], *value);
                }
                self.constant(*value, ty, loc)
            }
            Op::Load { src, slices } => {
                let (indices, shape) = self.window(*src, slices, loc);
                let r = self.refs[src].clone();
                let ty = result_ty(0);
                let v = self.emit(
                    &format!(
                        "vector.load {r}[{}] : {}, {}",
                        indices.join(", "),
                        ref_type(k, *src),
                        vector_type(&shape, ty.dtype)
                    ),
                    loc,
                );
                self.shape_cast(&v, &shape, &ty.shape, ty.dtype, loc)
            }
            Op::Store { dst, slices, value } => {
                let (indices, shape) = self.window(*dst, slices, loc);
                let vt = self.ty(*value);
                let v = self.v(*value);
                let v = self.shape_cast(&v, &vt.shape, &shape, vt.dtype, loc);
                let r = self.refs[dst].clone();
                self.line(
                    &format!(
                        "tpu.vector_store {r}[{}], {v} {{strides = array<i32>}} : {}, {},",
                        indices.join(", "),
                        ref_type(k, *dst),
                        vector_type(&shape, vt.dtype)
                    ),
                    loc,
                );
                return Ok(());
            }
            Op::LoadScalar { src, indices } => {
                let idx = self.index_values(indices, loc);
                let r = self.refs[src].clone();
                self.emit(
                    &format!(
                        "memref.load {r}[{}] : {}",
                        idx.join(", "),
                        ref_type(k, *src)
                    ),
                    loc,
                )
            }
            Op::StoreScalar {
                dst,
                indices,
                value,
            } => {
                let idx = self.index_values(indices, loc);
                let (r, v) = (self.refs[dst].clone(), self.v(*value));
                self.line(
                    &format!(
                        "memref.store {v}, {r}[{}] : {}",
                        idx.join(", "),
                        ref_type(k, *dst)
                    ),
                    loc,
                );
                return Ok(());
            }
            Op::Unary { op, x } => {
                let t = self.ty(*x);
                let (xs, ts) = (self.v(*x), value_type(t));
                let float = t.dtype.is_float();
                match op {
                    UnaryOp::Neg if float => self.emit(&format!("arith.negf {xs} : {ts}"), loc),
                    UnaryOp::Neg => {
                        let zero = self.constant(Literal::Int(0), t, loc);
                        self.emit(&format!("arith.subi {zero}, {xs} : {ts}"), loc)
                    }
                    UnaryOp::Exp => self.emit(&format!("math.exp {xs} : {ts}"), loc),
                    UnaryOp::Log => self.emit(&format!("math.log {xs} : {ts}"), loc),
                    UnaryOp::Tanh => self.emit(&format!("math.tanh {xs} : {ts}"), loc),
                    UnaryOp::Sqrt => self.emit(&format!("math.sqrt {xs} : {ts}"), loc),
                    UnaryOp::Rsqrt => self.emit(&format!("math.rsqrt {xs} : {ts}"), loc),
                    UnaryOp::Abs if float => self.emit(&format!("math.absf {xs} : {ts}"), loc),
                    UnaryOp::Abs => self.emit(&format!("math.absi {xs} : {ts}"), loc),
                    UnaryOp::Not => {
                        let one = self.constant(Literal::Bool(true), t, loc);
                        self.emit(&format!("arith.xori {xs}, {one} : {ts}"), loc)
                    }
                }
            }
            Op::Binary { op, lhs, rhs } => {
                let t = self.ty(*lhs);
                let name = binary_op(*op, t.dtype);
                let (a, b) = (self.v(*lhs), self.v(*rhs));
                self.emit(&format!("{name} {a}, {b} : {}", value_type(t)), loc)
            }
            Op::Compare { op, lhs, rhs } => {
                let t = self.ty(*lhs);
                let (a, b) = (self.v(*lhs), self.v(*rhs));
                let (name, pred) = compare_op(*op, t.dtype);
                self.emit(&format!("{name} {pred}, {a}, {b} : {}", value_type(t)), loc)
            }
            Op::Select {
                cond,
                on_true,
                on_false,
            } => {
                let (c, a, b) = (self.v(*cond), self.v(*on_true), self.v(*on_false));
                let t = self.ty(*on_true);
                let types = if t.is_scalar() {
                    value_type(t)
                } else {
                    format!("{}, {}", value_type(self.ty(*cond)), value_type(t))
                };
                self.emit(&format!("arith.select {c}, {a}, {b} : {types}"), loc)
            }
            Op::Cast { x, to } => self.cast(*x, *to, loc),
            Op::Broadcast { x, shape } => {
                let t = self.ty(*x);
                let to = ValueType::new(t.dtype, shape.clone());
                if t.shape == *shape {
                    self.v(*x)
                } else if let Some(value) = self.scalar_constants.get(x).copied() {
                    self.constant(value, &to, loc)
                } else {
                    let xs = self.v(*x);
                    self.emit(
                        &format!(
                            "vector.broadcast {xs} : {} to {}",
                            value_type(t),
                            value_type(&to)
                        ),
                        loc,
                    )
                }
            }
            Op::Repeat { x, times, axis } => {
                // As JAX lowers `pltpu.repeat`: one `tpu.concatenate` of the copies.
                let t = self.ty(*x);
                let xs = self.v(*x);
                if *times == 1 {
                    xs
                } else {
                    let mut shape = t.shape.clone();
                    shape[*axis] *= times;
                    let to = ValueType::new(t.dtype, shape);
                    self.emit(
                        &format!(
                            "tpu.concatenate {} in {axis} : {} -> {}",
                            vec![xs.as_str(); *times].join(", "),
                            vec![value_type(t); *times].join(", "),
                            value_type(&to)
                        ),
                        loc,
                    )
                }
            }
            Op::Reshape { x, shape } => {
                let t = self.ty(*x);
                let xs = self.v(*x);
                let to = ValueType::new(t.dtype, shape.clone());
                if t.shape == *shape {
                    xs
                } else if t.is_scalar() {
                    self.emit(
                        &format!(
                            "vector.broadcast {xs} : {} to {}",
                            value_type(t),
                            value_type(&to)
                        ),
                        loc,
                    )
                } else if to.is_scalar() {
                    let zeros = vec!["0"; t.rank()].join(", ");
                    self.emit(
                        &format!(
                            "vector.extract {xs}[{zeros}] : {} from {}",
                            t.dtype.mlir_name(),
                            value_type(t)
                        ),
                        loc,
                    )
                } else if t.rank() == 2 && shape.len() == 2 && t.shape[0] != shape[0] {
                    // A row as a column or back: through the 1-D vector (Mosaic casts a
                    // rank-2 vector to rank 1 and back, not across its tiled dims at once).
                    let flat = [t.shape.iter().product()];
                    let line = self.shape_cast(&xs, &t.shape, &flat, t.dtype, loc);
                    self.shape_cast(&line, &flat, shape, t.dtype, loc)
                } else {
                    self.shape_cast(&xs, &t.shape, shape, t.dtype, loc)
                }
            }
            Op::Iota { ty, dim } => {
                let i32_ty = ValueType::new(DType::I32, ty.shape.clone());
                let iota = self.emit(
                    &format!(
                        "tpu.iota {{dimensions = array<i32: {dim}>}} : {}",
                        value_type(&i32_ty)
                    ),
                    loc,
                );
                if ty.dtype == DType::I32 {
                    iota
                } else {
                    self.emit(
                        &format!(
                            "arith.trunci {iota} : {} to {}",
                            value_type(&i32_ty),
                            value_type(ty)
                        ),
                        loc,
                    )
                }
            }
            Op::Reduce { op, x, axis } => {
                let t = self.ty(*x);
                let out_ty = result_ty(0);
                // bf16 accumulates in f32 and rounds once, as the interpreter does.
                let wide = t.dtype == DType::BF16;
                let (src, acc_dtype) = if wide {
                    let w = ValueType::new(DType::F32, t.shape.clone());
                    let xs = self.v(*x);
                    let e = self.emit(
                        &format!("arith.extf {xs} : {} to {}", value_type(t), value_type(&w)),
                        loc,
                    );
                    (e, DType::F32)
                } else {
                    (self.v(*x), t.dtype)
                };
                let in_ty = ValueType::new(acc_dtype, t.shape.clone());
                let acc_ty = ValueType::new(acc_dtype, out_ty.shape.clone());
                let (kind, init) = reduce_kind(*op, acc_dtype);
                let acc = self.constant(init, &acc_ty, loc);
                let red = self.emit(
                    &format!(
                        "vector.multi_reduction <{kind}>, {src}, {acc} [{axis}] : {} to {}",
                        value_type(&in_ty),
                        value_type(&acc_ty)
                    ),
                    loc,
                );
                if wide {
                    self.emit(
                        &format!(
                            "arith.truncf {red} : {} to {}",
                            value_type(&acc_ty),
                            value_type(out_ty)
                        ),
                        loc,
                    )
                } else {
                    red
                }
            }
            Op::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => {
                let (a, b) = (self.v(*lhs), self.v(*rhs));
                let (ta, tb) = (self.ty(*lhs), self.ty(*rhs));
                let out_ty = result_ty(0);
                let zero = match out_ty.dtype {
                    DType::I32 => Literal::Int(0),
                    _ => Literal::Float(0.0),
                };
                let acc = self.constant(zero, out_ty, loc);
                let (lc, ln) = if *transpose_lhs { (0, 1) } else { (1, 0) };
                let (rc, rn) = if *transpose_rhs { (1, 0) } else { (0, 1) };
                // f32 operands multiply at full f32 precision, as the interpreter does.
                let precision = if ta.dtype == DType::F32 {
                    ", precision = #tpu.contract_precision<fp32>"
                } else {
                    ""
                };
                self.emit(
                    &format!(
                        "tpu.matmul {a}, {b}, {acc} {{dimension_numbers = \
                         #tpu.dot_dimension_numbers<[{lc}], [{rc}], [{ln}], [{rn}], \
                         [0, {ln}, 1, {rn}], [], []>{precision}, transpose_lhs_hint = false}} : {}, {}, {} -> {}",
                        value_type(ta),
                        value_type(tb),
                        value_type(out_ty),
                        value_type(out_ty)
                    ),
                    loc,
                )
            }
            Op::DeviceId => self.emit("tpu.device_id : i32", loc),
            Op::DmaStart {
                src,
                dst,
                sem,
                remote,
            } => {
                self.dma_start(src, dst, sem, remote.as_ref(), loc);
                return Ok(());
            }
            Op::DmaWait { src, dst, sem } => {
                self.dma_wait(src, dst, sem, loc);
                return Ok(());
            }
            Op::SemSignal { sem, inc, device } => {
                self.sem_signal(sem, *inc, *device, loc);
                return Ok(());
            }
            Op::SemWait { sem, value } => {
                self.sem_wait(sem, *value, loc);
                return Ok(());
            }
            Op::SemRead { sem } => self.sem_read(sem, loc),
            Op::Scoped { allocs, body } => return self.scoped(inst, allocs, body),
            Op::DebugPrint { format, args } => return self.debug_print(format, args, loc),
            Op::DebugCheck { cond, message } => {
                let c = self.v(*cond);
                self.line(&format!("cf.assert {c}, {}", string_literal(message)), loc);
                return Ok(());
            }
            Op::When {
                cond,
                then,
                otherwise,
            } => {
                let c = self.v(*cond);
                self.open(&format!("scf.if {c} {{"));
                self.region(then)?;
                if !otherwise.insts.is_empty() {
                    self.depth -= 1;
                    self.open("} else {");
                    self.region(otherwise)?;
                }
                self.close(Some(loc));
                return Ok(());
            }
            Op::ForLoop { lo, hi, init, body } => {
                let one = self.emit("arith.constant 1 : i32", loc);
                let (lo, hi) = (self.v(*lo), self.v(*hi));
                let iv = format!("%v{}", body.params[0].0);
                self.env.insert(body.params[0], iv.clone());
                let mut iter_args = Vec::new();
                let mut types = Vec::new();
                for (&p, &i) in body.params[1..].iter().zip(init) {
                    let name = format!("%v{}", p.0);
                    iter_args.push(format!("{name} = {}", self.v(i)));
                    types.push(value_type(self.ty(i)));
                    self.env.insert(p, name);
                }
                let results = match inst.results.len() {
                    0 => String::new(),
                    1 => format!("%v{} = ", inst.results[0].0),
                    n => format!("%v{}:{n} = ", inst.results[0].0),
                };
                let carried = if init.is_empty() {
                    String::new()
                } else {
                    format!(
                        " iter_args({}) -> ({})",
                        iter_args.join(", "),
                        types.join(", ")
                    )
                };
                self.open(&format!(
                    "{results}scf.for {iv} = {lo} to {hi} step {one}{carried} : i32 {{"
                ));
                self.region(body)?;
                if !body.yields.is_empty() {
                    let ys: Vec<String> = body.yields.iter().map(|y| self.v(*y)).collect();
                    self.line(
                        &format!("scf.yield {} : {}", ys.join(", "), types.join(", ")),
                        loc,
                    );
                }
                self.close(Some(loc));
                match inst.results.len() {
                    0 => {}
                    1 => {
                        self.env
                            .insert(inst.results[0], format!("%v{}", inst.results[0].0));
                    }
                    _ => {
                        let base = inst.results[0].0;
                        for (i, &r) in inst.results.iter().enumerate() {
                            self.env.insert(r, format!("%v{base}#{i}"));
                        }
                    }
                }
                return Ok(());
            }
        };
        self.env.insert(inst.results[0], out);
        Ok(())
    }

    /// `x` converted to `to` with the interpreter's semantics (bools are 0 and 1; floats
    /// truncate toward zero into ints; nonzero is true).
    fn cast(&mut self, x: ValueId, to: DType, loc: Loc) -> String {
        let t = self.ty(x);
        let from = t.dtype;
        let xs = self.v(x);
        if from == to {
            return xs;
        }
        let src = value_type(t);
        let dst_ty = ValueType::new(to, t.shape.clone());
        let dst = value_type(&dst_ty);
        let conv = |op: &str| format!("{op} {xs} : {src} to {dst}");
        match (from, to) {
            (DType::BF16, DType::F32) => self.emit(&conv("arith.extf"), loc),
            (DType::F32, DType::BF16) => self.emit(&conv("arith.truncf"), loc),
            (f, i) if f.is_float() && i.is_int() => self.emit(&conv("arith.fptosi"), loc),
            (i, f) if i.is_int() && f.is_float() => self.emit(&conv("arith.sitofp"), loc),
            (DType::I8, DType::I32) => self.emit(&conv("arith.extsi"), loc),
            (DType::I32, DType::I8) => self.emit(&conv("arith.trunci"), loc),
            (f, DType::Bool) => {
                let zero = self.constant(Literal::Int(0), t, loc);
                let (name, pred) = if f.is_float() {
                    ("arith.cmpf", "une")
                } else {
                    ("arith.cmpi", "ne")
                };
                self.emit(&format!("{name} {pred}, {xs}, {zero} : {src}"), loc)
            }
            (DType::Bool, i) if i.is_int() => self.emit(&conv("arith.extui"), loc),
            (DType::Bool, _) => {
                // bool -> i32 -> float.
                let wide = ValueType::new(DType::I32, t.shape.clone());
                let w = self.emit(
                    &format!("arith.extui {xs} : {src} to {}", value_type(&wide)),
                    loc,
                );
                self.emit(
                    &format!("arith.sitofp {w} : {} to {dst}", value_type(&wide)),
                    loc,
                )
            }
            (f, t) => unreachable!("every dtype pair is covered above: {f} -> {t}"),
        }
    }
}

/// A symbol name MLIR accepts unquoted, or the name quoted.
fn symbol(name: &str) -> String {
    let plain = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '-'));
    if plain {
        name.to_string()
    } else {
        string_literal(name)
    }
}

fn binary_op(op: BinaryOp, dtype: DType) -> &'static str {
    if dtype.is_float() {
        match op {
            BinaryOp::Add => "arith.addf",
            BinaryOp::Sub => "arith.subf",
            BinaryOp::Mul => "arith.mulf",
            BinaryOp::Div => "arith.divf",
            BinaryOp::Rem => "arith.remf",
            BinaryOp::Max => "arith.maximumf",
            BinaryOp::Min => "arith.minimumf",
            // Verified: logical ops only on ints and bools.
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => unreachable!("logical op on floats"),
        }
    } else {
        match op {
            BinaryOp::Add => "arith.addi",
            BinaryOp::Sub => "arith.subi",
            BinaryOp::Mul => "arith.muli",
            BinaryOp::Div => "arith.divsi",
            BinaryOp::Rem => "arith.remsi",
            BinaryOp::Max => "arith.maxsi",
            BinaryOp::Min => "arith.minsi",
            BinaryOp::And => "arith.andi",
            BinaryOp::Or => "arith.ori",
            BinaryOp::Xor => "arith.xori",
        }
    }
}

/// The compare op and predicate: ordered float compares (false on NaN) except `ne`, which is
/// true on NaN as in Rust; bools compare unsigned (false < true).
fn compare_op(op: CmpOp, dtype: DType) -> (&'static str, &'static str) {
    if dtype.is_float() {
        let p = match op {
            CmpOp::Eq => "oeq",
            CmpOp::Ne => "une",
            CmpOp::Lt => "olt",
            CmpOp::Le => "ole",
            CmpOp::Gt => "ogt",
            CmpOp::Ge => "oge",
        };
        ("arith.cmpf", p)
    } else {
        let signed = !dtype.is_bool();
        let p = match (op, signed) {
            (CmpOp::Eq, _) => "eq",
            (CmpOp::Ne, _) => "ne",
            (CmpOp::Lt, true) => "slt",
            (CmpOp::Le, true) => "sle",
            (CmpOp::Gt, true) => "sgt",
            (CmpOp::Ge, true) => "sge",
            (CmpOp::Lt, false) => "ult",
            (CmpOp::Le, false) => "ule",
            (CmpOp::Gt, false) => "ugt",
            (CmpOp::Ge, false) => "uge",
        };
        ("arith.cmpi", p)
    }
}

/// The `vector.multi_reduction` kind and its neutral element.
fn reduce_kind(op: ReduceOp, dtype: DType) -> (&'static str, Literal) {
    if dtype.is_float() {
        match op {
            ReduceOp::Sum => ("add", Literal::Float(0.0)),
            ReduceOp::Max => ("maximumf", Literal::Float(f64::NEG_INFINITY)),
            ReduceOp::Min => ("minimumf", Literal::Float(f64::INFINITY)),
        }
    } else {
        let (lo, hi) = if dtype == DType::I8 {
            (i8::MIN as i64, i8::MAX as i64)
        } else {
            (i32::MIN as i64, i32::MAX as i64)
        };
        match op {
            ReduceOp::Sum => ("add", Literal::Int(0)),
            ReduceOp::Max => ("maxsi", Literal::Int(lo)),
            ReduceOp::Min => ("minsi", Literal::Int(hi)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals_parse_back_exactly() {
        assert_eq!(float_literal(1.0, DType::F32), "1.0e0");
        assert_eq!(float_literal(-0.125, DType::F32), "-1.25e-1");
        assert_eq!(float_literal(f32::NEG_INFINITY, DType::F32), "0xFF800000");
        assert_eq!(float_literal(f32::NEG_INFINITY, DType::BF16), "0xFF80");
        for x in [0.1f32, 1.0 / 3.0, 3.4e38, 1e-40, -2.381_976_3e38] {
            let s = float_literal(x, DType::F32);
            assert_eq!(s.parse::<f32>().unwrap(), x, "{s}");
            assert!(s.contains('.'), "{s}");
        }
    }

    #[test]
    fn symbols_are_quoted_when_needed() {
        assert_eq!(symbol("splash_fwd"), "splash_fwd");
        assert_eq!(symbol("1x"), "\"1x\"");
    }
}
