//! Run-time choice of the CPU's vector instruction set for the host kernels.
//!
//! The crate is compiled for the target's baseline (SSE2 on x86-64, NEON on aarch64). A
//! loop that LLVM vectorises gets 4 lanes there; compiled again under `#[target_feature]`
//! it gets 8 (AVX2) or 16 (AVX-512F). [`isa`] picks the widest set the CPU has, once per
//! process; the matmul tile ([`super::cpu::packed`]) and every [`multiversion!`] function
//! follow that one choice, so forcing a narrower set (`EMBEDDER_RS_KERNEL`) measures the
//! whole pass as a CPU without the wider one would run it.

use std::sync::OnceLock;

/// A vector instruction set the host kernels have a path for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 with AVX-512F: a 16-lane tile.
    Avx512,
    /// x86-64 with AVX2 and FMA: an 8-lane tile.
    Avx2,
    /// aarch64 (NEON is part of its baseline): a 4-lane tile.
    Neon,
    /// Plain Rust that LLVM vectorises at the baseline width.
    Portable,
}

impl Isa {
    /// `"avx512"`, `"avx2"`, `"neon"` or `"portable"`: the spelling `EMBEDDER_RS_KERNEL`
    /// takes and `Embedder.kernel` reports.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
            Isa::Portable => "portable",
        }
    }

    /// The sets this CPU runs, widest first; `Portable` always last.
    pub fn available() -> Vec<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            let mut sets = Vec::new();
            if std::arch::is_x86_feature_detected!("avx512f") {
                sets.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                sets.push(Isa::Avx2);
            }
            sets.push(Isa::Portable);
            sets
        }
        #[cfg(target_arch = "aarch64")]
        {
            vec![Isa::Neon, Isa::Portable]
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            vec![Isa::Portable]
        }
    }
}

/// The set named by `forced` when the CPU has it (`available`, widest first), else the
/// widest. An unknown or unavailable name does not fail the load: it is a knob for
/// measurements, and the kernel in use is reported (`Embedder.kernel`).
pub fn choose(forced: &str, available: &[Isa]) -> Isa {
    let forced = forced.trim().to_ascii_lowercase();
    available
        .iter()
        .copied()
        .find(|isa| isa.name() == forced)
        .unwrap_or(available[0])
}

/// The set the host kernels use in this process, chosen on first call from the CPU and
/// `EMBEDDER_RS_KERNEL`.
pub fn isa() -> Isa {
    static CHOSEN: OnceLock<Isa> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let forced = std::env::var("EMBEDDER_RS_KERNEL").unwrap_or_default();
        choose(&forced, &Isa::available())
    })
}

/// `multiversion!(pub fn name(a: A, b: B), body)` defines `pub fn name(a: A, b: B)` running
/// `body(a, b)` (an `#[inline(always)]` function) compiled for AVX-512F or AVX2 when
/// [`isa`] chose it, else for the baseline (which on aarch64 is NEON already).
macro_rules! multiversion {
    ($vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?), $body:path) => {
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                match $crate::model::simd::isa() {
                    // SAFETY: isa() chose AVX-512F only on a CPU that has it.
                    $crate::model::simd::Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: isa() chose AVX2 only on a CPU with AVX2 and FMA.
                    $crate::model::simd::Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    _ => {}
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_widest_set_unless_one_available_is_forced() {
        let x86 = [Isa::Avx512, Isa::Avx2, Isa::Portable];
        assert_eq!(choose("", &x86), Isa::Avx512);
        assert_eq!(choose("avx2", &x86), Isa::Avx2);
        assert_eq!(choose(" AVX2 ", &x86), Isa::Avx2);
        assert_eq!(choose("portable", &x86), Isa::Portable);
        // not on this CPU, or not a set at all: the widest, not a failed load
        assert_eq!(choose("avx512", &[Isa::Avx2, Isa::Portable]), Isa::Avx2);
        assert_eq!(choose("neon", &x86), Isa::Avx512);
        assert_eq!(choose("sse9", &x86), Isa::Avx512);
        assert_eq!(
            choose("portable", &[Isa::Neon, Isa::Portable]),
            Isa::Portable
        );
    }

    #[test]
    fn the_chosen_set_is_one_this_cpu_runs() {
        let available = Isa::available();
        assert!(
            available.contains(&isa()),
            "{:?} not in {available:?}",
            isa()
        );
        assert_eq!(available.last(), Some(&Isa::Portable));
        // NEON is in aarch64's baseline: there it is always the widest (scripts/test_neon.sh)
        #[cfg(target_arch = "aarch64")]
        assert_eq!(available[0], Isa::Neon);
    }
}
