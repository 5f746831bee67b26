//! tessera: a Pallas-like kernel DSL embedded in Rust.
//!
//! This facade re-exports the layers (see docs/architecture.md), among them the
//! [`backend`]s a kernel runs on and the kernel families ([`splash`], [`paged`],
//! [`collective_kernels`]), and holds what ties them together: the example [`kernels`] with
//! their f64 [`reference`](mod@reference)s, the kernel [`registry`] (the one table of every
//! family's kernels) and `.npy` I/O ([`npy`]). A kernel author imports [`prelude`]. The `tessera` command-line tool is the crate's binary (the default `cli`
//! feature); the library itself has no CLI dependencies.

pub use tessera_backend as backend;
pub use tessera_backend::test_device;
pub use tessera_collective_kernels as collective_kernels;
pub use tessera_collectives as collectives;
pub use tessera_dsl as dsl;
pub use tessera_hlo as hlo;
pub use tessera_paged as paged;
pub use tessera_parallel as parallel;
pub use tessera_runtime as runtime;
pub use tessera_splash as splash;

pub mod kernels;
pub mod npy;
pub mod reference;
pub mod registry;
pub mod tpu;

pub use tessera_dsl::prelude;
