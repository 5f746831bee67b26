//! Compile-only for TPU: a StableHLO program (with its kernels as Mosaic `tpu_custom_call`s)
//! compiled by the real TPU compiler, libtpu, for a TPU topology such as `v5p:2x2x1`, on a
//! machine with no TPU (see `notes/tpu-aot.md`). libtpu is provisioned on first use, and the
//! environment it needs for compile-only (`TPU_SKIP_MDS_QUERY`, ...) is set then where unset.
//!
//! A kernel of your own, in one call ([`TpuTopology::compile_kernel`]):
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tessera::dsl::{ArgSpec, DType};
//! use tessera::kernels::row_softmax;
//! use tessera::tpu::TpuTopology;
//!
//! let args = [ArgSpec::new(DType::F32, [1024, 512])];
//! let report = TpuTopology::parse("tpu:v5p:2x2x1")?.compile_kernel(&row_softmax::<f32, 8>(), &args)?;
//! println!("{}", report.to_json());
//! # Ok(())
//! # }
//! ```
//!
//! A whole program, here splash attention's forward:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tessera::dsl::{DType, Lowering};
//! use tessera::splash::{splash_program, BlockSizes, Dims, Features, Mask, Pass, SplashAttention};
//! use tessera::tpu::TpuTopology;
//!
//! let dims = Dims { batch: 1, heads: 2, kv_heads: 2, q_len: 1024, kv_len: 1024,
//!                   head_dim: 128, head_dim_v: 128 };
//! let attn = SplashAttention::new(Mask::causal(), dims, DType::BF16,
//!                                 BlockSizes::uniform(512, 512), Default::default(),
//!                                 Lowering::tpu())?;
//! let program = splash_program(&attn, Pass::Forward, Features::default())?;
//! let report = TpuTopology::parse("tpu:v5p:2x2x1")?.compile(&program)?;
//! println!("{}", report.to_json());
//! # Ok(())
//! # }
//! ```

pub mod bundles;
pub mod cost;

use std::fmt::Write as _;
use std::path::PathBuf;

use base64::Engine as _;
use std::time::Instant;

use tessera_dsl::{ArgSpec, DeviceAxis, KernelDef, KernelError, Lowering};
use tessera_hlo::{DType, Module};
use tessera_runtime::{CompileOptions, CompiledMemoryStats, Error as RuntimeError, NamedValue};
use tessera_runtime::{Executable, Plugin, ScopedVmemRaise, Topology};

/// Topologies libtpu is known to accept, for messages.
pub const KNOWN_TOPOLOGIES: &str = "v5p:2x2x1, v5p:2x2x2, v5e:2x2, v6e:2x2, v4:2x2x1";

/// A TPU chip family: the slices it comes in and the memories of its chips. The slice
/// limits are Cloud TPU's (the largest slice of each family: v4 16x16x16 of a 4096-chip pod,
/// v5p 16x16x24, v5e and v6e 16x16 of a 256-chip pod, on a 2-D torus); VMEM per TensorCore
/// (what one kernel has) and HBM per chip are JAX's `pltpu.get_tpu_info` figures. libtpu is
/// handed nothing outside them (it crashes on some, e.g. `v5p:1024x1024x1024`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipFamily {
    /// `v4`, `v5p`, `v5e`, `v6e`.
    pub name: &'static str,
    /// Dims of its torus (3 or 2).
    pub dims: usize,
    /// The largest extent of one dim, and the most chips, of a slice.
    pub max_dim: usize,
    pub max_chips: usize,
    /// VMEM of one TensorCore, bytes.
    pub vmem_bytes: usize,
    /// HBM of one chip, bytes.
    pub hbm_bytes: u64,
}

