//! Resource observation: what bounded each memory tier of a run, and with what authority.
//!
//! [`run_contained`] runs one command as its own process tree inside a fresh memory cgroup
//! below the harness's own (entered before exec, so everything it touches is charged there),
//! optionally under a hard limit with swap off, while two samplers watch it: the cgroup and
//! /proc of its processes, and NVML's whole-board view. It returns what the kernel kept (limit,
//! high-water mark, limit events, OOM, swap, memory.stat split), the GPU audit, the /proc
//! counters, the authority vector and the admission predicate (seed 000 §2.1, §5.3).
//! A low RSS proves nothing: buffered reads charge page cache to the cgroup while RSS stays low,
//! which is why the host tier is the cgroup's charge, not the processes' RSS.
//!
//! This room observes and grades; it does not decide what a failed predicate means for a
//! campaign.

pub mod authority;
pub mod cgroup;
pub mod gpu;
pub mod procs;

use anyhow::{anyhow, bail, Context, Result};
use authority::{AuthorityVector, RunAdmission};
use cgroup::{Counters, Stale, StatSplit, Version};
use gpu::{GpuAudit, GpuSampler, Membership};
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;
use procs::{Io, ProcCounters, TreeSampler};
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use authority::{Conjunct, Grade, Graded, TierAuthority};
pub use cgroup::{SetupError, SetupErrorKind};

/// What a run may use and how often it is sampled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContainSpec {
    /// Hard host limit in bytes (the whole process tree, page cache included); None: the run
    /// still gets its own cgroup, for accounting only.
    pub memory_max: Option<u64>,
    /// Declared GPU allowance in bytes, audited against whole-board use.
    pub gpu_declared: Option<u64>,
    /// Device bound of the run (`--gpu-budget`): the admission predicate's device margin.
    pub gpu_budget: Option<u64>,
    /// The RPC device server's memory cgroup: its kernel peak is the device margin's audit.
    pub device_cgroup: Option<std::path::PathBuf>,
    /// Period of the cgroup, /proc and NVML samplers.
    pub sample_interval: Duration,
}

impl Default for ContainSpec {
    fn default() -> Self {
        ContainSpec {
            memory_max: None,
            gpu_declared: None,
            gpu_budget: None,
            device_cgroup: None,
            sample_interval: Duration::from_millis(50),
        }
    }
}

/// How the direct child ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunStatus {
    Exited { code: i32 },
    Signaled { signal: i32, name: String, core_dumped: bool },
}

impl RunStatus {
    pub fn success(&self) -> bool {
        matches!(self, RunStatus::Exited { code: 0 })
    }

    fn from_wait(status: libc::c_int) -> RunStatus {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            RunStatus::Signaled { signal, name: signal_name(signal), core_dumped: libc::WCOREDUMP(status) }
        } else {
            RunStatus::Exited { code: libc::WEXITSTATUS(status) }
        }
    }

    /// The status of a child reaped by `std::process` (a stopped child reads as exit code -1).
    pub fn from_exit(status: std::process::ExitStatus) -> RunStatus {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => RunStatus::Exited { code },
            (None, Some(signal)) => RunStatus::Signaled { signal, name: signal_name(signal), core_dumped: status.core_dumped() },
            (None, None) => RunStatus::Exited { code: -1 },
        }
    }
}

/// The one way a status is shown to a person, after its process's name: `exited with code 3`,
/// `was killed by signal 9 (SIGKILL)`.
impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunStatus::Exited { code } => write!(f, "exited with code {code}"),
            RunStatus::Signaled { signal, name, core_dumped } => {
                write!(f, "was killed by signal {signal} ({name}){}", if *core_dumped { ", core dumped" } else { "" })
            }
        }
    }
}

/// What a run's cgroup saw of its limit, to tell the limit's kill from a signal sent from outside.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitSeen {
    /// The hard limit, as the kernel read it back (None: no limit).
    pub limit: Option<u64>,
    pub limit_events: u64,
    /// Processes the kernel's OOM killer killed inside the cgroup (v1 and v2 `oom_kill`).
    pub oom_kills: u64,
    /// v1 `under_oom` seen, or v2 `memory.events` oom: the cgroup ran out at its limit.
    pub oom: bool,
}

