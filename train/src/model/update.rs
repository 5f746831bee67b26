//! After the backward: the gradient all-reduces (grouped by layout), global-norm clipping
//! and AdamW on what each device holds.

use super::*;

/// Sum over every device (one all-reduce).
pub(super) fn all_reduce_sum(
    f: &mut FuncBuilder<'_>,
    x: Value,
    devices: usize,
) -> Result<Value, CollectiveError> {
    let group: Vec<i64> = (0..devices as i64).collect();
    Ok(f.all_reduce(x, Reducer::Sum, &[group], Grouping::FlattenedIds)?)
}

/// Which gradients are shards (fsdp, or the weights over context), and the device groups
/// their sums run over.
pub(super) struct ReduceGroups {
    /// Per parameter: whether its gradient is a shard (it came out of the all-gathers'
    /// transposes, reduce-scatters over the batch and context axes, already summed over
    /// them).
    pub(super) sharded: Vec<bool>,
    /// Every device.
    pub(super) all: Vec<Vec<i64>>,
    /// Devices with the same batch and context coordinates (the ring axis of USP; one
    /// device each otherwise, or when the shards are split over the ring axis too): where a
    /// shard's gradient still needs its sum.
    pub(super) ring: Vec<Vec<i64>>,
    /// Devices with the same ring coordinate (the batch x context plane; every device when
    /// the shards are split over the ring axis too): where the shards' squares add up to
    /// the global norm.
    pub(super) shards: Vec<Vec<i64>>,
}

impl ReduceGroups {
    pub(super) fn new(mesh: &Mesh<ModelMesh>, specs: &[ParamSpec], split: WeightSplit) -> Self {
        let devices = mesh.num_devices() as i64;
        let sharded = specs
            .iter()
            .map(|s| split.is_split() && s.fsdp_dim.is_some())
            .collect();
        let all = vec![(0..devices).collect()];
        if split == WeightSplit::Ring {
            // Split over every device: the reduce-scatters summed the shards everywhere.
            let alone = (0..devices).map(|d| vec![d]).collect();
            return ReduceGroups {
                sharded,
                all: all.clone(),
                ring: alone,
                shards: all,
            };
        }
        // Row-major device ids: the ring axis is the innermost, so a device's ring
        // coordinate is its id modulo the ring size.
        let ring_size = mesh.axis_size::<RingAxis>() as i64;
        ReduceGroups {
            sharded,
            all,
            ring: mesh.axis::<RingAxis>().groups().to_vec(),
            shards: (0..ring_size)
                .map(|r| (r..devices).step_by(ring_size as usize).collect())
                .collect(),
        }
    }
}

/// Sums `values` over each group of `groups` in one all-reduce of their concatenation
/// (nothing to do for groups of one device).
pub(super) fn all_reduce_concat(
    f: &mut FuncBuilder<'_>,
    values: &[Value],
    groups: &[Vec<i64>],
) -> Result<Vec<Value>, CollectiveError> {
    if values.is_empty() || groups.iter().all(|g| g.len() == 1) {
        return Ok(values.to_vec());
    }
    let mut flat = Vec::with_capacity(values.len());
    let mut sizes = Vec::with_capacity(values.len());
    for &v in values {
        let t = f.value_type(v)?.clone();
        let size: i64 = t.dims.iter().product();
        sizes.push((size, t.dims.clone()));
        flat.push(f.reshape(v, &[size])?);
    }
    let all = f.concatenate(&flat, 0)?;
    let all = f.all_reduce(all, Reducer::Sum, groups, Grouping::FlattenedIds)?;
    let mut out = Vec::with_capacity(values.len());
    let mut at = 0;
    for (size, dims) in sizes {
        let v = f.slice(all, &[at], &[at + size])?;
        out.push(f.reshape(v, &dims)?);
        at += size;
    }
    Ok(out)
}

/// Sums the gradients and the loss over the devices: replicated gradients and the loss over
/// every device, in one all-reduce; with fsdp the shards (already summed over the batch and
/// context axes by the reduce-scatters) over the ring axis (USP), in another. Returns the mean loss
/// and the gradients.
pub(super) fn reduce_gradients(
    f: &mut FuncBuilder<'_>,
    grads: &[Value],
    loss_sum: Value,
    norm: LossNorm,
    groups: &ReduceGroups,
) -> Result<(Value, Vec<Value>), CollectiveError> {
    let (mut whole, mut shards) = (Vec::new(), Vec::new());
    for (&g, &sharded) in grads.iter().zip(&groups.sharded) {
        if sharded { &mut shards } else { &mut whole }.push(g);
    }
    whole.push(loss_sum);
    let mut whole = all_reduce_concat(f, &whole, &groups.all)?.into_iter();
    let mut shards = all_reduce_concat(f, &shards, &groups.ring)?.into_iter();
    let mut out = Vec::with_capacity(grads.len());
    for &sharded in &groups.sharded {
        let next = if sharded { shards.next() } else { whole.next() };
        out.push(next.ok_or_else(|| CollectiveError::local("a gradient per parameter"))?);
    }
    let loss = whole
        .next()
        .ok_or_else(|| CollectiveError::local("the loss after the gradients"))?;
    let loss = norm.apply(f, loss)?;
    Ok((loss, out))
}

