//! Mesh axes: marker types with a name.

/// A named mesh axis (`data`, `fsdp`, `context`, ...), as a zero-sized marker type.
///
/// Declare one with [`axis!`](crate::axis); the common ones are in [`axes`](crate::axes).
/// The type is what the sharding types name (`Split<Context>`); the name is what the host
/// side and the error messages print.
pub trait MeshAxis: 'static {
    /// The axis name, e.g. `"context"`. Two axes of one mesh must have different names.
    const NAME: &'static str;
}

/// Declares a mesh axis marker type.
///
/// ```
/// tessera_collectives::axis!(
///     /// Pipeline stages.
///     pub Stage = "stage"
/// );
/// use tessera_collectives::MeshAxis;
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
