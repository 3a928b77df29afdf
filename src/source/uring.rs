//! F: asynchronous O_DIRECT reads through io_uring into registered windows, with bounded depth.
//!
//! Windows, the ring and the in-flight table are allocated once at open; the hot path (`submit`,
//! `wait`) reuses them. Requests whose covering reads follow each other in the file go out as one
//! READV scattering into their windows or host targets; its completion becomes one completion
//! per request, full only for the requests it covered entirely. Completions are reaped as they
//! come, in any order, and returned with the tags of their request. Latencies (per SQE) go into
//! a log2 histogram.
//!
//! Depth bounds the reads the device serves at once, not the reads queued: a batch's SQEs go to
//! the kernel as at most `depth` linked chains (lowest tickets at the chains' heads), so the
//! kernel starts each chain's next read the moment the previous one completes. The queue stays
//! at depth while the caller computes and takes no completion, without a thread of ours. A read
//! that ends short (the file's tail) breaks its chain: the reads behind it come back cancelled,
//! never started, and are submitted again on their own.

use super::ModelFiles;
use super::{check_request, AlignedBuf, Completion, Covering, ReadRequest, Source, SourceError, SourceStats, ALIGN};
use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::time::Instant;

/// Requests one vectored read may carry (well under IOV_MAX).
pub const MAX_VECTOR: usize = 64;

/// Most SQEs queued at once for `n_windows` windows read at `depth`: room for every window's
/// bundle (of up to 8 extents) to be queued together, and never less than the depth.
pub fn entries(n_windows: u32, depth: u32) -> u32 {
    (n_windows.saturating_mul(8)).min(4096).max(depth)
}

/// One request carried by an SQE.
#[derive(Clone, Copy)]
struct Member {
    req: ReadRequest,
    cov: Covering,
    /// Bytes of this request's covering read the SQE itself reads (its iovec).
    iov_len: u64,
    /// The request's first block is the previous member's last one (unaligned neighbours): the
    /// SQE reads it once, into the previous member's window, and it is copied over at completion.
    shared_head: bool,
    /// Where the covering read lands.
    dst: *mut u8,
    host: bool,
}

/// One SQE in flight: its requests in file order, and the iovecs the kernel reads through
/// (kept here until completion). Both vectors are allocated once at open, at `MAX_VECTOR`.
struct InFlight {
    members: Vec<Member>,
    iovecs: Vec<libc::iovec>,
    started: Instant,
    busy: bool,
    /// Linked behind another SQE of its chain: the kernel starts it when that one completes,
    /// and cancels it, unstarted, when that one fails or ends short.
    follows: bool,
    /// The last SQE of its chain.
    tail: bool,
}

pub struct UringSource {
    files: ModelFiles,
    /// The files are registered with the ring (fixed descriptors); false where refused.
    files_registered: bool,
    ring: IoUring,
    windows: Vec<AlignedBuf>,
    window_size: u64,
    /// Registered with the kernel (ReadFixed); false where registration was refused.
    registered: bool,
    /// Chains (reads the device serves) at once.
    depth: usize,
    /// Chains whose tail has not completed.
    chains: usize,
    /// In-flight table indexed by user_data; `free` lists unused entries.
    table: Vec<InFlight>,
    free: Vec<usize>,
    /// Entries filled by `submit_vectored`, not yet given to the kernel (capacity: the table).
    staged: Vec<usize>,
    /// Cancelled behind a broken chain, to be submitted again (capacity: the table).
    retry: Vec<usize>,
    /// The push order of a flush (capacity: the table).
    order: Vec<usize>,
    /// Inside `drain`: cancelled reads are discarded, not submitted again.
    draining: bool,
    /// Requests carried by the SQEs in flight.
    requests_in_flight: usize,
    ready: VecDeque<Completion>,
    stats: SourceStats,
    /// The run being gathered by `submit_vectored` (capacity `MAX_VECTOR`, allocated once).
    run: Vec<Pending>,
    /// Draining failed: reads may still land in the windows (leaked) and in host targets.
    undrained: bool,
}

/// A checked request waiting to join an SQE.
#[derive(Clone, Copy)]
struct Pending {
    req: ReadRequest,
    cov: Covering,
    /// Where the covering read lands: inside a window, or the caller's host target.
    dst: *mut u8,
    host: bool,
    /// Its first block is the previous request's last one (see [`Member::shared_head`]).
    shared_head: bool,
}

