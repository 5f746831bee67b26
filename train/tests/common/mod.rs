//! What the train tests share.

use tessera_train::{ModelConfig, TrainConfig};

/// A model small enough for CI (1 layer, 4 heads of 8, 2 KV heads), 64 tokens on 4 context
/// devices, blocks 16, 5 steps.
pub fn micro() -> TrainConfig {
    let model = ModelConfig {
        vocab: 32,
        d_model: 32,
        layers: 1,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        mlp_dim: 64,
        rope_theta: 10_000.0,
        norm_eps: 1e-6,
    };
    let mut cfg = TrainConfig::new(model);
    cfg.steps = 5;
    cfg.max_target_length = 64;
    cfg.sa_block_q = 16;
    cfg.sa_block_kv = 16;
    cfg.sa_block_q_dkv = 16;
    cfg.sa_block_kv_dkv = 16;
    cfg.warmup_steps = 1;
    cfg.learning_rate = 1e-2;
    cfg.seed = 3;
    cfg
}
