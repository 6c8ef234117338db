//! Run-time choice of the burn device: flex (CPU) or wgpu.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use burn::tensor::wgpu::wgpu::DeviceType;
use burn::tensor::Device;

use crate::error::{EmbedderError, Result};

/// Which burn backend an embedder runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// burn-flex: pure-Rust CPU backend (gemm, rayon, SIMD).
    Cpu,
    /// burn-wgpu: WGSL compute shaders over Vulkan / Metal / DX12.
    Wgpu,
}

impl BackendKind {
    /// `"cpu"` or `"wgpu"`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Wgpu => "wgpu",
        }
    }
}

/// A device ready for tensors, with a description of what runs it.
#[derive(Clone)]
pub struct SelectedDevice {
    /// The burn device.
    pub device: Device,
    /// Backend family.
    pub kind: BackendKind,
    /// Human-readable adapter, e.g. `"llvmpipe (LLVM 19.1.7, 256 bits) (Cpu, Vulkan)"`.
    pub adapter: String,
    /// Whether the wgpu adapter is a software rasteriser rather than a real GPU.
    pub software: bool,
}

/// The wgpu runtime can be initialised once per process; keep its outcome.
static WGPU: OnceLock<std::result::Result<SelectedDevice, String>> = OnceLock::new();

fn init_wgpu() -> std::result::Result<SelectedDevice, String> {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        Device::wgpu_options().init_with_setup()
    }));
    match outcome {
        Ok(Ok((device, setup))) => {
            let info = setup.adapter.get_info();
            let software = matches!(info.device_type, DeviceType::Cpu | DeviceType::Other);
            let adapter = format!(
                "{} ({:?}, {:?}{})",
                info.name,
                info.device_type,
                info.backend,
                if info.driver.is_empty() {
                    String::new()
                } else {
                    format!(", {} {}", info.driver, info.driver_info)
                }
            );
            Ok(SelectedDevice {
                device,
                kind: BackendKind::Wgpu,
                adapter,
                software,
            })
        }
        Ok(Err(e)) => Err(format!("wgpu initialisation failed: {e}")),
        Err(panic) => Err(format!(
            "wgpu initialisation panicked: {}",
            panic_message(panic.as_ref())
        )),
    }
}

/// The wgpu device of this process (initialised on first call).
pub fn wgpu_device() -> std::result::Result<SelectedDevice, String> {
    WGPU.get_or_init(init_wgpu).clone()
}

/// The flex CPU device.
pub fn cpu_device() -> SelectedDevice {
    let threads = rayon::current_num_threads();
    SelectedDevice {
        device: Device::flex(),
        kind: BackendKind::Cpu,
        adapter: format!("burn-flex CPU ({threads} threads)"),
        software: false,
    }
}

/// Resolves `"cpu"`, `"wgpu"` or `"auto"` (wgpu when a hardware GPU adapter exists,
/// else cpu).
pub fn select(backend: &str) -> Result<SelectedDevice> {
    match backend.to_ascii_lowercase().as_str() {
        "cpu" | "flex" => Ok(cpu_device()),
        "wgpu" | "gpu" | "vulkan" => wgpu_device().map_err(EmbedderError::Backend),
        "auto" => Ok(match wgpu_device() {
            Ok(d) if !d.software => d,
            _ => cpu_device(),
        }),
        other => Err(EmbedderError::Backend(format!(
            "unknown backend {other:?}; expected \"auto\", \"cpu\" or \"wgpu\""
        ))),
    }
}

/// Text of a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_backend_is_an_error() {
        let err = select("tpu").err().unwrap();
        assert!(err.to_string().contains("unknown backend"));
    }

    #[test]
    fn cpu_backend_is_flex() {
        let d = select("cpu").unwrap();
        assert_eq!(d.kind, BackendKind::Cpu);
        assert!(d.adapter.contains("flex"));
        assert!(d.device == Device::flex());
    }
}
