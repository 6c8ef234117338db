//! Sentence pooling: masked mean over tokens, optional L2 normalisation.

use burn::tensor::Tensor;

/// Mean of the token states where `mask` is 1, as sentence-transformers' `Pooling`
/// with `pooling_mode_mean_tokens` (token count clamped at 1e-9).
///
/// - `x`: `[b, s, h]`, `mask`: `[b, s]` (1.0 = real token, 0.0 = padding)
/// - returns `[b, h]`
pub fn mean_pool(x: Tensor<3>, mask: Tensor<2>) -> Tensor<2> {
    let [b, s, h] = x.dims();
    let mask = mask.reshape([b, s, 1]);
    let sum = (x * mask.clone()).sum_dim(1).reshape([b, h]);
    let count = mask.sum_dim(1).reshape([b, 1]).clamp_min(1e-9);
    sum / count
}

/// Divides every row by its L2 norm (at least 1e-12), as `torch.nn.functional.normalize`.
///
/// - `x`: `[b, h]` -> `[b, h]`
pub fn l2_normalize(x: Tensor<2>) -> Tensor<2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}
