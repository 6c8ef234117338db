//! `embedder_rs`: a BERT sentence embedder on burn that matches
//! sentence-transformers (mean pooling, L2 normalisation), with run-time choice of
//! burn's flex CPU backend or wgpu, and Python bindings (feature `python`).

/// Rust-side allocations (activation tensors above all) come from mimalloc, which keeps
/// freed pages for reuse instead of returning them to the kernel between layers.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod backend;
pub mod embedder;
pub mod error;
pub mod model;
pub mod tokenize;

#[cfg(feature = "python")]
mod python;

pub use backend::BackendKind;
pub use embedder::{Embedder, EmbedderOptions};
pub use error::{EmbedderError, Result};
