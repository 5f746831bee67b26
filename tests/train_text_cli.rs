//! The train example on text (`--dataset-type hf`): bad data, tokenizers and checkpoints are
//! refused with one sentence naming the file, an exit status below 124 and nothing written;
//! a small run on the shipped text (Cicero's De finibus, book I, from the `lipsum` crate)
//! logs its eval loss, saves a checkpoint with its tokenizer, and samples from it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{assert_refused, train_example, Dir};
use tessera_train::checkpoint::{self, Checkpoint, Schedule};
use tessera_train::data::{read_documents, TextTokenizer};
use tessera_train::model::param_specs;
use tessera_train::{ModelConfig, TrainConfig};

/// A model small enough for CI: 1 layer, 4 heads of 8, 64 tokens, blocks 16 (and vocab
/// 300 unless a test gives its own).
const SMALL: &[&str] = &[
    "--d-model",
    "32",
    "--layers",
    "1",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--head-dim",
    "8",
    "--mlp-dim",
    "64",
    "--max-target-length",
    "64",
    "--sa-block-q",
    "16",
    "--sa-block-kv",
    "16",
    "--sa-block-q-dkv",
    "16",
    "--sa-block-kv-dkv",
    "16",
];

/// Runs the example in `dir` with the small model and `args`.
fn train(dir: &Dir, args: &[&str]) -> Output {
    Command::new(train_example())
        .current_dir(&dir.0)
        .env_remove("TESSERA_GPU_PJRT_PLUGIN")
        .env_remove("TESSERA_NUM_PROCESSES")
        .args(SMALL)
        .args(if args.contains(&"--vocab") {
            &[][..]
        } else {
            &["--vocab", "300"][..]
        })
        .args(args)
        .output()
        .unwrap()
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(contents(&p));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            out.push((p, bytes));
        }
    }
    out.sort();
    out
}

/// Runs `args`, asserts a refusal containing `want` and that `dir` holds what it held.
#[track_caller]
fn refused(dir: &Dir, args: &[&str], want: &str) {
    let before = contents(&dir.0);
    let out = train(dir, args);
    assert_refused(&format!("{args:?}"), &out, want);
    assert!(contents(&dir.0) == before, "{args:?} changed the files");
}

/// The small model's config (what SMALL says) for writing checkpoints.
fn small_config(steps: usize) -> TrainConfig {
    let model = ModelConfig {
        vocab: 300,
        d_model: 32,
        layers: 1,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        mlp_dim: 64,
        ..ModelConfig::tiny()
    };
    let mut cfg = TrainConfig::new(model);
    cfg.steps = steps;
    cfg.learning_rate = 3e-3;
    cfg.warmup_steps = 10;
    cfg
}

/// A checkpoint of the small model at step 1 of a 200-step run, with `tokenizer`.
fn write_checkpoint(path: &Path, tokenizer: Option<&str>) {
    let cfg = small_config(200);
    let specs = param_specs(&cfg.model);
    let tensors = specs
        .iter()
        .chain(&specs)
        .chain(&specs)
        .map(|s| vec![0.01; s.shape.iter().product()])
        .collect();
    let ck = Checkpoint {
        step: 1,
        seed: 0,
        model: cfg.model.to_string(),
        schedule: Schedule::of(&cfg),
        tensors,
    };
    checkpoint::save_with_tokenizer(path, &specs, &ck, tokenizer).unwrap();
}

