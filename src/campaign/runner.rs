//! The unattended runner: preregister, recover from the journal, run every unsettled cell in a
//! fresh child process, seal each outcome, apply the stop rules.
//!
//! Crash safety rests on three facts. (1) A cell's staging directory is never a record: only
//! `seal` makes one, by an atomic rename to `results/<digest>`. (2) The digest is journaled
//! (`cell_sealing`) before that rename, so after a crash the runner can tell a sealed record
//! (it exists and verifies) from an unfinished one. (3) Anything else found in staging is an
//! attempt that never produced an outcome: it is deleted, `cell_discarded` is journaled, and
//! the cell runs again. Cells that ran and failed are outcomes and are sealed, never rerun.

use super::admission::{self, Operands};
use super::document::{read_cell, CampaignRef, CellDocument, FaultRef, OracleRef, Validity, CELL_FILE, CELL_FORMAT};
use super::executor::{BlockRecord, CellExecutor, CellInputs, CellOutcome, CellStatus};
use super::expand::{block_control, expand, CellSpec};
use super::journal::{histories, CellHistory, CellState, Entry, Event, Journal, RunMode};
use super::spec::Campaign;
use super::{preregister, CampaignDir, Loaded};
use crate::record::{self, prepare_seal, verify_record};
use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

pub struct RunOptions {
    pub results: PathBuf,
    pub mode: RunMode,
    /// Where the runner reports its cells as it goes (the binary draws or prints them).
    pub progress: std::sync::Arc<dyn Progress>,
    /// Run only this block, with its own journal (a cluster task; see slurm.rs).
    pub block: Option<usize>,
}

/// What a runner reports while it runs, for its caller to show: the runner itself never
/// prints. Every method has a default that does nothing ([`Quiet`]).
pub trait Progress: Send + Sync {
    /// `done` of `total` cells are settled before this run starts.
    fn start(&self, total: usize, done: usize) {
        let _ = (total, done);
    }
    /// Cell `key` starts an attempt.
    fn running(&self, key: &str) {
        let _ = key;
    }
    /// One line about a cell: sealed, skipped, abandoned or interrupted. `settled`: the cell
    /// is settled by it (one more of `total` done).
    fn line(&self, line: &str, settled: bool) {
        let _ = (line, settled);
    }
    /// Every cell this run can settle is settled.
    fn finish(&self) {}
}

/// Reports nothing.
pub struct Quiet;

impl Progress for Quiet {}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub campaign: String,
    pub digest: String,
    pub preregistered_now: bool,
    pub cells: usize,
    pub sealed: usize,
    pub skipped: usize,
    pub abandoned: usize,
    /// Cells run by this invocation.
    pub ran: usize,
    /// Interrupted attempts discarded in all, as the journal has them: the sum of `campaign
    /// status`'s per-cell `discards` over this runner's cells (every cell, or its block's), like
    /// `sealed`, `skipped` and `abandoned`.
    pub discarded: usize,
    /// Of those, the attempts this invocation discarded: left by an interrupted runner, or
    /// ended from outside while it ran.
    pub discarded_now: usize,
}

/// The locks a runner holds for its whole run, released by the kernel when it dies: a local
/// runner the campaign's lock exclusively; a block task the campaign's lock shared (block
/// tasks run side by side, never beside a local runner) and its block's lock exclusively.
/// Preregistration and the runner's first journal events happen under them.
fn lock(c: &Loaded, dir: &CampaignDir, results: &Path) -> Result<(bool, Vec<Flock<fs::File>>)> {
    match dir.block {
        None => {
            let (now, l) = preregister(c, results)?;
            Ok((now, vec![l]))
        }
        Some(b) => {
            let (now, shared) = super::preregister_shared(c, results)?;
            let block = super::flock(&dir.lock(), FlockArg::LockExclusiveNonblock, || {
                format!("block {b} of campaign `{}` is being run by another process", c.id())
            })?;
            Ok((now, vec![shared, block]))
        }
    }
}

/// The preregistered identities this build and these files must have before anything runs:
/// [`super::gate`], the same validation `campaign check` gives, with every model made.
pub(crate) fn check_identities(c: &Loaded) -> Result<()> {
    super::gate::refuse(c, super::models::Recipes::Made)
}

