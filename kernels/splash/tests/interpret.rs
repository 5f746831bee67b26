//! The splash kernels on the interpreter against the f64 reference (`tests/backends.rs` runs
//! the full matrix on the interpreter and the XLA CPU plugin).

use tessera_backend::Backend;
use tessera_dsl::{ArgSpec, DType, HostArray, KernelDef, KernelRules, Lowering};
use tessera_splash::reference::{self, RefInputs};
use tessera_splash::{
    BlockSizes, Dims, Executor, Inputs, Mask, MultiHeadMask, SegmentIds, SplashAttention,
    SplashError, SplashOptions,
};

fn random(shape: &[usize], seed: u64, scale: f32) -> HostArray {
    let mut rng = fastrand::Rng::with_seed(seed);
    let n: usize = shape.iter().product();
    let v = (0..n).map(|_| (rng.f32() * 2.0 - 1.0) * scale).collect();
    HostArray::f32(shape.to_vec(), v).unwrap()
}

fn max_err(got: &HostArray, want: &[f64]) -> f64 {
    got.to_f64_vec()
        .iter()
        .zip(want)
        .map(|(g, w)| if g == w { 0.0 } else { (g - w).abs() })
        .fold(
            0.0,
            |a: f64, b| if b.is_nan() { f64::INFINITY } else { a.max(b) },
        )
}

#[test]
fn forward_and_both_backwards_match_the_reference() {
    let dims = Dims {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        q_len: 128,
        kv_len: 128,
        head_dim: 64,
        head_dim_v: 64,
    };
    let mask = Mask::causal().and(Mask::local(50, 0));
    let seg: Vec<i32> = (0..128).map(|i| i32::from(i >= 90)).collect();
    let segs = HostArray::i32([1, 128], seg.clone()).unwrap();
    let options = SplashOptions {
        soft_cap: Some(3.0),
        ..SplashOptions::default()
    };
    let (q, k, v) = (
        random(&[1, 2, 128, 64], 1, 3.0),
        random(&[1, 1, 128, 64], 2, 1.0),
        random(&[1, 1, 128, 64], 3, 1.0),
    );
    let dout = random(&[1, 2, 128, 64], 4, 1.0);
    let x = Inputs {
        segment_ids: Some(SegmentIds {
            q: &segs,
            kv: &segs,
        }),
        ..Inputs::new(&q, &k, &v)
    };
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let heads: MultiHeadMask = mask.clone().into();
    for fused in [false, true] {
        let attn = SplashAttention::new(
            mask.clone(),
            dims,
            DType::F32,
            // 32-query blocks (four per row of the mask) tile lanes only off TPU.
            BlockSizes::uniform(32, 128).with_fused_bwd(fused),
            options,
            KernelRules::portable(),
        )
        .unwrap();
        let r = RefInputs {
            q_segment_ids: Some(&seg),
            kv_segment_ids: Some(&seg),
            soft_cap: Some(3.0),
            ..RefInputs::new(dims, (&qf, &kf, &vf), &heads, attn.scale() as f64)
        };
        let fwd = attn.forward(&Backend::Interpret, &x).unwrap();
        let want = reference::forward(&r);
        assert!(max_err(&fwd.out, &want.out) < 2e-4);
        assert!(max_err(&fwd.lse, &want.lse) < 2e-4);
        let g = attn.backward(&Backend::Interpret, &x, &fwd, &dout).unwrap();
        let rg = reference::backward(&r, &dout.to_f64_vec());
        for (got, want) in [(&g.dq, &rg.dq), (&g.dk, &rg.dk), (&g.dv, &rg.dv)] {
            let scale = want.iter().map(|x| x.abs()).fold(0.0, f64::max);
            assert!(max_err(got, want) / scale < 1e-3, "fused={fused}");
        }
    }
}

