//! The typed records: what `record.json` says for a `generate` run (`sovereign.generate/1`)
//! and a `refine` run (`sovereign.refine/1`), written and read through serde.
//!
//! Field names and shapes are the records' own since their first format: fields a run may
//! lack are `Option`, absent from the file where they always were. Records are written through
//! a JSON value, so keys stay sorted (`Staging::commit`).

use super::{Surface, RECORD_FILE};
use crate::exec::{ExecParams, PlacementReport};
use crate::identity::BuildIdentity;
use crate::inventory::Inventory;
use crate::observe::ContainedRun;
use crate::plan::report::{OtherSource, PlanDescription, PlanReport, SourceDescription, SourceReport};
use crate::plan::PlanOptions;
use anyhow::{bail, Context, Result};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The format of a `generate` record.
pub const GENERATE_FORMAT: &str = "sovereign.generate/1";
/// The format of a `refine` record.
pub const REFINE_FORMAT: &str = "sovereign.refine/1";
/// The format of an `envelope` measurement cell's record.
pub const ENVELOPE_FORMAT: &str = "sovereign.envelope/1";
/// The format of a `read_replay` measurement cell's record.
pub const READ_REPLAY_FORMAT: &str = "sovereign.read_replay/1";
/// The format of a session's record (many requests through one process).
pub const SESSION_FORMAT: &str = "sovereign.session/1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Failed,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub load_s: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
}

/// A drafted run's proposer: the model whose greedy drafts the target checks (for an MTP head,
/// the target itself), and how many drafts one traversal checks at most.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftParams {
    pub model: ModelIdentity,
    pub draft_max: u32,
    #[serde(default)]
    pub proposer: ProposerKind,
    /// The MTP head's layer index (its nextn block, after the trunk's layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_layer: Option<u32>,
}

/// What drafted: another model, or the target's own multi-token-prediction head.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposerKind {
    #[default]
    Model,
    Mtp,
}

/// Temporal amortization as a run saw it (seed 000 §3.5): target traversals against the
/// outputs they committed, what the proposer offered and the target accepted at each draft
/// position, what was taken back, and the target's expert bytes per committed output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpeculativeReport {
    pub draft_max: u32,
    /// Target decodes after the prompt's: each fed the last committed token and its drafts.
    pub traversals: u64,
    /// Outputs committed by traversals (the first output comes from the prompt's decode).
    pub outputs: u64,
    pub outputs_per_traversal: f64,
    pub drafted: u64,
    pub accepted: u64,
    /// Per draft position (1..=draft_max): traversals that offered a draft there, and those
    /// that accepted it.
    pub offered_by_position: Vec<u64>,
    pub accepted_by_position: Vec<u64>,
    pub proposer_decodes: u64,
    pub proposer_s: f64,
    /// Where the two vocabularies differ in size (padding): drafts that stopped at a token the
    /// target's vocabulary lacks, and (once) the target committing one the proposer's lacks,
    /// after which the run went on one token per traversal.
    #[serde(default)]
    pub out_of_vocabulary: u64,
    /// Traversals that took rejected positions back, and the positions taken back.
    pub rollbacks: u64,
    pub rolled_back_positions: u64,
    /// Of those rollbacks, the ones that took back recurrent states too (hybrid or recurrent
    /// memory, through the per-position states the context keeps).
    pub state_rollbacks: u64,
    /// Rollbacks of a recurrent target whose architecture keeps no per-position states: the
    /// state before the traversal restored, and the committed positions fed again (one more
    /// target decode each).
    pub state_restores: u64,
    pub refed_positions: u64,
    /// The state ledger of a target with recurrent state (seed 000 A.1): every traversal
    /// stages a state for each position it feeds, commits the winner (the state after its last
    /// committed position) and rebases the others, the losers, onto it.
    #[serde(default)]
    pub state_stages: u64,
    #[serde(default)]
    pub winner_commits: u64,
    #[serde(default)]
    pub loser_rebases: u64,
    /// Distinct experts a layer selected in one traversal, averaged over layers and traversals
    /// (the union a streamed target reads).
    pub mean_union_experts: f64,
    /// Expert bytes the target's source read during the traversals (absent: resident target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_bytes_per_output: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_bytes_per_traversal: Option<f64>,
    /// Of `expert_bytes`, those read for the proposer's decodes (an MTP head's experts come
    /// from the target's source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposer_expert_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// The file, or a shard set's first file.
    pub file: String,
    /// The whole file's SHA-256, from its digest manifest; for a shard set, the set's
    /// (`gguf::set::set_sha256` of `shards`).
    pub sha256: String,
    /// A shard set's files in order, each with its SHA-256 (absent: one file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<ShardIdentity>>,
    pub bytes: u64,
    pub architecture: String,
    pub t_repr_bytes: u64,
    pub expert_bytes: u64,
    /// The digest manifest the run verified its bytes against (absent in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digests: Option<crate::digests::Provenance>,
}