#[test]
fn bad_data_tokenizers_and_checkpoints_are_refused_naming_the_file() {
    let d = Dir::new("train-text-errors");
    let file = |name: &str, bytes: &[u8]| {
        let p = d.0.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    };
    file("book.txt", lipsum::LIBER_PRIMUS.as_bytes());
    file("empty.txt", b"");
    file("blank.txt", b"\n \n\n");
    file("bad.txt", b"Lorem ipsum\n\xff\xfe dolor\n");
    file(
        "rows.jsonl",
        b"{\"text\": \"a row\"}\n{\"content\": \"no text\"}\n",
    );
    file("broken.jsonl", b"{\"text\": \"a row\"\n");
    file("notes.csv", b"text\nhello\n");
    file("other/README.md", b"# a data set card, not data\n");
    std::fs::create_dir_all(d.0.join("nothing")).unwrap();
    let hf = |path: &'static str| -> Vec<&'static str> {
        vec![
            "--dataset-type",
            "hf",
            "--dataset-path",
            path,
            "--steps",
            "2",
        ]
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (hf("empty.txt"), "empty.txt holds no text"),
        (hf("blank.txt"), "blank.txt holds no text"),
        (
            hf("nothing"),
            "nothing has no .txt, .jsonl, .json or .parquet file",
        ),
        (
            hf("other"),
            "other has no .txt, .jsonl, .json or .parquet file",
        ),
        (
            hf("missing.txt"),
            "--dataset-path missing.txt: No such file",
        ),
        (
            hf("bad.txt"),
            "bad.txt is not valid UTF-8 (line 2); save it as UTF-8",
        ),
        (
            hf("rows.jsonl"),
            "rows.jsonl line 2 has no text column `text` (a string); name the column that \
             holds the text with --train-data-columns",
        ),
        (
            hf("broken.jsonl"),
            "broken.jsonl line 1 is not a JSON object",
        ),
        (
            hf("notes.csv"),
            "notes.csv is not a .txt, .jsonl, .json or .parquet file",
        ),
        (
            vec!["--dataset-type", "hf"],
            "--dataset-type hf reads local files; name them with --dataset-path",
        ),
        (
            vec!["--dataset-path", "book.txt"],
            "--dataset-path is for text, but --dataset-type is synthetic",
        ),
        (
            vec!["--prompt", "Non eram"],
            "--prompt continues text, but this run trains on synthetic data",
        ),
        (
            [hf("book.txt"), vec!["--vocab", "200"]].concat(),
            "--vocab 200 is too small for a byte-level BPE",
        ),
    ];
    for (args, want) in &cases {
        refused(&d, args, want);
    }

    // A tokenizer of another size than --vocab.
    let docs = read_documents(&d.0.join("book.txt"), "text").unwrap();
    let tokenizer = TextTokenizer::train_bpe(&docs, 290).unwrap();
    let size = tokenizer.vocab_size();
    file("tokenizer.json", tokenizer.to_json().as_bytes());
    let want = format!(
        "--tokenizer-path tokenizer.json has {size} tokens, but --vocab is 300; set --vocab {size}"
    );
    let args = [hf("book.txt"), vec!["--tokenizer-path", "tokenizer.json"]].concat();
    refused(&d, &args, &want);
    file("not-a-tokenizer.json", b"{\"model\": 3}");
    let args = [
        hf("book.txt"),
        vec!["--tokenizer-path", "not-a-tokenizer.json"],
    ]
    .concat();
    refused(
        &d,
        &args,
        "--tokenizer-path not-a-tokenizer.json is not a Hugging Face tokenizer.json",
    );

    // Checkpoints: of another tokenizer, of synthetic data, of text resumed as synthetic.
    let own = TextTokenizer::train_bpe(&docs, 300).unwrap();
    file("own.json", own.to_json().as_bytes());
    // Another tokenizer of the model's size: its merges learnt from the text in capitals.
    file("upper.txt", lipsum::LIBER_PRIMUS.to_uppercase().as_bytes());
    let upper = read_documents(&d.0.join("upper.txt"), "text").unwrap();
    let other = TextTokenizer::train_bpe(&upper, 300).unwrap();
    assert_eq!(other.vocab_size(), 300);
    assert_ne!(other.to_json(), own.to_json());
    file("other.json", other.to_json().as_bytes());
    write_checkpoint(&d.0.join("other.safetensors"), Some(tokenizer.to_json()));
    write_checkpoint(&d.0.join("synthetic.safetensors"), None);
    write_checkpoint(&d.0.join("text.safetensors"), Some(own.to_json()));
    let resume = |ck: &'static str| {
        [
            hf("book.txt"),
            vec!["--tokenizer-path", "own.json", "--resume", ck],
        ]
        .concat()
    };
    refused(
        &d,
        &resume("other.safetensors"),
        "checkpoint other.safetensors was trained with another tokenizer than this run's",
    );
    refused(
        &d,
        &resume("synthetic.safetensors"),
        "checkpoint synthetic.safetensors was trained on synthetic data",
    );
    refused(
        &d,
        &["--resume", "text.safetensors", "--steps", "2"],
        "checkpoint text.safetensors was trained on text",
    );
    refused(
        &d,
        &["--resume", "synthetic.safetensors", "--prompt", "Non eram"],
        "checkpoint synthetic.safetensors was trained on synthetic data and holds no tokenizer",
    );
    refused(
        &d,
        &[
            "--resume",
            "text.safetensors",
            "--prompt",
            "Non eram",
            "--tokenizer-path",
            "other.json",
        ],
        "checkpoint text.safetensors was trained with another tokenizer than this run's",
    );
    refused(
        &d,
        &[
            "--resume",
            "text.safetensors",
            "--prompt",
            "Non eram",
            "--save",
            "x.safetensors",
        ],
        "--save writes nothing when --prompt samples from --resume (nothing is trained)",
    );
}

