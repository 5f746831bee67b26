//! `tessera_jax._tessera`: the tessera library as a Python extension module, for the
//! `tessera_jax` package (python/tessera_jax), which turns each kernel call into a JAX
//! primitive.
//!
//! It calls the library directly (no subprocess, no command line):
//! - the kernel registry (`tessera::registry`: names, parameters, definitions);
//! - instantiation (`KernelDef::instantiate`) under the portable rules for the StableHLO
//!   lowering (`tessera::dsl::stablehlo::lower_module`) and the output shapes, and under the
//!   TPU rules for the Mosaic custom call (`Lowering::mosaic_call`);
//! - splash attention's plans (`SplashAttention::forward_plan` / `backward_plan`): the kernel
//!   stages with their constant tables;
//! - the interpreter (`tessera::backend::run` with `Backend::Interpret`), tessera's reference
//!   run of a kernel;
//! - libtpu's provisioning (`tessera::runtime::libtpu_path`), so that JAX compiles with the
//!   libtpu tessera pins.
//!
//! Arrays cross as `(bytes, shape, dtype name)` (little-endian, row-major; the Python side
//! wraps them as numpy arrays), converted by the runtime's one `HostArray` <-> bytes
//! conversion (`HostBuffer`). Every tessera error becomes `tessera_jax.TesseraError` with
//! tessera's own message.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use tessera::backend::{self, Backend};
use tessera::dsl::ir::OperandRole;
use tessera::dsl::{
    ArgSpec, CallFacts, DType, DeviceAxis, HostArray, KernelDef, KernelRules, Lowering,
};
use tessera::registry::{self, KernelInfo};
use tessera::runtime::{ElementType, HostBuffer};
use tessera::splash::{
    stage_specs, BlockSizes, Dims, Features, Mask, SplashAttention, SplashOptions, Stage, StageArg,
    Tensor,
};

create_exception!(
    tessera_jax,
    TesseraError,
    PyException,
    "An error from tessera (a parameter, a block that does not tile, a VMEM overflow, ...); \
     the message is tessera's."
);

/// `e` as a Python `TesseraError` carrying tessera's message.
fn error(e: impl std::fmt::Display) -> PyErr {
    TesseraError::new_err(e.to_string())
}

/// A host array from Python: `(bytes, shape, dtype)`.
type PyArray<'py> = (Bound<'py, PyBytes>, Vec<usize>, String);
/// A host array for Python: `(bytes, shape, dtype)`.
type ToPyArray<'py> = (Bound<'py, PyBytes>, Vec<usize>, &'static str);
/// An operand for Python: `(name, role, shape, dtype)`.
type OperandInfo = (String, String, Vec<usize>, &'static str);

fn dtype_named(name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        error(format!(
            "unknown dtype `{name}`; tessera takes {}",
            names.join(", ")
        ))
    })
}

fn to_host(bytes: &[u8], shape: &[usize], dtype: &str) -> PyResult<HostArray> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let buffer = HostBuffer::from_bytes(
        ElementType::from(dtype_named(dtype)?),
        &dims,
        bytes.to_vec(),
    )
    .map_err(error)?;
    buffer.to_array().map_err(error)
}

fn from_host<'py>(py: Python<'py>, a: &HostArray) -> PyResult<ToPyArray<'py>> {
    let buffer = HostBuffer::from_array(a).map_err(error)?;
    Ok((
        PyBytes::new(py, buffer.as_bytes()),
        a.shape().to_vec(),
        a.dtype().name(),
    ))
}

/// The built-in kernels: `[{name, summary, on_mesh, params: [{name, default, help, size,
/// sets}]}]`, where `size` parameters only set default argument sizes (`sets`: (argument,
/// dim) pairs) and the others are compile-time parameters; `on_mesh` kernels run on a device
/// mesh, each device with its own arguments (from JAX: inside `shard_map`).
#[pyfunction]
fn kernels(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for k in registry::KERNELS {
        let entry = PyDict::new(py);
        entry.set_item("name", k.name)?;
        entry.set_item("summary", k.summary)?;
        entry.set_item("on_mesh", k.on_mesh())?;
        let params = PyList::empty(py);
        for p in k.params {
            let d = PyDict::new(py);
            d.set_item("name", p.name)?;
            d.set_item("default", p.default)?;
            d.set_item("help", p.help)?;
            d.set_item("size", p.is_size())?;
            d.set_item("sets", p.sets.to_vec())?;
            params.append(d)?;
        }
        entry.set_item("params", params)?;
        list.append(entry)?;
    }
    Ok(list)
}

