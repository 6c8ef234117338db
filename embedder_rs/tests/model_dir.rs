//! Runs the real model when `EMBEDDER_RS_MODEL_DIR` names a sentence-transformers
//! directory (config.json, model.safetensors, tokenizer.json); otherwise passes
//! after saying it was skipped.

use embedder_rs::{BackendKind, Embedder, EmbedderOptions};

fn model_dir() -> Option<String> {
    match std::env::var("EMBEDDER_RS_MODEL_DIR") {
        Ok(dir) if !dir.is_empty() => Some(dir),
        _ => {
            eprintln!("EMBEDDER_RS_MODEL_DIR not set: skipping the real-model test");
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
    let embedder = Embedder::load(&dir, &options).expect("model loads");
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
}
