//! Context-parallel splash attention on U CPU devices (Ulysses, all-gather, ring and the
//! Ulysses x ring hybrid) gives the results of the dense float64 reference on one device,
//! forward and backward, for MHA and GQA (including fewer KV heads than devices), causal and
//! local masks, U in {2, 4, 8}; the programs move data with the collectives each strategy
//! names and no others.

mod common;

use common::{assert_close, random};
use tessera_collective_kernels::memory::{ring_mesh, RingMesh};
use tessera_collective_kernels::ulysses::{
    ulysses_attention_bwd_of, ulysses_attention_bwd_staged_of, ulysses_attention_of,
    ulysses_attention_staged_of, Logits, Visibility,
};
use tessera_dsl::axes::Context;
use tessera_dsl::{ArgSpec, DType, HostArray, KernelDef, KernelRules, Lowering, ProblemKind};
use tessera_parallel::strategy::{AllGather, Ring, Ulysses, Usp};
use tessera_parallel::{ContextParallel, CpInputs, Strategy};
use tessera_runtime::Platform;
use tessera_splash::reference::{self, RefInputs};
use tessera_splash::{BlockSizes, Dims, Mask};

const HEAD_DIM: usize = 64;

fn dims(heads: usize, kv_heads: usize, seq: usize) -> Dims {
    Dims {
        batch: 1,
        heads,
        kv_heads,
        q_len: seq,
        kv_len: seq,
        head_dim: HEAD_DIM,
        head_dim_v: HEAD_DIM,
    }
}

fn config(
    strategy: Strategy,
    devices: usize,
    d: Dims,
    mask: Mask,
    block: usize,
) -> ContextParallel {
    ContextParallel {
        dims: d,
        dtype: DType::F32,
        mask,
        block_sizes: BlockSizes::uniform(block, block),
        options: Default::default(),
        strategy,
        devices,
        load_balance: false,
        lowering: Lowering::portable(),
    }
}

fn check(strategy: &str, devices: usize, heads: usize, kv_heads: usize, mask: Mask) {
    check_with(strategy, devices, heads, kv_heads, mask, false);
}

/// Like [`check`], with causal load balancing (zigzag).
fn check_balanced(strategy: &str, devices: usize, heads: usize, kv_heads: usize, mask: Mask) {
    run_check(strategy, devices, heads, kv_heads, mask, false, true);
}

/// Runs `strategy` on `devices` devices and compares `out`, `lse`, `dq`, `dk`, `dv` with the
/// f64 reference (tolerances of the splash tests: 2e-4 absolute for the forward, 1e-3
/// relative to the largest gradient for the backward). `packed`: with segment ids (packed
/// sequences whose boundaries cross the shards) and a soft cap.
fn check_with(
    strategy: &str,
    devices: usize,
    heads: usize,
    kv_heads: usize,
    mask: Mask,
    packed: bool,
) {
    run_check(strategy, devices, heads, kv_heads, mask, packed, false);
}

fn run_check(
    strategy: &str,
    devices: usize,
    heads: usize,
    kv_heads: usize,
    mask: Mask,
    packed: bool,
    load_balance: bool,
) {
    let strategy = Strategy::parse(strategy, devices).unwrap();
    check_strategy(strategy, devices, heads, kv_heads, mask, packed, |cp| {
        cp.load_balance = load_balance
    });
}

