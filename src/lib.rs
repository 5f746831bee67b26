//! tessera: a Pallas-like kernel DSL embedded in Rust.
//!
//! This facade re-exports the layers (see DESIGN.md) and hosts the example kernels and the
//! `tessera` command-line tool.

pub use tessera_collectives as collectives;
pub use tessera_dsl as dsl;
pub use tessera_hlo as hlo;
pub use tessera_runtime as runtime;
pub use tessera_splash as splash;

pub mod attention;
pub mod backend;
pub mod context_parallel;
pub mod kernels;
pub mod npy;
pub mod reference;
pub mod registry;

pub use tessera_dsl::prelude;
