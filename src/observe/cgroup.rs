//! Memory cgroups, written through cgroupfs directly (v1 `memory` controller and v2 unified).
//!
//! Why not `cgroups-rs`: it pulls zbus (minutes of build on two cores) and on v2 reports
//! `fail_cnt` as 0 without reading `memory.events`; limit events are the one number the
//! admission predicate cannot get wrong. The files are few and flat.
//!
//! One code path serves both hierarchies: [`Files`] names the file for each quantity and the
//! parsers take the text of either version. A run cgroup is created below the harness's own
//! cgroup as `sovereign-<pid>-<n>`. Each has a reaper, a process of its own session that removes
//! it once the harness lets go of it or dies, also when the harness's whole process group is
//! SIGKILLed; what a reaper could not remove (it was killed too) the next harness removes at
//! start ([`cleanup_stale`]).

use procfs::process::{MountInfo, MountInfos};
use procfs::ProcessCGroups;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The hierarchy that carries the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

/// Why no run cgroup can be made here; `message` is one line saying what to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SetupErrorKind {
    /// Neither a v1 `memory` hierarchy nor cgroup2 is mounted for this process.
    NoMemoryController,
    /// The cgroup files exist but we may not write them.
    NoPermission,
    /// cgroup v2 without the memory controller delegated to our subtree.
    NotDelegated,
    /// Anything else the kernel refused.
    Io,
}

#[derive(Clone, Debug)]
pub struct SetupError {
    pub kind: SetupErrorKind,
    pub message: String,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SetupError {}

fn setup(kind: SetupErrorKind, message: String) -> SetupError {
    SetupError { kind, message }
}

/// Maps a refused cgroupfs operation to a one-line actionable error.
fn refused(what: &str, path: &Path, e: &io::Error) -> SetupError {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => setup(
            SetupErrorKind::NoPermission,
            format!(
                "cannot {what} {}: {e}; run as root, or start sovereign in a delegated cgroup v2 subtree \
                 (e.g. `systemd-run --user --scope -p Delegate=yes sovereign ...`)",
                path.display()
            ),
        ),
        _ => setup(SetupErrorKind::Io, format!("cannot {what} {}: {e}", path.display())),
    }
}

// ---------------------------------------------------------------------------------------------
// Locating the hierarchy: /proc/self/mountinfo and /proc/self/cgroup, parsed by procfs.

/// Undoes the octal escapes (`\040` for a space) of mountinfo paths, which procfs leaves as
/// the kernel wrote them.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The path of the memory cgroup in one process's cgroups (`/proc/<pid>/cgroup`), for the
/// given hierarchy.
pub fn membership_path(groups: &ProcessCGroups, version: Version) -> Option<String> {
    groups.0.iter().find_map(|g| {
        let hit = match version {
            Version::V1 => g.controllers.iter().any(|c| c == "memory"),
            Version::V2 => g.hierarchy == 0 && g.controllers.is_empty(),
        };
        hit.then(|| g.pathname.clone())
    })
}

/// The memory cgroup of process `pid`, for the given hierarchy: `Ok(None)` when it names none.
pub fn membership_of(pid: u32, version: Version) -> procfs::ProcResult<Option<String>> {
    let groups = procfs::process::Process::new(pid as i32)?.cgroups()?;
    Ok(membership_path(&groups, version))
}

/// Where the memory controller is mounted and where this process sits in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Located {
    pub version: Version,
    pub mountpoint: PathBuf,
    /// The hierarchy path mounted at `mountpoint` (not `/` for a bind-mounted subtree).
    pub mount_root: String,
    /// Our cgroup as `/proc/self/cgroup` names it.
    pub own: String,
}

impl Located {
    /// Filesystem path of a cgroup named as in `/proc/<pid>/cgroup`.
    pub fn fs_path(&self, rel: &str) -> PathBuf {
        let inner = if self.mount_root != "/" && (rel == self.mount_root || rel.starts_with(&format!("{}/", self.mount_root))) {
            &rel[self.mount_root.len()..]
        } else {
            rel
        };
        match inner.trim_start_matches('/') {
            "" => self.mountpoint.clone(),
            inner => self.mountpoint.join(inner),
        }
    }
}

/// Finds the memory controller from mountinfo and `/proc/self/cgroup`. A v1 `memory`
/// hierarchy wins where both exist (hybrid hosts: the controller can be bound to only one
/// hierarchy, and cgroup2 then lacks it).
pub fn locate_from(mounts: &MountInfos, self_cgroup: &ProcessCGroups) -> Result<Located, SetupError> {
    let found = |version: Version, mount: &dyn Fn(&MountInfo) -> bool| {
        let own = membership_path(self_cgroup, version)?;
        let m = mounts.iter().find(|m| mount(m))?;
        Some(Located { version, mountpoint: unescape(&m.mount_point.to_string_lossy()).into(), mount_root: unescape(&m.root), own })
    };
    let v1 = |m: &MountInfo| m.fs_type == "cgroup" && m.super_options.contains_key("memory");
    let v2 = |m: &MountInfo| m.fs_type == "cgroup2";
    found(Version::V1, &v1).or_else(|| found(Version::V2, &v2)).ok_or_else(|| {
        setup(
            SetupErrorKind::NoMemoryController,
            "no memory cgroup controller for this process (neither a cgroup v1 `memory` hierarchy nor cgroup2 is mounted); \
             mount cgroup2 at /sys/fs/cgroup with the memory controller enabled, or run on a host that has one"
                .to_string(),
        )
    })
}