impl LimitSeen {
    pub fn of(host: &HostReport) -> LimitSeen {
        LimitSeen {
            limit: host.limit,
            limit_events: host.limit_events,
            oom_kills: host.oom_kills,
            oom: host.under_oom_seen || host.oom_events.unwrap_or(0) > 0,
        }
    }
}

/// Why a worker failed, in words: the one wording of a failed worker for everything a person
/// reads (stderr, a record's `error`, the admission predicate's conjunct, a campaign's
/// `cell.json`). A SIGKILL while the kernel's OOM killer acted in the cgroup is the limit's
/// kill; any other signal is named as it came, after the engine's own words where it aborted.
/// From `log` only the worker's own `error` line or the engine's abort is taken: other output (a
/// debugger's, a library's) is never the error. `log` is `None` where the caller has not read it
/// (the admission's conjunct, beside a record that holds the line).
pub fn worker_failure(status: &RunStatus, seen: Option<&LimitSeen>, log: Option<&str>) -> String {
    let own = log.unwrap_or_default().lines().map(str::trim).rev().find(|l| l.starts_with("error")).map(|l| {
        let l = l.strip_prefix("error:").map_or(l, str::trim_start);
        l.chars().take(500).collect::<String>()
    });
    let limit = seen.and_then(|s| s.limit.map(|l| (crate::bounds::show_bytes(l), s)));
    let by_limit = matches!(status, RunStatus::Signaled { signal: libc::SIGKILL, .. })
        && limit.as_ref().is_some_and(|(_, s)| s.oom_kills > 0 || s.oom);
    // A SIGKILL comes from outside (a limit, a timeout, a person), never from an abort.
    let aborted = matches!(status, RunStatus::Signaled { signal, .. } if *signal != libc::SIGKILL);
    let abort = aborted.then(|| log.and_then(engine_abort)).flatten();
    let mut line = match (status, &own) {
        (RunStatus::Signaled { signal, name, .. }, _) if by_limit => {
            format!(
                "the cgroup's {} limit killed the worker: the kernel's OOM killer sent it signal {signal} ({name})",
                limit.as_ref().map_or("", |(l, _)| l.as_str())
            )
        }
        // The engine's own words where it aborted (an assertion, an exception, a backend's
        // error): what killed it, whatever it said before.
        (RunStatus::Signaled { .. }, _) if abort.is_some() => {
            format!("llama.cpp aborted: {} (the worker {status})", abort.as_deref().unwrap_or_default())
        }
        (RunStatus::Signaled { .. }, None) => format!("the worker {status}"),
        (RunStatus::Signaled { .. }, Some(e)) => format!("the worker {status} after: {e}"),
        (RunStatus::Exited { .. }, Some(e)) => format!("the worker {status}: {e}"),
        (RunStatus::Exited { .. }, None) if log.is_some() => format!("the worker {status} and no error line"),
        (RunStatus::Exited { .. }, None) => format!("the worker {status}"),
    };
    if let Some((l, s)) = limit.filter(|(_, s)| s.limit_events > 0 && !by_limit) {
        line += &format!("; its cgroup's {l} limit was reached {} times", s.limit_events);
    }
    line
}

/// The engine's own words for an abort in a worker's stderr: the first GGML_ASSERT or
/// GGML_ABORT line (`file.c:line: message`, printed before any backtrace), or an uncaught
/// exception's `what()`. A backend's error (`CUDA error`) is followed by what the backend said
/// just before it: the runtime's message and the function whose call failed.
pub fn engine_abort(stderr: &str) -> Option<String> {
    // The path of a source file is this machine's; the file name and line are the engine's.
    let base = |file: &str| file.rsplit('/').next().unwrap_or(file).to_string();
    let located = |l: &str| -> Option<String> {
        let (loc, rest) = l.split_once(": ")?;
        let (file, line) = loc.rsplit_once(':')?;
        let source = [".c", ".cpp", ".h", ".cu"].iter().any(|x| file.ends_with(x));
        (source && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) && !file.contains(char::is_whitespace))
            .then(|| format!("{}:{line}: {rest}", base(file)))
    };
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let Some((at, mut text)) = lines.iter().enumerate().find_map(|(i, l)| located(l).map(|t| (i, t))) else {
        let what = lines.iter().find(|l| l.contains("what():"))?;
        return Some(what.chars().take(400).collect());
    };
    if let Some(backend) = text.strip_suffix(" error").and_then(|t| t.rsplit(": ").next()).filter(|b| !b.is_empty()) {
        // ggml_cuda_error: "<B> error: <msg>", "current device: N, in function F at FILE:LINE", stmt
        let before = &lines[at.saturating_sub(3)..at];
        let said = before.iter().find_map(|l| l.strip_prefix(&format!("{backend} error: ")));
        let call = before.iter().find_map(|l| {
            let f = l.split_once("in function ")?.1;
            let (func, file) = f.split_once(" at ")?;
            Some(format!("in {func} at {}", base(file)))
        });
        if let Some(said) = said {
            text = format!("{text}: {said}{}", call.map(|c| format!(" ({c})")).unwrap_or_default());
        }
    }
    Some(text.chars().take(400).collect())
}

