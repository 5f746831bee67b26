//! [`Trainer`]: one compiled train step, the state on the devices, the data fed step by step.

use std::path::Path;
use std::time::Instant;

use tessera_collectives::{DeviceArray, Executable, MeshArgument, Program};
use tessera_hlo::{DType, Reducer, TensorType};
use tessera_parallel::{kernel_lowering, AttentionLayer, ModelMesh};
use tessera_runtime::{Client, HostBuffer, Platform};

use crate::checkpoint::{self, Checkpoint};
use crate::data::{DataError, TextBatch, TextData};
use crate::model::{build_program, param_specs, Init, ParamSpec, StepKind};
use crate::{SettingError, SyntheticData, TrainConfig, TrainError};

/// What a run trains on.
#[derive(Debug, Clone)]
pub enum Dataset {
    /// The seed's Markov chain ([`SyntheticData`]).
    Synthetic,
    /// Text: packed rows with segment ids, a held-out split for eval.
    Text(Box<TextData>),
}

/// The data of a running trainer.
#[derive(Debug, Clone)]
enum Feed {
    Synthetic(SyntheticData),
    Text(Box<TextData>),
}

/// Where a synthetic run's held-out batches start: steps no run reaches.
const SYNTHETIC_EVAL_STEP: usize = 1 << 40;

/// A step's token arrays on the devices: tokens, targets, and with text their positions and
/// segment ids.
struct DeviceBatch {
    tokens: DeviceArray,
    targets: DeviceArray,
    positions: Option<DeviceArray>,
    segments: Option<DeviceArray>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepMetrics {
    /// The step, 1-based.
    pub step: usize,
    /// Mean cross-entropy over the step's tokens (before the update).
    pub loss: f64,
    /// Global gradient norm (before clipping).
    pub grad_norm: f64,
    /// The learning rate the update used.
    pub learning_rate: f64,
    /// Wall time of the step: copying its batch in, running, copying the loss out.
    pub step_time_s: f64,
    /// Tokens of the step per second of `step_time_s`.
    pub tokens_per_s: f64,
}

/// Where a step's time goes (best of the runs), from programs that stop at each stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTimes {
    /// The forward alone (to the loss).
    pub forward_s: f64,
    /// Forward, backward and the gradient all-reduce.
    pub gradients_s: f64,
    /// The whole step (with AdamW).
    pub step_s: f64,
    /// The step's collectives alone (every all-to-all, all-gather, permute and the
    /// gradient all-reduce, on arrays of their shapes).
    pub collectives_s: f64,
}

impl StepTimes {
    /// `gradients - forward`: the backward (with the gradient all-reduce).
    pub fn backward_s(&self) -> f64 {
        (self.gradients_s - self.forward_s).max(0.0)
    }

    /// `step - gradients`: clipping and AdamW.
    pub fn optimizer_s(&self) -> f64 {
        (self.step_s - self.gradients_s).max(0.0)
    }
}

/// The learning rate of update `k` (0-based): linear warmup to the peak over
/// `warmup_steps` (at most `steps`, which [`TrainConfig::validate`] requires), then a cosine
/// down to `final_lr_fraction` of it at `steps`.
pub fn learning_rate(cfg: &TrainConfig, k: usize) -> f64 {
    let peak = cfg.learning_rate;
    if k < cfg.warmup_steps {
        return peak * (k + 1) as f64 / cfg.warmup_steps as f64;
    }
    let span = cfg.steps.saturating_sub(cfg.warmup_steps).max(1) as f64;
    let progress = ((k - cfg.warmup_steps) as f64 / span).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    peak * (cfg.final_lr_fraction + (1.0 - cfg.final_lr_fraction) * cosine)
}

