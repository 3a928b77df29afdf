//! `observe` against real cgroups on this machine. Every test that needs a memory controller
//! and the right to create cgroups prints `SKIP: <reason>` and returns where they are missing;
//! under `CI=true` a missing controller fails the test instead.
//!
//! The tests share one lock: they move hundreds of MiB through the page cache, and the stale
//! cleanup test must not race the others' cleanup.

use crate::common;

use sovereign::observe::cgroup::{self, RunCgroup};
use sovereign::observe::gpu::{self, GpuAudit};
use sovereign::observe::{run_contained, ContainSpec, ContainedRun, Grade, Graded, RunStatus};
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const MIB: u64 = 1 << 20;
static SERIAL: Mutex<()> = Mutex::new(());

/// The lock, or None (after printing why) where run cgroups cannot be made.
fn cgroups(test: &str) -> Option<MutexGuard<'static, ()>> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let made = cgroup::prepare().map_err(|e| e.to_string()).and_then(|h| RunCgroup::create(&h).map_err(|e| e.to_string()));
    match made {
        Ok(_probe) => Some(guard),
        Err(e) => {
            common::skip(test, &format!("needs a memory cgroup it may create: {e}"));
            None
        }
    }
}

fn spec(limit: Option<u64>) -> ContainSpec {
    ContainSpec { memory_max: limit, sample_interval: Duration::from_millis(20), ..Default::default() }
}

