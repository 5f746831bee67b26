//! The op data model: every op is an [`OpKind`] (with its attributes) plus operands, results
//! and regions. Text is rendered from this data (see `print.rs`), so passes (e.g. a later
//! reverse-mode autodiff) can walk and rebuild programs.

use std::fmt;

use crate::{DType, Literal};

/// A typed SSA value of one function. Cheap to copy; its type is known to the
/// [`crate::FuncBuilder`] that made it and to the finished [`crate::Func`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub(crate) func: u32,
    pub(crate) id: u32,
}

impl Value {
    /// Index of this value in its function's value table ([`crate::Func::value_type`]).
    pub fn index(self) -> usize {
        self.id as usize
    }
}

/// Elementwise unary ops. Result type = operand type, except `IsFinite` (result `i1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `stablehlo.negate` (numeric).
    Neg,
    /// `stablehlo.abs` (numeric).
    Abs,
    /// `stablehlo.sign` (numeric).
    Sign,
    /// `stablehlo.exponential` (float).
    Exp,
    /// `stablehlo.exponential_minus_one` (float).
    Expm1,
    /// `stablehlo.log` (float).
    Log,
    /// `stablehlo.log_plus_one` (float).
    Log1p,
    /// `stablehlo.tanh` (float).
    Tanh,
    /// `stablehlo.logistic` (float): `1 / (1 + exp(-x))`.
    Logistic,
    /// `stablehlo.sqrt` (float).
    Sqrt,
    /// `stablehlo.rsqrt` (float).
    Rsqrt,
    /// `stablehlo.cbrt` (float).
    Cbrt,
    /// `stablehlo.sine` (float).
    Sin,
    /// `stablehlo.cosine` (float).
    Cos,
    /// `stablehlo.floor` (float).
    Floor,
    /// `stablehlo.ceil` (float).
    Ceil,
    /// `stablehlo.round_nearest_even` (float).
    RoundNearestEven,
    /// `stablehlo.round_nearest_afz` (float): ties away from zero.
    RoundNearestAfz,
    /// `stablehlo.is_finite` (float -> `i1`).
    IsFinite,
    /// `stablehlo.not` (integer or bool).
    Not,
    /// `stablehlo.popcnt` (integer).
    Popcnt,
    /// `stablehlo.count_leading_zeros` (integer).
    Clz,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 22] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Expm1,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Tanh,
        UnaryOp::Logistic,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Cbrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::RoundNearestEven,
        UnaryOp::RoundNearestAfz,
        UnaryOp::IsFinite,
        UnaryOp::Not,
        UnaryOp::Popcnt,
        UnaryOp::Clz,
    ];

    /// The full op name.
    pub const fn op_name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "stablehlo.negate",
            UnaryOp::Abs => "stablehlo.abs",
            UnaryOp::Sign => "stablehlo.sign",
            UnaryOp::Exp => "stablehlo.exponential",
            UnaryOp::Expm1 => "stablehlo.exponential_minus_one",
            UnaryOp::Log => "stablehlo.log",
            UnaryOp::Log1p => "stablehlo.log_plus_one",
            UnaryOp::Tanh => "stablehlo.tanh",
            UnaryOp::Logistic => "stablehlo.logistic",
            UnaryOp::Sqrt => "stablehlo.sqrt",
            UnaryOp::Rsqrt => "stablehlo.rsqrt",
            UnaryOp::Cbrt => "stablehlo.cbrt",
            UnaryOp::Sin => "stablehlo.sine",
            UnaryOp::Cos => "stablehlo.cosine",
            UnaryOp::Floor => "stablehlo.floor",
            UnaryOp::Ceil => "stablehlo.ceil",
            UnaryOp::RoundNearestEven => "stablehlo.round_nearest_even",
            UnaryOp::RoundNearestAfz => "stablehlo.round_nearest_afz",
            UnaryOp::IsFinite => "stablehlo.is_finite",
            UnaryOp::Not => "stablehlo.not",
            UnaryOp::Popcnt => "stablehlo.popcnt",
            UnaryOp::Clz => "stablehlo.count_leading_zeros",
        }
    }

    /// Which element types the op accepts.
    pub const fn accepts(self) -> TypeClass {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => TypeClass::Numeric,
            UnaryOp::Not => TypeClass::IntOrBool,
            UnaryOp::Popcnt | UnaryOp::Clz => TypeClass::Int,
            _ => TypeClass::Float,
        }
    }
}

