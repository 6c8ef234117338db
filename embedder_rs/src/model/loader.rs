//! Reads BERT weights from a `model.safetensors` file into burn parameters.
//!
//! Names are looked up with the prefixes Hugging Face checkpoints use for a bare
//! `BertModel` (`""`) and for task heads wrapping one (`"bert."`). Every tensor's
//! shape is checked against `config.json` before it reaches a device.

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::{Embedding, LayerNorm, LayerNormConfig, Linear};
use burn::tensor::{Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use crate::error::{EmbedderError, Result};

const PREFIXES: [&str; 3] = ["", "bert.", "model."];

/// A `model.safetensors` file held in memory, with the prefix its names use.
pub struct WeightFile {
    path: PathBuf,
    bytes: Vec<u8>,
    prefix: &'static str,
}

impl WeightFile {
    /// Reads the file and detects the name prefix from the word embedding table.
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| EmbedderError::Weights {
            file: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let mut file = Self {
            path: path.to_path_buf(),
            bytes,
            prefix: "",
        };
        let names = file.names()?;
        let anchor = "embeddings.word_embeddings.weight";
        file.prefix = PREFIXES
            .iter()
            .find(|p| names.iter().any(|n| *n == format!("{p}{anchor}")))
            .ok_or_else(|| file.missing(anchor))?;
        Ok(file)
    }

    fn parse(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.bytes).map_err(|e| EmbedderError::Weights {
            file: self.path.clone(),
            reason: e.to_string(),
        })
    }

    fn names(&self) -> Result<Vec<String>> {
        Ok(self
            .parse()?
            .names()
            .into_iter()
            .map(str::to_string)
            .collect())
    }

    fn missing(&self, name: &str) -> EmbedderError {
        EmbedderError::MissingTensor {
            name: name.to_string(),
            file: self.path.clone(),
            prefixes: PREFIXES.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Reads tensor `name` (without prefix) as f32, checking it has shape `expected`.
    pub fn read(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let tensors = self.parse()?;
        let full = format!("{}{name}", self.prefix);
        let view = tensors.tensor(&full).map_err(|_| self.missing(name))?;
        if view.shape() != expected {
            return Err(EmbedderError::ShapeMismatch {
                name: full,
                expected: expected.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(EmbedderError::Weights {
                    file: self.path.clone(),
                    reason: format!("tensor {full:?} has unsupported dtype {other:?}"),
                })
            }
        };
        Ok(values)
    }

    /// A 1-D parameter of length `n`.
    pub fn vector(&self, name: &str, n: usize, device: &Device) -> Result<Param<Tensor<1>>> {
        let values = self.read(name, &[n])?;
        Ok(Param::from_tensor(Tensor::from_data(
            TensorData::new(values, [n]),
            device,
        )))
    }

    /// An embedding table `[rows, dim]`.
    pub fn embedding(
        &self,
        name: &str,
        rows: usize,
        dim: usize,
        device: &Device,
    ) -> Result<Embedding> {
        let values = self.read(&format!("{name}.weight"), &[rows, dim])?;
        Ok(Embedding {
            weight: Param::from_tensor(Tensor::from_data(
                TensorData::new(values, [rows, dim]),
                device,
            )),
        })
    }

    /// Reads a PyTorch `nn.Linear` (`weight: [d_out, d_in]`, `bias: [d_out]`) as
    /// host row-major `[d_in, d_out]` weights and the bias.
    pub fn linear_host(
        &self,
        name: &str,
        d_in: usize,
        d_out: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let w = self.read(&format!("{name}.weight"), &[d_out, d_in])?;
        let b = self.read(&format!("{name}.bias"), &[d_out])?;
        Ok((transpose(&w, d_out, d_in), b))
    }

    /// A burn [`Linear`] (`weight: [d_in, d_out]`) from a PyTorch `nn.Linear`.
    pub fn linear(&self, name: &str, d_in: usize, d_out: usize, device: &Device) -> Result<Linear> {
        let (w, b) = self.linear_host(name, d_in, d_out)?;
        Ok(linear_from_host(w, b, d_in, d_out, device))
    }

    /// A LayerNorm named `name` (`weight`/`bias`, or the old `gamma`/`beta`).
    pub fn layer_norm(
        &self,
        name: &str,
        dim: usize,
        eps: f64,
        device: &Device,
    ) -> Result<LayerNorm> {
        let mut norm = LayerNormConfig::new(dim).with_epsilon(eps).init(device);
        let (gamma, beta) = match self.vector(&format!("{name}.weight"), dim, device) {
            Ok(g) => (g, self.vector(&format!("{name}.bias"), dim, device)?),
            Err(EmbedderError::MissingTensor { .. }) => (
                self.vector(&format!("{name}.gamma"), dim, device)
                    .map_err(|_| self.missing(&format!("{name}.weight")))?,
                self.vector(&format!("{name}.beta"), dim, device)?,
            ),
            Err(e) => return Err(e),
        };
        norm.gamma = gamma;
        norm.beta = Some(beta);
        Ok(norm)
    }
}

/// Builds a burn [`Linear`] from host row-major `[d_in, d_out]` weights and a bias.
pub fn linear_from_host(
    w: Vec<f32>,
    b: Vec<f32>,
    d_in: usize,
    d_out: usize,
    device: &Device,
) -> Linear {
    Linear {
        weight: Param::from_tensor(Tensor::from_data(TensorData::new(w, [d_in, d_out]), device)),
        bias: Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(b, [d_out]),
            device,
        ))),
    }
}

/// Transposes a row-major `[rows, cols]` matrix into `[cols, rows]`.
pub fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = m[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_is_correct() {
        // [[1, 2, 3], [4, 5, 6]] -> [[1, 4], [2, 5], [3, 6]]
        let t = transpose(&[1., 2., 3., 4., 5., 6.], 2, 3);
        assert_eq!(t, vec![1., 4., 2., 5., 3., 6.]);
    }

    #[test]
    fn missing_file_is_a_weights_error() {
        let err = WeightFile::open(Path::new("/nonexistent/model.safetensors"))
            .err()
            .unwrap();
        assert!(matches!(err, EmbedderError::Weights { .. }));
    }
}
