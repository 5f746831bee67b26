//! The kernel IR: an instantiated kernel with its grid, operands (with block mappings) and body.

mod checks;
mod infer_error;
mod ops;
mod print;
mod protocol;
mod types;
mod verify;

pub use crate::loc::Loc;
pub use checks::{CheckFlags, CheckKind, CheckSite, KernelChecks, FLAG_WORDS};
pub use infer_error::{InferError, NotCopyableWhy, WantedSemaphore};
pub use ops::{
    broadcast_shapes, broadcastable, infer, squeezed, BinaryOp, CmpOp, InferContext, Inst, Op,
    ReduceOp, RefWindow, Region, RemoteDma, SemRef, Slice, UnaryOp,
};
pub(crate) use ops::{dynamic_starts, format_print, print_format_pieces};
pub use protocol::check_protocol;
pub(crate) use protocol::eval_scalar;
pub use types::{
    device_count, DType, DeviceAxis, DimSemantics, Literal, MemorySpace, RefId, SemKind, ValueId,
    ValueType,
};
pub(crate) use verify::scoped_allocs;
pub use verify::{verify, VerifyError};

pub(crate) use types::{garbage_literal, join};

/// What a kernel operand is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperandRole {
    Input,
    Output,
    Scratch,
    /// Small integer arrays copied to SMEM before the grid starts; index maps may read them.
    ScalarPrefetch,
}

impl OperandRole {
    pub fn name(self) -> &'static str {
        match self {
            OperandRole::Input => "in",
            OperandRole::Output => "out",
            OperandRole::Scratch => "scratch",
            OperandRole::ScalarPrefetch => "prefetch",
        }
    }
}

/// One dimension of a block shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockDim {
    /// `n` elements per block.
    Sized(usize),
    /// One element, and the dimension is removed from the kernel's view (Pallas' `None`).
    Squeezed,
}

impl BlockDim {
    pub fn size(self) -> usize {
        match self {
            BlockDim::Sized(n) => n,
            BlockDim::Squeezed => 1,
        }
    }
}

impl std::fmt::Display for BlockDim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockDim::Sized(n) => write!(f, "{n}"),
            BlockDim::Squeezed => f.write_str("_"),
        }
    }
}

/// How a grid step selects the block of an array: a block shape and an index map from grid
/// indices to block indices (element offset = block index x block size, per dim).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockMapping {
    pub block_shape: Vec<BlockDim>,
    /// `params`: the grid indices (i32 scalars); `yields`: one block index per array dim.
    pub index_map: Region,
    /// How many VMEM buffers the grid's pipeline keeps for the block.
    pub buffering: Buffering,
}

/// How many VMEM buffers the grid's pipeline keeps for a block (Pallas' `pipeline_mode=
/// pl.Buffered(n)`; Mosaic's `pipeline_mode` window parameter). It changes when a block's
/// copies happen and the VMEM it takes, never what the kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Buffering {
    /// Two buffers: the next step's block is copied while this step computes (the default).
    #[default]
    Double,
    /// One buffer: the copy in happens before the step and the copy out after it, exposed.
    /// Half the VMEM, for a block whose index changes rarely (one fetched once per outer
    /// grid index) or whose copy is small next to the step.
    Single,
}

impl Buffering {
    /// The buffers of this kind: 2 or 1.
    pub fn count(self) -> usize {
        match self {
            Buffering::Double => 2,
            Buffering::Single => 1,
        }
    }
}

/// A kernel operand: an input, output, scratch buffer or scalar-prefetch array.
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    pub name: String,
    pub role: OperandRole,
    pub dtype: DType,
    pub memory: MemorySpace,
    /// The whole array (for scratch: the buffer itself).
    pub array_shape: Vec<usize>,
    /// Present for blocked VMEM inputs and outputs.
    pub block: Option<BlockMapping>,
    /// For an output: the input whose buffer it is (Pallas' `input_output_aliases`). It
    /// starts with the input's values, so what the kernel does not store keeps them.
    pub aliases: Option<RefId>,
    pub loc: Loc,
}

impl Operand {
    /// The shape the kernel body sees: the block without squeezed dims, or the whole array.
    pub fn view_shape(&self) -> Vec<usize> {
        match &self.block {
            Some(b) => b
                .block_shape
                .iter()
                .filter_map(|d| match d {
                    BlockDim::Sized(n) => Some(*n),
                    BlockDim::Squeezed => None,
                })
                .collect(),
            None => self.array_shape.clone(),
        }
    }

    /// The block shape with squeezed dims as 1 (same rank as the array).
    pub fn block_sizes(&self) -> Vec<usize> {
        match &self.block {
            Some(b) => b.block_shape.iter().map(|d| d.size()).collect(),
            None => self.array_shape.clone(),
        }
    }