/// A training run: the compiled step, the parameters and moments on the devices, the data.
pub struct Trainer {
    cfg: TrainConfig,
    layer: AttentionLayer,
    specs: Vec<ParamSpec>,
    program: Program<ModelMesh>,
    exe: Executable<ModelMesh>,
    client: Client,
    /// Parameters, `mu`, `nu` (3 per parameter), on the devices.
    state: Vec<DeviceArray>,
    /// Synthetic data's positions (the same every step); text's come with each batch.
    positions: Option<DeviceArray>,
    data: Feed,
    /// The forward alone, for eval (compiled at the first eval).
    eval_exe: Option<Executable<ModelMesh>>,
    step: usize,
    compile_s: f64,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("cfg", &self.cfg)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl Trainer {
    /// Validates `cfg`, gets `cfg.devices()` devices of `platform`, builds the step for them
    /// (its kernels as [`kernel_lowering`] says: Mosaic custom calls on TPU) and compiles it,
    /// initialises the parameters from the seed and puts them (and zero moments) on the
    /// devices.
    pub fn new(cfg: TrainConfig, platform: Platform) -> Result<Self, TrainError> {
        Self::with_data(cfg, platform, Dataset::Synthetic, None)
    }

    /// [`Trainer::new`] (or, with `resume`, [`Trainer::resume`]) on `data`. With text the
    /// step takes segment ids ([`TrainConfig::segment_ids`]); its rows must have the run's
    /// sequence length and its tokenizer no more tokens than the model's vocabulary. A
    /// checkpoint resumed must have been trained on the same kind of data, on text with the
    /// same tokenizer.
    pub fn with_data(
        mut cfg: TrainConfig,
        platform: Platform,
        data: Dataset,
        resume: Option<&Path>,
    ) -> Result<Self, TrainError> {
        cfg.segment_ids = matches!(data, Dataset::Text(_));
        if let Dataset::Text(text) = &data {
            let rows = text.train_rows().seq;
            if rows != cfg.max_target_length {
                return Err(DataError::RowLength {
                    rows,
                    seq: cfg.max_target_length,
                }
                .into());
            }
            let size = text.tokenizer().vocab_size();
            if size > cfg.model.vocab {
                return Err(DataError::TokenizerVocab {
                    path: "the tokenizer".into(),
                    size,
                    vocab: cfg.model.vocab,
                }
                .into());
            }
        }
        if let Some(path) = resume {
            check_checkpoint_data(path, &data)?;
        }
        let client = devices(&cfg, platform)?;
        let specs = param_specs(&cfg.model);
        let (tensors, step) = match resume {
            Some(path) => {
                let ck = checkpoint::load(path, &specs, &cfg)?;
                if ck.step >= cfg.steps {
                    return Err(SettingError::ResumeAtEnd {
                        path: path.display().to_string(),
                        step: ck.step,
                        steps: cfg.steps,
                    }
                    .into());
                }
                (ck.tensors, ck.step)
            }
            None => {
                let init = init_params(&specs, cfg.seed);
                let zeros: Vec<Vec<f32>> = init.iter().map(|p| vec![0.0; p.len()]).collect();
                let tensors = init.iter().chain(&zeros).chain(&zeros).cloned().collect();
                (tensors, 0)
            }
        };
        let feed = match data {
            Dataset::Synthetic => Feed::Synthetic(SyntheticData::new(cfg.seed, cfg.model.vocab)),
            Dataset::Text(text) => Feed::Text(text),
        };
        Self::with_state(cfg, platform, client, tensors, step, feed)
    }

    /// Continues the run saved at `path`: its parameters, moments and step (the data goes
    /// on from that step), on `platform` as [`Trainer::new`]. `cfg` must have the
    /// checkpoint's model and seed.
    pub fn resume(cfg: TrainConfig, path: &Path, platform: Platform) -> Result<Self, TrainError> {
        Self::with_data(cfg, platform, Dataset::Synthetic, Some(path))
    }

    fn with_state(
        mut cfg: TrainConfig,
        platform: Platform,
        client: Client,
        tensors: Vec<Vec<f32>>,
        step: usize,
        data: Feed,
    ) -> Result<Self, TrainError> {
        cfg.lowering = kernel_lowering(platform, &cfg.lowering);
        let (layer, program) = train_step_program(&cfg)?;
        let specs = param_specs(&cfg.model);
        let start = Instant::now();
        let exe = program.compile(&client)?;
        let compile_s = start.elapsed().as_secs_f64();
        let shapes = specs.iter().chain(&specs).chain(&specs);
        let state = tensors
            .iter()
            .zip(shapes)
            .enumerate()
            .map(|(i, (t, s))| Ok(exe.upload(i, &f32_buffer(&s.shape, t)?)?))
            .collect::<Result<Vec<_>, TrainError>>()?;
        let positions = match data {
            Feed::Synthetic(_) => {
                let order = layer.sequence_order();
                let positions: Vec<i32> = (0..cfg.global_batch())
                    .flat_map(|_| order.iter().map(|&p| p as i32))
                    .collect();
                let buffer = token_buffer(&layer, &positions)?;
                Some(exe.upload(3 * specs.len() + 3, &buffer)?)
            }
            Feed::Text(_) => None,
        };
        Ok(Trainer {
            cfg,
            layer,
            specs,
            program,
            exe,
            client,
            state,
            positions,
            data,
            eval_exe: None,
            step,
            compile_s,
        })
    }

    /// The text a run trains on (`None` for synthetic data).
    pub fn text(&self) -> Option<&TextData> {
        match &self.data {
            Feed::Text(t) => Some(t),
            Feed::Synthetic(_) => None,
        }
    }

    /// The mean loss over `batches` held-out batches (text: the held-out split from its
    /// start, wrapping around; synthetic: batches of steps no run reaches), from the forward
    /// alone on the current parameters (a program compiled at the first call), weighted by
    /// each batch's targets.
    pub fn eval_loss(&mut self, batches: usize) -> Result<f64, TrainError> {
        if self.eval_exe.is_none() {
            let program = build_program(&self.cfg, &self.layer, StepKind::Forward)?;
            self.eval_exe = Some(program.compile(&self.client)?);
        }
        let exe = self.eval_exe.as_ref().expect("compiled above");
        let n = self.specs.len();
        let (mut sum, mut weight) = (0.0, 0.0);
        for k in 0..batches.max(1) {
            let (batch, targets) = self.upload_batch(exe, n, k, true)?;
            let mut inputs: Vec<MeshArgument<'_>> =
                self.state[..n].iter().map(MeshArgument::Lent).collect();
            self.push_batch(&mut inputs, &batch);
            let out = exe.run_on_devices(inputs)?;
            let loss = scalar(exe, 0, &out[0])?;
            sum += loss * targets as f64;
            weight += targets as f64;
        }
        Ok(sum / weight.max(1.0))
    }

    /// The run's settings.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// Steps done.
    pub fn step_count(&self) -> usize {
        self.step
    }

    /// Seconds the step took to compile.
    pub fn compile_seconds(&self) -> f64 {
        self.compile_s
    }

    /// The train step's StableHLO (Shardy's form).
    pub fn program_text(&self) -> String {
        self.program.to_mlir()
    }

    /// The parameter tensors.
    pub fn param_specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// Bytes of training state (parameters, `mu`, `nu`) each device holds
    /// ([`crate::model::state_bytes_per_device`]).
    pub fn state_bytes_per_device(&self) -> usize {
        crate::model::state_bytes_per_device(&self.program, self.specs.len())
    }

    /// Runs one step: the next batch in, the state updated in place on the devices, the
    /// loss and gradient norm out.
    pub fn train_step(&mut self) -> Result<StepMetrics, TrainError> {
        let start = Instant::now();
        let k = self.step;
        let n = self.specs.len();
        let lr = learning_rate(&self.cfg, k);
        let t = (k + 1) as i32;
        let hyper = [
            lr,
            1.0 / (1.0 - self.cfg.adam_b1.powi(t)),
            1.0 / (1.0 - self.cfg.adam_b2.powi(t)),
        ]
        .map(|x| x as f32);
        let hyper = self.exe.upload(3 * n, &f32_buffer(&[3], &hyper)?)?;
        let (batch, _) = self.upload_batch(&self.exe, 3 * n + 1, k, false)?;
        let mut inputs: Vec<MeshArgument<'_>> = std::mem::take(&mut self.state)
            .into_iter()
            .map(MeshArgument::Donated)
            .collect();
        inputs.push(MeshArgument::Lent(&hyper));
        self.push_batch(&mut inputs, &batch);
        let mut outputs = self.exe.run_on_devices(inputs)?;
        let rest = outputs.split_off(3 * n);
        self.state = outputs;
        let loss = scalar(&self.exe, 3 * n, &rest[0])?;
        let grad_norm = scalar(&self.exe, 3 * n + 1, &rest[1])?;
        self.step += 1;
        for (what, value) in [("loss", loss), ("gradient norm", grad_norm)] {
            if !value.is_finite() {
                return Err(TrainError::NonFinite {
                    step: self.step,
                    what,
                    value,
                });
            }
        }
        let step_time_s = start.elapsed().as_secs_f64();
        Ok(StepMetrics {
            step: self.step,
            loss,
            grad_norm,
            learning_rate: lr,
            step_time_s,
            tokens_per_s: self.cfg.tokens_per_step() as f64 / step_time_s,
        })
    }

    /// Batch `k` of the train data (step `k`) or of the held-out data (`eval`), on the
    /// devices as `exe` takes its arguments from `base` on: tokens, targets and positions in
    /// the program's sequence order, segment ids in natural order. Also returns the batch's
    /// targets (positions that have one).
    fn upload_batch(
        &self,
        exe: &Executable<ModelMesh>,
        base: usize,
        k: usize,
        eval: bool,
    ) -> Result<(DeviceBatch, usize), TrainError> {
        let (b, s) = (self.cfg.global_batch(), self.cfg.max_target_length);
        let batch = match &self.data {
            Feed::Synthetic(d) => {
                let step = if eval { SYNTHETIC_EVAL_STEP + k } else { k };
                let batch = d.batch(step, b, s);
                TextBatch {
                    tokens: batch.tokens,
                    targets: batch.targets,
                    positions: Vec::new(),
                    segment_ids: Vec::new(),
                }
            }
            Feed::Text(t) if eval => t.eval_batch(k, b),
            Feed::Text(t) => t.batch(k, b),
        };
        let order = self.layer.sequence_order();
        let lay = |x: &[i32]| -> Vec<i32> {
            (0..b)
                .flat_map(|row| order.iter().map(move |&j| x[row * s + j]))
                .collect()
        };
        let up = |i: usize, x: &[i32]| -> Result<DeviceArray, TrainError> {
            Ok(exe.upload(base + i, &token_buffer(&self.layer, &lay(x))?)?)
        };
        let text = matches!(self.data, Feed::Text(_));
        let device = DeviceBatch {
            tokens: up(0, &batch.tokens)?,
            targets: up(1, &batch.targets)?,
            positions: text.then(|| up(2, &batch.positions)).transpose()?,
            segments: text
                .then(|| -> Result<DeviceArray, TrainError> {
                    let buffer = HostBuffer::from_slice(&[b as i64, s as i64], &batch.segment_ids)?;
                    Ok(exe.upload(base + 3, &buffer)?)
                })
                .transpose()?,
        };
        let targets = batch.targets.iter().filter(|&&t| t >= 0).count();
        Ok((device, targets))
    }

    /// A batch's arguments, after the state (and the step's scalars).
    fn push_batch<'a>(&'a self, inputs: &mut Vec<MeshArgument<'a>>, batch: &'a DeviceBatch) {
        let positions = batch
            .positions
            .as_ref()
            .or(self.positions.as_ref())
            .expect("text batches have positions, synthetic runs their own");
        inputs.extend([
            MeshArgument::Lent(&batch.tokens),
            MeshArgument::Lent(&batch.targets),
            MeshArgument::Lent(positions),
        ]);
        inputs.extend(batch.segments.as_ref().map(MeshArgument::Lent));
    }

