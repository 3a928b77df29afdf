//! The authority vector (seed 000 §2.1: boundary and grade per memory tier, with margins) and
//! the admission predicate (§5.3: positive margin below the limit and zero limit events, plus
//! zero OOM, zero OOM kills, zero swap and zero foreign compute processes).
//!
//! Both are pure functions of what was observed, so the grading is testable without a cgroup.

use super::gpu::GpuAudit;
use super::HostReport;
use serde::{Deserialize, Serialize};

/// Authority grades (seed 000 §2.1). Not comparable on one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    /// Enforced by the kernel or runtime (a cgroup limit).
    HardLimit,
    /// A capacity that cannot be exceeded (board size, installed memory).
    PhysicalCeiling,
    /// An instrumented, kernel-kept high-water mark.
    HighWaterMark,
    /// Periodic samples: an audit, not a bound between samples.
    SampledAudit,
    NotObserved,
}

impl Grade {
    pub fn name(self) -> &'static str {
        match self {
            Grade::HardLimit => "hard_limit",
            Grade::PhysicalCeiling => "physical_ceiling",
            Grade::HighWaterMark => "high_water_mark",
            Grade::SampledAudit => "sampled_audit",
            Grade::NotObserved => "not_observed",
        }
    }
}

/// A tier's grade as the record states it (`{"grade": ..., "reason": ...}`): why, where
/// nothing was observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Graded {
    pub grade: Grade,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Graded {
    pub fn not_observed(reason: String) -> Graded {
        Graded { grade: Grade::NotObserved, reason: Some(reason) }
    }
}

impl From<Grade> for Graded {
    fn from(grade: Grade) -> Graded {
        Graded { grade, reason: None }
    }
}

/// A grade with no reason attached is the bare grade.
impl PartialEq<Grade> for Graded {
    fn eq(&self, g: &Grade) -> bool {
        self.grade == *g && self.reason.is_none()
    }
}

/// One memory tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TierAuthority {
    /// The authority of `boundary`.
    pub grade: Graded,
    /// Bytes; None only when not observed.
    pub boundary: Option<u64>,
    /// The observed peak and how it was observed.
    pub peak: Option<u64>,
    pub peak_grade: Graded,
    /// boundary − peak (signed); None where there is no independent boundary.
    pub margin: Option<i64>,
    /// The physical ceiling, recorded separately from the boundary (host MemTotal, board size).
    pub ceiling: Option<u64>,
    pub ceiling_margin: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AuthorityVector {
    pub host: TierAuthority,
    pub gpu: TierAuthority,
}

