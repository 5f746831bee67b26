//! The model's elementwise and shape helpers on StableHLO values: RoPE, RMSNorm, SiLU,
//! one-hot, log-sum-exp, heads in and out.

use super::*;

/// `x` in `dtype` (itself when it already is).
pub(super) fn cast(
    f: &mut FuncBuilder<'_>,
    x: Value,
    dtype: DType,
) -> Result<Value, CollectiveError> {
    if f.value_type(x)?.dtype == dtype {
        Ok(x)
    } else {
        Ok(f.convert(x, dtype)?)
    }
}

/// `x * c` for a constant `c`.
pub(super) fn scale(f: &mut FuncBuilder<'_>, x: Value, c: f64) -> Result<Value, CollectiveError> {
    let t = f.value_type(x)?.clone();
    let c = f.splat(c, t)?;
    Ok(f.mul(x, c)?)
}

/// `x` ([`N`] or a scalar) broadcast along new dims to `dims`, keeping `keep`.
pub(super) fn bcast(
    f: &mut FuncBuilder<'_>,
    x: Value,
    dims: &[i64],
    keep: &[i64],
) -> Result<Value, CollectiveError> {
    Ok(f.broadcast_in_dim(x, dims, keep)?)
}

/// `[N]` int32 ids as `[N, vocab]` f32 one-hot rows.
pub(super) fn one_hot(
    f: &mut FuncBuilder<'_>,
    ids: Value,
    vocab: usize,
) -> Result<Value, CollectiveError> {
    let n = f.value_type(ids)?.dims[0];
    let dims = [n, vocab as i64];
    let ids = bcast(f, ids, &dims, &[0])?;
    let columns = f.iota(TensorType::new(dims, DType::I32), 1)?;
    let hit = f.eq(ids, columns)?;
    Ok(f.convert(hit, DType::F32)?)
}

/// RoPE's `cos` and `sin` `[N, head_dim / 2]` at `positions [N]` (int32).
pub(super) fn rope_tables(
    f: &mut FuncBuilder<'_>,
    positions: Value,
    head_dim: usize,
    theta: f64,
) -> Result<(Value, Value), CollectiveError> {
    let n = f.value_type(positions)?.dims[0];
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|j| theta.powf(-2.0 * j as f64 / head_dim as f64))
        .collect();
    let inv_freq = HostArray::from_f64(DType::F32, vec![half], &inv_freq)
        .map_err(|e| CollectiveError::local(e.to_string()))?;
    let inv_freq = f.constant(&inv_freq)?;
    let dims = [n, half as i64];
    let pos = f.convert(positions, DType::F32)?;
    let pos = bcast(f, pos, &dims, &[0])?;
    let freq = bcast(f, inv_freq, &dims, &[1])?;
    let angle = f.mul(pos, freq)?;
    Ok((f.cos(angle)?, f.sin(angle)?))
}

/// RoPE on `x [N, heads * head_dim]`: each head's halves `(x1, x2)` become
/// `(x1 cos - x2 sin, x2 cos + x1 sin)`.
pub(super) fn rope(
    f: &mut FuncBuilder<'_>,
    x: Value,
    heads: usize,
    cos: Value,
    sin: Value,
) -> Result<Value, CollectiveError> {
    let n = f.value_type(x)?.dims[0];
    let width = f.value_type(x)?.dims[1];
    let hd = width / heads as i64;
    let half = hd / 2;
    let h = heads as i64;
    let x = f.reshape(x, &[n, h, hd])?;
    let x1 = f.slice(x, &[0, 0, 0], &[n, h, half])?;
    let x2 = f.slice(x, &[0, 0, half], &[n, h, hd])?;
    let dims = [n, h, half];
    let c = bcast(f, cos, &dims, &[0, 2])?;
    let s = bcast(f, sin, &dims, &[0, 2])?;
    let (x1c, x2s) = (f.mul(x1, c)?, f.mul(x2, s)?);
    let (x2c, x1s) = (f.mul(x2, c)?, f.mul(x1, s)?);
    let y1 = f.sub(x1c, x2s)?;
    let y2 = f.add(x2c, x1s)?;
    let y = f.concatenate(&[y1, y2], 2)?;
    Ok(f.reshape(y, &[n, width])?)
}

