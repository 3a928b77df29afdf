//! Cell execution: each cell is a fresh child process that writes one record into a staging
//! directory. The runner only knows the [`CellExecutor`] trait; [`ProcessExecutor`] spawns
//! `sovereign generate`. Extension points for the memory-limit and Plan work:
//! [`generate_args`] (the only place arm fields become command-line arguments),
//! [`CellExecutor::preflight`] (what this build can run) and [`Telemetry`] (what an observer
//! fills in; `None` means "not observed", never zero).

use super::expand::CellSpec;
use super::spec::ExpertsMode;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
    /// Peak resident set of the child process itself (`wait4` ru_maxrss): not a cgroup charge,
    /// and not used by the admission predicate.
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
    /// The command, with campaign-relative paths and `<record>` for the staging directory.
    pub command: Vec<String>,
    pub telemetry: Telemetry,
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
    fn run(&self, cell: &CellSpec, staging: &Path, log: &Path) -> Result<CellOutcome>;
}

/// The files one cell's command line refers to.
pub struct CellPaths<'a> {
    pub model: &'a Path,
    pub prompt_file: &'a Path,
    pub record: &'a Path,
    /// Verifier and reference (refinement campaigns).
    pub refine: Option<(&'a Path, &'a Path)>,
}

/// The single mapping from a cell's arm and workload to `sovereign generate` arguments.
/// Plan arms map to the options of DESIGN.md's command line; the cgroup/memory cap is the
/// runner's business, not an argument.
pub fn generate_args(cell: &CellSpec, p: &CellPaths) -> Vec<OsString> {
    let arm = &cell.arm;
    let mut a: Vec<OsString> = match (&arm.refine, &cell.refine, p.refine) {
        (Some(ra), Some(models), Some((verifier, reference))) => {
            // A refinement cell: the campaign's model is the base; plan fields stream the verifier.
            let mut a: Vec<OsString> = vec!["refine".into(), "--base".into(), p.model.into(), "--verifier".into(), verifier.into()];
            a.extend(["--reference".into(), reference.into(), "--prompts".into(), p.prompt_file.into()]);
            a.extend(["--window".into(), models.window.to_string().into(), "--mode".into(), format!("{:?}", ra.mode).to_lowercase().into()]);
            if let Some(t) = ra.tau {
                a.extend(["--tau".into(), t.to_string().into()]);
            }
            if ra.verify_all {
                a.push("--verify-all".into());
            }
            a
        }
        _ => vec!["generate".into(), "--model".into(), p.model.into(), "--prompt-file".into(), p.prompt_file.into()],
    };
    let refine = arm.refine.is_some();
    a.extend(["--n-predict".into(), cell.workload.outputs.to_string().into(), "--threads".into(), arm.threads.to_string().into()]);
    if cell.workload.ignore_eos && !refine {
        a.push("--ignore-eos".into());
    }
    match arm.experts {
        ExpertsMode::Resident if refine => {}
        ExpertsMode::Resident => a.extend(["--experts".into(), "resident".into()]),
        ExpertsMode::Plan => {
            a.extend(if refine { ["--verifier-experts".into(), "plan".into()] } else { ["--experts".into(), "plan".into()] });
            let mut opt = |k: &str, v: Option<String>| {
                if let Some(v) = v {
                    a.push(k.into());
                    a.push(v.into());
                }
            };
            opt("--slots", arm.slots.map(|v| v.to_string()));
            opt("--policy", arm.policy.as_ref().map(|v| v.to_string()));
            opt("--source", arm.source.map(|v| format!("{v:?}").to_lowercase()));
            opt("--windows", arm.windows.map(|v| v.to_string()));
            opt("--depth", arm.depth.map(|v| v.to_string()));
            opt("--layer-buffers", arm.layer_buffers.map(|v| v.to_string()));
            opt("--fault", arm.fault.map(|f| f.name()));
        }
    }
    if let Some(cap) = arm.memory_cap_bytes {
        // The cell runs as its own process tree in a memory cgroup under this hard limit.
        a.extend(["--memory-max".into(), cap.to_string().into()]);
    }
    a.extend(["--record".into(), p.record.into(), "--json".into()]);
    a
}

