//! What a splash call computes, in floating-point operations: the visible (query, key) pairs
//! of its mask and the flops of each kernel over them (what `tessera bench` divides by time).

use crate::attention::SplashAttention;
use crate::mask::{Mask, MultiHeadMask};

impl SplashAttention {
    /// The visible (query, key) pairs over the whole batch and all heads, counted from the
    /// mask at its sequence offsets (segment ids, which depend on the data, not counted).
    pub fn visible_pairs(&self) -> f64 {
        let d = self.dims();
        let o = self.options().offsets;
        let count = |m: &Mask| -> u64 {
            (0..d.q_len)
                .map(|i| {
                    (0..d.kv_len)
                        .filter(|&j| m.allows((o.q + i) as i64, (o.kv + j) as i64))
                        .count() as u64
                })
                .sum()
        };
        let pairs: u64 = match self.mask() {
            MultiHeadMask::Shared(m) => count(m) * d.heads as u64,
            MultiHeadMask::PerHead(ms) => ms.iter().map(count).sum(),
        };
        (pairs * d.batch as u64) as f64
    }

    /// The floating-point operations of one call of the splash kernel `kernel` (a kernel of
    /// the forward or backward plans), over `pairs` visible pairs ([`Self::visible_pairs`]):
    /// each matmul a `D`-long dot product per pair, and the elementwise passes; 0 for a name
    /// that is not a splash kernel.
    pub fn kernel_flops(&self, kernel: &str, pairs: f64) -> f64 {
        let d = self.dims();
        let matmuls = |n: f64| 2.0 * n * d.head_dim as f64 * pairs;
        let rows = (d.batch * d.heads * d.q_len) as f64;
        match kernel {
            // q k^T and p v.
            "splash_fwd" => matmuls(2.0),
            // q k^T, dout v^T, p^T dout, ds^T q, ds k.
            "splash_bwd_fused" => matmuls(5.0),
            "splash_dq" => matmuls(3.0),
            "splash_dkv" => matmuls(4.0),
            // rowsum(out * dout).
            "splash_bwd_prep" => 2.0 * rows * d.head_dim_v as f64,
            // One addition per dQ partial and element of dq.
            "splash_dq_reduce" => self.dq_slots() as f64 * rows * d.head_dim as f64,
            _ => 0.0,
        }
    }
}
