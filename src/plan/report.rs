//! What an expert source puts on record: its description before the run (`params.experts`)
//! and its report after it (`experts`), the Plan's typed in full, another source's as its name
//! and counts. The engine's `ExpertSource` returns these, so a record reads them typed.

use super::coverage::CoverageReport;
use super::options::SourceKind;
use super::telemetry::{Closure, Telemetry};
use super::timeline::TimelineReport;
use crate::source::fault::{Expect, FaultCell};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What an expert source is, for the record's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceDescription {
    Plan(PlanDescription),
    Other(OtherSource),
}

/// How an expert source closed after the run, for the record.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceReport {
    Plan(Box<PlanReport>),
    Other(OtherSource),
}

/// A source other than the Plan as a record states it: its name, and the settings or counts it
/// gives (`{"source": "reread", "slots": 4}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherSource {
    pub source: String,
    #[serde(flatten)]
    pub counts: BTreeMap<String, u64>,
}

impl OtherSource {
    pub fn new(source: &str, counts: &[(&str, u64)]) -> OtherSource {
        OtherSource { source: source.to_string(), counts: counts.iter().map(|&(k, v)| (k.to_string(), v)).collect() }
    }
}

/// `"mode": "plan"`: what marks a source description as the Plan's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanMode {
    #[default]
    Plan,
}

/// The Plan as a run's parameters name it (`plan zero, 4 slots, source F`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDescription {
    pub mode: PlanMode,
    pub slots: u32,
    pub layer_buffers: u32,
    pub policy: String,
    pub source: SourceKind,
    pub windows: u64,
    pub window_bytes: u64,
    /// Reads in flight (source F only).
    pub depth: Option<u32>,
    /// Where windows and depth came from: the flags, or the manifest (absent in earlier records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizing: Option<super::options::Sizing>,
    /// Distinct experts per engine pass of a one-token ubatch, when decode is streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_pass: Option<u32>,
    /// The same for a ubatch of several tokens, when prompts are streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pass: Option<u32>,
    /// Slots and policy sized from a budget, with every term (absent: given, or the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::budget::BudgetSizing>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestReport {
    pub objects: u64,
    pub managed_bytes: u64,
    pub window_bytes: u64,
    pub slots_per_layer: u32,
    pub layer_buffers: u32,
    pub slot_pool_bytes: u64,
}

/// Window → slot copies (host-to-device where a pool is on a device), each observed complete
/// before its slot became DeviceReady.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyReport {
    pub devices: BTreeSet<String>,
    pub bytes: u64,
    pub seconds: f64,
    /// Devices whose pools copy asynchronously (a copy stream of their own, an event per copy,
    /// the slot DeviceReady only once its event completed), and those that copy synchronously
    /// (no asynchronous set or events: the CPU, plain host memory).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub asynchronous: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub synchronous: BTreeSet<String>,
    /// Copies queued with an event, time blocked on those events, and the time from queueing
    /// to each event seen complete (summed over bundles).
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub async_copies: u64,
    #[serde(default, skip_serializing_if = "crate::util::is_zero_f64")]
    pub wait_seconds: f64,
    #[serde(default, skip_serializing_if = "crate::util::is_zero_f64")]
    pub in_flight_seconds: f64,
}

/// The names of a step's four times.
pub const STEP_FIELDS: [&str; 4] = ["read_s", "copy_s", "compute_s", "exposed_wait_s"];

/// The four times of a step: in source reads, in window → slot copies, computing, and
/// waiting on the source where nothing else ran. Written as an array in `fields` order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "[f64; 4]", into = "[f64; 4]")]
pub struct StepTimes {
    pub read_s: f64,
    pub copy_s: f64,
    pub compute_s: f64,
    pub exposed_wait_s: f64,
}

impl From<[f64; 4]> for StepTimes {
    fn from([read_s, copy_s, compute_s, exposed_wait_s]: [f64; 4]) -> StepTimes {
        StepTimes { read_s, copy_s, compute_s, exposed_wait_s }
    }
}

impl From<StepTimes> for [f64; 4] {
    fn from(t: StepTimes) -> [f64; 4] {
        [t.read_s, t.copy_s, t.compute_s, t.exposed_wait_s]
    }
}

impl std::ops::AddAssign for StepTimes {
    fn add_assign(&mut self, o: StepTimes) {
        self.read_s += o.read_s;
        self.copy_s += o.copy_s;
        self.compute_s += o.compute_s;
        self.exposed_wait_s += o.exposed_wait_s;
    }
}

/// Per step (one ubatch through the model, from its first MoE acquire) and in total: its
/// [`StepTimes`], named by `fields`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepsReport {
    pub fields: Vec<String>,
    pub total: Option<StepTimes>,
    pub per_step: Vec<StepTimes>,
    /// Per step, the logical bytes read and its tokens (absent in earlier records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_bytes: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<u64>,
}