/// One instantiated tessera kernel: a definition (its compile-time parameters fixed) and the
/// dtypes and shapes of its arguments. The static parameter of a JAX primitive call: hashed
/// and compared by its IR.
#[pyclass(frozen, module = "tessera_jax", name = "Kernel")]
struct PyKernel {
    def: KernelDef,
    specs: Vec<ArgSpec>,
    /// The device mesh the kernel runs on (empty: one device).
    mesh: Vec<DeviceAxis>,
    /// The kernel instantiated under the portable rules (shapes of the outputs, IR, the
    /// StableHLO lowering).
    kernel: Arc<tessera::dsl::Kernel>,
    ir: String,
    /// Grid steps that do work (splash: from its block tables), for the Mosaic cost estimate.
    active_steps: Option<u64>,
    hash: u64,
    /// Why the TPU rules refuse the plan the kernel belongs to (splash's block sizes), where
    /// they do: its TPU lowering raises this instead of building a call.
    tpu_refusal: Option<String>,
    /// The registry entry and parameters a registry kernel was made from: its run-time data
    /// check (`KernelInfo::check_inputs`) runs on a call's concrete arrays.
    entry: Option<(&'static KernelInfo, Vec<(String, String)>)>,
}

impl PyKernel {
    fn new(
        def: KernelDef,
        specs: Vec<ArgSpec>,
        mesh: Vec<DeviceAxis>,
        active_steps: Option<u64>,
    ) -> PyResult<Self> {
        let kernel = def
            .instantiate_on(&specs, &mesh, &KernelRules::portable())
            .map_err(error)?;
        let ir = kernel.to_text();
        let mut h = DefaultHasher::new();
        (&ir, active_steps).hash(&mut h);
        Ok(PyKernel {
            def,
            specs,
            mesh,
            kernel,
            ir,
            active_steps,
            hash: h.finish(),
            tpu_refusal: None,
            entry: None,
        })
    }

    fn operands(&self, roles: &[OperandRole]) -> Vec<OperandInfo> {
        // The check flags and their zeros are the primitive's own (`check_flags`).
        let flags = self.kernel.checks.flags;
        let is_flags =
            |i: usize| flags.is_some_and(|f| i == f.init.index() || i == f.flags.index());
        self.kernel
            .operands
            .iter()
            .enumerate()
            .filter(|&(i, o)| roles.contains(&o.role) && !is_flags(i))
            .map(|(_, o)| o)
            .map(|o| {
                let role = match o.role {
                    OperandRole::ScalarPrefetch => "scalar_prefetch",
                    OperandRole::Input => "input",
                    OperandRole::Output => "output",
                    OperandRole::Scratch => "scratch",
                };
                (
                    o.name.clone(),
                    role.to_string(),
                    o.array_shape.clone(),
                    o.dtype.name(),
                )
            })
            .collect()
    }
}

#[pymethods]
impl PyKernel {
    /// The kernel's name (`splash_fwd`, `matmul`, ...).
    #[getter]
    fn name(&self) -> &'static str {
        self.def.name()
    }

    /// The arguments, in call order: `[(name, role, shape, dtype)]`, role `scalar_prefetch`
    /// or `input`.
    #[getter]
    fn args(&self) -> Vec<OperandInfo> {
        self.operands(&[OperandRole::ScalarPrefetch, OperandRole::Input])
    }

    /// The outputs: `[(name, role, shape, dtype)]`.
    #[getter]
    fn outputs(&self) -> Vec<OperandInfo> {
        self.operands(&[OperandRole::Output])
    }

