//! A dense float64 reference for splash attention's forward and gradients, written for clarity
//! (one query row at a time, straight from the definitions) and sharing no code with the
//! kernels. Tests compare the kernels against it.

pub use crate::attention::Dims;
use crate::mask::{MultiHeadMask, SeqOffsets};

/// Everything the reference reads, as f64 row-major arrays in the kernels' layouts:
/// `q [B, H, Sq, D]`, `k [B, KVH, Skv, D]`, `v [B, KVH, Skv, Dv]`, segment ids `[B, Sq]` and
/// `[B, Skv]`, sinks `[H]`.
#[derive(Debug, Clone, Copy)]
pub struct RefInputs<'a> {
    pub dims: Dims,
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub q_segment_ids: Option<&'a [i32]>,
    pub kv_segment_ids: Option<&'a [i32]>,
    pub sinks: Option<&'a [f64]>,
    pub mask: &'a MultiHeadMask,
    pub offsets: SeqOffsets,
    pub scale: f64,
    pub soft_cap: Option<f64>,
}

impl<'a> RefInputs<'a> {
    /// `q`, `k` and `v` under `mask`, logits scaled by `scale`; no segment ids, sinks,
    /// offsets or soft cap (set those fields on the result).
    pub fn new(
        dims: Dims,
        (q, k, v): (&'a [f64], &'a [f64], &'a [f64]),
        mask: &'a MultiHeadMask,
        scale: f64,
    ) -> Self {
        RefInputs {
            dims,
            q,
            k,
            v,
            q_segment_ids: None,
            kv_segment_ids: None,
            sinks: None,
            mask,
            offsets: SeqOffsets::default(),
            scale,
            soft_cap: None,
        }
    }
}

/// Forward results: `out [B, H, Sq, Dv]` and `lse [B, H, Sq]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RefForward {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Gradients of `sum(out * dout)`.
#[derive(Debug, Clone, PartialEq)]
pub struct RefGrads {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    /// `[H]`, when there are sinks.
    pub dsinks: Option<Vec<f64>>,
}

/// The probabilities of one query row: the visible keys with their weights and capped-logit
/// derivative, the sink's weight, and the logsumexp.
struct Row {
    /// (key index, probability, d logit / d raw logit)
    keys: Vec<(usize, f64, f64)>,
    sink_p: f64,
    lse: f64,
}

impl RefInputs<'_> {
    fn row(&self, b: usize, h: usize, i: usize) -> Row {
        let d = self.dims;
        let kvh = h / (d.heads / d.kv_heads);
        let q = &self.q[((b * d.heads + h) * d.q_len + i) * d.head_dim..][..d.head_dim];
        let mask = self.mask.head(h);
        let qpos = (self.offsets.q + i) as i64;
        let mut logits = Vec::new();
        for j in 0..d.kv_len {
            let kpos = (self.offsets.kv + j) as i64;
            let mut visible = mask.allows(qpos, kpos);
            if let (Some(qs), Some(ks)) = (self.q_segment_ids, self.kv_segment_ids) {
                visible &= qs[b * d.q_len + i] == ks[b * d.kv_len + j];
            }
            if !visible {
                continue;
            }
            let k = &self.k[((b * d.kv_heads + kvh) * d.kv_len + j) * d.head_dim..][..d.head_dim];
            let raw = self.scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
            let (logit, dlogit) = match self.soft_cap {
                Some(c) => {
                    let t = (raw / c).tanh();
                    (c * t, 1.0 - t * t)
                }
                None => (raw, 1.0),
            };
            logits.push((j, logit, dlogit));
        }
        let sink = self.sinks.map(|s| s[h]);
        let max = logits
            .iter()
            .map(|l| l.1)
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            return Row {
                keys: Vec::new(),
                sink_p: 0.0,
                lse: f64::NEG_INFINITY,
            };
        }
        let denom: f64 = logits.iter().map(|l| (l.1 - max).exp()).sum::<f64>()
            + sink.map_or(0.0, |s| (s - max).exp());
        Row {
            keys: logits
                .iter()
                .map(|&(j, l, dl)| (j, (l - max).exp() / denom, dl))
                .collect(),
            sink_p: sink.map_or(0.0, |s| (s - max).exp() / denom),
            lse: max + denom.ln(),
        }
    }

    fn v_row(&self, b: usize, h: usize, j: usize) -> &[f64] {
        let d = self.dims;
        let kvh = h / (d.heads / d.kv_heads);
        &self.v[((b * d.kv_heads + kvh) * d.kv_len + j) * d.head_dim_v..][..d.head_dim_v]
    }
}

