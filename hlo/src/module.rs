//! Modules and finished functions.

use std::fmt;

use crate::builder::FuncBuilder;
use crate::ops::{ChannelHandle, DotDims, Region, Sharding, Value};
use crate::{DType, HloError, TensorType};

/// A StableHLO module: device counts (`mhlo.num_partitions`, `mhlo.num_replicas`) and
/// functions. Render it with [`Module::to_mlir`] (or `Display`).
///
/// ```
/// use tessera_hlo::{DType, Module, TensorType};
///
/// let mut m = Module::new("axpy");
/// let mut f = m.func("main");
/// let x = f.arg(TensorType::new([4], DType::F32))?;
/// let y = f.arg(TensorType::new([4], DType::F32))?;
/// let a = f.splat(2.0, TensorType::new([4], DType::F32))?;
/// let ax = f.mul(a, x)?;
/// let r = f.add(ax, y)?;
/// f.finish(&[r])?;
/// assert!(m.to_mlir().contains("\"stablehlo.multiply\""));
/// # Ok::<(), tessera_hlo::HloError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    name: String,
    num_partitions: u32,
    num_replicas: u32,
    mesh: Vec<(String, u32)>,
    funcs: Vec<Func>,
    next_channel: i64,
    /// `(function, argument, result)`: the argument's buffer may be reused for the result
    /// (`tf.aliasing_output`), see [`Module::alias_output`].
    aliases: Vec<(String, usize, usize)>,
    /// The Mosaic kernels that use the barrier semaphore, in the order their first call was
    /// built: a kernel's `collective_id` is its position here (see
    /// [`FuncBuilder::tpu_custom_call`](crate::FuncBuilder::tpu_custom_call)).
    collective_kernels: Vec<String>,
}

impl Module {
    /// An empty module with one replica and one partition.
    pub fn new(name: impl Into<String>) -> Self {
        Module {
            name: name.into(),
            num_partitions: 1,
            num_replicas: 1,
            mesh: Vec::new(),
            funcs: Vec::new(),
            next_channel: 1,
            collective_kernels: Vec::new(),
            aliases: Vec::new(),
        }
    }

    /// XLA's own `[n, n] x [n, n]` dot of `dtype`, accumulated and returned in f32, as `@main`:
    /// the program a machine's matmul peak is measured with (`tessera bench`, and the
    /// trainer's MFU in tessera-train).
    pub fn square_dot(n: usize, dtype: DType) -> Result<Module, HloError> {
        let mut m = Module::new(format!("xla_dot_{}", dtype.name()));
        let mut f = m.func("main");
        let ty = TensorType::new(vec![n as i64, n as i64], dtype);
        let x = f.arg(ty.clone())?;
        let y = f.arg(ty)?;
        let z = f.dot_general(x, y, &DotDims::new([], [], [1], [0]), DType::F32, None)?;
        f.finish(&[z])?;
        Ok(m)
    }

    /// The module name (`module @name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets `mhlo.num_partitions` (at least 1). Collectives built afterwards check their
    /// device ids against it.
    pub fn set_num_partitions(&mut self, n: u32) -> Result<(), HloError> {
        if n == 0 {
            return Err(HloError::Module {
                reason: "mhlo.num_partitions must be >= 1".into(),
            });
        }
        if !self.mesh.is_empty() && n != self.num_partitions {
            return Err(HloError::Module {
                reason: format!(
                    "the mesh has {} devices; mhlo.num_partitions cannot be {n}",
                    self.num_partitions
                ),
            });
        }
        self.num_partitions = n;
        Ok(())
    }

    /// Makes this a manually partitioned module on a device mesh: named axes with their
    /// sizes, major to minor (partition `p` sits at the row-major coordinates of `p`), and
    /// `mhlo.num_partitions` their product. `@main` then takes and returns per-device blocks
    /// ([`Sharding::ManualSplit`]), and [`Module::to_mlir`] prints Shardy's form. Call it
    /// before adding functions.
    pub fn set_mesh(&mut self, axes: &[(&str, u32)]) -> Result<(), HloError> {
        let err = |reason: String| HloError::Module { reason };
        if !self.funcs.is_empty() {
            return Err(err("set the mesh before adding functions".into()));
        }
        if axes.is_empty() {
            return Err(err("a mesh needs at least one axis".into()));
        }
        let mut devices = 1u32;
        for (i, &(name, size)) in axes.iter().enumerate() {
            if name.is_empty() || axes[..i].iter().any(|&(n, _)| n == name) {
                return Err(err(format!(
                    "mesh axis #{i} `{name}`: axis names must be non-empty and distinct"
                )));
            }
            if size == 0 {
                return Err(err(format!("mesh axis `{name}` has size 0")));
            }
            devices = devices
                .checked_mul(size)
                .ok_or_else(|| err("the mesh has more than u32::MAX devices".into()))?;
        }
        self.mesh = axes.iter().map(|&(n, s)| (n.to_string(), s)).collect();
        self.num_partitions = devices;
        Ok(())
    }

