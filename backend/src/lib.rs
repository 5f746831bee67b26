//! Where a kernel runs: the interpreter, or the devices of a PJRT [`Platform`] (cpu, gpu,
//! tpu). The same kernel definition and host arrays go in; host arrays come out.
//!
//! [`Backend`] is the one device type of tessera: `Interpret` or `Pjrt(platform)`, listed
//! once in [`Backend::ALL`]. Splash attention's plans, the registry's runner, `tessera run`,
//! the examples and tessera-jax all run kernels through it. A program with collectives
//! (context parallelism, the train step) runs on a [`Platform`] alone: the interpreter runs
//! kernels only ([`Backend::program_platform`] says which).
//!
//! Below the kernels that use it (splash) and above what it drives (the kernel IR and its
//! lowerings in `tessera-dsl`, the PJRT binding in `tessera-runtime`).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use tessera_dsl::interpret::{self, InterpretOptions};
use tessera_dsl::{
    ArgSpec, DeviceAxis, HostArray, Kernel, KernelDef, KernelError, KernelLowering, KernelRules,
    Lowering,
};
use tessera_hlo::Module;
use tessera_runtime::{Client, CompileOptions, LoadedExecutable, XlaOption};

pub use tessera_runtime::{Platform, GPU_PLUGIN_ENV};

/// Where a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The host interpreter (the reference).
    Interpret,
    /// The devices of a PJRT plugin: on cpu and gpu the kernel lowered to StableHLO and
    /// compiled by XLA; on tpu the kernel as a Mosaic `tpu_custom_call` compiled by libtpu
    /// (the program `tessera compile kernel` compiles for a topology).
    Pjrt(Platform),
}

impl Backend {
    /// The XLA CPU plugin: every machine has it.
    pub const CPU: Backend = Backend::Pjrt(Platform::Cpu);
    /// A GPU PJRT plugin (the CUDA plugin of the `jax-cuda12-pjrt` wheel), named by
    /// [`GPU_PLUGIN_ENV`].
    pub const GPU: Backend = Backend::Pjrt(Platform::Gpu);
    /// libtpu and this machine's TPU chips.
    pub const TPU: Backend = Backend::Pjrt(Platform::Tpu);

    /// Every backend: the interpreter, then every platform of [`Platform::ALL`].
    pub const ALL: [Backend; 4] = [Backend::Interpret, Backend::CPU, Backend::GPU, Backend::TPU];

    /// The backends of [`Backend::ALL`] that every machine runs (no accelerator needed): the
    /// interpreter and the CPU plugin.
    pub fn everywhere() -> impl Iterator<Item = Backend> {
        Backend::ALL.into_iter().filter(|b| b.runs_everywhere())
    }

    /// Whether every machine runs this backend (it needs no accelerator).
    pub fn runs_everywhere(self) -> bool {
        matches!(self, Backend::Interpret | Backend::Pjrt(Platform::Cpu))
    }

    /// `interpret`, or the platform's name (`cpu`, `gpu`, `tpu`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Interpret => "interpret",
            Backend::Pjrt(p) => p.name(),
        }
    }

    /// The PJRT platform whose devices run the kernel; `None` for the interpreter.
    pub fn platform(self) -> Option<Platform> {
        match self {
            Backend::Interpret => None,
            Backend::Pjrt(p) => Some(p),
        }
    }

    /// The platform of a program with collectives (`what` it is, for the message): the
    /// interpreter runs kernels alone.
    pub fn program_platform(self, what: &'static str) -> Result<Platform, RunError> {
        self.platform().ok_or(RunError::KernelsOnly { what })
    }
}