/// One file of a shard set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardIdentity {
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
}

impl ModelIdentity {
    /// The identity a record names the model file `path` (already inventoried as `inv`) by:
    /// its digest manifest (cached while the file's identity is unchanged, built otherwise),
    /// and the ranges llama.cpp is about to load, `loads` (None: the run does not load it),
    /// checked against it.
    pub fn of(path: &Path, inv: &Inventory, loads: Option<crate::digests::Loads>) -> Result<ModelIdentity> {
        let o = crate::digests::obtain(path, inv, None)?;
        let mut provenance = o.provenance;
        provenance.load_check = loads.map(|l| crate::digests::check_load(inv, &o.digests, l)).transpose()?;
        let shards = inv.is_set().then(|| {
            inv.shards
                .iter()
                .zip(&o.digests.files)
                .map(|(s, f)| ShardIdentity { file: s.file.clone(), sha256: f.body.sha256.clone(), bytes: s.bytes })
                .collect()
        });
        Ok(ModelIdentity {
            file: inv.file.clone(),
            sha256: o.digests.sha256.clone(),
            shards,
            bytes: inv.file_bytes,
            architecture: inv.architecture.clone(),
            t_repr_bytes: inv.t_repr_bytes,
            expert_bytes: inv.expert_bytes,
            digests: Some(provenance),
        })
    }
}

/// What the run's process held at its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    pub vm_hwm_bytes: Option<u64>,
}

impl ProcessReport {
    pub fn now() -> ProcessReport {
        ProcessReport { vm_hwm_bytes: crate::observe::procs::own_hwm() }
    }
}

/// What bounded each memory tier of a contained run, and its admission.
pub type Resources = ContainedRun;

/// `"resident"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resident {
    Resident,
}

/// Where a run's experts came from (`params.experts`): resident, the Plan, or another
/// source by its name and counts.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpertsParams {
    Resident,
    Plan(PlanDescription),
    Other(OtherSource),
}

impl From<SourceDescription> for ExpertsParams {
    fn from(d: SourceDescription) -> ExpertsParams {
        match d {
            SourceDescription::Plan(d) => ExpertsParams::Plan(d),
            SourceDescription::Other(o) => ExpertsParams::Other(o),
        }
    }
}

impl ExpertsParams {
    /// `params.experts` as a record stores it.
    fn of_value(v: Value) -> Result<ExpertsParams, serde_json::Error> {
        Ok(if v == "resident" {
            ExpertsParams::Resident
        } else if v.get("mode").and_then(Value::as_str) == Some("plan") {
            ExpertsParams::Plan(serde_json::from_value(v)?)
        } else {
            ExpertsParams::Other(serde_json::from_value(v)?)
        })
    }

    pub fn plan(&self) -> Option<&PlanDescription> {
        match self {
            ExpertsParams::Plan(d) => Some(d),
            _ => None,
        }
    }
}

impl Serialize for ExpertsParams {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ExpertsParams::Resident => Resident::Resident.serialize(s),
            ExpertsParams::Plan(d) => d.serialize(s),
            ExpertsParams::Other(o) => o.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ExpertsParams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ExpertsParams::of_value(Value::deserialize(d)?).map_err(|e| D::Error::custom(format!("params.experts: {e}")))
    }
}

/// How a run's expert source closed (`experts`): the Plan's report, the error of a source that
/// did not close, or another source's name and counts.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpertsReport {
    Plan(Box<PlanReport>),
    FinishError(String),
    Other(OtherSource),
}

impl From<SourceReport> for ExpertsReport {
    fn from(r: SourceReport) -> ExpertsReport {
        match r {
            SourceReport::Plan(r) => ExpertsReport::Plan(r),
            SourceReport::Other(o) => ExpertsReport::Other(o),
        }
    }
}

impl ExpertsReport {
    /// `experts` as a record stores it.
    fn of_value(v: Value) -> Result<ExpertsReport, serde_json::Error> {
        let finish_error = v.as_object().filter(|o| o.len() == 1).and_then(|o| o.get("finish_error")).and_then(Value::as_str);
        Ok(if let Some(e) = finish_error {
            ExpertsReport::FinishError(e.to_string())
        } else if v.get("manifest").is_some() {
            ExpertsReport::Plan(Box::new(serde_json::from_value(v)?))
        } else {
            ExpertsReport::Other(serde_json::from_value(v)?)
        })
    }

    pub fn plan(&self) -> Option<&PlanReport> {
        match self {
            ExpertsReport::Plan(r) => Some(r),
            _ => None,
        }
    }
}

#[derive(Serialize)]
struct FinishError<'a> {
    finish_error: &'a str,
}

