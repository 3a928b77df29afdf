//! Cell execution: each cell is one worker process (`sovereign cell SPEC`) that writes one
//! record into a staging directory. The runner only knows the [`CellExecutor`] trait;
//! [`ProcessExecutor`] turns the campaign cell into a typed [`Cell`] ([`worker_cell`], the only
//! place arm fields become run settings) and starts its worker, inside a memory cgroup when the
//! arm has a cap. [`CellExecutor::preflight`] says what this build can run; [`Telemetry`] is what
//! an observer fills in (`None` means "not observed", never zero).

use super::arm::{ArmExperts, ArmKind, DeviceArm, Program, RunArm};
use super::expand::CellSpec;
use super::spec::Measure;
use crate::cell::{self, Cell, Experts, GenerateCell, Prompt, RefineCell};
use crate::exec::ExecParams;
use crate::observe::RunStatus;
use crate::plan::PlanOptions;
use crate::plan::PolicySpec;
use crate::refine;
use crate::source::fault::FaultCell;
use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Whether the cell's process produced its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// Exited 0 and left a record in the staging directory.
    Completed,
    /// Exited non-zero, was killed, or left no record. This is an outcome, sealed like any other.
    Failed,
}

impl CellStatus {
    pub fn name(self) -> &'static str {
        match self {
            CellStatus::Completed => "completed",
            CellStatus::Failed => "failed",
        }
    }
}

/// Resource observations of one cell. `None`: not observed by this executor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    /// Peak charge of the cell's cgroup over its whole process tree (memory.peak / max_usage).
    pub memory_peak_bytes: Option<u64>,
    /// memory.max (v2) / failcnt (v1) limit events.
    pub memory_max_events: Option<u64>,
    pub oom_kill_events: Option<u64>,
    pub swap_peak_bytes: Option<u64>,
    /// Peak resident set of the worker (`wait4` ru_maxrss; sampled VmHWM when contained): not a
    /// cgroup charge, and not used by the admission predicate.
    pub child_max_rss_bytes: Option<u64>,
}

/// What happened when a cell ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellOutcome {
    pub status: CellStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The failure in one line (machine paths replaced by `<record>` and campaign-relative paths).
    pub error: Option<String>,
    /// Complete wall time seen by the runner: spawn to exit.
    pub wall_s: f64,
    /// The command of records before typed cells (empty since).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The cell the worker ran, with campaign-relative paths and `<record>` for the staging
    /// directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<Cell>,
    pub telemetry: Telemetry,
    /// Set when the worker was ended from outside (a signal the run did not cause: not the
    /// kernel's OOM killer, not the cgroup limit, not the engine's own abort): the attempt is
    /// interrupted, not an outcome; the runner discards it and runs the cell again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
    /// A `warm` arm's model bytes the runner read through the page cache before the worker
    /// started (not in `wall_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmed_bytes: Option<u64>,
}

/// The kernel's count of OOM kills since boot (`/proc/vmstat` `oom_kill`), if it keeps one.
fn oom_kills_now() -> Option<u64> {
    procfs::vmstat().ok()?.get("oom_kill").and_then(|&n| u64::try_from(n).ok())
}

/// Why a worker that died by `signal` was interrupted rather than failed: only signals that
/// come from outside (an operator, a scheduler's preemption), with no OOM kill anywhere on the
/// machine during the attempt and no limit event in its cgroup.
pub(super) fn interruption(signal: Option<i32>, oom_before: Option<u64>, oom_after: Option<u64>, t: &Telemetry) -> Option<String> {
    let sig = signal?;
    let outside = [Signal::SIGKILL, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT];
    if !outside.iter().any(|s| *s as i32 == sig) {
        // SIGABRT, SIGSEGV, SIGFPE, SIGBUS, SIGILL: the run's own (an engine abort).
        return None;
    }
    let (Some(a), Some(b)) = (oom_before, oom_after) else { return None };
    if b != a || t.oom_kill_events.unwrap_or(0) > 0 || t.memory_max_events.unwrap_or(0) > 0 {
        return None;
    }
    let status = RunStatus::Signaled { signal: sig, name: crate::observe::signal_name(sig), core_dumped: false };
    Some(format!("the worker {status} from outside the run: no OOM kill, no limit event"))
}

