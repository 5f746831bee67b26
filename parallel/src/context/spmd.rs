//! SPMD glue: what the strategies and the typed splash calls emit around the kernels inside
//! a program (splash plans as custom-VJP units, segment ids sliced per call, a device's
//! chunks of the sequence, the kernels' logsumexp layout, KV head replication).

use std::collections::HashMap;

use tessera_collectives::{CollectiveError, DTensor, MeshShape};
use tessera_dsl::DType;
use tessera_hlo::{FuncBuilder, Value};
use tessera_splash::{Stage, Tensor};

/// Lowers a splash forward plan into `f` as a custom-VJP unit whose backward is the
/// `backward` plan, each kernel for the plan's target (inline, or a Mosaic custom call inside
/// the manual-sharded region); `shard` selects the per-shard tables. With `keep_residuals`
/// ([`tessera_splash::SplashOptions::keep_residuals`]) the unit's inputs and outputs are
/// kept for the backward of a loop holding it. Errors in the collectives' form.
pub(crate) fn lower_forward(
    f: &mut FuncBuilder<'_>,
    forward: &[Stage],
    backward: Vec<Stage>,
    env: &mut HashMap<Tensor, Value>,
    shard: Option<Value>,
    keep_residuals: bool,
) -> Result<(), CollectiveError> {
    tessera_splash::lower_forward_on_shard(f, forward, backward, env, shard)
        .map_err(|e| CollectiveError::local(e.to_string()))?;
    if keep_residuals {
        for t in [Tensor::Q, Tensor::K, Tensor::V, Tensor::Out, Tensor::Lse] {
            f.keep_for_backward(env[&t])?;
        }
    }
    Ok(())
}

/// Whole `[B, S]` segment ids in a program, sliced per device and step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segments {
    pub full: Value,
}

impl Segments {
    /// Positions `start .. start + len` (all when `start` is `None`) as the kernels' query
    /// or key segment ids (both `[B, 1, len]`).
    pub(crate) fn slice(
        &self,
        f: &mut FuncBuilder<'_>,
        start: Option<Value>,
        len: usize,
    ) -> Result<Value, CollectiveError> {
        let b = f.value_type(self.full)?.dims[0];
        let len = len as i64;
        let x = match start {
            Some(start) => {
                let zero = f.scalar(0.0, DType::I32)?;
                f.dynamic_slice(self.full, &[zero, start], &[b, len])?
            }
            None => self.full,
        };
        Ok(f.reshape(x, &[b, 1, len])?)
    }

    /// Adds the query and key segment ids of an attention of `q_len` queries from `q_start`
    /// and `kv_len` keys from `kv_start` to a plan's environment.
    pub fn add_to(
        &self,
        f: &mut FuncBuilder<'_>,
        env: &mut HashMap<Tensor, Value>,
        (q_start, q_len): (Option<Value>, usize),
        (kv_start, kv_len): (Option<Value>, usize),
    ) -> Result<(), CollectiveError> {
        let q = self.slice(f, q_start, q_len)?;
        let kv = self.slice(f, kv_start, kv_len)?;
        env.extend([(Tensor::QSegments, q), (Tensor::KvSegments, kv)]);
        Ok(())
    }
}

/// In a program, where part `part` of the shard `(shard + shift) mod ring` starts in the
/// natural sequence: [`chunk_of`](super::config::chunk_of)`((shard + shift) mod ring, part,
/// ring) * len`, the rule the strategies' kernel calls are listed with, on the device's own
/// position.
pub(crate) fn part_start(
    f: &mut FuncBuilder<'_>,
    shard: Value,
    shift: usize,
    ring: usize,
    part: usize,
    len: usize,
) -> Result<Value, CollectiveError> {
    let shift = f.scalar(shift as f64, DType::I32)?;
    let ring_size = f.scalar(ring as f64, DType::I32)?;
    let x = f.add(shard, shift)?;
    let mut chunk = f.rem(x, ring_size)?;
    if part == 1 {
        let last = f.scalar((2 * ring - 1) as f64, DType::I32)?;
        chunk = f.sub(last, chunk)?;
    }
    let len = f.scalar(len as f64, DType::I32)?;
    Ok(f.mul(chunk, len)?)
}