impl Serialize for ExpertsReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ExpertsReport::Plan(r) => r.serialize(s),
            ExpertsReport::FinishError(e) => FinishError { finish_error: e }.serialize(s),
            ExpertsReport::Other(o) => o.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ExpertsReport {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ExpertsReport::of_value(Value::deserialize(d)?).map_err(|e| D::Error::custom(format!("experts: {e}")))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateParams {
    pub n_predict: u32,
    pub ignore_eos: bool,
    pub experts: ExpertsParams,
    pub sampling: String,
    #[serde(flatten)]
    pub exec: ExecParams,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementReport>,
    /// The proposer of a drafted run (absent: one token per target decode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftParams>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerateCounts {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub logits_rows: usize,
    pub n_vocab: usize,
    pub route_events: usize,
    pub route_k: usize,
    /// `n_predict`, `end_of_generation`, or `failed`.
    pub stop: String,
}

/// `record.json` of a `generate` run. A contained run that failed before its worker wrote a
/// record has only `format`, `outcome`, `error`, `build`, `surfaces` and what the container
/// adds (`resources`, `cache_protocol`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRecord {
    pub format: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelIdentity>,
    pub build: BuildIdentity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<GenerateParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<GenerateCounts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    /// The source's report: null for a resident run and for a source that never finished;
    /// absent where the worker wrote no record.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub experts: Option<Option<ExpertsReport>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessReport>,
    #[serde(default)]
    pub surfaces: BTreeMap<String, Surface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_protocol: Option<String>,
    /// A drafted run's traversals, acceptance and bytes per output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeReport>,
}

/// What a run decodes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Base generates, verifier checks windows (the runtime).
    Refine,
    /// The base alone: the zero-bytes endpoint.
    Base,
    /// The verifier alone, greedy and incremental: the quality ceiling, one pass per token.
    Verifier,
}

/// Per-run counters of the runtime.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Verifier passes (teacher-forcing sweeps; decode steps in verifier mode).
    pub sweeps: u64,
    pub rollbacks: u64,
    /// Base decisions flagged for checking (margin under τ, or all with verify-all).
    pub deferred: u64,
    /// Deferred decisions the verifier actually checked.
    pub checked: u64,
    /// Tokens the verifier was fed (prefill and suffixes).
    pub verifier_tokens: u64,
    /// Base decode passes (prompt prefill counts one).
    pub base_passes: u64,
}

/// The quality of a refinement run's outputs under the reference (seed 001 §5.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    /// Mean over every output token of every prompt, natural log.
    pub mean_logprob: f64,
    pub per_prompt: Vec<f64>,
    pub tokens: usize,
    /// Share of output tokens that are the reference's own greedy choice at that position.
    pub reference_agreement: f64,
    pub reference_streamed: bool,
}

/// The verifier of a refinement run: resident, or streamed through the Plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VerifierParams {
    Resident(Resident),
    Streamed { streamed: PlanOptions },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefineParams {
    pub mode: Mode,
    pub tau: f32,
    pub window: u32,
    pub verify_all: bool,
    pub n_predict: u32,
    pub prompts: usize,
    pub sampling: String,
    pub verifier: VerifierParams,
    pub exec: ExecParams,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefineCounts {
    pub prompts: usize,
    /// None when the run failed.
    pub prompt_tokens: Option<usize>,
    pub prompt_tokens_each: Vec<usize>,
    pub generated_tokens: usize,
    pub n_vocab: usize,
}

/// What verification cost (seed 001): logical bytes per sweep over the verifier checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefineReport {
    pub counters: Counters,
    pub verification_bytes_logical: u64,
    pub verification_bytes_per_token: f64,
    pub verifier_bytes: u64,
    pub bytes_per_token_over_verifier: f64,
    pub rollbacks_per_token: f64,
    /// What the streamed verifier actually read from storage (its routed experts only).
    pub served_bytes_per_token: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefineTiming {
    pub load_s: f64,
    pub generate_s: f64,
    pub tokens_per_s: f64,
}

/// `record.json` of a `refine` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefineRecord {
    pub format: String,
    pub outcome: Outcome,
    #[serde(default)]
    pub error: Option<String>,
    /// The base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelIdentity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier: Option<ModelIdentity>,
    /// Null when the run was not scored; absent where the worker wrote no record.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub reference: Option<Option<ModelIdentity>>,
    pub build: BuildIdentity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<RefineParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<RefineCounts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refine: Option<RefineReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<RefineTiming>,
    /// The streamed verifier's source report (null when resident).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub experts: Option<Option<ExpertsReport>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub quality: Option<Option<Quality>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessReport>,
    #[serde(default)]
    pub surfaces: BTreeMap<String, Surface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_protocol: Option<String>,
}

