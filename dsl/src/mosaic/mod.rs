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

mod control;
mod cost;
mod memory;
mod schedule;
mod vector;

use std::collections::HashMap;
use std::fmt::Write;

use crate::tpu_facts::SendSems;

pub(crate) use cost::estimate as cost_estimate;
pub use cost::CostEstimate;
pub use schedule::{ArgValues, KernelSchedule, PathRuns, ScheduleError, CHECK_FAILED_PATH};

use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    BlockDim, Buffering, DType, Inst, Kernel, Literal, Loc, MemorySpace, Op, OperandRole, RefId,
    Region, SemKind, Slice, ValueId, ValueType,
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

/// The scoped VMEM kernel `k` needs on TPU, as its Mosaic call asks for it (before the
/// clamp of [`MosaicKernel::vmem_limit_bytes`]): its blocks and scratch plus room for two of
/// its largest vector values to spill. The TPU rules check the blocks and scratch alone
/// (what libtpu surely refuses); a kernel whose need passes the budget may still be refused
/// by libtpu, so a caller choosing between kernels holds this against the budget.
pub fn scoped_vmem_bytes(k: &Kernel) -> usize {
    crate::tpu_facts::vmem_bytes(k) + 2 * cost::largest_value_bytes(k)
}

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
        vmem_limit_bytes: scoped_vmem_bytes(k).clamp(MIN_VMEM_LIMIT_BYTES, MAX_VMEM_LIMIT_BYTES),
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

/// What an op with a region (`scf.for`, `tpu.region`) is assigned to: nothing, `%vN = ` or
/// `%vN:k = ` for `k` results ([`Emitter::bind_results`] binds them).
fn results_prefix(inst: &Inst) -> String {
    match inst.results.len() {
        0 => String::new(),
        1 => format!("%v{} = ", inst.results[0].0),
        n => format!("%v{}:{n} = ", inst.results[0].0),
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
                // Double buffering is Mosaic's default; one buffer is asked for by name.
                let pipeline_mode = match k.operand(r).block.as_ref().map(|b| b.buffering) {
                    Some(Buffering::Single) => ", pipeline_mode = #tpu.pipeline_mode<synchronous>",
                    _ => "",
                };
                format!(
                    "{{transform_indices = @transform_{}, window_bounds = array<i64: {}>{}}}",
                    blocks - 1,
                    sizes.join(", "),
                    pipeline_mode
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
    /// Binds the results of an op with a region (`scf.for`, `tpu.region`), emitted after
    /// [`results_prefix`]: one result is `%vN`, several are `%vN#0`, `%vN#1`, ...
    fn bind_results(&mut self, inst: &Inst) {
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
    }

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

    /// Emits one instruction and binds its result. The op families' emitters live beside
    /// this file: `vector.rs` (elementwise ops, shapes, reductions, matmuls), `memory.rs`
    /// (loads and stores, copies, semaphores, scopes) and `control.rs` (`when`, loops).
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
            Op::Load { src, slices } => self.load(src, slices, result_ty(0), loc),
            Op::Store { dst, slices, value } => {
                self.store(dst, slices, value, loc);
                return Ok(());
            }
            Op::LoadScalar { src, indices } => self.load_scalar(src, indices, loc),
            Op::StoreScalar {
                dst,
                indices,
                value,
            } => {
                self.store_scalar(dst, indices, value, loc);
                return Ok(());
            }
            Op::Unary { op, x } => self.unary(op, x, loc),
            Op::Binary { op, lhs, rhs } => self.binary(op, lhs, rhs, loc),
            Op::Compare { op, lhs, rhs } => self.compare(op, lhs, rhs, loc),
            Op::Select {
                cond,
                on_true,
                on_false,
            } => self.select(cond, on_true, on_false, loc),
            Op::Cast { x, to } => self.cast(*x, *to, loc),
            Op::Broadcast { x, shape } => self.broadcast(x, shape, loc),
            Op::Repeat { x, times, axis } => self.repeat(x, times, axis, loc),
            Op::Reshape { x, shape } => self.reshape(x, shape, loc),
            Op::Iota { ty, dim } => self.iota(ty, dim, loc),
            Op::Reduce { op, x, axis } => self.reduce(op, x, axis, result_ty(0), loc),
            Op::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => self.dot(lhs, rhs, transpose_lhs, transpose_rhs, result_ty(0), loc),
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
            } => return self.when(cond, then, otherwise, loc),
            Op::ForLoop { lo, hi, init, body } => {
                return self.for_loop(inst, lo, hi, init, body, loc)
            }
        };
        self.env.insert(inst.results[0], out);
        Ok(())
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
