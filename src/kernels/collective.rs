//! Collectives inside kernels: an all-gather over a mesh axis as a ring of remote copies
//! (JAX's `ops/tpu/all_gather.py`), and an all-gather matmul whose remote copy of each
//! weight shard overlaps the matmul of the shard before it (a collective matmul).
//!
//! The kernels live in `tessera-parallel` ([`tessera_parallel::collective_kernels`]), so that
//! the fsdp train step of `tessera-train` can run the all-gather matmul
//! (`--collective-matmul`); this module is where the kernel list names them.

pub use tessera_parallel::collective_kernels::{
    all_gather, all_gather_matmul, all_gather_matmul_reference, all_gather_reference,
};
