//! The campaign file: types, parsing with line:column diagnostics, and semantic validation.
//!
//! Every struct denies unknown fields, so a typo'd key is an error at its position rather than
//! a silently ignored setting. The JSON Schema in `schemas/campaign.schema.json` is generated
//! from these types (`sovereign campaign schema`).

use anyhow::Result;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub use crate::plan::PolicySpec;
pub use crate::spec::{from_yaml, At, Diagnostic, Sha256Hex};

/// A campaign: everything that is fixed before the first cell runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Campaign {
    /// Names `results/campaigns/<id>/`: letters, digits, `.`, `_`, `-`.
    pub id: At<String>,
    /// What the campaign is for, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The model every cell runs (in a refinement campaign: the base that generates).
    pub model: ModelSpec,
    /// A margin-gated refinement campaign (seed 001): the verifier and the reference that
    /// scores quality. Every arm then runs `sovereign refine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refine: Option<RefineModels>,
    /// Proposers by name, for arms that decode with `draft` (temporal amortization): models
    /// with the target's vocabulary, held resident beside it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proposers: BTreeMap<String, ModelSpec>,
    pub workload: Workload,
    /// The engine build every cell must come from.
    pub build: BuildSpec,
    /// The arms, each a complete run specification.
    pub arms: Vec<Arm>,
    pub schedule: Schedule,
    pub oracle: OracleSpec,
    pub admission: Admission,
    pub stop: StopRules,
    pub repetition: Repetition,
    /// Prespecified summaries (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
}

impl Campaign {
    /// Every model the campaign names, with its field: the model, a refinement's verifier
    /// and reference, and the proposers.
    pub fn models(&self) -> Vec<(String, &ModelSpec)> {
        let mut v = vec![("model".to_string(), &self.model)];
        if let Some(r) = &self.refine {
            v.extend([("refine.verifier".to_string(), &r.verifier), ("refine.reference".to_string(), &r.reference)]);
        }
        v.extend(self.proposers.iter().map(|(name, m)| (format!("proposers.{name}"), m)));
        v
    }
}

/// The model, by path and expected digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Relative paths are taken from the campaign file's directory.
    pub path: At<String>,
    pub sha256: At<Sha256Hex>,
    /// How the model is made when `path` is missing: forged (`model forge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<ForgeRecipe>,
    /// How the model is made when `path` is missing: quantized from another file
    /// (`model quantize`), itself present or made by its own recipe first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<QuantizeRecipe>,
}

/// `sovereign model forge` as a campaign names it; absent fields take forge's defaults (the
/// architecture the preset's own: qwen3next for `seed`, else qwen3moe).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, from = "ForgeRecipeFile")]
pub struct ForgeRecipe {
    pub arch: crate::forge::Arch,
    pub preset: crate::forge::Preset,
    #[serde(default)]
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_ff: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment: Option<u64>,
    /// The trained context length in tokens (default: the preset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub f16_router: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tied_output: bool,
    #[serde(default, skip_serializing_if = "crate::util::is_zero_f32")]
    pub router_skew: f32,
    /// Nextn (MTP) blocks after the trunk (`model forge --mtp-layers`).
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub mtp_layers: u64,
}

/// A forge recipe as written. [`ForgeRecipe`] is it with the architecture resolved, so that a
/// campaign's frozen form always names the architecture, as it did before presets had their own.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ForgeRecipeFile {
    #[serde(default)]
    arch: Option<crate::forge::Arch>,
    preset: crate::forge::Preset,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    layers: Option<u64>,
    #[serde(default)]
    experts: Option<u64>,
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(default)]
    embd: Option<u64>,
    #[serde(default)]
    expert_ff: Option<u64>,
    #[serde(default)]
    vocab: Option<u64>,
    #[serde(default)]
    alignment: Option<u64>,
    #[serde(default)]
    context: Option<u64>,
    #[serde(default)]
    f16_router: bool,
    #[serde(default)]
    tied_output: bool,
    #[serde(default)]
    router_skew: f32,
    #[serde(default)]
    mtp_layers: u64,
}

impl From<ForgeRecipeFile> for ForgeRecipe {
    fn from(f: ForgeRecipeFile) -> ForgeRecipe {
        ForgeRecipe {
            arch: f.arch.unwrap_or(f.preset.arch()),
            preset: f.preset,
            seed: f.seed,
            layers: f.layers,
            experts: f.experts,
            top_k: f.top_k,
            embd: f.embd,
            expert_ff: f.expert_ff,
            vocab: f.vocab,
            alignment: f.alignment,
            context: f.context,
            f16_router: f.f16_router,
            tied_output: f.tied_output,
            router_skew: f.router_skew,
            mtp_layers: f.mtp_layers,
        }
    }
}

/// `sovereign model quantize` as a campaign names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuantizeRecipe {
    /// The source model, relative to the campaign file's directory.
    pub from: String,
    #[serde(rename = "type")]
    pub ty: crate::engine::QuantType,
}

/// The models of a refinement campaign beside the base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefineModels {
    /// The higher-bit variant of the base's checkpoint.
    pub verifier: ModelSpec,
    /// The full-precision model whose mean per-token log-probability scores every output.
    pub reference: ModelSpec,
    /// Verify every `window` generated tokens (`verify_all`: `window` drafts per traversal).
    pub window: At<u32>,
}

/// What a refinement arm decodes with (`sovereign refine --mode`).
pub use crate::refine::Mode as RefineMode;

/// A refinement arm: `experts: plan` streams the verifier's (and the reference's) experts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefineArm {
    /// `refine` (the runtime), `base` or `verifier` (the endpoints).
    #[serde(default = "default_refine_mode")]
    pub mode: RefineMode,
    /// Deferral threshold on the base's top-1 margin (mode `refine`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau: Option<f32>,
    /// Check every position, not only deferred ones: drafted decoding with the base as the
    /// proposer, whose output is the verifier's own greedy one.
    #[serde(default)]
    pub verify_all: bool,
}