/// [`locate_from`] on this process.
pub fn locate() -> Result<Located, SetupError> {
    let unreadable = |p: &str, e: procfs::ProcError| setup(SetupErrorKind::NoMemoryController, format!("cannot read {p}: {e}"));
    let me = procfs::process::Process::myself().map_err(|e| unreadable("/proc/self", e))?;
    let mounts = me.mountinfo().map_err(|e| unreadable("/proc/self/mountinfo", e))?;
    locate_from(&mounts, &me.cgroups().map_err(|e| unreadable("/proc/self/cgroup", e))?)
}

// ---------------------------------------------------------------------------------------------
// Preparing the base: the cgroup below which run cgroups are made.

/// The name of the leaf the harness moves into on v2 (no internal processes).
pub const HARNESS_LEAF: &str = "harness";
/// Prefix of every run cgroup.
pub const PREFIX: &str = "sovereign-";

/// A hierarchy ready for run cgroups.
#[derive(Clone, Debug, Serialize)]
pub struct Hierarchy {
    pub located: Located,
    /// Filesystem path of the cgroup that run cgroups are made in.
    pub base: PathBuf,
    /// The same, as `/proc/<pid>/cgroup` names it.
    pub base_rel: String,
    /// v2: the leaf the harness sits in (`base/harness`) when it had to move there.
    pub leaf_rel: Option<String>,
}

impl Hierarchy {
    pub fn version(&self) -> Version {
        self.located.version
    }
}

fn words(path: &Path) -> Vec<String> {
    fs::read_to_string(path).map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

fn parent_rel(rel: &str) -> String {
    match rel.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/".to_string(),
        Some((p, _)) => p.to_string(),
    }
}

fn child_rel(rel: &str, name: &str) -> String {
    format!("{}/{}", rel.trim_end_matches('/'), name)
}

/// Locates the memory controller and, on v2, makes sure run cgroups can get it: `memory` in
/// the base's `cgroup.subtree_control`, which requires the base to hold no process, so the
/// harness (and anything else in its cgroup) moves into a `harness` leaf first.
pub fn prepare() -> Result<Hierarchy, SetupError> {
    prepare_at(locate()?)
}

/// [`prepare`] for an explicitly located hierarchy.
pub fn prepare_at(located: Located) -> Result<Hierarchy, SetupError> {
    let own = located.fs_path(&located.own);
    if !own.is_dir() {
        return Err(setup(
            SetupErrorKind::NoMemoryController,
            format!(
                "our memory cgroup {} is not visible under {}; mount the cgroup filesystem of this namespace",
                located.own,
                located.mountpoint.display()
            ),
        ));
    }
    match located.version {
        Version::V1 => Ok(Hierarchy { base: own, base_rel: located.own.clone(), leaf_rel: None, located }),
        Version::V2 => prepare_v2(located),
    }
}

fn prepare_v2(located: Located) -> Result<Hierarchy, SetupError> {
    let own_rel = located.own.clone();
    let own = located.fs_path(&own_rel);
    let has_memory = |p: &Path| words(p).iter().any(|w| w == "memory");
    // Already moved into our leaf by an earlier run of this process.
    let in_leaf =
        own.file_name().is_some_and(|n| n == HARNESS_LEAF) && own.parent().is_some_and(|p| has_memory(&p.join("cgroup.subtree_control")));
    let (base_rel, base) = if in_leaf {
        let r = parent_rel(&own_rel);
        (r.clone(), located.fs_path(&r))
    } else {
        (own_rel.clone(), own.clone())
    };
    if !has_memory(&located.mountpoint.join("cgroup.controllers")) {
        return Err(setup(
            SetupErrorKind::NoMemoryController,
            format!(
                "cgroup2 at {} offers no memory controller (bound to cgroup v1, disabled, or not delegated to this container); \
                 boot with `systemd.unified_cgroup_hierarchy=1` or `cgroup_no_v1=memory`, or have the container runtime delegate memory",
                located.mountpoint.display()
            ),
        ));
    }
    if !has_memory(&base.join("cgroup.controllers")) {
        let parent = base.parent().map(|p| p.display().to_string()).unwrap_or_default();
        return Err(setup(
            SetupErrorKind::NotDelegated,
            format!(
                "cgroup v2: the memory controller is not delegated to {} (missing from {parent}/cgroup.subtree_control); \
                 run `echo +memory > {parent}/cgroup.subtree_control` as root, or start sovereign with \
                 `systemd-run --user --scope -p Delegate=yes sovereign ...`",
                base.display()
            ),
        ));
    }
    let mut leaf_rel = in_leaf.then(|| own_rel.clone());
    let subtree = base.join("cgroup.subtree_control");
    if !has_memory(&subtree) {
        // The root cgroup is exempt from the no-internal-process rule; every other base must be
        // emptied into a leaf before it may distribute the controller.
        if base_rel != "/" {
            let leaf = base.join(HARNESS_LEAF);
            if let Err(e) = fs::create_dir(&leaf) {
                if e.kind() != io::ErrorKind::AlreadyExists {
                    return Err(refused("create the harness leaf", &leaf, &e));
                }
            }
            for pid in read_pids(&base) {
                if let Err(e) = fs::write(leaf.join("cgroup.procs"), pid.to_string()) {
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        return Err(refused("move the harness into", &leaf, &e));
                    }
                }
            }
            leaf_rel = Some(child_rel(&base_rel, HARNESS_LEAF));
        }
        if let Err(e) = fs::write(&subtree, "+memory") {
            return Err(match e.raw_os_error() {
                Some(libc::EBUSY) => setup(
                    SetupErrorKind::NotDelegated,
                    format!("cannot enable memory in {}: {e} (processes the harness cannot move remain in {}); start sovereign in an empty delegated cgroup", subtree.display(), base.display()),
                ),
                _ => refused("enable memory in", &subtree, &e),
            });
        }
    }
    Ok(Hierarchy { base, base_rel, leaf_rel, located })
}

