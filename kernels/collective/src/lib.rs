//! tessera-collective-kernels: kernels that move their own data, written as
//! `#[tpu_kernel]`s, with their registry entries ([`registry::KERNELS`]).
//!
//! - [`memory`]: a double-buffered gather of tiles from an HBM operand (`gather_tiles`), a
//!   ring shift of a whole array to the next device of a mesh axis with remote copies
//!   (`ring_shift`), and an all-gather over that ring (`ring_all_gather`).
//! - [`collective`]: collectives inside kernels on any mesh axis: an all-gather as a ring of
//!   remote copies (JAX's `ops/tpu/all_gather.py`), an all-to-all (every device's chunks in
//!   flight at once, a receive semaphore per source), and an all-gather matmul whose remote
//!   copy of each weight shard overlaps the matmul of the shard before it (a collective
//!   matmul, which the fsdp train step of `tessera-train` runs with `--collective-matmul`).
//! - [`ulysses`]: Ulysses attention as one kernel per direction: the all-to-alls of q, k, v
//!   and of the output (of dq, dk, dv) done by remote copies inside it, overlapping the
//!   attention.
//!
//! The kernels that only copy are generic over their element type (`all_gather_of::<T, M,
//! A>()`, `all_to_all_of::<T, M, A>()`, `ring_all_gather_of::<T>()`, ...: f32, bf16, i32 and
//! i8; `gather_tiles_of` in tiles of [`memory::tile_rows`], f32, bf16 and i32); the names
//! without `_of` are their f32 instances.
//!
//! Each kernel has an f64 reference written separately from it (every device's outputs from
//! every device's arguments); the registry runs both on every backend.

pub mod collective;
pub mod memory;
pub mod registry;
pub mod ulysses;

pub use collective::{all_gather, all_gather_matmul, all_gather_of, all_to_all, all_to_all_of};
pub use memory::{
    gather_tiles, gather_tiles_of, ring_all_gather, ring_all_gather_of, ring_shift, ring_shift_of,
    RingMesh,
};
