//! F: asynchronous O_DIRECT reads through io_uring into registered windows, with bounded depth.
//!
//! Windows and the in-flight table are allocated once at open; the hot path (`submit`, `wait`)
//! allocates nothing. Completions are reaped as they come, in any order, and returned with the
//! tags of their request. Latencies go into a log2 histogram.

use super::{check_request, AlignedBuf, Completion, Covering, ReadRequest, Source, SourceError, SourceStats};
use super::open_direct;
use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

struct InFlight {
    req: ReadRequest,
    cov: Covering,
    started: Instant,
}

pub struct UringSource {
    file: File,
    ring: IoUring,
    windows: Vec<AlignedBuf>,
    window_size: u64,
    /// Registered with the kernel (ReadFixed); false where registration was refused.
    registered: bool,
    depth: usize,
    /// In-flight table indexed by user_data; `free` lists unused entries.
    table: Vec<Option<InFlight>>,
    free: Vec<usize>,
    ready: VecDeque<Completion>,
    stats: SourceStats,
}

impl UringSource {
    /// Opens `path` with O_DIRECT, allocates and registers `n_windows` windows of `window_size`
    /// bytes, and allows at most `depth` reads in flight.
    pub fn open(path: &Path, n_windows: u32, window_size: u64, depth: u32) -> Result<UringSource> {
        if n_windows == 0 || depth == 0 {
            bail!("the asynchronous source needs at least one window and a depth of at least one");
        }
        let file = open_direct(path)?;
        let window_size = super::align_up(window_size);
        let windows: Vec<AlignedBuf> = (0..n_windows).map(|_| AlignedBuf::new(window_size)).collect::<Result<_>>()?;
        let depth = depth as usize;
        let ring = IoUring::new(depth.next_power_of_two().max(2) as u32)
            .context("io_uring is not available on this host (use --source d)")?;
        let iovecs: Vec<libc::iovec> =
            windows.iter().map(|w| libc::iovec { iov_base: w.as_ptr() as *mut _, iov_len: w.len() }).collect();
        // SAFETY: the windows outlive the ring (dropped after it: field order) and never move.
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(UringSource {
            file,
            ring,
            windows,
            window_size,
            registered,
            depth,
            table: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            ready: VecDeque::with_capacity(depth),
            stats: SourceStats::default(),
        })
    }

    pub fn registered(&self) -> bool {
        self.registered
    }

    /// Moves every available completion from the ring to `ready`; blocks for one if `block`.
    fn reap(&mut self, block: bool) -> Result<(), SourceError> {
        if block {
            loop {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(io_error(&e)),
                }
            }
        }
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let idx = cqe.user_data() as usize;
            let f = self.table[idx].take().expect("a completion for an entry in flight");
            self.free.push(idx);
            self.stats.record_latency(f.started.elapsed());
            let res = cqe.result();
            let result = if res < 0 {
                self.stats.failed += 1;
                Err(-res)
            } else {
                Ok(self.stats.record_read(res as u64, &f.cov, f.req.len))
            };
            self.ready.push_back(Completion::of(&f.req, result));
        }
        Ok(())
    }
}

fn io_error(e: &std::io::Error) -> SourceError {
    SourceError::Io { errno: e.raw_os_error().unwrap_or(libc::EIO) }
}

impl Source for UringSource {
    fn n_windows(&self) -> u32 {
        self.windows.len() as u32
    }

    fn window_size(&self) -> u64 {
        self.window_size
    }

    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError> {
        let cov = check_request(&req, self.n_windows(), self.window_size)?;
        // Bounded depth: make room by reaping (completions wait in `ready`).
        while self.free.is_empty() {
            self.reap(true)?;
        }
        let idx = self.free.pop().expect("a free entry");
        let buf = self.windows[req.window as usize].as_ptr();
        // SAFETY: the covering read lies inside the window (checked above).
        let dst = unsafe { buf.add(req.window_offset as usize) };
        let fd = types::Fd(self.file.as_raw_fd());
        let sqe = if self.registered {
            opcode::ReadFixed::new(fd, dst, cov.len as u32, req.window as u16).offset(cov.offset).build()
        } else {
            opcode::Read::new(fd, dst, cov.len as u32).offset(cov.offset).build()
        }
        .user_data(idx as u64);
        self.table[idx] = Some(InFlight { req, cov, started: Instant::now() });
        // SAFETY: the window stays alive and is not touched by us until the completion is reaped.
        unsafe {
            let mut sq = self.ring.submission();
            if sq.push(&sqe).is_err() {
                drop(sq);
                // The entry was never queued: give it back so drop does not wait for it.
                let pushed = match self.ring.submit() {
                    Ok(_) => self.ring.submission().push(&sqe).map_err(|_| SourceError::Io { errno: libc::EBUSY }),
                    Err(e) => Err(io_error(&e)),
                };
                if let Err(e) = pushed {
                    self.table[idx] = None;
                    self.free.push(idx);
                    return Err(e);
                }
            }
        }
        self.ring.submit().map_err(|e| io_error(&e))?;
        self.stats.submissions += 1;
        let outstanding = self.outstanding() as u64;
        self.stats.peak_outstanding = self.stats.peak_outstanding.max(outstanding);
        Ok(())
    }

    fn wait(&mut self) -> Result<Completion, SourceError> {
        if self.ready.is_empty() {
            if self.free.len() == self.depth {
                return Err(SourceError::NothingOutstanding);
            }
            self.reap(false)?;
            while self.ready.is_empty() {
                self.reap(true)?;
            }
        }
        self.stats.completions += 1;
        Ok(self.ready.pop_front().expect("a ready completion"))
    }

    fn outstanding(&self) -> usize {
        (self.depth - self.free.len()) + self.ready.len()
    }

    fn window(&self, w: u32) -> &[u8] {
        self.windows[w as usize].as_slice()
    }

    fn corrupt(&mut self, w: u32, at: u64) -> bool {
        self.windows.get_mut(w as usize).is_some_and(|b| b.flip(at))
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }
}

impl Drop for UringSource {
    fn drop(&mut self) {
        // Reads still in flight write into the windows: drain them before the memory goes.
        while self.free.len() < self.depth {
            if self.reap(true).is_err() {
                break;
            }
        }
    }
}
