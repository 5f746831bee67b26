//! The RMSNorm of this crate on the interpreter and the XLA CPU plugin against its f64
//! reference (f32 and bf16, with and without the optional weight), and the binary: it prints
//! its lines and the TPU compile report, and nothing on stderr, with neither the plugins' log
//! settings nor libtpu's compile-only environment set by the caller.

use rmsnorm::{rms_norm, rms_norm_ref};
use tessera::backend::{run, Backend};
use tessera::dsl::{DType, HostArray, KernelDef, KernelRules};
use tessera::reference::max_abs_diff;

fn check(def: KernelDef, dtype: DType, with_weight: bool, tol: f64) {
    let (rows, cols) = (64, 256);
    let x = HostArray::random(dtype, [rows, cols], 3);
    let weight = HostArray::random(dtype, [1, cols], 4);
    let (def, inputs, w) = if with_weight {
        (
            def,
            vec![x.clone(), weight.clone()],
            Some(weight.to_f64_vec()),
        )
    } else {
        (def.without("weight").unwrap(), vec![x.clone()], None)
    };
    let want = rms_norm_ref(&x.to_f64_vec(), w.as_deref(), rows, cols);
    for backend in [Backend::Interpret, Backend::CPU] {
        let out = run(&def, &inputs, backend, &KernelRules::tpu()).unwrap();
        assert_eq!(out[0].dtype(), dtype);
        let (err, at) = max_abs_diff(&out[0].to_f64_vec(), &want);
        assert!(
            err <= tol,
            "{dtype} weight {with_weight} on {backend}: error {err:e} at {at} exceeds {tol:e}"
        );
    }
}

#[test]
fn rms_norm_matches_the_reference_on_interpret_and_cpu() {
    for with_weight in [true, false] {
        check(rms_norm::<f32, 8>(), DType::F32, with_weight, 1e-5);
        // The output is rounded to bf16 (values up to ~4 with the weight).
        check(
            rms_norm::<tessera::prelude::bf16, 16>(),
            DType::BF16,
            with_weight,
            2e-2,
        );
    }
}

#[test]
fn the_binary_prints_only_its_results() {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rmsnorm"));
    for var in [
        "TF_CPP_MIN_LOG_LEVEL",
        "TESSERA_VERBOSE",
        "TPU_SKIP_MDS_QUERY",
        "ALLOW_MULTIPLE_LIBTPU_LOAD",
        "TPU_WORKER_HOSTNAMES",
        "TPU_ACCELERATOR_TYPE",
        "LIBTPU_INIT_ARGS",
    ] {
        command.env_remove(var);
    }
    let out = command.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stderr, "", "stderr holds more than the program printed");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (line, backend) in lines.iter().zip(["interpret", "cpu"]) {
        let err: f64 = line
            .strip_prefix(&format!("{backend}: rms_norm 256x512 f32, max |error| "))
            .unwrap_or_else(|| panic!("{line}"))
            .parse()
            .unwrap();
        assert!(err <= 1e-5, "{line}");
    }
    assert!(
        lines[2]
            .starts_with("{\"topology\":\"v5p:2x2x1\",\"devices\":1,\"kernels\":[\"rms_norm\"]"),
        "{}",
        lines[2]
    );
}
