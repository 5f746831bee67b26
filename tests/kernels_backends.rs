//! Every registered kernel (`tessera::registry::KERNELS`), at each of its cases, on the
//! interpreter and on the PJRT CPU backend (StableHLO through XLA), against its f64
//! reference: adding a kernel to the registry adds it here. A kernel on a device mesh runs
//! on that many devices (interleaved interpreter instances; one SPMD program on as many CPU
//! devices) with each device's outputs checked.

use tessera::backend::{Backend, Platform};
use tessera::dsl::KernelRules;
use tessera::registry::KERNELS;
use tessera::runtime::CompileOptions;

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
    registered_kernels_on(Backend::CPU);
}

/// XLA's own programs that `tessera bench kernels` times beside the kernels compute what the
/// kernels do: each against the kernel's f64 reference at every case, on as many CPU devices.
#[test]
fn xla_programs_match_the_references() {
    let mut checked = 0;
    for info in KERNELS {
        for case in info.cases {
            let instance = info.instance(&case.given()).unwrap();
            let Some(module) = instance.xla_program() else {
                continue;
            };
            let what = format!("xla {} {}", info.name, instance.label());
            let module = module.unwrap_or_else(|e| panic!("{what}: {e}"));
            let n = instance.devices();
            let client = Platform::Cpu.client(n).unwrap();
            let options = if n > 1 {
                CompileOptions::manual_partitions(n).unwrap()
            } else {
                CompileOptions::single_device()
            };
            let exe = client
                .compile(&module.to_mlir(), &options)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let inputs = instance.inputs(1).unwrap();
            let outputs = exe.execute_arrays(&inputs).unwrap();
            let err = instance.max_error(&inputs, &outputs).unwrap();
            println!("{what}: max abs error {err:.1e} (tol {:.0e})", case.tol);
            assert!(err <= case.tol, "{what}: max abs error {err:e}");
            checked += 1;
        }
    }
    assert!(checked > 0);
}
