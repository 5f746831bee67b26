//! Compile-only: topologies without a client, and compiled (unloaded) executables.
//!
//! This is the path to compile for TPU on a machine with no TPU (see `notes/tpu-aot.md`):
//! load `libtpu.so` as a [`Plugin`], create a [`Topology`] such as `v5p:2x2x1`, and
//! [`Topology::compile`] a manually partitioned StableHLO program with
//! [`CompileOptions::manual_partitions`]; the result's [`Executable::serialize`] is the TPU
//! executable, and a compile error carries the TPU compiler's message.

use std::ffi::c_char;
use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, ErrorCode, Result};
use crate::ffi;
use crate::options::CompileOptions;
use crate::plugin::{
    api_fn, copy_string, raw_named_values, raw_slice, read_named_value, NamedValue, Plugin,
    PluginInner,
};
use crate::shape::{entry_parameters, ArrayShape};

/// What a device description says about a device.
pub(crate) struct Description {
    pub(crate) id: i32,
    pub(crate) kind: String,
    pub(crate) to_string: String,
}

/// Reads id, kind and short description of a (plugin-owned) device description.
pub(crate) fn describe(
    p: &'static PluginInner,
    description: NonNull<ffi::PJRT_DeviceDescription>,
) -> Result<Description> {
    let f = api_fn!(p, PJRT_DeviceDescription_Id)?;
    let mut args = ffi::PJRT_DeviceDescription_Id_Args::init();
    args.device_description = description.as_ptr();
    // SAFETY: `args` is initialised; the description is owned by a live client or topology.
    let err = unsafe { f(&mut args) };
    p.check(err, "PJRT_DeviceDescription_Id")?;
    let id = args.id;

    let f = api_fn!(p, PJRT_DeviceDescription_Kind)?;
    let mut args = ffi::PJRT_DeviceDescription_Kind_Args::init();
    args.device_description = description.as_ptr();
    // SAFETY: as above.
    let err = unsafe { f(&mut args) };
    p.check(err, "PJRT_DeviceDescription_Kind")?;
    // SAFETY: the string has the lifetime of the description, alive during the copy.
    let kind = unsafe { copy_string(args.device_kind, args.device_kind_size) };

    let f = api_fn!(p, PJRT_DeviceDescription_ToString)?;
    let mut args = ffi::PJRT_DeviceDescription_ToString_Args::init();
    args.device_description = description.as_ptr();
    // SAFETY: as above.
    let err = unsafe { f(&mut args) };
    p.check(err, "PJRT_DeviceDescription_ToString")?;
    // SAFETY: as above.
    let to_string = unsafe { copy_string(args.to_string, args.to_string_size) };
    Ok(Description {
        id,
        kind,
        to_string,
    })
}

/// A device topology created without a client (e.g. `v5p:2x2x1` from libtpu), to compile for
/// devices this machine does not have.
pub struct Topology {
    plugin: Plugin,
    raw: NonNull<ffi::PJRT_TopologyDescription>,
    name: String,
}

// SAFETY: a topology description is an immutable heap object with no thread affinity; PJRT
// only reads it (`PJRT_Compile` takes it as const), and it is destroyed once, in Drop.
unsafe impl Send for Topology {}
// SAFETY: as above.
unsafe impl Sync for Topology {}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let p = self.plugin.inner;
        if let Ok(f) = api_fn!(p, PJRT_TopologyDescription_Destroy) {
            let mut args = ffi::PJRT_TopologyDescription_Destroy_Args::init();
            args.topology = self.raw.as_ptr();
            // SAFETY: owned, destroyed exactly once.
            let err = unsafe { f(&mut args) };
            p.ignore_error(err);
        }
    }
}

impl Plugin {
    /// Creates a topology by name, e.g. `v5p:2x2x1` with libtpu.
    pub fn topology(&self, name: &str) -> Result<Topology> {
        self.topology_with_options(name, &[])
    }