/// The families `tessera compile` targets.
pub const CHIP_FAMILIES: [ChipFamily; 4] = [
    ChipFamily {
        name: "v4",
        dims: 3,
        max_dim: 16,
        max_chips: 4096,
        vmem_bytes: 16 << 20,
        hbm_bytes: 34_400_000_000,
    },
    ChipFamily {
        name: "v5p",
        dims: 3,
        max_dim: 24,
        max_chips: 6144,
        vmem_bytes: 64 << 20,
        hbm_bytes: 103_000_000_000,
    },
    ChipFamily {
        name: "v5e",
        dims: 2,
        max_dim: 16,
        max_chips: 256,
        vmem_bytes: 128 << 20,
        hbm_bytes: 17_200_000_000,
    },
    ChipFamily {
        name: "v6e",
        dims: 2,
        max_dim: 16,
        max_chips: 256,
        vmem_bytes: 128 << 20,
        hbm_bytes: 34_400_000_000,
    },
];

/// Why a program did not compile for TPU.
#[derive(Debug, thiserror::Error)]
pub enum TpuCompileError {
    /// The target is not `tpu:TOPOLOGY`.
    #[error(
        "unknown target `{target}`; expected tpu:TOPOLOGY, e.g. tpu:v5p:2x2x1 (known \
         topologies: {KNOWN_TOPOLOGIES})"
    )]
    Target { target: String },
    /// Not a chip family tessera knows the slices of.
    #[error(
        "`{family}` is not a TPU chip family tessera compiles for; use v4, v5p, v5e or v6e \
         (e.g. tpu:v5p:2x2x1)"
    )]
    Family { family: String },
    /// A slice its chip family does not come in.
    #[error(
        "{} is not a slice of {}: {} slices are {}-D tori of at most {} chips, each dim at \
         most {} (e.g. {}:{})",
        topology,
        family.name,
        family.name,
        family.dims,
        family.max_chips,
        family.max_dim,
        family.name,
        if family.dims == 3 { "2x2x1" } else { "2x2" }
    )]
    Slice {
        topology: String,
        family: ChipFamily,
    },
    /// libtpu could not be provisioned or loaded.
    #[error("cannot load the TPU compiler (libtpu): {0}")]
    Libtpu(RuntimeError),
    /// libtpu does not know the topology.
    #[error(
        "libtpu cannot create the topology `{topology}`: {message}; known topologies: \
         {KNOWN_TOPOLOGIES}"
    )]
    Topology { topology: String, message: String },
    /// The program needs more devices than the topology has.
    #[error(
        "the program runs on {program} devices but the topology {topology} has {devices}; use \
         a topology with at least {program} devices or fewer devices"
    )]
    Devices {
        topology: String,
        program: usize,
        devices: usize,
    },
    /// The TPU compiler rejected the program; `culprit` names the kernel when one kernel
    /// compiled alone is rejected, and `message` is the compiler's, verbatim. Shown as the
    /// compiler's first line and the kernel line it names; the whole text is written to
    /// `full_message` (a file in the temporary directory) when it has more to say.
    #[error(
        "the TPU compiler rejected {culprit}{}: {}{}",
        kernel_line(message),
        first_line(message),
        full_message
            .as_ref()
            .map(|p| format!("\nthe compiler's whole message: {}", p.display()))
            .unwrap_or_default()
    )]
    Compiler {
        culprit: String,
        message: String,
        full_message: Option<PathBuf>,
    },
    /// libtpu's dumps of the compiled kernels could not be read.
    #[error(transparent)]
    Dumps(#[from] cost::DumpError),

    /// The kernel does not instantiate for the arguments under the TPU rules (the message
    /// names the kernel line and the rule), or does not lower.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Any other runtime failure.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// A TPU topology to compile for (`tpu:v5p:2x2x1` on the command line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpuTopology {
    topology: String,
}

