//! Whole-board GPU audit through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so.1` at run
//! time): board used memory (total − free) and the compute processes on every board, with
//! those outside the run's cgroup marked foreign. GPU memory is audited, not partitioned.
//!
//! Where NVML or a GPU is absent the result is [`GpuAudit::NotObserved`] with NVML's reason —
//! never a zero that was not measured.

use super::cgroup::{membership_of, Version};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Board {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub total: u64,
}

/// A compute process on a board that is not in the run's cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ForeignProcess {
    pub pid: u32,
    pub board: u32,
    pub comm: Option<String>,
    /// Its memory cgroup, or why it could not be read (then it counts as foreign).
    pub cgroup: String,
    pub max_used: Option<u64>,
    pub samples: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct GpuObservation {
    pub boards: Vec<Board>,
    /// Sum of board sizes.
    pub total: u64,
    pub samples: u64,
    pub interval_ms: f64,
    /// Used memory (total − free) summed over boards: first sample, sampled maximum, last.
    pub used_start: u64,
    pub used_peak: u64,
    pub used_end: u64,
    /// Maximum per board.
    pub used_peak_per_board: Vec<u64>,
    /// Compute processes of the run seen on a board.
    pub run_processes: Vec<u32>,
    /// Sampled maximum of the device memory NVML charges to the run's own processes (summed
    /// over boards); None when NVML did not report it for some sample with a run process.
    pub run_used_peak: Option<u64>,
    pub foreign: Vec<ForeignProcess>,
    pub foreign_max_concurrent: u32,
    pub sample_errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GpuAudit {
    NotObserved { reason: String },
    Observed(GpuObservation),
}

/// Whether a pid belongs to the run: its memory cgroup is the run cgroup or below it.
#[derive(Clone, Debug)]
pub struct Membership {
    pub version: Version,
    pub rel: String,
}

/// Why a process's cgroup could not be told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unclassified {
    #[error("/proc/{pid}/cgroup: {reason}")]
    Unreadable { pid: u32, reason: String },
    #[error("/proc/{pid}/cgroup: no memory hierarchy line")]
    NoMemoryLine { pid: u32 },
}

impl Membership {
    /// `Ok(true)` inside, `Ok(false)` outside with its cgroup, `Err` when unreadable.
    pub fn classify(&self, pid: u32) -> Result<(bool, String), Unclassified> {
        let p = membership_of(pid, self.version)
            .map_err(|e| Unclassified::Unreadable { pid, reason: e.to_string() })?
            .ok_or(Unclassified::NoMemoryLine { pid })?;
        let inside = p == self.rel || p.starts_with(&format!("{}/", self.rel.trim_end_matches('/')));
        Ok((inside, p))
    }
}

/// Why NVML observes nothing (or not a number) here; records keep it as their reason.
#[derive(Debug, thiserror::Error)]
pub enum Unobserved {
    #[error("NVML unavailable: {0}")]
    Unavailable(NvmlError),
    #[error("NVML reports zero devices")]
    NoDevices,
    #[error("NVML device count: {0}")]
    DeviceCount(NvmlError),
    #[error("device {index}: {error}")]
    Device { index: u32, error: NvmlError },
    #[error("device {index} running_compute_processes: {error}")]
    Processes { index: u32, error: NvmlError },
    #[error("device {0}: NVML keeps no per-process memory")]
    NoPerProcessMemory(u32),
    #[error("pid {0} is not among NVML's compute processes")]
    NotListed(u32),
}

/// Why the GPU cannot be observed here, or None when NVML sees at least one board.
pub fn probe() -> Option<String> {
    open().err().map(|e| e.to_string())
}

/// NVML with at least one board, or why not.
fn open() -> Result<(Nvml, u32), Unobserved> {
    let nvml = Nvml::init().map_err(Unobserved::Unavailable)?;
    match nvml.device_count() {
        Ok(0) => Err(Unobserved::NoDevices),
        Ok(n) => Ok((nvml, n)),
        Err(e) => Err(Unobserved::DeviceCount(e)),
    }
}