/// Runs one cell. `staging` does not exist yet: a successful run leaves a complete record
/// directory there (the runner adds `cell.json` and seals it); `log` receives the process's
/// output. An `Err` means the executor could not run the cell at all (the runner stops and the
/// cell is retried on resume); a cell that ran and failed is an `Ok` outcome.
pub trait CellExecutor {
    /// Refuses, before the campaign is frozen, a cell this executor cannot run as specified.
    fn preflight(&self, _cell: &CellSpec) -> Result<()> {
        Ok(())
    }
    fn run(&self, cell: &CellSpec, inputs: &CellInputs, staging: &Path, log: &Path) -> Result<CellOutcome>;
}

/// What a cell may read of its block: the sealed, completed records of the cells that ran
/// before it (a measurement cell reads them; a run reads nothing).
#[derive(Debug, Clone, Default)]
pub struct CellInputs {
    pub block: Vec<BlockRecord>,
}

#[derive(Debug, Clone)]
pub struct BlockRecord {
    pub arm: super::expand::CellArm,
    pub digest: String,
    pub dir: PathBuf,
}

/// The typed cell of a measurement arm, its inputs resolved from the block; an input that
/// is missing (its cell failed or was skipped) is an error that becomes the cell's outcome.
pub fn measure_cell(cell: &CellSpec, inputs: &CellInputs, model: &Path, record: &Path) -> Result<Cell> {
    let id = &cell.arm.id.value;
    let ArmKind::Measure(measure) = cell.arm.kind() else { anyhow::bail!("arm `{id}` is not a measurement arm") };
    match measure {
        Measure::Envelope(e) => Ok(Cell::Envelope(cell::EnvelopeCell {
            model: model.to_path_buf(),
            block_bytes: e.block_bytes,
            depths: e.depths.clone(),
            bytes_per_depth: e.bytes_per_depth,
            record: record.to_path_buf(),
        })),
        Measure::ReadReplay(r) => {
            let of = &r.of.value;
            let source = inputs
                .block
                .iter()
                .rev()
                .find(|b| b.arm.id.value == *of)
                .with_context(|| format!("arm `{id}`: no completed record of arm `{of}` earlier in block {}", cell.block))?;
            let Some(mut plan) = source.arm.kind().run().and_then(|r| r.plan().cloned()) else {
                anyhow::bail!("arm `{id}`: measure.read_replay.of `{of}` is not a Plan arm")
            };
            if plan.budget.take().is_some() {
                // Sized from its budget: the replay reads as the run did, with the record's slots and policy.
                let rec = crate::record::load_generate(&source.dir)?;
                let d = rec
                    .params
                    .as_ref()
                    .and_then(|p| p.experts.plan())
                    .with_context(|| format!("arm `{id}`: record of `{of}` names no Plan"))?;
                plan.slots = d.slots;
                plan.policy =
                    d.policy.parse::<PolicySpec>().with_context(|| format!("arm `{id}`: the policy `{}` of `{of}`'s record", d.policy))?;
            }
            let (depth, depth_from) = match r.depth {
                Some(d) => (d, "fixed".to_string()),
                None => {
                    let env =
                        inputs.block.iter().rev().find(|b| matches!(b.arm.kind(), ArmKind::Measure(Measure::Envelope(_)))).with_context(
                            || format!("arm `{id}`: no completed envelope record earlier in block {} to take the depth from", cell.block),
                        )?;
                    let best = crate::record::load_envelope(&env.dir)?
                        .best
                        .with_context(|| format!("envelope record {} names no best depth", env.digest))?;
                    // A floor reads at least as deep as the arm did: an envelope whose best depth
                    // is shallower by its noise would replay the arm's reads slower than it read them.
                    let rec = crate::record::load_generate(&source.dir)?;
                    match rec.params.as_ref().and_then(|p| p.experts.plan()).and_then(|d| d.depth) {
                        Some(own) if own > best.depth => {
                            (own, format!("arm {of}'s own (record {}), deeper than envelope {}'s best", source.digest, env.digest))
                        }
                        _ => (best.depth, format!("envelope {}", env.digest)),
                    }
                }
            };
            Ok(Cell::ReadReplay(cell::ReadReplayCell {
                model: model.to_path_buf(),
                of: source.dir.clone(),
                of_arm: of.clone(),
                of_record: source.digest.clone(),
                plan: PlanOptions { fault: FaultCell::None, ..plan },
                depth,
                depth_from,
                record: record.to_path_buf(),
            }))
        }
    }
}