    /// The shape of the kernel's check flags (`[grid steps, 128]`, int32) when it makes
    /// run-time index checks, else `None`: the lowering takes their zeros as one more
    /// operand (the last of `mosaic()`'s `operand_order`, one past `args`) and returns them
    /// after the outputs; [`raise_on_check_flags`](Self::raise_on_check_flags) reads them.
    #[getter]
    fn check_flags(&self) -> Option<Vec<usize>> {
        let flags = self.kernel.checks.flags?;
        Some(self.kernel.operand(flags.flags).array_shape.clone())
    }

    /// Raises `TesseraError` naming the failed check (the kernel line, the value, its
    /// bound and the grid step) when the check flags `flags` (`(bytes, shape, dtype)`)
    /// report one; returns `None` otherwise.
    fn raise_on_check_flags(&self, flags: PyArray<'_>) -> PyResult<()> {
        let (bytes, shape, dtype) = &flags;
        let host = to_host(bytes.as_bytes(), shape, dtype)?;
        tessera::dsl::checks::failure(&self.kernel, &host).map_err(error)
    }

    /// The devices the kernel runs on (1 for a kernel without a mesh): each runs it on its
    /// own arguments, so it is called inside `jax.shard_map` over that many devices.
    #[getter]
    fn devices(&self) -> usize {
        self.kernel.num_devices()
    }

    /// The kernel's mesh: `[(axis, size)]`, empty for one device.
    #[getter]
    fn mesh(&self) -> Vec<(String, usize)> {
        self.mesh.iter().map(|a| (a.name.clone(), a.size)).collect()
    }

    /// Grid steps that do work, when known (the Mosaic cost estimate counts only those).
    #[getter]
    fn active_steps(&self) -> Option<u64> {
        self.active_steps
    }

    /// The verified kernel IR as text.
    fn ir(&self) -> &str {
        &self.ir
    }

    /// The portable lowering: a StableHLO module (MLIR text) whose public `@main` takes the
    /// arguments and returns the outputs. For a kernel on a mesh, one device's part of the
    /// manually partitioned program (`stablehlo.partition_id` is its device id; remote
    /// copies are `collective_permute`s), to call inside `shard_map`.
    fn stablehlo(&self, py: Python<'_>) -> PyResult<String> {
        let kernel = Arc::clone(&self.kernel);
        py.detach(|| {
            if kernel.num_devices() > 1 {
                tessera::dsl::stablehlo::lower_module_spmd_body(&kernel)
            } else {
                tessera::dsl::stablehlo::lower_module(&kernel)
            }
            .map(|m| m.to_mlir())
        })
        .map_err(error)
    }

