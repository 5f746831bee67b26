//! The tracing frontend: while a kernel is instantiated, its body runs once on tracer values
//! whose methods and operators append IR ops to the kernel being built (as JAX traces Pallas).
//!
//! Tracer operations never panic on a user mistake: the first problem in a chain is recorded
//! with its source location, the result is marked poisoned, and ops on poisoned values record
//! nothing more, so one mistake yields one message. The instantiation reports them all.

mod memory;
mod ops;
mod pipeline;
mod refs;
mod state;

pub(crate) use memory::declare_operand;
pub use memory::*;
pub use ops::*;
pub use pipeline::{
    BlockIndices, Pipeline, PipelineInput, PipelineOutput, PipelineSource, PipelineStep,
};
pub use refs::*;
pub use state::Value;
pub(crate) use state::{trace_region, with_trace, TraceState};