/// The files one cell refers to.
pub struct CellPaths<'a> {
    pub model: &'a Path,
    pub prompt_file: &'a Path,
    pub record: &'a Path,
    /// Verifier and reference (refinement campaigns).
    pub refine: Option<(&'a Path, &'a Path)>,
    /// The RPC servers the cell's device layers go to (an `rpc` arm's server).
    pub rpc: &'a [String],
    /// The memory cgroup of that server, when the arm caps the device.
    pub device_cgroup: Option<&'a Path>,
    /// The proposer an arm with `draft` decodes with.
    pub proposer: Option<&'a Path>,
}

/// The single mapping from a campaign cell's run arm and workload to the typed [`Cell`] a
/// worker runs. The cgroup/memory cap is the executor's business, not part of the cell.
pub fn worker_cell(cell: &CellSpec, arm: &RunArm, p: &CellPaths) -> Cell {
    // The context is left to the work (the prompt's tokens and the outputs), the same for every
    // arm of the campaign, drafted or not.
    let exec = || ExecParams::new(None, cell::BATCH, crate::bounds::threads(arm.threads.map(i64::from), None), false);
    match (&arm.program, &cell.refine, p.refine) {
        (Program::Refine(ra), Some(models), Some((verifier, reference))) => Cell::Refine(RefineCell {
            // The campaign's model is the base; plan fields stream the verifier.
            base: p.model.to_path_buf(),
            verifier: verifier.to_path_buf(),
            reference: Some(reference.to_path_buf()),
            prompts: p.prompt_file.to_path_buf(),
            n_predict: *cell.workload.outputs,
            mode: ra.mode,
            tau: ra.tau.unwrap_or(refine::DEFAULT_TAU),
            window: *models.window,
            verify_all: ra.verify_all,
            exec: exec(),
            // The verifier streams with the arm's settings at their defaults where a budget would
            // size them: a refine cell has no budget of the verifier's to size from.
            stream: arm.plan().map(|plan| PlanOptions { fault: FaultCell::None, budget: None, ..plan.clone() }),
            reference_slots: cell::REFERENCE_SLOTS,
            record: p.record.to_path_buf(),
            seal: false,
        }),
        _ => Cell::Generate(GenerateCell {
            model: p.model.to_path_buf(),
            prompt: match (cell.workload.is_session(), &arm.program) {
                (true, Program::Generate { between, .. }) => {
                    Prompt::Requests { file: p.prompt_file.to_path_buf(), between: between.unwrap_or_default().resolve() }
                }
                _ => Prompt::File(p.prompt_file.to_path_buf()),
            },
            n_predict: *cell.workload.outputs,
            exec: exec(),
            ignore_eos: cell.workload.ignore_eos,
            experts: match &arm.experts {
                ArmExperts::Resident { .. } => Experts::Resident,
                ArmExperts::Host => Experts::Host,
                ArmExperts::Plan(plan) => Experts::Plan(plan.clone()),
            },
            gpu_layers: arm.device().map_or(0, DeviceArm::n_gpu_layers),
            gpu_budget: arm.device().and_then(DeviceArm::budget),
            rpc: p.rpc.to_vec(),
            device_cgroup: p.device_cgroup.map(Path::to_path_buf),
            draft: arm.draft().and_then(|d| {
                let proposer = match d.is_mtp() {
                    true => crate::generate::Proposer::Mtp,
                    false => crate::generate::Proposer::Model(p.proposer?.to_path_buf()),
                };
                Some(crate::generate::Draft { proposer, max: d.max })
            }),
            record: p.record.to_path_buf(),
            // The campaign seals each record under its digest.
            seal: false,
        }),
    }
}

