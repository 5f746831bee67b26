//! The kernel registry's machinery: what every kernel family implements to register its
//! kernels ([`KernelInfo`]: parameters, build, f64 reference, flop count, run-time data
//! check, check cases, bench sets, XLA's own program), the bench sizes of `tessera bench
//! kernels` ([`BENCH_SIZES`], written once), and an entry at given parameter values
//! ([`Instance`]: its definition, inputs, reference, flops and one way to run it on any
//! [`Backend`], its run-time data checked first).
//!
//! Each family lists its entries in its own home (`tessera_splash::registry`,
//! `tessera_paged::registry`, `tessera_collective_kernels::registry`, the facade's example
//! kernels); the facade's `registry::KERNELS` puts the lists one after another. This crate
//! sits below every family, so none of them reaches up into the facade to register.
//!
//! Two kinds of parameter: compile-time ones (block sizes, dtype, mask, flags), which change
//! the kernel, and sizes, which only set the default arguments (`tessera ir` instantiates
//! with them; `tessera run` takes sizes from its inputs and checks any size given against
//! them, [`KernelInfo::check_sizes`]). A kernel may run on a device mesh (the collectives:
//! [`KernelInfo::on_mesh`]): its build gives the mesh, each device has its own arguments and
//! outputs, and its reference computes every device's outputs from every device's
//! arguments.

pub mod xla;

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_backend::{self as backend, Backend, RunError};
use tessera_dsl::{
    ArgSpec, DType, DeviceAxis, HostArray, Kernel, KernelDef, KernelError, KernelRules,
};

/// The block sizes the CLI can instantiate (each one a monomorphised kernel).
pub const BLOCK_SIZES: [usize; 7] = [8, 16, 32, 64, 128, 256, 512];

/// A size `tessera bench kernels` sets from the flag of its name (`matmul_size`:
/// `--matmul-size`): a bench parameter written `{name}` takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchSize {
    pub name: &'static str,
    pub default: usize,
    /// The flag's help.
    pub help: &'static str,
}

/// The sizes of `tessera bench kernels`, each written here once: the CLI makes its flags
/// from them and the bench sets of the registered kernels ([`KernelInfo::bench`]) name them.
pub mod bench_size {
    use super::BenchSize;

    pub const MATMUL_SIZE: BenchSize = BenchSize {
        name: "matmul_size",
        default: 2048,
        help: "Square size of the matmuls (the tiled kernel and XLA's dot, the peak)",
    };
    pub const MATMUL_BLOCK: BenchSize = BenchSize {
        name: "matmul_block",
        default: 512,
        help: "Block size of the tiled matmul kernel (all three dims), one of the registry's \
               block sizes",
    };
    pub const SEQ: BenchSize = BenchSize {
        name: "seq",
        default: 4096,
        help: "Sequence length of the attention kernels",
    };
    pub const HEADS: BenchSize = BenchSize {
        name: "heads",
        default: 8,
        help: "Heads of the attention kernels",
    };
    pub const HEAD_DIM: BenchSize = BenchSize {
        name: "head_dim",
        default: 64,
        help: "Head dim of the attention kernels",
    };
    pub const BLOCK: BenchSize = BenchSize {
        name: "block",
        default: 512,
        help: "Query and key block of the splash kernels",
    };
    pub const FLASH_BLOCK: BenchSize = BenchSize {
        name: "flash_block",
        default: 256,
        help: "Query and key block of the example flash attention kernel",
    };
    pub const SOFTMAX_BLOCK: BenchSize = BenchSize {
        name: "softmax_block",
        default: 64,
        help: "Rows per block of the row softmax (over a seq x seq array)",
    };
    pub const KV_PAGES: BenchSize = BenchSize {
        name: "kv_pages",
        default: 128,
        help: "Pages (of 16 tokens) per sequence of paged attention (8 sequences, 32 query \
               heads, 8 KV heads, head dim 128)",
    };
    pub const COLLECTIVE_SIZE: BenchSize = BenchSize {
        name: "collective_size",
        default: 1024,
        help: "Size of the collective kernels on 4 CPU devices: the all-gather's shards are \
               size x size, the all-gather matmul's x and weight size x size (256-blocks; a \
               multiple of 512)",
    };
}

