//! [`Spmd`]: builds one SPMD function over a [`FuncBuilder`] and hands out typed tensors.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use tessera_hlo::{DType, FuncBuilder, Sharding, TensorType, Value};

use crate::axis::MeshAxis;
use crate::collective::Collective;
use crate::error::CollectiveError;
use crate::layout::{DimSpec, Invariant, Layout, PartitionSpec, Variation, Varying};
use crate::mesh::{HasAxis, Mesh, MeshShape};
use crate::tensor::DTensor;

/// The run-time layout of a distributed tensor: its [`PartitionSpec`] and the axis it varies
/// over ([`Varying`]), if any. The type of a [`DTensor`] says the same at compile time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    /// How each dim is split.
    pub spec: PartitionSpec,
    /// The axis the values vary over beyond the split dims (`None`: [`Invariant`]).
    pub varying: Option<&'static str>,
}

impl TensorLayout {
    /// The layout of the types `S`, `V` on mesh `M`.
    pub fn of<M, S: Layout<M>, V: Variation<M>>() -> Self {
        TensorLayout {
            spec: S::spec(),
            varying: V::AXIS,
        }
    }

    /// Checks what the types cannot: every mesh axis is used at most once (by one split dim,
    /// or as the varying axis), and the rank is `rank`.
    pub fn validate<M: MeshShape>(
        &self,
        mesh: &Mesh<M>,
        rank: usize,
        context: &str,
    ) -> Result<(), CollectiveError> {
        let err = |reason: String| CollectiveError::Spec {
            context: context.to_string(),
            spec: self.to_string(),
            reason,
        };
        if self.spec.rank() != rank {
            return Err(err(format!(
                "it has {} dims, the tensor has rank {rank}",
                self.spec.rank()
            )));
        }
        let mut used: Vec<&str> = Vec::new();
        let axes = self
            .spec
            .dims()
            .iter()
            .filter_map(|d| match d {
                DimSpec::Split(a) => Some(*a),
                DimSpec::Replicated => None,
            })
            .chain(self.varying);
        for a in axes {
            if mesh.index_of(a).is_none() {
                return Err(err(format!("the mesh {mesh} has no axis `{a}`")));
            }
            if used.contains(&a) {
                return Err(err(format!(
                    "mesh axis `{a}` is used twice (a tensor is split over an axis at most once, \
                     and does not both vary over it and split a dim over it)"
                )));
            }
            used.push(a);
        }
        Ok(())
    }

    /// Per-device dims of a tensor with global dims `global`; fails if a split dim does not
    /// divide by its axis size.
    pub fn local_dims<M: MeshShape>(
        &self,
        mesh: &Mesh<M>,
        global: &[i64],
        context: &str,
    ) -> Result<Vec<i64>, CollectiveError> {
        self.validate(mesh, global.len(), context)?;
        let mut local = global.to_vec();
        for (dim, (size, d)) in local.iter_mut().zip(self.spec.dims()).enumerate() {
            if let DimSpec::Split(a) = d {
                let n = axis_size(mesh, a)?;
                if *size < 0 || *size % n as i64 != 0 {
                    return Err(CollectiveError::NotDivisible {
                        context: context.to_string(),
                        dim,
                        size: *size,
                        axis: a,
                        axis_size: n,
                    });
                }
                *size /= n as i64;
            }
        }
        Ok(local)
    }

    /// Global dims of a tensor with per-device dims `local`.
    pub fn global_dims<M: MeshShape>(
        &self,
        mesh: &Mesh<M>,
        local: &[i64],
    ) -> Result<Vec<i64>, CollectiveError> {
        let mut global = local.to_vec();
        for (size, d) in global.iter_mut().zip(self.spec.dims()) {
            if let DimSpec::Split(a) = d {
                let n = axis_size(mesh, a)? as i64;
                *size = size.checked_mul(n).ok_or_else(|| {
                    CollectiveError::operand("global shape", format!("{local:?} overflows"))
                })?;
            }
        }
        Ok(global)
    }
}