/// What the contained run put on record about its memory tiers (None where not observed).
fn resource_telemetry(record: &Path, max_rss_bytes: u64) -> Telemetry {
    let rec = crate::record::load_typed(record).ok();
    let host = rec.as_ref().and_then(|r| r.resources()).map(|r| &r.host);
    Telemetry {
        memory_peak_bytes: host.and_then(|h| h.kernel_peak),
        memory_max_events: host.map(|h| h.limit_events),
        oom_kill_events: host.map(|h| h.oom_kills),
        swap_peak_bytes: host.and_then(|h| h.swap.peak),
        child_max_rss_bytes: Some(max_rss_bytes),
    }
}

/// Spawns this executable (`sovereign generate ...`) for each cell, output to the cell's log.
/// A device server (`sovereign device serve`) on an ephemeral loopback port, killed and reaped
/// when dropped, so no cell leaves one running.
/// An `rpc: local` arm's device server: a child of the runner, in a memory cgroup of its own
/// when the arm caps the device.
struct DeviceServer {
    server: Server,
    endpoint: String,
}

enum Server {
    Child(std::process::Child),
    Capped(Option<crate::observe::Capped>),
}

impl Server {
    fn pid(&self) -> u32 {
        match self {
            Server::Child(c) => c.id(),
            Server::Capped(c) => c.as_ref().map_or(0, |c| c.pid()),
        }
    }

    fn exited(&mut self) -> Option<String> {
        match self {
            Server::Child(c) => c.try_wait().ok().flatten().map(|s| RunStatus::from_exit(s).to_string()),
            Server::Capped(_) => {
                // No signal: only asks whether our own child is still there.
                kill(Pid::from_raw(self.pid() as i32), None).is_err().then(|| "ended".to_string())
            }
        }
    }

