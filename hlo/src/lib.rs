//! tessera-hlo: a typed StableHLO program builder that emits MLIR text.
//!
//! A [`Module`] holds device counts and functions; a [`FuncBuilder`] adds typed arguments
//! and ops one at a time. Every op checks its operands when it is built and returns an
//! [`HloError`] naming the op and the mismatch, so the emitted text is valid by construction.
//! Programs are stored as data ([`Op`]: an [`OpKind`] with operands, results and regions) and
//! rendered with [`Module::to_mlir`] in MLIR's generic op syntax, which the XLA CPU PJRT
//! plugin (StableHLO 1.13) and libtpu parse. Constants are built from the shared host array
//! ([`HostArray`]).
//!
//! Reverse-mode autodiff ([`autodiff`]): [`FuncBuilder::vjp`] and [`FuncBuilder::grad`]
//! append the backward of a forward built in the same function, with a VJP rule per op and
//! custom VJPs ([`FuncBuilder::custom_vjp`]) for kernels and other opaque units.
//!
//! Manually partitioned (SPMD) programs come in two forms: per-device arguments and results
//! marked `mhlo.sharding = "{manual}"` (GSPMD's form, [`Sharding::Manual`]), or, on a module
//! with a mesh ([`Module::set_mesh`]), Shardy's form: `@main` over global tensors split over
//! the mesh axes ([`Sharding::ManualSplit`]), its body an `sdy.manual_computation`. A module
//! with a mesh prints both ([`Module::to_mlir`], [`Module::to_mlir_gspmd`]).
//!
//! ```
//! use tessera_hlo::{DType, Grouping, Module, Sharding, TensorType};
//!
//! // Ulysses re-sharding on 4 devices: [B, H, S/4, D] -> [B, H/4, S, D].
//! let mut m = Module::new("ulysses");
//! m.set_num_partitions(4)?;
//! let mut f = m.func("main");
//! let x = f.arg_with_sharding(TensorType::new([1, 8, 16, 64], DType::BF16), Sharding::Manual)?;
//! let y = f.all_to_all(x, 1, 2, &[vec![0, 1, 2, 3]], Grouping::FlattenedIds)?;
//! f.finish_with_shardings(&[(y, Some(Sharding::Manual))])?;
//! let text = m.to_mlir();
//! assert!(text.contains("-> tensor<1x2x64x64xbf16>"));
//! assert!(text.contains("channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>"));
//! # Ok::<(), tessera_hlo::HloError>(())
//! ```

#![warn(missing_docs)]

pub mod autodiff;
mod builder;
mod error;
mod literal;
mod mesh_types;
mod module;
mod ops;
mod print;
mod tpu;
mod types;

pub use builder::{FuncBuilder, ScanOutput};
pub use error::HloError;
pub use literal::Literal;
pub use mesh_types::{axes, HasAxis, MeshAxis, MeshShape};
pub use module::{Func, Module};
pub use ops::{
    BinaryOp, ChannelHandle, CollectiveAttrs, ComparisonDirection, ComparisonType, CustomCall,
    CustomCallApiVersion, DotDims, Grouping, Op, OpKind, OutputOperandAlias, Precision, Reducer,
    Region, Sharding, TypeClass, UnaryOp, Value,
};
pub use tessera_array::{ArrayData, DType, HostArray};
pub use tpu::{CostEstimate, TpuCustomCall, TPU_CUSTOM_CALL};
pub use types::TensorType;
