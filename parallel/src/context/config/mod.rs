//! A context-parallel configuration ([`ContextParallel`]), the strategy contract it holds
//! (`contract`), its validation, and the rules every strategy shares, each computed from the strategy's own facts: KV head replication
//! (from its Ulysses degree), each device's kernel dims (from its local lengths), load
//! balancing's chunk order ([`chunk_of`]), and block sizes that must divide the local
//! lengths.

use tessera_collectives::Mesh;
use tessera_dsl::{DType, Lowering};
use tessera_splash::{BlockSizes, Dims, Mask, SeqOffsets, ShardedSplash, SplashOptions};

pub(crate) mod contract;

use super::error::{Block, ConfigError, CpError, Quantity};
use super::layout::ModelMesh;
use contract::{KernelCalls, Shards, Strategy};

/// A context-parallel attention: the global problem, its mask, the strategy and the devices.
#[derive(Debug, Clone)]
pub struct ContextParallel {
    /// The global dims (`heads`, `kv_heads`, `q_len = kv_len = S`).
    pub dims: Dims,
    pub dtype: DType,
    /// One mask shared by every head (positions are global).
    pub mask: Mask,
    pub block_sizes: BlockSizes,
    /// Scale, soft cap and mask value (the offsets are set per device).
    pub options: SplashOptions,
    pub strategy: Strategy,
    /// The context-parallel degree: devices on the context axis (for USP, `U x R`).
    pub devices: usize,
    /// Causal load balancing (MaxText's `context_parallel_load_balance`) for the strategies
    /// that balance (all-gather, ring): the sequence is cut into `2U` chunks and device `r`
    /// holds chunks `r` and `2U - 1 - r` (zigzag, [`chunk_of`]), so under a causal mask every
    /// device has the same work. The arrays stay in natural order for the caller; the
    /// programs take them in zigzag order.
    pub load_balance: bool,
    /// What the kernels are lowered for: [`Lowering::portable`] (inline StableHLO, runs on the
    /// CPU plugin) or [`Lowering::tpu`] (Mosaic custom calls inside the manual-sharded program,
    /// compile-only for a TPU topology).
    pub lowering: Lowering,
}

/// The natural chunk that part `part` of shard `shard` holds, of `ring` shards: with one
/// part per shard the shard itself; with two (load balancing) chunks `shard` and
/// `2 ring - 1 - shard` of `2 ring` (zigzag).
pub fn chunk_of(shard: usize, part: usize, ring: usize) -> usize {
    if part == 0 {
        shard
    } else {
        2 * ring - 1 - shard
    }
}

/// The inverse of a permutation: `inverse(order)[order[i]] = i`.
pub(crate) fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inverse = vec![0; order.len()];
    for (slot, &chunk) in order.iter().enumerate() {
        inverse[chunk] = slot;
    }
    inverse
}

impl ContextParallel {
    /// Checks the configuration before anything is built (MaxText's rules, with KV head
    /// replication for Ulysses when `KVH < U`); the error names the quantities at fault.
    pub fn validate(&self) -> Result<(), CpError> {
        Ok(self.check()?)
    }