/// Checks a completed record against the preregistered identities.
fn validity(spec: &Campaign, cell: &CellSpec, staging: &Path, outcome: &CellOutcome, measure: bool) -> Validity {
    let mut problems = Vec::new();
    if outcome.status == CellStatus::Completed {
        match record::load_typed(staging) {
            Ok(rec) => {
                let model = rec.model().map_or("", |m| m.sha256.as_str());
                if model != spec.model.sha256.0 {
                    problems.push(format!("model sha256 {} is not the preregistered {}", model, spec.model.sha256));
                }
                if rec.build().engine.tree_sha256 != spec.build.engine_tree_sha256.0 {
                    problems.push("engine tree digest differs from the preregistered one".into());
                }
                // A measurement reads the model and runs no workload.
                if measure {
                    return Validity { valid: problems.is_empty(), problems };
                }
                let refine = match &rec {
                    record::TypedRecord::Refine(r) => Some(r),
                    _ => None,
                };
                if let Some(r) = &spec.refine {
                    for (what, m, had) in [
                        ("verifier", &r.verifier, refine.and_then(|x| x.verifier.as_ref())),
                        ("reference", &r.reference, refine.and_then(|x| x.reference())),
                    ] {
                        let had = had.map_or("", |h| h.sha256.as_str());
                        if had != m.sha256.0 {
                            problems.push(format!("{what} sha256 {had} is not the preregistered {}", m.sha256));
                        }
                    }
                }
                // A drafted arm's proposer, and the K it ran with, are the preregistered ones.
                let draft = match &rec {
                    record::TypedRecord::Generate(g) => g.params.as_ref().and_then(|p| p.draft.as_ref()),
                    _ => None,
                };
                let k = cell.arm.draft_max.unwrap_or(0);
                let want = cell.arm.draft.as_deref().and_then(|d| match d == super::spec::MTP {
                    true => Some((record::format::ProposerKind::Mtp, cell.model.sha256.0.as_str(), k)),
                    false => cell.proposer.as_ref().map(|m| (record::format::ProposerKind::Model, m.sha256.0.as_str(), k)),
                });
                let had = draft.map(|d| (d.proposer, d.model.sha256.as_str(), d.draft_max));
                if want != had {
                    problems.push(format!("proposer (kind, sha256, draft_max) {had:?} is not the preregistered {want:?}"));
                }
                let prompt_tokens = rec.prompt_tokens().map(|n| n as u64);
                if prompt_tokens != Some(u64::from(*spec.workload.prompt_tokens)) {
                    problems.push(format!("{:?} prompt tokens where {} were preregistered", prompt_tokens, spec.workload.prompt_tokens));
                }
                // A refinement record counts the outputs of all its prompts.
                let per = if spec.refine.is_some() { refine.and_then(|r| r.counts.as_ref()).map_or(0, |c| c.prompts as u64) } else { 1 };
                let outputs = match &rec {
                    // A session's outputs are its requests' own.
                    record::TypedRecord::Session(s) => s.requests.iter().map(|r| u64::from(r.n_predict)).sum(),
                    _ => u64::from(*spec.workload.outputs) * per,
                };
                let generated = rec.generated_tokens().map(|n| n as u64);
                if spec.workload.ignore_eos && generated != Some(outputs) {
                    problems.push(format!("{generated:?} outputs where {outputs} were preregistered"));
                }
                let pinned = spec.workload.input().ok().filter(|i| !i.session).map(|i| i.sha256.0.as_str());
                if let (Some(prompt), Some(pinned)) = (rec.surfaces().get("prompt"), pinned) {
                    if prompt.sha256 != pinned {
                        problems.push("prompt bytes differ from the preregistered prompt".into());
                    }
                }
            }
            Err(e) => problems.push(format!("record unreadable: {e:#}")),
        }
    }
    Validity { valid: problems.is_empty(), problems }
}

struct Ctx<'a> {
    c: &'a Loaded,
    cells: Vec<CellSpec>,
    dir: CampaignDir,
    results: PathBuf,
    journal: Journal,
    entries: Vec<Entry>,
    hist: BTreeMap<String, CellHistory>,
    block: Option<usize>,
}

impl Ctx<'_> {
    /// Cells this runner settles (all, or those of its block).
    fn mine(&self, cell: &CellSpec) -> bool {
        self.block.is_none_or(|b| b == cell.block)
    }

    fn append(&mut self, ev: Event) -> Result<()> {
        let e = self.journal.append(ev)?;
        self.entries.push(e);
        self.hist = histories(&self.entries);
        Ok(())
    }

    fn state(&self, key: &str) -> CellState {
        self.hist.get(key).map(|h| h.state.clone()).unwrap_or(CellState::Pending)
    }

    /// The oracle's sealed record, if it completed.
    fn oracle_record(&self) -> Option<String> {
        self.cells.iter().filter(|c| c.is_oracle).find_map(|c| match self.state(&c.key) {
            CellState::Sealed { digest, status: CellStatus::Completed, .. } => Some(digest),
            _ => None,
        })
    }

    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(&self.dir.root).unwrap_or(p).display().to_string()
    }
}

fn remove_staging(path: &Path) -> Result<()> {
    let mut partial = path.as_os_str().to_os_string();
    partial.push(".partial");
    for p in [path.to_path_buf(), PathBuf::from(partial)] {
        if p.exists() {
            make_writable(&p);
            fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    Ok(())
}

fn make_writable(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = fs::symlink_metadata(p) {
        if m.is_dir() {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    make_writable(&e.path());
                }
            }
        } else if m.is_file() {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o644));
        }
    }
}

fn sealed_event(cell: &str, attempt: u32, digest: &str, doc: &CellDocument, recovered: bool) -> Event {
    Event::CellSealed {
        cell: cell.to_string(),
        attempt,
        digest: digest.to_string(),
        status: doc.outcome.status,
        valid: doc.validity.valid,
        exact: doc.oracle.exact,
        admission: doc.admission.passed,
        wall_s: doc.outcome.wall_s,
        recovered,
    }
}

