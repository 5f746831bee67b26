//! Kernel definitions and their instantiation: `#[tpu_kernel]` expands to a function that
//! returns a [`KernelDef`]; instantiating it with argument shapes traces the body into a
//! verified [`Kernel`], checked against a target's rules and cached.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{
    verify, BlockDim, BlockMapping, Buffering, DType, DeviceAxis, DimSemantics, Kernel, Loc,
    MemorySpace, OperandRole, Param, RefId, SemKind, ValueType,
};
use crate::rules::{self, KernelRules};
use crate::trace::Element;
use crate::trace::{
    Devices, DmaSem, Hbm, HbmMut, Ref, RefMut, Scratch, Sem, Smem, TraceState, Value, Vmem,
};
use tessera_hlo::MeshShape;

/// The dtype and shape of one kernel argument (an input or scalar-prefetch array).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArgSpec {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl ArgSpec {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        ArgSpec {
            dtype,
            shape: shape.into(),
        }
    }

    /// The dtype and shape of a host array, as instantiation wants them.
    pub fn of(a: &crate::HostArray) -> Self {
        ArgSpec::new(a.dtype(), a.shape())
    }
}

impl fmt::Display for ArgSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", ValueType::new(self.dtype, self.shape.clone()))
    }
}

/// A kernel argument as declared in the signature (for listings and messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgDecl {
    pub name: &'static str,
    pub role: OperandRole,
    pub dtype: DType,
    pub rank: usize,
    /// Declared `Option<Ref<T>>` / `Option<Smem<T>>`: [`KernelDef::without`] leaves it out.
    pub optional: bool,
}

impl ArgDecl {
    /// A required argument (kernels written without the macro declare theirs this way).
    pub fn new(name: &'static str, role: OperandRole, dtype: DType, rank: usize) -> Self {
        ArgDecl {
            name,
            role,
            dtype,
            rank,
            optional: false,
        }
    }
}

/// Returned by builder steps that found a problem; the problem itself is in the builder.
#[derive(Debug, Clone, Copy)]
pub struct Stop;

type BuildFn = dyn Fn(&mut Builder) -> Result<(), Stop> + Send + Sync;

/// A kernel with its compile-time parameters fixed, ready to instantiate for argument shapes.
#[derive(Clone)]
pub struct KernelDef {
    name: &'static str,
    params: Vec<Param>,
    /// The arguments it takes: the declared ones but those left out.
    args: Vec<ArgDecl>,
    /// The optional outputs it still writes (declared `Option<RefMut<T>>` or `Option<HbmMut<T>>`).
    optional_outputs: Vec<&'static str>,
    /// The optional arguments and outputs left out ([`KernelDef::without`]), in the order
    /// they were left out.
    absent: Vec<&'static str>,
    loc: Loc,
    build: Arc<BuildFn>,
}

impl fmt::Debug for KernelDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelDef")
            .field("name", &self.name)
            .field("params", &self.params)
            .field("args", &self.args)
            .field("optional_outputs", &self.optional_outputs)
            .field("absent", &self.absent)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    name: &'static str,
    loc: Loc,
    params: Vec<Param>,
    absent: Vec<&'static str>,
    args: Vec<ArgSpec>,
    mesh: Vec<DeviceAxis>,
    rules: KernelRules,
}

fn cache() -> &'static Mutex<HashMap<CacheKey, Arc<Kernel>>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<Kernel>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

impl KernelDef {
    #[doc(hidden)]
    pub fn __new(
        name: &'static str,
        params: Vec<Param>,
        args: Vec<ArgDecl>,
        loc: Loc,
        build: impl Fn(&mut Builder) -> Result<(), Stop> + Send + Sync + 'static,
    ) -> Self {
        KernelDef {
            name,
            params,
            args,
            optional_outputs: Vec::new(),
            absent: Vec::new(),
            loc,
            build: Arc::new(build),
        }
    }

    /// `def` with the names of its optional outputs (the macro declares them).
    #[doc(hidden)]
    pub fn __with_optional_outputs(mut def: Self, names: Vec<&'static str>) -> Self {
        def.optional_outputs = names;
        def
    }