/// [`run_check`] of a parsed strategy.
fn check_strategy(
    strategy: Strategy,
    devices: usize,
    heads: usize,
    kv_heads: usize,
    mask: Mask,
    packed: bool,
    adjust: impl FnOnce(&mut ContextParallel),
) {
    let seq = 512;
    let d = dims(heads, kv_heads, seq);
    let mut cp = config(strategy.clone(), devices, d, mask.clone(), 128);
    adjust(&mut cp);
    let load_balance = cp.load_balance;
    // The largest block that divides what every kernel call holds (up to the one `adjust`
    // leaves, 128 unless it sets one).
    let parts = if load_balance { 2 } else { 1 };
    let block = (seq / devices / parts).min(cp.block_sizes.block_q);
    cp.block_sizes = BlockSizes::uniform(block, block);
    let soft_cap = packed.then_some(3.0);
    cp.options.soft_cap = soft_cap.map(|c| c as f32);
    let segments: Vec<i32> = (0..seq as i32).map(|i| i / 100).collect();
    let segment_ids = HostArray::i32([1, seq], segments.clone()).unwrap();
    let segment_ids = packed.then_some(&segment_ids);
    let what = format!(
        "{strategy} on {devices} devices, H={heads} KVH={kv_heads} {mask:?}{}{}{}{}",
        if packed { " packed" } else { "" },
        if soft_cap.is_some() {
            " soft-capped"
        } else {
            ""
        },
        if load_balance { " load-balanced" } else { "" },
        match cp.lowering.rules.vmem_limit_bytes {
            Some(limit) => format!(" under a VMEM budget of {limit} bytes"),
            None => String::new(),
        }
    );

    let q = random(DType::F32, &[1, heads, seq, HEAD_DIM], 1);
    let k = random(DType::F32, &[1, kv_heads, seq, HEAD_DIM], 2);
    let v = random(DType::F32, &[1, kv_heads, seq, HEAD_DIM], 3);
    let dout = random(DType::F32, &[1, heads, seq, HEAD_DIM], 4);
    let mask = mask.into();
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let r = RefInputs {
        q_segment_ids: packed.then_some(&segments[..]),
        kv_segment_ids: packed.then_some(&segments[..]),
        soft_cap,
        ..RefInputs::new(d, (&qf, &kf, &vf), &mask, 1.0 / (HEAD_DIM as f64).sqrt())
    };
    let want = reference::forward(&r);
    let x = CpInputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids,
    };
    let want_grads = reference::backward(&r, &dout.to_f64_vec());

    let (out, lse) = cp
        .forward(Platform::Cpu, &x)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(out.shape(), q.shape(), "{what}: out shape");
    assert_close(&out.to_f64_vec(), &want.out, 2e-4, &format!("{what}: out"));
    assert_close(&lse.to_f64_vec(), &want.lse, 2e-4, &format!("{what}: lse"));

    let both = cp
        .forward_backward(Platform::Cpu, &x, &dout)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let fb = format!("{what}: forward + backward program's");
    assert_close(
        &both.out.to_f64_vec(),
        &want.out,
        2e-4,
        &format!("{fb} out"),
    );
    assert_close(
        &both.lse.to_f64_vec(),
        &want.lse,
        2e-4,
        &format!("{fb} lse"),
    );
    for (name, got, want, shape) in [
        ("dq", &both.dq, &want_grads.dq, q.shape()),
        ("dk", &both.dk, &want_grads.dk, k.shape()),
        ("dv", &both.dv, &want_grads.dv, v.shape()),
    ] {
        assert_eq!(got.shape(), shape, "{what}: {name} shape");
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        assert_close(
            &got.to_f64_vec(),
            want,
            1e-3 * scale,
            &format!("{what}: {name}"),
        );
    }
}

/// Every strategy on the list, as its base spelling parses on 4 devices: a strategy added to
/// the list is tested here without a line of its own. GQA with packed sequences crossing the
/// shards and a soft cap, causal, with load balancing where the strategy balances.
#[test]
fn every_listed_strategy_matches_the_reference() {
    let listed = Strategy::listed(4);
    assert!(listed.len() >= 4, "{listed:?}");
    for strategy in listed {
        let balances = strategy.load_balances();
        check_strategy(strategy, 4, 8, 2, Mask::causal(), true, |cp| {
            cp.load_balance = balances
        });
    }
}

