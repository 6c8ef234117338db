//! BERT self-attention block: fused QKV projection, scaled dot-product attention
//! with a padding mask, output projection, residual and post-LayerNorm.

use burn::module::Module;
use burn::nn::{LayerNorm, Linear};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Tensor, TensorData};

use super::config::BertConfig;
use super::loader::{linear_from_host, WeightFile};
use crate::error::Result;

/// Multi-head self-attention with its output sub-layer.
#[derive(Module, Debug)]
pub struct BertAttention {
    /// Query, key and value projections fused into one `[h, 3h]` matmul.
    pub qkv: Linear,
    /// Output projection `[h, h]`.
    pub output: Linear,
    /// Post-attention LayerNorm over `h`.
    pub norm: LayerNorm,
    /// Number of heads.
    pub heads: usize,
}

impl BertAttention {
    /// Loads `{prefix}.attention.*`.
    pub fn load(w: &WeightFile, c: &BertConfig, prefix: &str, device: &Device) -> Result<Self> {
        let h = c.hidden_size;
        let mut weight = vec![0.0f32; h * 3 * h];
        let mut bias = Vec::with_capacity(3 * h);
        for (i, part) in ["query", "key", "value"].iter().enumerate() {
            // Host layout [h_in, h_out]; interleave the three into [h_in, 3h].
            let (wp, bp) = w.linear_host(&format!("{prefix}.attention.self.{part}"), h, h)?;
            for r in 0..h {
                weight[r * 3 * h + i * h..r * 3 * h + (i + 1) * h]
                    .copy_from_slice(&wp[r * h..(r + 1) * h]);
            }
            bias.extend_from_slice(&bp);
        }
        Ok(Self {
            qkv: linear_from_host(weight, bias, h, 3 * h, device),
            output: w.linear(&format!("{prefix}.attention.output.dense"), h, h, device)?,
            norm: w.layer_norm(
                &format!("{prefix}.attention.output.LayerNorm"),
                h,
                c.layer_norm_eps,
                device,
            )?,
            heads: c.num_attention_heads,
        })
    }

    /// - `x`: `[b, s, h]` hidden states
    /// - `mask`: `[b, heads, s, s]`, `true` at padded keys (see [`padding_mask`])
    /// - returns `[b, s, h]`
    pub fn forward(&self, x: Tensor<3>, mask: &Tensor<4, Bool>) -> Tensor<3> {
        let qkv = super::linear_rows(&self.qkv, x.clone());
        let context = device_attention(qkv, mask.clone(), self.heads);
        self.norm
            .forward(super::linear_rows(&self.output, context) + x)
    }
}

/// burn's attention over the fused projection: `qkv` `[b, s, 3h]` and `mask`
/// `[b, heads, s, s]` (see [`padding_mask`]) -> context `[b, s, h]`.
pub fn device_attention(qkv: Tensor<3>, mask: Tensor<4, Bool>, heads: usize) -> Tensor<3> {
    let [b, s, h3] = qkv.dims();
    let (h, dh) = (h3 / 3, h3 / 3 / heads);
    // [b, s, 3h] -> [b, s, 3, heads, dh] -> [3, b, heads, s, dh]
    let qkv = qkv.reshape([b, s, 3, heads, dh]).permute([2, 0, 3, 1, 4]);
    let part = |i: usize| -> Tensor<4> { qkv.clone().narrow(0, i, 1).reshape([b, heads, s, dh]) };
    // [b, heads, s, dh]
    let context = attention(
        part(0),
        part(1),
        part(2),
        Some(mask),
        None,
        AttentionModuleOptions::default(),
    );
    // [b, heads, s, dh] -> [b, s, h]
    context.swap_dims(1, 2).reshape([b, s, h])
}

/// `[b, heads, s, s]`, `true` where the key position is past the sequence's length.
pub fn padding_mask(lengths: &[usize], s: usize, heads: usize, device: &Device) -> Tensor<4, Bool> {
    let b = lengths.len();
    let pad: Vec<bool> = lengths
        .iter()
        .flat_map(|&len| (0..s).map(move |j| j >= len))
        .collect();
    Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, s]), device)
        .reshape([b, 1, 1, s])
        .expand([b, heads, s, s])
}
