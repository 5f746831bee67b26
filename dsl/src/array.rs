//! Host arrays: the inputs and outputs of kernels run on the host (interpreter, tests, CLI).
//! The type lives in `tessera-array`, shared by every crate; this module re-exports it where
//! kernel code has always found it.

pub use tessera_array::{ArrayData, HostArray, ShapeError};