/// What the contained run put on record about its memory tiers (None where not observed).
fn resource_telemetry(record: &Path, child_max_rss_bytes: u64) -> Telemetry {
    let rec = crate::record::load_typed(record).ok();
    let host = rec.as_ref().and_then(|r| r.resources()).map(|r| &r.host);
    Telemetry {
        memory_peak_bytes: host.and_then(|h| h.kernel_peak),
        memory_max_events: host.map(|h| h.limit_events),
        oom_kill_events: host.map(|h| h.oom_kills),
        swap_peak_bytes: host.and_then(|h| h.swap.peak),
        child_max_rss_bytes: Some(child_max_rss_bytes),
    }
}

/// Spawns this executable (`sovereign generate ...`) for each cell, output to the cell's log.
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
        if cell.arm.memory_cap_bytes.is_some() {
            // Refuse before anything is frozen when no memory cgroup can be made here.
            crate::observe::cleanup_stale().with_context(|| format!("arm `{}`: memory_cap_bytes", cell.arm.id.value))?;
        }
        Ok(())
    }

    fn run(&self, cell: &CellSpec, staging: &Path, log: &Path) -> Result<CellOutcome> {
        let model = self.base.join(&cell.model.path);
        let prompt = self.base.join(&cell.workload.prompt_file);
        let refine_paths = cell.refine.as_ref().map(|r| (self.base.join(&r.verifier.path), self.base.join(&r.reference.path)));
        let args = generate_args(
            cell,
            &CellPaths { model: &model, prompt_file: &prompt, record: staging, refine: refine_paths.as_ref().map(|(v, r)| (v.as_path(), r.as_path())) },
        );
        let shown = generate_args(
            cell,
            &CellPaths {
                model: Path::new(&cell.model.path),
                prompt_file: Path::new(&cell.workload.prompt_file),
                record: Path::new("<record>"),
                refine: cell.refine.as_ref().map(|r| (Path::new(&r.verifier.path), Path::new(&r.reference.path))),
            },
        );
        let mut command = vec!["sovereign".to_string()];
        command.extend(shown.iter().map(|a| a.to_string_lossy().into_owned()));

        let mut out = File::create(log).with_context(|| format!("{}: cannot create the cell log", log.display()))?;
        writeln!(out, "# cell {} (attempt log); command: {} {}", cell.key, self.exe.display(), args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "))?;
        out.flush()?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(&args).stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: only async-signal-safe calls between fork and exec. The child dies with the
        // runner, so a killed runner never leaves a cell finishing unobserved.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let t0 = Instant::now();
        let child = cmd.spawn().with_context(|| format!("spawning {}", self.exe.display()))?;
        let (code, signal, maxrss_kib) = wait4(child.id() as libc::pid_t)?;
        let wall_s = t0.elapsed().as_secs_f64();

        let complete = staging.join(crate::record::RECORD_FILE).is_file();
        let status = if code == Some(0) && complete { CellStatus::Completed } else { CellStatus::Failed };
        let error = match status {
            CellStatus::Completed => None,
            CellStatus::Failed if code == Some(0) => Some("the cell exited 0 but left no record".to_string()),
            CellStatus::Failed => {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let line = crate::observe::worker_error(code, signal, &text);
                let mut line = line.replace(&staging.display().to_string(), "<record>");
                for (abs, rel) in [(&model, &cell.model.path), (&prompt, &cell.workload.prompt_file)] {
                    line = line.replace(&abs.display().to_string(), rel);
                }
                Some(line)
            }
        };
        Ok(CellOutcome {
            status,
            exit_code: code,
            signal,
            error,
            wall_s,
            command,
            telemetry: resource_telemetry(staging, maxrss_kib * 1024),
        })
    }
}

/// Waits for a child, returning (exit code, terminating signal, peak RSS in KiB).
fn wait4(pid: libc::pid_t) -> Result<(Option<i32>, Option<i32>, u64)> {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter; pid is our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: as above.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if rc == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e).context("waiting for the cell process");
        }
    }
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Ok((code, signal, ru.ru_maxrss.max(0) as u64))
}
