//! The `tessera` command-line tool.

use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use tessera::backend::{self, Backend};
use tessera::dsl::{ArgSpec, DType, HostArray, TargetRules};
use tessera::npy::{read_npy, write_npy};
use tessera::reference::{attention_ref, matmul_ref, max_abs_diff, random, softmax_ref};
use tessera::registry;

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "A Pallas-like kernel DSL embedded in Rust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
    Attention(Box<tessera::attention::AttentionArgs>),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: tessera::attention::BenchCommand,
    },
}

fn parse_param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

fn parse_arg(s: &str) -> Result<ArgSpec, String> {
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

fn rules(name: &str) -> Result<TargetRules> {
    match name {
        "tpu" => Ok(TargetRules::tpu()),
        "portable" => Ok(TargetRules::portable()),
        other => bail!("unknown rules `{other}`; expected tpu or portable"),
    }
}

fn list_kernels() {
    for k in registry::KERNELS {
        println!("{}  {}", k.name, k.summary);
        for p in k.params {
            println!("    {:<8} = {:<6} {}", p.name, p.default, p.help);
        }
    }
}

fn print_ir(
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

fn run_kernel(
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

/// One demo case: a kernel run on every backend, its max error against the reference.
fn demo_case(
    name: &str,
    params: &[(&str, &str)],
    check: impl Fn(&[HostArray], &HostArray) -> f64,
    tol: f64,
) -> Result<bool> {
    let info = registry::find(name).map_err(|e| anyhow!(e))?;
    let given: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (def, specs) = info.build(&given).map_err(|e| anyhow!(e))?;
    let inputs: Vec<HostArray> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| random(s.dtype, &s.shape, i as u64 + 1))
        .collect();
    let shown: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut all_ok = true;
    for b in Backend::ALL {
        // The first run instantiates (and on `cpu` compiles) the kernel; time the second.
        backend::run(&def, &inputs, b, &TargetRules::tpu())
            .with_context(|| format!("running {name} on {b}"))?;
        let start = std::time::Instant::now();
        let outputs = backend::run(&def, &inputs, b, &TargetRules::tpu())
            .with_context(|| format!("running {name} on {b}"))?;
        let elapsed = start.elapsed();
        let err = check(&inputs, &outputs[0]);
        let ok = err <= tol;
        all_ok &= ok;
        println!(
            "{:<16} {:<40} {:<9} {:>8.1} ms   max |err| {:.2e} (tol {:.0e})  {}",
            name,
            shown.join(" "),
            b.name(),
            elapsed.as_secs_f64() * 1e3,
            err,
            tol,
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    Ok(all_ok)
}

fn demo() -> Result<bool> {
    let f64s = |a: &HostArray| a.to_f64_vec();
    let mut all_ok = true;
    for (dtype, tol) in [("f32", 1e-4), ("bf16", 1e-3)] {
        all_ok &= demo_case(
            "matmul",
            &[
                ("dtype", dtype),
                ("BM", "128"),
                ("BN", "128"),
                ("BK", "128"),
            ],
            |i, o| {
                let (m, k) = (i[0].shape()[0], i[0].shape()[1]);
                max_abs_diff(
                    &f64s(o),
                    &matmul_ref(&f64s(&i[0]), &f64s(&i[1]), m, k, i[1].shape()[1]),
                )
                .0
            },
            tol,
        )?;
    }
    for (dtype, br, tol) in [("f32", "8", 1e-6), ("bf16", "16", 4e-3)] {
        all_ok &= demo_case(
            "row_softmax",
            &[("dtype", dtype), ("BR", br)],
            |i, o| {
                let (r, c) = (i[0].shape()[0], i[0].shape()[1]);
                max_abs_diff(&f64s(o), &softmax_ref(&f64s(&i[0]), r, c)).0
            },
            tol,
        )?;
    }
    for causal in ["false", "true"] {
        all_ok &= demo_case(
            "flash_attention",
            &[
                ("BQ", "64"),
                ("BKV", "128"),
                ("causal", causal),
                ("S", "256"),
            ],
            |i, o| {
                let (s, d) = (i[0].shape()[0], i[0].shape()[1]);
                let want = attention_ref(
                    &f64s(&i[0]),
                    &f64s(&i[1]),
                    &f64s(&i[2]),
                    s,
                    d,
                    causal == "true",
                );
                max_abs_diff(&f64s(o), &want).0
            },
            1e-5,
        )?;
    }
    all_ok &= demo_context_parallel()?;
    Ok(all_ok)
}

/// Splash attention with the sequence sharded over 4 virtual CPU devices, every strategy,
/// forward and backward, against the same attention on one device.
fn demo_context_parallel() -> Result<bool> {
    use tessera::context_parallel::{ContextParallel, CpInputs, Strategy};
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
        TargetRules::tpu(),
    )?;
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: None,
        sinks: None,
    };
    let fwd = single.forward(&Backend::Cpu, &x)?;
    let grads = single.backward(&Backend::Cpu, &x, &fwd, &dout)?;
    let want = [&fwd.out, &fwd.lse, &grads.dq, &grads.dk, &grads.dv];
    let mut all_ok = true;
    for strategy in ["ulysses", "all-gather", "ring", "usp"] {
        let cp = ContextParallel {
            dims,
            dtype: DType::F32,
            mask: Mask::causal(),
            block_sizes: blocks,
            options: SplashOptions::default(),
            strategy: Strategy::parse(strategy, devices)?,
            devices,
            load_balance: false,
        };
        let start = std::time::Instant::now();
        let x = CpInputs {
            q: &q,
            k: &k,
            v: &v,
            segment_ids: None,
        };
        let (out, lse) = cp.forward(&x)?;
        let (dq, dk, dv) = cp.backward(&x, &out, &lse, &dout)?;
        let elapsed = start.elapsed();
        let got = [&out, &lse, &dq, &dk, &dv];
        let err = got
            .iter()
            .zip(want)
            .map(|(g, w)| max_abs_diff(&g.to_f64_vec(), &w.to_f64_vec()).0)
            .fold(0.0, f64::max);
        let tol = 1e-4;
        all_ok &= err <= tol;
        println!(
            "{:<16} {:<48} {:<9} {:>8.1} ms   max |err| {:.2e} (tol {:.0e})  {}",
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Kernels => {
            list_kernels();
            Ok(true)
        }
        Command::Ir {
            kernel,
            params,
            args,
            rules,
        } => print_ir(&kernel, &params, args, &rules).map(|()| true),
        Command::Run {
            kernel,
            params,
            inputs,
            outputs,
            backend,
            rules,
        } => run_kernel(&kernel, &params, &inputs, &outputs, backend, &rules).map(|()| true),
        Command::Demo => demo(),
        Command::Attention(args) => tessera::attention::attention_command(&args).map(|()| true),
        Command::Bench { what } => tessera::attention::bench(&what).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: some kernels disagree with their references");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