fn default_refine_mode() -> RefineMode {
    RefineMode::Refine
}

/// What every cell computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// One prompt, and its digest. Relative paths are taken from the campaign file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_file: Option<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_sha256: Option<At<Sha256Hex>>,
    /// Instead of one prompt, a session's requests (JSON Lines, as `generate --requests` reads
    /// them, prompts inline so that the file's digest covers them), and its digest: every
    /// cell serves them in order through one process, as its arm's `between` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_sha256: Option<At<Sha256Hex>>,
    /// Expected prompt length in tokens (a session's: over all its requests); a record with
    /// another count is invalid.
    pub prompt_tokens: At<u32>,
    /// Tokens to generate (greedy); a session's requests that name no `n_predict` take it.
    pub outputs: At<u32>,
    /// Keep generating past end-of-generation tokens, so every cell has `outputs` outputs.
    pub ignore_eos: bool,
}

/// The file a workload names as its input and that file's pinned digest.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadInput<'a> {
    pub file: &'a At<String>,
    pub sha256: &'a At<Sha256Hex>,
    /// A session's requests, not one prompt.
    pub session: bool,
}

impl WorkloadInput<'_> {
    /// The field that names the file, as a campaign file spells it.
    pub fn field(&self) -> &'static str {
        if self.session {
            "workload.requests"
        } else {
            "workload.prompt_file"
        }
    }

    /// The field that pins its digest.
    pub fn digest_field(&self) -> &'static str {
        if self.session {
            "workload.requests_sha256"
        } else {
            "workload.prompt_sha256"
        }
    }
}

impl Workload {
    /// The one prompt or the session's requests, with its digest: exactly one pair is given.
    pub fn input(&self) -> Result<WorkloadInput<'_>, String> {
        match (&self.prompt_file, &self.prompt_sha256, &self.requests, &self.requests_sha256) {
            (Some(file), Some(sha256), None, None) => Ok(WorkloadInput { file, sha256, session: false }),
            (None, None, Some(file), Some(sha256)) => Ok(WorkloadInput { file, sha256, session: true }),
            (Some(_), _, Some(_), _) | (Some(_), _, _, Some(_)) | (_, Some(_), Some(_), _) | (_, Some(_), _, Some(_)) => {
                Err("workload: give `prompt_file` (one prompt) or `requests` (a session), not both".into())
            }
            (Some(_), None, ..) => Err("workload.prompt_file needs `prompt_sha256`".into()),
            (None, Some(_), ..) => Err("workload.prompt_sha256 needs `prompt_file`".into()),
            (_, _, Some(_), None) => Err("workload.requests needs `requests_sha256`".into()),
            (_, _, None, Some(_)) => Err("workload.requests_sha256 needs `requests`".into()),
            (None, None, None, None) => Err("workload: name `prompt_file` (one prompt) or `requests` (a session)".into()),
        }
    }

    /// Whether every cell is a session of requests.
    pub fn is_session(&self) -> bool {
        self.requests.is_some()
    }
}

/// Expected build identity: the pinned engine tree and the patch series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    /// `engine.tree_sha256` of `sovereign build-info --json`.
    pub engine_tree_sha256: At<Sha256Hex>,
    /// `engine.patches` of `sovereign build-info --json`, in order.
    pub patches: At<Vec<PatchSpec>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchSpec {
    pub name: String,
    pub sha256: Sha256Hex,
}

/// How an arm holds its experts.
pub use crate::cell::ExpertsMode;

/// Where a Plan arm reads expert bytes.
pub use crate::plan::SourceKind;

/// A deterministic fault cell (seed 000 §5.4, Table 7): the type `generate --fault` takes.
/// Absent (or `none`): the no-fault control.
pub use crate::source::fault::FaultCell;

/// One arm: a complete run specification. Plan fields are required for `experts: plan` and
/// forbidden for `experts: resident`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    /// Referenced by the schedule, the oracle and the analysis: letters, digits, `_`, `-`.
    pub id: At<String>,
    /// How a run arm holds its experts (every arm but a measurement arm names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertsMode>,
    /// A measurement cell instead of a run: `envelope` or `read_replay` (then the arm names
    /// nothing else but its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measure: Option<Measure>,
    /// Expert slots per MoE layer. With `policy`, or neither: then both are sized from the
    /// arm's budget (`memory_cap_bytes` for host pools; with `gpu_layers`, `gpu_budget` or
    /// `device_memory_cap_bytes`), LRU over every slot, as `generate` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceKind>,
    /// Host staging windows (absent: sized from the model's manifest for source F).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<u32>,
    /// Source queue depth (absent, for source F: sized from the manifest and the device's
    /// read profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Layer buffers shared by the layers' slot pools (absent or 0: one pool per layer; 2:
    /// double-buffered layer by layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_buffers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultCell>,
    /// The decode token whose every event the record's `timeline` surface keeps (absent: the
    /// middle one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_token: Option<u32>,
    /// Distinct experts per engine pass when a ubatch has one token (absent: one pass): fewer
    /// than a token selects lets the engine compute a layer's first experts while the Plan
    /// still reads the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_pass: Option<u32>,
    /// Distinct experts per engine pass when a ubatch has several tokens (absent: half the
    /// slots for F, so one group is read while the other computes; 0: the slots, one group at
    /// a time), as `generate --prompt-pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pass: Option<u32>,
    /// How the Plan verifies each read against the digest manifest: `xxh3` (default) or
    /// `blake3`, as `generate --verify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<crate::digests::Verify>,
    /// This arm runs `sovereign refine` (the campaign must name `refine` models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refine: Option<RefineArm>,
    /// Hard host memory limit over the cell's whole process tree, bytes (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cap_bytes: Option<u64>,
    /// Engine threads, decoding and prompt alike. Absent, the machine that runs the cell takes
    /// `generate`'s default (every core, decoding and prompt alike); the record names the
    /// counts. A measurement arm names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Layers placed on the device (`all`, or a count), as `generate --gpu-layers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<crate::exec::GpuLayers>,
    /// `local`: the runner starts an RPC device server (`sovereign device serve`) on a loopback
    /// port for each of the arm's cells, registers it as the cell's device and stops it when
    /// the cell ends. Needs `gpu_layers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc: Option<RpcArm>,
    /// Device bytes the cell's run may hold, as `generate --gpu-budget`: its buffers on the
    /// device (weights, KV cache, compute buffers, slot pools) are checked against it before
    /// decoding, and the device's audited peak after. Needs `gpu_layers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_budget: Option<u64>,
    /// With `rpc: local`: the device server runs in a memory cgroup of its own with this hard
    /// limit (swap off), bytes; the run's budget is this unless `gpu_budget` says less, and the
    /// server cgroup's kernel peak is the device's audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory_cap_bytes: Option<u64>,
    /// Resident arms without a memory cap: the runner reads the model file through the page
    /// cache before each cell (outside its wall time), so the run computes on warm pages and
    /// measures compute alone: the compute floor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
    /// Decode with a proposer, as `generate --draft`: the name of one of the campaign's
    /// With a session workload (`workload.requests`): what carries from one request to the
    /// next, as `generate --between` (`auto`, `reset`, `cold`, or `separate`: every request
    /// a process of its own, a session's baseline). Absent: `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<crate::session::BetweenMode>,
    /// `proposers`, whose greedy drafts the target checks `draft_max` at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<String>,
    /// Drafts one traversal checks (with `draft`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_max: Option<u32>,
}

