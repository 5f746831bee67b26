//! Example kernels written with `#[tpu_kernel]`, each tested against naive Rust.

pub mod flash;
pub mod matmul;
pub mod memory;
pub mod softmax;

pub use flash::flash_attention;
pub use matmul::matmul;
pub use softmax::row_softmax;
