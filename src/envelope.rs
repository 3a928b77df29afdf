//! The storage read envelope: cold O_DIRECT reads through io_uring by block size and queue
//! depth. O_DIRECT keeps the page cache from posing as the device; the best cell is the device
//! ceiling that performance reports are compared against. A run reads an expert again tokens
//! after it last did, and whatever sits in front of the device (a virtual disk's host cache, a
//! controller's) may serve that faster than a first read: with `Rereads::Measured` each cell's
//! region is read a second time straight after, so that the ceiling bounds those reads too.
//! A cell's reads reach the kernel as one of F's [`Pattern`]s: single reads, vectored reads of
//! neighbouring blocks, or chains of linked reads, so the ceiling bounds each way F reads.

use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use serde::{Deserialize, Serialize};
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
    pub cells: Vec<Cell>,
    pub ceiling: Cell,
}

/// Reads `bytes` from `start` in `block`-sized blocks, `depth` submissions (or chains) in
/// flight, submitted as `pattern` says.
fn measure(file: &File, file_len: u64, start: u64, bytes: u64, block: usize, depth: usize, pattern: Pattern) -> Result<Cell> {
    let (per_sqe, chain) = pattern.shape();
    let unit = block * per_sqe;
    let slots = depth * chain;
    let mut ring = IoUring::new(slots.next_power_of_two().max(2) as u32).context("io_uring unavailable")?;
    // One huge-page buffer cut into a buffer per submission, as the Plan's slots and the replay.
    let buf = crate::source::AlignedBuf::huge((unit * slots) as u64)?;
    // SAFETY: each part lies inside `buf`, which outlives every read.
    let iovecs: Vec<libc::iovec> =
        (0..slots * per_sqe).map(|i| libc::iovec { iov_base: unsafe { buf.as_ptr().add(i * block) }.cast(), iov_len: block }).collect();
    let usable = file_len / ALIGN as u64 * ALIGN as u64;
    let span = usable.saturating_sub(unit as u64).max(ALIGN as u64);
    let n_units = (bytes / unit as u64).max(1);
    let fd = types::Fd(file.as_raw_fd());
    // A chain's submissions complete one after the other; it is free again when all have.
    let (mut next, mut done, mut read) = (0u64, 0u64, 0u64);
    let mut pending = vec![0usize; depth];
    let mut free: Vec<usize> = (0..depth).collect();
    let t = Instant::now();
    while done < n_units {
        while next < n_units {
            let Some(c) = free.pop() else { break };
            let len = chain.min((n_units - next) as usize);
            for k in 0..len {
                let slot = c * chain + k;
                let off = (start + next * unit as u64) % span / ALIGN as u64 * ALIGN as u64;
                let sqe = match pattern {
                    Pattern::Vectored => opcode::Readv::new(fd, iovecs[slot * per_sqe..].as_ptr(), per_sqe as u32).offset(off).build(),
                    _ => opcode::Read::new(fd, iovecs[slot].iov_base.cast(), block as u32).offset(off).build(),
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
        for (slot, res) in completions {
            if res < 0 {
                bail!("read failed: {}", std::io::Error::from_raw_os_error(-res));
            }
            read += res as u64;
            done += 1;
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
    })
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
    let mut cells = Vec::new();
    let mut start = 0u64;
    for &block in blocks {
        for &depth in depths {
            for &pattern in patterns {
                let what = format!("{}: block {block} depth {depth} {pattern:?}", path.display());
                let cell = measure(&file, file_len, start, bytes_per_cell, block, depth, pattern).with_context(|| what.clone())?;
                cells.push(cell);
                if rereads == Rereads::Measured {
                    let again = measure(&file, file_len, start, bytes_per_cell, block, depth, pattern)
                        .with_context(|| format!("{what}, read again"))?;
                    cells.push(Cell { reread: true, ..again });
                }
                start += bytes_per_cell;
            }
        }
    }
    let ceiling = cells.iter().max_by(|a, b| a.mib_per_s.total_cmp(&b.mib_per_s)).cloned().context("no cells")?;
    Ok(Envelope { file_bytes: file_len, bytes_per_cell, cells, ceiling })
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
    fn envelope_reads_every_byte_it_claims() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("data");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; 8 << 20]).unwrap();
        f.sync_all().unwrap();
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
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("data");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; 16 << 20]).unwrap();
        f.sync_all().unwrap();
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
    }
}
