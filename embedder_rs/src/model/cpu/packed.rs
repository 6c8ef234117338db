//! Linear layers for the CPU path, with weights packed once at load time.
//!
//! A general-purpose gemm (burn-flex's, via the `gemm` crate) repacks the weight matrix
//! on every call; for a short text that is as much memory traffic as the multiply itself.
//! Here each weight matrix `[d_in, d_out]` is cut at load into column panels of [`NR`]
//! columns, each stored `[d_in, NR]` contiguously (the last one zero-padded), so a
//! register tile reads its panel front to back. ONNX Runtime's MLAS does the same.
//!
//! The register tile is [`MR`] rows x [`NR`] columns: on AVX-512 that is 8 x 2 vectors =
//! 16 accumulators, fed per step `k` by one broadcast of each row's `x[r, k]` and two
//! vector loads from the panel. The bias (and GELU) are applied as the tile is stored.

use super::super::activation::gelu_scalar;
use super::super::simd::{isa, Isa};
use super::SendPtr;

/// Columns per packed panel (two AVX-512 vectors).
pub const NR: usize = 32;
/// Rows per register tile.
pub const MR: usize = 8;
/// Below this many multiply-adds (~15 us on one AVX-512 core, ~25 us on an AVX2 one) a
/// product runs on the calling thread alone; above it the call's helpers share it. They
/// spin between ops (`team`), so a split costs a claim from a counter, not a wake-up, and
/// even a short text's products (~14 tokens: 2-8M each) are worth splitting: left on one
/// thread (a 16M threshold), on an AVX2-only CPU a short text took ~2x ONNX Runtime's time
/// on two (issue 27: 2.18 back to back, 1.85 after a pause).
pub const SERIAL_FMAS: usize = 1 << 20;
/// Rows a task covers at most: a panel is reused for this many rows while it is in cache.
/// With 64-row tasks one ~250-token passage on two threads reads each weight panel from L3
/// four times (~170 MB a call); the linear layers of six layers at m = 250 on two threads
/// run at 230-245 GFLOP/s with 64 rows, 233-276 with 256, side by side.
const MAX_TASK_ROWS: usize = 32 * MR;
/// Rows a task covers at least, when many threads share a small product.
const MIN_TASK_ROWS: usize = 8 * MR;
/// Tasks wanted per thread of the call, so that one preempted thread holds up little.
const TASKS_PER_THREAD: usize = 4;

/// What is applied to each output element as the tile is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// `x @ W + b`
    Bias,
    /// `gelu(x @ W + b)` (exact, erf-based GELU)
    BiasGelu,
}

/// A linear layer `y = x @ W + b` with `W` packed into column panels.
pub struct PackedLinear {
    d_in: usize,
    d_out: usize,
    /// `[panels][d_in][NR]`
    panels: Vec<f32>,
    /// `[panels * NR]`, zero past `d_out`.
    bias: Vec<f32>,
}

impl PackedLinear {
    /// Packs row-major `weight` `[d_in, d_out]` and `bias` `[d_out]`.
    pub fn new(weight: &[f32], bias: &[f32], d_in: usize, d_out: usize) -> Self {
        assert_eq!(weight.len(), d_in * d_out, "weight must be [d_in, d_out]");
        assert_eq!(bias.len(), d_out, "bias must be [d_out]");
        let mut panels = Vec::new();
        pack_rows(weight, d_out, d_in, d_out, &mut panels);
        let mut padded = vec![0.0f32; d_out.div_ceil(NR) * NR];
        padded[..d_out].copy_from_slice(bias);
        Self {
            d_in,
            d_out,
            panels,
            bias: padded,
        }
    }

    /// `out[m, d_out] = epilogue(x[m, d_in] @ W + b)`, split among the call's team.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32], epilogue: Epilogue) {
        assert_eq!(x.len(), m * self.d_in, "x must be [m, d_in]");
        assert_eq!(out.len(), m * self.d_out, "out must be [m, d_out]");
        if m == 0 {
            return;
        }
        let n_panels = self.d_out.div_ceil(NR);
        let task_rows = task_rows(m, n_panels, rayon::current_num_threads());
        let row_tasks = m.div_ceil(task_rows);
        let dst = SendPtr(out.as_mut_ptr());
        let kernel = kernel();
        // Row chunks outermost: neighbouring tasks share rows of x, and each task keeps its
        // panel in cache across its rows.
        let run = |task: usize| {
            let (chunk, panel) = (task / n_panels, task % n_panels);
            let rows = chunk * task_rows..(m).min((chunk + 1) * task_rows);
            // SAFETY: this task alone writes rows `rows`, columns of `panel`, of `out`.
            unsafe {
                panel_rows(
                    kernel,
                    Operand {
                        x,
                        lda: self.d_in,
                        k: self.d_in,
                    },
                    rows,
                    &self.panels[panel * self.d_in * NR..(panel + 1) * self.d_in * NR],
                    &self.bias[panel * NR..(panel + 1) * NR],
                    (dst.at(panel * NR), self.d_out),
                    NR.min(self.d_out - panel * NR),
                    epilogue,
                )
            }
        };
        let tasks = 0..row_tasks * n_panels;
        if m * self.d_in * self.d_out < SERIAL_FMAS {
            tasks.for_each(run);
        } else {
            super::claim_tasks(tasks.len(), run);
        }
    }
}