/// Where an arm's RPC device comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RpcArm {
    /// A server the runner starts for the cell on this machine and stops after it.
    Local,
}

/// A measurement cell a campaign interleaves with its arms; each seals a record of its own
/// format (`sovereign.envelope/1`, `sovereign.read_replay/1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Measure {
    /// The device's read ceiling: O_DIRECT io_uring reads of `block_bytes` from the model
    /// file, `bytes_per_depth` at each of `depths` reads in flight, each depth and each way F
    /// submits reads (single, vectored over neighbouring blocks, linked chains: the cell's
    /// `pattern`) over its own region of the file, read twice (the second read, a cell of its
    /// own marked `reread`, bounds a run's reads of experts it read moments before). The record
    /// names the best depth and its MiB/s.
    Envelope(EnvelopeMeasure),
    /// A run's own reads with no compute: the routes of arm `of`'s record in the same block
    /// go through the real Plan with that arm's settings (a dry source collects every read it
    /// submits, which must equal that record's `q_run` reads and bytes), then the same
    /// extents are read in order with io_uring O_DIRECT, one ubatch after the other, at
    /// `depth` reads in flight. The record gives read seconds per decode token and for the
    /// prefill.
    ReadReplay(ReadReplayMeasure),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeMeasure {
    /// Bytes per read: a multiple of 4096 up to 64 MiB.
    pub block_bytes: u64,
    /// Reads in flight, 1 to 16 values of 1..=1024.
    pub depths: Vec<u32>,
    /// Bytes read at each depth.
    pub bytes_per_depth: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadReplayMeasure {
    /// The Plan arm whose reads are replayed; it runs earlier in every block with this cell.
    pub of: At<String>,
    /// Reads in flight (absent: the best depth of the block's envelope cell, which must run
    /// earlier in the block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

/// The order cells run in: `lead` cells once each (block 0), then the blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Arms run once each, in this order, before the blocks: the oracle first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lead: Vec<At<String>>,
    pub blocks: Blocks,
}

/// Counterbalanced blocks: written out in advance, or drawn from a seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Blocks {
    /// Each inner list is one block: the arms in the order they run (Table 6).
    Preordered(Vec<At<Vec<At<String>>>>),
    /// `count` blocks, each a permutation of `arms` drawn from `seed` (SplitMix64, Fisher–Yates).
    SeededRandom { seed: u64, count: At<u32>, arms: Vec<At<String>> },
}

/// SplitMix64 (Steele, Lea, Flood 2014): small, fixed and documented, so a seeded schedule
/// is the same on every machine and in every version.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Blocks {
    /// The blocks' arm orders: as written (`preordered`), or one Fisher–Yates permutation per
    /// block drawn from SplitMix64(seed) (index j = next % (i + 1); the bias is below 2^-60).
    pub fn orders(&self) -> Vec<Vec<String>> {
        match self {
            Blocks::Preordered(b) => b.iter().map(|b| b.iter().map(|a| a.value.clone()).collect()).collect(),
            Blocks::SeededRandom { seed, count, arms } => {
                let mut rng = SplitMix64(*seed);
                (0..count.value)
                    .map(|_| {
                        let mut v: Vec<String> = arms.iter().map(|a| a.value.clone()).collect();
                        for i in (1..v.len()).rev() {
                            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                            v.swap(i, j);
                        }
                        v
                    })
                    .collect()
            }
        }
    }
}

/// The oracle arm and the exactness relation E with its horizon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OracleSpec {
    pub arm: At<String>,
    pub relation: Relation,
    /// Outputs the relation covers; must equal `workload.outputs` for `all_surfaces`.
    pub horizon: u32,
}

pub use crate::oracle::Relation;