/// What an envelope cell measured: O_DIRECT io_uring reads of one block size at each depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvelopeParams {
    pub block_bytes: u64,
    pub depths: Vec<u32>,
    pub bytes_per_depth: u64,
    /// Bytes of memory the reads landed in (absent in earlier records: a buffer per read in
    /// flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_bytes: Option<u64>,
}

/// The best depth of an envelope cell: the device's read ceiling at that block size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvelopeBest {
    pub depth: u32,
    pub mib_per_s: f64,
}

/// `record.json` of an `envelope` cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvelopeRecord {
    pub format: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelIdentity>,
    pub build: BuildIdentity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<EnvelopeParams>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cells: Vec<crate::envelope::Cell>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<EnvelopeBest>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub surfaces: BTreeMap<String, Surface>,
}

/// What a read replay replayed: whose reads, through which Plan settings, at which depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadReplayParams {
    /// The arm whose record's routes were replayed, and that record's digest (its directory
    /// name when run outside a campaign).
    pub of_arm: String,
    pub of_record: String,
    /// The Plan settings the reads were derived with (the arm's own).
    pub plan: PlanOptions,
    /// Reads in flight during the replay.
    pub depth: u32,
    /// `fixed`; `envelope <digest>`, the record whose best depth this is; or the arm's own
    /// depth, where deeper than its block envelope's best.
    pub depth_from: String,
    /// Bytes of memory the reads landed in, each in the place written longest ago: the run's
    /// slot pools, up to the landing's cap (absent in earlier records: `depth` buffers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_bytes: Option<u64>,
}

/// Reads of one phase (prefill ubatches or decode tokens), replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayPhase {
    /// Ubatches of the phase (decode: one per decode token).
    pub steps: u64,
    pub reads: u64,
    pub logical_bytes: u64,
    /// Covering aligned bytes actually read.
    pub physical_bytes: u64,
    pub seconds: f64,
    /// `seconds / steps`.
    pub seconds_per_step: f64,
    /// Each step's read time.
    pub per_step_s: Vec<f64>,
    /// Each round's time where the sequence was read more than once: the phase is the
    /// fastest round's (absent in earlier records: one round).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds_s: Vec<f64>,
}

/// The replayed sequence against the run's own Plan telemetry (`q_run`): equal reads,
/// logical and physical bytes, or the replay failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayCheck {
    pub replayed: crate::plan::Traffic,
    pub run: crate::plan::Traffic,
    pub equal: bool,
}

/// `record.json` of a `read_replay` cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadReplayRecord {
    pub format: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelIdentity>,
    pub build: BuildIdentity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<ReadReplayParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<ReplayCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<ReplayPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<ReplayPhase>,
    /// The decode's reads again, each layer event's drained before the next layer's go out,
    /// as a run's router orders them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_by_layer: Option<ReplayPhase>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub surfaces: BTreeMap<String, Surface>,
}

impl ReadReplayRecord {
    /// Read seconds per decode token (None where the replay did not complete).
    pub fn decode_s_per_token(&self) -> Option<f64> {
        self.decode.as_ref().filter(|_| self.outcome == Outcome::Completed).map(|d| d.seconds_per_step)
    }

    /// Read seconds per decode token with a barrier after every layer event (None where the
    /// replay did not complete or has no such phase).
    pub fn decode_by_layer_s_per_token(&self) -> Option<f64> {
        self.decode_by_layer.as_ref().filter(|_| self.outcome == Outcome::Completed).map(|d| d.seconds_per_step)
    }

    /// The least read seconds per decode token any decode phase took, and which phase: each
    /// reads the same bytes from the same device, and the device's drift only ever adds time,
    /// so the fastest is the floor's read term (None where the replay did not complete).
    pub fn decode_floor_s_per_token(&self) -> Option<(f64, ReplayDecode)> {
        fastest_decode(self.decode_s_per_token(), self.decode_by_layer_s_per_token())
    }
}

/// Which decode phase of a read replay gave its floor's read term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayDecode {
    /// Each decode token's reads at once, at the replay's depth (its fastest round).
    #[default]
    Ubatch,
    /// Each layer event's reads drained before the next layer's go out.
    ByLayer,
}

/// The faster of a replay's two decode phases; the ubatch phase where they tie or the layer
/// phase is missing (records before it).
fn fastest_decode(ubatch: Option<f64>, by_layer: Option<f64>) -> Option<(f64, ReplayDecode)> {
    let u = ubatch?;
    Some(match by_layer {
        Some(l) if l < u => (l, ReplayDecode::ByLayer),
        _ => (u, ReplayDecode::Ubatch),
    })
}