/// A signal's name (`SIGKILL`), or `signal N` for one without a common name.
pub fn signal_name(sig: i32) -> String {
    let n = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    n.to_string()
}

/// Swap of the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SwapReport {
    /// Whether the cgroup accounts swap (v1 memsw files, v2 `memory.swap.current`).
    pub accounted: bool,
    /// Largest swap seen (sampled, and v2 `memory.swap.peak` where kept); `Some(0)` also when
    /// swap is not accounted but the host has none configured.
    pub peak: Option<u64>,
    pub end: Option<u64>,
    /// v2 `memory.swap.events` max + fail.
    pub events: Option<u64>,
    pub note: String,
}

/// The host tier: the run cgroup's charge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct HostReport {
    pub hierarchy: Option<Version>,
    /// Name of the run's cgroup below the harness's own (removed afterwards; see `removed`).
    /// Its filesystem path is the machine's, not the run's, and stays out of records.
    pub cgroup: String,
    #[serde(skip)]
    pub cgroup_path: PathBuf,
    pub requested_limit: Option<u64>,
    /// The limit as the kernel read it back; None: no limit.
    pub limit: Option<u64>,
    pub swap_control: String,
    /// Kernel high-water mark (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`), if kept.
    pub kernel_peak: Option<u64>,
    /// Largest sampled usage (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub sampled_peak: u64,
    pub end_usage: u64,
    /// Times a charge hit the limit (v1 failcnt of memory + memsw, v2 `memory.events` max).
    pub limit_events: u64,
    pub limit_event_files: BTreeMap<String, u64>,
    /// v2 `memory.events` oom; None on v1 (no count kept).
    pub oom_events: Option<u64>,
    /// v1 `under_oom` seen in any sample or at the end.
    pub under_oom_seen: bool,
    pub oom_kills: u64,
    pub swap: SwapReport,
    /// memory.stat split at the sample of largest usage, and after the run.
    pub stat_at_peak: Option<StatSplit>,
    pub stat_end: Option<StatSplit>,
    /// Host MemTotal, the physical ceiling.
    pub mem_total: Option<u64>,
    pub samples: u64,
    /// Processes still in the cgroup after the direct child exited, killed by the harness.
    pub stragglers_killed: u32,
    /// Cgroups of dead harnesses removed before this run.
    pub stale_removed: Vec<Stale>,
    pub removed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleanup_error: Option<String>,
}

/// Everything observed of one contained run.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ContainedRun {
    pub status: RunStatus,
    pub wall_s: f64,
    pub host: HostReport,
    pub gpu: GpuAudit,
    pub procs: ProcCounters,
    pub authority: AuthorityVector,
    pub admission: RunAdmission,
}

/// What the host sampler thread saw.
#[derive(Default)]
struct HostSamples {
    samples: u64,
    sampled_peak: u64,
    stat_at_peak: Option<StatSplit>,
    swap_peak: Option<u64>,
    under_oom_seen: bool,
    tree: TreeSampler,
}

impl HostSamples {
    fn sample(&mut self, dir: &std::path::Path, v: Version) {
        let c: Counters = cgroup::read_counters(dir, v);
        if self.samples == 0 || c.usage > self.sampled_peak {
            self.sampled_peak = c.usage;
            self.stat_at_peak = cgroup::read_stat(dir, v);
        }
        if let Some(s) = c.swap {
            self.swap_peak = Some(self.swap_peak.unwrap_or(0).max(s));
        }
        self.under_oom_seen |= c.under_oom;
        self.tree.sample(&cgroup::read_pids(dir));
        self.samples += 1;
    }
}

