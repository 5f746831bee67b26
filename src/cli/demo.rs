//! `tessera demo`: every example kernel on every backend against naive f64 references, then
//! context-parallel splash attention on 4 CPU devices against one device.

use anyhow::{anyhow, Context, Result};
use tessera::backend::{self, Backend, Platform};
use tessera::dsl::{DType, HostArray, Target, TargetRules};
use tessera::reference::{attention_ref, matmul_ref, max_abs_diff, random, softmax_ref};
use tessera::registry;

/// One demo case: a kernel run on every backend, its max error against the reference.
fn demo_case(
    name: &str,
    params: &[(&str, &str)],
    check: impl Fn(&[HostArray], &HostArray) -> f64,
    tol: f64,
) -> Result<bool> {
    let info = registry::find(name).map_err(|e| anyhow!(e))?;
    let given: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (def, specs) = info.build(&given).map_err(|e| anyhow!(e))?;
    let inputs: Vec<HostArray> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| random(s.dtype, &s.shape, i as u64 + 1))
        .collect();
    let shown: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut all_ok = true;
    for b in Backend::ALL {
        // The first run instantiates (and on `cpu` compiles) the kernel; time the second.
        backend::run(&def, &inputs, b, &TargetRules::tpu())
            .with_context(|| format!("running {name} on {b}"))?;
        let start = std::time::Instant::now();
        let outputs = backend::run(&def, &inputs, b, &TargetRules::tpu())
            .with_context(|| format!("running {name} on {b}"))?;
        let elapsed = start.elapsed();
        let err = check(&inputs, &outputs[0]);
        let ok = err <= tol;
        all_ok &= ok;
        outln!(
            "{:<16} {:<40} {:<9} {:>8.1} ms   max |err| {:.2e} (tol {:.0e})  {}",
            name,
            shown.join(" "),
            b.name(),
            elapsed.as_secs_f64() * 1e3,
            err,
            tol,
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    Ok(all_ok)
}

pub fn demo() -> Result<bool> {
    let f64s = |a: &HostArray| a.to_f64_vec();
    let mut all_ok = true;
    for (dtype, tol) in [("f32", 1e-4), ("bf16", 1e-3)] {
        all_ok &= demo_case(
            "matmul",
            &[
                ("dtype", dtype),
                ("BM", "128"),
                ("BN", "128"),
                ("BK", "128"),
            ],
            |i, o| {
                let (m, k) = (i[0].shape()[0], i[0].shape()[1]);
                max_abs_diff(
                    &f64s(o),
                    &matmul_ref(&f64s(&i[0]), &f64s(&i[1]), m, k, i[1].shape()[1]),
                )
                .0
            },
            tol,
        )?;
    }
    for (dtype, br, tol) in [("f32", "8", 1e-6), ("bf16", "16", 4e-3)] {
        all_ok &= demo_case(
            "row_softmax",
            &[("dtype", dtype), ("BR", br)],
            |i, o| {
                let (r, c) = (i[0].shape()[0], i[0].shape()[1]);
                max_abs_diff(&f64s(o), &softmax_ref(&f64s(&i[0]), r, c)).0
            },
            tol,
        )?;
    }
    for causal in ["false", "true"] {
        all_ok &= demo_case(
            "flash_attention",
            &[
                ("BQ", "64"),
                ("BKV", "128"),
                ("causal", causal),
                ("S", "256"),
            ],
            |i, o| {
                let (s, d) = (i[0].shape()[0], i[0].shape()[1]);
                let want = attention_ref(
                    &f64s(&i[0]),
                    &f64s(&i[1]),
                    &f64s(&i[2]),
                    s,
                    d,
                    causal == "true",
                );
                max_abs_diff(&f64s(o), &want).0
            },
            1e-5,
        )?;
    }
    all_ok &= demo_context_parallel()?;
    Ok(all_ok)
}

/// Splash attention with the sequence sharded over 4 virtual CPU devices, every strategy,
/// forward and backward, against the same attention on one device.
fn demo_context_parallel() -> Result<bool> {
    use tessera::parallel::{ContextParallel, CpInputs, Strategy};
    use tessera::splash::{BlockSizes, Dims, Inputs, Mask, SplashAttention, SplashOptions};

    let (devices, seq) = (4, 1024);
    let dims = Dims {
        batch: 1,
        heads: 8,
        kv_heads: 4,
        q_len: seq,
        kv_len: seq,
        head_dim: 64,
        head_dim_v: 64,
    };
    let shapes = [
        [1, 8, seq, 64],
        [1, 4, seq, 64],
        [1, 4, seq, 64],
        [1, 8, seq, 64],
    ];
    let [q, k, v, dout] = shapes.map(|s| random(DType::F32, &s, 11));
    let blocks = BlockSizes::uniform(256, 256);
    let single = SplashAttention::new(
        Mask::causal(),
        dims,
        DType::F32,
        blocks,
        SplashOptions::default(),
        TargetRules::tpu(),
    )?;
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: None,
        sinks: None,
    };
    let fwd = single.forward(&Backend::Cpu, &x)?;
    let grads = single.backward(&Backend::Cpu, &x, &fwd, &dout)?;
    let want = [&fwd.out, &fwd.lse, &grads.dq, &grads.dk, &grads.dv];
    let mut all_ok = true;
    for strategy in ["ulysses", "all-gather", "ring", "usp"] {
        let cp = ContextParallel {
            dims,
            dtype: DType::F32,
            mask: Mask::causal(),
            block_sizes: blocks,
            options: SplashOptions::default(),
            strategy: Strategy::parse(strategy, devices)?,
            devices,
            load_balance: false,
            target: Target::portable(),
        };
        let start = std::time::Instant::now();
        let x = CpInputs {
            q: &q,
            k: &k,
            v: &v,
            segment_ids: None,
        };
        let r = cp.forward_backward(Platform::Cpu, &x, &dout)?;
        let elapsed = start.elapsed();
        let got = [&r.out, &r.lse, &r.dq, &r.dk, &r.dv];
        let err = got
            .iter()
            .zip(want)
            .map(|(g, w)| max_abs_diff(&g.to_f64_vec(), &w.to_f64_vec()).0)
            .fold(0.0, f64::max);
        let tol = 1e-4;
        all_ok &= err <= tol;
        outln!(
            "{:<16} {:<48} {:<9} {:>8.1} ms   max |err| {:.2e} (tol {:.0e})  {}",
            "context_parallel",
            format!("{} H=8 KVH=4 S={seq} causal, fwd+bwd+compile", cp.strategy),
            format!("cpu x{devices}"),
            elapsed.as_secs_f64() * 1e3,
            err,
            tol,
            if err <= tol { "ok" } else { "MISMATCH" }
        );
    }
    Ok(all_ok)
}
