//! `tessera compile train`: the whole train step (forward, backward, gradient all-reduce,
//! AdamW) of a model on a `data x context` mesh, its splash attention as Mosaic kernels,
//! compiled by libtpu for a TPU topology; printed beside the step-time model's prediction
//! (`tessera_train::predict`).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use tessera::dsl::{KernelCostEstimates, Lowering};
use tessera::tpu::{CompileReport, TpuTopology};
use tessera_train::predict::{predict_step, Chip, Efficiency, StepPrediction, StepSetup};
use tessera_train::{train_step_program, RematPolicy, TrainConfig};

use super::compile::{compile_and_commit, stage_emits, CompileArgs};
use super::outputs::Outputs;
use super::train_flags::{flag_error, ModelFlags, StepDefaults, StepFlags};
use super::tune::{causal_name, tune_attention, AttentionCase};

/// Arguments of `tessera compile train` (MaxText's flag names).
#[derive(Args, Debug)]
pub struct CompileTrainArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    #[command(flatten)]
    pub step: StepFlags,
    /// The scoped VMEM budget the splash kernels are checked against and compiled with, in
    /// KiB (instead of --vmem-limit-mib; default 16 MiB).
    #[arg(long, value_name = "KIB")]
    pub vmem_limit_kib: Option<usize>,
    /// Skip the second compile (2 layers per loop iteration) that measures one layer's cost
    /// for the compiler's estimate of the whole step.
    #[arg(long)]
    pub no_step_estimate: bool,
}

/// The validated config of `a`, its attention kernels for `kernels` (a TPU target), with
/// MaxText's defaults for what the flags leave unset ([`StepDefaults::MAXTEXT`]: bf16 compute,
/// load balancing for the strategies that balance), and the `auto` blocks chosen by `tessera
/// tune`'s search for `target` ([`auto_blocks`]); with what that search chose, when it ran.
/// Refused before anything is built when one device of it cannot fit a chip of `target`'s
/// HBM ([`tessera_train::memory::check_fits`]).
pub fn train_config(
    a: &CompileTrainArgs,
    target: &TpuTopology,
    kernels: &Lowering,
) -> Result<(TrainConfig, Option<String>)> {
    let model = a.model.model().map_err(|e| anyhow!(e))?;
    let mut note = None;
    let mut search = |cfg: &TrainConfig| {
        let (blocks, said) = auto_blocks(cfg, target, kernels)?;
        note = Some(said);
        Ok(blocks)
    };
    let mut cfg = a
        .step
        .config_with(model, StepDefaults::MAXTEXT, Some(&mut search))
        .map_err(|e| anyhow!(e))?;
    cfg.lowering = kernels.clone();
    let chip = target.chip();
    tessera_train::memory::check_fits(
        &cfg,
        1,
        chip.hbm_bytes as f64,
        &format!("one {} chip's HBM", chip.name),
    )
    .map_err(|e| anyhow!(e.describe(&super::train_flags::MaxTextFlags)))?;
    cfg.validate().map_err(|e| anyhow!(flag_error(&e)))?;
    Ok((cfg, note))
}

/// The splash blocks `tessera tune` picks for the attention each device of `cfg` runs (the
/// strategy's local dims: its sequences, heads and lengths per kernel call), as `[q, kv,
/// q_dkv, kv_dkv]`, and a sentence saying so. The calls of a strategy whose devices hold
/// different blocks differ by where their queries and keys sit; the search compiles the
/// busiest, the one whose queries
/// sit furthest after its keys (its causal offset), for every call.
fn auto_blocks(
    cfg: &TrainConfig,
    target: &TpuTopology,
    kernels: &Lowering,
) -> std::result::Result<([usize; 4], String), String> {
    let mut c = cfg.clone();
    c.lowering = kernels.clone();
    c.validate().map_err(|e| flag_error(&e))?;
    let cp = c.context_parallel();
    let local = cp.local_dims();
    let offset = cp
        .kernel_calls()
        .iter()
        .flatten()
        .flatten()
        .map(|o| o.q as i64 - o.kv as i64)
        .max()
        .unwrap_or(0)
        .max(0);
    let case = AttentionCase {
        dims: local,
        offset,
        dtype: c.dtype,
        fused: c.block_sizes().use_fused_bwd_kernel,
    };
    let (t, blocks) = tune_attention(target, kernels, case, (128, 2048), false)
        .map_err(|e| format!("--sa-block-* auto: {e:#}"))?;
    let (f, b) = (blocks[t.best_fwd], blocks[t.best_bwd]);
    let said = format!(
        "auto blocks (tessera tune, libtpu's cycles per core of the attention each device \
         runs: B={} H={} KV={} Q={} K={} D={}, {}): forward {}x{}, backward {}x{} of {} \
         candidates ({} compiled now, the rest cached); the flags given explicitly keep their \
         values",
        local.batch,
        local.heads,
        local.kv_heads,
        local.q_len,
        local.kv_len,
        local.head_dim,
        causal_name(offset),
        f.0,
        f.1,
        b.0,
        b.1,
        t.rows.len(),
        t.compiled
    );
    Ok(([f.0, f.1, b.0, b.1], said))
}

