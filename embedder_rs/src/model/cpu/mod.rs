//! The CPU forward pass: the burn model's weights run through host kernels.
//!
//! burn-flex runs a layer as a dozen tensor ops, each allocating its output, and its gemm
//! repacks the weights on every call; at one short text that per-op overhead was most of
//! the time, and ONNX Runtime (which fuses and pre-packs) was 1.9x faster. Here the
//! [`BertModel`]'s parameters are copied once at load into packed panels, and a batch runs
//! as one pass per layer over preallocated buffers:
//!
//! - the batch is *packed*: the sequences' tokens lie one after another (`[tokens, h]`),
//!   with no padding, so no work is spent on padded positions;
//! - QKV, output, up and down projections are [`packed::PackedLinear`] (bias fused, GELU
//!   fused into the up projection);
//! - residual + LayerNorm is one fused pass ([`norm`]);
//! - attention runs per (sequence, head) over exactly that sequence's tokens
//!   ([`attention`]).
//!
//! The wgpu path keeps burn's ops; the two are checked against each other in the tests.

pub mod attention;
pub mod norm;
pub mod packed;
pub(crate) mod team;

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::tensor::Tensor;
use std::sync::Mutex;

use super::{BertConfig, BertModel};
use norm::{add_layer_norm, Norm};
use packed::{Epilogue, PackedLinear};
pub(crate) use team::claim_tasks;
use team::with_team;

/// A raw pointer that a team's tasks may share; each task writes a disjoint block.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: used only for writes to disjoint blocks (see each use).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// # Safety
    /// `offset` must be inside the allocation.
    pub(crate) unsafe fn at(self, offset: usize) -> *mut f32 {
        unsafe { self.0.add(offset) }
    }
}

/// A batch of token sequences packed end to end.
pub struct Packed<'a> {
    /// Word-piece ids of every token, `[tokens]`.
    pub ids: &'a [u32],
    /// Segment ids, `[tokens]`.
    pub type_ids: &'a [u32],
    /// `(first token, length)` of each sequence; spans are disjoint and in order.
    pub spans: &'a [(usize, usize)],
}

/// One encoder layer with packed weights.
struct Layer {
    qkv: PackedLinear,
    output: PackedLinear,
    attention_norm: Norm,
    up: PackedLinear,
    down: PackedLinear,
    norm: Norm,
}

/// The model's weights laid out for the host kernels.
pub struct HostBert {
    /// `[vocab, h]`
    word: Vec<f32>,
    /// `[max_positions, h]`
    position: Vec<f32>,
    /// `[type_vocab, h]`
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    h: usize,
    heads: usize,
    intermediate: usize,
    /// The kept buffer set for batches of up to [`KEPT_TOKENS`]; `None` while a call uses it.
    kept: Mutex<Option<Buffers>>,
}

/// A parameter's values, row-major, read back from its device.
fn host<const D: usize>(param: &Param<Tensor<D>>) -> Vec<f32> {
    param
        .val()
        .into_data()
        .try_into_vec::<f32>()
        .expect("parameters are f32")
}

fn pack(linear: &Linear) -> PackedLinear {
    let [d_in, d_out] = linear.weight.val().dims();
    let bias = linear.bias.as_ref().map(host).unwrap_or(vec![0.0; d_out]);
    PackedLinear::new(&host(&linear.weight), &bias, d_in, d_out)
}

fn norm(layer_norm: &LayerNorm, eps: f64) -> Norm {
    let gamma = host(&layer_norm.gamma);
    let beta = layer_norm
        .beta
        .as_ref()
        .map(host)
        .unwrap_or(vec![0.0; gamma.len()]);
    Norm {
        gamma,
        beta,
        eps: eps as f32,
    }
}

/// Buffers of one pass, allocated once per batch instead of once per op.
#[derive(Default)]
struct Buffers {
    hidden: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    attended: Vec<f32>,
    intermediate: Vec<f32>,
}