fn axis_size<M: MeshShape>(mesh: &Mesh<M>, axis: &str) -> Result<usize, CollectiveError> {
    mesh.index_of(axis)
        .map(|i| mesh.sizes()[i])
        .ok_or_else(|| CollectiveError::Mesh {
            reason: format!("the mesh {mesh} has no axis `{axis}`"),
        })
}

impl fmt::Display for TensorLayout {
    /// `P(None, context)`, or `P(None, None) varying over data`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.spec)?;
        if let Some(a) = self.varying {
            write!(f, " varying over {a}")?;
        }
        Ok(())
    }
}

/// A program input or output: its sharding and its global and per-device types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// How the tensor is split over the mesh.
    pub spec: PartitionSpec,
    /// The type of the whole (logical) tensor.
    pub global: TensorType,
    /// The type each device holds.
    pub local: TensorType,
}

/// One collective that a [`Spmd`] emitted: what autodiff needs to apply its transpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveCall {
    /// The collective and its parameters.
    pub collective: Collective,
    /// Its operand.
    pub input: Value,
    /// Its result.
    pub output: Value,
    /// The per-device type of its operand.
    pub input_type: TensorType,
}

impl CollectiveCall {
    /// The bytes each device sends for this collective, with the usual algorithms: an
    /// all-to-all keeps `1/n` of its operand and sends the rest; an all-gather sends its
    /// block to the `n - 1` others; a reduce-scatter (ring) sends `(n - 1)/n` of its operand,
    /// an all-reduce twice that; a permute sends its whole operand.
    pub fn bytes_sent_per_device(&self) -> usize {
        let elements = self.input_type.num_elements().unwrap_or(0) as usize;
        let bytes = elements * self.input_type.dtype.size_bytes();
        let n = self.collective.axis().size();
        match &self.collective {
            Collective::AllToAll { .. } | Collective::ReduceScatter { .. } => bytes * (n - 1) / n,
            Collective::AllGather { .. } => bytes * (n - 1),
            Collective::Psum { .. } => 2 * bytes * (n - 1) / n,
            Collective::Pvary { .. } => 0,
            Collective::Ppermute { pairs, .. } => {
                if pairs.iter().all(|(s, t)| s == t) {
                    0
                } else {
                    bytes
                }
            }
        }
    }
}

/// Emits collectives on raw per-device values where typed tensors cannot go: inside a local
/// op's closure or a custom-VJP rule (e.g. a ring attention unit whose backward runs a ring of
/// its own). Each one joins its program's [`Spmd::collectives`], as the [`DTensor`]
/// combinators' do; the caller answers for the layouts the types would have checked.
#[derive(Clone)]
pub struct CollectiveRecorder {
    tape: Tape,
}

impl fmt::Debug for CollectiveRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectiveRecorder")
            .field("recorded", &self.tape.borrow().len())
            .finish()
    }
}

impl CollectiveRecorder {
    /// Appends `collective` applied to `x` ([`Collective::emit`], with its checks), records
    /// it, and returns its result.
    pub fn emit(
        &self,
        f: &mut FuncBuilder<'_>,
        collective: &Collective,
        x: Value,
    ) -> Result<Value, CollectiveError> {
        let input_type = f.value_type(x)?.clone();
        let output = collective.emit(f, x)?;
        self.tape.borrow_mut().push(CollectiveCall {
            collective: collective.clone(),
            input: x,
            output,
            input_type,
        });
        Ok(output)
    }
}

/// What a finished [`Spmd`] function takes and returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Signature {
    /// The arguments, in order.
    pub inputs: Vec<TensorInfo>,
    /// The results, in order.
    pub outputs: Vec<TensorInfo>,
}