    /// A description for messages, e.g. `in_specs[1] (y)`.
    pub fn describe(&self, position: usize) -> String {
        let list = match self.role {
            OperandRole::Input => "in_specs",
            OperandRole::Output => "out_specs",
            OperandRole::Scratch => "scratch_shapes",
            OperandRole::ScalarPrefetch => "scalar_prefetch",
        };
        format!("{list}[{position}] ({})", self.name)
    }
}

/// A compile-time parameter value of an instantiated kernel (block size, flag, mask, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Param {
    pub name: String,
    pub value: String,
}

/// An instantiated kernel: everything is concrete (shapes, grid, block sizes).
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<Param>,
    pub grid: Vec<usize>,
    pub semantics: Vec<DimSemantics>,
    pub operands: Vec<Operand>,
    /// The device mesh the kernel runs on (empty: one device, no remote copies).
    pub mesh: Vec<DeviceAxis>,
    pub body: Region,
    /// Type of every value, indexed by [`ValueId`].
    pub types: Vec<ValueType>,
    /// Where the kernel was declared.
    pub loc: Loc,
    /// The run-time index checks it makes ([`crate::checks`]), with their flags' operands
    /// (none where every index is proven in range or marked unchecked).
    pub checks: KernelChecks,
}

impl Kernel {
    pub fn value_type(&self, v: ValueId) -> &ValueType {
        &self.types[v.index()]
    }

    pub fn operand(&self, r: RefId) -> &Operand {
        &self.operands[r.index()]
    }

    /// The operands the caller passes as arguments (scalar prefetch and inputs), in
    /// declaration order: the order of the kernel's arguments. The check flags' zeros of a
    /// kernel with run-time checks are not among them: each lowering makes them itself
    /// ([`Kernel::all_argument_refs`] lists them too, last).
    pub fn argument_refs(&self) -> Vec<RefId> {
        let init = self.checks.flags.map(|c| c.init);
        self.all_argument_refs()
            .into_iter()
            .filter(|&r| Some(r) != init)
            .collect()
    }

    /// [`Kernel::argument_refs`] and, for a kernel with run-time checks, the zeros its
    /// check flags start from (declared last, so last).
    pub fn all_argument_refs(&self) -> Vec<RefId> {
        (0..self.operands.len() as u32)
            .map(RefId)
            .filter(|&r| {
                matches!(
                    self.operand(r).role,
                    OperandRole::Input | OperandRole::ScalarPrefetch
                )
            })
            .collect()
    }

    /// The outputs the caller gets (without the check flags), with their ids.
    pub fn caller_outputs(&self) -> impl Iterator<Item = (RefId, &Operand)> {
        let flags = self.checks.flags.map(|c| c.flags);
        self.operands_with(OperandRole::Output)
            .filter(move |(r, _)| Some(*r) != flags)
    }

    /// Operands with `role`, with their ids, in declaration order.
    pub fn operands_with(&self, role: OperandRole) -> impl Iterator<Item = (RefId, &Operand)> {
        self.operands
            .iter()
            .enumerate()
            .filter(move |(_, o)| o.role == role)
            .map(|(i, o)| (RefId(i as u32), o))
    }

    /// The position of `r` among the operands of its role (for `in_specs[i]` messages).
    pub fn role_position(&self, r: RefId) -> usize {
        let role = self.operand(r).role;
        self.operands[..r.index()]
            .iter()
            .filter(|o| o.role == role)
            .count()
    }

    /// `in_specs[1] (y)`-style name of an operand.
    pub fn describe(&self, r: RefId) -> String {
        self.operand(r).describe(self.role_position(r))
    }

    /// The number of devices the kernel runs on (1 without a mesh).
    pub fn num_devices(&self) -> usize {
        device_count(&self.mesh)
    }

    /// Whether the kernel moves its own data: HBM operands, semaphores, copies, device ids
    /// or scoped allocations (what the pipeline-only paths of the backends do not handle).
    pub fn moves_own_data(&self) -> bool {
        fn region(r: &Region) -> bool {
            r.insts.iter().any(|i| {
                matches!(
                    i.op,
                    Op::DeviceId
                        | Op::DmaStart { .. }
                        | Op::DmaWait { .. }
                        | Op::SemSignal { .. }
                        | Op::SemWait { .. }
                        | Op::SemRead { .. }
                        | Op::Scoped { .. }
                ) || i.op.regions().into_iter().any(region)
            })
        }
        self.operands
            .iter()
            .any(|o| matches!(o.memory, MemorySpace::Any | MemorySpace::Semaphore(_)))
            || region(&self.body)
    }

    /// The IR in its stable text form.
    pub fn to_text(&self) -> String {
        print::print_kernel(self)
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl InferContext for Kernel {
    fn value_type(&self, v: ValueId) -> &ValueType {
        &self.types[v.index()]
    }
    fn operand(&self, r: RefId) -> Option<&Operand> {
        self.operands.get(r.index())
    }
    fn grid_rank(&self) -> usize {
        self.grid.len()
    }
}