/// `record.json` of a session: its requests in order (each a generate record of its own under
/// `requests/NNNN`, named here with its digest), what each took, and the source's ledger at
/// teardown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    pub format: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelIdentity>,
    pub build: BuildIdentity,
    /// What the source carried from each request to the next (resident runs carry nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<crate::session::Between>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ctx: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<SessionCounts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<SessionTiming>,
    #[serde(default)]
    pub requests: Vec<RequestEntry>,
    /// The mean task scores of the requests that named expected answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<crate::session::Aggregate>,
    /// The expert source's ledger at teardown (served runs): it must balance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closure: Option<crate::plan::Closure>,
    /// Requests, resets and epochs over the session (served runs): checked at teardown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<SessionLedger>,
    /// New Plans put in place of the one before a request, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub renewals: Vec<Renewal>,
    /// Every surface of every request's record, under `requests/NNNN/NAME` (its file's path in
    /// this record), so that two sessions compare request by request as two records do.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub surfaces: BTreeMap<String, Surface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_protocol: Option<String>,
}

/// A session's tokens, over the requests that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCounts {
    pub requests: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
}

/// A session's times: the model's load (once, or summed over separate processes) and every
/// request's readying and decoding (its request+reset wall time).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionTiming {
    pub load_s: f64,
    pub requests_wall_s: f64,
}

impl SessionRecord {
    /// A session's record before its requests: completed until something fails.
    pub fn begun(model: Option<ModelIdentity>, build: BuildIdentity, between: Option<crate::session::Between>) -> SessionRecord {
        SessionRecord {
            format: SESSION_FORMAT.into(),
            outcome: Outcome::Completed,
            error: None,
            model,
            build,
            between,
            n_ctx: None,
            counts: None,
            timing: None,
            requests: Vec::new(),
            scores: None,
            closure: None,
            ledger: None,
            renewals: Vec::new(),
            surfaces: BTreeMap::new(),
            resources: None,
            cache_protocol: None,
        }
    }

    /// The session failed closed, for `why`.
    pub fn fail(&mut self, why: String) {
        self.outcome = Outcome::Failed;
        self.error = Some(why);
    }

    /// A record of `requests` (each committed at `requests/NNNN` of `root`): its counts, its
    /// request+reset wall time, and every request's surfaces under its place.
    pub fn take_requests(&mut self, root: &Path, requests: Vec<RequestEntry>, load_s: f64) -> Result<()> {
        for r in &requests {
            let (_, surfaces) = super::load(&root.join(&r.record))?;
            for (name, mut s) in surfaces {
                s.file = format!("{}/{}", r.record, s.file);
                self.surfaces.insert(format!("{}/{name}", r.record), s);
            }
        }
        self.counts = Some(SessionCounts {
            requests: requests.len(),
            prompt_tokens: requests.iter().map(|r| r.prompt_tokens).sum(),
            generated_tokens: requests.iter().map(|r| r.generated_tokens).sum(),
        });
        self.timing = Some(SessionTiming { load_s, requests_wall_s: requests.iter().map(|r| r.wall_s).sum() });
        self.requests = requests;
        Ok(())
    }
}

/// The session's own closure: every request after the first was readied once, by a reset of
/// the Plan (cold ones counted too) or by a new Plan in its place (a renewal: after a request
/// that failed, around one with its own fault cell); the Plan in use at teardown has as its
/// epoch the resets since it began, and its ledger balanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLedger {
    pub requests: u64,
    pub resets: u64,
    pub cold_resets: u64,
    /// New Plans put in place of the one before a request.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub renewals: u64,
    /// Resets since the Plan in use at teardown began.
    pub plan_resets: u64,
    pub epoch: u64,
    pub balanced: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl SessionLedger {
    /// Why the ledger of a session that ran every request with `between` does not close.
    pub fn unbalanced(&self, between: crate::session::Between) -> Option<String> {
        let cold = if between == crate::session::Between::Cold { self.resets } else { 0 };
        let readied = self.resets + self.renewals;
        let why = if !self.balanced {
            "the Plan's ledger did not balance"
        } else if readied != self.requests.saturating_sub(1) {
            "not one reset or renewal before each request after the first"
        } else if self.cold_resets != cold {
            "cold resets do not match `between`"
        } else if self.epoch != self.plan_resets {
            "the epoch is not the number of resets of the Plan in use"
        } else {
            return None;
        };
        Some(format!("the session's ledger does not close: {why} ({self:?})"))
    }
}

/// A new Plan (with a new load of the model) put in place before a request: after one that
/// failed, or around one with its own fault cell (`fault`, `none` for the session's own), and
/// how the Plan it replaced closed (its epoch where it reported one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Renewal {
    pub before_request: usize,
    pub fault: crate::source::fault::FaultCell,
    pub replaced_epoch: Option<u64>,
    pub replaced_clean: bool,
}

