//! The `tessera` command line: its clap types and commands. Part of the binary only, so the
//! library carries no CLI dependencies.

pub mod attention;
pub mod bench;
mod bench_cp;
pub mod compile;
pub mod demo;
pub mod kernel;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use tessera::backend::Backend;
use tessera::dsl::{ArgSpec, DType, TargetRules};

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "A Pallas-like kernel DSL embedded in Rust"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the built-in kernels and their compile-time parameters.
    Kernels,
    /// Print the IR of a built-in kernel instantiated with the given parameters.
    Ir {
        /// Kernel name (see `tessera kernels`).
        kernel: String,
        /// A compile-time parameter or default array size, NAME=VALUE (repeatable).
        #[arg(long = "param", short = 'p', value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Override an argument's type, e.g. `--arg f32[256,512]` (repeat in argument order).
        #[arg(long = "arg", value_parser = parse_arg)]
        args: Vec<ArgSpec>,
        /// Hardware rules to check: tpu (default) or portable.
        #[arg(long, default_value = "tpu")]
        rules: String,
    },
    /// Run a built-in kernel on .npy inputs and write its outputs as .npy files.
    Run {
        /// Kernel name (see `tessera kernels`).
        kernel: String,
        /// A compile-time parameter, NAME=VALUE (repeatable).
        #[arg(long = "param", short = 'p', value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Input .npy files, in argument order (float32 files are converted to the kernel's dtype).
        #[arg(long = "input", short = 'i', required = true)]
        inputs: Vec<std::path::PathBuf>,
        /// Output .npy files, in output order.
        #[arg(long = "output", short = 'o', required = true)]
        outputs: Vec<std::path::PathBuf>,
        /// Where to run: interpret, cpu (StableHLO on the XLA CPU plugin) or gpu.
        #[arg(long, default_value = "interpret")]
        backend: Backend,
        /// Hardware rules to check: tpu (default) or portable.
        #[arg(long, default_value = "tpu")]
        rules: String,
    },
    /// Run the example kernels on every backend and check them against naive f64 references.
    Demo,
    /// Splash attention on .npy inputs: forward (out, lse) and, with --dout, gradients.
    Attention(Box<attention::AttentionArgs>),
    /// Compile for a TPU topology with the TPU compiler (libtpu, compile-only): splash
    /// attention or a registered kernel, as Mosaic custom calls. Prints one JSON line per
    /// compiled program.
    Compile(Box<compile::CompileArgs>),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
}

pub fn parse_param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

pub fn parse_arg(s: &str) -> Result<ArgSpec, String> {
    let bad = || format!("expected DTYPE[D0,D1,...] such as f32[256,512], got `{s}`");
    let (dtype, rest) = s.split_once('[').ok_or_else(bad)?;
    let dims = rest.strip_suffix(']').ok_or_else(bad)?;
    let dtype = DType::from_name(dtype)
        .ok_or_else(|| format!("unknown dtype `{dtype}`; expected f32, bf16, i32, i8 or bool"))?;
    let shape = dims
        .split(',')
        .map(|d| d.trim().parse::<usize>().map_err(|_| bad()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ArgSpec::new(dtype, shape))
}

pub fn rules(name: &str) -> Result<TargetRules> {
    match name {
        "tpu" => Ok(TargetRules::tpu()),
        "portable" => Ok(TargetRules::portable()),
        other => bail!("unknown rules `{other}`; expected tpu or portable"),
    }
}
