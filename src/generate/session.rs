//! A session: many requests through one process, one model load and one expert source. Each
//! request's sequence is cleared before it and its source readied as `between` says; each gets
//! its own sealed generate record, and the session's record names them in order.

use super::{
    closing_checks, commit_completed, commit_failed, load_model, params_before_decode, write_surfaces, Decoding, GenerateSpec, Ran,
};
use crate::engine::{Context, ExpertSource};
use crate::exec::ExecRequest;
use crate::inventory::Inventory;
use crate::plan::Closure;
use crate::record::format::{ExpertsParams, ExpertsReport, ModelIdentity, Outcome};
use crate::record::Staging;
use crate::session::{score, Aggregate, Between, Request, Score};
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

pub const SESSION_FORMAT: &str = "sovereign.session/1";

pub struct SessionSpec {
    pub model: PathBuf,
    pub requests: Vec<Request>,
    pub between: Between,
    /// Without a context, the session's is its largest request's work.
    pub exec: ExecRequest,
    pub ignore_eos: bool,
    /// The session's directory (must not exist): `requests/NNNN` per request, by its place, and `session`.
    pub record: PathBuf,
    pub seal: bool,
}

/// The session's record: its requests in order, what each took, and the source's ledger at
/// teardown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub format: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub model: ModelIdentity,
    /// What the source carried from each request to the next (resident runs carry nothing).
    pub between: Between,
    pub n_ctx: u32,
    pub load_s: f64,
    pub requests: Vec<RequestEntry>,
    /// The mean task scores of the requests that named expected answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<Aggregate>,
    /// The expert source's ledger at teardown (served runs): it must balance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closure: Option<Closure>,
    /// Requests, resets and epochs over the session (served runs): checked at teardown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<SessionLedger>,
}

/// The session's own closure: every request after the first began with one reset (cold ones
/// counted too), the Plan's epoch is the number of resets, and its ledger balanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLedger {
    pub requests: u64,
    pub resets: u64,
    pub cold_resets: u64,
    pub epoch: u64,
    pub balanced: bool,
}