/// Settles what an interrupted runner left: finished seals are recorded, everything else in
/// staging is discarded.
fn recover(ctx: &mut Ctx, summary: &mut RunSummary) -> Result<()> {
    for cell in ctx.cells.clone() {
        if !ctx.mine(&cell) {
            continue;
        }
        match ctx.state(&cell.key) {
            CellState::Sealing { attempt, digest } => {
                let target = ctx.results.join(&digest);
                let staging = ctx.dir.staging().join(format!("{}.a{attempt}", cell.key));
                if target.exists() {
                    let r = verify_record(&target)
                        .with_context(|| format!("cell {}: its sealed record does not verify; refusing to continue", cell.key))?;
                    record::finish_modes(&r.dir)?;
                    let doc = read_cell(&r.dir)?;
                    ctx.append(sealed_event(&cell.key, attempt, &digest, &doc, true))?;
                    continue;
                }
                if staging.join(CELL_FILE).is_file() {
                    let prepared = prepare_seal(&staging)?;
                    if prepared.digest() == digest {
                        let r = prepared.finish(&ctx.results)?;
                        let doc = read_cell(&r.dir)?;
                        ctx.append(sealed_event(&cell.key, attempt, &digest, &doc, true))?;
                        continue;
                    }
                }
                remove_staging(&staging)?;
                ctx.append(Event::CellDiscarded {
                    cell: cell.key.clone(),
                    attempt,
                    reason: "interrupted while sealing and the staged record no longer matches its journaled digest; staging deleted"
                        .into(),
                })?;
                summary.discarded_now += 1;
            }
            CellState::Started { attempt, staging } => {
                remove_staging(&ctx.dir.root.join(&staging))?;
                ctx.append(Event::CellDiscarded {
                    cell: cell.key.clone(),
                    attempt,
                    reason: format!(
                        "interrupted before an outcome was recorded{}; staging deleted, the cell runs again (not an outcome-selected rerun)",
                        requeued().map(|why| format!(" ({why})")).unwrap_or_default()
                    ),
                })?;
                summary.discarded_now += 1;
            }
            _ => {}
        }
    }
    // Anything else under staging belongs to no journaled attempt (e.g. a crash between
    // creating it and journaling): it can never become a record.
    if let Ok(rd) = fs::read_dir(ctx.dir.staging()) {
        for e in rd.flatten() {
            remove_staging(&e.path())?;
        }
    }
    Ok(())
}

/// Why this runner is a Slurm task's second or later start: Slurm requeued it (preemption
/// with `PreemptMode=REQUEUE`, `scontrol requeue`, a node failure), so the attempt the earlier
/// start was running was ended by the scheduler, not by the run.
fn requeued() -> Option<String> {
    let restarts: u32 = std::env::var("SLURM_RESTART_COUNT").ok()?.trim().parse().ok()?;
    let job = std::env::var("SLURM_JOB_ID").ok()?;
    (restarts > 0).then(|| format!("the Slurm task was preempted or requeued: job {job}, restart {restarts}"))
}

/// The stop rule that skips a cell, if one does.
fn stop_reason(ctx: &Ctx, cell: &CellSpec) -> Option<String> {
    let spec = &ctx.c.spec;
    for earlier in &ctx.cells[..cell.index] {
        if let CellState::Sealed { status, admission, .. } = ctx.state(&earlier.key) {
            if spec.stop.campaign_after_oracle_failure && earlier.is_oracle && status != CellStatus::Completed {
                return Some(format!("stop rule: the oracle cell {} failed", earlier.key));
            }
            if spec.stop.arm_after_admission_failure && earlier.arm.id.value == cell.arm.id.value && admission == Some(false) {
                return Some(format!("stop rule: arm `{}` stopped after its first admission failure ({})", cell.arm.id.value, earlier.key));
            }
        }
        if spec.stop.campaign_after_oracle_failure && earlier.is_oracle && ctx.state(&earlier.key) == CellState::Abandoned {
            return Some(format!("stop rule: the oracle cell {} was abandoned", earlier.key));
        }
    }
    None
}

/// The completed records sealed earlier in the cell's block, in schedule order.
fn block_inputs(ctx: &Ctx, cell: &CellSpec) -> CellInputs {
    let block = ctx
        .cells
        .iter()
        .filter(|c| c.block == cell.block && c.position < cell.position)
        .filter_map(|c| match ctx.state(&c.key) {
            CellState::Sealed { digest, status: CellStatus::Completed, .. } => {
                Some(BlockRecord { arm: c.arm.clone(), dir: ctx.results.join(&digest), digest })
            }
            _ => None,
        })
        .collect();
    CellInputs { block }
}

