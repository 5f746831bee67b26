//! [`TextData`]: documents read, tokenized and packed into a train and a held-out split.

use std::path::PathBuf;

use super::{pack, read_documents, DataError, Document, Rows, TextTokenizer};

/// Where the text comes from and how it is cut.
#[derive(Debug, Clone, PartialEq)]
pub struct TextOptions {
    /// A file or a directory of files ([`super::source`]).
    pub path: PathBuf,
    /// The JSON and Parquet column holding the text.
    pub column: String,
    /// A Hugging Face `tokenizer.json`; without one, a byte-level BPE trained on the
    /// documents.
    pub tokenizer: Option<PathBuf>,
    /// The model's vocabulary size.
    pub vocab: usize,
    /// Tokens per row (the sequence length).
    pub seq: usize,
    /// Several documents to a row (with segment ids) or one.
    pub packing: bool,
}

/// One step's `[B, S]` arrays, row-major, in natural order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextBatch {
    pub tokens: Vec<i32>,
    /// -1 where a position has no target.
    pub targets: Vec<i32>,
    pub positions: Vec<i32>,
    pub segment_ids: Vec<i32>,
}

/// Text data: the tokenizer, the train rows and the held-out rows (the last tenth of the
/// documents, at least one).
#[derive(Debug, Clone)]
pub struct TextData {
    tokenizer: TextTokenizer,
    train: Rows,
    eval: Rows,
    documents: [usize; 2],
    seed: u64,
}

impl TextData {
    /// Reads `opts.path`, tokenizes its documents with `tokenizer` (given: a checkpoint's)
    /// or as `opts` says, and packs them. `seed` orders the train rows.
    pub fn load(
        opts: &TextOptions,
        tokenizer: Option<TextTokenizer>,
        seed: u64,
    ) -> Result<Self, DataError> {
        let docs = read_documents(&opts.path, &opts.column)?;
        if docs.len() < 2 {
            return Err(DataError::TooFewDocuments {
                path: opts.path.clone(),
                documents: docs.len(),
            });
        }
        let tokenizer = match (tokenizer, &opts.tokenizer) {
            (Some(t), _) => t,
            (None, Some(path)) => TextTokenizer::from_file(path, opts.vocab)?,
            (None, None) => TextTokenizer::train_bpe(&docs, opts.vocab)?,
        };
        Self::from_documents(&docs, tokenizer, opts.seq, opts.packing, seed)
    }

    /// `docs` tokenized with `tokenizer` and packed into rows of `seq`, the last tenth (at
    /// least one) held out.
    pub fn from_documents(
        docs: &[Document],
        tokenizer: TextTokenizer,
        seq: usize,
        packing: bool,
        seed: u64,
    ) -> Result<Self, DataError> {
        let ids = docs
            .iter()
            .map(|d| tokenizer.encode(&d.text))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_token_ids(&ids, tokenizer, seq, packing, seed)
    }