/// A batch runs in groups of whole sequences of up to this many tokens, each through one
/// buffer set that is allocated, and written, once at load (about 31 MB for MiniLM) and
/// kept. Fresh buffers of a few MB are mmaps whose pages the kernel zeroes on first touch:
/// ~5% of a one-passage call. Touching them at load puts the memory in the process's RSS
/// from the start instead of at the first batch of some size (a long run's RSS stays flat
/// after load). A larger batch is not given a set of its own per call (32 passages: ~110
/// MB): such a call right after another library's large one took up to ~1.3x its time,
/// its helper thread off the CPU, neither running nor waiting to run, for ~300 ms of it
/// (schedstat): blocked in the kernel, most likely faulting in the fresh pages (this host
/// compacts memory for huge pages on a fault). Groups give the same numbers bit for bit
/// (every row's products, a sequence's attention and its pooling are its own), and a
/// batch's memory does not grow with its size. A second caller at the same moment
/// allocates a set of its own for its call.
const KEPT_TOKENS: usize = 2048;

impl Buffers {
    /// Sized for `tokens`; every buffer is fully written before it is read in a pass, so
    /// what a reused buffer held does not matter. Within the capacity a kept set was made
    /// with, nothing is allocated.
    fn fit(&mut self, tokens: usize, h: usize, intermediate: usize) {
        self.hidden.resize(tokens * h, 0.0);
        self.qkv.resize(tokens * 3 * h, 0.0);
        self.context.resize(tokens * h, 0.0);
        self.attended.resize(tokens * h, 0.0);
        self.intermediate.resize(tokens * intermediate, 0.0);
    }
}

impl HostBert {
    /// Copies and packs `model`'s parameters (loaded on any device) for the host kernels.
    pub fn new(model: &BertModel, config: &BertConfig) -> Self {
        let eps = config.layer_norm_eps;
        let e = &model.embeddings;
        let layers = model
            .encoder
            .layers
            .iter()
            .map(|l| Layer {
                qkv: pack(&l.attention.qkv),
                output: pack(&l.attention.output),
                attention_norm: norm(&l.attention.norm, eps),
                up: pack(&l.intermediate),
                down: pack(&l.output),
                norm: norm(&l.norm, eps),
            })
            .collect();
        let mut kept = Buffers::default();
        kept.fit(KEPT_TOKENS, config.hidden_size, config.intermediate_size);
        Self {
            word: host(&e.word.weight),
            position: host(&e.position.weight),
            token_type: host(&e.token_type.weight),
            embedding_norm: norm(&e.norm, eps),
            layers,
            h: config.hidden_size,
            heads: config.num_attention_heads,
            intermediate: config.intermediate_size,
            kept: Mutex::new(Some(kept)),
        }
    }

    /// Mean-pooled sentence embeddings `[spans, h]` of a packed batch, L2-normalised when
    /// `normalize`. Ids must be in the vocabulary and spans no longer than the position
    /// table (the tokenizer truncates to `max_seq_length`, which is).
    pub fn embed(&self, batch: &Packed<'_>, normalize: bool) -> Vec<f32> {
        let (h, tokens) = (self.h, batch.ids.len());
        // the QKV product of this batch is split across workers (see packed::SERIAL_FMAS)
        let splits = tokens * h * 3 * h >= packed::SERIAL_FMAS;
        with_team(splits, || {
            let mut pooled = Vec::with_capacity(batch.spans.len() * h);
            let mut rebased = Vec::new();
            for group in groups(batch.spans, KEPT_TOKENS) {
                let spans = &batch.spans[group];
                let start = spans[0].0;
                let end = spans.last().map_or(start, |&(first, len)| first + len);
                rebased.clear();
                rebased.extend(spans.iter().map(|&(first, len)| (first - start, len)));
                pooled.extend(self.embed_group(
                    &Packed {
                        ids: &batch.ids[start..end],
                        type_ids: &batch.type_ids[start..end],
                        spans: &rebased,
                    },
                    normalize,
                ));
            }
            pooled
        })
    }

