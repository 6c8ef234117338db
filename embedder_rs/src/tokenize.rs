//! Tokenisation with the Hugging Face `tokenizers` crate, and length-bucketed
//! batching: texts are sorted by token count, cut into batches of similar
//! length, and each batch is padded only to its own longest text.

use std::path::Path;

use tokenizers::{Encoding, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::{EmbedderError, Result};

/// Fewer texts than this are tokenized on the calling thread (~0.3 ms a 250-token passage):
/// `encode_batch` hands even one text to a worker of rayon's pool and waits for it, a
/// wake-up each way, and the worker then spins idle beside the forward pass.
const PARALLEL_FROM_TEXTS: usize = 4;

/// A `tokenizer.json` with truncation forced to the model's `max_seq_length`.
pub struct TextTokenizer {
    inner: Tokenizer,
    pad_id: u32,
    max_seq_length: usize,
}

/// One padded batch, ready for the model. All arrays are row-major `[b, s]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Positions of these rows in the caller's list of texts.
    pub rows: Vec<usize>,
    /// Sequence length `s` (longest text of the batch).
    pub seq_len: usize,
    /// Word-piece ids, `pad_id` after each text's end.
    pub input_ids: Vec<i64>,
    /// Segment ids (0 for single sentences).
    pub token_type_ids: Vec<i64>,
    /// 1 for real tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
}

impl TextTokenizer {
    /// Loads `tokenizer.json`, overriding its truncation with `max_seq_length`
    /// and turning its own padding off (batches are padded by [`make_batches`]).
    pub fn load(path: &Path, max_seq_length: usize) -> Result<Self> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| {
            EmbedderError::Tokenizer(format!("cannot load {}: {e}", path.display()))
        })?;
        let pad_id = inner
            .get_padding()
            .map(|p| p.pad_id)
            .or_else(|| inner.token_to_id("[PAD]"))
            .unwrap_or(0);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| EmbedderError::Tokenizer(e.to_string()))?;
        inner.with_padding(None);
        Ok(Self {
            inner,
            pad_id,
            max_seq_length,
        })
    }

    /// Truncation length in tokens, special tokens included.
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// Encodes every text (with `[CLS]`/`[SEP]`, truncated, unpadded): in parallel on
    /// rayon's pool from [`PARALLEL_FROM_TEXTS`] texts, on the calling thread below that.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Encoding>> {
        let encoded = if texts.len() < PARALLEL_FROM_TEXTS {
            texts.iter().map(|&t| self.inner.encode(t, true)).collect()
        } else {
            self.inner.encode_batch(texts.to_vec(), true)
        };
        encoded.map_err(|e| EmbedderError::Tokenizer(e.to_string()))
    }

    /// Token counts after truncation, special tokens included.
    pub fn count(&self, texts: &[&str]) -> Result<Vec<usize>> {
        Ok(self.encode(texts)?.iter().map(Encoding::len).collect())
    }

    /// The id used for padding.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }
}

/// Consecutive texts packed end to end, without padding (the CPU path).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedChunk {
    /// Position of the chunk's first text in the caller's list; the rest follow in order.
    pub first: usize,
    /// Word-piece ids of every token of every text, `[tokens]`.
    pub ids: Vec<u32>,
    /// Segment ids, `[tokens]`.
    pub type_ids: Vec<u32>,
    /// `(first token, length)` of each text.
    pub spans: Vec<(usize, usize)>,
}

/// Cuts `encodings` into runs of consecutive texts of at most `max_tokens` tokens in all
/// (a longer single text still gets a chunk of its own), each packed end to end.
pub fn pack_chunks(encodings: &[Encoding], max_tokens: usize) -> Vec<PackedChunk> {
    let mut chunks: Vec<PackedChunk> = Vec::new();
    for (i, e) in encodings.iter().enumerate() {
        let fits = chunks
            .last()
            .is_some_and(|c| c.ids.len() + e.len() <= max_tokens.max(1));
        if !fits {
            chunks.push(PackedChunk {
                first: i,
                ids: Vec::new(),
                type_ids: Vec::new(),
                spans: Vec::new(),
            });
        }
        let c = chunks.last_mut().expect("a chunk was just pushed");
        c.spans.push((c.ids.len(), e.len()));
        c.ids.extend_from_slice(e.get_ids());
        c.type_ids.extend_from_slice(e.get_type_ids());
    }
    chunks
}

