//! A session: many requests through one process, one model load and one expert source. Each
//! request's sequence is cleared before it and its source readied as `between` says; each gets
//! its own sealed generate record, and the session's record names them in order.

use super::{
    closing_checks, commit_completed, commit_failed, load_model, params_before_decode, write_surfaces, Decoding, GenerateSpec, Ran,
};
use crate::engine::{Context, ExpertSource};
use crate::exec::ExecRequest;
use crate::inventory::Inventory;
use crate::plan::report::SourceReport;
use crate::record::format::{ExpertsParams, ExpertsReport, ModelIdentity, Outcome};
use crate::record::Staging;
use crate::session::{score, Between, Request};
use crate::source::fault::FaultCell;
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::time::Instant;

pub use crate::record::format::{Renewal, RequestEntry, Served, SessionLedger, SessionRecord, SESSION_FORMAT};

pub struct SessionSpec {
    pub model: PathBuf,
    pub requests: Vec<Request>,
    pub between: Between,
    /// Without a context, the session's is its largest request's work.
    pub exec: ExecRequest,
    pub ignore_eos: bool,
    /// The session's record (must not exist); each request's record is committed inside it,
    /// at `requests/NNNN` by its place, before the session's is.
    pub record: PathBuf,
    pub seal: bool,
}

/// Runs every request in order through one model load and the source `make_source` builds
/// (None: resident) with a request's own fault cell (None: the source's own) for the tokens it
/// decodes after its prompt. A request that fails closed fails the session (its record and the
/// session's say why) and the session goes on: the next request is served by a new Plan in
/// the failed one's place, as a request with its own fault cell is. A source that cannot be
/// readied for the next request ends the session there.
pub fn run_with(
    spec: &SessionSpec,
    make_source: impl Fn(&Inventory, Option<FaultCell>, u32) -> Result<Option<Box<dyn ExpertSource>>>,
) -> Result<SessionRecord> {
    if spec.requests.is_empty() {
        bail!("a session needs at least one request");
    }
    let staging = Staging::new(&spec.record)?.sealing(spec.seal);
    let inv = Inventory::of(&spec.model)?;
    let own = |r: &Request| (r.fault != FaultCell::None).then_some(r.fault);
    let outputs = |i: usize| spec.requests[i].n_predict.saturating_sub(1);
    let mut source = make_source(&inv, own(&spec.requests[0]), outputs(0))?;
    let loads = if source.is_some() { crate::digests::Loads::NonExpert } else { crate::digests::Loads::All };
    let model_id = ModelIdentity::of(&spec.model, &inv, Some(loads))?;
    let experts = source.as_mut().map_or(ExpertsParams::Resident, |s| s.describe().into());
    let served = source.is_some();
    if let Some(r) = spec.requests.iter().find(|r| r.fault != FaultCell::None && !served) {
        bail!("request {:?} names the fault cell {:?}: fault cells perturb a Plan's reads, and this session has none", r.id, r.fault);
    }
    let t0 = Instant::now();
    let first = load_model(&spec.model, source)?;
    let load_s = t0.elapsed().as_secs_f64();
    let mut prompts = Vec::with_capacity(spec.requests.len());
    let mut n_ctx = 0;
    for r in &spec.requests {
        let p = first.tokenize(&r.prompt, true)?;
        if p.is_empty() {
            bail!("request {:?}: the prompt tokenized to nothing", r.id);
        }
        let n = crate::bounds::context(spec.exec.n_ctx, "prompt", p.len(), r.n_predict, inv.trained_context().as_ref())
            .map_err(|e| anyhow!("{}: request {:?}: {e}", spec.model.display(), r.id))?;
        n_ctx = n_ctx.max(n);
        prompts.push(p);
    }
    let exec = spec.exec.with_ctx(n_ctx);
    let mut record = SessionRecord::begun(Some(model_id.clone()), crate::identity::build_identity()?, Some(spec.between));
    record.n_ctx = Some(n_ctx);
    let shared = Shared { model_id, experts, exec, load_s, root: staging.dir().to_path_buf() };
    let (mut failed, mut entries) = (None, Vec::with_capacity(spec.requests.len()));
    let (mut model, mut i, mut pending) = (Some(first), 0, None);
    // One pass per Plan: its requests through one context, until one fails or names a fault
    // cell of its own (or the next does); then a new Plan (a new load) takes its place.
    while let Some(m) = &model {
        let mut ctx = Context::new(m, exec, true)?;
        let mut renew = None;
        while i < spec.requests.len() {
            let r = &spec.requests[i];
            let ready = match pending.take() {
                Some((renewal, seconds)) => {
                    record.renewals.push(renewal);
                    Ready::Renewed(seconds)
                }
                None if i == 0 => Ready::First,
                None => Ready::Between,
            };
            let done = serve_request(spec, &shared, i, r, std::mem::take(&mut prompts[i]), m, &mut ctx, ready)?;
            entries.push(done.entry);
            let went_wrong = done.failure.is_some();
            if failed.is_none() {
                failed = done.failure;
            }
            i += 1;
            if !done.readied {
                break;
            }
            let next = spec.requests.get(i);
            if next.is_some() && (went_wrong || own(r).is_some() || next.and_then(own).is_some()) {
                renew = Some(next.and_then(own));
                break;
            }
        }
        drop(ctx);
        let Some(fault) = renew else { break };
        // The replaced Plan closes (how, on record), its model goes, and a new one is loaded.
        let started = Instant::now();
        let replaced = m.with_source(|s| s.finish()).transpose();
        let (replaced_epoch, replaced_clean) = match &replaced {
            Ok(Some(SourceReport::Plan(p))) => (Some(p.closure.epoch), p.clean_closure),
            _ => (None, false),
        };
        model = None;
        match make_source(&inv, fault, outputs(i)).and_then(|s| load_model(&spec.model, s)) {
            Ok(m) => {
                model = Some(m);
                let renewal = Renewal { before_request: i, fault: fault.unwrap_or_default(), replaced_epoch, replaced_clean };
                pending = Some((renewal, started.elapsed().as_secs_f64()));
            }
            Err(e) => {
                failed.get_or_insert(format!("no new Plan for request {:?}: {e:#}", spec.requests[i].id));
            }
        }
    }
    record.take_requests(staging.dir(), entries, load_s)?;
    if let Some(model) = model.as_ref().filter(|_| served) {
        if let Some(why) = close_source(&mut record, model, spec.between) {
            failed.get_or_insert(why);
        }
    }
    record.scores = score::aggregate(record.requests.iter().map(|r| &r.score));
    if let Some(e) = &failed {
        record.fail(e.clone());
    }
    let dir = staging.commit(&record)?;
    match failed {
        Some(e) => Err(anyhow!("{e}; session record {}", dir.display())),
        None => Ok(record),
    }
}

