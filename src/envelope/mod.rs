//! The storage read envelope: cold O_DIRECT reads through io_uring by block size and queue
//! depth. O_DIRECT keeps the page cache from posing as the device; the best cell is the device
//! ceiling that performance reports are compared against. A run reads an expert again tokens
//! after it last did, and whatever sits in front of the device (a virtual disk's host cache, a
//! controller's) may serve that faster than a first read: with `Rereads::Measured` each cell's
//! region is read a second time straight after, so that the ceiling bounds those reads too.
//! A cell's reads reach the kernel as one of F's [`Pattern`]s: single reads, vectored reads of
//! neighbouring blocks, or chains of linked reads, so the ceiling bounds each way F reads.
//! Reads land in a [`Landing`] area as large as the bytes a cell reads (up to
//! [`LANDING_MAX`]), never in a few buffers used over and over: where the device's host copies
//! the bytes (a virtual disk), reads into a few reused buffers, warm in its caches, ran about
//! 20 % faster than the same reads into a run's slot pools.

pub mod profile;

use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

pub const ALIGN: usize = 4096;
pub const BLOCK_SIZES: &[usize] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
pub const DEPTHS: &[usize] = &[1, 2, 4, 8, 16, 32];

/// Blocks one vectored read carries in a [`Pattern::Vectored`] cell.
pub const VECTOR: usize = 4;
/// Reads per chain in a [`Pattern::Linked`] cell.
pub const CHAIN: usize = 4;

/// The largest landing area: far beyond any cache in front of memory.
pub const LANDING_MAX: u64 = 1 << 30;

/// Memory reads land in, touched once before any read is timed (as a run's slots are by the
/// reads before), handed out in places of one read's size in turn: a place is written again
/// only once every other place was, or, when reads in flight hold them, as soon as one is free.
pub struct Landing {
    buf: crate::source::AlignedBuf,
}

/// One read size's places in a [`Landing`], free ones oldest first.
pub struct Places<'a> {
    landing: &'a Landing,
    unit: usize,
    free: VecDeque<usize>,
}

impl Landing {
    /// An area of `bytes` (at most [`LANDING_MAX`]) but room for at least `at_least`.
    pub fn new(bytes: u64, at_least: u64) -> Result<Landing> {
        let len = bytes.min(LANDING_MAX).max(at_least).max(ALIGN as u64);
        let mut buf = crate::source::AlignedBuf::huge(len)?;
        buf.as_mut_slice().fill(0);
        Ok(Landing { buf })
    }

    pub fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The area cut into places of `unit` bytes.
    pub fn places(&self, unit: usize) -> Places<'_> {
        let n = self.buf.len() / unit.max(1);
        Places { landing: self, unit, free: (0..n).collect() }
    }
}

impl Places<'_> {
    /// The free place written longest ago, or none while reads in flight hold every place.
    pub fn take(&mut self) -> Option<(usize, *mut u8)> {
        let i = self.free.pop_front()?;
        // SAFETY: place `i` lies inside the landing area (`i < len / unit`).
        Some((i, unsafe { self.landing.buf.as_ptr().add(i * self.unit) }))
    }

    /// Place `i`'s read has completed.
    pub fn give(&mut self, i: usize) {
        self.free.push_back(i);
    }

    pub fn len(&self) -> usize {
        self.landing.buf.len() / self.unit.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a cell's reads reach the kernel, as F sends them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// One read per block, `depth` in flight.
    #[default]
    Plain,
    /// One READV of [`VECTOR`] neighbouring blocks per submission, `depth` in flight: F reads
    /// neighbouring extents (experts e and e+1 of a tensor) so.
    Vectored,
    /// `depth` chains of [`CHAIN`] linked reads: the kernel starts a chain's next read when the
    /// one before completes, as F queues a batch deeper than its depth.
    Linked,
}

impl Pattern {
    pub const ALL: [Pattern; 3] = [Pattern::Plain, Pattern::Vectored, Pattern::Linked];

    fn is_plain(&self) -> bool {
        *self == Pattern::Plain
    }