// ---------------------------------------------------------------------------------------------
// File names and parsers, shared by both versions.

/// Which file holds each quantity.
#[derive(Clone, Copy, Debug)]
pub struct Files {
    pub limit: &'static str,
    pub usage: &'static str,
    /// Kernel high-water mark, where the kernel keeps one.
    pub peak: &'static str,
}

impl Files {
    pub fn of(v: Version) -> Files {
        match v {
            Version::V1 => Files { limit: "memory.limit_in_bytes", usage: "memory.usage_in_bytes", peak: "memory.max_usage_in_bytes" },
            Version::V2 => Files { limit: "memory.max", usage: "memory.current", peak: "memory.peak" },
        }
    }
}

/// `key value` lines (memory.stat, memory.events, memory.oom_control, memory.swap.events).
pub fn parse_keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (k, v) = (it.next()?, it.next()?);
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// A limit file that holds neither a number nor `max`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {source}")]
pub struct BadLimit {
    pub text: String,
    pub source: std::num::ParseIntError,
}

/// A single number, or `max` (v2 for "no limit") as `None`.
pub fn parse_limit(text: &str) -> Result<Option<u64>, BadLimit> {
    match text.trim() {
        "max" => Ok(None),
        t => t.parse().map(Some).map_err(|source| BadLimit { text: t.to_string(), source }),
    }
}

/// A single number (`memory.current`, `memory.peak`, v1 counters).
pub fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The anon/file split of `memory.stat`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StatSplit {
    /// Usage when the stat was read.
    pub usage: u64,
    pub anon: u64,
    pub file: u64,
    pub shmem: Option<u64>,
    /// Kernel memory (v2 `kernel`, v1 `memory.kmem.usage_in_bytes`).
    pub kernel: Option<u64>,
}

/// The split from `memory.stat` text: v2 `anon`/`file`, v1 `total_rss`/`total_cache` (the
/// hierarchical sums; a run cgroup has no children, so they equal `rss`/`cache`).
pub fn parse_stat(text: &str, v: Version) -> StatSplit {
    let m = parse_keyed(text);
    let get = |keys: &[&str]| keys.iter().find_map(|k| m.get(*k).copied());
    match v {
        Version::V2 => StatSplit {
            usage: 0,
            anon: get(&["anon"]).unwrap_or(0),
            file: get(&["file"]).unwrap_or(0),
            shmem: get(&["shmem"]),
            kernel: get(&["kernel"]),
        },
        Version::V1 => StatSplit {
            usage: 0,
            anon: get(&["total_rss", "rss"]).unwrap_or(0),
            file: get(&["total_cache", "cache"]).unwrap_or(0),
            shmem: get(&["total_shmem", "shmem"]),
            kernel: None,
        },
    }
}

/// Counters read from a cgroup directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub usage: u64,
    /// Kernel high-water mark (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`), if kept.
    pub peak: Option<u64>,
    /// Times a charge hit the limit: v1 `memory.failcnt` + `memory.memsw.failcnt` (a failed
    /// charge is counted on the one counter that refused it), v2 `memory.events` `max`.
    pub limit_events: u64,
    /// Each contributing file, for the record.
    pub limit_event_files: BTreeMap<String, u64>,
    /// v2 `memory.events` `oom`; v1 exposes no count (only `under_oom`).
    pub oom_events: Option<u64>,
    pub under_oom: bool,
    pub oom_kills: u64,
    /// Bytes in swap now (v1 memory.stat `total_swap`, v2 `memory.swap.current`); None if not
    /// accounted.
    pub swap: Option<u64>,
    /// v2 `memory.swap.peak`.
    pub swap_peak: Option<u64>,
    /// v2 `memory.swap.events` `max` + `fail`.
    pub swap_events: Option<u64>,
}

fn read_opt(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file)).ok()
}

fn read_num(dir: &Path, file: &str) -> Option<u64> {
    read_opt(dir, file).as_deref().and_then(parse_u64)
}