impl From<Platform> for Backend {
    fn from(p: Platform) -> Self {
        Backend::Pjrt(p)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend name that is none of [`Backend::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{name}`; expected {}", backend_names())]
pub struct UnknownBackend {
    pub name: String,
}

/// `interpret, cpu, gpu or tpu`, from [`Backend::ALL`].
fn backend_names() -> String {
    let names: Vec<_> = Backend::ALL.iter().map(|b| b.name()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

impl FromStr for Backend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend { name: s.into() })
    }
}

/// Why a kernel could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The platform's devices could not be had (none on this machine, too few, ...).
    #[error(transparent)]
    Devices(tessera_runtime::Error),
    /// (The message includes the cause, so it is not also a `source`: a chain printer would
    /// repeat it.)
    #[error("XLA runtime: {0}")]
    Runtime(tessera_runtime::Error),
    /// The interpreter was asked to run a program with collectives.
    #[error("the interpreter runs kernels alone, not {what}; choose the cpu, gpu or tpu backend")]
    KernelsOnly { what: &'static str },
}

impl From<tessera_runtime::Error> for RunError {
    fn from(e: tessera_runtime::Error) -> Self {
        RunError::Runtime(e)
    }
}

/// The lowering the kernels of a program that runs on `platform` are built for, starting from
/// `lowering`: on TPU, Mosaic `tpu_custom_call`s (the program `tessera compile` compiles for a
/// topology; [`Lowering::tpu`] unless `lowering` already lowers to Mosaic), elsewhere inline
/// StableHLO (`lowering` itself, or its rules with inline lowering when it asked for Mosaic:
/// the XLA CPU and GPU compilers do not know the custom call).
pub fn kernel_lowering(platform: Platform, lowering: &Lowering) -> Lowering {
    match (platform.takes_mosaic_kernels(), lowering.kernels) {
        (true, KernelLowering::Mosaic) | (false, KernelLowering::Inline) => lowering.clone(),
        (true, KernelLowering::Inline) => Lowering::tpu(),
        (false, KernelLowering::Mosaic) => Lowering::inline(lowering.rules.clone()),
    }
}

/// Runs `def` on `args` (scalar prefetch, then inputs) on `backend`, instantiated under
/// `rules` (TPU rules by default, so what runs here also compiles for TPU).
pub fn run(
    def: &KernelDef,
    args: &[HostArray],
    backend: Backend,
    rules: &KernelRules,
) -> Result<Vec<HostArray>, RunError> {
    let specs: Vec<_> = args.iter().map(ArgSpec::of).collect();
    let kernel = def.instantiate(&specs, rules)?;
    run_kernel(&kernel, args, backend)
}

/// Runs an instantiated kernel on `backend`.
pub fn run_kernel(
    k: &Kernel,
    args: &[HostArray],
    backend: Backend,
) -> Result<Vec<HostArray>, RunError> {
    match backend {
        Backend::Interpret => Ok(interpret::run_kernel(
            k,
            args,
            &InterpretOptions::default(),
        )?),
        Backend::Pjrt(platform) => {
            let client = platform.client(1).map_err(RunError::Devices)?;
            let mut per_device = compiled(k, platform, &client)?.execute_arrays(&[args])?;
            let mut outputs = per_device.pop().unwrap_or_default();
            tessera_dsl::checks::take_failure(k, &mut outputs)?;
            Ok(outputs)
        }
    }
}

/// Compiles a one-device program for `platform` with the options `tessera compile` compiles
/// it with for a TPU topology ([`tpu_compile_options`]) and runs it on `args`.
pub fn run_program(
    module: &Module,
    platform: Platform,
    args: &[HostArray],
) -> Result<Vec<HostArray>, RunError> {
    let client = platform.client(1).map_err(RunError::Devices)?;
    let exe = client.compile(&module.to_mlir(), &tpu_compile_options(module)?)?;
    Ok(exe.execute_arrays(&[args])?.pop().unwrap_or_default())
}

/// The options a program compiles with for TPU, for a topology or for chips
/// ([`run_program`]): its partitions, manually sharded; Shardy's partitioner for a program
/// with a mesh (Shardy's form, `sdy.manual_computation`).
pub fn tpu_compile_options(module: &Module) -> Result<CompileOptions, tessera_runtime::Error> {
    Ok(
        CompileOptions::manual_partitions(module.num_partitions() as usize)?
            .with_shardy(!module.mesh().is_empty()),
    )
}

/// Compiled kernels by platform and IR text: a kernel compiles once per process.
fn executables() -> &'static Mutex<HashMap<String, Arc<LoadedExecutable>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<LoadedExecutable>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The executable cached under `key`, or `compile()`'s, cached.
fn cached(
    key: String,
    compile: impl FnOnce() -> Result<LoadedExecutable, RunError>,
) -> Result<Arc<LoadedExecutable>, RunError> {
    let cache = executables();
    if let Some(exe) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Arc::clone(exe));
    }
    let exe = Arc::new(compile()?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, Arc::clone(&exe));
    Ok(exe)
}