/// `out = softmax(logits) v` over visible keys (and the sink), `lse = logsumexp(logits)`;
/// rows without a visible key (or sink) give `out = 0`, `lse = -inf`.
pub fn forward(x: &RefInputs<'_>) -> RefForward {
    let d = x.dims;
    let mut out = vec![0.0; d.batch * d.heads * d.q_len * d.head_dim_v];
    let mut lse = vec![0.0; d.batch * d.heads * d.q_len];
    for b in 0..d.batch {
        for h in 0..d.heads {
            for i in 0..d.q_len {
                let row = x.row(b, h, i);
                let r = (b * d.heads + h) * d.q_len + i;
                lse[r] = row.lse;
                let o = &mut out[r * d.head_dim_v..][..d.head_dim_v];
                for &(j, p, _) in &row.keys {
                    for (o, v) in o.iter_mut().zip(x.v_row(b, h, j)) {
                        *o += p * v;
                    }
                }
            }
        }
    }
    RefForward { out, lse }
}

/// One visible (query, key) pair of the backward: the query row `r` (flat `(b, h, i)`), the key
/// row `kr` (flat `(b, kvh, j)`) and key index `j`, the probability `p` and `ds`, the
/// gradient of the loss with respect to the raw logit `q.k` (scale and soft cap applied).
struct Pair {
    r: usize,
    kr: usize,
    j: usize,
    p: f64,
    ds: f64,
}

/// Visits every visible pair of the backward of `sum(out * dout)` (row by row); returns the
/// sinks' gradient `[H]`.
fn backward_pairs(x: &RefInputs<'_>, dout: &[f64], mut visit: impl FnMut(&Pair)) -> Vec<f64> {
    let d = x.dims;
    let mut dsinks = vec![0.0; d.heads];
    for b in 0..d.batch {
        for (h, dsink) in dsinks.iter_mut().enumerate() {
            let kvh = h / (d.heads / d.kv_heads);
            for i in 0..d.q_len {
                let row = x.row(b, h, i);
                let r = (b * d.heads + h) * d.q_len + i;
                let go = &dout[r * d.head_dim_v..][..d.head_dim_v];
                // dp_j = dout . v_j; di = sum_j p_j dp_j = out . dout.
                let dp: Vec<f64> = row
                    .keys
                    .iter()
                    .map(|&(j, _, _)| go.iter().zip(x.v_row(b, h, j)).map(|(a, b)| a * b).sum())
                    .collect();
                let di: f64 = row.keys.iter().zip(&dp).map(|(k, dp)| k.1 * dp).sum();
                *dsink -= row.sink_p * di;
                for (&(j, p, dlogit), &dp) in row.keys.iter().zip(&dp) {
                    let kr = (b * d.kv_heads + kvh) * d.kv_len + j;
                    // d loss / d raw logit, then through raw = scale * q.k.
                    let ds = p * (dp - di) * dlogit * x.scale;
                    visit(&Pair { r, kr, j, p, ds });
                }
            }
        }
    }
    dsinks
}

/// The gradients of `sum(out * dout)` with respect to q, k, v and the sinks.
pub fn backward(x: &RefInputs<'_>, dout: &[f64]) -> RefGrads {
    let d = x.dims;
    let mut dq = vec![0.0; x.q.len()];
    let mut dk = vec![0.0; x.k.len()];
    let mut dv = vec![0.0; x.v.len()];
    let (dh, dhv) = (d.head_dim, d.head_dim_v);
    let dsinks = backward_pairs(x, dout, |&Pair { r, kr, p, ds, .. }| {
        let go = &dout[r * dhv..][..dhv];
        for (dv, g) in dv[kr * dhv..][..dhv].iter_mut().zip(go) {
            *dv += p * g;
        }
        let (q, k) = (&x.q[r * dh..][..dh], &x.k[kr * dh..][..dh]);
        for (dq, k) in dq[r * dh..][..dh].iter_mut().zip(k) {
            *dq += ds * k;
        }
        for (dk, q) in dk[kr * dh..][..dh].iter_mut().zip(q) {
            *dk += ds * q;
        }
    });
    RefGrads {
        dq,
        dk,
        dv,
        dsinks: x.sinks.map(|_| dsinks),
    }
}