/// What the compiler made of a program, for one device of the topology.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileReport {
    /// The topology, e.g. `v5p:2x2x1`.
    pub topology: String,
    /// Devices (SPMD partitions) the program runs on.
    pub devices: usize,
    /// The Mosaic kernels in the program, in program order.
    pub kernels: Vec<String>,
    /// Bytes of the serialized TPU executable.
    pub executable_bytes: usize,
    /// The compiler's memory statistics for one device.
    pub memory: Option<CompiledMemoryStats>,
    /// Floating-point operations per device, from the compiler's cost analysis.
    pub flops: Option<f64>,
    /// Bytes accessed per device, from the compiler's cost analysis.
    pub bytes_accessed: Option<f64>,
    /// Transcendental operations per device, from the compiler's cost analysis.
    pub transcendentals: Option<f64>,
    /// The compiler's own estimate of the program's run time in seconds (libtpu's
    /// `optimal_seconds`), where it gives one.
    pub optimal_seconds: Option<f64>,
    /// Scoped VMEM each Mosaic kernel uses as compiled (the largest over its calls), in
    /// program order; read from the compiled program.
    pub kernel_vmem: Vec<(String, i64)>,
    /// Each compiled Mosaic kernel's cost read from libtpu's bundles ([`cost`]); `None` when
    /// libtpu was loaded without dumps (see `tessera_runtime::enable_libtpu_dumps`).
    pub kernel_costs: Option<Vec<cost::KernelCost>>,
    /// Each time libtpu refused a kernel's scoped VMEM limit (tessera's estimate of its
    /// need) and the program was compiled again with the limit raised to what libtpu asked
    /// for; empty when the first compile went through.
    pub vmem_raises: Vec<ScopedVmemRaise>,
    /// Wall time of the compile.
    pub compile_seconds: f64,
}

impl TpuTopology {
    /// Parses `tpu:FAMILY:AxBxC` (e.g. `tpu:v5p:2x2x1`, `tpu:v5e:2x2`) and checks it against
    /// what its chip family comes in ([`CHIP_FAMILIES`]): the number of dims, each dim's
    /// extent and the chips of the slice.
    pub fn parse(target: &str) -> Result<Self, TpuCompileError> {
        let topology = target
            .strip_prefix("tpu:")
            .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == ':'))
            .ok_or_else(|| TpuCompileError::Target {
                target: target.to_string(),
            })?;
        let (family, shape) = topology
            .split_once(':')
            .ok_or_else(|| TpuCompileError::Target {
                target: target.to_string(),
            })?;
        let chip = CHIP_FAMILIES
            .iter()
            .find(|f| f.name == family)
            .ok_or_else(|| TpuCompileError::Family {
                family: family.to_string(),
            })?;
        let dims: Vec<usize> = shape
            .split('x')
            .map(|d| d.parse::<usize>().ok().filter(|&d| d > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| TpuCompileError::Target {
                target: target.to_string(),
            })?;
        let chips = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= chip.max_chips);
        if dims.len() != chip.dims || dims.iter().any(|&d| d > chip.max_dim) || chips.is_none() {
            return Err(TpuCompileError::Slice {
                topology: topology.to_string(),
                family: *chip,
            });
        }
        Ok(TpuTopology {
            topology: topology.to_string(),
        })
    }

    /// The topology's chip family.
    pub fn chip(&self) -> ChipFamily {
        let family = self.topology.split(':').next().unwrap_or_default();
        // `parse` only makes topologies of a known family.
        *CHIP_FAMILIES
            .iter()
            .find(|f| f.name == family)
            .unwrap_or(&CHIP_FAMILIES[1])
    }

    /// The topology name libtpu gets, e.g. `v5p:2x2x1`.
    pub fn topology(&self) -> &str {
        &self.topology
    }

    /// The devices of the topology, as libtpu counts them (v5p:4x4x4: 64).
    pub fn device_count(&self) -> Result<usize, TpuCompileError> {
        Ok(self.create_topology()?.device_ids()?.len())
    }

    fn create_topology(&self) -> Result<Topology, TpuCompileError> {
        // What libtpu needs to compile without a TPU, where the user did not set it.
        tessera_runtime::provision::set_libtpu_compile_only_env();
        let plugin = Plugin::libtpu().map_err(TpuCompileError::Libtpu)?;
        plugin
            .topology(&self.topology)
            .map_err(|e| TpuCompileError::Topology {
                topology: self.topology.clone(),
                message: compiler_message(&e),
            })
    }

    /// Compiles a kernel of yours for the topology: instantiates `def` for `args` (scalar
    /// prefetch and inputs, in order) under the TPU rules, lowers it to Mosaic inside a
    /// `tpu_custom_call` in a one-device program ([`Lowering::lower_module`]) and compiles that. The
    /// report is the one `tessera compile kernel` prints.
    pub fn compile_kernel(
        &self,
        def: &KernelDef,
        args: &[ArgSpec],
    ) -> Result<CompileReport, TpuCompileError> {
        self.compile_kernel_on(def, args, &[])
    }

    /// [`TpuTopology::compile_kernel`] for a kernel on a device mesh (`Devices<M>`; `mesh`
    /// gives its axes' sizes, empty for one device): instantiated on `mesh` with `args` (each
    /// device's), lowered to one partition per device, each device's `tpu_custom_call` talking
    /// to the others ([`Lowering::lower_module_spmd`]), and compiled for the topology, which
    /// needs as many chips as the mesh has devices.
    pub fn compile_kernel_on(
        &self,
        def: &KernelDef,
        args: &[ArgSpec],
        mesh: &[DeviceAxis],
    ) -> Result<CompileReport, TpuCompileError> {
        let target = Lowering::tpu();
        let kernel = def.instantiate_on(args, mesh, &target.rules)?;
        let module = if kernel.num_devices() > 1 {
            target.lower_module_spmd(&kernel)?
        } else {
            target.lower_module(&kernel)?
        };
        self.compile(&module)
    }

    /// Compiles `module` (its `mhlo.num_partitions` devices, manually partitioned) for the
    /// topology. A rejection names the kernel the compiler refuses alone, when there is one.
    pub fn compile(&self, module: &Module) -> Result<CompileReport, TpuCompileError> {
        let topology = self.create_topology()?;
        let devices = topology.device_ids()?.len();
        let program = module.num_partitions() as usize;
        if program > devices {
            return Err(TpuCompileError::Devices {
                topology: self.topology.clone(),
                program,
                devices,
            });
        }
        let options = tessera_backend::tpu_compile_options(module)?;
        let start = Instant::now();
        let compiled =
            match topology.compile_with_dumps(&module.to_mlir(), &options, &cost::is_cost_file) {
                Ok(compiled) => compiled,
                Err(e @ RuntimeError::Pjrt { .. }) => return Err(blame(&topology, module, &e)),
                Err(e) => return Err(e.into()),
            };
        let compile_seconds = start.elapsed().as_secs_f64();
        let mut report = report(self, module, &compiled.executable, program, compile_seconds)?;
        report.vmem_raises = compiled.vmem_raises;
        if let Some(files) = compiled.dumps {
            let mut costs =
                cost::costs_of_dumps(&files, cost::tensorcores_per_chip(&self.topology))?;
            for c in &mut costs {
                c.scoped_vmem_bytes = report
                    .kernel_vmem
                    .iter()
                    .find(|(k, _)| *k == c.kernel)
                    .map(|(_, b)| *b);
            }
            report.kernel_costs = Some(costs);
        }
        Ok(report)
    }
}