/// Every size of `tessera bench kernels` ([`bench_size`]).
pub const BENCH_SIZES: &[BenchSize] = &[
    bench_size::MATMUL_SIZE,
    bench_size::MATMUL_BLOCK,
    bench_size::SEQ,
    bench_size::HEADS,
    bench_size::HEAD_DIM,
    bench_size::BLOCK,
    bench_size::FLASH_BLOCK,
    bench_size::SOFTMAX_BLOCK,
    bench_size::KV_PAGES,
    bench_size::COLLECTIVE_SIZE,
];

/// A parameter of a built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
    /// For a size parameter, the argument dims it sets as (argument name, dim); empty for a
    /// compile-time parameter. An argument a kernel does not take is skipped.
    pub sets: &'static [(&'static str, usize)],
}

impl ParamInfo {
    /// A compile-time parameter.
    pub const fn compile_time(
        name: &'static str,
        default: &'static str,
        help: &'static str,
    ) -> Self {
        ParamInfo {
            name,
            default,
            help,
            sets: &[],
        }
    }

    /// A size parameter setting the argument dims `sets`.
    pub const fn size(
        name: &'static str,
        default: &'static str,
        help: &'static str,
        sets: &'static [(&'static str, usize)],
    ) -> Self {
        ParamInfo {
            name,
            default,
            help,
            sets,
        }
    }

    /// Whether this parameter is a size (sets argument dims) rather than compile-time.
    pub fn is_size(&self) -> bool {
        !self.sets.is_empty()
    }
}

/// Why a registered kernel could not be built, checked or timed at the given parameters.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("unknown kernel `{name}`; built-in kernels: {}", .known.join(", "))]
    UnknownKernel {
        name: String,
        known: Vec<&'static str>,
    },
    #[error("kernel `{kernel}` has no parameter `{param}`; its parameters: {}", .known.join(", "))]
    UnknownParam {
        kernel: &'static str,
        param: String,
        known: Vec<&'static str>,
    },
    /// A value that does not parse as the parameter's kind.
    #[error("parameter {param}={value}: expected {expected}")]
    BadValue {
        param: String,
        value: String,
        expected: &'static str,
    },
    /// A block size with no monomorphised kernel.
    #[error(
        "parameter {param}={value}: the CLI instantiates block sizes {BLOCK_SIZES:?}; use the \
         library API for other sizes"
    )]
    BlockSize { param: String, value: usize },
    /// A size given beside arguments that say otherwise.
    #[error(
        "parameter {param}={value} disagrees with argument `{arg}` {spec}, whose dim {dim} is \
         {actual}; sizes come from the arguments, so drop {param} or pass arguments of that size"
    )]
    SizeMismatch {
        param: String,
        value: String,
        arg: &'static str,
        /// (Boxed: the error stays small.)
        spec: Box<ArgSpec>,
        dim: usize,
        actual: String,
    },
    /// A bench parameter `{name}` that is none of [`BENCH_SIZES`].
    #[error(
        "kernel `{kernel}`: bench parameter {param}={{{knob}}} names no size of `tessera bench \
         kernels`; known: {}",
        BENCH_SIZES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
    )]
    UnknownKnob {
        kernel: &'static str,
        param: &'static str,
        knob: String,
    },
    /// Arrays that are not the kernel's arguments (count).
    #[error("kernel `{kernel}` takes {expected} arguments, got {got}")]
    Arguments {
        kernel: String,
        expected: usize,
        got: usize,
    },
    #[error("no splash plan runs a kernel named `{kernel}`")]
    NoSplashStage { kernel: String },
    /// The f64 reference cannot be computed from what the kernel takes.
    #[error("the f64 reference of `{kernel}` cannot be computed from {reason}")]
    NoReference {
        kernel: String,
        reason: &'static str,
    },
    /// A kernel family's own error for its parameters (a splash mask that does not parse,
    /// block sizes its rules refuse, ...): the family's typed error as the source.
    #[error(transparent)]
    Family(BoxedError),
    #[error(transparent)]
    Hlo(#[from] tessera_hlo::HloError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// Why [`Instance::run`] gave no outputs: its run-time data check refused the arguments, or
/// the backend failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Inputs(#[from] RegistryError),
    #[error(transparent)]
    Run(#[from] RunError),
}

/// A kernel definition, its default arguments (each device's, for a kernel on a mesh), the
/// values of the arguments the parameters fix (by position; `None` for data) and the device
/// mesh it runs on (empty: one device).
#[derive(Debug, Clone)]
pub struct Built {
    pub def: KernelDef,
    pub args: Vec<ArgSpec>,
    pub fixed: Vec<Option<HostArray>>,
    pub mesh: Vec<DeviceAxis>,
}

impl Built {
    /// A one-device kernel whose arguments are all data.
    pub fn data(def: KernelDef, args: Vec<ArgSpec>) -> Self {
        Self::on_mesh(def, args, Vec::new())
    }

    /// A kernel on the device mesh `mesh` whose arguments are all data.
    pub fn on_mesh(def: KernelDef, args: Vec<ArgSpec>, mesh: Vec<DeviceAxis>) -> Self {
        let fixed = vec![None; args.len()];
        Built {
            def,
            args,
            fixed,
            mesh,
        }
    }
}

pub type BuildFn = fn(&Params, &str) -> Result<Built, RegistryError>;
pub type ReferenceFn = fn(&Params, &str, &[HostArray]) -> Result<Vec<Vec<f64>>, RegistryError>;
/// Every device's outputs from every device's arguments.
pub type MeshReferenceFn =
    fn(&Params, &str, &[Vec<HostArray>]) -> Result<Vec<Vec<Vec<f64>>>, RegistryError>;

/// A kernel's f64 reference, written separately from the kernel.
#[derive(Debug, Clone, Copy)]
pub enum Reference {
    /// A one-device kernel's outputs from its arguments.
    Local(ReferenceFn),
    /// A kernel on a device mesh: every device's outputs from every device's arguments (an
    /// all-gather's output holds the others' inputs).
    Mesh(MeshReferenceFn),
}
pub type FlopsFn = fn(&Params, &str) -> Result<f64, RegistryError>;
pub type InputsFn = fn(&Params, &str, u64) -> Result<Vec<HostArray>, RegistryError>;
/// Checks a call's run-time data before any backend runs it: the values a kernel indexes
/// with (page tables, lengths), which no shape or dtype check sees. Gets the parameters, the
/// kernel's name, every argument's spec (scalar prefetch, then inputs) and, by position, the
/// values at hand: all of them in `tessera run` and [`Instance::run`]; tessera-jax's `call`
/// passes only the scalar-prefetch arguments (the data stays on its device), and under
/// `jax.jit` none; a check checks what it is given. Refuses with the family's sentence
/// ([`RegistryError::Family`]).
pub type CheckInputsFn =
    fn(&Params, &str, &[ArgSpec], &[Option<&HostArray>]) -> Result<(), RegistryError>;
/// XLA's own program for what the kernel computes, from the parameters (what the kernel's
/// code depends on beyond the shapes: a mask), each device's argument specs and the number
/// of devices (one partition per device where more than one).
pub type XlaFn =
    fn(&Params, &[ArgSpec], usize) -> Result<tessera_hlo::Module, tessera_hlo::HloError>;

/// A parameter set a kernel is checked at, and the largest absolute error allowed against
/// its f64 reference (over every output).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub params: &'static [(&'static str, &'static str)],
    pub tol: f64,
}

