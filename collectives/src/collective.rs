//! The collectives as data: emit one into a [`FuncBuilder`], or its transpose (VJP).

use std::fmt;

use tessera_hlo::{FuncBuilder, Grouping, Reducer, Value};

use crate::error::CollectiveError;
use crate::mesh::AxisGroups;

/// A collective over one mesh axis, with its parameters: the untyped form the typed
/// combinators of [`DTensor`](crate::DTensor) lower through, and what autodiff works with.
///
/// [`Collective::emit`] appends it to a function in the manual-sharding form
/// (`mhlo.num_partitions` = devices, a channel handle per collective, flattened device ids);
/// [`Collective::transpose`] is its transpose (VJP) rule, and
/// [`Collective::emit_transpose`] applies the rule to a cotangent:
///
/// | collective | transpose |
/// |---|---|
/// | `AllToAll { split_dim: s, concat_dim: c }` | `AllToAll { split_dim: c, concat_dim: s }` (the inverse) |
/// | `AllGather { dim }` | `ReduceScatter { dim }` |
/// | `ReduceScatter { dim }` | `AllGather { dim }` |
/// | `Ppermute { pairs }` | `Ppermute` with every pair reversed |
/// | `Psum` | `Pvary`: the identity on the (replicated) cotangent |
/// | `Pvary` | `Psum` |
///
/// Inner products: a permutation (all_to_all, ppermute), all_gather and reduce_scatter are
/// linear maps of the per-device values, and their transposes satisfy
/// `sum_devices <f(x), y> = sum_devices <x, f^T(y)>`. `Psum`'s result is replicated (one
/// logical value held by every device of the group), so its cotangent is one replicated value
/// too: `<psum(x), y> = sum_devices <x, y>`, whose transpose is the identity (JAX's
/// convention: the transpose of `psum` on an invariant cotangent is `pvary`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collective {
    /// `stablehlo.all_to_all`: dim `split_dim` is cut into one block per device of the axis,
    /// block `j` goes to device `j`, and the received blocks are concatenated along
    /// `concat_dim` in device order.
    AllToAll {
        /// The mesh axis.
        axis: AxisGroups,
        /// The dim that is split (it shrinks by the axis size).
        split_dim: usize,
        /// The dim the received blocks are concatenated along (it grows by the axis size).
        concat_dim: usize,
    },
    /// `stablehlo.all_gather`: the devices' values concatenated along `dim`, in device order.
    AllGather {
        /// The mesh axis.
        axis: AxisGroups,
        /// The dim that grows by the axis size.
        dim: usize,
    },
    /// `stablehlo.reduce_scatter` (sum): the devices' values summed, then device `j` keeps
    /// block `j` of `dim`.
    ReduceScatter {
        /// The mesh axis.
        axis: AxisGroups,
        /// The dim that shrinks by the axis size.
        dim: usize,
    },
    /// `stablehlo.all_reduce` (sum) over the axis.
    Psum {
        /// The mesh axis.
        axis: AxisGroups,
    },
    /// The identity on the value: marks a replicated value as varying over the axis (the
    /// transpose of [`Collective::Psum`]). Emits a no-op `reshape`, so that the marked value
    /// is a value of its own (autodiff hangs the transpose, a `psum`, on it); XLA removes it.
    Pvary {
        /// The mesh axis.
        axis: AxisGroups,
    },
    /// `stablehlo.collective_permute`: for each `(source, target)` pair of positions along
    /// the axis, the source's value goes to the target, in every group; a device that is no
    /// target receives zeros.
    Ppermute {
        /// The mesh axis.
        axis: AxisGroups,
        /// `(source, target)` positions along the axis (0..size).
        pairs: Vec<(usize, usize)>,
    },
}

impl Collective {
    /// The cyclic shift by `offset` along the axis: position `i` sends to
    /// `(i + offset) mod size` (`offset` may be negative).
    pub fn ring_shift(axis: AxisGroups, offset: i64) -> Collective {
        let n = axis.size() as i64;
        let pairs = (0..n)
            .map(|i| (i as usize, (i + offset).rem_euclid(n) as usize))
            .collect();
        Collective::Ppermute { axis, pairs }
    }

