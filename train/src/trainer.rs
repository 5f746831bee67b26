//! [`Trainer`]: one compiled train step, the state on the devices, the data fed step by step.

use std::path::Path;
use std::time::Instant;

use tessera_collectives::{DeviceArray, Executable, MeshArgument, Program};
use tessera_hlo::{DType, Reducer, TensorType};
use tessera_parallel::{kernel_lowering, AttentionLayer, ModelMesh};
use tessera_runtime::{Client, HostBuffer, Platform};

use crate::checkpoint::{self, Checkpoint};
use crate::model::{build_program, param_specs, Init, ParamSpec, StepKind};
use crate::{SettingError, SyntheticData, TrainConfig, TrainError};

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
/// `warmup_steps`, then a cosine down to `final_lr_fraction` of it at `steps`.
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
    positions: DeviceArray,
    data: SyntheticData,
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
        let client = devices(&cfg, platform)?;
        let specs = param_specs(&cfg.model);
        let init = init_params(&specs, cfg.seed);
        let zeros: Vec<Vec<f32>> = init.iter().map(|p| vec![0.0; p.len()]).collect();
        let tensors = init.iter().chain(&zeros).chain(&zeros).cloned().collect();
        Self::with_state(cfg, platform, client, tensors, 0)
    }

    /// Continues the run saved at `path`: its parameters, moments and step (the data goes
    /// on from that step), on `platform` as [`Trainer::new`]. `cfg` must have the
    /// checkpoint's model and seed.
    pub fn resume(cfg: TrainConfig, path: &Path, platform: Platform) -> Result<Self, TrainError> {
        let client = devices(&cfg, platform)?;
        let specs = param_specs(&cfg.model);
        let ck = checkpoint::load(path, &specs, &cfg)?;
        if ck.step >= cfg.steps {
            return Err(SettingError::ResumeAtEnd {
                path: path.display().to_string(),
                step: ck.step,
                steps: cfg.steps,
            }
            .into());
        }
        Self::with_state(cfg, platform, client, ck.tensors, ck.step)
    }

    fn with_state(
        mut cfg: TrainConfig,
        platform: Platform,
        client: Client,
        tensors: Vec<Vec<f32>>,
        step: usize,
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
        let order = layer.sequence_order();
        let batch = cfg.global_batch();
        let positions: Vec<i32> = (0..batch)
            .flat_map(|_| order.iter().map(|&p| p as i32))
            .collect();
        let positions = exe.upload(3 * specs.len() + 3, &token_buffer(&layer, &positions)?)?;
        let data = SyntheticData::new(cfg.seed, cfg.model.vocab);
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
            step,
            compile_s,
        })
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
        let (tokens, targets) = self.batch(k)?;
        let mut inputs: Vec<MeshArgument<'_>> = std::mem::take(&mut self.state)
            .into_iter()
            .map(MeshArgument::Donated)
            .collect();
        inputs.extend([
            MeshArgument::Lent(&hyper),
            MeshArgument::Lent(&tokens),
            MeshArgument::Lent(&targets),
            MeshArgument::Lent(&self.positions),
        ]);
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

    /// The batch of step `k` on the devices: tokens and targets in the program's order.
    fn batch(&self, k: usize) -> Result<(DeviceArray, DeviceArray), TrainError> {
        let (b, s) = (self.cfg.global_batch(), self.cfg.max_target_length);
        let batch = self.data.batch(k, b, s);
        let order = self.layer.sequence_order();
        let lay = |x: &[i32]| -> Vec<i32> {
            (0..b)
                .flat_map(|row| order.iter().map(move |&j| x[row * s + j]))
                .collect()
        };
        let base = 3 * self.specs.len() + 1;
        let tokens = self
            .exe
            .upload(base, &token_buffer(&self.layer, &lay(&batch.tokens))?)?;
        let targets = self
            .exe
            .upload(base + 1, &token_buffer(&self.layer, &lay(&batch.targets))?)?;
        Ok((tokens, targets))
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
        checkpoint::save(path, &self.specs, &ck)
    }

    /// Times the step's stages (best of `reps` runs each, after a warm-up) on this run's
    /// state and its next batch, without changing either.
    pub fn time_split(&self, reps: usize) -> Result<StepTimes, TrainError> {
        let n = self.specs.len();
        let params = &self.state[..n];
        let (tokens, targets) = self.batch(self.step)?;
        let best = |exe: &Executable<ModelMesh>, with_moments: bool| -> Result<f64, TrainError> {
            let hyper = with_moments
                .then(|| -> Result<DeviceArray, TrainError> {
                    Ok(exe.upload(3 * n, &f32_buffer(&[3], &[1e-9, 1.0, 1.0])?)?)
                })
                .transpose()?;
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
                inputs.extend([
                    MeshArgument::Lent(&tokens),
                    MeshArgument::Lent(&targets),
                    MeshArgument::Lent(&self.positions),
                ]);
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
fn devices(cfg: &TrainConfig, platform: Platform) -> Result<Client, TrainError> {
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
fn attention_layer(cfg: &TrainConfig) -> Result<AttentionLayer, TrainError> {
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

fn f32_buffer(shape: &[usize], data: &[f32]) -> Result<HostBuffer, TrainError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(HostBuffer::from_slice(&dims, data)?)
}

/// A `[B, S]` int32 array (in the program's sequence order) as the program's
/// `[B, R, S/R]` token input.
fn token_buffer(layer: &AttentionLayer, data: &[i32]) -> Result<HostBuffer, TrainError> {
    Ok(HostBuffer::from_slice(&layer.token_dims(), data)?)
}

/// A replicated scalar output, copied to the host.
fn scalar(exe: &Executable<ModelMesh>, output: usize, a: &DeviceArray) -> Result<f64, TrainError> {
    let v = exe.download(output, a)?.to_vec::<f32>()?;
    Ok(f64::from(v[0]))
}