/// What the step took from MaxText's defaults because its flags were not given, one phrase
/// each (empty when every such flag was given).
fn chosen_defaults(a: &StepFlags, cfg: &TrainConfig) -> Vec<String> {
    let mut chosen = Vec::new();
    if a.dtype.is_none() {
        chosen.push(format!(
            "compute dtype {} (MaxText's default; --dtype f32 for f32)",
            cfg.dtype.name()
        ));
    }
    if a.shard_weights_over_context.is_none() && !cfg.fsdp() && cfg.shards_weights() {
        chosen.push(
            "weights split over the context axis (MaxText's embed rule; \
             --shard-weights-over-context=false to replicate them)"
                .into(),
        );
    }
    if a.context_parallel_load_balance.is_none() && cfg.strategy.load_balances() {
        chosen.push(
            "load balancing on (MaxText's default; --context-parallel-load-balance=false to \
             turn it off)"
                .into(),
        );
    }
    chosen
}

/// Builds, checks against the topology, compiles and reports the train step of `a`.
pub fn compile_train(
    a: &CompileTrainArgs,
    target: &TpuTopology,
    kernels: &Lowering,
    args: &CompileArgs,
    mut outputs: Outputs,
) -> Result<()> {
    let (cfg, auto_note) = train_config(a, target, kernels)?;
    if let Some(note) = &auto_note {
        outln!("{note}");
    }
    let devices = target.device_count()?;
    if cfg.devices() != devices {
        let (flag, degree) = if cfg.fsdp() {
            ("--ici-fsdp-parallelism", cfg.ici_fsdp_parallelism)
        } else {
            ("--ici-data-parallelism", cfg.ici_data_parallelism)
        };
        bail!(
            "{flag} {degree} x --ici-context-parallelism {} = {} devices, but the topology {} \
             has {devices}; make their product {devices}",
            cfg.ici_context_parallelism,
            cfg.devices(),
            target.topology()
        );
    }
    let (_, program) = train_step_program(&cfg).map_err(|e| anyhow!(flag_error(&e)))?;
    stage_emits(args, &mut outputs, program.module())?;
    let report = compile_and_commit(target, program.module(), outputs)?;
    let mut collectives = collective_bytes(program.collectives());
    // The gradients (and the loss) are summed in f32 all-reduces that the step builds outside
    // the typed collectives, so they are not in their list. A gradient held whole on every
    // device is summed over all `n`; an fsdp shard (already reduce-scattered over the axes
    // it is split on) over the devices that hold the same shard, `n x local / global`. A
    // ring all-reduce over `g` devices sends `2 (g - 1) / g` of it.
    let n = cfg.devices();
    let params = tessera_train::model::param_specs(&cfg.model).len();
    let mut all_reduce = 2 * 4 * (n - 1) / n; // the loss
    for t in &program.inputs()[..params] {
        let local = t.local.dims.iter().product::<i64>() as usize;
        let global = t.global.dims.iter().product::<i64>() as usize;
        let group = n * local / global.max(1);
        if group > 1 {
            all_reduce += 2 * 4 * local * (group - 1) / group;
        }
    }
    collectives.insert("all_reduce", (1, all_reduce));
    let state_bytes = tessera_train::model::state_bytes_per_device(&program, params);
    let chip = Chip::parse(target.topology()).ok();
    let prediction = predict(&cfg, chip.as_ref());
    let estimate = if a.no_step_estimate {
        Err("skipped (--no-step-estimate)".to_string())
    } else {
        step_estimate(&cfg, target, &report)?
    };
    let chosen = chosen_defaults(&a.step, &cfg);
    if !chosen.is_empty() {
        outln!("defaults chosen: {}", chosen.join("; "));
    }
    print_human(
        &cfg,
        &report,
        &collectives,
        state_bytes,
        chip.as_ref(),
        &prediction,
    );
    print_estimate(&estimate, kernels.cost_estimates);
    let mut json = report_json(&cfg, &report, &collectives, chip.as_ref(), &prediction);
    json.insert("state_bytes_per_device".into(), json!(state_bytes));
    json.insert("dtype".into(), json!(cfg.dtype.name()));
    json.insert("load_balance".into(), json!(cfg.load_balance));
    json.insert("shards_weights".into(), json!(cfg.shards_weights()));
    json.insert(
        "per_device_batch_size".into(),
        json!(cfg.per_device_batch_size),
    );
    json.insert("global_batch".into(), json!(cfg.global_batch()));
    json.insert("defaults_chosen".into(), json!(chosen));
    json.insert(
        "kernel_cost_estimates".into(),
        json!(match kernels.cost_estimates {
            KernelCostEstimates::Counted => "counted",
            KernelCostEstimates::Omitted => "omitted",
        }),
    );
    json.insert(
        "compiler_step_estimate".into(),
        match &estimate {
            Ok(e) => e.to_json(),
            Err(why) => json!({ "none": why }),
        },
    );
    outln!("{}", Value::Object(json));
    Ok(())
}

