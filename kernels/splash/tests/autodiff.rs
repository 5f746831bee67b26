//! Splash attention under reverse-mode autodiff: the forward is a custom-VJP unit whose rule
//! runs the backward kernels. On the XLA CPU plugin, the gradients `grad` gives match the
//! dense float64 reference, including a cotangent on the logsumexp (checked against central
//! differences of the f64 reference).

use std::collections::HashMap;

use tessera_dsl::{DType, HostArray, KernelRules};
use tessera_hlo::{Module, TensorType};
use tessera_runtime::{Client, CompileOptions};
use tessera_splash::reference::{self, RefInputs};
use tessera_splash::{
    lower_forward_on_shard, splash_program, BlockSizes, Dims, Features, Mask, Pass,
    SplashAttention, SplashOptions, Tensor,
};

fn dims() -> Dims {
    Dims {
        batch: 1,
        heads: 2,
        kv_heads: 1,
        q_len: 128,
        kv_len: 128,
        head_dim: 32,
        head_dim_v: 32,
    }
}

fn attention(mask: Mask, fused: bool) -> SplashAttention {
    let mut blocks = BlockSizes::uniform(64, 64);
    blocks.use_fused_bwd_kernel = fused;
    SplashAttention::new(
        mask,
        dims(),
        DType::F32,
        blocks,
        SplashOptions {
            soft_cap: Some(4.0),
            ..SplashOptions::default()
        },
        KernelRules::portable(),
    )
    .unwrap()
}

fn ref_inputs<'a>(
    attn: &SplashAttention,
    mask: &'a tessera_splash::MultiHeadMask,
    x: &'a [Vec<f64>; 3],
) -> RefInputs<'a> {
    RefInputs {
        soft_cap: Some(4.0),
        ..RefInputs::new(
            attn.dims(),
            (&x[0], &x[1], &x[2]),
            mask,
            f64::from(attn.scale()),
        )
    }
}

fn shapes() -> [Vec<usize>; 4] {
    let d = dims();
    [
        vec![d.batch, d.heads, d.q_len, d.head_dim],
        vec![d.batch, d.kv_heads, d.kv_len, d.head_dim],
        vec![d.batch, d.kv_heads, d.kv_len, d.head_dim_v],
        vec![d.batch, d.heads, d.q_len, d.head_dim_v],
    ]
}

/// `|got - want| <= tol * max |want|` everywhere.
fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: {g} vs {w} (scale {scale})"
        );
    }
}

#[test]
fn grad_of_the_forward_matches_the_f64_reference() {
    for (mask, fused) in [(Mask::causal(), false), (Mask::local(40, 0), true)] {
        let attn = attention(mask.clone(), fused);
        let m = splash_program(&attn, Pass::ForwardBackward, Features::default()).unwrap();
        let text = m.to_mlir();
        let [sq, sk, sv, so] = shapes();
        let q = HostArray::random(DType::F32, sq, 1);
        let k = HostArray::random(DType::F32, sk, 2);
        let v = HostArray::random(DType::F32, sv, 3);
        let dout = HostArray::random(DType::F32, so, 4);
        let exe = Client::cpu_shared(1)
            .unwrap()
            .compile(&text, &CompileOptions::single_device())
            .unwrap();
        let out = exe
            .execute_arrays(&[vec![q.clone(), k.clone(), v.clone(), dout.clone()]])
            .unwrap()
            .remove(0);
        let x = [q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec()];
        let mask = mask.into();
        let r = ref_inputs(&attn, &mask, &x);
        let want = reference::backward(&r, &dout.to_f64_vec());
        for (name, got, want) in [
            ("dq", &out[2], &want.dq),
            ("dk", &out[3], &want.dk),
            ("dv", &out[4], &want.dv),
        ] {
            assert_close(
                &got.to_f64_vec(),
                want,
                1e-3,
                &format!("fused {fused}: {name}"),
            );
        }
    }
}

