//! Block sizes of the forward and backward kernels, and their validation.

use tessera_dsl::KernelRules;

use crate::error::{BlockProblem, BlockSizeError, BlockSizeReason, SplashError};

/// The TPU lane width: the minor dimension of a vreg.
pub const NUM_LANES: usize = 128;

/// Tile sizes of the splash kernels (JAX's `BlockSizes`). They barely change numerics but
/// decide speed: bigger blocks mean fewer grid steps and bigger matmuls; smaller ones skip
/// masked regions more finely.
///
/// - forward: `block_q` queries by `block_kv` keys per grid step, the keys processed
///   `block_kv_compute` at a time;
/// - dK/dV (and the fused backward): `block_q_dkv` by `block_kv_dkv`, computed
///   `block_kv_dkv_compute` keys at a time;
/// - dQ: `block_q_dq` by `block_kv_dq`, computed `block_kv_dq_compute` keys at a time
///   (unused with `use_fused_bwd_kernel`, where the dK/dV kernel also produces dQ). JAX's
///   dQ kernel has no compute block; [`default_dq_compute_block`] says why tessera's does;
/// - diagonal blocks: a kernel with square blocks cuts each block the mask leaves full below
///   the diagonal and empty above it (the causal diagonal) into `block_diagonal` x
///   `block_diagonal` sub-tiles and skips those above the diagonal (tokamax's
///   `qk_diag_skip`); a sub-tile the size of the block computes the whole block. Unset, each
///   kernel takes [`default_diagonal_block`] (forward), [`default_dkv_diagonal_block`]
///   (dK/dV, fused) or [`default_dq_diagonal_block`] (dQ) of its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockSizes {
    pub block_q: usize,
    pub block_kv: usize,
    pub block_kv_compute: usize,
    pub block_q_dkv: usize,
    pub block_kv_dkv: usize,
    pub block_kv_dkv_compute: usize,
    pub block_q_dq: usize,
    pub block_kv_dq: usize,
    /// `None`: [`default_dq_compute_block`] of `block_kv_dq` (see
    /// [`BlockSizes::dq_compute_block`]).
    pub block_kv_dq_compute: Option<usize>,
    /// The diagonal sub-tile of every kernel with square blocks; `None`: each kernel's
    /// default ([`BlockSizes::diagonal_block`], [`BlockSizes::diagonal_block_dkv`],
    /// [`BlockSizes::diagonal_block_dq`]).
    pub block_diagonal: Option<usize>,
    /// One backward kernel computing dQ, dK and dV together (dQ is reduced over key blocks
    /// afterwards) instead of separate dQ and dK/dV kernels.
    pub use_fused_bwd_kernel: bool,
}

/// The largest block [`default_block`] picks (MaxText's default splash block).
pub const MAX_DEFAULT_BLOCK: usize = 512;

/// The default block along `len` queries or keys (the same rule for both): `len` itself up to
/// [`MAX_DEFAULT_BLOCK`], else the largest divisor of `len` up to it that tiles on a TPU (a
/// multiple of [`NUM_LANES`] for either: keys are the lane dim of the scores, queries of
/// the residual rows `lse` and `di`), else `len`. The one rule the CLI, the trainer and
/// splash's own row blocks use.
pub fn default_block(len: usize) -> usize {
    if len <= MAX_DEFAULT_BLOCK {
        return len;
    }
    (1..=MAX_DEFAULT_BLOCK)
        .rev()
        .find(|b| len % b == 0 && b % NUM_LANES == 0)
        .unwrap_or(len)
}