/// Runs one attempt of `cell` and seals its outcome; `None` when the attempt was interrupted
/// from outside (discarded and journaled, to be run again).
fn run_cell(ctx: &mut Ctx, exec: &dyn CellExecutor, cell: &CellSpec) -> Result<Option<(String, CellDocument)>> {
    let attempt = ctx.hist.get(&cell.key).map_or(0, |h| h.attempts) + 1;
    let staging = ctx.dir.staging().join(format!("{}.a{attempt}", cell.key));
    let log = ctx.dir.logs().join(format!("{}.a{attempt}.log", cell.key));
    remove_staging(&staging)?;
    ctx.append(Event::CellStarted { cell: cell.key.clone(), index: cell.index, attempt, staging: ctx.rel(&staging) })?;

    let outcome = exec.run(cell, &block_inputs(ctx, cell), &staging, &log)?;
    let mut partial = staging.as_os_str().to_os_string();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    if partial.exists() {
        make_writable(&partial);
        fs::remove_dir_all(&partial)?;
    }
    if let Some(reason) = outcome.interrupted {
        // Not the run's outcome: nothing of it is sealed or counted against the arm.
        remove_staging(&staging)?;
        ctx.append(Event::CellDiscarded { cell: cell.key.clone(), attempt, reason })?;
        return Ok(None);
    }
    // A failed cell's record holds only its cell.json: whatever it half-wrote is not evidence.
    // A fault cell's committed record is kept: failing closed is its outcome, and the record is
    // what its validator reads.
    let evidence = cell.arm.fault.is_some() && staging.join(record::RECORD_FILE).is_file();
    if outcome.status == CellStatus::Failed && staging.exists() && !evidence {
        remove_staging(&staging)?;
    }
    fs::create_dir_all(&staging)?;

    let spec = &ctx.c.spec;
    let measure = cell.arm.measure.is_some();
    let validity = validity(spec, cell, &staging, &outcome, measure);
    let oracle_record = if cell.is_oracle { None } else { ctx.oracle_record() };
    let (exact, differing) = match (&oracle_record, outcome.status) {
        // A measurement computes nothing to compare.
        _ if measure => (None, Vec::new()),
        (Some(d), CellStatus::Completed) => {
            let (e, diff) = crate::oracle::exactness(spec.oracle.relation, &ctx.results.join(d), &staging)?;
            (Some(e), diff)
        }
        _ => (None, Vec::new()),
    };
    let adm = admission::evaluate(
        &spec.admission,
        &Operands {
            status: outcome.status,
            valid: validity.valid,
            // A measurement cell is admitted on its outcome and validity alone.
            is_oracle: cell.is_oracle || measure,
            exact,
            memory_cap_bytes: cell.arm.memory_cap_bytes,
            telemetry: &outcome.telemetry,
        },
    );
    let fault = cell.arm.fault.map(|f| {
        let control = block_control(&ctx.cells, cell).and_then(|c| match ctx.state(&c.key) {
            CellState::Sealed { digest, .. } => Some(digest),
            _ => None,
        });
        let (validation, _) = crate::oracle::fault::verdict(f, &staging, control.as_ref().map(|d| ctx.results.join(d)).as_deref());
        FaultRef { cell: f, control, validation }
    });
    let doc = CellDocument {
        format: CELL_FORMAT.to_string(),
        campaign: CampaignRef { id: ctx.c.id().to_string(), sha256: ctx.c.digest.clone() },
        cell: cell.clone(),
        attempt,
        outcome,
        validity,
        oracle: OracleRef {
            arm: spec.oracle.arm.value.clone(),
            relation: spec.oracle.relation,
            horizon: spec.oracle.horizon,
            record: oracle_record,
            exact,
            differing,
        },
        admission_rule: spec.admission.clone(),
        admission: adm,
        fault,
    };
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    crate::util::write_new_durable(&staging.join(CELL_FILE), text.as_bytes())?;
    let prepared = prepare_seal(&staging)?;
    let digest = prepared.digest().to_string();
    ctx.append(Event::CellSealing { cell: cell.key.clone(), attempt, digest: digest.clone() })?;
    prepared.finish(&ctx.results)?;
    ctx.append(sealed_event(&cell.key, attempt, &digest, &doc, false))?;
    Ok(Some((digest, doc)))
}

/// What a sealed cell's progress line says: outcome, time, exactness, admission, fault, digest.
fn sealed_line(key: &str, digest: &str, doc: &CellDocument) -> String {
    let adm = match doc.admission.passed {
        Some(true) => "admitted",
        Some(false) => "NOT admitted",
        None => "admission not evaluated",
    };
    let exact = match doc.oracle.exact {
        Some(true) => ", exact",
        Some(false) => ", NOT exact",
        None => "",
    };
    let fault = match &doc.fault {
        Some(f) if f.validation.passed => format!(", fault {} validated", f.cell.name()),
        Some(f) => format!(", fault {} FAILED its validation ({})", f.cell.name(), f.validation.failed.join(", ")),
        None => String::new(),
    };
    let failed = match (&doc.outcome.error, doc.outcome.status) {
        (Some(e), CellStatus::Failed) => format!(" ({e})"),
        _ => String::new(),
    };
    format!("{key} {}{failed} in {:.2} s{exact}, {adm}{fault}: sealed {digest}", doc.outcome.status.name(), doc.outcome.wall_s)
}