    fn stop(&mut self) {
        match self {
            Server::Child(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            Server::Capped(c) => {
                if let Some(c) = c.take() {
                    // Our own child; `wait` then reaps it and removes its cgroup.
                    let _ = kill(Pid::from_raw(c.pid() as i32), Signal::SIGKILL);
                    let _ = c.wait();
                }
            }
        }
    }
}

impl DeviceServer {
    /// Starts a server on an ephemeral loopback port, its spec written at `spec`.
    fn start(exe: &Path, memory_max: Option<u64>, spec: &Path) -> Result<DeviceServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let endpoint = format!("127.0.0.1:{port}");
        let task = crate::cell::Task::DeviceServe(crate::cell::DeviceServe {
            listen: endpoint.clone(),
            threads: crate::cell::DEVICE_SERVE_THREADS,
        });
        crate::cell::write_task(&task, spec)?;
        let mut cmd = crate::cell::task_command(Some(exe), spec)?;
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        let mut server = match memory_max {
            Some(max) => Server::Capped(Some(crate::observe::Capped::start(cmd, max).context("starting the capped device server")?)),
            None => {
                crate::observe::die_with_parent(&mut cmd);
                Server::Child(cmd.spawn().context("starting the device server")?)
            }
        };
        let addr: std::net::SocketAddr = endpoint.parse()?;
        let t0 = Instant::now();
        while std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200)).is_err() {
            if let Some(status) = server.exited() {
                server.stop();
                anyhow::bail!("the device server {status} before listening on {endpoint}");
            }
            if t0.elapsed() > std::time::Duration::from_secs(20) {
                server.stop();
                anyhow::bail!("the device server did not listen on {endpoint} within 20 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(DeviceServer { server, endpoint })
    }

    fn cgroup_dir(&self) -> Option<&Path> {
        match &self.server {
            Server::Capped(Some(c)) => Some(c.cgroup_dir()),
            _ => None,
        }
    }
}

impl Drop for DeviceServer {
    fn drop(&mut self) {
        self.server.stop();
    }
}

pub struct ProcessExecutor {
    exe: PathBuf,
    /// Relative model and prompt paths are taken from here (the campaign file's directory).
    base: PathBuf,
}

impl ProcessExecutor {
    /// Uses the running executable.
    pub fn current(base: &Path) -> Result<ProcessExecutor> {
        Ok(ProcessExecutor::with_exe(&std::env::current_exe().context("locating this executable")?, base))
    }

    pub fn with_exe(exe: &Path, base: &Path) -> ProcessExecutor {
        ProcessExecutor { exe: exe.to_path_buf(), base: base.to_path_buf() }
    }
}

impl CellExecutor for ProcessExecutor {
    fn preflight(&self, cell: &CellSpec) -> Result<()> {
        if cell.arm.kind().run().is_some_and(|r| r.memory_cap_bytes.is_some()) {
            // Refuse before anything is frozen when no memory cgroup can be made here.
            crate::observe::cleanup_stale().with_context(|| format!("arm `{}`: memory_cap_bytes", cell.arm.id.value))?;
        }
        Ok(())
    }

    fn run(&self, cell: &CellSpec, inputs: &CellInputs, staging: &Path, log: &Path) -> Result<CellOutcome> {
        let input = cell.workload.input().map_err(anyhow::Error::msg)?;
        let paths = RunPaths { model: self.base.join(&cell.model.path), prompt: self.base.join(&input.file.value), staging, log };
        // An `rpc: local` arm's device: started for this cell, stopped when the cell ends.
        let mut server: Option<DeviceServer> = None;
        let kind = cell.arm.kind();
        let (worker, shown) = match kind.run() {
            None => {
                let t0 = Instant::now();
                match measure_cell(cell, inputs, &paths.model, staging) {
                    Ok(w) => {
                        let shown = shown_measure(cell, inputs, &paths, &w);
                        (w, shown)
                    }
                    Err(e) => return failed_to_start(cell, log, &e, t0),
                }
            }
            Some(run) => {
                if let Some(rpc) = run.device().and_then(|d| d.rpc) {
                    let started = DeviceServer::start(&self.exe, rpc.memory_cap_bytes, &log.with_extension("device.json"));
                    server = Some(started.with_context(|| format!("arm `{}`: rpc: local", cell.arm.id.value))?);
                }
                self.run_workers(cell, run, &paths, server.as_ref())
            }
        };
        let mut out = File::create(log).with_context(|| format!("{}: cannot create the cell log", log.display()))?;
        writeln!(out, "# cell {} (attempt log); worker: {}", cell.key, serde_json::to_string(&worker)?)?;
        out.flush()?;
        let warmed_bytes = match kind.run().is_some_and(RunArm::warm) {
            true => {
                let mut n = 0;
                for f in crate::gguf::set::files(&paths.model)? {
                    n += crate::util::warm_file_cache(&f)?;
                }
                writeln!(out, "# warm: read {n} bytes of {} through the page cache", cell.model.path)?;
                Some(n)
            }
            false => None,
        };
        let t0 = Instant::now();
        let oom_before = oom_kills_now();
        let end = match kind.run().and_then(|r| r.memory_cap_bytes.map(|cap| (r, cap))) {
            Some((run, cap)) => self.run_capped(run, &worker, cap, server.as_ref(), &mut out)?,
            None => self.run_plain(&worker, log, &out)?,
        };
        let wall_s = t0.elapsed().as_secs_f64();
        let oom_after = oom_kills_now();
        let complete = staging.join(crate::record::RECORD_FILE).is_file();
        let status = if end.code() == Some(0) && complete { CellStatus::Completed } else { CellStatus::Failed };
        let error = (status == CellStatus::Failed).then(|| failure_line(cell, &paths, &end, complete));
        let telemetry = resource_telemetry(staging, end.maxrss);
        let interrupted = if status == CellStatus::Failed { interruption(end.signal(), oom_before, oom_after, &telemetry) } else { None };
        let (exit_code, signal) = (end.code(), end.signal());
        Ok(CellOutcome {
            status,
            exit_code,
            signal,
            error,
            wall_s,
            command: Vec::new(),
            worker: Some(shown),
            telemetry,
            interrupted,
            warmed_bytes,
        })
    }
}

/// Where one attempt of a cell reads and writes, on this machine.
struct RunPaths<'a> {
    model: PathBuf,
    prompt: PathBuf,
    staging: &'a Path,
    log: &'a Path,
}

