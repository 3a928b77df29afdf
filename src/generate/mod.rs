//! One generate run: greedy decoding through the engine with every oracle surface recorded,
//! one token per target decode or, with a proposer, several (`draft`).

pub mod draft;
pub mod mtp;
pub mod session;

use crate::engine::{Context, ExpertSource, Model};
use crate::exec::{DeviceCheck, ExecParams, ExecRequest, PlacementReport};
use crate::identity::build_identity;
use crate::inventory::Inventory;
use crate::record::format::{
    DraftParams, ExpertsParams, ExpertsReport, GenerateCounts, GenerateParams, Outcome, ProcessReport, ProposerKind, SpeculativeReport,
};
use crate::record::{GenerateRecord, Staging, GENERATE_FORMAT};
use crate::routes::RouteEvent;
use anyhow::{bail, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::Instant;

pub struct GenerateSpec {
    pub model: PathBuf,
    pub prompt: Vec<u8>,
    pub n_predict: u32,
    /// Without a context, the run's is its work: the prompt's tokens plus `n_predict`, up to
    /// the model's trained length ([`crate::bounds::context`]).
    pub exec: ExecRequest,
    pub ignore_eos: bool,
    /// A proposer whose greedy drafts the target checks, several per traversal.
    pub draft: Option<Draft>,
    pub record: PathBuf,
    /// Seal the record where it is committed ([`Staging::sealing`]).
    pub seal: bool,
}

/// Temporal amortization's proposer and the most drafts one target traversal checks.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Draft {
    pub proposer: Proposer,
    pub max: u32,
}

/// Who drafts for the target.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Proposer {
    /// Another model with the target's vocabulary, resident, in its own context.
    Model(PathBuf),
    /// The target's own multi-token-prediction (nextn) head, in an MTP context on the same
    /// model, fed the target's hidden rows; its experts come from the target's source.
    Mtp,
}

impl Draft {
    /// The proposer's file, where it is another model.
    pub fn model(&self) -> Option<&std::path::Path> {
        match &self.proposer {
            Proposer::Model(m) => Some(m),
            Proposer::Mtp => None,
        }
    }

    pub fn is_mtp(&self) -> bool {
        self.proposer == Proposer::Mtp
    }
}

pub use crate::record::format::{ModelIdentity, Timing};

/// Loads `path`, resident or with its experts from `source`. llama.cpp reads a served model's
/// non-expert tensors with O_DIRECT where it can, through the page cache where the file system
/// refuses it; cached pages are copies, not the run's working set, so they are given back
/// rather than kept charged.
pub fn load_model(path: &std::path::Path, source: Option<Box<dyn ExpertSource>>) -> Result<Model> {
    load_model_full(path, source, false)
}

/// [`load_model`], with the model's nextn (MTP) blocks where `mtp`.
pub fn load_model_full(path: &std::path::Path, source: Option<Box<dyn ExpertSource>>, mtp: bool) -> Result<Model> {
    let served = source.is_some();
    let model = Model::load_full(path, source, mtp)?;
    if served {
        for f in crate::gguf::set::files(path)? {
            crate::util::drop_file_cache(&f)?;
        }
    }
    Ok(model)
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub record: PathBuf,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub timing: Timing,
    pub response: String,
    pub routes: Vec<RouteEvent>,
    pub digests: Vec<(String, String)>,
}

/// Index of the largest value; the first one on ties. NaN never wins.
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || row[best].is_nan() {
            best = i;
        }
    }
    best
}

/// Rows `from..` of `logits` must be finite: a NaN or infinite row has no argmax, and taking
/// one would turn a broken model into a short, "completed" run.
pub fn check_finite(logits: &[f32], n_vocab: usize, from: usize) -> Result<()> {
    for (i, row) in logits.chunks(n_vocab.max(1)).enumerate().skip(from) {
        if let Some(j) = row.iter().position(|v| !v.is_finite()) {
            bail!("logits row {i} is not finite (vocabulary entry {j} is {})", row[j]);
        }
    }
    Ok(())
}