/// Elementwise binary ops. Both operands have the same type; so does the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `stablehlo.add` (any type; logical or on bool).
    Add,
    /// `stablehlo.subtract` (numeric).
    Sub,
    /// `stablehlo.multiply` (any type; logical and on bool).
    Mul,
    /// `stablehlo.divide` (numeric; integer division truncates).
    Div,
    /// `stablehlo.remainder` (numeric; sign of the dividend).
    Rem,
    /// `stablehlo.power` (numeric).
    Pow,
    /// `stablehlo.maximum` (any type; NaN-propagating on floats).
    Max,
    /// `stablehlo.minimum` (any type; NaN-propagating on floats).
    Min,
    /// `stablehlo.atan2` (float).
    Atan2,
    /// `stablehlo.and` (integer or bool).
    And,
    /// `stablehlo.or` (integer or bool).
    Or,
    /// `stablehlo.xor` (integer or bool).
    Xor,
    /// `stablehlo.shift_left` (integer).
    ShiftLeft,
    /// `stablehlo.shift_right_arithmetic` (integer).
    ShiftRightArithmetic,
    /// `stablehlo.shift_right_logical` (integer).
    ShiftRightLogical,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 15] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Atan2,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::ShiftLeft,
        BinaryOp::ShiftRightArithmetic,
        BinaryOp::ShiftRightLogical,
    ];

    /// The full op name.
    pub const fn op_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "stablehlo.add",
            BinaryOp::Sub => "stablehlo.subtract",
            BinaryOp::Mul => "stablehlo.multiply",
            BinaryOp::Div => "stablehlo.divide",
            BinaryOp::Rem => "stablehlo.remainder",
            BinaryOp::Pow => "stablehlo.power",
            BinaryOp::Max => "stablehlo.maximum",
            BinaryOp::Min => "stablehlo.minimum",
            BinaryOp::Atan2 => "stablehlo.atan2",
            BinaryOp::And => "stablehlo.and",
            BinaryOp::Or => "stablehlo.or",
            BinaryOp::Xor => "stablehlo.xor",
            BinaryOp::ShiftLeft => "stablehlo.shift_left",
            BinaryOp::ShiftRightArithmetic => "stablehlo.shift_right_arithmetic",
            BinaryOp::ShiftRightLogical => "stablehlo.shift_right_logical",
        }
    }

    /// Which element types the op accepts.
    pub const fn accepts(self) -> TypeClass {
        match self {
            BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min => TypeClass::Any,
            BinaryOp::Sub | BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow => TypeClass::Numeric,
            BinaryOp::Atan2 => TypeClass::Float,
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => TypeClass::IntOrBool,
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightArithmetic | BinaryOp::ShiftRightLogical => {
                TypeClass::Int
            }
        }
    }
}

/// A set of element types an op accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TypeClass {
    /// Every dtype.
    Any,
    /// Floats and integers (not bool).
    Numeric,
    /// `f32`, `bf16`.
    Float,
    /// `i32`, `i8`.
    Int,
    /// Integers and bool.
    IntOrBool,
}

impl TypeClass {
    /// Whether `dtype` is in the class.
    pub const fn contains(self, dtype: DType) -> bool {
        match self {
            TypeClass::Any => true,
            TypeClass::Numeric => !dtype.is_bool(),
            TypeClass::Float => dtype.is_float(),
            TypeClass::Int => dtype.is_int(),
            TypeClass::IntOrBool => !dtype.is_float(),
        }
    }