fn report(
    target: &TpuTopology,
    module: &Module,
    exe: &Executable,
    devices: usize,
    compile_seconds: f64,
) -> Result<CompileReport, TpuCompileError> {
    let costs = exe.cost_analysis()?;
    let cost = |name: &str| {
        costs
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| match v {
                NamedValue::Float(x) => Some(f64::from(*x)),
                NamedValue::Int64(x) => Some(*x as f64),
                _ => None,
            })
    };
    let kernels = module.tpu_kernel_names();
    let kernel_vmem = match exe.optimized_program()? {
        Some(p) => scoped_vmem(&p.code, &kernels),
        None => Vec::new(),
    };
    Ok(CompileReport {
        topology: target.topology.clone(),
        devices,
        kernels,
        kernel_vmem,
        kernel_costs: None,
        vmem_raises: Vec::new(),
        executable_bytes: exe.serialize()?.len(),
        memory: exe.memory_stats()?,
        flops: cost("flops"),
        bytes_accessed: cost("bytes accessed"),
        transcendentals: cost("transcendentals"),
        optimal_seconds: cost("optimal_seconds"),
        compile_seconds,
    })
}

/// The scoped VMEM (memory space 1) the compiler gave each Mosaic kernel, read from the
/// compiled program (a serialized HLO module whose custom calls carry their backend config
/// as JSON: `"custom_call_config":{"body":"<base64>",..},"used_scoped_memory_configs":
/// [{"memory_space":"1","offset":"0","size":"N"}]`). A kernel is recognised by its function
/// `@NAME(` in the decoded body. The largest use per kernel name, in `kernels`' order.
fn scoped_vmem(program: &[u8], kernels: &[String]) -> Vec<(String, i64)> {
    const BODY: &[u8] = b"\"custom_call_config\":{\"body\":\"";
    const USED: &[u8] = b"\"used_scoped_memory_configs\":[";
    let mut found: Vec<(String, i64)> = kernels.iter().map(|k| (k.clone(), -1)).collect();
    let mut at = 0;
    while let Some(i) = find(&program[at..], BODY) {
        let start = at + i + BODY.len();
        let Some(len) = program[start..].iter().position(|&b| b == b'"') else {
            break;
        };
        at = start + len;
        let text = base64::engine::general_purpose::STANDARD
            .decode(&program[start..at])
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let Some(slot) = found
            .iter_mut()
            .find(|(name, _)| text.contains(&format!("@{name}(")))
        else {
            continue;
        };
        // This call's list: after its body, before the next body.
        let end = find(&program[at..], BODY).map_or(program.len(), |j| at + j);
        let Some(u) = find(&program[at..end], USED) else {
            continue;
        };
        let list_start = at + u + USED.len();
        let list_end = program[list_start..end]
            .iter()
            .position(|&b| b == b']')
            .map_or(end, |j| list_start + j);
        let list = String::from_utf8_lossy(&program[list_start..list_end]);
        if let Some(size) = cost::used_scoped_vmem(&list) {
            slot.1 = slot.1.max(size);
        }
    }
    found.retain(|(_, bytes)| *bytes >= 0);
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The compiler's first non-empty line.
fn first_line(message: &str) -> &str {
    message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(no message)")
}

/// ` at FILE:LINE:COL` for the kernel line the compiler names (`loc("FILE":LINE:COL)`, the
/// location tessera gives each Mosaic op), or nothing.
fn kernel_line(message: &str) -> String {
    let Some(start) = message.find("loc(\"") else {
        return String::new();
    };
    let rest = &message[start + 5..];
    let Some(end) = rest.find(')') else {
        return String::new();
    };
    format!(" at {}", rest[..end].replacen('"', "", 2))
}

/// The compiler's whole `message`, written to a file of its own in the temporary directory
/// when it is more than one line (the error shows its first line); `None` when it is one
/// line or cannot be written.
fn write_full_message(message: &str) -> Option<PathBuf> {
    if message.trim().lines().count() <= 1 {
        return None;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!(
        "tessera-tpu-compiler-{}-{nanos}.txt",
        std::process::id()
    ));
    std::fs::write(&path, message).ok()?;
    Some(path)
}

/// The compiler rejected `culprit`, saying `message`.
fn rejected(culprit: String, message: String) -> TpuCompileError {
    TpuCompileError::Compiler {
        culprit,
        full_message: write_full_message(&message),
        message,
    }
}

/// The compiler's own message of a PJRT error (the whole error for other kinds).
fn compiler_message(e: &RuntimeError) -> String {
    match e {
        RuntimeError::Pjrt { message, .. } => message.trim_end().to_string(),
        e => e.to_string(),
    }
}

/// Finds which kernel the compiler rejects by compiling each alone; when none is rejected
/// alone, the program around them is.
fn blame(topology: &Topology, module: &Module, program_error: &RuntimeError) -> TpuCompileError {
    let kernels = module.tpu_kernel_programs().unwrap_or_default();
    if let Ok(options) = CompileOptions::manual_partitions(1) {
        for (name, alone) in &kernels {
            if let Err(e @ RuntimeError::Pjrt { .. }) = topology.compile(&alone.to_mlir(), &options)
            {
                return rejected(format!("kernel `{name}`"), compiler_message(&e));
            }
        }
    }
    // A kernel accepted alone may still be refused in the program (e.g. out of scoped VMEM
    // beside its neighbours); the compiler then names the custom call by its result shapes.
    let message = compiler_message(program_error);
    let named: Vec<&String> = kernels
        .iter()
        .filter(|(_, alone)| mentions_results(&message, alone))
        .map(|(name, _)| name)
        .collect();
    if let [name] = named.as_slice() {
        return rejected(
            format!("kernel `{name}` (in the program; it compiles alone)"),
            message,
        );
    }
    let culprit = if kernels.is_empty() {
        format!("the program `{}`", module.name())
    } else {
        let names: Vec<String> = kernels.iter().map(|(n, _)| format!("`{n}`")).collect();
        format!(
            "the program `{}` (its kernels {} compile alone)",
            module.name(),
            names.join(", ")
        )
    };
    rejected(culprit, message)
}

/// Whether the compiler's `message` shows a custom call with the results of the kernel
/// program `alone` (HLO text such as `f32[1,2,2048,128]{`).
fn mentions_results(message: &str, alone: &Module) -> bool {
    let Some(main) = alone.get_func("main") else {
        return false;
    };
    let results = main.result_types();
    message.contains("custom-call")
        && !results.is_empty()
        && results.iter().all(|t| {
            let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
            message.contains(&format!("{}[{}]{{", hlo_type(t.dtype), dims.join(",")))
        })
}

/// The HLO name of an element type.
fn hlo_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::I32 => "s32",
        DType::I8 => "s8",
        DType::Bool => "pred",
    }
}

