//! The link probe: which libtorch is loaded and what it can run on.
//!
//! The version is read from the `version.py` that PyTorch ships beside the
//! `lib/` folder of the `libtorch_cpu.so` this process actually mapped (from
//! `/proc/self/maps`), so it reports what runs, not what was built against.

use serde::Serialize;
use std::path::{Path, PathBuf};
use tch::{Cuda, Device, Kind, Tensor};

/// What the probe found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `torch.__version__` of the loaded libtorch, when it can be read.
    pub libtorch_version: Option<String>,
    /// Path of the mapped `libtorch_cpu.so`.
    pub libtorch_path: Option<PathBuf>,
    /// Whether `libtorch_cuda.so` is mapped into this process.
    pub cuda_library_loaded: bool,
    /// Whether CUDA is usable.
    pub cuda_available: bool,
    /// Whether cuDNN is usable.
    pub cudnn_available: bool,
    /// Intra-op threads libtorch uses on CPU.
    pub cpu_threads: i32,
    /// Every device with the result of a small matrix product on it.
    pub devices: Vec<DeviceReport>,
}

/// One device and whether it computed correctly.
#[derive(Debug, Serialize)]
pub struct DeviceReport {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Whether a 64×64 matrix product on it matched the expected sum.
    pub matmul_ok: bool,
}

/// Runs the probe.
pub fn run() -> std::io::Result<Report> {
    // Call into libtorch first so that its libraries are surely mapped.
    let cuda_available = Cuda::is_available();
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| std::io::Error::new(e.kind(), format!("reading /proc/self/maps: {e}")))?;
    let libtorch_path = mapped(&maps, "libtorch_cpu.so");
    let libtorch_version = libtorch_path.as_deref().and_then(version_beside);
    let mut devices = vec![DeviceReport {
        device: "cpu".into(),
        matmul_ok: matmul_ok(Device::Cpu),
    }];
    if cuda_available {
        for i in 0..Cuda::device_count() {
            let i = usize::try_from(i)
                .map_err(|e| std::io::Error::other(format!("device index: {e}")))?;
            devices.push(DeviceReport {
                device: format!("cuda:{i}"),
                matmul_ok: matmul_ok(Device::Cuda(i)),
            });
        }
    }
    Ok(Report {
        libtorch_version,
        libtorch_path,
        cuda_library_loaded: mapped(&maps, "libtorch_cuda.so").is_some(),
        cuda_available,
        cudnn_available: Cuda::cudnn_is_available(),
        cpu_threads: tch::utils::get_num_threads(),
        devices,
    })
}

fn mapped(maps: &str, name: &str) -> Option<PathBuf> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| Path::new(p).file_name().is_some_and(|f| f == name))
        .map(PathBuf::from)
}

/// Reads `__version__` from `<torch>/version.py` for `<torch>/lib/libtorch_cpu.so`.
fn version_beside(lib: &Path) -> Option<String> {
    let text = std::fs::read_to_string(lib.parent()?.parent()?.join("version.py")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("__version__"))
        .map(|rest| {
            rest.trim_start_matches([' ', '=', ':', 's', 't', 'r'])
                .trim()
                .trim_matches(['\'', '"'])
                .to_owned()
        })
}

fn matmul_ok(device: Device) -> bool {
    let n = 64;
    let a = Tensor::ones([n, n], (Kind::Float, device));
    let sum = a.matmul(&a).sum(Kind::Float).double_value(&[]);
    (sum - (n * n * n) as f64).abs() < 1e-3
}