    /// How error messages describe the class.
    pub const fn describe(self) -> &'static str {
        match self {
            TypeClass::Any => "any type",
            TypeClass::Numeric => "a float or integer type",
            TypeClass::Float => "a float type (f32, bf16)",
            TypeClass::Int => "an integer type (i32, i8)",
            TypeClass::IntOrBool => "an integer or bool type",
        }
    }
}

/// `comparison_direction` of `stablehlo.compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComparisonDirection {
    /// Equal.
    Eq,
    /// Not equal.
    Ne,
    /// Less than.
    Lt,
    /// Less or equal.
    Le,
    /// Greater than.
    Gt,
    /// Greater or equal.
    Ge,
}

impl ComparisonDirection {
    /// The StableHLO spelling (`EQ`, `LT`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            ComparisonDirection::Eq => "EQ",
            ComparisonDirection::Ne => "NE",
            ComparisonDirection::Lt => "LT",
            ComparisonDirection::Le => "LE",
            ComparisonDirection::Gt => "GT",
            ComparisonDirection::Ge => "GE",
        }
    }
}

/// `compare_type` of `stablehlo.compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComparisonType {
    /// IEEE float comparison (floats only).
    Float,
    /// Total order on floats (floats only).
    TotalOrder,
    /// Signed integer comparison (integers only).
    Signed,
    /// Unsigned comparison of the bit patterns (integers and bool).
    Unsigned,
}

impl ComparisonType {
    /// The StableHLO spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            ComparisonType::Float => "FLOAT",
            ComparisonType::TotalOrder => "TOTALORDER",
            ComparisonType::Signed => "SIGNED",
            ComparisonType::Unsigned => "UNSIGNED",
        }
    }

    /// The natural comparison type for a dtype (what JAX emits).
    pub const fn default_for(dtype: DType) -> ComparisonType {
        match dtype {
            DType::F32 | DType::BF16 => ComparisonType::Float,
            DType::I32 | DType::I8 => ComparisonType::Signed,
            DType::Bool => ComparisonType::Unsigned,
        }
    }

    /// Whether this comparison type is allowed on `dtype`.
    pub const fn allows(self, dtype: DType) -> bool {
        match self {
            ComparisonType::Float | ComparisonType::TotalOrder => dtype.is_float(),
            ComparisonType::Signed => dtype.is_int(),
            ComparisonType::Unsigned => !dtype.is_float(),
        }
    }
}

/// Operand precision of `stablehlo.dot_general` (`precision_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// Fastest.
    #[default]
    Default,
    /// More accurate (e.g. bf16x3 on TPU).
    High,
    /// Most accurate (f32 on TPU).
    Highest,
}

impl Precision {
    /// The StableHLO spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }
}

/// Dimension numbers of `stablehlo.dot_general`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    /// Batch dimensions of the left operand.
    pub lhs_batch: Vec<i64>,
    /// Batch dimensions of the right operand (same sizes, same order).
    pub rhs_batch: Vec<i64>,
    /// Contracting dimensions of the left operand.
    pub lhs_contracting: Vec<i64>,
    /// Contracting dimensions of the right operand (same sizes, same order).
    pub rhs_contracting: Vec<i64>,
}

impl DotDims {
    /// Dimension numbers with the given batch and contracting dimensions.
    pub fn new(
        lhs_batch: impl Into<Vec<i64>>,
        rhs_batch: impl Into<Vec<i64>>,
        lhs_contracting: impl Into<Vec<i64>>,
        rhs_contracting: impl Into<Vec<i64>>,
    ) -> Self {
        DotDims {
            lhs_batch: lhs_batch.into(),
            rhs_batch: rhs_batch.into(),
            lhs_contracting: lhs_contracting.into(),
            rhs_contracting: rhs_contracting.into(),
        }
    }

    /// Plain contraction, no batch dimensions.
    pub fn contracting(lhs: impl Into<Vec<i64>>, rhs: impl Into<Vec<i64>>) -> Self {
        DotDims::new([], [], lhs, rhs)
    }
}