impl Case {
    /// The parameters as `NAME=VALUE` pairs for [`KernelInfo::instance`].
    pub fn given(&self) -> Vec<(String, String)> {
        owned(self.params)
    }
}

pub fn owned(params: &[(&str, &str)]) -> Vec<(String, String)> {
    params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelInfo {
    pub name: &'static str,
    pub summary: &'static str,
    pub params: &'static [ParamInfo],
    /// Builds from the parameters; gets the kernel's name (one builder serves every splash
    /// kernel).
    pub build: BuildFn,
    /// The kernel's outputs computed in f64 from its arguments, written separately from the
    /// kernel; a [`Reference::Mesh`] one for a kernel that runs on a device mesh.
    pub reference: Reference,
    /// Floating-point operations of one call (on every device together; 0 for a kernel that
    /// only moves data).
    pub flops: FlopsFn,
    /// Arguments whose values the reference is exact for, where random data is not (splash's
    /// residuals); `None`: random data.
    pub inputs: Option<InputsFn>,
    /// XLA's own program for the same computation on the same arguments, written with the
    /// ordinary ops an XLA user writes: `tessera bench kernels` times it beside the kernel.
    pub xla: Option<XlaFn>,
    /// Refuses run-time data the kernel must not be run on (a page index outside the pool):
    /// `tessera run`, [`Instance::run`] (so `tessera demo`) and tessera-jax's `call` call it
    /// before any backend ([`KernelInfo::check_inputs`]); `None`: any values of the right
    /// shapes and dtypes are legal.
    pub check_inputs: Option<CheckInputsFn>,
    /// Where `tessera demo`, the backend tests and the Mosaic tests check the kernel.
    pub cases: &'static [Case],
    /// Where `tessera bench kernels` times it: one row per set (sets differ by dtype); a
    /// value `{knob}` is the bench size of that name ([`BENCH_SIZES`]).
    pub bench: &'static [&'static [(&'static str, &'static str)]],
}