fn diff(a: u64, b: u64) -> i64 {
    (a as i128 - b as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Host: hard limit when one was set, else the instrumented high-water mark itself; MemTotal as
/// the physical ceiling. GPU: the declared allowance as a sampled audit, else the board size as
/// a physical ceiling; not observed without NVML.
pub fn authority(host: &HostReport, gpu: &GpuAudit, gpu_declared: Option<u64>) -> AuthorityVector {
    let (peak, peak_grade) = match host.kernel_peak {
        Some(p) => (p, Grade::HighWaterMark),
        None => (host.sampled_peak, Grade::SampledAudit),
    };
    let host_tier = TierAuthority {
        grade: if host.limit.is_some() { Grade::HardLimit } else { peak_grade }.into(),
        boundary: Some(host.limit.unwrap_or(peak)),
        peak: Some(peak),
        peak_grade: peak_grade.into(),
        margin: host.limit.map(|l| diff(l, peak)),
        ceiling: host.mem_total,
        ceiling_margin: host.mem_total.map(|t| diff(t, peak)),
    };
    let gpu_tier = match gpu {
        GpuAudit::NotObserved { reason } => {
            let g = Graded::not_observed(reason.clone());
            TierAuthority { grade: g.clone(), boundary: None, peak: None, peak_grade: g, margin: None, ceiling: None, ceiling_margin: None }
        }
        GpuAudit::Observed(o) => {
            let (grade, boundary) = match gpu_declared {
                Some(d) => (Grade::SampledAudit, d),
                None => (Grade::PhysicalCeiling, o.total),
            };
            TierAuthority {
                grade: grade.into(),
                boundary: Some(boundary),
                peak: Some(o.used_peak),
                peak_grade: Grade::SampledAudit.into(),
                margin: Some(diff(boundary, o.used_peak)),
                ceiling: Some(o.total),
                ceiling_margin: Some(diff(o.total, o.used_peak)),
            }
        }
    };
    AuthorityVector { host: host_tier, gpu: gpu_tier }
}

/// One conjunct of the admission predicate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Conjunct {
    pub name: String,
    pub passed: bool,
    pub value: String,
}

/// One run's admission: the predicate over what bounded its memory tiers, conjunct by
/// conjunct (a campaign's verdict on a cell is `campaign::admission::CellAdmission`). A record
/// carries `failed` beside the conjuncts for its readers; it is written from the conjuncts and
/// ignored when read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(into = "AdmissionRecord")]
pub struct RunAdmission {
    pub admitted: bool,
    pub conjuncts: Vec<Conjunct>,
}

impl RunAdmission {
    /// Adds a conjunct about the run itself: a failed run is never admitted.
    pub fn require_run(&mut self, name: &str, passed: bool, value: String) {
        if !passed {
            self.admitted = false;
        }
        self.conjuncts.insert(0, Conjunct { name: name.to_string(), passed, value });
    }

    /// The conjuncts that failed, in order.
    pub fn failing(&self) -> impl Iterator<Item = &Conjunct> {
        self.conjuncts.iter().filter(|x| !x.passed)
    }

    /// `name: value` of every failed conjunct, e.g. `limit events: 33481`.
    pub fn failed(&self) -> Vec<String> {
        self.failing().map(|x| format!("{}: {}", x.name, x.value)).collect()
    }
}

/// [`RunAdmission`] as a record serializes it.
#[derive(Serialize)]
struct AdmissionRecord {
    admitted: bool,
    conjuncts: Vec<Conjunct>,
    failed: Vec<String>,
}

impl From<RunAdmission> for AdmissionRecord {
    fn from(a: RunAdmission) -> AdmissionRecord {
        let failed = a.failed();
        AdmissionRecord { admitted: a.admitted, conjuncts: a.conjuncts, failed }
    }
}

/// Evaluates the predicate. A run without a hard host limit cannot show a positive margin below
/// one and is not admitted. Without a GPU and without a declared GPU allowance the GPU
/// conjuncts hold vacuously (said so in their value); with a declared allowance they need an
/// observation.
pub fn admission(host: &HostReport, gpu: &GpuAudit, auth: &AuthorityVector, gpu_declared: Option<u64>) -> RunAdmission {
    admission_with_budget(host, gpu, auth, gpu_declared, None, None)
}

/// The predicate with the device-margin conjunct of a `--gpu-budget`: the device's memory
/// stays below the budget, audited hard by the RPC device server's own cgroup (its kernel peak)
/// where there is one, else by NVML samples of the run's own processes. Not observed fails it.
pub fn admission_with_budget(
    host: &HostReport,
    gpu: &GpuAudit,
    auth: &AuthorityVector,
    gpu_declared: Option<u64>,
    gpu_budget: Option<u64>,
    device: Option<&super::DeviceAudit>,
) -> RunAdmission {
    let mut c = Vec::new();
    let mut push = |name: &str, passed: bool, value: String| c.push(Conjunct { name: name.to_string(), passed, value });

    match (host.limit, auth.host.margin) {
        (Some(l), Some(m)) => push("host margin", m > 0, format!("{m} bytes below the {l}-byte limit")),
        _ => push("host margin", false, "no hard host limit (accounting-only run)".to_string()),
    }
    push("limit events", host.limit_events == 0, host.limit_events.to_string());
    match host.oom_events {
        Some(n) => push("oom events", n == 0 && !host.under_oom_seen, n.to_string()),
        None => push(
            "oom events",
            !host.under_oom_seen,
            if host.under_oom_seen { "under_oom seen".into() } else { "under_oom never seen (v1 keeps no count)".into() },
        ),
    }
    push("oom kills", host.oom_kills == 0, host.oom_kills.to_string());
    match host.swap.peak {
        Some(p) => push("swap", p == 0, format!("{p} bytes")),
        None => push("swap", false, format!("not observed ({})", host.swap.note)),
    }
    match gpu {
        GpuAudit::Observed(o) => {
            let pids: Vec<String> = o.foreign.iter().map(|f| f.pid.to_string()).collect();
            let mut uniq = pids.clone();
            uniq.sort();
            uniq.dedup();
            let v = if uniq.is_empty() { "0".to_string() } else { format!("{} (pids {})", uniq.len(), uniq.join(", ")) };
            push("foreign compute processes", uniq.is_empty(), v);
            if gpu_declared.is_some() {
                let m = auth.gpu.margin.unwrap_or(0);
                push("gpu margin", m > 0, format!("{m} bytes below the declared allowance"));
            }
        }
        GpuAudit::NotObserved { reason } => {
            let declared = gpu_declared.is_some();
            let v = if declared { format!("not observed ({reason})") } else { format!("none declared; GPU not observed ({reason})") };
            push("foreign compute processes", !declared, v.clone());
            if declared {
                push("gpu margin", false, v);
            }
        }
    }
    if let (Some(b), Some(d)) = (gpu_budget, device) {
        match d.peak {
            Some(p) => push(
                "device margin",
                p < b && d.oom_kills == 0,
                format!("{} bytes below the {b}-byte budget (device server cgroup peak, hard; {} OOM kills)", diff(b, p), d.oom_kills),
            ),
            None => push("device margin", false, format!("the device server's cgroup {} keeps no peak", d.cgroup)),
        }
    } else if let Some(b) = gpu_budget {
        match gpu {
            GpuAudit::Observed(o) => match o.run_used_peak {
                Some(p) => push("device margin", p < b, format!("{} bytes below the {b}-byte budget (run's own, sampled)", diff(b, p))),
                None => push("device margin", false, "NVML did not report the run's own device memory".to_string()),
            },
            GpuAudit::NotObserved { reason } => push("device margin", false, format!("not observed ({reason})")),
        }
    }
    RunAdmission { admitted: c.iter().all(|x| x.passed), conjuncts: c }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::gpu::{ForeignProcess, GpuObservation};
    use crate::observe::{HostReport, SwapReport};

    const GIB: u64 = 1 << 30;

    fn host(limit: Option<u64>, peak: u64, events: u64) -> HostReport {
        HostReport {
            limit,
            kernel_peak: Some(peak),
            sampled_peak: peak - 4096,
            limit_events: events,
            mem_total: Some(16_667_594_752),
            swap: SwapReport { accounted: true, peak: Some(0), end: Some(0), events: None, note: String::new() },
            ..HostReport::default()
        }
    }

    fn board(used_peak: u64, foreign: Vec<u32>) -> GpuAudit {
        GpuAudit::Observed(GpuObservation {
            boards: vec![],
            total: 25_769_803_776,
            samples: 10,
            interval_ms: 50.0,
            used_start: 0,
            used_peak,
            used_end: 0,
            used_peak_per_board: vec![used_peak],
            run_processes: vec![],
            run_used_peak: Some(0),
            foreign: foreign
                .into_iter()
                .map(|pid| ForeignProcess { pid, board: 0, comm: None, cgroup: "/".into(), max_used: None, samples: 1 })
                .collect(),
            foreign_max_concurrent: 0,
            sample_errors: 0,
            last_error: None,
        })
    }

    /// The names of the conjuncts that failed, in order.
    fn failing(adm: &RunAdmission) -> Vec<&str> {
        adm.failing().map(|c| c.name.as_str()).collect()
    }

    /// Whether the conjunct `name` passed, and its value.
    fn value<'a>(adm: &'a RunAdmission, name: &str) -> (bool, &'a str) {
        let c = adm.conjuncts.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no conjunct {name}: {adm:?}"));
        (c.passed, c.value.as_str())
    }

    /// A record's `failed` is the failing conjuncts as `name: value`, written from them and
    /// ignored when read back; a run's own conjunct counts like any other.
    #[test]
    fn failed_is_written_from_the_conjuncts() {
        let h = host(Some(11 * GIB), 11 * GIB, 7);
        let g = board(20 * GIB, vec![]);
        let mut adm = admission(&h, &g, &authority(&h, &g, None), None);
        adm.require_run("worker exited 0", false, "Exited { code: 3 }".into());
        assert!(!adm.admitted);
        assert_eq!(failing(&adm), ["worker exited 0", "host margin", "limit events"]);
        let json = serde_json::to_value(&adm).unwrap();
        assert_eq!(json["failed"], serde_json::json!(adm.failed()));
        assert_eq!(adm.failed()[2], "limit events: 7");
        let mut stale = json.clone();
        stale["failed"] = serde_json::json!(["nothing: at all"]);
        let back: RunAdmission = serde_json::from_value(stale).unwrap();
        assert_eq!(back, adm);
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
    }

    /// The seed's P cell: it reaches the 11 GiB ceiling and advances memory.max 33,481 times.
    #[test]
    fn seed_p_cell_fails_d_cell_passes() {
        let p = host(Some(11 * GIB), 11 * GIB, 33481);
        let g = board(20 * GIB, vec![]);
        let a = authority(&p, &g, Some(23 * GIB));
        assert_eq!(a.host.grade, Grade::HardLimit);
        assert_eq!(a.host.margin, Some(0));
        assert_eq!(a.gpu.grade, Grade::SampledAudit);
        assert_eq!(a.gpu.margin, Some(3 * GIB as i64));
        assert_eq!(a.gpu.ceiling, Some(25_769_803_776));
        let adm = admission(&p, &g, &a, Some(23 * GIB));
        assert!(!adm.admitted);
        assert_eq!(value(&adm, "limit events"), (false, "33481"), "{adm:?}");

        let d = host(Some(11 * GIB), 9 * GIB, 0);
        let a = authority(&d, &g, Some(23 * GIB));
        let adm = admission(&d, &g, &a, Some(23 * GIB));
        assert!(adm.admitted && adm.failing().next().is_none(), "{adm:?}");
        assert_eq!(a.host.margin, Some(2 * GIB as i64));
    }

    #[test]
    fn foreign_swap_oom_and_no_limit_fail() {
        let d = host(Some(11 * GIB), 9 * GIB, 0);
        let g = board(20 * GIB, vec![4242]);
        let adm = admission(&d, &g, &authority(&d, &g, None), None);
        assert_eq!(failing(&adm), ["foreign compute processes"]);
        assert_eq!(value(&adm, "foreign compute processes"), (false, "1 (pids 4242)"));

        let mut h = host(Some(11 * GIB), 9 * GIB, 0);
        h.swap.peak = Some(8192);
        h.oom_kills = 1;
        h.oom_events = Some(1);
        let g = GpuAudit::NotObserved { reason: "NVML unavailable: x".into() };
        let a = authority(&h, &g, None);
        assert_eq!(a.gpu.grade, Graded::not_observed("NVML unavailable: x".into()));
        assert_eq!(a.gpu.boundary, None);
        let adm = admission(&h, &g, &a, None);
        assert_eq!(failing(&adm), ["oom events", "oom kills", "swap"]);
        assert_eq!([value(&adm, "oom events").1, value(&adm, "oom kills").1], ["1", "1"]);
        // A declared GPU allowance that cannot be audited fails.
        let adm = admission(&d, &g, &authority(&d, &g, Some(GIB)), Some(GIB));
        assert_eq!(failing(&adm), ["foreign compute processes", "gpu margin"]);

        let free = host(None, 9 * GIB, 0);
        let a = authority(&free, &g, None);
        assert_eq!(a.host.grade, Grade::HighWaterMark);
        assert_eq!(a.host.boundary, Some(9 * GIB));
        assert_eq!(a.host.margin, None);
        assert_eq!(a.host.ceiling_margin, Some(16_667_594_752 - 9 * GIB as i64));
        let adm = admission(&free, &g, &a, None);
        assert_eq!(failing(&adm), ["host margin"]);
    }

    /// `--gpu-budget`: the run's own sampled device memory must stay below it; a board-wide
    /// number never stands in for it, and not observed fails.
    #[test]
    fn device_margin_is_the_runs_own_usage_below_the_budget() {
        let d = host(Some(11 * GIB), 9 * GIB, 0);
        let own = |peak: Option<u64>| match board(20 * GIB, vec![]) {
            GpuAudit::Observed(mut o) => {
                o.run_used_peak = peak;
                GpuAudit::Observed(o)
            }
            g => g,
        };
        let check = |g: &GpuAudit, budget| admission_with_budget(&d, g, &authority(&d, g, None), None, budget, None);
        assert!(check(&own(Some(3 * GIB)), Some(4 * GIB)).admitted);
        // The board's 20 GiB is foreign to the run: only the run's own 3 GiB counts.
        let adm = check(&own(Some(4 * GIB)), Some(4 * GIB));
        assert_eq!(failing(&adm), ["device margin"]);
        assert!(value(&adm, "device margin").1.contains("(run's own, sampled)"), "{adm:?}");
        assert_eq!(failing(&check(&own(None), Some(4 * GIB))), ["device margin"]);
        let none = GpuAudit::NotObserved { reason: "NVML unavailable: x".into() };
        let adm = check(&none, Some(GIB));
        assert_eq!(failing(&adm), ["device margin"]);
        assert!(value(&adm, "device margin").1.contains("NVML unavailable: x"), "{adm:?}");
        // Without a budget there is no such conjunct.
        assert!(check(&own(Some(30 * GIB)), None).conjuncts.iter().all(|c| c.name != "device margin"));
    }
}