/// Rows per task for `m` rows against `n_panels` panels on `threads` threads: as many as
/// still give each thread [`TASKS_PER_THREAD`] tasks, a multiple of [`MR`] between
/// [`MIN_TASK_ROWS`] and [`MAX_TASK_ROWS`] (two threads: one row chunk up to 256 rows).
fn task_rows(m: usize, n_panels: usize, threads: usize) -> usize {
    let chunks = (TASKS_PER_THREAD * threads).div_ceil(n_panels.max(1));
    m.div_ceil(chunks)
        .next_multiple_of(MR)
        .clamp(MIN_TASK_ROWS, MAX_TASK_ROWS)
}

/// Packs `B` `[k, n]`, whose row `kk` is `src[kk * stride..][..n]`, into `dst` as panels
/// of [`NR`] columns, `[panels][k][NR]`, the last one zero-padded.
pub fn pack_rows(src: &[f32], stride: usize, k: usize, n: usize, dst: &mut Vec<f32>) {
    let n_panels = n.div_ceil(NR);
    dst.clear();
    dst.resize(n_panels * k * NR, 0.0);
    for (p, panel) in dst.chunks_exact_mut(k * NR).enumerate() {
        let cols = NR.min(n - p * NR);
        for (kk, row) in panel.chunks_exact_mut(NR).enumerate() {
            let from = kk * stride + p * NR;
            row[..cols].copy_from_slice(&src[from..from + cols]);
        }
    }
}

/// Packs `B` `[k, n]` whose *column* `j` is `src[j * stride..][..k]` (a transposed operand,
/// such as the keys in `Q @ K^T`) into `dst` as [`pack_rows`] does.
pub fn pack_columns(src: &[f32], stride: usize, k: usize, n: usize, dst: &mut Vec<f32>) {
    let n_panels = n.div_ceil(NR);
    dst.clear();
    dst.resize(n_panels * k * NR, 0.0);
    for j in 0..n {
        let (p, c) = (j / NR, j % NR);
        let panel = &mut dst[p * k * NR..(p + 1) * k * NR];
        for (kk, &v) in src[j * stride..j * stride + k].iter().enumerate() {
            panel[kk * NR + c] = v;
        }
    }
}

/// `out[m, n] = x[m, k] @ B` on the calling thread, `B` packed by [`pack_rows`] or
/// [`pack_columns`]; rows of `x` are `lda` apart, rows of `out` `ldc` apart.
///
/// # Safety
/// `out` must be valid for writes of `m` rows, `ldc` apart, of `n` values each, and no
/// other thread may touch them meanwhile.
pub unsafe fn multiply(
    a: Operand<'_>,
    m: usize,
    panels: &[f32],
    n: usize,
    out: *mut f32,
    ldc: usize,
) {
    static ZERO: [f32; NR] = [0.0; NR];
    let k = a.k;
    assert!(
        m == 0 || a.x.len() >= (m - 1) * a.lda + k,
        "x must hold m rows of k values"
    );
    assert_eq!(
        panels.len(),
        n.div_ceil(NR) * k * NR,
        "panels must be B [k, n] packed"
    );
    let kernel = kernel();
    for (p, panel) in panels.chunks_exact(k * NR).enumerate() {
        // SAFETY: the caller's contract covers every row and column written.
        unsafe {
            panel_rows(
                kernel,
                a,
                0..m,
                panel,
                &ZERO,
                (out.add(p * NR), ldc),
                NR.min(n - p * NR),
                Epilogue::Bias,
            )
        }
    }
}

/// The left operand of a product: `x` holds rows of `k` values, `lda` apart.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub x: &'a [f32],
    pub lda: usize,
    pub k: usize,
}

