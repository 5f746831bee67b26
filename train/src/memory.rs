//! What a train step holds in memory, estimated from its settings before anything is built
//! or allocated, so that a run that cannot fit is refused with one sentence instead of
//! aborting on an allocation failure (the example on this machine's memory, `tessera compile
//! train` on the chip's HBM).
//!
//! All arithmetic is in `f64` (a product of dims a user typed cannot overflow; at worst it is
//! `inf`, which fits nowhere), so this is safe to call on settings nothing has validated yet.
//! It is an estimate of what the step keeps live, not an exact count:
//! - state: the f32 parameters, their gradients and both AdamW moments (16 bytes a
//!   parameter), split over fsdp x the context axis's weight shards when the step shards
//!   them (`TrainConfig::shards_weights`);
//! - activations, for the tokens one device holds (`per_device_batch_size x
//!   max_target_length`): the residual stream each layer saves for the backward (in the
//!   compute dtype), one layer's live intermediates during its backward (f32, forward and
//!   gradient), the logits with their softmax and gradient (f32), and the token ids; the
//!   layer's and the logits' together, as they are when the last layer is not re-run
//!   (`TrainConfig::remat_last_layer`) and holds its activations through the loss;
//! - with [`RematPolicy::SaveAttention`], what each layer keeps of its attention: q, k and v
//!   as the kernels take them (k and v whole sequences where the strategy gathers them, every
//!   ring step's shard for a ring, every query head's for the fused Ulysses kernels), each
//!   kernel call's output and logsumexp (f32), and the output as the projection takes it
//!   (compute dtype).

use tessera_parallel::strategy::Exchange;

use crate::{RematPolicy, SettingError, TrainConfig};

/// Bytes one device holds during a train step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimate {
    /// Parameters, gradients and AdamW moments.
    pub state_bytes: f64,
    /// Activations of the device's tokens.
    pub activation_bytes: f64,
}

impl MemoryEstimate {
    /// Everything one device holds.
    pub fn per_device(&self) -> f64 {
        self.state_bytes + self.activation_bytes
    }
}

/// Parameters of `cfg`'s model, counted in `f64` (as [`crate::model::param_specs`] lays
/// them out).
pub fn param_count(cfg: &TrainConfig) -> f64 {
    let m = &cfg.model;
    let [v, d, l, h, kv, hd, f] = [
        m.vocab, m.d_model, m.layers, m.heads, m.kv_heads, m.head_dim, m.mlp_dim,
    ]
    .map(|x| x as f64);
    let layer = 2.0 * d + 2.0 * d * h * hd + 2.0 * d * kv * hd + 3.0 * d * f;
    2.0 * v * d + l * layer + d
}

/// The estimate for one device of `cfg` (see the module docs).
pub fn estimate(cfg: &TrainConfig) -> MemoryEstimate {
    let m = &cfg.model;
    let [v, d, l, h, kv, hd, f] = [
        m.vocab, m.d_model, m.layers, m.heads, m.kv_heads, m.head_dim, m.mlp_dim,
    ]
    .map(|x| x as f64);
    let rows = if cfg.weight_rows_over_ring() {
        cfg.weight_ring_shards()
    } else {
        cfg.ici_fsdp_parallelism
    };
    let shards = if cfg.shards_weights() {
        rows as f64 * cfg.weight_context_shards().max(1) as f64
    } else {
        1.0
    };
    let state_bytes = 16.0 * param_count(cfg) / shards;
    let tokens = cfg.per_device_batch_size * cfg.max_target_length as f64;
    let act = cfg.dtype.size_bytes() as f64;
    let saved = l * d * act;
    let kept_attention = match cfg.remat_policy {
        RematPolicy::Full => 0.0,
        RematPolicy::SaveAttention => {
            // K/V copies a device's kernels take (the gathered sequence, or every ring
            // step's shard) and the kernel calls whose output and logsumexp are kept.
            // The fused Ulysses kernels take this device's rows of every query head's K and V
            // (GQA's KV heads repeated).
            let cp = cfg.ici_context_parallelism.max(1) as f64;
            let (kv_heads, calls) = match cfg.strategy.exchange(cp as usize) {
                Exchange::Heads => (kv, 1.0),
                Exchange::HeadsInKernel => (h, 1.0),
                Exchange::AllKeys => (kv * cp, 1.0),
                Exchange::Ring { ring, .. } => (kv * ring as f64, ring as f64),
            };
            let qkv = (h + 2.0 * kv_heads) * hd * act;
            let outputs = calls * (h * hd * act + 4.0 * h) + h * hd * act;
            l * (qkv + outputs)
        }
    };
    let layer = 2.0 * 4.0 * (6.0 * d + 2.0 * (h + 2.0 * kv) * hd + 3.0 * f);
    let logits = 3.0 * 4.0 * v;
    let ids = 3.0 * 4.0;
    MemoryEstimate {
        state_bytes,
        activation_bytes: tokens * (saved + kept_attention + layer + logits + ids),
    }
}

/// Refuses `cfg` when `devices` devices of it need more than `available` bytes together
/// (`place`: where they live, for the message, e.g. "this machine" or "a v5p chip's HBM").
/// With `devices` 1 the check is per device.
pub fn check_fits(
    cfg: &TrainConfig,
    devices: usize,
    available: f64,
    place: &str,
) -> Result<MemoryEstimate, SettingError> {
    let e = estimate(cfg);
    let needed = e.per_device() * devices as f64;
    if needed.is_finite() && needed <= available {
        return Ok(e);
    }
    Err(SettingError::Memory {
        needed,
        state: e.state_bytes * devices as f64,
        activations: e.activation_bytes * devices as f64,
        devices,
        available,
        place: place.to_string(),
        per_device_batch_size: cfg.per_device_batch_size,
        seq_len: cfg.max_target_length,
    })
}