/// The keys dQ computes at a time within a key block of `block_kv_dq` when
/// `block_kv_dq_compute` is `None`: 256 of a 512 block, 512 of a block of 2048 or more, else
/// the whole block.
///
/// Measured on v5p with libtpu's bundles and allocations (`tessera compile --target
/// tpu:v5p:2x2x1 attention`, bf16, causal, 8 heads, D 128, S 4096 and 8192, MHA and GQA
/// 8/2, forward + backward): at blocks 512, halves take 0.80x the scoped VMEM (1.20 MiB
/// against 1.52 MiB at S 4096; JAX's dQ takes 1.50 MiB) for 0.6-1.3% more cycles; at 2048,
/// quarters take 2.3-3.2% fewer cycles and 0.58-0.61x the VMEM; at 1024 halves and quarters
/// both cost cycles (+1.5% and +16%), so the block stays whole. Blocks over 2048 take 2048's
/// split unmeasured; the StableHLO lowering (CPU) computes the same sub-blocks. (The dQ
/// kernel's score tiles are `(compute, block_q)` values; libtpu's spills of them decide its
/// VMEM.)
pub fn default_dq_compute_block(block_kv_dq: usize) -> usize {
    match block_kv_dq {
        512 => 256,
        b if b >= 2048 && b % 512 == 0 => 512,
        b => b,
    }
}

/// The forward's diagonal sub-tile when `block_diagonal` is `None`: 256 for square blocks of
/// 1024 or more, else the whole block (no skip).
///
/// Measured on v5p with libtpu's bundles (`tessera compile --target tpu:v5p:2x2x1
/// attention --block-diagonal N`, bf16, causal MHA, 8 heads, D 128, S 8192, the forward's
/// grid compacted, cycles per core, whole block first): at blocks 2048 -> 654,564 at
/// sub-tiles of 256 (676,798 at 512, 789,166 at 128 before the compaction, whose unskipped
/// kernel took 832,816); at 1024 761,684 -> 703,270 (256) / 709,478 (512) / 719,238 (128); at
/// 512 825,204 -> 828,758 (128) / 830,132 (256).
pub fn default_diagonal_block(block_q: usize, block_kv: usize) -> usize {
    if block_q == block_kv && block_q >= 1024 && block_q % 256 == 0 {
        256
    } else {
        block_q
    }
}

/// The dK/dV (or fused) kernel's diagonal sub-tile when `block_diagonal` is `None`: 256 for
/// square blocks of 1024 or more, 128 for square blocks of 512, else the whole block.
///
/// Measured as [`default_diagonal_block`], whole block first: dK/dV at blocks 2048 1,211,076
/// -> 1,032,622 (256) / 1,034,480 (512); at 1024 1,141,287 -> 1,074,245 (256) / 1,084,133
/// (512); at 512 1,307,655 -> 1,271,811 (128) / 1,296,835 (256). The fused backward at 2048
/// 1,476,518 -> 1,273,178 (256); at 1024 1,413,477 -> 1,332,860 (256); at 512 1,533,907 ->
/// 1,532,629 (128).
pub fn default_dkv_diagonal_block(block_q: usize, block_kv: usize) -> usize {
    match block_q {
        b if b != block_kv => b,
        512 => 128,
        b => default_diagonal_block(b, block_kv),
    }
}

/// The dQ kernel's diagonal sub-tile when `block_diagonal` is `None`: 512 for square
/// blocks of 1024 or more, else the whole block. Measured as [`default_diagonal_block`]:
/// dQ at blocks 2048 872,101 -> 803,237 / 760,757 / 782,101 at sub-tiles 256 / 512 / 1024;
/// at 1024 832,027 -> 813,179 (256) / 797,627 (512); at 512 1,079,771 -> 1,079,387 (256) /
/// 1,083,991 (128), no gain.
pub fn default_dq_diagonal_block(block_q: usize, block_kv: usize) -> usize {
    if block_q == block_kv && block_q >= 1024 && block_q % 512 == 0 {
        512
    } else {
        block_q
    }
}

impl Default for BlockSizes {
    /// JAX's defaults: 128 everywhere, separate backward kernels.
    fn default() -> Self {
        BlockSizes::uniform(128, 128)
    }
}

impl BlockSizes {
    /// `block_q` for every query block and `block_kv` for every key block (the forward's and
    /// dK/dV's compute blocks equal to their blocks, dQ's its default), separate backward
    /// kernels.
    pub fn uniform(block_q: usize, block_kv: usize) -> Self {
        BlockSizes {
            block_q,
            block_kv,
            block_kv_compute: block_kv,
            block_q_dkv: block_q,
            block_kv_dkv: block_kv,
            block_kv_dkv_compute: block_kv,
            block_q_dq: block_q,
            block_kv_dq: block_kv,
            block_kv_dq_compute: None,
            block_diagonal: None,
            use_fused_bwd_kernel: false,
        }
    }