/// `sqrt(sum of g^2)` over every gradient: the shards' squares summed over the batch and
/// context axes.
pub(super) fn global_norm(
    f: &mut FuncBuilder<'_>,
    grads: &[Value],
    groups: &ReduceGroups,
) -> Result<Value, CollectiveError> {
    let mut whole = f.scalar(0.0, DType::F32)?;
    let mut shards = f.scalar(0.0, DType::F32)?;
    for (&g, &sharded) in grads.iter().zip(&groups.sharded) {
        let rank = f.value_type(g)?.rank() as i64;
        let g2 = f.mul(g, g)?;
        let s = f.reduce(g2, &(0..rank).collect::<Vec<_>>(), Reducer::Sum)?;
        let acc = if sharded { &mut shards } else { &mut whole };
        *acc = f.add(*acc, s)?;
    }
    if groups.sharded.iter().any(|&s| s) {
        let summed = all_reduce_concat(f, &[shards], &groups.shards)?;
        whole = f.add(whole, summed[0])?;
    }
    Ok(f.sqrt(whole)?)
}

/// Global-norm clipping and AdamW. `moments` are `mu` then `nu` (one per parameter), `hyper`
/// is `[lr, 1/(1-b1^t), 1/(1-b2^t)]`. Returns the gradient norm (before clipping) and the new
/// parameters, `mu` and `nu`, in that order. Elementwise, so with fsdp it runs on the shards.
#[allow(clippy::too_many_arguments)]
pub(super) fn adamw(
    f: &mut FuncBuilder<'_>,
    cfg: &TrainConfig,
    specs: &[crate::model::ParamSpec],
    params: &[Value],
    moments: &[Value],
    grads: &[Value],
    hyper: Value,
    groups: &ReduceGroups,
) -> Result<(Value, Vec<Value>), CollectiveError> {
    let n = params.len();
    let norm = global_norm(f, grads, groups)?;
    let scalar = |f: &mut FuncBuilder<'_>, i: i64| -> Result<Value, CollectiveError> {
        let x = f.slice(hyper, &[i], &[i + 1])?;
        Ok(f.reshape(x, &[])?)
    };
    let (lr, bc1, bc2) = (scalar(f, 0)?, scalar(f, 1)?, scalar(f, 2)?);
    // Clipping: g * clip / max(norm, clip).
    let clip = cfg.gradient_clipping_threshold;
    let factor = if clip > 0.0 {
        let c = f.scalar(clip, DType::F32)?;
        let denom = f.max(norm, c)?;
        Some(f.div(c, denom)?)
    } else {
        None
    };
    let mut new_params = Vec::with_capacity(n);
    let mut new_mu = Vec::with_capacity(n);
    let mut new_nu = Vec::with_capacity(n);
    for i in 0..n {
        let (p, mu, nu) = (params[i], moments[i], moments[n + i]);
        let t = f.value_type(p)?.clone();
        let dims = t.dims.clone();
        let full = |f: &mut FuncBuilder<'_>, s: Value| -> Result<Value, CollectiveError> {
            Ok(f.broadcast_in_dim(s, &dims, &[])?)
        };
        let mut g = grads[i];
        if let Some(factor) = factor {
            let fb = full(f, factor)?;
            g = f.mul(g, fb)?;
        }
        let mu_decay = scale(f, mu, cfg.adam_b1)?;
        let g1 = scale(f, g, 1.0 - cfg.adam_b1)?;
        let mu1 = f.add(mu_decay, g1)?;
        let nu_decay = scale(f, nu, cfg.adam_b2)?;
        let gg = f.mul(g, g)?;
        let g2 = scale(f, gg, 1.0 - cfg.adam_b2)?;
        let nu1 = f.add(nu_decay, g2)?;
        let bc1b = full(f, bc1)?;
        let bc2b = full(f, bc2)?;
        let mhat = f.mul(mu1, bc1b)?;
        let vhat = f.mul(nu1, bc2b)?;
        let root = f.sqrt(vhat)?;
        let eps = f.splat(cfg.adam_eps, t.clone())?;
        let denom = f.add(root, eps)?;
        let mut update = f.div(mhat, denom)?;
        if specs[i].decay && cfg.weight_decay > 0.0 {
            let wd = scale(f, p, cfg.weight_decay)?;
            update = f.add(update, wd)?;
        }
        let lrb = full(f, lr)?;
        let step = f.mul(update, lrb)?;
        new_params.push(f.sub(p, step)?);
        new_mu.push(mu1);
        new_nu.push(nu1);
    }
    let mut all = new_params;
    all.extend(new_mu);
    all.extend(new_nu);
    Ok((norm, all))
}