    /// Creates a topology by name with plugin-specific create options.
    pub fn topology_with_options(
        &self,
        name: &str,
        options: &[(String, NamedValue)],
    ) -> Result<Topology> {
        let p = self.inner;
        let f = api_fn!(p, PJRT_TopologyDescription_Create)?;
        let raw_options = raw_named_values(options);
        let mut args = ffi::PJRT_TopologyDescription_Create_Args::init();
        args.topology_name = name.as_ptr().cast::<c_char>();
        args.topology_name_size = name.len();
        args.create_options = raw_options.as_ptr();
        args.num_options = raw_options.len();
        // SAFETY: `args` is initialised; name and options (borrowed) outlive the call.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_TopologyDescription_Create")?;
        let raw = NonNull::new(args.topology).ok_or_else(|| Error::PluginContract {
            operation: "PJRT_TopologyDescription_Create",
            reason: "null topology without an error".into(),
        })?;
        Ok(Topology {
            plugin: *self,
            raw,
            name: name.to_string(),
        })
    }
}

impl Topology {
    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Platform name, e.g. `tpu`.
    pub fn platform_name(&self) -> Result<String> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_TopologyDescription_PlatformName)?;
        let mut args = ffi::PJRT_TopologyDescription_PlatformName_Args::init();
        args.topology = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the topology alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_TopologyDescription_PlatformName")?;
        // SAFETY: owned by the live topology.
        Ok(unsafe { copy_string(args.platform_name, args.platform_name_size) })
    }

    /// Ids of the topology's devices, in the plugin's order.
    pub fn device_ids(&self) -> Result<Vec<i32>> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_TopologyDescription_GetDeviceDescriptions)?;
        let mut args = ffi::PJRT_TopologyDescription_GetDeviceDescriptions_Args::init();
        args.topology = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the topology alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_TopologyDescription_GetDeviceDescriptions")?;
        // SAFETY: `num_descriptions` entries owned by the live topology.
        let raw = unsafe { raw_slice(args.descriptions, args.num_descriptions) };
        raw.iter()
            .map(|&d| {
                let d = NonNull::new(d).ok_or_else(|| Error::PluginContract {
                    operation: "PJRT_TopologyDescription_GetDeviceDescriptions",
                    reason: "null description".into(),
                })?;
                Ok(describe(p, d)?.id)
            })
            .collect()
    }

    /// Compiles a StableHLO program (MLIR text) for this topology, with no client. The options
    /// must be complete (for TPU: `num_partitions`, SPMD on and a device assignment, as
    /// [`CompileOptions::manual_partitions`] makes). When libtpu dumps in this process, the
    /// compile's dumps are discarded (see [`Topology::compile_with_dumps`]).
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<Executable> {
        self.compile_with_dumps(program, options, &|_| false)
            .map(|c| c.executable)
    }

    fn compile_alone(&self, program: &str, options: &CompileOptions) -> Result<Executable> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_Compile)?;
        let options_bytes = options.to_proto_bytes()?;
        let mut code = program.as_bytes().to_vec();
        let format = b"mlir";
        let mut raw_program = ffi::PJRT_Program::init();
        raw_program.code = code.as_mut_ptr().cast::<c_char>();
        raw_program.code_size = code.len();
        raw_program.format = format.as_ptr().cast::<c_char>();
        raw_program.format_size = format.len();
        let mut args = ffi::PJRT_Compile_Args::init();
        args.topology = self.raw.as_ptr();
        args.program = &raw_program;
        args.compile_options = options_bytes.as_ptr().cast::<c_char>();
        args.compile_options_size = options_bytes.len();
        // SAFETY: `args` is initialised; program, format and options are owned here and
        // outlive the call; the topology is alive; no client is passed (null).
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Compile")?;
        Executable::from_raw(self.plugin, args.executable)
    }
}