/// The GPU boards as NVML describes them, for the build identity.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeviceInfo {
    NotObserved { reason: String },
    Observed { driver: Option<String>, cuda_driver: Option<String>, boards: Vec<BoardInfo> },
}

#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct BoardInfo {
    pub index: u32,
    pub name: Option<String>,
    pub compute_capability: Option<String>,
    pub memory_total: Option<u64>,
}

pub fn device_info() -> DeviceInfo {
    let (nvml, count) = match open() {
        Ok(x) => x,
        Err(reason) => return DeviceInfo::NotObserved { reason: reason.to_string() },
    };
    let boards = (0..count)
        .map(|i| {
            let d = nvml.device_by_index(i).ok();
            BoardInfo {
                index: i,
                name: d.as_ref().and_then(|d| d.name().ok()),
                compute_capability: d.as_ref().and_then(|d| d.cuda_compute_capability().ok()).map(|c| format!("{}.{}", c.major, c.minor)),
                memory_total: d.as_ref().and_then(|d| d.memory_info().ok()).map(|m| m.total),
            }
        })
        .collect();
    DeviceInfo::Observed {
        driver: nvml.sys_driver_version().ok(),
        cuda_driver: nvml.sys_cuda_driver_version().ok().map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        boards,
    }
}

/// Device memory NVML charges to this process now, summed over boards; Err says why it is not
/// observed (no NVML, no board, or NVML keeps no per-process number).
pub fn own_usage() -> Result<u64, Unobserved> {
    let (nvml, count) = open()?;
    let me = std::process::id();
    let (mut sum, mut seen) = (0u64, false);
    for i in 0..count {
        let dev = nvml.device_by_index(i).map_err(|error| Unobserved::Device { index: i, error })?;
        let procs = dev.running_compute_processes().map_err(|error| Unobserved::Processes { index: i, error })?;
        for p in procs.into_iter().filter(|p| p.pid == me) {
            seen = true;
            match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => sum += b,
                UsedGpuMemory::Unavailable => return Err(Unobserved::NoPerProcessMemory(i)),
            }
        }
    }
    if !seen {
        // Zero would be a claim; a process NVML does not list (no context, or another pid
        // namespace) is not observed.
        return Err(Unobserved::NotListed(me));
    }
    Ok(sum)
}

pub struct GpuSampler {
    stop: Sender<()>,
    handle: JoinHandle<GpuAudit>,
}

impl GpuSampler {
    pub fn start(interval: Duration, membership: Membership) -> GpuSampler {
        let (stop, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("observe-gpu".into())
            .spawn(move || {
                let (nvml, count) = match open() {
                    Ok(x) => x,
                    Err(reason) => return GpuAudit::NotObserved { reason: reason.to_string() },
                };
                let mut st = State::new(interval, membership);
                loop {
                    st.sample(&nvml, count);
                    match rx.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        _ => break,
                    }
                }
                st.sample(&nvml, count);
                st.finish()
            })
            .expect("spawning the GPU sampler thread");
        GpuSampler { stop, handle }
    }

    pub fn stop(self) -> GpuAudit {
        let _ = self.stop.send(());
        self.handle.join().unwrap_or_else(|_| GpuAudit::NotObserved { reason: "GPU sampler thread panicked".to_string() })
    }
}

struct State {
    membership: Membership,
    obs: GpuObservation,
    /// pid → inside the run? (with its cgroup text)
    class: BTreeMap<u32, Result<(bool, String), Unclassified>>,
    foreign: BTreeMap<(u32, u32), ForeignProcess>,
    run: std::collections::BTreeSet<u32>,
}

impl State {
    fn new(interval: Duration, membership: Membership) -> State {
        State {
            membership,
            obs: GpuObservation {
                boards: Vec::new(),
                total: 0,
                samples: 0,
                interval_ms: interval.as_secs_f64() * 1e3,
                used_start: 0,
                used_peak: 0,
                used_end: 0,
                used_peak_per_board: Vec::new(),
                run_processes: Vec::new(),
                run_used_peak: Some(0),
                foreign: Vec::new(),
                foreign_max_concurrent: 0,
                sample_errors: 0,
                last_error: None,
            },
            class: BTreeMap::new(),
            foreign: BTreeMap::new(),
            run: Default::default(),
        }
    }