/// The one-device program `k` runs as on `platform`: the kernel alone in a module, lowered
/// as the platform takes kernels ([`kernel_lowering`]): on TPU one Mosaic custom call, the
/// program `tessera compile kernel` compiles for a topology; inline StableHLO elsewhere.
pub fn kernel_program(k: &Kernel, platform: Platform) -> Result<Module, KernelError> {
    kernel_lowering(platform, &Lowering::portable()).lower_module(k)
}

/// The program a kernel on a device mesh runs as on `platform`: one partition per device
/// (manually sharded), each applying the kernel to its own arguments; on TPU one Mosaic
/// custom call per device that communicates with the others, elsewhere the SPMD lowering
/// (remote copies as `collective_permute`s).
pub fn kernel_spmd_program(k: &Kernel, platform: Platform) -> Result<Module, KernelError> {
    kernel_lowering(platform, &Lowering::portable()).lower_module_spmd(k)
}

/// `k` compiled for `platform`'s first device ([`kernel_program`]), on TPU with the options
/// `tessera compile` uses.
fn compiled(
    k: &Kernel,
    platform: Platform,
    client: &Client,
) -> Result<Arc<LoadedExecutable>, RunError> {
    cached(format!("{platform}\n{}", k.to_text()), || {
        let module = kernel_program(k, platform)?;
        let options = match platform {
            Platform::Tpu => tpu_compile_options(&module)?,
            Platform::Cpu | Platform::Gpu => compile_options(client),
        };
        Ok(client.compile(&module.to_mlir(), &options)?)
    })
}

/// The options tessera compiles a lowered kernel with for `client`'s device: one device and,
/// on the XLA CPU plugin, `xla_cpu_use_xnnpack=false`. XLA CPU otherwise runs small dots (a
/// 256 x 256 x 256 block product) with XNNPACK, which packs the right operand again at every
/// call, and a kernel's dots take fresh blocks at every grid step: the tiled matmul
/// (2048^3, 256 blocks) used 12% less processor time on XLA's default (oneDNN) dot; splash
/// attention's dots, which XLA never sends to XNNPACK, are unaffected.
pub fn compile_options(client: &Client) -> CompileOptions {
    without_xnnpack_on_cpu(CompileOptions::single_device(), client)
}

/// `options` with `xla_cpu_use_xnnpack=false` on the XLA CPU plugin ([`compile_options`]
/// says why).
fn without_xnnpack_on_cpu(options: CompileOptions, client: &Client) -> CompileOptions {
    if client.platform_name() == "cpu" {
        options.with_xla_option("xla_cpu_use_xnnpack", XlaOption::Bool(false))
    } else {
        options
    }
}

/// One `#[test]` per device kind: `test_device!(check: interpret, cpu, gpu, tpu)` makes the
/// module `check` with the tests `check::interpret`, `check::cpu`, `check::gpu` and
/// `check::tpu`, each calling `check(kind)`, where `kind` is parsed from its name into
/// `check`'s parameter type (a [`Backend`], or a [`Platform`] for programs the interpreter
/// does not run). A GPU or TPU run reports each test on its own (candle's `test_device!`).
///
/// The `gpu` and `tpu` tests exist only in builds with the using crate's `gpu-tests` and
/// `tpu-tests` features (which it declares, `gpu-tests = []`; `cargo test --features
/// tpu-tests` on a TPU VM): without the device they fail, with the sentence that says what is
/// missing. A plain `cargo test` compiles the interpret and cpu ones; the facade's own tests
/// say in one line which kinds were left out.
#[macro_export]
macro_rules! test_device {
    ($test:ident: $($kind:ident),+ $(,)?) => {
        mod $test {
            $($crate::test_device!(@kind $test $kind);)+
        }
    };
    (@kind $test:ident gpu) => {
        #[cfg(feature = "gpu-tests")]
        #[test]
        fn gpu() {
            super::$test("gpu".parse().expect("gpu names a device kind"))
        }
    };
    (@kind $test:ident tpu) => {
        #[cfg(feature = "tpu-tests")]
        #[test]
        fn tpu() {
            super::$test("tpu".parse().expect("tpu names a device kind"))
        }
    };
    (@kind $test:ident $kind:ident) => {
        #[test]
        fn $kind() {
            super::$test(stringify!($kind).parse().expect("a device kind"))
        }
    };
}