    /// [`ContextParallel::validate`] with the structured error alone.
    pub fn check(&self) -> Result<(), ConfigError> {
        let (d, n) = (self.dims, self.devices);
        let strategy = || self.strategy.label();
        if n == 0 {
            return Err(ConfigError::Zero {
                quantity: Quantity::ContextDegree,
            });
        }
        let sizes = [
            (Quantity::Batch, d.batch),
            (Quantity::Heads, d.heads),
            (Quantity::KvHeads, d.kv_heads),
            (Quantity::SeqLen, d.q_len),
            (Quantity::KvLen, d.kv_len),
            (Quantity::HeadDim, d.head_dim),
            (Quantity::HeadDimV, d.head_dim_v),
        ];
        if let Some(&(quantity, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return Err(ConfigError::Zero { quantity });
        }
        if let Some(fixed) = self.strategy.fixed_devices().filter(|&f| f != n) {
            return Err(ConfigError::DevicesFixed {
                strategy: strategy(),
                fixed,
                devices: n,
            });
        }
        if d.q_len != d.kv_len {
            return Err(ConfigError::NotSelfAttention {
                strategy: strategy(),
                q_len: d.q_len,
                kv_len: d.kv_len,
            });
        }
        if self.load_balance && !self.strategy.load_balances() {
            return Err(ConfigError::LoadBalanceUnsupported {
                strategy: strategy(),
                balanced: self
                    .strategy
                    .balancing_peers(n)
                    .iter()
                    .map(Strategy::label)
                    .collect(),
            });
        }
        if d.q_len % (n * self.parts()) != 0 {
            return Err(ConfigError::SequenceNotDivisible {
                strategy: strategy(),
                seq: d.q_len,
                devices: n,
                parts: self.parts(),
            });
        }
        let u = self.ulysses_degree();
        if u > 1 && d.heads % u != 0 {
            return Err(ConfigError::HeadsNotDivisible {
                strategy: strategy(),
                heads: d.heads,
                ulysses: u,
                context_degree: u == n,
            });
        }
        let kv = d.kv_heads;
        if u > 1 && ((kv < u && u % kv != 0) || (kv >= u && kv % u != 0)) {
            return Err(ConfigError::KvHeadsNotDivisible {
                strategy: strategy(),
                kv_heads: kv,
                ulysses: u,
            });
        }
        let (q_local, kv_local) = self.block_lengths();
        let b = self.block_sizes;
        let mut blocks = vec![
            (Block::Q, b.block_q, q_local),
            (Block::Kv, b.block_kv, kv_local),
            (Block::QDkv, b.block_q_dkv, q_local),
            (Block::KvDkv, b.block_kv_dkv, kv_local),
        ];
        if !b.use_fused_bwd_kernel {
            blocks.extend([
                (Block::QDq, b.block_q_dq, q_local),
                (Block::KvDq, b.block_kv_dq, kv_local),
            ]);
        }
        for (block, size, local) in blocks {
            if size == 0 {
                return Err(ConfigError::Zero {
                    quantity: Quantity::Block(block),
                });
            }
            if local % size != 0 {
                return Err(ConfigError::BlockNotDividing {
                    strategy: strategy(),
                    block,
                    size,
                    local,
                    seq: d.q_len,
                });
            }
        }
        self.strategy.check(self)
    }

    /// Chunks of each device's shard attended separately: 2 with load balancing, else 1.
    pub fn parts(&self) -> usize {
        self.shards().parts
    }

    /// How the sequence is cut over the context devices.
    pub fn shards(&self) -> Shards {
        Shards::of(self.dims.q_len, self.devices, self.load_balance)
    }

    /// The queries and keys (per head) each kernel call of a device holds.
    pub fn local_lengths(&self) -> (usize, usize) {
        self.strategy.local_lengths(self.shards())
    }

    /// The queries and keys (per head) the splash blocks must divide.
    pub fn block_lengths(&self) -> (usize, usize) {
        self.strategy.block_lengths(self.shards())
    }

    /// Every forward kernel call and where its queries and keys start on every shard.
    pub fn kernel_calls(&self) -> KernelCalls {
        self.strategy.kernel_calls(self.shards())
    }

    /// The Ulysses degree (1 for a strategy whose devices keep every head).
    pub fn ulysses_degree(&self) -> usize {
        self.strategy.ulysses_degree(self.devices)
    }

    /// How often each KV head is replicated so the Ulysses all-to-all can split them (1:
    /// none): the Ulysses degree over the KV heads when there are fewer; the query heads
    /// over the KV heads for a strategy whose kernels take one KV head per query head.
    pub fn kv_replication(&self) -> usize {
        let u = self.ulysses_degree();
        if self.strategy.repeats_kv_heads() {
            self.dims.heads / self.dims.kv_heads.max(1)
        } else if self.dims.kv_heads < u {
            u / self.dims.kv_heads
        } else {
            1
        }
    }

    /// The dims each device's attention kernel sees.
    pub fn local_dims(&self) -> Dims {
        let d = self.dims;
        let u = self.ulysses_degree();
        let (q_len, kv_len) = self.local_lengths();
        Dims {
            heads: d.heads / u,
            kv_heads: d.kv_heads * self.kv_replication() / u,
            q_len,
            kv_len,
            ..d
        }
    }

    /// The `[data, context, ring]` sizes of the [`ModelMesh`] of `data` data shards.
    pub fn mesh_sizes(&self, data: usize) -> [usize; 3] {
        let [context, ring] = self.strategy.mesh_axes(self.devices);
        [data, context, ring]
    }

    /// The [`ModelMesh`] of `data` data shards.
    pub fn mesh(&self, data: usize) -> Result<Mesh<ModelMesh>, CpError> {
        Ok(Mesh::new(self.mesh_sizes(data))?)
    }

    /// The order of the sequence's chunks as the programs take it: slot `i` of
    /// `devices x parts` equal chunks holds natural chunk `order[i]` (device `r`'s parts
    /// in turn, [`chunk_of`]; the identity without load balancing).
    pub fn chunk_order(&self) -> Vec<usize> {
        let n = self.devices;
        (0..n)
            .flat_map(|r| (0..self.parts()).map(move |part| (r, part)))
            .map(|(r, part)| chunk_of(r, part, n))
            .collect()
    }

    /// The order of the sequence the programs take: position `j` as laid out for a program
    /// holds natural position `order[j]`.
    pub fn sequence_order(&self) -> Vec<usize> {
        let chunks = self.chunk_order();
        let len = self.dims.q_len / chunks.len().max(1);
        chunks
            .iter()
            .flat_map(|&c| c * len..(c + 1) * len)
            .collect()
    }

    /// One splash attention per shard at `offsets[shard]` (local dims), for the lowering.
    pub(crate) fn sharded_splash(&self, offsets: &[SeqOffsets]) -> Result<ShardedSplash, CpError> {
        Ok(ShardedSplash::new(
            self.mask.clone(),
            self.local_dims(),
            self.dtype,
            self.block_sizes,
            self.options,
            self.lowering.clone(),
            offsets,
        )?)
    }
}
