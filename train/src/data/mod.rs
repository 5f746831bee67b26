//! The data a run trains on: [`SyntheticData`] (a seeded Markov chain, the default), or text
//! ([`TextData`]): documents read from files in the formats Hugging Face datasets stores
//! ([`source`]), tokenized by a Hugging Face tokenizer or a byte-level BPE trained on them
//! ([`tokenizer`]), and packed into rows of the sequence length with per-document segment
//! ids ([`packing`]), with the last documents held out for eval.

mod error;
pub mod packing;
pub mod source;
mod synthetic;
mod text;
pub mod tokenizer;

pub use error::DataError;
pub use packing::{pack, Rows};
pub use source::{read_documents, Document};
pub use synthetic::{Batch, SyntheticData, ENTROPY_NATS};
pub use text::{TextBatch, TextData, TextOptions};
pub use tokenizer::TextTokenizer;
