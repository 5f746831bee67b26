//! Mesh axes and mesh shapes: marker types with names. They live in `tessera-hlo`, so that
//! kernels (`tessera-dsl`) name the same axes as SPMD programs; re-exported here.

pub use tessera_hlo::{axes, HasAxis, MeshAxis, MeshShape};
