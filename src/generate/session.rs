//! A session: many requests through one process, one model load and one expert source. Each
//! request's sequence is cleared before it and its source readied as `between` says; each gets
//! its own sealed generate record, and the session's record names them in order.

use super::{
    closing_checks, commit_completed, commit_failed, load_model, params_before_decode, write_surfaces, Decoding, GenerateSpec, Ran,
};
use crate::engine::{Context, ExpertSource};
use crate::exec::ExecRequest;
use crate::inventory::Inventory;
use crate::record::format::{ExpertsParams, ExpertsReport, ModelIdentity, Outcome};
use crate::record::Staging;
use crate::session::{score, Between, Request};
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::time::Instant;

pub use crate::record::format::{RequestEntry, Served, SessionLedger, SessionRecord, SESSION_FORMAT};

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
/// (None: resident). The first request that fails ends the session closed: its record says
/// why, later requests do not run, and the session's record says which failed.
pub fn run_with(
    spec: &SessionSpec,
    make_source: impl FnOnce(&Inventory) -> Result<Option<Box<dyn ExpertSource>>>,
) -> Result<SessionRecord> {
    if spec.requests.is_empty() {
        bail!("a session needs at least one request");
    }
    let staging = Staging::new(&spec.record)?.sealing(spec.seal);
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
    let mut record = SessionRecord::begun(Some(model_id.clone()), crate::identity::build_identity()?, Some(spec.between));
    record.n_ctx = Some(n_ctx);
    let shared = Shared { model_id, experts, exec, load_s, root: staging.dir().to_path_buf() };
    let mut failed = None;
    let mut entries = Vec::with_capacity(spec.requests.len());
    for (i, (r, prompt)) in spec.requests.iter().zip(prompts).enumerate() {
        let (entry, failure) = serve_request(spec, &shared, i, r, prompt, &model, &mut ctx)?;
        entries.push(entry);
        if failure.is_some() {
            failed = failure;
            break;
        }
    }
    drop(ctx);
    record.take_requests(staging.dir(), entries, load_s)?;
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
        record.fail(e.clone());
    }
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
    /// The session's staging directory, where each request's record is committed.
    root: PathBuf,
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
        record: shared.root.join(&dir),
        seal: spec.seal,
    };
    let staging = Staging::new(&rspec.record)?.sealing(spec.seal);
    let params = params_before_decode(&rspec, shared.exec, shared.experts.clone(), ctx)?;
    let ready = if i == 0 {
        Ok(())
    } else {
        ctx.clear();
        model.with_source(|s| s.between(spec.between, r.n_predict.saturating_sub(1))).unwrap_or(Ok(()))
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
        n_predict: r.n_predict,
        prompt_tokens,
        generated_tokens,
        between_s,
        wall_s: started.elapsed().as_secs_f64(),
        served: entry_served,
        score: response.and_then(|text| score::score(&text, &r.expected)),
    };
    Ok((entry, failed))
}
