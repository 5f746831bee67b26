//! Mesh axes and mesh shapes as marker types, shared by the SPMD programs of
//! `tessera-collectives` (which re-exports them) and the kernels of `tessera-dsl` that address
//! other devices (a remote copy's target is a position on a typed mesh axis).
//!
//! A mesh axis is a zero-sized type with a name ([`MeshAxis`], declared with
//! [`axis!`](crate::axis)); a mesh shape is a zero-sized type listing its axes major to minor
//! ([`MeshShape`], declared with [`mesh!`](crate::mesh)), and [`HasAxis`] says which axes it
//! has. Sizes are values, given where a mesh is built.

/// A named mesh axis (`data`, `fsdp`, `context`, ...), as a zero-sized marker type.
///
/// Declare one with [`axis!`](crate::axis); the common ones are in [`axes`].
/// The type is what sharding types and kernels name (`Split<Context>`, `next::<Context>()`);
/// the name is what the host side and the error messages print.
pub trait MeshAxis: 'static {
    /// The axis name, e.g. `"context"`. Two axes of one mesh must have different names.
    const NAME: &'static str;
}

/// Declares a mesh axis marker type.
///
/// ```
/// tessera_hlo::axis!(
///     /// Pipeline stages.
///     pub Stage = "stage"
/// );
/// use tessera_hlo::MeshAxis;
/// assert_eq!(Stage::NAME, "stage");
/// ```
#[macro_export]
macro_rules! axis {
    ($(#[$meta:meta])* $vis:vis $name:ident = $label:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis struct $name;

        impl $crate::MeshAxis for $name {
            const NAME: &'static str = $label;
        }
    };
}

/// The usual mesh axes of data-, FSDP-, context- and tensor-parallel training.
pub mod axes {
    crate::axis!(
        /// Data parallelism: the batch is split, parameters are replicated.
        pub Data = "data"
    );
    crate::axis!(
        /// Fully sharded data parallelism: the batch and the parameters are split.
        pub Fsdp = "fsdp"
    );
    crate::axis!(
        /// Context (sequence) parallelism: the sequence is split (Ulysses, ring, all-gather).
        pub Context = "context"
    );
    crate::axis!(
        /// Tensor parallelism: heads or hidden features are split.
        pub Tensor = "tensor"
    );
}

/// The axes of a device mesh, major to minor. Implemented by the marker types that
/// [`mesh!`](crate::mesh) declares; the sizes come with a mesh value (`tessera_collectives::Mesh`)
/// or with a kernel's instantiation.
pub trait MeshShape: 'static {
    /// The axis names, major to minor (device ids are row-major over them).
    const AXES: &'static [&'static str];
}

/// Says that `A` is an axis of the mesh `Self`, and where. Implemented by
/// [`mesh!`](crate::mesh) once per axis.
#[diagnostic::on_unimplemented(
    message = "`{A}` is not an axis of the mesh `{Self}`",
    label = "`{Self}` has no axis `{A}`",
    note = "a mesh's axes are the ones listed where it is declared with `mesh!`"
)]
pub trait HasAxis<A: MeshAxis>: MeshShape {
    /// Position of the axis in [`MeshShape::AXES`].
    const INDEX: usize;
}

/// Declares a mesh marker type and its axes, major to minor.
///
/// ```
/// use tessera_hlo::axes::{Context, Data};
/// use tessera_hlo::{mesh, HasAxis, MeshShape};
///
/// mesh!(
///     /// Data x context parallelism.
///     pub DataContext = [Data, Context]
/// );
/// assert_eq!(DataContext::AXES, &["data", "context"]);
/// assert_eq!(<DataContext as HasAxis<Context>>::INDEX, 1);
/// ```
///
/// Listing an axis twice is a compile error (conflicting `HasAxis` impls); two different axis
/// types with the same name are rejected where a mesh is built.
#[macro_export]
macro_rules! mesh {
    (@axes $mesh:ident; $index:expr; $axis:ty $(, $rest:ty)*) => {
        impl $crate::HasAxis<$axis> for $mesh {
            const INDEX: usize = $index;
        }
        $crate::mesh!(@axes $mesh; $index + 1usize; $($rest),*);
    };
    (@axes $mesh:ident; $index:expr;) => {};
    ($(#[$meta:meta])* $vis:vis $name:ident = [$($axis:ty),+ $(,)?]) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis struct $name;

        impl $crate::MeshShape for $name {
            const AXES: &'static [&'static str] = &[$(<$axis as $crate::MeshAxis>::NAME),+];
        }

        $crate::mesh!(@axes $name; 0usize; $($axis),+);
    };
}