/// Reads every counter of a cgroup directory. Files the kernel does not have stay `None`.
pub fn read_counters(dir: &Path, v: Version) -> Counters {
    let f = Files::of(v);
    let mut c = Counters { usage: read_num(dir, f.usage).unwrap_or(0), peak: read_num(dir, f.peak), ..Counters::default() };
    match v {
        Version::V1 => {
            for file in ["memory.failcnt", "memory.memsw.failcnt"] {
                if let Some(n) = read_num(dir, file) {
                    c.limit_events += n;
                    c.limit_event_files.insert(file.to_string(), n);
                }
            }
            let oom = read_opt(dir, "memory.oom_control").map(|t| parse_keyed(&t)).unwrap_or_default();
            c.under_oom = oom.get("under_oom").copied().unwrap_or(0) != 0;
            c.oom_kills = oom.get("oom_kill").copied().unwrap_or(0);
            // Not memsw usage − usage: the two counters are read apart and charged in 64-page
            // batches, which showed 256 KiB of "swap" on a host without swap.
            let stat = read_opt(dir, "memory.stat").map(|t| parse_keyed(&t)).unwrap_or_default();
            c.swap = stat.get("total_swap").or(stat.get("swap")).copied();
        }
        Version::V2 => {
            let ev = read_opt(dir, "memory.events").map(|t| parse_keyed(&t)).unwrap_or_default();
            c.limit_events = ev.get("max").copied().unwrap_or(0);
            c.limit_event_files.insert("memory.events:max".to_string(), c.limit_events);
            c.oom_events = Some(ev.get("oom").copied().unwrap_or(0));
            c.oom_kills = ev.get("oom_kill").copied().unwrap_or(0);
            c.swap = read_num(dir, "memory.swap.current");
            c.swap_peak = read_num(dir, "memory.swap.peak");
            c.swap_events = read_opt(dir, "memory.swap.events").map(|t| {
                let m = parse_keyed(&t);
                m.get("max").copied().unwrap_or(0) + m.get("fail").copied().unwrap_or(0)
            });
        }
    }
    c
}

/// The anon/file split of a cgroup directory now.
pub fn read_stat(dir: &Path, v: Version) -> Option<StatSplit> {
    let mut s = parse_stat(&read_opt(dir, "memory.stat")?, v);
    s.usage = read_num(dir, Files::of(v).usage).unwrap_or(0);
    if v == Version::V1 {
        s.kernel = read_num(dir, "memory.kmem.usage_in_bytes");
    }
    Some(s)
}

/// Pids in a cgroup (`cgroup.procs`; zombies are not listed).
pub fn read_pids(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs")).map(|s| s.split_whitespace().filter_map(|w| w.parse().ok()).collect()).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Run cgroups.

static NEXT: AtomicU64 = AtomicU64::new(0);

/// v1: memsw limit above the memory limit (2 MiB, one PMD folio); see [`RunCgroup::set_limit`].
pub const V1_SWAP_HEADROOM: u64 = 2 << 20;

/// How swap was kept out of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LimitSetting {
    /// The limit as the kernel reads it back (page-rounded), or None for no limit.
    pub limit: Option<u64>,
    pub swap_control: String,
}

/// A cgroup of one run. Dropping it kills what is left inside and removes it.
#[derive(Debug)]
pub struct RunCgroup {
    pub version: Version,
    pub name: String,
    pub path: PathBuf,
    /// As `/proc/<pid>/cgroup` names it.
    pub rel: String,
    /// Where stragglers that cannot be killed are moved (v1 base, v2 harness leaf).
    evacuate: Option<PathBuf>,
    removed: bool,
    /// Removes the cgroup if this process dies before it does (dropped after `remove`).
    _reaper: Option<Reaper>,
}

impl RunCgroup {
    /// Makes `sovereign-<pid>-<n>` below the base.
    pub fn create(h: &Hierarchy) -> Result<RunCgroup, SetupError> {
        let name = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = h.base.join(&name);
        fs::create_dir(&path).map_err(|e| refused("create cgroup", &path, &e))?;
        let reaper = Reaper::start(&path)
            .map_err(|e| log::warn!("{}: no reaper ({e}); if this process is killed, the next run removes the cgroup", path.display()))
            .ok();
        let evacuate = match h.version() {
            Version::V1 => Some(h.base.clone()),
            Version::V2 => h.leaf_rel.as_ref().map(|r| h.located.fs_path(r)),
        };
        Ok(RunCgroup { version: h.version(), rel: child_rel(&h.base_rel, &name), name, path, evacuate, removed: false, _reaper: reaper })
    }

