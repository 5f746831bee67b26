//! Where a kernel runs: the interpreter, or the devices of a PJRT [`Platform`] (cpu, gpu,
//! tpu). The same kernel definition and host arrays go in; host arrays come out.
//!
//! A program with collectives (context parallelism, the train step) runs on a [`Platform`]
//! alone: the interpreter runs kernels only. [`Backend::platform`] says which.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use tessera_dsl::interpret::{self, InterpretOptions};
use tessera_dsl::{
    ArgSpec, DeviceAxis, HostArray, Kernel, KernelDef, KernelError, KernelRules, Lowering,
};
use tessera_hlo::Module;
use tessera_runtime::{Client, CompileOptions, LoadedExecutable, XlaOption};
use tessera_splash::{Executor, SplashError};

pub use tessera_runtime::{Platform, GPU_PLUGIN_ENV};

/// Where a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The host interpreter (the reference).
    Interpret,
    /// StableHLO compiled and run by the XLA CPU PJRT plugin.
    Cpu,
    /// StableHLO compiled and run by a GPU PJRT plugin (the CUDA plugin of the
    /// `jax-cuda12-pjrt` wheel), named by `TESSERA_GPU_PJRT_PLUGIN`.
    Gpu,
    /// The kernel as a Mosaic `tpu_custom_call` compiled by libtpu and run on a TPU chip:
    /// the program `tessera compile kernel` compiles for a topology.
    Tpu,
}

impl Backend {
    /// The backends every machine runs (no accelerator needed).
    pub const ALL: [Backend; 2] = [Backend::Interpret, Backend::Cpu];

    /// Every backend.
    pub const EVERY: [Backend; 4] = [Backend::Interpret, Backend::Cpu, Backend::Gpu, Backend::Tpu];

    pub fn name(self) -> &'static str {
        match self.platform() {
            None => "interpret",
            Some(p) => p.name(),
        }
    }

    /// The PJRT platform whose devices run the kernel; `None` for the interpreter.
    pub fn platform(self) -> Option<Platform> {
        match self {
            Backend::Interpret => None,
            Backend::Cpu => Some(Platform::Cpu),
            Backend::Gpu => Some(Platform::Gpu),
            Backend::Tpu => Some(Platform::Tpu),
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
        match p {
            Platform::Cpu => Backend::Cpu,
            Platform::Gpu => Backend::Gpu,
            Platform::Tpu => Backend::Tpu,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Backend::EVERY
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown backend `{s}`; expected interpret, cpu, gpu or tpu"))
    }
}

/// Splash attention's plans run their kernels on any backend.
impl Executor for Backend {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &KernelRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        run(def, args, *self, rules).map_err(|e| match e {
            RunError::Kernel(k) => SplashError::Kernel(k),
            other => SplashError::Backend(Box::new(other)),
        })
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
    match backend.platform() {
        None => Ok(interpret::run_kernel(
            k,
            args,
            &InterpretOptions::default(),
        )?),
        Some(platform) => {
            let client = platform.client(1).map_err(RunError::Devices)?;
            let mut per_device = compiled(k, platform, &client)?.execute_arrays(&[args])?;
            Ok(per_device.pop().unwrap_or_default())
        }
    }
}

/// Compiles a one-device program for `platform` with the options `tessera compile` compiles
/// it with for a TPU topology ([`crate::tpu::compile_options`]) and runs it on `args`.
pub fn run_program(
    module: &Module,
    platform: Platform,
    args: &[HostArray],
) -> Result<Vec<HostArray>, RunError> {
    let client = platform.client(1).map_err(RunError::Devices)?;
    let exe = client.compile(&module.to_mlir(), &crate::tpu::compile_options(module)?)?;
    Ok(exe.execute_arrays(&[args])?.pop().unwrap_or_default())
}

/// Compiled kernels by platform and IR text: a kernel compiles once per process.
fn executables() -> &'static Mutex<HashMap<String, Arc<LoadedExecutable>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<LoadedExecutable>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The one-device program `k` runs as on `platform`: the kernel alone in a module, lowered
/// as the platform takes kernels ([`tessera_parallel::kernel_lowering`]): on TPU one Mosaic
/// custom call, the program `tessera compile kernel` compiles for a topology; inline
/// StableHLO elsewhere.
pub fn kernel_program(k: &Kernel, platform: Platform) -> Result<Module, KernelError> {
    tessera_parallel::kernel_lowering(platform, &Lowering::portable()).lower_module(k)
}

/// The program a kernel on a device mesh runs as on `platform`: one partition per device
/// (manually sharded), each applying the kernel to its own arguments; on TPU one Mosaic
/// custom call per device that communicates with the others, elsewhere the SPMD lowering
/// (remote copies as `collective_permute`s).
pub fn kernel_spmd_program(k: &Kernel, platform: Platform) -> Result<Module, KernelError> {
    tessera_parallel::kernel_lowering(platform, &Lowering::portable()).lower_module_spmd(k)
}

/// `k` compiled for `platform`'s first device ([`kernel_program`]), on TPU with the options
/// `tessera compile` uses.
fn compiled(
    k: &Kernel,
    platform: Platform,
    client: &Client,
) -> Result<Arc<LoadedExecutable>, RunError> {
    let key = format!("{platform}\n{}", k.to_text());
    if let Some(exe) = executables()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(Arc::clone(exe));
    }
    let module = kernel_program(k, platform)?;
    let options = match platform {
        Platform::Tpu => crate::tpu::compile_options(&module)?,
        Platform::Cpu | Platform::Gpu => compile_options(client),
    };
    let exe = Arc::new(client.compile(&module.to_mlir(), &options)?);
    executables()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, Arc::clone(&exe));
    Ok(exe)
}

