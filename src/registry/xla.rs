//! XLA's own programs for what some registered kernels compute, written with the ordinary
//! StableHLO ops an XLA user writes (no kernel): `tessera bench kernels` times each beside
//! its kernel, on the same arguments ([`super::Instance::xla_program`]).

use tessera_dsl::{ArgSpec, DType};
use tessera_hlo::{
    DotDims, FuncBuilder, Grouping, HloError, Module, Reducer, Sharding, TensorType, Value,
};

use crate::kernels::paged_attention::MASK_VALUE;

fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

fn ty(spec: &ArgSpec) -> TensorType {
    TensorType::new(dims(&spec.shape), spec.dtype)
}

/// Paged attention as XLA computes it densely: every sequence's pages gathered out of the
/// pools into `[B, KVH, pages_per_seq * page_size, D]` (a loop over the page table's columns,
/// one dynamic slice per entry), then attention of each query head group over them with the positions past the
/// sequence's length masked; f32 arithmetic, output in the input dtype. Arguments as the
/// kernel's: `q, k_pages, v_pages, lengths, page_indices`.
pub fn paged_attention(args: &[ArgSpec]) -> Result<Module, HloError> {
    let [q, k, _, _, table] = args else {
        unreachable!("paged attention takes five arguments")
    };
    let (b, h, d) = (q.shape[0] as i64, q.shape[1] as i64, q.shape[2] as i64);
    let (kvh, page) = (k.shape[0] as i64, k.shape[2] as i64);
    let per_seq = table.shape[1] as i64;
    let (group, t) = (h / kvh, per_seq * page);
    let dtype = q.dtype;
    let mut module = Module::new("xla_paged_attention");
    let mut f = module.func("main");
    let values: Vec<Value> = args
        .iter()
        .map(|a| f.arg(ty(a)))
        .collect::<Result<_, _>>()?;
    let [q, k_pages, v_pages, lengths, table] = values[..] else {
        unreachable!("five arguments")
    };
    // A loop over the page table's columns: at column `j`, every sequence's page `j` sliced
    // out of each pool (a dynamic slice per sequence) and stored at its place.
    let gathered = TensorType::new(vec![b, kvh, per_seq, page, d], dtype);
    let init = [
        f.splat(0.0, gathered.clone())?,
        f.splat(0.0, gathered)?,
        k_pages,
        v_pages,
        table,
    ];
    let lower = f.scalar(0.0, DType::I32)?;
    let upper = f.scalar(per_seq as f64, DType::I32)?;
    let out = f.fori_loop::<HloError, _>(lower, upper, &init, |f, j, c| {
        let zero = f.scalar(0.0, DType::I32)?;
        let mut next = Vec::new();
        for (buf, pool) in [(c[0], c[2]), (c[1], c[3])] {
            let mut pages = Vec::new();
            for s in 0..b {
                let row = f.scalar(s as f64, DType::I32)?;
                let entry = f.dynamic_slice(c[4], &[row, j], &[1, 1])?;
                let entry = f.reshape(entry, &[])?;
                let p = f.dynamic_slice(pool, &[zero, entry, zero, zero], &[kvh, 1, page, d])?;
                pages.push(f.reshape(p, &[1, kvh, 1, page, d])?);
            }
            let column = f.concatenate(&pages, 0)?;
            next.push(f.dynamic_update_slice(buf, column, &[zero, zero, j, zero, zero])?);
        }
        next.extend_from_slice(&c[2..]);
        Ok(next)
    })?;
    let kv = |f: &mut FuncBuilder<'_>, x: Value| -> Result<Value, HloError> {
        let x = f.reshape(x, &[b, kvh, t, d])?;
        f.convert(x, DType::F32)
    };
    let (keys, vals) = (kv(&mut f, out[0])?, kv(&mut f, out[1])?);
    let q = f.reshape(q, &[b, kvh, group, d])?;
    let q = f.convert(q, DType::F32)?;
    // [B, KVH, G, T]
    let batch = DotDims::new([0, 1], [0, 1], [3], [3]);
    let s = f.dot_general(q, keys, &batch, DType::F32, None)?;
    let scores = [b, kvh, group, t];
    let pos = f.iota(TensorType::new(scores.to_vec(), DType::I32), 3)?;
    let len = f.broadcast_in_dim(lengths, &scores, &[0])?;
    let visible = f.lt(pos, len)?;
    let masked = f.splat(
        f64::from(MASK_VALUE),
        TensorType::new(scores.to_vec(), DType::F32),
    )?;
    let s = f.select(visible, s, masked)?;
    let max = f.reduce(s, &[3], Reducer::Max)?;
    let max = f.broadcast_in_dim(max, &scores, &[0, 1, 2])?;
    let s = f.sub(s, max)?;
    let p = f.exp(s)?;
    // A sequence of length 0 gets zeros, as the kernel's: its weights are masked out.
    let zeros = f.splat(0.0, TensorType::new(scores.to_vec(), DType::F32))?;
    let p = f.select(visible, p, zeros)?;
    let sum = f.reduce(p, &[3], Reducer::Sum)?;
    let tiny = f.splat(
        f64::from(f32::MIN_POSITIVE),
        TensorType::new(vec![b, kvh, group], DType::F32),
    )?;
    let sum = f.max(sum, tiny)?;
    let sum = f.broadcast_in_dim(sum, &scores, &[0, 1, 2])?;
    let p = f.div(p, sum)?;
    let o = f.dot_general(
        p,
        vals,
        &DotDims::new([0, 1], [0, 1], [3], [2]),
        DType::F32,
        None,
    )?;
    let o = f.reshape(o, &[b, h, d])?;
    let o = f.convert(o, dtype)?;
    f.finish(&[o])?;
    Ok(module)
}

