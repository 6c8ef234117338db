//! GFLOP/s of the packed linear layers on one thread, at MiniLM's shapes, for the kernel
//! this CPU chose (`EMBEDDER_RS_KERNEL=avx2|portable` forces a narrower one):
//!
//!     cargo run --release --example kernel_rate [tokens...]
//!
//! A tool for comparing kernels side by side on one machine, not a benchmark of the pass
//! (BENCHMARKS.md section 4 is that). Each shape's time is the best of 15 runs of ~0.1
//! GFLOP each by the wall clock: on a shared machine the best run is the one the other
//! tenants disturbed least (this thread's on-CPU time from schedstat, used before, moves in
//! scheduler ticks: the rates came out in steps of ~20%).

use std::time::Instant;

use embedder_rs::model::cpu::packed::{Epilogue, PackedLinear};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    let tokens: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("token counts"))
        .collect();
    let tokens = if tokens.is_empty() {
        vec![14, 64, 250]
    } else {
        tokens
    };
    println!("kernel {}", embedder_rs::model::kernel_name());
    // MiniLM-L6: QKV, output, up (with GELU), down
    let shapes = [
        ("qkv", 384, 1152, Epilogue::Bias),
        ("out", 384, 384, Epilogue::Bias),
        ("up", 384, 1536, Epilogue::BiasGelu),
        ("down", 1536, 384, Epilogue::Bias),
    ];
    for &m in &tokens {
        for &(name, d_in, d_out, epilogue) in &shapes {
            let layer = PackedLinear::new(&values(d_in * d_out, 1), &values(d_out, 2), d_in, d_out);
            let x = values(m * d_in, 3);
            let mut out = vec![0.0f32; m * d_out];
            let flops = 2.0 * (m * d_in * d_out) as f64;
            let reps = ((2e8 / flops) as usize).max(3);
            layer.forward(&x, m, &mut out, epilogue);
            let mut best = f64::INFINITY;
            for _ in 0..15 {
                let t0 = Instant::now();
                for _ in 0..reps {
                    layer.forward(&x, m, &mut out, epilogue);
                }
                best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
            }
            println!(
                "m {m:4} {name:4} {d_in:4}x{d_out:4}: {:6.1} GFLOP/s ({:.1} us)",
                flops / best / 1e9,
                best * 1e6
            );
        }
    }
}