#[test]
fn bf16_inputs_and_traced_dead_paths() {
    // bf16 q, k, v (f32 accumulation, bf16 outputs and gradients), against the reference on
    // the bf16-rounded inputs; all kernel paths traced (as sequence shards need). The
    // kernels round `q * scale` to bf16: with the default scale (1/8 for D = 64, exact) and
    // with one that rounds (1/sqrt(128)).
    let dims = Dims {
        batch: 1,
        heads: 2,
        kv_heads: 2,
        q_len: 256,
        kv_len: 256,
        head_dim: 64,
        head_dim_v: 64,
    };
    let to_bf16 = |a: HostArray| {
        HostArray::from_f64(DType::BF16, a.shape().to_vec(), &a.to_f64_vec()).unwrap()
    };
    let (q, k, v) = (
        to_bf16(random(&[1, 2, 256, 64], 1, 3.0)),
        to_bf16(random(&[1, 2, 256, 64], 2, 1.0)),
        to_bf16(random(&[1, 2, 256, 64], 3, 1.0)),
    );
    let dout = to_bf16(random(&[1, 2, 256, 64], 4, 1.0));
    let x = Inputs::new(&q, &k, &v);
    for scale in [None, Some(1.0 / 128f32.sqrt())] {
        let options = SplashOptions {
            scale,
            trace_all_paths: true,
            ..SplashOptions::default()
        };
        let attn = SplashAttention::new(
            Mask::Full,
            dims,
            DType::BF16,
            BlockSizes::uniform(128, 128).with_fused_bwd(true),
            options,
            KernelRules::tpu(),
        )
        .unwrap();
        let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
        let heads: MultiHeadMask = Mask::Full.into();
        let r = RefInputs::new(dims, (&qf, &kf, &vf), &heads, attn.scale() as f64);
        let fwd = attn.forward(&Backend::Interpret, &x).unwrap();
        assert_eq!(fwd.out.dtype(), DType::BF16);
        let want = reference::forward(&r);
        let (out_err, lse_err) = (max_err(&fwd.out, &want.out), max_err(&fwd.lse, &want.lse));
        println!("scale {scale:?}: out error {out_err:e}, lse error {lse_err:e}");
        assert!(out_err < 2e-2, "scale {scale:?}: out error {out_err}");
        assert!(lse_err < 1e-3, "scale {scale:?}: lse error {lse_err}");
        // Without the residual the kernel rounds `q * scale` to bf16 instead of `k * scale`.
        let out = attn.inference(&Backend::Interpret, &x).unwrap();
        assert_eq!(out.dtype(), DType::BF16);
        let inference_err = max_err(&out, &want.out);
        println!("scale {scale:?}: inference out error {inference_err:e}");
        assert!(
            inference_err < 2e-2,
            "scale {scale:?}: inference error {inference_err}"
        );
        let g = attn.backward(&Backend::Interpret, &x, &fwd, &dout).unwrap();
        let rg = reference::backward(&r, &dout.to_f64_vec());
        for (name, got, want) in [
            ("dq", &g.dq, &rg.dq),
            ("dk", &g.dk, &rg.dk),
            ("dv", &g.dv, &rg.dv),
        ] {
            let top = want.iter().map(|x| x.abs()).fold(0.0, f64::max);
            let err = max_err(got, want) / top;
            println!("scale {scale:?}: {name} relative error {err:e}");
            assert!(err < 3e-2, "scale {scale:?}: {name} relative error {err}");
        }
    }
}

/// Runs on the interpreter and records the shape of the forward's running-max scratch.
#[derive(Default)]
struct ForwardScratch(std::cell::RefCell<Vec<Vec<usize>>>);

impl Executor for ForwardScratch {
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
            self.0
                .borrow_mut()
                .push(m.expect("the forward has m_scratch").array_shape.clone());
        }
        Backend::Interpret.run(def, args, rules)
    }
}

/// Kernels built as Mosaic calls keep the forward's running max and sum lane-replicated
/// (`[bq, 128]`, met by `repeat`s); inlined ones keep `[bq, 1]`. Both match the reference
/// on the interpreter (with sinks and segment ids, compute blocks half the key blocks).
#[test]
fn mosaic_plans_keep_the_running_max_lane_dense() {
    let dims = Dims {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        q_len: 256,
        kv_len: 256,
        head_dim: 128,
        head_dim_v: 128,
    };
    let seg: Vec<i32> = (0..256).map(|i| i32::from(i >= 150)).collect();
    let segs = HostArray::i32([1, 256], seg.clone()).unwrap();
    let sinks = HostArray::f32([2], vec![0.5, -1.0]).unwrap();
    let (q, k, v) = (
        random(&[1, 2, 256, 128], 1, 2.0),
        random(&[1, 1, 256, 128], 2, 1.0),
        random(&[1, 1, 256, 128], 3, 1.0),
    );
    let x = Inputs {
        segment_ids: Some(SegmentIds {
            q: &segs,
            kv: &segs,
        }),
        sinks: Some(&sinks),
        ..Inputs::new(&q, &k, &v)
    };
    let blocks = BlockSizes {
        block_kv_compute: 128,
        ..BlockSizes::uniform(128, 256)
    };
    let mask: MultiHeadMask = Mask::causal().into();
    let (qf, kf, vf, sf) = (
        q.to_f64_vec(),
        k.to_f64_vec(),
        v.to_f64_vec(),
        sinks.to_f64_vec(),
    );
    for (target, lanes) in [
        (Lowering::tpu(), 128),
        (Lowering::from(KernelRules::tpu()), 1),
    ] {
        let attn = SplashAttention::new(
            mask.clone(),
            dims,
            DType::F32,
            blocks,
            SplashOptions::default(),
            target,
        )
        .unwrap();
        let exec = ForwardScratch::default();
        let fwd = attn.forward(&exec, &x).unwrap();
        assert_eq!(exec.0.into_inner(), [vec![128, lanes]]);
        let want = reference::forward(&RefInputs {
            q_segment_ids: Some(&seg),
            kv_segment_ids: Some(&seg),
            sinks: Some(&sf),
            ..RefInputs::new(dims, (&qf, &kf, &vf), &mask, attn.scale() as f64)
        });
        assert!(max_err(&fwd.out, &want.out) < 1e-5, "{lanes} lanes: out");
        assert!(max_err(&fwd.lse, &want.lse) < 1e-5, "{lanes} lanes: lse");
        let out = attn.inference(&Backend::Interpret, &x).unwrap();
        assert!(
            max_err(&out, &want.out) < 1e-5,
            "{lanes} lanes: inference out"
        );
    }
}