/// A reduction computation for `reduce`, `all_reduce` and `reduce_scatter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reducer {
    /// `add`; identity 0 (false).
    Sum,
    /// `multiply`; identity 1 (true).
    Prod,
    /// `maximum`; identity -inf (or the type's minimum).
    Max,
    /// `minimum`; identity +inf (or the type's maximum).
    Min,
    /// `and` (integer or bool); identity all ones.
    And,
    /// `or` (integer or bool); identity 0.
    Or,
    /// `xor` (integer or bool); identity 0.
    Xor,
}

impl Reducer {
    /// The binary op combining two elements.
    pub const fn op(self) -> BinaryOp {
        match self {
            Reducer::Sum => BinaryOp::Add,
            Reducer::Prod => BinaryOp::Mul,
            Reducer::Max => BinaryOp::Max,
            Reducer::Min => BinaryOp::Min,
            Reducer::And => BinaryOp::And,
            Reducer::Or => BinaryOp::Or,
            Reducer::Xor => BinaryOp::Xor,
        }
    }

    /// The identity element for `dtype` as a scalar literal, or `None` when the reducer does
    /// not apply to `dtype`.
    pub fn identity(self, dtype: DType) -> Option<Literal> {
        if !self.op().accepts().contains(dtype) {
            return None;
        }
        let v = match (self, dtype) {
            (Reducer::Sum | Reducer::Or | Reducer::Xor, _) => 0.0,
            (Reducer::Prod, _) => 1.0,
            (Reducer::Max, DType::F32 | DType::BF16) => f64::NEG_INFINITY,
            (Reducer::Min, DType::F32 | DType::BF16) => f64::INFINITY,
            (Reducer::Max, DType::I32) => f64::from(i32::MIN),
            (Reducer::Min, DType::I32) => f64::from(i32::MAX),
            (Reducer::Max, DType::I8) => f64::from(i8::MIN),
            (Reducer::Min, DType::I8) => f64::from(i8::MAX),
            (Reducer::Max, DType::Bool) => 0.0,
            (Reducer::Min, DType::Bool) => 1.0,
            (Reducer::And, DType::Bool) => 1.0,
            (Reducer::And, _) => -1.0,
        };
        Literal::scalar(v, dtype).ok()
    }
}

/// How a collective groups processes (StableHLO's process grouping strategies).
///
/// For the manual-partition programs tessera runs (`mhlo.num_partitions = N`, arguments with
/// `mhlo.sharding = "{manual}"`), use [`Grouping::FlattenedIds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Grouping {
    /// No channel handle: ids are replica ids (`mhlo.num_replicas = N` programs).
    CrossReplica,
    /// A channel handle, no `use_global_device_ids`: for `all_to_all` and
    /// `collective_permute` ids are partition ids (cross_partition); for `all_gather`,
    /// `all_reduce` and `reduce_scatter` ids are replica ids and each group spans all
    /// partitions (cross_replica_and_partition).
    CrossPartition,
    /// A channel handle plus `use_global_device_ids`: ids are flattened device ids
    /// (`replica * num_partitions + partition`). `all_to_all` and `collective_permute`
    /// have no `use_global_device_ids`; for them this is [`Grouping::CrossPartition`].
    #[default]
    FlattenedIds,
}

/// `#stablehlo.channel_handle<handle = H, type = T>`; allocated uniquely per module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelHandle {
    /// Unique id within the module (from 1).
    pub handle: i64,
    /// Channel type; 1 = DEVICE_TO_DEVICE.
    pub kind: i64,
}

/// Attributes shared by the collectives that take replica groups.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CollectiveAttrs {
    /// `replica_groups`: every group has the same size.
    pub replica_groups: Vec<Vec<i64>>,
    /// `channel_handle`, when the grouping needs one.
    pub channel: Option<ChannelHandle>,
    /// `use_global_device_ids` (unit attribute).
    pub use_global_device_ids: bool,
}

/// `api_version` of `stablehlo.custom_call` (string `backend_config` versions only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CustomCallApiVersion {
    /// API_VERSION_ORIGINAL (1).
    #[default]
    Original,
    /// API_VERSION_STATUS_RETURNING (2).
    StatusReturning,
    /// API_VERSION_STATUS_RETURNING_UNIFIED (3).
    StatusReturningUnified,
}