/// The fused kernels against the reference: MHA and GQA (KV heads repeated, fewer than the
/// devices too), causal, full, local and chunked causal, on 2, 4 and 8 devices; packed
/// sequences whose documents cross the devices' blocks, full, causal and local.
#[test]
fn ulysses_fused_matches_the_reference() {
    check("ulysses_fused", 4, 8, 8, Mask::causal());
    check("ulysses-fused", 2, 4, 2, Mask::Full);
    check("ulysses_fused", 8, 8, 2, Mask::causal());
    // A window of 100 keys behind and 20 ahead, and chunks of 96 (blocks of 128).
    check("ulysses_fused", 4, 8, 2, Mask::local(100, 20));
    check("ulysses_fused", 2, 4, 4, Mask::chunked(96));
    check_with("ulysses_fused", 2, 4, 2, Mask::Full, true);
    check_with("ulysses_fused", 4, 4, 2, Mask::causal(), true);
    check_with("ulysses_fused", 4, 4, 2, Mask::local(64, 0), true);
}

/// Under a VMEM budget a head's gathered sequence does not fit (the kernel rules' limit,
/// set here on the CPU path as `tessera compile` sets it for TPU), `ulysses_fused` takes the
/// kernels that stage the heads in HBM: the same results against the reference, packed and
/// causal, and a local window. The budget's premise is checked first: the VMEM kernels are
/// refused under it for VMEM alone, the staged ones fit.
#[test]
fn ulysses_fused_stages_the_heads_in_hbm_where_vmem_is_short() {
    const BUDGET: usize = 800 << 10;
    const BLOCK: usize = 64;
    let rules = KernelRules::portable().with_vmem_limit(BUDGET);
    // What each device's kernels take: 8 heads of the 128 rows of 512 a device holds.
    let x = ArgSpec::new(DType::F32, [8, 128, HEAD_DIM]);
    let stats = ArgSpec::new(DType::F32, [8, 128 / BLOCK, 1, BLOCK]);
    let causal = Visibility::Causal;
    let logits = Logits::default();
    for (gathered, staged, args) in [
        (
            ulysses_attention_of::<f32, RingMesh, Context>(BLOCK, causal, logits),
            ulysses_attention_staged_of::<f32, RingMesh, Context>(BLOCK, causal, logits),
            vec![x.clone(); 3],
        ),
        (
            ulysses_attention_bwd_of::<f32, RingMesh, Context>(BLOCK, causal, logits),
            ulysses_attention_bwd_staged_of::<f32, RingMesh, Context>(BLOCK, causal, logits),
            [vec![x.clone(); 4], vec![stats.clone(); 2]].concat(),
        ),
    ] {
        let instantiate = |def: KernelDef| {
            def.without("segment_ids")
                .unwrap()
                .instantiate_on(&args, &ring_mesh(4), &rules)
        };
        match instantiate(gathered) {
            Err(e) => assert!(
                e.problems.iter().all(|p| p.kind == ProblemKind::Vmem),
                "{e}"
            ),
            Ok(k) => panic!(
                "`{}` fits {BUDGET} bytes of VMEM; the test needs less",
                k.name
            ),
        }
        if let Err(e) = instantiate(staged) {
            panic!("{e}");
        }
    }
    let short_of_vmem = |cp: &mut ContextParallel| {
        cp.block_sizes = BlockSizes::uniform(BLOCK, BLOCK);
        cp.lowering.rules = cp.lowering.rules.clone().with_vmem_limit(BUDGET)
    };
    let fused = || Strategy::parse("ulysses_fused", 4).unwrap();
    check_strategy(fused(), 4, 8, 2, Mask::causal(), true, short_of_vmem);
    check_strategy(fused(), 4, 8, 8, Mask::local(100, 20), false, short_of_vmem);
    // Under a budget the staged kernel does not fit either, the step is refused naming it.
    let mut cp = config(fused(), 4, dims(8, 8, 512), Mask::causal(), 128);
    cp.lowering.rules = cp.lowering.rules.clone().with_vmem_limit(64 << 10);
    let [q, k, v] = [1, 2, 3].map(|s| random(DType::F32, &[1, 8, 512, HEAD_DIM], s));
    let x = CpInputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: None,
    };
    let refused = cp.forward(Platform::Cpu, &x).unwrap_err().to_string();
    assert!(
        refused.contains("ulysses_attention_staged") && refused.contains("VMEM"),
        "{refused}"
    );
}