/// One request of a session, as its record names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestEntry {
    pub id: String,
    /// Its record, relative to the session's directory, and that record's `record.json` digest.
    pub record: String,
    pub record_sha256: String,
    pub outcome: Outcome,
    /// The outputs it asked for.
    pub n_predict: u32,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Readying the source before it (none for the first), and that plus its decoding.
    pub between_s: f64,
    pub wall_s: f64,
    /// What a Plan served it: bytes read from storage, hits and misses, and its epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<Served>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<crate::session::Score>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Served {
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub epoch: u64,
    /// The resets before it, and of those the cold ones.
    pub resets: u64,
    pub cold_resets: u64,
}

impl Served {
    /// What the Plan's report of one request says it served.
    pub fn of(p: &PlanReport) -> Served {
        let t = &p.telemetry;
        Served {
            read_bytes: t.q_run.physical_bytes,
            hits: t.hits,
            misses: t.misses,
            epoch: p.closure.epoch,
            resets: t.resets,
            cold_resets: t.cold_resets,
        }
    }
}

/// A field that is present (null or not) deserializes to `Some`: absent and null differ.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl GenerateRecord {
    /// The source's report, if the run has one.
    pub fn experts(&self) -> Option<&ExpertsReport> {
        self.experts.as_ref().and_then(Option::as_ref)
    }

    /// The Plan's report, if the Plan served the run and closed.
    pub fn plan(&self) -> Option<&PlanReport> {
        self.experts().and_then(ExpertsReport::plan)
    }
}

impl RefineRecord {
    pub fn experts(&self) -> Option<&ExpertsReport> {
        self.experts.as_ref().and_then(Option::as_ref)
    }

    pub fn reference(&self) -> Option<&ModelIdentity> {
        self.reference.as_ref().and_then(Option::as_ref)
    }

    pub fn quality(&self) -> Option<&Quality> {
        self.quality.as_ref().and_then(Option::as_ref)
    }
}

/// A record of either format.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedRecord {
    Generate(Box<GenerateRecord>),
    Refine(Box<RefineRecord>),
    Envelope(Box<EnvelopeRecord>),
    ReadReplay(Box<ReadReplayRecord>),
    Session(Box<SessionRecord>),
}

/// The parts both formats share, for readers that take either.
impl TypedRecord {
    pub fn format(&self) -> &str {
        match self {
            TypedRecord::Generate(_) => GENERATE_FORMAT,
            TypedRecord::Refine(_) => REFINE_FORMAT,
            TypedRecord::Envelope(_) => ENVELOPE_FORMAT,
            TypedRecord::ReadReplay(_) => READ_REPLAY_FORMAT,
            TypedRecord::Session(_) => SESSION_FORMAT,
        }
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            TypedRecord::Generate(r) => r.outcome,
            TypedRecord::Refine(r) => r.outcome,
            TypedRecord::Envelope(r) => r.outcome,
            TypedRecord::ReadReplay(r) => r.outcome,
            TypedRecord::Session(r) => r.outcome,
        }
    }

    pub fn model(&self) -> Option<&ModelIdentity> {
        match self {
            TypedRecord::Generate(r) => r.model.as_ref(),
            TypedRecord::Refine(r) => r.model.as_ref(),
            TypedRecord::Envelope(r) => r.model.as_ref(),
            TypedRecord::ReadReplay(r) => r.model.as_ref(),
            TypedRecord::Session(r) => r.model.as_ref(),
        }
    }

    /// Every model the record names, by its role in the run.
    pub fn models(&self) -> Vec<(&'static str, &ModelIdentity)> {
        match self {
            TypedRecord::Generate(r) => r.model.iter().map(|m| ("model", m)).collect(),
            TypedRecord::Refine(r) => [("base", r.model.as_ref()), ("verifier", r.verifier.as_ref()), ("reference", r.reference())]
                .into_iter()
                .filter_map(|(k, m)| m.map(|m| (k, m)))
                .collect(),
            TypedRecord::Envelope(r) => r.model.iter().map(|m| ("model", m)).collect(),
            TypedRecord::ReadReplay(r) => r.model.iter().map(|m| ("model", m)).collect(),
            TypedRecord::Session(r) => r.model.iter().map(|m| ("model", m)).collect(),
        }
    }

    pub fn build(&self) -> &BuildIdentity {
        match self {
            TypedRecord::Generate(r) => &r.build,
            TypedRecord::Refine(r) => &r.build,
            TypedRecord::Envelope(r) => &r.build,
            TypedRecord::ReadReplay(r) => &r.build,
            TypedRecord::Session(r) => &r.build,
        }
    }

    pub fn surfaces(&self) -> &BTreeMap<String, Surface> {
        match self {
            TypedRecord::Generate(r) => &r.surfaces,
            TypedRecord::Refine(r) => &r.surfaces,
            TypedRecord::Envelope(r) => &r.surfaces,
            TypedRecord::ReadReplay(r) => &r.surfaces,
            TypedRecord::Session(r) => &r.surfaces,
        }
    }

    pub fn resources(&self) -> Option<&Resources> {
        match self {
            TypedRecord::Generate(r) => r.resources.as_ref(),
            TypedRecord::Refine(r) => r.resources.as_ref(),
            TypedRecord::Session(r) => r.resources.as_ref(),
            TypedRecord::Envelope(_) | TypedRecord::ReadReplay(_) => None,
        }
    }

    /// Prompt tokens, over every prompt of a refinement run (None where not counted).
    pub fn prompt_tokens(&self) -> Option<usize> {
        match self {
            TypedRecord::Generate(r) => r.counts.as_ref().map(|c| c.prompt_tokens),
            TypedRecord::Refine(r) => r.counts.as_ref().and_then(|c| c.prompt_tokens),
            TypedRecord::Session(r) => r.counts.map(|c| c.prompt_tokens),
            TypedRecord::Envelope(_) | TypedRecord::ReadReplay(_) => None,
        }
    }

    pub fn generated_tokens(&self) -> Option<usize> {
        match self {
            TypedRecord::Generate(r) => r.counts.as_ref().map(|c| c.generated_tokens),
            TypedRecord::Refine(r) => r.counts.as_ref().map(|c| c.generated_tokens),
            TypedRecord::Session(r) => r.counts.map(|c| c.generated_tokens),
            TypedRecord::Envelope(_) | TypedRecord::ReadReplay(_) => None,
        }
    }
}