impl CompileReport {
    /// One sentence for each of [`Self::vmem_raises`], for the printed summaries.
    pub fn vmem_raise_notes(&self) -> Vec<String> {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        self.vmem_raises
            .iter()
            .map(|r| {
                format!(
                    "a kernel needed {:.2} MiB of scoped VMEM, over the {:.2} MiB limit \
                     tessera estimated: compiled again with {:.2} MiB",
                    mib(r.asked_bytes),
                    mib(r.limit_bytes),
                    mib(r.raised_bytes)
                )
            })
            .collect()
    }

    /// One JSON object: the topology, devices, kernels, executable bytes, per-device argument,
    /// output, alias, temporary and generated-code bytes, each kernel's scoped VMEM and, when
    /// read, its cost (`kernel_costs`), the scoped VMEM limits libtpu refused and what they
    /// were raised to (`scoped_vmem_raises`), flops and bytes accessed (null when the compiler
    /// does not say), compile seconds.
    pub fn to_json(&self) -> String {
        let opt = |x: Option<f64>| x.map_or("null".to_string(), |x| format!("{x}"));
        let mut json = format!(
            "{{\"topology\":\"{}\",\"devices\":{},\"kernels\":[",
            self.topology, self.devices
        );
        let names: Vec<String> = self.kernels.iter().map(|k| json_string(k)).collect();
        json.push_str(&names.join(","));
        let _ = write!(json, "],\"executable_bytes\":{}", self.executable_bytes);
        if let Some(m) = &self.memory {
            let _ = write!(
                json,
                ",\"argument_bytes\":{},\"output_bytes\":{},\"alias_bytes\":{},\
                 \"temp_bytes\":{},\"generated_code_bytes\":{}",
                m.argument_bytes,
                m.output_bytes,
                m.alias_bytes,
                m.temp_bytes,
                m.generated_code_bytes
            );
        }
        let vmem: Vec<String> = self
            .kernel_vmem
            .iter()
            .map(|(k, b)| format!("{}:{b}", json_string(k)))
            .collect();
        let _ = write!(json, ",\"scoped_vmem_bytes\":{{{}}}", vmem.join(","));
        if let Some(costs) = &self.kernel_costs {
            let costs: Vec<String> = costs.iter().map(|c| c.to_json()).collect();
            let _ = write!(json, ",\"kernel_costs\":[{}]", costs.join(","));
        }
        let raises: Vec<String> = self
            .vmem_raises
            .iter()
            .map(|r| {
                format!(
                    "{{\"asked_bytes\":{},\"limit_bytes\":{},\"raised_bytes\":{}}}",
                    r.asked_bytes, r.limit_bytes, r.raised_bytes
                )
            })
            .collect();
        let _ = write!(json, ",\"scoped_vmem_raises\":[{}]", raises.join(","));
        let _ = write!(
            json,
            ",\"flops\":{},\"bytes_accessed\":{},\"transcendentals\":{},\"optimal_seconds\":{},\
             \"compile_seconds\":{:.3}}}",
            opt(self.flops),
            opt(self.bytes_accessed),
            opt(self.transcendentals),
            opt(self.optimal_seconds),
            self.compile_seconds
        );
        json
    }
}

