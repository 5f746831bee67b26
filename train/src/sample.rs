//! [`Sampler`]: a continuation of a prompt from a model trained on text, one token at a time
//! (the whole context through the forward for each, no KV cache).

use std::path::Path;

use tessera_collectives::{DeviceArray, Executable, MeshArgument};
use tessera_parallel::{AttentionLayer, ModelMesh};
use tessera_runtime::{HostBuffer, Platform};

use crate::data::{DataError, TextTokenizer};
use crate::model::{build_program, param_specs, StepKind};
use crate::trainer::{attention_layer, devices, f32_buffer, token_buffer};
use crate::{checkpoint, TrainConfig, TrainError};

/// How tokens are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// Softmax temperature; 0 takes the most likely token.
    pub temperature: f64,
    /// Only the `top_k` most likely tokens are drawn from (0: all).
    pub top_k: usize,
    /// Tokens to add at most (fewer when the end-of-text token comes).
    pub max_new_tokens: usize,
    /// Seed of the draws.
    pub seed: u64,
}

/// A model's parameters on the devices and the program of the logits at one position.
pub struct Sampler {
    cfg: TrainConfig,
    layer: AttentionLayer,
    exe: Executable<ModelMesh>,
    params: Vec<DeviceArray>,
    tokenizer: TextTokenizer,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Sampler {
    /// The parameters of the checkpoint at `path` (of `cfg`'s model; its seed and schedule
    /// are not checked) with the tokenizer it was trained with; refused for a checkpoint
    /// trained on synthetic data, which has none.
    pub fn from_checkpoint(
        cfg: TrainConfig,
        path: &Path,
        platform: Platform,
    ) -> Result<Self, TrainError> {
        let shown = path.display().to_string();
        let json = checkpoint::saved_tokenizer(path)?.ok_or_else(|| DataError::CheckpointData {
            path: shown.clone(),
            text: true,
        })?;
        let tokenizer = TextTokenizer::from_json(&json, &shown)?;
        let params = checkpoint::load_parameters(path, &param_specs(&cfg.model), &cfg)?;
        Self::new(cfg, platform, params, tokenizer)
    }

    /// `params` (in [`param_specs`] order) of `cfg`'s model on `platform`'s devices, with
    /// `tokenizer`.
    pub fn new(
        mut cfg: TrainConfig,
        platform: Platform,
        params: Vec<Vec<f32>>,
        tokenizer: TextTokenizer,
    ) -> Result<Self, TrainError> {
        cfg.segment_ids = true;
        cfg.lowering = tessera_parallel::kernel_lowering(platform, &cfg.lowering);
        let client = devices(&cfg, platform)?;
        let layer = attention_layer(&cfg)?;
        let exe = build_program(&cfg, &layer, StepKind::Logits)?.compile(&client)?;
        let specs = param_specs(&cfg.model);
        let params = params
            .iter()
            .zip(&specs)
            .enumerate()
            .map(|(i, (p, s))| Ok(exe.upload(i, &f32_buffer(&s.shape, p)?)?))
            .collect::<Result<Vec<_>, TrainError>>()?;
        Ok(Sampler {
            cfg,
            layer,
            exe,
            params,
            tokenizer,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The logits of the token after `context` (its last `max_target_length - 1` tokens,
    /// after an end-of-text token as every document starts).
    pub fn next_logits(&self, context: &[u32]) -> Result<Vec<f32>, TrainError> {
        let (b, s) = (self.cfg.global_batch(), self.cfg.max_target_length);
        let keep = &context[context.len().saturating_sub(s - 1)..];
        let len = keep.len() + 1;
        let mut tokens = vec![0i32; b * s];
        let mut targets = vec![-1i32; b * s];
        let mut positions = vec![0i32; b * s];
        let mut segments = vec![0i32; b * s];
        tokens[0] = self.tokenizer.eos() as i32;
        for (i, &t) in keep.iter().enumerate() {
            tokens[i + 1] = t as i32;
        }
        for i in 0..len {
            positions[i] = i as i32;
            segments[i] = 1;
        }
        targets[len - 1] = 0;
        let order = self.layer.sequence_order();
        let lay = |x: &[i32]| -> Vec<i32> {
            (0..b)
                .flat_map(|row| order.iter().map(move |&j| x[row * s + j]))
                .collect()
        };
        let n = self.params.len();
        let up = |i: usize, x: &[i32]| -> Result<DeviceArray, TrainError> {
            Ok(self
                .exe
                .upload(n + i, &token_buffer(&self.layer, &lay(x))?)?)
        };
        let arrays = [
            up(0, &tokens)?,
            up(1, &targets)?,
            up(2, &positions)?,
            self.exe.upload(
                n + 3,
                &HostBuffer::from_slice(&[b as i64, s as i64], &segments)?,
            )?,
        ];
        let mut inputs: Vec<MeshArgument<'_>> =
            self.params.iter().map(MeshArgument::Lent).collect();
        inputs.extend(arrays.iter().map(MeshArgument::Lent));
        let out = self.exe.run_on_devices(inputs)?;
        Ok(self.exe.download(0, &out[0])?.to_vec::<f32>()?)
    }

    /// `prompt` continued as `opts` says: the continuation's text (without the prompt).
    pub fn sample(&self, prompt: &str, opts: SampleOptions) -> Result<String, TrainError> {
        let mut context = self.tokenizer.encode(prompt)?;
        let start = context.len();
        let mut rng = fastrand::Rng::with_seed(opts.seed);
        for _ in 0..opts.max_new_tokens {
            let logits = self.next_logits(&context)?;
            let vocab = self.tokenizer.vocab_size().min(logits.len());
            let next = draw(&logits[..vocab], opts, &mut rng);
            if next == self.tokenizer.eos() {
                break;
            }
            context.push(next);
        }
        Ok(self.tokenizer.decode(&context[start..])?)
    }
}

/// A token drawn from `logits` at `opts.temperature` among the `opts.top_k` most likely (the
/// most likely at temperature 0).
fn draw(logits: &[f32], opts: SampleOptions, rng: &mut fastrand::Rng) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if opts.temperature <= 0.0 || order.len() <= 1 {
        return order.first().copied().unwrap_or(0) as u32;
    }
    if opts.top_k > 0 {
        order.truncate(opts.top_k);
    }
    let top = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - top) / opts.temperature).exp())
        .collect();
    let mut u = rng.f64() * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_temperature_and_top_k() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let mut rng = fastrand::Rng::with_seed(1);
        let greedy = SampleOptions {
            temperature: 0.0,
            top_k: 0,
            max_new_tokens: 1,
            seed: 0,
        };
        assert_eq!(draw(&logits, greedy, &mut rng), 1);
        let top2 = SampleOptions {
            temperature: 1.0,
            top_k: 2,
            ..greedy
        };
        let drawn: std::collections::BTreeSet<u32> =
            (0..200).map(|_| draw(&logits, top2, &mut rng)).collect();
        assert_eq!(drawn.into_iter().collect::<Vec<_>>(), [1, 3]);
    }
}
