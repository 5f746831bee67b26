//! Synthetic data with structure to learn, deterministic from the seed: a Markov chain over
//! the vocabulary where every token has four successors drawn once from the seed, taken with
//! probabilities 1/2, 1/4, 1/8, 1/8. A model that learns the table brings the cross-entropy
//! from `ln(vocab)` down to the chain's entropy, 1.21 nats (`1.75 ln 2`).

/// The successors of each token and their cumulative probabilities (in eighths).
const CUMULATIVE_EIGHTHS: [u32; 4] = [4, 6, 7, 8];

/// The chain's entropy per token, in nats: the loss a perfect model reaches.
pub const ENTROPY_NATS: f64 = 1.75 * std::f64::consts::LN_2;

/// A seeded Markov chain producing the batches of every step.
#[derive(Debug, Clone)]
pub struct SyntheticData {
    seed: u64,
    vocab: usize,
    successors: Vec<[u32; 4]>,
}

/// One step's `[B, S]` inputs and next-token targets, row-major, in natural order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub tokens: Vec<i32>,
    pub targets: Vec<i32>,
}

impl SyntheticData {
    /// The chain of `seed` over `vocab` tokens.
    pub fn new(seed: u64, vocab: usize) -> Self {
        let mut rng = fastrand::Rng::with_seed(mix(seed, u64::MAX, 0));
        let successors = (0..vocab)
            .map(|_| std::array::from_fn(|_| rng.u32(0..vocab as u32)))
            .collect();
        SyntheticData {
            seed,
            vocab,
            successors,
        }
    }

    /// The batch of step `step` (0-based): `batch` sequences of `seq` tokens, each from its
    /// own stream of the seed, so a step's data does not depend on what ran before it.
    pub fn batch(&self, step: usize, batch: usize, seq: usize) -> Batch {
        let mut tokens = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for row in 0..batch {
            let mut rng = fastrand::Rng::with_seed(mix(self.seed, step as u64, row as u64));
            let mut t = rng.u32(0..self.vocab as u32);
            for _ in 0..seq {
                let draw = rng.u32(0..8);
                let pick = CUMULATIVE_EIGHTHS
                    .iter()
                    .position(|&c| draw < c)
                    .unwrap_or(3);
                let next = self.successors[t as usize][pick];
                tokens.push(t as i32);
                targets.push(next as i32);
                t = next;
            }
        }
        Batch { tokens, targets }
    }
}

/// A 64-bit mix of three words (splitmix64 finalisers): independent streams per
/// (seed, step, row).
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut x = a ^ b.rotate_left(21) ^ c.rotate_left(42) ^ 0x9e37_79b9_7f4a_7c15;
    for _ in 0..2 {
        x ^= x >> 30;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_deterministic_and_follow_the_chain() {
        let data = SyntheticData::new(7, 64);
        let a = data.batch(3, 2, 100);
        assert_eq!(a, SyntheticData::new(7, 64).batch(3, 2, 100));
        assert_ne!(a, data.batch(4, 2, 100));
        assert_ne!(a, SyntheticData::new(8, 64).batch(3, 2, 100));
        for (i, (&t, &n)) in a.tokens.iter().zip(&a.targets).enumerate() {
            assert!(data.successors[t as usize].contains(&(n as u32)));
            if (i + 1) % 100 != 0 {
                assert_eq!(a.tokens[i + 1], n, "targets are the next tokens");
            }
        }
    }
}