fn quiet(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// A file of `mib` MiB that is on disk and not in the page cache.
fn cold_file(dir: &Path, mib: u64) -> PathBuf {
    let path = dir.join("cold.bin");
    let mut f = File::create(&path).unwrap();
    let block: Vec<u8> = (0..MIB).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..mib {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
    drop_cache(&path);
    path
}

fn drop_cache(path: &Path) {
    let f = File::open(path).unwrap();
    // SAFETY: advisory call on an open fd.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise DONTNEED");
}

fn show(what: &str, r: &ContainedRun) {
    let h = &r.host;
    eprintln!(
        "{what}: status {:?} wall {:.3}s limit {:?} kernel_peak {:?} sampled_peak {} limit_events {} ({:?}) oom_kills {} \
         stat_at_peak {:?} stat_end {:?} read_bytes {} rchar {} rss_hwm {:?} margin {:?} admitted {} failed {:?}",
        r.status,
        r.wall_s,
        h.limit,
        h.kernel_peak,
        h.sampled_peak,
        h.limit_events,
        h.limit_event_files,
        h.oom_kills,
        h.stat_at_peak,
        h.stat_end,
        r.procs.read_bytes,
        r.procs.rchar,
        r.procs.rss_hwm,
        r.authority.host.margin,
        r.admission.admitted,
        r.admission.failed()
    );
}

fn assert_gone(r: &ContainedRun) {
    assert!(r.host.removed, "cleanup: {:?}", r.host.cleanup_error);
    assert!(!r.host.cgroup_path.exists(), "{} still exists", r.host.cgroup_path.display());
    assert!(!r.host.cgroup.contains('/'), "a machine path in the record: {}", r.host.cgroup);
}

/// The seed's P-versus-D/F admission result in miniature: buffered reads of a 300 MiB file
/// through a 64 MiB limit complete but fill the limit with page cache (RSS stays small); the
/// same reads with O_DIRECT stay under it with no limit event.
#[test]
fn page_cache_hits_the_limit_direct_io_does_not() {
    let Some(_g) = cgroups("page_cache_hits_the_limit_direct_io_does_not") else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = cold_file(dir.path(), 300);
    let input = format!("if={}", file.display());

    let p = run_contained(quiet("dd", &[&input, "of=/dev/null", "bs=1M"]), &spec(Some(64 * MIB))).unwrap();
    show("P (buffered)", &p);
    assert!(p.status.success(), "{:?}", p.status);
    assert_eq!(p.host.limit, Some(64 * MIB));
    assert_eq!(p.authority.host.grade, Grade::HardLimit);
    assert!(p.host.limit_events > 0, "buffered reads through a 64 MiB limit must hit it");
    assert!(p.host.kernel_peak.unwrap() > 60 * MIB);
    let s = p.host.stat_at_peak.as_ref().unwrap();
    assert!(s.file > 4 * s.anon && s.file > s.usage / 2, "file share not dominant at peak: {s:?}");
    let e = p.host.stat_end.as_ref().unwrap();
    assert!(e.file > e.anon, "{e:?}");
    assert!(p.procs.rchar >= 300 * MIB, "{:?}", p.procs);
    assert!(p.procs.read_bytes >= 250 * MIB, "{:?}", p.procs);
    assert!(p.procs.rss_hwm.unwrap() < 16 * MIB, "RSS should stay small: {:?}", p.procs);
    assert!(!p.admission.admitted);
    let events = p.admission.conjuncts.iter().find(|c| c.name == "limit events").unwrap();
    assert_eq!((events.passed, events.value.clone()), (false, p.host.limit_events.to_string()), "{:?}", p.admission);
    assert_gone(&p);

    drop_cache(&file);
    let d = run_contained(quiet("dd", &[&input, "of=/dev/null", "bs=1M", "iflag=direct"]), &spec(Some(64 * MIB))).unwrap();
    show("D (O_DIRECT)", &d);
    assert!(d.status.success(), "{:?}", d.status);
    assert_eq!(d.host.limit_events, 0);
    assert!(d.authority.host.margin.unwrap() > 0);
    assert_eq!(d.procs.read_bytes, 300 * MIB, "O_DIRECT read_bytes rise exactly by the bytes read");
    assert!(d.admission.admitted, "{:?}", d.admission.failed());
    assert_gone(&d);
}

/// Anonymous memory beyond the limit: the kernel OOM-kills the child; the kill is recorded.
#[test]
fn anon_beyond_the_limit_is_oom_killed_and_recorded() {
    let Some(_g) = cgroups("anon_beyond_the_limit_is_oom_killed_and_recorded") else { return };
    // dd allocates its 256 MiB block and fills it from /dev/zero: all anonymous memory.
    let r = run_contained(quiet("dd", &["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]), &spec(Some(64 * MIB))).unwrap();
    show("OOM", &r);
    assert!(matches!(r.status, RunStatus::Signaled { signal: libc::SIGKILL, .. }), "{:?}", r.status);
    assert!(r.host.oom_kills >= 1, "{:?}", r.host);
    assert!(!r.admission.admitted);
    assert!(r.admission.failing().any(|c| c.name == "oom kills"), "{:?}", r.admission);
    // The run's own conjunct says in words that the limit, not an outside signal, killed it.
    let exit = r.admission.conjuncts.iter().find(|c| c.name == "worker exited 0").unwrap();
    assert_eq!(exit.value, "the cgroup's 64 MiB limit killed the worker: the kernel's OOM killer sent it signal 9 (SIGKILL)");
    assert_gone(&r);
}

/// A crashing child that leaves a process behind: status recorded, straggler killed, cgroup gone.
#[test]
fn crash_with_a_straggler_leaves_no_cgroup() {
    let Some(_g) = cgroups("crash_with_a_straggler_leaves_no_cgroup") else { return };
    let r = run_contained(quiet("sh", &["-c", "sleep 30 & kill -SEGV $$"]), &spec(Some(64 * MIB))).unwrap();
    show("crash", &r);
    assert!(matches!(r.status, RunStatus::Signaled { signal: libc::SIGSEGV, .. }), "{:?}", r.status);
    assert_eq!(r.host.stragglers_killed, 1);
    assert!(r.procs.processes_seen >= 1);
    assert_gone(&r);
}

/// Cgroups of a dead harness are removed (their processes killed first) at the next start; a
/// pid that is alive but not a harness in our cgroup (pid 1) is not mistaken for a creator.
#[test]
fn stale_cgroups_of_dead_harnesses_are_removed() {
    let Some(_g) = cgroups("stale_cgroups_of_dead_harnesses_are_removed") else { return };
    let h = cgroup::prepare().unwrap();
    let dead = h.base.join("sovereign-999999999-0"); // above any pid_max: never alive
    let reused = h.base.join("sovereign-1-7");
    let mine = h.base.join(format!("sovereign-{}-999999", std::process::id()));
    for d in [&dead, &reused, &mine] {
        let _ = fs::create_dir(d);
    }
    let mut sleeper = common::Reaped::new(Command::new("sleep").arg("30").spawn().unwrap());
    fs::write(dead.join("cgroup.procs"), sleeper.id().to_string()).unwrap();

    let r = run_contained(quiet("true", &[]), &spec(None)).unwrap();
    let names: Vec<&str> = r.host.stale_removed.iter().map(|s| s.name.as_str()).collect();
    eprintln!("stale: {:?}", r.host.stale_removed);
    assert!(names.contains(&"sovereign-999999999-0") && names.contains(&"sovereign-1-7"), "{names:?}");
    assert!(r.host.stale_removed.iter().all(|s| s.removed));
    assert_eq!(r.host.stale_removed.iter().find(|s| s.name == "sovereign-999999999-0").unwrap().killed, 1);
    assert!(!dead.exists() && !reused.exists());
    assert!(mine.exists(), "a cgroup of this (live) harness must be left alone");
    fs::remove_dir(&mine).unwrap();
    let st = sleeper.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL));
    assert_gone(&r);
}

/// Without a limit the run still gets its own cgroup: the child's memory is charged there
/// (proving it joined before exec), graded as an instrumented high-water mark under MemTotal.
#[test]
fn accounting_only_run_charges_the_child() {
    let Some(_g) = cgroups("accounting_only_run_charges_the_child") else { return };
    let r = run_contained(quiet("dd", &["if=/dev/zero", "of=/dev/null", "bs=16M", "count=32"]), &spec(None)).unwrap();
    show("no limit", &r);
    assert!(r.status.success());
    assert_eq!(r.host.limit, None);
    assert!(r.host.kernel_peak.unwrap() >= 16 * MIB, "dd's 16 MiB block must be charged to the run cgroup");
    // VmHWM is sampled from /proc before the child is reaped and can miss the last pages (or
    // the whole of a short child); wait4's maxrss is the kernel's figure for its whole life.
    assert!(r.procs.maxrss_wait4 >= 16 * MIB, "{:?}", r.procs);
    assert_eq!(r.authority.host.grade, Grade::HighWaterMark);
    assert_eq!(r.authority.host.ceiling, r.host.mem_total);
    assert!(r.authority.host.ceiling_margin.unwrap() > 0);
    assert_eq!(r.admission.failing().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["host margin"], "{:?}", r.admission);
    assert_gone(&r);
}

/// No NVML here: the GPU tier is `NotObserved` with NVML's own reason, never a zero.
#[test]
fn gpu_without_nvml_is_not_observed() {
    let probe = gpu::probe();
    let Some(_g) = cgroups("gpu_without_nvml_is_not_observed") else { return };
    let r = run_contained(quiet("true", &[]), &ContainSpec { gpu_declared: None, ..spec(Some(64 * MIB)) }).unwrap();
    eprintln!("gpu: {:?}", r.gpu);
    match (&probe, &r.gpu) {
        (Some(why), GpuAudit::NotObserved { reason }) => {
            assert_eq!(why, reason);
            assert!(reason.starts_with("NVML unavailable: ") || reason.contains("zero devices"), "{reason}");
            assert_eq!(r.authority.gpu.grade, Graded::not_observed(reason.clone()));
            assert_eq!((r.authority.gpu.boundary, r.authority.gpu.peak), (None, None));
            assert!(r.admission.admitted, "{:?}", r.admission.failed());
            // Declaring a GPU allowance that cannot be audited is not admitted.
            let d = run_contained(quiet("true", &[]), &ContainSpec { gpu_declared: Some(MIB), ..spec(Some(64 * MIB)) }).unwrap();
            assert!(d.admission.failing().any(|c| c.name == "gpu margin" && c.value.starts_with("not observed")), "{:?}", d.admission);
        }
        (None, GpuAudit::Observed(o)) => {
            eprintln!("NVML present: {} board(s), {} bytes", o.boards.len(), o.total);
            assert!(o.total > 0 && o.samples > 0);
        }
        other => panic!("probe and sampler disagree: {other:?}"),
    }
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"authority\""));
}

/// A cgroup2 filesystem this test mounted (at a temporary directory), unmounted when dropped.
/// Hosts of cgroup v1 alone (CI's kind) mount no cgroup2, yet the kernel has the unified
/// hierarchy: mounted, its root offers only the controllers v1 has not bound (no memory).
struct Cgroup2Mount {
    dir: tempfile::TempDir,
}

impl Cgroup2Mount {
    fn new() -> std::io::Result<Cgroup2Mount> {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir()?;
        let target = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: every pointer is a NUL-terminated string that outlives the call; no data.
        let rc = unsafe { libc::mount(c"none".as_ptr(), target.as_ptr(), c"cgroup2".as_ptr(), 0, std::ptr::null()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Cgroup2Mount { dir })
    }
}

impl Drop for Cgroup2Mount {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let target = std::ffi::CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the calls. A busy mount is detached.
        let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
        if rc != 0 && unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!("cannot unmount the test's cgroup2 at {}: {}", self.dir.path().display(), std::io::Error::last_os_error());
        }
    }
}