    /// The kernel without its optional argument or output `name`. An argument declared
    /// `Option<Ref<T>>`, `Option<Hbm<T>>` or `Option<Smem<T>>`: the caller passes no array for
    /// it and the body
    /// gets `None`, where Pallas passes `None` for an operand. An output declared
    /// `Option<RefMut<T>>` or `Option<HbmMut<T>>`: the kernel no longer produces it (its
    /// outputs are the others, in order) and the body gets `None`, as a Pallas kernel whose out spec is `None`. A
    /// different kernel (cached apart); `args()` lists the arguments that remain.
    pub fn without(mut self, name: &str) -> Result<KernelDef, KernelError> {
        if let Some(i) = self.optional_outputs.iter().position(|&o| o == name) {
            let removed = self.optional_outputs.remove(i);
            self.absent.push(removed);
            return Ok(self);
        }
        let Some(i) = self.args.iter().position(|a| a.name == name) else {
            let message = if self.absent.contains(&name) {
                format!("`{name}` is already left out")
            } else {
                let names: Vec<&str> = self.args.iter().map(|a| a.name).collect();
                let outputs = if self.optional_outputs.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; its optional outputs: {}",
                        self.optional_outputs.join(", ")
                    )
                };
                format!(
                    "no argument or optional output `{name}`; its arguments: {}{outputs}",
                    names.join(", ")
                )
            };
            return Err(KernelError::single(
                self.name,
                ProblemKind::Argument,
                name,
                message,
            ));
        };
        if !self.args[i].optional {
            return Err(KernelError::single(
                self.name,
                ProblemKind::Argument,
                name,
                format!(
                    "`{name}` is required; only arguments declared `Option<Ref<T>>`, \
                     `Option<Hbm<T>>` or `Option<Smem<T>>` and outputs declared `Option<RefMut<T>>` or \
                     `Option<HbmMut<T>>` can be left out"
                ),
            ));
        }
        let removed = self.args.remove(i);
        self.absent.push(removed.name);
        Ok(self)
    }

    /// The optional arguments and outputs left out ([`KernelDef::without`]).
    pub fn absent(&self) -> &[&'static str] {
        &self.absent
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The compile-time parameters (block sizes, dtypes, flags) this definition fixed.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The arguments to pass at instantiation and run time, in order.
    pub fn args(&self) -> &[ArgDecl] {
        &self.args
    }

    /// Traces the kernel for arguments of the given dtypes and shapes, verifies it and checks
    /// `rules`. Cached by (kernel, parameters, argument shapes, rules).
    pub fn instantiate(
        &self,
        args: &[ArgSpec],
        rules: &KernelRules,
    ) -> Result<Arc<Kernel>, KernelError> {
        self.instantiate_on(args, &[], rules)
    }

    /// [`KernelDef::instantiate`] for a kernel that runs on a device mesh (it declares one
    /// with `Devices<M>`): `mesh` gives the axes of `M`, in order, with their sizes. A kernel
    /// that declares no mesh ignores it.
    pub fn instantiate_on(
        &self,
        args: &[ArgSpec],
        mesh: &[DeviceAxis],
        rules: &KernelRules,
    ) -> Result<Arc<Kernel>, KernelError> {
        let key = CacheKey {
            name: self.name,
            loc: self.loc,
            params: self.params.clone(),
            absent: self.absent.clone(),
            args: args.to_vec(),
            mesh: mesh.to_vec(),
            rules: rules.clone(),
        };
        if let Some(k) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(Arc::clone(k));
        }
        let kernel = Arc::new(self.trace(args, mesh, rules)?);
        cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::clone(&kernel));
        Ok(kernel)
    }

    fn trace(
        &self,
        args: &[ArgSpec],
        mesh: &[DeviceAxis],
        rules: &KernelRules,
    ) -> Result<Kernel, KernelError> {
        let err = |problems| KernelError::new(self.name, problems);
        if args.len() != self.args.len() {
            let expected: Vec<String> = self
                .args
                .iter()
                .map(|a| format!("{} ({} rank {})", a.name, a.dtype, a.rank))
                .collect();
            return Err(KernelError::single(
                self.name,
                ProblemKind::Argument,
                "arguments",
                format!(
                    "expected {} arguments [{}], got {}",
                    self.args.len(),
                    expected.join(", "),
                    args.len()
                ),
            ));
        }
        let mut b = Builder {
            loc: self.loc,
            absent: self.absent.clone(),
            args: args.to_vec(),
            next_arg: 0,
            problems: Vec::new(),
            grid: Vec::new(),
            semantics: Vec::new(),
            mesh: mesh.to_vec(),
            kernel_mesh: Vec::new(),
        };
        let (state, result) = TraceState::run(TraceState::new(0), || (self.build)(&mut b));
        let mut problems = b.problems;
        problems.extend(state.problems.iter().map(|p| Problem {
            kind: ProblemKind::Trace,
            subject: format!("`{}`", p.op),
            message: p.message.clone(),
            loc: Some(p.loc),
        }));
        if result.is_err() || !problems.is_empty() {
            if problems.is_empty() {
                problems.push(Problem {
                    kind: ProblemKind::Trace,
                    subject: "kernel".into(),
                    message: "instantiation stopped without a reason (a tessera bug)".into(),
                    loc: Some(self.loc),
                });
            }
            return Err(err(problems));
        }
        let mut regions = state.regions;
        let body = regions.pop().unwrap_or_default();
        let kernel = Kernel {
            name: self.name.to_string(),
            params: self.params.clone(),
            grid: b.grid,
            semantics: b.semantics,
            operands: state.operands,
            mesh: b.kernel_mesh,
            body,
            types: state.types,
            loc: self.loc,
            checks: Default::default(),
        };
        // `kernel` verified; `whose` follows each failing op's name in its problem.
        let verified = |kernel: &Kernel, whose: &str| {
            verify(kernel).map_err(|errors| {
                err(errors
                    .into_iter()
                    .map(|e| Problem {
                        kind: ProblemKind::Verify,
                        subject: format!("`{}`{whose}", e.op),
                        message: e.message,
                        loc: Some(e.loc),
                    })
                    .collect())
            })
        };
        verified(&kernel, "")?;
        // Every run-time index proven in range or guarded (unless the rules turn the checks
        // off); what the guards add is verified as the author's code is.
        let kernel = if rules.run_time_checks {
            crate::checks::insert(kernel, &state.unchecked)
        } else {
            kernel
        };
        verified(&kernel, " (a run-time check; a tessera bug)")?;
        let mut problems = rules::check(&kernel, rules);
        problems.extend(crate::interpreter::check_coverage(&kernel));
        problems.extend(crate::ir::check_protocol(&kernel));
        if problems.is_empty() {
            Ok(kernel)
        } else {
            Err(err(problems))
        }
    }
}

