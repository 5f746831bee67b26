//! Model FLOPs per step as MaxText counts them, and the peak they are measured against.

use std::path::PathBuf;
use std::time::Instant;

use tessera_hlo::{DType, Module};
use tessera_runtime::{Client, CompileOptions, HostBuffer, Provisioner};

use crate::{ModelConfig, TrainConfig, TrainError};

/// Model FLOPs of one training step: `6 N` per token for the `N` matmul parameters
/// (forward, and twice that backward) plus causal attention, `3 x 4 B S^2 H D / 2` per layer
/// (scores and the weighted sum, forward and backward, half the pairs masked).
pub fn model_flops_per_step(cfg: &TrainConfig) -> f64 {
    model_flops(&cfg.model, cfg.global_batch() as f64, cfg.max_target_length)
}

/// [`model_flops_per_step`] for `sequences` sequences of `seq_len` tokens (MaxText's
/// `calculate_tflops_training_per_device` times the devices).
pub fn model_flops(m: &ModelConfig, sequences: f64, seq_len: usize) -> f64 {
    let s = seq_len as f64;
    let dense = 6.0 * m.matmul_params() as f64 * sequences * s;
    let attention =
        3.0 * m.layers as f64 * 4.0 * sequences * s * s * (m.heads * m.head_dim) as f64 / 2.0;
    dense + attention
}

/// The machine's f32 matmul peak in FLOP/s: a `[n, n] x [n, n]` dot compiled for one CPU
/// device (which uses every core) and timed (best of 5), measured once per plugin library
/// and cached in `$TESSERA_CACHE_DIR/train/matmul_peak_f32_<n>_<plugin>.txt`.
pub fn matmul_peak(n: usize) -> Result<f64, TrainError> {
    let path = cache_path(n);
    if let Some(peak) = path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|p| p.is_finite() && *p > 0.0)
    {
        return Ok(peak);
    }
    let peak = measure_matmul(n)?;
    if let Some(path) = path {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // A cache: failing to write it only means measuring again next time.
        let _ = std::fs::write(&path, format!("{peak}\n"));
    }
    Ok(peak)
}

fn cache_path(n: usize) -> Option<PathBuf> {
    let cache = Provisioner::from_env().ok()?.cache_dir().to_path_buf();
    // Another plugin (another XLA) has another peak: the library's path names the entry.
    let plugin = tessera_runtime::cpu_plugin_path().ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&plugin, &mut hasher);
    let key = std::hash::Hasher::finish(&hasher);
    Some(
        cache
            .join("train")
            .join(format!("matmul_peak_f32_{n}_{key:016x}.txt")),
    )
}

fn measure_matmul(n: usize) -> Result<f64, TrainError> {
    let program = Module::square_dot(n, DType::F32)
        .map_err(|e| TrainError::Collective(e.into()))?
        .to_mlir();
    let client = Client::cpu_shared(1)?;
    let exe = client.compile(&program, &CompileOptions::single_device())?;
    let dims = [n as i64, n as i64];
    let values: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.25).collect();
    let a = client.buffer_from_host(&HostBuffer::from_slice(&dims, &values)?, 0)?;
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        let start = Instant::now();
        let out = exe.execute(&[[&a, &a]])?;
        // Wait for the data, not just the launch.
        let _ = out[0][0].to_host()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n as f64).powi(3) / best)
}