// SAFETY: the raw pointers in the in-flight table point into the windows this source owns or
// into host targets the caller lent for the duration of the read (see `submit_vectored`).
unsafe impl Send for UringSource {}

impl UringSource {
    /// Opens `path` with O_DIRECT, allocates and registers `n_windows` windows of `window_size`
    /// bytes, and allows at most `depth` reads (SQEs) in flight.
    pub fn open(path: &Path, n_windows: u32, window_size: u64, depth: u32) -> Result<UringSource> {
        Self::open_with(&[path], n_windows, window_size, depth, &mut AlignedBuf::new)
    }

    /// The same with each window from `alloc` (pinned host memory of a device, where it has one).
    pub fn open_with<P: AsRef<Path>>(
        paths: &[P],
        n_windows: u32,
        window_size: u64,
        depth: u32,
        alloc: super::WindowAlloc,
    ) -> Result<UringSource> {
        if n_windows == 0 || depth == 0 {
            bail!("the asynchronous source needs at least one window and a depth of at least one");
        }
        let files = ModelFiles::open(paths, true)?;
        let window_size = super::align_up(window_size);
        let windows: Vec<AlignedBuf> = (0..n_windows).map(|_| alloc(window_size)).collect::<Result<_>>()?;
        let n = entries(n_windows, depth) as usize;
        let depth = depth as usize;
        let ring = IoUring::new(n.next_power_of_two().max(2) as u32).context("io_uring is not available on this host (use --source d)")?;
        let iovecs: Vec<libc::iovec> = windows.iter().map(|w| libc::iovec { iov_base: w.as_ptr() as *mut _, iov_len: w.len() }).collect();
        // SAFETY: the windows outlive the ring (dropped after it: field order) and never move.
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        // One descriptor per shard, registered so each SQE names its shard by index.
        let fds: Vec<i32> = files.files().iter().map(|f| f.as_raw_fd()).collect();
        let files_registered = ring.submitter().register_files(&fds).is_ok();
        // Entries grow to the longest run they carried and keep that capacity.
        let table = (0..n)
            .map(|_| InFlight {
                members: Vec::with_capacity(4),
                iovecs: Vec::with_capacity(4),
                started: Instant::now(),
                busy: false,
                follows: false,
                tail: true,
            })
            .collect();
        Ok(UringSource {
            files,
            files_registered,
            ring,
            windows,
            window_size,
            registered,
            depth,
            chains: 0,
            table,
            free: (0..n).rev().collect(),
            staged: Vec::with_capacity(n),
            retry: Vec::with_capacity(n),
            order: Vec::with_capacity(n),
            draining: false,
            requests_in_flight: 0,
            ready: VecDeque::with_capacity(n),
            stats: SourceStats::default(),
            run: Vec::with_capacity(MAX_VECTOR),
            undrained: false,
        })
    }

    pub fn registered(&self) -> bool {
        self.registered
    }

