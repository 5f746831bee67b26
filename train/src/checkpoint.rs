//! Checkpoints as safetensors: every parameter under its name, AdamW's moments as
//! `adam_mu.NAME` and `adam_nu.NAME` (all f32), and in the metadata the step, the seed, the
//! model's dims and the learning-rate schedule ([`Schedule`]), which a resume checks against
//! its own run; a checkpoint holding a non-finite number is refused.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::model::ParamSpec;
use crate::{Setting, SettingError, TrainConfig, TrainError};

/// The learning-rate schedule of a run ([`crate::learning_rate`]): a resume must have the
/// same one, or its learning rates would jump mid-run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Steps the cosine spans.
    pub steps: usize,
    /// Linear warmup steps.
    pub warmup_steps: usize,
    /// The peak learning rate.
    pub learning_rate: f64,
    /// The final learning rate as a fraction of the peak.
    pub final_lr_fraction: f64,
}

impl Schedule {
    /// The schedule of `cfg`.
    pub fn of(cfg: &TrainConfig) -> Self {
        Schedule {
            steps: cfg.steps,
            warmup_steps: cfg.warmup_steps,
            learning_rate: cfg.learning_rate,
            final_lr_fraction: cfg.final_lr_fraction,
        }
    }

    /// Each setting as the metadata key it is stored under and its value's text (Rust's
    /// shortest round-trip form for the rates).
    fn entries(&self) -> [(Setting, &'static str, String); 4] {
        [
            (Setting::Steps, "steps", self.steps.to_string()),
            (
                Setting::WarmupSteps,
                "warmup_steps",
                self.warmup_steps.to_string(),
            ),
            (
                Setting::LearningRate,
                "learning_rate",
                self.learning_rate.to_string(),
            ),
            (
                Setting::FinalLrFraction,
                "final_lr_fraction",
                self.final_lr_fraction.to_string(),
            ),
        ]
    }
}

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Steps done.
    pub step: usize,
    /// The run's seed (the data of step `t` is the seed's batch `t`).
    pub seed: u64,
    /// The model's dims, as `ModelConfig`'s display.
    pub model: String,
    /// The learning-rate schedule it was trained with.
    pub schedule: Schedule,
    /// Parameters, then `mu`, then `nu`, each in [`crate::model::param_specs`] order.
    pub tensors: Vec<Vec<f32>>,
}

