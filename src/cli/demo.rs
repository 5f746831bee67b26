//! `tessera demo`: every registered kernel at each of its cases on every backend against its
//! f64 reference (a kernel on a device mesh on that many interleaved interpreter devices and
//! CPU devices), then context-parallel splash attention on 4 CPU devices against one device.

use anyhow::{Context, Result};
use tessera::backend::{Backend, Platform};
use tessera::dsl::{DType, KernelRules, Lowering};
use tessera::reference::{max_abs_diff, random};
use tessera::registry::{self, Case, KernelInfo};

/// One case of a registered kernel, run on every backend; its max error against the reference.
fn demo_case(info: &'static KernelInfo, case: &Case) -> Result<bool> {
    let name = info.name;
    let instance = info.instance(&case.given())?;
    let inputs = instance.inputs(1)?;
    let devices = instance.devices();
    let mut all_ok = true;
    for b in Backend::everywhere() {
        // The first run instantiates (and on `cpu` compiles) the kernel; time the second.
        instance
            .run(&inputs, b, &KernelRules::tpu())
            .with_context(|| format!("running {name} on {b}"))?;
        let start = std::time::Instant::now();
        let outputs = instance
            .run(&inputs, b, &KernelRules::tpu())
            .with_context(|| format!("running {name} on {b}"))?;
        let elapsed = start.elapsed();
        let err = instance.max_error(&inputs, &outputs)?;
        let ok = err <= case.tol;
        all_ok &= ok;
        outln!(
            "{:<18} {:<40} {:<9} {:>8.1} ms   max |err| {:.2e} (tol {:.0e})  {}",
            name,
            instance.label(),
            if devices > 1 {
                format!("{b} x{devices}")
            } else {
                b.name().to_string()
            },
            elapsed.as_secs_f64() * 1e3,
            err,
            case.tol,
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    Ok(all_ok)
}

pub fn demo() -> Result<bool> {
    let mut all_ok = true;
    for info in registry::KERNELS {
        for case in info.cases {
            all_ok &= demo_case(info, case)?;
        }
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
        KernelRules::tpu(),
    )?;
    let x = Inputs::new(&q, &k, &v);
    let fwd = single.forward(&Backend::CPU, &x)?;
    let grads = single.backward(&Backend::CPU, &x, &fwd, &dout)?;
    let want = [&fwd.out, &fwd.lse, &grads.dq, &grads.dk, &grads.dv];
    let mut all_ok = true;
    for strategy in Strategy::listed(devices) {
        let cp = ContextParallel {
            dims,
            dtype: DType::F32,
            mask: Mask::causal(),
            block_sizes: blocks,
            options: SplashOptions::default(),
            strategy,
            devices,
            load_balance: false,
            lowering: Lowering::portable(),
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
            "{:<18} {:<48} {:<9} {:>8.1} ms   max |err| {:.2e} (tol {:.0e})  {}",
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