/// How the worker ended (None: it never started, and the log says why), and its peak resident set.
struct WorkerExit {
    status: Option<RunStatus>,
    maxrss: u64,
}

impl WorkerExit {
    fn code(&self) -> Option<i32> {
        match self.status {
            Some(RunStatus::Exited { code }) => Some(code),
            // A worker that never started is the cell's failure, as a refusal is (exit 2).
            None => Some(2),
            Some(RunStatus::Signaled { .. }) => None,
        }
    }

    fn signal(&self) -> Option<i32> {
        match self.status {
            Some(RunStatus::Signaled { signal, .. }) => Some(signal),
            _ => None,
        }
    }
}

/// A measurement cell shown without this machine's paths: the campaign's model, records by digest.
fn shown_measure(cell: &CellSpec, inputs: &CellInputs, paths: &RunPaths, w: &Cell) -> Cell {
    let digests: Vec<(PathBuf, String)> = inputs.block.iter().map(|b| (b.dir.clone(), b.digest.clone())).collect();
    w.map_paths(|p| {
        if p == paths.model {
            PathBuf::from(&cell.model.path)
        } else if p == paths.staging {
            PathBuf::from("<record>")
        } else {
            digests.iter().find(|(d, _)| d == p).map_or_else(|| p.to_path_buf(), |(_, g)| PathBuf::from(g))
        }
    })
}

/// A measurement cell that could not be built: a failed outcome, its one line in the log.
fn failed_to_start(cell: &CellSpec, log: &Path, e: &anyhow::Error, t0: Instant) -> Result<CellOutcome> {
    let line = format!("{e:#}").replace('\n', " ");
    let mut out = File::create(log).with_context(|| format!("{}: cannot create the cell log", log.display()))?;
    writeln!(out, "# cell {} (attempt log)\nerror: {line}", cell.key)?;
    Ok(CellOutcome {
        status: CellStatus::Failed,
        exit_code: None,
        signal: None,
        error: Some(line),
        wall_s: t0.elapsed().as_secs_f64(),
        command: Vec::new(),
        worker: None,
        telemetry: Telemetry::default(),
        interrupted: None,
        warmed_bytes: None,
    })
}

/// Why a failed cell failed, in one line without this machine's paths.
fn failure_line(cell: &CellSpec, paths: &RunPaths, end: &WorkerExit, complete: bool) -> String {
    if end.code() == Some(0) {
        return "the cell exited 0 but left no record".to_string();
    }
    let text = std::fs::read_to_string(paths.log).unwrap_or_default();
    let line = match complete {
        // The record says how the worker ended, in its own words.
        true => crate::record::load_typed(paths.staging).ok().and_then(|r| r.error().map(str::to_string)),
        false => None,
    };
    let own = || text.lines().map(str::trim).rev().find_map(|l| l.strip_prefix("error:")).map(|l| l.trim().to_string()).unwrap_or_default();
    let line = line.unwrap_or_else(|| match &end.status {
        Some(status) => crate::observe::worker_failure(status, None, Some(&text)),
        None => own(),
    });
    let mut line = line.replace(&paths.staging.display().to_string(), "<record>");
    let input = cell.workload.input().map_or("", |i| i.file.value.as_str());
    for (abs, rel) in [(&paths.model, cell.model.path.value.as_str()), (&paths.prompt, input)] {
        line = line.replace(&abs.display().to_string(), rel);
    }
    line
}