/// Part `part` of `parts` equal parts of a local value's sequence dim (2).
pub(crate) fn seq_part(
    f: &mut FuncBuilder<'_>,
    x: Value,
    part: usize,
    parts: usize,
) -> Result<Value, CollectiveError> {
    if parts == 1 {
        return Ok(x);
    }
    let dims = f.value_type(x)?.dims.clone();
    let len = dims[2] / parts as i64;
    let mut start = vec![0; dims.len()];
    start[2] = part as i64 * len;
    let mut limit = dims.clone();
    limit[2] = start[2] + len;
    Ok(f.slice(x, &start, &limit)?)
}

/// Concatenates the parts of a sequence back along dim 2.
pub(crate) fn seq_concat(
    f: &mut FuncBuilder<'_>,
    parts: &[Value],
) -> Result<Value, CollectiveError> {
    if parts.len() == 1 {
        return Ok(parts[0]);
    }
    Ok(f.concatenate(parts, 2)?)
}

/// `x` with dim `dim` cut into `order.len()` chunks, chunk `i` of the result being chunk
/// `order[i]` of `x` (the in-program twin of the host's
/// [`permute_chunks`](super::program::permute_chunks)).
pub(crate) fn reorder_chunks(
    f: &mut FuncBuilder<'_>,
    x: Value,
    dim: usize,
    order: &[usize],
) -> Result<Value, CollectiveError> {
    let dims = f.value_type(x)?.dims.clone();
    let len = dims[dim] / order.len() as i64;
    let mut chunks = Vec::with_capacity(order.len());
    for &c in order {
        let mut start = vec![0; dims.len()];
        start[dim] = c as i64 * len;
        let mut limit = dims.clone();
        limit[dim] = start[dim] + len;
        chunks.push(f.slice(x, &start, &limit)?);
    }
    Ok(f.concatenate(&chunks, dim as i64)?)
}

/// `[b, h, n, ..]` as `[b, h, 1, n, ..]` (a chunk of the sequence as one of `[R, S/R]`), or
/// back (`merge`: `[b, h, r, n, ..]` as `[b, h, r n, ..]`).
pub(crate) fn chunk_view(
    f: &mut FuncBuilder<'_>,
    x: Value,
    merge: bool,
) -> Result<Value, CollectiveError> {
    let d = f.value_type(x)?.dims.clone();
    let dims: Vec<i64> = if merge {
        [&d[..2], &[d[2] * d[3]], &d[4..]].concat()
    } else {
        [&d[..2], &[1], &d[2..]].concat()
    };
    Ok(f.reshape(x, &dims)?)
}

/// `lse [B, H, S]` as the kernels' `[B, H, 1, S]`.
pub(crate) fn lse_to_kernel(f: &mut FuncBuilder<'_>, lse: Value) -> Result<Value, CollectiveError> {
    let d = f.value_type(lse)?.dims.clone();
    Ok(f.reshape(lse, &[d[0], d[1], 1, d[2]])?)
}

/// The kernels' `[B, H, 1, S]` as `lse [B, H, S]`.
pub(crate) fn lse_from_kernel(
    f: &mut FuncBuilder<'_>,
    lse: Value,
) -> Result<Value, CollectiveError> {
    let d = f.value_type(lse)?.dims.clone();
    Ok(f.reshape(lse, &[d[0], d[1], d[3]])?)
}

/// Repeats each head `rep` times along dim 1 (`[B, KVH, ...] -> [B, KVH*rep, ...]`), so head
/// `j` becomes heads `j*rep .. j*rep + rep` (KV head replication for a Ulysses degree above
/// the KV heads).
pub(crate) fn replicate_heads<'p, M: MeshShape, S, V>(
    x: &DTensor<'p, M, S, V>,
    rep: usize,
) -> Result<DTensor<'p, M, S, V>, CollectiveError> {
    if rep == 1 {
        return Ok(x.clone());
    }
    x.map_local(|f, v| {
        let d = f.value_type(v)?.dims.clone();
        let wide: Vec<i64> = [&d[..2], &[rep as i64], &d[2..]].concat();
        let keep: Vec<i64> = [0, 1].into_iter().chain(3..wide.len() as i64).collect();
        let wide = f.broadcast_in_dim(v, &wide, &keep)?;
        let merged: Vec<i64> = [&[d[0], d[1] * rep as i64], &d[2..]].concat();
        Ok(f.reshape(wide, &merged)?)
    })
}