/// Parameter values by name, as given on the command line (defaults filled in).
#[derive(Debug, Clone, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    pub fn bad(&self, name: &str, expected: &'static str) -> RegistryError {
        RegistryError::BadValue {
            param: name.to_string(),
            value: self.0.get(name).cloned().unwrap_or_default(),
            expected,
        }
    }

    /// The value of parameter `name` as given (or its default). Every parameter a kernel
    /// declares has one; a name it does not declare is a bug in its family.
    pub fn get(&self, name: &str) -> &str {
        &self.0[name]
    }

    pub fn usize(&self, name: &str) -> Result<usize, RegistryError> {
        match self.0[name].parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.bad(name, "a positive integer")),
        }
    }

    /// A positive integer, or the value of parameter `other` when the value is its name
    /// (a default such as `BKVC = BKV`).
    pub fn usize_or_same_as(&self, name: &str, other: &str) -> Result<usize, RegistryError> {
        if self.0[name] == other {
            self.usize(other)
        } else {
            self.usize(name)
        }
    }

    pub fn block(&self, name: &str) -> Result<usize, RegistryError> {
        let b = self.usize(name)?;
        if BLOCK_SIZES.contains(&b) {
            Ok(b)
        } else {
            Err(RegistryError::BlockSize {
                param: name.to_string(),
                value: b,
            })
        }
    }

    /// The compute dtype (`DType::compute_from_name`).
    pub fn dtype(&self) -> Result<DType, RegistryError> {
        self.0
            .get("dtype")
            .and_then(|d| DType::compute_from_name(d))
            .ok_or_else(|| self.bad("dtype", "f32 or bf16"))
    }

    pub fn bool(&self, name: &str) -> Result<bool, RegistryError> {
        self.0[name]
            .parse()
            .map_err(|_| self.bad(name, "true or false"))
    }
}

/// Calls `$m!(.. const_value)` with the const matching a run-time block size (one of
/// [`BLOCK_SIZES`], which [`Params::block`] checks).
#[macro_export]
macro_rules! dispatch_block {
    ($value:expr, $m:ident ! ( $($args:tt)* )) => {
        match $value {
            8 => $m!($($args)* 8),
            16 => $m!($($args)* 16),
            32 => $m!($($args)* 32),
            64 => $m!($($args)* 64),
            128 => $m!($($args)* 128),
            256 => $m!($($args)* 256),
            512 => $m!($($args)* 512),
            other => unreachable!("block size {other} passed validation"),
        }
    };
}

/// Checks that `inputs` are as many as `kernel` takes.
pub fn expect_inputs(
    kernel: &str,
    inputs: &[HostArray],
    expected: usize,
) -> Result<(), RegistryError> {
    if inputs.len() == expected {
        return Ok(());
    }
    Err(RegistryError::Arguments {
        kernel: kernel.to_string(),
        expected,
        got: inputs.len(),
    })
}

/// The flops of a kernel that only moves data.
pub fn no_flops(_: &Params, _: &str) -> Result<f64, RegistryError> {
    Ok(0.0)
}

/// Parameters several families share.
pub const DTYPE: ParamInfo = ParamInfo::compile_time("dtype", "f32", "input dtype: f32 or bf16");
pub const BQ: ParamInfo = ParamInfo::compile_time("BQ", "128", "query rows per block");
pub const BKV: ParamInfo = ParamInfo::compile_time("BKV", "128", "keys per block");

impl KernelInfo {
    /// Whether the kernel runs on a device mesh (each device with its own arguments and
    /// outputs; [`Instance::mesh`]) rather than on one device.
    pub fn on_mesh(&self) -> bool {
        matches!(self.reference, Reference::Mesh(_))
    }