/// libtpu's cost analysis of the whole step. It counts a loop body once, so the layer loop's
/// body is measured as the difference between the step compiled with 2 layers per iteration
/// and with 1 (same layers, same computation), and the step is the 1-layer compile plus
/// `layers - 1` bodies.
#[derive(Debug, Clone, Copy)]
struct StepEstimate {
    /// One layer (forward, remat forward and backward): flops, bytes, seconds.
    per_layer: [f64; 3],
    /// The whole step.
    step: [f64; 3],
    /// Wall time of the second compile.
    compile_s: f64,
}

impl StepEstimate {
    fn to_json(self) -> Value {
        let [flops, bytes, seconds] = self.step;
        let [layer_flops, layer_bytes, layer_seconds] = self.per_layer;
        json!({
            "optimal_seconds": seconds,
            "flops": flops,
            "bytes_accessed": bytes,
            "per_layer_optimal_seconds": layer_seconds,
            "per_layer_flops": layer_flops,
            "per_layer_bytes_accessed": layer_bytes,
            "compile_s": self.compile_s,
        })
    }
}

/// The compiler's estimate of the whole step (see [`StepEstimate`]), or why there is none
/// (an odd number of layers; a cost analysis without the numbers). Compile errors are
/// errors.
fn step_estimate(
    cfg: &TrainConfig,
    target: &TpuTopology,
    one: &CompileReport,
) -> Result<Result<StepEstimate, String>> {
    let layers = cfg.model.layers;
    if layers < 2 || layers % 2 != 0 {
        return Ok(Err(format!(
            "measuring a layer needs an even number of layers (2 per loop iteration); this \
             step has {layers}"
        )));
    }
    let costs = |r: &CompileReport| Some([r.flops?, r.bytes_accessed?, r.optimal_seconds?]);
    let Some(once) = costs(one) else {
        return Ok(Err(
            "libtpu's cost analysis gave no flops, bytes or time".into()
        ));
    };
    let mut two_cfg = cfg.clone();
    two_cfg.layers_per_iteration = 2;
    let (_, program) = train_step_program(&two_cfg)?;
    let two = target
        .compile(program.module())
        .context("compiling the step with 2 layers per loop iteration (for the step estimate)")?;
    let Some(twice) = costs(&two) else {
        return Ok(Err(
            "libtpu's cost analysis gave no flops, bytes or time".into()
        ));
    };
    let per_layer: [f64; 3] = std::array::from_fn(|i| twice[i] - once[i]);
    let step = std::array::from_fn(|i| once[i] + (layers - 1) as f64 * per_layer[i]);
    Ok(Ok(StepEstimate {
        per_layer,
        step,
        compile_s: two.compile_seconds,
    }))
}