    /// The op's name in messages (`all_to_all`, `psum`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllToAll { .. } => "all_to_all",
            Collective::AllGather { .. } => "all_gather",
            Collective::ReduceScatter { .. } => "reduce_scatter",
            Collective::Psum { .. } => "psum",
            Collective::Pvary { .. } => "pvary",
            Collective::Ppermute { .. } => "ppermute",
        }
    }

    /// The mesh axis the collective runs over.
    pub fn axis(&self) -> &AxisGroups {
        match self {
            Collective::AllToAll { axis, .. }
            | Collective::AllGather { axis, .. }
            | Collective::ReduceScatter { axis, .. }
            | Collective::Psum { axis }
            | Collective::Pvary { axis }
            | Collective::Ppermute { axis, .. } => axis,
        }
    }

    /// The transposed collective (see the table on [`Collective`]).
    pub fn transpose(&self) -> Collective {
        match self.clone() {
            Collective::AllToAll {
                axis,
                split_dim,
                concat_dim,
            } => Collective::AllToAll {
                axis,
                split_dim: concat_dim,
                concat_dim: split_dim,
            },
            Collective::AllGather { axis, dim } => Collective::ReduceScatter { axis, dim },
            Collective::ReduceScatter { axis, dim } => Collective::AllGather { axis, dim },
            Collective::Psum { axis } => Collective::Pvary { axis },
            Collective::Pvary { axis } => Collective::Psum { axis },
            Collective::Ppermute { axis, pairs } => Collective::Ppermute {
                axis,
                pairs: pairs.into_iter().map(|(s, t)| (t, s)).collect(),
            },
        }
    }

    /// Emits the transpose of this collective applied to `cotangent` (a value of the
    /// collective's result type) and returns the cotangent of its operand.
    pub fn emit_transpose(
        &self,
        f: &mut FuncBuilder<'_>,
        cotangent: Value,
    ) -> Result<Value, CollectiveError> {
        self.transpose().emit(f, cotangent)
    }

    /// Appends the collective applied to `x` and returns its result.
    ///
    /// Checks, with a message naming the op, the dim and the axis: the function's module has
    /// one partition per mesh device (and one replica), the dims exist, a dim that is split
    /// divides by the axis size, a permutation is valid.
    pub fn emit(&self, f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
        let axis = self.axis();
        let partitions = f.num_partitions() as usize;
        if partitions != axis.num_devices() || f.num_replicas() != 1 {
            return Err(CollectiveError::DeviceCount {
                context: format!(
                    "{} over `{}`: the module has mhlo.num_partitions = {partitions} and \
                     mhlo.num_replicas = {}",
                    self.name(),
                    axis.name(),
                    f.num_replicas()
                ),
                expected: axis.num_devices(),
                actual: partitions * f.num_replicas() as usize,
            });
        }
        let ty = f.value_type(x)?.clone();
        let check_dim = |what: &str, dim: usize| {
            if dim >= ty.rank() {
                Err(CollectiveError::operand(
                    format!("{} over `{}`", self.name(), axis.name()),
                    format!("{what} {dim} is out of range for the operand {ty}"),
                ))
            } else {
                Ok(())
            }
        };
        let check_divisible = |dim: usize| {
            let size = ty.dims[dim];
            if size % axis.size() as i64 != 0 {
                Err(CollectiveError::NotDivisible {
                    context: format!("{} over `{}` of {ty}", self.name(), axis.name()),
                    dim,
                    size,
                    axis: axis.name(),
                    axis_size: axis.size(),
                })
            } else {
                Ok(())
            }
        };
        let groups = axis.groups();
        let ids = Grouping::FlattenedIds;
        let y = match self {
            Collective::AllToAll {
                split_dim,
                concat_dim,
                ..
            } => {
                check_dim("split dim", *split_dim)?;
                check_dim("concat dim", *concat_dim)?;
                check_divisible(*split_dim)?;
                f.all_to_all(x, *split_dim as i64, *concat_dim as i64, groups, ids)?
            }
            Collective::AllGather { dim, .. } => {
                check_dim("dim", *dim)?;
                f.all_gather(x, *dim as i64, groups, ids)?
            }
            Collective::ReduceScatter { dim, .. } => {
                check_dim("dim", *dim)?;
                check_divisible(*dim)?;
                f.reduce_scatter(x, *dim as i64, Reducer::Sum, groups, ids)?
            }
            Collective::Psum { .. } => f.all_reduce(x, Reducer::Sum, groups, ids)?,
            Collective::Pvary { .. } => f.reshape(x, &ty.dims)?,
            Collective::Ppermute { pairs, .. } => {
                let device_pairs = permutation_pairs(axis, pairs)?;
                f.collective_permute(x, &device_pairs, ids)?
            }
        };
        Ok(y)
    }
}

/// Checks positions along the axis and maps them to device-id pairs in every group.
fn permutation_pairs(
    axis: &AxisGroups,
    pairs: &[(usize, usize)],
) -> Result<Vec<(i64, i64)>, CollectiveError> {
    let err = |reason: String| CollectiveError::Permutation {
        axis: axis.name(),
        reason,
    };
    if pairs.is_empty() {
        return Err(err("no (source, target) pairs".into()));
    }
    let n = axis.size();
    let mut sources = vec![false; n];
    let mut targets = vec![false; n];
    for &(s, t) in pairs {
        for p in [s, t] {
            if p >= n {
                return Err(err(format!(
                    "position {p} is out of range: the axis has {n} devices"
                )));
            }
        }
        if std::mem::replace(&mut sources[s], true) {
            return Err(err(format!("source {s} appears twice")));
        }
        if std::mem::replace(&mut targets[t], true) {
            return Err(err(format!("target {t} appears twice")));
        }
    }
    Ok(axis
        .groups()
        .iter()
        .flat_map(|g| pairs.iter().map(move |&(s, t)| (g[s], g[t])))
        .collect())
}

impl fmt::Display for Collective {
    /// E.g. `all_to_all over context (split 1, concat 2)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} over {}", self.name(), self.axis().name())?;
        match self {
            Collective::AllToAll {
                split_dim,
                concat_dim,
                ..
            } => write!(f, " (split {split_dim}, concat {concat_dim})"),
            Collective::AllGather { dim, .. } | Collective::ReduceScatter { dim, .. } => {
                write!(f, " (dim {dim})")
            }
            Collective::Ppermute { pairs, .. } => write!(f, " {pairs:?}"),
            Collective::Psum { .. } | Collective::Pvary { .. } => Ok(()),
        }
    }
}