/// Rows `rows` of `a` against one packed panel into the `cols` columns at `out.0` (rows
/// `out.1` apart; row 0 of `a` is row 0 there). The kernel walks the rows in register
/// blocks of its own height.
///
/// # Safety
/// `out` must be valid for writes of every row in `rows` (`cols` values each) and written
/// by no other thread meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_rows(
    kernel: Kernel,
    a: Operand<'_>,
    rows: std::ops::Range<usize>,
    panel: &[f32],
    bias: &[f32],
    out: (*mut f32, usize),
    cols: usize,
    epilogue: Epilogue,
) {
    let (base, ldc) = out;
    if rows.is_empty() {
        return;
    }
    kernel(&Tile {
        x: &a.x[rows.start * a.lda..],
        rows: rows.len(),
        k: a.k,
        lda: a.lda,
        panel,
        bias,
        // SAFETY: row `rows.start` of the output lies inside what the caller vouched for.
        out: unsafe { base.add(rows.start * ldc) },
        ldc,
        cols,
        epilogue,
    });
}

/// One kernel call's inputs: `rows` rows of `x` against one packed panel, into the first
/// `cols` (<= [`NR`]) columns of `rows` rows at `out`, `ldc` apart.
#[derive(Clone, Copy)]
pub struct Tile<'a> {
    x: &'a [f32],
    rows: usize,
    k: usize,
    /// Distance between rows of `x`.
    lda: usize,
    panel: &'a [f32],
    bias: &'a [f32],
    out: *mut f32,
    ldc: usize,
    cols: usize,
    epilogue: Epilogue,
}

impl Tile<'_> {
    /// Rows `r0..r0 + rows` of this tile.
    fn sub(&self, r0: usize, rows: usize) -> Tile<'_> {
        debug_assert!(r0 + rows <= self.rows);
        Tile {
            x: &self.x[r0 * self.lda..],
            rows,
            // SAFETY: row r0 < self.rows of the output is inside the tile's rows.
            out: unsafe { self.out.add(r0 * self.ldc) },
            ..*self
        }
    }

    /// Row `r`, columns `c0..c0 + n`, of the output.
    ///
    /// # Safety
    /// `r < rows` and `c0 + n <= cols`; no other reference to those values may be alive.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn out_row(&self, r: usize, c0: usize, n: usize) -> &mut [f32] {
        // SAFETY: see the function's contract and PackedLinear::forward.
        unsafe { std::slice::from_raw_parts_mut(self.out.add(r * self.ldc + c0), n) }
    }
}

type Kernel = fn(&Tile<'_>);

/// The tile for the instruction set [`isa`] chose (`EMBEDDER_RS_KERNEL` = `avx2` or
/// `portable` forces a narrower one, to measure them against each other on one machine).
fn kernel() -> Kernel {
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::tile,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::tile,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::tile,
        _ => portable::tile,
    }
}

/// Stores one row of a register block's sums (the bias already added) into `out`
/// (`out.len() <= N`), applying the epilogue's activation. A whole row (`out.len() == N`,
/// every row but a ragged panel's) takes a fixed-length path: the GELU loop vectorises
/// and the copy is inlined. A run-time length makes each row a libc memmove (~11% of a
/// 32-passage call when every tile stored its rows that way).
#[inline(always)]
fn store_block_row<const N: usize>(row: &[f32; N], out: &mut [f32], epilogue: Epilogue) {
    if let Ok(whole) = <&mut [f32; N]>::try_from(&mut *out) {
        match epilogue {
            Epilogue::Bias => *whole = *row,
            Epilogue::BiasGelu => whole
                .iter_mut()
                .zip(row)
                .for_each(|(o, &a)| *o = gelu_scalar(a)),
        }
        return;
    }
    match epilogue {
        Epilogue::Bias => out.copy_from_slice(&row[..out.len()]),
        Epilogue::BiasGelu => out
            .iter_mut()
            .zip(row)
            .for_each(|(o, &a)| *o = gelu_scalar(a)),
    }
}

mod portable {
    use super::{store_block_row, Tile, MR, NR};

    /// Plain Rust over arrays of `NR` lanes; LLVM vectorises the inner loops.
    #[inline(always)]
    fn body(t: &Tile<'_>) {
        let mut acc = [[0.0f32; NR]; MR];
        for (kk, b) in t.panel.chunks_exact(NR).take(t.k).enumerate() {
            for (r, row) in acc.iter_mut().enumerate().take(t.rows) {
                let a = t.x[r * t.lda + kk];
                for (c, &w) in row.iter_mut().zip(b) {
                    *c += a * w;
                }
            }
        }
        for (r, row) in acc.iter_mut().enumerate().take(t.rows) {
            for (c, &b) in row.iter_mut().zip(t.bias) {
                *c += b;
            }
            // SAFETY: r < t.rows, and cols <= NR.
            store_block_row(row, unsafe { t.out_row(r, 0, t.cols) }, t.epilogue);
        }
    }

    pub fn tile(t: &Tile<'_>) {
        for r0 in (0..t.rows).step_by(MR) {
            body(&t.sub(r0, MR.min(t.rows - r0)))
        }
    }
}

