//! Types of the kernel IR: value types, memory spaces, literals and the garbage literal
//! uninitialised buffers hold (shared by the interpreter and the StableHLO lowering). Source
//! locations are [`Loc`](crate::ir::Loc), in `loc.rs` below both the IR and the errors that
//! name them.

use std::fmt;

pub use tessera_hlo::DType;

/// Identifies an SSA value inside one [`Kernel`](super::Kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Identifies an operand (input, output, scratch or scalar-prefetch ref) of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RefId(pub u32);

impl RefId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The type of an SSA value: a dtype and a static shape (rank 0 is a scalar).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValueType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl ValueType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        ValueType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> Self {
        ValueType {
            dtype,
            shape: Vec::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dtype)?;
        if !self.shape.is_empty() {
            write!(f, "[{}]", join(&self.shape, ", "))?;
        }
        Ok(())
    }
}

/// Where a kernel operand lives while the kernel body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// A block of the array, copied into vector memory for each grid step (TPU VMEM).
    Vmem,
    /// The whole array in scalar memory (TPU SMEM): scalar prefetch and small tables.
    Smem,
    /// Left where it is (HBM); the kernel may not load it directly: it copies windows of it
    /// to and from VMEM scratch with asynchronous copies.
    Any,
    /// Semaphores (TPU semaphore memory): counters that copies and signals increment and
    /// waits decrement. The operand's shape is the shape of the semaphore array.
    Semaphore(SemKind),
}

impl MemorySpace {
    pub fn name(self) -> &'static str {
        match self {
            MemorySpace::Vmem => "vmem",
            MemorySpace::Smem => "smem",
            MemorySpace::Any => "any",
            MemorySpace::Semaphore(SemKind::Dma) => "dma_semaphore",
            MemorySpace::Semaphore(SemKind::Regular) => "semaphore",
            MemorySpace::Semaphore(SemKind::Barrier) => "barrier_semaphore",
        }
    }

    /// The kind of semaphore, for semaphore operands.
    pub fn semaphore(self) -> Option<SemKind> {
        match self {
            MemorySpace::Semaphore(kind) => Some(kind),
            MemorySpace::Vmem | MemorySpace::Smem | MemorySpace::Any => None,
        }
    }
}

/// What a semaphore counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemKind {
    /// Completed copies, in bytes: a copy adds its size when it lands (to its destination's
    /// semaphore, and for a remote copy to the sender's semaphore too); a wait for a copy
    /// takes that size back.
    Dma,
    /// Signals: `signal(n)` adds `n` (on this device or another), `wait(n)` takes `n`.
    Regular,
    /// The kernel's barrier semaphore: a regular semaphore shared by every kernel with the
    /// same collective id, for the devices to agree that all of them have entered the kernel.
    Barrier,
}

/// One axis of the device mesh a kernel runs on: its name and size. Device ids are
/// row-major over a kernel's axes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceAxis {
    pub name: String,
    pub size: usize,
}

impl DeviceAxis {
    pub fn new(name: impl Into<String>, size: usize) -> Self {
        DeviceAxis {
            name: name.into(),
            size,
        }
    }
}

/// The number of devices of a mesh (1 for no axes).
pub fn device_count(mesh: &[DeviceAxis]) -> usize {
    mesh.iter().map(|a| a.size).product()
}

/// How the iterations of one grid dimension relate to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DimSemantics {
    /// Iterations are independent: they may run in any order or on different cores.
    Parallel,
    /// Iterations run in order and may carry state (accumulators in scratch).
    Arbitrary,
}

impl DimSemantics {
    pub fn name(self) -> &'static str {
        match self {
            DimSemantics::Parallel => "parallel",
            DimSemantics::Arbitrary => "arbitrary",
        }
    }
}

pub(crate) fn join<T: fmt::Display>(items: &[T], sep: &str) -> String {
    items
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

/// A scalar literal; its dtype comes from the op that holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Literal {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Literal {
    /// Whether this literal can be represented in `dtype` (ints in range, floats for floats).
    pub fn fits(self, dtype: DType) -> bool {
        match (self, dtype) {
            (Literal::Float(_), d) => d.is_float(),
            (Literal::Int(v), DType::I32) => i32::try_from(v).is_ok(),
            (Literal::Int(v), DType::I8) => i8::try_from(v).is_ok(),
            (Literal::Int(_), d) => d.is_float(),
            (Literal::Bool(_), d) => d.is_bool(),
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Float(v) if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e16 => {
                write!(f, "{v:.1}")
            }
            Literal::Float(v) => write!(f, "{v:?}"),
            Literal::Int(v) => write!(f, "{v}"),
            Literal::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// What uninitialised scratch and output buffers hold ([`DType::garbage`]: NaN for floats, a
/// sentinel for ints), so a kernel that reads what it never wrote shows it.
pub(crate) fn garbage_literal(dtype: DType) -> Literal {
    let g = dtype.garbage();
    match dtype {
        d if d.is_float() => Literal::Float(g),
        DType::Bool => Literal::Bool(g != 0.0),
        _ => Literal::Int(g as i64),
    }
}