#[test]
fn a_logsumexp_cotangent_enters_as_di_minus_dlse() {
    // L = <out, dout> + <lse, dlse>; its derivative along a random direction of q, k and v
    // against central differences of the f64 reference.
    let attn = attention(Mask::causal(), false);
    let d = attn.dims();
    let feats = Features::default();
    let mut m = Module::new("lse_cotangent");
    let mut f = m.func("main");
    let [sq, sk, sv, so] = shapes();
    let t =
        |s: &[usize]| TensorType::new(s.iter().map(|&x| x as i64).collect::<Vec<_>>(), DType::F32);
    let (q, k, v) = (
        f.arg(t(&sq)).unwrap(),
        f.arg(t(&sk)).unwrap(),
        f.arg(t(&sv)).unwrap(),
    );
    let mut env = HashMap::from([(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)]);
    lower_forward_on_shard(
        &mut f,
        &attn.forward_plan(feats),
        attn.backward_plan(feats),
        &mut env,
        None,
    )
    .unwrap();
    let dout = f.arg(t(&so)).unwrap();
    let dlse = f.arg(t(&[d.batch, d.heads, 1, d.q_len])).unwrap();
    let g = f
        .vjp(
            &[env[&Tensor::Out], env[&Tensor::Lse]],
            &[dout, dlse],
            &[q, k, v],
        )
        .unwrap();
    f.finish(&g).unwrap();

    let exe = Client::cpu_shared(1)
        .unwrap()
        .compile(&m.to_mlir(), &CompileOptions::single_device())
        .unwrap();
    let mask = Mask::causal().into();
    // With a random dout, and with dout = 0 (the lse term alone).
    for zero_dout in [false, true] {
        let dout = if zero_dout {
            HostArray::zeros(DType::F32, so.clone())
        } else {
            HostArray::random(DType::F32, so.clone(), 14)
        };
        let arrays = [
            HostArray::random(DType::F32, sq.clone(), 11),
            HostArray::random(DType::F32, sk.clone(), 12),
            HostArray::random(DType::F32, sv.clone(), 13),
            dout,
            HostArray::random(DType::F32, [d.batch, d.heads, 1, d.q_len], 15),
        ];
        let grads: Vec<Vec<f64>> = exe
            .execute_arrays(&[arrays.to_vec()])
            .unwrap()
            .remove(0)
            .iter()
            .map(HostArray::to_f64_vec)
            .collect();
        let x: [Vec<f64>; 3] = [0, 1, 2].map(|i| arrays[i].to_f64_vec());
        let (dout, dlse) = (arrays[3].to_f64_vec(), arrays[4].to_f64_vec());
        let dirs: [Vec<f64>; 3] = [0, 1, 2].map(|i| {
            HostArray::random(DType::F32, arrays[i].shape().to_vec(), 20 + i as u64).to_f64_vec()
        });
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
        let loss = |h: f64| {
            let y: [Vec<f64>; 3] =
                [0, 1, 2].map(|i| x[i].iter().zip(&dirs[i]).map(|(a, u)| a + h * u).collect());
            let fwd = reference::forward(&ref_inputs(&attn, &mask, &y));
            dot(&fwd.out, &dout) + dot(&fwd.lse, &dlse)
        };
        let h = 1e-4;
        let fd = (loss(h) - loss(-h)) / (2.0 * h);
        let analytic: f64 = (0..3).map(|i| dot(&grads[i], &dirs[i])).sum();
        let scale: f64 = (0..3)
            .map(|i| {
                grads[i]
                    .iter()
                    .zip(&dirs[i])
                    .map(|(g, u)| (g * u).abs())
                    .sum::<f64>()
            })
            .sum();
        let tol = 1e-6 * scale;
        println!("dout = 0: {zero_dout}: fd {fd}, vjp {analytic}, tolerance {tol}");
        assert!(
            (fd - analytic).abs() <= tol,
            "dout = 0: {zero_dout}: finite difference {fd} vs vjp {analytic} (scale {scale})"
        );
        if zero_dout {
            // Only the lse term: a rule that dropped it would give 0, far outside the
            // tolerance.
            assert!(fd.abs() > 50.0 * tol, "{fd} vs tolerance {tol}");
        }
    }
}
