//! /proc counters of the run's process tree: `read_bytes`, `rchar`, RSS high-water.
//!
//! Read from /proc directly (four fields of two files; the `procfs` crate would add nothing).
//! The kernel adds a waited-for child's I/O counters to its parent's, and `/proc/<pid>/io` stays
//! readable while a process is a zombie, so the direct child's counters read between its exit
//! and its reaping cover itself and every descendant waited for inside the tree.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;

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

pub fn parse_io(text: &str) -> Option<Io> {
    let mut io = Io::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        let Ok(v) = v.trim().parse::<u64>() else { continue };
        let slot = match k {
            "rchar" => &mut io.rchar,
            "wchar" => &mut io.wchar,
            "read_bytes" => &mut io.read_bytes,
            "write_bytes" => &mut io.write_bytes,
            _ => continue,
        };
        *slot = v;
        seen += 1;
    }
    (seen == 4).then_some(io)
}

pub fn read_io(pid: u32) -> Option<Io> {
    parse_io(&fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

/// `VmHWM` of `/proc/<pid>/status` in bytes (absent for zombies and kernel threads).
pub fn parse_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line["VmHWM:".len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

pub fn read_hwm(pid: u32) -> Option<u64> {
    parse_hwm(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// `MemTotal` of `/proc/meminfo` (or `SwapTotal`, ...) in bytes.
pub fn meminfo(key: &str) -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.split(':').next() == Some(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What sampling saw of each process that was in the run's cgroup.
#[derive(Clone, Debug, Default)]
pub struct TreeSampler {
    pub per_pid: BTreeMap<u32, (Option<Io>, Option<u64>)>,
}

impl TreeSampler {
    pub fn sample(&mut self, pids: &[u32]) {
        for &pid in pids {
            let io = read_io(pid);
            let hwm = read_hwm(pid);
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
        let io = parse_io("rchar: 8197\nwchar: 1221\nsyscr: 12\nsyscw: 1\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n").unwrap();
        assert_eq!((io.rchar, io.wchar, io.read_bytes, io.write_bytes), (8197, 1221, 4096, 0));
        assert_eq!(parse_io("rchar: 1\n"), None);
        assert_eq!(
            parse_hwm("Name:\tdd\nVmPeak:\t  9000 kB\nVmHWM:\t    1792 kB\nVmRSS:\t 1700 kB\n"),
            Some(1792 * 1024)
        );
        assert_eq!(parse_hwm("Name:\tzombie\n"), None);
        assert!(meminfo("MemTotal").unwrap() > 0);
        let me = std::process::id();
        assert!(read_io(me).unwrap().rchar > 0);
        assert!(read_hwm(me).unwrap() > 0);
    }
}
