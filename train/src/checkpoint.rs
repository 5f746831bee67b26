//! Checkpoints as safetensors: every parameter under its name, AdamW's moments as
//! `adam_mu.NAME` and `adam_nu.NAME` (all f32), and in the metadata the step, the seed and
//! the model's dims, which a resume checks against its own run.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::model::ParamSpec;
use crate::{ModelConfig, SettingError, TrainError};

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Steps done.
    pub step: usize,
    /// The run's seed (the data of step `t` is the seed's batch `t`).
    pub seed: u64,
    /// The model's dims, as `ModelConfig`'s display.
    pub model: String,
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

/// Writes `ck` for the parameters `specs` to `path` (through a temporary file beside it, so
/// a crash leaves the old checkpoint whole).
pub fn save(path: &Path, specs: &[ParamSpec], ck: &Checkpoint) -> Result<(), TrainError> {
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
    let metadata = HashMap::from([
        ("format".to_string(), "tessera-train".to_string()),
        ("step".to_string(), ck.step.to_string()),
        ("seed".to_string(), ck.seed.to_string()),
        ("model".to_string(), ck.model.clone()),
    ]);
    let data =
        safetensors::serialize(views, Some(metadata)).map_err(|e| err(path, e.to_string()))?;
    let tmp = path.with_extension("safetensors.tmp");
    std::fs::write(&tmp, data).map_err(|e| err(path, format!("cannot write: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| err(path, format!("cannot write: {e}")))
}

/// Reads a checkpoint of the model `model` (parameters `specs`) with the run's `seed`;
/// fails with what differs when it was written by another model or seed.
pub fn load(
    path: &Path,
    specs: &[ParamSpec],
    model: &ModelConfig,
    seed: u64,
) -> Result<Checkpoint, TrainError> {
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
    if saved_seed != seed {
        return Err(SettingError::CheckpointSeed {
            path: path.display().to_string(),
            saved: saved_seed,
            seed,
        }
        .into());
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
            Ok(t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checkpoint {
        step,
        seed,
        model: saved_model,
        tensors,
    })
}
