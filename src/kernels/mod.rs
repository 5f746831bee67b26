//! Example kernels written with `#[tpu_kernel]`, each tested against naive Rust.

pub mod matmul;

pub use matmul::matmul;
