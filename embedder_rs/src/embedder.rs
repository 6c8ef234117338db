//! The sentence embedder: tokenizer + BERT + pooling on a chosen device.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use burn::tensor::{Int, Tensor, TensorData};
use serde_json::Value;

use crate::backend::{self, panic_message, BackendKind, SelectedDevice};
use crate::error::{EmbedderError, Result};
use crate::model::cpu::{HostBert, Packed};
use crate::model::loader::WeightFile;
use crate::model::{BertConfig, BertModel};
use crate::tokenize::{make_batches, pack_chunks, Batch, TextTokenizer};

/// Default most texts per forward pass.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Default most padded tokens per forward pass (bounds activation memory).
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 16 * 1024;

/// Options for [`Embedder::load`].
#[derive(Debug, Clone)]
pub struct EmbedderOptions {
    /// `"auto"`, `"cpu"` or `"wgpu"`.
    pub backend: String,
    /// Truncation length; `None` reads `sentence_bert_config.json` (else the
    /// model's `max_position_embeddings`).
    pub max_seq_length: Option<usize>,
    /// Most texts per forward pass on wgpu (padded batches); the CPU packs texts without
    /// padding and is bounded by `max_batch_tokens` alone.
    pub batch_size: usize,
    /// Most tokens (padded, on wgpu) per forward pass: bounds activation memory.
    pub max_batch_tokens: usize,
}

impl Default for EmbedderOptions {
    fn default() -> Self {
        Self {
            backend: "auto".into(),
            max_seq_length: None,
            batch_size: DEFAULT_BATCH_SIZE,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
        }
    }
}

/// What runs the forward pass.
enum Engine {
    /// Host kernels over packed weights (the CPU).
    Host(Box<HostBert>),
    /// burn's tensor ops on the device (wgpu).
    Burn(Box<BertModel>),
}

/// A loaded sentence-transformers BERT model.
pub struct Embedder {
    engine: Engine,
    tokenizer: TextTokenizer,
    device: SelectedDevice,
    config: BertConfig,
    name: String,
    batch_size: usize,
    max_batch_tokens: usize,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| EmbedderError::BadConfig {
        file: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| EmbedderError::BadConfig {
        file: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn required(dir: &Path, file: &str) -> Result<PathBuf> {
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EmbedderError::BadModelDir {
            dir: dir.to_path_buf(),
            reason: format!("{file} not found"),
        })
    }
}

impl Embedder {
    /// Loads `config.json`, `model.safetensors` and `tokenizer.json` from `dir`.
    pub fn load(dir: impl AsRef<Path>, options: &EmbedderOptions) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(EmbedderError::BadModelDir {
                dir: dir.to_path_buf(),
                reason: "not a directory".into(),
            });
        }
        let config = BertConfig::from_hf_json(&required(dir, "config.json")?)?;
        let weights_path = required(dir, "model.safetensors")?;
        let tokenizer_path = required(dir, "tokenizer.json")?;

        let pooling = dir.join("1_Pooling").join("config.json");
        if pooling.is_file() {
            let v = read_json(&pooling)?;
            if v.get("pooling_mode_mean_tokens").and_then(Value::as_bool) != Some(true) {
                return Err(EmbedderError::BadConfig {
                    file: pooling,
                    reason: "only mean pooling (pooling_mode_mean_tokens) is supported".into(),
                });
            }
        }
        let st_config = dir.join("sentence_bert_config.json");
        let from_st = if st_config.is_file() {
            read_json(&st_config)?
                .get("max_seq_length")
                .and_then(Value::as_u64)
                .map(|n| n as usize)
        } else {
            None
        };
        let max_seq_length = options
            .max_seq_length
            .or(from_st)
            .unwrap_or(config.max_position_embeddings)
            .min(config.max_position_embeddings);
        if max_seq_length < 2 {
            return Err(EmbedderError::BadConfig {
                file: st_config,
                reason: format!("max_seq_length {max_seq_length} is too small"),
            });
        }