    /// The mesh axes and their sizes (empty without a mesh).
    pub fn mesh(&self) -> &[(String, u32)] {
        &self.mesh
    }

    /// Lets result `output` of the finished function `func` reuse the buffer of its argument
    /// `arg` (`tf.aliasing_output = output` on the argument, as JAX emits for donated
    /// arguments): a caller that donates that argument gets the result in place. The two
    /// must have the same type and sharding; an argument and a result are aliased at most
    /// once.
    pub fn alias_output(&mut self, func: &str, arg: usize, output: usize) -> Result<(), HloError> {
        let err = |reason: String| HloError::Module {
            reason: format!("alias argument #{arg} of @{func} to result #{output}: {reason}"),
        };
        let f = self
            .funcs
            .iter()
            .find(|f| f.name == func)
            .ok_or_else(|| err("no finished function of that name".into()))?;
        let (args, results) = (f.arg_types(), f.result_types());
        let (Some(a), Some(r)) = (args.get(arg), results.get(output)) else {
            return Err(err(format!(
                "the function has {} arguments and {} results",
                args.len(),
                results.len()
            )));
        };
        if a != r || f.arg_shardings.get(arg) != f.result_shardings.get(output) {
            return Err(err(format!(
                "the argument is {a}, the result {r}; only equal types and shardings alias"
            )));
        }
        if self
            .aliases
            .iter()
            .any(|(g, x, y)| g == func && (*x == arg || *y == output))
        {
            return Err(err("the argument or the result is aliased already".into()));
        }
        self.aliases.push((func.to_string(), arg, output));
        Ok(())
    }

    /// The result each argument of `func` is aliased to ([`Module::alias_output`]).
    pub fn output_aliases(&self, func: &str) -> Vec<(usize, usize)> {
        self.aliases
            .iter()
            .filter(|(g, _, _)| g == func)
            .map(|&(_, a, o)| (a, o))
            .collect()
    }

    /// Sets `mhlo.num_replicas` (at least 1).
    pub fn set_num_replicas(&mut self, n: u32) -> Result<(), HloError> {
        if n == 0 {
            return Err(HloError::Module {
                reason: "mhlo.num_replicas must be >= 1".into(),
            });
        }
        self.num_replicas = n;
        Ok(())
    }

    /// `mhlo.num_partitions`.
    pub fn num_partitions(&self) -> u32 {
        self.num_partitions
    }

    /// `mhlo.num_replicas`.
    pub fn num_replicas(&self) -> u32 {
        self.num_replicas
    }

