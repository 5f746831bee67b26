//! What each device holds and moves ([`CpStats`], `tessera attention --stats`).

use std::fmt;

use super::error::CpError;
use super::strategy::{Exchange, Strategy};
use super::ContextParallel;

/// One collective of a program and what it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveStat {
    /// `all_to_all`, `all_gather`, `reduce_scatter`, `ppermute`, ...
    pub name: &'static str,
    /// The mesh axis it runs over.
    pub axis: String,
    /// The per-device operand shape and dtype.
    pub operand: String,
    /// Bytes each device sends (see `CollectiveCall::bytes_sent_per_device`).
    pub bytes_per_device: usize,
}

/// What each device holds and moves, for `--stats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpStats {
    pub strategy: Strategy,
    pub devices: usize,
    /// KV heads each device's attention holds.
    pub kv_heads_per_device: usize,
    /// Keys per KV head each device's attention holds at once.
    pub kv_len_per_device: usize,
    /// Bytes of K and V each device's attention holds at once.
    pub kv_bytes_per_device: usize,
    /// How many times each KV head was replicated for Ulysses (1: none).
    pub kv_replication: usize,
    /// Forward key blocks each device computes (every head and batch element, skipped
    /// blocks not counted): the work balance across devices.
    pub blocks_per_device: Vec<usize>,
    /// The collectives of the forward program.
    pub forward: Vec<CollectiveStat>,
    /// The collectives of the forward + backward program.
    pub forward_backward: Vec<CollectiveStat>,
}

impl fmt::Display for CpStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "strategy {} on {} devices", self.strategy, self.devices)?;
        write!(
            f,
            "per device K/V held by the attention: {} KV heads x {} keys = {} bytes",
            self.kv_heads_per_device, self.kv_len_per_device, self.kv_bytes_per_device
        )?;
        if self.kv_replication > 1 {
            write!(
                f,
                " (each KV head replicated {}x to reach the degree)",
                self.kv_replication
            )?;
        }
        writeln!(f)?;
        let most = self.blocks_per_device.iter().copied().max().unwrap_or(0);
        let total: usize = self.blocks_per_device.iter().sum();
        writeln!(
            f,
            "forward key blocks computed per device: {:?} (busiest {:.2}x the mean)",
            self.blocks_per_device,
            most as f64 * self.blocks_per_device.len() as f64 / total.max(1) as f64
        )?;
        for (pass, list) in [
            ("forward", &self.forward),
            ("forward + backward", &self.forward_backward),
        ] {
            let total: usize = list.iter().map(|c| c.bytes_per_device).sum();
            writeln!(
                f,
                "{pass}: {} collectives, {total} bytes sent per device",
                list.len()
            )?;
            for c in list {
                writeln!(
                    f,
                    "  {:<15} over {:<8} {:<28} {:>12} bytes per device",
                    c.name, c.axis, c.operand, c.bytes_per_device
                )?;
            }
        }
        if self.strategy.exchange(self.devices) == Exchange::HeadsInKernel {
            writeln!(
                f,
                "q, k, v and the output (and the backward's arrays) move by remote copies \
                 inside the attention kernels, not as collectives"
            )?;
        }
        Ok(())
    }
}

impl ContextParallel {
    /// Per-device K/V, replication and the bytes every collective of both programs moves.
    pub fn stats(&self) -> Result<CpStats, CpError> {
        self.validate()?;
        let ld = self.local_dims();
        let d = self.dims;
        let kv_bytes = d.batch * ld.kv_heads * ld.kv_len * (d.head_dim + d.head_dim_v);
        Ok(CpStats {
            strategy: self.strategy.clone(),
            devices: self.devices,
            kv_heads_per_device: ld.kv_heads,
            kv_len_per_device: ld.kv_len,
            kv_bytes_per_device: kv_bytes * self.dtype.size_bytes(),
            kv_replication: self.kv_replication(),
            blocks_per_device: self.blocks_per_device()?,
            forward: self.forward_program(false)?.collective_stats(),
            forward_backward: self.forward_backward_program(false)?.collective_stats(),
        })
    }

    /// Forward key blocks each device computes over all its kernel calls.
    fn blocks_per_device(&self) -> Result<Vec<usize>, CpError> {
        let calls = self.kernel_calls();
        let shards = calls[0][0].len();
        let mut per_shard = vec![0; shards];
        for offsets in calls.iter().flatten() {
            for (i, shard) in self.sharded_splash(offsets)?.shards().iter().enumerate() {
                per_shard[i] += shard.stats().computed();
            }
        }
        // Shards are positions on the innermost axis whose devices hold different blocks
        // (`context`, or USP's `ring`); the devices of the other axes run the same calls.
        Ok((0..self.devices)
            .map(|d| per_shard[d % per_shard.len()])
            .collect())
    }
}
