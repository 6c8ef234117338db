//! Self-attention on the CPU, straight from the fused QKV projection of packed tokens.
//!
//! burn-flex's attention permutes Q, K and V into `[b, heads, s, dh]` copies, masks every
//! padded key with a per-element branch and takes a scalar `exp` per score: about 30% of
//! a forward pass once the matmuls were fast. Here the batch is *packed*: the sequences'
//! tokens lie one after another with no padding at all, and each sequence is a span of
//! rows. Each (sequence, head) is one task that reads Q in place from the
//! `[tokens, 3, heads, dh]` projection (rows `3 * heads * dh` apart), packs its K^T and V
//! into panels for the linear layers' register tile, attends over exactly the sequence's
//! tokens and runs a vectorised softmax.

use std::cell::RefCell;

use super::super::simd::multiversion;
use super::packed::{self, Operand};
use super::SendPtr;

/// Context vectors `[tokens, heads * dh]` of `qkv` (`[tokens, 3, heads, dh]`, row-major)
/// into `out`.
///
/// `spans[i] = (first, len)`: sequence `i` is rows `first..first + len`; its tokens attend
/// to each other only. Rows that belong to no span are left as they are.
pub fn attention(qkv: &[f32], heads: usize, dh: usize, spans: &[(usize, usize)], out: &mut [f32]) {
    let h = heads * dh;
    let tokens = out.len() / h.max(1);
    assert_eq!(out.len(), tokens * h, "out must be [tokens, heads * dh]");
    assert_eq!(
        qkv.len(),
        tokens * 3 * h,
        "qkv must be [tokens, 3, heads, dh]"
    );
    assert!(
        spans.iter().all(|&(first, len)| first + len <= tokens),
        "spans must lie within the tokens"
    );
    let dst = SendPtr(out.as_mut_ptr());
    let scale = 1.0 / (dh as f32).sqrt();
    let token = 3 * h; // stride between tokens in qkv
    let head_task = |s: &mut Scratch, task: usize| {
        let (seq, head) = (task / heads, task % heads);
        let (first, len) = spans[seq];
        if len == 0 {
            return;
        }
        let base = first * 3 * h + head * dh;
        let (q, k, v) = (&qkv[base..], &qkv[base + h..], &qkv[base + 2 * h..]);
        // the head's keys as the columns of K^T and its values as rows, in panels for the
        // same register tile as the linear layers (the `gemm` crate, used before, repacked
        // both and ran at about half the tile's rate on these shapes)
        packed::pack_columns(k, token, dh, len, &mut s.keys);
        packed::pack_rows(v, token, len, dh, &mut s.values);
        s.scores.resize(len * len, 0.0);
        s.inv_sums.resize(len, 0.0);
        // SAFETY: `scores` is len x len; q holds `len` rows of dh values, `token` apart
        // (spans were checked against qkv's length above).
        unsafe {
            packed::multiply(
                Operand {
                    x: q,
                    lda: token,
                    k: dh,
                },
                len,
                &s.keys,
                len,
                s.scores.as_mut_ptr(),
                len,
            )
        };
        softmax_rows(&mut s.scores, &mut s.inv_sums, scale);
        // SAFETY: this task alone writes rows first..first+len, columns
        // head*dh..(head+1)*dh of `out` (spans are disjoint; tasks differ in span or
        // head); `out` outlives the parallel loop.
        unsafe {
            let context = dst.at(first * h + head * dh);
            packed::multiply(
                Operand {
                    x: &s.scores,
                    lda: len,
                    k: len,
                },
                len,
                &s.values,
                dh,
                context,
                h,
            );
            // the softmax's normalisation, on len x dh values instead of len x len
            scale_rows(context, h, dh, &s.inv_sums);
        }
    };
    // head_task claims no tasks itself, so the borrow is never nested
    let run = |task: usize| SCRATCH.with(|s| head_task(&mut s.borrow_mut(), task));
    let work: usize = spans.iter().map(|&(_, len)| len * len).sum::<usize>() * heads * dh * 2;
    let tasks = 0..spans.len() * heads;
    if work < super::packed::SERIAL_FMAS {
        tasks.for_each(run);
    } else {
        super::claim_tasks(tasks.len(), run);
    }
}

