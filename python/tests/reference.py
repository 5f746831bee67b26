"""Dense attention in f64 with jax.numpy, written from the definition (separately from the
kernels): the reference for splash attention's outputs, logsumexp and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def mask_matrix(mask: str, q_len: int, kv_len: int) -> np.ndarray:
    """`[Sq, Skv]` bool: which keys each query sees under tessera's mask syntax."""
    q = np.arange(q_len)[:, None]
    k = np.arange(kv_len)[None, :]
    parts = mask.split(":")
    if parts == ["full"]:
        return np.ones((q_len, kv_len), bool)
    if parts[0] == "causal":
        offset = int(parts[1]) if len(parts) == 2 else 0
        return k <= q + offset
    if parts[0] == "local":
        left, right = int(parts[1]), int(parts[2])
        return (q - left <= k) & (k <= q + right)
    if parts[0] == "chunked":
        chunk = int(parts[1])
        return (k <= q) & (q // chunk == k // chunk)
    raise ValueError(mask)


def attention(q, k, v, *, mask, segment_ids=None, soft_cap=None, sinks=None, scale=None):
    """`(out, lse)` of dense attention, in f64: q `[B, H, Sq, D]`, k and v `[B, KVH, Skv, D]`
    (query head h uses kv head h // (H / KVH)); lse `[B, H, Sq]`."""
    q, k, v = (jnp.asarray(x, jnp.float64) for x in (q, k, v))
    heads, kv_heads = q.shape[1], k.shape[1]
    k = jnp.repeat(k, heads // kv_heads, axis=1)
    v = jnp.repeat(v, heads // kv_heads, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    visible = jnp.asarray(mask_matrix(mask, q.shape[2], k.shape[2]))[None, None]
    if segment_ids is not None:
        q_ids, kv_ids = (jnp.asarray(i) for i in segment_ids)
        visible = visible & (q_ids[:, None, :, None] == kv_ids[:, None, None, :])
    logits = jnp.where(visible, logits, -jnp.inf)
    if sinks is not None:
        sink = jnp.broadcast_to(
            jnp.asarray(sinks, jnp.float64)[None, :, None, None], logits.shape[:3] + (1,)
        )
        logits = jnp.concatenate([logits, sink], axis=-1)
        v = jnp.concatenate([v, jnp.zeros(v.shape[:2] + (1, v.shape[3]))], axis=2)
    lse = jax.nn.logsumexp(logits, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", jnp.exp(logits - lse[..., None]), v)
    return out, lse
