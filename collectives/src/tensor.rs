//! [`DTensor`]: a distributed tensor whose sharding is part of its type, and the typed
//! collective combinators.

use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;

use tessera_hlo::autodiff::{VjpCall, VjpRule};
use tessera_hlo::{BinaryOp, DType, FuncBuilder, HloError, TensorType, Value};

use crate::axis::MeshAxis;
use crate::collective::Collective;
use crate::error::CollectiveError;
use crate::layout::{
    AllToAllOut, ConcatDimOf, DimAt, DimSpec, GatherDimOf, Invariant, InvariantOutput, Layout,
    MatchesOutput, PermuteDimOf, SameMesh, SameSharding, SameVariation, ScatterDimOf, SplitDimOf,
    Variation, Varying, VaryingOver, WithSplit, WithWhole,
};
use crate::mesh::{HasAxis, MeshShape};
use crate::spmd::{declare, CollectiveCall, Ctx, LocalValue, Tape, TensorInfo, TensorLayout};

/// The VJP of a collective: its transpose ([`Collective::transpose`]), recorded on the
/// program's tape.
#[derive(Debug)]
struct TransposeRule {
    collective: Collective,
    tape: Tape,
}

impl VjpRule for TransposeRule {
    fn name(&self) -> &str {
        self.collective.name()
    }

    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, HloError> {
        let Some(ct) = call.cotangents[0] else {
            return Ok(vec![None]);
        };
        let t = self.collective.transpose();
        let input_type = f.value_type(ct)?.clone();
        let back = t.emit(f, ct).map_err(|e| HloError::Autodiff {
            op: format!("{} (transpose of {})", t.name(), self.collective.name()),
            reason: e.to_string(),
        })?;
        self.tape.borrow_mut().push(CollectiveCall {
            collective: t,
            input: ct,
            output: back,
            input_type,
        });
        Ok(vec![Some(back)])
    }
}

/// A distributed tensor of an SPMD program on mesh `M`: one per-device value (a StableHLO
/// value of the program being built), with its sharding in the type.
///
/// * `S`: the sharding, a tuple with one entry per dim: [`Replicated`](crate::Replicated)
///   (every device holds the whole dim) or [`Split<A>`](crate::Split) (the dim is cut into
///   equal blocks over mesh axis `A`). E.g. Ulysses' sequence-sharded
///   `[B, H, S/U, D]` is `(Replicated, Replicated, Split<Context>, Replicated)`.
/// * `V`: [`Invariant`] (the default), or [`Varying<A>`] for per-device values that differ
///   along `A` beyond the split dims (partial sums, `axis_index`).
///
/// The combinators change the type the way the collective changes the layout, and reject
/// at compile time what does not fit (e.g. an `all_to_all` whose concat dim is not the one
/// split over its axis). What the types cannot know (sizes) is checked when the op is built.
pub struct DTensor<'p, M, S, V = Invariant> {
    ctx: &'p (dyn Ctx<M> + 'p),
    value: Value,
    layout: TensorLayout,
    _types: PhantomData<fn() -> (S, V)>,
}

impl<M, S, V> Clone for DTensor<'_, M, S, V> {
    fn clone(&self) -> Self {
        DTensor {
            ctx: self.ctx,
            value: self.value,
            layout: self.layout.clone(),
            _types: PhantomData,
        }
    }
}

impl<M, S, V> fmt::Debug for DTensor<'_, M, S, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DTensor")
            .field("value", &self.value)
            .field("layout", &self.layout.to_string())
            .finish()
    }
}

impl<M, S, V> LocalValue<M> for DTensor<'_, M, S, V> {
    fn local_value(&self) -> Value {
        self.value
    }
}