/// One head's working memory.
struct Scratch {
    /// `K^T` `[dh, len]` in panels.
    keys: Vec<f32>,
    /// `V` `[len, dh]` in panels.
    values: Vec<f32>,
    /// `[len, len]`
    scores: Vec<f32>,
    /// `[len]`
    inv_sums: Vec<f32>,
}

thread_local! {
    /// Each thread's scratch, kept across tasks and calls: a fresh `len x len` buffer per
    /// task is, for a long sequence, an mmap whose pages the kernel zeroes on first touch
    /// (with the per-batch buffers, ~5% of a one-passage call).
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            keys: Vec::new(),
            values: Vec::new(),
            scores: Vec::new(),
            inv_sums: Vec::new(),
        })
    };
}

multiversion!(fn softmax_rows(scores: &mut [f32], inv_sums: &mut [f32], scale: f32), softmax_rows_generic);

/// Independent accumulators per reduction, so the max and the sum vectorise (a single
/// running f32 sum is a strict sequential dependency LLVM must not reorder).
const LANES: usize = 16;

/// Each row `i` of the square `scores` (`inv_sums.len()` rows) of raw products `x` becomes
/// `e^(scale * (x - max))` (the attention's `1 / sqrt(dh)` applied here, in the pass that
/// reads the row anyway), left
/// unnormalised, and `inv_sums[i]` its `1 / sum`: the normalisation is applied to the
/// `len x dh` context rows afterwards instead of the `len x len` scores (three passes over
/// a row instead of four).
#[inline(always)]
fn softmax_rows_generic(scores: &mut [f32], inv_sums: &mut [f32], scale: f32) {
    let len = inv_sums.len();
    for (row, inv) in scores.chunks_exact_mut(len).zip(inv_sums.iter_mut()) {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            for (m, &x) in lanes.iter_mut().zip(c) {
                *m = if x > *m { x } else { *m };
            }
        }
        let max = chunks
            .remainder()
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        // whole 16-lane chunks, then the tail through a fixed-length array (for a 250-token
        // row the tail's 10 scalar `exp`s were ~40% of the row's time); a plain loop per
        // chunk, which LLVM's loop vectoriser takes whole (fused with the sum below into
        // 16-lane chunks, it stayed scalar)
        let mut chunks = row.chunks_exact_mut(LANES);
        for c in &mut chunks {
            c.iter_mut().for_each(|x| *x = exp((*x - max) * scale));
        }
        let tail = chunks.into_remainder();
        let mut lane = [max; LANES];
        lane[..tail.len()].copy_from_slice(tail);
        lane.iter_mut().for_each(|x| *x = exp((*x - max) * scale));
        tail.copy_from_slice(&lane[..tail.len()]);
        let mut sums = [0.0f32; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            for (s, &x) in sums.iter_mut().zip(c) {
                *s += x;
            }
        }
        *inv = 1.0 / chunks.remainder().iter().chain(&sums).sum::<f32>();
    }
}

/// Scales row `i` of the `rows.len()` x `dh` block at `out` (rows `stride` apart) by
/// `scales[i]`.
///
/// # Safety
/// Every row `i < scales.len()` must lie inside one allocation: `out + i * stride .. + dh`.
unsafe fn scale_rows(out: *mut f32, stride: usize, dh: usize, scales: &[f32]) {
    for (i, &s) in scales.iter().enumerate() {
        // SAFETY: see the function's contract.
        let row = unsafe { std::slice::from_raw_parts_mut(out.add(i * stride), dh) };
        row.iter_mut().for_each(|x| *x *= s);
    }
}