    /// Sets the hard limit with swap off (v2 `memory.swap.max = 0`; v1 `memory.swappiness = 0`
    /// and memsw = limit + [`V1_SWAP_HEADROOM`]), or no limit (accounting only).
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<LimitSetting, SetupError> {
        let f = Files::of(self.version);
        let write = |file: &str, value: &str| {
            let p = self.path.join(file);
            fs::write(&p, value).map_err(|e| refused(&format!("write {value} to"), &p, &e))
        };
        let swap_control = match (self.version, bytes) {
            (Version::V1, Some(b)) => {
                write(f.limit, &b.to_string())?;
                let swappiness = write("memory.swappiness", "0").is_ok();
                if self.path.join("memory.memsw.limit_in_bytes").exists() {
                    // memsw = limit exactly would make the kernel fail charges on the memsw
                    // counter first, and kernels as recent as 6.18 do not advance its failcnt:
                    // limit events would read 0 at the ceiling. With this headroom (one PMD
                    // folio, the largest single charge) the memory counter fails first and
                    // `memory.failcnt` counts; swap stays bounded by it and is recorded.
                    let limit = read_opt(&self.path, f.limit).as_deref().and_then(parse_u64).unwrap_or(b);
                    write("memory.memsw.limit_in_bytes", &(limit + V1_SWAP_HEADROOM).to_string())?;
                    format!(
                        "memory.memsw.limit_in_bytes = limit + {V1_SWAP_HEADROOM}{}: at most {V1_SWAP_HEADROOM} bytes of swap, recorded",
                        if swappiness { ", memory.swappiness = 0 (limit reclaim never swaps)" } else { "" }
                    )
                } else {
                    "memory.memsw.* absent (kernel without swap accounting): swap not limited".to_string()
                }
            }
            (Version::V1, None) => match write("memory.swappiness", "0") {
                Ok(()) => "no limit: memory.swappiness = 0 (v1 cannot cap swap without a memory limit)".to_string(),
                Err(e) => format!("no limit; swap not limited ({e})"),
            },
            (Version::V2, b) => {
                if let Some(b) = b {
                    write(f.limit, &b.to_string())?;
                }
                if self.path.join("memory.swap.max").exists() {
                    write("memory.swap.max", "0")?;
                    "memory.swap.max = 0".to_string()
                } else {
                    "memory.swap.max absent (kernel without swap accounting): swap not limited".to_string()
                }
            }
        };
        let limit = match bytes {
            None => None,
            Some(_) => {
                let text = read_opt(&self.path, f.limit).unwrap_or_default();
                parse_limit(&text).map_err(|e| setup(SetupErrorKind::Io, format!("{}: {e}", self.path.join(f.limit).display())))?
            }
        };
        Ok(LimitSetting { limit, swap_control })
    }

    /// `cgroup.procs` opened for writing, for a child to join itself before exec.
    pub fn open_procs(&self) -> Result<File, SetupError> {
        let p = self.path.join("cgroup.procs");
        OpenOptions::new().write(true).open(&p).map_err(|e| refused("open", &p, &e))
    }

    pub fn pids(&self) -> Vec<u32> {
        read_pids(&self.path)
    }

    pub fn counters(&self) -> Counters {
        read_counters(&self.path, self.version)
    }

    pub fn stat(&self) -> Option<StatSplit> {
        read_stat(&self.path, self.version)
    }

    /// SIGKILLs everything inside until it is empty; returns how many processes were killed.
    pub fn kill_all(&self) -> u32 {
        kill_all(&self.path, self.evacuate.as_deref())
    }

    /// Kills stragglers and removes the directory (retrying while the kernel reports busy).
    pub fn remove(&mut self) -> Result<(), RemoveError> {
        if self.removed {
            return Ok(());
        }
        self.kill_all();
        remove_dir(&self.path)?;
        self.removed = true;
        Ok(())
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// SIGKILLs every process of a cgroup (v2 `cgroup.kill` where present) until `cgroup.procs` is
/// empty; after two seconds the survivors are moved to `evacuate`. Returns the number killed.
fn kill_all(dir: &Path, evacuate: Option<&Path>) -> u32 {
    let mut killed = std::collections::BTreeSet::new();
    let start = Instant::now();
    loop {
        let pids = read_pids(dir);
        if pids.is_empty() {
            break;
        }
        if start.elapsed() > Duration::from_secs(2) {
            if let Some(to) = evacuate {
                for pid in &pids {
                    let _ = fs::write(to.join("cgroup.procs"), pid.to_string());
                }
            }
            break;
        }
        if !dir.join("cgroup.kill").exists() || fs::write(dir.join("cgroup.kill"), "1").is_err() {
            for &pid in &pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as libc::pid_t), nix::sys::signal::Signal::SIGKILL);
            }
        }
        killed.extend(pids);
        std::thread::sleep(Duration::from_millis(10));
    }
    killed.len() as u32
}

/// A cgroup directory the kernel would not let go (still busy after five seconds, or refused).
#[derive(Debug, thiserror::Error)]
#[error("cannot remove {}: {source}", dir.display())]
pub struct RemoveError {
    pub dir: PathBuf,
    pub source: io::Error,
}

