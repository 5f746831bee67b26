//! Splash attention for the shards of an SPMD program.
//!
//! Context parallelism runs one program on every device, but each device attends a different
//! part of the global attention matrix: in the all-gather strategy device `r` holds query
//! shard `r` against every key; in ring attention, at step `t`, device `r` holds the keys of
//! device `r - t`. The block-sparsity tables (and the offsets the in-kernel masks use) differ
//! per device, the kernel must not. [`ShardedSplash`] builds one [`SplashAttention`] per shard
//! at its [`SeqOffsets`], pads their tables to one shape (the longest row of any shard sets
//! the grid; shorter rows get empty slots, which the kernels skip) and traces every block path
//! in every shard, so the kernel definitions agree and the plans merge: arguments that differ
//! become [`StageArg::PerShard`], which the SPMD lowering stacks into one constant and slices
//! by the device's shard index.

use tessera_dsl::{DType, Lowering};

use crate::attention::{Dims, Features, SplashAttention, SplashOptions, Stage, StageArg};
use crate::block_sizes::BlockSizes;
use crate::error::{OptionsError, PlanBug, SplashError};
use crate::mask::{MultiHeadMask, SeqOffsets};
use crate::mask_info::BlockStats;

/// One splash attention per shard, with tables of one shape (see the module docs).
#[derive(Debug, Clone)]
pub struct ShardedSplash {
    shards: Vec<SplashAttention>,
}

impl ShardedSplash {
    /// Builds shard `i` at `offsets[i]`: every shard has the local `dims`, the same mask,
    /// block sizes and options (`options.offsets` is replaced by the shard's).
    pub fn new(
        mask: impl Into<MultiHeadMask>,
        dims: Dims,
        dtype: DType,
        block_sizes: BlockSizes,
        options: SplashOptions,
        lowering: impl Into<Lowering>,
        offsets: &[SeqOffsets],
    ) -> Result<Self, SplashError> {
        let lowering = lowering.into();
        if offsets.is_empty() {
            return Err(SplashError::Options(OptionsError::NoShards));
        }
        let mask = mask.into();
        let mut shards = offsets
            .iter()
            .map(|&o| {
                let options = SplashOptions {
                    offsets: o,
                    // A shard whose blocks are all full (or all partial) must still trace
                    // the other path: another shard runs the same kernel on it.
                    trace_all_paths: true,
                    ..options
                };
                SplashAttention::new(
                    mask.clone(),
                    dims,
                    dtype,
                    block_sizes,
                    options,
                    lowering.clone(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let kinds = shards[0].mask_infos_mut().len();
        for k in 0..kinds {
            let (mut width, mut partial) = (0, 0);
            for s in &mut shards {
                let info = &s.mask_infos_mut()[k];
                width = width.max(info.width);
                partial = partial.max(info.num_partial_blocks);
            }
            for s in &mut shards {
                s.mask_infos_mut()[k].pad_to(width, partial);
            }
        }
        Ok(ShardedSplash { shards })
    }

    /// Whether the shards keep their residuals for a loop's backward
    /// ([`SplashOptions::keep_residuals`]; every shard has the same options).
    pub fn keeps_residuals(&self) -> bool {
        self.shards[0].options().keep_residuals
    }

    /// The per-shard attentions (their tables padded).
    pub fn shards(&self) -> &[SplashAttention] {
        &self.shards
    }

    /// The forward's blocks summed over the shards (computed, skipped, masked).
    pub fn stats(&self) -> BlockStats {
        self.shards.iter().fold(BlockStats::default(), |a, s| {
            let b = s.stats();
            BlockStats {
                total: a.total + b.total,
                full: a.full + b.full,
                partial: a.partial + b.partial,
                empty: a.empty + b.empty,
            }
        })
    }

    /// The forward plan of every shard, merged.
    pub fn forward_plan(&self, f: Features) -> Result<Vec<Stage>, SplashError> {
        merge(self.shards.iter().map(|s| s.forward_plan(f)).collect())
    }

    /// The backward plan of every shard, merged.
    pub fn backward_plan(&self, f: Features) -> Result<Vec<Stage>, SplashError> {
        merge(self.shards.iter().map(|s| s.backward_plan(f)).collect())
    }
}

/// Merges per-shard plans of identical kernels: constant arguments that differ between
/// shards become [`StageArg::PerShard`].
fn merge(plans: Vec<Vec<Stage>>) -> Result<Vec<Stage>, SplashError> {
    let mut merged = plans[0].clone();
    for (i, stage) in merged.iter_mut().enumerate() {
        for plan in &plans[1..] {
            let other = &plan[i];
            if other.def.name() != stage.def.name() || other.def.params() != stage.def.params() {
                return Err(SplashError::Internal(PlanBug::KernelDiffersBetweenShards {
                    kernel: stage.def.name().to_string(),
                }));
            }
        }
        // One call runs on every device: its cost is the busiest shard's.
        stage.active_steps = plans.iter().map(|p| p[i].active_steps).max().flatten();
        for (j, arg) in stage.args.iter_mut().enumerate() {
            let StageArg::Const(first) = arg else {
                continue;
            };
            let per_shard: Vec<_> = plans
                .iter()
                .map(|p| match &p[i].args[j] {
                    StageArg::Const(c) => c.clone(),
                    _ => unreachable!("plans of one kernel have arguments of one kind"),
                })
                .collect();
            if per_shard.iter().any(|c| c.shape() != first.shape()) {
                return Err(SplashError::Internal(
                    PlanBug::ArgumentDiffersBetweenShards {
                        argument: j,
                        kernel: stage.def.name().to_string(),
                    },
                ));
            }
            if per_shard.iter().any(|c| c != first) {
                *arg = StageArg::PerShard(per_shard);
            }
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::Mask;

    #[test]
    fn query_shards_of_a_causal_mask_share_one_kernel() {
        // All-gather strategy on 4 devices: query shard r (256 rows at 256r) against all
        // 1024 keys.
        let dims = Dims {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            q_len: 256,
            kv_len: 1024,
            head_dim: 64,
            head_dim_v: 64,
        };
        let offsets: Vec<_> = (0..4).map(|r| SeqOffsets { q: 256 * r, kv: 0 }).collect();
        let s = ShardedSplash::new(
            Mask::causal(),
            dims,
            DType::F32,
            BlockSizes::uniform(128, 128),
            SplashOptions::default(),
            Lowering::portable(),
            &offsets,
        )
        .unwrap();
        // Shard r computes 2 rows of (2r + 1) and (2r + 2) key blocks, which the forward's
        // compacted tables walk in (4r + 3) slots; the grid is set by the last shard's 15.
        for (r, shard) in s.shards().iter().enumerate() {
            assert_eq!(shard.stats().computed(), 2 * (4 * r + 3), "shard {r}");
            assert_eq!(shard.fwd_mask_info().width, 15);
        }
        assert_eq!(s.stats().computed(), 2 * (3 + 7 + 11 + 15));
        let plan = s.forward_plan(Features::default()).unwrap();
        assert_eq!(plan.len(), 1);
        let per_shard = plan[0]
            .args
            .iter()
            .filter(|a| matches!(a, StageArg::PerShard(_)))
            .count();
        // data_next, block_mask, row_block, row_bounds and the offsets differ per shard
        // (mask_next is all zeros: a computed mask stores no blocks).
        assert_eq!(per_shard, 5);
        assert_eq!(s.backward_plan(Features::default()).unwrap().len(), 3);
    }
}
