//! The main job: train a small Llama-style model with context-parallel splash attention,
//! MaxText style, on virtual CPU devices (`--backend cpu`, the default), GPUs (`gpu`) or the
//! chips of a TPU VM (`tpu`: the step `tessera compile train` compiles, its kernels Mosaic
//! custom calls).
//!
//! ```sh
//! cargo run --release --example train                       # tiny, 4 devices, Ulysses
//! cargo run --release --example train -- --context-parallel-strategy ring --steps 50
//! cargo run --release --example train -- --model small --steps 3 --bench
//! ```
//!
//! Per step it prints loss, step time, tokens/s, model TFLOP/s per device and MFU against a
//! peak (`--peak-tflops` per device; on cpu by default the machine's measured f32 matmul peak
//! shared by the devices, elsewhere no MFU without it); `--log-json PATH` writes one JSON
//! object per step, and the loss curve is drawn as an SVG beside the log at the end.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use tessera::backend::{Backend, Platform};
use tessera_train::data::ENTROPY_NATS;
use tessera_train::flops::{matmul_peak, model_flops_per_step};
use tessera_train::{StepMetrics, TrainConfig, Trainer};

#[path = "../src/cli/train_flags.rs"]
mod train_flags;
use train_flags::{flag_error, ModelFlags, StepFlags};