struct HostSampler {
    stop: Sender<()>,
    handle: JoinHandle<HostSamples>,
}

impl HostSampler {
    fn start(dir: PathBuf, v: Version, interval: Duration) -> Result<HostSampler> {
        let (stop, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new().name("observe-host".into()).spawn(move || {
            let mut s = HostSamples::default();
            loop {
                s.sample(&dir, v);
                match rx.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    _ => break,
                }
            }
            s.sample(&dir, v);
            s
        })?;
        Ok(HostSampler { stop, handle })
    }

    fn stop(self) -> HostSamples {
        let _ = self.stop.send(());
        self.handle.join().unwrap_or_default()
    }
}

/// Waits for the direct child to exit, reads its /proc counters while it is a zombie, then reaps
/// it with wait4 for its status and rusage.
fn wait_child(pid: u32) -> Result<(RunStatus, Option<Io>, libc::rusage)> {
    let id = Pid::from_raw(pid as libc::pid_t);
    loop {
        match waitid(Id::Pid(id), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(_) => break,
            Err(Errno::EINTR) => continue,
            Err(e) => bail!("waiting for child {pid}: {}", std::io::Error::from(e)),
        }
    }
    let io = procs::read_io(pid);
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data, valid when zeroed.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 (which nix does not wrap) on our own child, writing only into the two
        // locals it is given.
        let r = unsafe { libc::wait4(id.as_raw(), &mut status, 0, &mut ru) };
        if r == id.as_raw() {
            break;
        }
        let e = std::io::Error::last_os_error();
        if r < 0 && e.raw_os_error() != Some(libc::EINTR) {
            bail!("reaping child {pid}: {e}");
        }
    }
    Ok((RunStatus::from_wait(status), io, ru))
}

