//! The Mosaic lowering checked by numbers, without a TPU: every registered kernel, and the
//! splash kernels over more configurations, is lowered to Mosaic, the emitted MLIR text is parsed and run by the test-only evaluator
//! (`tessera-mosaic-eval`, which never sees the kernel IR), and its outputs must equal the
//! interpreter's bit for bit. Both run the grid as a chip with two TensorCores does (megacore:
//! the leading parallel dims split between two cores, each with its own scratch) with the
//! check that refuses state carried across a parallel dim, so every registered kernel
//! (`tessera::registry::KERNELS`, all run here) passes it.

mod common;

mod repeat_kernels;
mod when_else_kernels;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelDef, KernelRules, Lowering};
use tessera::splash::{
    BlockSizes, Dims, Executor, Inputs, Mask, MultiHeadMask, SegmentIds, SeqOffsets,
    SplashAttention, SplashError, SplashOptions,
};
use tessera_mosaic_eval::RunOptions;

/// Runs `def` through Mosaic text and the evaluator (two cores, with the check).
fn run_mosaic(def: &KernelDef, args: &[HostArray], rules: &KernelRules) -> Vec<HostArray> {
    common::mosaic_eval(def, args, rules, &RunOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", def.name()))
}

/// The registered kernels (`tessera::registry::KERNELS`): the splash ones, or the others.
fn registered(splash: bool) -> BTreeSet<String> {
    tessera::registry::KERNELS
        .iter()
        .map(|k| k.name.to_string())
        .filter(|n| n.starts_with("splash_") == splash)
        .collect()
}

/// Bitwise equality of two outputs (NaN equal to NaN of the same bits); the number of
/// elements compared.
fn assert_same(what: &str, got: &HostArray, want: &HostArray) -> usize {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes differ");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtypes differ");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let differ: Vec<usize> = (0..g.len())
        .filter(|&i| g[i].to_bits() != w[i].to_bits() && !(g[i].is_nan() && w[i].is_nan()))
        .collect();
    if let Some(&i) = differ.first() {
        let max = differ
            .iter()
            .map(|&i| (g[i] - w[i]).abs())
            .fold(0.0, f64::max);
        panic!(
            "{what}: {} of {} elements differ from the interpreter (max abs diff {max:e}); first \
             at flat index {i}: mosaic {} vs interpreter {}",
            differ.len(),
            g.len(),
            g[i],
            w[i]
        );
    }
    g.len()
}

/// The interpreter on two cores (v4/v5p rules), with the parallel-state check.
fn megacore(rules: &KernelRules) -> InterpretOptions {
    InterpretOptions {
        rules: rules.clone(),
        megacore: Some(true),
        ..InterpretOptions::default()
    }
}

fn check(name: &str, def: KernelDef, args: &[HostArray]) -> usize {
    let want = interpret::run(&def, args, &megacore(&KernelRules::tpu()))
        .unwrap_or_else(|e| panic!("{e}"));
    let got = run_mosaic(&def, args, &KernelRules::tpu());
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(&want)
        .enumerate()
        .map(|(i, (g, w))| assert_same(&format!("{name} output {i}"), g, w))
        .sum()
}

fn random(dtype: DType, shape: &[usize], seed: u64) -> HostArray {
    HostArray::random(dtype, shape, seed)
}

/// Every registered kernel at each of its cases (`tessera::registry::KERNELS`): adding a
/// kernel to the registry adds it here. Every kernel runs on its devices (one, or its mesh's:
/// remote copies between interleaved devices) in both, each device on two cores with the
/// parallel-state check.
#[test]
fn registered_kernels_agree_with_the_interpreter() {
    let mut n = 0;
    for info in tessera::registry::KERNELS {
        for case in info.cases {
            let instance = info
                .instance(&case.given())
                .unwrap_or_else(|e| panic!("{}: {e}", info.name));
            let inputs = instance.inputs(1).unwrap_or_else(|e| panic!("{e}"));
            let what = format!("{} {}", info.name, instance.label());
            let k = instance
                .instantiate(&KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let want =
                interpret::run_kernel_on_devices(&k, &inputs, &megacore(&KernelRules::tpu()))
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = common::mosaic_eval_on_devices(&k, &inputs)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got.len(), want.len(), "{what}: devices");
            for (d, (got, want)) in got.iter().zip(&want).enumerate() {
                assert_eq!(got.len(), want.len(), "{what}: outputs");
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    n += assert_same(&format!("{what} device {d} output {i}"), g, w);
                }
            }
        }
    }
    println!("registered kernels: {n} output elements equal bit for bit");
}

/// `when_else` lowers to `scf.if .. else`, which the evaluator runs as the interpreter does.
#[test]
fn when_else_agrees_with_the_interpreter() {
    for (name, def, args, _) in when_else_kernels::cases() {
        check(name, def, &args);
    }
}

