//! Collectives (manual-sharding form) and device ids.

use super::{check_dim, grow, FuncBuilder};
use crate::ops::{CollectiveAttrs, Grouping, OpKind, Reducer, Region, Value};
use crate::{DType, HloError, TensorType};

/// Whether an op has the `use_global_device_ids` attribute (decides what ids mean).
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdKind {
    /// all_gather, all_reduce, reduce_scatter.
    WithGlobalIds,
    /// all_to_all, collective_permute.
    NoGlobalIds,
}

impl FuncBuilder<'_> {
    /// The exclusive bound of valid ids, their name, and how many devices one listed id
    /// stands for (cross_replica_and_partition groups span every partition).
    fn id_space(&self, grouping: Grouping, kind: IdKind) -> (i64, &'static str, i64) {
        let replicas = i64::from(self.module.num_replicas());
        let partitions = i64::from(self.module.num_partitions());
        match (grouping, kind) {
            (Grouping::CrossReplica, _) => (replicas, "replica ids (mhlo.num_replicas)", 1),
            (Grouping::CrossPartition | Grouping::FlattenedIds, IdKind::NoGlobalIds) => {
                (partitions, "partition ids (mhlo.num_partitions)", 1)
            }
            (Grouping::CrossPartition, IdKind::WithGlobalIds) => {
                (replicas, "replica ids (mhlo.num_replicas)", partitions)
            }
            (Grouping::FlattenedIds, IdKind::WithGlobalIds) => (
                replicas * partitions,
                "flattened device ids (num_replicas * num_partitions)",
                1,
            ),
        }
    }

    /// Validates replica groups and returns the channel/ids attributes and the number of
    /// devices in one group.
    fn collective_attrs(
        &mut self,
        op: &'static str,
        groups: &[Vec<i64>],
        grouping: Grouping,
        kind: IdKind,
    ) -> Result<(CollectiveAttrs, i64), HloError> {
        const ATTR: &str = "replica_groups";
        let (bound, what, per_id) = self.id_space(grouping, kind);
        let Some(first) = groups.first() else {
            return Err(HloError::attr(
                op,
                ATTR,
                "no groups (list every group explicitly)",
            ));
        };
        let size = first.len();
        if size == 0 {
            return Err(HloError::attr(op, ATTR, "empty group"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, g) in groups.iter().enumerate() {
            if g.len() != size {
                return Err(HloError::attr(
                    op,
                    ATTR,
                    format!(
                        "group #{i} has {} ids, group #0 has {size} (groups must be equal)",
                        g.len()
                    ),
                ));
            }
            for &id in g {
                if !(0..bound).contains(&id) {
                    return Err(HloError::attr(
                        op,
                        ATTR,
                        format!(
                            "id {id} in group #{i} is out of range: ids are {what}, 0..{bound}"
                        ),
                    ));
                }
                if !seen.insert(id) {
                    return Err(HloError::attr(op, ATTR, format!("id {id} appears twice")));
                }
            }
        }
        if seen.len() as i64 != bound {
            return Err(HloError::attr(
                op,
                ATTR,
                format!(
                    "the groups must cover every id of 0..{bound} ({what}); they list {} \
                     (XLA rejects partial groups)",
                    seen.len()
                ),
            ));
        }
        let channel = match grouping {
            Grouping::CrossReplica => None,
            _ => Some(self.module.alloc_channel()),
        };
        let attrs = CollectiveAttrs {
            replica_groups: groups.to_vec(),
            channel,
            use_global_device_ids: grouping == Grouping::FlattenedIds
                && kind == IdKind::WithGlobalIds,
        };
        Ok((attrs, size as i64 * per_id))
    }

    /// `stablehlo.all_to_all`: splits `split_dimension` into one block per group member,
    /// sends block `j` to member `j`, and concatenates the received blocks along
    /// `concat_dimension` (`split_count` = group size).
    ///
    /// E.g. Ulysses: `[B, H, S/U, D] -> [B, H/U, S, D]` with `split_dimension = 1`,
    /// `concat_dimension = 2`.
    pub fn all_to_all(
        &mut self,
        x: Value,
        split_dimension: i64,
        concat_dimension: i64,
        groups: &[Vec<i64>],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.all_to_all";
        let t = self.operand(OP, 0, x)?;
        let split = check_dim(OP, "split_dimension", split_dimension, t.rank())?;
        let concat = check_dim(OP, "concat_dimension", concat_dimension, t.rank())?;
        let (attrs, n) = self.collective_attrs(OP, groups, grouping, IdKind::NoGlobalIds)?;
        if t.dims[split] % n != 0 {
            return Err(HloError::shape(
                OP,
                format!(
                    "split_dimension {split} of {t} (size {}) is not divisible by split_count {n}",
                    t.dims[split]
                ),
            ));
        }
        let mut dims = t.dims.clone();
        dims[split] /= n;
        dims[concat] = grow(OP, dims[concat], n)?;
        let kind = OpKind::AllToAll {
            split_dimension,
            concat_dimension,
            split_count: n,
            attrs,
        };
        Ok(self.emit1(kind, vec![x], TensorType::new(dims, t.dtype), vec![]))
    }

    /// `stablehlo.all_gather`: concatenates the group members' operands along
    /// `all_gather_dim`, in group order.
    pub fn all_gather(
        &mut self,
        x: Value,
        all_gather_dim: i64,
        groups: &[Vec<i64>],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.all_gather";
        let t = self.operand(OP, 0, x)?;
        let d = check_dim(OP, "all_gather_dim", all_gather_dim, t.rank())?;
        let (attrs, n) = self.collective_attrs(OP, groups, grouping, IdKind::WithGlobalIds)?;
        let mut dims = t.dims.clone();
        dims[d] = grow(OP, dims[d], n)?;
        let kind = OpKind::AllGather {
            all_gather_dim,
            attrs,
        };
        Ok(self.emit1(kind, vec![x], TensorType::new(dims, t.dtype), vec![]))
    }

    /// `stablehlo.collective_permute`: each `(source, target)` pair sends the source's
    /// operand to the target; devices that receive nothing get zeros. Sources are distinct,
    /// and so are targets.
    pub fn collective_permute(
        &mut self,
        x: Value,
        source_target_pairs: &[(i64, i64)],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.collective_permute";
        const ATTR: &str = "source_target_pairs";
        let t = self.operand(OP, 0, x)?;
        let (bound, what, _) = self.id_space(grouping, IdKind::NoGlobalIds);
        if source_target_pairs.is_empty() {
            return Err(HloError::attr(OP, ATTR, "no pairs"));
        }
        let mut sources = std::collections::BTreeSet::new();
        let mut targets = std::collections::BTreeSet::new();
        for &(s, d) in source_target_pairs {
            for id in [s, d] {
                if !(0..bound).contains(&id) {
                    return Err(HloError::attr(
                        OP,
                        ATTR,
                        format!("id {id} out of range: ids are {what}, 0..{bound}"),
                    ));
                }
            }
            if !sources.insert(s) {
                return Err(HloError::attr(
                    OP,
                    ATTR,
                    format!("source {s} appears twice"),
                ));
            }
            if !targets.insert(d) {
                return Err(HloError::attr(
                    OP,
                    ATTR,
                    format!("target {d} appears twice"),
                ));
            }
        }
        let channel = match grouping {
            Grouping::CrossReplica => None,
            _ => Some(self.module.alloc_channel()),
        };
        let kind = OpKind::CollectivePermute {
            source_target_pairs: source_target_pairs.to_vec(),
            channel,
        };
        Ok(self.emit1(kind, vec![x], t, vec![]))
    }

    /// `stablehlo.all_reduce` with a standard reducer (e.g. `psum` is [`Reducer::Sum`]).
    pub fn all_reduce(
        &mut self,
        x: Value,
        reducer: Reducer,
        groups: &[Vec<i64>],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.all_reduce";
        let t = self.operand(OP, 0, x)?;
        let body = self.reducer_region(OP, reducer, t.dtype)?;
        self.finish_all_reduce(x, t, body, groups, grouping)
    }

    /// `stablehlo.all_reduce` with a custom body: two scalars of the operand's dtype in, one
    /// out; the body cannot capture outer values.
    pub fn all_reduce_with<E, F>(
        &mut self,
        x: Value,
        groups: &[Vec<i64>],
        grouping: Grouping,
        body: F,
    ) -> Result<Value, E>
    where
        E: From<HloError>,
        F: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        let t = self.operand("stablehlo.all_reduce", 0, x)?;
        let region = self.reduction_body("stablehlo.all_reduce", &[t.dtype], body)?;
        Ok(self.finish_all_reduce(x, t, region, groups, grouping)?)
    }

    fn finish_all_reduce(
        &mut self,
        x: Value,
        t: TensorType,
        body: Region,
        groups: &[Vec<i64>],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.all_reduce";
        let (attrs, _) = self.collective_attrs(OP, groups, grouping, IdKind::WithGlobalIds)?;
        Ok(self.emit1(OpKind::AllReduce { attrs }, vec![x], t, vec![body]))
    }

    /// `stablehlo.reduce_scatter` with a standard reducer: reduces over the group, then
    /// member `j` keeps block `j` of `scatter_dimension` (which must divide by the group
    /// size).
    pub fn reduce_scatter(
        &mut self,
        x: Value,
        scatter_dimension: i64,
        reducer: Reducer,
        groups: &[Vec<i64>],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.reduce_scatter";
        let t = self.operand(OP, 0, x)?;
        let body = self.reducer_region(OP, reducer, t.dtype)?;
        self.finish_reduce_scatter(x, t, scatter_dimension, body, groups, grouping)
    }

    /// `stablehlo.reduce_scatter` with a custom body (see [`FuncBuilder::all_reduce_with`]).
    pub fn reduce_scatter_with<E, F>(
        &mut self,
        x: Value,
        scatter_dimension: i64,
        groups: &[Vec<i64>],
        grouping: Grouping,
        body: F,
    ) -> Result<Value, E>
    where
        E: From<HloError>,
        F: FnOnce(&mut Self, &[Value]) -> Result<Vec<Value>, E>,
    {
        let t = self.operand("stablehlo.reduce_scatter", 0, x)?;
        let region = self.reduction_body("stablehlo.reduce_scatter", &[t.dtype], body)?;
        Ok(self.finish_reduce_scatter(x, t, scatter_dimension, region, groups, grouping)?)
    }

    fn finish_reduce_scatter(
        &mut self,
        x: Value,
        t: TensorType,
        scatter_dimension: i64,
        body: Region,
        groups: &[Vec<i64>],
        grouping: Grouping,
    ) -> Result<Value, HloError> {
        const OP: &str = "stablehlo.reduce_scatter";
        let d = check_dim(OP, "scatter_dimension", scatter_dimension, t.rank())?;
        let (attrs, n) = self.collective_attrs(OP, groups, grouping, IdKind::WithGlobalIds)?;
        if t.dims[d] % n != 0 {
            return Err(HloError::shape(
                OP,
                format!(
                    "scatter_dimension {d} of {t} (size {}) is not divisible by the group size {n}",
                    t.dims[d]
                ),
            ));
        }
        let mut dims = t.dims.clone();
        dims[d] /= n;
        let kind = OpKind::ReduceScatter {
            scatter_dimension,
            attrs,
        };
        Ok(self.emit1(kind, vec![x], TensorType::new(dims, t.dtype), vec![body]))
    }

    /// `stablehlo.partition_id` as a scalar `i32` (the op yields `ui32`; a `convert` follows
    /// it in the text).
    pub fn partition_id(&mut self) -> Value {
        self.emit1(
            OpKind::PartitionId,
            vec![],
            TensorType::scalar(DType::I32),
            vec![],
        )
    }

    /// `stablehlo.replica_id` as a scalar `i32` (see [`FuncBuilder::partition_id`]).
    pub fn replica_id(&mut self) -> Value {
        self.emit1(
            OpKind::ReplicaId,
            vec![],
            TensorType::scalar(DType::I32),
            vec![],
        )
    }
}
