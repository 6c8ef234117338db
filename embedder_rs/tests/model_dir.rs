//! The real model on the CPU, from `EMBEDDER_RS_MODEL_DIR` (a sentence-transformers
//! directory: config.json, model.safetensors, tokenizer.json).
//!
//! Set but wrong, the test fails. Unset, it passes after saying it was skipped, unless
//! `EMBEDDER_RS_REQUIRE_MODEL=1` says the model is expected (scripts/run_tests.sh, so
//! `make test`, sets both from the Python side's model package): then it fails.

use embedder_rs::{BackendKind, Embedder, EmbedderOptions};

const DIR_VAR: &str = "EMBEDDER_RS_MODEL_DIR";
const REQUIRE_VAR: &str = "EMBEDDER_RS_REQUIRE_MODEL";

fn model_dir() -> Option<String> {
    match std::env::var(DIR_VAR) {
        Ok(dir) if !dir.is_empty() => Some(dir),
        _ if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") => {
            panic!("{REQUIRE_VAR}=1 but {DIR_VAR} is not set: the real-model test cannot run")
        }
        _ => {
            eprintln!("{DIR_VAR} not set: skipping the real-model test");
            None
        }
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

#[test]
fn embeds_with_the_real_model_on_cpu() {
    let Some(dir) = model_dir() else { return };
    let options = EmbedderOptions {
        backend: "cpu".into(),
        ..Default::default()
    };
    let embedder = Embedder::load(&dir, &options)
        .unwrap_or_else(|e| panic!("{DIR_VAR}={dir}: the model does not load: {e}"));
    assert_eq!(embedder.backend(), BackendKind::Cpu);
    let dim = embedder.dim();
    let long = "word ".repeat(400);
    let texts = [
        "A cat sits on the mat.",
        "A kitten is sitting on a rug.",
        "Quarterly revenue grew by eight percent.",
        "",
        "Grüße aus Köln, 日本語",
        long.as_str(),
    ];
    let batch = embedder.embed(&texts, true).unwrap();
    assert_eq!(batch.len(), texts.len() * dim);
    let row = |i: usize| &batch[i * dim..(i + 1) * dim];
    for i in 0..texts.len() {
        let norm: f32 = row(i).iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "row {i} norm {norm}");
    }
    assert!(cosine(row(0), row(1)) > cosine(row(0), row(2)) + 0.2);
    // One by one gives the same vectors as the padded, bucketed batch.
    for (i, text) in texts.iter().enumerate() {
        let single = embedder.embed(&[text], true).unwrap();
        assert!(cosine(&single, row(i)) > 0.999_999, "row {i}");
    }
    let counts = embedder.count_tokens(&texts).unwrap();
    assert_eq!(counts[3], 2); // [CLS] [SEP]
    assert_eq!(counts[5], embedder.max_seq_length());
    // shown by `cargo test -- --show-output` (scripts/run_tests.sh): which model ran
    println!(
        "real model from {dir}: {} texts, dim {dim}, cos(cat, kitten) {:.4}",
        texts.len(),
        cosine(row(0), row(1))
    );
}