/// The prompt: the leading steps of more than one token, their bytes read, bytes per prompt
/// token and [read, copy, compute, exposed wait] summed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillReport {
    pub steps: u64,
    pub tokens: u64,
    pub read_bytes: u64,
    pub bytes_per_token: f64,
    pub read_s: f64,
    pub copy_s: f64,
    pub compute_s: f64,
    pub exposed_wait_s: f64,
}

impl PrefillReport {
    /// From the per-step figures: the first `prompt_steps` where the run said where its prompt
    /// ended, else the leading steps of more than one token; `None` when the run began with a
    /// one-token step.
    pub fn of(per_step: &[StepTimes], bytes: &[u64], tokens: &[u64], prompt_steps: Option<usize>) -> Option<PrefillReport> {
        let leading = tokens.iter().take_while(|&&t| t > 1).count();
        let n = prompt_steps.map_or(leading, |p| p.min(leading)).min(per_step.len()).min(bytes.len());
        if n == 0 {
            return None;
        }
        let mut sum = StepTimes::default();
        for &s in &per_step[..n] {
            sum += s;
        }
        let (tokens, read_bytes) = (tokens[..n].iter().sum::<u64>(), bytes[..n].iter().sum::<u64>());
        Some(PrefillReport {
            steps: n as u64,
            tokens,
            read_bytes,
            bytes_per_token: read_bytes as f64 / tokens as f64,
            read_s: sum.read_s,
            copy_s: sum.copy_s,
            compute_s: sum.compute_s,
            exposed_wait_s: sum.exposed_wait_s,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultReport {
    pub cell: FaultCell,
    pub expect: Expect,
    pub invariant: String,
    pub fired: u64,
    pub log: Vec<String>,
}

/// Seed 000 eq. (5): M_source <= N_w * W + M_queue + M_meta, with our values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceBound {
    pub n_windows: u64,
    pub window_bytes: u64,
    pub windows_bytes: u64,
    /// Where the windows live: `pinned (<host buffer type>)` when the offload device offers
    /// one, else `aligned mapping (<why>)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows_memory: Option<String>,
    pub queue_entries: u32,
    pub plan_struct_bytes: u64,
}

/// The Plan's telemetry and closure after a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    pub manifest: ManifestReport,
    pub telemetry: Telemetry,
    pub closure: Closure,
    pub clean_closure: bool,
    pub selections: CoverageReport,
    pub exposed_source_wait_s: f64,
    pub copy: CopyReport,
    pub steps: StepsReport,
    /// The prompt's share of the steps (absent in earlier records and where the run began with
    /// a one-token step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PrefillReport>,
    pub acquire_calls: u64,
    pub uring_registered_buffers: Option<bool>,
    pub fault: FaultReport,
    pub m_source_bound: SourceBound,
    /// Where each decode token's time went (absent in records made before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<TimelineReport>,
}

#[cfg(test)]
mod tests {
    use super::{PrefillReport, StepTimes, STEP_FIELDS};

    #[test]
    fn step_times_are_written_as_the_arrays_records_hold_in_field_order() {
        let t = StepTimes { read_s: 1.5, copy_s: 2.5, compute_s: 3.5, exposed_wait_s: 4.5 };
        let v = serde_json::to_value(t).unwrap();
        assert_eq!(v, serde_json::json!([1.5, 2.5, 3.5, 4.5]));
        assert_eq!(serde_json::from_value::<StepTimes>(v).unwrap(), t);
        assert_eq!(STEP_FIELDS, ["read_s", "copy_s", "compute_s", "exposed_wait_s"]);
    }

    #[test]
    fn the_prefill_is_the_leading_steps_of_more_than_one_token() {
        let steps = [[1.0, 0.5, 2.0, 0.25], [3.0, 0.0, 4.0, 1.0], [9.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]].map(StepTimes::from);
        let p = PrefillReport::of(&steps, &[100, 300, 5, 50], &[512, 88, 1, 4], None).unwrap();
        assert_eq!((p.steps, p.tokens, p.read_bytes), (2, 600, 400));
        assert_eq!((p.read_s, p.copy_s, p.compute_s, p.exposed_wait_s), (4.0, 0.5, 6.0, 1.25));
        assert_eq!(p.bytes_per_token, 400.0 / 600.0);
        // A run that begins with one token has no prefill.
        assert_eq!(PrefillReport::of(&steps, &[1, 2, 3, 4], &[1, 512, 1, 1], None), None);
        assert_eq!(PrefillReport::of(&[], &[], &[], None), None);
        // A drafted run's traversals after its prompt feed several tokens each: not prefill.
        let p = PrefillReport::of(&steps, &[100, 300, 5, 50], &[512, 88, 5, 4], Some(2)).unwrap();
        assert_eq!((p.steps, p.tokens, p.read_bytes), (2, 600, 400));
    }
}
