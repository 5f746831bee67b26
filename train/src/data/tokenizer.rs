//! The tokenizer of text data: a Hugging Face `tokenizer.json` (the `tokenizers` crate), or a
//! byte-level BPE trained on the documents (its `BpeTrainer`), either with an end-of-text
//! token that separates documents. Its JSON travels with a checkpoint.

use std::path::Path;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use super::{DataError, Document};

/// The end-of-text token a trained BPE has (GPT-2's).
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// End-of-text tokens looked for in a given tokenizer, in this order.
const END_OF_TEXT_TOKENS: [&str; 4] = [END_OF_TEXT, "</s>", "<|end_of_text|>", "<eos>"];

/// A tokenizer and its end-of-text token.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    eos: u32,
    json: String,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.vocab_size())
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

fn tokenize_error(e: impl std::fmt::Display) -> DataError {
    DataError::Tokenize {
        reason: e.to_string(),
    }
}

impl TextTokenizer {
    /// A byte-level BPE of at most `vocab` tokens (the 256 bytes, the end-of-text token, and
    /// the merges learnt from `docs`; fewer when the documents have no more pairs to merge).
    pub fn train_bpe(docs: &[Document], vocab: usize) -> Result<Self, DataError> {
        if vocab < 257 {
            return Err(DataError::BpeVocab { vocab });
        }
        let byte_level = ByteLevel::new(false, true, true);
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(byte_level));
        tokenizer.with_decoder(Some(byte_level));
        tokenizer
            .train(&mut trainer, docs.iter().map(|d| d.text.as_str()))
            .map_err(tokenize_error)?;
        let json = tokenizer.to_string(false).map_err(tokenize_error)?;
        Self::from_json(&json, "the trained BPE")
    }

    /// The `tokenizer.json` at `path`, whose vocabulary must have `vocab` tokens (added ones
    /// included) and an end-of-text token.
    pub fn from_file(path: &Path, vocab: usize) -> Result<Self, DataError> {
        let shown = path.display().to_string();
        let json = std::fs::read_to_string(path).map_err(|e| DataError::Tokenizer {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let t = Self::from_json(&json, &shown)?;
        if t.vocab_size() != vocab {
            return Err(DataError::TokenizerVocab {
                path: shown,
                size: t.vocab_size(),
                vocab,
            });
        }
        Ok(t)
    }

    /// The tokenizer of a `tokenizer.json` text (`source` names it in errors).
    pub fn from_json(json: &str, source: &str) -> Result<Self, DataError> {
        let inner: Tokenizer = json.parse().map_err(|e| DataError::Tokenizer {
            path: source.to_string(),
            reason: format!("{e}"),
        })?;
        let eos = END_OF_TEXT_TOKENS
            .iter()
            .find_map(|t| inner.token_to_id(t))
            .ok_or_else(|| DataError::NoEndOfText {
                path: source.to_string(),
            })?;
        Ok(TextTokenizer {
            inner,
            eos,
            json: json.to_string(),
        })
    }

    /// The tokenizer as `tokenizer.json` text (what a checkpoint stores).
    pub fn to_json(&self) -> &str {
        &self.json
    }

    /// Tokens in the vocabulary, added ones included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The end-of-text token.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The tokens of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(tokenize_error)?
            .get_ids()
            .to_vec())
    }

    /// The text of `ids` (special tokens left out).
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.inner.decode(ids, true).map_err(tokenize_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(texts: &[&str]) -> Vec<Document> {
        texts
            .iter()
            .map(|t| Document {
                text: t.to_string(),
                file: "x.txt".into(),
            })
            .collect()
    }

    /// A trained BPE round-trips text, merges frequent pairs, and survives its JSON.
    #[test]
    fn trained_bpe_round_trips() {
        let d = docs(&[
            "the cat sat on the mat",
            "the dog sat on the log",
            "ünïcödé",
        ]);
        let t = TextTokenizer::train_bpe(&d, 300).unwrap();
        assert!(
            t.vocab_size() > 257 && t.vocab_size() <= 300,
            "{}",
            t.vocab_size()
        );
        let ids = t.encode("the cat sat").unwrap();
        assert!(ids.len() < "the cat sat".len(), "merges shorten: {ids:?}");
        assert_eq!(t.decode(&ids).unwrap(), "the cat sat");
        let again = TextTokenizer::from_json(t.to_json(), "json").unwrap();
        assert_eq!(
            again.encode("the dog").unwrap(),
            t.encode("the dog").unwrap()
        );
        assert_eq!(again.eos(), t.eos());
        let e = TextTokenizer::train_bpe(&d, 100).unwrap_err();
        assert!(e.to_string().contains("vocab 100 is too small"), "{e}");
    }
}