/// The program-building interface [`DTensor`]s talk to: a trait object, so that a tensor's
/// type names neither the builder's lifetime nor the owner.
pub(crate) trait Ctx<M> {
    fn mesh(&self) -> &Mesh<M>;
    fn with_builder(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut FuncBuilder<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError>;
    /// The program's record of collectives, shared with the VJP rules that add the
    /// transposes.
    fn tape(&self) -> Tape;
    fn add_output(&self, value: Value, info: TensorInfo) -> Result<(), CollectiveError>;
}

/// The collectives of a program in order, forward ones and (after a VJP) their transposes.
pub(crate) type Tape = Rc<RefCell<Vec<CollectiveCall>>>;

impl<M> dyn Ctx<M> + '_ {
    /// Runs `f` on the builder and returns its result.
    pub(crate) fn build<R>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut FuncBuilder<'_>) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let mut f = Some(f);
        let mut out = None;
        self.with_builder(op, &mut |b| {
            if let Some(f) = f.take() {
                out = Some(f(b)?);
            }
            Ok(())
        })?;
        out.ok_or(CollectiveError::Busy { op })
    }
}

/// A value the local ops of a program on mesh `M` accept: any [`DTensor`] of that mesh.
#[diagnostic::on_unimplemented(
    message = "a local op of a program on the mesh `{M}` cannot take `{Self}`",
    label = "this is not a tensor of the mesh `{M}`",
    note = "local ops take the `DTensor`s of their own program"
)]
pub trait LocalValue<M> {
    /// The per-device value.
    fn local_value(&self) -> Value;
}

/// The typed results of a local op with several results ([`Spmd::local_results`]): a tuple of
/// 1 to 4 [`DTensor`]s of one program.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tuple of tensors of the mesh `{M}`",
    label = "this is not a tuple of tensors of the program",
    note = "a local op with several results returns a tuple of 1 to 4 `DTensor`s of its program"
)]
pub trait LocalResults<'p, M>: Sized {
    /// How many results.
    const COUNT: usize;
    /// Wraps `values` (one per result), checking each fits its type (rank, axes used once).
    fn wrap(p: &'p Spmd<'_, M>, values: &[Value]) -> Result<Self, CollectiveError>;
}

macro_rules! local_results {
    ($(($($s:ident $v:ident $i:tt),+);)*) => {
        $(
            impl<'p, M: MeshShape, $($s: Layout<M>, $v: Variation<M>),+> LocalResults<'p, M>
                for ($(DTensor<'p, M, $s, $v>,)+)
            {
                const COUNT: usize = [$($i),+].len();
                fn wrap(p: &'p Spmd<'_, M>, values: &[Value]) -> Result<Self, CollectiveError> {
                    Ok(($(p.declare::<$s, $v>(values[$i])?,)+))
                }
            }
        )*
    };
}

local_results! {
    (S0 V0 0);
    (S0 V0 0, S1 V1 1);
    (S0 V0 0, S1 V1 1, S2 V2 2);
    (S0 V0 0, S1 V1 1, S2 V2 2, S3 V3 3);
}

/// Builds one SPMD function on the mesh `M`: the function's arguments and results are
/// per-device shards (on a module with the mesh, blocks of global tensors split over its
/// axes; else `mhlo.sharding = "{manual}"`), and the typed [`DTensor`]s it hands out carry
/// their sharding in their type.
///
/// Usually made by [`Program::build`](crate::Program::build); to emit into a function built
/// elsewhere (e.g. beside other code), wrap its [`FuncBuilder`] with [`Spmd::new`] and take
/// it back with [`Spmd::into_parts`].
///
/// The builder sits in a `RefCell`: tensor ops borrow it for the duration of one op. Calling a
/// tensor op from inside a local op's closure (which holds the builder) is an error
/// ([`CollectiveError::Busy`]), not a panic.
pub struct Spmd<'m, M> {
    builder: RefCell<Builder<'m>>,
    mesh: Mesh<M>,
    inputs: RefCell<Vec<TensorInfo>>,
    outputs: RefCell<Vec<(Value, TensorInfo)>>,
    tape: Tape,
    /// In a scan body: every mesh axis's `axis_index`, computed once before the loop (they do
    /// not change from one iteration to the next, so the body does not recompute them).
    axis_indices: Vec<Value>,
}

impl<M: MeshShape> fmt::Debug for Spmd<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spmd")
            .field("mesh", &self.mesh)
            .field("inputs", &self.inputs.borrow().len())
            .field("outputs", &self.outputs.borrow().len())
            .finish_non_exhaustive()
    }
}