/// A softmax scale of the configuration's own: the fused kernels give plain Ulysses'
/// results (splash's, which the reference tests hold), forward and backward.
#[test]
fn ulysses_fused_takes_the_configuration_s_scale() {
    let d = dims(8, 4, 256);
    let run = |name: &str| {
        let strategy = Strategy::parse(name, 4).unwrap();
        let mut cp = config(strategy, 4, d, Mask::causal(), 64);
        cp.options.scale = Some(0.3);
        let q = random(DType::F32, &[1, 8, 256, HEAD_DIM], 1);
        let [k, v] = [2, 3].map(|s| random(DType::F32, &[1, 4, 256, HEAD_DIM], s));
        let dout = random(DType::F32, &[1, 8, 256, HEAD_DIM], 4);
        let x = CpInputs {
            q: &q,
            k: &k,
            v: &v,
            segment_ids: None,
        };
        cp.forward_backward(Platform::Cpu, &x, &dout).unwrap()
    };
    let (plain, fused) = (run("ulysses"), run("ulysses_fused"));
    for (name, a, b) in [
        ("out", &plain.out, &fused.out),
        ("lse", &plain.lse, &fused.lse),
        ("dq", &plain.dq, &fused.dq),
        ("dk", &plain.dk, &fused.dk),
        ("dv", &plain.dv, &fused.dv),
    ] {
        assert_close(&b.to_f64_vec(), &a.to_f64_vec(), 1e-4, name);
    }
}

/// What the fused kernels do not take is refused with the setting named and a way out.
#[test]
fn ulysses_fused_refuses_what_its_kernels_do_not_take() {
    let strategy = Strategy::parse("ulysses_fused", 4).unwrap();
    let d = dims(8, 8, 512);
    let refused = |cp: ContextParallel, says: &str| {
        let e = cp.check().unwrap_err().to_string();
        assert!(e.starts_with("ulysses_fused: ") && e.contains(says), "{e}");
    };
    refused(
        config(strategy.clone(), 4, d, Mask::Causal { offset: 3 }, 128),
        "masks without offsets, not causal(offset=3)",
    );
    let mut cp = config(strategy.clone(), 4, d, Mask::causal(), 128);
    cp.block_sizes.block_kv = 64;
    refused(cp, "one block for queries and keys, not 128 and 64");
    // 512 / 4 = 128 rows per device: a block of 256 divides the sequence, not the rows.
    refused(
        config(strategy.clone(), 4, d, Mask::causal(), 256),
        "the 128 queries",
    );
    let mut cp = config(strategy, 4, d, Mask::causal(), 128);
    cp.dims.head_dim_v = 32;
    refused(cp, "one head dim");
}

#[test]
fn ulysses_matches_the_reference() {
    check("ulysses", 2, 4, 4, Mask::local(64, 0));
    check("ulysses", 4, 8, 8, Mask::causal());
    // 2 KV heads on 4 devices: each KV head is replicated twice before the all-to-all.
    check("ulysses", 4, 8, 2, Mask::causal());
    check("ulysses", 8, 8, 2, Mask::local(100, 0));
    check_with("ulysses", 4, 8, 4, Mask::causal(), true);
}

#[test]
fn all_gather_matches_the_reference() {
    check("all_gather", 2, 8, 2, Mask::local(64, 0));
    check("all-gather", 4, 8, 8, Mask::causal());
    check("all-gather", 8, 4, 1, Mask::causal());
    check_with("all-gather", 4, 4, 2, Mask::causal(), true);
}

#[test]
fn ring_matches_the_reference() {
    check("ring", 2, 4, 4, Mask::causal());
    check("ring", 4, 8, 2, Mask::local(100, 0));
    check("ring", 8, 4, 4, Mask::causal());
    check_with("ring", 4, 4, 2, Mask::local(100, 0), true);
}