impl CustomCallApiVersion {
    /// The integer value of the attribute.
    pub const fn as_i32(self) -> i32 {
        match self {
            CustomCallApiVersion::Original => 1,
            CustomCallApiVersion::StatusReturning => 2,
            CustomCallApiVersion::StatusReturningUnified => 3,
        }
    }
}

/// One entry of `output_operand_aliases`: result `output` may reuse the buffer of operand
/// `operand` (e.g. a kernel writing in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutputOperandAlias {
    /// Result index (rendered as `output_tuple_indices = [i]` when there are several results,
    /// `[]` for a single result).
    pub output: usize,
    /// Operand index.
    pub operand: usize,
}

/// Attributes of `stablehlo.custom_call`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CustomCall {
    /// `call_target_name` (e.g. `tpu_custom_call`, `Sharding`).
    pub call_target_name: String,
    /// `backend_config` string (escaped on output); omitted when empty.
    pub backend_config: String,
    /// `has_side_effect`.
    pub has_side_effect: bool,
    /// `api_version`.
    pub api_version: CustomCallApiVersion,
    /// `operand_layouts`: one minor-to-major permutation per operand.
    pub operand_layouts: Option<Vec<Vec<i64>>>,
    /// `result_layouts`: one minor-to-major permutation per result.
    pub result_layouts: Option<Vec<Vec<i64>>>,
    /// `output_operand_aliases`.
    pub output_operand_aliases: Vec<OutputOperandAlias>,
    /// `mhlo.sharding` on the op (e.g. for the `Sharding` / `SPMDFullToShardShape` targets).
    pub sharding: Option<Sharding>,
    /// Further attributes, name and raw MLIR attribute text (e.g. `("kernel_name", "\"k\"")`).
    /// Not checked: the escape hatch for target-specific attributes.
    pub extra_attrs: Vec<(String, String)>,
}

impl CustomCall {
    /// A call to `call_target_name` with default attributes.
    pub fn new(call_target_name: impl Into<String>) -> Self {
        CustomCall {
            call_target_name: call_target_name.into(),
            ..CustomCall::default()
        }
    }
}

/// The sharding of an argument, a result or a custom call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// `{manual}`: the value is a per-device shard in a manually partitioned program.
    Manual,
    /// A per-device block of a global tensor in a manually partitioned program, on a module
    /// with a mesh ([`Module::set_mesh`](crate::Module::set_mesh)): dim `d` is split over the
    /// mesh axis `axes[d]` (`None`: whole on every device). Only on `@main`'s arguments and
    /// results. The Shardy form declares the global tensor with this split; the GSPMD form
    /// prints `{manual}` (see [`Module::to_mlir`](crate::Module::to_mlir)).
    ManualSplit(Vec<Option<String>>),
    /// `{replicated}`.
    Replicated,
    /// Any other HLO sharding string, e.g. `{devices=[4,1]<=[4]}` (not checked).
    Raw(String),
}

