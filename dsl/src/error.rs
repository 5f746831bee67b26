//! Errors a kernel user can cause: bad arguments, traced mistakes, broken hardware rules.

use std::fmt;

use crate::loc::Loc;

/// Which stage found a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    /// Arguments given at instantiation: count, rank, dtype, consistent dims.
    Argument,
    /// A mistake in the kernel body or an index map found while tracing.
    Trace,
    /// Ill-formed IR (a bug in a frontend or a pass rather than in user code, usually).
    Verify,
    /// TPU tiling of block shapes.
    Tiling,
    /// The grid and block shapes must cover each array exactly, in bounds.
    Coverage,
    /// Block and scratch buffers must fit the VMEM budget.
    Vmem,
    /// Semaphores must fit a TPU kernel's semaphore memory.
    SemaphoreMemory,
    /// An operand, op or value Mosaic cannot compile for TPU.
    TpuOp,
    /// The protocol of copies and semaphores: every copy waited once, signals balanced by
    /// waits, no wait that nothing satisfies (checked at instantiation where control flow is
    /// static, by the interpreter otherwise).
    Protocol,
    /// A problem found while running the kernel (interpreter or runtime).
    Run,
    /// Lowering to a backend failed (a tessera bug, reported rather than hidden).
    Lower,
}

/// One problem, with the operand or op it concerns and where the kernel author wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// What the problem is about: `in_specs[1] (y)`, `dot`, `grid`, ...
    pub subject: String,
    pub message: String,
    pub loc: Option<Loc>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = self.loc {
            write!(f, "{loc}: ")?;
        }
        write!(f, "{}: {}", self.subject, self.message)
    }
}

/// Every problem found while instantiating or running one kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct KernelError {
    pub kernel: String,
    pub problems: Vec<Problem>,
}

impl KernelError {
    pub fn new(kernel: impl Into<String>, problems: Vec<Problem>) -> Self {
        KernelError {
            kernel: kernel.into(),
            problems,
        }
    }

    pub fn single(
        kernel: impl Into<String>,
        kind: ProblemKind,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        KernelError::new(
            kernel,
            vec![Problem {
                kind,
                subject: subject.into(),
                message: message.into(),
                loc: None,
            }],
        )
    }

    /// Whether any problem is of `kind`.
    pub fn has(&self, kind: ProblemKind) -> bool {
        self.problems.iter().any(|p| p.kind == kind)
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problems.as_slice() {
            [one] => write!(f, "kernel `{}`: {one}", self.kernel),
            many => {
                write!(f, "kernel `{}`: {} problems:", self.kernel, many.len())?;
                for p in many {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
        }
    }
}