#[test]
fn load_balanced_all_gather_and_ring_match_the_reference() {
    check_balanced("all-gather", 2, 4, 2, Mask::causal());
    // Causal: the gathered halves (three calls a device, the second half reversed), here
    // with segment ids crossing the chunks and a soft cap.
    run_check("all-gather", 4, 8, 2, Mask::causal(), true, true);
    check_balanced("all-gather", 4, 8, 8, Mask::local(100, 0));
    check_balanced("ring", 2, 4, 4, Mask::local(64, 0));
    check_balanced("ring", 4, 8, 2, Mask::causal());
    check_balanced("ring", 8, 4, 1, Mask::causal());
    run_check("all-gather", 8, 4, 4, Mask::causal(), true, true);
    run_check("ring", 4, 4, 2, Mask::causal(), true, true);
}

#[test]
fn usp_matches_the_reference() {
    check("usp:2x2", 4, 8, 2, Mask::causal());
    // 1 KV head on a Ulysses degree of 2: replicated.
    check("usp:2x4", 8, 4, 1, Mask::local(64, 0));
    check("usp", 8, 8, 8, Mask::causal());
    check_with("usp:2x2", 4, 4, 2, Mask::causal(), true);
}

fn count(text: &str, op: &str) -> usize {
    text.matches(&format!("\"stablehlo.{op}\"")).count()
}

/// `[all_to_all, all_gather, reduce_scatter, collective_permute]` counts of both programs.
fn collectives(strategy: &str, devices: usize) -> [[usize; 4]; 2] {
    let s = Strategy::parse(strategy, devices).unwrap();
    collectives_of(&config(s, devices, dims(8, 8, 512), Mask::causal(), 128))
}

fn collectives_of(cp: &ContextParallel) -> [[usize; 4]; 2] {
    let ops = [
        "all_to_all",
        "all_gather",
        "reduce_scatter",
        "collective_permute",
    ];
    [
        cp.forward_program(false),
        cp.forward_backward_program(false),
    ]
    .map(|p| {
        let text = p.unwrap().to_mlir();
        ops.map(|op| count(&text, op))
    })
}

#[test]
fn each_strategy_moves_data_with_its_own_collectives() {
    // The forward + backward programs run the forward's collectives, then the transposes of
    // those the gradient flows through.
    //
    // Ulysses: q, k, v in and out, lse back; then dout through the transpose of out's
    // all-to-all (lse's cotangent is 0: no all-to-all), dq, dk, dv back: 9 all-to-alls.
    assert_eq!(collectives("ulysses", 4), [[5, 0, 0, 0], [9, 0, 0, 0]]);
    // All-gather: K and V gathered; the backward reduce-scatters dK and dV (the gather's
    // transpose).
    assert_eq!(collectives("all-gather", 4), [[0, 2, 0, 0], [0, 2, 2, 0]]);
    // Load-balanced under a causal mask: each device's two parts of K and V gathered apart
    // (the halves of the sequence), the gathered K/V never reordered; the only reverses are
    // of `len`-row local values (a device's part 1 of K and V, the reversed call's queries,
    // out and lse: 5 in the forward). Under another mask the whole K/V are gathered.
    let mut balanced = config(
        Strategy::from(AllGather),
        4,
        dims(8, 8, 512),
        Mask::causal(),
        64,
    );
    balanced.load_balance = true;
    assert_eq!(collectives_of(&balanced), [[0, 4, 0, 0], [0, 4, 4, 0]]);
    let text = balanced.forward_program(false).unwrap().to_mlir();
    assert_eq!(count(&text, "reverse"), 5, "{text}");
    balanced.mask = Mask::local(100, 0);
    assert_eq!(collectives_of(&balanced), [[0, 2, 0, 0], [0, 2, 2, 0]]);
    // Ring on 4 devices: K and V move 3 times; the backward ring moves them 3 times again
    // and their dK/dV accumulators 4 times (one more, home).
    assert_eq!(collectives("ring", 4), [[0, 0, 0, 6], [0, 0, 0, 20]]);
    // USP 2x2: Ulysses all-to-alls over `ulysses`, permutes over `ring` (1 step of K/V); the
    // backward as Ulysses' and the ring's together (K/V once, dK/dV twice).
    assert_eq!(collectives("usp:2x2", 4), [[5, 0, 0, 2], [9, 0, 0, 8]]);
}