        let tokenizer = TextTokenizer::load(&tokenizer_path, max_seq_length)?;
        let device = backend::select(&options.backend)?;
        let weights = WeightFile::open(&weights_path)?;
        let model = catch_unwind(AssertUnwindSafe(|| {
            BertModel::load(&weights, &config, &device.device)
        }))
        .map_err(|p| EmbedderError::Inference(panic_message(p.as_ref())))??;
        // On the CPU the burn parameters are packed for the host kernels and then dropped.
        let engine = match device.kind {
            BackendKind::Cpu => Engine::Host(Box::new(HostBert::new(&model, &config))),
            BackendKind::Wgpu => Engine::Burn(Box::new(model)),
        };

        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default();
        Ok(Self {
            engine,
            tokenizer,
            device,
            config,
            name,
            batch_size: options.batch_size.max(1),
            max_batch_tokens: options.max_batch_tokens.max(1),
        })
    }

    /// Embedding width.
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    /// Truncation length in tokens.
    pub fn max_seq_length(&self) -> usize {
        self.tokenizer.max_seq_length()
    }

    /// Backend actually in use.
    pub fn backend(&self) -> BackendKind {
        self.device.kind
    }

    /// The kernels that run the forward pass: `"wgpu"` on the wgpu backend, else the CPU
    /// instruction set the host kernels chose (`"avx512"`, `"avx2"`, `"neon"` or
    /// `"portable"`, see `EMBEDDER_RS_KERNEL`).
    pub fn kernel(&self) -> &'static str {
        match self.engine {
            Engine::Host(_) => crate::model::simd::isa().name(),
            Engine::Burn(_) => "wgpu",
        }
    }

    /// Why this backend: what was asked for and, for `"auto"`, what it found.
    pub fn backend_reason(&self) -> &str {
        &self.device.reason
    }

    /// Adapter (GPU name, or CPU description) actually in use.
    pub fn adapter(&self) -> &str {
        &self.device.adapter
    }

    /// Name of the model directory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Token counts after truncation, `[CLS]` and `[SEP]` included.
    pub fn count_tokens(&self, texts: &[&str]) -> Result<Vec<usize>> {
        self.tokenizer.count(texts)
    }

    /// Embeds `texts`; returns row-major `[texts.len(), dim]` f32.
    pub fn embed(&self, texts: &[&str], normalize: bool) -> Result<Vec<f32>> {
        let dim = self.dim();
        let mut out = vec![0.0f32; texts.len() * dim];
        if texts.is_empty() {
            return Ok(out);
        }
        let model = match &self.engine {
            Engine::Host(host) => {
                // On the calling thread, which leads the pass's parallel ops itself with
                // rayon's workers as helpers (model::cpu::team); a text of a few tokens,
                // whose products are too small to split, never leaves it.
                self.embed_host(host, texts, normalize, &mut out)?;
                return Ok(out);
            }
            Engine::Burn(model) => model,
        };
        let encodings = self.tokenizer.encode(texts)?;
        let batches = make_batches(
            &encodings,
            self.tokenizer.pad_id(),
            self.batch_size,
            self.max_batch_tokens,
        );
        for batch in batches {
            let rows = self.forward(model, &batch, normalize)?;
            for (k, &r) in batch.rows.iter().enumerate() {
                out[r * dim..(r + 1) * dim].copy_from_slice(&rows[k * dim..(k + 1) * dim]);
            }
        }
        Ok(out)
    }

    /// The CPU path: texts packed without padding into chunks of at most
    /// `max_batch_tokens` tokens, each through the host kernels; rows into `out`.
    fn embed_host(
        &self,
        host: &HostBert,
        texts: &[&str],
        normalize: bool,
        out: &mut [f32],
    ) -> Result<()> {
        let dim = self.dim();
        let encodings = self.tokenizer.encode(texts)?;
        for chunk in pack_chunks(&encodings, self.max_batch_tokens) {
            let batch = Packed {
                ids: &chunk.ids,
                type_ids: &chunk.type_ids,
                spans: &chunk.spans,
            };
            let rows = catch_unwind(AssertUnwindSafe(|| host.embed(&batch, normalize)))
                .map_err(|p| EmbedderError::Inference(panic_message(p.as_ref())))?;
            let at = chunk.first * dim;
            out[at..at + rows.len()].copy_from_slice(&rows);
        }
        Ok(())
    }

    /// One padded batch through burn's model: `[b, dim]` row-major.
    fn forward(&self, model: &BertModel, batch: &Batch, normalize: bool) -> Result<Vec<f32>> {
        let device = &self.device.device;
        let shape = [batch.rows.len(), batch.seq_len];
        let run = || -> Result<Vec<f32>> {
            let ids = |v: &Vec<i64>| {
                Tensor::<2, Int>::from_data(TensorData::new(v.clone(), shape), device)
            };
            let lengths: Vec<usize> = batch
                .attention_mask
                .chunks_exact(batch.seq_len)
                .map(|row| row.iter().filter(|&&m| m != 0).count())
                .collect();
            let pooled = model.embed(
                ids(&batch.input_ids),
                ids(&batch.token_type_ids),
                ids(&batch.attention_mask),
                &lengths,
                normalize,
            );
            let data = pooled
                .try_into_data()
                .map_err(|e| EmbedderError::Inference(format!("{e:?}")))?;
            data.try_into_vec::<f32>()
                .map_err(|e| EmbedderError::Inference(format!("{e:?}")))
        };
        catch_unwind(AssertUnwindSafe(run))
            .map_err(|p| EmbedderError::Inference(panic_message(p.as_ref())))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_dir_is_reported() {
        let err = Embedder::load("/definitely/not/here", &EmbedderOptions::default())
            .err()
            .unwrap();
        assert!(matches!(err, EmbedderError::BadModelDir { .. }));
        assert!(err.to_string().contains("not a directory"));
    }

    #[test]
    fn dir_without_files_is_reported() {
        let dir = std::env::temp_dir().join(format!("embedder_rs_empty_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = Embedder::load(&dir, &EmbedderOptions::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("config.json not found"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