impl Sharding {
    /// The `mhlo.sharding` string (without quotes) of the GSPMD form.
    pub fn as_str(&self) -> &str {
        match self {
            Sharding::Manual | Sharding::ManualSplit(_) => "{manual}",
            Sharding::Replicated => "{replicated}",
            Sharding::Raw(s) => s,
        }
    }
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an op is, with its attributes. Operands, results and regions live in [`Op`].
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    /// `stablehlo.constant`.
    Constant(Literal),
    /// Elementwise unary op.
    Unary(UnaryOp),
    /// Elementwise binary op.
    Binary(BinaryOp),
    /// `stablehlo.compare`.
    Compare {
        /// Direction.
        direction: ComparisonDirection,
        /// Comparison type.
        compare_type: ComparisonType,
    },
    /// `stablehlo.select(pred, on_true, on_false)`.
    Select,
    /// `stablehlo.clamp(min, operand, max)`.
    Clamp,
    /// `stablehlo.convert`.
    Convert,
    /// `stablehlo.iota`.
    Iota {
        /// The dimension that counts up.
        dimension: i64,
    },
    /// `stablehlo.broadcast_in_dim`.
    BroadcastInDim {
        /// Result dimension of each operand dimension.
        broadcast_dimensions: Vec<i64>,
    },
    /// `stablehlo.reshape`.
    Reshape,
    /// `stablehlo.optimization_barrier`: its operands unchanged, which XLA may not move or
    /// rewrite computations across (keeps a chosen form of a computation).
    OptimizationBarrier,
    /// `stablehlo.transpose`.
    Transpose {
        /// Result dimension `i` is operand dimension `permutation[i]`.
        permutation: Vec<i64>,
    },
    /// `stablehlo.reverse`.
    Reverse {
        /// Reversed dimensions.
        dimensions: Vec<i64>,
    },
    /// `stablehlo.slice`.
    Slice {
        /// Inclusive starts.
        start_indices: Vec<i64>,
        /// Exclusive limits.
        limit_indices: Vec<i64>,
        /// Positive strides.
        strides: Vec<i64>,
    },
    /// `stablehlo.dynamic_slice(operand, starts...)`.
    DynamicSlice {
        /// Sizes of the slice.
        slice_sizes: Vec<i64>,
    },
    /// `stablehlo.dynamic_update_slice(operand, update, starts...)`.
    DynamicUpdateSlice,
    /// `stablehlo.gather(operand, indices)` of whole rows: result row `i` is row
    /// `indices[i]` of the operand (`[N]` i32 indices, clamped into range), as JAX's
    /// `jnp.take(x, indices, axis=0)`.
    GatherRows {
        /// The dims of one row (the operand's dims after the first).
        row_dims: Vec<i64>,
    },
    /// `stablehlo.scatter(operand, indices, updates)` of whole rows, adding: the operand with
    /// update row `i` added to row `indices[i]` (repeated indices add up; an index out of
    /// range is skipped). The transpose of [`OpKind::GatherRows`]; region 0 is the addition.
    ScatterAddRows {
        /// The dims of one row (the operand's dims after the first).
        row_dims: Vec<i64>,
    },
    /// `stablehlo.concatenate`.
    Concatenate {
        /// Concatenated dimension.
        dimension: i64,
    },
    /// `stablehlo.pad(operand, padding_value)`.
    Pad {
        /// `edge_padding_low` (may be negative).
        low: Vec<i64>,
        /// `edge_padding_high` (may be negative).
        high: Vec<i64>,
        /// `interior_padding` (non-negative).
        interior: Vec<i64>,
    },
    /// `stablehlo.dot_general`; the result element type is the accumulation type.
    DotGeneral {
        /// Dimension numbers.
        dims: DotDims,
        /// `precision_config` for lhs and rhs.
        precision: Option<[Precision; 2]>,
    },
    /// `stablehlo.reduce(inputs..., inits...)`; region 0 is the body.
    Reduce {
        /// Reduced dimensions.
        dimensions: Vec<i64>,
    },
    /// `stablehlo.while`; regions: cond, body.
    While,
    /// `stablehlo.case(index)`; one region per branch.
    Case,
    /// `stablehlo.if(pred)`; regions: then, else.
    If,
    /// `stablehlo.custom_call`.
    CustomCall(CustomCall),
    /// `func.call`.
    Call {
        /// Callee function name.
        callee: String,
    },
    /// `stablehlo.all_to_all`.
    AllToAll {
        /// Dimension split into `split_count` blocks.
        split_dimension: i64,
        /// Dimension the received blocks are concatenated along.
        concat_dimension: i64,
        /// Number of blocks (= group size).
        split_count: i64,
        /// Groups and channel (never `use_global_device_ids`).
        attrs: CollectiveAttrs,
    },
    /// `stablehlo.all_gather`.
    AllGather {
        /// Gathered dimension.
        all_gather_dim: i64,
        /// Groups, channel, global ids.
        attrs: CollectiveAttrs,
    },
    /// `stablehlo.collective_permute`.
    CollectivePermute {
        /// `(source, target)` pairs.
        source_target_pairs: Vec<(i64, i64)>,
        /// Channel handle (cross-partition) or none (cross-replica).
        channel: Option<ChannelHandle>,
    },
    /// `stablehlo.all_reduce`; region 0 is the reduction.
    AllReduce {
        /// Groups, channel, global ids.
        attrs: CollectiveAttrs,
    },
    /// `stablehlo.reduce_scatter`; region 0 is the reduction.
    ReduceScatter {
        /// Scattered dimension.
        scatter_dimension: i64,
        /// Groups, channel, global ids.
        attrs: CollectiveAttrs,
    },
    /// `stablehlo.partition_id`, converted to `i32` (StableHLO yields `ui32`; the text is
    /// `partition_id` followed by a `convert`).
    PartitionId,
    /// `stablehlo.replica_id`, converted to `i32` like [`OpKind::PartitionId`].
    ReplicaId,
}