/// AVX2 + FMA (CPUs without AVX-512). 16 ymm registers hold a 6 x 16 block (12
/// accumulators, two panel vectors, one broadcast: the shape BLIS and MLAS use on these
/// CPUs), so a panel runs as its two 16-column halves, each over all of the call's rows in
/// blocks of 6. Each half stays in L1 across the rows (k = 384: 24 KB), and a half with
/// no real column in it (a short sequence's keys) is skipped. Blocks of 6 over all the rows
/// rather than 8-row tiles run as 6 + 2: a 2-row block, 4 accumulators deep, waits on the
/// FMA latency (~3/4 of the 6-row block's rate over the whole product).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{store_block_row, Epilogue, Tile};
    use crate::model::cpu::packed::NR;

    /// Rows per register block.
    const RB: usize = 6;
    /// Columns per block: two ymm vectors.
    const CB: usize = 16;

    /// Rows `r0..r0 + ROWS`, columns `c0..c0 + CB`, over the whole of `k`, stored with
    /// the bias and epilogue.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `r0 + ROWS <= t.rows`, `c0 < t.cols`, `c0 + CB <= NR`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const ROWS: usize>(t: &Tile<'_>, r0: usize, c0: usize) {
        let mut c = [[_mm256_setzero_ps(); 2]; ROWS];
        // SAFETY (every load below): the panel holds k rows of NR floats; x holds t.rows
        // rows of k floats, `lda` apart, and r0 + ROWS <= t.rows.
        // one pointer per row, indexed by `kk`: each broadcast is one instruction with no
        // address arithmetic (from `x + r * lda + kk`, LLVM chained an add per row)
        let rows: [*const f32; ROWS] =
            std::array::from_fn(|r| unsafe { t.x.as_ptr().add((r0 + r) * t.lda) });
        let mut b = unsafe { t.panel.as_ptr().add(c0) };
        macro_rules! step {
            ($kk:expr, $b:expr) => {{
                let b0 = _mm256_loadu_ps($b);
                let b1 = _mm256_loadu_ps($b.add(8));
                for (a, x) in c.iter_mut().zip(&rows) {
                    let xr = _mm256_broadcast_ss(&*x.add($kk));
                    a[0] = _mm256_fmadd_ps(xr, b0, a[0]);
                    a[1] = _mm256_fmadd_ps(xr, b1, a[1]);
                }
            }};
        }
        // four steps of `k` a loop turn: the loop's own counting and branching, and a
        // panel pointer's add, once per 48 multiply-adds instead of once per 12
        let mut kk = 0;
        while kk + 4 <= t.k {
            unsafe {
                step!(kk, b);
                step!(kk + 1, b.add(NR));
                step!(kk + 2, b.add(2 * NR));
                step!(kk + 3, b.add(3 * NR));
                b = b.add(4 * NR);
            }
            kk += 4;
        }
        while kk < t.k {
            unsafe {
                step!(kk, b);
                b = b.add(NR);
            }
            kk += 1;
        }
        if t.epilogue == Epilogue::Bias && c0 + CB <= t.cols {
            // the common case straight from the registers: a call to `finish` and a copy
            // through the stack per row was ~15% of a 32-passage batch (a libc memmove
            // for every 16 values)
            // SAFETY: bias holds NR floats, c0 + CB <= NR; rows r0..r0 + ROWS and columns
            // c0..c0 + CB of the output are the caller's to write.
            unsafe {
                let bias0 = _mm256_loadu_ps(t.bias.as_ptr().add(c0));
                let bias1 = _mm256_loadu_ps(t.bias.as_ptr().add(c0 + 8));
                for (r, a) in c.iter().enumerate() {
                    let out = t.out.add((r0 + r) * t.ldc + c0);
                    _mm256_storeu_ps(out, _mm256_add_ps(a[0], bias0));
                    _mm256_storeu_ps(out.add(8), _mm256_add_ps(a[1], bias1));
                }
            }
            return;
        }
        let mut sums = [[0.0f32; CB]; ROWS];
        for (row, a) in sums.iter_mut().zip(&c) {
            // SAFETY: each row of `sums` holds CB = 16 floats.
            unsafe {
                _mm256_storeu_ps(row.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), a[1]);
            }
        }
        // SAFETY: as this function's contract.
        unsafe { finish(t, r0, c0, &sums) }
    }

    /// Adds the bias to the block's sums and stores them through the epilogue.
    ///
    /// Not inlined into [`block`], on purpose: there LLVM hoisted the GELU's constants
    /// into registers above the `k` loop, and the 6-row block, which needs 15 of the 16,
    /// kept one accumulator on the stack instead: a load and a store per step, ~55% of
    /// the FMA peak.
    ///
    /// # Safety
    /// As [`block`]'s, with `sums.len()` for `ROWS`.
    #[inline(never)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn finish(t: &Tile<'_>, r0: usize, c0: usize, sums: &[[f32; CB]]) {
        let cols = (t.cols - c0).min(CB);
        // SAFETY: bias holds NR floats and c0 + CB <= NR.
        let (bias0, bias1) = unsafe {
            (
                _mm256_loadu_ps(t.bias.as_ptr().add(c0)),
                _mm256_loadu_ps(t.bias.as_ptr().add(c0 + 8)),
            )
        };
        for (r, sum) in sums.iter().enumerate() {
            let mut row = [0.0f32; CB];
            // SAFETY: `sum` and `row` hold 16 floats.
            unsafe {
                let v0 = _mm256_add_ps(_mm256_loadu_ps(sum.as_ptr()), bias0);
                let v1 = _mm256_add_ps(_mm256_loadu_ps(sum.as_ptr().add(8)), bias1);
                _mm256_storeu_ps(row.as_mut_ptr(), v0);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), v1);
            }
            // SAFETY: r0 + r < t.rows and c0 + cols <= t.cols.
            store_block_row(&row, unsafe { t.out_row(r0 + r, c0, cols) }, t.epilogue);
        }
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(t: &Tile<'_>) {
        const _: () = assert!(NR.is_multiple_of(CB));
        for c0 in (0..t.cols).step_by(CB) {
            let mut r0 = 0;
            while r0 < t.rows {
                // 7 to 9 rows left run as two blocks of 4 or 5, not 6 and 1 to 3: a block
                // of R rows takes max(R, 4) cycles a step (two FMA ports, latency 4, 2R
                // accumulators), so 6 + 2 takes 10 and 4 + 4 takes 8 (a 14-token text's
                // 6 + 6 + 2 rows: 16 -> 14)
                let left = t.rows - r0;
                let n = if (7..=9).contains(&left) {
                    left.div_ceil(2)
                } else {
                    RB.min(left)
                };
                // SAFETY: r0 + n <= t.rows, c0 < t.cols <= NR (the caller's contract).
                unsafe {
                    match n {
                        6 => block::<6>(t, r0, c0),
                        5 => block::<5>(t, r0, c0),
                        4 => block::<4>(t, r0, c0),
                        3 => block::<3>(t, r0, c0),
                        2 => block::<2>(t, r0, c0),
                        _ => block::<1>(t, r0, c0),
                    }
                }
                r0 += n;
            }
        }
    }

    pub fn tile(t: &Tile<'_>) {
        // SAFETY: chosen only after the CPU was checked for AVX2 and FMA.
        unsafe { run(t) }
    }
}

