//! Why one op of the module could not be evaluated: [`OpError`], the values the sentence names
//! as fields. [`EvalError::Op`](crate::EvalError::Op) carries it with the op's location.

use std::fmt;

/// An op the evaluator refuses: operands it does not take, windows outside their memref,
/// literals it cannot read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    #[error("{indices} indices and a rank-{window_rank} window into a rank-{memref_rank} memref")]
    WindowRank {
        indices: usize,
        window_rank: usize,
        memref_rank: usize,
    },
    #[error("window {start}..{end} is outside a dim of size {size}")]
    WindowOutside { start: i64, end: i64, size: usize },
    #[error("`{literal}` is not a {elem} literal")]
    Literal { literal: String, elem: &'static str },
    #[error("float literal `{literal}` has no `.` (MLIR needs one)")]
    FloatLiteralWithoutDot { literal: String },
    #[error("{op} does not take {operands}")]
    Operands { op: String, operands: Operands },
    #[error("{op} does not take {elem}")]
    Elem { op: String, elem: &'static str },
    #[error("{op}: division by zero is undefined")]
    DivisionByZero { op: String },
    #[error("operands differ in element type")]
    OperandElems,
    #[error("unsupported arith.cmpf predicate `{pred}`")]
    FloatPredicate { pred: String },
    #[error("unsupported arith.cmpi predicate `{pred}` on {operands}")]
    IntPredicate { pred: String, operands: Operands },
    #[error("compare operands do not match the op")]
    CompareOperands,
    #[error("arith.select needs an i1 condition")]
    SelectCondition,
    #[error("arith.select condition shape differs")]
    SelectConditionShape,
    #[error("arith.select branches differ in type")]
    SelectBranches,
    #[error("{op} changes the shape")]
    CastShape { op: String },
    #[error("{op} from {from} to {to} is not supported")]
    Cast {
        op: String,
        from: &'static str,
        to: &'static str,
    },
    #[error("vector.broadcast to a lower rank")]
    BroadcastToLowerRank,
    #[error("cannot broadcast {from:?} to {to:?}")]
    Broadcast { from: Vec<usize>, to: Vec<usize> },
    #[error("vector.multi_reduction: accumulator shape does not match")]
    ReductionAccumulator,
    #[error("reduction <{kind}> does not take {operands}")]
    ReductionKind { kind: String, operands: Operands },
    #[error("vector.multi_reduction: unsupported element type")]
    ReductionElem,
    #[error("tpu.concatenate: parts {parts:?} do not make {shape:?} along dim {dim}")]
    Concatenate {
        parts: Vec<Vec<usize>>,
        shape: Vec<usize>,
        dim: usize,
    },
    #[error("tpu.matmul: rank-2 operands only")]
    MatmulRank,
    #[error("tpu.matmul: shapes do not match")]
    MatmulShapes,
    #[error("tpu.matmul: unsupported operand types")]
    MatmulTypes,
}

/// A kind of operand data an op may not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operands {
    Floats,
    Integers,
    I1,
}

impl fmt::Display for Operands {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operands::Floats => "floats",
            Operands::Integers => "integers",
            Operands::I1 => "i1",
        })
    }
}
