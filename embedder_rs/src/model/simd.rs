//! Run-time choice of vector width for the CPU kernels written in plain Rust.
//!
//! The crate is compiled for baseline x86-64 (SSE2). A loop that LLVM vectorises gets
//! 4 lanes there; compiled again under `#[target_feature]` it gets 8 (AVX2) or 16
//! (AVX-512F). [`multiversion!`] defines a function that picks the widest version the CPU
//! supports, once per call.

/// `multiversion!(pub fn name(a: A, b: B), body)` defines `pub fn name(a: A, b: B)` running
/// `body(a, b)` (an `#[inline(always)]` function) compiled for AVX-512F, AVX2 or the
/// baseline, whichever the CPU has.
macro_rules! multiversion {
    ($vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?), $body:path) => {
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has just been checked for AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has just been checked for AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use multiversion;