impl ProcessExecutor {
    /// A run cell's worker, and the same worker as the record shows it (no machine paths).
    fn run_workers(&self, cell: &CellSpec, arm: &RunArm, paths: &RunPaths, server: Option<&DeviceServer>) -> (Cell, Cell) {
        let refine_paths = cell.refine.as_ref().map(|r| (self.base.join(&r.verifier.path), self.base.join(&r.reference.path)));
        let proposer = cell.proposer.as_ref().map(|m| self.base.join(&m.path));
        let endpoints: Vec<String> = server.iter().map(|s| s.endpoint.clone()).collect();
        let device_cgroup = server.and_then(DeviceServer::cgroup_dir).map(Path::to_path_buf);
        let worker = worker_cell(
            cell,
            arm,
            &CellPaths {
                model: &paths.model,
                prompt_file: &paths.prompt,
                record: paths.staging,
                refine: refine_paths.as_ref().map(|(v, r)| (v.as_path(), r.as_path())),
                rpc: &endpoints,
                device_cgroup: device_cgroup.as_deref(),
                proposer: proposer.as_deref(),
            },
        );
        let shown_rpc: Vec<String> = endpoints.iter().map(|_| "<local device server>".to_string()).collect();
        let shown = worker_cell(
            cell,
            arm,
            &CellPaths {
                model: Path::new(&cell.model.path),
                prompt_file: Path::new(cell.workload.input().map_or("", |i| i.file.value.as_str())),
                record: Path::new("<record>"),
                refine: cell.refine.as_ref().map(|r| (Path::new(&r.verifier.path), Path::new(&r.reference.path))),
                rpc: &shown_rpc,
                device_cgroup: device_cgroup.as_ref().map(|_| Path::new("<device server cgroup>")),
                proposer: cell.proposer.as_ref().map(|m| Path::new(m.path.as_str())),
            },
        );
        (worker, shown)
    }

    /// The runner is the harness: it makes the cgroup and starts the one worker in it. A
    /// cgroup that cannot be made is the cell's failure (exit 2), written to its log.
    fn run_capped(&self, arm: &RunArm, worker: &Cell, cap: u64, server: Option<&DeviceServer>, out: &mut File) -> Result<WorkerExit> {
        let contain = crate::observe::ContainSpec {
            memory_max: Some(cap),
            gpu_budget: arm.device().and_then(DeviceArm::budget),
            device_cgroup: server.and_then(DeviceServer::cgroup_dir).map(Path::to_path_buf),
            ..Default::default()
        };
        let ran = cell::cache_protocol(worker, false).and_then(|cache| cell::run_in_cgroup(worker, &contain, cache, Some(&self.exe)));
        match ran {
            Ok((rec, dir)) => {
                if let Ok(text) = std::fs::read_to_string(dir.join(cell::LOG_FILE)) {
                    out.write_all(text.as_bytes())?;
                }
                let res = rec.resources().context("a contained record without its resources")?;
                Ok(WorkerExit { status: Some(res.status.clone()), maxrss: res.procs.rss_hwm.unwrap_or(0) })
            }
            Err(e) => {
                writeln!(out, "error: {}", format!("{e:#}").replace('\n', " "))?;
                Ok(WorkerExit { status: None, maxrss: 0 })
            }
        }
    }

    /// `sovereign cell SPEC` with no cgroup, its output into the cell's log.
    fn run_plain(&self, worker: &Cell, log: &Path, out: &File) -> Result<WorkerExit> {
        let spec = log.with_extension("cell.json");
        let cmd =
            cell::worker_command(Some(&self.exe), worker, cell::SpecFrom::File(&spec), cell::WorkerOutput::Log(out.try_clone()?), &[])?;
        let ran = crate::observe::run_plain(cmd);
        let _ = std::fs::remove_file(&spec);
        let (status, maxrss) = ran?;
        Ok(WorkerExit { status: Some(status), maxrss })
    }
}