    /// [`default_block`] along `q_len` queries for every query block and along `kv_len` keys
    /// for every key block.
    pub fn default_for(q_len: usize, kv_len: usize) -> Self {
        BlockSizes::uniform(default_block(q_len), default_block(kv_len))
    }

    /// The keys dQ computes at a time: `block_kv_dq_compute`, or by default
    /// [`default_dq_compute_block`] of `block_kv_dq`.
    pub fn dq_compute_block(&self) -> usize {
        self.block_kv_dq_compute
            .unwrap_or_else(|| default_dq_compute_block(self.block_kv_dq))
    }

    /// The forward's diagonal sub-tile: `block_diagonal`, or by default
    /// [`default_diagonal_block`] of `block_q` and `block_kv` (`block_q`: no skip).
    pub fn diagonal_block(&self) -> usize {
        self.block_diagonal
            .unwrap_or_else(|| default_diagonal_block(self.block_q, self.block_kv))
    }

    /// The dK/dV (or fused) kernel's diagonal sub-tile: `block_diagonal`, or by default
    /// [`default_dkv_diagonal_block`] of `block_q_dkv` and `block_kv_dkv`.
    pub fn diagonal_block_dkv(&self) -> usize {
        self.block_diagonal
            .unwrap_or_else(|| default_dkv_diagonal_block(self.block_q_dkv, self.block_kv_dkv))
    }

    /// The dQ kernel's diagonal sub-tile: `block_diagonal`, or by default
    /// [`default_dq_diagonal_block`] of `block_q_dq` and `block_kv_dq`.
    pub fn diagonal_block_dq(&self) -> usize {
        self.block_diagonal
            .unwrap_or_else(|| default_dq_diagonal_block(self.block_q_dq, self.block_kv_dq))
    }

    /// The same sizes with the fused backward kernel on or off.
    pub fn with_fused_bwd(mut self, fused: bool) -> Self {
        self.use_fused_bwd_kernel = fused;
        self
    }