/// Sorts encodings by length (longest first) and cuts them into batches of at most
/// `max_batch` texts and `max_tokens` padded tokens, each padded to its own longest.
pub fn make_batches(
    encodings: &[Encoding],
    pad_id: u32,
    max_batch: usize,
    max_tokens: usize,
) -> Vec<Batch> {
    let lens: Vec<usize> = encodings.iter().map(Encoding::len).collect();
    plan_batches(&lens, max_batch, max_tokens)
        .into_iter()
        .map(|rows| pad_batch(encodings, rows, pad_id))
        .collect()
}

/// Groups row indices: sorted by length descending (stable), then greedily cut so
/// that no batch exceeds `max_batch` rows or `max_tokens` padded tokens.
pub fn plan_batches(lens: &[usize], max_batch: usize, max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by(|&a, &b| lens[b].cmp(&lens[a]));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for i in order {
        // Sorted descending: the first row of a batch is its longest.
        let s = if current.is_empty() { lens[i] } else { longest };
        if !current.is_empty()
            && (current.len() >= max_batch.max(1) || (current.len() + 1) * s > max_tokens)
        {
            batches.push(std::mem::take(&mut current));
        }
        if current.is_empty() {
            longest = lens[i];
        }
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

fn pad_batch(encodings: &[Encoding], rows: Vec<usize>, pad_id: u32) -> Batch {
    let s = rows
        .iter()
        .map(|&r| encodings[r].len())
        .max()
        .unwrap_or(0)
        .max(1);
    let b = rows.len();
    let mut input_ids = vec![i64::from(pad_id); b * s];
    let mut token_type_ids = vec![0i64; b * s];
    let mut attention_mask = vec![0i64; b * s];
    for (k, &r) in rows.iter().enumerate() {
        let e = &encodings[r];
        for (j, ((&id, &ty), &m)) in e
            .get_ids()
            .iter()
            .zip(e.get_type_ids())
            .zip(e.get_attention_mask())
            .enumerate()
        {
            input_ids[k * s + j] = i64::from(id);
            token_type_ids[k * s + j] = i64::from(ty);
            attention_mask[k * s + j] = i64::from(m);
        }
    }
    Batch {
        rows,
        seq_len: s,
        input_ids,
        token_type_ids,
        attention_mask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_sorted_and_bounded() {
        let lens = [5, 100, 7, 100, 3, 50];
        let plan = plan_batches(&lens, 2, 10_000);
        assert_eq!(plan, vec![vec![1, 3], vec![5, 2], vec![0, 4]]);
        let mut all: Vec<usize> = plan.concat();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn packed_chunks_keep_order_and_budget() {
        let enc = |n: usize, first: u32| {
            let tokens = (0..n as u32)
                .map(|i| tokenizers::Token::new(first + i, String::new(), (0, 0)))
                .collect();
            Encoding::from_tokens(tokens, 0)
        };
        let encodings = vec![enc(3, 0), enc(4, 10), enc(1, 20), enc(9, 30), enc(2, 40)];
        let chunks = pack_chunks(&encodings, 8);
        let firsts: Vec<usize> = chunks.iter().map(|c| c.first).collect();
        assert_eq!(firsts, vec![0, 3, 4]);
        assert_eq!(chunks[0].spans, vec![(0, 3), (3, 4), (7, 1)]);
        assert_eq!(chunks[0].ids, vec![0, 1, 2, 10, 11, 12, 13, 20]);
        assert_eq!(
            chunks[1].spans,
            vec![(0, 9)],
            "a long text gets a chunk of its own"
        );
        assert_eq!(chunks[2].ids, vec![40, 41]);
        assert!(pack_chunks(&[], 8).is_empty());
    }

    #[test]
    fn token_budget_cuts_batches() {
        let lens = [100, 100, 100, 10];
        // 2 rows of 100 = 200 tokens fit, a third does not.
        let plan = plan_batches(&lens, 32, 250);
        assert_eq!(plan, vec![vec![0, 1], vec![2, 3]]);
        // A single row longer than the budget still gets a batch.
        assert_eq!(plan_batches(&[500], 32, 250), vec![vec![0]]);
        assert!(plan_batches(&[], 32, 250).is_empty());
    }
}
