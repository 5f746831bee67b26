//! Paged attention and the KV-cache update beside it: their builds (the page tables and
//! slots the parameters fix), f64 references, flop counts, XLA's dense paged attention, and
//! entries ([`KERNELS`], which the facade's registry lists).

use tessera_dsl::{with_float_type, ArgSpec, DType, HostArray};
use tessera_hlo::{DotDims, FuncBuilder, HloError, Module, Reducer, TensorType, Value};
use tessera_registry::xla::ty;
use tessera_registry::{
    expect_inputs, no_flops, Built, Case, KernelInfo, ParamInfo, Params, Reference, RegistryError,
    DTYPE,
};

use crate::cache_update::{block_rows, cache_update, cache_update_reference};
use crate::paged_attention::{
    paged_attention, paged_attention_reference, validate_tables, MASK_VALUE,
};

/// The pages in paged attention's pool: `P`, or with `P=all` every sequence's own
/// (`B * pages_per_seq`).
fn paged_pool(p: &Params) -> Result<usize, RegistryError> {
    if p.get("P") == "all" {
        Ok(p.usize("B")? * p.usize("pages_per_seq")?)
    } else {
        p.usize("P")
    }
}

/// The lengths and page table of paged attention's default arguments: sequence `b` holds
/// `max - (b * max) / B - 3 (b % 2)` tokens (clamped at 0; `max = pages_per_seq * page_size`:
/// full, partial and, for large `b`, short sequences), entry `j` of its table is page
/// `(b * pages_per_seq + 7 j mod pages_per_seq) mod P` (distinct pages, out of order, where
/// 7 does not divide `pages_per_seq` and the pool holds them all).
fn paged_tables(p: &Params) -> Result<(HostArray, HostArray), RegistryError> {
    let (b, pages, per_seq) = (p.usize("B")?, paged_pool(p)?, p.usize("pages_per_seq")?);
    let max = per_seq * p.usize("page_size")?;
    let lengths = (0..b)
        .map(|i| (max - i * max / b).saturating_sub(3 * (i % 2)) as i32)
        .collect();
    let table = (0..b * per_seq)
        .map(|i| (((i / per_seq) * per_seq + (7 * (i % per_seq)) % per_seq) % pages) as i32)
        .collect();
    Ok((
        HostArray::i32([b], lengths).expect("one length per sequence"),
        HostArray::i32([b, per_seq], table).expect("one page per entry"),
    ))
}

fn build_paged(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (dtype, per_block) = (p.dtype()?, p.usize("pages_per_block")?);
    let [b, h, kvh, d] = ["B", "H", "KVH", "D"].map(|n| p.usize(n));
    let (b, h, kvh, d) = (b?, h?, kvh?, d?);
    let (pages, page_size, per_seq) = (
        p.usize("P")?,
        p.usize("page_size")?,
        p.usize("pages_per_seq")?,
    );
    let def = with_float_type!(dtype, T => paged_attention::<T>(per_block));
    let (lengths, table) = paged_tables(p)?;
    Ok(Built {
        def,
        args: vec![
            ArgSpec::new(dtype, [b, h, d]),
            ArgSpec::new(dtype, [kvh, pages, page_size, d]),
            ArgSpec::new(dtype, [kvh, pages, page_size, d]),
            ArgSpec::new(DType::I32, [b]),
            ArgSpec::new(DType::I32, [b, per_seq]),
        ],
        fixed: vec![None, None, None, Some(lengths), Some(table)],
        mesh: Vec::new(),
    })
}

/// Paged attention's run-time data check: [`validate_tables`] on `lengths` and
/// `page_indices` against the pool of `k_pages` (`[KVH, P, page_size, D]`), when both tables
/// are at hand. Arguments of other kinds or shapes are left to the instantiation, which
/// refuses them with its own sentence.
fn check_paged_tables(
    _: &Params,
    _name: &str,
    specs: &[ArgSpec],
    values: &[Option<&HostArray>],
) -> Result<(), RegistryError> {
    let ([_, k_pages, _, _, _], [_, _, _, Some(lengths), Some(table)]) = (specs, values) else {
        return Ok(());
    };
    let (&[_, pages, page_size, _], &[_, per_seq]) = (&k_pages.shape[..], table.shape()) else {
        return Ok(());
    };
    if lengths.dtype() != DType::I32 || table.dtype() != DType::I32 {
        return Ok(());
    }
    let ints = |a: &HostArray| a.to_f64_vec().iter().map(|&x| x as i32).collect::<Vec<_>>();
    validate_tables(&ints(lengths), &ints(table), per_seq, page_size, pages)
        .map_err(|e| RegistryError::Family(Box::new(e)))
}

fn paged_reference(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 5)?;
    let lengths: Vec<i32> = x[3].to_f64_vec().iter().map(|&l| l as i32).collect();
    Ok(vec![paged_attention_reference(
        &x[0], &x[1], &x[2], &lengths, &x[4],
    )])
}

fn paged_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    // q k^T and p v over each sequence's tokens: two D-long dot products per token and head.
    let (lengths, _) = paged_tables(p)?;
    let tokens: f64 = lengths.to_f64_vec().iter().sum();
    Ok(4.0 * (p.usize("H")? * p.usize("D")?) as f64 * tokens)
}

