//! The StableHLO lowering vectorises leading parallel grid dims into batch dims where the
//! kernel allows, and the results stay identical to the interpreter's. One test per backend
//! (`tessera::test_device!`): the interpreter, cpu, and with their features gpu and tpu.

mod common;

use common::{assert_close, attention_ref, random};
use tessera::backend::{run, Backend};
use tessera::dsl::prelude::*;
use tessera::dsl::stablehlo::vectorised_dims;
use tessera::dsl::{ArgSpec, HostArray, KernelDef, KernelRules};

/// Multi-head flash attention: the head dim is squeezed, so heads vectorise.
#[tpu_kernel(grid = (H, S / BQ, S / BKV), dimension_semantics = (parallel, parallel, arbitrary))]
fn mha_flash<const BQ: usize, const BKV: usize>(
    #[shape(H, S, D)]
    #[block((None, BQ, D), |h, i, j| (h, i, 0))]
    q: Ref<f32>,
    #[shape(H, S, D)]
    #[block((None, BKV, D), |h, i, j| (h, j, 0))]
    k: Ref<f32>,
    #[shape(H, S, D)]
    #[block((None, BKV, D), |h, i, j| (h, j, 0))]
    v: Ref<f32>,
    #[shape(H, S, D)]
    #[block((None, BQ, D), |h, i, j| (h, i, 0))]
    out: RefMut<f32>,
    #[scratch(BQ, 1)] m: Scratch<f32>,
    #[scratch(BQ, 1)] l: Scratch<f32>,
    #[scratch(BQ, D)] acc: Scratch<f32>,
) {
    let (qi, kj) = (program_id(1), program_id(2));
    when(kj.eq(0), || {
        m.store(f32::NEG_INFINITY);
        l.store(0.0);
        acc.store(0.0);
    });
    let scale = 1.0 / (q.shape()[1] as f32).sqrt();
    when(
        (kj * BKV as i32).le(qi * BQ as i32 + (BQ as i32 - 1)),
        || {
            let s = dot_nt(q.load(), k.load()) * scale;
            let row = iota(DType::I32, &[BQ, BKV], 0) + qi * BQ as i32;
            let col = iota(DType::I32, &[BQ, BKV], 1) + kj * BKV as i32;
            let s = select(col.le(row), s, f32::NEG_INFINITY);
            let m_prev = m.load();
            let m_next = m_prev.maximum(s.max_keepdims(-1));
            let alpha = (m_prev - m_next).exp();
            let p = (s - m_next).exp();
            l.store(alpha * l.load() + p.sum_keepdims(-1));
            acc.store(acc.load() * alpha + dot(p, v.load()));
            m.store(m_next);
        },
    );
    when(kj.eq(num_programs(2) - 1), || {
        out.store(acc.load() / l.load())
    });
}

/// Per-head and per-row work that depends on the batched program id: a `when` on a batched
/// condition becomes a masked update; a run-time loop carries batched values.
#[tpu_kernel(grid = (H, R / 8), dimension_semantics = (parallel, parallel))]
fn head_dependent(
    #[shape(H, 1, R, 128)]
    #[block((None, None, 8, 128), |h, i| (h, 0, i, 0))]
    x: Ref<f32>,
    #[shape(H, 1, R, 128)]
    #[block((None, None, 8, 128), |h, i| (h, 0, i, 0))]
    out: RefMut<f32>,
) {
    let h = program_id(0).cast(DType::F32);
    let scaled = fori_loop(0, 3, x.load(), |_, acc| acc + h);
    out.store(scaled);
    when(program_id(0).eq(1), || out.store(-x.load()));
}

fn on(backend: Backend, def: &KernelDef, args: &[HostArray]) -> Vec<f64> {
    run(def, args, backend, &KernelRules::tpu()).unwrap_or_else(|e| panic!("{backend}: {e}"))[0]
        .to_f64_vec()
}

tessera::test_device!(heads_vectorise_and_match_the_interpreter_and_the_reference: interpret, cpu, gpu, tpu);

fn heads_vectorise_and_match_the_interpreter_and_the_reference(backend: Backend) {
    let (h, s, d) = (4, 128, 64);
    let def = mha_flash::<32, 32>();
    let args: Vec<HostArray> = (0..3).map(|i| random(DType::F32, &[h, s, d], i)).collect();
    let kernel = def
        .instantiate(
            &args.iter().map(ArgSpec::of).collect::<Vec<_>>(),
            &KernelRules::tpu(),
        )
        .unwrap();
    assert_eq!(
        vectorised_dims(&kernel),
        1,
        "the head dim vectorises, the q-block dim does not"
    );
    let got = on(backend, &def, &args);
    let interpreted = on(Backend::Interpret, &def, &args);
    assert_close(
        &got,
        &interpreted,
        2e-6,
        &format!("{backend} against interpret"),
    );
    let per_head = s * d;
    for head in 0..h {
        let slice = |a: &HostArray| a.to_f64_vec()[head * per_head..(head + 1) * per_head].to_vec();
        let want = attention_ref(
            &slice(&args[0]),
            &slice(&args[1]),
            &slice(&args[2]),
            s,
            d,
            true,
        );
        assert_close(
            &got[head * per_head..(head + 1) * per_head],
            &want,
            2e-6,
            &format!("{backend}, head {head}"),
        );
    }
}

