//! `tessera demo`: every registered kernel at each of its cases on each chosen backend
//! (default: interpret and cpu) against its f64 reference (a kernel on a device mesh on that
//! many interleaved interpreter devices or PJRT devices), then context-parallel splash
//! attention on 4 devices of each chosen PJRT backend against one device. A case needing more
//! devices than a GPU or TPU machine has is reported as skipped, with the count it needs.

use anyhow::{Context, Result};
use tessera::backend::{Backend, Platform};
use tessera::dsl::{DType, KernelRules, Lowering};
use tessera::reference::{max_abs_diff, random};
use tessera::registry::{self, Case, KernelInfo};

/// The devices a backend offers: as many as asked for on the interpreter and the CPU plugin
/// (virtual devices), the plugin's devices on a GPU or TPU machine.
fn devices_of(backend: Backend) -> Result<usize> {
    match backend {
        Backend::Interpret | Backend::Pjrt(Platform::Cpu) => Ok(usize::MAX),
        // The platform's own refusal (no plugin, no chips) names the backend and the fix.
        Backend::Pjrt(platform) => Ok(platform.client(1)?.devices().len()),
    }
}

/// The line of a case that does not run on `backend`: it needs more devices than there are.
fn skipped_line(name: &str, what: &str, backend: Backend, needed: usize, present: usize) {
    outln!(
        "{name:<18} {what:<40} {:<9} skipped: needs {needed} {backend} devices, {present} present",
        backend.name()
    );
}

/// One case of a registered kernel, run on each backend (with the devices each has); its max
/// error against the reference.
fn demo_case(
    info: &'static KernelInfo,
    case: &Case,
    backends: &[(Backend, usize)],
) -> Result<bool> {
    let name = info.name;
    let instance = info.instance(&case.given())?;
    let inputs = instance.inputs(1)?;
    let devices = instance.devices();
    let mut all_ok = true;
    for &(b, present) in backends {
        if devices > present {
            skipped_line(name, &instance.label(), b, devices, present);
            continue;
        }
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

/// The demo on `backends` (none: the backends every machine has). False when a result is off
/// its reference.
pub fn demo(backends: &[Backend]) -> Result<bool> {
    let asked: Vec<Backend> = if backends.is_empty() {
        Backend::everywhere().collect()
    } else {
        backends.to_vec()
    };
    let mut with_devices: Vec<(Backend, usize)> = Vec::new();
    for b in asked {
        if !with_devices.iter().any(|&(seen, _)| seen == b) {
            with_devices.push((b, devices_of(b)?));
        }
    }
    let mut all_ok = true;
    for info in registry::KERNELS {
        for case in info.cases {
            all_ok &= demo_case(info, case, &with_devices)?;
        }
    }
    for &(b, present) in &with_devices {
        if let Some(platform) = b.platform() {
            all_ok &= demo_context_parallel(platform, present)?;
        }
    }
    Ok(all_ok)
}

/// Splash attention with the sequence sharded over 4 devices of `platform` (`present` of them
/// exist), every strategy, forward and backward, against the same attention on one device.
fn demo_context_parallel(platform: Platform, present: usize) -> Result<bool> {
    use tessera::parallel::{ContextParallel, CpInputs, Strategy};
    use tessera::splash::{BlockSizes, Dims, Inputs, Mask, SplashAttention, SplashOptions};

    let (devices, seq) = (4, 1024);
    if present < devices {
        let what = "every strategy, H=8 KVH=4 S=1024 causal";
        skipped_line(
            "context_parallel",
            what,
            Backend::Pjrt(platform),
            devices,
            present,
        );
        return Ok(true);
    }
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
    let one_device = Backend::Pjrt(platform);
    let fwd = single.forward(&one_device, &x)?;
    let grads = single.backward(&one_device, &x, &fwd, &dout)?;
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
        let r = cp.forward_backward(platform, &x, &dout)?;
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
            format!("{platform} x{devices}"),
            elapsed.as_secs_f64() * 1e3,
            err,
            tol,
            if err <= tol { "ok" } else { "MISMATCH" }
        );
    }
    Ok(all_ok)
}