fn print_estimate(estimate: &Result<StepEstimate, String>, kernel_costs: KernelCostEstimates) {
    let kernels = match kernel_costs {
        KernelCostEstimates::Counted => "",
        KernelCostEstimates::Omitted => {
            "; the Mosaic calls without their cost estimates, priced as JAX's splash calls are"
        }
    };
    match estimate {
        Ok(e) => outln!(
            "compiler's estimate of the whole step (libtpu's cost analysis; one layer measured \
             as 2 layers per loop iteration minus 1, compiled in {:.1} s{kernels}): {:.3} TFLOP, \
             {:.3} GB accessed, {:.4e} s ({:.4e} s a layer)",
            e.compile_s,
            e.step[0] / 1e12,
            e.step[1] / 1e9,
            e.step[2],
            e.per_layer[2]
        ),
        Err(why) => outln!("no compiler estimate of the whole step: {why}"),
    }
}

/// Calls and bytes each device sends per step, by collective (`all_to_all`, `psum`, ...).
fn collective_bytes(
    calls: &[tessera::collectives::CollectiveCall],
) -> BTreeMap<&'static str, (usize, usize)> {
    let mut by_name = BTreeMap::new();
    for c in calls {
        let entry = by_name.entry(c.collective.name()).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += c.bytes_sent_per_device();
    }
    by_name
}

/// The step-time model's prediction, or why there is none. It models MaxText's step, whose
/// weights are sharded over fsdp x context; the batch degree (data or fsdp) is its fsdp.
fn predict(cfg: &TrainConfig, chip: Option<&Chip>) -> Result<StepPrediction, String> {
    let Some(chip) = chip else {
        return Err("the step-time model knows v5p and v5e slices only".into());
    };
    let setup = StepSetup {
        model: cfg.model,
        seq_len: cfg.max_target_length,
        per_device_batch: cfg.per_device_batch_size,
        fsdp: cfg.batch_shards(),
        context: cfg.ici_context_parallelism,
        strategy: cfg.strategy.clone(),
        load_balance: cfg.load_balance,
        blocks: cfg.block_sizes(),
        // The step's backward re-runs each layer's forward, with `--remat-policy full` the
        // attention included.
        remat_attention: cfg.remat_policy == RematPolicy::Full,
    };
    predict_step(&setup, chip, Efficiency::CALIBRATED).map_err(|e| flag_error(&e))
}

/// Per-device bytes of the compiled program: arguments + outputs + temporaries - aliased.
fn per_device_bytes(report: &CompileReport) -> Option<i64> {
    report
        .memory
        .as_ref()
        .map(|m| m.argument_bytes + m.output_bytes + m.temp_bytes - m.alias_bytes)
}

fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