/// dQ split by key block, as the fused backward kernel leaves it before its reduction:
/// `[Skv / block_kv, B, H, Sq, D]`, entry `kb` summing over the keys of block `kb` only (the
/// sum over blocks is [`backward`]'s `dq`).
pub fn dq_per_key_block(x: &RefInputs<'_>, dout: &[f64], block_kv: usize) -> Vec<f64> {
    let d = x.dims;
    let dh = d.head_dim;
    let blocks = d.kv_len.div_ceil(block_kv);
    let mut out = vec![0.0; blocks * x.q.len()];
    backward_pairs(x, dout, |&Pair { r, kr, j, ds, .. }| {
        let k = &x.k[kr * dh..][..dh];
        let at = (j / block_kv) * x.q.len() + r * dh;
        for (dq, k) in out[at..][..dh].iter_mut().zip(k) {
            *dq += ds * k;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::Mask;

    /// The reference's gradients agree with central finite differences of its forward.
    #[test]
    fn gradients_match_finite_differences() {
        let dims = Dims {
            batch: 1,
            heads: 2,
            kv_heads: 1,
            q_len: 5,
            kv_len: 5,
            head_dim: 3,
            head_dim_v: 2,
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let mut r = |n: usize| (0..n).map(|_| rng.f64() * 2.0 - 1.0).collect::<Vec<_>>();
        let (q, k, v, dout) = (r(30), r(15), r(10), r(20));
        let sinks = vec![0.3, -0.5];
        let seg = vec![0, 0, 1, 1, 1];
        let mask: MultiHeadMask = Mask::causal().into();
        let inputs = |q: &[f64], k: &[f64], v: &[f64], s: &[f64]| -> f64 {
            let x = RefInputs {
                dims,
                q,
                k,
                v,
                q_segment_ids: Some(&seg),
                kv_segment_ids: Some(&seg),
                sinks: Some(s),
                mask: &mask,
                offsets: SeqOffsets::default(),
                scale: 0.7,
                soft_cap: Some(2.0),
            };
            forward(&x).out.iter().zip(&dout).map(|(o, g)| o * g).sum()
        };
        let x = RefInputs {
            dims,
            q: &q,
            k: &k,
            v: &v,
            q_segment_ids: Some(&seg),
            kv_segment_ids: Some(&seg),
            sinks: Some(&sinks),
            mask: &mask,
            offsets: SeqOffsets::default(),
            scale: 0.7,
            soft_cap: Some(2.0),
        };
        let g = backward(&x, &dout);
        let eps = 1e-6;
        let check = |name: &str, base: &[f64], grad: &[f64], f: &dyn Fn(&[f64]) -> f64| {
            for i in 0..base.len() {
                let (mut up, mut down) = (base.to_vec(), base.to_vec());
                up[i] += eps;
                down[i] -= eps;
                let fd = (f(&up) - f(&down)) / (2.0 * eps);
                assert!(
                    (fd - grad[i]).abs() < 1e-6,
                    "{name}[{i}]: {fd} vs {}",
                    grad[i]
                );
            }
        };
        check("dq", &q, &g.dq, &|p| inputs(p, &k, &v, &sinks));
        check("dk", &k, &g.dk, &|p| inputs(&q, p, &v, &sinks));
        check("dv", &v, &g.dv, &|p| inputs(&q, &k, p, &sinks));
        check("dsinks", &sinks, g.dsinks.as_ref().unwrap(), &|p| {
            inputs(&q, &k, &v, p)
        });
        // dQ per key block (blocks of 2 keys: 3 blocks, the last partial) sums to dq.
        let per_block = dq_per_key_block(&x, &dout, 2);
        assert_eq!(per_block.len(), 3 * g.dq.len());
        for (i, want) in g.dq.iter().enumerate() {
            let sum: f64 = (0..3).map(|kb| per_block[kb * g.dq.len() + i]).sum();
            assert!((sum - want).abs() < 1e-12, "dq[{i}]: {sum} vs {want}");
        }
    }
}