#[test]
fn segment_ids_are_gathered_as_int32() {
    let cp = config(
        Strategy::from(Ulysses),
        4,
        dims(8, 8, 512),
        Mask::causal(),
        128,
    );
    for program in [cp.forward_program(true), cp.forward_backward_program(true)] {
        let text = program.unwrap().to_mlir();
        let gathers: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("\"stablehlo.all_gather\""))
            .collect();
        assert_eq!(gathers.len(), 1, "{text}");
        assert!(gathers[0].contains("xi32>"), "{}", gathers[0]);
    }
}

#[test]
fn ulysses_holds_one_over_u_of_all_gathers_kv() {
    let stats = |strategy| {
        let cp = ContextParallel {
            dims: dims(32, 32, 4096),
            dtype: DType::BF16,
            mask: Mask::causal(),
            block_sizes: BlockSizes::uniform(256, 256),
            options: Default::default(),
            strategy,
            devices: 16,
            load_balance: false,
            lowering: Lowering::portable(),
        };
        cp.stats().unwrap()
    };
    let ulysses = stats(Strategy::from(Ulysses));
    let all_gather = stats(Strategy::from(AllGather));
    // 2 of 32 KV heads over the whole sequence against all 32.
    assert_eq!(ulysses.kv_heads_per_device, 2);
    assert_eq!(
        ulysses.kv_bytes_per_device * 16,
        all_gather.kv_bytes_per_device
    );
    assert_eq!(all_gather.kv_bytes_per_device, 32 * 4096 * 128 * 2);
    let ring = stats(Strategy::from(Ring));
    assert_eq!(ring.kv_len_per_device, 4096 / 16);
    // Every collective reports what it sends: Ulysses' forward all-to-all of q keeps 1/16.
    let q_bytes = 32 * (4096 / 16) * 64 * 2;
    assert_eq!(ulysses.forward[0].name, "all_to_all");
    assert_eq!(ulysses.forward[0].bytes_per_device, q_bytes * 15 / 16);
    assert_eq!(all_gather.forward[0].name, "all_gather");
    assert_eq!(all_gather.forward[0].bytes_per_device, q_bytes * 15);
}

#[test]
fn load_balancing_evens_out_causal_work() {
    for strategy in [Strategy::from(AllGather), Strategy::from(Ring)] {
        let mut cp = config(strategy.clone(), 4, dims(8, 8, 1024), Mask::causal(), 128);
        let plain = cp.stats().unwrap().blocks_per_device;
        // Device r's queries see (r + 1) of 4 quarters of the keys: 8 query blocks of 128
        // per head x 8 heads.
        assert!(
            plain.windows(2).all(|w| w[0] < w[1]),
            "{strategy}: {plain:?}"
        );
        cp.load_balance = true;
        let balanced = cp.stats().unwrap().blocks_per_device;
        assert!(
            balanced.iter().all(|&b| b == balanced[0]),
            "{strategy}: {balanced:?}"
        );
        // The same blocks in all, moved between devices.
        assert_eq!(
            balanced.iter().sum::<usize>(),
            plain.iter().sum::<usize>(),
            "{strategy}"
        );
        // Load balancing moves no other data: the same collectives and bytes, each as one
        // collective per chunk of a shard, of half the size (the ring sends a shard's two
        // chunks, and their dK/dV accumulators, as two permutes, so no step slices or
        // concatenates a whole shard; the all-gather gathers a shard's two chunks apart, the
        // two halves of the sequence, and reduce-scatters their dK/dV apart).
        let plain_cp = ContextParallel {
            load_balance: false,
            lowering: Lowering::portable(),
            ..cp.clone()
        };
        let per_chunk = 2;
        assert_eq!(
            collectives_of(&cp),
            collectives_of(&plain_cp).map(|ops| ops.map(|n| n * per_chunk)),
            "{strategy}"
        );
        let bytes = |cp: &ContextParallel| {
            let s = cp.stats().unwrap();
            [s.forward, s.forward_backward]
                .map(|c| c.iter().map(|c| c.bytes_per_device).sum::<usize>())
        };
        assert_eq!(bytes(&cp), bytes(&plain_cp), "{strategy}");
    }
}

