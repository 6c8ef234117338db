//! Embeds one batch over and over, for a profiler to watch (`perf record`):
//!
//!     cargo run --release --example embed_loop -- MODEL_DIR TEXTS TOKENS SECONDS
//!
//! TEXTS texts of about TOKENS word pieces each; prints the time per call.

use std::time::Instant;

use embedder_rs::{Embedder, EmbedderOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, texts, tokens, seconds] = &args[..] else {
        eprintln!("usage: embed_loop MODEL_DIR TEXTS TOKENS SECONDS");
        std::process::exit(2);
    };
    let (texts, tokens): (usize, usize) = (texts.parse().unwrap(), tokens.parse().unwrap());
    let seconds: f64 = seconds.parse().unwrap();
    let options = EmbedderOptions {
        backend: "cpu".into(),
        ..Default::default()
    };
    let embedder = Embedder::load(dir, &options).expect("model loads");
    let words = [
        "river", "stone", "quiet", "garden", "signal", "paper", "orbit",
    ];
    let batch: Vec<String> = (0..texts)
        .map(|t| {
            (0..tokens.saturating_sub(2))
                .map(|i| words[(i * 7 + t) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
    embedder.embed(&refs, true).unwrap();
    let (t0, mut calls) = (Instant::now(), 0u32);
    while t0.elapsed().as_secs_f64() < seconds {
        embedder.embed(&refs, true).unwrap();
        calls += 1;
    }
    println!(
        "kernel {}: {:.2} ms a call ({calls} calls)",
        embedder.kernel(),
        t0.elapsed().as_secs_f64() * 1e3 / calls as f64
    );
}
