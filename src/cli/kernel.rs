//! `tessera kernels`, `tessera ir` and `tessera run`: the built-in kernels by name.

use anyhow::{anyhow, bail, Result};
use tessera::backend::{self, Backend};
use tessera::dsl::{ArgSpec, DType, HostArray};
use tessera::npy::{read_npy, write_npy};
use tessera::registry;

use super::rules;

pub fn list_kernels() {
    for k in registry::KERNELS {
        println!("{}  {}", k.name, k.summary);
        for p in k.params {
            println!("    {:<8} = {:<6} {}", p.name, p.default, p.help);
        }
    }
}

pub fn print_ir(
    kernel: &str,
    params: &[(String, String)],
    args: Vec<ArgSpec>,
    rules_name: &str,
) -> Result<()> {
    let info = registry::find(kernel).map_err(|e| anyhow!(e))?;
    let (def, default_args) = info.build(params).map_err(|e| anyhow!(e))?;
    let args = if args.is_empty() { default_args } else { args };
    let k = def.instantiate(&args, &rules(rules_name)?)?;
    print!("{k}");
    Ok(())
}

pub fn run_kernel(
    kernel: &str,
    params: &[(String, String)],
    inputs: &[std::path::PathBuf],
    outputs: &[std::path::PathBuf],
    backend: Backend,
    rules_name: &str,
) -> Result<()> {
    let info = registry::find(kernel).map_err(|e| anyhow!(e))?;
    let (def, _) = info.build(params).map_err(|e| anyhow!(e))?;
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
    let results = backend::run(&def, &args, backend, &rules(rules_name)?)?;
    if outputs.len() != results.len() {
        bail!(
            "`{kernel}` has {} outputs, got {} --output files",
            results.len(),
            outputs.len()
        );
    }
    for (path, a) in outputs.iter().zip(&results) {
        write_npy(path, a)?;
    }
    Ok(())
}
