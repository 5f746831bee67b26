//! Example kernels written with `#[tpu_kernel]`, each tested against naive Rust.

pub mod cache_update;
pub mod collective;
pub mod flash;
pub mod matmul;
pub mod memory;
pub mod paged_attention;
pub mod softmax;

pub use cache_update::cache_update;
pub use flash::flash_attention;
pub use matmul::{matmul, pipelined_matmul};
pub use paged_attention::paged_attention;
pub use softmax::row_softmax;
