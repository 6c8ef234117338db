//! Python bindings: the private extension module `embedder_rs._native`.

use numpy::{IntoPyArray, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::embedder::{Embedder, EmbedderOptions, DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS};
use crate::error::EmbedderError as RsError;

pyo3::create_exception!(
    _native,
    EmbedderError,
    PyException,
    "Any failure of embedder_rs: bad model directory, missing tensor, shape mismatch, tokenizer or backend error."
);

fn to_py(err: RsError) -> PyErr {
    EmbedderError::new_err(err.to_string())
}

/// A BERT sentence embedder running on burn.
#[pyclass(name = "Embedder", module = "embedder_rs", frozen)]
struct PyEmbedder {
    inner: Embedder,
}

#[pymethods]
impl PyEmbedder {
    #[new]
    #[pyo3(signature = (model_dir, backend = "auto", max_seq_length = None, batch_size = DEFAULT_BATCH_SIZE, max_batch_tokens = DEFAULT_MAX_BATCH_TOKENS))]
    fn new(
        py: Python<'_>,
        model_dir: std::path::PathBuf,
        backend: &str,
        max_seq_length: Option<usize>,
        batch_size: usize,
        max_batch_tokens: usize,
    ) -> PyResult<Self> {
        let options = EmbedderOptions {
            backend: backend.to_string(),
            max_seq_length,
            batch_size,
            max_batch_tokens,
        };
        let inner = py
            .detach(|| Embedder::load(&model_dir, &options))
            .map_err(to_py)?;
        Ok(Self { inner })
    }

    /// Embeds the texts; float32 array of shape [len(texts), dim].
    #[pyo3(signature = (texts, normalize = true))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        normalize: bool,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let n = texts.len();
        let dim = self.inner.dim();
        let flat = py
            .detach(|| {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                self.inner.embed(&refs, normalize)
            })
            .map_err(to_py)?;
        // The Vec becomes the array's buffer; reshape makes a view, not a copy.
        flat.into_pyarray(py).reshape([n, dim])
    }

    /// Token counts after truncation ([CLS] and [SEP] included).
    fn count_tokens(&self, py: Python<'_>, texts: Vec<String>) -> PyResult<Vec<usize>> {
        py.detach(|| {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            self.inner.count_tokens(&refs)
        })
        .map_err(to_py)
    }

    /// "cpu" or "wgpu": the backend actually in use.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend().name()
    }

    /// Why this backend: what was asked for and, for "auto", what it found (e.g. "auto: no
    /// GPU device node (...), wgpu not probed").
    #[getter]
    fn backend_reason(&self) -> String {
        self.inner.backend_reason().to_string()
    }

    /// The kernels in use: "avx512", "avx2", "neon" or "portable" (the CPU's instruction
    /// set, as the host kernels chose it), or "wgpu".
    #[getter]
    fn kernel(&self) -> &'static str {
        self.inner.kernel()
    }

    /// The adapter actually in use (GPU name and driver, or the CPU backend).
    #[getter]
    fn adapter(&self) -> String {
        self.inner.adapter().to_string()
    }

    /// Alias of `adapter`.
    #[getter]
    fn device(&self) -> String {
        self.inner.adapter().to_string()
    }

    /// Embedding width.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// Truncation length in tokens.
    #[getter]
    fn max_seq_length(&self) -> usize {
        self.inner.max_seq_length()
    }

    /// Name of the model directory.
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// Version of embedder_rs.
    #[getter]
    fn version(&self) -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn __repr__(&self) -> String {
        format!(
            "Embedder(name={:?}, backend={:?}, kernel={:?}, adapter={:?}, dim={}, max_seq_length={})",
            self.inner.name(),
            self.inner.backend().name(),
            self.inner.kernel(),
            self.inner.adapter(),
            self.inner.dim(),
            self.inner.max_seq_length()
        )
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEmbedder>()?;
    m.add("EmbedderError", m.py().get_type::<EmbedderError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