fn print_human(
    cfg: &TrainConfig,
    r: &CompileReport,
    collectives: &BTreeMap<&'static str, (usize, usize)>,
    state_bytes: usize,
    chip: Option<&Chip>,
    prediction: &Result<StepPrediction, String>,
) {
    let m = &cfg.model;
    outln!(
        "train step: {} layers, {:.1} M parameters, {}; {} tokens x {} sequences per device \
         ({} a step); batch {} x context {} ({}{}); splash blocks q {} kv {} q_dkv {} kv_dkv {}",
        m.layers,
        m.num_params() as f64 / 1e6,
        cfg.dtype.name(),
        cfg.max_target_length,
        cfg.per_device_batch_size,
        cfg.global_batch(),
        cfg.batch_shards(),
        cfg.ici_context_parallelism,
        cfg.strategy.maxtext_name(),
        if cfg.load_balance {
            ", load balanced"
        } else {
            ""
        },
        cfg.sa_block_q,
        cfg.sa_block_kv,
        cfg.sa_block_q_dkv,
        cfg.sa_block_kv_dkv
    );
    outln!(
        "compiled for {} ({} devices) in {:.1} s: kernels {}; executable {} bytes",
        r.topology,
        r.devices,
        r.compile_seconds,
        r.kernels.join(", "),
        r.executable_bytes
    );
    if let (Some(mem), Some(total)) = (&r.memory, per_device_bytes(r)) {
        let fits = match chip {
            Some(c) => format!(
                "{} {}'s {:.0} GiB HBM",
                if total as f64 <= c.hbm_bytes {
                    "fits"
                } else {
                    "does NOT fit"
                },
                c.name,
                gib(c.hbm_bytes)
            ),
            None => "HBM of this chip not known".into(),
        };
        outln!(
            "per device: arguments {:.2} GiB + outputs {:.2} GiB + temporaries {:.2} GiB - \
             aliased {:.2} GiB = {:.2} GiB ({fits}); code {:.1} MiB",
            gib(mem.argument_bytes as f64),
            gib(mem.output_bytes as f64),
            gib(mem.temp_bytes as f64),
            gib(mem.alias_bytes as f64),
            gib(total as f64),
            mem.generated_code_bytes as f64 / (1u64 << 20) as f64
        );
    }
    for note in r.vmem_raise_notes() {
        outln!("{note}");
    }
    outln!(
        "parameters and both AdamW moments (f32) per device: {:.2} GiB{}",
        gib(state_bytes as f64),
        if cfg.fsdp() {
            " (sharded by fsdp x context)"
        } else if cfg.shards_weights() {
            " (sharded over the context axis)"
        } else {
            " (replicated: every device holds all of them)"
        }
    );
    if let (Some(f), Some(b)) = (r.flops, r.bytes_accessed) {
        outln!(
            "compiler's cost analysis per device (the scanned layers' loop body counted once): \
             {:.3} TFLOP, {:.3} GB accessed, its time estimate {}",
            f / 1e12,
            b / 1e9,
            r.optimal_seconds
                .map_or("none".to_string(), |s| format!("{s:.4e} s"))
        );
    }
    let moved: Vec<String> = collectives
        .iter()
        .map(|(name, (calls, bytes))| {
            format!(
                "{name} {calls} calls {:.1} MiB",
                *bytes as f64 / (1u64 << 20) as f64
            )
        })
        .collect();
    outln!(
        "collectives, bytes each device sends (the scanned layers' body counted once): {}",
        moved.join(", ")
    );
    match prediction {
        Ok(p) => {
            let b = &p.breakdown;
            outln!(
                "predicted (step-time model, tessera_train::predict; its fsdp degree is the \
                 batch degree): {:.3} ms, MFU {:.1}%: matmuls {:.3} ms, attention {:.3} ms, \
                 context collectives {:.3} ms, fsdp collectives {:.3} ms, optimizer {:.3} ms",
                1e3 * p.predicted_step_s,
                100.0 * p.predicted_mfu,
                1e3 * b.compute_matmul_s,
                1e3 * b.compute_attention_s,
                1e3 * b.context_collectives_s,
                1e3 * (b.fsdp_all_gather_s + b.fsdp_reduce_scatter_s),
                1e3 * b.optimizer_s
            );
        }
        Err(why) => outln!("no prediction: {why}"),
    }
}

fn report_json(
    cfg: &TrainConfig,
    r: &CompileReport,
    collectives: &BTreeMap<&'static str, (usize, usize)>,
    chip: Option<&Chip>,
    prediction: &Result<StepPrediction, String>,
) -> Map<String, Value> {
    let mut o: Map<String, Value> = match serde_json::from_str(&r.to_json()) {
        Ok(Value::Object(o)) => o,
        _ => Map::new(),
    };
    let m = &cfg.model;
    o.insert("layers".into(), json!(m.layers));
    o.insert("params".into(), json!(m.num_params()));
    o.insert("strategy".into(), json!(cfg.strategy.maxtext_name()));
    o.insert("data".into(), json!(cfg.ici_data_parallelism));
    o.insert("fsdp".into(), json!(cfg.ici_fsdp_parallelism));
    o.insert("context".into(), json!(cfg.ici_context_parallelism));
    o.insert("max_target_length".into(), json!(cfg.max_target_length));
    if let Some(code) = o.get("generated_code_bytes").cloned() {
        o.insert("code_bytes".into(), code);
    }
    let total = per_device_bytes(r);
    o.insert("per_device_bytes".into(), json!(total));
    o.insert("hbm_bytes".into(), json!(chip.map(|c| c.hbm_bytes)));
    o.insert(
        "fits_hbm".into(),
        json!(chip.zip(total).map(|(c, t)| t as f64 <= c.hbm_bytes)),
    );
    o.insert("compile_s".into(), json!(r.compile_seconds));
    let moved: Map<String, Value> = collectives
        .iter()
        .map(|(name, (calls, bytes))| {
            (
                name.to_string(),
                json!({"calls": calls, "bytes_per_device": bytes}),
            )
        })
        .collect();
    o.insert("collectives".into(), Value::Object(moved));
    match prediction {
        Ok(p) => {
            if let Ok(Value::Object(predicted)) = serde_json::from_str(&p.to_json()) {
                o.extend(predicted);
            }
        }
        Err(why) => {
            o.insert("predicted_step_s".into(), Value::Null);
            o.insert("prediction".into(), json!(why));
        }
    }
    o
}