/// XLA's `all_gather` over every device: one partition per device (`devices`), each with
/// its own `x`, every one getting the concatenation in device order.
pub fn all_gather(args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    spmd(args, devices, "xla_all_gather", |f, x| {
        f.all_gather(x[0], 0, &[group(devices)], Grouping::FlattenedIds)
    })
}

/// XLA's `all_gather` of the weight's row shards, then its dot: `x @ all_gather(w)` on every
/// device (`devices` partitions), f32 accumulation, output in the input dtype.
pub fn all_gather_matmul(args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    let dtype = args[0].dtype;
    spmd(args, devices, "xla_all_gather_matmul", |f, x| {
        let w = f.all_gather(x[1], 0, &[group(devices)], Grouping::FlattenedIds)?;
        let out = f.dot_general(x[0], w, &DotDims::contracting([1], [0]), DType::F32, None)?;
        f.convert(out, dtype)
    })
}

/// XLA's `collective_permute` around the ring: device `d` gets device `d - 1`'s `x`.
pub fn ring_shift(args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    let n = devices as i64;
    let pairs: Vec<(i64, i64)> = (0..n).map(|d| (d, (d + 1) % n)).collect();
    spmd(args, devices, "xla_ring_shift", |f, x| {
        f.collective_permute(x[0], &pairs, Grouping::FlattenedIds)
    })
}

fn group(devices: usize) -> Vec<i64> {
    (0..devices as i64).collect()
}

/// A manually partitioned module of `devices` partitions whose `main` takes each device's
/// `args` and returns `body`'s one result.
fn spmd(
    args: &[ArgSpec],
    devices: usize,
    name: &str,
    body: impl FnOnce(&mut FuncBuilder<'_>, &[Value]) -> Result<Value, HloError>,
) -> Result<Module, HloError> {
    let mut module = Module::new(name);
    module.set_num_partitions(devices as u32)?;
    let mut f = module.func("main");
    let values: Vec<Value> = args
        .iter()
        .map(|a| f.arg_with_sharding(ty(a), Sharding::Manual))
        .collect::<Result<_, _>>()?;
    let out = body(&mut f, &values)?;
    f.finish_with_shardings(&[(out, Some(Sharding::Manual))])?;
    Ok(module)
}