/// The options tessera compiles a lowered kernel with for `client`'s device: one device and,
/// on the XLA CPU plugin, `xla_cpu_use_xnnpack=false`. XLA CPU otherwise runs small dots (a
/// 256 x 256 x 256 block product) with XNNPACK, which packs the right operand again at every
/// call, and a kernel's dots take fresh blocks at every grid step: the tiled matmul
/// (2048^3, 256 blocks) used 12% less processor time on XLA's default (oneDNN) dot; splash
/// attention's dots, which XLA never sends to XNNPACK, are unaffected.
pub fn compile_options(client: &Client) -> CompileOptions {
    let options = CompileOptions::single_device();
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
/// missing. A plain `cargo test` compiles the
/// interpret and cpu ones; the facade's own tests say in one line which kinds were left out.
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
    match backend.platform() {
        None => Ok(interpret::run_kernel_on_devices(
            &kernel,
            per_device,
            &InterpretOptions::default(),
        )?),
        // The SPMD program is plain StableHLO on every platform (copies and remote copies
        // have no Mosaic lowering yet, so a TPU runs the portable form too).
        Some(platform) => run_spmd(
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
    let cached = executables()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    let exe = match cached {
        Some(exe) => exe,
        None => {
            let module = kernel_spmd_program(k, platform)?;
            let options = match platform {
                Platform::Tpu => crate::tpu::compile_options(&module)?,
                Platform::Cpu | Platform::Gpu => {
                    let options = CompileOptions::manual_partitions(n)?;
                    if client.platform_name() == "cpu" {
                        options.with_xla_option("xla_cpu_use_xnnpack", XlaOption::Bool(false))
                    } else {
                        options
                    }
                }
            };
            let exe = Arc::new(client.compile(&module.to_mlir(), &options)?);
            executables()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, Arc::clone(&exe));
            exe
        }
    };
    Ok(exe.execute_arrays(per_device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_by_name_and_map_to_platforms() {
        for b in Backend::EVERY {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
            if let Some(p) = b.platform() {
                assert_eq!(Backend::from(p), b);
                assert_eq!(p.name(), b.name());
            }
        }
        let e = Backend::Interpret
            .program_platform("a train step")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the interpreter runs kernels alone, not a train step; choose the cpu, gpu or tpu \
             backend"
        );
    }

    /// The one line a run without GPU and TPU tests prints about them (`test_device!`).
    #[cfg(not(all(feature = "gpu-tests", feature = "tpu-tests")))]
    #[test]
    #[cfg_attr(
        all(not(feature = "gpu-tests"), not(feature = "tpu-tests")),
        ignore = "gpu and tpu device tests not compiled: run `cargo test --features \
                  gpu-tests,tpu-tests` where the devices are"
    )]
    #[cfg_attr(
        all(feature = "gpu-tests", not(feature = "tpu-tests")),
        ignore = "tpu device tests not compiled: run `cargo test --features tpu-tests` on a \
                  TPU VM"
    )]
    #[cfg_attr(
        all(not(feature = "gpu-tests"), feature = "tpu-tests"),
        ignore = "gpu device tests not compiled: run `cargo test --features gpu-tests` where \
                  a GPU is"
    )]
    fn gpu_and_tpu_device_tests() {}
}
