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
    /// Why this backend: what was asked for and, for `"auto"`, what it found.
    pub reason: String,
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
                reason: "wgpu asked for".into(),
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
        reason: "cpu asked for".into(),
    }
}

/// Device nodes through which a GPU driver is reached on Linux: DRM render nodes (AMD,
/// Intel, Mesa drivers), NVIDIA's proprietary driver, WSL2's GPU paravirtualisation.
#[cfg(target_os = "linux")]
fn gpu_device_node(dev: &std::path::Path) -> Option<String> {
    for fixed in ["nvidiactl", "dxg"] {
        if dev.join(fixed).exists() {
            return Some(format!("/dev/{fixed}"));
        }
    }
    std::fs::read_dir(dev.join("dri"))
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("renderD"))
        .map(|name| format!("/dev/dri/{name}"))
}

/// Whether `"auto"` should probe wgpu at all, and why (or why not). Creating a Vulkan
/// instance loads every installed driver; without a GPU that finds only a software
/// rasteriser (which `auto` never takes), and Mesa's window-system code prints
/// "error: XDG_RUNTIME_DIR is invalid" lines to stderr on the way, from C, where no Rust
/// code can catch them. On Linux a hardware GPU is reachable only through a device node,
/// so without one the probe is skipped. Elsewhere (Metal, DX12) it always runs.
fn worth_probing() -> (bool, String) {
    #[cfg(target_os = "linux")]
    {
        match gpu_device_node(std::path::Path::new("/dev")) {
            Some(node) => (true, format!("{node} present")),
            None => (
                false,
                "no GPU device node (/dev/dri/renderD*, /dev/nvidiactl, /dev/dxg), wgpu not probed"
                    .into(),
            ),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        (true, "not Linux".into())
    }
}

/// `"auto"`: wgpu when its adapter is a hardware GPU, else the CPU; `reason` says which
/// and why.
fn auto_device() -> SelectedDevice {
    let (probe, found) = worth_probing();
    if !probe {
        return SelectedDevice {
            reason: format!("auto: {found}"),
            ..cpu_device()
        };
    }
    match wgpu_device() {
        Ok(d) if !d.software => SelectedDevice {
            reason: format!("auto: {found}, wgpu adapter {}", d.adapter),
            ..d
        },
        Ok(d) => SelectedDevice {
            reason: format!(
                "auto: {found}, but wgpu's adapter is software ({})",
                d.adapter
            ),
            ..cpu_device()
        },
        Err(e) => SelectedDevice {
            reason: format!("auto: {found}, but {e}"),
            ..cpu_device()
        },
    }
}

/// Resolves `"cpu"`, `"wgpu"` or `"auto"` (wgpu when a hardware GPU adapter exists,
/// else cpu; on Linux without a GPU device node wgpu is not even probed).
pub fn select(backend: &str) -> Result<SelectedDevice> {
    match backend.to_ascii_lowercase().as_str() {
        "cpu" | "flex" => Ok(cpu_device()),
        "wgpu" | "gpu" | "vulkan" => wgpu_device().map_err(EmbedderError::Backend),
        "auto" => Ok(auto_device()),
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
        assert_eq!(d.reason, "cpu asked for");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn gpu_device_nodes_are_found_by_name() {
        let dev = std::env::temp_dir().join(format!("embedder_rs_dev_{}", std::process::id()));
        std::fs::create_dir_all(dev.join("dri")).unwrap();
        std::fs::write(dev.join("dri").join("card0"), b"").unwrap();
        // a display-only card node is not a render node
        assert_eq!(gpu_device_node(&dev), None);
        std::fs::write(dev.join("dri").join("renderD128"), b"").unwrap();
        assert_eq!(
            gpu_device_node(&dev).as_deref(),
            Some("/dev/dri/renderD128")
        );
        std::fs::write(dev.join("nvidiactl"), b"").unwrap();
        assert_eq!(gpu_device_node(&dev).as_deref(), Some("/dev/nvidiactl"));
        std::fs::remove_dir_all(&dev).ok();
    }

    /// `auto` always resolves (to the CPU when no hardware GPU answers) and says why.
    #[test]
    fn auto_says_what_it_found() {
        let d = select("auto").unwrap();
        assert!(d.reason.starts_with("auto: "), "{}", d.reason);
        if d.kind == BackendKind::Cpu {
            assert!(!d.software);
        }
    }
}