/// Runs a kernel that runs on a device mesh (`mesh`: its axes with their sizes) on every
/// device: `per_device[d]` are device `d`'s arguments; returns each device's outputs. The
/// interpreter runs the devices as interleaved instances; the StableHLO backends compile
/// one SPMD program with a partition per device, remote copies as `collective_permute`s.
pub fn run_on_devices(
    def: &KernelDef,
    mesh: &[DeviceAxis],
    per_device: &[Vec<HostArray>],
    backend: Backend,
    rules: &KernelRules,
) -> Result<Vec<Vec<HostArray>>, RunError> {
    let first = per_device.first().map(Vec::as_slice).unwrap_or_default();
    let specs: Vec<_> = first.iter().map(ArgSpec::of).collect();
    let kernel = def.instantiate_on(&specs, mesh, rules)?;
    let n = kernel.num_devices();
    match backend {
        Backend::Interpret => Ok(interpret::run_kernel_on_devices(
            &kernel,
            per_device,
            &InterpretOptions::default(),
        )?),
        // The SPMD program is plain StableHLO on every platform (copies and remote copies
        // have no Mosaic lowering yet, so a TPU runs the portable form too).
        Backend::Pjrt(platform) => run_spmd(
            &kernel,
            per_device,
            platform,
            &platform.client(n).map_err(RunError::Devices)?,
        ),
    }
}

fn run_spmd(
    k: &Kernel,
    per_device: &[Vec<HostArray>],
    platform: Platform,
    client: &Client,
) -> Result<Vec<Vec<HostArray>>, RunError> {
    let n = k.num_devices();
    let key = format!("{}\nspmd {n}\n{}", client.platform_name(), k.to_text());
    let exe = cached(key, || {
        let module = kernel_spmd_program(k, platform)?;
        let options = match platform {
            Platform::Tpu => tpu_compile_options(&module)?,
            Platform::Cpu | Platform::Gpu => {
                without_xnnpack_on_cpu(CompileOptions::manual_partitions(n)?, client)
            }
        };
        Ok(client.compile(&module.to_mlir(), &options)?)
    })?;
    let mut outputs = exe.execute_arrays(per_device)?;
    for device_outputs in &mut outputs {
        tessera_dsl::checks::take_failure(k, device_outputs)?;
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_by_name_and_map_to_platforms() {
        let platforms: Vec<_> = Backend::ALL.iter().filter_map(|b| b.platform()).collect();
        assert_eq!(
            platforms,
            Platform::ALL,
            "Backend::ALL lists every platform once"
        );
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
            if let Some(p) = b.platform() {
                assert_eq!(Backend::from(p), b);
                assert_eq!(p.name(), b.name());
            }
        }
        assert_eq!(
            Backend::everywhere().collect::<Vec<_>>(),
            [Backend::Interpret, Backend::CPU]
        );
        assert_eq!(
            "cuda".parse::<Backend>().unwrap_err().to_string(),
            "unknown backend `cuda`; expected interpret, cpu, gpu or tpu"
        );
        let e = Backend::Interpret
            .program_platform("a train step")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the interpreter runs kernels alone, not a train step; choose the cpu, gpu or tpu \
             backend"
        );
    }

    #[test]
    fn tpu_takes_mosaic_and_the_others_inline_kernels() {
        let budget = KernelRules::tpu().with_vmem_limit(1 << 20);
        let tpu = Lowering {
            rules: budget.clone(),
            ..Lowering::tpu()
        };
        assert_eq!(kernel_lowering(Platform::Tpu, &tpu), tpu);
        assert_eq!(
            kernel_lowering(Platform::Tpu, &Lowering::portable()),
            Lowering::tpu()
        );
        for p in [Platform::Cpu, Platform::Gpu] {
            assert_eq!(
                kernel_lowering(p, &tpu),
                Lowering::inline(budget.clone()),
                "{p}"
            );
            assert_eq!(
                kernel_lowering(p, &Lowering::portable()),
                Lowering::portable()
            );
        }
    }
}