/// `cmd`'s process is killed (SIGKILL) when this process dies, however it dies. The death
/// signal follows the thread that spawns, so spawn and wait on one thread. getppid after the
/// prctl closes the race with a parent that died before it took effect.
pub fn die_with_parent(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the hook makes only prctl, getppid and raise calls (async-signal-safe, no
    // allocation) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != parent {
                let _ = nix::sys::signal::raise(Signal::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Runs `cmd` as a plain child that dies with us (no cgroup): how it ended, and its wait4
/// `ru_maxrss` in bytes.
pub fn run_plain(mut cmd: Command) -> Result<(RunStatus, u64)> {
    die_with_parent(&mut cmd);
    let child = cmd.spawn().with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    let (status, _, ru) = wait_child(child.id())?;
    Ok((status, (ru.ru_maxrss.max(0) as u64) * 1024))
}

/// A long-lived process (a device server) held in a memory cgroup of its own: the kernel bounds
/// its memory hard. Dropping it kills what is inside and removes the cgroup.
pub struct Capped {
    cgroup: cgroup::RunCgroup,
    pid: u32,
    /// The limit as the kernel reads it back.
    pub limit: Option<u64>,
}

/// How a capped process ended, and what its cgroup saw.
#[derive(Debug, Serialize)]
pub struct CappedEnd {
    pub status: RunStatus,
    pub counters: cgroup::Counters,
}

impl Capped {
    /// Starts `cmd` inside a new cgroup below ours, limited to `memory_max` with swap off.
    pub fn start(mut cmd: Command, memory_max: u64) -> Result<Capped> {
        let h = cgroup::prepare()?;
        cgroup::cleanup_stale(&h);
        let cg = cgroup::RunCgroup::create(&h)?;
        let setting = cg.set_limit(Some(memory_max))?;
        let procs_file = cg.open_procs()?;
        let fd = procs_file.as_raw_fd();
        // SAFETY: the hook only calls getpid and write (async-signal-safe); the fd stays open in
        // the parent until spawn returns and is close-on-exec, so borrowing it in the child
        // before exec is sound.
        unsafe {
            cmd.pre_exec(move || cgroup::join_fd(BorrowedFd::borrow_raw(fd)));
        }
        die_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("cannot start {:?} in cgroup {}", cmd.get_program(), cg.path.display()))?;
        drop(procs_file);
        Ok(Capped { pid: child.id(), cgroup: cg, limit: setting.limit })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The cgroup, as `/proc/<pid>/cgroup` names it.
    pub fn cgroup(&self) -> &str {
        &self.cgroup.rel
    }

    /// The cgroup's directory (what [`audit_device`] reads).
    pub fn cgroup_dir(&self) -> &std::path::Path {
        &self.cgroup.path
    }

    /// Waits for the process to end; its status and the cgroup's counters (peak, limit events,
    /// OOM kills).
    pub fn wait(self) -> Result<CappedEnd> {
        let (status, _, _) = wait_child(self.pid)?;
        Ok(CappedEnd { status, counters: self.cgroup.counters() })
    }
}

/// The memory of a device server's own cgroup (`device serve --memory-max`), read by the run
/// that used the device: the kernel's limit and high-water mark bound the device hard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DeviceAudit {
    pub cgroup: String,
    pub limit: Option<u64>,
    pub peak: Option<u64>,
    pub limit_events: u64,
    pub oom_kills: u64,
}

/// Reads the cgroup directory `dir` of a device server (v1 or v2, told by its files).
pub fn audit_device(dir: &std::path::Path) -> Result<DeviceAudit> {
    let v = if dir.join("memory.current").is_file() {
        cgroup::Version::V2
    } else if dir.join("memory.usage_in_bytes").is_file() {
        cgroup::Version::V1
    } else {
        bail!("{}: not a memory cgroup (no memory.current or memory.usage_in_bytes)", dir.display());
    };
    let f = cgroup::Files::of(v);
    let limit = std::fs::read_to_string(dir.join(f.limit)).ok().and_then(|t| cgroup::parse_limit(&t).ok().flatten());
    let c = cgroup::read_counters(dir, v);
    Ok(DeviceAudit { cgroup: dir.display().to_string(), limit, peak: c.peak, limit_events: c.limit_events, oom_kills: c.oom_kills })
}

/// Removes run cgroups left by harnesses that were killed and whose reaper did not remove them;
/// [`run_contained`] does this at start.
pub fn cleanup_stale() -> Result<Vec<Stale>> {
    let h = cgroup::prepare()?;
    Ok(cgroup::cleanup_stale(&h))
}

/// Runs `cmd` as its own process tree in a new memory cgroup below ours, limited to
/// `spec.memory_max` with swap off, and returns what bounded each tier.
///
/// Errors (one line each, saying what to do) when no run cgroup can be made: no memory
/// controller, no permission, or a v2 subtree without delegation. The child's stdio should be
/// inherited, null or files: pipes are closed by the harness once the child has started.
/// The cgroup is removed afterwards, also when the child crashes or leaves processes behind,
/// and by its reaper when this process is killed before it could ([`cgroup::RunCgroup`]).
pub fn run_contained(mut cmd: Command, spec: &ContainSpec) -> Result<ContainedRun> {
    if spec.sample_interval.is_zero() {
        bail!("sample interval must be positive");
    }
    let h = cgroup::prepare()?;
    let stale_removed = cgroup::cleanup_stale(&h);
    let mut cg = cgroup::RunCgroup::create(&h)?;
    let setting = cg.set_limit(spec.memory_max)?;
    let procs_file = cg.open_procs()?;
    let fd = procs_file.as_raw_fd();
    // SAFETY: the hook only calls getpid and write (async-signal-safe); the fd stays open in
    // the parent until spawn returns and is close-on-exec, so the command never inherits it and
    // borrowing it in the child before exec is sound.
    unsafe {
        cmd.pre_exec(move || cgroup::join_fd(BorrowedFd::borrow_raw(fd)));
    }
    die_with_parent(&mut cmd);
    let host_sampler = HostSampler::start(cg.path.clone(), cg.version, spec.sample_interval)?;
    let gpu_sampler = GpuSampler::start(spec.sample_interval, Membership { version: cg.version, rel: cg.rel.clone() });
    let t0 = Instant::now();
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            host_sampler.stop();
            gpu_sampler.stop();
            return Err(anyhow!("cannot start {:?} in cgroup {}: {e}", cmd.get_program(), cg.path.display()));
        }
    };
    drop(procs_file);
    let pid = child.id();
    drop(child);
    let (status, child_io, ru) = wait_child(pid)?;
    let wall_s = t0.elapsed().as_secs_f64();

    // Stragglers: count their I/O, then kill them.
    let mut io = child_io.unwrap_or_default();
    for p in cg.pids() {
        if let Some(i) = procs::read_io(p) {
            io.add(&i);
        }
    }
    let stragglers_killed = cg.kill_all();
    let hs = host_sampler.stop();
    let gpu = gpu_sampler.stop();
    let end: Counters = cg.counters();
    let stat_end = cg.stat();
    let cleanup = cg.remove();

    let swap_total = procs::swap_total();
    let swap = if end.swap.is_some() || hs.swap_peak.is_some() {
        let peak = [hs.swap_peak, end.swap, end.swap_peak].into_iter().flatten().max();
        SwapReport { accounted: true, peak, end: end.swap, events: end.swap_events, note: setting.swap_control.clone() }
    } else if swap_total == Some(0) {
        SwapReport {
            accounted: false,
            peak: Some(0),
            end: Some(0),
            events: None,
            note: "swap not accounted; no swap configured (SwapTotal 0)".into(),
        }
    } else {
        SwapReport {
            accounted: false,
            peak: None,
            end: None,
            events: None,
            note: "swap not accounted by this kernel and swap is configured".into(),
        }
    };
    let host = HostReport {
        hierarchy: Some(cg.version),
        cgroup: cg.name.clone(),
        cgroup_path: cg.path.clone(),
        requested_limit: spec.memory_max,
        limit: setting.limit,
        swap_control: setting.swap_control,
        kernel_peak: end.peak,
        sampled_peak: hs.sampled_peak.max(end.usage),
        end_usage: end.usage,
        limit_events: end.limit_events,
        limit_event_files: end.limit_event_files,
        oom_events: end.oom_events,
        under_oom_seen: hs.under_oom_seen || end.under_oom,
        oom_kills: end.oom_kills,
        swap,
        stat_at_peak: hs.stat_at_peak,
        stat_end,
        mem_total: procs::mem_total(),
        samples: hs.samples,
        stragglers_killed,
        stale_removed,
        removed: cleanup.is_ok(),
        cleanup_error: cleanup.err().map(|e| e.to_string()),
    };
    let maxrss_wait4 = (ru.ru_maxrss.max(0) as u64) * 1024;
    let procs = ProcCounters {
        read_bytes: io.read_bytes,
        rchar: io.rchar,
        write_bytes: io.write_bytes,
        wchar: io.wchar,
        rss_hwm: hs.tree.hwm(),
        maxrss_wait4,
        processes_seen: hs.tree.per_pid.len() + usize::from(!hs.tree.per_pid.contains_key(&pid)),
        final_read: child_io.is_some(),
    };
    let authority = authority::authority(&host, &gpu, spec.gpu_declared);
    let device = spec.device_cgroup.as_deref().map(audit_device).transpose()?;
    let mut admission = authority::admission_with_budget(&host, &gpu, &authority, spec.gpu_declared, spec.gpu_budget, device.as_ref());
    let exit = match status.success() {
        true => format!("the worker {status}"),
        false => worker_failure(&status, Some(&LimitSeen::of(&host)), None),
    };
    admission.require_run("worker exited 0", status.success(), exit);
    Ok(ContainedRun { status, wall_s, host, gpu, procs, authority, admission })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_worker_is_said_in_words_and_the_limit_told_from_an_outside_signal() {
        let gdb = "loading\n[Inferior 1 (process 4242) detached]\n";
        let kill = RunStatus::Signaled { signal: 9, name: "SIGKILL".into(), core_dumped: false };
        assert_eq!(worker_failure(&kill, None, Some(gdb)), "the worker was killed by signal 9 (SIGKILL)");
        assert_eq!(worker_failure(&RunStatus::Exited { code: 3 }, None, Some(gdb)), "the worker exited with code 3 and no error line");
        assert_eq!(worker_failure(&RunStatus::Exited { code: 3 }, None, None), "the worker exited with code 3");
        let own = "error: --model m: not a GGUF file\n[Inferior 1 detached]";
        assert_eq!(
            worker_failure(&RunStatus::Exited { code: 2 }, None, Some(own)),
            "the worker exited with code 2: --model m: not a GGUF file"
        );
        // Under a limit: an OOM kill is the limit's; a SIGKILL without one came from outside.
        let oom = LimitSeen { limit: Some(4 << 20), limit_events: 40, oom_kills: 1, oom: true };
        assert_eq!(
            worker_failure(&kill, Some(&oom), None),
            "the cgroup's 4 MiB limit killed the worker: the kernel's OOM killer sent it signal 9 (SIGKILL)"
        );
        let quiet = LimitSeen { limit: Some(4 << 20), ..LimitSeen::default() };
        assert_eq!(worker_failure(&kill, Some(&quiet), None), "the worker was killed by signal 9 (SIGKILL)");
        let hit = LimitSeen { limit_events: 7, ..quiet };
        assert_eq!(
            worker_failure(&RunStatus::Exited { code: 1 }, Some(&hit), Some(own)),
            "the worker exited with code 1: --model m: not a GGUF file; its cgroup's 4 MiB limit was reached 7 times"
        );
        let abort = RunStatus::Signaled { signal: 6, name: "SIGABRT".into(), core_dumped: true };
        assert_eq!(abort.to_string(), "was killed by signal 6 (SIGABRT), core dumped");
        // An engine's abort is quoted in its own words, wherever the worker ran.
        let log = "/root/w/src/ggml/src/ggml-cpu/ops.cpp:5363: GGML_ASSERT(i01 >= 0 && i01 < ne01) failed\n[New LWP 7]\n#0 wait4\n";
        assert_eq!(
            worker_failure(&abort, Some(&quiet), Some(log)),
            "llama.cpp aborted: ops.cpp:5363: GGML_ASSERT(i01 >= 0 && i01 < ne01) failed (the worker was killed by signal 6 (SIGABRT), core dumped)"
        );
        assert_eq!(worker_failure(&abort, None, Some(gdb)), "the worker was killed by signal 6 (SIGABRT), core dumped");
        assert_eq!(worker_failure(&kill, None, Some(log)), "the worker was killed by signal 9 (SIGKILL)");
        for text in [worker_failure(&kill, Some(&oom), Some(gdb)), worker_failure(&abort, None, Some(own))] {
            assert!(!text.contains('{'), "{text}");
        }
    }

    #[test]
    fn an_engine_abort_is_quoted_without_this_machines_paths() {
        let log = "llama_model_load: loading\n/root/x/src/llama-model.cpp:1368: GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed\nlibggml-base.so(+0x1234)\n";
        assert_eq!(engine_abort(log).unwrap(), "llama-model.cpp:1368: GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed");
        let log = "terminate called after throwing an instance of 'std::out_of_range'\n  what():  map::at\n";
        assert_eq!(engine_abort(log).unwrap(), "what():  map::at");
        assert_eq!(engine_abort("nothing from the engine\n"), None);
        // A backtrace printed by gdb after the assertion is not the engine's message.
        let log = "ops.cpp:6355: GGML_ASSERT(n_dims % 2 == 0) failed\n360\t../csu/libc-start.c: No such file or directory.\n";
        assert_eq!(engine_abort(log).unwrap(), "ops.cpp:6355: GGML_ASSERT(n_dims % 2 == 0) failed");
        assert_eq!(engine_abort("360\t../csu/libc-start.c: No such file or directory.\n"), None);
    }

    #[test]
    fn a_backend_error_keeps_the_runtimes_message_and_the_failing_call() {
        let log = "llama_context: graph splits = 9\nCUDA error: an illegal memory access was encountered\n  current device: 0, in function ggml_backend_cuda_synchronize at /tmp/w/src/ggml/src/ggml-cuda/ggml-cuda.cu:2901\n  cudaStreamSynchronize(cuda_ctx->stream())\n/tmp/w/src/ggml/src/ggml-cuda/ggml-cuda.cu:109: CUDA error\n";
        assert_eq!(
            engine_abort(log).unwrap(),
            "ggml-cuda.cu:109: CUDA error: an illegal memory access was encountered (in ggml_backend_cuda_synchronize at ggml-cuda.cu:2901)"
        );
        // Without the backend's lines the abort is quoted as it stands.
        assert_eq!(engine_abort("x\n/a/ggml-cuda.cu:109: CUDA error\n").unwrap(), "ggml-cuda.cu:109: CUDA error");
    }
}
