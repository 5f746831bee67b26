//! Runs the fused RMSNorm on the interpreter and on the XLA CPU plugin against its f64
//! reference, then compiles it for a TPU v5p topology (libtpu, compile-only): prints one line
//! per backend and the compile report, and nothing else (the plugins' logs stay off unless
//! `TESSERA_VERBOSE=1`).

use rmsnorm::{rms_norm, rms_norm_ref};
use tessera::backend::{run, Backend};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelRules};
use tessera::reference::max_abs_diff;
use tessera::tpu::TpuTopology;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (rows, cols) = (256, 512);
    let x = HostArray::random(DType::F32, [rows, cols], 1);
    let weight = HostArray::random(DType::F32, [1, cols], 2);
    let want = rms_norm_ref(&x.to_f64_vec(), Some(&weight.to_f64_vec()), rows, cols);
    for backend in [Backend::Interpret, Backend::CPU] {
        let inputs = [x.clone(), weight.clone()];
        let out = run(&rms_norm::<f32, 8>(), &inputs, backend, &KernelRules::tpu())?;
        let (err, _) = max_abs_diff(&out[0].to_f64_vec(), &want);
        println!("{backend}: rms_norm {rows}x{cols} f32, max |error| {err:.1e}");
    }
    // One call: instantiate, lower to a Mosaic custom call, compile for the topology.
    let args = [ArgSpec::of(&x), ArgSpec::of(&weight)];
    let report =
        TpuTopology::parse("tpu:v5p:2x2x1")?.compile_kernel(&rms_norm::<f32, 8>(), &args)?;
    println!("{}", report.to_json());
    Ok(())
}
