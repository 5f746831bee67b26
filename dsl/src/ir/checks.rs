//! What a kernel checks at run time: the types of [`Kernel::checks`](super::Kernel), set by
//! the pass in [`crate::checks`].

use super::{Loc, RefId};

/// Words per row of the check flags: one 128-lane vector of i32 (a whole TPU lane row, so
/// the row's copy to HBM is one aligned window). Word 0 is the failed check's number plus
/// one (0: none), the next words its values.
pub const FLAG_WORDS: usize = 128;

/// One run-time check the kernel makes: what it checks and where the author wrote the access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckSite {
    /// Where the checked access (or arithmetic) is in the kernel.
    pub loc: Loc,
    pub kind: CheckKind,
}

/// What a [`CheckSite`] checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// An index into an operand along one dim: `what` names it (`the start of k_pages'
    /// window along dim 1`), valid values are `0..=max`.
    Index { what: String, max: i64 },
    /// `lhs op rhs` on i32 may leave i32; it feeds an index or a loop bound.
    Overflow { op: &'static str },
    /// An author's `debug_check`, with its message.
    /// `compared` is how many run-time values its condition compares (recorded with it, at
    /// most three: `length` of `length.ge(0) & length.le(128)`).
    Author { message: String, compared: usize },
}

/// What a kernel checks at run time ([`insert`](crate::checks::insert)): its checks, the operands of their flags
/// (absent where nothing is checked) and how many indices needed no check.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelChecks {
    /// The flags' operands, where the kernel makes a check.
    pub flags: Option<CheckFlags>,
    /// The checks, numbered by position.
    pub sites: Vec<CheckSite>,
    /// Indices proven in range at instantiation.
    pub proven: usize,
    /// Indices marked `unchecked_index` (by the author, or by tessera for a mesh neighbour).
    pub unchecked: usize,
}

impl std::fmt::Display for CheckKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckKind::Index { what, max } => write!(f, "{what} in 0 to {max}"),
            CheckKind::Overflow { op } => write!(f, "`{op}` within i32"),
            CheckKind::Author { message, .. } => write!(f, "debug_check: {message}"),
        }
    }
}

/// The check flags' operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckFlags {
    /// The zeros the flags start from (an input the lowerings make themselves: not one of
    /// [`Kernel::argument_refs`](super::Kernel::argument_refs)).
    pub init: RefId,
    /// The flags: an i32 `[grid steps, FLAG_WORDS]` output in HBM aliasing `init`.
    pub flags: RefId,
    /// The step's check state: i32 `[1, FLAG_WORDS]` SMEM scratch, word 0 the failed check's
    /// number plus one (0 in a passing step), copied to the step's row of the flags where a
    /// check failed.
    pub state: RefId,
}

impl KernelChecks {
    /// The flags' shape for a kernel with `grid`.
    pub fn flags_shape(grid: &[usize]) -> Vec<usize> {
        vec![grid.iter().product::<usize>().max(1), FLAG_WORDS]
    }
}