/// `e^x` for `x <= 0` (scores minus their row maximum), within 2 ulp: Cody-Waite range
/// reduction `x = n ln2 + r` and Cephes' degree-5 polynomial for `e^r`, branch-free so
/// that it vectorises. Below -87 it returns ~1e-38 instead of a subnormal; against a row
/// whose largest term is 1 that is zero.
///
/// In fused multiply-adds: one rounding a step and half the vector ops of a multiply and
/// an add, whose dependency chain holds the softmax at ~2 cycles a score on AVX-512 (a
/// 250 x 250 block: ~20% faster in FMAs, with the vector tail below). Inside the AVX2,
/// AVX-512 and NEON builds each is one instruction; the portable x86 build (a CPU without
/// FMA) calls libm's `fmaf`, which is exact and slow.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    // t's low mantissa bits hold the integer n (as an offset from ROUND's bits), so 2^n is
    // built with integer adds and a shift. No float-to-int `as` cast: Rust's is saturating,
    // and its compares kept this loop scalar (~10% of a passage's forward pass).
    let t = x.mul_add(std::f32::consts::LOG2_E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let y = (p * r).mul_add(r, r) + 1.0;
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    f32::from_bits(n_bits.wrapping_add(127) << 23) * y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::{device_attention, padding_mask};
    use burn::tensor::{Device, Tensor, TensorData};

    #[test]
    fn softmax_rows_match_the_exact_softmax() {
        for (n, scale) in [
            (1usize, 1.0f32),
            (5, 1.0),
            (16, 0.125),
            (17, 1.0),
            (100, 0.125),
            (256, 0.3),
        ] {
            let logits: Vec<f32> = (0..n * n)
                .map(|i| ((i * 37) % 11) as f32 * 0.7 - 3.0 + (i / n) as f32)
                .collect();
            let mut rows = logits.clone();
            let mut inv = vec![0.0f32; n];
            softmax_rows(&mut rows, &mut inv, scale);
            for r in 0..n {
                let row = &logits[r * n..(r + 1) * n];
                let z: f64 = row.iter().map(|&x| (x as f64 * scale as f64).exp()).sum();
                for (c, &x) in row.iter().enumerate() {
                    let p = rows[r * n + c] as f64 * inv[r] as f64;
                    assert!(
                        (p - (x as f64 * scale as f64).exp() / z).abs() < 1e-6,
                        "n {n} scale {scale} row {r} col {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn exp_is_within_2e7_relative() {
        let mut worst = 0.0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let want = (x as f64).exp(); // of the f32 input, so only exp's error counts
            worst = worst.max(((exp(x) as f64) - want).abs() / want);
        }
        assert!(worst < 2e-7, "max relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
    }

    fn lcg(n: usize, seed: u64) -> Vec<f32> {
        super::super::test_values(n, seed, 4.0)
    }

    /// Agrees with burn's masked attention (the wgpu path) on every real token, for ragged
    /// lengths: the padded batch is given as spans of its rows.
    #[test]
    fn matches_burn_attention_on_real_tokens() {
        // small enough to run serially, then large enough to split among a call's team
        check_against_burn(3, 11, 4, 8, &[11, 5, 1]);
        let work = (200 * 200 + 120 * 120) * 12 * 32 * 2;
        assert!(work >= crate::model::cpu::packed::SERIAL_FMAS);
        crate::model::cpu::team::with_team(true, || {
            check_against_burn(2, 200, 12, 32, &[200, 120])
        });
    }

    fn check_against_burn(b: usize, s: usize, heads: usize, dh: usize, lengths: &[usize]) {
        let h = heads * dh;
        let qkv = lcg(b * s * 3 * h, 7);
        let spans: Vec<(usize, usize)> = lengths
            .iter()
            .enumerate()
            .map(|(i, &l)| (i * s, l))
            .collect();
        let mut ours = vec![0.0f32; b * s * h];
        attention(&qkv, heads, dh, &spans, &mut ours);

        let device = Device::flex();
        let fused = Tensor::<3>::from_data(TensorData::new(qkv, [b, s, 3 * h]), &device);
        let mask = padding_mask(lengths, s, heads, &device);
        let want = device_attention(fused, mask, heads)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (i, &len) in lengths.iter().enumerate() {
            for j in 0..s {
                let row = (i * s + j) * h;
                for c in 0..h {
                    if j < len {
                        let (a, w) = (ours[row + c], want[row + c]);
                        assert!(
                            (a - w).abs() < 1e-5,
                            "seq {i} token {j} col {c}: {a} vs {w}"
                        );
                    } else {
                        assert_eq!(ours[row + c], 0.0, "rows outside every span are untouched");
                    }
                }
            }
        }
    }
}