    /// The Mosaic custom call, the kernel instantiated under the TPU rules (a block that does
    /// not tile or a VMEM budget overflow is a `TesseraError`): `{kernel_name, body (the
    /// Mosaic module, MLIR text), backend_config (the call's JSON), cost_estimate {flops,
    /// transcendentals, bytes_accessed}, vmem_limit_bytes, operand_order,
    /// output_operand_aliases}`. `operand_order`: the call's operands as indices into `args`
    /// (scalar prefetch first); `output_operand_aliases`: `(output, operand)` pairs, an
    /// output that is that call operand's buffer (`input_output_aliases`).
    /// `vmem_limit_bytes`: the VMEM budget to check against (default: the TPU rules').
    #[pyo3(signature = (vmem_limit_bytes = None))]
    fn mosaic<'py>(
        &self,
        py: Python<'py>,
        vmem_limit_bytes: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if let Some(refusal) = &self.tpu_refusal {
            return Err(error(refusal));
        }
        let mut lowering = Lowering::tpu();
        if let Some(bytes) = vmem_limit_bytes {
            lowering.rules = lowering.rules.with_vmem_limit(bytes);
        }
        let call = py
            .detach(|| {
                let kernel = self
                    .def
                    .instantiate_on(&self.specs, &self.mesh, &lowering.rules)?;
                lowering.mosaic_call(
                    &kernel,
                    CallFacts {
                        active_grid_steps: self.active_steps,
                        known: &[],
                    },
                )
            })
            .map_err(error)?;
        let d = PyDict::new(py);
        d.set_item("kernel_name", &call.call.kernel_name)?;
        d.set_item("body", &call.call.mosaic)?;
        d.set_item("backend_config", call.call.backend_config())?;
        if let Some(c) = call.call.cost_estimate {
            let cost = PyDict::new(py);
            cost.set_item("flops", c.flops)?;
            cost.set_item("transcendentals", c.transcendentals)?;
            cost.set_item("bytes_accessed", c.bytes_accessed)?;
            d.set_item("cost_estimate", cost)?;
        }
        d.set_item("vmem_limit_bytes", call.call.vmem_limit_bytes)?;
        d.set_item("operand_order", call.operand_order)?;
        let aliases: Vec<(usize, usize)> = call
            .call
            .output_operand_aliases
            .iter()
            .map(|a| (a.output, a.operand))
            .collect();
        d.set_item("output_operand_aliases", aliases)?;
        Ok(d)
    }

    /// Whether the kernel's registry entry checks a call's run-time data
    /// ([`check_inputs`](Self::check_inputs) does something).
    #[getter]
    fn checks_inputs(&self) -> bool {
        self.entry
            .as_ref()
            .is_some_and(|(info, _)| info.check_inputs.is_some())
    }

    /// Runs the registry entry's run-time data check (paged attention's page table and
    /// lengths) on a call's arrays: `arrays[i]` is argument `i` (`(bytes, shape, dtype)`, in
    /// `args` order) or `None` where it is not at hand (a tracer under `jax.jit`, or data the
    /// check does not read); a `TesseraError` with the entry's sentence refuses them. A
    /// no-op for a kernel without one (splash's plan stages, most registry kernels).
    fn check_inputs(&self, py: Python<'_>, arrays: Vec<Option<PyArray<'_>>>) -> PyResult<()> {
        let Some((info, given)) = &self.entry else {
            return Ok(());
        };
        let host = arrays
            .iter()
            .map(|a| {
                a.as_ref()
                    .map(|(b, shape, dtype)| to_host(b.as_bytes(), shape, dtype))
                    .transpose()
            })
            .collect::<PyResult<Vec<_>>>()?;
        let values: Vec<Option<&HostArray>> = host.iter().map(Option::as_ref).collect();
        py.detach(|| info.check_inputs(given, &self.specs, &values))
            .map_err(error)
    }

    /// Runs the kernel in tessera's interpreter (the reference every tessera backend is
    /// checked against) on `arrays` (`(bytes, shape, dtype)`, in `args` order); returns the
    /// outputs the same way.
    fn run<'py>(
        &self,
        py: Python<'py>,
        arrays: Vec<PyArray<'py>>,
    ) -> PyResult<Vec<ToPyArray<'py>>> {
        if self.kernel.num_devices() > 1 {
            return Err(error(format_args!(
                "kernel `{}` runs on {} devices, each with its own arguments; run it with \
                 `run_on_devices` (one argument list per device)",
                self.def.name(),
                self.kernel.num_devices()
            )));
        }
        let host = arrays
            .iter()
            .map(|(b, shape, dtype)| to_host(b.as_bytes(), shape, dtype))
            .collect::<PyResult<Vec<_>>>()?;
        if let Some((info, given)) = &self.entry {
            let values: Vec<Option<&HostArray>> = host.iter().map(Some).collect();
            info.check_inputs(given, &self.specs, &values)
                .map_err(error)?;
        }
        let outs = py
            .detach(|| {
                backend::run(
                    &self.def,
                    &host,
                    Backend::Interpret,
                    &KernelRules::portable(),
                )
            })
            .map_err(error)?;
        outs.iter().map(|a| from_host(py, a)).collect()
    }

    /// Runs a kernel on a mesh in tessera's interpreter, every device at once:
    /// `per_device[d]` are device `d`'s arrays (as [`run`](Self::run) takes them); returns
    /// each device's outputs.
    fn run_on_devices<'py>(
        &self,
        py: Python<'py>,
        per_device: Vec<Vec<PyArray<'py>>>,
    ) -> PyResult<Vec<Vec<ToPyArray<'py>>>> {
        let host = per_device
            .iter()
            .map(|arrays| {
                arrays
                    .iter()
                    .map(|(b, shape, dtype)| to_host(b.as_bytes(), shape, dtype))
                    .collect::<PyResult<Vec<_>>>()
            })
            .collect::<PyResult<Vec<_>>>()?;
        let outs = py
            .detach(|| {
                backend::run_on_devices(
                    &self.def,
                    &self.mesh,
                    &host,
                    Backend::Interpret,
                    &KernelRules::portable(),
                )
            })
            .map_err(error)?;
        outs.iter()
            .map(|device| device.iter().map(|a| from_host(py, a)).collect())
            .collect()
    }

    fn __hash__(&self) -> u64 {
        self.hash
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyKernel>().is_ok_and(|o| {
            let o = o.get();
            o.hash == self.hash && o.active_steps == self.active_steps && o.ir == self.ir
        })
    }

    fn __repr__(&self) -> String {
        let args: Vec<String> = self.specs.iter().map(ToString::to_string).collect();
        format!(
            "tessera_jax.Kernel({}, [{}])",
            self.def.name(),
            args.join(", ")
        )
    }
}

