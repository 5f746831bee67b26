//! Shardings as types: per-dim [`Replicated`] / [`Split`], per-tensor [`Invariant`] /
//! [`Varying`], their run-time form ([`PartitionSpec`]), and the traits the combinators
//! check. See the crate docs for the message design.

use std::fmt;
use std::marker::PhantomData;

use crate::axis::MeshAxis;
use crate::mesh::HasAxis;

/// Highest tensor rank the typed layer supports (shardings are tuples of up to this many
/// dims).
pub const MAX_RANK: usize = 8;

/// A dim that every device holds whole (JAX: `None` in a `PartitionSpec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Replicated;

/// A dim split into equal contiguous blocks over mesh axis `A`: the device at coordinate `i`
/// of `A` holds block `i` (JAX: the axis name in a `PartitionSpec`).
pub struct Split<A>(PhantomData<A>);

/// The tensor holds the same value on every device that its split dims do not tell apart
/// (the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Invariant;

/// The tensor holds a different value on each device along axis `A`, beyond what its split
/// dims say: a partial sum, an [`axis_index`](crate::Spmd::axis_index), a local op's
/// per-device result. [`psum`](crate::DTensor::psum) and
/// [`reduce_scatter`](crate::DTensor::reduce_scatter) over `A` sum those values (JAX: a value
/// whose varying manual axes include `A`).
pub struct Varying<A>(PhantomData<A>);

macro_rules! axis_marker_impls {
    ($($ty:ident => $label:literal),*) => {
        $(
            impl<A> Clone for $ty<A> {
                fn clone(&self) -> Self {
                    *self
                }
            }

            impl<A> Copy for $ty<A> {}

            impl<A> Default for $ty<A> {
                fn default() -> Self {
                    $ty(PhantomData)
                }
            }

            impl<A: MeshAxis> fmt::Debug for $ty<A> {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    write!(f, concat!($label, "<{}>"), A::NAME)
                }
            }
        )*
    };
}

axis_marker_impls!(Split => "Split", Varying => "Varying");

/// How one dim is laid out, at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DimSpec {
    /// Whole on every device.
    Replicated,
    /// Split over the named mesh axis.
    Split(&'static str),
}

/// The run-time form of a sharding: one [`DimSpec`] per dim (JAX's `PartitionSpec`).
/// Displays as `P(None, None, context, None)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PartitionSpec(pub Vec<DimSpec>);

impl PartitionSpec {
    /// Every dim whole.
    pub fn replicated(rank: usize) -> Self {
        PartitionSpec(vec![DimSpec::Replicated; rank])
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The per-dim specs.
    pub fn dims(&self) -> &[DimSpec] {
        &self.0
    }

    /// The dim split over `axis`, if any.
    pub fn dim_of(&self, axis: &str) -> Option<usize> {
        self.0
            .iter()
            .position(|d| matches!(d, DimSpec::Split(a) if *a == axis))
    }
}

impl fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("P(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                DimSpec::Replicated => f.write_str("None")?,
                DimSpec::Split(a) => f.write_str(a)?,
            }
        }
        f.write_str(")")
    }
}

// ----- validity: a sharding of mesh M -----

/// One dim's sharding on mesh `M`: [`Replicated`], or [`Split<A>`] for an axis `A` of `M`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a dim sharding",
    label = "this is not `Replicated` or `Split<Axis>`",
    note = "a sharding is a tuple with one entry per dim, each `Replicated` or `Split<Axis>`"
)]
pub trait DimSharding<M>: 'static {
    /// The run-time form.
    const SPEC: DimSpec;
}

impl<M> DimSharding<M> for Replicated {
    const SPEC: DimSpec = DimSpec::Replicated;
}

impl<M: HasAxis<A>, A: MeshAxis> DimSharding<M> for Split<A> {
    const SPEC: DimSpec = DimSpec::Split(A::NAME);
}

/// A sharding of a tensor on mesh `M`: a tuple with one [`DimSharding`] per dim (`()` for a
/// scalar), up to [`MAX_RANK`] dims.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a sharding of a tensor on the mesh `{M}`",
    label = "this is not a sharding",
    note = "a sharding is a tuple with one entry per dim (at most 8), each `Replicated` or \
            `Split<Axis>` with an axis of the mesh"
)]
pub trait Layout<M>: 'static {
    /// Number of dims.
    const RANK: usize;
    /// The run-time form.
    fn spec() -> PartitionSpec;
}