impl Topology {
    /// [`Topology::compile`], and the dump files libtpu wrote for this compile whose names
    /// `keep` accepts, when libtpu dumps in this process (see
    /// [`enable_libtpu_dumps`](crate::enable_libtpu_dumps); `None` when it loaded without a
    /// dump directory). Such compiles run one at a time in the process.
    ///
    /// When libtpu refuses a Mosaic call whose scoped VMEM outgrew the limit the call
    /// carries, the program is compiled again with that limit raised to what libtpu asked
    /// for (a whole MiB above it; at most `VMEM_RETRIES`, 3, times), and the result says so
    /// ([`CompiledWithDumps::vmem_raises`]). A kernel's limit is tessera's estimate of its
    /// need, kept tight so that XLA keeps the rest of VMEM for the program; libtpu's own
    /// count is exact. The dumps are those of the compile that succeeded.
    pub fn compile_with_dumps(
        &self,
        program: &str,
        options: &CompileOptions,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<CompiledWithDumps> {
        let mut program = std::borrow::Cow::Borrowed(program);
        let mut vmem_raises = Vec::new();
        loop {
            match crate::dumps::collecting(keep, || self.compile_alone(&program, options)) {
                Err(e) if vmem_raises.len() < VMEM_RETRIES => {
                    match raised_scoped_vmem(&program, &e.to_string()) {
                        Some((raised, raise)) => {
                            program = std::borrow::Cow::Owned(raised);
                            vmem_raises.push(raise);
                        }
                        None => return Err(e),
                    }
                }
                Err(e) => return Err(e),
                Ok((executable, dumps)) => {
                    return Ok(CompiledWithDumps {
                        executable,
                        dumps,
                        vmem_raises,
                    })
                }
            }
        }
    }
}

/// What [`Topology::compile_with_dumps`] gives back.
#[derive(Debug)]
pub struct CompiledWithDumps {
    pub executable: Executable,
    /// The dump files kept, when libtpu dumps in this process.
    pub dumps: Option<Vec<crate::DumpFile>>,
    /// Each time libtpu refused a call's scoped VMEM limit and the program was compiled
    /// again with it raised, in order; empty when the first compile succeeded.
    pub vmem_raises: Vec<ScopedVmemRaise>,
}

/// One retry of a compile with a raised scoped VMEM limit: libtpu needed `asked_bytes`
/// where calls carried `limit_bytes` (both as its message gives them, to 0.01 MiB), and every
/// call carrying that limit was compiled again with `raised_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopedVmemRaise {
    pub asked_bytes: u64,
    pub limit_bytes: u64,
    pub raised_bytes: u64,
}

/// How many times a compile is retried with raised scoped VMEM limits.
const VMEM_RETRIES: usize = 3;