/// A registered kernel (see `kernels()`) with compile-time parameters `params` (name ->
/// value, as strings) instantiated for `args` (`[(shape, dtype)]`; default: the sizes in
/// `params` and the registry's defaults).
#[pyfunction]
#[pyo3(signature = (name, params = Vec::new(), args = None))]
fn kernel(
    name: &str,
    params: Vec<(String, String)>,
    args: Option<Vec<(Vec<usize>, String)>>,
) -> PyResult<PyKernel> {
    let info = registry::find(name).map_err(error)?;
    let instance = info.instance(&params).map_err(error)?;
    let (def, mesh) = (instance.def().clone(), instance.mesh().to_vec());
    let specs = match args {
        None => instance.args().to_vec(),
        Some(args) => {
            let specs = args
                .into_iter()
                .map(|(shape, dtype)| Ok(ArgSpec::new(dtype_named(&dtype)?, shape)))
                .collect::<PyResult<Vec<_>>>()?;
            info.check_sizes(&params, &def, &specs).map_err(error)?;
            specs
        }
    };
    Ok(PyKernel {
        entry: Some((info, params)),
        ..PyKernel::new(def, specs, mesh, None)?
    })
}

/// One kernel launch of a splash plan.
#[pyclass(frozen, module = "tessera_jax", name = "Stage")]
struct PyStage {
    kernel: Py<PyKernel>,
    /// `("const", (bytes, shape, dtype))`, `("zeros", (shape, dtype))` or `("tensor", name)`
    /// per argument.
    args: Py<PyList>,
    outputs: Vec<String>,
}

#[pymethods]
impl PyStage {
    #[getter]
    fn kernel(&self, py: Python<'_>) -> Py<PyKernel> {
        self.kernel.clone_ref(py)
    }

    /// Per argument, in call order: `("const", (bytes, shape, dtype))` for an array the
    /// configuration fixes (block tables, placeholders), `("zeros", (shape, dtype))` for a
    /// buffer a kernel accumulates into from zeros (the fused backward's dQ partials, which
    /// the caller makes in its program), or `("tensor", NAME)` for one of the
    /// computation (`q`, `k`, `v`, `q_segment_ids`, `kv_segment_ids`, `sinks`, `out`, `lse`,
    /// `dout`, `di`, `dq_partial`).
    #[getter]
    fn args(&self, py: Python<'_>) -> Py<PyList> {
        self.args.clone_ref(py)
    }

    /// The tensors the outputs become, in order (`out`, `lse`, `dq`, ...).
    #[getter]
    fn outputs(&self) -> Vec<String> {
        self.outputs.clone()
    }
}