    /// [`Self::embed`] for one group of whole sequences, in the kept buffer set when it
    /// is free and large enough.
    fn embed_group(&self, batch: &Packed<'_>, normalize: bool) -> Vec<f32> {
        let (h, tokens) = (self.h, batch.ids.len());
        let kept = if tokens <= KEPT_TOKENS {
            self.kept().take()
        } else {
            None
        };
        let is_kept = kept.is_some();
        let mut buf = kept.unwrap_or_default();
        buf.fit(tokens, h, self.intermediate);
        self.embeddings(batch, &mut buf.hidden);
        for layer in &self.layers {
            self.layer(layer, batch.spans, &mut buf);
        }
        let pooled = pool(&buf.hidden, h, batch.spans, normalize);
        if is_kept {
            *self.kept() = Some(buf);
        }
        pooled
    }

    /// The kept buffer set; a panic in another call cannot leave it inconsistent (`fit`
    /// resizes whatever it gets), so a poisoned lock is taken as it is.
    fn kept(&self) -> std::sync::MutexGuard<'_, Option<Buffers>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `hidden` `[tokens, h]` = LN(word + position + token type).
    fn embeddings(&self, batch: &Packed<'_>, hidden: &mut [f32]) {
        let h = self.h;
        let dst = SendPtr(hidden.as_mut_ptr());
        claim_tasks(batch.spans.len(), |span| {
            let (first, len) = batch.spans[span];
            // SAFETY: spans are disjoint rows of `hidden`.
            let rows = unsafe { std::slice::from_raw_parts_mut(dst.at(first * h), len * h) };
            for (p, row) in rows.chunks_exact_mut(h).enumerate() {
                let t = first + p;
                let (id, ty) = (batch.ids[t] as usize, batch.type_ids[t] as usize);
                let word = &self.word[id * h..(id + 1) * h];
                let pos = &self.position[p * h..(p + 1) * h];
                let typ = &self.token_type[ty * h..(ty + 1) * h];
                for (((x, w), q), y) in row.iter_mut().zip(word).zip(pos).zip(typ) {
                    *x = w + y + q;
                }
            }
        });
        add_layer_norm(hidden, &[], &self.embedding_norm);
    }

    /// One post-LayerNorm transformer layer over `buf.hidden`, in place.
    fn layer(&self, l: &Layer, spans: &[(usize, usize)], buf: &mut Buffers) {
        let tokens = buf.hidden.len() / self.h;
        l.qkv
            .forward(&buf.hidden, tokens, &mut buf.qkv, Epilogue::Bias);
        let dh = self.h / self.heads;
        attention::attention(&buf.qkv, self.heads, dh, spans, &mut buf.context);
        l.output
            .forward(&buf.context, tokens, &mut buf.attended, Epilogue::Bias);
        add_layer_norm(&mut buf.attended, &buf.hidden, &l.attention_norm);
        l.up.forward(
            &buf.attended,
            tokens,
            &mut buf.intermediate,
            Epilogue::BiasGelu,
        );
        l.down
            .forward(&buf.intermediate, tokens, &mut buf.hidden, Epilogue::Bias);
        add_layer_norm(&mut buf.hidden, &buf.attended, &l.norm);
    }
}

/// `spans` (in order) cut into runs of whole spans of at most `limit` tokens each, from
/// the first span's first token to the last one's end (a span longer than `limit` is a run
/// of its own); none for no spans.
fn groups(spans: &[(usize, usize)], limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &(first, len)) in spans.iter().enumerate() {
        if i > start && first + len - spans[start].0 > limit {
            out.push(start..i);
            start = i;
        }
    }
    if start < spans.len() {
        out.push(start..spans.len());
    }
    out
}