/// The instantiation context `#[tpu_kernel]`-generated code talks to. Not for direct use.
#[derive(Debug)]
pub struct Builder {
    loc: Loc,
    absent: Vec<&'static str>,
    args: Vec<ArgSpec>,
    next_arg: usize,
    problems: Vec<Problem>,
    grid: Vec<usize>,
    semantics: Vec<DimSemantics>,
    /// The mesh given at instantiation, and the one the kernel declared (`Devices<M>`).
    mesh: Vec<DeviceAxis>,
    kernel_mesh: Vec<DeviceAxis>,
}

impl Builder {
    fn problem(&mut self, kind: ProblemKind, subject: impl Into<String>, message: String) -> Stop {
        self.problems.push(Problem {
            kind,
            subject: subject.into(),
            message,
            loc: Some(self.loc),
        });
        Stop
    }

    /// Takes the next argument's shape, checking its dtype and rank.
    #[doc(hidden)]
    pub fn __arg(&mut self, name: &str, dtype: DType, rank: usize) -> Result<Vec<usize>, Stop> {
        let index = self.next_arg;
        self.next_arg += 1;
        let Some(arg) = self.args.get(index).cloned() else {
            return Err(self.problem(ProblemKind::Argument, name, "missing argument".into()));
        };
        if arg.dtype != dtype {
            return Err(self.problem(
                ProblemKind::Argument,
                format!("argument {index} ({name})"),
                format!("expected a {dtype} array, got {arg}"),
            ));
        }
        if arg.shape.len() != rank {
            return Err(self.problem(
                ProblemKind::Argument,
                format!("argument {index} ({name})"),
                format!("expected a rank-{rank} array, got {arg}"),
            ));
        }
        if arg.shape.contains(&0) {
            return Err(self.problem(
                ProblemKind::Argument,
                format!("argument {index} ({name})"),
                format!("empty arrays are not supported, got {arg}"),
            ));
        }
        Ok(arg.shape)
    }