impl<M> Layout<M> for () {
    const RANK: usize = 0;
    fn spec() -> PartitionSpec {
        PartitionSpec(Vec::new())
    }
}

macro_rules! layout_tuples {
    ($(($($x:ident),+);)*) => {
        $(
            impl<M, $($x: DimSharding<M>),+> Layout<M> for ($($x,)+) {
                const RANK: usize = [$(stringify!($x)),+].len();
                fn spec() -> PartitionSpec {
                    PartitionSpec(vec![$(<$x as DimSharding<M>>::SPEC),+])
                }
            }
        )*
    };
}

layout_tuples! {
    (X0);
    (X0, X1);
    (X0, X1, X2);
    (X0, X1, X2, X3);
    (X0, X1, X2, X3, X4);
    (X0, X1, X2, X3, X4, X5);
    (X0, X1, X2, X3, X4, X5, X6);
    (X0, X1, X2, X3, X4, X5, X6, X7);
}

/// A sharding with one more dim in front, unsplit: the layout of a stack of tensors of layout
/// `Self` (e.g. per-layer weights stacked as `[L, ...]`, which [`Spmd::scan`](crate::Spmd::scan)
/// reads row by row).
pub trait Stack<M>: Layout<M> {
    /// `(Replicated, ...Self)`.
    type Stacked: Layout<M>;
}

/// A sharding whose dim 0 is [`Replicated`]: a stack of tensors whose rows have the layout
/// `Row`. A stack whose dim 0 is split has no such rows on each device.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the sharding of a stack: its dim 0 must be `Replicated`",
    label = "a scan reads rows of tensors whose dim 0 is whole on every device",
    note = "stack per-iteration tensors along a new, unsplit dim 0"
)]
pub trait Unstack<M>: Layout<M> {
    /// The sharding without dim 0.
    type Row: Layout<M>;
}

impl<M> Stack<M> for () {
    type Stacked = (Replicated,);
}

impl<M> Unstack<M> for (Replicated,) {
    type Row = ();
}

macro_rules! stack_tuples {
    ($(($($x:ident),+);)*) => {
        $(
            impl<M, $($x: DimSharding<M>),+> Stack<M> for ($($x,)+) {
                type Stacked = (Replicated, $($x,)+);
            }
            impl<M, $($x: DimSharding<M>),+> Unstack<M> for (Replicated, $($x,)+) {
                type Row = ($($x,)+);
            }
        )*
    };
}

stack_tuples! {
    (X0);
    (X0, X1);
    (X0, X1, X2);
    (X0, X1, X2, X3);
    (X0, X1, X2, X3, X4);
    (X0, X1, X2, X3, X4, X5);
    (X0, X1, X2, X3, X4, X5, X6);
}

/// Whether a tensor on mesh `M` varies over an axis: [`Invariant`], or [`Varying<A>`] for an
/// axis `A` of `M`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a variation of a tensor on the mesh `{M}`",
    label = "this is not `Invariant` or `Varying<Axis>`",
    note = "use `Invariant`, or `Varying<Axis>` with an axis of the mesh"
)]
pub trait Variation<M>: 'static {
    /// The axis the tensor varies over, if any.
    const AXIS: Option<&'static str>;
}

impl<M> Variation<M> for Invariant {
    const AXIS: Option<&'static str> = None;
}

impl<M: HasAxis<A>, A: MeshAxis> Variation<M> for Varying<A> {
    const AXIS: Option<&'static str> = Some(A::NAME);
}

// ----- reading and replacing one dim -----

/// Dim `D` of a sharding tuple: its sharding (`Kind`) and the tuple with it replaced
/// (`With<Y>`). How the combinators compute their result types.
#[diagnostic::on_unimplemented(
    message = "dim {D} is out of range for a tensor sharded as `{Self}`",
    label = "there is no dim {D}",
    note = "dims count from 0; a sharding has one entry per dim"
)]
pub trait DimAt<const D: usize> {
    /// The sharding of dim `D`.
    type Kind;
    /// The sharding with dim `D` replaced by `Y`.
    type With<Y>;
}

// ----- the checks of the combinators (one trait per message) -----