/// A child cgroup and a grandchild under it, the child distributing no controller (nothing is
/// ever written to its cgroup.subtree_control), so the grandchild has no memory controller even
/// where its grandparent has; both removed when dropped.
struct Undelegated {
    child: PathBuf,
    grandchild: PathBuf,
}

impl Undelegated {
    const GRANDCHILD: &'static str = "no-memory";

    fn new(parent: &Path) -> std::io::Result<Undelegated> {
        let child = parent.join(format!("observe-undelegated-{}", std::process::id()));
        fs::create_dir(&child)?;
        let g = Undelegated { grandchild: child.join(Self::GRANDCHILD), child };
        fs::create_dir(&g.grandchild)?;
        Ok(g)
    }
}

impl Drop for Undelegated {
    fn drop(&mut self) {
        for d in [&self.grandchild, &self.child] {
            if let Err(e) = fs::remove_dir(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("cannot remove the test's cgroup {}: {e}", d.display());
                }
            }
        }
    }
}

/// The v2 checks against a real cgroup2 mount whose cgroup lacks the memory controller: a
/// one-line error saying what to do, nothing moved. Where no cgroup2 is mounted, the test mounts
/// one (as root) and unmounts it at its end; on a hybrid or v1 host the unified hierarchy has no
/// memory controller at all. Where this process's own v2 cgroup has the controller (a v2 host
/// with delegation), the cgroup under test is a grandchild that was never delegated it.
#[test]
fn v2_without_memory_delegation_says_what_to_do() {
    let test = "v2_without_memory_delegation_says_what_to_do";
    // The other tests may move this process into a harness leaf (v2) while this one looks.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let existing = mountinfo.lines().find(|l| l.contains(" - cgroup2 ")).map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (PathBuf::from(f[4]), f[3].to_string())
    });
    // Declared before `undelegated`, so dropped after it: the cgroups go before the mount.
    let mut mounted = None;
    let (point, mount_root) = match existing {
        Some(m) => m,
        None => match Cgroup2Mount::new() {
            Ok(m) => (mounted.insert(m).dir.path().to_path_buf(), "/".to_string()),
            Err(e) => {
                common::skip(test, &format!("no cgroup2 is mounted and mounting one failed: {e}"));
                return;
            }
        },
    };
    let controllers = |d: &Path| {
        let c = fs::read_to_string(d.join("cgroup.controllers")).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        c.split_whitespace().any(|w| w == "memory")
    };
    let own = cgroup::membership_of(std::process::id(), cgroup::Version::V2).unwrap().expect("a cgroup v2 line in /proc/self/cgroup");
    let mut located = cgroup::Located { version: cgroup::Version::V2, mountpoint: point.clone(), mount_root, own: own.clone() };
    let own_dir = located.fs_path(&own);
    assert!(own_dir.is_dir(), "our cgroup {own} is not visible under the cgroup2 at {}", point.display());
    let mut undelegated = None;
    let dir = if controllers(&own_dir) {
        let u = match Undelegated::new(&own_dir) {
            Ok(u) => undelegated.insert(u),
            Err(e) => {
                common::skip(test, &format!("{} has the memory controller and no child cgroup can be made in it: {e}", own_dir.display()));
                return;
            }
        };
        located.own =
            format!("{}/{}/{}", own.trim_end_matches('/'), u.child.file_name().unwrap().to_str().unwrap(), Undelegated::GRANDCHILD);
        assert_eq!(located.fs_path(&located.own), u.grandchild);
        u.grandchild.clone()
    } else {
        own_dir
    };
    assert!(!controllers(&dir), "{} must lack the memory controller", dir.display());
    let root_has_memory = controllers(&point);
    eprintln!(
        "cgroup2 at {} ({}), root {} memory; the cgroup under test: {}",
        point.display(),
        if mounted.is_some() { "mounted by this test" } else { "the host's" },
        if root_has_memory { "offers" } else { "lacks" },
        dir.display()
    );

    let before = fs::read_to_string(dir.join("cgroup.procs")).unwrap();
    let e = cgroup::prepare_at(located).unwrap_err();
    eprintln!("v2 error: {e}");
    assert!(!e.message.contains('\n'), "{}", e.message);
    if root_has_memory {
        // The controller exists on this hierarchy but was not given to our cgroup: say how.
        assert_eq!(e.kind, cgroup::SetupErrorKind::NotDelegated, "{}", e.message);
        assert!(e.message.contains(&format!("not delegated to {}", dir.display())), "{}", e.message);
        let parent = dir.parent().unwrap().join("cgroup.subtree_control");
        assert!(e.message.contains(&format!("echo +memory > {}", parent.display())), "{}", e.message);
        assert!(e.message.contains("Delegate=yes"), "{}", e.message);
    } else {
        // The hierarchy has no memory controller at all (bound to v1): say how to free it.
        assert!(undelegated.is_none(), "a cgroup with memory under a root without it");
        assert_eq!(e.kind, cgroup::SetupErrorKind::NoMemoryController, "{}", e.message);
        assert!(e.message.contains(&format!("cgroup2 at {} offers no memory controller", point.display())), "{}", e.message);
        assert!(e.message.contains("cgroup_no_v1=memory"), "{}", e.message);
    }
    // Nothing moved: no harness leaf made, the cgroup's processes where they were.
    assert!(!dir.join(cgroup::HARNESS_LEAF).exists());
    assert_eq!(fs::read_to_string(dir.join("cgroup.procs")).unwrap().lines().count() > 0, !before.is_empty());
}

#[test]
fn zero_sample_interval_is_refused() {
    let e = run_contained(quiet("true", &[]), &ContainSpec { sample_interval: Duration::ZERO, ..ContainSpec::default() }).unwrap_err();
    assert!(e.to_string().contains("sample interval"));
}
