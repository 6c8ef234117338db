//! The one error type of the crate; the Python layer maps it to `EmbedderError`.

use std::path::PathBuf;

/// Everything that can go wrong while loading a model or embedding text.
#[derive(Debug, thiserror::Error)]
pub enum EmbedderError {
    /// The model directory is missing, or lacks one of the files we need.
    #[error("bad model directory {dir}: {reason}")]
    BadModelDir {
        /// The directory that was given.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A JSON configuration file could not be read or parsed.
    #[error("bad config {file}: {reason}")]
    BadConfig {
        /// The file that failed.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// `model.safetensors` lacks a tensor the architecture needs.
    #[error("missing tensor {name:?} in {file} (tried prefixes {prefixes:?})")]
    MissingTensor {
        /// Tensor name without prefix.
        name: String,
        /// The safetensors file.
        file: PathBuf,
        /// Prefixes that were tried (`""`, `"bert."`, ...).
        prefixes: Vec<String>,
    },
    /// A tensor exists but its shape disagrees with config.json.
    #[error("shape mismatch for tensor {name:?}: expected {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// Full tensor name.
        name: String,
        /// Shape implied by config.json.
        expected: Vec<usize>,
        /// Shape stored in the file.
        found: Vec<usize>,
    },
    /// The safetensors file itself is unreadable or uses an unsupported dtype.
    #[error("cannot read weights {file}: {reason}")]
    Weights {
        /// The safetensors file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// tokenizer.json could not be loaded or a text could not be encoded.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The requested backend is unknown or could not be initialised.
    #[error("backend error: {0}")]
    Backend(String),
    /// The forward pass failed (device error, read-back failure, panic inside burn).
    #[error("inference error: {0}")]
    Inference(String),
}

/// Crate-wide result alias.
pub type Result<T> = std::result::Result<T, EmbedderError>;