/// The README's text run, small and with a given tokenizer.json: trains on the shipped text
/// with Ulysses and packing on 4 CPU devices, logs eval losses as JSON, samples at its end,
/// saves the tokenizer with the checkpoint, resumes on it, and samples from the checkpoint.
#[test]
fn a_text_run_logs_eval_losses_saves_its_tokenizer_and_samples() {
    let d = Dir::new("train-text-run");
    std::fs::write(d.0.join("book.txt"), lipsum::LIBER_PRIMUS).unwrap();
    // A tokenizer.json of 300 tokens, as a user would bring one.
    let docs = read_documents(&d.0.join("book.txt"), "text").unwrap();
    let tokenizer = TextTokenizer::train_bpe(&docs, 300).unwrap();
    std::fs::write(d.0.join("tokenizer.json"), tokenizer.to_json()).unwrap();
    let out = train(
        &d,
        &[
            "--dataset-type",
            "hf",
            "--dataset-path",
            "book.txt",
            "--tokenizer-path",
            "tokenizer.json",
            "--steps",
            "6",
            "--stop-at",
            "4",
            "--eval-interval",
            "2",
            "--eval-steps",
            "1",
            "--log-json",
            "log.jsonl",
            "--save",
            "ck.safetensors",
            "--prompt",
            "Non eram",
            "--max-new-tokens",
            "8",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("unigram entropy"), "{stdout}");
    assert!(
        stdout.contains("sample (temperature 0.8, top-k 40): Non eram"),
        "{stdout}"
    );
    let log = std::fs::read_to_string(d.0.join("log.jsonl")).unwrap();
    let evals: Vec<(u64, f64)> = log
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Some((v["step"].as_u64()?, v["eval_loss"].as_f64()?))
        })
        .collect();
    assert_eq!(
        evals.iter().map(|e| e.0).collect::<Vec<_>>(),
        [2, 4],
        "{log}"
    );
    assert!(evals.iter().all(|e| e.1.is_finite() && e.1 > 0.0), "{log}");
    let saved = checkpoint::saved_tokenizer(&d.0.join("ck.safetensors")).unwrap();
    assert_eq!(saved.as_deref(), Some(tokenizer.to_json()));
    // Resumed on the same text, with the tokenizer the checkpoint holds (no
    // --tokenizer-path).
    let out = train(
        &d,
        &[
            "--dataset-type",
            "hf",
            "--dataset-path",
            "book.txt",
            "--steps",
            "6",
            "--resume",
            "ck.safetensors",
            "--save",
            "ck6.safetensors",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("starting at step 4"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Sampling from the checkpoint trains and writes nothing.
    let before = contents(&d.0);
    let out = train(
        &d,
        &[
            "--resume",
            "ck.safetensors",
            "--prompt",
            "Non eram",
            "--temperature",
            "0",
            "--max-new-tokens",
            "8",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("sample (temperature 0, top-k 40): Non eram"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.len() > "sample (temperature 0, top-k 40): Non eram".len(),
        "{line}"
    );
    assert!(contents(&d.0) == before, "sampling wrote files");
}