    /// Blocks per submission and submissions per chain.
    fn shape(self) -> (usize, usize) {
        match self {
            Pattern::Plain => (1, 1),
            Pattern::Vectored => (VECTOR, 1),
            Pattern::Linked => (1, CHAIN),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub block_bytes: usize,
    pub depth: usize,
    /// How the reads were submitted (absent: one read per block).
    #[serde(default, skip_serializing_if = "Pattern::is_plain")]
    pub pattern: Pattern,
    pub bytes: u64,
    pub seconds: f64,
    pub mib_per_s: f64,
    pub iops: f64,
    /// A second read of the region the cell before it just read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reread: bool,
    /// Reads per burst, each burst drained before the next goes out, as a token's layer waits
    /// for its router (absent: reads kept in flight throughout).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub burst_reads: usize,
    /// Blocks per vectored read (absent: [`VECTOR`], or not vectored).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vector: usize,
    /// In bursts: how long after its burst went out a read was seen landed, on average (absent
    /// without bursts). The reader of a burst can use its first reads this soon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_s: Option<f64>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Whether each cell's region is read a second time, as a cell of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rereads {
    Measured,
    Skipped,
}

#[derive(Debug, Serialize)]
pub struct Envelope {
    pub file_bytes: u64,
    pub bytes_per_cell: u64,
    /// Bytes of memory the reads landed in ([`Landing`]).
    pub landing_bytes: u64,
    pub cells: Vec<Cell>,
    pub ceiling: Cell,
}

/// How a cell's reads go out: `depth` submissions (or chains) in flight, submitted as `pattern`
/// says (a vectored read of `vector` blocks, 0 for [`VECTOR`]), in bursts of `burst_reads`
/// submissions each drained before the next (0: no bursts).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub depth: usize,
    pub pattern: Pattern,
    pub vector: usize,
    pub burst_reads: usize,
}

impl Shape {
    /// Blocks per submission and submissions per chain.
    fn per_sqe_and_chain(&self) -> (usize, usize) {
        match self.pattern {
            Pattern::Vectored if self.vector > 0 => (self.vector, 1),
            p => p.shape(),
        }
    }
}

/// Reads `bytes` from `start` in `block`-sized blocks, as `shape` says, each into the next free
/// place of `landing`.
fn measure(file: &File, file_len: u64, landing: &Landing, start: u64, bytes: u64, block: usize, shape: Shape) -> Result<Cell> {
    let Shape { depth, pattern, burst_reads, .. } = shape;
    let (per_sqe, chain) = shape.per_sqe_and_chain();
    let unit = block * per_sqe;
    let slots = depth * chain;
    let mut ring = IoUring::new(slots.next_power_of_two().max(2) as u32).context("io_uring unavailable")?;
    let mut places = landing.places(unit);
    if places.len() < slots {
        bail!("a landing area of {} bytes holds {} reads of {unit} bytes, fewer than the {slots} in flight", landing.len(), places.len());
    }
    // The iovecs of each submission in flight (a READV's blocks lie side by side in its place).
    let mut iovecs: Vec<libc::iovec> = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: block }; slots * per_sqe];
    let mut held = vec![0usize; slots];
    let usable = file_len / ALIGN as u64 * ALIGN as u64;
    let span = usable.saturating_sub(unit as u64).max(ALIGN as u64);
    let n_units = (bytes / unit as u64).max(1);
    let fd = types::Fd(file.as_raw_fd());
    // A chain's submissions complete one after the other; it is free again when all have.
    let (mut next, mut done, mut read) = (0u64, 0u64, 0u64);
    let mut pending = vec![0usize; depth];
    let mut free: Vec<usize> = (0..depth).collect();
    let burst = if burst_reads == 0 { usize::MAX } else { burst_reads };
    let mut burst_left = burst;
    let t = Instant::now();
    // When the burst went out, and the sum over reads of how long after it each was seen landed.
    let (mut burst_start, mut landed_s) = (t, 0f64);
    while done < n_units {
        while next < n_units {
            if burst_left == 0 {
                // The burst is out: the next starts once every read of it has landed.
                if done < next {
                    break;
                }
                burst_left = burst;
                burst_start = Instant::now();
            }
            let Some(c) = free.pop() else { break };
            let len = chain.min((n_units - next) as usize).min(burst_left);
            burst_left -= len;
            for k in 0..len {
                let slot = c * chain + k;
                let (place, at) = places.take().expect("more places than reads in flight");
                held[slot] = place;
                for (j, v) in iovecs[slot * per_sqe..(slot + 1) * per_sqe].iter_mut().enumerate() {
                    // SAFETY: the place holds `per_sqe` blocks.
                    v.iov_base = unsafe { at.add(j * block) }.cast();
                }
                let off = (start + next * unit as u64) % span / ALIGN as u64 * ALIGN as u64;
                let sqe = match pattern {
                    Pattern::Vectored => opcode::Readv::new(fd, iovecs[slot * per_sqe..].as_ptr(), per_sqe as u32).offset(off).build(),
                    _ => opcode::Read::new(fd, at, block as u32).offset(off).build(),
                };
                let sqe = sqe.user_data(slot as u64);
                let sqe = if k + 1 < len { sqe.flags(io_uring::squeue::Flags::IO_LINK) } else { sqe };
                // SAFETY: the buffers and iovecs stay alive and untouched until the completion is
                // reaped (the ring has room for every slot: at most `depth` chains are queued).
                unsafe { ring.submission().push(&sqe).context("submission queue full")? };
                next += 1;
            }
            pending[c] = len;
        }
        ring.submit_and_wait(1)?;
        let completions: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        let seen = burst_start.elapsed().as_secs_f64();
        for (slot, res) in completions {
            if res < 0 {
                bail!("read failed: {}", std::io::Error::from_raw_os_error(-res));
            }
            read += res as u64;
            done += 1;
            landed_s += seen;
            places.give(held[slot as usize]);
            let c = slot as usize / chain;
            pending[c] -= 1;
            if pending[c] == 0 {
                free.push(c);
            }
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(Cell {
        block_bytes: block,
        depth,
        pattern,
        bytes: read,
        seconds,
        mib_per_s: read as f64 / (1 << 20) as f64 / seconds.max(1e-9),
        iops: (done * per_sqe as u64) as f64 / seconds.max(1e-9),
        reread: false,
        burst_reads,
        vector: if pattern == Pattern::Vectored { per_sqe } else { 0 },
        landing_s: (burst_reads > 0).then(|| landed_s / done.max(1) as f64),
    })
}

/// One cell per entry of `depths`, in order, of `block`-sized reads submitted as `shape` says
/// (at each depth of `depths`, not its own), each over its own region of the file; and the
/// bytes of the area they landed in.
pub fn measure_cells(path: &Path, bytes_per_cell: u64, block: usize, depths: &[usize], shape: Shape) -> Result<(Vec<Cell>, u64)> {
    let file = crate::source::open_direct(path)?;
    let file_len = file.metadata()?.len();
    if file_len < (4 << 20) {
        bail!("{}: {} bytes is too small to measure (need at least 4 MiB)", path.display(), file_len);
    }
    let (per_sqe, chain) = shape.per_sqe_and_chain();
    let landing = Landing::new(bytes_per_cell, (block * per_sqe * chain * depths.iter().max().copied().unwrap_or(1)) as u64)?;
    let mut cells = Vec::with_capacity(depths.len());
    for (i, &depth) in depths.iter().enumerate() {
        let start = i as u64 * bytes_per_cell;
        let cell = measure(&file, file_len, &landing, start, bytes_per_cell, block, Shape { depth, ..shape })
            .with_context(|| format!("{}: block {block} depth {depth} {:?}", path.display(), shape.pattern))?;
        cells.push(cell);
    }
    Ok((cells, landing.len()))
}

/// Measures every block size × depth × pattern cell, each over its own region of the file when
/// it is large enough, so no cell rereads what another just read; with `Rereads::Measured`,
/// each region again straight after, as a cell of its own.
pub fn measure_envelope(
    path: &Path,
    bytes_per_cell: u64,
    blocks: &[usize],
    depths: &[usize],
    patterns: &[Pattern],
    rereads: Rereads,
) -> Result<Envelope> {
    let file = crate::source::open_direct(path)?;
    let file_len = file.metadata()?.len();
    if file_len < (4 << 20) {
        bail!("{}: {} bytes is too small to measure (need at least 4 MiB)", path.display(), file_len);
    }
    let largest = blocks.iter().max().copied().unwrap_or(ALIGN) * VECTOR.max(CHAIN) * depths.iter().max().copied().unwrap_or(1);
    let landing = Landing::new(bytes_per_cell, largest as u64)?;
    let mut cells = Vec::new();
    let mut start = 0u64;
    for &block in blocks {
        for &depth in depths {
            for &pattern in patterns {
                let what = format!("{}: block {block} depth {depth} {pattern:?}", path.display());
                let shape = Shape { depth, pattern, vector: VECTOR, burst_reads: 0 };
                let cell = measure(&file, file_len, &landing, start, bytes_per_cell, block, shape).with_context(|| what.clone())?;
                cells.push(cell);
                if rereads == Rereads::Measured {
                    let again = measure(&file, file_len, &landing, start, bytes_per_cell, block, shape)
                        .with_context(|| format!("{what}, read again"))?;
                    cells.push(Cell { reread: true, ..again });
                }
                start += bytes_per_cell;
            }
        }
    }
    let ceiling = cells.iter().max_by(|a, b| a.mib_per_s.total_cmp(&b.mib_per_s)).cloned().context("no cells")?;
    Ok(Envelope { file_bytes: file_len, bytes_per_cell, landing_bytes: landing.len(), cells, ceiling })
}

/// CSV of the envelope cells.
pub fn to_csv(e: &Envelope) -> String {
    let mut s = String::from("block_bytes,depth,bytes,seconds,mib_per_s,iops,reread,pattern\n");
    for c in &e.cells {
        let pattern = serde_json::to_value(c.pattern).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        s.push_str(&format!(
            "{},{},{},{:.6},{:.1},{:.1},{},{pattern}\n",
            c.block_bytes, c.depth, c.bytes, c.seconds, c.mib_per_s, c.iops, c.reread
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_land_in_every_place_before_any_is_written_again() {
        let landing = Landing::new(64 << 10, 0).unwrap();
        assert_eq!(landing.len(), 64 << 10, "already a whole number of pages");
        let mut places = landing.places(16 << 10);
        assert_eq!(places.len(), 4);
        let (a, pa) = places.take().unwrap();
        let (b, pb) = places.take().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pb as usize - pa as usize, 16 << 10);
        places.give(a);
        // Places 2 and 3 were never written: they come before 0, written moments ago.
        assert_eq!(places.take().unwrap().0, 2);
        assert_eq!(places.take().unwrap().0, 3);
        assert_eq!(places.take().unwrap().0, 0);
        assert!(places.take().is_none(), "place 1 is still held by its read");
        places.give(b);
        assert_eq!(places.take().unwrap().0, 1);
        // Room for the reads in flight is kept however small the area asked for.
        assert!(Landing::new(4096, 1 << 20).unwrap().len() >= 1 << 20);
        assert!(Landing::new(u64::MAX, 0).unwrap().len() <= LANDING_MAX + (2 << 20));
    }

    /// A file of `bytes` in a directory of its own (kept while the first is held).
    fn data_file(bytes: usize) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("data");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; bytes]).unwrap();
        f.sync_all().unwrap();
        (dir, p)
    }

    #[test]
    fn envelope_reads_every_byte_it_claims() {
        let (_dir, p) = data_file(8 << 20);
        let e = measure_envelope(&p, 1 << 20, &[4096, 65536], &[1, 4], &[Pattern::Plain], Rereads::Skipped).unwrap();
        assert_eq!(e.cells.len(), 4);
        for c in &e.cells {
            assert_eq!(c.bytes, 1 << 20, "{c:?}");
            assert!(c.mib_per_s > 0.0 && !c.reread);
        }
        assert!(e.cells.iter().all(|c| c.mib_per_s <= e.ceiling.mib_per_s));
        assert_eq!(to_csv(&e).lines().count(), 5);
        // Each region read again straight after, as a cell of its own that counts toward the ceiling.
        let e = measure_envelope(&p, 1 << 20, &[4096, 65536], &[1, 4], &[Pattern::Plain], Rereads::Measured).unwrap();
        assert_eq!(e.cells.len(), 8);
        for pair in e.cells.chunks(2) {
            assert!(!pair[0].reread && pair[1].reread, "{pair:?}");
            assert_eq!((pair[0].block_bytes, pair[0].depth, pair[0].bytes), (pair[1].block_bytes, pair[1].depth, pair[1].bytes));
        }
        assert!(e.cells.iter().all(|c| c.mib_per_s <= e.ceiling.mib_per_s));
        assert_eq!(to_csv(&e).lines().filter(|l| l.ends_with(",true,plain")).count(), 4);
    }

    #[test]
    fn every_pattern_reads_every_byte_it_claims_in_its_own_cell() {
        let (_dir, p) = data_file(16 << 20);
        // 1 MiB a cell: 16 vectored reads of 4 x 16 KiB, 64 linked reads in chains of 4, and a
        // count that leaves the last chain short (5 reads at depth 2: chains of 4 and 1).
        let e = measure_envelope(&p, 1 << 20, &[16 << 10], &[1, 3], &Pattern::ALL, Rereads::Measured).unwrap();
        assert_eq!(e.cells.len(), 2 * 3 * 2);
        for c in &e.cells {
            assert_eq!(c.bytes, 1 << 20, "{c:?}");
            assert_eq!((c.iops * c.seconds).round(), 64.0, "{c:?}: blocks read");
        }
        let patterns: Vec<Pattern> = e.cells.iter().step_by(2).map(|c| c.pattern).collect();
        assert_eq!(patterns, [Pattern::ALL, Pattern::ALL].concat());
        assert_eq!(to_csv(&e).lines().filter(|l| l.ends_with(",vectored")).count(), 4);
        let e = measure_envelope(&p, 5 * 4096, &[4096], &[2], &[Pattern::Linked], Rereads::Skipped).unwrap();
        assert_eq!(e.cells[0].bytes, 5 * 4096);
        // A plain cell's record keeps its earlier form: no pattern field.
        let plain = serde_json::to_value(&e.cells[0]).unwrap();
        assert_eq!(plain["pattern"], "linked");
        let old: Cell =
            serde_json::from_str(r#"{"block_bytes":4096,"depth":1,"bytes":1,"seconds":1.0,"mib_per_s":1.0,"iops":1.0}"#).unwrap();
        assert_eq!(old.pattern, Pattern::Plain);
        assert!(serde_json::to_value(&old).unwrap().get("pattern").is_none());
        assert!(serde_json::to_value(&old).unwrap().get("burst_reads").is_none());
        assert!(serde_json::to_value(&old).unwrap().get("landing_s").is_none());
    }

    #[test]
    fn a_cell_read_in_bursts_reads_every_byte_and_says_its_burst() {
        let (_dir, p) = data_file(8 << 20);
        // 40 reads in bursts of 3 (the last burst short) at depths below, at and above a burst;
        // linked chains cut at a burst's end.
        for pattern in [Pattern::Plain, Pattern::Linked] {
            let shape = Shape { depth: 0, pattern, vector: 0, burst_reads: 3 };
            let (cells, _) = measure_cells(&p, 40 * 4096, 4096, &[1, 3, 8], shape).unwrap();
            for c in &cells {
                assert_eq!((c.bytes, c.burst_reads, c.pattern, c.vector), (40 * 4096, 3, pattern, 0), "{c:?}");
                assert_eq!((c.iops * c.seconds).round(), 40.0, "{c:?}: blocks read");
                // A read lands after its burst goes out and before the burst ends: no later, on
                // average, than 3 reads a burst allow (each burst takes its share of the cell).
                let landing = c.landing_s.unwrap();
                assert!(landing > 0.0 && landing * 40.0 <= 3.0 * c.seconds, "{c:?}");
            }
            assert_eq!(serde_json::to_value(&cells[0]).unwrap()["burst_reads"], 3);
        }
        // Vectored reads of 3 blocks (a merged expert's gate, up and down), 14 of them, the last
        // short of the file's region: every block counted once.
        let shape = Shape { depth: 0, pattern: Pattern::Vectored, vector: 3, burst_reads: 4 };
        let (cells, _) = measure_cells(&p, 42 * 4096, 4096, &[2, 8], shape).unwrap();
        for c in &cells {
            assert_eq!((c.bytes, c.vector), (42 * 4096, 3), "{c:?}");
            assert_eq!((c.iops * c.seconds).round(), 42.0, "{c:?}: blocks read");
        }
    }
}
