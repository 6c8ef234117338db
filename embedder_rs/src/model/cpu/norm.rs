//! LayerNorm on the CPU: the residual add fused into the normalisation, one pass to read
//! a row and one to write it, vectorised at the CPU's widest width.

use super::super::simd::multiversion;
use super::{claim_tasks, SendPtr};

/// Rows per task: enough work to amortise claiming it.
const TASK_ROWS: usize = 16;

/// A LayerNorm's parameters over width `h`.
pub struct Norm {
    /// `[h]`
    pub gamma: Vec<f32>,
    /// `[h]`
    pub beta: Vec<f32>,
    /// Added to the variance.
    pub eps: f32,
}

/// Independent accumulators per reduction, so the sums vectorise (one running f32 sum
/// is a strict sequential dependency that LLVM must not reorder).
const LANES: usize = 16;

/// Sum of `f(x)` over `row`, in `LANES` independent partial sums.
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f(x);
        }
    }
    chunks.remainder().iter().map(|&x| f(x)).sum::<f32>() + lanes.iter().sum::<f32>()
}

/// `row = LN(row + residual)` (residual empty: `row = LN(row)`).
#[inline(always)]
fn norm_row(row: &mut [f32], residual: &[f32], norm: &Norm) {
    if !residual.is_empty() {
        row.iter_mut().zip(residual).for_each(|(x, r)| *x += r);
    }
    let n = row.len() as f32;
    let mean = lane_sum(row, |x| x) / n;
    let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n;
    let inv = 1.0 / (var + norm.eps).sqrt();
    for ((x, g), b) in row.iter_mut().zip(&norm.gamma).zip(&norm.beta) {
        *x = (*x - mean) * inv * g + b;
    }
}

#[inline(always)]
fn norm_rows_body(rows: &mut [f32], residual: &[f32], norm: &Norm) {
    let h = norm.gamma.len();
    if residual.is_empty() {
        rows.chunks_exact_mut(h)
            .for_each(|row| norm_row(row, &[], norm));
    } else {
        rows.chunks_exact_mut(h)
            .zip(residual.chunks_exact(h))
            .for_each(|(row, res)| norm_row(row, res, norm));
    }
}

multiversion!(fn norm_rows(rows: &mut [f32], residual: &[f32], norm: &Norm), norm_rows_body);

/// `x[r] = LN(x[r] + residual[r])` for every row of `x` (`[rows, h]`); with an empty
/// `residual`, `x[r] = LN(x[r])`. Split among the call's team ([`super::team`]).
pub fn add_layer_norm(x: &mut [f32], residual: &[f32], norm: &Norm) {
    let h = norm.gamma.len();
    assert_eq!(x.len() % h, 0, "x must be [rows, h]");
    assert!(
        residual.is_empty() || residual.len() == x.len(),
        "residual must match x"
    );
    let (len, chunk) = (x.len(), TASK_ROWS * h);
    let dst = SendPtr(x.as_mut_ptr());
    claim_tasks(len.div_ceil(chunk), |task| {
        let span = task * chunk..len.min((task + 1) * chunk);
        let res = if residual.is_empty() {
            &[][..]
        } else {
            &residual[span.clone()]
        };
        // SAFETY: each task normalises its own rows of `x`.
        let rows = unsafe { std::slice::from_raw_parts_mut(dst.at(span.start), span.len()) };
        norm_rows(rows, res, norm);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_reference_layer_norm() {
        let h = 37;
        let rows = 40;
        let x: Vec<f32> = (0..rows * h)
            .map(|i| ((i * 7919) % 101) as f32 * 0.1 - 5.0)
            .collect();
        let res: Vec<f32> = (0..rows * h)
            .map(|i| ((i * 31) % 13) as f32 * 0.3)
            .collect();
        let norm = Norm {
            gamma: (0..h).map(|i| 1.0 + i as f32 * 0.01).collect(),
            beta: (0..h).map(|i| i as f32 * -0.02).collect(),
            eps: 1e-12,
        };
        let mut ours = x.clone();
        // 40 rows: three tasks, shared with a team
        super::super::team::with_team(true, || add_layer_norm(&mut ours, &res, &norm));
        for r in 0..rows {
            let v: Vec<f64> = (0..h)
                .map(|c| (x[r * h + c] + res[r * h + c]) as f64)
                .collect();
            let mean = v.iter().sum::<f64>() / h as f64;
            let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / h as f64;
            for c in 0..h {
                let want = (v[c] - mean) / (var + 1e-12).sqrt() * norm.gamma[c] as f64
                    + norm.beta[c] as f64;
                let got = ours[r * h + c] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "row {r} col {c}: {got} vs {want}"
                );
            }
        }
        let mut plain = x.clone();
        add_layer_norm(&mut plain, &[], &norm);
        let mut summed: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
        add_layer_norm(&mut summed, &[], &norm);
        assert_eq!(
            summed, ours,
            "the fused residual is the same as adding first"
        );
        assert_ne!(plain, ours);
    }
}
