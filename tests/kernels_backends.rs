//! Every registered kernel (`tessera::registry::KERNELS`), at each of its cases, on the
//! interpreter and on the PJRT CPU backend (StableHLO through XLA), against its f64
//! reference: adding a kernel to the registry adds it here. A kernel on a device mesh runs
//! on that many devices (interleaved interpreter instances; one SPMD program on as many CPU
//! devices) with each device's outputs checked.

use tessera::backend::Backend;
use tessera::dsl::KernelRules;
use tessera::registry::KERNELS;

/// Runs every case of every registered kernel on `backend`, checking each against its
/// reference; fails naming every case out of tolerance.
fn registered_kernels_on(backend: Backend) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for info in KERNELS {
        for case in info.cases {
            let instance = info
                .instance(&case.given())
                .unwrap_or_else(|e| panic!("{}: {e}", info.name));
            let what = format!(
                "{} {} on {backend} x{}",
                info.name,
                instance.label(),
                instance.devices()
            );
            let inputs = instance.inputs(1).unwrap_or_else(|e| panic!("{what}: {e}"));
            let outputs = match instance.run(&inputs, backend, &KernelRules::tpu()) {
                Ok(o) => o,
                Err(e) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
            };
            let err = instance
                .max_error(&inputs, &outputs)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            println!("{what}: max abs error {err:.1e} (tol {:.0e})", case.tol);
            if err.is_nan() || err > case.tol {
                failures.push(format!(
                    "{what}: max abs error {err:e} exceeds {:e}",
                    case.tol
                ));
            }
            checked += 1;
        }
    }
    println!("{checked} cases of {} kernels on {backend}", KERNELS.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn registered_kernels_on_interpret() {
    registered_kernels_on(Backend::Interpret);
}

#[test]
fn registered_kernels_on_cpu() {
    registered_kernels_on(Backend::Cpu);
}