    /// Fills defaults and checks names.
    fn params_of(&self, given: &[(String, String)]) -> Result<Params, RegistryError> {
        let mut params = Params::default();
        for p in self.params {
            params.0.insert(p.name.to_string(), p.default.to_string());
        }
        for (name, value) in given {
            if !params.0.contains_key(name) {
                return Err(RegistryError::UnknownParam {
                    kernel: self.name,
                    param: name.clone(),
                    known: self.params.iter().map(|p| p.name).collect(),
                });
            }
            params.0.insert(name.clone(), value.clone());
        }
        Ok(params)
    }

    /// Fills defaults, checks names, and builds the definition and its default arguments.
    pub fn build(
        &self,
        given: &[(String, String)],
    ) -> Result<(KernelDef, Vec<ArgSpec>), RegistryError> {
        let built = (self.build)(&self.params_of(given)?, self.name)?;
        Ok((built.def, built.args))
    }

    /// The kernel at the given parameter values, with its reference, inputs and flop count.
    pub fn instance(&'static self, given: &[(String, String)]) -> Result<Instance, RegistryError> {
        let params = self.params_of(given)?;
        let built = (self.build)(&params, self.name)?;
        Ok(Instance {
            info: self,
            given: given.to_vec(),
            params,
            built,
        })
    }

