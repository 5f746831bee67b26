//! The meshes of context-parallel programs and the layouts of their tensors.
//!
//! Every strategy composes on [`ModelMesh`], `data x context x ring`: the batch split over
//! `data`, the sequence over `context` (and, for a strategy with a ring axis of its own such
//! as USP, cut into `ring` chunks first, each chunk split over `context`). A standalone
//! context-parallel program ([`ContextParallel`](crate::ContextParallel)) is one on a mesh
//! with one data shard; a model's train step puts its batch on `data`.

use tessera_collectives::axes::{Context, Data};
use tessera_collectives::{axis, mesh, DTensor, Mesh, MeshShape, Replicated, Split};
use tessera_dsl::DeviceAxis;

mesh!(pub ModelMesh = [Data, Context, RingAxis]);

/// `[B, H, S, D]` with the heads split over `A` and the whole sequence on every device
/// (Ulysses after its all-to-all); `B` is the batch's sharding.
pub type ByHeads<B, A> = (B, Split<A>, Replicated, Replicated);
/// `[B, H, S]`: a logsumexp of [`ByHeads`].
pub type ByHeadsLse<B, A> = (B, Split<A>, Replicated);
/// `[B, H, S, D]` with the sequence split over `A`: each device holds one block of positions;
/// `B` and `H` are the batch's and the heads' shardings.
pub type BySequence<B, H, A> = (B, H, Split<A>, Replicated);
/// `[B, H, S]`: a logsumexp of [`BySequence`].
pub type BySequenceLse<B, H, A> = (B, H, Split<A>);
/// `[B, H, S, D]` with the whole sequence on every device (all-gathered K/V).
pub type WholeSequence<B, H> = (B, H, Replicated, Replicated);
/// `[B, S]` segment ids, whole on every device.
pub type WholeSegmentIds<B> = (B, Replicated);

axis!(
    /// The ring axis of a strategy that runs a ring beside the context axis (USP).
    pub RingAxis = "ring"
);

mesh!(
    /// One context axis: the mesh of programs that use the typed splash ops
    /// ([`crate::local_splash`]) directly.
    pub ContextMesh = [Context]
);

/// `[B, R, S/R]` token arrays: the batch over `data`, each sequence cut into `R` ring chunks
/// over `ring` and each chunk into pieces over `context` (with `R = 1` unless the strategy has
/// a ring axis).
pub type TokenLayout = (Split<Data>, Split<RingAxis>, Split<Context>);

/// `[B, H, R, S/R, D]`: how a program takes and returns global `[B, H, S, D]` arrays, the
/// sequence viewed as `[R, S/R]` (a reshape) so each of its splits has its own dim.
pub type Pieces = (
    Split<Data>,
    Replicated,
    Split<RingAxis>,
    Split<Context>,
    Replicated,
);
/// `[B, H, R, S/R]`: a logsumexp of [`Pieces`].
pub type PiecesLse = (Split<Data>, Replicated, Split<RingAxis>, Split<Context>);

/// A device's `[b, H, s, D]` block of the sequence: its batch block over `data`, its
/// positions over `context` (and `ring`, which one dim cannot say).
pub type Seq = BySequence<Split<Data>, Replicated, Context>;
/// `[b, H, s]`: a logsumexp of [`Seq`].
pub type SeqLse = BySequenceLse<Split<Data>, Replicated, Context>;

/// A tensor of [`Seq`] layout.
pub type SeqTensor<'p> = DTensor<'p, ModelMesh, Seq>;
/// A tensor of [`SeqLse`] layout.
pub type SeqLseTensor<'p> = DTensor<'p, ModelMesh, SeqLse>;
/// Whole `[b, S]` segment ids on every device, in natural order.
pub type WholeSegments<'p> = DTensor<'p, ModelMesh, WholeSegmentIds<Split<Data>>>;

/// The axes of `mesh` as a mesh kernel's devices (`instantiate_on`), in order: what a kernel
/// that copies between the devices of a program's mesh is instantiated over.
pub fn kernel_devices<M: MeshShape>(mesh: &Mesh<M>) -> Vec<DeviceAxis> {
    mesh.axis_names()
        .iter()
        .zip(mesh.sizes())
        .map(|(&name, &size)| DeviceAxis::new(name, size))
        .collect()
}