#[test]
fn kv_replication_is_visible_in_the_stats() {
    let cp = config(
        Strategy::from(Ulysses),
        4,
        dims(8, 2, 512),
        Mask::causal(),
        128,
    );
    let s = cp.stats().unwrap();
    assert_eq!((s.kv_replication, s.kv_heads_per_device), (2, 1));
    assert!(s.to_string().contains("replicated 2x"), "{s}");
}

#[test]
fn invalid_configurations_are_named() {
    let cases: [(Strategy, usize, Dims, usize, &str); 7] = [
        (
            Strategy::from(Ulysses),
            4,
            dims(6, 6, 512),
            128,
            "ulysses: the 6 query heads are not divisible by the Ulysses degree 4",
        ),
        (Strategy::from(Ulysses), 4, dims(6, 3, 512), 128, "6 query heads"),
        (
            Strategy::from(Ulysses),
            8,
            dims(8, 3, 512),
            64,
            "the Ulysses degree 8 neither divides the 3 KV heads nor is a multiple of them",
        ),
        (
            Strategy::from(Ring),
            3,
            dims(8, 8, 512),
            128,
            "ring: the sequence length 512 is not divisible by the 3 sequence shards (the context degree 3)",
        ),
        (
            Strategy::from(Ring),
            8,
            dims(8, 8, 512),
            128,
            "ring: block_q = 128 does not divide the 64 queries each attention call holds (the sequence length 512 / 8 sequence shards)",
        ),
        (
            Strategy::from(AllGather),
            8,
            dims(8, 8, 512),
            128,
            "all-gather: block_q = 128 does not divide the 64 queries",
        ),
        (
            Strategy::from(Usp {
                ulysses: 2,
                ring: 2,
            }),
            8,
            dims(8, 8, 512),
            128,
            "usp:2x2 runs on 4 devices (the product of its degrees), but the context degree is 8",
        ),
    ];
    for (strategy, devices, d, block, message) in cases {
        let cp = config(strategy.clone(), devices, d, Mask::causal(), block);
        let e = cp.validate().unwrap_err().to_string();
        assert!(e.contains(message), "{strategy}: {e}");
        assert!(cp.forward_program(false).is_err());
    }
    let balanced = [
        (
            Strategy::from(Ulysses),
            dims(8, 8, 512),
            128,
            "load balancing (load_balance) balances the all-gather and ring strategies, not ulysses",
        ),
        (
            Strategy::from(Ring),
            dims(8, 8, 516),
            4,
            "the sequence length 516 is not divisible by the 8 sequence shards (the context degree 4 x 2 for load balancing (load_balance))",
        ),
        (
            Strategy::from(Ring),
            dims(8, 8, 512),
            128,
            "ring: block_q = 128 does not divide the 64 queries",
        ),
    ];
    for (strategy, d, block, message) in balanced {
        let mut cp = config(strategy.clone(), 4, d, Mask::causal(), block);
        cp.load_balance = true;
        let e = cp.validate().unwrap_err().to_string();
        assert!(e.contains(message), "{strategy}: {e}");
    }
}

#[test]
fn strategies_parse_in_both_spellings() {
    assert_eq!(
        Strategy::parse("all_gather", 4).unwrap(),
        Strategy::from(AllGather)
    );
    assert_eq!(
        Strategy::parse("all-gather", 4).unwrap(),
        Strategy::from(AllGather)
    );
    assert_eq!(
        Strategy::parse("usp", 8).unwrap(),
        Strategy::from(Usp {
            ulysses: 4,
            ring: 2
        })
    );
    assert_eq!(
        Strategy::parse("usp", 4).unwrap(),
        Strategy::from(Usp {
            ulysses: 2,
            ring: 2
        })
    );
    assert_eq!(
        Strategy::parse("usp:1x4", 4).unwrap(),
        Strategy::from(Usp {
            ulysses: 1,
            ring: 4
        })
    );
    for bad in ["rings", "usp:2", "usp:0x4", "usp:ax2"] {
        let e = Strategy::parse(bad, 4).unwrap_err().to_string();
        assert!(e.contains("usp:UxR"), "{bad}: {e}");
    }
}