impl<M: MeshShape> Ctx<M> for Spmd<'_, M> {
    fn mesh(&self) -> &Mesh<M> {
        &self.mesh
    }

    fn with_builder(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut FuncBuilder<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let mut b = self
            .builder
            .try_borrow_mut()
            .map_err(|_| CollectiveError::Busy { op })?;
        match &mut *b {
            Builder::Function(b) => f(b),
            Builder::LoopBody(b) => b.run(f),
        }
    }

    fn tape(&self) -> Tape {
        self.tape.clone()
    }

    fn add_output(&self, value: Value, info: TensorInfo) -> Result<(), CollectiveError> {
        self.outside_loop("output")?;
        self.outputs.borrow_mut().push((value, info));
        Ok(())
    }
}

/// Where a [`Spmd`] emits: the function itself, or the body of a [`Spmd::scan`] (the
/// function's builder lent by the loop while it builds the body region).
// One per function or loop body, never in a collection: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Builder<'m> {
    Function(FuncBuilder<'m>),
    LoopBody(&'m mut (dyn LoopBuilder + 'm)),
}

/// A builder lent to a loop body, whatever the lifetime of its module borrow.
pub(crate) trait LoopBuilder {
    fn run(
        &mut self,
        f: &mut dyn FnMut(&mut FuncBuilder<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError>;
}

impl LoopBuilder for FuncBuilder<'_> {
    fn run(
        &mut self,
        f: &mut dyn FnMut(&mut FuncBuilder<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        f(self)
    }
}

impl<'m, M: MeshShape> Spmd<'m, M> {
    /// Wraps a function builder whose module has one partition per mesh device
    /// (`mhlo.num_partitions`) and one replica, and either this mesh
    /// ([`Module::set_mesh`](tessera_hlo::Module::set_mesh)) or none.
    pub fn new(builder: FuncBuilder<'m>, mesh: &Mesh<M>) -> Result<Self, CollectiveError> {
        let partitions = builder.num_partitions() as usize;
        let module_mesh = builder.mesh();
        let same_mesh = module_mesh.len() == mesh.axis_names().len()
            && module_mesh
                .iter()
                .zip(mesh.axis_names().iter().zip(mesh.sizes()))
                .all(|((n, s), (m, &k))| n == m && *s as usize == k);
        if !module_mesh.is_empty() && !same_mesh {
            return Err(CollectiveError::Mesh {
                reason: format!(
                    "SPMD function @{} on the mesh {mesh}: the module's mesh is {module_mesh:?}",
                    builder.name()
                ),
            });
        }
        if partitions != mesh.num_devices() || builder.num_replicas() != 1 {
            return Err(CollectiveError::DeviceCount {
                context: format!(
                    "SPMD function @{} on the mesh {mesh}: the module has mhlo.num_partitions = \
                     {partitions} and mhlo.num_replicas = {}",
                    builder.name(),
                    builder.num_replicas()
                ),
                expected: mesh.num_devices(),
                actual: partitions * builder.num_replicas() as usize,
            });
        }
        Ok(Spmd {
            builder: RefCell::new(Builder::Function(builder)),
            mesh: mesh.clone(),
            inputs: RefCell::new(Vec::new()),
            outputs: RefCell::new(Vec::new()),
            tape: Rc::new(RefCell::new(Vec::new())),
            axis_indices: Vec::new(),
        })
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh<M> {
        &self.mesh
    }

    pub(crate) fn ctx(&self) -> &(dyn Ctx<M> + '_) {
        self
    }

    /// Adds an argument: a tensor of `global_dims` sharded as `S`. Each device receives its
    /// shard (see [`shard`](crate::host::shard)).
    ///
    /// Fails if a split dim does not divide by its axis size (the message names the dim, its
    /// size and the axis), or if the sharding uses a mesh axis twice.
    pub fn arg<S: Layout<M>>(
        &self,
        global_dims: impl AsRef<[i64]>,
        dtype: DType,
    ) -> Result<DTensor<'_, M, S>, CollectiveError> {
        self.outside_loop("arg")?;
        let global = global_dims.as_ref();
        let layout = TensorLayout::of::<M, S, Invariant>();
        let index = self.inputs.borrow().len();
        let context = format!("argument #{index} {}", TensorType::new(global, dtype));
        let local = layout.local_dims(&self.mesh, global, &context)?;
        let local = TensorType::new(local, dtype);
        let value = self.ctx().build("arg", |f| {
            let sharding = block_sharding(f, &layout.spec);
            Ok(f.arg_with_sharding(local.clone(), sharding)?)
        })?;
        self.inputs.borrow_mut().push(TensorInfo {
            spec: layout.spec.clone(),
            global: TensorType::new(global, dtype),
            local,
        });
        Ok(DTensor::new(self.ctx(), value, layout))
    }

    /// This device's coordinate along axis `A` (JAX's `axis_index`): an `i32` scalar that
    /// varies over `A`.
    pub fn axis_index<A: MeshAxis>(&self) -> Result<DTensor<'_, M, (), Varying<A>>, CollectiveError>
    where
        M: HasAxis<A>,
    {
        let index = <M as HasAxis<A>>::INDEX;
        let value = match self.axis_indices.get(index) {
            Some(&v) => v,
            None => self.axis_index_value(index)?,
        };
        Ok(DTensor::new(
            self.ctx(),
            value,
            TensorLayout::of::<M, (), Varying<A>>(),
        ))
    }

    /// The axis indices a scan body reads from before its loop (`None` outside loops).
    pub(crate) fn axis_indices(&self) -> Option<Vec<Value>> {
        (!self.axis_indices.is_empty()).then(|| self.axis_indices.clone())
    }

    /// This device's coordinate along mesh axis number `index`, computed from the partition id.
    pub(crate) fn axis_index_value(&self, index: usize) -> Result<Value, CollectiveError> {
        let size = self.mesh.sizes()[index] as f64;
        let stride = self.mesh.stride(index) as f64;
        self.ctx().build("axis_index", |f| {
            let id = f.partition_id();
            let stride = f.scalar(stride, DType::I32)?;
            let size = f.scalar(size, DType::I32)?;
            let q = f.div(id, stride)?;
            Ok(f.rem(q, size)?)
        })
    }

    /// Declares the layout of a per-device value built directly with the [`FuncBuilder`]
    /// (by [`Spmd::with_builder`], a local op, or the gradients [`Spmd::vjp`] returns): how
    /// values computed on the raw builder enter the typed world. Checks the rank and that no
    /// mesh axis is used twice.
    pub fn declare<S: Layout<M>, V: Variation<M>>(
        &self,
        value: Value,
    ) -> Result<DTensor<'_, M, S, V>, CollectiveError> {
        declare(self.ctx(), value, TensorLayout::of::<M, S, V>(), "declare")
    }

    /// Runs a local (per-device) computation on the values of `inputs` and returns its raw
    /// results; [`Spmd::local_results`] (several results) and [`Spmd::local`] (one) type them
    /// instead. This is where kernels compose: the closure may call
    /// `tessera_dsl::stablehlo::lower_into(kernel, f, args)`.
    pub fn local_values(
        &self,
        inputs: &[&dyn LocalValue<M>],
        f: impl FnOnce(&mut FuncBuilder<'_>, &[Value]) -> Result<Vec<Value>, CollectiveError>,
    ) -> Result<Vec<Value>, CollectiveError> {
        let args: Vec<Value> = inputs.iter().map(|x| x.local_value()).collect();
        self.ctx().build("local op", |b| f(b, &args))
    }

    /// A local computation with several results, typed by `R`: a tuple of [`DTensor`]s
    /// (`(DTensor<'_, M, S1, V1>, DTensor<'_, M, S2, V2>, ..)`, up to 4) whose shardings say
    /// what each device holds. A typed local op (e.g. a kernel) states `R` in its signature,
    /// so its callers get typed results. `f` returns one value per result, in order.
    pub fn local_results<'p, R: LocalResults<'p, M>>(
        &'p self,
        inputs: &[&dyn LocalValue<M>],
        f: impl FnOnce(&mut FuncBuilder<'_>, &[Value]) -> Result<Vec<Value>, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let values = self.local_values(inputs, f)?;
        if values.len() != R::COUNT {
            return Err(CollectiveError::operand(
                "local op",
                format!(
                    "the closure returned {} values for {} typed results",
                    values.len(),
                    R::COUNT
                ),
            ));
        }
        R::wrap(self, &values)
    }

    /// A local computation with one result, declared to have the layout `S`, `V`.
    pub fn local<S: Layout<M>, V: Variation<M>>(
        &self,
        inputs: &[&dyn LocalValue<M>],
        f: impl FnOnce(&mut FuncBuilder<'_>, &[Value]) -> Result<Value, CollectiveError>,
    ) -> Result<DTensor<'_, M, S, V>, CollectiveError> {
        let out = self.local_values(inputs, |b, args| Ok(vec![f(b, args)?]))?;
        self.declare(out[0])
    }

    /// Runs `f` on the underlying builder (untyped access).
    pub fn with_builder<R>(
        &self,
        f: impl FnOnce(&mut FuncBuilder<'_>) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        self.ctx().build("with_builder", f)
    }

    /// A handle that emits collectives on raw values into this program and records them
    /// ([`CollectiveRecorder`]); it may outlive the borrow of the builder, e.g. inside a
    /// custom-VJP rule.
    pub fn collective_recorder(&self) -> CollectiveRecorder {
        CollectiveRecorder {
            tape: self.tape.clone(),
        }
    }

    /// The collectives emitted so far, in order: the forward's, and the transposes a
    /// [`Spmd::vjp`] emitted.
    pub fn collectives(&self) -> Vec<CollectiveCall> {
        self.tape.borrow().clone()
    }

    /// Reverse-mode autodiff of the program built so far (`tessera_hlo::autodiff`): appends
    /// the backward and returns the per-device cotangents of `wrt` (give them their layout
    /// with [`Spmd::declare`], usually `wrt`'s), given one cotangent per output.
    ///
    /// Every collective of a [`DTensor`] is differentiated by its transpose
    /// ([`Collective::transpose`](crate::Collective::transpose)), which joins
    /// [`Spmd::collectives`]. The cotangents are per device, as the values are; a `psum`'s
    /// result and its cotangent are one value held by every device of the axis (JAX's
    /// convention), so a replicated loss takes the cotangent 1 on every device.
    pub fn vjp(
        &self,
        outputs: &[&dyn LocalValue<M>],
        cotangents: &[&dyn LocalValue<M>],
        wrt: &[&dyn LocalValue<M>],
    ) -> Result<Vec<Value>, CollectiveError> {
        let values = |xs: &[&dyn LocalValue<M>]| -> Vec<Value> {
            xs.iter().map(|x| x.local_value()).collect()
        };
        let (y, ct, x) = (values(outputs), values(cotangents), values(wrt));
        self.ctx().build("vjp", |f| Ok(f.vjp(&y, &ct, &x)?))
    }

    /// Removes the ops no output needs ([`FuncBuilder::prune`]) and their collectives from
    /// [`Spmd::collectives`]: e.g. the forward's output collectives in a program that returns
    /// only gradients.
    pub fn prune(&self) -> Result<(), CollectiveError> {
        self.outside_loop("prune")?;
        let keep: Vec<Value> = self.outputs.borrow().iter().map(|(v, _)| *v).collect();
        let removed = self.ctx().build("prune", |f| Ok(f.prune(&keep)))?;
        self.tape
            .borrow_mut()
            .retain(|c| !removed.contains(&c.output));
        Ok(())
    }

    /// The signature so far.
    pub fn signature(&self) -> Signature {
        Signature {
            inputs: self.inputs.borrow().clone(),
            outputs: self
                .outputs
                .borrow()
                .iter()
                .map(|(_, i)| i.clone())
                .collect(),
        }
    }

    /// Ends the function: it returns the tensors given to [`DTensor::output`], in order, each
    /// a per-device block: [`Sharding::ManualSplit`] on a module with a mesh (as
    /// [`Program::build`](crate::Program::build) makes), else [`Sharding::Manual`].
    pub fn finish(self) -> Result<Signature, CollectiveError> {
        let (builder, signature, outputs) = self.into_parts();
        let results: Vec<(Value, Option<Sharding>)> = outputs
            .into_iter()
            .zip(&signature.outputs)
            .map(|(v, info)| (v, Some(block_sharding(&builder, &info.spec))))
            .collect();
        builder.finish_with_shardings(&results)?;
        Ok(signature)
    }

    /// Hands the builder back unfinished, with the signature and the output values.
    pub fn into_parts(self) -> (FuncBuilder<'m>, Signature, Vec<Value>) {
        let signature = self.signature();
        let values = self
            .outputs
            .into_inner()
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        let builder = match self.builder.into_inner() {
            Builder::Function(b) => b,
            // Loop bodies' `Spmd`s live inside `Spmd::scan`, which lends them by reference.
            Builder::LoopBody(_) => unreachable!("a scan body's Spmd is never handed out by value"),
        };
        (builder, signature, values)
    }

    /// Fails when this `Spmd` builds a [`Spmd::scan`] body, where `op` (which belongs to the
    /// function: arguments, results, pruning) cannot go.
    fn outside_loop(&self, op: &'static str) -> Result<(), CollectiveError> {
        let in_loop = matches!(
            self.builder.try_borrow().as_deref(),
            Ok(Builder::LoopBody(_))
        );
        if in_loop {
            return Err(CollectiveError::operand(
                op,
                "inside a scan body: arguments, outputs and pruning belong to the function; \
                 call it on the function's Spmd, outside the scan",
            ));
        }
        Ok(())
    }

    /// The `Spmd` of a loop body built on `builder` (lent by the loop): the same mesh and
    /// record of collectives.
    pub(crate) fn loop_body<'b>(
        &self,
        builder: &'b mut (dyn LoopBuilder + 'b),
        axis_indices: Vec<Value>,
    ) -> Spmd<'b, M> {
        Spmd {
            builder: RefCell::new(Builder::LoopBody(builder)),
            mesh: self.mesh.clone(),
            inputs: RefCell::new(Vec::new()),
            outputs: RefCell::new(Vec::new()),
            tape: self.tape.clone(),
            axis_indices,
        }
    }
}

/// Wraps `value` as a tensor of `layout` after checking it fits.
pub(crate) fn declare<'p, M: MeshShape, S, V>(
    ctx: &'p (dyn Ctx<M> + 'p),
    value: Value,
    layout: TensorLayout,
    op: &'static str,
) -> Result<DTensor<'p, M, S, V>, CollectiveError> {
    let ty = ctx.build(op, |f| Ok(f.value_type(value)?.clone()))?;
    layout.validate(
        ctx.mesh(),
        ty.rank(),
        &format!("{op} of a local value {ty}"),
    )?;
    Ok(DTensor::new(ctx, value, layout))
}

/// The sharding of an argument or result of `f` split as `spec`: on a module with a mesh,
/// that block of the global tensor (Shardy's form names the split axes); else `{manual}`.
fn block_sharding(f: &FuncBuilder<'_>, spec: &PartitionSpec) -> Sharding {
    if f.mesh().is_empty() {
        return Sharding::Manual;
    }
    Sharding::ManualSplit(
        spec.dims()
            .iter()
            .map(|d| match d {
                DimSpec::Split(axis) => Some(axis.to_string()),
                DimSpec::Replicated => None,
            })
            .collect(),
    )
}