/// The name a plan tensor has on the Python side.
fn tensor_name(t: Tensor) -> &'static str {
    match t {
        Tensor::Q => "q",
        Tensor::K => "k",
        Tensor::V => "v",
        Tensor::QSegments => "q_segment_ids",
        Tensor::KvSegments => "kv_segment_ids",
        Tensor::Sinks => "sinks",
        Tensor::Out => "out",
        Tensor::Lse => "lse",
        Tensor::DOut => "dout",
        Tensor::Di => "di",
        Tensor::DqPartial => "dq_partial",
        Tensor::Dq => "dq",
        Tensor::Dk => "dk",
        Tensor::Dv => "dv",
        Tensor::DSinks => "dsinks",
    }
}

fn py_stage(
    py: Python<'_>,
    attn: &SplashAttention,
    stage: Stage,
    tpu_refusal: &Option<String>,
) -> PyResult<PyStage> {
    let specs = stage_specs(&stage, |t| attn.tensor_spec(t));
    let args = PyList::empty(py);
    for a in &stage.args {
        match a {
            StageArg::Const(c) => args.append(("const", from_host(py, c)?))?,
            // Made inside the JAX program (a broadcast), not embedded in it as a constant:
            // the fused backward's dQ partials are 3 times dQ's size.
            StageArg::Zeros(spec) => {
                args.append(("zeros", (spec.shape.clone(), spec.dtype.name())))?
            }
            StageArg::Tensor(t) => args.append(("tensor", tensor_name(*t)))?,
            StageArg::PerShard(_) => {
                return Err(error(format!(
                    "kernel `{}` has per-shard tables, which only sequence-sharded splash \
                     (inside tessera's own SPMD programs) uses",
                    stage.def.name()
                )))
            }
        }
    }
    let kernel = PyKernel {
        tpu_refusal: tpu_refusal.clone(),
        ..PyKernel::new(stage.def, specs, Vec::new(), stage.active_steps)?
    };
    Ok(PyStage {
        kernel: Py::new(py, kernel)?,
        args: args.unbind(),
        outputs: stage
            .outputs
            .iter()
            .map(|&t| tensor_name(t).into())
            .collect(),
    })
}