/// `all_to_all` over `A` concatenates dim `D`: it must be the dim split over `A`.
#[diagnostic::on_unimplemented(
    message = "`all_to_all` over `{A}` concatenates dim {D}, so dim {D} must be split over \
               `{A}`, but it is not",
    label = "dim {D} is not split over `{A}`",
    note = "`all_to_all::<Axis, SPLIT, CONCAT>` makes dim CONCAT (split over Axis) whole and \
            splits dim SPLIT over Axis: e.g. Ulysses `[B, H, S/U, D] -> [B, H/U, S, D]` is \
            `all_to_all::<Context, 1, 2>`"
)]
pub trait ConcatDimOf<A, const D: usize> {}

/// `all_to_all` over `A` splits dim `D`: it must be whole.
#[diagnostic::on_unimplemented(
    message = "`all_to_all` over `{A}` splits dim {D}, but dim {D} is already split",
    label = "dim {D} is already split",
    note = "a dim is split over at most one mesh axis, and SPLIT and CONCAT must be different \
            dims; make dim {D} whole first (all_gather)"
)]
pub trait SplitDimOf<A, const D: usize> {}

/// `all_gather` over `A` gathers dim `D`: it must be split over `A`.
#[diagnostic::on_unimplemented(
    message = "`all_gather` over `{A}` gathers dim {D}, but dim {D} is not split over `{A}`",
    label = "dim {D} is not split over `{A}`",
    note = "`all_gather::<Axis, DIM>` concatenates the blocks of dim DIM held along Axis; check \
            the axis and the dim"
)]
pub trait GatherDimOf<A, const D: usize> {}

/// `reduce_scatter` over `A` scatters dim `D`: it must be whole.
#[diagnostic::on_unimplemented(
    message = "`reduce_scatter` over `{A}` scatters dim {D}, but dim {D} is already split",
    label = "dim {D} is already split",
    note = "a dim is split over at most one mesh axis; scatter a whole dim"
)]
pub trait ScatterDimOf<A, const D: usize> {}

/// `ppermute` / `ring_shift` over `A` moves the blocks of dim `D`: it must be split over `A`.
#[diagnostic::on_unimplemented(
    message = "`ppermute` over `{A}` moves the blocks of dim {D} between the devices of `{A}`, \
               but dim {D} is not split over `{A}`",
    label = "dim {D} is not split over `{A}`: nothing differs between the devices to move",
    note = "a tensor that is not split over the axis is the same on every device of it, so a \
            ring shift would not change it; shift a tensor split over the axis (e.g. the K/V \
            chunks of ring attention)"
)]
pub trait PermuteDimOf<A, const D: usize> {}

/// A local op needs dim `D` whole on every device. Use it as a bound on the sharding of a
/// local op's operand (`S: WholeDim<2>`) to have the compiler reject a sharded dim.
#[diagnostic::on_unimplemented(
    message = "this local op needs dim {D} whole on every device, but dim {D} is split",
    label = "dim {D} is split across devices",
    note = "re-shard first: `all_to_all` moves the split to another dim (Ulysses), \
            `all_gather` makes the dim whole"
)]
pub trait WholeDim<const D: usize> {}

/// `psum` and `reduce_scatter` over `A` sum per-device values: the tensor must vary over `A`.
#[diagnostic::on_unimplemented(
    message = "summing over `{A}` (psum, reduce_scatter) needs a tensor that varies over `{A}`, \
               but this one is `{Self}`",
    label = "this tensor does not vary over `{A}`",
    note = "a `Varying<Axis>` tensor holds one summand per device (e.g. a partial result of a \
            local op); an `Invariant` tensor is the same on every device, and a split tensor \
            is made whole with `all_gather`"
)]
pub trait VaryingOver<A> {}

#[diagnostic::do_not_recommend]
impl<A> VaryingOver<A> for Varying<A> {}

/// A program output must not vary beyond its split dims.
#[diagnostic::on_unimplemented(
    message = "a program output must be `Invariant`, but this tensor is `{Self}`",
    label = "this tensor varies from device to device",
    note = "sum the per-device values first: `psum` (replicated result) or `reduce_scatter` \
            (split result)"
)]
pub trait InvariantOutput {}

#[diagnostic::do_not_recommend]
impl InvariantOutput for Invariant {}