    /// Takes an optional argument's shape like [`Builder::__arg`], or `None` when the
    /// definition leaves it out ([`KernelDef::without`]; no argument is taken then).
    #[doc(hidden)]
    pub fn __optional_arg(
        &mut self,
        name: &str,
        dtype: DType,
        rank: usize,
    ) -> Result<Option<Vec<usize>>, Stop> {
        if self.absent.contains(&name) {
            return Ok(None);
        }
        self.__arg(name, dtype, rank).map(Some)
    }

    /// Whether the definition keeps the optional output `name` (not [`KernelDef::without`] it).
    #[doc(hidden)]
    pub fn __output_present(&self, name: &str) -> bool {
        !self.absent.contains(&name)
    }

    /// Checks that dim `dim` of `name` equals `expected`, the size of the symbol `symbol`.
    #[doc(hidden)]
    pub fn __dim_eq(
        &mut self,
        name: &str,
        dim: usize,
        actual: usize,
        symbol: &str,
        expected: usize,
    ) -> Result<(), Stop> {
        if actual == expected {
            return Ok(());
        }
        Err(self.problem(
            ProblemKind::Argument,
            name,
            format!(
                "dim {dim} is {actual} but `{symbol}` is {expected} (set by an earlier argument)"
            ),
        ))
    }

    /// Refuses the arguments with `message` about `subject` unless `ok` (a relation between
    /// sizes the kernel needs, e.g. one dim dividing another).
    #[doc(hidden)]
    pub fn __require(&mut self, ok: bool, subject: &str, message: String) -> Result<(), Stop> {
        if ok {
            Ok(())
        } else {
            Err(self.problem(ProblemKind::Argument, subject, message))
        }
    }

    /// Checks that every block dim is positive before the grid is computed from them.
    #[doc(hidden)]
    pub fn __blocks_positive(&mut self, name: &str, block: &[BlockDim]) -> Result<(), Stop> {
        if let Some(d) = block.iter().position(|b| *b == BlockDim::Sized(0)) {
            return Err(self.problem(
                ProblemKind::Argument,
                name,
                format!("block dim {d} is 0; block sizes must be positive"),
            ));
        }
        Ok(())
    }

    /// Sets the grid and its dimension semantics.
    #[doc(hidden)]
    pub fn __grid(&mut self, grid: &[usize], semantics: &[DimSemantics]) -> Result<(), Stop> {
        self.grid = grid.to_vec();
        self.semantics = semantics.to_vec();
        crate::trace::with_trace(|t| t.grid_rank = grid.len());
        if grid.contains(&0) {
            return Err(self.problem(
                ProblemKind::Coverage,
                "grid",
                format!(
                    "grid {grid:?} has an empty dimension: an array dim is smaller than its block"
                ),
            ));
        }
        Ok(())
    }

    /// Declares an operand of the kernel being traced and returns its id.
    #[allow(clippy::too_many_arguments)]
    fn declare(
        &mut self,
        name: &str,
        role: OperandRole,
        dtype: DType,
        memory: MemorySpace,
        array_shape: Vec<usize>,
        block: Option<BlockMapping>,
        loc: Loc,
    ) -> RefId {
        let r = crate::trace::declare_operand(name, role, dtype, memory, array_shape, loc);
        crate::trace::with_trace(|t| t.operands[r.index()].block = block);
        r
    }

    fn mapping(
        &mut self,
        block: Vec<BlockDim>,
        index_map: IndexMapFn<'_>,
        buffering: Buffering,
    ) -> BlockMapping {
        let rank = self.grid.len();
        let (mut region, yields) = crate::trace::trace_region(
            vec![ValueType::scalar(DType::I32); rank],
            |g: &[Value]| index_map(g),
        );
        region.yields = yields.iter().map(|v| v.id).collect();
        BlockMapping {
            block_shape: block,
            index_map: region,
            buffering,
        }
    }

    /// Declares a blocked VMEM input or output.
    #[allow(clippy::too_many_arguments)]
    fn blocked<T: Element>(
        &mut self,
        name: &str,
        role: OperandRole,
        shape: Vec<usize>,
        block: Vec<BlockDim>,
        index_map: IndexMapFn<'_>,
        buffering: Buffering,
        loc: Loc,
    ) -> RefId {
        let block = Some(self.mapping(block, index_map, buffering));
        self.declare(name, role, T::DTYPE, MemorySpace::Vmem, shape, block, loc)
    }

