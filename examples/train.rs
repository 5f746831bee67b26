//! The main job: train a small Llama-style model with context-parallel splash attention,
//! MaxText style, on virtual CPU devices (`--backend cpu`, the default), GPUs (`gpu`) or the
//! chips of a TPU VM (`tpu`: the step `tessera compile train` compiles, its kernels Mosaic
//! custom calls).
//!
//! ```sh
//! cargo run --release --example train                       # tiny, 4 devices, Ulysses
//! cargo run --release --example train -- --context-parallel-strategy ring --steps 50
//! cargo run --release --example train -- --model small --steps 3 --bench
//! cargo run --release --example train -- --dataset-type hf --dataset-path book.txt --vocab 512
//! ```
//!
//! With `--dataset-type hf` it trains on the text of `--dataset-path` (the library's
//! `tessera_train::data`: documents, a tokenizer, packed rows with segment ids, the last
//! tenth of the documents held out) and prints the text's unigram entropy beside the loss;
//! `--eval-interval N` shows the held-out loss every N steps (`--eval-steps` batches).
//!
//! Per step it prints loss, step time, tokens/s, model TFLOP/s per device and MFU against a
//! peak (`--peak-tflops` per device; on cpu by default the machine's measured f32 matmul peak
//! shared by the devices, elsewhere no MFU without it); `--log-json PATH` writes one JSON
//! object per step, and the loss curve is drawn as an SVG beside the log at the end.
//!
//! Its outputs (`--save`, `--log-json`, `--plot`, `--dump-hlo`) go through the CLI's output
//! layer (`src/cli/outputs.rs`): every path is checked before anything is built (a missing
//! directory, a directory, a device or other special file, two outputs or an output and
//! `--resume` naming one file are refused), each is written to a temporary file beside it,
//! and all are renamed into place only when the whole run succeeded, so a failing run
//! (a bad setting, a non-finite loss) leaves no file behind.

use std::path::{Path, PathBuf};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use tessera::backend::{Backend, Platform};
use tessera_train::data::{DataError, TextData, TextTokenizer, ENTROPY_NATS};
use tessera_train::flops::{matmul_peak, model_flops_per_step};
use tessera_train::{StepMetrics, TrainConfig, Trainer};

#[path = "../src/cli/train_flags.rs"]
mod train_flags;
use train_flags::{flag_error, DataFlags, ModelFlags, StepFlags};
// The CLI's output layer; the example uses part of it.
#[path = "../src/cli/outputs.rs"]
#[allow(dead_code)]
mod outputs;
use outputs::Outputs;
use tessera_train::checkpoint::{saved_step, saved_tokenizer};
use tessera_train::sample::{SampleOptions, Sampler};
use tessera_train::{Dataset, SettingError, TrainError};

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
    #[command(flatten)]
    data: DataFlags,
    /// Every N steps (and at the last), the loss on the held-out data, forward only
    /// (MaxText's `eval_interval`; 0: never).
    #[arg(long, default_value_t = 0)]
    eval_interval: usize,
    /// Held-out batches each eval averages (MaxText's `eval_steps`).
    #[arg(long, default_value_t = 4)]
    eval_steps: usize,
    /// Peak learning rate (after warmup; cosine to a tenth of it at --steps).
    #[arg(long, default_value_t = 3e-3)]
    learning_rate: f64,
    /// Linear warmup steps up to the peak learning rate, at most --steps [default: 10, or
    /// --steps when the run is shorter]
    #[arg(long)]
    warmup_steps: Option<usize>,
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
    /// Continue TEXT with the model and print it: with --resume, the checkpoint's model (one
    /// trained on text, whose tokenizer it holds) and nothing is trained; without, the model
    /// this run trains on text, at its end.
    #[arg(long)]
    prompt: Option<String>,
    /// Sampling temperature (0: the most likely token each time).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Draw among the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Tokens to add to the prompt at most (sampling stops at the end-of-text token).
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The warmup of a run that does not give `--warmup-steps` (or all of a shorter run).
const DEFAULT_WARMUP_STEPS: usize = 10;

/// The run's settings, refused (before anything is built or allocated) when they do not fit
/// this machine's memory (on cpu; [`check_memory`]) or do not validate.
fn config(a: &Args, platform: Platform) -> Result<TrainConfig, String> {
    let mut cfg = a.step.config(a.model.model()?)?;
    cfg.steps = a.steps;
    cfg.learning_rate = a.learning_rate;
    cfg.warmup_steps = a.warmup_steps.unwrap_or(a.steps.min(DEFAULT_WARMUP_STEPS));
    cfg.seed = a.seed;
    // Before validating: the estimate cannot overflow, and what it lets through has dims
    // whose products fit.
    check_memory(&cfg, platform)?;
    cfg.validate().map_err(|e| flag_error(&e))?;
    Ok(cfg)
}