    /// Checks every block against the sequence lengths, its compute block and (under TPU
    /// rules) the TPU tiling of the operands it shapes.
    pub fn validate(
        &self,
        q_len: usize,
        kv_len: usize,
        rules: &KernelRules,
    ) -> Result<(), SplashError> {
        let mut q_blocks = vec![("block_q", self.block_q), ("block_q_dkv", self.block_q_dkv)];
        let mut kv_blocks = vec![
            (
                "block_kv",
                self.block_kv,
                ("block_kv_compute", self.block_kv_compute),
            ),
            (
                "block_kv_dkv",
                self.block_kv_dkv,
                ("block_kv_dkv_compute", self.block_kv_dkv_compute),
            ),
        ];
        if !self.use_fused_bwd_kernel {
            q_blocks.push(("block_q_dq", self.block_q_dq));
            kv_blocks.push((
                "block_kv_dq",
                self.block_kv_dq,
                ("block_kv_dq_compute", self.dq_compute_block()),
            ));
        }
        // (block names, problem): blocks of equal size with the same problem share a message.
        let mut problems: Vec<BlockProblem> = Vec::new();
        let mut add = |name: &'static str, problem: Option<BlockSizeReason>| {
            if let Some(reason) = problem {
                match problems.iter_mut().find(|p| p.reason == reason) {
                    Some(p) if p.blocks.contains(&name) => {}
                    Some(p) => p.blocks.push(name),
                    None => problems.push(BlockProblem {
                        blocks: vec![name],
                        reason,
                    }),
                }
            }
        };
        // A block that does not divide its extent gets that message alone.
        let tpu = rules.tpu_tiling;
        for (name, b) in q_blocks {
            let d = divides(b, "the query sequence length", q_len);
            let t = d.is_none() && tpu;
            add(name, d);
            if t {
                add(name, tiled(b, q_len, QUERY_LANES));
            }
        }
        for (name, b, (cname, c)) in kv_blocks {
            let d = divides(b, "the key sequence length", kv_len);
            let t = d.is_none() && tpu;
            add(name, d);
            if t {
                add(name, tiled(b, kv_len, KEY_LANES));
            }
            if cname != name {
                let d = divides(c, name, b);
                let t = d.is_none() && tpu && c != b;
                add(cname, d);
                if t {
                    add(cname, tiled(c, b, KEY_LANES));
                }
            }
        }
        if let Some(d) = self.block_diagonal {
            // The forward's blocks must be square; the backward kernels' are cut where they
            // are square.
            let mut square = vec![("block_q", self.block_q, self.block_kv)];
            square.push(("block_q_dkv", self.block_q_dkv, self.block_kv_dkv));
            if !self.use_fused_bwd_kernel {
                square.push(("block_q_dq", self.block_q_dq, self.block_kv_dq));
            }
            let mut checked = Vec::new();
            for (i, (name, bq, bkv)) in square.into_iter().enumerate() {
                // One message per block size, under the first kernel that has it.
                if checked.contains(&(bq, bkv)) {
                    continue;
                }
                checked.push((bq, bkv));
                let problem = if bq != bkv {
                    (i == 0).then_some(BlockSizeReason::NotSquare {
                        block: d,
                        block_q: bq,
                        block_kv: bkv,
                    })
                } else {
                    divides(d, name, bq)
                };
                let t = problem.is_none() && tpu && bq == bkv;
                add("block_diagonal", problem);
                if t {
                    add("block_diagonal", tiled(d, bq, KEY_LANES));
                }
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(SplashError::BlockSizes(BlockSizeError::Blocks { problems }))
    }
}

/// Why `b` does not divide `n` (`b` is the size of the named blocks, shown before).
fn divides(b: usize, what: &'static str, n: usize) -> Option<BlockSizeReason> {
    if b == 0 {
        Some(BlockSizeReason::Zero)
    } else if n % b != 0 {
        Some(BlockSizeReason::NotADivisor {
            block: b,
            extent: what,
            len: n,
            suggestion: nearest_divisor(n, b),
        })
    } else {
        None
    }
}

/// What lays a query block along lanes: the residual rows `lse` and `di` (`[.., 1, Sq]`)
/// and the query segment ids; the dK/dV kernels' transposed scores.
const QUERY_LANES: &str = "query residual rows (lse, di), query segment ids and the dK/dV \
                           scores, whose query axis is the lane axis";
/// What lays a key block along lanes.
const KEY_LANES: &str = "scores and key segment ids, whose key axis is the lane axis";

/// Why `b` does not tile on TPU: it must be a multiple of [`NUM_LANES`] (the lane tiling of
/// `why`) or the whole extent `full`. (Both block axes are lane axes of some operand, which
/// covers every sublane tiling too: int8 mask blocks need 32 rows, f32 and bf16 tiles 16.)
fn tiled(b: usize, full: usize, why: &'static str) -> Option<BlockSizeReason> {
    if b == 0 || b == full || b % NUM_LANES == 0 {
        return None;
    }
    Some(BlockSizeReason::NotTiled {
        block: b,
        lanes: why,
        len: full,
        suggestion: (b.div_ceil(NUM_LANES) * NUM_LANES).min(full),
    })
}

/// The divisor of `n` closest to `b` (ties to the smaller).
fn nearest_divisor(n: usize, b: usize) -> usize {
    (1..=n)
        .filter(|d| n % d == 0)
        .min_by_key(|&d| (d.abs_diff(b), d))
        .unwrap_or(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_for_typical_sequences() {
        for s in [128, 256, 4096] {
            BlockSizes::default()
                .validate(s, s, &KernelRules::tpu())
                .unwrap();
        }
    }

    /// dQ's default compute block follows `block_kv_dq`, also when it is set after
    /// [`BlockSizes::uniform`].
    #[test]
    fn dq_compute_block_defaults_from_the_dq_key_block() {
        assert_eq!(BlockSizes::uniform(128, 512).dq_compute_block(), 256);
        assert_eq!(BlockSizes::uniform(128, 1024).dq_compute_block(), 1024);
        assert_eq!(BlockSizes::uniform(128, 4096).dq_compute_block(), 512);
        let b = BlockSizes {
            block_kv_dq: 128,
            ..BlockSizes::uniform(128, 512)
        };
        assert_eq!(b.dq_compute_block(), 128);
        b.validate(512, 512, &KernelRules::tpu()).unwrap();
        let b = BlockSizes {
            block_kv_dq_compute: Some(128),
            ..BlockSizes::uniform(128, 2048)
        };
        assert_eq!(b.dq_compute_block(), 128);
    }

    #[test]
    fn diagonal_sub_tiles_default_by_block_and_are_checked_when_set() {
        let b = BlockSizes::uniform(2048, 2048);
        assert_eq!(
            (
                b.diagonal_block(),
                b.diagonal_block_dkv(),
                b.diagonal_block_dq()
            ),
            (256, 256, 512)
        );
        assert_eq!(BlockSizes::uniform(512, 512).diagonal_block(), 512);
        assert_eq!(BlockSizes::uniform(512, 512).diagonal_block_dkv(), 128);
        assert_eq!(BlockSizes::uniform(512, 512).diagonal_block_dq(), 512);
        assert_eq!(BlockSizes::uniform(256, 512).diagonal_block(), 256);
        let set = |d, bq, bkv| {
            BlockSizes {
                block_diagonal: Some(d),
                ..BlockSizes::uniform(bq, bkv)
            }
            .validate(1024, 1024, &KernelRules::tpu())
        };
        set(128, 512, 512).unwrap();
        let e = set(128, 256, 512).unwrap_err().to_string();
        assert!(
            e.contains(
                "block_diagonal = 128, but diagonal sub-tiles need square blocks \
                 (block_q = 256, block_kv = 512)"
            ),
            "{e}"
        );
        let e = set(96, 512, 512).unwrap_err().to_string();
        assert!(
            e.contains("block_diagonal = 96, which does not divide block_q (512)"),
            "{e}"
        );
        let e = set(64, 512, 512).unwrap_err().to_string();
        assert!(
            e.contains("block_diagonal = 64, which is neither a multiple of 128"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_block_and_the_fix() {
        let mut b = BlockSizes::uniform(96, 128);
        let e = b
            .validate(256, 256, &KernelRules::tpu())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("block_q, block_q_dkv, block_q_dq = 96, which does not divide the query sequence length (256)"),
            "{e}"
        );
        b = BlockSizes::uniform(64, 256);
        b.block_kv_compute = 96;
        let e = b
            .validate(256, 256, &KernelRules::tpu())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("block_kv_compute = 96, which does not divide block_kv (256)"),
            "{e}"
        );
        b = BlockSizes::uniform(128, 256);
        b.block_kv_dq_compute = Some(100);
        let e = b
            .validate(256, 256, &KernelRules::tpu())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("block_kv_dq_compute = 100, which does not divide block_kv_dq (256)"),
            "{e}"
        );
        // dQ's compute block does not count with the fused backward, which has no dQ kernel.
        b.use_fused_bwd_kernel = true;
        b.validate(256, 256, &KernelRules::tpu()).unwrap();
        let e = BlockSizes::uniform(64, 64)
            .validate(256, 256, &KernelRules::tpu())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "block_kv, block_kv_dkv, block_kv_dq = 64, which is neither a multiple of 128"
            ),
            "{e}"
        );
        // Portable rules only need divisibility.
        BlockSizes::uniform(64, 64)
            .validate(256, 256, &KernelRules::portable())
            .unwrap();
        // Query blocks lie along lanes too (lse rows, the dK/dV scores).
        let e = BlockSizes::uniform(16, 128)
            .validate(256, 256, &KernelRules::tpu())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("block_q, block_q_dkv, block_q_dq = 16, which is neither a multiple of 128 (lane tiling of query residual rows"),
            "{e}"
        );
        // With the fused kernel the dq blocks are unused.
        let mut fused = BlockSizes::uniform(128, 128).with_fused_bwd(true);
        fused.block_q_dq = 7;
        fused.validate(256, 256, &KernelRules::tpu()).unwrap();
    }
}