impl<'p, M: MeshShape, S, V> DTensor<'p, M, S, V> {
    pub(crate) fn new(ctx: &'p (dyn Ctx<M> + 'p), value: Value, layout: TensorLayout) -> Self {
        DTensor {
            ctx,
            value,
            layout,
            _types: PhantomData,
        }
    }

    /// The per-device StableHLO value.
    pub fn value(&self) -> Value {
        self.value
    }

    /// The run-time layout (the same as the type's).
    pub fn layout(&self) -> &TensorLayout {
        &self.layout
    }

    /// The type each device holds.
    pub fn local_type(&self) -> Result<TensorType, CollectiveError> {
        let v = self.value;
        self.ctx
            .build("local_type", |f| Ok(f.value_type(v)?.clone()))
    }

    /// The element type.
    pub fn dtype(&self) -> Result<DType, CollectiveError> {
        Ok(self.local_type()?.dtype)
    }

    /// The dims of the whole (logical) tensor.
    pub fn global_dims(&self) -> Result<Vec<i64>, CollectiveError> {
        let local = self.local_type()?;
        self.layout.global_dims(self.ctx.mesh(), &local.dims)
    }

    fn with_layout<S2, V2>(&self, value: Value, layout: TensorLayout) -> DTensor<'p, M, S2, V2> {
        DTensor::new(self.ctx, value, layout)
    }

    /// Emits `c` on this tensor, records it, and returns the result with `layout`. The
    /// collective is a custom-VJP unit whose rule is its transpose (recorded too).
    fn collective<S2, V2>(
        &self,
        c: Collective,
        layout: TensorLayout,
    ) -> Result<DTensor<'p, M, S2, V2>, CollectiveError> {
        let x = self.value;
        let rule = Rc::new(TransposeRule {
            collective: c.clone(),
            tape: self.ctx.tape(),
        });
        let (y, input_type) = self.ctx.build(c.name(), |f| {
            let input_type = f.value_type(x)?.clone();
            let y = f.custom_vjp(rule, &[x], |f, x| {
                Ok::<_, CollectiveError>(vec![c.emit(f, x[0])?])
            })?;
            Ok((y[0], input_type))
        })?;
        self.ctx.tape().borrow_mut().push(CollectiveCall {
            collective: c,
            input: x,
            output: y,
            input_type,
        });
        Ok(self.with_layout(y, layout))
    }

    fn axis<A: MeshAxis>(&self) -> Result<crate::AxisGroups, CollectiveError> {
        self.ctx.mesh().axis_by_name(A::NAME)
    }

    /// `all_to_all` over `A` (JAX: `all_to_all(x, A, SPLIT, CONCAT, tiled=True)`): dim
    /// `CONCAT`, split over `A`, becomes whole, and dim `SPLIT`, whole, becomes split over
    /// `A`. The global tensor is unchanged; only its layout moves.
    ///
    /// Ulysses: `[B, H, S/U, D] -> [B, H/U, S, D]` is `all_to_all::<Context, 1, 2>()`, and the
    /// inverse `all_to_all::<Context, 2, 1>()`. Fails if the per-device size of dim `SPLIT`
    /// does not divide by the size of `A`.
    pub fn all_to_all<A, const SPLIT: usize, const CONCAT: usize>(
        &self,
    ) -> Result<DTensor<'p, M, AllToAllOut<S, A, SPLIT, CONCAT>, V>, CollectiveError>
    where
        A: MeshAxis,
        S: DimAt<SPLIT> + SplitDimOf<A, SPLIT> + ConcatDimOf<A, CONCAT>,
        WithSplit<S, A, SPLIT>: DimAt<CONCAT>,
    {
        let mut layout = self.layout.clone();
        layout.spec.0[CONCAT] = DimSpec::Replicated;
        layout.spec.0[SPLIT] = DimSpec::Split(A::NAME);
        let c = Collective::AllToAll {
            axis: self.axis::<A>()?,
            split_dim: SPLIT,
            concat_dim: CONCAT,
        };
        self.collective(c, layout)
    }

    /// `all_gather` over `A` (JAX: `all_gather(x, A, axis=DIM, tiled=True)`): dim `DIM`, split
    /// over `A`, becomes whole on every device of `A`.
    pub fn all_gather<A, const DIM: usize>(
        &self,
    ) -> Result<DTensor<'p, M, WithWhole<S, DIM>, V>, CollectiveError>
    where
        A: MeshAxis,
        S: DimAt<DIM> + GatherDimOf<A, DIM>,
    {
        let mut layout = self.layout.clone();
        layout.spec.0[DIM] = DimSpec::Replicated;
        let c = Collective::AllGather {
            axis: self.axis::<A>()?,
            dim: DIM,
        };
        self.collective(c, layout)
    }

    /// `reduce_scatter` over `A` (JAX: `psum_scatter(x, A, scatter_dimension=DIM,
    /// tiled=True)`): sums the per-device values of a tensor varying over `A`, and device `j`
    /// of `A` keeps block `j` of dim `DIM`. Fails if dim `DIM` does not divide by the size of
    /// `A`.
    pub fn reduce_scatter<A, const DIM: usize>(
        &self,
    ) -> Result<DTensor<'p, M, WithSplit<S, A, DIM>, Invariant>, CollectiveError>
    where
        A: MeshAxis,
        S: DimAt<DIM> + ScatterDimOf<A, DIM>,
        V: VaryingOver<A>,
    {
        let layout = TensorLayout {
            spec: {
                let mut spec = self.layout.spec.clone();
                spec.0[DIM] = DimSpec::Split(A::NAME);
                spec
            },
            varying: None,
        };
        let c = Collective::ReduceScatter {
            axis: self.axis::<A>()?,
            dim: DIM,
        };
        self.collective(c, layout)
    }

    /// `psum` over `A`: sums the per-device values of a tensor varying over `A`; the result is
    /// the same on every device of `A`.
    pub fn psum<A>(&self) -> Result<DTensor<'p, M, S, Invariant>, CollectiveError>
    where
        A: MeshAxis,
        V: VaryingOver<A>,
    {
        let layout = TensorLayout {
            spec: self.layout.spec.clone(),
            varying: None,
        };
        let c = Collective::Psum {
            axis: self.axis::<A>()?,
        };
        self.collective(c, layout)
    }

    /// `ppermute` over `A` (JAX: `ppermute(x, A, perm)`): for each `(source, target)` pair of
    /// positions along `A`, the source's block of dim `DIM` (split over `A`) goes to the
    /// target; a device that is no target receives zeros. Fails on an invalid permutation.
    pub fn ppermute<A, const DIM: usize>(
        &self,
        pairs: &[(usize, usize)],
    ) -> Result<Self, CollectiveError>
    where
        A: MeshAxis,
        S: PermuteDimOf<A, DIM>,
    {
        let c = Collective::Ppermute {
            axis: self.axis::<A>()?,
            pairs: pairs.to_vec(),
        };
        self.collective(c, self.layout.clone())
    }

    /// The ring shift over `A`: device `i` of `A` sends its block of dim `DIM` to device
    /// `(i + offset) mod size` (`offset` may be negative). Ring attention rotates K/V with
    /// `ring_shift::<Context, 2>(1)`.
    pub fn ring_shift<A, const DIM: usize>(&self, offset: i64) -> Result<Self, CollectiveError>
    where
        A: MeshAxis,
        S: PermuteDimOf<A, DIM>,
    {
        let c = Collective::ring_shift(self.axis::<A>()?, offset);
        self.collective(c, self.layout.clone())
    }

    fn binary<M2, S2, V2>(
        &self,
        op: BinaryOp,
        other: &DTensor<'_, M2, S2, V2>,
    ) -> Result<Self, CollectiveError> {
        let (x, y) = (self.value, other.value);
        let z = self.ctx.build(op.op_name(), |f| Ok(f.binary(op, x, y)?))?;
        Ok(self.with_layout(z, self.layout.clone()))
    }

    /// Elementwise sum of two tensors of the same mesh, sharding and variation.
    pub fn add<M2, S2, V2>(&self, other: &DTensor<'_, M2, S2, V2>) -> Result<Self, CollectiveError>
    where
        M2: SameMesh<M>,
        S2: SameSharding<S>,
        V2: SameVariation<V>,
    {
        self.binary(BinaryOp::Add, other)
    }

    /// Elementwise difference (see [`DTensor::add`]).
    pub fn sub<M2, S2, V2>(&self, other: &DTensor<'_, M2, S2, V2>) -> Result<Self, CollectiveError>
    where
        M2: SameMesh<M>,
        S2: SameSharding<S>,
        V2: SameVariation<V>,
    {
        self.binary(BinaryOp::Sub, other)
    }

    /// Elementwise product (see [`DTensor::add`]).
    pub fn mul<M2, S2, V2>(&self, other: &DTensor<'_, M2, S2, V2>) -> Result<Self, CollectiveError>
    where
        M2: SameMesh<M>,
        S2: SameSharding<S>,
        V2: SameVariation<V>,
    {
        self.binary(BinaryOp::Mul, other)
    }

    /// Converts the elements to `dtype` (same layout).
    pub fn convert(&self, dtype: DType) -> Result<Self, CollectiveError> {
        let x = self.value;
        let y = self
            .ctx
            .build("stablehlo.convert", |f| Ok(f.convert(x, dtype)?))?;
        Ok(self.with_layout(y, self.layout.clone()))
    }

    /// A local (per-device) computation that keeps the layout: `f` receives the builder and
    /// this device's value and returns a value of the same rank (its per-device sizes may
    /// differ). For a local op with requirements on the layout, bound its argument's
    /// sharding, e.g. `S: WholeDim<2>` for an op that needs the whole sequence.
    pub fn map_local(
        &self,
        f: impl FnOnce(&mut FuncBuilder<'_>, Value) -> Result<Value, CollectiveError>,
    ) -> Result<Self, CollectiveError> {
        let x = self.value;
        let y = self.ctx.build("local op", |b| f(b, x))?;
        declare(self.ctx, y, self.layout.clone(), "map_local")
    }

    /// A local computation whose result has another layout, declared as `S2`, `V2` (e.g. a
    /// local matmul over a split contraction dim gives a partial sum: `Varying<A>`).
    pub fn map_local_as<S2: Layout<M>, V2: Variation<M>>(
        &self,
        f: impl FnOnce(&mut FuncBuilder<'_>, Value) -> Result<Value, CollectiveError>,
    ) -> Result<DTensor<'p, M, S2, V2>, CollectiveError> {
        let x = self.value;
        let y = self.ctx.build("local op", |b| f(b, x))?;
        declare(self.ctx, y, TensorLayout::of::<M, S2, V2>(), "map_local_as")
    }

    /// Returns this tensor from the program, declared with the output sharding `D` (JAX:
    /// `out_specs`): a tensor of another sharding, or one that still varies, does not compile.
    pub fn output<D: Layout<M>>(&self) -> Result<(), CollectiveError>
    where
        S: MatchesOutput<D>,
        V: InvariantOutput,
    {
        let local = self.local_type()?;
        let global = self.global_dims()?;
        let info = TensorInfo {
            spec: D::spec(),
            global: TensorType::new(global, local.dtype),
            local,
        };
        self.ctx.add_output(self.value, info)
    }
}

impl<'p, M: MeshShape, S> DTensor<'p, M, S, Invariant> {
    /// Marks the tensor as varying over `A` (JAX: `pvary`): the identity on the value, after
    /// which each device's copy counts as one summand (a `psum` over `A` then multiplies by
    /// the axis size). The transpose of `psum`.
    pub fn vary<A>(&self) -> Result<DTensor<'p, M, S, Varying<A>>, CollectiveError>
    where
        A: MeshAxis,
        M: HasAxis<A>,
    {
        let layout = TensorLayout {
            spec: self.layout.spec.clone(),
            varying: Some(A::NAME),
        };
        let rank = self.local_type()?.rank();
        layout.validate(self.ctx.mesh(), rank, "vary")?;
        let c = Collective::Pvary {
            axis: self.ctx.mesh().axis::<A>(),
        };
        self.collective(c, layout)
    }
}
