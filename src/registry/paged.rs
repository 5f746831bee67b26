//! Paged attention and the KV-cache kernels beside it (`cache_update`, `gather_tiles`): their
//! builds (the page tables and slots the parameters fix), f64 references, flop counts and
//! entries.

use super::*;
use crate::kernels::cache_update::{block_rows, cache_update, cache_update_reference};
use crate::kernels::memory::{gather_tiles, gather_tiles_reference, TILE_ROWS};
use crate::kernels::paged_attention;
use crate::kernels::paged_attention::paged_attention_reference;

/// The pages in paged attention's pool: `P`, or with `P=all` every sequence's own
/// (`B * pages_per_seq`).
fn paged_pool(p: &Params) -> Result<usize, RegistryError> {
    if p.0["P"] == "all" {
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

/// `gather_tiles`' tile order: tile `g` is `(7 g + 3) mod (R / 8)` (out of order, repeating
/// where `G` exceeds the tiles of `x`).
fn tile_order(p: &Params) -> Result<HostArray, RegistryError> {
    let (g, r) = (p.usize("G")?, p.usize("R")?);
    if r % TILE_ROWS != 0 {
        return Err(p.bad("R", "a multiple of 8 (x is gathered in tiles of 8 rows)"));
    }
    let tiles = (0..g)
        .map(|i| ((7 * i + 3) % (r / TILE_ROWS)) as i32)
        .collect();
    Ok(HostArray::i32([g], tiles).expect("one entry per step"))
}

fn build_gather_tiles(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    f32_only(p)?;
    let tiles = tile_order(p)?;
    let x = ArgSpec::new(DType::F32, [p.usize("R")?, p.usize("C")?]);
    Ok(Built {
        def: gather_tiles(),
        args: vec![ArgSpec::of(&tiles), x],
        fixed: vec![Some(tiles), None],
        mesh: Vec::new(),
    })
}

fn gather_tiles_ref(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 2)?;
    let tiles: Vec<i32> = x[0].to_f64_vec().iter().map(|&t| t as i32).collect();
    Ok(vec![gather_tiles_reference(&tiles, &x[1])])
}

/// Paged attention and the KV-cache kernels.
pub(super) const KERNELS: &[KernelInfo] = &[
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
        xla: Some(|args, _| xla::paged_attention(args)),
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
    KernelInfo {
        name: "gather_tiles",
        summary: "tiles of 8 rows of x[R,C] (left in HBM) in the order of a scalar-prefetched \
                  table, each step's copy double-buffered behind the one before",
        params: &[
            ParamInfo::compile_time("dtype", "f32", "input dtype: f32"),
            ParamInfo::size("G", "6", "tiles gathered (grid steps)", &[("tiles", 0)]),
            ParamInfo::size("R", "32", "rows of x (a multiple of 8)", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_gather_tiles,
        reference: Reference::Local(gather_tiles_ref),
        flops: no_flops,
        inputs: None,
        xla: None,
        // A copy: exact.
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("G", "9"), ("R", "16"), ("C", "256")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("R", "{collective_size}"), ("C", "{collective_size}")]],
    },
];