fn f32_bytes(rows: &[f32]) -> Vec<u8> {
    rows.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Before decoding, with every buffer of the run allocated (weights, slot pools, KV cache,
/// compute buffers): their sizes on each device, refused over `--gpu-budget`, and the process's
/// device memory as NVML reports it where a GPU is observed (refused over the budget too).
static DEVICE_CGROUP: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The memory cgroup of the RPC device's server: read after the run, its kernel peak goes on
/// record as the device's audit. Process-wide, like the placement; once.
pub fn audit_device_at(dir: PathBuf) {
    let _ = DEVICE_CGROUP.set(dir);
}

/// A device that was OOM-killed, or whose peak reached the budget, fails the run closed.
fn audit_verdict(a: &crate::observe::DeviceAudit, budget: Option<u64>) -> Result<()> {
    if a.oom_kills > 0 {
        bail!("the device server's cgroup saw {} OOM kills during the run ({})", a.oom_kills, a.cgroup);
    }
    match (a.peak, budget) {
        (Some(p), Some(b)) if p > b => {
            bail!("the device's memory peaked at {p} bytes, over the {b}-byte budget (its server's cgroup {})", a.cgroup)
        }
        (None, Some(b)) => bail!("the device server's cgroup keeps no peak: the {b}-byte budget cannot be audited ({})", a.cgroup),
        _ => Ok(()),
    }
}

pub fn device_check(ctx: &Context) -> Result<DeviceCheck> {
    let budget = crate::engine::placement().gpu_budget;
    // A device server's hard cap bounds the device as a budget does: buffers that cannot fit
    // under it are refused before decoding rather than killed by the kernel during it.
    let cap = match DEVICE_CGROUP.get() {
        Some(dir) => crate::observe::audit_device(dir)?.limit,
        None => None,
    };
    let buffers = ctx.device_memory();
    let on_devices: Vec<&crate::exec::DeviceBuffers> = buffers.iter().filter(|b| b.device != "CPU" && b.total() > 0).collect();
    let device_bytes = on_devices.iter().map(|b| b.total()).sum();
    if let Some(c) = cap.filter(|&c| device_bytes > c) {
        bail!("the device server's memory cap is {c} bytes, and the run's buffers take {device_bytes} bytes on its devices before decoding; refused");
    }
    if let Some(b) = budget.filter(|&b| device_bytes > b) {
        let each: Vec<String> = on_devices
            .iter()
            .map(|d| {
                format!(
                    "{} {} (weights {}, KV/state {}, compute {}, slot pools {})",
                    d.device,
                    d.total(),
                    d.model,
                    d.context,
                    d.compute,
                    d.pools
                )
            })
            .collect();
        bail!(
            "--gpu-budget {b}: the run's buffers take {device_bytes} bytes on its devices before decoding ({}); refused",
            each.join("; ")
        );
    }
    let mut check = DeviceCheck { observed: false, own_bytes: None, reason: None, budget, buffers, device_bytes };
    match crate::observe::gpu::own_usage() {
        Ok(used) => {
            if let Some(b) = budget.filter(|&b| used >= b) {
                bail!("--gpu-budget {b}: the run's device memory is {used} bytes before decoding (NVML, this process); refused");
            }
            (check.observed, check.own_bytes) = (true, Some(used));
        }
        Err(why) => check.reason = Some(why.to_string()),
    }
    Ok(check)
}

/// How a run picks each token.
pub const SAMPLING: &str = "greedy (first maximum)";

pub fn run(spec: &GenerateSpec) -> Result<Summary> {
    run_with(spec, |_| Ok(None))
}

/// The sequence's recurrent state after prefill and after every decode step, for models that
/// keep one: each state's SHA-256, and the last state's bytes.
#[derive(Default)]
struct RecurrentStates {
    digests: Vec<u8>,
    last: Option<Vec<u8>>,
    capture_s: f64,
}

impl RecurrentStates {
    fn capture(&mut self, ctx: &Context) -> Result<()> {
        let t = Instant::now();
        if let Some(state) = ctx.recurrent_state()? {
            self.digests.extend_from_slice(&Sha256::digest(&state));
            self.last = Some(state);
        }
        self.capture_s += t.elapsed().as_secs_f64();
        Ok(())
    }
}

/// A run whose experts come from the source `make_source` builds for the model (None: resident).
pub fn run_with(spec: &GenerateSpec, make_source: impl FnOnce(&Inventory) -> Result<Option<Box<dyn ExpertSource>>>) -> Result<Summary> {
    let inv = Inventory::of(&spec.model)?;
    if spec.prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let staging = Staging::new(&spec.record)?.sealing(spec.seal);
    let Loaded { model_id, experts, model, load_s, prompt, exec } = load_for_run(spec, &inv, make_source(&inv)?)?;
    let n_vocab = model.n_vocab();
    // A drafted target takes back up to `max` positions per traversal, recurrent states too.
    let rollback = spec.draft.as_ref().map_or(0, |d| d.max);
    let mut ctx = Context::with_rollback(&model, exec, true, rollback)?;
    if spec.draft.as_ref().is_some_and(Draft::is_mtp) {
        ctx.keep_hidden(false);
    }
    let mut params = params_before_decode(spec, exec, experts, &ctx)?;
    let mut run = Decoding::new(prompt.len() + spec.n_predict as usize, n_vocab, spec.n_predict);
    let (decoded, speculative) = match &spec.draft {
        Some(d) => match run.drafted(spec, d, Target { model: &model, inv: &inv, id: &model_id }, &mut ctx, &prompt, &mut params) {
            Ok(r) => (Ok(()), Some(r)),
            Err(e) => (Err(e), None),
        },
        None => (run.decode(spec, &model, &mut ctx, &prompt), None),
    };
    let mut routes = std::mem::take(&mut run.routes);
    routes.extend(ctx.take_routes());
    let route_k = ctx.route_k().unwrap_or(0);
    drop(ctx);
    let source_report = model.with_source(|s| s.finish().map(ExpertsReport::from));
    let source_surfaces = model.with_source(|s| s.surfaces()).unwrap_or_default();
    let mut ran = Ran { model_id, params, prompt, n_vocab, route_k, load_s };
    if let Err(e) = closing_checks(decoded, &source_report, &mut ran.params) {
        let dir = commit_failed(staging, ran, &e, source_report)?;
        return Err(e.context(format!("run failed closed; record {}", dir.display())));
    }
    let source_report = source_report.transpose()?;
    let mut staging = staging;
    write_surfaces(&mut staging, spec, &ran, &run, &routes, &source_surfaces)?;
    commit_completed(staging, ran, run, routes, source_report, speculative)
}

/// The model a drafted run decodes, with its inventory and identity as the run has them.
struct Target<'a> {
    model: &'a Model,
    inv: &'a Inventory,
    id: &'a ModelIdentity,
}

impl Decoding {
    /// Readies the proposer (another model, resident, refused where its vocabulary is not the
    /// target's, since its drafts are token ids the target checks; or the target's own MTP
    /// head), names it in the run's parameters and decodes with it. Any failure fails the run
    /// closed, on record.
    fn drafted(
        &mut self,
        spec: &GenerateSpec,
        d: &Draft,
        Target { model: target, inv, id }: Target,
        ctx: &mut Context,
        prompt: &[i32],
        params: &mut GenerateParams,
    ) -> Result<SpeculativeReport> {
        if d.max == 0 || d.max > crate::bounds::MAX_DRAFT {
            bail!("the draft length must be 1 to {} (got {})", crate::bounds::MAX_DRAFT, d.max);
        }
        // A traversal must be one ubatch: recurrent states are kept per position of one ubatch.
        if d.max >= spec.exec.n_ubatch {
            bail!("{} drafts and the committed token do not fit one ubatch of {}", d.max, spec.exec.n_ubatch);
        }
        let mut drafting = draft::Drafting {
            n_predict: spec.n_predict,
            ignore_eos: spec.ignore_eos,
            k_max: d.max,
            target: "target",
            proposer: "proposer",
        };
        let Some(path) = d.model() else {
            let head = mtp::check(inv, target)?;
            params.draft = Some(DraftParams { model: id.clone(), draft_max: d.max, proposer: ProposerKind::Mtp, head_layer: Some(head) });
            drafting.proposer = "MTP head";
            let mut proposer = mtp::MtpHead::new(target, Context::mtp(target, ctx.params(), true)?);
            let report = self.decode_drafted(&drafting, target, ctx, &mut proposer, prompt);
            self.head_routes = proposer.into_routes();
            return report;
        };
        let inv = Inventory::of(path).map_err(|e| anyhow::anyhow!("the proposer {}: {e:#}", path.display()))?;
        params.draft = Some(DraftParams {
            model: ModelIdentity::of(path, &inv, Some(crate::digests::Loads::All))?,
            draft_max: d.max,
            proposer: ProposerKind::Model,
            head_layer: None,
        });
        let m = Model::load(path)?;
        if let Some(diff) = target.vocabulary_difference(&m) {
            bail!("the proposer {} does not share the target's vocabulary ({diff}): refused", path.display());
        }
        // The proposer's context is the target's: its work is the same prompt and outputs.
        let mut proposer = draft::Proposer::new(&m, Context::new(&m, ctx.params(), false)?);
        self.decode_drafted(&drafting, target, ctx, &mut proposer, prompt)
    }
}

/// The model loaded for a run, with what its record says of it.
struct Loaded {
    model_id: ModelIdentity,
    experts: ExpertsParams,
    model: Model,
    load_s: f64,
    prompt: Vec<i32>,
    /// The run's parameters, its context sized.
    exec: ExecParams,
}

/// Loads the model (its experts from `source`, if any) and tokenizes the prompt, refusing a
/// prompt that tokenizes to nothing or does not fit the context with its predictions; sizes the
/// context to the work where the spec leaves it out.
fn load_for_run(spec: &GenerateSpec, inv: &Inventory, mut source: Option<Box<dyn ExpertSource>>) -> Result<Loaded> {
    let loads = if source.is_some() { crate::digests::Loads::NonExpert } else { crate::digests::Loads::All };
    let model_id = ModelIdentity::of(&spec.model, inv, Some(loads))?;
    let experts = match &mut source {
        Some(s) => s.describe().into(),
        None => ExpertsParams::Resident,
    };
    let t0 = Instant::now();
    let model = load_model_full(&spec.model, source, spec.draft.as_ref().is_some_and(Draft::is_mtp))?;
    let load_s = t0.elapsed().as_secs_f64();
    let prompt = model.tokenize(&spec.prompt, true)?;
    if prompt.is_empty() {
        bail!("the prompt tokenized to nothing");
    }
    let n_ctx = crate::bounds::context(spec.exec.n_ctx, "prompt", prompt.len(), spec.n_predict, inv.trained_context().as_ref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", spec.model.display()))?;
    Ok(Loaded { model_id, experts, model, load_s, prompt, exec: spec.exec.with_ctx(n_ctx) })
}

/// The run's parameters, with the device check made once every buffer is allocated.
fn params_before_decode(spec: &GenerateSpec, exec: ExecParams, experts: ExpertsParams, ctx: &Context) -> Result<GenerateParams> {
    let device = device_check(ctx)?;
    Ok(GenerateParams {
        n_predict: spec.n_predict,
        ignore_eos: spec.ignore_eos,
        experts,
        sampling: SAMPLING.into(),
        exec,
        placement: Some(PlacementReport { device_before_decode: Some(device), ..crate::engine::placement_report() }),
        draft: None,
    })
}

/// What the record states of a run beyond its decoding.
struct Ran {
    model_id: ModelIdentity,
    params: GenerateParams,
    prompt: Vec<i32>,
    n_vocab: usize,
    route_k: usize,
    load_s: f64,
}

/// Greedy decoding's state: every logits row, the tokens and bytes generated, why it stopped.
struct Decoding {
    logits: Vec<f32>,
    generated: Vec<i32>,
    response: Vec<u8>,
    stop: &'static str,
    prefill_s: f64,
    decode_s: f64,
    recurrent: RecurrentStates,
    /// Routes of committed positions (a drafted run's; a plain run's stay in its context).
    routes: Vec<RouteEvent>,
    /// Where each generated token came from (a drafted run's).
    origins: Vec<draft::Origin>,
    /// The proposer's routes where it is the model's own MTP head: every decode of its block,
    /// drafts and catch-ups, as its context numbered them.
    head_routes: Vec<RouteEvent>,
}

impl Decoding {
    fn new(rows: usize, n_vocab: usize, n_predict: u32) -> Decoding {
        Decoding {
            logits: Vec::with_capacity(rows * n_vocab),
            generated: Vec::with_capacity(n_predict as usize),
            response: Vec::new(),
            stop: "n_predict",
            prefill_s: 0.0,
            decode_s: 0.0,
            recurrent: RecurrentStates::default(),
            routes: Vec::new(),
            origins: Vec::new(),
            head_routes: Vec::new(),
        }
    }

    /// Prefill, then one greedy step per token until `n_predict` tokens or, unless EOS is
    /// ignored, the end of generation; every row is checked finite as it arrives.
    fn decode(&mut self, spec: &GenerateSpec, model: &Model, ctx: &mut Context, prompt: &[i32]) -> Result<()> {
        let n_vocab = model.n_vocab();
        let t1 = Instant::now();
        ctx.decode(prompt, true, &mut self.logits)?;
        check_finite(&self.logits, n_vocab, 0)?;
        self.prefill_s = t1.elapsed().as_secs_f64();
        model.with_source(|s| s.prompted());
        self.recurrent.capture(ctx)?;
        let t2 = Instant::now();
        while self.generated.len() < spec.n_predict as usize {
            let next = argmax(&self.logits[self.logits.len() - n_vocab..]) as i32;
            if !spec.ignore_eos && model.is_eog(next) {
                self.stop = "end_of_generation";
                break;
            }
            self.generated.push(next);
            self.response.extend(model.token_bytes(next));
            if self.generated.len() == spec.n_predict as usize {
                break;
            }
            let from = self.logits.len() / n_vocab.max(1);
            ctx.decode(&[next], true, &mut self.logits)?;
            check_finite(&self.logits, n_vocab, from)?;
            self.recurrent.capture(ctx)?;
        }
        // Capturing the states is the harness's work, not the engine's: not decode time.
        self.decode_s = t2.elapsed().as_secs_f64() - self.recurrent.capture_s;
        Ok(())
    }
}

/// After decoding: a source that cannot close clean (or show its service complete) fails the
/// run, and so does a device server's audit over the budget.
fn closing_checks(decoded: Result<()>, source_report: &Option<Result<ExpertsReport>>, params: &mut GenerateParams) -> Result<()> {
    let decoded = match (decoded, source_report) {
        (Ok(()), Some(Err(f))) => Err(anyhow::anyhow!("the expert source did not close: {f:#}")),
        (d, _) => d,
    };
    decoded.and_then(|()| {
        let Some(dir) = DEVICE_CGROUP.get() else { return Ok(()) };
        let audit = crate::observe::audit_device(dir)?;
        let placement = params.placement.as_mut().expect("set before decoding");
        let verdict = audit_verdict(&audit, placement.gpu_budget);
        placement.device_audit = Some(audit);
        verdict
    })
}

/// Fail closed, and keep the evidence: nothing of the failed step is accepted, and the record
/// says what failed and how the source closed.
fn commit_failed(staging: Staging, ran: Ran, e: &anyhow::Error, source_report: Option<Result<ExpertsReport>>) -> Result<PathBuf> {
    let experts = match source_report {
        Some(Ok(r)) => Some(r),
        Some(Err(f)) => Some(ExpertsReport::FinishError(format!("{f:#}"))),
        None => None,
    };
    let record = GenerateRecord {
        format: GENERATE_FORMAT.into(),
        outcome: Outcome::Failed,
        error: Some(format!("{e:#}")),
        model: Some(ran.model_id),
        build: build_identity()?,
        params: Some(ran.params),
        counts: Some(GenerateCounts {
            prompt_tokens: ran.prompt.len(),
            generated_tokens: 0,
            logits_rows: 0,
            n_vocab: ran.n_vocab,
            route_events: 0,
            route_k: ran.route_k,
            stop: "failed".into(),
        }),
        timing: None,
        experts: Some(experts),
        process: Some(ProcessReport::now()),
        surfaces: Default::default(),
        resources: None,
        cache_protocol: None,
        speculative: None,
    };
    staging.commit(&record)
}

/// The run's surfaces: prompt, tokens, logits rows, response, routes, the recurrent states
/// where the model keeps one, and what the source adds.
fn write_surfaces(
    staging: &mut Staging,
    spec: &GenerateSpec,
    ran: &Ran,
    run: &Decoding,
    routes: &[RouteEvent],
    source_surfaces: &[crate::engine::SourceSurface],
) -> Result<()> {
    let tokens: Vec<u8> = ran.prompt.iter().chain(&run.generated).flat_map(|t| t.to_le_bytes()).collect();
    staging.surface("prompt", "prompt.bin", &spec.prompt, 1, false)?;
    staging.surface("tokens", "tokens.bin", &tokens, 4, false)?;
    staging.surface("logits", "logits.bin", &f32_bytes(&run.logits), ran.n_vocab as u64 * 4, true)?;
    staging.surface("response", "response.bin", &run.response, 1, false)?;
    staging.surface("routes", "routes.bin", &crate::routes::encode(routes, ran.route_k), crate::routes::unit_bytes(ran.route_k), false)?;
    if !run.head_routes.is_empty() {
        let bytes = crate::routes::encode(&run.head_routes, ran.route_k);
        staging.surface("mtp_routes", "mtp_routes.bin", &bytes, crate::routes::unit_bytes(ran.route_k), false)?;
    }
    if let Some(last) = &run.recurrent.last {
        // One SHA-256 per state (after prefill, after each decode step), and the last state.
        staging.surface("recurrent", "recurrent.bin", &run.recurrent.digests, 32, false)?;
        staging.surface("recurrent_state", "recurrent_state.bin", last, 1, false)?;
    }
    for s in source_surfaces {
        staging.surface(&s.name, &s.file, &s.bytes, 1, false)?;
    }
    Ok(())
}

/// Seals the completed run's record and sums it up.
fn commit_completed(
    staging: Staging,
    ran: Ran,
    run: Decoding,
    routes: Vec<RouteEvent>,
    experts: Option<ExpertsReport>,
    speculative: Option<SpeculativeReport>,
) -> Result<Summary> {
    let decode_steps = run.generated.len().saturating_sub(1);
    let timing = Timing {
        load_s: ran.load_s,
        prefill_s: run.prefill_s,
        decode_s: run.decode_s,
        prefill_tokens_per_s: ran.prompt.len() as f64 / run.prefill_s.max(1e-9),
        decode_tokens_per_s: decode_steps as f64 / run.decode_s.max(1e-9),
    };
    let counts = GenerateCounts {
        prompt_tokens: ran.prompt.len(),
        generated_tokens: run.generated.len(),
        logits_rows: run.logits.len() / ran.n_vocab,
        n_vocab: ran.n_vocab,
        route_events: routes.len(),
        route_k: ran.route_k,
        stop: run.stop.into(),
    };
    let digests = staging.surfaces().iter().map(|(k, s)| (k.clone(), s.sha256.clone())).collect();
    let record = GenerateRecord {
        format: GENERATE_FORMAT.into(),
        outcome: Outcome::Completed,
        error: None,
        model: Some(ran.model_id),
        build: build_identity()?,
        params: Some(ran.params),
        counts: Some(counts),
        timing: Some(timing.clone()),
        experts: Some(experts),
        process: Some(ProcessReport::now()),
        surfaces: staging.surfaces().clone(),
        resources: None,
        cache_protocol: None,
        speculative,
    };
    let dir = staging.commit(&record)?;
    Ok(Summary {
        record: dir,
        prompt_tokens: ran.prompt.len(),
        generated_tokens: run.generated.len(),
        timing,
        response: String::from_utf8_lossy(&run.response).into_owned(),
        routes,
        digests,
    })
}

/// Per layer: how many distinct experts were selected, and the most-used one's share.
pub fn route_summary(routes: &[RouteEvent]) -> Vec<(u32, usize, usize, f64)> {
    let mut per: std::collections::BTreeMap<u32, std::collections::BTreeMap<i32, usize>> = Default::default();
    for e in routes {
        let m = per.entry(e.layer).or_default();
        for &x in &e.experts {
            *m.entry(x).or_default() += 1;
        }
    }
    per.into_iter()
        .map(|(layer, m)| {
            let total: usize = m.values().sum();
            let top = m.values().copied().max().unwrap_or(0);
            (layer, m.len(), total, top as f64 / total.max(1) as f64)
        })
        .collect()
}