    /// [`Self::from_documents`] of documents already tokenized (`ids`; at least two).
    pub fn from_token_ids(
        ids: &[Vec<u32>],
        tokenizer: TextTokenizer,
        seq: usize,
        packing: bool,
        seed: u64,
    ) -> Result<Self, DataError> {
        let docs = ids;
        if docs.len() < 2 {
            return Err(DataError::TooFewDocuments {
                path: "the documents".into(),
                documents: docs.len(),
            });
        }
        let held = docs.len().div_ceil(10).min(docs.len() - 1);
        let split = docs.len() - held;
        let eos = tokenizer.eos();
        Ok(TextData {
            train: pack(&ids[..split], eos, seq, packing),
            eval: pack(&ids[split..], eos, seq, packing),
            tokenizer,
            documents: [split, held],
            seed,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The train rows.
    pub fn train_rows(&self) -> &Rows {
        &self.train
    }

    /// The held-out rows.
    pub fn eval_rows(&self) -> &Rows {
        &self.eval
    }

    /// Documents in the train and the held-out split.
    pub fn documents(&self) -> [usize; 2] {
        self.documents
    }

    /// The entropy (nats) of the train split's target tokens' frequencies: the loss of a
    /// model that knows how often each token comes but not what came before it.
    pub fn unigram_entropy(&self) -> f64 {
        let mut counts = std::collections::HashMap::<i32, usize>::new();
        for &t in self.train.targets.iter().filter(|&&t| t >= 0) {
            *counts.entry(t).or_default() += 1;
        }
        let total: usize = counts.values().sum();
        counts
            .values()
            .map(|&c| {
                let p = c as f64 / total as f64;
                -p * p.ln()
            })
            .sum()
    }

    /// The batch of step `step` (0-based): `batch` train rows, every row once per epoch in an
    /// order drawn from the seed and the epoch.
    pub fn batch(&self, step: usize, batch: usize) -> TextBatch {
        let n = self.train.len();
        // The epoch's order, drawn once per epoch the batch spans.
        let mut orders = std::collections::HashMap::<usize, Vec<usize>>::new();
        let picks: Vec<usize> = (0..batch)
            .map(|r| {
                let i = step * batch + r;
                let (epoch, k) = (i / n, i % n);
                let order = orders.entry(epoch).or_insert_with(|| {
                    let mut order: Vec<usize> = (0..n).collect();
                    fastrand::Rng::with_seed(self.seed ^ (epoch as u64).wrapping_mul(0x9e37_79b9))
                        .shuffle(&mut order);
                    order
                });
                order[k]
            })
            .collect();
        gather(&self.train, picks.into_iter())
    }

    /// Held-out batch `k`: rows `k * batch ..` of the held-out split, in order, wrapping
    /// around.
    pub fn eval_batch(&self, k: usize, batch: usize) -> TextBatch {
        let n = self.eval.len();
        gather(&self.eval, (0..batch).map(|r| (k * batch + r) % n))
    }

    /// Held-out batches that cover the split once.
    pub fn eval_batches(&self, batch: usize) -> usize {
        self.eval.len().div_ceil(batch.max(1))
    }
}

fn gather(rows: &Rows, picks: impl Iterator<Item = usize>) -> TextBatch {
    let s = rows.seq;
    let mut b = TextBatch {
        tokens: Vec::new(),
        targets: Vec::new(),
        positions: Vec::new(),
        segment_ids: Vec::new(),
    };
    for row in picks {
        let r = row * s..(row + 1) * s;
        b.tokens.extend_from_slice(&rows.tokens[r.clone()]);
        b.targets.extend_from_slice(&rows.targets[r.clone()]);
        b.positions.extend_from_slice(&rows.positions[r.clone()]);
        b.segment_ids.extend_from_slice(&rows.segment_ids[r]);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each epoch takes every train row once; the held-out batches wrap around in order.
    #[test]
    fn epochs_take_every_row_once() {
        let docs: Vec<Document> = (0..20)
            .map(|i| Document {
                text: format!("document {i} says {}", "la ".repeat(i)),
                file: "x.txt".into(),
            })
            .collect();
        let tokenizer = TextTokenizer::train_bpe(&docs, 300).unwrap();
        let data = TextData::from_documents(&docs, tokenizer, 16, false, 5).unwrap();
        assert_eq!(data.documents(), [18, 2]);
        let n = data.train_rows().len();
        let rows =
            |b: &TextBatch| -> Vec<Vec<i32>> { b.tokens.chunks(16).map(<[i32]>::to_vec).collect() };
        let mut seen: Vec<Vec<i32>> = (0..n).flat_map(|k| rows(&data.batch(k, 1))).collect();
        let mut all: Vec<Vec<i32>> = data
            .train_rows()
            .tokens
            .chunks(16)
            .map(<[i32]>::to_vec)
            .collect();
        seen.sort();
        all.sort();
        assert_eq!(seen, all);
        assert_eq!(data.batch(3, 2), data.batch(3, 2));
        let m = data.eval_rows().len();
        assert_eq!(data.eval_batch(0, 1), data.eval_batch(m, 1));
        assert!(data.unigram_entropy() > 0.0);
    }
}