/// Train a small Llama-style model with context-parallel splash attention (MaxText's flags).
#[derive(Parser, Debug)]
#[command(name = "train")]
struct Args {
    /// Where the step runs: cpu (the XLA CPU plugin's virtual devices), gpu (a CUDA PJRT
    /// plugin named by TESSERA_GPU_PJRT_PLUGIN) or tpu (the chips of a TPU VM).
    #[arg(long, default_value = "cpu")]
    backend: Backend,
    #[command(flatten)]
    model: ModelFlags,
    /// Training steps (the cosine schedule ends here).
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Stop after this many steps (the schedule still spans --steps): with --save, a
    /// checkpoint to --resume from.
    #[arg(long)]
    stop_at: Option<usize>,
    #[command(flatten)]
    step: StepFlags,
    /// Peak learning rate (after warmup; cosine to a tenth of it at --steps).
    #[arg(long, default_value_t = 3e-3)]
    learning_rate: f64,
    #[arg(long, default_value_t = 10)]
    warmup_steps: usize,
    /// Seed of the initialisation and the synthetic data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write one JSON object per step to PATH (and the loss curve to PATH with .svg).
    #[arg(long)]
    log_json: Option<PathBuf>,
    /// Where the loss-curve SVG goes (default: beside --log-json, else train_loss.svg).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Save parameters, AdamW moments and the step (safetensors) at the end.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Continue the run saved at PATH (same model, --seed and --steps).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Peak TFLOP/s of one device for MFU (default on cpu: the measured f32 matmul peak of
    /// this machine divided among the devices; on gpu and tpu no MFU without it).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// After training, time the step's parts (forward, backward, optimizer, collectives).
    #[arg(long)]
    bench: bool,
    /// Print the train step's StableHLO to PATH.
    #[arg(long)]
    dump_hlo: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn config(a: &Args) -> Result<TrainConfig, String> {
    let mut cfg = a.step.config(a.model.model()?)?;
    cfg.steps = a.steps;
    cfg.learning_rate = a.learning_rate;
    cfg.warmup_steps = a.warmup_steps;
    cfg.seed = a.seed;
    cfg.validate().map_err(|e| flag_error(&e))?;
    Ok(cfg)
}

/// Refuses a model whose training state cannot fit this machine's memory before anything
/// is allocated: every CPU device holds the f32 parameters, their gradients and both AdamW
/// moments (16 bytes a parameter). Where `/proc/meminfo` cannot be read, or the devices are
/// not the CPU's, nothing is checked.
fn check_memory(a: &Args, cfg: &TrainConfig, platform: Platform) -> Result<(), String> {
    if platform != Platform::Cpu {
        return Ok(());
    }
    let Some(available) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    }) else {
        return Ok(());
    };
    // With fsdp each device holds 1/F of the state (all but the norm scales).
    let needed =
        16 * cfg.model.num_params() as u64 * cfg.devices() as u64 / cfg.ici_fsdp_parallelism as u64;
    if needed > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(format!(
            "--model {} needs {:.1} GiB for the parameters, gradients and AdamW moments on {} \
             CPU devices, but this machine has {:.1} GiB available; train tiny or small here, \
             or compile the step for a TPU slice with `tessera compile --target tpu:...`",
            a.model.model,
            gib(needed),
            cfg.devices(),
            gib(available)
        ));
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let cfg = config(a)?;
    let stop = a.stop_at.unwrap_or(cfg.steps).min(cfg.steps);
    if let Some(p) = a.peak_tflops.filter(|p| !(p.is_finite() && *p > 0.0)) {
        return Err(format!("--peak-tflops {p} is not a positive number"));
    }
    let devices = cfg.devices();
    let platform = a.backend.platform().ok_or_else(|| {
        "--backend interpret runs kernels alone; the train step is one SPMD program: use \
         --backend cpu, gpu or tpu"
            .to_string()
    })?;
    // The devices first: a platform this machine lacks is refused before anything is built.
    platform.client(devices).map_err(|e| e.to_string())?;
    check_memory(a, &cfg, platform)?;
    println!(
        "model {} ({} parameters), {} {} devices = {} {} x context {}, {}{}, global batch {} \
         x {} tokens, splash blocks q {} kv {}",
        a.model.model,
        cfg.model.num_params(),
        devices,
        platform,
        if cfg.fsdp() { "fsdp" } else { "data" },
        cfg.batch_shards(),
        cfg.ici_context_parallelism,
        cfg.strategy.maxtext_name(),
        if cfg.load_balance {
            " (load balanced)"
        } else {
            ""
        },
        cfg.global_batch(),
        cfg.max_target_length,
        cfg.sa_block_q,
        cfg.sa_block_kv
    );
    let mut trainer = match &a.resume {
        Some(path) => Trainer::resume(cfg.clone(), path, platform),
        None => Trainer::new(cfg.clone(), platform),
    }
    .map_err(|e| flag_error(&e))?;
    println!(
        "compiled the train step in {:.1} s; starting at step {}; parameters and AdamW \
         moments take {:.2} MiB per device",
        trainer.compile_seconds(),
        trainer.step_count(),
        trainer.state_bytes_per_device() as f64 / (1u64 << 20) as f64
    );
    if let Some(path) = &a.dump_hlo {
        std::fs::write(path, trainer.program_text())
            .map_err(|e| format!("--dump-hlo {}: {e}", path.display()))?;
    }
    // Per device; none (no MFU) for devices other than this machine's CPU unless given.
    let peak_per_device = match a.peak_tflops {
        Some(t) => Some(t * 1e12),
        None if platform == Platform::Cpu => {
            let peak = matmul_peak(2048).map_err(|e| e.to_string())?;
            println!(
                "measured f32 matmul peak of this machine: {:.1} GFLOP/s ({:.1} per device)",
                peak / 1e9,
                peak / 1e9 / devices as f64
            );
            Some(peak / devices as f64)
        }
        None => None,
    };
    let percent = |mfu: Option<f64>| match mfu {
        Some(m) => format!("{:.2}%", 100.0 * m),
        None => "n/a (no --peak-tflops)".to_string(),
    };
    let flops = model_flops_per_step(&cfg);
    let mut log = match &a.log_json {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| format!("--log-json {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let first = trainer.step_count();
    let bar = ProgressBar::new((stop - first.min(stop)) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} steps {elapsed_precise} eta {eta} {msg}",
        )
        .map_err(|e| e.to_string())?,
    );
    let mut history: Vec<StepMetrics> = Vec::new();
    while trainer.step_count() < stop {
        let m = trainer.train_step().map_err(|e| e.to_string())?;
        let tflops = flops / m.step_time_s / devices as f64 / 1e12;
        let mfu = peak_per_device.map(|p| tflops * 1e12 / p);
        let line = format!(
            "completed step: {}, seconds: {:.3}, TFLOP/s/device: {:.4}, Tokens/s/device: {:.0}, \
             MFU: {}, loss: {:.4}, grad_norm: {:.3}, lr: {:.2e}",
            m.step,
            m.step_time_s,
            tflops,
            m.tokens_per_s / devices as f64,
            percent(mfu),
            m.loss,
            m.grad_norm,
            m.learning_rate
        );
        // Above the bar (or plainly when there is no terminal to draw it on).
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
        bar.inc(1);
        bar.set_message(format!("loss {:.3}", m.loss));
        if let Some(log) = &mut log {
            let mut obj = String::new();
            let _ = write!(
                obj,
                "{{\"step\":{},\"loss\":{},\"step_time_s\":{},\"tokens_per_s\":{},\
                 \"tflops_per_device\":{},\"mfu\":{},\"grad_norm\":{},\"learning_rate\":{}}}",
                m.step,
                m.loss,
                m.step_time_s,
                m.tokens_per_s,
                tflops,
                mfu.map_or("null".to_string(), |m| m.to_string()),
                m.grad_norm,
                m.learning_rate
            );
            writeln!(log, "{obj}").map_err(|e| format!("--log-json: {e}"))?;
        }
        history.push(m);
    }
    bar.finish_and_clear();
    if let Some(mut log) = log {
        log.flush().map_err(|e| format!("--log-json: {e}"))?;
    }
    if let (Some(f), Some(l)) = (history.first(), history.last()) {
        let times: Vec<f64> = history.iter().skip(1).map(|m| m.step_time_s).collect();
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        println!(
            "loss {:.4} (step {}) -> {:.4} (step {}), {:.1}% of the first; the data's entropy \
             is {:.3}; mean step time {:.3} s after the first",
            f.loss,
            f.step,
            l.loss,
            l.step,
            100.0 * l.loss / f.loss,
            ENTROPY_NATS,
            mean
        );
    }
    if let Some(path) = &a.save {
        trainer.save(path).map_err(|e| e.to_string())?;
        println!("saved step {} to {}", trainer.step_count(), path.display());
    }
    if !history.is_empty() {
        let plot = a.plot.clone().unwrap_or_else(|| match &a.log_json {
            Some(log) => log.with_extension("svg"),
            None => PathBuf::from("train_loss.svg"),
        });
        draw_loss(&plot, &history, &cfg)?;
        println!("loss curve: {}", plot.display());
    }
    if a.bench {
        let t = trainer.time_split(3).map_err(|e| e.to_string())?;
        let tflops = flops / t.step_s / devices as f64 / 1e12;
        println!(
            "step {:.4} s = forward {:.4} s + backward {:.4} s + optimizer {:.4} s; the step's \
             collectives alone {:.4} s",
            t.step_s,
            t.forward_s,
            t.backward_s(),
            t.optimizer_s(),
            t.collectives_s
        );
        println!(
            "{:.2e} model FLOPs per step: {:.4} TFLOP/s per device, MFU {}{}",
            flops,
            tflops,
            percent(peak_per_device.map(|p| tflops * 1e12 / p)),
            peak_per_device.map_or(String::new(), |p| format!(
                " of {:.1} GFLOP/s per device",
                p / 1e9
            ))
        );
    }
    Ok(())
}

/// The loss per step as an SVG line chart.
fn draw_loss(path: &Path, history: &[StepMetrics], cfg: &TrainConfig) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let first = history[0].step as f64;
    let last = history[history.len() - 1].step as f64;
    let max = history.iter().map(|m| m.loss).fold(0.0, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "loss, {} on {} devices",
                cfg.strategy.maxtext_name(),
                cfg.devices()
            ),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(first..last.max(first + 1.0), 0.0..max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy (nats)")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            history.iter().map(|m| (m.step as f64, m.loss)),
            &BLUE,
        ))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            [(first, ENTROPY_NATS), (last, ENTROPY_NATS)],
            &RED.mix(0.5),
        ))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
