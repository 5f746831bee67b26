//! Every example kernel gives the same results on the interpreter and on the PJRT CPU
//! backend (StableHLO through XLA), f32 and bf16, and both agree with the naive references.

mod common;

use common::{assert_close, attention_ref, matmul_ref, random, softmax_ref};
use tessera::backend::{run, Backend};
use tessera::dsl::{DType, HostArray, KernelDef, TargetRules};
use tessera::kernels::{flash_attention, matmul, row_softmax};

/// Runs `def` on every backend; checks each against `reference` within `tol` and the
/// backends against each other within `cross_tol`.
fn check_all(def: KernelDef, inputs: &[HostArray], reference: &[f64], tol: f64, cross_tol: f64) {
    let mut results = Vec::new();
    for backend in Backend::ALL {
        let out = run(&def, inputs, backend, &TargetRules::tpu())
            .unwrap_or_else(|e| panic!("{def:?} on {backend}: {e}"));
        let got = out[0].to_f64_vec();
        assert_close(&got, reference, tol, &format!("{def:?} on {backend}"));
        results.push((backend, got));
    }
    let (b0, first) = &results[0];
    for (b, other) in &results[1..] {
        assert_close(
            other,
            first,
            cross_tol,
            &format!("{def:?}: {b} against {b0}"),
        );
    }
}

#[test]
fn matmul_on_every_backend() {
    for (dtype, (m, k, n)) in [
        (DType::F32, (256, 384, 256)),
        (DType::BF16, (128, 256, 256)),
    ] {
        let (x, y) = (random(dtype, &[m, k], 1), random(dtype, &[k, n], 2));
        let want = matmul_ref(&x.to_f64_vec(), &y.to_f64_vec(), m, k, n);
        let defs = match dtype {
            DType::F32 => vec![
                matmul::<f32, 128, 128, 128>(),
                matmul::<f32, 64, 256, 384>(),
            ],
            _ => vec![
                matmul::<half::bf16, 16, 128, 256>(),
                matmul::<half::bf16, 128, 256, 128>(),
            ],
        };
        for def in defs {
            check_all(
                def,
                &[x.clone(), y.clone()],
                &want,
                1e-5 * k as f64,
                1e-5 * k as f64,
            );
        }
    }
}

#[test]
fn row_softmax_on_every_backend() {
    let x = random(DType::F32, &[64, 256], 3);
    let want = softmax_ref(&x.to_f64_vec(), 64, 256);
    check_all(
        row_softmax::<f32, 8>(),
        std::slice::from_ref(&x),
        &want,
        1e-6,
        1e-6,
    );
    check_all(
        row_softmax::<f32, 32>(),
        std::slice::from_ref(&x),
        &want,
        1e-6,
        1e-6,
    );
    let xb = random(DType::BF16, &[64, 128], 3);
    let want = softmax_ref(&xb.to_f64_vec(), 64, 128);
    // One bf16 rounding of the output; the backends may differ by one bf16 ulp.
    check_all(row_softmax::<half::bf16, 16>(), &[xb], &want, 2e-4, 1e-4);
}

#[test]
fn flash_attention_on_every_backend() {
    for causal in [false, true] {
        let (s, d) = (128, 64);
        let q = random(DType::F32, &[s, d], 4);
        let k = random(DType::F32, &[s, d], 5);
        let v = random(DType::F32, &[s, d], 6);
        let want = attention_ref(
            &q.to_f64_vec(),
            &k.to_f64_vec(),
            &v.to_f64_vec(),
            s,
            d,
            causal,
        );
        let args = [q, k, v];
        check_all(
            flash_attention::<f32, 32, 64>(causal),
            &args,
            &want,
            2e-6,
            2e-6,
        );
        check_all(
            flash_attention::<f32, 128, 32>(causal),
            &args,
            &want,
            2e-6,
            2e-6,
        );

        let qb = random(DType::BF16, &[s, d], 7);
        let kb = random(DType::BF16, &[s, d], 8);
        let vb = random(DType::BF16, &[s, d], 9);
        let want = attention_ref(
            &qb.to_f64_vec(),
            &kb.to_f64_vec(),
            &vb.to_f64_vec(),
            s,
            d,
            causal,
        );
        check_all(
            flash_attention::<half::bf16, 32, 32>(causal),
            &[qb, kb, vb],
            &want,
            2e-2,
            2e-2,
        );
    }
}
