//! BERT input embeddings: word + position + token type, then LayerNorm.

use burn::module::Module;
use burn::nn::{Embedding, LayerNorm};
use burn::tensor::{Device, Int, Tensor};

use super::config::BertConfig;
use super::loader::WeightFile;
use crate::error::Result;

/// Sum of the three embedding tables, normalised.
#[derive(Module, Debug)]
pub struct BertEmbeddings {
    /// `[vocab_size, h]`
    pub word: Embedding,
    /// `[max_position_embeddings, h]`
    pub position: Embedding,
    /// `[type_vocab_size, h]`
    pub token_type: Embedding,
    /// LayerNorm over `h`.
    pub norm: LayerNorm,
}

impl BertEmbeddings {
    /// Loads `embeddings.*` from the weight file.
    pub fn load(w: &WeightFile, c: &BertConfig, device: &Device) -> Result<Self> {
        let h = c.hidden_size;
        Ok(Self {
            word: w.embedding("embeddings.word_embeddings", c.vocab_size, h, device)?,
            position: w.embedding(
                "embeddings.position_embeddings",
                c.max_position_embeddings,
                h,
                device,
            )?,
            token_type: w.embedding(
                "embeddings.token_type_embeddings",
                c.type_vocab_size,
                h,
                device,
            )?,
            norm: w.layer_norm("embeddings.LayerNorm", h, c.layer_norm_eps, device)?,
        })
    }

    /// - `input_ids`: `[b, s]` word-piece ids
    /// - `token_type_ids`: `[b, s]` segment ids
    /// - returns `[b, s, h]`
    pub fn forward(&self, input_ids: Tensor<2, Int>, token_type_ids: Tensor<2, Int>) -> Tensor<3> {
        let [_, s] = input_ids.dims();
        let [_, h] = self.position.weight.dims();
        // Positions 0..s are the first s rows of the table: [1, s, h], broadcast over b.
        let position = self
            .position
            .weight
            .val()
            .narrow(0, 0, s)
            .reshape([1, s, h]);
        let x = self.word.forward(input_ids) + self.token_type.forward(token_type_ids) + position;
        self.norm.forward(x)
    }
}
