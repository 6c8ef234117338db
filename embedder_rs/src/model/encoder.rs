//! BERT encoder: a stack of post-LayerNorm transformer layers with exact GELU.

use burn::module::Module;
use burn::nn::{LayerNorm, Linear};
use burn::tensor::activation::gelu;
use burn::tensor::{Bool, Device, Tensor};

use super::attention::BertAttention;
use super::config::BertConfig;
use super::loader::WeightFile;
use crate::error::Result;

/// One transformer layer: attention, then the feed-forward sub-layer.
#[derive(Module, Debug)]
pub struct BertLayer {
    /// Self-attention with residual and LayerNorm.
    pub attention: BertAttention,
    /// `[h, intermediate]`
    pub intermediate: Linear,
    /// `[intermediate, h]`
    pub output: Linear,
    /// LayerNorm over `h` after the feed-forward residual.
    pub norm: LayerNorm,
}

impl BertLayer {
    /// Loads `encoder.layer.{index}.*`.
    pub fn load(w: &WeightFile, c: &BertConfig, index: usize, device: &Device) -> Result<Self> {
        let p = format!("encoder.layer.{index}");
        let (h, i) = (c.hidden_size, c.intermediate_size);
        Ok(Self {
            attention: BertAttention::load(w, c, &p, device)?,
            intermediate: w.linear(&format!("{p}.intermediate.dense"), h, i, device)?,
            output: w.linear(&format!("{p}.output.dense"), i, h, device)?,
            norm: w.layer_norm(
                &format!("{p}.output.LayerNorm"),
                h,
                c.layer_norm_eps,
                device,
            )?,
        })
    }

    /// - `x`: `[b, s, h]`, `mask`: `[b, heads, s, s]`, `true` at padded keys
    /// - returns `[b, s, h]`
    pub fn forward(&self, x: Tensor<3>, mask: &Tensor<4, Bool>) -> Tensor<3> {
        let x = self.attention.forward(x, mask);
        let y = self
            .output
            .forward(gelu(self.intermediate.forward(x.clone())));
        self.norm.forward(y + x)
    }
}

/// The layer stack.
#[derive(Module, Debug)]
pub struct BertEncoder {
    /// `num_hidden_layers` layers.
    pub layers: Vec<BertLayer>,
}

impl BertEncoder {
    /// Loads every `encoder.layer.*`.
    pub fn load(w: &WeightFile, c: &BertConfig, device: &Device) -> Result<Self> {
        let layers = (0..c.num_hidden_layers)
            .map(|i| BertLayer::load(w, c, i, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers })
    }

    /// - `x`: `[b, s, h]`, `mask`: `[b, heads, s, s]`, `true` at padded keys -> `[b, s, h]`
    pub fn forward(&self, mut x: Tensor<3>, mask: &Tensor<4, Bool>) -> Tensor<3> {
        for layer in &self.layers {
            x = layer.forward(x, mask);
        }
        x
    }
}
