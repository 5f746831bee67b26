//! The `tessera` command line: its clap types and commands. Part of the binary only, so the
//! library carries no CLI dependencies.

/// `print!` to stdout that ends the process quietly when stdout is closed (`tessera kernels |
/// head`) instead of panicking; see [`write_stdout`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` through [`out!`].
macro_rules! outln {
    () => {
        $crate::cli::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub mod attention;
pub mod bench;
mod bench_cp;
pub mod compile;
pub mod compile_train;
pub mod demo;
pub mod kernel;
mod outputs;
pub mod tpu_dump;
pub mod train_flags;
pub mod tune;

pub use train_flags::{load_balance_help, strategies_help};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use tessera::backend::Backend;
use tessera::dsl::{ArgSpec, DType, KernelRules};

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "A Pallas-like kernel DSL embedded in Rust"
)]
pub struct Cli {
    /// Let the XLA plugin's log lines (INFO, warnings) through to stderr; also
    /// TESSERA_VERBOSE=1.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// What `tessera ir` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// The verified kernel IR.
    Ir,
    /// The kernel lowered to a StableHLO module (MLIR text), as the XLA backends compile it.
    Stablehlo,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the built-in kernels and their parameters (compile-time ones and sizes).
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
        /// What to print: the kernel IR or its StableHLO module.
        #[arg(long, value_enum, default_value = "ir")]
        emit: Emit,
    },
    /// Run a built-in kernel on .npy inputs and write its outputs as .npy files.
    Run {
        /// Kernel name (see `tessera kernels`).
        kernel: String,
        /// A compile-time parameter, NAME=VALUE (repeatable). Sizes come from the inputs; a
        /// size parameter given must agree with them.
        #[arg(long = "param", short = 'p', value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Input .npy files, in argument order (float32 files are converted to the kernel's dtype).
        #[arg(long = "input", short = 'i', required = true)]
        inputs: Vec<std::path::PathBuf>,
        /// Output .npy files, in output order.
        #[arg(long = "output", short = 'o', required = true)]
        outputs: Vec<std::path::PathBuf>,
        /// Where to run: interpret, cpu (StableHLO on the XLA CPU plugin), gpu (a CUDA PJRT
        /// plugin named by TESSERA_GPU_PJRT_PLUGIN) or tpu (a chip of a TPU VM: the kernel as
        /// the Mosaic custom call `tessera compile kernel` compiles).
        #[arg(long, default_value = "interpret")]
        backend: Backend,
        /// Hardware rules to check: tpu (default) or portable.
        #[arg(long, default_value = "tpu")]
        rules: String,
    },
    /// Run every registered kernel on each backend and check it against its f64 reference,
    /// then context-parallel splash on 4 devices of each device backend that has them.
    Demo {
        /// A backend to run on (repeatable): interpret, cpu, gpu (the CUDA PJRT plugin named
        /// by TESSERA_GPU_PJRT_PLUGIN) or tpu. Default: interpret and cpu, the two every
        /// machine has.
        #[arg(long = "backend")]
        backends: Vec<Backend>,
    },
    /// Splash attention on .npy inputs: forward (out, lse) and, with --dout, gradients.
    Attention(Box<attention::AttentionArgs>),
    /// Compile for a TPU topology with the TPU compiler (libtpu, compile-only): splash
    /// attention or a registered kernel, as Mosaic custom calls. Prints one JSON line per
    /// compiled program.
    Compile(Box<compile::CompileArgs>),
    /// The cost of every Mosaic kernel in a directory of libtpu's dumps (a peer's compile,
    /// e.g. JAX's), read as `tessera compile` reads its own kernels.
    TpuDumpReport(tpu_dump::TpuDumpReportArgs),
    /// Block sizes chosen without hardware: every candidate the TPU rules allow compiled by
    /// libtpu and ranked by its cycles per TensorCore (splash attention, or a registered
    /// kernel's block parameters); cached per kernel, shape, dtype, chip and libtpu.
    Tune(Box<tune::TuneArgs>),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
}

/// Writes to stdout. A closed pipe ends the process with the status a Unix tool killed by
/// SIGPIPE has (141), silently, as `yes | head` does; another write error ends it with one
/// line and status 1. (Rust ignores SIGPIPE, so `println!` would panic instead.)
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// Reports a command-line error as one line (clap's message without its usage block) and
/// returns clap's exit code; help and version print as clap prints them.
pub fn report_parse_error(e: clap::Error) -> std::process::ExitCode {
    use clap::error::ErrorKind;
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        if let Some(text) = missing_subcommand(&e.render().to_string()) {
            eprint!("{text}");
            return std::process::ExitCode::from(code);
        }
    }
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        // Nothing useful can be done when printing help fails (a closed pipe).
        let _ = e.print();
        return std::process::ExitCode::from(code);
    }
    let text = e.render().to_string();
    let mut line = String::new();
    for part in text
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    eprintln!("{line} (see --help)");
    std::process::ExitCode::from(code)
}

/// For a command given without its subcommand (`tessera compile`), one sentence and the
/// subcommands, from the help clap would print: `error: tessera compile needs a subcommand:`
/// then one line per subcommand.
fn missing_subcommand(help: &str) -> Option<String> {
    let usage = help.lines().find_map(|l| l.strip_prefix("Usage: "))?;
    let command: Vec<&str> = usage
        .split_whitespace()
        .take_while(|w| !w.starts_with('[') && !w.starts_with('<'))
        .collect();
    let subcommands: Vec<&str> = help
        .lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.split_whitespace().next() != Some("help"))
        .collect();
    if subcommands.is_empty() {
        return None;
    }
    let mut text = format!(
        "error: `{}` needs a subcommand, one of (see --help):\n",
        command.join(" ")
    );
    for line in subcommands {
        text.push_str(line);
        text.push('\n');
    }
    Some(text)
}

/// A count or size that must be at least 1.
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(_) => Err(format!("expected a positive integer, got `{s}`")),
    }
}

/// A compute dtype (`f32` or `bf16`), as clap parses `--dtype`.
pub fn compute_dtype(s: &str) -> Result<DType, String> {
    DType::compute_from_name(s)
        .ok_or_else(|| format!("`{s}` is not a compute dtype; use f32 or bf16"))
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

pub fn rules(name: &str) -> Result<KernelRules> {
    match name {
        "tpu" => Ok(KernelRules::tpu()),
        "portable" => Ok(KernelRules::portable()),
        other => bail!("unknown rules `{other}`; expected tpu or portable"),
    }
}
