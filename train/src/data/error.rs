//! Why a data set or a tokenizer cannot be used: each message names the file and the fix;
//! the settings in it are named as a [`Names`] names them (a command line's flags).

use std::path::PathBuf;

use tessera_parallel::{LibraryNames, Names};

/// Data, a tokenizer, or a checkpoint's tokenizer that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataError {
    /// The dataset path does not exist or cannot be read.
    Unreadable { path: PathBuf, reason: String },
    /// A file (or a directory's files) with no text.
    Empty { path: PathBuf },
    /// A directory without a file of a known format.
    NoDataFiles { dir: PathBuf },
    /// A file whose extension is not a known format.
    Format { path: PathBuf },
    /// A file that is not UTF-8 (`line` 1-based, where the first invalid byte is).
    Utf8 { path: PathBuf, line: usize },
    /// A JSON line or record that does not parse, or is not an object.
    Json {
        path: PathBuf,
        place: String,
        reason: String,
    },
    /// A JSON record or a Parquet file without the text column, or with a non-string one.
    MissingColumn {
        path: PathBuf,
        place: String,
        column: String,
    },
    /// A Parquet file that cannot be read.
    Parquet { path: PathBuf, reason: String },
    /// Fewer than two documents: nothing to hold out for eval.
    TooFewDocuments { path: PathBuf, documents: usize },
    /// A tokenizer file that cannot be read or parsed.
    Tokenizer { path: String, reason: String },
    /// A tokenizer whose vocabulary is not the model's.
    TokenizerVocab {
        path: String,
        size: usize,
        vocab: usize,
    },
    /// A tokenizer without an end-of-text token to separate documents.
    NoEndOfText { path: String },
    /// A vocabulary too small for a byte-level BPE.
    BpeVocab { vocab: usize },
    /// Training or running the tokenizer failed.
    Tokenize { reason: String },
    /// A checkpoint trained with another tokenizer than the run's.
    CheckpointTokenizer { path: String },
    /// A checkpoint trained on synthetic data for a run on text (`text: true`), or the other
    /// way round.
    CheckpointData { path: String, text: bool },
    /// Text packed into rows of another length than the run's sequence.
    RowLength { rows: usize, seq: usize },
}

fn flag(names: &dyn Names, key: &'static str) -> String {
    names.flag(key).map_or(key.to_string(), str::to_string)
}

impl DataError {
    /// The message with the settings named as `names` names them.
    pub fn describe(&self, names: &dyn Names) -> String {
        let path_flag = flag(names, "dataset_path");
        let column_flag = flag(names, "train_data_columns");
        let tokenizer_flag = flag(names, "tokenizer_path");
        let vocab_flag = flag(names, "vocab");
        match self {
            DataError::Unreadable { path, reason } => format!(
                "{path_flag} {}: {reason}; point it at a file or a directory of .txt, .jsonl, \
                 .json or .parquet files",
                path.display()
            ),
            DataError::Empty { path } => format!(
                "{} holds no text; give {path_flag} files with documents in them",
                path.display()
            ),
            DataError::NoDataFiles { dir } => format!(
                "{} has no .txt, .jsonl, .json or .parquet file; point {path_flag} at a \
                 directory of them, or at one file",
                dir.display()
            ),
            DataError::Format { path } => format!(
                "{} is not a .txt, .jsonl, .json or .parquet file; convert it to one of them",
                path.display()
            ),
            DataError::Utf8 { path, line } => format!(
                "{} is not valid UTF-8 (line {line}); save it as UTF-8",
                path.display()
            ),
            DataError::Json {
                path,
                place,
                reason,
            } => format!(
                "{} {place} is not a JSON object ({reason}); write one object per line, with \
                 the text under {column_flag}",
                path.display()
            ),
            DataError::MissingColumn {
                path,
                place,
                column,
            } => format!(
                "{} {place} has no text column `{column}` (a string); name the column that \
                 holds the text with {column_flag}",
                path.display()
            ),
            DataError::Parquet { path, reason } => format!(
                "{} cannot be read as Parquet ({reason}); write it with pyarrow or HF datasets \
                 (uncompressed or snappy)",
                path.display()
            ),
            DataError::TooFewDocuments { path, documents } => format!(
                "{} holds {documents} document{}, but the run holds the last tenth of them out \
                 for eval; give {path_flag} at least 2 documents (blank-line-separated \
                 paragraphs in a .txt file)",
                path.display(),
                if *documents == 1 { "" } else { "s" }
            ),
            DataError::Tokenizer { path, reason } => format!(
                "{tokenizer_flag} {path} is not a Hugging Face tokenizer.json ({reason}); give \
                 one, or leave {tokenizer_flag} out to train a byte-level BPE on the data"
            ),
            DataError::TokenizerVocab { path, size, vocab } => format!(
                "{tokenizer_flag} {path} has {size} tokens, but {vocab_flag} is {vocab}; set \
                 {vocab_flag} {size}"
            ),
            DataError::NoEndOfText { path } => format!(
                "{tokenizer_flag} {path} has no end-of-text token (<|endoftext|>, </s>, \
                 <|end_of_text|> or <eos>) to separate documents; add one to its added tokens"
            ),
            DataError::BpeVocab { vocab } => format!(
                "{vocab_flag} {vocab} is too small for a byte-level BPE (its 256 byte tokens and \
                 the end-of-text token); use at least 257, e.g. {vocab_flag} 512, or a \
                 {tokenizer_flag}"
            ),
            DataError::Tokenize { reason } => format!("tokenizing the data failed: {reason}"),
            DataError::CheckpointTokenizer { path } => format!(
                "checkpoint {path} was trained with another tokenizer than this run's; leave \
                 {tokenizer_flag} out to use the one it holds"
            ),
            DataError::CheckpointData { path, text: true } => format!(
                "checkpoint {path} was trained on synthetic data and holds no tokenizer; \
                 train on text from the start, or continue it without {path_flag}"
            ),
            DataError::CheckpointData { path, text: false } => format!(
                "checkpoint {path} was trained on text; continue it on the text it was \
                 trained on ({path_flag}, with the dataset type it had)"
            ),
            DataError::RowLength { rows, seq } => format!(
                "the text is packed into rows of {rows} tokens, but the run's sequences hold \
                 {seq}; pack it with the run's sequence length"
            ),
        }
    }
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(&LibraryNames))
    }
}

impl std::error::Error for DataError {}
