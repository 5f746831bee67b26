//! tessera-hlo: a typed StableHLO program builder that emits MLIR text.

mod dtype;

pub use dtype::DType;