    /// The parameters, `mu` and `nu` copied to the host (each checked equal on every
    /// device).
    pub fn state_on_host(&self) -> Result<Vec<Vec<f32>>, TrainError> {
        self.state
            .iter()
            .enumerate()
            .map(|(i, a)| Ok(self.exe.download(i, a)?.to_vec::<f32>()?))
            .collect()
    }

    /// Saves parameters, moments and the step to `path` (safetensors).
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let ck = Checkpoint {
            step: self.step,
            seed: self.cfg.seed,
            model: self.cfg.model.to_string(),
            schedule: checkpoint::Schedule::of(&self.cfg),
            tensors: self.state_on_host()?,
        };
        let tokenizer = self.text().map(|t| t.tokenizer().to_json());
        checkpoint::save_with_tokenizer(path, &self.specs, &ck, tokenizer)
    }

    /// Times the step's stages (best of `reps` runs each, after a warm-up) on this run's
    /// state and its next batch, without changing either.
    pub fn time_split(&self, reps: usize) -> Result<StepTimes, TrainError> {
        let n = self.specs.len();
        let params = &self.state[..n];
        let best = |exe: &Executable<ModelMesh>, with_moments: bool| -> Result<f64, TrainError> {
            let hyper = with_moments
                .then(|| -> Result<DeviceArray, TrainError> {
                    Ok(exe.upload(3 * n, &f32_buffer(&[3], &[1e-9, 1.0, 1.0])?)?)
                })
                .transpose()?;
            let base = if with_moments { 3 * n + 1 } else { n };
            let (batch, _) = self.upload_batch(exe, base, self.step, false)?;
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) + 1 {
                let state = if with_moments {
                    &self.state[..]
                } else {
                    params
                };
                let mut inputs: Vec<MeshArgument<'_>> =
                    state.iter().map(MeshArgument::Lent).collect();
                inputs.extend(hyper.as_ref().map(MeshArgument::Lent));
                self.push_batch(&mut inputs, &batch);
                let start = Instant::now();
                let out = exe.run_on_devices(inputs)?;
                let _ = out
                    .last()
                    .map(|o| exe.download(out.len() - 1, o))
                    .transpose()?;
                best = best.min(start.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let compile = |kind| -> Result<Executable<ModelMesh>, TrainError> {
            Ok(build_program(&self.cfg, &self.layer, kind)?.compile(&self.client)?)
        };
        let forward_s = best(&compile(StepKind::Forward)?, false)?;
        let gradients_s = best(&compile(StepKind::Gradients)?, false)?;
        let step_s = best(&self.exe, true)?;
        let collectives_s = self.time_collectives(reps)?;
        Ok(StepTimes {
            forward_s,
            gradients_s,
            step_s,
            collectives_s,
        })
    }

    /// Runs every collective of the step (and the gradient all-reduce) alone, on arrays of
    /// their shapes, and returns the best time of `reps`.
    fn time_collectives(&self, reps: usize) -> Result<f64, TrainError> {
        let calls = self.program.collectives().to_vec();
        let grad_elements: i64 = self
            .specs
            .iter()
            .map(|s| s.shape.iter().product::<usize>() as i64)
            .sum::<i64>()
            + 1;
        let devices = self.cfg.devices();
        let program = Program::build("collectives", &self.layer.mesh()?, |p| {
            let x = p.arg::<()>([], DType::F32)?;
            let total = p.with_builder(|f| {
                let mut total = f.scalar(0.0, DType::F32)?;
                for call in &calls {
                    let t = TensorType::new(call.input_type.dims.clone(), call.input_type.dtype);
                    let xin = f.convert(x.value(), t.dtype)?;
                    let v = f.broadcast_in_dim(xin, &t.dims, &[])?;
                    let y = call.collective.emit(f, v)?;
                    let rank = f.value_type(y)?.rank() as i64;
                    let s = f.reduce(y, &(0..rank).collect::<Vec<_>>(), Reducer::Sum)?;
                    let s = f.convert(s, DType::F32)?;
                    total = f.add(total, s)?;
                }
                let g = f.broadcast_in_dim(x.value(), &[grad_elements], &[])?;
                let group: Vec<i64> = (0..devices as i64).collect();
                let g = f.all_reduce(
                    g,
                    Reducer::Sum,
                    &[group],
                    tessera_hlo::Grouping::FlattenedIds,
                )?;
                let s = f.reduce(g, &[0], Reducer::Sum)?;
                Ok(f.add(total, s)?)
            })?;
            p.declare::<(), tessera_collectives::Invariant>(total)?
                .output::<()>()
        })?;
        let exe = program.compile(&self.client)?;
        let x = exe.upload(0, &f32_buffer(&[], &[0.0])?)?;
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) + 1 {
            let start = Instant::now();
            let out = exe.run_on_devices(vec![MeshArgument::Lent(&x)])?;
            exe.download(0, &out[0])?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(best)
    }
}

/// Validates `cfg` and gets its devices of `platform`: before anything is built, so a
/// platform this machine does not have is refused at once.
pub(crate) fn devices(cfg: &TrainConfig, platform: Platform) -> Result<Client, TrainError> {
    cfg.validate()?;
    platform.client(cfg.devices()).map_err(TrainError::Devices)
}

/// Validates `cfg` and builds its train step (forward, backward, gradient all-reduce,
/// AdamW) with its attention layer, without compiling it: its kernels lowered for
/// `cfg.lowering` (portable StableHLO by default; [`Lowering::tpu`](tessera_dsl::Lowering::tpu), as
/// [`Trainer`] builds it for TPU devices and `tessera compile train` for a TPU topology).
pub fn train_step_program(
    cfg: &TrainConfig,
) -> Result<(AttentionLayer, Program<ModelMesh>), TrainError> {
    cfg.validate()?;
    let layer = attention_layer(cfg)?;
    let program = build_program(cfg, &layer, StepKind::Train)?;
    Ok((layer, program))
}

/// The attention layer of `cfg` ([`TrainConfig::context_parallel`]) on its batch shards.
pub(crate) fn attention_layer(cfg: &TrainConfig) -> Result<AttentionLayer, TrainError> {
    Ok(AttentionLayer::new(
        cfg.context_parallel(),
        cfg.batch_shards(),
    )?)
}

/// The initial parameters from `seed`: normal (Box-Muller over the seed's stream) or ones.
/// The stream is drawn layer by layer: a run of stacked (`[L, ...]`) parameters takes, for
/// each layer in turn, that layer's row of each, so layer `l` starts as it did when every
/// layer had its own tensors.
fn init_params(specs: &[ParamSpec], seed: u64) -> Vec<Vec<f32>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out: Vec<Vec<f32>> = specs
        .iter()
        .map(|s| Vec::with_capacity(s.shape.iter().product()))
        .collect();
    let mut i = 0;
    while i < specs.len() {
        let run = if specs[i].stacked {
            specs[i..].iter().take_while(|s| s.stacked).count()
        } else {
            1
        };
        let group = i..i + run;
        let layers = if specs[i].stacked {
            specs[i].shape[0]
        } else {
            1
        };
        for _ in 0..layers {
            for k in group.clone() {
                let s = &specs[k];
                let len: usize = s.shape.iter().product::<usize>() / layers;
                fill(&mut out[k], s.init, len, &mut rng);
            }
        }
        i += run;
    }
    out
}

