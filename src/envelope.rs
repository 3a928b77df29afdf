//! The storage read envelope: cold O_DIRECT reads through io_uring by block size and queue
//! depth. O_DIRECT keeps the page cache from posing as the device; the best cell is the device
//! ceiling that performance reports are compared against. A run reads an expert again tokens
//! after it last did, and whatever sits in front of the device (a virtual disk's host cache, a
//! controller's) may serve that faster than a first read: with `Rereads::Measured` each cell's
//! region is read a second time straight after, so that the ceiling bounds those reads too.

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub block_bytes: usize,
    pub depth: usize,
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

/// Reads `bytes` from `start` in `block`-sized reads with at most `depth` in flight.
fn measure(file: &File, file_len: u64, start: u64, bytes: u64, block: usize, depth: usize) -> Result<Cell> {
    let mut ring = IoUring::new(depth.next_power_of_two() as u32).context("io_uring unavailable")?;
    // One huge-page buffer cut into `depth` read buffers, as the Plan's slots and the replay.
    let buf = crate::source::AlignedBuf::huge((block * depth) as u64)?;
    // SAFETY: each part lies inside `buf`, which outlives every read.
    let bufs: Vec<*mut u8> = (0..depth).map(|i| unsafe { buf.as_ptr().add(i * block) }).collect();
    let usable = file_len / ALIGN as u64 * ALIGN as u64;
    let n_reads = (bytes / block as u64).max(1);
    let fd = types::Fd(file.as_raw_fd());
    let (mut next, mut done, mut in_flight, mut read) = (0u64, 0u64, 0usize, 0u64);
    let mut free: Vec<usize> = (0..depth).collect();
    let t = Instant::now();
    while done < n_reads {
        while in_flight < depth && next < n_reads {
            let slot = free.pop().expect("a free buffer while below depth");
            let span = usable.saturating_sub(block as u64).max(ALIGN as u64);
            let off = (start + next * block as u64) % span / ALIGN as u64 * ALIGN as u64;
            let sqe = opcode::Read::new(fd, bufs[slot], block as u32).offset(off).build().user_data(slot as u64);
            // SAFETY: the buffer stays alive and untouched until its completion is reaped.
            unsafe { ring.submission().push(&sqe).context("submission queue full")? };
            next += 1;
            in_flight += 1;
        }
        ring.submit_and_wait(1)?;
        let completions: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (slot, res) in completions {
            if res < 0 {
                bail!("read failed: {}", std::io::Error::from_raw_os_error(-res));
            }
            read += res as u64;
            free.push(slot as usize);
            in_flight -= 1;
            done += 1;
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(Cell {
        block_bytes: block,
        depth,
        bytes: read,
        seconds,
        mib_per_s: read as f64 / (1 << 20) as f64 / seconds.max(1e-9),
        iops: done as f64 / seconds.max(1e-9),
        reread: false,
    })
}

/// Measures every block size × depth cell, each over its own region of the file when it is
/// large enough, so no cell rereads what another just read; with `Rereads::Measured`, each
/// region again straight after, as a cell of its own.
pub fn measure_envelope(path: &Path, bytes_per_cell: u64, blocks: &[usize], depths: &[usize], rereads: Rereads) -> Result<Envelope> {
    let file = crate::source::open_direct(path)?;
    let file_len = file.metadata()?.len();
    if file_len < (4 << 20) {
        bail!("{}: {} bytes is too small to measure (need at least 4 MiB)", path.display(), file_len);
    }
    let mut cells = Vec::new();
    let mut start = 0u64;
    for &block in blocks {
        for &depth in depths {
            let cell = measure(&file, file_len, start, bytes_per_cell, block, depth)
                .with_context(|| format!("{}: block {block} depth {depth}", path.display()))?;
            cells.push(cell);
            if rereads == Rereads::Measured {
                let again = measure(&file, file_len, start, bytes_per_cell, block, depth)
                    .with_context(|| format!("{}: block {block} depth {depth}, read again", path.display()))?;
                cells.push(Cell { reread: true, ..again });
            }
            start += bytes_per_cell;
        }
    }
    let ceiling = cells.iter().max_by(|a, b| a.mib_per_s.total_cmp(&b.mib_per_s)).cloned().context("no cells")?;
    Ok(Envelope { file_bytes: file_len, bytes_per_cell, cells, ceiling })
}

/// CSV of the envelope cells.
pub fn to_csv(e: &Envelope) -> String {
    let mut s = String::from("block_bytes,depth,bytes,seconds,mib_per_s,iops,reread\n");
    for c in &e.cells {
        s.push_str(&format!("{},{},{},{:.6},{:.1},{:.1},{}\n", c.block_bytes, c.depth, c.bytes, c.seconds, c.mib_per_s, c.iops, c.reread));
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
        let e = measure_envelope(&p, 1 << 20, &[4096, 65536], &[1, 4], Rereads::Skipped).unwrap();
        assert_eq!(e.cells.len(), 4);
        for c in &e.cells {
            assert_eq!(c.bytes, 1 << 20, "{c:?}");
            assert!(c.mib_per_s > 0.0 && !c.reread);
        }
        assert!(e.cells.iter().all(|c| c.mib_per_s <= e.ceiling.mib_per_s));
        assert_eq!(to_csv(&e).lines().count(), 5);
        // Each region read again straight after, as a cell of its own that counts toward the ceiling.
        let e = measure_envelope(&p, 1 << 20, &[4096, 65536], &[1, 4], Rereads::Measured).unwrap();
        assert_eq!(e.cells.len(), 8);
        for pair in e.cells.chunks(2) {
            assert!(!pair[0].reread && pair[1].reread, "{pair:?}");
            assert_eq!((pair[0].block_bytes, pair[0].depth, pair[0].bytes), (pair[1].block_bytes, pair[1].depth, pair[1].bytes));
        }
        assert!(e.cells.iter().all(|c| c.mib_per_s <= e.ceiling.mib_per_s));
        assert_eq!(to_csv(&e).lines().filter(|l| l.ends_with(",true")).count(), 4);
    }
}