/// `repeat` lowers to `tpu.concatenate` of the copies, which the evaluator runs as the
/// interpreter does.
#[test]
fn repeat_agrees_with_the_interpreter() {
    for (name, def, args, _) in repeat_kernels::cases() {
        check(name, def, &args);
    }
}

/// Runs every kernel of a plan on the interpreter and through Mosaic, checks they agree and
/// counts what was compared per kernel.
#[derive(Default)]
struct BothAgree {
    compared: RefCell<BTreeMap<String, (usize, usize)>>,
    /// The shape of each forward's running-max scratch.
    fwd_running_max: RefCell<Vec<Vec<usize>>>,
}

impl Executor for BothAgree {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &KernelRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        if def.name() == "splash_fwd" {
            let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
            let k = def.instantiate(&specs, rules)?;
            let m = k.operands.iter().find(|o| o.name == "m_scratch");
            self.fwd_running_max
                .borrow_mut()
                .push(m.expect("the forward has m_scratch").array_shape.clone());
        }
        let want = interpret::run(def, args, &megacore(rules))?;
        let got = run_mosaic(def, args, rules);
        let mut n = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            n += assert_same(&format!("{} output {i}", def.name()), g, w);
        }
        let mut c = self.compared.borrow_mut();
        let e = c.entry(def.name().to_string()).or_default();
        e.0 += 1;
        e.1 += n;
        Ok(want)
    }
}

struct SplashCase {
    dtype: DType,
    dims: Dims,
    mask: MultiHeadMask,
    blocks: BlockSizes,
    options: SplashOptions,
    segmented: bool,
    sinks: bool,
}

fn dims(heads: usize, kv_heads: usize, seq: usize) -> Dims {
    Dims {
        batch: 1,
        heads,
        kv_heads,
        q_len: seq,
        kv_len: seq,
        head_dim: 64,
        head_dim_v: 64,
    }
}

