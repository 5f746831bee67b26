//! Training on text on 4 virtual CPU devices: Cicero's De finibus, book I (the `lipsum`
//! crate's public-domain text, written to a temporary file and read as a `.txt` data set),
//! a byte-level BPE trained on it, packed rows with segment ids through the context-parallel
//! attention.

mod common;

use std::path::Path;

use common::micro;
use tessera_parallel::strategy::{AllGather, Ring, Ulysses, Usp};
use tessera_parallel::Strategy;
use tessera_runtime::Platform;
use tessera_train::data::{TextData, TextOptions, TextTokenizer};
use tessera_train::{Dataset, StepMetrics, TrainConfig, Trainer};

/// The tests that train run one at a time: each already uses every core (4 devices).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The micro model with a vocabulary for a small BPE (the 256 bytes, end-of-text and 63
/// merges).
fn text_config() -> TrainConfig {
    let mut cfg = micro();
    cfg.model.vocab = 320;
    cfg.model.d_model = 64;
    cfg.model.mlp_dim = 128;
    cfg.learning_rate = 1e-2;
    cfg.warmup_steps = 5;
    cfg
}

/// The shipped text as a data set in `dir`, read, tokenized and packed for `cfg`.
fn shipped_text(dir: &Path, cfg: &TrainConfig, packing: bool) -> TextData {
    let path = dir.join("liber_primus.txt");
    std::fs::write(&path, lipsum::LIBER_PRIMUS).unwrap();
    let opts = TextOptions {
        path,
        column: "text".into(),
        tokenizer: None,
        vocab: cfg.model.vocab,
        seq: cfg.max_target_length,
        packing,
    };
    TextData::load(&opts, None, cfg.seed).unwrap()
}

fn run(cfg: TrainConfig, text: &TextData, steps: usize) -> (Trainer, Vec<StepMetrics>) {
    let data = Dataset::Text(Box::new(text.clone()));
    let mut t = Trainer::with_data(cfg, Platform::Cpu, data, None).unwrap();
    let m = (0..steps).map(|_| t.train_step().unwrap()).collect();
    (t, m)
}

/// With packing and Ulysses the held-out loss falls below the text's unigram entropy (the
/// model learns more than how often each token comes); all-gather takes the same 20 steps
/// within 1e-3.
#[test]
fn packed_text_learns_below_the_unigram_entropy_and_strategies_agree() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = text_config();
    cfg.steps = 60;
    let text = shipped_text(dir.path(), &cfg, true);
    let entropy = text.unigram_entropy();
    assert!(entropy > 2.0, "a unigram entropy of text: {entropy}");
    let data = Dataset::Text(Box::new(text.clone()));
    let mut trainer = Trainer::with_data(cfg.clone(), Platform::Cpu, data, None).unwrap();
    let before = trainer.eval_loss(4).unwrap();
    let ulysses: Vec<StepMetrics> = (0..cfg.steps)
        .map(|_| trainer.train_step().unwrap())
        .collect();
    let eval = trainer.eval_loss(4).unwrap();
    eprintln!(
        "ulysses, packed: loss {:.4} -> {:.4}, eval loss {before:.4} -> {eval:.4}, unigram \
         entropy {entropy:.4}",
        ulysses[0].loss,
        ulysses[ulysses.len() - 1].loss
    );
    assert!(
        before > entropy,
        "an untrained model is no better than unigrams: {before}"
    );
    assert!(
        eval < entropy,
        "eval loss {eval} after {} steps, unigram entropy {entropy}",
        cfg.steps
    );
    let mut gather = cfg.clone();
    gather.strategy = Strategy::from(AllGather);
    let (_, all_gather) = run(gather, &text, 20);
    let diff = ulysses
        .iter()
        .zip(&all_gather)
        .map(|(a, b)| (a.loss - b.loss).abs())
        .fold(0.0, f64::max);
    eprintln!("max |ulysses - all_gather| over 20 steps: {diff:.2e}");
    for (a, b) in ulysses.iter().zip(&all_gather) {
        assert!(
            (a.loss - b.loss).abs() <= 1e-3,
            "step {}: ulysses {} all_gather {}",
            a.step,
            a.loss,
            b.loss
        );
    }
}

/// Documents two to a row (packed, segment ids keeping them apart, positions from 0 in each)
/// give the losses of the same documents one to a row with padding (twice the rows), before
/// and after an update: on every strategy (the ring and all-gather load balanced; Ulysses on
/// data 2 x context 2), whose context shards cut the documents of 22 to 32 tokens.
#[test]
fn packed_rows_give_the_losses_of_one_document_a_row() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), lipsum::LIBER_PRIMUS).unwrap();
    let cfg = text_config();
    let docs = tessera_train::data::read_documents(dir.path(), "text").unwrap();
    let tokenizer = TextTokenizer::train_bpe(&docs, cfg.model.vocab).unwrap();
    // Nine documents of 21..=31 tokens (22..=32 pairs: two fit a row of 64, three do not);
    // the last is held out.
    let ids: Vec<Vec<u32>> = tokenizer
        .encode(lipsum::LIBER_PRIMUS)
        .unwrap()
        .chunks(32)
        .take(9)
        .enumerate()
        .map(|(i, c)| c[..21 + (i * 7) % 11].to_vec())
        .collect();
    let usp = Strategy::from(Usp {
        ulysses: 2,
        ring: 2,
    });
    for (strategy, balanced) in [
        (Strategy::from(Ulysses), false),
        (Strategy::from(Ring), true),
        (Strategy::from(AllGather), true),
        (usp, false),
    ] {
        let mut packed_cfg = cfg.clone();
        packed_cfg.strategy = strategy.clone();
        packed_cfg.load_balance = balanced;
        if balanced {
            // Each device holds two chunks of 8.
            packed_cfg.sa_block_q = 8;
            packed_cfg.sa_block_kv = 8;
            packed_cfg.sa_block_q_dkv = 8;
            packed_cfg.sa_block_kv_dkv = 8;
        }
        if strategy == Strategy::from(Ulysses) {
            // And the batch over 2 data shards (the rows' segment ids split with them).
            packed_cfg.ici_data_parallelism = 2;
            packed_cfg.ici_context_parallelism = 2;
        }
        let name = format!("{strategy} on data {}", packed_cfg.ici_data_parallelism);
        let mut unpacked_cfg = packed_cfg.clone();
        unpacked_cfg.per_device_batch_size = 2.0;
        let packed = TextData::from_token_ids(&ids, tokenizer.clone(), 64, true, 1).unwrap();
        let unpacked = TextData::from_token_ids(&ids, tokenizer.clone(), 64, false, 1).unwrap();
        assert_eq!(packed.train_rows().len(), 4);
        assert_eq!(unpacked.train_rows().len(), 8);
        let (_, a) = run(packed_cfg, &packed, 2);
        let (_, b) = run(unpacked_cfg, &unpacked, 2);
        eprintln!(
            "{name}: packed {:?}, unpacked {:?}",
            a.iter().map(|m| m.loss).collect::<Vec<_>>(),
            b.iter().map(|m| m.loss).collect::<Vec<_>>()
        );
        for (a, b) in a.iter().zip(&b) {
            assert!(
                (a.loss - b.loss).abs() <= 1e-4,
                "{name}: step {}: packed {} unpacked {}",
                a.step,
                a.loss,
                b.loss
            );
        }
    }
}