/// Appends `len` values drawn as `init` says.
fn fill(out: &mut Vec<f32>, init: Init, len: usize, rng: &mut fastrand::Rng) {
    match init {
        Init::Ones => out.extend(std::iter::repeat_n(1.0, len)),
        Init::Normal(std) => out.extend((0..len).map(|_| {
            let u1 = 1.0 - rng.f64();
            let u2 = rng.f64();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (z * std) as f32
        })),
    }
}

pub(crate) fn f32_buffer(shape: &[usize], data: &[f32]) -> Result<HostBuffer, TrainError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(HostBuffer::from_slice(&dims, data)?)
}

/// A `[B, S]` int32 array (in the program's sequence order) as the program's
/// `[B, R, S/R]` token input.
pub(crate) fn token_buffer(layer: &AttentionLayer, data: &[i32]) -> Result<HostBuffer, TrainError> {
    Ok(HostBuffer::from_slice(&layer.token_dims(), data)?)
}

/// A replicated scalar output, copied to the host.
fn scalar(exe: &Executable<ModelMesh>, output: usize, a: &DeviceArray) -> Result<f64, TrainError> {
    let v = exe.download(output, a)?.to_vec::<f32>()?;
    Ok(f64::from(v[0]))
}

/// Refuses to resume `path` on `data` when it was trained on the other kind of data, or on
/// text with another tokenizer (read from its header).
fn check_checkpoint_data(path: &Path, data: &Dataset) -> Result<(), TrainError> {
    let saved = checkpoint::saved_tokenizer(path)?;
    let shown = path.display().to_string();
    let e = match (saved, data) {
        (None, Dataset::Synthetic) => return Ok(()),
        (Some(json), Dataset::Text(t)) if json == t.tokenizer().to_json() => return Ok(()),
        (Some(_), Dataset::Text(_)) => DataError::CheckpointTokenizer { path: shown },
        (None, Dataset::Text(_)) => DataError::CheckpointData {
            path: shown,
            text: true,
        },
        (Some(_), Dataset::Synthetic) => DataError::CheckpointData {
            path: shown,
            text: false,
        },
    };
    Err(e.into())
}