    /// Entries given to the kernel whose completion was not reaped.
    fn busy_entries(&self) -> usize {
        self.table.len() - self.free.len() - self.staged.len()
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
            let f = &mut self.table[idx];
            assert!(f.busy, "a completion for an entry in flight");
            if f.tail {
                self.chains -= 1;
            }
            if cqe.result() == -libc::ECANCELED && f.follows && !self.draining {
                // Never started: the read ahead of it in its chain failed or ended short.
                self.retry.push(idx);
                continue;
            }
            f.busy = false;
            self.free.push(idx);
            self.requests_in_flight -= f.members.len();
            if !f.follows {
                // A linked read's time includes its wait behind the reads ahead of it.
                self.stats.record_latency(f.started.elapsed());
            }
            let res = cqe.result();
            if res < 0 {
                self.stats.failed += 1;
                for m in &f.members {
                    self.ready.push_back(Completion::of(&m.req, Err(-res)));
                }
                continue;
            }
            // Hand each request the bytes of its covering read the SQE delivered, in file order.
            let (got, mut at, mut logical_sum) = (res as u64, 0u64, 0u64);
            let mut prev_full = false;
            for (i, m) in f.members.iter().enumerate() {
                let delivered = got.saturating_sub(at).min(m.iov_len);
                let mut phys = delivered;
                if m.shared_head {
                    if prev_full {
                        let p = &f.members[i - 1];
                        // SAFETY: both are covering ranges inside this source's windows
                        // (checked at submission), disjoint, and the read that filled the
                        // source block has completed.
                        unsafe { std::ptr::copy_nonoverlapping(p.dst.add((p.cov.len - ALIGN) as usize), m.dst, ALIGN as usize) };
                        phys += ALIGN;
                    } else {
                        phys = 0;
                    }
                }
                at += m.iov_len;
                prev_full = delivered == m.iov_len;
                let logical = phys.saturating_sub(m.cov.head).min(m.req.len);
                logical_sum += logical;
                if m.host {
                    self.stats.host_target_bytes += logical;
                }
                self.ready.push_back(Completion::of(&m.req, Ok(logical)));
            }
            self.stats.physical_bytes += got;
            self.stats.logical_bytes += logical_sum;
            self.stats.padding_bytes += got.saturating_sub(logical_sum);
        }
        drop(cq);
        if !self.retry.is_empty() {
            // Each on its own: nothing is linked behind a read that has already failed once.
            self.stats.relinked += self.retry.len() as u64;
            let mut retry = std::mem::take(&mut self.retry);
            if self.push_all(&retry, false).is_err() {
                // No room to submit them again: they fail, as reads that never happened.
                for &idx in &retry {
                    let f = &mut self.table[idx];
                    f.busy = false;
                    self.requests_in_flight -= f.members.len();
                    self.stats.failed += 1;
                    for m in &f.members {
                        self.ready.push_back(Completion::of(&m.req, Err(libc::ECANCELED)));
                    }
                    self.free.push(idx);
                }
            }
            retry.clear();
            self.retry = retry;
            self.ring.submit().map_err(|e| io_error(&e))?;
        }
        Ok(())
    }

    /// Queues one SQE per entry of `order` (filled, busy), all or none: chains of `link`ed
    /// entries are linked to the next SQE, so the order is the chains', one after the other.
    fn push_all(&mut self, order: &[usize], link: bool) -> Result<(), SourceError> {
        let room = |r: &mut IoUring| {
            let sq = r.submission();
            sq.capacity() - sq.len()
        };
        if room(&mut self.ring) < order.len() {
            self.ring.submit().map_err(|e| io_error(&e))?;
            if room(&mut self.ring) < order.len() {
                return Err(SourceError::Io { errno: libc::EBUSY });
            }
        }
        for &idx in order {
            let f = &mut self.table[idx];
            if !link {
                f.follows = false;
                f.tail = true;
                f.started = Instant::now();
            }
            self.chains += usize::from(f.tail);
            self.push(idx).expect("room was checked");
        }
        Ok(())
    }

    /// Queues one SQE for `table[idx]`, already filled; `Err` only when the queue is full.
    fn push(&mut self, idx: usize) -> Result<(), ()> {
        let f = &self.table[idx];
        let first = f.members[0];
        // Checked when the request was staged: its shard is one of ours.
        let (shard, offset) = super::shard_offset(first.cov.offset);
        macro_rules! read {
            ($fd:expr) => {
                if f.members.len() == 1 && !first.host && self.registered {
                    opcode::ReadFixed::new($fd, first.dst, first.iov_len as u32, first.req.window as u16).offset(offset).build()
                } else if f.members.len() == 1 {
                    opcode::Read::new($fd, first.dst, first.iov_len as u32).offset(offset).build()
                } else {
                    opcode::Readv::new($fd, f.iovecs.as_ptr(), f.iovecs.len() as u32).offset(offset).build()
                }
            };
        }
        let sqe =
            if self.files_registered { read!(types::Fixed(shard as u32)) } else { read!(types::Fd(self.files.files()[shard].as_raw_fd())) }
                .user_data(idx as u64);
        let sqe = if f.tail { sqe } else { sqe.flags(io_uring::squeue::Flags::IO_LINK) };
        // SAFETY: the destinations stay valid and untouched by us until the completion is
        // reaped; the iovecs live in the table entry until then.
        unsafe { self.ring.submission().push(&sqe).map_err(|_| ()) }
    }

    /// Fills an entry for `run` (requests adjacent in the file, at most `MAX_VECTOR`) and stages
    /// it. Where no entry is free, what is staged goes out first and completions are reaped;
    /// `done` counts the requests that went out.
    fn stage_run(&mut self, run: &[Pending], done: &mut usize) -> Result<(), SourceError> {
        if self.free.is_empty() {
            *done += self.flush().map_err(|(n, e)| {
                *done += n;
                e
            })?;
        }
        while self.free.is_empty() {
            self.reap(true)?;
        }
        let idx = self.free.pop().expect("a free entry");
        let f = &mut self.table[idx];
        f.members.clear();
        f.iovecs.clear();
        for &Pending { req, cov, dst, host, shared_head } in run {
            let skip = if shared_head { ALIGN } else { 0 };
            let m = Member { req, cov, iov_len: cov.len - skip, shared_head, dst, host };
            // SAFETY: inside the covering range (cov.len > ALIGN when shared_head).
            let base = unsafe { dst.add(skip as usize) };
            f.iovecs.push(libc::iovec { iov_base: base.cast(), iov_len: m.iov_len as usize });
            f.members.push(m);
        }
        f.busy = true;
        self.staged.push(idx);
        Ok(())
    }

    /// Gives the staged entries to the kernel as at most `depth` chains, less those still
    /// running (at least one): the entries in ticket order, dealt to the chains in turn, so the
    /// reads needed first start first. Returns the requests that went out; `Err((n, e))`: `n`
    /// of them did (all, where only the final enter failed: they wait for the next one).
    fn flush(&mut self) -> Result<usize, (usize, SourceError)> {
        if self.staged.is_empty() {
            return Ok(0);
        }
        let mut staged = std::mem::take(&mut self.staged);
        staged.sort_unstable_by_key(|&i| self.table[i].members.iter().map(|m| m.req.ticket).min());
        let k = staged.len().min(self.depth.saturating_sub(self.chains).max(1));
        // Chain c holds staged[c], staged[c + k], ...: pushed one chain after the other.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        for c in 0..k {
            for j in (c..staged.len()).step_by(k) {
                let f = &mut self.table[staged[j]];
                f.follows = j >= k;
                f.tail = j + k >= staged.len();
                order.push(staged[j]);
            }
        }
        let pushed = self.push_all(&order, true);
        self.order = order;
        if let Err(e) = pushed {
            // Never queued: give the entries back so drop does not wait for them.
            for &i in &staged {
                self.table[i].busy = false;
                self.free.push(i);
            }
            staged.clear();
            self.staged = staged;
            return Err((0, e));
        }
        let now = Instant::now();
        let mut n_requests = 0;
        for &i in &staged {
            let f = &mut self.table[i];
            f.started = now;
            let (n, host) = (f.members.len(), f.members.iter().filter(|m| m.host).count());
            n_requests += n;
            self.stats.sqes += 1;
            self.stats.linked_sqes += u64::from(f.follows);
            if n > 1 {
                self.stats.coalesced_sqes += 1;
                self.stats.coalesced_requests += n as u64;
            }
            self.stats.host_target_requests += host as u64;
        }
        staged.clear();
        self.staged = staged;
        // Queued: their completions will come (a failed enter leaves them for the next one).
        self.requests_in_flight += n_requests;
        self.stats.submissions += n_requests as u64;
        let outstanding = self.outstanding() as u64;
        self.stats.peak_outstanding = self.stats.peak_outstanding.max(outstanding);
        self.ring.submit().map_err(|e| (n_requests, io_error(&e)))?;
        Ok(n_requests)
    }

    /// Checks `reads`, gathers adjacent ones into runs, stages each run as one SQE and gives
    /// them to the kernel together.
    ///
    /// # Safety
    /// As [`Source::submit_vectored`].
    unsafe fn submit_runs(
        &mut self,
        reads: &[(ReadRequest, Option<NonNull<u8>>)],
        run: &mut Vec<Pending>,
    ) -> Result<(), (usize, SourceError)> {
        let mut done = 0usize;
        let r = self.gather(reads, run, &mut done);
        // What was staged goes out, even behind a refused request: the Plan counts it submitted.
        let flushed = self.flush();
        match (r, flushed) {
            (Ok(()), Ok(_)) => Ok(()),
            (Err(e), Ok(n)) | (Err(e), Err((n, _))) => Err((done + n, e)),
            (Ok(()), Err((n, e))) => Err((done + n, e)),
        }
    }

    /// Stages the runs of `reads`; `done` counts the requests that went out meanwhile.
    ///
    /// # Safety
    /// As [`Source::submit_vectored`].
    unsafe fn gather(
        &mut self,
        reads: &[(ReadRequest, Option<NonNull<u8>>)],
        run: &mut Vec<Pending>,
        done: &mut usize,
    ) -> Result<(), SourceError> {
        for &(req, into) in reads {
            let cov = check_request(&req, self.n_windows(), self.window_size)?;
            self.files.at(cov.offset)?;
            let (dst, host) = match into {
                Some(p) if !(p.as_ptr() as u64).is_multiple_of(ALIGN) => {
                    return Err(SourceError::HostTarget { detail: "the target is not aligned to 4096 bytes" })
                }
                Some(p) => (p.as_ptr(), true),
                // SAFETY: the covering read lies inside the window (checked above).
                None => (unsafe { self.windows[req.window as usize].as_ptr().add(req.window_offset as usize) }, false),
            };
            // Joins the run when its covering read starts where the previous one ends, or (two
            // windows, unaligned neighbours) on the previous one's last block.
            let joins = run.last().and_then(|prev| {
                let end = prev.cov.offset + prev.cov.len;
                if run.len() >= MAX_VECTOR {
                    None
                } else if cov.offset == end {
                    Some(false)
                } else if !host && !prev.host && cov.offset + ALIGN == end && cov.len > ALIGN {
                    Some(true)
                } else {
                    None
                }
            });
            let pending = Pending { req, cov, dst, host, shared_head: joins == Some(true) };
            if joins.is_none() && !run.is_empty() {
                self.stage_run(run, done)?;
                run.clear();
            }
            run.push(pending);
        }
        if !run.is_empty() {
            self.stage_run(run, done)?;
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
        // SAFETY: no host target.
        unsafe { self.submit_vectored(&[(req, None)]) }.map_err(|(_, e)| e)
    }

    fn reads_into_host(&self) -> bool {
        true
    }

    fn room(&self) -> usize {
        self.free.len()
    }

    unsafe fn submit_vectored(&mut self, reads: &[(ReadRequest, Option<NonNull<u8>>)]) -> Result<(), (usize, SourceError)> {
        if self.undrained {
            return Err((0, SourceError::Undrained));
        }
        let mut run = std::mem::take(&mut self.run);
        let r = self.submit_runs(reads, &mut run);
        run.clear();
        self.run = run;
        r
    }

    fn wait(&mut self) -> Result<Completion, SourceError> {
        if self.ready.is_empty() {
            if self.busy_entries() == 0 {
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
        self.requests_in_flight + self.ready.len()
    }

    fn in_flight(&self) -> usize {
        self.requests_in_flight
    }

    fn poll_ready(&mut self) -> bool {
        // A failed reap is not swallowed: the next wait reaps again and returns it.
        if self.ready.is_empty() && self.busy_entries() > 0 {
            let _ = self.reap(false);
        }
        !self.ready.is_empty()
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

    fn drain(&mut self) -> Result<(), SourceError> {
        if self.undrained {
            return Err(SourceError::Undrained);
        }
        // Reads still in flight write into the windows and host targets: wait for every one.
        self.draining = true;
        let r = self.drain_all();
        self.draining = false;
        r
    }

    fn undrained(&self) -> bool {
        self.undrained
    }
}

impl UringSource {
    fn drain_all(&mut self) -> Result<(), SourceError> {
        while self.busy_entries() > 0 {
            if let Err(e) = self.reap(true) {
                let in_flight = self.busy_entries();
                let host = self.table.iter().filter(|f| f.busy).flat_map(|f| &f.members).filter(|m| m.host).count();
                let bytes: usize = self.windows.iter().map(AlignedBuf::len).sum();
                log::warn!(
                    "io_uring could not be drained ({e}) with {in_flight} reads in flight ({host} into host targets); leaking its {} windows ({bytes} bytes) rather than freeing memory the kernel may still write",
                    self.windows.len()
                );
                self.undrained = true;
                return Err(e);
            }
        }
        self.ready.clear();
        Ok(())
    }
}

impl Drop for UringSource {
    fn drop(&mut self) {
        // An owner that lent host targets drains first and learns the outcome; this is the
        // last resort for the windows.
        if self.drain().is_err() {
            // The kernel may still write into the windows: they are leaked, never freed, and so
            // are the iovecs its vectored reads were prepared from.
            for w in std::mem::take(&mut self.windows) {
                std::mem::forget(w);
            }
            std::mem::forget(std::mem::take(&mut self.table));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::ObjectId;
    use std::io::Write;

    fn req(ticket: u64, offset: u64, len: u64, window: u32) -> ReadRequest {
        ReadRequest {
            ticket,
            object: ObjectId { layer: 0, expert: ticket as u32 },
            extent: 0,
            offset,
            len,
            window,
            window_offset: 0,
            epoch: 1,
            generation: 1,
        }
    }

    #[test]
    fn drain_returns_once_every_read_has_landed() {
        let block = 8 * ALIGN;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..4 * block as u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        f.as_file().sync_all().unwrap();
        let mut s = UringSource::open(f.path(), 2, block, 4).unwrap();
        let host = AlignedBuf::new(block).unwrap();
        let target = NonNull::new(host.as_ptr()).unwrap();
        let reads = [(req(1, 0, block, 0), None), (req(2, block, block, 1), Some(target)), (req(3, 3 * block, block, 1), None)];
        // SAFETY: `host` outlives the source's reads (drained below) and is not touched meanwhile.
        unsafe { s.submit_vectored(&reads) }.unwrap();
        assert_eq!(s.outstanding(), 3);
        s.drain().unwrap();
        assert!(!s.undrained());
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.wait(), Err(SourceError::NothingOutstanding));
        assert_eq!(s.stats().completions, 0, "drained completions are discarded, not returned");
        assert!(host.as_slice() == &data[block as usize..2 * block as usize]);
        assert!(s.window(0) == &data[..block as usize]);
        assert!(s.window(1) == &data[3 * block as usize..]);
        s.drain().unwrap();
    }

    #[test]
    fn a_batch_deeper_than_the_depth_goes_out_as_linked_chains_and_a_short_read_breaks_only_its_own() {
        let block = 4 * ALIGN;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        // Ten blocks and a half: the last covering read ends past the end of the file.
        let data: Vec<u8> = (0..(10 * block + block / 2) as u32).map(|i| (i * 13 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        f.as_file().sync_all().unwrap();
        let mut s = UringSource::open(f.path(), 6, block, 2).unwrap();
        assert!(s.room() >= 6, "room for every window's reads at once, beyond the depth");
        // Six reads of scattered blocks (none adjacent, so six SQEs); the lowest ticket is the
        // file's short tail, at the head of a chain that carries other reads behind it.
        let at = [10, 0, 2, 4, 6, 8];
        let reads: Vec<_> = at.iter().enumerate().map(|(w, &b)| (req(w as u64 + 1, b * block, block, w as u32), None)).collect();
        // SAFETY: no host target.
        unsafe { s.submit_vectored(&reads) }.unwrap();
        let mut got = Vec::new();
        while s.outstanding() > 0 {
            got.push(s.wait().unwrap());
        }
        got.sort_by_key(|c| c.ticket);
        assert_eq!(got.len(), 6);
        assert_eq!(got[0].result, Ok(block / 2), "the tail is short");
        for (c, &b) in got.iter().zip(&at).skip(1) {
            assert_eq!(c.result, Ok(block), "{c:?}");
            let w = s.window(c.window);
            assert!(w[..block as usize] == data[(b * block) as usize..((b + 1) * block) as usize], "window {} holds block {b}", c.window);
        }
        let st = s.stats();
        // Two chains of three: the second and third SQE of each wait for the one ahead.
        assert_eq!((st.sqes, st.linked_sqes, st.submissions, st.completions), (6, 4, 6, 6), "{st:?}");
        assert_eq!(st.relinked, 2, "the reads behind the short tail were cancelled and went out again: {st:?}");
        s.drain().unwrap();
    }
}
