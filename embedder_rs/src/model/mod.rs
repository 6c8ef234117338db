//! The BERT model in burn, one file per component.

pub mod activation;
pub mod attention;
pub mod config;
pub mod cpu;
pub mod embeddings;
pub mod encoder;
pub mod loader;
pub mod pooling;
pub mod simd;

/// The CPU kernels' instruction set in this process: `"avx512"`, `"avx2"`, `"neon"` or
/// `"portable"` (see `EMBEDDER_RS_KERNEL`).
pub fn kernel_name() -> &'static str {
    simd::isa().name()
}

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor};

pub use config::BertConfig;
use embeddings::BertEmbeddings;
use encoder::BertEncoder;
use loader::WeightFile;

use crate::error::Result;

/// A BERT encoder with sentence pooling on top, in burn's tensor ops: what runs on wgpu.
/// On the CPU its parameters run through the host kernels of [`cpu`] instead.
#[derive(Module, Debug)]
pub struct BertModel {
    /// Input embeddings.
    pub embeddings: BertEmbeddings,
    /// Transformer layers.
    pub encoder: BertEncoder,
    /// Number of attention heads (for the mask shape).
    pub heads: usize,
}

impl BertModel {
    /// Loads every tensor the architecture needs from `weights`, checking shapes.
    pub fn load(weights: &WeightFile, config: &BertConfig, device: &Device) -> Result<Self> {
        Ok(Self {
            embeddings: BertEmbeddings::load(weights, config, device)?,
            encoder: BertEncoder::load(weights, config, device)?,
            heads: config.num_attention_heads,
        })
    }

    /// Sentence embeddings for one right-padded batch.
    ///
    /// - `input_ids`, `token_type_ids`: `[b, s]`
    /// - `attention_mask`: `[b, s]`, 1 for real tokens and 0 for padding
    /// - `lengths`: real tokens per row (the ones of `attention_mask`, all first)
    /// - returns `[b, h]`, L2-normalised when `normalize`
    pub fn embed(
        &self,
        input_ids: Tensor<2, Int>,
        token_type_ids: Tensor<2, Int>,
        attention_mask: Tensor<2, Int>,
        lengths: &[usize],
        normalize: bool,
    ) -> Tensor<2> {
        let [_, s] = input_ids.dims();
        let mask = attention::padding_mask(lengths, s, self.heads, &input_ids.device());
        let x = self.embeddings.forward(input_ids, token_type_ids);
        let x = self.encoder.forward(x, &mask);
        let pooled = pooling::mean_pool(x, attention_mask.float());
        if normalize {
            pooling::l2_normalize(pooled)
        } else {
            pooled
        }
    }
}

/// Applies `layer` to `[b, s, d_in]` as one `[b*s, d_in] @ [d_in, d_out]` matmul, so the
/// CPU gemm gets one large problem it can split across threads instead of `b` small ones.
///
/// - `x`: `[b, s, d_in]` -> `[b, s, d_out]`
pub fn linear_rows(layer: &burn::nn::Linear, x: Tensor<3>) -> Tensor<3> {
    let [b, s, d_in] = x.dims();
    let y = layer.forward(x.reshape([b * s, d_in]));
    let [_, d_out] = y.dims();
    y.reshape([b, s, d_out])
}