/// Refuses a run that cannot fit this machine's memory before anything is allocated: every
/// CPU device holds its training state and its tokens' activations
/// ([`tessera_train::memory::check_fits`]), all in this machine's memory. Where
/// `/proc/meminfo` cannot be read, or the devices are not the CPU's, nothing is checked.
fn check_memory(cfg: &TrainConfig, platform: Platform) -> Result<(), String> {
    if platform != Platform::Cpu {
        return Ok(());
    }
    let Some(available) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kib| kib * 1024.0)
    }) else {
        return Ok(());
    };
    // The device count, in f64 too: its factors are not validated yet.
    let devices = cfg.ici_context_parallelism as f64
        * cfg.ici_data_parallelism as f64
        * cfg.ici_fsdp_parallelism as f64;
    let devices = if devices.is_finite() && devices <= 1e6 {
        devices as usize
    } else {
        usize::MAX
    };
    tessera_train::memory::check_fits(cfg, devices, available, "this machine (available memory)")
        .map(|_| ())
        .map_err(|e| e.describe(&train_flags::MaxTextFlags))
}

/// The step to stop at: `--stop-at` (in `1..=--steps`) or `--steps`.
fn stop_step(a: &Args) -> Result<usize, String> {
    match a.stop_at {
        None => Ok(a.steps),
        Some(stop_at) if (1..=a.steps).contains(&stop_at) => Ok(stop_at),
        Some(stop_at) => Err(flag_error(&TrainError::from(SettingError::StopAt {
            stop_at,
            steps: a.steps,
        }))),
    }
}

/// Refuses a resume that would train nothing: a checkpoint at or past `--steps` or the step
/// to stop at (read from its header, before anything is built).
fn check_resume(a: &Args, stop: usize) -> Result<(), String> {
    let Some(path) = &a.resume else {
        return Ok(());
    };
    let step = saved_step(path).map_err(|e| flag_error(&e))?;
    let shown = path.display().to_string();
    let e = if step >= a.steps {
        SettingError::ResumeAtEnd {
            path: shown,
            step,
            steps: a.steps,
        }
    } else if step >= stop {
        SettingError::ResumePastStop {
            path: shown,
            step,
            stop_at: stop,
        }
    } else {
        return Ok(());
    };
    Err(flag_error(&e.into()))
}

/// The run's outputs, checked and staged (see the module docs).
fn outputs(a: &Args, plot: &Path) -> Result<Outputs, String> {
    let mut files: Vec<(&str, &Path)> = vec![("--plot", plot)];
    for (flag, path) in [
        ("--save", &a.save),
        ("--log-json", &a.log_json),
        ("--dump-hlo", &a.dump_hlo),
    ] {
        if let Some(p) = path {
            files.push((flag, p));
        }
    }
    let inputs: Vec<(&str, &Path)> = a.resume.iter().map(|p| ("--resume", p.as_path())).collect();
    Outputs::prepare(&files, &inputs).map_err(|e| format!("{e:#}"))
}

/// The data of the run: synthetic, or the text of `--dataset-path` (tokenized with the
/// checkpoint's tokenizer on a resume without `--tokenizer-path`).
fn dataset(a: &Args, cfg: &TrainConfig) -> Result<Dataset, String> {
    let Some(opts) = a.data.text_options(&cfg.model, cfg.max_target_length)? else {
        return Ok(Dataset::Synthetic);
    };
    let saved = match (&a.resume, &opts.tokenizer) {
        (Some(path), None) => saved_tokenizer(path).map_err(|e| flag_error(&e))?,
        _ => None,
    };
    let tokenizer = saved
        .map(|json| {
            let shown = a.resume.as_ref().map(|p| p.display().to_string());
            TextTokenizer::from_json(&json, &shown.unwrap_or_default())
        })
        .transpose()
        .map_err(|e| flag_error(&e.into()))?;
    let text = TextData::load(&opts, tokenizer, cfg.seed).map_err(|e| flag_error(&e.into()))?;
    Ok(Dataset::Text(Box::new(text)))
}

/// One step's JSON line (a non-finite number, which JSON cannot hold, as null); the
/// held-out loss when the step had an eval.
fn json_line(m: &StepMetrics, tflops: f64, mfu: Option<f64>, eval: Option<f64>) -> String {
    let mut line = serde_json::json!({
        "step": m.step,
        "loss": m.loss,
        "step_time_s": m.step_time_s,
        "tokens_per_s": m.tokens_per_s,
        "tflops_per_device": tflops,
        "mfu": mfu,
        "grad_norm": m.grad_norm,
        "learning_rate": m.learning_rate,
    });
    if let Some(loss) = eval {
        line["eval_loss"] = serde_json::json!(loss);
    }
    line.to_string()
}