/// The admission predicate a cell must pass (seed 000 §5.3: positive headroom, no limit event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Admission {
    /// The cell must be exact against the oracle under the relation.
    pub require_exact: bool,
    /// With a memory cap: cap − peak must be at least this (and positive).
    pub min_headroom_bytes: u64,
    /// With a memory cap: at most this many memory.max (limit) events.
    pub max_limit_events: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopRules {
    /// An arm's later cells are skipped after its first admission failure.
    pub arm_after_admission_failure: bool,
    /// Nothing else runs if the oracle cell fails.
    pub campaign_after_oracle_failure: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Repetition {
    /// Only `none`: no cell is ever rerun because of its outcome.
    pub outcome_selected_reruns: Reruns,
    /// A cell interrupted before it produced an outcome (runner killed, machine rebooted) is
    /// discarded and run again; once it has been interrupted this many times it is abandoned
    /// instead. Every discard and abandonment is journaled.
    pub max_interrupted_attempts: At<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reruns {
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Analysis {
    /// Paired ratio b/a over the blocks that contain both arms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<PairAnalysis>,
    /// An arm's decode time per token against its floor, per block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<FloorAnalysis>,
    /// Complete wall time of arms against a baseline arm (mean over each arm's cells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<WallAnalysis>,
    /// Arms' prefill time against its floor, per block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_floor: Option<PrefillFloorAnalysis>,
    /// A prespecified criterion on a recorded number (a session's task score, say), judged by
    /// `export` and by the claim's `replay` like any assertion, when it fails too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criterion: Option<CriterionAnalysis>,
}

/// `mean(b) - mean(a) >= min_difference`, the means of `metric` over each arm's completed
/// cells: for example `{ a: separate, b: reset, metric: { pointer: /scores/f1 },
/// min_difference: -0.01 }`, "the session's aggregate F1 is at least the separate runs' less
/// 0.01".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CriterionAnalysis {
    pub a: At<String>,
    pub b: At<String>,
    pub metric: Operand,
    pub min_difference: f64,
}

/// Per block, the floor of an arm's prefill is max(the `compute` arm's prefill seconds (a
/// resident arm: the least of the block's cells, else of all its cells), the arm's prefill
/// bytes read over the envelope's best cell in the campaign), and the ratio is the arm's
/// prefill seconds over it, with the paired-log t interval over the blocks. With `baseline`
/// (stock mmap under the same cap, say), each block also gives the baseline's prefill seconds
/// over the arm's. An arm faster than its floor's compute term, or reading faster than the
/// envelope, is an invalid measurement: no ratio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefillFloorAnalysis {
    /// Plan arms.
    pub arms: Vec<At<String>>,
    /// A resident arm: the compute floor.
    pub compute: At<String>,
    /// An `envelope` arm: the device's read ceiling.
    pub envelope: At<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<At<String>>,
    pub level: f64,
}

/// `arms`' mean complete wall time (the runner's, spawn to exit) over `baseline`'s: a speedup
/// is `baseline / arm`. A ratio over failed cells is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WallAnalysis {
    pub baseline: At<String>,
    pub arms: Vec<At<String>>,
}

/// Per block, the floor time per decode token is max(read time per decode token of the
/// block's `replay` cell, decode time per token of the `compute` arm, resident: the least of
/// the block's cells, else of all its cells), and the ratio is `arm`'s decode time per token
/// over it (1.10: within 10 %); the paired-log t interval of that ratio over the blocks. An
/// arm faster than a term of its floor makes the floor an invalid measurement: no ratio.
/// With `envelope`, each block also gives the arm's bytes per second (its replay's decode
/// bytes per token over its decode time per token) over the envelope's best cell in the
/// campaign, with its interval; a replay or an arm moving more bytes per second than that cell
/// is an invalid measurement too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FloorAnalysis {
    pub arm: At<String>,
    /// A `read_replay` arm of `arm`.
    pub replay: At<String>,
    /// A resident arm: the compute floor.
    pub compute: At<String>,
    /// An `envelope` arm: the device's read ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<At<String>>,
    pub level: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PairAnalysis {
    /// Denominator arm.
    pub a: At<String>,
    /// Numerator arm.
    pub b: At<String>,
    pub metric: Operand,
    /// Interval level, e.g. 0.95.
    pub level: f64,
}

/// A number inside a sealed record: a JSON pointer into one of its JSON files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Operand {
    /// `record.json` (the run) or `cell.json` (the campaign cell, e.g. `/outcome/wall_s`).
    #[serde(default = "default_file")]
    pub file: String,
    /// RFC 6901 JSON pointer, e.g. `/timing/decode_s`.
    pub pointer: String,
}

pub fn default_file() -> String {
    crate::record::RECORD_FILE.to_string()
}

/// Parses a campaign file's text. Syntax errors, typo'd keys and wrong types come back as one
/// diagnostic at their position; semantic problems (unknown arm references, missing Plan
/// fields, ...) as one diagnostic each.
pub fn parse(text: &str) -> std::result::Result<Campaign, Vec<Diagnostic>> {
    let c: Campaign = from_yaml(text)?;
    let problems = validate(&c);
    if problems.is_empty() {
        Ok(c)
    } else {
        Err(problems)
    }
}

fn valid_name(s: &str, extra: &[char]) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || extra.contains(&c))
}