    /// The kernel at bench parameter set `set` ([`KernelInfo::bench`]), each `{knob}` value
    /// given by `knob` (the bench's flags).
    pub fn bench_instance(
        &'static self,
        set: &[(&'static str, &'static str)],
        knob: impl Fn(&str) -> Option<String>,
    ) -> Result<Instance, RegistryError> {
        let mut given = Vec::with_capacity(set.len());
        for &(param, value) in set {
            let value = match value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
                Some(name) => knob(name).ok_or_else(|| RegistryError::UnknownKnob {
                    kernel: self.name,
                    param,
                    knob: name.to_string(),
                })?,
                None => value.to_string(),
            };
            given.push((param.to_string(), value));
        }
        self.instance(&given)
    }

    /// Runs the entry's run-time data check ([`KernelInfo::check_inputs`], a no-op where it
    /// has none) on a call's arguments: `specs` every argument's, `values` by position those
    /// at hand (`None`: not known here).
    pub fn check_inputs(
        &self,
        given: &[(String, String)],
        specs: &[ArgSpec],
        values: &[Option<&HostArray>],
    ) -> Result<(), RegistryError> {
        match self.check_inputs {
            Some(check) => check(&self.params_of(given)?, self.name, specs, values),
            None => Ok(()),
        }
    }

    /// Checks the size parameters in `given` against the arguments `args` of `def` (as run:
    /// sizes come from the inputs); a size given that disagrees with them is an error naming
    /// the parameter and the argument.
    pub fn check_sizes(
        &self,
        given: &[(String, String)],
        def: &KernelDef,
        args: &[ArgSpec],
    ) -> Result<(), RegistryError> {
        for (name, value) in given {
            let Some(param) = self.params.iter().find(|p| p.name == name) else {
                continue;
            };
            for &(arg, dim) in param.sets {
                let Some(i) = def.args().iter().position(|a| a.name == arg) else {
                    continue;
                };
                let Some(spec) = args.get(i) else { continue };
                let actual = spec.shape.get(dim).map(ToString::to_string);
                if actual.as_deref() != Some(value.as_str()) {
                    return Err(RegistryError::SizeMismatch {
                        param: name.clone(),
                        value: value.clone(),
                        arg: def.args()[i].name,
                        spec: Box::new(spec.clone()),
                        dim,
                        actual: actual.unwrap_or_else(|| "missing".into()),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A registered kernel at given parameter values: its definition and default arguments, and
/// what checks and times it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub info: &'static KernelInfo,
    /// The parameters given (the others at their defaults).
    given: Vec<(String, String)>,
    params: Params,
    built: Built,
}

impl Instance {
    /// The parameters given, `NAME=VALUE ...` (the others at their defaults).
    pub fn label(&self) -> String {
        let shown: Vec<String> = self.given.iter().map(|(k, v)| format!("{k}={v}")).collect();
        shown.join(" ")
    }

    pub fn def(&self) -> &KernelDef {
        &self.built.def
    }

    /// The default arguments (scalar prefetch, then inputs).
    pub fn args(&self) -> &[ArgSpec] {
        &self.built.args
    }

    /// The dtype parameter (every registered kernel has one).
    pub fn dtype(&self) -> Result<DType, RegistryError> {
        self.params.dtype()
    }

    /// The device mesh the kernel runs on: its axes with their sizes (empty: one device).
    pub fn mesh(&self) -> &[DeviceAxis] {
        &self.built.mesh
    }
    /// The devices one call runs on (1 for a one-device kernel).
    pub fn devices(&self) -> usize {
        self.built.mesh.iter().map(|a| a.size).product()
    }
    /// The kernel instantiated for its default arguments on its mesh under `rules`.
    pub fn instantiate(&self, rules: &KernelRules) -> Result<Arc<Kernel>, KernelError> {
        self.built
            .def
            .instantiate_on(&self.built.args, &self.built.mesh, rules)
    }
    /// Each device's arguments for the default specs (one list for a one-device kernel) whose
    /// values the reference is exact for (splash's backward kernels get a forward's
    /// residuals); the arguments the parameters fix keep their values. Deterministic in
    /// `seed`; the devices' data differ.
    pub fn inputs(&self, seed: u64) -> Result<Vec<Vec<HostArray>>, RegistryError> {
        (0..self.devices() as u64)
            .map(|d| match self.info.inputs {
                Some(f) => f(&self.params, self.info.name, seed + 1000 * d),
                None => Ok(self.device_random_inputs(seed + 1000 * d)),
            })
            .collect()
    }
    /// Each device's random arguments for the default specs (floats uniform in [-1, 1),
    /// integers 0); the arguments the parameters fix keep their values. For timing.
    pub fn random_inputs(&self, seed: u64) -> Vec<Vec<HostArray>> {
        (0..self.devices() as u64)
            .map(|d| self.device_random_inputs(seed + 1000 * d))
            .collect()
    }
    fn device_random_inputs(&self, seed: u64) -> Vec<HostArray> {
        self.built
            .args
            .iter()
            .zip(&self.built.fixed)
            .enumerate()
            .map(|(i, (spec, fixed))| match fixed {
                Some(a) => a.clone(),
                None if spec.dtype.is_float() => {
                    HostArray::random(spec.dtype, spec.shape.clone(), seed + i as u64)
                }
                None => HostArray::zeros(spec.dtype, spec.shape.clone()),
            })
            .collect()
    }
    /// Whether argument `i` is fixed by the parameters (a table) rather than data.
    pub fn is_fixed(&self, i: usize) -> bool {
        self.built.fixed.get(i).is_some_and(Option::is_some)
    }
    /// Each device's outputs for `inputs` (each device's arguments), computed in f64 by the
    /// reference.
    pub fn reference(
        &self,
        inputs: &[Vec<HostArray>],
    ) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
        match self.info.reference {
            Reference::Local(f) => inputs
                .iter()
                .map(|x| f(&self.params, self.info.name, x))
                .collect(),
            Reference::Mesh(f) => f(&self.params, self.info.name, inputs),
        }
    }
    /// XLA's own program computing what the kernel does, on the same arguments (each
    /// device's, in a program of one partition per device for a kernel on a mesh); `None`
    /// where the registry has none.
    pub fn xla_program(&self) -> Option<Result<tessera_hlo::Module, RegistryError>> {
        let f = self.info.xla?;
        Some(f(&self.params, &self.built.args, self.devices()).map_err(RegistryError::from))
    }
    /// Floating-point operations of one call at the default arguments, on every device
    /// together (0 for a kernel that only moves data).
    pub fn flops(&self) -> Result<f64, RegistryError> {
        (self.info.flops)(&self.params, self.info.name)
    }
    /// Checks each device's arguments `inputs` with the entry's run-time data check
    /// ([`KernelInfo::check_inputs`]; every value at hand).
    pub fn check_inputs(&self, inputs: &[Vec<HostArray>]) -> Result<(), RegistryError> {
        let Some(check) = self.info.check_inputs else {
            return Ok(());
        };
        for device in inputs {
            let specs: Vec<ArgSpec> = device.iter().map(ArgSpec::of).collect();
            let values: Vec<Option<&HostArray>> = device.iter().map(Some).collect();
            check(&self.params, self.info.name, &specs, &values)?;
        }
        Ok(())
    }
    /// Runs the kernel on `backend` under `rules`: `inputs[d]` are device `d`'s arguments;
    /// returns each device's outputs. The entry's run-time data check
    /// ([`Instance::check_inputs`]) runs first, on every backend; then a one-device kernel
    /// runs as [`backend::run`], a kernel on a mesh as [`backend::run_on_devices`].
    pub fn run(
        &self,
        inputs: &[Vec<HostArray>],
        backend: Backend,
        rules: &KernelRules,
    ) -> Result<Vec<Vec<HostArray>>, CallError> {
        self.check_inputs(inputs)?;
        Ok(match (self.built.mesh.is_empty(), inputs) {
            (true, [one]) => vec![backend::run(&self.built.def, one, backend, rules)?],
            _ => {
                backend::run_on_devices(&self.built.def, &self.built.mesh, inputs, backend, rules)?
            }
        })
    }
    /// The largest absolute difference between `outputs` (each device's, of a run on
    /// `inputs`) and the reference, over every device and output (NaN counts as the
    /// largest).
    pub fn max_error(
        &self,
        inputs: &[Vec<HostArray>],
        outputs: &[Vec<HostArray>],
    ) -> Result<f64, RegistryError> {
        let want = self.reference(inputs)?;
        let count = |o: &[Vec<_>]| o.iter().map(Vec::len).collect::<Vec<_>>();
        let got_counts: Vec<usize> = outputs.iter().map(Vec::len).collect();
        if count(&want) != got_counts {
            return Err(RegistryError::Arguments {
                kernel: self.info.name.to_string(),
                expected: want.iter().map(Vec::len).sum(),
                got: got_counts.iter().sum(),
            });
        }
        Ok(outputs
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(got, want)| max_abs_diff(&got.to_f64_vec(), want).0)
            .fold(0.0, |a: f64, b| if b.is_nan() || b > a { b } else { a }))
    }
}

/// Checks a family's entries, panicking with the kernel and parameters at the first gap:
/// every entry has cases and bench sets, each case builds and instantiates under the TPU
/// rules with inputs that match its argument specs (one list per device), a reference with
/// one output per kernel output and a flop count, and every bench set resolves its sizes
/// ([`BENCH_SIZES`]) and builds. For a family's tests (each family runs it on its list; the
/// facade on the whole table).
pub fn check_family(kernels: &'static [KernelInfo]) {
    for info in kernels {
        assert!(!info.cases.is_empty(), "{}: no cases", info.name);
        assert!(!info.bench.is_empty(), "{}: no bench parameters", info.name);
        for case in info.cases {
            let inst = info
                .instance(&case.given())
                .unwrap_or_else(|e| panic!("{} {:?}: {e}", info.name, case.params));
            assert!(case.tol > 0.0);
            let inputs = inst.inputs(1).unwrap();
            assert_eq!(inputs.len(), inst.devices(), "{}", info.name);
            assert_eq!(info.on_mesh(), !inst.mesh().is_empty(), "{}", info.name);
            for device in &inputs {
                assert_eq!(device.len(), inst.args().len(), "{}", info.name);
                for (a, spec) in device.iter().zip(inst.args()) {
                    assert_eq!(&ArgSpec::of(a), spec, "{}", info.name);
                }
            }
            let outputs = inst
                .instantiate(&KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{} {:?}: {e}", info.name, case.params))
                .caller_outputs()
                .map(|(_, o)| o.array_shape.iter().product::<usize>())
                .collect::<Vec<_>>();
            for want in inst.reference(&inputs).unwrap() {
                let want: Vec<usize> = want.iter().map(Vec::len).collect();
                assert_eq!(want, outputs, "{} {:?}", info.name, case.params);
            }
            // 0: a kernel that only moves data.
            assert!(inst.flops().unwrap() >= 0.0, "{}", info.name);
        }
        for set in info.bench {
            // Small values for every knob: the sets resolve and build.
            let knob = |name: &str| -> Option<String> {
                BENCH_SIZES.iter().any(|s| s.name == name).then(|| {
                    match name {
                        "heads" => "2",
                        "head_dim" => "64",
                        "collective_size" => "512",
                        _ => "128",
                    }
                    .to_string()
                })
            };
            info.bench_instance(set, knob)
                .unwrap_or_else(|e| panic!("{} bench: {e}", info.name));
        }
    }
}

/// A family's own error, boxed ([`RegistryError::Family`]).
pub type BoxedError = Box<dyn std::error::Error + Send + Sync>;

/// The largest absolute difference between `got` and `want` and where it is (NaN counts as
/// the largest).
pub fn max_abs_diff(got: &[f64], want: &[f64]) -> (f64, usize) {
    got.iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| ((g - w).abs(), i))
        .fold(
            (0.0, 0),
            |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a },
        )
}
