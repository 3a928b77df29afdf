//! The identity of this build: what `build-info` prints and every record carries.

use crate::engine::{self, EngineIdentity};
use anyhow::Result;
use serde::Serialize;
use std::borrow::Cow;
use std::sync::OnceLock;

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct BuildIdentity {
    pub sovereign_version: Cow<'static, str>,
    pub engine: EngineIdentity,
    /// SHA-256 of the running executable.
    pub binary_sha256: String,
    /// CPU features the engine's kernels were compiled for.
    pub cpu_features: Vec<String>,
    pub target: Cow<'static, str>,
    /// Engine libraries and backend modules mapped into the process, by SHA-256.
    pub libraries: Vec<engine::backends::LoadedLibrary>,
    /// Devices of the loaded backends (ggml registry), with NVML's view of GPU boards.
    pub devices: Vec<engine::backends::Device>,
    pub gpu: crate::observe::gpu::DeviceInfo,
}

pub fn build_identity() -> Result<BuildIdentity> {
    static BINARY: OnceLock<String> = OnceLock::new();
    let binary_sha256 = match BINARY.get() {
        Some(d) => d.clone(),
        None => {
            let d = crate::util::sha256_file(&std::env::current_exe()?)?;
            BINARY.get_or_init(|| d).clone()
        }
    };
    Ok(BuildIdentity {
        sovereign_version: env!("CARGO_PKG_VERSION").into(),
        engine: engine::identity(),
        binary_sha256,
        cpu_features: engine::cpu_features(),
        target: std::env::consts::ARCH.into(),
        libraries: engine::backends::loaded_libraries(),
        devices: engine::backends::devices(),
        gpu: crate::observe::gpu::device_info(),
    })
}