/// Semantic checks that the types cannot express.
pub fn validate(c: &Campaign) -> Vec<Diagnostic> {
    let mut out = validate_header(c);
    let mut ids = BTreeSet::new();
    for a in &c.arms {
        if !valid_name(&a.id, &[]) {
            out.push(Diagnostic::at(&a.id, format!("arm id {:?} must be letters, digits, `_`, `-`", a.id.value)));
        }
        if !ids.insert(a.id.value.clone()) {
            out.push(Diagnostic::at(&a.id, format!("arm `{}` is defined twice", a.id.value)));
        }
        out.extend(validate_arm(a));
    }
    let known = Known(&ids);
    validate_schedule(c, &known, &mut out);
    validate_oracle(c, &known, &mut out);
    out.extend(validate_refine(c));
    out.extend(validate_proposers(c));
    out.extend(validate_session(c));
    if let Some(p) = c.analysis.as_ref().and_then(|a| a.pairs.as_ref()) {
        validate_pairs(p, &known, &mut out);
    }
    if let Some(f) = c.analysis.as_ref().and_then(|a| a.floor.as_ref()) {
        validate_floor(c, f, &known, &mut out);
    }
    if let Some(f) = c.analysis.as_ref().and_then(|a| a.prefill_floor.as_ref()) {
        validate_prefill_floor(c, f, &known, &mut out);
    }
    if let Some(k) = c.analysis.as_ref().and_then(|a| a.criterion.as_ref()) {
        known.all([&k.a, &k.b], "analysis.criterion", &mut out);
        if !k.min_difference.is_finite() {
            out.push(Diagnostic::at(&k.a, "analysis.criterion.min_difference must be a finite number"));
        }
    }
    if let Some(w) = c.analysis.as_ref().and_then(|a| a.wall.as_ref()) {
        known.all(std::iter::once(&w.baseline), "analysis.wall.baseline", &mut out);
        known.all(&w.arms, "analysis.wall.arms", &mut out);
        if w.arms.is_empty() {
            out.push(Diagnostic::at(&w.baseline, "analysis.wall.arms names no arm".to_string()));
        }
    }
    let attempts = &c.repetition.max_interrupted_attempts;
    if attempts.value == 0 || attempts.value > crate::bounds::MAX_INTERRUPTED_ATTEMPTS {
        out.push(Diagnostic::at(
            attempts,
            format!("repetition.max_interrupted_attempts {}: expected 1..={}", attempts.value, crate::bounds::MAX_INTERRUPTED_ATTEMPTS),
        ));
    }
    out
}

/// The campaign's id, workload and models.
fn validate_header(c: &Campaign) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if let Err(e) = crate::bounds::campaign_id(&c.id.value) {
        out.push(Diagnostic::at(&c.id, e.to_string()));
    }
    let outputs = &c.workload.outputs;
    if outputs.value == 0 || outputs.value > crate::bounds::MAX_N_PREDICT {
        out.push(Diagnostic::at(outputs, format!("workload.outputs {}: expected 1..={}", outputs.value, crate::bounds::MAX_N_PREDICT)));
    }
    if let Err(e) = c.workload.input() {
        out.push(Diagnostic::at(outputs, e));
    }
    let prompt_tokens = &c.workload.prompt_tokens;
    if prompt_tokens.value == 0 || prompt_tokens.value > crate::bounds::MAX_PROMPT_TOKENS {
        out.push(Diagnostic::at(
            prompt_tokens,
            format!("workload.prompt_tokens {}: expected 1..={}", prompt_tokens.value, crate::bounds::MAX_PROMPT_TOKENS),
        ));
    }
    if c.arms.is_empty() {
        out.push(Diagnostic::at(&c.id, "a campaign needs at least one arm (`arms:` is empty)"));
    }
    for (field, m) in c.models() {
        if m.forge.is_some() && m.quantize.is_some() {
            out.push(Diagnostic::at(&m.path, format!("{field}: give `forge` or `quantize`, not both")));
        }
        if let Some(f) = &m.forge {
            if !(f.router_skew.is_finite() && (0.0..=crate::forge::MAX_ROUTER_SKEW).contains(&f.router_skew)) {
                out.push(Diagnostic::at(
                    &m.path,
                    format!("{field}.forge.router_skew {}: expected 0..={}", f.router_skew, crate::forge::MAX_ROUTER_SKEW),
                ));
            }
            if let Err(why) = crate::forge::tied_output_allowed(f.arch, f.tied_output) {
                out.push(Diagnostic::at(&m.path, format!("{field}.forge.tied_output: {why}")));
            }
            if crate::forge::STATELESS_FAMILIES.contains(&f.arch) {
                out.push(Diagnostic::at(
                    &m.path,
                    format!(
                        "{field}.forge.arch {}: llama.cpp keeps no KV cache for it (a diffusion model), so no cell can \
                         generate one token after another with it",
                        f.arch.name()
                    ),
                ));
            }
        }
    }
    out
}

/// One arm's fields against what the arm is ([`Arm::kind`]), each problem at the arm's id.
fn validate_arm(a: &Arm) -> Vec<Diagnostic> {
    match a.kind() {
        Ok(_) => Vec::new(),
        Err(e) => e.0.into_iter().map(|m| Diagnostic::at(&a.id, m)).collect(),
    }
}

/// The arm ids a campaign defines, to check each reference against.
struct Known<'a>(&'a BTreeSet<String>);

impl Known<'_> {
    fn check(&self, r: &At<String>, what: &str, out: &mut Vec<Diagnostic>) {
        if !self.0.contains(&r.value) {
            let ids = self.0.iter().cloned().collect::<Vec<_>>().join(", ");
            out.push(Diagnostic::at(r, format!("{what} names arm `{}`, which is not defined (arms: {ids})", r.value)));
        }
    }

    fn all<'r>(&self, refs: impl IntoIterator<Item = &'r At<String>>, what: &str, out: &mut Vec<Diagnostic>) {
        for r in refs {
            self.check(r, what, out);
        }
    }

    /// A block of the schedule: every arm defined, none twice (the lead may repeat one).
    fn block(&self, block: &[At<String>], what: &str, out: &mut Vec<Diagnostic>) {
        let mut seen = BTreeSet::new();
        for r in block {
            self.check(r, what, out);
            if !seen.insert(r.value.clone()) && what != "schedule.lead" {
                out.push(Diagnostic::at(r, format!("arm `{}` appears twice in one block", r.value)));
            }
        }
    }
}

