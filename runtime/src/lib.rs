//! tessera-runtime: tessera's own binding of the PJRT C API.
//!
//! * [`ffi`]: the raw `#[repr(C)]` binding of `pjrt_c_api.h` 0.81 (the subset used), checked
//!   against the real header by `tests/ffi_layout.rs`.
//! * [`Plugin`]: a PJRT plugin library, loaded once and never unloaded.
//! * [`Client`], [`Device`], [`Buffer`], [`LoadedExecutable`]: compile StableHLO text and run
//!   it on N devices, moving [`HostBuffer`]s between host and devices.
//! * [`Platform`]: the devices a program runs on (cpu, gpu, tpu), one way to get a client of
//!   any plugin ([`Platform::client`]).
//! * [`Topology`], [`Executable`]: compile-only for a topology with no client (TPU via libtpu).
//! * [`enable_libtpu_dumps`]: libtpu's dumps of what its compiler made of each kernel, read
//!   back per compile ([`Topology::compile_with_dumps`]).
//! * [`provision`]: where the plugin library comes from (env override or a pinned PyPI wheel
//!   unpacked into a cache).
//!
//! ```no_run
//! use tessera_runtime::{Client, CompileOptions, HostBuffer};
//! # fn main() -> tessera_runtime::Result<()> {
//! let client = Client::cpu_shared(1)?;
//! let program = r#"
//! func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {
//!   %0 = stablehlo.add %a, %b : tensor<2xf32>
//!   return %0 : tensor<2xf32>
//! }"#;
//! let exe = client.compile(program, &CompileOptions::single_device())?;
//! let a = HostBuffer::from_slice(&[2], &[1.0f32, 2.0])?;
//! let b = HostBuffer::from_slice(&[2], &[10.0f32, 20.0])?;
//! let out = exe.execute_host(&[vec![a, b]])?;
//! assert_eq!(out[0][0].to_vec::<f32>()?, vec![11.0, 22.0]);
//! # Ok(())
//! # }
//! ```
//!
//! # Unsafe code
//! This is the only tessera crate with `unsafe` (the workspace denies `unsafe_code`). It is
//! allowed per module, only where FFI happens (`ffi`, `plugin`, `client`, `topology`); the
//! element, options, provisioning and error modules stay under the workspace's `deny`. Every
//! `unsafe` block is small and carries a `// SAFETY:` comment.
//!
//! # Thread safety
//! [`Plugin`], [`Client`], [`Device`], [`Buffer`], [`LoadedExecutable`], [`Topology`] and
//! [`Executable`] are `Send + Sync`: the PJRT objects they wrap are documented thread-safe, and
//! the wrappers are immutable after creation. Every PJRT object is destroyed exactly once, by
//! its wrapper's `Drop`; buffers and executables keep their client alive.

mod array;
mod device;
mod dumps;
mod element;
mod error;
mod options;
pub mod provision;
mod shape;

#[allow(unsafe_code)]
mod client;
#[allow(unsafe_code)]
pub mod ffi;
#[allow(unsafe_code)]
mod plugin;
#[allow(unsafe_code)]
mod topology;

pub use client::{
    Argument, Buffer, Client, Device, LoadedExecutable, CPU_COLLECTIVES_NONBLOCKING_SINCE,
    CPU_DEVICE_COUNT_OPTION,
};
pub use device::{
    libtpu_client, tpu_chips, tpu_chips_in, Platform, GPU_PLUGIN_ENV, PCI_DEVICES, PROCESSES_ENV,
};
pub use dumps::{enable_libtpu_dumps, libtpu_dump_dir, DumpFile, LibtpuDumps, LIBTPU_INIT_ARGS};
pub use element::{ElementType, HostBuffer, NativeType};
pub use error::{CompileOptionsError, Error, ErrorCode, Result};
pub use options::{CompileOptions, DeviceAssignment, XlaOption};
pub use plugin::{configure_plugin_logs, NamedValue, Plugin, VERBOSE_VAR};
pub use provision::{
    cpu_plugin_path, libtpu_path, libtpu_wheel, ProvisionedPlugin, Provisioner, WheelSpec,
};
pub use shape::ArrayShape;
pub use tessera_array::{ArrayData, DType, HostArray};
pub use topology::{
    CompiledMemoryStats, CompiledWithDumps, Executable, OptimizedProgram, ScopedVmemRaise, Topology,
};
