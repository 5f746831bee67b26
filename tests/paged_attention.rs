//! Paged attention (JAX's `paged_attention` semantics) against its f64 reference on the
//! interpreter and the CPU plugin, MHA and GQA, f32 and bf16; the Mosaic lowering run by the
//! evaluator equals the interpreter bit for bit. Its tables are checked: the registry's
//! runner refuses a page index outside the pool or a length past the table on every backend
//! with one sentence, the kernel itself stops at its `debug_check` on the interpreter and
//! mosaic-eval, and padding past a length and pages shared between sequences run.

mod common;

use common::with_i32;
use tessera::backend::{self, Backend};
use tessera::dsl::interpret::{self, DebugLog, InterpretOptions};
use tessera::dsl::{mosaic, ArgSpec, DType, HostArray, KernelDef, KernelRules};
use tessera::paged::paged_attention::{paged_attention, paged_attention_reference};
use tessera::registry::{self, Instance};
use tessera_mosaic_eval::{Module, OutputSpec, RunOptions};

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

#[test]
fn paged_attention_matches_its_reference_on_every_backend() {
    for c in cases() {
        let args = inputs(&c);
        let want = paged_attention_reference(&args[0], &args[1], &args[2], &c.lengths, &args[4]);
        let tol = if c.dtype == DType::BF16 { 2e-2 } else { 1e-5 };
        for b in Backend::everywhere() {
            let out = backend::run(&def(c.dtype), &args, b, &KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{b}: {e}"));
            let err = common::max_error(&out[0], &want);
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
        let got =
            mosaic_evaluated(&d, &args, &RunOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want, "{} H={} KVH={}", c.dtype, c.heads, c.kv_heads);
    }
}

/// `def`'s Mosaic lowering for `args` (declaration order) run by mosaic-eval.
fn mosaic_evaluated(
    def: &KernelDef,
    args: &[HostArray],
    options: &RunOptions,
) -> Result<Vec<HostArray>, tessera_mosaic_eval::EvalError> {
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    let k = def.instantiate(&specs, &KernelRules::tpu()).unwrap();
    let module = Module::parse(&mosaic::lower(&k).unwrap().text).unwrap();
    let flags = k.operand(
        k.checks
            .flags
            .expect("paged attention checks its pages")
            .flags,
    );
    let outputs = [
        OutputSpec {
            dtype: args[0].dtype(),
            shape: args[0].shape().to_vec(),
            aliases: None,
        },
        OutputSpec {
            dtype: flags.dtype,
            shape: flags.array_shape.clone(),
            aliases: Some(args.len()),
        },
    ];
    let call_args = mosaic::call_order(&k, &common::with_flags_init(&k, args));
    let mut got = module.run_with(&call_args, &outputs, options)?;
    common::checked(&k, &mut got)?;
    Ok(got)
}

/// The registry's paged attention at its defaults (f32; B 4, H 8, KVH 2, D 128, a pool of 64
/// pages of 16 tokens, 8 entries per sequence, 4 pages per block: lengths 128, 93, 64 and 29
/// use 8, 6, 4 and 2 entries) and its inputs.
fn registry_case() -> (Instance, Vec<HostArray>) {
    let instance = registry::find("paged_attention")
        .unwrap()
        .instance(&[])
        .unwrap();
    let mut inputs = instance.inputs(1).unwrap();
    let args = inputs.remove(0);
    assert_eq!(args[3].to_f64_vec(), [128.0, 93.0, 64.0, 29.0]);
    (instance, args)
}

/// Bad tables for the registry case, each with the sentence refusing it: entry 3 of sequence
/// 2 (used: its 64 tokens fill entries 0 to 3) outside the pool, and sequence 1's length
/// outside 0..=128.
fn bad_tables(args: &[HostArray]) -> Vec<(Vec<HostArray>, String)> {
    let mut out = Vec::new();
    for page in [64, 100, -1, i32::MIN, i32::MAX] {
        out.push((
            with_i32(args, 4, 2 * 8 + 3, page),
            format!(
                "paged attention: sequence 2 reads entry page_indices[2, 3] = {page}, which \
                 is no page of the pool's 64 (0 to 63); its 64 tokens use entries 0 to 3"
            ),
        ));
    }
    for length in [129, -1, i32::MIN, i32::MAX] {
        out.push((
            with_i32(args, 3, 1, length),
            format!(
                "paged attention: sequence 1 has length lengths[1] = {length}, outside 0 to \
                 128 (its table row holds 8 pages of 16 tokens)"
            ),
        ));
    }
    out
}

#[test]
fn the_registry_runner_refuses_bad_tables_on_every_backend() {
    let (instance, args) = registry_case();
    for (bad, sentence) in bad_tables(&args) {
        for b in Backend::everywhere() {
            let e = instance
                .run(std::slice::from_ref(&bad), b, &KernelRules::tpu())
                .expect_err(&sentence);
            assert_eq!(e.to_string(), sentence, "{b}");
        }
    }
}

/// Entries past a sequence's length hold anything (-1, 64, i32::MIN, ...), and sequence 3
/// reads sequence 0's first two pages: the registry's runner, the interpreter, the CPU
/// plugin and mosaic-eval run it, to the reference.
#[test]
fn padding_past_a_length_and_shared_pages_run_on_every_backend() {
    let (instance, mut args) = registry_case();
    let mut table: Vec<i32> = args[4].to_f64_vec().iter().map(|&x| x as i32).collect();
    let padding = [-1, 64, 100, i32::MIN, i32::MAX];
    for (seq, used) in [(1, 6), (2, 4), (3, 2)] {
        for (e, entry) in table[seq * 8..][used..8].iter_mut().enumerate() {
            *entry = padding[(seq + e) % padding.len()];
        }
    }
    table[3 * 8] = table[0];
    table[3 * 8 + 1] = table[1];
    args[4] = HostArray::i32([4, 8], table).unwrap();
    let want = instance.reference(std::slice::from_ref(&args)).unwrap();
    let mut interpreted = None;
    for b in Backend::everywhere() {
        let got = instance
            .run(std::slice::from_ref(&args), b, &KernelRules::tpu())
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        common::assert_close(&got[0][0].to_f64_vec(), &want[0][0], 1e-5, b.name());
        if b == Backend::Interpret {
            interpreted = Some(got[0][0].clone());
        }
    }
    let evaluated = mosaic_evaluated(instance.def(), &args, &RunOptions::default()).unwrap();
    assert_eq!(Some(evaluated[0].clone()), interpreted, "mosaic-eval");
}

/// Past every host check (the kernel run as it is), the interpreter and mosaic-eval refuse a
/// bad length at the kernel's `debug_check` (its line, the bound, the grid step: the sequence
/// and its first KV head; a printed line of the values) and a bad page at the run-time check
/// of its copy's window (the copy's line, the value, the bound, the grid step).
#[test]
fn the_kernel_checks_its_tables_itself() {
    let (instance, args) = registry_case();
    let source = include_str!("../kernels/paged/src/paged_attention.rs");
    let line_of = |start: &str| {
        let at = source
            .lines()
            .position(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no `{start}` in paged_attention.rs"));
        format!("paged_attention.rs:{}:", at + 1)
    };
    let page = (
        with_i32(&args, 4, 2 * 8 + 3, 64),
        line_of("copy.start();"),
        "run-time check: the start of the copy's source `k_pages`'s window along dim 1 is 64",
        "at grid step [2, 0], outside 0 to 63",
        None,
    );
    let length = (
        with_i32(&args, 3, 1, i32::MAX),
        line_of("debug_check(length_ok"),
        "debug_check: failed: lengths[b] is outside 0..=128 (8 pages of 16 tokens per \
         sequence)",
        "at grid step [1, 0]",
        Some("grid step [1, 0]: paged_attention: sequence 1 has length 2147483647"),
    );
    for (bad, line, message, step, printed) in [page, length] {
        let log = DebugLog::new();
        let options = InterpretOptions {
            debug_log: Some(log.clone()),
            ..InterpretOptions::default()
        };
        let e = interpret::run(instance.def(), &bad, &options)
            .unwrap_err()
            .to_string();
        let eval_log = tessera_mosaic_eval::DebugLog::default();
        let eval_options = RunOptions {
            debug_log: Some(eval_log.clone()),
            ..RunOptions::default()
        };
        let eval = mosaic_evaluated(instance.def(), &bad, &eval_options)
            .unwrap_err()
            .to_string();
        for (what, e, lines) in [
            ("interpret", e, log.lines()),
            ("mosaic-eval", eval, eval_log.lock().unwrap().clone()),
        ] {
            assert!(e.contains(&line), "{what}: {e}");
            assert!(e.contains(message), "{what}: {e}");
            assert!(e.contains(step), "{what}: {e}");
            if let Some(printed) = printed {
                assert!(lines.iter().any(|l| l == printed), "{what}: {lines:#?}");
            }
        }
    }
}

/// The Mosaic for TPU carries the kernel's checks: `cf.assert` on the length with its
/// `tpu.log` of the values under the failing condition, and the run-time checks of the page
/// copies' windows (in the first block's fetch and the next block's), which write the check
/// flags: an extra operand and result (one row of 128 words per grid step) and the step's
/// check state in SMEM (tests/memory_tpu_compile.rs compiles the kernel with libtpu for v5p;
/// mosaic-eval runs this text in the tests above).
#[test]
fn the_mosaic_for_tpu_carries_the_checks() {
    let (instance, args) = registry_case();
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    let k = instance
        .def()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap();
    let kinds: Vec<String> = k.checks.sites.iter().map(|s| s.kind.to_string()).collect();
    let window = "the start of the copy's source `k_pages`'s window along dim 1 in 0 to 63";
    assert_eq!(
        kinds,
        [
            "debug_check: lengths[b] is outside 0..=128 (8 pages of 16 tokens per sequence)",
            window,
            window,
            window,
            window,
            window,
            window,
            window,
            window,
        ],
        "{k}"
    );
    let text = mosaic::lower(&k).unwrap().text;
    let asserts: Vec<&str> = text.lines().filter(|l| l.contains("cf.assert")).collect();
    assert_eq!(asserts.len(), 1, "{asserts:#?}");
    assert!(
        asserts[0].contains("lengths[b] is outside 0..=128"),
        "{asserts:#?}"
    );
    assert_eq!(text.matches("tpu.log").count(), 1, "{text}");
    // Grid (4, 2): 8 rows of flags; the state: a check number and up to three values.
    assert!(
        text.contains("memref<8x128xi32, #tpu.memory_space<any>>"),
        "{text}"
    );
    assert!(
        text.contains("memref<4xi32, #tpu.memory_space<smem>>"),
        "{text}"
    );
}
