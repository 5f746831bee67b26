//! Paged attention (JAX's `paged_attention` semantics) against its f64 reference on the
//! interpreter and the CPU plugin, MHA and GQA, f32 and bf16; the Mosaic lowering run by the
//! evaluator equals the interpreter bit for bit.

use tessera::backend::{self, Backend};
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{mosaic, ArgSpec, DType, HostArray, KernelDef, KernelRules};
use tessera::paged::paged_attention::{paged_attention, paged_attention_reference};
use tessera_mosaic_eval::{Module, OutputSpec};

/// A decode batch: `q [B, H, D]`, pages `[KVH, P, page_size, D]`, lengths, page table.
struct Case {
    dtype: DType,
    heads: usize,
    kv_heads: usize,
    lengths: Vec<i32>,
}

const D: usize = 128;
const PAGE: usize = 16;
const PAGES: usize = 24;
const PER_SEQ: usize = 8;
const PER_BLOCK: usize = 4;

fn inputs(c: &Case) -> Vec<HostArray> {
    let b = c.lengths.len();
    // A scale that keeps the logits of order 1.
    let q = HostArray::random(DType::F32, [b, c.heads, D], 1).to_f64_vec();
    let q: Vec<f64> = q.iter().map(|x| x * 0.2).collect();
    let q = HostArray::from_f64(c.dtype, [b, c.heads, D], &q).unwrap();
    let k = HostArray::random(c.dtype, [c.kv_heads, PAGES, PAGE, D], 2);
    let v = HostArray::random(c.dtype, [c.kv_heads, PAGES, PAGE, D], 3);
    let lengths = HostArray::i32([b], c.lengths.clone()).unwrap();
    // Sequence `s` uses pages `(5 s + 7 j) % PAGES` (distinct within a sequence).
    let table: Vec<i32> = (0..b * PER_SEQ)
        .map(|i| ((5 * (i / PER_SEQ) + 7 * (i % PER_SEQ)) % PAGES) as i32)
        .collect();
    let pages = HostArray::i32([b, PER_SEQ], table).unwrap();
    vec![q, k, v, lengths, pages]
}

fn def(dtype: DType) -> KernelDef {
    match dtype {
        DType::BF16 => paged_attention::<half::bf16>(PER_BLOCK),
        _ => paged_attention::<f32>(PER_BLOCK),
    }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for (heads, kv_heads) in [(8, 8), (8, 2)] {
            out.push(Case {
                dtype,
                heads,
                kv_heads,
                lengths: vec![37, 0, 128, 64, 1],
            });
        }
    }
    out
}

fn max_error(got: &HostArray, want: &[f64]) -> f64 {
    got.to_f64_vec()
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f64::max)
}

#[test]
fn paged_attention_matches_its_reference_on_every_backend() {
    for c in cases() {
        let args = inputs(&c);
        let want = paged_attention_reference(&args[0], &args[1], &args[2], &c.lengths, &args[4]);
        let tol = if c.dtype == DType::BF16 { 2e-2 } else { 1e-5 };
        for b in Backend::everywhere() {
            let out = backend::run(&def(c.dtype), &args, b, &KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{b}: {e}"));
            let err = max_error(&out[0], &want);
            assert!(
                err <= tol,
                "{b} {} H={} KVH={}: max error {err:e}",
                c.dtype,
                c.heads,
                c.kv_heads
            );
        }
    }
}

#[test]
fn mosaic_eval_agrees_with_the_interpreter() {
    for c in cases() {
        let args = inputs(&c);
        let d = def(c.dtype);
        let want = interpret::run(&d, &args, &InterpretOptions::default()).unwrap();
        let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
        let k = d.instantiate(&specs, &KernelRules::tpu()).unwrap();
        let m = mosaic::lower(&k).unwrap();
        let module = Module::parse(&m.text).unwrap_or_else(|e| panic!("{e}\n{}", m.text));
        let outputs = [OutputSpec {
            dtype: c.dtype,
            shape: args[0].shape().to_vec(),
            aliases: None,
        }];
        let got = module
            .run(&mosaic::call_order(&k, &args), &outputs)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want, "{} H={} KVH={}", c.dtype, c.heads, c.kv_heads);
    }
}
