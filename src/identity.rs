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
    /// The machine the run happened on: pairs never mix nodes (absent from older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeIdentity>,
}

/// The hardware and kernel a run saw. `id` is the SHA-256 of the canonical JSON of the other
/// fields: two records come from the same node exactly when their ids are equal.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct NodeIdentity {
    pub id: String,
    /// SHA-256 of the host name (records name no machine).
    pub host_sha256: String,
    pub cpu_model: String,
    /// The CPU's feature flags (/proc/cpuinfo), sorted.
    pub cpu_flags: Vec<String>,
    pub logical_cpus: usize,
    /// MemTotal.
    pub memory_bytes: u64,
    pub kernel: String,
    /// GPU boards (NVML name and memory), empty where none is observed.
    pub gpus: Vec<String>,
}

fn node_identity(gpu: &crate::observe::gpu::DeviceInfo) -> NodeIdentity {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = <procfs::CpuInfo as procfs::Current>::current().ok();
    // cpu 0's, the first the file lists.
    let field = |name: &str| cpuinfo.as_ref().and_then(|c| c.get_field(0, name)).unwrap_or_default().to_string();
    let mut cpu_flags: Vec<String> = field("flags").split_whitespace().map(str::to_string).collect();
    cpu_flags.sort();
    let memory_bytes = crate::observe::procs::mem_total().unwrap_or(0);
    let gpus = match gpu {
        crate::observe::gpu::DeviceInfo::Observed { boards, .. } => boards
            .iter()
            .map(|b| format!("{} {}", b.name.as_deref().unwrap_or("unnamed"), b.memory_total.map_or("?".into(), |m| m.to_string())))
            .collect(),
        crate::observe::gpu::DeviceInfo::NotObserved { .. } => Vec::new(),
    };
    let mut n = NodeIdentity {
        id: String::new(),
        host_sha256: crate::util::sha256(read("/proc/sys/kernel/hostname").trim().as_bytes()),
        cpu_model: field("model name"),
        cpu_flags,
        // The machine's, not this process's allowance (affinity and quotas vary by job).
        logical_cpus: cpuinfo.as_ref().map_or(0, procfs::CpuInfo::num_cores),
        memory_bytes,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        gpus,
    };
    n.id = crate::util::sha256(crate::util::canonical_json(&serde_json::to_value(&n).unwrap_or_default()).as_bytes());
    n
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
    let gpu = crate::observe::gpu::device_info();
    Ok(BuildIdentity {
        sovereign_version: env!("CARGO_PKG_VERSION").into(),
        engine: engine::identity(),
        binary_sha256,
        cpu_features: engine::cpu_features(),
        target: std::env::consts::ARCH.into(),
        libraries: engine::backends::loaded_libraries(),
        devices: engine::backends::devices(),
        node: Some(node_identity(&gpu)),
        gpu,
    })
}