fn validate_schedule(c: &Campaign, known: &Known, out: &mut Vec<Diagnostic>) {
    known.block(&c.schedule.lead, "schedule.lead", out);
    match &c.schedule.blocks {
        Blocks::Preordered(blocks) => {
            let cells = c.schedule.lead.len() as u64 + blocks.iter().map(|b| b.len() as u64).sum::<u64>();
            if let Some(b) = blocks.first().filter(|_| cells > crate::bounds::MAX_CELLS) {
                out.push(Diagnostic::at(
                    b,
                    format!(
                        "schedule.blocks.preordered: {} blocks and the lead are {cells} cells, more than {}",
                        blocks.len(),
                        crate::bounds::MAX_CELLS
                    ),
                ));
            }
            for b in blocks {
                if b.is_empty() {
                    out.push(Diagnostic::at(b, "schedule.blocks: a block is empty"));
                }
                known.block(b, "schedule.blocks", out);
            }
        }
        Blocks::SeededRandom { arms, count, .. } => {
            if arms.is_empty() || count.value == 0 {
                out.push(Diagnostic::at(
                    count,
                    format!("schedule.blocks.seeded_random: count {} with {} arms: needs arms and count >= 1", count.value, arms.len()),
                ));
            }
            let cells = u64::from(count.value) * arms.len() as u64 + c.schedule.lead.len() as u64;
            if cells > crate::bounds::MAX_CELLS {
                out.push(Diagnostic::at(
                    count,
                    format!(
                        "schedule.blocks.seeded_random: count {} x {} arms and the lead are {cells} cells, more than {}",
                        count.value,
                        arms.len(),
                        crate::bounds::MAX_CELLS
                    ),
                ));
            }
            known.block(arms, "schedule.blocks.seeded_random.arms", out);
        }
    }
}

/// The oracle: a defined run arm, scheduled first, over the workload's horizon. The
/// measurement schedule and the oracle's place are checked only once all else holds.
fn validate_oracle(c: &Campaign, known: &Known, out: &mut Vec<Diagnostic>) {
    known.check(&c.oracle.arm, "oracle.arm", out);
    if c.arms.iter().any(|a| a.id.value == c.oracle.arm.value && a.measure.is_some()) {
        out.push(Diagnostic::at(
            &c.oracle.arm,
            format!("oracle.arm `{}` is a measurement arm; the oracle must be a run", c.oracle.arm.value),
        ));
    }
    if out.is_empty() {
        out.extend(validate_measure_schedule(c));
    }
    if out.is_empty() {
        // The oracle is the reference: it must be the first cell that runs.
        let first = c.schedule.lead.first().map(|r| &r.value).or(match &c.schedule.blocks {
            Blocks::Preordered(b) => b.first().and_then(|b| b.first()).map(|r| &r.value),
            Blocks::SeededRandom { .. } => None,
        });
        if first != Some(&c.oracle.arm.value) {
            out.push(Diagnostic::at(
                &c.oracle.arm,
                format!("the oracle arm `{}` must be the first cell scheduled (put it first in schedule.lead)", c.oracle.arm.value),
            ));
        }
    }
    if c.oracle.horizon != *c.workload.outputs {
        out.push(Diagnostic::at(
            &c.oracle.arm,
            format!("oracle.horizon {} must equal workload.outputs {}", c.oracle.horizon, c.workload.outputs),
        ));
    }
}

fn validate_pairs(p: &PairAnalysis, known: &Known, out: &mut Vec<Diagnostic>) {
    known.check(&p.a, "analysis.pairs.a", out);
    known.check(&p.b, "analysis.pairs.b", out);
    if p.a.value == p.b.value {
        out.push(Diagnostic::at(&p.b, "analysis.pairs: a and b must be different arms"));
    }
    if !(p.level > 0.0 && p.level < 1.0) {
        out.push(Diagnostic::at(&p.a, format!("analysis.pairs.level must lie strictly between 0 and 1 (got {})", p.level)));
    }
    if !p.metric.pointer.is_empty() && !p.metric.pointer.starts_with('/') {
        out.push(Diagnostic::at(&p.a, format!("analysis.pairs.metric.pointer {:?} must start with `/`", p.metric.pointer)));
    }
    if p.metric.file != "record.json" && p.metric.file != "cell.json" {
        out.push(Diagnostic::at(&p.a, format!("analysis.pairs.metric.file must be record.json or cell.json, not {:?}", p.metric.file)));
    }
}

/// The floor's arms: a Plan arm, a read replay of it, a resident arm, an envelope arm.
fn validate_floor(c: &Campaign, f: &FloorAnalysis, known: &Known, out: &mut Vec<Diagnostic>) {
    for (r, what) in [(&f.arm, "analysis.floor.arm"), (&f.replay, "analysis.floor.replay"), (&f.compute, "analysis.floor.compute")] {
        known.check(r, what, out);
    }
    let arm = |r: &At<String>| c.arms.iter().find(|a| a.id.value == r.value);
    if arm(&f.arm).is_some_and(|a| a.experts != Some(ExpertsMode::Plan)) {
        out.push(Diagnostic::at(&f.arm, format!("analysis.floor.arm `{}` must be a Plan arm", f.arm.value)));
    }
    match arm(&f.replay).and_then(|a| a.measure.as_ref()) {
        Some(Measure::ReadReplay(m)) if m.of.value == f.arm.value => {}
        _ if arm(&f.replay).is_none() => {}
        _ => out.push(Diagnostic::at(
            &f.replay,
            format!("analysis.floor.replay `{}` must be a read_replay arm of `{}`", f.replay.value, f.arm.value),
        )),
    }
    if arm(&f.compute).is_some_and(|a| a.experts != Some(ExpertsMode::Resident)) {
        out.push(Diagnostic::at(&f.compute, format!("analysis.floor.compute `{}` must be a resident arm", f.compute.value)));
    }
    if let Some(e) = &f.envelope {
        known.check(e, "analysis.floor.envelope", out);
        if arm(e).is_some_and(|a| !matches!(a.measure, Some(Measure::Envelope(_)))) {
            out.push(Diagnostic::at(e, format!("analysis.floor.envelope `{}` must be an envelope arm", e.value)));
        }
    }
    if !(f.level > 0.0 && f.level < 1.0) {
        out.push(Diagnostic::at(&f.arm, format!("analysis.floor.level must lie strictly between 0 and 1 (got {})", f.level)));
    }
}

