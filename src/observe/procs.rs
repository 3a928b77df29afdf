//! /proc counters of the run's process tree: `read_bytes`, `rchar`, RSS high-water.
//!
//! Read through `procfs`, the one /proc reader of the harness (this process's own `VmHWM` too).
//! The kernel adds a waited-for child's I/O counters to its parent's, and `/proc/<pid>/io` stays
//! readable while a process is a zombie, so the direct child's counters read between its exit
//! and its reaping cover itself and every descendant waited for inside the tree.

use procfs::process::{Process, Status};
use procfs::{Current, FromRead, Meminfo};
use serde::Serialize;
use std::collections::BTreeMap;

/// `/proc/<pid>/io`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Io {
    pub rchar: u64,
    pub wchar: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl Io {
    pub fn add(&mut self, o: &Io) {
        self.rchar += o.rchar;
        self.wchar += o.wchar;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
    }
}

impl From<procfs::process::Io> for Io {
    fn from(io: procfs::process::Io) -> Io {
        Io { rchar: io.rchar, wchar: io.wchar, read_bytes: io.read_bytes, write_bytes: io.write_bytes }
    }
}

/// The text of a `/proc/<pid>/io`; None unless every field the kernel writes is there.
pub fn parse_io(text: &str) -> Option<Io> {
    procfs::process::Io::from_read(text.as_bytes()).ok().map(Io::from)
}

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

pub fn read_io(pid: u32) -> Option<Io> {
    process(pid)?.io().ok().map(Io::from)
}

/// `VmHWM` of a status in bytes (absent for zombies and kernel threads).
fn hwm_of(status: &Status) -> Option<u64> {
    status.vmhwm.map(|kb| kb * 1024)
}

/// `VmHWM` of the text of a `/proc/<pid>/status`, in bytes.
pub fn parse_hwm(status: &str) -> Option<u64> {
    hwm_of(&Status::from_read(status.as_bytes()).ok()?)
}

pub fn read_hwm(pid: u32) -> Option<u64> {
    hwm_of(&process(pid)?.status().ok()?)
}

/// This process's resident-set high-water mark (`VmHWM`), if /proc tells it.
pub fn own_hwm() -> Option<u64> {
    hwm_of(&Process::myself().ok()?.status().ok()?)
}

/// `MemTotal` of `/proc/meminfo`, bytes.
pub fn mem_total() -> Option<u64> {
    Meminfo::current().ok().map(|m| m.mem_total)
}

/// `SwapTotal` of `/proc/meminfo`, bytes.
pub fn swap_total() -> Option<u64> {
    Meminfo::current().ok().map(|m| m.swap_total)
}

/// What sampling saw of each process that was in the run's cgroup.
#[derive(Clone, Debug, Default)]
pub struct TreeSampler {
    pub per_pid: BTreeMap<u32, (Option<Io>, Option<u64>)>,
}

impl TreeSampler {
    pub fn sample(&mut self, pids: &[u32]) {
        for &pid in pids {
            let p = process(pid);
            let io = p.as_ref().and_then(|p| p.io().ok()).map(Io::from);
            let hwm = p.as_ref().and_then(|p| p.status().ok()).as_ref().and_then(hwm_of);
            let e = self.per_pid.entry(pid).or_default();
            if io.is_some() {
                e.0 = io;
            }
            e.1 = e.1.max(hwm);
        }
    }

    pub fn hwm(&self) -> Option<u64> {
        self.per_pid.values().filter_map(|v| v.1).max()
    }
}

/// The run's process-tree counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ProcCounters {
    /// Tree totals: the direct child's counters read at its exit (its own and those of every
    /// descendant waited for inside the tree) plus those of stragglers still alive at that
    /// moment. A descendant orphaned out of the tree and reaped elsewhere mid-run is missed.
    pub read_bytes: u64,
    pub rchar: u64,
    pub write_bytes: u64,
    pub wchar: u64,
    /// Largest sampled `VmHWM` of any process of the tree (each read after exec, so it is the
    /// process's own high-water mark); None if no sample caught a process alive.
    pub rss_hwm: Option<u64>,
    /// wait4 `ru_maxrss` of the direct child, bytes: an upper bound only, since exec records
    /// the high-water mark of the forked pre-exec copy of the harness in it.
    pub maxrss_wait4: u64,
    /// Distinct pids seen in the cgroup.
    pub processes_seen: usize,
    /// Whether the direct child's counters could be read at exit.
    pub final_read: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_and_status() {
        let io = parse_io("rchar: 8197\nwchar: 1221\nsyscr: 12\nsyscw: 1\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n")
            .unwrap();
        assert_eq!((io.rchar, io.wchar, io.read_bytes, io.write_bytes), (8197, 1221, 4096, 0));
        assert_eq!(parse_io("rchar: 1\n"), None);
        // A live process's status (as the kernel writes it), and a zombie's (no Vm lines).
        let live = concat!(
            "Name:\tpython3\n",
            "Umask:\t0022\n",
            "State:\tR (running)\n",
            "Tgid:\t20787\n",
            "Ngid:\t0\n",
            "Pid:\t20787\n",
            "PPid:\t20785\n",
            "TracerPid:\t0\n",
            "Uid:\t0\t0\t0\t0\n",
            "Gid:\t0\t0\t0\t0\n",
            "FDSize:\t256\n",
            "Groups:\t \n",
            "VmPeak:\t   16564 kB\n",
            "VmHWM:\t    1792 kB\n",
            "VmRSS:\t   13620 kB\n",
            "Threads:\t1\n",
            "SigQ:\t0/96364\n",
            "SigPnd:\t0000000000000000\n",
            "ShdPnd:\t0000000000000000\n",
            "SigBlk:\t0000000000000000\n",
            "SigIgn:\t0000000001001000\n",
            "SigCgt:\t0000000000000002\n",
            "CapInh:\t0000000000000000\n",
            "CapPrm:\t000001fffeffffff\n",
            "CapEff:\t000001fffeffffff\n",
            "CapBnd:\t000001fffeffffff\n",
            "Seccomp:\t0\n",
            "Cpus_allowed:\t3\n",
            "Cpus_allowed_list:\t0-1\n",
            "Mems_allowed:\t00000001\n",
            "Mems_allowed_list:\t0\n",
            "voluntary_ctxt_switches:\t15\n",
            "nonvoluntary_ctxt_switches:\t6\n",
        );
        assert_eq!(parse_hwm(live), Some(1792 * 1024));
        let zombie: String = live.lines().filter(|l| !l.starts_with("Vm")).map(|l| format!("{l}\n")).collect();
        assert!(Status::from_read(zombie.as_bytes()).is_ok());
        assert_eq!(parse_hwm(&zombie), None);
        assert!(mem_total().unwrap() > 0);
        assert!(swap_total().is_some());
        let me = std::process::id();
        assert!(read_io(me).unwrap().rchar > 0);
        assert!(read_hwm(me).unwrap() > 0);
        assert!(own_hwm().unwrap() > 0);
    }
}