/// How `--prompt` is continued.
fn sample_options(a: &Args) -> Result<SampleOptions, String> {
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(format!(
            "--temperature {} is not a number at or above 0",
            a.temperature
        ));
    }
    Ok(SampleOptions {
        temperature: a.temperature,
        top_k: a.top_k,
        max_new_tokens: a.max_new_tokens,
        seed: a.seed,
    })
}

/// Prints `prompt` and the continuation `sampler` draws.
fn print_sample(sampler: &Sampler, prompt: &str, opts: SampleOptions) -> Result<(), String> {
    let text = sampler.sample(prompt, opts).map_err(|e| flag_error(&e))?;
    println!(
        "sample (temperature {}, top-k {}): {prompt}{text}",
        opts.temperature, opts.top_k
    );
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    let platform = a.backend.platform().ok_or_else(|| {
        "--backend interpret runs kernels alone; the train step is one SPMD program: use \
         --backend cpu, gpu or tpu"
            .to_string()
    })?;
    let cfg = config(a, platform)?;
    if let (Some(prompt), Some(path)) = (&a.prompt, &a.resume) {
        // Sampling from a checkpoint: nothing trained, nothing written.
        let outputs = [
            ("--save", a.save.is_some()),
            ("--log-json", a.log_json.is_some()),
            ("--plot", a.plot.is_some()),
            ("--dump-hlo", a.dump_hlo.is_some()),
        ];
        if let Some((flag, _)) = outputs.iter().find(|(_, set)| *set) {
            return Err(format!(
                "{flag} writes nothing when --prompt samples from --resume (nothing is \
                 trained); leave it out"
            ));
        }
        let opts = sample_options(a)?;
        if let Some(given) = &a.data.tokenizer_path {
            // The checkpoint's tokenizer is the one it samples with; another is refused.
            let given = TextTokenizer::from_file(given, cfg.model.vocab)
                .map_err(|e| flag_error(&e.into()))?;
            let saved = saved_tokenizer(path).map_err(|e| flag_error(&e))?;
            if saved.as_deref().is_some_and(|s| s != given.to_json()) {
                let e = DataError::CheckpointTokenizer {
                    path: path.display().to_string(),
                };
                return Err(flag_error(&e.into()));
            }
        }
        let sampler = Sampler::from_checkpoint(cfg, path, platform).map_err(|e| flag_error(&e))?;
        return print_sample(&sampler, prompt, opts);
    }
    let sampling = a.prompt.as_ref().map(|_| sample_options(a)).transpose()?;
    if a.prompt.is_some() && a.data.dataset_type == train_flags::DatasetType::Synthetic {
        return Err(
            "--prompt continues text, but this run trains on synthetic data; train on \
                    text (--dataset-type hf) or --resume a checkpoint trained on text"
                .to_string(),
        );
    }
    let stop = stop_step(a)?;
    if let Some(p) = a.peak_tflops.filter(|p| !(p.is_finite() && *p > 0.0)) {
        return Err(format!("--peak-tflops {p} is not a positive number"));
    }
    let plot = a.plot.clone().unwrap_or_else(|| match &a.log_json {
        Some(log) => log.with_extension("svg"),
        None => PathBuf::from("train_loss.svg"),
    });
    let mut outputs = outputs(a, &plot)?;
    check_resume(a, stop)?;
    let devices = cfg.devices();
    // The devices first: a platform this machine lacks is refused before anything is built.
    platform.client(devices).map_err(|e| e.to_string())?;
    let data = dataset(a, &cfg)?;
    // The entropy the loss is measured against: the chain's, or the text's unigram entropy.
    let entropy = match &data {
        Dataset::Synthetic => ENTROPY_NATS,
        Dataset::Text(text) => {
            let [train, held] = text.documents();
            println!(
                "text: {train} documents ({} tokens in {} rows) to train on, {held} held out \
                 ({} rows), {}; tokenizer of {} tokens; unigram entropy {:.3} nats",
                text.train_rows().real_targets(),
                text.train_rows().len(),
                text.eval_rows().len(),
                if a.data.packing.unwrap_or(true) {
                    "packed"
                } else {
                    "one document a row"
                },
                text.tokenizer().vocab_size(),
                text.unigram_entropy()
            );
            text.unigram_entropy()
        }
    };
    let entropy_name = match &data {
        Dataset::Synthetic => "the data's entropy",
        Dataset::Text(_) => "the text's unigram entropy",
    };
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
    let mut trainer = Trainer::with_data(cfg.clone(), platform, data, a.resume.as_deref())
        .map_err(|e| flag_error(&e))?;
    println!(
        "compiled the train step in {:.1} s; starting at step {}; parameters and AdamW \
         moments take {:.2} MiB per device",
        trainer.compile_seconds(),
        trainer.step_count(),
        trainer.state_bytes_per_device() as f64 / (1u64 << 20) as f64
    );
    let failed = |e: anyhow::Error| format!("{e:#}");
    outputs
        .write_text_if("--dump-hlo", &trainer.program_text())
        .map_err(failed)?;
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
    let mut log = String::new();
    let first = trainer.step_count();
    let bar = ProgressBar::new((stop - first.min(stop)) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} steps {elapsed_precise} eta {eta} {msg}",
        )
        .map_err(|e| e.to_string())?,
    );
    let mut history: Vec<StepMetrics> = Vec::new();
    let mut evals: Vec<(usize, f64)> = Vec::new();
    while trainer.step_count() < stop {
        let m = trainer.train_step().map_err(|e| flag_error(&e))?;
        let tflops = flops / m.step_time_s / devices as f64 / 1e12;
        let mfu = peak_per_device.map(|p| tflops * 1e12 / p);
        let eval = if a.eval_interval > 0 && (m.step % a.eval_interval == 0 || m.step == stop) {
            let loss = trainer
                .eval_loss(a.eval_steps)
                .map_err(|e| flag_error(&e))?;
            evals.push((m.step, loss));
            Some(loss)
        } else {
            None
        };
        let mut line = format!(
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
        if let Some(loss) = eval {
            line.push_str(&format!(
                ", eval_loss: {loss:.4} ({entropy_name}: {entropy:.4})"
            ));
        }
        // Above the bar (or plainly when there is no terminal to draw it on).
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
        bar.inc(1);
        bar.set_message(format!("loss {:.3}", m.loss));
        log.push_str(&json_line(&m, tflops, mfu, eval));
        log.push('\n');
        history.push(m);
    }
    bar.finish_and_clear();
    outputs.write_text_if("--log-json", &log).map_err(failed)?;
    if let (Some(f), Some(l)) = (history.first(), history.last()) {
        let times: Vec<f64> = history.iter().skip(1).map(|m| m.step_time_s).collect();
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        println!(
            "loss {:.4} (step {}) -> {:.4} (step {}), {:.1}% of the first; {entropy_name} \
             is {:.3}; mean step time {:.3} s after the first",
            f.loss,
            f.step,
            l.loss,
            l.step,
            100.0 * l.loss / f.loss,
            entropy,
            mean
        );
    }
    if let (Some(f), Some(l)) = (evals.first(), evals.last()) {
        println!(
            "eval loss {:.4} (step {}) -> {:.4} (step {}); {entropy_name} is {entropy:.3}",
            f.1, f.0, l.1, l.0
        );
    }
    if a.save.is_some() {
        outputs
            .write_with("--save", |temp| Ok(trainer.save(temp)?))
            .map_err(failed)?;
    }
    outputs
        .write_with("--plot", |temp| {
            draw_loss(temp, &history, &evals, entropy, &cfg)
                .map_err(|e| anyhow::anyhow!("--plot {e}"))
        })
        .map_err(failed)?;
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
    if let (Some(prompt), Some(opts), Some(text)) = (&a.prompt, sampling, trainer.text()) {
        let n = trainer.param_specs().len();
        let mut params = trainer.state_on_host().map_err(|e| flag_error(&e))?;
        params.truncate(n);
        let sampler = Sampler::new(cfg.clone(), platform, params, text.tokenizer().clone())
            .map_err(|e| flag_error(&e))?;
        print_sample(&sampler, prompt, opts)?;
    }
    outputs.commit().map_err(failed)?;
    if let Some(path) = &a.save {
        println!("saved step {} to {}", trainer.step_count(), path.display());
    }
    println!("loss curve: {}", plot.display());
    Ok(())
}

/// The loss per step as an SVG line chart, the held-out losses (`evals`, by step) as a
/// second line, and `entropy` as a reference line.
fn draw_loss(
    path: &Path,
    history: &[StepMetrics],
    evals: &[(usize, f64)],
    entropy: f64,
    cfg: &TrainConfig,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plotting: {e}");
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let (Some(first), Some(last)) = (history.first(), history.last()) else {
        return Err("no steps to plot".into());
    };
    let (first, last) = (first.step as f64, last.step as f64);
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let max = history
        .iter()
        .map(|m| m.loss)
        .chain(evals.iter().map(|e| e.1))
        .fold(entropy, f64::max)
        * 1.05;
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
            [(first, entropy), (last, entropy)],
            &RED.mix(0.5),
        ))
        .map_err(|e| err(&e))?;
    if !evals.is_empty() {
        chart
            .draw_series(LineSeries::new(
                evals.iter().map(|&(step, loss)| (step as f64, loss)),
                &GREEN,
            ))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}
