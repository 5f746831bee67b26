//! What the TPU rules ([`rules`](crate::rules)) and the Mosaic emitter
//! ([`mosaic`](crate::mosaic)) both know of how Mosaic lays a kernel out on a TPU: the
//! (sublane, lane) tile of a dtype, the VMEM a kernel's blocks and scratch take, the
//! semaphore memory its semaphores take, and which DMA semaphores remote copies count their
//! sends on (Mosaic waits those differently). Below both,
//! so that neither imports the other; `tpu_tile` and `vmem_bytes` are re-exported from
//! `rules`, where the public API names them.

use std::collections::HashMap;

use crate::ir::{
    eval_scalar, DType, Kernel, MemorySpace, Op, OperandRole, RefId, Region, RemoteDma, SemRef,
    ValueId,
};

/// How many grid steps after an output last held a block an input aliasing that output may
/// read the block: Mosaic's pipeline keeps two buffers per operand, fetching a step's input
/// blocks while earlier steps' output blocks are still being written back (tokamax's splash
/// cycles its dQ partials through 3 blocks for this reason). The interpreter refuses a
/// closer read.
pub const ALIASED_READ_DISTANCE: usize = 3;

/// The (sublane, lane) tile of a dtype on TPU: 32-bit types pack 8 rows, bf16 16, 8-bit 32.
pub fn tpu_tile(dtype: DType) -> (usize, usize) {
    match dtype.size_bytes() {
        4 => (8, 128),
        2 => (16, 128),
        _ => (32, 128),
    }
}

/// The VMEM buffers of a kernel with their bytes: pipelined blocks are double-buffered
/// unless they ask for one buffer ([`crate::Buffering`]), scratch is allocated once.
pub(crate) fn vmem_items(k: &Kernel) -> Vec<(String, usize)> {
    let mut items = Vec::new();
    for (i, o) in k.operands.iter().enumerate() {
        if o.memory != MemorySpace::Vmem {
            continue;
        }
        let elems: usize = o.block_sizes().iter().product();
        let bytes = elems * o.dtype.size_bytes();
        let buffers = o.block.as_ref().map_or(
            // Scratch is allocated once; a VMEM operand without a block, pipelined as one.
            if o.role == OperandRole::Scratch { 1 } else { 2 },
            |b| b.buffering.count(),
        );
        let bytes = buffers * bytes;
        items.push((k.describe(RefId(i as u32)), bytes));
    }
    items
}

/// The VMEM a kernel needs: its pipelined blocks' buffers plus its scratch.
pub fn vmem_bytes(k: &Kernel) -> usize {
    vmem_items(k).iter().map(|(_, b)| b).sum()
}

/// The semaphore memory (libtpu's memory space `sflag`) one kernel has on every TPU
/// generation tessera compiles for (v4, v5p, v5e, v6e; libtpu 0.0.50.1): 2 KiB, 4 bytes a
/// semaphore, DMA or regular. libtpu uses some of it itself, more for larger kernels (64 to
/// 112 bytes beside 508 semaphores of scratch; about 300 beside 480 semaphores counting 480
/// copies), so the TPU rules refuse what libtpu surely refuses and leave the last few
/// hundred bytes to libtpu's own message.
pub const SEMAPHORE_MEMORY_BYTES: usize = 2048;

/// The bytes of semaphore memory of each semaphore scratch operand of `k`.
pub(crate) fn semaphore_items(k: &Kernel) -> Vec<(String, usize)> {
    k.operands
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.role == OperandRole::Scratch && matches!(o.memory, MemorySpace::Semaphore(_))
        })
        .map(|(i, o)| {
            let count: usize = o.array_shape.iter().product();
            (k.describe(RefId(i as u32)), 4 * count)
        })
        .collect()
}

/// One semaphore of an array: the operand and its index, each entry `None` where it is
/// computed at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SemKey {
    r: RefId,
    index: Vec<Option<i64>>,
}

impl SemKey {
    /// Whether the two may name the same semaphore.
    fn overlaps(&self, other: &SemKey) -> bool {
        self.r == other.r
            && self
                .index
                .iter()
                .zip(&other.index)
                .all(|(a, b)| a.is_none() || b.is_none() || a == b)
    }
}

/// The DMA semaphores on which remote copies count their sends (on the sending device):
/// Mosaic waits those differently from the arrival of a copy, so each wait is classified.
#[derive(Debug, Default)]
pub(crate) struct SendSems {
    keys: Vec<SemKey>,
    consts: HashMap<ValueId, i64>,
}

impl SendSems {
    pub(crate) fn of(k: &Kernel) -> SendSems {
        fn walk(k: &Kernel, r: &Region, s: &mut SendSems) {
            for inst in &r.insts {
                let get = |v: ValueId| s.consts.get(&v).copied();
                if let (Some(x), [v]) = (eval_scalar(k, &inst.op, &get), inst.results.as_slice()) {
                    s.consts.insert(*v, x);
                }
                if let Op::DmaStart {
                    remote: Some(RemoteDma { send_sem, .. }),
                    ..
                } = &inst.op
                {
                    let key = s.key(send_sem);
                    s.keys.push(key);
                }
                for nested in inst.op.regions() {
                    walk(k, nested, s);
                }
            }
        }
        let mut s = SendSems::default();
        walk(k, &k.body, &mut s);
        s
    }

    fn key(&self, sem: &SemRef) -> SemKey {
        SemKey {
            r: sem.sem,
            index: sem
                .index
                .iter()
                .map(|v| self.consts.get(v).copied())
                .collect(),
        }
    }

    /// Whether `sem` may be a semaphore remote copies count their sends on.
    pub(crate) fn may_be_send(&self, sem: &SemRef) -> bool {
        let key = self.key(sem);
        self.keys.iter().any(|k| k.overlaps(&key))
    }
}