/// `s` as a JSON string.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            TpuTopology::parse("tpu:v5p:2x2x1").unwrap().topology(),
            "v5p:2x2x1"
        );
        for bad in ["v5p:2x2x1", "tpu:", "gpu:v5p", "tpu:v5p 2x2"] {
            let e = TpuTopology::parse(bad).unwrap_err();
            assert!(e.to_string().contains("expected tpu:TOPOLOGY"), "{e}");
        }
    }

    #[test]
    fn a_custom_call_in_a_compiler_message_is_matched_by_its_results() {
        use tessera_hlo::TensorType;
        let alone = |results: &[&[i64]]| {
            let mut m = Module::new("kernel");
            let mut f = m.func("main");
            let outs: Vec<_> = results
                .iter()
                .map(|d| f.arg(TensorType::new(d.to_vec(), DType::F32)).unwrap())
                .collect();
            f.finish(&outs).unwrap();
            m
        };
        let message = "Ran out of memory in memory space vmem while allocating on stack for \
            %name.4 = (f32[2,1,2,2048,128]{4,3,2,1,0:T(8,128)}, f32[1,2,2048,128]{3,2,1,0:T(8,128)}) \
            custom-call(%copy-done.3), custom_call_target=\"tpu_custom_call\"";
        assert!(mentions_results(
            message,
            &alone(&[&[2, 1, 2, 2048, 128], &[1, 2, 2048, 128]])
        ));
        assert!(!mentions_results(message, &alone(&[&[1, 2, 2048, 1]])));
        assert!(!mentions_results(
            "f32[1,2,2048,128]{",
            &alone(&[&[1, 2, 2048, 128]])
        ));
    }

    #[test]
    fn report_json_is_one_object_and_notes_each_vmem_raise() {
        let r = CompileReport {
            topology: "v5e:2x2".into(),
            devices: 4,
            kernels: vec!["splash_fwd".into(), "a\"b".into()],
            executable_bytes: 10,
            memory: Some(CompiledMemoryStats {
                argument_bytes: 1,
                output_bytes: 2,
                temp_bytes: 3,
                ..Default::default()
            }),
            flops: Some(1.5e9),
            bytes_accessed: None,
            transcendentals: None,
            optimal_seconds: Some(0.5),
            kernel_vmem: vec![("splash_fwd".into(), 4096)],
            kernel_costs: None,
            vmem_raises: vec![ScopedVmemRaise {
                asked_bytes: 16_923_000,
                limit_bytes: 16 << 20,
                raised_bytes: 17 << 20,
            }],
            compile_seconds: 0.25,
        };
        assert_eq!(
            r.to_json(),
            "{\"topology\":\"v5e:2x2\",\"devices\":4,\"kernels\":[\"splash_fwd\",\"a\\\"b\"],\
             \"executable_bytes\":10,\"argument_bytes\":1,\"output_bytes\":2,\"alias_bytes\":0,\
             \"temp_bytes\":3,\"generated_code_bytes\":0,\"scoped_vmem_bytes\":{\"splash_fwd\":4096},\
             \"scoped_vmem_raises\":[{\"asked_bytes\":16923000,\"limit_bytes\":16777216,\
             \"raised_bytes\":17825792}],\"flops\":1500000000,\
             \"bytes_accessed\":null,\"transcendentals\":null,\"optimal_seconds\":0.5,\
             \"compile_seconds\":0.250}"
        );
        assert_eq!(
            r.vmem_raise_notes(),
            [
                "a kernel needed 16.14 MiB of scoped VMEM, over the 16.00 MiB limit tessera \
              estimated: compiled again with 17.00 MiB"
            ]
        );
    }
}