impl OpKind {
    /// The full op name (`stablehlo.add`, `func.call`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Constant(_) => "stablehlo.constant",
            OpKind::Unary(u) => u.op_name(),
            OpKind::Binary(b) => b.op_name(),
            OpKind::Compare { .. } => "stablehlo.compare",
            OpKind::Select => "stablehlo.select",
            OpKind::Clamp => "stablehlo.clamp",
            OpKind::Convert => "stablehlo.convert",
            OpKind::Iota { .. } => "stablehlo.iota",
            OpKind::BroadcastInDim { .. } => "stablehlo.broadcast_in_dim",
            OpKind::Reshape => "stablehlo.reshape",
            OpKind::OptimizationBarrier => "stablehlo.optimization_barrier",
            OpKind::Transpose { .. } => "stablehlo.transpose",
            OpKind::Reverse { .. } => "stablehlo.reverse",
            OpKind::Slice { .. } => "stablehlo.slice",
            OpKind::DynamicSlice { .. } => "stablehlo.dynamic_slice",
            OpKind::DynamicUpdateSlice => "stablehlo.dynamic_update_slice",
            OpKind::GatherRows { .. } => "stablehlo.gather",
            OpKind::ScatterAddRows { .. } => "stablehlo.scatter",
            OpKind::Concatenate { .. } => "stablehlo.concatenate",
            OpKind::Pad { .. } => "stablehlo.pad",
            OpKind::DotGeneral { .. } => "stablehlo.dot_general",
            OpKind::Reduce { .. } => "stablehlo.reduce",
            OpKind::While => "stablehlo.while",
            OpKind::Case => "stablehlo.case",
            OpKind::If => "stablehlo.if",
            OpKind::CustomCall(_) => "stablehlo.custom_call",
            OpKind::Call { .. } => "func.call",
            OpKind::AllToAll { .. } => "stablehlo.all_to_all",
            OpKind::AllGather { .. } => "stablehlo.all_gather",
            OpKind::CollectivePermute { .. } => "stablehlo.collective_permute",
            OpKind::AllReduce { .. } => "stablehlo.all_reduce",
            OpKind::ReduceScatter { .. } => "stablehlo.reduce_scatter",
            OpKind::PartitionId => "stablehlo.partition_id",
            OpKind::ReplicaId => "stablehlo.replica_id",
        }
    }
}

/// One op: kind and attributes, operand values, result values, nested regions.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    /// What the op is.
    pub kind: OpKind,
    /// Operand values, in StableHLO order.
    pub operands: Vec<Value>,
    /// Result values (their types are in the function's value table).
    pub results: Vec<Value>,
    /// Nested regions (reduce body, while cond/body, case branches, ...).
    pub regions: Vec<Region>,
}

/// A single-block region: block arguments, ops, and the values its terminator returns
/// (`stablehlo.return`, or `func.return` for a function body).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Region {
    /// Block arguments.
    pub args: Vec<Value>,
    /// Ops in order.
    pub ops: Vec<Op>,
    /// Returned values.
    pub results: Vec<Value>,
}