/// `[N, heads * hd]` rows to the attention's `[b, heads, s, hd]`.
pub(super) fn to_heads(
    f: &mut FuncBuilder<'_>,
    x: Value,
    b: i64,
    s: i64,
    heads: usize,
) -> Result<Value, CollectiveError> {
    let width = f.value_type(x)?.dims[1];
    let h = heads as i64;
    let x = f.reshape(x, &[b, s, h, width / h])?;
    Ok(f.transpose(x, &[0, 2, 1, 3])?)
}

/// The attention's `[b, heads, s, hd]` back to `[N, heads * hd]` rows.
pub(super) fn from_heads(f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, CollectiveError> {
    let d = f.value_type(x)?.dims.clone();
    let x = f.transpose(x, &[0, 2, 1, 3])?;
    Ok(f.reshape(x, &[d[0] * d[2], d[1] * d[3]])?)
}

/// RMSNorm of the rows of `x [N, D]` with scale `g [D]`: `(x r g, r)` where
/// `r = 1 / sqrt(mean(x^2) + eps)` per row.
pub(super) fn rms_norm(
    f: &mut FuncBuilder<'_>,
    x: Value,
    g: Value,
    eps: f64,
) -> Result<(Value, Value), CollectiveError> {
    let dims = f.value_type(x)?.dims.clone();
    let sq = f.mul(x, x)?;
    let ms = f.reduce(sq, &[1], Reducer::Sum)?;
    let ms = scale(f, ms, 1.0 / dims[1] as f64)?;
    let eps = f.splat(eps, TensorType::new([dims[0]], DType::F32))?;
    let r = f.add(ms, eps)?;
    let r = f.unary(UnaryOp::Rsqrt, r)?;
    let rb = bcast(f, r, &dims, &[0])?;
    let gb = bcast(f, g, &dims, &[1])?;
    let y = f.mul(x, rb)?;
    Ok((f.mul(y, gb)?, r))
}

/// `a * sigmoid(a)`.
pub(super) fn silu(f: &mut FuncBuilder<'_>, a: Value) -> Result<Value, CollectiveError> {
    let s = f.logistic(a)?;
    Ok(f.mul(a, s)?)
}

/// The logsumexp of the rows of `logits [N, V]`.
pub(super) fn logsumexp(f: &mut FuncBuilder<'_>, logits: Value) -> Result<Value, CollectiveError> {
    let dims = f.value_type(logits)?.dims.clone();
    let max = f.reduce(logits, &[1], Reducer::Max)?;
    let maxb = bcast(f, max, &dims, &[0])?;
    let z = f.sub(logits, maxb)?;
    let e = f.exp(z)?;
    let sum = f.reduce(e, &[1], Reducer::Sum)?;
    let log_sum = f.log(sum)?;
    Ok(f.add(log_sum, max)?)
}

/// 1.0 where a target (any shape, int32) is a token, 0.0 where it is -1 (no target), as a
/// flat `[N]` f32 vector.
pub(super) fn target_mask(
    f: &mut FuncBuilder<'_>,
    targets: Value,
) -> Result<Value, CollectiveError> {
    let n: i64 = f.value_type(targets)?.dims.iter().product();
    let t = f.reshape(targets, &[n])?;
    let zero = f.scalar(0.0, DType::I32)?;
    let zero = bcast(f, zero, &[n], &[])?;
    let real = f.compare(tessera_hlo::ComparisonDirection::Ge, t, zero)?;
    Ok(f.convert(real, DType::F32)?)
}
