//! The example kernels on the interpreter, against naive f64 references, for several block
//! sizes and dtypes, under TPU rules (and portable rules for blocks TPU would reject).

mod common;

use common::{assert_close, attention_ref, matmul_ref, random, softmax_ref};
use tessera::dsl::interpret::{run, InterpretOptions};
use tessera::dsl::{DType, KernelDef, KernelRules};
use tessera::kernels::{flash_attention, matmul, row_softmax};

fn tpu() -> InterpretOptions {
    InterpretOptions::default()
}

fn portable() -> InterpretOptions {
    InterpretOptions {
        rules: KernelRules::portable(),
        ..Default::default()
    }
}

fn check_matmul(
    def: KernelDef,
    dtype: DType,
    (m, k, n): (usize, usize, usize),
    opts: &InterpretOptions,
) {
    let x = random(dtype, &[m, k], 1);
    let y = random(dtype, &[k, n], 2);
    let out = run(&def, &[x.clone(), y.clone()], opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].shape(), &[m, n]);
    assert_eq!(out[0].dtype(), DType::F32);
    let want = matmul_ref(&x.to_f64_vec(), &y.to_f64_vec(), m, k, n);
    // f32 accumulation over k terms of magnitude <= 1.
    assert_close(
        &out[0].to_f64_vec(),
        &want,
        1e-5 * k as f64,
        &format!("{def:?}"),
    );
}

#[test]
fn matmul_f32_matches_naive_for_several_block_sizes() {
    check_matmul(
        matmul::<f32, 128, 128, 128>(),
        DType::F32,
        (256, 384, 256),
        &tpu(),
    );
    check_matmul(
        matmul::<f32, 8, 128, 256>(),
        DType::F32,
        (32, 512, 256),
        &tpu(),
    );
    check_matmul(
        matmul::<f32, 64, 256, 128>(),
        DType::F32,
        (128, 256, 512),
        &tpu(),
    );
    check_matmul(
        matmul::<f32, 8, 8, 8>(),
        DType::F32,
        (24, 40, 16),
        &portable(),
    );
    check_matmul(
        matmul::<f32, 16, 8, 4>(),
        DType::F32,
        (16, 12, 24),
        &portable(),
    );
}

#[test]
fn matmul_bf16_inputs_accumulate_in_f32() {
    check_matmul(
        matmul::<half::bf16, 16, 128, 128>(),
        DType::BF16,
        (64, 256, 128),
        &tpu(),
    );
    check_matmul(
        matmul::<half::bf16, 128, 128, 256>(),
        DType::BF16,
        (128, 512, 256),
        &tpu(),
    );
    check_matmul(
        matmul::<half::bf16, 8, 8, 8>(),
        DType::BF16,
        (16, 32, 8),
        &portable(),
    );
}

fn check_softmax(def: KernelDef, dtype: DType, rows: usize, cols: usize, tol: f64) {
    let x = random(dtype, &[rows, cols], 3);
    let out = run(&def, std::slice::from_ref(&x), &tpu()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].dtype(), dtype);
    let want = softmax_ref(&x.to_f64_vec(), rows, cols);
    assert_close(&out[0].to_f64_vec(), &want, tol, &format!("{def:?}"));
}

#[test]
fn row_softmax_matches_naive() {
    check_softmax(row_softmax::<f32, 8>(), DType::F32, 64, 128, 1e-6);
    check_softmax(row_softmax::<f32, 32>(), DType::F32, 64, 384, 1e-6);
    check_softmax(row_softmax::<f32, 16>(), DType::F32, 16, 200, 1e-6);
    // bf16 output: half an ulp of bf16 near 1/cols.
    check_softmax(row_softmax::<half::bf16, 16>(), DType::BF16, 64, 128, 2e-4);
}

fn check_flash(def: KernelDef, dtype: DType, s: usize, d: usize, causal: bool, tol: f64) {
    let q = random(dtype, &[s, d], 4);
    let k = random(dtype, &[s, d], 5);
    let v = random(dtype, &[s, d], 6);
    let out =
        run(&def, &[q.clone(), k.clone(), v.clone()], &tpu()).unwrap_or_else(|e| panic!("{e}"));
    let want = attention_ref(
        &q.to_f64_vec(),
        &k.to_f64_vec(),
        &v.to_f64_vec(),
        s,
        d,
        causal,
    );
    assert_close(
        &out[0].to_f64_vec(),
        &want,
        tol,
        &format!("{def:?} causal={causal}"),
    );
}

#[test]
fn flash_attention_matches_dense_reference() {
    for causal in [false, true] {
        check_flash(
            flash_attention::<f32, 8, 8>(causal),
            DType::F32,
            64,
            32,
            causal,
            2e-6,
        );
        check_flash(
            flash_attention::<f32, 16, 32>(causal),
            DType::F32,
            64,
            64,
            causal,
            2e-6,
        );
        check_flash(
            flash_attention::<f32, 32, 8>(causal),
            DType::F32,
            64,
            16,
            causal,
            2e-6,
        );
        check_flash(
            flash_attention::<f32, 64, 64>(causal),
            DType::F32,
            64,
            32,
            causal,
            2e-6,
        );
    }
}

#[test]
fn flash_attention_bf16() {
    for causal in [false, true] {
        // p is rounded to bf16 before the second matmul, as on TPU: ~3 significant digits.
        check_flash(
            flash_attention::<half::bf16, 16, 16>(causal),
            DType::BF16,
            64,
            32,
            causal,
            2e-2,
        );
        check_flash(
            flash_attention::<half::bf16, 32, 16>(causal),
            DType::BF16,
            64,
            128,
            causal,
            2e-2,
        );
    }
}

#[test]
fn results_do_not_depend_on_the_order_of_parallel_steps() {
    let q = random(DType::F32, &[64, 32], 7);
    let def = flash_attention::<f32, 8, 16>(true);
    let args = [q.clone(), q.clone(), q];
    let sequential = run(&def, &args, &tpu()).unwrap();
    for seed in 0..3 {
        let shuffled = run(&def, &args, &InterpretOptions::shuffled(seed)).unwrap();
        assert_eq!(shuffled, sequential, "seed {seed}");
    }
}
