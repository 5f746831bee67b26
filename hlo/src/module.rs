//! Modules and finished functions.

use std::fmt;

use crate::builder::FuncBuilder;
use crate::ops::{ChannelHandle, Region, Sharding, Value};
use crate::{HloError, TensorType};

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
    funcs: Vec<Func>,
    next_channel: i64,
}

impl Module {
    /// An empty module with one replica and one partition.
    pub fn new(name: impl Into<String>) -> Self {
        Module {
            name: name.into(),
            num_partitions: 1,
            num_replicas: 1,
            funcs: Vec::new(),
            next_channel: 1,
        }
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
        self.num_partitions = n;
        Ok(())
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
    pub fn to_mlir(&self) -> String {
        crate::print::render_module(self)
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