/// Mean of each span's rows of `hidden` (`[tokens, h]`) -> `[spans, h]`, L2-normalised
/// (norm clamped at 1e-12, as `torch.nn.functional.normalize`) when `normalize`.
fn pool(hidden: &[f32], h: usize, spans: &[(usize, usize)], normalize: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; spans.len() * h];
    let dst = SendPtr(out.as_mut_ptr());
    claim_tasks(spans.len(), |span| {
        let (first, len) = spans[span];
        // SAFETY: each task writes its own row of `out`.
        let row = unsafe { std::slice::from_raw_parts_mut(dst.at(span * h), h) };
        for t in first..first + len {
            row.iter_mut()
                .zip(&hidden[t * h..(t + 1) * h])
                .for_each(|(o, x)| *o += x);
        }
        let inv = 1.0 / (len as f32).max(1e-9);
        row.iter_mut().for_each(|o| *o *= inv);
        if normalize {
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            row.iter_mut().for_each(|o| *o /= norm);
        }
    });
    out
}

/// `n` pseudo-random values in `[-span/2, span/2)` from a 64-bit LCG: test inputs that
/// are the same on every run.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64, span: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * span
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::loader::WeightFile;
    use burn::tensor::{Device, Int, TensorData};
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    /// A tiny BERT with pseudo-random weights written as a safetensors file.
    fn tiny_model(dir: &std::path::Path) -> (BertConfig, std::path::PathBuf) {
        let mut config = BertConfig::new(50, 32, 2, 4, 64, 24);
        config.layer_norm_eps = 1e-12;
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            ("embeddings.word_embeddings.weight".into(), vec![50, h]),
            ("embeddings.position_embeddings.weight".into(), vec![24, h]),
            ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
            ("embeddings.LayerNorm.weight".into(), vec![h]),
            ("embeddings.LayerNorm.bias".into(), vec![h]),
        ];
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for part in [
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
            ] {
                shapes.push((format!("{p}.{part}.weight"), vec![h, h]));
                shapes.push((format!("{p}.{part}.bias"), vec![h]));
            }
            shapes.push((format!("{p}.attention.output.dense.weight"), vec![h, h]));
            shapes.push((format!("{p}.attention.output.dense.bias"), vec![h]));
            shapes.push((format!("{p}.attention.output.LayerNorm.weight"), vec![h]));
            shapes.push((format!("{p}.attention.output.LayerNorm.bias"), vec![h]));
            shapes.push((format!("{p}.intermediate.dense.weight"), vec![i, h]));
            shapes.push((format!("{p}.intermediate.dense.bias"), vec![i]));
            shapes.push((format!("{p}.output.dense.weight"), vec![h, i]));
            shapes.push((format!("{p}.output.dense.bias"), vec![h]));
            shapes.push((format!("{p}.output.LayerNorm.weight"), vec![h]));
            shapes.push((format!("{p}.output.LayerNorm.bias"), vec![h]));
        }
        let mut state = 12345u64;
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let is_gamma = name.ends_with("LayerNorm.weight");
                let bytes = (0..n)
                    .flat_map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                        let v = if is_gamma { 1.0 + 0.2 * u } else { 0.4 * u };
                        v.to_le_bytes()
                    })
                    .collect();
                (name, shape, bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = data
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        let path = dir.join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        (config, path)
    }

    /// Normalised embeddings of `texts` (token ids, segment 0), packed end to end.
    fn embed_texts(host: &HostBert, texts: &[Vec<u32>]) -> Vec<f32> {
        let ids = texts.concat();
        let mut spans = Vec::new();
        let mut at = 0;
        for t in texts {
            spans.push((at, t.len()));
            at += t.len();
        }
        let type_ids = vec![0u32; ids.len()];
        let packed = Packed {
            ids: &ids,
            type_ids: &type_ids,
            spans: &spans,
        };
        host.embed(&packed, true)
    }

    /// The host kernels on a packed batch give burn's padded forward pass, text by text.
    #[test]
    fn host_forward_matches_burn_forward() {
        let dir = std::env::temp_dir().join(format!("embedder_rs_tiny_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (config, path) = tiny_model(&dir);
        let device = Device::flex();
        let model = BertModel::load(&WeightFile::open(&path).unwrap(), &config, &device).unwrap();
        let host = HostBert::new(&model, &config);

        let texts: Vec<Vec<u32>> = vec![
            vec![1, 7, 9, 22, 41, 2],
            vec![1, 2],
            (0..20).map(|i| (i * 7 % 49) as u32 + 1).collect(),
            vec![1, 30, 31, 2],
        ];
        let ours = embed_texts(&host, &texts);

        let (b, s) = (texts.len(), texts.iter().map(Vec::len).max().unwrap());
        let mut padded = vec![0i64; b * s];
        let mut mask = vec![0i64; b * s];
        for (r, t) in texts.iter().enumerate() {
            for (j, &id) in t.iter().enumerate() {
                padded[r * s + j] = id as i64;
                mask[r * s + j] = 1;
            }
        }
        let int = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [b, s]), &device);
        let lengths: Vec<usize> = texts.iter().map(Vec::len).collect();
        let want = model
            .embed(int(padded), int(vec![0; b * s]), int(mask), &lengths, true)
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        assert_eq!(ours.len(), want.len());
        for (k, (a, w)) in ours.iter().zip(&want).enumerate() {
            assert!((a - w).abs() < 2e-5, "value {k}: host {a} vs burn {w}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Buffers kept from a larger batch hold its values; the next, smaller batch must not
    /// see them: its result equals a fresh model's, bit for bit.
    #[test]
    fn reused_buffers_do_not_leak_into_the_next_batch() {
        let dir = std::env::temp_dir().join(format!("embedder_rs_reuse_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (config, path) = tiny_model(&dir);
        let device = Device::flex();
        let model = BertModel::load(&WeightFile::open(&path).unwrap(), &config, &device).unwrap();
        let (used, fresh) = (
            HostBert::new(&model, &config),
            HostBert::new(&model, &config),
        );
        let long: Vec<Vec<u32>> = (0..6)
            .map(|s| {
                (0..20)
                    .map(|i| ((i * 11 + s * 5) % 49) as u32 + 1)
                    .collect()
            })
            .collect();
        let short = vec![vec![1, 7, 2], vec![1, 40, 41, 42, 2]];
        embed_texts(&used, &long);
        assert!(used.kept().is_some(), "the kept set is back after a call");
        assert_eq!(embed_texts(&used, &short), embed_texts(&fresh, &short));
        // over KEPT_TOKENS: in groups through the kept set, which does not grow; every
        // text's embedding is the one it gets alone, bit for bit, across the groups' seams
        let many: Vec<Vec<u32>> = (0..KEPT_TOKENS / 20 + 5)
            .map(|s| long[s % 6].clone())
            .collect();
        let out = embed_texts(&used, &many);
        assert_eq!(out.len(), many.len() * config.hidden_size);
        let alone = embed_texts(&fresh, &long);
        for (t, row) in out.chunks_exact(config.hidden_size).enumerate() {
            let s = t % 6;
            assert_eq!(
                row,
                &alone[s * config.hidden_size..(s + 1) * config.hidden_size],
                "text {t}"
            );
        }
        assert_eq!(
            used.kept().as_ref().map(|b| b.hidden.capacity()),
            Some(KEPT_TOKENS * config.hidden_size)
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Runs of whole spans within the limit, measured from a run's first token to its last
    /// one's end; a span over the limit runs alone; nothing for nothing.
    #[test]
    fn groups_cut_between_whole_spans() {
        let spans = [(0, 3), (3, 4), (7, 2), (9, 6), (15, 1)];
        assert_eq!(groups(&spans, 9), vec![0..3, 3..5]);
        assert_eq!(groups(&spans, 16), vec![0..5]);
        assert_eq!(groups(&spans, 5), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
        assert_eq!(groups(&[(0, 40), (40, 2)], 8), vec![0..1, 1..2]);
        assert!(groups(&[], 8).is_empty());
    }
}
