//! BERT hyper-parameters, read from a Hugging Face `config.json`.

use std::path::Path;

use burn::config::Config;
use serde_json::Value;

use crate::error::EmbedderError;

/// Hyper-parameters of a BERT encoder.
#[derive(Config, Debug, PartialEq)]
pub struct BertConfig {
    /// Number of word pieces, rows of the word embedding table.
    pub vocab_size: usize,
    /// Width `h` of every hidden state.
    pub hidden_size: usize,
    /// Number of encoder layers.
    pub num_hidden_layers: usize,
    /// Number of attention heads; `hidden_size` must be a multiple of it.
    pub num_attention_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Rows of the position embedding table (longest sequence the model can take).
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) embedding table.
    #[config(default = 2)]
    pub type_vocab_size: usize,
    /// Epsilon of every LayerNorm.
    #[config(default = 1e-12)]
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// Parses a Hugging Face `config.json` (unknown keys are ignored).
    pub fn from_hf_json(path: &Path) -> crate::error::Result<Self> {
        let bad = |reason: String| EmbedderError::BadConfig {
            file: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        Self::from_hf_str(&text).map_err(bad)
    }

    /// Parses the text of a Hugging Face `config.json`.
    pub fn from_hf_str(text: &str) -> std::result::Result<Self, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(model_type) = v.get("model_type").and_then(Value::as_str) {
            if model_type != "bert" {
                return Err(format!(
                    "model_type {model_type:?} is not supported (only \"bert\")"
                ));
            }
        }
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "gelu" {
                return Err(format!(
                    "hidden_act {act:?} is not supported (only exact \"gelu\")"
                ));
            }
        }
        if let Some(kind) = v.get("position_embedding_type").and_then(Value::as_str) {
            if kind != "absolute" {
                return Err(format!("position_embedding_type {kind:?} is not supported"));
            }
        }
        let get = |key: &str| -> std::result::Result<usize, String> {
            v.get(key)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| format!("missing or non-integer key {key:?}"))
        };
        let mut config = BertConfig::new(
            get("vocab_size")?,
            get("hidden_size")?,
            get("num_hidden_layers")?,
            get("num_attention_heads")?,
            get("intermediate_size")?,
            get("max_position_embeddings")?,
        );
        if let Ok(n) = get("type_vocab_size") {
            config.type_vocab_size = n;
        }
        if let Some(eps) = v.get("layer_norm_eps").and_then(Value::as_f64) {
            config.layer_norm_eps = eps;
        }
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            ));
        }
        Ok(config)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINILM: &str = r#"{"architectures":["BertModel"],"attention_probs_dropout_prob":0.1,
      "hidden_act":"gelu","hidden_size":384,"intermediate_size":1536,"layer_norm_eps":1e-12,
      "max_position_embeddings":512,"model_type":"bert","num_attention_heads":12,
      "num_hidden_layers":6,"type_vocab_size":2,"vocab_size":30522}"#;

    #[test]
    fn parses_minilm_config() {
        let c = BertConfig::from_hf_str(MINILM).unwrap();
        assert_eq!(c.hidden_size, 384);
        assert_eq!(c.num_hidden_layers, 6);
        assert_eq!(c.head_dim(), 32);
        assert_eq!(c.layer_norm_eps, 1e-12);
    }

    #[test]
    fn rejects_other_architectures() {
        let text = MINILM.replace("\"bert\"", "\"gpt2\"");
        assert!(BertConfig::from_hf_str(&text).unwrap_err().contains("gpt2"));
        let text = MINILM.replace("\"gelu\"", "\"relu\"");
        assert!(BertConfig::from_hf_str(&text).is_err());
        assert!(BertConfig::from_hf_str("{}")
            .unwrap_err()
            .contains("vocab_size"));
    }
}