/// `program` with the scoped VMEM limit of the calls libtpu refused raised to what it asked
/// for, from libtpu's message ("Scoped allocation with size 16.14M and limit 16.00M
/// exceeded ..."), and the raise; or `None` when the message is not that or no call carries
/// that limit. Every call whose limit prints as that limit is raised (the message does not
/// say which one failed), to the whole MiB above the asked size.
fn raised_scoped_vmem(program: &str, message: &str) -> Option<(String, ScopedVmemRaise)> {
    let rest = message.split("Scoped allocation with size ").nth(1)?;
    let (size, rest) = rest.split_once("M and limit ")?;
    let (limit, _) = rest.split_once('M')?;
    let asked: f64 = size.parse().ok()?;
    let limit_mib: f64 = limit.parse().ok()?;
    let mib = |x: f64| (x * (1u64 << 20) as f64).round() as u64;
    let raised = ((asked.floor() as u64) + 1) << 20;
    // The limit as `tessera_hlo::TpuCustomCall` writes it into the quoted backend config.
    const KEY: &str = "\\\"size\\\": ";
    let mut out = String::with_capacity(program.len());
    let mut rest = program;
    let mut changed = false;
    while let Some(i) = rest.find(KEY) {
        let (head, tail) = rest.split_at(i + KEY.len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        let bytes: u64 = tail[..digits].parse().ok()?;
        if format!("{:.2}", bytes as f64 / (1u64 << 20) as f64) == limit && raised > bytes {
            out.push_str(&raised.to_string());
            changed = true;
        } else {
            out.push_str(&tail[..digits]);
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    changed.then_some((
        out,
        ScopedVmemRaise {
            asked_bytes: mib(asked),
            limit_bytes: mib(limit_mib),
            raised_bytes: raised,
        },
    ))
}

#[cfg(test)]
mod vmem_tests {
    use super::{raised_scoped_vmem, ScopedVmemRaise};

    #[test]
    fn refused_limits_are_raised_to_what_libtpu_asked() {
        let program = r#"backend_config = "{\"scoped_memory_configs\": [{\"memory_space\": 1, \"offset\": 0, \"size\": 16777216}]}" x backend_config = "{\"size\": 33554432}""#;
        let message = "E1001: CompileTimeScopedVmemOom: ... Scoped allocation with size \
                       16.14M and limit 16.00M exceeded scoped vmem limit by 144.0K.";
        let (raised, raise) = raised_scoped_vmem(program, message).unwrap();
        assert_eq!(
            raise,
            ScopedVmemRaise {
                asked_bytes: (16.14 * 1048576.0_f64).round() as u64,
                limit_bytes: 16 << 20,
                raised_bytes: 17 << 20,
            }
        );
        assert!(raised.contains(r#"\"size\": 17825792}]"#), "{raised}");
        assert!(raised.contains(r#"\"size\": 33554432}"#), "{raised}");
        assert_eq!(raised_scoped_vmem(program, "some other error"), None);
        let none_at_that_limit = message.replace("limit 16.00M", "limit 8.00M");
        assert_eq!(raised_scoped_vmem(program, &none_at_that_limit), None);
    }
}

/// A compiled executable that is not loaded on any device: the result of a compile-only
/// [`Topology::compile`].
pub struct Executable {
    plugin: Plugin,
    raw: NonNull<ffi::PJRT_Executable>,
}

// SAFETY: a compiled executable is immutable; the queries used here only read it, and it is
// destroyed once, in Drop.
unsafe impl Send for Executable {}
// SAFETY: as above.
unsafe impl Sync for Executable {}

impl fmt::Debug for Executable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executable")
            .field("name", &self.name().ok())
            .finish_non_exhaustive()
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let p = self.plugin.inner;
        if let Ok(f) = api_fn!(p, PJRT_Executable_Destroy) {
            let mut args = ffi::PJRT_Executable_Destroy_Args::init();
            args.executable = self.raw.as_ptr();
            // SAFETY: owned, destroyed exactly once.
            let err = unsafe { f(&mut args) };
            p.ignore_error(err);
        }
    }
}

macro_rules! executable_count {
    ($self:ident, $func:ident, $args:ident, $field:ident) => {{
        let p = $self.plugin.inner;
        let f = api_fn!(p, $func)?;
        let mut args = ffi::$args::init();
        args.executable = $self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        p.check(err, stringify!($func))?;
        Ok(args.$field)
    }};
}

impl Executable {
    /// Takes ownership of a raw executable returned by the plugin.
    pub(crate) fn from_raw(plugin: Plugin, raw: *mut ffi::PJRT_Executable) -> Result<Self> {
        let raw = NonNull::new(raw).ok_or_else(|| Error::PluginContract {
            operation: "PJRT_Compile",
            reason: "null executable without an error".into(),
        })?;
        Ok(Self { plugin, raw })
    }

    /// Name of the compiled module.
    pub fn name(&self) -> Result<String> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_Executable_Name)?;
        let mut args = ffi::PJRT_Executable_Name_Args::init();
        args.executable = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Executable_Name")?;
        // SAFETY: owned by the live executable.
        Ok(unsafe { copy_string(args.executable_name, args.executable_name_size) })
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> Result<usize> {
        executable_count!(
            self,
            PJRT_Executable_NumOutputs,
            PJRT_Executable_NumOutputs_Args,
            num_outputs
        )
    }

    /// Number of replicas it was compiled for.
    pub fn num_replicas(&self) -> Result<usize> {
        executable_count!(
            self,
            PJRT_Executable_NumReplicas,
            PJRT_Executable_NumReplicas_Args,
            num_replicas
        )
    }

    /// Number of partitions it was compiled for.
    pub fn num_partitions(&self) -> Result<usize> {
        executable_count!(
            self,
            PJRT_Executable_NumPartitions,
            PJRT_Executable_NumPartitions_Args,
            num_partitions
        )
    }

    /// The entry parameters of the compiled (for SPMD: partitioned, per-device) program, read
    /// from the plugin's optimized HLO. `Ok(None)` when the plugin does not provide it or the
    /// signature has parameters that are not plain arrays.
    pub fn parameters(&self) -> Result<Option<Vec<ArrayShape>>> {
        Ok(self
            .optimized_program()?
            .and_then(|p| entry_parameters(&p.code, p.format == "hlo_with_config")))
    }

    /// The plugin's optimized program: for XLA a serialized `HloModuleProto` (format `hlo`)
    /// or `HloModuleProtoWithConfig` (`hlo_with_config`). `Ok(None)` when the plugin does not
    /// provide it.
    pub fn optimized_program(&self) -> Result<Option<OptimizedProgram>> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_Executable_OptimizedProgram)?;
        let mut program = ffi::PJRT_Program::init();
        let mut args = ffi::PJRT_Executable_OptimizedProgram_Args::init();
        args.executable = self.raw.as_ptr();
        args.program = &mut program;
        // SAFETY: `args` is initialised; `program.code` is null, so the plugin only writes the
        // needed size (and the format) into `program`, which outlives the call.
        let err = unsafe { f(&mut args) };
        if unimplemented_as_none(p.check(err, "PJRT_Executable_OptimizedProgram"))?.is_none() {
            return Ok(None);
        }
        // SAFETY: the format string is owned by the plugin and static.
        let format = unsafe { copy_string(program.format, program.format_size) };
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast::<c_char>();
        program.code_size = code.len();
        args.program = &mut program;
        // SAFETY: as above; now `program.code` points to `code_size` writable bytes.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Executable_OptimizedProgram")?;
        code.truncate(program.code_size);
        Ok(Some(OptimizedProgram { format, code }))
    }

    /// Bytes of generated code, as the plugin counts them; `Ok(None)` when the plugin does
    /// not say (unimplemented or negative).
    pub fn generated_code_size(&self) -> Result<Option<u64>> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_Executable_SizeOfGeneratedCodeInBytes)?;
        let mut args = ffi::PJRT_Executable_SizeOfGeneratedCodeInBytes_Args::init();
        args.executable = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        match unimplemented_as_none(p.check(err, "PJRT_Executable_SizeOfGeneratedCodeInBytes"))? {
            Some(()) => Ok(u64::try_from(args.size_in_bytes).ok()),
            None => Ok(None),
        }
    }

    /// The compiler's memory statistics for one device (`xla::CompiledMemoryStats`):
    /// argument, output, alias and temporary bytes in device memory. `Ok(None)` when the
    /// plugin does not provide them.
    pub fn memory_stats(&self) -> Result<Option<CompiledMemoryStats>> {
        let p = self.plugin.inner;
        let f = match api_fn!(p, PJRT_Executable_GetCompiledMemoryStats) {
            Ok(f) => f,
            Err(Error::MissingFunction { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut args = ffi::PJRT_Executable_GetCompiledMemoryStats_Args::init();
        args.executable = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive; the plugin only writes the
        // integer out-fields.
        let err = unsafe { f(&mut args) };
        let ok = unimplemented_as_none(p.check(err, "PJRT_Executable_GetCompiledMemoryStats"))?;
        Ok(ok.map(|()| CompiledMemoryStats {
            generated_code_bytes: args.generated_code_size_in_bytes,
            argument_bytes: args.argument_size_in_bytes,
            output_bytes: args.output_size_in_bytes,
            alias_bytes: args.alias_size_in_bytes,
            temp_bytes: args.temp_size_in_bytes,
            host_temp_bytes: args.host_temp_size_in_bytes,
            peak_bytes: args.peak_memory_in_bytes,
        }))
    }

    /// The compiler's cost analysis (for XLA: `flops`, `bytes accessed`, `transcendentals`,
    /// ...), as the plugin names them. Empty when the plugin provides none.
    pub fn cost_analysis(&self) -> Result<Vec<(String, NamedValue)>> {
        let p = self.plugin.inner;
        let f = match api_fn!(p, PJRT_Executable_GetCostAnalysis) {
            Ok(f) => f,
            Err(Error::MissingFunction { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut args = ffi::PJRT_Executable_GetCostAnalysis_Args::init();
        args.executable = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        if unimplemented_as_none(p.check(err, "PJRT_Executable_GetCostAnalysis"))?.is_none() {
            return Ok(Vec::new());
        }
        // SAFETY: `num_properties` values owned by the live executable, copied here.
        let raw = unsafe { raw_slice(args.properties, args.num_properties) };
        Ok(raw.iter().filter_map(read_named_value).collect())
    }

    /// The plugin's serialized form of the executable (for TPU: what the runtime loads).
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let p = self.plugin.inner;
        let f = api_fn!(p, PJRT_Executable_Serialize)?;
        let mut args = ffi::PJRT_Executable_Serialize_Args::init();
        args.executable = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Executable_Serialize")?;
        // SAFETY: `serialized_bytes_size` bytes backed by `serialized_executable`, alive until
        // its deleter runs below.
        let bytes = unsafe {
            raw_slice(
                args.serialized_bytes.cast::<u8>(),
                args.serialized_bytes_size,
            )
        }
        .to_vec();
        if let (Some(deleter), false) = (
            args.serialized_executable_deleter,
            args.serialized_executable.is_null(),
        ) {
            // SAFETY: the deleter frees the backing object; called exactly once.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }
}

/// A compiled executable's optimized program, in the plugin's serialization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizedProgram {
    /// `hlo` or `hlo_with_config` for XLA plugins.
    pub format: String,
    /// The serialized program.
    pub code: Vec<u8>,
}

/// Memory one device needs to run a compiled executable, as the compiler computed it
/// (`PJRT_Executable_GetCompiledMemoryStats`). Bytes; the plugin reports `-1` for what it does
/// not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompiledMemoryStats {
    /// Generated code in device memory.
    pub generated_code_bytes: i64,
    /// Arguments (parameters) in device memory.
    pub argument_bytes: i64,
    /// Outputs in device memory.
    pub output_bytes: i64,
    /// Output bytes that reuse argument buffers.
    pub alias_bytes: i64,
    /// Temporaries (everything the program allocates besides arguments and outputs).
    pub temp_bytes: i64,
    /// Temporaries in host memory.
    pub host_temp_bytes: i64,
    /// Peak device memory, when the plugin computes it (0 otherwise).
    pub peak_bytes: i64,
}

/// `Ok(Some(()))` on success, `Ok(None)` when the plugin answers `UNIMPLEMENTED`.
fn unimplemented_as_none(r: Result<()>) -> Result<Option<()>> {
    match r {
        Ok(()) => Ok(Some(())),
        Err(Error::Pjrt {
            code: ErrorCode::Unimplemented,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}