tessera::test_device!(batched_conditions_and_loops_are_masked_per_element: interpret, cpu, gpu, tpu);

fn batched_conditions_and_loops_are_masked_per_element(backend: Backend) {
    let x = random(DType::F32, &[3, 1, 16, 128], 11);
    let def = head_dependent();
    let kernel = def
        .instantiate(&[ArgSpec::of(&x)], &KernelRules::tpu())
        .unwrap();
    assert_eq!(vectorised_dims(&kernel), 1);
    let xs = x.to_f64_vec();
    for (i, got) in on(backend, &def, &[x]).iter().enumerate() {
        let head = i / (16 * 128);
        // Three f32 additions of the head index, as the kernel computes them.
        let hf = head as f32;
        let want = if head == 1 {
            -xs[i]
        } else {
            f64::from(xs[i] as f32 + hf + hf + hf)
        };
        assert_eq!(*got, want, "{backend}, element {i}");
    }
}

#[test]
fn kernels_that_cannot_vectorise_keep_the_loop() {
    // Block size 8 on the leading parallel dim: heads are not whole blocks of one.
    let k = tessera::kernels::row_softmax::<f32, 8>()
        .instantiate(&[ArgSpec::new(DType::F32, [64, 128])], &KernelRules::tpu())
        .unwrap();
    assert_eq!(vectorised_dims(&k), 0);
}

/// Gathers blocks in the order of a scalar-prefetch table and sums row windows with a
/// run-time loop: SMEM-driven index maps and dynamic slices on every backend.
#[tpu_kernel(grid = (H, N), dimension_semantics = (parallel, arbitrary))]
fn gather_and_fold(
    #[shape(H, N)] order: Smem<i32>,
    #[shape(H, S, 128)]
    #[block((None, 64, 128), |h, j| (h, order.get([h, j]), 0))]
    x: Ref<f32>,
    #[shape(H, N * 8, 128)]
    #[block((None, 8, 128), |h, j| (h, j, 0))]
    out: RefMut<f32>,
) {
    let folded = fori_loop(0, 8, zeros(DType::F32, &[8, 128]), |g, acc| {
        acc + x.at(&[ds(g * 8, 8), all()]).load()
    });
    let first = order.get([program_id(0), program_id(1)]).cast(DType::F32);
    out.store(folded + first);
}

tessera::test_device!(scalar_prefetch_and_dynamic_windows_match_the_reference: interpret, cpu, gpu, tpu);

/// Against an f64 reference (each output row the sum of the 8 rows of its window, plus the
/// table entry) and, off the interpreter, the interpreter exactly.
fn scalar_prefetch_and_dynamic_windows_match_the_reference(backend: Backend) {
    let (h, n) = (2usize, 4usize);
    let order = HostArray::i32([h, n], vec![3, 1, 0, 2, 2, 2, 1, 0]).unwrap();
    let x = random(DType::F32, &[h, n * 64, 128], 5);
    let def = gather_and_fold();
    let kernel = def
        .instantiate(&[ArgSpec::of(&order), ArgSpec::of(&x)], &KernelRules::tpu())
        .unwrap();
    assert_eq!(
        vectorised_dims(&kernel),
        0,
        "the index map reads SMEM with the head index"
    );
    let (table, xs) = (order.to_f64_vec(), x.to_f64_vec());
    let want: Vec<f64> = (0..h * n * 8 * 128)
        .map(|e| {
            let (head, j, r, c) = (e / (n * 8 * 128), e / (8 * 128) % n, e / 128 % 8, e % 128);
            let block = table[head * n + j];
            let row0 = block as usize * 64 + r;
            let sum: f64 = (0..8)
                .map(|g| xs[(head * n * 64 + row0 + g * 8) * 128 + c])
                .sum();
            sum + block
        })
        .collect();
    let args = [order, x];
    let got = on(backend, &def, &args);
    assert_close(
        &got,
        &want,
        1e-5,
        &format!("{backend} against the reference"),
    );
    if backend != Backend::Interpret {
        assert_eq!(
            got,
            on(Backend::Interpret, &def, &args),
            "{backend} against interpret"
        );
    }
}