/// aarch64 (Graviton, Ampere, Apple silicon): NEON is part of the baseline, so no run-time
/// check. 32 q registers of 4 lanes hold a 6 x 16 block (24 accumulators, four panel
/// vectors, one broadcast), walked as the AVX2 tile walks its blocks. Its products are the
/// same fused multiply-adds in the same order as the x86 tiles', so all agree bit for bit
/// (the tests hold each to one scalar reference); its speed has not been measured on ARM.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::{store_block_row, Tile};
    use crate::model::cpu::packed::NR;

    /// Rows per register block.
    const RB: usize = 6;
    /// Columns per block: four q vectors.
    const CB: usize = 16;

    /// Rows `r0..r0 + ROWS`, columns `c0..c0 + CB`, over the whole of `k`, stored with
    /// the bias and epilogue.
    ///
    /// # Safety
    /// `r0 + ROWS <= t.rows`, `c0 < t.cols`, `c0 + CB <= NR`.
    #[inline(always)]
    unsafe fn block<const ROWS: usize>(t: &Tile<'_>, r0: usize, c0: usize) {
        // SAFETY (every load and store below): the panel holds k rows of NR floats and the
        // bias NR; x holds t.rows rows of k floats, `lda` apart; r0 + ROWS <= t.rows.
        unsafe {
            let mut c = [[vdupq_n_f32(0.0); 4]; ROWS];
            let x = t.x.as_ptr().add(r0 * t.lda);
            let b = t.panel.as_ptr().add(c0);
            for kk in 0..t.k {
                let p = b.add(kk * NR);
                let w = [
                    vld1q_f32(p),
                    vld1q_f32(p.add(4)),
                    vld1q_f32(p.add(8)),
                    vld1q_f32(p.add(12)),
                ];
                for (r, a) in c.iter_mut().enumerate() {
                    let xr = vdupq_n_f32(*x.add(r * t.lda + kk));
                    for (acc, &wj) in a.iter_mut().zip(&w) {
                        *acc = vfmaq_f32(*acc, wj, xr);
                    }
                }
            }
            let cols = (t.cols - c0).min(CB);
            let bias = t.bias.as_ptr().add(c0);
            for (r, a) in c.iter().enumerate() {
                let mut row = [0.0f32; CB];
                for (j, &acc) in a.iter().enumerate() {
                    let v = vaddq_f32(acc, vld1q_f32(bias.add(4 * j)));
                    vst1q_f32(row.as_mut_ptr().add(4 * j), v);
                }
                store_block_row(&row, t.out_row(r0 + r, c0, cols), t.epilogue);
            }
        }
    }

    pub fn tile(t: &Tile<'_>) {
        const _: () = assert!(NR.is_multiple_of(CB));
        for c0 in (0..t.cols).step_by(CB) {
            let mut r0 = 0;
            while r0 < t.rows {
                let n = RB.min(t.rows - r0);
                // SAFETY: r0 + n <= t.rows, c0 < t.cols <= NR (the caller's contract).
                unsafe {
                    match n {
                        6 => block::<6>(t, r0, c0),
                        5 => block::<5>(t, r0, c0),
                        4 => block::<4>(t, r0, c0),
                        3 => block::<3>(t, r0, c0),
                        2 => block::<2>(t, r0, c0),
                        _ => block::<1>(t, r0, c0),
                    }
                }
                r0 += n;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{store_block_row, Epilogue, Tile, MR, NR};

    /// Panel rows (k steps) ahead of the one in use that the tile asks the cache for. A
    /// panel is read from L3 or memory by the first row block of a task and from L1/L2 by
    /// the rest; a short text's product is nearly all first blocks. Side by side (two
    /// threads, best / median of 8 alternations): one 14-token text 2.32 / 2.50 -> 2.07 /
    /// 2.30 ms a call; six layers' linear products at m = 250 on one thread ~4-8% faster
    /// (24 and 48 steps measured alike).
    const PREFETCH_STEPS: usize = 24;

    /// `ROWS` x 32 accumulators in registers over the whole of `k`.
    #[target_feature(enable = "avx512f")]
    fn rows<const ROWS: usize>(t: &Tile<'_>) {
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        let (x, b) = (t.x.as_ptr(), t.panel.as_ptr());
        for kk in 0..t.k {
            // a hint only: past the panel's end it touches nothing (hence `wrapping_add`)
            let ahead = b.wrapping_add((kk + PREFETCH_STEPS) * NR) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            // SAFETY: the panel holds k rows of NR floats; x holds ROWS rows of k floats,
            // `lda` apart.
            unsafe {
                let b0 = _mm512_loadu_ps(b.add(kk * NR));
                let b1 = _mm512_loadu_ps(b.add(kk * NR + 16));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xr = _mm512_set1_ps(*x.add(r * t.lda + kk));
                    a[0] = _mm512_fmadd_ps(xr, b0, a[0]);
                    a[1] = _mm512_fmadd_ps(xr, b1, a[1]);
                }
            }
        }
        // SAFETY: bias holds NR floats.
        let (bias0, bias1) = unsafe {
            (
                _mm512_loadu_ps(t.bias.as_ptr()),
                _mm512_loadu_ps(t.bias.as_ptr().add(16)),
            )
        };
        // the first `cols` lanes of the two vectors (a partial panel: attention's last one)
        let lanes = if t.cols == NR {
            u32::MAX
        } else {
            (1u32 << t.cols) - 1
        };
        let (mask0, mask1) = (lanes as u16, (lanes >> 16) as u16);
        let mut row = [0.0f32; NR];
        for (r, a) in acc.iter().enumerate() {
            let (v0, v1) = (_mm512_add_ps(a[0], bias0), _mm512_add_ps(a[1], bias1));
            // SAFETY: r < t.rows and cols <= NR, so the row's first `cols` values are the
            // tile's to write: the masked stores touch no lane past them (and the second
            // is skipped when its mask is empty, its address possibly past the row).
            unsafe {
                let out = t.out.add(r * t.ldc);
                if t.epilogue == Epilogue::Bias {
                    // straight from the registers (through `row`, a libc memmove per row)
                    _mm512_mask_storeu_ps(out, mask0, v0);
                    if mask1 != 0 {
                        _mm512_mask_storeu_ps(out.add(16), mask1, v1);
                    }
                    continue;
                }
                _mm512_storeu_ps(row.as_mut_ptr(), v0);
                _mm512_storeu_ps(row.as_mut_ptr().add(16), v1);
                store_block_row(&row, t.out_row(r, 0, t.cols), t.epilogue);
            }
        }
    }

    pub fn tile(t: &Tile<'_>) {
        const _: () = assert!(MR == 8 && NR == 32);
        for r0 in (0..t.rows).step_by(MR) {
            let t = &t.sub(r0, MR.min(t.rows - r0));
            // SAFETY: chosen only after the CPU was checked for AVX-512F.
            unsafe {
                match t.rows {
                    8 => rows::<8>(t),
                    7 => rows::<7>(t),
                    6 => rows::<6>(t),
                    5 => rows::<5>(t),
                    4 => rows::<4>(t),
                    3 => rows::<3>(t),
                    2 => rows::<2>(t),
                    _ => rows::<1>(t),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(n: usize, seed: u64) -> Vec<f32> {
        super::super::test_values(n, seed, 2.0)
    }

    fn reference(x: &[f32], w: &[f32], b: &[f32], m: usize, d_in: usize, d_out: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; m * d_out];
        for i in 0..m {
            for j in 0..d_out {
                let mut s = b[j] as f64;
                for k in 0..d_in {
                    s += x[i * d_in + k] as f64 * w[k * d_out + j] as f64;
                }
                out[i * d_out + j] = s as f32;
            }
        }
        out
    }

    /// Every shape class: fewer rows than a tile, ragged rows and columns, several tasks.
    #[test]
    fn matches_a_reference_matmul() {
        for &(m, d_in, d_out) in &[
            (1, 3, 5),
            (7, 16, 32),
            (9, 33, 70),
            (70, 64, 96),
            (130, 40, 33),
            // over SERIAL_FMAS: split among a call's team
            (300, 256, 256),
        ] {
            assert!(
                m < 300 || m * d_in * d_out >= SERIAL_FMAS,
                "the large case must run in parallel"
            );
            let (x, w, b) = (lcg(m * d_in, 1), lcg(d_in * d_out, 2), lcg(d_out, 3));
            let packed = PackedLinear::new(&w, &b, d_in, d_out);
            let mut out = vec![f32::NAN; m * d_out];
            super::super::team::with_team(true, || packed.forward(&x, m, &mut out, Epilogue::Bias));
            let want = reference(&x, &w, &b, m, d_in, d_out);
            for (i, (a, e)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (a - e).abs() < 1e-4,
                    "{m}x{d_in}x{d_out} at {i}: {a} vs {e}"
                );
            }
            packed.forward(&x, m, &mut out, Epilogue::BiasGelu);
            for (a, e) in out.iter().zip(&want) {
                assert!((a - gelu_scalar(*e)).abs() < 1e-4);
            }
        }
    }

    /// Two threads keep a passage's rows in one task per panel; many threads get several
    /// tasks each, never fewer than MIN_TASK_ROWS rows, and the chunks cover every row.
    #[test]
    fn task_rows_follow_the_threads() {
        assert_eq!(task_rows(250, 12, 2), 256);
        assert_eq!(task_rows(250, 36, 2), 256);
        assert_eq!(task_rows(2000, 12, 2), MAX_TASK_ROWS);
        assert_eq!(task_rows(14, 12, 2), MIN_TASK_ROWS);
        assert_eq!(task_rows(250, 12, 16), MIN_TASK_ROWS);
        assert_eq!(task_rows(1000, 12, 16), 168);
        for (m, panels, threads) in [(250, 12, 2), (1000, 12, 16), (7, 1, 64), (513, 48, 3)] {
            let rows = task_rows(m, panels, threads);
            assert_eq!(rows % MR, 0);
            assert!(m.div_ceil(rows) * rows >= m);
        }
    }

    /// `multiply` over strided operands: `B` packed from rows and from columns (its
    /// transpose) gives the same product as the reference, ragged panels included.
    #[test]
    fn multiply_strided_operands() {
        // n = 59: a last panel of 27 columns, whose second vector is stored in part
        for &(m, k, n) in &[
            (1, 4, 3),
            (11, 64, 11),
            (70, 64, 70),
            (33, 250, 64),
            (21, 40, 59),
        ] {
            let (lda, ldc) = (k + 5, n + 3);
            let x = lcg(m * lda, 11);
            let dense: Vec<f32> = (0..m)
                .flat_map(|i| x[i * lda..i * lda + k].to_vec())
                .collect();
            let b = lcg(k * n, 12);
            let want = reference(&dense, &b, &vec![0.0; n], m, k, n);
            let bt: Vec<f32> = (0..n)
                .flat_map(|j| (0..k).map(move |kk| (j, kk)))
                .map(|(j, kk)| b[kk * n + j])
                .collect();
            let (mut rows, mut cols) = (Vec::new(), Vec::new());
            pack_rows(&b, n, k, n, &mut rows);
            pack_columns(&bt, k, k, n, &mut cols);
            for panels in [&rows, &cols] {
                let mut out = vec![f32::NAN; m * ldc];
                // SAFETY: out holds m rows of ldc >= n values.
                unsafe {
                    multiply(
                        Operand { x: &x, lda, k },
                        m,
                        panels,
                        n,
                        out.as_mut_ptr(),
                        ldc,
                    )
                };
                for i in 0..m {
                    for j in 0..n {
                        let (a, e) = (out[i * ldc + j], want[i * n + j]);
                        assert!(
                            (a - e).abs() < 1e-4,
                            "{m}x{k}x{n} at ({i}, {j}): {a} vs {e}"
                        );
                    }
                    assert!(
                        out[i * ldc + n..(i + 1) * ldc].iter().all(|v| v.is_nan()),
                        "only n columns written"
                    );
                }
            }
        }
    }

    /// The product as the SIMD tiles form it: for each output, one fused multiply-add per
    /// `k` in order from zero, then the bias; the epilogue on top.
    fn fused_reference(
        x: &[f32],
        w: &[f32],
        b: &[f32],
        (m, d_in, d_out): (usize, usize, usize),
        epilogue: Epilogue,
    ) -> Vec<f32> {
        let mut out = vec![0.0f32; m * d_out];
        for i in 0..m {
            for j in 0..d_out {
                let mut acc = 0.0f32;
                for k in 0..d_in {
                    acc = x[i * d_in + k].mul_add(w[k * d_out + j], acc);
                }
                let v = acc + b[j];
                out[i * d_out + j] = match epilogue {
                    Epilogue::Bias => v,
                    Epilogue::BiasGelu => gelu_scalar(v),
                };
            }
        }
        out
    }

    /// The kernels this CPU runs, by name.
    fn kernels() -> Vec<(&'static str, Kernel)> {
        let mut kernels: Vec<(&str, Kernel)> = vec![("portable", portable::tile)];
        let available = Isa::available();
        #[cfg(target_arch = "x86_64")]
        {
            if available.contains(&Isa::Avx2) {
                kernels.push(("avx2", avx2::tile));
            }
            if available.contains(&Isa::Avx512) {
                kernels.push(("avx512", avx512::tile));
            }
        }
        #[cfg(target_arch = "aarch64")]
        if available.contains(&Isa::Neon) {
            kernels.push(("neon", neon::tile));
        }
        let _ = available;
        kernels
    }

    /// Each kernel this CPU can run gives the reference product, with GELU too, over row
    /// counts that are and are not multiples of its register block, and ragged panels
    /// (columns past `cols` are never written). The SIMD tiles (AVX2, AVX-512, NEON) agree
    /// with the fused reference, and so with each other, bit for bit; the portable one,
    /// which rounds the product and the sum apart, within 1e-4 of the exact product.
    #[test]
    fn every_kernel_matches_the_reference() {
        for &(m, d_in, d_out) in &[(19, 45, 64), (6, 384, 40), (13, 7, 17), (64, 33, 32)] {
            let (x, w, b) = (lcg(m * d_in, 7), lcg(d_in * d_out, 8), lcg(d_out, 9));
            let packed = PackedLinear::new(&w, &b, d_in, d_out);
            let exact = reference(&x, &w, &b, m, d_in, d_out);
            for (name, kernel) in kernels() {
                for epilogue in [Epilogue::Bias, Epilogue::BiasGelu] {
                    let fused = fused_reference(&x, &w, &b, (m, d_in, d_out), epilogue);
                    let mut out = vec![f32::NAN; m * d_out];
                    for p in 0..d_out.div_ceil(NR) {
                        let cols = NR.min(d_out - p * NR);
                        kernel(&Tile {
                            x: &x,
                            rows: m,
                            k: d_in,
                            lda: d_in,
                            panel: &packed.panels[p * d_in * NR..(p + 1) * d_in * NR],
                            bias: &packed.bias[p * NR..(p + 1) * NR],
                            out: out[p * NR..].as_mut_ptr(),
                            ldc: d_out,
                            cols,
                            epilogue,
                        });
                    }
                    for (i, (a, e)) in out.iter().zip(&exact).enumerate() {
                        let e = match epilogue {
                            Epilogue::Bias => *e,
                            Epilogue::BiasGelu => gelu_scalar(*e),
                        };
                        let at = format!("{name} {m}x{d_in}x{d_out} {epilogue:?} at {i}");
                        assert!((a - e).abs() < 1e-4, "{at}: {a} vs {e}");
                        if name != "portable" {
                            assert_eq!(
                                a.to_bits(),
                                fused[i].to_bits(),
                                "{at}: {a} vs {}",
                                fused[i]
                            );
                        }
                    }
                }
            }
        }
    }
}