    /// Starts a public function. It joins the module when [`FuncBuilder::finish`] is called.
    /// A function can only call functions finished before it.
    pub fn func(&mut self, name: impl Into<String>) -> FuncBuilder<'_> {
        FuncBuilder::new(self, name.into())
    }

    /// The finished functions, in the order they were finished.
    pub fn funcs(&self) -> &[Func] {
        &self.funcs
    }

    /// The finished function called `name`.
    pub fn get_func(&self, name: &str) -> Option<&Func> {
        self.funcs.iter().find(|f| f.name == name)
    }

    /// Checks what only the whole module can tell: a public `@main` exists.
    pub fn verify(&self) -> Result<(), HloError> {
        match self.get_func("main") {
            Some(f) if f.public => Ok(()),
            Some(_) => Err(HloError::Module {
                reason: "@main must be public".into(),
            }),
            None => Err(HloError::Module {
                reason: "no @main function".into(),
            }),
        }
    }

    /// The module as MLIR text (generic op syntax, one op per line, deterministic).
    ///
    /// With a mesh it is Shardy's form, for a compile with `use_shardy_partitioner`: an
    /// `sdy.mesh`, `@main` over global tensors with `sdy.sharding` attributes, and its body
    /// in an `sdy.manual_computation` over every mesh axis. Without one, shardings print as
    /// `mhlo.sharding` (GSPMD).
    pub fn to_mlir(&self) -> String {
        crate::print::render_module(self, !self.mesh.is_empty())
    }

    /// The module in GSPMD's manual form, mesh or not: per-device types with
    /// `mhlo.sharding = "{manual}"`, for a compile without Shardy (what libtpu is known to
    /// compile).
    pub fn to_mlir_gspmd(&self) -> String {
        crate::print::render_module(self, false)
    }

    /// Checks the sharding of an argument or result (`what`) of type `ty` of the function
    /// `func`: [`Sharding::ManualSplit`] needs a mesh, names its axes and has one entry per
    /// dim; on a module with a mesh, `@main` takes and returns only such blocks and other
    /// functions carry no shardings (Shardy's form has no `mhlo.sharding`).
    pub(crate) fn check_sharding(
        &self,
        func: &str,
        what: &str,
        ty: &TensorType,
        sharding: Option<&Sharding>,
    ) -> Result<(), HloError> {
        let err = |reason: String| HloError::Func {
            func: func.to_string(),
            reason: format!("{what}: {reason}"),
        };
        match (sharding, self.mesh.is_empty()) {
            (Some(Sharding::ManualSplit(_)), true) => Err(err(
                "a ManualSplit sharding needs a module mesh; call Module::set_mesh first".into(),
            )),
            (Some(Sharding::ManualSplit(axes)), false) => {
                if func != "main" {
                    return Err(err("only @main takes and returns ManualSplit blocks".into()));
                }
                if axes.len() != ty.rank() {
                    return Err(err(format!(
                        "the ManualSplit sharding names {} dims, the type {ty} has {}",
                        axes.len(),
                        ty.rank()
                    )));
                }
                let mut global = 1i64;
                for (d, (a, &local)) in axes.iter().zip(&ty.dims).enumerate() {
                    let size = match a {
                        None => 1,
                        Some(a) => {
                            let Some(&(_, size)) = self.mesh.iter().find(|(n, _)| n == a) else {
                                return Err(err(format!(
                                    "dim {d} is split over `{a}`, not a mesh axis"
                                )));
                            };
                            if axes[..d].iter().any(|b| b.as_ref() == Some(a)) {
                                return Err(err(format!("mesh axis `{a}` splits two dims")));
                            }
                            i64::from(size)
                        }
                    };
                    global = local
                        .checked_mul(size)
                        .and_then(|g| global.checked_mul(g))
                        .ok_or_else(|| err(format!("the global tensor of {ty} is too large")))?;
                }
                Ok(())
            }
            (_, true) => Ok(()),
            (None, false) if func != "main" => Ok(()),
            (_, false) => Err(err(if func == "main" {
                "on a module with a mesh, @main takes and returns ManualSplit blocks".into()
            } else {
                "on a module with a mesh, only @main has shardings".into()
            })),
        }
    }

    pub(crate) fn add_func(&mut self, func: Func) -> Result<(), HloError> {
        if self.get_func(&func.name).is_some() {
            return Err(HloError::Func {
                func: func.name,
                reason: "a function with this name is already in the module".into(),
            });
        }
        if func.name == "main" && !func.public {
            return Err(HloError::Func {
                func: func.name,
                reason: "@main must be public".into(),
            });
        }
        self.funcs.push(func);
        Ok(())
    }

    /// The `collective_id` of the Mosaic kernel `mosaic` (its module text) in this program:
    /// one id per distinct kernel, numbered from 0 in the order their calls are built.
    pub(crate) fn collective_id(&mut self, mosaic: &str) -> u32 {
        let at = match self.collective_kernels.iter().position(|m| m == mosaic) {
            Some(at) => at,
            None => {
                self.collective_kernels.push(mosaic.to_string());
                self.collective_kernels.len() - 1
            }
        };
        at as u32
    }

    pub(crate) fn alloc_channel(&mut self) -> ChannelHandle {
        let handle = self.next_channel;
        self.next_channel += 1;
        ChannelHandle { handle, kind: 1 }
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_mlir())
    }
}

/// A finished `func.func`: signature, body, and the type of every value it defines.
#[derive(Debug, Clone, PartialEq)]
pub struct Func {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) public: bool,
    pub(crate) arg_shardings: Vec<Option<Sharding>>,
    pub(crate) result_shardings: Vec<Option<Sharding>>,
    pub(crate) body: Region,
    pub(crate) values: Vec<TensorType>,
}

impl Func {
    /// The function name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the function is public (`func.func public`).
    pub fn is_public(&self) -> bool {
        self.public
    }

    /// The body: `args` are the function arguments, `results` the returned values.
    pub fn body(&self) -> &Region {
        &self.body
    }

    /// The type of a value of this function (`None` for a value of another function).
    pub fn value_type(&self, v: Value) -> Option<&TensorType> {
        if v.func != self.id {
            return None;
        }
        self.values.get(v.index())
    }

    /// Argument types, in order.
    pub fn arg_types(&self) -> Vec<TensorType> {
        self.body
            .args
            .iter()
            .map(|&v| self.values[v.index()].clone())
            .collect()
    }

    /// Result types, in order.
    pub fn result_types(&self) -> Vec<TensorType> {
        self.body
            .results
            .iter()
            .map(|&v| self.values[v.index()].clone())
            .collect()
    }

    /// `mhlo.sharding` of each argument.
    pub fn arg_shardings(&self) -> &[Option<Sharding>] {
        &self.arg_shardings
    }

    /// `mhlo.sharding` of each result.
    pub fn result_shardings(&self) -> &[Option<Sharding>] {
        &self.result_shardings
    }
}
