//! Errors raised while building a program. Every message starts with the op that raised it.

use crate::{DType, TensorType};

/// An invalid use of the builder, detected before any text is emitted.
///
/// `op` is the full op name (`stablehlo.add`, `func.call`, `func.func`, ...), so the message
/// always names the op, followed by the mismatch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HloError {
    /// An operand's element type is not one the op accepts.
    #[error("{op}: {operand} has element type {got}, expected {expected}")]
    DType {
        /// Op name.
        op: &'static str,
        /// Which operand (e.g. `lhs`, `operand #2`).
        operand: String,
        /// The element type found.
        got: DType,
        /// What the op accepts (e.g. `a float type`, `i1`).
        expected: String,
    },
    /// Two types that must agree do not.
    #[error("{op}: {what}: {lhs} vs {rhs}")]
    TypeMismatch {
        /// Op name.
        op: &'static str,
        /// What had to agree.
        what: String,
        /// The first type.
        lhs: TensorType,
        /// The second type.
        rhs: TensorType,
    },
    /// A shape constraint of the op is violated.
    #[error("{op}: {reason}")]
    Shape {
        /// Op name.
        op: &'static str,
        /// The violated constraint.
        reason: String,
    },
    /// An attribute (dimension numbers, groups, layouts, ...) is invalid.
    #[error("{op}: invalid {attr}: {reason}")]
    Attr {
        /// Op name.
        op: &'static str,
        /// Attribute name, as in StableHLO.
        attr: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// A value cannot be used here (another function, or out of scope).
    #[error("{op}: {what} {reason}")]
    Value {
        /// Op name.
        op: &'static str,
        /// Which value (e.g. `operand #1`, `body result #0`).
        what: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A literal does not fit its type or shape.
    #[error("{op}: {reason}")]
    Literal {
        /// Op name (`stablehlo.constant`).
        op: &'static str,
        /// The problem.
        reason: String,
    },
    /// A function-level error (duplicate name, unknown callee, bad results).
    #[error("func @{func}: {reason}")]
    Func {
        /// Function name.
        func: String,
        /// The problem.
        reason: String,
    },
    /// Reverse-mode autodiff cannot differentiate an op (no VJP rule), or was misused.
    #[error("{op}: {reason}")]
    Autodiff {
        /// The op (or `autodiff`, `custom_vjp`).
        op: String,
        /// Why, and how to fix it.
        reason: String,
    },
    /// A module-level error (device counts, missing `@main`).
    #[error("module: {reason}")]
    Module {
        /// The problem.
        reason: String,
    },
}

impl HloError {
    pub(crate) fn shape(op: &'static str, reason: impl Into<String>) -> Self {
        HloError::Shape {
            op,
            reason: reason.into(),
        }
    }

    pub(crate) fn attr(op: &'static str, attr: &'static str, reason: impl Into<String>) -> Self {
        HloError::Attr {
            op,
            attr,
            reason: reason.into(),
        }
    }

    pub(crate) fn dtype(
        op: &'static str,
        operand: impl Into<String>,
        got: DType,
        expected: impl Into<String>,
    ) -> Self {
        HloError::DType {
            op,
            operand: operand.into(),
            got,
            expected: expected.into(),
        }
    }

    pub(crate) fn mismatch(
        op: &'static str,
        what: impl Into<String>,
        lhs: &TensorType,
        rhs: &TensorType,
    ) -> Self {
        HloError::TypeMismatch {
            op,
            what: what.into(),
            lhs: lhs.clone(),
            rhs: rhs.clone(),
        }
    }

    /// The op (or `func @name` / `module`) the error is about.
    pub fn op(&self) -> &str {
        match self {
            HloError::DType { op, .. }
            | HloError::TypeMismatch { op, .. }
            | HloError::Shape { op, .. }
            | HloError::Attr { op, .. }
            | HloError::Value { op, .. }
            | HloError::Literal { op, .. } => op,
            HloError::Autodiff { op, .. } => op,
            HloError::Func { .. } => "func.func",
            HloError::Module { .. } => "builtin.module",
        }
    }
}