impl SessionLedger {
    /// Why the ledger of a session that ran every request with `between` does not close.
    pub fn unbalanced(&self, between: Between) -> Option<String> {
        let expect_cold = if between == Between::Cold { self.requests.saturating_sub(1) } else { 0 };
        let why = if !self.balanced {
            "the Plan's ledger did not balance"
        } else if self.resets != self.requests.saturating_sub(1) {
            "not one reset before each request after the first"
        } else if self.cold_resets != expect_cold {
            "cold resets do not match `between`"
        } else if self.epoch != self.resets {
            "the epoch is not the number of resets"
        } else {
            return None;
        };
        Some(format!("the session's ledger does not close: {why} ({self:?})"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestEntry {
    pub id: String,
    /// Its record, relative to the session's directory, and that record's `record.json` digest.
    pub record: String,
    pub record_sha256: String,
    pub outcome: Outcome,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Readying the source before it (none for the first), and that plus its decoding.
    pub between_s: f64,
    pub wall_s: f64,
    /// What a Plan served it: bytes read from storage, hits and misses, and its epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<Served>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<Score>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    pub read_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub epoch: u64,
    /// The resets before it, and of those the cold ones.
    pub resets: u64,
    pub cold_resets: u64,
}

/// Runs every request in order through one model load and the source `make_source` builds
/// (None: resident). The first request that fails ends the session closed: its record says
/// why, later requests do not run, and the session's record says which failed.
pub fn run_with(
    spec: &SessionSpec,
    make_source: impl FnOnce(&Inventory) -> Result<Option<Box<dyn ExpertSource>>>,
) -> Result<SessionRecord> {
    if spec.requests.is_empty() {
        bail!("a session needs at least one request");
    }
    if std::fs::symlink_metadata(&spec.record).is_ok() {
        bail!("{}: already exists; records are write-once", spec.record.display());
    }
    let inv = Inventory::of(&spec.model)?;
    let mut source = make_source(&inv)?;
    let loads = if source.is_some() { crate::digests::Loads::NonExpert } else { crate::digests::Loads::All };
    let model_id = ModelIdentity::of(&spec.model, &inv, Some(loads))?;
    let experts = source.as_mut().map_or(ExpertsParams::Resident, |s| s.describe().into());
    let served = source.is_some();
    let t0 = Instant::now();
    let model = load_model(&spec.model, source)?;
    let load_s = t0.elapsed().as_secs_f64();
    let mut prompts = Vec::with_capacity(spec.requests.len());
    let mut n_ctx = 0;
    for r in &spec.requests {
        let p = model.tokenize(&r.prompt, true)?;
        if p.is_empty() {
            bail!("request {:?}: the prompt tokenized to nothing", r.id);
        }
        let n = crate::bounds::context(spec.exec.n_ctx, "prompt", p.len(), r.n_predict, inv.trained_context().as_ref())
            .map_err(|e| anyhow!("{}: request {:?}: {e}", spec.model.display(), r.id))?;
        n_ctx = n_ctx.max(n);
        prompts.push(p);
    }
    let exec = spec.exec.with_ctx(n_ctx);
    let mut ctx = Context::new(&model, exec, true)?;
    let mut record = SessionRecord {
        format: SESSION_FORMAT.into(),
        outcome: Outcome::Completed,
        error: None,
        model: model_id.clone(),
        between: spec.between,
        n_ctx,
        load_s,
        requests: Vec::new(),
        scores: None,
        closure: None,
        ledger: None,
    };
    let shared = Shared { model_id, experts, exec, load_s };
    let mut failed = None;
    for (i, (r, prompt)) in spec.requests.iter().zip(prompts).enumerate() {
        let (entry, failure) = serve_request(spec, &shared, i, r, prompt, &model, &mut ctx)?;
        record.requests.push(entry);
        if failure.is_some() {
            failed = failure;
            break;
        }
    }
    drop(ctx);
    if served {
        let closed = model.with_source(|s| s.finish()).transpose();
        match closed {
            Ok(Some(crate::plan::report::SourceReport::Plan(p))) => {
                let sum = |f: fn(&Served) -> u64| record.requests.iter().filter_map(|r| r.served.as_ref()).map(f).sum();
                let ledger = SessionLedger {
                    requests: record.requests.len() as u64,
                    resets: sum(|s| s.resets),
                    cold_resets: sum(|s| s.cold_resets),
                    epoch: p.closure.epoch,
                    balanced: p.clean_closure,
                };
                if failed.is_none() {
                    failed = ledger.unbalanced(spec.between);
                }
                record.ledger = Some(ledger);
                record.closure = Some(p.closure);
            }
            Ok(_) => {}
            Err(e) => {
                failed.get_or_insert(format!("the expert source did not close: {e:#}"));
            }
        }
    }
    record.scores = score::aggregate(record.requests.iter().map(|r| &r.score));
    if let Some(e) = &failed {
        record.outcome = Outcome::Failed;
        record.error = Some(e.clone());
    }
    let staging = Staging::new(&spec.record.join("session"))?.sealing(spec.seal);
    let dir = staging.commit(&record)?;
    match failed {
        Some(e) => Err(anyhow!("{e}; session record {}", dir.display())),
        None => Ok(record),
    }
}

/// What every request of a session shares.
struct Shared {
    model_id: ModelIdentity,
    experts: ExpertsParams,
    exec: crate::exec::ExecParams,
    load_s: f64,
}

/// Request `i` of the session: its sequence cleared and its source readied (after the first),
/// decoded, and its record committed; with why it failed, where it did.
fn serve_request(
    spec: &SessionSpec,
    shared: &Shared,
    i: usize,
    r: &Request,
    prompt: Vec<i32>,
    model: &crate::engine::Model,
    ctx: &mut Context,
) -> Result<(RequestEntry, Option<String>)> {
    let started = Instant::now();
    let dir = format!("requests/{i:04}");
    let rspec = GenerateSpec {
        model: spec.model.clone(),
        prompt: r.prompt.clone(),
        n_predict: r.n_predict,
        exec: spec.exec,
        ignore_eos: spec.ignore_eos,
        draft: None,
        record: spec.record.join(&dir),
        seal: spec.seal,
    };
    let staging = Staging::new(&rspec.record)?.sealing(spec.seal);
    let params = params_before_decode(&rspec, shared.exec, shared.experts.clone(), ctx)?;
    let ready = if i == 0 {
        Ok(())
    } else {
        ctx.clear();
        model.with_source(|s| s.between(spec.between, r.n_predict)).unwrap_or(Ok(()))
    };
    let between_s = started.elapsed().as_secs_f64();
    let mut run = Decoding::new(prompt.len() + r.n_predict as usize, model.n_vocab(), r.n_predict);
    let decoded = ready.and_then(|()| run.decode(&rspec, model, ctx, &prompt));
    let routes = ctx.take_routes();
    let surfaces = model.with_source(|s| s.surfaces()).unwrap_or_default();
    let report = model.with_source(|s| s.end_request().map(ExpertsReport::from));
    let entry_served = match &report {
        Some(Ok(ExpertsReport::Plan(p))) => Some(Served {
            read_bytes: p.telemetry.q_run.physical_bytes,
            hits: p.telemetry.hits,
            misses: p.telemetry.misses,
            epoch: p.closure.epoch,
            resets: p.telemetry.resets,
            cold_resets: p.telemetry.cold_resets,
        }),
        _ => None,
    };
    let route_k = ctx.route_k().unwrap_or(0);
    let mut ran = Ran {
        model_id: shared.model_id.clone(),
        params,
        prompt,
        n_vocab: model.n_vocab(),
        route_k,
        load_s: if i == 0 { shared.load_s } else { 0.0 },
    };
    let mut failed = None;
    let prompt_tokens = ran.prompt.len();
    let (committed, outcome, generated_tokens, response) = match closing_checks(decoded, &report, &mut ran.params) {
        Err(e) => {
            let d = commit_failed(staging, ran, &e, report)?;
            failed = Some(format!("request {:?} failed: {e:#}", r.id));
            (d, Outcome::Failed, 0, None)
        }
        Ok(()) => {
            let report = report.transpose()?;
            let mut staging = staging;
            write_surfaces(&mut staging, &rspec, &ran, &run, &routes, &surfaces)?;
            let s = commit_completed(staging, ran, run, routes, report, None)?;
            (s.record, Outcome::Completed, s.generated_tokens, Some(s.response))
        }
    };
    let entry = RequestEntry {
        id: r.id.clone(),
        record: dir,
        record_sha256: crate::util::sha256_file(&committed.join("record.json"))?,
        outcome,
        prompt_tokens,
        generated_tokens,
        between_s,
        wall_s: started.elapsed().as_secs_f64(),
        served: entry_served,
        score: response.and_then(|text| score::score(&text, &r.expected)),
    };
    Ok((entry, failed))
}