/// Closes the session's source at teardown and puts its ledger on the record; why the session
/// fails closed there, where it does.
fn close_source(record: &mut SessionRecord, model: &crate::engine::Model, between: Between) -> Option<String> {
    let closed = model.with_source(|s| s.finish()).transpose();
    match closed {
        Ok(Some(crate::plan::report::SourceReport::Plan(p))) => {
            let sum = |f: fn(&Served) -> u64| record.requests.iter().filter_map(|r| r.served.as_ref()).map(f).sum();
            let last = record.renewals.last().map_or(0, |r| r.before_request);
            let plan_resets = record.requests[last..].iter().filter_map(|r| r.served.as_ref()).map(|s| s.resets).sum();
            let ledger = SessionLedger {
                requests: record.requests.len() as u64,
                resets: sum(|s| s.resets),
                cold_resets: sum(|s| s.cold_resets),
                renewals: record.renewals.len() as u64,
                plan_resets,
                epoch: p.closure.epoch,
                balanced: p.clean_closure,
            };
            let why = ledger.unbalanced(between);
            record.ledger = Some(ledger);
            record.closure = Some(p.closure);
            why
        }
        Ok(_) => None,
        Err(e) => Some(format!("the expert source did not close: {e:#}")),
    }
}

/// What every request of a session shares.
struct Shared {
    model_id: ModelIdentity,
    experts: ExpertsParams,
    exec: crate::exec::ExecParams,
    load_s: f64,
    /// The session's staging directory, where each request's record is committed.
    root: PathBuf,
}

/// How the source is readied before a request.
enum Ready {
    /// The session's first request: the source as made.
    First,
    /// `between`: the Plan reset (or emptied).
    Between,
    /// A new Plan (a new load and context) took the last one's place, in these seconds.
    Renewed(f64),
}

/// What serving one request gave.
struct RequestDone {
    entry: RequestEntry,
    /// Why it failed, where it did.
    failure: Option<String>,
    /// Whether its source was readied (if not, the session cannot go on).
    readied: bool,
}

/// Request `i` of the session: its sequence cleared and its source readied as `ready` says,
/// decoded, and its record committed.
#[allow(clippy::too_many_arguments)]
fn serve_request(
    spec: &SessionSpec,
    shared: &Shared,
    i: usize,
    r: &Request,
    prompt: Vec<i32>,
    model: &crate::engine::Model,
    ctx: &mut Context,
    ready: Ready,
) -> Result<RequestDone> {
    let started = Instant::now();
    let dir = format!("requests/{i:04}");
    let rspec = GenerateSpec {
        model: spec.model.clone(),
        prompt: r.prompt.clone(),
        n_predict: r.n_predict,
        exec: spec.exec,
        ignore_eos: spec.ignore_eos,
        draft: None,
        record: shared.root.join(&dir),
        seal: spec.seal,
    };
    let staging = Staging::new(&rspec.record)?.sealing(spec.seal);
    let outputs = r.n_predict.saturating_sub(1);
    let (ready, renewed_s) = match ready {
        Ready::First => (Ok(()), 0.0),
        Ready::Between => {
            ctx.clear();
            (model.with_source(|s| s.between(spec.between, outputs)).unwrap_or(Ok(())), 0.0)
        }
        Ready::Renewed(seconds) => (Ok(()), seconds),
    };
    let readied = ready.is_ok();
    // The source as it serves this request (a renewed one names the request's fault cell).
    let experts = model.with_source(|s| s.describe().into()).unwrap_or_else(|| shared.experts.clone());
    let params = params_before_decode(&rspec, shared.exec, experts, ctx)?;
    let between_s = renewed_s + started.elapsed().as_secs_f64();
    let mut run = Decoding::new(prompt.len() + r.n_predict as usize, model.n_vocab(), r.n_predict);
    let decoded = ready.and_then(|()| run.decode(&rspec, model, ctx, &prompt));
    let routes = ctx.take_routes();
    let surfaces = model.with_source(|s| s.surfaces()).unwrap_or_default();
    let report = model.with_source(|s| s.end_request().map(ExpertsReport::from));
    let entry_served = match &report {
        Some(Ok(ExpertsReport::Plan(p))) => Some(Served::of(p)),
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
        n_predict: r.n_predict,
        prompt_tokens,
        generated_tokens,
        between_s,
        wall_s: renewed_s + started.elapsed().as_secs_f64(),
        served: entry_served,
        score: response.and_then(|text| score::score(&text, &r.expected)),
    };
    Ok(RequestDone { entry, failure: failed, readied })
}