/// The prefill floor's arms: Plan arms, a resident arm, an envelope arm, any baseline.
fn validate_prefill_floor(c: &Campaign, f: &PrefillFloorAnalysis, known: &Known, out: &mut Vec<Diagnostic>) {
    let arm = |r: &At<String>| c.arms.iter().find(|a| a.id.value == r.value);
    known.all(&f.arms, "analysis.prefill_floor.arms", out);
    for r in &f.arms {
        if arm(r).is_some_and(|a| a.experts != Some(ExpertsMode::Plan)) {
            out.push(Diagnostic::at(r, format!("analysis.prefill_floor.arms: `{}` must be a Plan arm", r.value)));
        }
    }
    known.check(&f.compute, "analysis.prefill_floor.compute", out);
    if arm(&f.compute).is_some_and(|a| a.experts != Some(ExpertsMode::Resident)) {
        out.push(Diagnostic::at(&f.compute, format!("analysis.prefill_floor.compute `{}` must be a resident arm", f.compute.value)));
    }
    known.check(&f.envelope, "analysis.prefill_floor.envelope", out);
    if arm(&f.envelope).is_some_and(|a| !matches!(a.measure, Some(Measure::Envelope(_)))) {
        out.push(Diagnostic::at(&f.envelope, format!("analysis.prefill_floor.envelope `{}` must be an envelope arm", f.envelope.value)));
    }
    if let Some(b) = &f.baseline {
        known.check(b, "analysis.prefill_floor.baseline", out);
        if arm(b).is_some_and(|a| a.measure.is_some() || a.refine.is_some()) {
            out.push(Diagnostic::at(b, format!("analysis.prefill_floor.baseline `{}` must be an arm that runs the workload", b.value)));
        }
    }
    if f.arms.is_empty() {
        out.push(Diagnostic::at(&f.compute, "analysis.prefill_floor.arms names no arm".to_string()));
    }
    if !(f.level > 0.0 && f.level < 1.0) {
        out.push(Diagnostic::at(&f.compute, format!("analysis.prefill_floor.level must lie strictly between 0 and 1 (got {})", f.level)));
    }
}

/// A read replay names a Plan arm (without a fault) that runs earlier in each of its blocks,
/// and, without a fixed depth, an envelope cell earlier in each of its blocks.
fn validate_measure_schedule(c: &Campaign) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let arm = |id: &str| c.arms.iter().find(|a| a.id.value == id);
    let mut blocks = vec![c.schedule.lead.iter().map(|a| a.value.clone()).collect::<Vec<_>>()];
    blocks.extend(c.schedule.blocks.orders());
    for a in &c.arms {
        let Some(Measure::ReadReplay(r)) = &a.measure else { continue };
        let id = &a.id.value;
        match arm(&r.of.value) {
            None => {
                out.push(Diagnostic::at(
                    &r.of,
                    format!("arm `{id}`: measure.read_replay.of names arm `{}`, which is not defined", r.of.value),
                ));
                continue;
            }
            Some(of) if of.experts != Some(ExpertsMode::Plan) || of.fault.is_some_and(|f| f != FaultCell::None) => {
                out.push(Diagnostic::at(
                    &r.of,
                    format!("arm `{id}`: measure.read_replay.of `{}` must be a Plan arm without a fault", r.of.value),
                ));
                continue;
            }
            Some(_) => {}
        }
        for b in blocks.iter().filter(|b| b.contains(id)) {
            let before = &b[..b.iter().position(|x| x == id).expect("contains")];
            if !before.contains(&r.of.value) {
                out.push(Diagnostic::at(
                    &r.of,
                    format!("arm `{id}` runs in a block ({}) where `{}` does not run before it", b.join(", "), r.of.value),
                ));
            }
            let envelope = before.iter().any(|x| arm(x).is_some_and(|a| matches!(a.measure, Some(Measure::Envelope(_)))));
            if r.depth.is_none() && !envelope {
                out.push(Diagnostic::at(&a.id, format!("arm `{id}` takes its depth from the block's envelope cell, but block ({}) runs none before it; give measure.read_replay.depth", b.join(", "))));
            }
        }
    }
    out
}

/// `draft: mtp`: the arm drafts with the campaign model's own MTP head; no proposer may take
/// the name.
pub const MTP: &str = "mtp";

/// A refinement campaign: every arm refines, with the token relation and outputs fixed.
/// Proposers are named as arms are, and each arm's `draft` names one of them.
fn validate_proposers(c: &Campaign) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (name, m) in &c.proposers {
        if !valid_name(name, &[]) {
            out.push(Diagnostic::at(&m.path, format!("proposer name {name:?} must be letters, digits, `_`, `-`")));
        }
        if name == MTP {
            out.push(Diagnostic::at(
                &m.path,
                format!("proposer name `{name}` is `draft: {name}`, the model's own MTP head; name the proposer otherwise"),
            ));
        }
    }
    for a in &c.arms {
        if let Some(d) = a.draft.as_ref().filter(|d| *d != MTP && !c.proposers.contains_key(*d)) {
            let names = c.proposers.keys().cloned().collect::<Vec<_>>().join(", ");
            out.push(Diagnostic::at(
                &a.id,
                format!("arm `{}`: `draft` names proposer `{d}`, which `proposers` does not define (proposers: {names})", a.id.value),
            ));
        }
    }
    // A traversal of K + 1 rows takes other matrix kernels than one row (llamafile's sgemm
    // declines a single row): logits rows equal bitwise only between runs with the same
    // proposer and K, so `all_surfaces` holds only against an oracle that drafts alike.
    let oracle = c.arms.iter().find(|a| a.id.value == c.oracle.arm.value);
    if let (Relation::AllSurfaces, Some(o)) = (c.oracle.relation, oracle) {
        for a in c.arms.iter().filter(|a| a.measure.is_none() && (&a.draft, a.draft_max) != (&o.draft, o.draft_max)) {
            let how = |d: &Option<String>, k: Option<u32>| {
                d.as_ref().map_or("one token per traversal".to_string(), |d| format!("proposer `{d}`, draft_max {}", k.unwrap_or(0)))
            };
            out.push(Diagnostic::at(
                &a.id,
                format!(
                    "arm `{}` decodes with {}, the oracle arm `{}` with {}: their logits rows come from other kernels, so `relation: all_surfaces` cannot hold; draft alike or use `relation: tokens`",
                    a.id.value,
                    how(&a.draft, a.draft_max),
                    o.id.value,
                    how(&o.draft, o.draft_max)
                ),
            ));
        }
    }
    out
}

