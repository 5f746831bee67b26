//! Where the kernel author wrote something: the source location every IR op and every
//! [`Problem`](crate::Problem) carries. Below both the IR and the errors (the IR's checks
//! return problems, and problems name IR locations); re-exported as `ir::Loc`.

use std::fmt;

/// A position in the kernel author's source, captured while tracing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    pub file: &'static str,
    pub line: u32,
    pub column: u32,
}

impl Loc {
    /// The location of the caller of a `#[track_caller]` function.
    #[track_caller]
    pub fn caller() -> Loc {
        let l = std::panic::Location::caller();
        Loc {
            file: l.file(),
            line: l.line(),
            column: l.column(),
        }
    }

    /// A location for IR built by tessera itself rather than by a kernel author.
    pub const fn internal() -> Loc {
        Loc {
            file: "<tessera>",
            line: 0,
            column: 0,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}