fn err(path: &Path, reason: impl Into<String>) -> TrainError {
    TrainError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn names(specs: &[ParamSpec]) -> Vec<String> {
    let base = specs.iter().map(|s| s.name.clone());
    let mu = specs.iter().map(|s| format!("adam_mu.{}", s.name));
    let nu = specs.iter().map(|s| format!("adam_nu.{}", s.name));
    base.chain(mu).chain(nu).collect()
}

/// Writes `ck` for the parameters `specs` to `path` (through a temporary file beside it,
/// renamed over `path` once whole, so a crash leaves the old checkpoint whole and no
/// temporary file). Refuses a `path` that exists and is not a regular file (a directory, a
/// device such as `/dev/null`, a pipe): renaming over it would replace it.
pub fn save(path: &Path, specs: &[ParamSpec], ck: &Checkpoint) -> Result<(), TrainError> {
    save_with_tokenizer(path, specs, ck, None)
}

/// [`save`], with the `tokenizer.json` text of a run on text in the metadata (`tokenizer`),
/// which a resume and sampling read back ([`saved_tokenizer`]).
pub fn save_with_tokenizer(
    path: &Path,
    specs: &[ParamSpec],
    ck: &Checkpoint,
    tokenizer: Option<&str>,
) -> Result<(), TrainError> {
    if let Ok(m) = std::fs::metadata(path) {
        if !m.is_file() {
            return Err(err(
                path,
                "it exists and is not a regular file (a directory, a device or a pipe); save \
                 to a file path",
            ));
        }
    }
    let names = names(specs);
    let shapes = specs
        .iter()
        .chain(specs)
        .chain(specs)
        .map(|s| s.shape.clone());
    let bytes: Vec<Vec<u8>> = ck
        .tensors
        .iter()
        .map(|t| t.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = names
        .iter()
        .zip(shapes)
        .zip(&bytes)
        .map(|((n, shape), b)| {
            TensorView::new(Dtype::F32, shape, b)
                .map(|v| (n.clone(), v))
                .map_err(|e| err(path, e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut metadata = HashMap::from([
        ("format".to_string(), "tessera-train".to_string()),
        ("step".to_string(), ck.step.to_string()),
        ("seed".to_string(), ck.seed.to_string()),
        ("model".to_string(), ck.model.clone()),
    ]);
    for (_, key, value) in ck.schedule.entries() {
        metadata.insert(key.to_string(), value);
    }
    if let Some(json) = tokenizer {
        metadata.insert(TOKENIZER_KEY.to_string(), json.to_string());
    }
    let data =
        safetensors::serialize(views, Some(metadata)).map_err(|e| err(path, e.to_string()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let cannot = |e: std::io::Error| err(path, format!("cannot write: {e}"));
    // Removed when dropped, so a failed write leaves nothing behind.
    let mut builder = tempfile::Builder::new();
    builder.prefix(".checkpoint.").suffix(".tmp");
    // Temporary files are private (0600); the checkpoint gets what a plain create gives
    // (0666 less the umask).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut tmp = builder.tempfile_in(dir).map_err(cannot)?;
    std::io::Write::write_all(&mut tmp, &data).map_err(cannot)?;
    tmp.persist(path).map_err(|e| cannot(e.error))?;
    Ok(())
}

/// The step a checkpoint was saved at, read from its header alone (so a run can refuse a
/// resume that would train nothing before it builds anything).
pub fn saved_step(path: &Path) -> Result<usize, TrainError> {
    header_metadata(path)?["step"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| err(path, "not a tessera-train checkpoint (no step metadata)"))
}

/// The metadata key of a run on text's tokenizer.
const TOKENIZER_KEY: &str = "tokenizer";

/// The `tokenizer.json` text a checkpoint was trained with, or `None` for one trained on
/// synthetic data; read from its header alone.
pub fn saved_tokenizer(path: &Path) -> Result<Option<String>, TrainError> {
    let meta = header_metadata(path)?;
    if meta["format"].as_str() != Some("tessera-train") {
        return Err(err(
            path,
            "not a tessera-train checkpoint (no format metadata)",
        ));
    }
    Ok(meta[TOKENIZER_KEY].as_str().map(str::to_string))
}

/// A checkpoint's `__metadata__`, read from its header alone.
fn header_metadata(path: &Path) -> Result<serde_json::Value, TrainError> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let not = |why: String| err(path, format!("not a safetensors file ({why})"));
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| not(e.to_string()))?;
    let len = u64::from_le_bytes(len);
    // safetensors' own limit on a header.
    if len > 100_000_000 {
        return Err(not(format!("a header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header)
        .map_err(|e| not(e.to_string()))?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| not(e.to_string()))?;
    Ok(header["__metadata__"].clone())
}

/// Reads a checkpoint of `cfg`'s model (parameters `specs`) for a run of `cfg`; fails with
/// what differs when it was written by another model, seed or schedule, and when it holds a
/// number that is not finite.
pub fn load(path: &Path, specs: &[ParamSpec], cfg: &TrainConfig) -> Result<Checkpoint, TrainError> {
    load_checked(path, specs, cfg, true)
}

/// The parameters of a checkpoint of `cfg`'s model (its seed and schedule not checked: for
/// sampling, which trains nothing); the first `specs.len()` tensors of the result.
pub fn load_parameters(
    path: &Path,
    specs: &[ParamSpec],
    cfg: &TrainConfig,
) -> Result<Vec<Vec<f32>>, TrainError> {
    let mut ck = load_checked(path, specs, cfg, false)?;
    ck.tensors.truncate(specs.len());
    Ok(ck.tensors)
}

fn load_checked(
    path: &Path,
    specs: &[ParamSpec],
    cfg: &TrainConfig,
    same_run: bool,
) -> Result<Checkpoint, TrainError> {
    let (model, seed) = (&cfg.model, cfg.seed);
    let data = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let (_, meta) = SafeTensors::read_metadata(&data)
        .map_err(|e| err(path, format!("not a safetensors file ({e})")))?;
    let meta = meta.metadata().clone().unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some("tessera-train") {
        return Err(err(
            path,
            "not a tessera-train checkpoint (no format metadata)",
        ));
    }
    let get = |key: &str| {
        meta.get(key)
            .cloned()
            .ok_or_else(|| err(path, format!("the metadata has no `{key}`")))
    };
    let saved_model = get("model")?;
    if saved_model != model.to_string() {
        return Err(SettingError::CheckpointModel {
            path: path.display().to_string(),
            saved: saved_model,
            model: model.to_string(),
        }
        .into());
    }
    let saved_seed: u64 = get("seed")?.parse().map_err(|_| err(path, "bad seed"))?;
    if same_run && saved_seed != seed {
        return Err(SettingError::CheckpointSeed {
            path: path.display().to_string(),
            saved: saved_seed,
            seed,
        }
        .into());
    }
    let schedule = Schedule::of(cfg);
    for (setting, key, run) in schedule.entries() {
        let saved = get(key)?;
        if same_run && saved != run {
            return Err(SettingError::CheckpointSchedule {
                path: path.display().to_string(),
                setting,
                saved,
                run,
            }
            .into());
        }
    }
    let step: usize = get("step")?.parse().map_err(|_| err(path, "bad step"))?;
    let st = SafeTensors::deserialize(&data).map_err(|e| err(path, e.to_string()))?;
    let shapes = specs.iter().chain(specs).chain(specs).map(|s| &s.shape);
    let tensors = names(specs)
        .iter()
        .zip(shapes)
        .map(|(name, shape)| {
            let t = st
                .tensor(name)
                .map_err(|_| err(path, format!("it has no tensor `{name}`")))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape.as_slice() {
                return Err(err(
                    path,
                    format!(
                        "`{name}` is {:?} {:?}, the model needs F32 {shape:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
            let values: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if let Some(bad) = values.iter().find(|x| !x.is_finite()) {
                return Err(err(
                    path,
                    format!(
                        "`{name}` holds {bad}, not a finite number; resume from an earlier \
                         checkpoint"
                    ),
                ));
            }
            Ok(values)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checkpoint {
        step,
        seed,
        model: saved_model,
        schedule,
        tensors,
    })
}