/// `between` belongs to a session workload's arms; a session is not one run whose decode a
/// floor analysis reads, nor a refinement's prompts.
fn validate_session(c: &Campaign) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let Some(requests) = &c.workload.requests else {
        for a in c.arms.iter().filter(|a| a.between.is_some()) {
            out.push(Diagnostic::at(&a.id, format!("arm `{}` sets `between`, but the workload names no `requests`", a.id.value)));
        }
        return out;
    };
    if c.refine.is_some() {
        out.push(Diagnostic::at(requests, "workload.requests: a refinement campaign refines `prompt_file`'s prompts, not a session"));
    }
    let analysis = c.analysis.as_ref();
    for (name, set) in
        [("floor", analysis.is_some_and(|a| a.floor.is_some())), ("prefill_floor", analysis.is_some_and(|a| a.prefill_floor.is_some()))]
    {
        if set {
            out.push(Diagnostic::at(requests, format!("analysis.{name} reads one run's steps; a session's cells are many runs")));
        }
    }
    out
}

fn validate_refine(c: &Campaign) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    match &c.refine {
        None => {
            for a in c.arms.iter().filter(|a| a.refine.is_some()) {
                out.push(Diagnostic::at(&a.id, format!("arm `{}` refines, but the campaign names no `refine` models", a.id.value)));
            }
        }
        Some(r) => {
            if r.window.value == 0 || r.window.value > crate::bounds::MAX_REFINE_WINDOW {
                out.push(Diagnostic::at(
                    &r.window,
                    format!("refine.window {}: expected 1..={}", r.window.value, crate::bounds::MAX_REFINE_WINDOW),
                ));
            }
            if c.oracle.relation != Relation::Tokens {
                out.push(Diagnostic::at(&c.oracle.arm, "a refinement campaign records no logits rows: use `relation: tokens`"));
            }
            if !c.workload.ignore_eos {
                out.push(Diagnostic::at(
                    &c.workload.outputs,
                    "refinement always decodes workload.outputs tokens: set workload.ignore_eos: true",
                ));
            }
            for a in &c.arms {
                match &a.refine {
                    None => {
                        out.push(Diagnostic::at(&a.id, format!("arm `{}`: every arm of a refinement campaign needs `refine`", a.id.value)))
                    }
                    Some(ra) => {
                        if a.fault.is_some() {
                            out.push(Diagnostic::at(&a.id, format!("arm `{}`: fault cells do not apply to refinement", a.id.value)));
                        }
                        if a.experts == Some(ExpertsMode::Host) {
                            out.push(Diagnostic::at(
                                &a.id,
                                format!("arm `{}`: a refinement arm's verifier is `resident` or streamed (`plan`)", a.id.value),
                            ));
                        }
                        match (ra.mode, ra.tau, ra.verify_all) {
                            (RefineMode::Refine, None, false) => out.push(Diagnostic::at(
                                &a.id,
                                format!("arm `{}`: mode refine needs `tau` or `verify_all: true`", a.id.value),
                            )),
                            (RefineMode::Refine, Some(t), _) if !(t.is_finite() && t >= 0.0) => {
                                out.push(Diagnostic::at(&a.id, format!("arm `{}`: tau must be a finite number at least 0", a.id.value)))
                            }
                            (RefineMode::Base | RefineMode::Verifier, t, v) if t.is_some() || v => out.push(Diagnostic::at(
                                &a.id,
                                format!("arm `{}`: `tau` and `verify_all` apply only to mode refine", a.id.value),
                            )),
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    out
}

/// The JSON Schema of the campaign file, as checked in at `schemas/campaign.schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(Campaign);
    let mut s = serde_json::to_string_pretty(&schema).expect("a schema serializes");
    s.push('\n');
    s
}

/// Canonical JSON of a campaign and its SHA-256: the preregistered identity.
pub fn canonical(c: &Campaign) -> Result<(String, String)> {
    let text = crate::util::canonical_json_of(c)?;
    let digest = crate::util::sha256(text.as_bytes());
    Ok((text, digest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::Arch;

    /// A recipe without `arch` forges what `model forge` without `--arch` does, and its frozen
    /// form names the architecture either way.
    #[test]
    fn a_recipe_takes_its_presets_architecture() {
        let recipe = |forge: &str| -> ForgeRecipe {
            let text = format!("path: m.gguf\nsha256: {}\nforge: {forge}\n", "0".repeat(64));
            from_yaml::<ModelSpec>(&text).unwrap().forge.unwrap()
        };
        assert_eq!(recipe("{ preset: seed }").arch, Arch::Qwen3next);
        assert_eq!(recipe("{ preset: tiny }").arch, Arch::Qwen3moe);
        assert_eq!(recipe("{ preset: seed, arch: qwen3moe }").arch, Arch::Qwen3moe);
        let frozen = serde_json::to_value(recipe("{ preset: tiny }")).unwrap();
        assert_eq!(frozen["arch"], "qwen3moe");
        assert!(
            from_yaml::<ModelSpec>(&format!("path: m.gguf\nsha256: {}\nforge: {{ preset: seed, layer: 3 }}\n", "0".repeat(64))).is_err()
        );
    }
}