impl TypedRecord {
    /// The record of a worker that did not exit 0: it proves nothing, whatever it wrote, so
    /// only how it ended is kept.
    pub fn failed(format: &str, error: String, build: BuildIdentity) -> Result<TypedRecord> {
        Ok(match format {
            GENERATE_FORMAT => TypedRecord::Generate(Box::new(GenerateRecord {
                format: GENERATE_FORMAT.into(),
                outcome: Outcome::Failed,
                error: Some(error),
                model: None,
                build,
                params: None,
                counts: None,
                timing: None,
                experts: None,
                process: None,
                surfaces: BTreeMap::new(),
                resources: None,
                cache_protocol: None,
                speculative: None,
            })),
            REFINE_FORMAT => TypedRecord::Refine(Box::new(RefineRecord {
                format: REFINE_FORMAT.into(),
                outcome: Outcome::Failed,
                error: Some(error),
                model: None,
                verifier: None,
                reference: None,
                build,
                params: None,
                counts: None,
                refine: None,
                timing: None,
                experts: None,
                quality: None,
                process: None,
                surfaces: BTreeMap::new(),
                resources: None,
                cache_protocol: None,
            })),
            ENVELOPE_FORMAT => TypedRecord::Envelope(Box::new(EnvelopeRecord {
                format: ENVELOPE_FORMAT.into(),
                outcome: Outcome::Failed,
                error: Some(error),
                model: None,
                build,
                params: None,
                cells: Vec::new(),
                best: None,
                surfaces: BTreeMap::new(),
            })),
            READ_REPLAY_FORMAT => TypedRecord::ReadReplay(Box::new(ReadReplayRecord {
                format: READ_REPLAY_FORMAT.into(),
                outcome: Outcome::Failed,
                error: Some(error),
                model: None,
                build,
                params: None,
                check: None,
                prefill: None,
                decode: None,
                decode_by_layer: None,
                surfaces: BTreeMap::new(),
            })),
            SESSION_FORMAT => {
                let mut r = SessionRecord::begun(None, build, None);
                r.fail(error);
                TypedRecord::Session(Box::new(r))
            }
            other => bail!("unknown record format {other:?}"),
        })
    }

    pub fn error(&self) -> Option<&str> {
        match self {
            TypedRecord::Generate(r) => r.error.as_deref(),
            TypedRecord::Refine(r) => r.error.as_deref(),
            TypedRecord::Envelope(r) => r.error.as_deref(),
            TypedRecord::ReadReplay(r) => r.error.as_deref(),
            TypedRecord::Session(r) => r.error.as_deref(),
        }
    }

    /// Adds what bounded a contained run, and the page-cache protocol it started under.
    pub fn set_contained(&mut self, resources: Resources, cache_protocol: &str) {
        let (r, c) = match self {
            TypedRecord::Generate(g) => (&mut g.resources, &mut g.cache_protocol),
            TypedRecord::Refine(g) => (&mut g.resources, &mut g.cache_protocol),
            TypedRecord::Session(g) => (&mut g.resources, &mut g.cache_protocol),
            // Measurement cells never run contained (their arms take no memory cap).
            TypedRecord::Envelope(_) | TypedRecord::ReadReplay(_) => return,
        };
        *r = Some(resources);
        *c = Some(cache_protocol.to_string());
    }
}

impl Serialize for TypedRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TypedRecord::Generate(r) => r.serialize(s),
            TypedRecord::Refine(r) => r.serialize(s),
            TypedRecord::Envelope(r) => r.serialize(s),
            TypedRecord::ReadReplay(r) => r.serialize(s),
            TypedRecord::Session(r) => r.serialize(s),
        }
    }
}

