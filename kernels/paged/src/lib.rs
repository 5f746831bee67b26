//! tessera-paged: paged attention for decoding and the KV-cache update beside it, written as
//! `#[tpu_kernel]`s, with their registry entries ([`registry::KERNELS`]).
//!
//! - [`paged_attention`](mod@paged_attention): one query token per sequence attends to its
//!   keys and values, which live in pages of a shared pool in HBM found through a page table
//!   (JAX's `paged_attention`); pages double-buffered into VMEM.
//! - [`cache_update`](mod@cache_update): an in-place update of a cache by row blocks (the
//!   write of new keys and values into a serving stack's KV cache).
//!
//! Each kernel has an f64 reference written separately from it; the registry runs both on
//! every backend (`tessera demo`, `tessera run`, the backend tests).

pub mod cache_update;
pub mod paged_attention;
pub mod registry;

pub use cache_update::cache_update;
pub use paged_attention::{paged_attention, validate_tables, TableError};
