//! `tessera kernels`, `tessera ir` and `tessera run`: the built-in kernels by name.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use tessera::backend::{self, Backend};
use tessera::dsl::{ArgSpec, DType, HostArray};
use tessera::npy::read_npy;
use tessera::registry;

use super::outputs::Outputs;
use super::{rules, Emit};

pub fn list_kernels() {
    for k in registry::KERNELS {
        let mesh = if k.on_mesh() {
            " [runs on a device mesh: each device its own arguments and outputs]"
        } else {
            ""
        };
        outln!("{}  {}{mesh}", k.name, k.summary);
        for p in k.params {
            outln!("    {:<10} = {:<7} {}", p.name, p.default, p.help);
        }
    }
}

pub fn print_ir(
    kernel: &str,
    params: &[(String, String)],
    args: Vec<ArgSpec>,
    rules_name: &str,
    emit: Emit,
) -> Result<()> {
    let instance = registry::find(kernel)?.instance(params)?;
    let args = if args.is_empty() {
        instance.args().to_vec()
    } else {
        args
    };
    let k = instance
        .def()
        .instantiate_on(&args, instance.mesh(), &rules(rules_name)?)?;
    match emit {
        Emit::Ir => out!("{k}"),
        // A kernel on a mesh: one partition per device, remote copies as collective_permutes.
        Emit::Stablehlo if k.num_devices() > 1 => out!(
            "{}",
            tessera::dsl::stablehlo::lower_module_spmd(&k)?.to_mlir()
        ),
        Emit::Stablehlo => out!("{}", tessera::dsl::stablehlo::lower_module(&k)?.to_mlir()),
    }
    Ok(())
}

/// Runs `tessera run`: reads the inputs, checks them (their sizes, and the values the kernel
/// indexes with where its entry has a run-time data check), the parameters and the output
/// paths against the kernel, then runs it; the outputs appear only when everything succeeded.
pub fn run_kernel(
    kernel: &str,
    params: &[(String, String)],
    inputs: &[PathBuf],
    outputs: &[PathBuf],
    backend: Backend,
    rules_name: &str,
) -> Result<()> {
    let info = registry::find(kernel)?;
    if info.on_mesh() {
        bail!(
            "`{kernel}` runs on a mesh of devices, each with its own arguments, and `tessera run` \
             takes one device's .npy inputs; run it with `tessera::backend::run_on_devices` \
             from Rust (`tessera demo` checks it on 4 CPU devices)"
        );
    }
    let (def, _) = info.build(params)?;
    if inputs.len() != def.args().len() {
        let names: Vec<&str> = def.args().iter().map(|a| a.name).collect();
        bail!(
            "`{kernel}` takes {} inputs ({}), got {}",
            names.len(),
            names.join(", "),
            inputs.len()
        );
    }
    let mut args = Vec::with_capacity(inputs.len());
    for (path, decl) in inputs.iter().zip(def.args()) {
        let a = read_npy(path)?;
        let a = if a.dtype() == decl.dtype {
            a
        } else if a.dtype() == DType::F32 && decl.dtype.is_float() {
            HostArray::from_f64(decl.dtype, a.shape().to_vec(), &a.to_f64_vec())?
        } else {
            bail!(
                "{}: `{}` takes {} but the file holds {}",
                path.display(),
                decl.name,
                decl.dtype,
                a.dtype()
            );
        };
        args.push(a);
    }
    let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
    info.check_sizes(params, &def, &specs)?;
    let k = def.instantiate(&specs, &rules(rules_name)?)?;
    // The values the kernel indexes with (paged attention's page table and lengths), checked
    // before any backend, so that a bad one is refused in the table's terms (the kernel's own
    // run-time checks would refuse it too, in the kernel's).
    let values: Vec<Option<&HostArray>> = args.iter().map(Some).collect();
    info.check_inputs(params, &specs, &values)?;
    let results = k.caller_outputs().count();
    if outputs.len() != results {
        bail!(
            "`{kernel}` has {results} output{}, got {} --output files",
            if results == 1 { "" } else { "s" },
            outputs.len()
        );
    }
    let output_files: Vec<(&str, &Path)> =
        outputs.iter().map(|p| ("--output", p.as_path())).collect();
    let input_labels: Vec<String> = def
        .args()
        .iter()
        .map(|a| format!("`{}` (--input)", a.name))
        .collect();
    let input_files: Vec<(&str, &Path)> = input_labels
        .iter()
        .zip(inputs)
        .map(|(label, p)| (label.as_str(), p.as_path()))
        .collect();
    let mut staged = Outputs::prepare(&output_files, &input_files)?;
    for (i, a) in backend::run_kernel(&k, &args, backend)?.iter().enumerate() {
        staged.write_npy(i, a)?;
    }
    staged.commit()
}