/// Reads `DIR/record.json` as the record of its format; an unknown format or a field of the
/// wrong shape is one error naming the file.
pub fn load_typed(dir: &Path) -> Result<TypedRecord> {
    let path = dir.join(RECORD_FILE);
    if !path.exists() {
        anyhow::bail!("{}: not a record (no {})", dir.display(), path.display());
    }
    let text = crate::bounds::read_text("a record", &path, crate::bounds::MAX_RECORD_JSON_BYTES)?;
    parse(&path, &text)
}

/// Parses the text of `path` (a `record.json`).
pub fn parse(path: &Path, text: &str) -> Result<TypedRecord> {
    #[derive(Deserialize)]
    struct Head {
        format: Option<Value>,
    }
    let head: Head = serde_json::from_str(text).with_context(|| format!("{}: not a record", path.display()))?;
    let format = head.format.unwrap_or(Value::Null);
    let field = |e: serde_json::Error| anyhow::anyhow!("{}: {e}", path.display());
    Ok(match format.as_str() {
        Some(GENERATE_FORMAT) => TypedRecord::Generate(Box::new(serde_json::from_str(text).map_err(field)?)),
        Some(REFINE_FORMAT) => TypedRecord::Refine(Box::new(serde_json::from_str(text).map_err(field)?)),
        Some(ENVELOPE_FORMAT) => TypedRecord::Envelope(Box::new(serde_json::from_str(text).map_err(field)?)),
        Some(READ_REPLAY_FORMAT) => TypedRecord::ReadReplay(Box::new(serde_json::from_str(text).map_err(field)?)),
        Some(SESSION_FORMAT) => TypedRecord::Session(Box::new(serde_json::from_str(text).map_err(field)?)),
        _ => bail!(
            "{}: unknown record format {format} (known: {GENERATE_FORMAT}, {REFINE_FORMAT}, {ENVELOPE_FORMAT}, {READ_REPLAY_FORMAT}, {SESSION_FORMAT})",
            path.display()
        ),
    })
}

/// The node a record ran on (`build.node.id`) from its `record.json` as read: None where the
/// record names none.
pub fn node_id(record: &Value) -> Option<String> {
    #[derive(Deserialize)]
    struct Head {
        build: Option<BuildHead>,
    }
    #[derive(Deserialize)]
    struct BuildHead {
        node: Option<NodeHead>,
    }
    #[derive(Deserialize)]
    struct NodeHead {
        id: String,
    }
    let head = Head::deserialize(record).ok()?;
    head.build.and_then(|b| b.node).map(|n| n.id)
}

/// A `generate` record; a record of another format is refused, naming it.
pub fn load_generate(dir: &Path) -> Result<GenerateRecord> {
    match load_typed(dir)? {
        TypedRecord::Generate(r) => Ok(*r),
        other => bail!("{}: not a generate record (format \"{}\")", dir.display(), other.format()),
    }
}

/// An `envelope` record; a record of another format is refused, naming it.
pub fn load_envelope(dir: &Path) -> Result<EnvelopeRecord> {
    match load_typed(dir)? {
        TypedRecord::Envelope(r) => Ok(*r),
        other => bail!("{}: not an envelope record (format \"{}\")", dir.display(), other.format()),
    }
}

/// A `read_replay` record; a record of another format is refused, naming it.
pub fn load_read_replay(dir: &Path) -> Result<ReadReplayRecord> {
    match load_typed(dir)? {
        TypedRecord::ReadReplay(r) => Ok(*r),
        other => bail!("{}: not a read_replay record (format \"{}\")", dir.display(), other.format()),
    }
}

/// A `refine` record; a record of another format is refused, naming it.
pub fn load_refine(dir: &Path) -> Result<RefineRecord> {
    match load_typed(dir)? {
        TypedRecord::Refine(r) => Ok(*r),
        other => bail!("{}: not a refine record (format \"{}\")", dir.display(), other.format()),
    }
}

#[cfg(test)]
mod tests {
    use super::{fastest_decode, ReplayDecode};

    #[test]
    fn the_floors_read_term_is_the_faster_decode_phase() {
        assert_eq!(fastest_decode(Some(0.164), Some(0.152)), Some((0.152, ReplayDecode::ByLayer)));
        assert_eq!(fastest_decode(Some(0.146), Some(0.149)), Some((0.146, ReplayDecode::Ubatch)));
        assert_eq!(fastest_decode(Some(0.15), Some(0.15)), Some((0.15, ReplayDecode::Ubatch)));
        assert_eq!(fastest_decode(Some(0.15), None), Some((0.15, ReplayDecode::Ubatch)), "a record before the layer phase");
        assert_eq!(fastest_decode(None, Some(0.1)), None, "no decode phase, no floor");
    }
}