/// `cache_update`'s slots: step `i` writes block `(5 i + 2) mod (R / rows)` (out of order;
/// distinct while `N <= R / rows` and 5 does not divide `R / rows`).
fn cache_slots(p: &Params) -> Result<HostArray, RegistryError> {
    let (n, r, rows) = (p.usize("N")?, p.usize("R")?, block_rows(p.dtype()?));
    if r % rows != 0 || r == 0 {
        return Err(p.bad(
            "R",
            "a positive multiple of the block (8 rows for f32, 16 for bf16)",
        ));
    }
    let slots = (0..n).map(|i| ((5 * i + 2) % (r / rows)) as i32).collect();
    Ok(HostArray::i32([n], slots).expect("one slot per step"))
}

fn build_cache_update(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let dtype = p.dtype()?;
    let slots = cache_slots(p)?;
    let (n, r, c) = (p.usize("N")?, p.usize("R")?, p.usize("C")?);
    Ok(Built {
        def: with_float_type!(dtype, T => cache_update::<T>()),
        args: vec![
            ArgSpec::of(&slots),
            ArgSpec::new(dtype, [r, c]),
            ArgSpec::new(dtype, [n * block_rows(dtype), c]),
        ],
        fixed: vec![Some(slots), None, None],
        mesh: Vec::new(),
    })
}

fn cache_update_ref(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 3)?;
    let slots: Vec<i32> = x[0].to_f64_vec().iter().map(|&s| s as i32).collect();
    Ok(vec![cache_update_reference(&slots, &x[1], &x[2])])
}

/// Paged attention and the KV-cache update.
pub const KERNELS: &[KernelInfo] = &[
    KernelInfo {
        name: "paged_attention",
        summary: "decode attention over KV pages in HBM found through a page table (JAX's \
                  paged_attention), pages double-buffered into VMEM",
        params: &[
            ParamInfo::compile_time("pages_per_block", "4", "pages per copy block"),
            DTYPE,
            ParamInfo::size(
                "B",
                "4",
                "sequences",
                &[("q", 0), ("lengths", 0), ("page_indices", 0)],
            ),
            ParamInfo::size("H", "8", "query heads", &[("q", 1)]),
            ParamInfo::size(
                "KVH",
                "2",
                "key/value heads (divides H)",
                &[("k_pages", 0), ("v_pages", 0)],
            ),
            ParamInfo::size(
                "P",
                "64",
                "pages in the pool",
                &[("k_pages", 1), ("v_pages", 1)],
            ),
            ParamInfo::size(
                "page_size",
                "16",
                "tokens per page",
                &[("k_pages", 2), ("v_pages", 2)],
            ),
            ParamInfo::size(
                "pages_per_seq",
                "8",
                "page table entries per sequence",
                &[("page_indices", 1)],
            ),
            ParamInfo::size(
                "D",
                "128",
                "head dim",
                &[("q", 2), ("k_pages", 3), ("v_pages", 3)],
            ),
        ],
        build: build_paged,
        reference: Reference::Local(paged_reference),
        flops: paged_flops,
        inputs: None,
        xla: Some(|_, args, _| xla_paged_attention(args)),
        check_inputs: Some(check_paged_tables),
        cases: &[
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-5,
            },
            // MHA, one page per block.
            Case {
                params: &[("dtype", "f32"), ("KVH", "8"), ("pages_per_block", "1")],
                tol: 1e-5,
            },
            // Outputs rounded to bf16 (|out| <= 1).
            Case {
                params: &[("dtype", "bf16"), ("B", "3")],
                tol: 1e-2,
            },
        ],
        bench: &[
            &[
                ("dtype", "f32"),
                ("pages_per_block", "8"),
                ("B", "8"),
                ("H", "32"),
                ("KVH", "8"),
                ("pages_per_seq", "{kv_pages}"),
            ],
            &[
                ("dtype", "bf16"),
                ("pages_per_block", "8"),
                ("B", "8"),
                ("H", "32"),
                ("KVH", "8"),
                ("pages_per_seq", "{kv_pages}"),
            ],
        ],
    },
    KernelInfo {
        name: "cache_update",
        summary: "cache[R,C] with the row blocks (8 rows f32, 16 bf16) listed in a \
                  scalar-prefetched table replaced by the blocks of new, in place: out is \
                  cache's buffer (input_output_aliases), so unlisted blocks keep their values",
        params: &[
            DTYPE,
            ParamInfo::size("N", "3", "blocks updated (grid steps)", &[("slots", 0)]),
            ParamInfo::size(
                "R",
                "64",
                "rows of the cache (a multiple of 8)",
                &[("cache", 0)],
            ),
            ParamInfo::size("C", "128", "columns", &[("cache", 1), ("new", 1)]),
        ],
        build: build_cache_update,
        reference: Reference::Local(cache_update_ref),
        flops: no_flops,
        inputs: None,
        xla: None,
        check_inputs: None,
        // A copy: exact.
        cases: &[
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "bf16"), ("N", "5"), ("R", "96"), ("C", "256")],
                tol: 1e-30,
            },
        ],
        bench: &[&[
            ("dtype", "f32"),
            ("R", "{collective_size}"),
            ("C", "{collective_size}"),
        ]],
    },
];

/// Paged attention as XLA computes it densely: every sequence's pages gathered out of the
/// pools into `[B, KVH, pages_per_seq * page_size, D]` (a loop over the page table's columns,
/// one dynamic slice per entry), then attention of each query head group over them with the positions past the
/// sequence's length masked; f32 arithmetic, output in the input dtype. Arguments as the
/// kernel's: `q, k_pages, v_pages, lengths, page_indices`.
fn xla_paged_attention(args: &[ArgSpec]) -> Result<Module, HloError> {
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

#[cfg(test)]
mod tests {
    #[test]
    fn entries_are_complete() {
        tessera_registry::check_family(super::KERNELS);
    }
}
