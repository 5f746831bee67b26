//! Running kernels on a backend: the interpreter, or StableHLO through the XLA runtime
//! (PJRT CPU plugin). The same kernel definition and host arrays go in; host arrays come out.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use tessera_dsl::interpret::{self, InterpretOptions};
use tessera_dsl::{ArgSpec, DeviceAxis, HostArray, Kernel, KernelDef, KernelError, TargetRules};
use tessera_runtime::{Client, CompileOptions, LoadedExecutable, XlaOption};
use tessera_splash::{Executor, SplashError};

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
}

/// The variable that names the GPU PJRT plugin library.
pub const GPU_PLUGIN_VAR: &str = "TESSERA_GPU_PJRT_PLUGIN";

impl Backend {
    /// The backends every machine runs (no accelerator needed): what tests cover.
    pub const ALL: [Backend; 2] = [Backend::Interpret, Backend::Cpu];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Interpret => "interpret",
            Backend::Cpu => "cpu",
            Backend::Gpu => "gpu",
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
        match s {
            "interpret" => Ok(Backend::Interpret),
            "cpu" => Ok(Backend::Cpu),
            "gpu" => Ok(Backend::Gpu),
            other => Err(format!(
                "unknown backend `{other}`; expected interpret, cpu or gpu"
            )),
        }
    }
}

/// Splash attention's plans run their kernels on any backend.
impl Executor for Backend {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &TargetRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        run(def, args, *self, rules).map_err(|e| match e {
            RunError::Kernel(k) => SplashError::Kernel(k),
            other => SplashError::Backend(other.to_string()),
        })
    }
}

/// Why a kernel could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// (The message includes the cause, so it is not also a `source`: a chain printer would
    /// repeat it.)
    #[error("XLA runtime: {0}")]
    Runtime(tessera_runtime::Error),
    #[error(
        "the gpu backend needs a CUDA PJRT plugin: install the wheel (`pip install \
         jax-cuda12-pjrt jax-cuda12-plugin[with-cuda]`) and set {GPU_PLUGIN_VAR} to its \
         xla_cuda_plugin.so"
    )]
    NoGpuPlugin,
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
    rules: &TargetRules,
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
        Backend::Cpu => run_on(k, args, &Client::cpu_shared(1)?),
        Backend::Gpu => run_on(k, args, &gpu_client()?),
    }
}

/// One client of the GPU plugin per process (creating one initialises CUDA).
fn gpu_client() -> Result<Client, RunError> {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let path = std::env::var_os(GPU_PLUGIN_VAR).ok_or(RunError::NoGpuPlugin)?;
    let plugin = tessera_runtime::Plugin::load(path)?;
    let client = Client::new(plugin, &[])?;
    Ok(CLIENT.get_or_init(|| client).clone())
}

/// Compiled kernels by IR text: a kernel compiles once per process.
fn executables() -> &'static Mutex<HashMap<String, Arc<LoadedExecutable>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<LoadedExecutable>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn compiled(k: &Kernel, client: &Client) -> Result<Arc<LoadedExecutable>, RunError> {
    let key = format!("{}\n{}", client.platform_name(), k.to_text());
    if let Some(exe) = executables()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(Arc::clone(exe));
    }
    let module = tessera_dsl::stablehlo::lower_module(k)?;
    let exe = Arc::new(client.compile(&module.to_mlir(), &compile_options(client))?);
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

fn run_on(k: &Kernel, args: &[HostArray], client: &Client) -> Result<Vec<HostArray>, RunError> {
    let mut per_device = compiled(k, client)?.execute_arrays(&[args])?;
    Ok(per_device.pop().unwrap_or_default())
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
    rules: &TargetRules,
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
        Backend::Cpu => run_spmd(&kernel, per_device, &Client::cpu_shared(n)?),
        Backend::Gpu => run_spmd(&kernel, per_device, &gpu_client()?),
    }
}

fn run_spmd(
    k: &Kernel,
    per_device: &[Vec<HostArray>],
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
            let module = tessera_dsl::stablehlo::lower_module_spmd(k)?;
            let mut options = CompileOptions::manual_partitions(n)?;
            if client.platform_name() == "cpu" {
                options = options.with_xla_option("xla_cpu_use_xnnpack", XlaOption::Bool(false));
            }
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