/// Splash attention's kernel plans for `q [B, H, Sq, D]`, `k [B, KVH, Skv, D]`,
/// `v [B, KVH, Skv, Dv]` of `dtype` (f32 or bf16): `{forward: [Stage], inference: [Stage],
/// backward: [Stage]}`. The forward plan maps `q, k, v` (and
/// `q_segment_ids [B, Sq, 1]`, `kv_segment_ids [B, 1, Skv]` int32 when `segmented`, `sinks [H]`
/// f32 when `sinks`) to `out` and `lse [B, H, Sq, 1]`; the inference plan maps the same to
/// `out` alone (the forward without its residual, for a call no backward follows); the
/// backward plan maps the forward's and `dout` to `dq`, `dk`, `dv` (and `dsinks [H, 1, 1]`). `mask`: tessera's mask syntax
/// (`causal`, `full`, `local:LEFT:RIGHT`, `chunked:SIZE`, `causal:OFFSET`). Block sizes
/// left out default as in JAX's `BlockSizes` (the dkv blocks to the forward's, compute
/// blocks to their blocks), dQ's compute block as tessera's `default_dq_compute_block`, each
/// kernel's diagonal sub-tile as its `default_*diagonal_block`.
#[pyfunction]
#[pyo3(signature = (
    q, k, v, dtype, mask, block_q, block_kv, *, block_kv_compute = None, block_q_dkv = None,
    block_kv_dkv = None, block_kv_dkv_compute = None, block_q_dq = None, block_kv_dq = None,
    block_kv_dq_compute = None, block_diagonal = None, fused_bwd = false, segmented = false, sinks = false, soft_cap = None, scale = None
))]
#[allow(clippy::too_many_arguments)]
fn splash_plan<'py>(
    py: Python<'py>,
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    dtype: &str,
    mask: &str,
    block_q: usize,
    block_kv: usize,
    block_kv_compute: Option<usize>,
    block_q_dkv: Option<usize>,
    block_kv_dkv: Option<usize>,
    block_kv_dkv_compute: Option<usize>,
    block_q_dq: Option<usize>,
    block_kv_dq: Option<usize>,
    block_kv_dq_compute: Option<usize>,
    block_diagonal: Option<usize>,
    fused_bwd: bool,
    segmented: bool,
    sinks: bool,
    soft_cap: Option<f32>,
    scale: Option<f32>,
) -> PyResult<Bound<'py, PyDict>> {
    let dims = Dims::of(&q, &k, &v).map_err(error)?;
    let mask = Mask::parse(mask).map_err(error)?;
    let block_kv_dkv = block_kv_dkv.unwrap_or(block_kv);
    let blocks = BlockSizes {
        block_kv_compute: block_kv_compute.unwrap_or(block_kv),
        block_q_dkv: block_q_dkv.unwrap_or(block_q),
        block_kv_dkv,
        block_kv_dkv_compute: block_kv_dkv_compute.unwrap_or(block_kv_dkv),
        block_q_dq: block_q_dq.unwrap_or(block_q),
        block_kv_dq: block_kv_dq.unwrap_or(block_kv),
        block_kv_dq_compute,
        block_diagonal,
        ..BlockSizes::uniform(block_q, block_kv)
    }
    .with_fused_bwd(fused_bwd);
    let options = SplashOptions {
        soft_cap,
        scale,
        ..SplashOptions::default()
    };
    let dtype = dtype_named(dtype)?;
    // Planned under the portable rules (the plan serves every platform); what the TPU rules
    // refuse (e.g. key blocks that are not whole lane tiles) stops the TPU lowering only.
    let tpu_refusal = SplashAttention::new(
        mask.clone(),
        dims,
        dtype,
        blocks,
        options,
        KernelRules::tpu(),
    )
    .err()
    .map(|e| e.to_string());
    let attn = py
        .detach(|| {
            SplashAttention::new(mask, dims, dtype, blocks, options, KernelRules::portable())
        })
        .map_err(error)?;
    let features = Features { segmented, sinks };
    let plan = PyDict::new(py);
    let forward = PyList::empty(py);
    for stage in attn.forward_plan(features) {
        forward.append(py_stage(py, &attn, stage, &tpu_refusal)?)?;
    }
    let inference = PyList::empty(py);
    for stage in attn.inference_plan(features) {
        inference.append(py_stage(py, &attn, stage, &tpu_refusal)?)?;
    }
    let backward = PyList::empty(py);
    for stage in attn.backward_plan(features) {
        backward.append(py_stage(py, &attn, stage, &tpu_refusal)?)?;
    }
    plan.set_item("forward", forward)?;
    plan.set_item("inference", inference)?;
    plan.set_item("backward", backward)?;
    Ok(plan)
}

/// The path of the libtpu tessera compiles with (the pinned wheel, downloaded on first use
/// into tessera's cache, or `TESSERA_LIBTPU`), for JAX's `TPU_LIBRARY_PATH`.
#[pyfunction]
fn libtpu_path(py: Python<'_>) -> PyResult<String> {
    let path = py.detach(tessera::runtime::libtpu_path).map_err(error)?;
    Ok(path.to_string_lossy().into_owned())
}

/// The environment libtpu needs for compile-only use on a machine without a TPU:
/// `[(name, value)]` (tessera's `LIBTPU_COMPILE_ONLY_ENV`).
#[pyfunction]
fn libtpu_compile_only_env() -> Vec<(&'static str, &'static str)> {
    tessera::runtime::provision::LIBTPU_COMPILE_ONLY_ENV.to_vec()
}

#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TesseraError", m.py().get_type::<TesseraError>())?;
    m.add_class::<PyKernel>()?;
    m.add_class::<PyStage>()?;
    m.add_function(wrap_pyfunction!(kernels, m)?)?;
    m.add_function(wrap_pyfunction!(kernel, m)?)?;
    m.add_function(wrap_pyfunction!(splash_plan, m)?)?;
    m.add_function(wrap_pyfunction!(libtpu_path, m)?)?;
    m.add_function(wrap_pyfunction!(libtpu_compile_only_env, m)?)?;
    Ok(())
}