fn remove_dir(dir: &Path) -> Result<(), RemoveError> {
    let start = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(source) => return Err(RemoveError { dir: dir.to_path_buf(), source }),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The reaper: a run cgroup is removed also when its creator is killed outright.

/// How long the reaper keeps trying to empty and remove a run cgroup once its creator is gone.
const REAPER_PATIENCE: Duration = Duration::from_secs(5);

/// A process of its own, forked when a run cgroup is made, that removes the cgroup once its
/// creator has let go of it, however the creator ended: it waits for end of file on a pipe
/// whose only writer is the creator (close-on-exec, so no worker holds it), then kills whatever
/// is left inside and removes the directory. It runs in a session and process group of its own,
/// so a signal to the creator's group (`kill -9 -PGID`, a terminal's hangup or ^C) does not
/// reach it. When the creator removes the cgroup itself, dropping the reaper closes the pipe;
/// the reaper finds nothing to remove, exits, and is reaped here.
#[derive(Debug)]
struct Reaper {
    pid: libc::pid_t,
    pipe: Option<std::os::fd::OwnedFd>,
}

/// The paths the reaper needs, made before it is forked (it may not allocate).
struct ReaperPaths {
    dir: std::ffi::CString,
    kill: std::ffi::CString,
    procs: std::ffi::CString,
}

impl Reaper {
    fn start(dir: &Path) -> io::Result<Reaper> {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
        let paths = ReaperPaths { dir: c(dir)?, kill: c(&dir.join("cgroup.kill"))?, procs: c(&dir.join("cgroup.procs"))? };
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made by pipe2 and are owned by nothing else.
        let (read, write) = unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child runs only `reap`, which makes async-signal-safe calls on its stack
        // and on the paths made above (no allocation, no lock another thread may hold) and
        // never returns.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => reap(std::os::fd::AsRawFd::as_raw_fd(&read), &paths),
            pid => Ok(Reaper { pid, pipe: Some(write) }),
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        drop(self.pipe.take());
        let mut status = 0;
        // SAFETY: waitpid on our own child, writing only into the local it is given.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {}
    }
}

/// The reaper's whole life after fork; only async-signal-safe calls, on its own stack.
fn reap(read: std::os::fd::RawFd, p: &ReaperPaths) -> ! {
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: each call is a plain syscall on descriptors and paths this process owns.
    unsafe {
        libc::setsid();
        // Nothing of the creator's is held: not its stdio (a reader waits for their end of
        // file), not its locks, not other reapers' pipes.
        let read_fd = i64::from(read);
        for (lo, hi) in [(0, read_fd - 1), (read_fd + 1, i64::from(libc::c_uint::MAX))] {
            if lo <= hi && libc::syscall(libc::SYS_close_range, lo as libc::c_uint, hi as libc::c_uint, 0) != 0 {
                // Kernels before 5.9: the descriptors a harness can hold.
                for fd in lo..=hi.min(4095) {
                    libc::close(fd as libc::c_int);
                }
            }
        }
        // Until the creator's end closes: it let go of the cgroup, or it died.
        let mut b = [0u8; 1];
        loop {
            let r = libc::read(read, b.as_mut_ptr().cast(), 1);
            if r == 0 || (r < 0 && errno() != libc::EINTR) {
                break;
            }
        }
        let start = Instant::now();
        while libc::rmdir(p.dir.as_ptr()) != 0 && errno() == libc::EBUSY && start.elapsed() < REAPER_PATIENCE {
            kill_inside(p);
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        libc::_exit(0)
    }
}

/// SIGKILLs what is inside a cgroup (v2 `cgroup.kill`, else each pid of `cgroup.procs`), with
/// only async-signal-safe calls.
///
/// # Safety
/// Plain syscalls on the paths given; callable between fork and exit.
unsafe fn kill_inside(p: &ReaperPaths) {
    let fd = libc::open(p.kill.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd >= 0 {
        let killed = libc::write(fd, b"1".as_ptr().cast(), 1) == 1;
        libc::close(fd);
        if killed {
            return;
        }
    }
    let fd = libc::open(p.procs.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
    libc::close(fd);
    let mut pid: i64 = 0;
    for &c in buf[..n.max(0) as usize].iter().chain(b"\n") {
        if c.is_ascii_digit() {
            pid = (pid * 10 + i64::from(c - b'0')).min(i64::from(i32::MAX));
        } else {
            if pid > 0 {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            pid = 0;
        }
    }
}

/// Parses `sovereign-<pid>-<n>`.
pub fn parse_run_name(name: &str) -> Option<(u32, u64)> {
    let (pid, n) = name.strip_prefix(PREFIX)?.split_once('-')?;
    Some((pid.parse().ok()?, n.parse().ok()?))
}

/// One stale run cgroup found at start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Stale {
    pub name: String,
    pub creator_pid: u32,
    pub killed: u32,
    pub removed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Whether `pid` is a live harness of this hierarchy: it exists and sits in the base or its
/// leaf (a reused pid elsewhere is not the creator).
fn creator_alive(h: &Hierarchy, pid: u32) -> bool {
    match membership_of(pid, h.version()) {
        Ok(Some(p)) => p == h.base_rel || Some(&p) == h.leaf_rel.as_ref(),
        Ok(None) | Err(_) => false,
    }
}

/// Removes `sovereign-<pid>-<n>` cgroups below the base whose creator is dead (stragglers are
/// killed first). Cgroups of this process and of a live harness are left alone: a live harness
/// removes its own, and one may sit empty for a moment between mkdir and its child's exec.
pub fn cleanup_stale(h: &Hierarchy) -> Vec<Stale> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir(&h.base) else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, _)) = parse_run_name(&name) else { continue };
        if pid == me || !e.path().is_dir() || creator_alive(h, pid) {
            continue;
        }
        let evacuate = match h.version() {
            Version::V1 => Some(h.base.clone()),
            Version::V2 => h.leaf_rel.as_ref().map(|r| h.located.fs_path(r)),
        };
        let killed = kill_all(&e.path(), evacuate.as_deref());
        let r = remove_dir(&e.path());
        out.push(Stale { name, creator_pid: pid, killed, removed: r.is_ok(), error: r.err().map(|e| e.to_string()) });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Writes the calling process's pid into an open `cgroup.procs`; async-signal-safe (no
/// allocation), for `pre_exec`.
pub fn join_fd(fd: BorrowedFd<'_>) -> io::Result<()> {
    let pid = nix::unistd::getpid().as_raw() as u64;
    let mut buf = [0u8; 24];
    let mut i = buf.len();
    let mut n = pid;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = buf.len() - i;
    let w = nix::unistd::write(fd, &buf[i..]).map_err(io::Error::from)?;
    if w != len {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a cgroup v2 host (kernel 6.8) for the parsers.
    const V2_EVENTS: &str = "low 0\nhigh 0\nmax 33481\noom 2\noom_kill 1\noom_group_kill 0\n";
    const V2_STAT: &str = "anon 4325376\nfile 11274289152\nkernel 9834496\nkernel_stack 114688\npagetables 143360\n\
sec_pagetables 0\npercpu 1200\nsock 0\nvmalloc 8192\nshmem 0\nzswap 0\nzswapped 0\nfile_mapped 2887680\n\
file_dirty 0\nfile_writeback 0\nswapcached 0\nanon_thp 0\nfile_thp 0\nshmem_thp 0\ninactive_anon 4308992\n\
active_anon 16384\ninactive_file 11169292288\nactive_file 104996864\nunevictable 0\nslab_reclaimable 6946816\n\
slab_unreclaimable 1432320\nslab 8379136\nworkingset_refault_anon 0\nworkingset_refault_file 9101\n\
pgscan 2930688\npgsteal 2930652\npgfault 52810\npgmajfault 190\nthp_fault_alloc 0\n";
    const V2_PEAK: &str = "11811160064\n";
    const V2_SWAP_EVENTS: &str = "high 0\nmax 0\nfail 0\n";
    const V1_STAT: &str = "cache 66519040\nrss 1081344\nrss_huge 0\nshmem 0\nmapped_file 0\ndirty 0\nwriteback 0\n\
swap 0\npgpgin 77145\npgpgout 60648\npgfault 339\npgmajfault 0\ninactive_anon 1069056\nactive_anon 0\n\
inactive_file 66465792\nactive_file 4096\nunevictable 0\nhierarchical_memory_limit 67108864\n\
hierarchical_memsw_limit 67108864\ntotal_cache 66519040\ntotal_rss 1081344\ntotal_rss_huge 0\ntotal_shmem 0\n";
    const V1_OOM: &str = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";

    #[test]
    fn v2_events_stat_peak() {
        let ev = parse_keyed(V2_EVENTS);
        assert_eq!(ev["max"], 33481);
        assert_eq!(ev["oom"], 2);
        assert_eq!(ev["oom_kill"], 1);
        let s = parse_stat(V2_STAT, Version::V2);
        assert_eq!((s.anon, s.file, s.shmem, s.kernel), (4325376, 11274289152, Some(0), Some(9834496)));
        assert_eq!(parse_u64(V2_PEAK), Some(11811160064));
        assert_eq!(parse_limit("max\n"), Ok(None));
        assert_eq!(parse_limit("11811160064\n"), Ok(Some(11811160064)));
        assert!(parse_limit("eleven").is_err());
    }

    #[test]
    fn v1_stat_and_oom() {
        let s = parse_stat(V1_STAT, Version::V1);
        assert_eq!((s.anon, s.file, s.shmem), (1081344, 66519040, Some(0)));
        assert_eq!(parse_keyed(V1_OOM)["oom_kill"], 3);
        let d = tempfile::tempdir().unwrap();
        for (f, t) in [
            ("memory.usage_in_bytes", "67100672\n"),
            ("memory.max_usage_in_bytes", "67108864\n"),
            ("memory.failcnt", "116\n"),
            ("memory.memsw.failcnt", "0\n"),
            ("memory.memsw.usage_in_bytes", "67362816\n"),
            ("memory.oom_control", V1_OOM),
            ("memory.stat", &V1_STAT.replace("total_shmem 0\n", "total_shmem 0\ntotal_swap 0\n")),
        ] {
            fs::write(d.path().join(f), t).unwrap();
        }
        let c = read_counters(d.path(), Version::V1);
        assert_eq!((c.usage, c.peak, c.limit_events, c.oom_kills, c.under_oom), (67100672, Some(67108864), 116, 3, false));
        assert_eq!(c.swap, Some(0), "swap comes from memory.stat, not memsw usage - usage");
        assert_eq!(c.oom_events, None);
    }

    /// The v2 reading path over a directory of captured files (plain files stand in for
    /// cgroupfs; the same code reads the kernel's).
    #[test]
    fn v2_counters_from_files() {
        let d = tempfile::tempdir().unwrap();
        for (f, t) in [
            ("memory.current", "11811000000\n"),
            ("memory.peak", V2_PEAK),
            ("memory.events", V2_EVENTS),
            ("memory.stat", V2_STAT),
            ("memory.swap.current", "0\n"),
            ("memory.swap.events", V2_SWAP_EVENTS),
        ] {
            fs::write(d.path().join(f), t).unwrap();
        }
        let c = read_counters(d.path(), Version::V2);
        assert_eq!(c.usage, 11811000000);
        assert_eq!(c.peak, Some(11811160064));
        assert_eq!(c.limit_events, 33481);
        assert_eq!((c.oom_events, c.oom_kills), (Some(2), 1));
        assert_eq!((c.swap, c.swap_peak, c.swap_events), (Some(0), None, Some(0)));
        let s = read_stat(d.path(), Version::V2).unwrap();
        assert_eq!((s.usage, s.file), (11811000000, 11274289152));
        // Without memory.peak (kernels before 5.19) the peak is not invented.
        fs::remove_file(d.path().join("memory.peak")).unwrap();
        assert_eq!(read_counters(d.path(), Version::V2).peak, None);
    }

    /// The v2 control flow over a fake tree (plain files stand in for cgroupfs): the harness is
    /// moved into a leaf, memory is enabled for the subtree, a later call finds the leaf, and a
    /// run cgroup gets `memory.max` and `memory.swap.max = 0`.
    #[test]
    fn v2_control_flow_on_a_fake_tree() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let a = root.join("a");
        fs::create_dir(&a).unwrap();
        fs::write(a.join("cgroup.controllers"), "memory pids\n").unwrap();
        fs::write(a.join("cgroup.subtree_control"), "").unwrap();
        fs::write(a.join("cgroup.procs"), "4242\n").unwrap();
        let located = |own: &str| Located { version: Version::V2, mountpoint: root.to_path_buf(), mount_root: "/".into(), own: own.into() };

        let h = prepare_at(located("/a")).unwrap();
        assert_eq!((h.base.as_path(), h.base_rel.as_str(), h.leaf_rel.as_deref()), (a.as_path(), "/a", Some("/a/harness")));
        assert_eq!(fs::read_to_string(a.join("harness/cgroup.procs")).unwrap(), "4242");
        assert_eq!(fs::read_to_string(a.join("cgroup.subtree_control")).unwrap(), "+memory");

        fs::write(a.join("cgroup.subtree_control"), "memory\n").unwrap();
        let h2 = prepare_at(located("/a/harness")).unwrap();
        assert_eq!((h2.base_rel.as_str(), h2.leaf_rel.as_deref()), ("/a", Some("/a/harness")));

        let mut cg = RunCgroup::create(&h2).unwrap();
        assert!(cg.rel.starts_with("/a/sovereign-") && cg.path.starts_with(&a));
        fs::write(cg.path.join("memory.swap.max"), "max\n").unwrap();
        let set = cg.set_limit(Some(64 << 20)).unwrap();
        assert_eq!(set.limit, Some(64 << 20));
        assert_eq!(set.swap_control, "memory.swap.max = 0");
        assert_eq!(fs::read_to_string(cg.path.join("memory.max")).unwrap(), "67108864");
        assert_eq!(fs::read_to_string(cg.path.join("memory.swap.max")).unwrap(), "0");
        for f in ["memory.max", "memory.swap.max"] {
            fs::remove_file(cg.path.join(f)).unwrap();
        }
        cg.remove().unwrap();
        assert!(!cg.path.exists());

        // Without memory in the base's cgroup.controllers: not delegated, one line.
        fs::write(a.join("cgroup.controllers"), "pids\n").unwrap();
        let e = prepare_at(located("/a/harness")).unwrap_err();
        assert_eq!(e.kind, SetupErrorKind::NotDelegated);
        assert!(e.message.contains("+memory") && !e.message.contains('\n'), "{}", e.message);
    }

    fn mounts(text: &str) -> MountInfos {
        procfs::FromRead::from_read(text.as_bytes()).unwrap()
    }

    fn groups(text: &str) -> ProcessCGroups {
        procfs::FromRead::from_read(text.as_bytes()).unwrap()
    }

    #[test]
    fn locate_v1_v2_hybrid_none() {
        let hybrid = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let cg = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n";
        let l = locate_from(&mounts(hybrid), &groups(cg)).unwrap();
        assert_eq!(l.version, Version::V1);
        assert_eq!(l.fs_path(&l.own), PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"));

        let v2 = "30 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let l = locate_from(&mounts(v2), &groups("0::/user.slice/user-1000.slice/session-2.scope\n")).unwrap();
        assert_eq!(l.version, Version::V2);
        assert_eq!(l.fs_path(&l.own), PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"));

        // A bind-mounted subtree (containers): the mount root is stripped.
        let sub = "30 24 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = locate_from(&mounts(sub), &groups("0::/kubepods/pod1/c1\n")).unwrap();
        assert_eq!(l.fs_path(&l.own), PathBuf::from("/sys/fs/cgroup/c1"));

        // Escaped mount point.
        let esc = "30 24 0:26 / /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n";
        assert_eq!(locate_from(&mounts(esc), &groups("0::/\n")).unwrap().mountpoint, PathBuf::from("/mnt/cg v2"));

        let none = "22 1 8:1 / / rw - ext4 /dev/vda rw\n";
        let e = locate_from(&mounts(none), &groups("0::/\n")).unwrap_err();
        assert_eq!(e.kind, SetupErrorKind::NoMemoryController);
        assert!(!e.message.contains('\n'));
    }

    #[test]
    fn names_and_paths() {
        assert_eq!(parse_run_name("sovereign-123-4"), Some((123, 4)));
        assert_eq!(parse_run_name("sovereign-x-4"), None);
        assert_eq!(parse_run_name("harness"), None);
        assert_eq!(parent_rel("/a/b"), "/a");
        assert_eq!(parent_rel("/a"), "/");
        assert_eq!(child_rel("/", "x"), "/x");
        assert_eq!(child_rel("/a", "x"), "/a/x");
        assert_eq!(membership_path(&groups("12:memory,foo:/m\n0::/u\n"), Version::V1).as_deref(), Some("/m"));
        assert_eq!(membership_path(&groups("12:memory,foo:/m\n0::/u\n"), Version::V2).as_deref(), Some("/u"));
    }
}