    #[doc(hidden)]
    pub fn __input<T: Element>(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        block: Vec<BlockDim>,
        index_map: IndexMapFn<'_>,
        buffering: Buffering,
        loc: Loc,
    ) -> Ref<T> {
        let input = OperandRole::Input;
        Ref::__from_id(self.blocked::<T>(name, input, shape, block, index_map, buffering, loc))
    }

    #[doc(hidden)]
    pub fn __output<T: Element>(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        block: Vec<BlockDim>,
        index_map: IndexMapFn<'_>,
        buffering: Buffering,
        loc: Loc,
    ) -> RefMut<T> {
        let output = OperandRole::Output;
        RefMut::__from_id(self.blocked::<T>(name, output, shape, block, index_map, buffering, loc))
    }

    #[doc(hidden)]
    pub fn __scratch<T: Element>(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> Scratch<T> {
        let memory = MemorySpace::Vmem;
        Scratch::__from_id(self.declare(
            name,
            OperandRole::Scratch,
            T::DTYPE,
            memory,
            shape,
            None,
            loc,
        ))
    }

    #[doc(hidden)]
    pub fn __prefetch<T: Element>(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> Smem<T> {
        let (role, memory) = (OperandRole::ScalarPrefetch, MemorySpace::Smem);
        Smem::__from_id(self.declare(name, role, T::DTYPE, memory, shape, None, loc))
    }

    /// Declares SMEM scratch (`#[scratch(..)] t: Smem<T>`, Pallas' `pltpu.SMEM`): words the
    /// kernel reads and writes one at a time, kept across grid steps.
    #[doc(hidden)]
    pub fn __smem_scratch<T: Element>(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        loc: Loc,
    ) -> Smem<T> {
        let (role, memory) = (OperandRole::Scratch, MemorySpace::Smem);
        Smem::__from_id(self.declare(name, role, T::DTYPE, memory, shape, None, loc))
    }
}

/// Operands of kernels that move their own data (see `trace::memory`).
impl Builder {
    fn unblocked(
        &mut self,
        name: &str,
        role: OperandRole,
        dtype: DType,
        memory: MemorySpace,
        shape: Vec<usize>,
        loc: Loc,
    ) -> RefId {
        crate::trace::declare_operand(name, role, dtype, memory, shape, loc)
    }

    /// Declares an input left in HBM (no block spec).
    #[doc(hidden)]
    pub fn __hbm<T: Element>(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> Hbm<T> {
        let (role, memory) = (OperandRole::Input, MemorySpace::Any);
        Hbm::__from_id(self.unblocked(name, role, T::DTYPE, memory, shape, loc))
    }

    /// Declares an output left in HBM (written by copies).
    #[doc(hidden)]
    pub fn __hbm_out<T: Element>(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> HbmMut<T> {
        let (role, memory) = (OperandRole::Output, MemorySpace::Any);
        HbmMut::__from_id(self.unblocked(name, role, T::DTYPE, memory, shape, loc))
    }

    /// Declares a VMEM scratch buffer that copies may fill or drain.
    #[doc(hidden)]
    pub fn __vmem<T: Element>(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> Vmem<T> {
        let (role, memory) = (OperandRole::Scratch, MemorySpace::Vmem);
        Vmem::__from_id(self.unblocked(name, role, T::DTYPE, memory, shape, loc))
    }

    /// Declares an array of DMA semaphores (`shape` `[]` for one).
    #[doc(hidden)]
    pub fn __dma_sems(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> DmaSem {
        let memory = MemorySpace::Semaphore(SemKind::Dma);
        DmaSem::__from_id(self.unblocked(
            name,
            OperandRole::Scratch,
            DType::I32,
            memory,
            shape,
            loc,
        ))
    }

    /// Declares an array of regular semaphores (`shape` `[]` for one).
    #[doc(hidden)]
    pub fn __sems(&mut self, name: &str, shape: Vec<usize>, loc: Loc) -> Sem {
        let memory = MemorySpace::Semaphore(SemKind::Regular);
        Sem::__from_id(self.unblocked(name, OperandRole::Scratch, DType::I32, memory, shape, loc))
    }

    /// Makes output `output` the buffer of input `input` (Pallas' `input_output_aliases`):
    /// the two must have the same dtype and shape.
    #[doc(hidden)]
    pub fn __alias(&mut self, output: &str, input: &str) -> Result<(), Stop> {
        let found = crate::trace::with_trace(|t| {
            let find = |name: &str| t.operands.iter().position(|o| o.name == name);
            Some((find(output)?, find(input)?))
        });
        let Some((out, inp)) = found else {
            let message = format!("no operand `{output}` or `{input}` to alias");
            return Err(self.problem(ProblemKind::Argument, output, message));
        };
        let (o, i) =
            crate::trace::with_trace(|t| (t.operands[out].clone(), t.operands[inp].clone()));
        if o.dtype != i.dtype || o.array_shape != i.array_shape {
            let message = format!(
                "aliases input `{input}` ({}{:?}) but is {}{:?}; an aliased output is the input's \
                 buffer, of the same dtype and shape",
                i.dtype, i.array_shape, o.dtype, o.array_shape
            );
            return Err(self.problem(ProblemKind::Argument, output, message));
        }
        crate::trace::with_trace(|t| t.operands[out].aliases = Some(RefId(inp as u32)));
        Ok(())
    }

    /// Declares that the kernel runs on mesh `M`: the instantiation must give `M`'s axes.
    #[doc(hidden)]
    pub fn __devices<M: MeshShape>(&mut self) -> Result<Devices<M>, Stop> {
        let given: Vec<&str> = self.mesh.iter().map(|a| a.name.as_str()).collect();
        if given != M::AXES {
            let message = if self.mesh.is_empty() {
                format!(
                    "the kernel runs on a mesh with axes {:?}; instantiate it with their sizes                      (`KernelDef::instantiate_on`, or run it on that many devices)",
                    M::AXES
                )
            } else {
                format!(
                    "the kernel runs on a mesh with axes {:?} but was instantiated for axes                      {given:?}",
                    M::AXES
                )
            };
            return Err(self.problem(ProblemKind::Argument, "mesh", message));
        }
        if let Some(a) = self.mesh.iter().find(|a| a.size == 0) {
            let message = format!("mesh axis `{}` has size 0", a.name);
            return Err(self.problem(ProblemKind::Argument, "mesh", message));
        }
        self.kernel_mesh = self.mesh.clone();
        let mesh = self.mesh.clone();
        crate::trace::with_trace(|t| t.memory.mesh = mesh);
        Ok(Devices::__new())
    }
}

/// An index map as generated code passes it: grid indices in, block indices out.
pub type IndexMapFn<'a> = &'a dyn Fn(&[Value]) -> Vec<Value>;

impl Param {
    /// A parameter shown by its `Display` form (block sizes, dtypes, flags).
    pub fn new(name: &str, value: impl fmt::Display) -> Self {
        Param {
            name: name.to_string(),
            value: value.to_string(),
        }
    }

    /// A parameter too large to print (a mask, a table): shown and keyed by a hash of its value.
    pub fn hashed(name: &str, value: &impl Hash) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        value.hash(&mut h);
        Param {
            name: name.to_string(),
            value: format!("#{:016x}", h.finish()),
        }
    }
}

impl Param {
    /// A `#[comptime]` argument: its `Debug` form when short, else a hash of it.
    pub fn comptime<T: ComptimeValue>(name: &str, value: &T) -> Self {
        let shown = format!("{value:?}");
        if shown.len() <= 48 && !shown.contains('\n') {
            Param {
                name: name.to_string(),
                value: shown,
            }
        } else {
            Param::hashed(name, value)
        }
    }
}

/// What a `#[comptime]` argument must be: it keys the kernel cache and is shown in the IR.
#[diagnostic::on_unimplemented(
    message = "`#[comptime]` values key the kernel cache: `{Self}` must be `Clone + Debug + Hash + Send + Sync + 'static`",
    label = "not usable as a compile-time kernel parameter"
)]
pub trait ComptimeValue: Clone + fmt::Debug + Hash + Send + Sync + 'static {}

impl<T: Clone + fmt::Debug + Hash + Send + Sync + 'static> ComptimeValue for T {}

/// The short name of a kernel's type parameter (`f32`, `bf16`), for its parameter list.
#[doc(hidden)]
pub fn __type_param_name<T: ?Sized>() -> &'static str {
    let full = std::any::type_name::<T>();
    // `half::binary16::bf16` -> `bf16`; generic arguments are kept whole.
    match full.find('<') {
        Some(_) => full,
        None => full.rsplit("::").next().unwrap_or(full),
    }
}