fn run_splash(exec: &BothAgree, c: &SplashCase) {
    let attn = SplashAttention::new(
        c.mask.clone(),
        c.dims,
        c.dtype,
        c.blocks,
        c.options,
        KernelRules::tpu(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d = c.dims;
    let q = random(c.dtype, &[d.batch, d.heads, d.q_len, d.head_dim], 1);
    let k = random(c.dtype, &[d.batch, d.kv_heads, d.kv_len, d.head_dim], 2);
    let v = random(c.dtype, &[d.batch, d.kv_heads, d.kv_len, d.head_dim_v], 3);
    let dout = random(c.dtype, &[d.batch, d.heads, d.q_len, d.head_dim_v], 4);
    let seg = HostArray::i32(
        [d.batch, d.q_len],
        (0..d.q_len as i32)
            .map(|i| i32::from(i >= 100) + i32::from(i >= 200))
            .collect(),
    )
    .unwrap();
    let sinks = HostArray::f32(
        [d.heads],
        (0..d.heads).map(|h| h as f32 * 0.5 - 0.25).collect(),
    )
    .unwrap();
    let x = Inputs {
        segment_ids: c.segmented.then_some(SegmentIds { q: &seg, kv: &seg }),
        sinks: c.sinks.then_some(&sinks),
        ..Inputs::new(&q, &k, &v)
    };
    let fwd = attn.forward(exec, &x).unwrap_or_else(|e| panic!("{e}"));
    attn.backward(exec, &x, &fwd, &dout)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn splash_kernels_agree_with_the_interpreter() {
    let exec = BothAgree::default();
    let dense = tessera::splash::DenseMask::from_fn(256, 256, |q, kv| {
        (q + 2 * kv) % 7 != 0 && kv <= q + 40
    });
    let cases = [
        // Causal, separate backward kernels, f32 and bf16.
        SplashCase {
            dtype: DType::F32,
            dims: dims(2, 2, 256),
            mask: Mask::causal().into(),
            blocks: BlockSizes::uniform(128, 128),
            options: SplashOptions::default(),
            segmented: false,
            sinks: false,
        },
        SplashCase {
            dtype: DType::BF16,
            dims: dims(2, 1, 256),
            mask: Mask::causal().into(),
            blocks: BlockSizes::uniform(128, 128),
            options: SplashOptions::default(),
            segmented: false,
            sinks: false,
        },
        // Local window with segment ids, fused backward, compute blocks smaller than the
        // key blocks (sliced loads), soft cap and sinks.
        SplashCase {
            dtype: DType::BF16,
            dims: dims(2, 2, 256),
            mask: Mask::local(60, 10).into(),
            blocks: BlockSizes {
                block_kv_compute: 128,
                block_kv_dkv_compute: 128,
                ..BlockSizes::uniform(128, 256)
            }
            .with_fused_bwd(true),
            options: SplashOptions {
                soft_cap: Some(5.0),
                ..SplashOptions::default()
            },
            segmented: true,
            sinks: true,
        },
        // Per-head masks (computed, with a head-class table) and a dense mask (stored int8
        // partial blocks), GQA.
        SplashCase {
            dtype: DType::F32,
            dims: dims(4, 2, 256),
            mask: MultiHeadMask::PerHead(vec![
                Mask::causal(),
                Mask::chunked(64),
                Mask::local(30, 30),
                Mask::causal().or(Mask::local(0, 20)),
            ]),
            blocks: BlockSizes::uniform(128, 128).with_fused_bwd(true),
            options: SplashOptions::default(),
            segmented: false,
            sinks: false,
        },
        // A one-sided window at a query offset (`kv >= q + 64`: the balanced all-gather's
        // call on the reversed second half), segment ids, bf16.
        SplashCase {
            dtype: DType::BF16,
            dims: dims(2, 2, 256),
            mask: Mask::Local {
                left: Some(0),
                right: None,
                offset: 0,
            }
            .into(),
            blocks: BlockSizes::uniform(128, 128),
            options: SplashOptions {
                offsets: SeqOffsets { q: 64, kv: 0 },
                ..SplashOptions::default()
            },
            segmented: true,
            sinks: false,
        },
        // Fused backward over 4 key blocks: block 3 adds to the dQ partial block 0 wrote,
        // read back through the alias.
        SplashCase {
            dtype: DType::BF16,
            dims: dims(2, 1, 512),
            mask: Mask::causal().into(),
            blocks: BlockSizes::uniform(128, 128).with_fused_bwd(true),
            options: SplashOptions::default(),
            segmented: false,
            sinks: false,
        },
        SplashCase {
            dtype: DType::F32,
            dims: dims(2, 2, 256),
            mask: Mask::Dense(dense).into(),
            // dQ computing half its key block at a time (sliced stored mask blocks and key
            // segment ids, keys-by-queries tiles).
            blocks: BlockSizes {
                block_kv_dq_compute: Some(128),
                ..BlockSizes::uniform(128, 256)
            },
            options: SplashOptions::default(),
            segmented: true,
            sinks: false,
        },
    ];
    for c in &cases {
        run_splash(&exec, c);
    }
    let compared = exec.compared.into_inner();
    for (name, (runs, n)) in &compared {
        println!("{name}: {runs} runs, {n} output elements equal bit for bit");
    }
    let ran: BTreeSet<String> = compared.keys().cloned().collect();
    assert_eq!(ran, registered(true), "the registered splash kernels");
}

/// The forward of a plan built as Mosaic calls (`Lowering::tpu()`, D = 128) holds its running
/// max and sum lane-replicated (`[bq, 128]` scratch met by `repeat`s, lse from lane 0): the
/// Mosaic text agrees with the interpreter bit for bit and both match the f64 reference, with
/// and without sinks and segment ids, with compute blocks half the key blocks, and with the
/// diagonal block by 128-row sub-tiles (the one above the diagonal skipped).
#[test]
fn lane_dense_splash_forward_matches_f64() {
    let dims = Dims {
        head_dim: 128,
        head_dim_v: 128,
        ..dims(2, 1, 256)
    };
    let seg: Vec<i32> = (0..256).map(|i| i32::from(i >= 100)).collect();
    let segs = HostArray::i32([1, 256], seg.clone()).unwrap();
    let sinks = HostArray::f32([2], vec![0.25, -0.75]).unwrap();
    let q = random(DType::F32, &[1, 2, 256, 128], 1);
    let k = random(DType::F32, &[1, 1, 256, 128], 2);
    let v = random(DType::F32, &[1, 1, 256, 128], 3);
    let (qf, kf, vf, sf) = (
        q.to_f64_vec(),
        k.to_f64_vec(),
        v.to_f64_vec(),
        sinks.to_f64_vec(),
    );
    let split = BlockSizes {
        block_kv_compute: 128,
        ..BlockSizes::uniform(128, 256)
    };
    let mask: MultiHeadMask = Mask::causal().into();
    // Causal f32 splash on these dims, planned for the TPU (Mosaic) lowering.
    let tpu_plan = |blocks| {
        SplashAttention::new(
            mask.clone(),
            dims,
            DType::F32,
            blocks,
            SplashOptions::default(),
            Lowering::tpu(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let diagonal = BlockSizes {
        block_diagonal: Some(128),
        ..BlockSizes::uniform(256, 256)
    };
    for (blocks, extras) in [
        (BlockSizes::uniform(128, 128), false),
        (split, true),
        (diagonal, true),
    ] {
        let attn = tpu_plan(blocks);
        let sub_tiles = attn.fwd_mask_info().diagonal_sub_tiles;
        assert_eq!(
            sub_tiles, blocks.block_diagonal,
            "the diagonal path is used"
        );
        let x = Inputs {
            segment_ids: extras.then_some(SegmentIds {
                q: &segs,
                kv: &segs,
            }),
            sinks: extras.then_some(&sinks),
            ..Inputs::new(&q, &k, &v)
        };
        let exec = BothAgree::default();
        let fwd = attn.forward(&exec, &x).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exec.compared.borrow()["splash_fwd"].0, 1);
        assert_eq!(
            exec.fwd_running_max.into_inner(),
            [vec![blocks.block_q, 128]],
            "a lane-replicated running max"
        );
        let want = tessera::splash::reference::forward(&tessera::splash::reference::RefInputs {
            q_segment_ids: extras.then_some(&seg[..]),
            kv_segment_ids: extras.then_some(&seg[..]),
            sinks: extras.then_some(&sf[..]),
            ..tessera::splash::reference::RefInputs::new(
                dims,
                (&qf, &kf, &vf),
                &mask,
                attn.scale() as f64,
            )
        });
        common::assert_close(&fwd.out.to_f64_vec(), &want.out, 1e-5, "out");
        common::assert_close(&fwd.lse.to_f64_vec(), &want.lse, 1e-5, "lse");
    }

    // Queries of segment 1 see no key (every key is segment 0): their lse is -inf, carried
    // through the finalize's lane-0 row (a one-hot matmul) without turning into NaN.
    let kv_seg = HostArray::i32([1, 256], vec![0; 256]).unwrap();
    let attn = tpu_plan(BlockSizes::uniform(128, 128));
    let x = Inputs {
        segment_ids: Some(SegmentIds {
            q: &segs,
            kv: &kv_seg,
        }),
        ..Inputs::new(&q, &k, &v)
    };
    let fwd = attn
        .forward(&BothAgree::default(), &x)
        .unwrap_or_else(|e| panic!("{e}"));
    let lse = fwd.lse.to_f64_vec();
    for (row, &l) in lse.iter().enumerate() {
        let pos = row % 256;
        if pos >= 100 {
            assert_eq!(l, f64::NEG_INFINITY, "row {row} sees no key");
        } else {
            assert!(l.is_finite(), "row {row}: {l}");
        }
    }
    let out = fwd.out.to_f64_vec();
    assert!(out[100 * 128..256 * 128].iter().all(|&o| o == 0.0));
}

/// The backward planned for Mosaic (D = 128) where queries 0..40 see no key (causal, offset
/// -40): their lse is -inf, which the dQ and dK/dV kernels meet in every masked tile (hidden
/// logits become -inf before the exponential, lse -inf counts as +inf). Separate and fused
/// kernels agree with the interpreter bit for bit and with the f64 reference; those rows'
/// dQ is exactly 0.
#[test]
fn splash_backward_rows_without_keys_match_f64() {
    let dims = Dims {
        head_dim: 128,
        head_dim_v: 128,
        ..dims(2, 1, 256)
    };
    let mask: MultiHeadMask = Mask::Causal { offset: -40 }.into();
    let q = random(DType::F32, &[1, 2, 256, 128], 1);
    let k = random(DType::F32, &[1, 1, 256, 128], 2);
    let v = random(DType::F32, &[1, 1, 256, 128], 3);
    let dout = random(DType::F32, &[1, 2, 256, 128], 4);
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    for fused in [false, true] {
        let attn = SplashAttention::new(
            mask.clone(),
            dims,
            DType::F32,
            BlockSizes::uniform(128, 128).with_fused_bwd(fused),
            SplashOptions::default(),
            Lowering::tpu(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let x = Inputs::new(&q, &k, &v);
        let exec = BothAgree::default();
        let fwd = attn.forward(&exec, &x).unwrap_or_else(|e| panic!("{e}"));
        let grads = attn
            .backward(&exec, &x, &fwd, &dout)
            .unwrap_or_else(|e| panic!("{e}"));
        let want = tessera::splash::reference::backward(
            &tessera::splash::reference::RefInputs::new(
                dims,
                (&qf, &kf, &vf),
                &mask,
                attn.scale() as f64,
            ),
            &dout.to_f64_vec(),
        );
        let dq = grads.dq.to_f64_vec();
        common::assert_close(&dq, &want.dq, 1e-4, "dq");
        common::assert_close(&grads.dk.to_f64_vec(), &want.dk, 1e-4, "dk");
        common::assert_close(&grads.dv.to_f64_vec(), &want.dv, 1e-4, "dv");
        for h in 0..2 {
            let rows = &dq[h * 256 * 128..(h * 256 + 40) * 128];
            assert!(
                rows.iter().all(|&g| g == 0.0),
                "head {h}: rows without keys"
            );
        }
    }
}
