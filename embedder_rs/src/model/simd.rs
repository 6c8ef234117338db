//! Run-time choice of vector width for the CPU kernels written in plain Rust.
//!
//! The crate is compiled for baseline x86-64 (SSE2). A loop that LLVM vectorises gets
//! 4 lanes there; compiled again under `#[target_feature]` it gets 8 (AVX2) or 16
//! (AVX-512F). [`multiversion!`] defines a function over `&mut [f32]` that picks the
//! widest version the CPU supports, once per call.

/// `multiversion!(pub fn name, body)` defines `pub fn name(values: &mut [f32])` running
/// `body(values)` (an `#[inline(always)]` function) compiled for AVX-512F, AVX2 or the
/// baseline, whichever the CPU has.
macro_rules! multiversion {
    ($vis:vis fn $name:ident, $body:path) => {
        $vis fn $name(values: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512(values: &mut [f32]) {
                    $body(values)
                }
                #[target_feature(enable = "avx2")]
                fn avx2(values: &mut [f32]) {
                    $body(values)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has just been checked for AVX-512F.
                    return unsafe { avx512(values) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has just been checked for AVX2.
                    return unsafe { avx2(values) };
                }
            }
            $body(values)
        }
    };
}

pub(crate) use multiversion;