/// The sharding of a returned tensor must be the declared output sharding.
#[diagnostic::on_unimplemented(
    message = "the program declares the output sharding `{Declared}`, but this tensor is \
               sharded as `{Self}`",
    label = "this tensor is not sharded as declared",
    note = "re-shard before returning (e.g. the inverse `all_to_all`), or declare the sharding \
            the tensor has"
)]
pub trait MatchesOutput<Declared> {}

#[diagnostic::do_not_recommend]
impl<S> MatchesOutput<S> for S {}

/// Both operands of an elementwise op must have the same sharding (`Self` is the second
/// operand's, `S` the first's).
#[diagnostic::on_unimplemented(
    message = "cannot combine a tensor sharded as `{S}` with one sharded as `{Self}`",
    label = "this operand is sharded differently from the first",
    note = "elementwise ops need the same sharding on both sides; re-shard one operand first \
            (all_to_all, all_gather, ...)"
)]
pub trait SameSharding<S> {}

#[diagnostic::do_not_recommend]
impl<S> SameSharding<S> for S {}

/// Both operands of an elementwise op must vary over the same axes (`Self` is the second
/// operand's variation, `V` the first's).
#[diagnostic::on_unimplemented(
    message = "cannot combine a tensor that is `{V}` with one that is `{Self}`",
    label = "this operand is `{Self}`",
    note = "sum a `Varying` operand first (psum), or make the other one vary too (`vary`)"
)]
pub trait SameVariation<V> {}

#[diagnostic::do_not_recommend]
impl<V> SameVariation<V> for V {}

/// Tensors of a program all live on its mesh (`Self` is the second operand's mesh, `M` the
/// first's).
#[diagnostic::on_unimplemented(
    message = "cannot mix tensors of the mesh `{M}` with tensors of the mesh `{Self}`",
    label = "this tensor lives on the mesh `{Self}`",
    note = "an SPMD program runs on one device mesh; move data between meshes on the host"
)]
pub trait SameMesh<M> {}

#[diagnostic::do_not_recommend]
impl<M> SameMesh<M> for M {}

include!(concat!(env!("OUT_DIR"), "/positions.rs"));

/// The sharding after `all_to_all::<A, SPLIT, CONCAT>`: dim SPLIT split over `A`, dim CONCAT
/// whole.
pub type AllToAllOut<S, A, const SPLIT: usize, const CONCAT: usize> =
    <<S as DimAt<SPLIT>>::With<Split<A>> as DimAt<CONCAT>>::With<Replicated>;

/// The sharding with dim `D` whole.
pub type WithWhole<S, const D: usize> = <S as DimAt<D>>::With<Replicated>;

/// The sharding with dim `D` split over `A`.
pub type WithSplit<S, A, const D: usize> = <S as DimAt<D>>::With<Split<A>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axes::{Context, Data};

    crate::mesh!(Dc = [Data, Context]);

    fn spec_of<S: Layout<Dc>>() -> PartitionSpec {
        S::spec()
    }

    /// The generated impls reach rank MAX_RANK (a compile-time check).
    #[allow(dead_code)]
    fn highest_rank_is_covered()
    where
        (R, R, R, R, R, R, R, Split<Context>): DimAt<7> + GatherDimOf<Context, 7> + Layout<Dc>,
    {
    }

    type R = Replicated;

    #[test]
    fn specs_and_results() {
        type Seq = (Replicated, Replicated, Split<Context>, Replicated);
        assert_eq!(spec_of::<Seq>().to_string(), "P(None, None, context, None)");
        assert_eq!(<Seq as Layout<Dc>>::RANK, 4);
        let heads = spec_of::<AllToAllOut<Seq, Context, 1, 2>>();
        assert_eq!(heads.to_string(), "P(None, context, None, None)");
        assert_eq!(heads.dim_of("context"), Some(1));
        assert_eq!(heads.dim_of("data"), None);
        assert_eq!(spec_of::<WithWhole<Seq, 2>>(), PartitionSpec::replicated(4));
        assert_eq!(
            spec_of::<WithSplit<(Replicated,), Data, 0>>().to_string(),
            "P(data)"
        );
        assert_eq!(spec_of::<()>().to_string(), "P()");
        assert_eq!(<Varying<Data> as Variation<Dc>>::AXIS, Some("data"));
    }
}