    fn error(&mut self, e: String) {
        self.obs.sample_errors += 1;
        self.obs.last_error = Some(e);
    }

    fn sample(&mut self, nvml: &Nvml, count: u32) {
        let mut used = Vec::with_capacity(count as usize);
        let mut foreign_now = 0u32;
        let mut run_used = Some(0u64);
        for i in 0..count {
            let dev = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => return self.error(format!("device {i}: {e}")),
            };
            let mem = match dev.memory_info() {
                Ok(m) => m,
                Err(e) => return self.error(format!("device {i} memory_info: {e}")),
            };
            if self.obs.boards.len() < count as usize {
                self.obs.boards.push(Board { index: i, name: dev.name().ok(), uuid: dev.uuid().ok(), total: mem.total });
            }
            used.push(mem.total.saturating_sub(mem.free));
            let procs = match dev.running_compute_processes() {
                Ok(p) => p,
                Err(e) => return self.error(format!("device {i} running_compute_processes: {e}")),
            };
            for p in procs {
                let membership = &self.membership;
                let class = self.class.entry(p.pid).or_insert_with(|| membership.classify(p.pid)).clone();
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                match class {
                    Ok((true, _)) => {
                        self.run.insert(p.pid);
                        run_used = run_used.zip(bytes).map(|(a, b)| a + b);
                    }
                    other => {
                        foreign_now += 1;
                        let cgroup = match other {
                            Ok((_, c)) => c,
                            Err(e) => format!("unreadable: {e}"),
                        };
                        let f = self.foreign.entry((p.pid, i)).or_insert_with(|| ForeignProcess {
                            pid: p.pid,
                            board: i,
                            comm: fs::read_to_string(format!("/proc/{}/comm", p.pid)).ok().map(|s| s.trim().to_string()),
                            cgroup,
                            max_used: None,
                            samples: 0,
                        });
                        f.samples += 1;
                        f.max_used = f.max_used.max(bytes);
                    }
                }
            }
        }
        let sum: u64 = used.iter().sum();
        if self.obs.samples == 0 {
            self.obs.used_start = sum;
            self.obs.total = self.obs.boards.iter().map(|b| b.total).sum();
            self.obs.used_peak_per_board = vec![0; used.len()];
        }
        for (m, u) in self.obs.used_peak_per_board.iter_mut().zip(&used) {
            *m = (*m).max(*u);
        }
        self.obs.samples += 1;
        self.obs.used_peak = self.obs.used_peak.max(sum);
        self.obs.run_used_peak = self.obs.run_used_peak.zip(run_used).map(|(a, b)| a.max(b));
        self.obs.used_end = sum;
        self.obs.foreign_max_concurrent = self.obs.foreign_max_concurrent.max(foreign_now);
    }

    fn finish(mut self) -> GpuAudit {
        if self.obs.samples == 0 {
            let why = self.obs.last_error.unwrap_or_else(|| "no sample completed".to_string());
            return GpuAudit::NotObserved { reason: format!("NVML sampling failed: {why}") };
        }
        self.obs.run_processes = self.run.into_iter().collect();
        self.obs.foreign = self.foreign.into_values().collect();
        GpuAudit::Observed(self.obs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_by_memory_cgroup() {
        let me = std::process::id();
        for v in [Version::V1, Version::V2] {
            let Some(own) = membership_of(me, v).unwrap() else { continue };
            let inside = Membership { version: v, rel: own.clone() };
            assert_eq!(inside.classify(me).unwrap(), (true, own.clone()));
            let run = Membership { version: v, rel: format!("{}/sovereign-1-0", own.trim_end_matches('/')) };
            assert_eq!(run.classify(me).unwrap(), (false, own.clone()));
            assert!(run.classify(999_999_999).is_err(), "an unreadable pid is reported, then counted foreign");
        }
    }
}