/// `campaign run` / `campaign resume`.
pub fn run(c: &Loaded, exec: &dyn CellExecutor, opts: &RunOptions) -> Result<RunSummary> {
    let cells = expand(&c.spec);
    let dir = CampaignDir::new(&opts.results, c.id());
    let dir = match opts.block {
        Some(b) => dir.block(b),
        None => dir,
    };
    if opts.mode == RunMode::Resume && !dir.campaign_json().exists() {
        bail!("campaign `{}` is not preregistered under {}; start it with `campaign run`", c.id(), opts.results.display());
    }
    // Refuse what cannot run before anything is frozen.
    for cell in &cells {
        exec.preflight(cell)?;
    }
    check_identities(c)?;
    let (preregistered_now, _locks) = lock(c, &dir, &opts.results)?;
    fs::create_dir_all(dir.logs())?;
    fs::create_dir_all(dir.staging())?;
    let (journal, _) = Journal::open(&dir.journal())?;
    // Cells run by other runners (local or cluster tasks) count as they were journaled.
    let entries = Journal::read_all(&dir.journal_files()?)?;
    let hist = histories(&entries);
    let mut ctx = Ctx { c, cells, dir, results: opts.results.clone(), journal, entries, hist, block: opts.block };
    let mut summary = RunSummary {
        campaign: c.id().to_string(),
        digest: c.digest.clone(),
        preregistered_now,
        cells: ctx.cells.len(),
        sealed: 0,
        skipped: 0,
        abandoned: 0,
        ran: 0,
        discarded: 0,
        discarded_now: 0,
    };
    recover(&mut ctx, &mut summary)?;
    ctx.append(Event::RunnerStarted {
        pid: std::process::id(),
        mode: opts.mode,
        binary_sha256: crate::identity::build_identity()?.binary_sha256,
        cells: ctx.cells.len(),
    })?;

    let settled = |s: &CellState| matches!(s, CellState::Sealed { .. } | CellState::Skipped { .. } | CellState::Abandoned);
    let done = ctx.cells.iter().filter(|c| settled(&ctx.state(&c.key))).count();
    let progress = &*opts.progress;
    progress.start(ctx.cells.len(), done);

    for cell in ctx.cells.clone() {
        if settled(&ctx.state(&cell.key)) || !ctx.mine(&cell) {
            continue;
        }
        let n = format!("[{}/{}]", cell.index + 1, ctx.cells.len());
        if let Some(reason) = stop_reason(&ctx, &cell) {
            ctx.append(Event::CellSkipped { cell: cell.key.clone(), reason: reason.clone() })?;
            progress.line(&format!("{n} {} skipped: {reason}", cell.key), true);
            continue;
        }
        // An attempt interrupted from outside is discarded and the cell runs again, up to
        // repetition.max_interrupted_attempts.
        let sealed = loop {
            let discards = ctx.hist.get(&cell.key).map_or(0, |h| h.discards);
            if discards >= *ctx.c.spec.repetition.max_interrupted_attempts {
                ctx.append(Event::CellAbandoned {
                    cell: cell.key.clone(),
                    attempts: discards,
                    reason: format!("interrupted {discards} times (repetition.max_interrupted_attempts)"),
                })?;
                progress.line(&format!("{n} {} abandoned after {discards} interrupted attempts", cell.key), true);
                break None;
            }
            progress.running(&cell.key);
            match run_cell(&mut ctx, exec, &cell)? {
                Some(s) => break Some(s),
                None => {
                    summary.discarded_now += 1;
                    progress.line(&format!("{n} {} interrupted from outside; attempt discarded, running it again", cell.key), false);
                }
            }
        };
        let Some((digest, doc)) = sealed else { continue };
        summary.ran += 1;
        progress.line(&format!("{n} {}", sealed_line(&cell.key, &digest, &doc)), true);
    }
    progress.finish();
    for cell in &ctx.cells {
        if ctx.mine(cell) {
            summary.discarded += ctx.hist.get(&cell.key).map_or(0, |h| h.discards as usize);
        }
        match ctx.state(&cell.key) {
            CellState::Sealed { .. } => summary.sealed += 1,
            CellState::Skipped { .. } => summary.skipped += 1,
            CellState::Abandoned => summary.abandoned += 1,
            _ => {}
        }
    }
    ctx.append(Event::RunnerFinished { sealed: summary.sealed, skipped: summary.skipped, abandoned: summary.abandoned })?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::executor::Telemetry;

    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// Writes a small but complete record (identical surfaces every time) without running the
    /// engine; cells of `fail_arm` fail instead. Exercises the runner's bookkeeping only.
    struct Fake {
        fail_arm: Option<&'static str>,
        /// The first attempts of this arm's cells, this many in all, end interrupted from outside.
        interrupt: Option<(&'static str, std::sync::atomic::AtomicU32)>,
    }

    fn fake(fail_arm: Option<&'static str>) -> Fake {
        Fake { fail_arm, interrupt: None }
    }

    impl CellExecutor for Fake {
        fn run(&self, cell: &CellSpec, _inputs: &CellInputs, staging: &Path, _log: &Path) -> Result<CellOutcome> {
            if let Some((arm, left)) = &self.interrupt {
                if *arm == cell.arm.id.value
                    && left
                        .fetch_update(std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                {
                    return Ok(CellOutcome {
                        status: CellStatus::Failed,
                        exit_code: None,
                        signal: Some(9),
                        error: Some("killed".into()),
                        wall_s: 0.1,
                        command: vec![],
                        worker: None,
                        telemetry: Telemetry::default(),
                        interrupted: Some("signal 9 from outside".into()),
                        warmed_bytes: None,
                    });
                }
            }
            let failed = self.fail_arm == Some(cell.arm.id.value.as_str());
            if !failed {
                let part = staging.with_extension("tmp");
                fs::create_dir_all(&part)?;
                let mut surfaces = std::collections::BTreeMap::new();
                for name in crate::oracle::SURFACES.iter().chain(&["prompt"]) {
                    let bytes = format!("{name} bytes");
                    fs::write(part.join(format!("{name}.bin")), &bytes)?;
                    surfaces.insert(
                        name.to_string(),
                        record::Surface {
                            file: format!("{name}.bin"),
                            sha256: crate::util::sha256(bytes.as_bytes()),
                            bytes: bytes.len() as u64,
                            unit_bytes: 1,
                            unit_sha256: vec![],
                        },
                    );
                }
                let rec = record::GenerateRecord {
                    format: record::GENERATE_FORMAT.into(),
                    outcome: record::format::Outcome::Completed,
                    error: None,
                    model: Some(record::format::ModelIdentity {
                        shards: None,
                        file: "m.bin".into(),
                        sha256: cell.model.sha256.0.clone(),
                        bytes: 0,
                        architecture: "fake".into(),
                        t_repr_bytes: 0,
                        expert_bytes: 0,
                        digests: None,
                    }),
                    build: crate::identity::BuildIdentity {
                        sovereign_version: env!("CARGO_PKG_VERSION").into(),
                        engine: crate::engine::identity(),
                        binary_sha256: String::new(),
                        cpu_features: vec![],
                        target: std::env::consts::ARCH.into(),
                        libraries: vec![],
                        devices: vec![],
                        gpu: crate::observe::gpu::DeviceInfo::NotObserved { reason: "fake executor".into() },
                        node: None,
                    },
                    params: None,
                    counts: Some(record::format::GenerateCounts {
                        prompt_tokens: *cell.workload.prompt_tokens as usize,
                        generated_tokens: *cell.workload.outputs as usize,
                        logits_rows: 0,
                        n_vocab: 0,
                        route_events: 0,
                        route_k: 0,
                        stop: "n_predict".into(),
                    }),
                    timing: None,
                    experts: None,
                    process: None,
                    surfaces,
                    resources: None,
                    cache_protocol: None,
                    speculative: None,
                };
                fs::write(part.join("record.json"), serde_json::to_vec(&rec)?)?;
                fs::rename(&part, staging)?;
            }
            Ok(CellOutcome {
                status: if failed { CellStatus::Failed } else { CellStatus::Completed },
                exit_code: Some(if failed { 2 } else { 0 }),
                signal: None,
                error: failed.then(|| "error: injected".to_string()),
                // Distinct per call, as real wall times are: a rerun never repeats a digest.
                wall_s: 0.5 + CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as f64 * 1e-3,
                command: vec![],
                worker: None,
                telemetry: Telemetry::default(),
                interrupted: None,
                warmed_bytes: None,
            })
        }
    }

    fn fixture(t: &Path) -> Loaded {
        let model = t.join("m.bin");
        fs::write(&model, b"model").unwrap();
        let prompt_bytes = "prompt bytes";
        fs::write(t.join("p.txt"), prompt_bytes).unwrap();
        let e = crate::engine::identity();
        let patches: String = e.patches.iter().map(|p| format!("    - {{ name: {}, sha256: {} }}\n", p.name, p.sha256)).collect();
        let text = format!(
            "id: fake\nmodel: {{ path: m.bin, sha256: {} }}\n\
workload: {{ prompt_file: p.txt, prompt_sha256: {}, prompt_tokens: 3, outputs: 2, ignore_eos: true }}\n\
build:\n  engine_tree_sha256: {}\n  patches:{}\n{patches}\
arms:\n  - {{ id: O, experts: resident, threads: 1 }}\n  - {{ id: A, experts: resident, threads: 1 }}\n  - {{ id: X, experts: resident, threads: 1 }}\n\
schedule:\n  lead: [O]\n  blocks:\n    preordered: [[A, X], [X, A], [A, X]]\n\
oracle: {{ arm: O, relation: all_surfaces, horizon: 2 }}\n\
admission: {{ require_exact: true, min_headroom_bytes: 0, max_limit_events: 0 }}\n\
stop: {{ arm_after_admission_failure: true, campaign_after_oracle_failure: true }}\n\
repetition: {{ outcome_selected_reruns: none, max_interrupted_attempts: 2 }}\n",
            crate::util::sha256(b"model"),
            crate::util::sha256(prompt_bytes.as_bytes()),
            e.tree_sha256,
            if patches.is_empty() { " []" } else { "" },
        );
        let file = t.join("fake.yaml");
        fs::write(&file, text).unwrap();
        crate::campaign::load(&file).unwrap()
    }

    fn opts(results: &Path, mode: RunMode) -> RunOptions {
        RunOptions { results: results.to_path_buf(), mode, progress: std::sync::Arc::new(Quiet), block: None }
    }

    fn journal(results: &Path) -> Vec<Entry> {
        Journal::read(&CampaignDir::new(results, "fake").journal()).unwrap()
    }

    fn sealed_of(j: &[Entry], key: &str) -> Vec<(String, bool, u32)> {
        j.iter()
            .filter_map(|e| match &e.event {
                Event::CellSealed { cell, digest, recovered, attempt, .. } if cell == key => Some((digest.clone(), *recovered, *attempt)),
                _ => None,
            })
            .collect()
    }

    /// Keeps the journal up to and including the first event matching `pred`.
    fn truncate_after(results: &Path, pred: impl Fn(&Event) -> bool) -> Vec<Entry> {
        let path = CampaignDir::new(results, "fake").journal();
        let j = Journal::read(&path).unwrap();
        let n = j.iter().position(|e| pred(&e.event)).unwrap() + 1;
        let text: String = j[..n].iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect();
        fs::write(&path, text).unwrap();
        j[..n].to_vec()
    }

    /// Runners started together on one campaign (threads here: a flock belongs to an open
    /// file, not to a process): each either runs or stops with one line, and the journal they
    /// leave reads back in sequence, opening with the one preregistration, and resumes.
    #[test]
    fn racing_runners_preregister_once_and_leave_one_journal() {
        for _ in 0..10 {
            let t = tempfile::tempdir().unwrap();
            let c = fixture(t.path());
            let results = t.path().join("results");
            let barrier = std::sync::Barrier::new(8);
            let outcomes: Vec<Result<RunSummary>> = std::thread::scope(|s| {
                let racers: Vec<_> = (0..8)
                    .map(|i| {
                        let (c, results, barrier) = (&c, &results, &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            run(c, &fake(None), &opts(results, if i % 4 == 3 { RunMode::Resume } else { RunMode::Run }))
                        })
                    })
                    .collect();
                racers.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(outcomes.iter().any(Result::is_ok));
            for e in outcomes.iter().filter_map(|r| r.as_ref().err()) {
                let m = format!("{e:#}");
                assert!(!m.contains('\n') && (m.contains("is being run by another process") || m.contains("is not preregistered")), "{m}");
            }
            let j = journal(&results);
            assert!(matches!(j[0].event, Event::Preregistered { .. }), "{j:?}");
            assert_eq!(j.iter().filter(|e| matches!(e.event, Event::Preregistered { .. })).count(), 1);
            let s = run(&c, &fake(None), &opts(&results, RunMode::Resume)).unwrap();
            assert_eq!((s.sealed, s.ran), (7, 0));
        }
    }

    #[test]
    fn stop_rule_skips_an_arm_after_its_first_admission_failure() {
        let t = tempfile::tempdir().unwrap();
        let c = fixture(t.path());
        let results = t.path().join("results");
        let s = run(&c, &fake(Some("X")), &opts(&results, RunMode::Run)).unwrap();
        assert_eq!((s.sealed, s.skipped, s.ran), (5, 2, 5));
        let j = journal(&results);
        let skipped: Vec<&str> = j.iter().filter(|e| matches!(e.event, Event::CellSkipped { .. })).filter_map(|e| e.event.cell()).collect();
        assert_eq!(skipped, ["b02-p0-X", "b03-p1-X"]);
        // The failed cell is an outcome: sealed, with only its cell.json, and not rerun.
        let (d, _, _) = sealed_of(&j, "b01-p1-X").pop().unwrap();
        let doc = read_cell(&results.join(&d)).unwrap();
        assert_eq!((doc.outcome.status, doc.admission.passed), (CellStatus::Failed, Some(false)));
        assert_eq!(verify_record(&results.join(&d)).unwrap().manifest.files.len(), 1);
        // A's cells are exact against the oracle.
        let (d, _, _) = sealed_of(&j, "b02-p1-A").pop().unwrap();
        assert_eq!(read_cell(&results.join(d)).unwrap().oracle.exact, Some(true));
        // Resume afterwards runs nothing.
        assert_eq!(run(&c, &fake(Some("X")), &opts(&results, RunMode::Resume)).unwrap().ran, 0);
    }

    #[test]
    fn a_worker_killed_from_outside_is_run_again_not_counted_against_its_arm() {
        let t = tempfile::tempdir().unwrap();
        let c = fixture(t.path());
        // Once: the cell runs again and seals; the arm goes on (no cell skipped).
        let results = t.path().join("once");
        let f = Fake { fail_arm: None, interrupt: Some(("X", 1.into())) };
        let s = run(&c, &f, &opts(&results, RunMode::Run)).unwrap();
        assert_eq!((s.sealed, s.skipped, s.abandoned), (7, 0, 0));
        // The summary counts the discarded attempt as `campaign status` does.
        assert_eq!((s.discarded, s.discarded_now), (1, 1));
        assert_eq!(status_discards(&c, &results), s.discarded);
        let j = journal(&results);
        let discarded: Vec<(&str, u32)> = j
            .iter()
            .filter_map(|e| match &e.event {
                Event::CellDiscarded { cell, attempt, reason } if reason.contains("from outside") => Some((cell.as_str(), *attempt)),
                _ => None,
            })
            .collect();
        assert_eq!(discarded, [("b01-p1-X", 1)]);
        let (d, _, attempt) = sealed_of(&j, "b01-p1-X").pop().unwrap();
        assert_eq!(attempt, 2);
        assert_eq!(read_cell(&results.join(d)).unwrap().outcome.status, CellStatus::Completed);
        // As often as allowed (2): that cell is abandoned, and still no other cell is skipped.
        let results = t.path().join("twice");
        let f = Fake { fail_arm: None, interrupt: Some(("X", 2.into())) };
        let s = run(&c, &f, &opts(&results, RunMode::Run)).unwrap();
        assert_eq!((s.sealed, s.skipped, s.abandoned), (6, 0, 1));
        assert_eq!((s.discarded, s.discarded_now, status_discards(&c, &results)), (2, 2, 2));
        // A later run discards nothing more and still counts what the journal has.
        let s = run(&c, &fake(None), &opts(&results, RunMode::Resume)).unwrap();
        assert_eq!((s.discarded, s.discarded_now, status_discards(&c, &results)), (2, 0, 2));
    }

    /// The interrupted attempts `campaign status` shows, summed over its cells.
    fn status_discards(c: &Loaded, results: &Path) -> usize {
        super::super::status::status(c, results).unwrap().cells.iter().map(|r| r.discards as usize).sum()
    }

    #[test]
    fn only_an_outside_signal_without_an_oom_kill_interrupts_an_attempt() {
        use super::super::executor::Telemetry as T;
        let quiet = T::default();
        let interruption = super::super::executor::interruption;
        assert!(interruption(Some(libc::SIGKILL), Some(3), Some(3), &quiet).is_some());
        assert!(interruption(Some(libc::SIGTERM), Some(3), Some(3), &quiet).is_some());
        // The engine's own aborts, an OOM kill anywhere, a limit event, an exit: outcomes.
        assert!(interruption(Some(libc::SIGABRT), Some(3), Some(3), &quiet).is_none());
        assert!(interruption(Some(libc::SIGSEGV), Some(3), Some(3), &quiet).is_none());
        assert!(interruption(Some(libc::SIGKILL), Some(3), Some(4), &quiet).is_none());
        assert!(interruption(Some(libc::SIGKILL), None, None, &quiet).is_none());
        assert!(interruption(Some(libc::SIGKILL), Some(3), Some(3), &T { oom_kill_events: Some(1), ..T::default() }).is_none());
        assert!(interruption(Some(libc::SIGKILL), Some(3), Some(3), &T { memory_max_events: Some(5), ..T::default() }).is_none());
        assert!(interruption(None, Some(3), Some(3), &quiet).is_none());
    }

    #[test]
    fn crash_points_are_recovered_without_rerunning_or_losing_a_cell() {
        let t = tempfile::tempdir().unwrap();
        let c = fixture(t.path());
        let results = t.path().join("results");
        let fake = fake(None);
        run(&c, &fake, &opts(&results, RunMode::Run)).unwrap();
        let key = "b02-p0-X";

        // 1. Killed after the rename, before `cell_sealed`: the record is found and kept.
        let j = truncate_after(&results, |e| matches!(e, Event::CellSealing { cell, .. } if cell == key));
        let Event::CellSealing { digest, .. } = &j.last().unwrap().event else { unreachable!() };
        let digest = digest.clone();
        run(&c, &fake, &opts(&results, RunMode::Resume)).unwrap();
        assert_eq!(sealed_of(&journal(&results), key), [(digest.clone(), true, 1)]);

        // 2. Killed after `cell_sealing`, before the rename: the staged record is sealed.
        let j = truncate_after(&results, |e| matches!(e, Event::CellSealing { cell, .. } if cell == key));
        assert_eq!(sealed_of(&j, key), []);
        let staged = CampaignDir::new(&results, "fake").staging().join(format!("{key}.a1"));
        make_writable(&results.join(&digest));
        fs::rename(results.join(&digest), &staged).unwrap();
        run(&c, &fake, &opts(&results, RunMode::Resume)).unwrap();
        assert_eq!(sealed_of(&journal(&results), key), [(digest.clone(), true, 1)]);
        verify_record(&results.join(&digest)).unwrap();

        // 3. Killed mid-cell: the half-written staging is discarded and the cell runs again.
        truncate_after(&results, |e| matches!(e, Event::CellStarted { cell, .. } if cell == key));
        fs::create_dir_all(staged.join("junk")).unwrap();
        let s = run(&c, &fake, &opts(&results, RunMode::Resume)).unwrap();
        assert_eq!((s.discarded, s.discarded_now, status_discards(&c, &results)), (1, 1, 1));
        let j = journal(&results);
        let sealed = sealed_of(&j, key);
        assert_eq!(sealed.len(), 1);
        assert_eq!((sealed[0].1, sealed[0].2), (false, 2));
        assert!(!staged.exists());

        // 4. Interrupted more often than allowed (2): abandoned, not retried forever.
        truncate_after(&results, |e| matches!(e, Event::CellStarted { cell, attempt, .. } if cell == key && *attempt == 2));
        let (mut jn, _) = Journal::open(&CampaignDir::new(&results, "fake").journal()).unwrap();
        jn.append(Event::CellDiscarded { cell: key.into(), attempt: 2, reason: "test".into() }).unwrap();
        jn.append(Event::CellStarted { cell: key.into(), index: 3, attempt: 3, staging: format!("staging/{key}.a3") }).unwrap();
        drop(jn);
        let s = run(&c, &fake, &opts(&results, RunMode::Resume)).unwrap();
        // Three attempts of that cell discarded in all (as status counts), one by this run.
        assert_eq!((s.abandoned, s.discarded, s.discarded_now, status_discards(&c, &results)), (1, 3, 1, 3));
        let j = journal(&results);
        assert!(j.iter().any(|e| matches!(&e.event, Event::CellAbandoned { cell, .. } if cell == key)));
    }
}
