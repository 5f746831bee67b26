//! The small example kernels, written with `#[tpu_kernel]`, each with an f64 reference
//! (`crate::reference`) and an entry in the registry ([`registry`]). The other kernel families
//! live in their own crates: splash attention (`tessera-splash`), paged attention and the
//! KV-cache update (`tessera-paged`), and the kernels that move their own data
//! (`tessera-collective-kernels`); the facade re-exports each.

pub mod flash;
pub mod matmul;
pub mod registry;
pub mod softmax;

pub use flash::flash_attention;
pub use matmul::{matmul, pipelined_matmul};
pub use softmax::row_softmax;
