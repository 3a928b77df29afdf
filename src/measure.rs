//! Measurement cells a campaign interleaves with its arms, each sealed as a record of its own
//! format: `envelope` (the device's O_DIRECT read ceiling at a few depths, and the best depth)
//! and `read_replay` (a run's own reads replayed in order at one depth, with no compute).
//!
//! The replayed sequence is derived, not guessed: the run's recorded routes go through the real
//! Plan with that run's own settings and a dry source (`plan::simulate::reads`), which collects
//! every read the Plan submits per layer event. It must equal the run's own Plan telemetry
//! (`q_run`: reads, logical and physical bytes), or the replay fails. The covering reads of
//! each ubatch are then read with io_uring O_DIRECT into aligned buffers, neighbours in the file
//! joined into one read as F's source joins them, at most `depth` in flight, one ubatch after
//! the other (a token's routes are not known before the previous
//! token's compute, so the floor keeps that barrier and no other). The decode's reads are then
//! read again one layer event after the other, each drained before the next goes out, as the
//! router's dependence queues a run's: what that barrier costs the device, apart from compute.

use crate::envelope::{self, Landing, Places};
use crate::identity::build_identity;
use crate::inventory::Inventory;
use crate::plan::simulate::{self, LayerEvent};
use crate::plan::PlanOptions;
use crate::plan::{Manifest, Traffic};
use crate::record::format::{EnvelopeBest, EnvelopeParams, ModelIdentity, Outcome, ReadReplayParams, ReplayCheck, ReplayPhase};
use crate::record::{EnvelopeRecord, ReadReplayRecord, Staging, ENVELOPE_FORMAT, READ_REPLAY_FORMAT};
use crate::source::Covering;
use anyhow::{anyhow, bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Most reads in flight a measurement takes.
pub const MAX_DEPTH: u32 = 1024;
/// Most bytes of aligned buffers a measurement allocates (depth x read size).
pub const MAX_BUFFER_BYTES: u64 = 2 << 30;
/// Largest envelope block.
pub const MAX_BLOCK_BYTES: u64 = 64 << 20;

/// An `envelope` cell: O_DIRECT reads of `block_bytes` from the model file at each depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeCell {
    pub model: PathBuf,
    pub block_bytes: u64,
    pub depths: Vec<u32>,
    pub bytes_per_depth: u64,
    pub record: PathBuf,
}

/// A `read_replay` cell: the reads of record `of` (a completed generate record of arm
/// `of_arm`, served by the Plan with `plan`), replayed at `depth`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadReplayCell {
    pub model: PathBuf,
    pub of: PathBuf,
    pub of_arm: String,
    /// The digest `of` is sealed under (its directory name otherwise).
    pub of_record: String,
    pub plan: PlanOptions,
    pub depth: u32,
    pub depth_from: String,
    pub record: PathBuf,
}

/// Bounds a measurement's depths and buffers before anything is allocated.
pub fn check_envelope(block_bytes: u64, depths: &[u32], bytes_per_depth: u64) -> Result<()> {
    if depths.is_empty() || depths.len() > 16 {
        bail!("envelope: give 1 to 16 depths (got {})", depths.len());
    }
    if !(crate::source::ALIGN..=MAX_BLOCK_BYTES).contains(&block_bytes) || !block_bytes.is_multiple_of(crate::source::ALIGN) {
        bail!("envelope: block_bytes {block_bytes} must be a multiple of 4096 from 4096 to {MAX_BLOCK_BYTES}");
    }
    for &d in depths {
        check_depth(d, block_bytes).map_err(|e| anyhow!("envelope: {e}"))?;
    }
    if bytes_per_depth < block_bytes || bytes_per_depth > 1 << 40 {
        bail!("envelope: bytes_per_depth {bytes_per_depth} must be at least block_bytes and at most 1 TiB");
    }
    Ok(())
}

fn check_depth(depth: u32, read_bytes: u64) -> Result<()> {
    if depth == 0 || depth > MAX_DEPTH {
        bail!("depth {depth}: expected 1..={MAX_DEPTH}");
    }
    if depth as u64 * read_bytes > MAX_BUFFER_BYTES {
        bail!("depth {depth} x {read_bytes}-byte reads is more than {MAX_BUFFER_BYTES} bytes of buffers");
    }
    Ok(())
}

/// What a measurement cell put on record, for the command line.
pub enum Summary {
    Envelope(Box<EnvelopeRecord>),
    ReadReplay(Box<ReadReplayRecord>),
}

/// Runs an envelope cell and writes its record.
pub fn run_envelope(c: &EnvelopeCell) -> Result<EnvelopeRecord> {
    let staging = Staging::new(&c.record)?;
    let inv = Inventory::of(&c.model)?;
    let model = ModelIdentity::of(&c.model, &inv, None)?;
    let measured = check_envelope(c.block_bytes, &c.depths, c.bytes_per_depth).and_then(|()| {
        let depths: Vec<usize> = c.depths.iter().map(|&d| d as usize).collect();
        // A set's largest file: the device's ceiling, over the bytes the Plan reads.
        let file = inv.shards.iter().max_by_key(|s| s.bytes).map_or(c.model.as_path(), |s| s.path.as_path());
        // The replay reads what its run read moments before: the ceiling holds rereads too.
        // Every way F submits reads (single, vectored, linked chains): the ceiling bounds each.
        let patterns = &envelope::Pattern::ALL;
        envelope::measure_envelope(file, c.bytes_per_depth, &[c.block_bytes as usize], &depths, patterns, envelope::Rereads::Measured)
    });
    let mut rec = EnvelopeRecord {
        format: ENVELOPE_FORMAT.into(),
        outcome: Outcome::Completed,
        error: None,
        model: Some(model),
        build: build_identity()?,
        params: Some(EnvelopeParams {
            block_bytes: c.block_bytes,
            depths: c.depths.clone(),
            bytes_per_depth: c.bytes_per_depth,
            landing_bytes: None,
        }),
        cells: Vec::new(),
        best: None,
        surfaces: BTreeMap::new(),
    };
    let ran = measured.map(|e| {
        rec.best = Some(EnvelopeBest { depth: e.ceiling.depth as u32, mib_per_s: e.ceiling.mib_per_s });
        if let Some(p) = rec.params.as_mut() {
            p.landing_bytes = Some(e.landing_bytes);
        }
        rec.cells = e.cells;
    });
    seal(staging, rec, ran, "envelope failed")
}

/// A measurement record that can say it failed, and why.
trait Failable: Serialize {
    fn failed(&mut self, error: String);
}

impl Failable for EnvelopeRecord {
    fn failed(&mut self, error: String) {
        self.outcome = Outcome::Failed;
        self.error = Some(error);
    }
}

impl Failable for ReadReplayRecord {
    fn failed(&mut self, error: String) {
        self.outcome = Outcome::Failed;
        self.error = Some(error);
    }
}

/// Commits `rec` either way: as it is when the measurement `ran`, else marked failed with the
/// reason, and the error names the sealed record.
fn seal<R: Failable>(staging: Staging, mut rec: R, ran: Result<()>, what: &str) -> Result<R> {
    match ran {
        Ok(()) => {
            staging.commit(&rec)?;
            Ok(rec)
        }
        Err(e) => {
            rec.failed(format!("{e:#}"));
            let dir = staging.commit(&rec)?;
            Err(e.context(format!("{what}; record {}", dir.display())))
        }
    }
}

/// One covering read: aligned offset and length, and the logical extent inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub offset: u64,
    pub len: u64,
    pub logical: u64,
    /// Where the logical extent ends inside the read: fewer bytes back is a short read.
    pub end: u64,
}

/// The reads of one run, derived through the Plan, split by ubatch.
pub struct Sequence {
    /// The covering reads of each ubatch, in submission order.
    pub steps: Vec<Vec<Read>>,
    /// Ubatches of the prompt; the rest are decode tokens.
    pub prefill_steps: usize,
    pub traffic: Traffic,
    /// The dry Plan's own count of what it submitted.
    pub plan_traffic: Traffic,
    /// The run's slot pools: the memory its reads land in.
    pub pool_bytes: u64,
    /// Each layer event's reads: its ubatch and their range in that ubatch's step.
    pub events: Vec<(usize, std::ops::Range<usize>)>,
}

/// Times a replay reads the whole sequence; each phase keeps its fastest round. A device's
/// rate drifts from one moment to the next (rounds of one depth differ by up to a quarter on a
/// virtual disk), and a floor read at a slow moment is one the arm can beat.
pub const REPLAY_ROUNDS: usize = 3;

/// What a replay measured: each round's read time of each ubatch, each decode ubatch's again
/// with every layer event drained before the next went out (the fastest of as many rounds),
/// and the bytes of memory the reads landed in.
pub struct Replayed {
    pub rounds: Vec<Vec<f64>>,
    pub decode_by_layer: Vec<f64>,
    pub landing_bytes: u64,
}

/// The reads the Plan with `plan`'s settings submits for `events` (every layer event of a
/// run's routes), per ubatch; the first `prefill_steps` ubatches are the prompt's.
pub fn sequence(inv: &Inventory, plan: &PlanOptions, events: &[LayerEvent], prefill_steps: usize) -> Result<Sequence> {
    let policy = plan.policy.clone();
    let manifest = Manifest::new(inv, plan.slots, &policy.pinned)?.with_layer_buffers(plan.layer_buffers)?;
    let n_used = inv.n_used();
    let sizing = crate::plan::Sizing::of(&manifest, plan, n_used);
    let passes = crate::plan::Passes { token: sizing.token_pass, prompt: sizing.prompt_pass };
    let pool_bytes = manifest.slot_pool_bytes();
    let trace = simulate::reads(manifest, &policy, events, sizing.windows, passes)?;
    let n_steps = events.last().map_or(0, |e| e.ubatch as usize + 1);
    let mut steps: Vec<Vec<Read>> = vec![Vec::new(); n_steps];
    let mut by_event = Vec::with_capacity(events.len());
    let mut traffic = Traffic::default();
    for (n, ev) in events.iter().enumerate() {
        let start = steps[ev.ubatch as usize].len();
        by_event.push((ev.ubatch as usize, start..start + trace.starts[n + 1] - trace.starts[n]));
        for r in &trace.requests[trace.starts[n]..trace.starts[n + 1]] {
            let cov = Covering::of(r.offset, r.len);
            steps[ev.ubatch as usize].push(Read { offset: cov.offset, len: cov.len, logical: r.len, end: cov.head + r.len });
            traffic.reads += 1;
            traffic.logical_bytes += r.len;
            traffic.physical_bytes += cov.len;
            traffic.padding_bytes += cov.padding(r.len);
        }
    }
    if prefill_steps > n_steps {
        bail!("{prefill_steps} prompt ubatches, but the routes hold only {n_steps} ubatches");
    }
    Ok(Sequence { steps, prefill_steps, traffic, plan_traffic: trace.telemetry.q_run, pool_bytes, events: by_event })
}

/// The sequence of generate record `of` (its routes, its model, its Plan settings), checked
/// against that record's own Plan telemetry.
pub fn sequence_of_record(of: &Path, model: &Path, plan: &PlanOptions) -> Result<(Sequence, ReplayCheck, usize)> {
    let rec = crate::record::load_generate(of)?;
    let routes = crate::oracle::routes::load(of, Some(model))?;
    let name = of.display();
    let counts = rec.counts.as_ref().ok_or_else(|| anyhow!("{name}: the record has no counts"))?;
    let params = rec.params.as_ref().ok_or_else(|| anyhow!("{name}: the record has no parameters"))?;
    let report = rec.plan().ok_or_else(|| anyhow!("{name}: the run was not served by the Plan (no Plan report to replay against)"))?;
    let n_ubatch = params.exec.n_ubatch.max(1) as usize;
    let prefill_steps = counts.prompt_tokens.div_ceil(n_ubatch);
    let seq = sequence(&routes.inventory, plan, &routes.events, prefill_steps)?;
    let decode_steps = seq.steps.len() - seq.prefill_steps;
    let want_decode = counts.generated_tokens.saturating_sub(1);
    if decode_steps != want_decode {
        bail!("{name}: the routes hold {decode_steps} decode ubatches, the run decoded {want_decode} tokens after its prompt");
    }
    let check = check(&seq, report.telemetry.q_run);
    Ok((seq, check, decode_steps))
}

/// The derived sequence against a run's own traffic: the same reads, logical and physical
/// bytes, counted both from the collected requests and by the dry Plan itself.
pub fn check(seq: &Sequence, run: Traffic) -> ReplayCheck {
    ReplayCheck { replayed: seq.traffic, run, equal: seq.traffic == run && seq.plan_traffic == run }
}

/// Reads `reads` with at most `depth` in flight, each into the next free place; returns the
/// physical bytes read. A read that fails or stops before its logical end fails the replay.
fn read_step(ring: &mut IoUring, n_files: usize, places: &mut Places, depth: usize, reads: &[Read]) -> Result<u64> {
    let (mut next, mut in_flight, mut bytes) = (0usize, 0usize, 0u64);
    // Per read in flight (indexed by user_data): its place and the bytes it must deliver.
    let mut held: Vec<(usize, u64)> = vec![(0, 0); depth];
    let mut free: Vec<usize> = (0..depth).collect();
    while next < reads.len() || in_flight > 0 {
        while next < reads.len() {
            let Some(b) = free.pop() else { break };
            let (place, at) = places.take().expect("more places than reads in flight");
            let r = reads[next];
            held[b] = (place, r.end);
            let (shard, offset) = crate::source::shard_offset(r.offset);
            if shard >= n_files {
                bail!("a read in shard {shard} of a model of {n_files} files");
            }
            let sqe = opcode::Read::new(types::Fixed(shard as u32), at, r.len as u32).offset(offset).build().user_data(b as u64);
            // SAFETY: the buffer stays alive and untouched until its completion is reaped.
            unsafe { ring.submission().push(&sqe).context("submission queue full")? };
            next += 1;
            in_flight += 1;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e).context("io_uring_enter"),
        }
        let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (b, res) in done {
            if res < 0 {
                bail!("a replayed read failed: {}", std::io::Error::from_raw_os_error(-res));
            }
            // Near the end of the file a covering read may stop early; never before the extent ends.
            let (place, want) = held[b as usize];
            if (res as u64) < want {
                bail!("a replayed read returned {res} bytes, short of its extent");
            }
            bytes += res as u64;
            places.give(place);
            free.push(b as usize);
            in_flight -= 1;
        }
    }
    Ok(bytes)
}

/// The phase of `steps` (the sequence's steps `range`) in the round that read it fastest, with
/// every round's time.
fn fastest(steps: &[Vec<Read>], rounds: &[Vec<f64>], range: std::ops::Range<usize>) -> ReplayPhase {
    let seconds: Vec<f64> = rounds.iter().map(|r| r[range.clone()].iter().sum()).collect();
    let best = (0..rounds.len()).min_by(|&a, &b| seconds[a].total_cmp(&seconds[b])).expect("at least one round");
    ReplayPhase { rounds_s: seconds, ..phase(steps, &rounds[best][range]) }
}

fn phase(steps: &[Vec<Read>], times: &[f64]) -> ReplayPhase {
    let seconds: f64 = times.iter().sum();
    ReplayPhase {
        steps: steps.len() as u64,
        reads: steps.iter().map(|s| s.len() as u64).sum(),
        logical_bytes: steps.iter().flatten().map(|r| r.logical).sum(),
        physical_bytes: steps.iter().flatten().map(|r| r.len).sum(),
        seconds,
        seconds_per_step: if steps.is_empty() { 0.0 } else { seconds / steps.len() as f64 },
        per_step_s: times.to_vec(),
        rounds_s: Vec::new(),
    }
}

/// `reads` as F's source sends them: a covering read that starts where the one before it ends,
/// in the same file, joins it as one read, up to [`MAX_VECTOR`] of them and `cap` bytes. A
/// floor read one request at a time would be slower than F's own reads where larger requests
/// read faster.
///
/// [`MAX_VECTOR`]: crate::source::uring::MAX_VECTOR
pub fn coalesced(reads: &[Read], cap: u64) -> Vec<Read> {
    let mut out: Vec<Read> = Vec::with_capacity(reads.len());
    let mut members = 0;
    for &r in reads {
        if let Some(last) = out.last_mut() {
            let same_file = crate::source::shard_offset(last.offset).0 == crate::source::shard_offset(r.offset).0;
            if members < crate::source::uring::MAX_VECTOR && same_file && last.offset + last.len == r.offset && last.len + r.len <= cap {
                last.end = r.offset - last.offset + r.end;
                last.len += r.len;
                last.logical += r.logical;
                members += 1;
                continue;
            }
        }
        out.push(r);
        members = 1;
    }
    out
}

/// Replays the sequence's reads from the model's files (one, or each shard of its set), one
/// ubatch after the other; then the decode's again, one layer event after the other. Each
/// layer event's reads go out as F's source sends them ([`coalesced`]).
pub fn replay_reads<P: AsRef<Path>>(model: &[P], seq: &Sequence, depth: u32) -> Result<Replayed> {
    let single = seq.steps.iter().flatten().map(|r| r.len).max().unwrap_or(crate::source::ALIGN);
    let cap = (MAX_BUFFER_BYTES / depth.max(1) as u64).min(MAX_BLOCK_BYTES).max(single);
    let mut steps: Vec<Vec<Read>> = vec![Vec::new(); seq.steps.len()];
    let (mut events, mut covered) = (Vec::with_capacity(seq.events.len()), vec![0usize; seq.steps.len()]);
    for (u, range) in &seq.events {
        let joined = coalesced(&seq.steps[*u][range.clone()], cap);
        events.push((*u, steps[*u].len()..steps[*u].len() + joined.len()));
        steps[*u].extend(joined);
        covered[*u] += range.len();
    }
    // The layer events partition each ubatch's reads: every read once, none twice.
    if let Some(u) = (0..steps.len()).find(|&u| covered[u] != seq.steps[u].len()) {
        bail!("ubatch {u}: its layer events hold {} reads, the ubatch {}", covered[u], seq.steps[u].len());
    }
    let largest = steps.iter().flatten().map(|r| r.len).max().unwrap_or(crate::source::ALIGN);
    check_depth(depth, largest)?;
    let files = crate::source::ModelFiles::open(model, true)?;
    let mut ring = IoUring::new((depth as usize).next_power_of_two().max(2) as u32).context("io_uring is not available on this host")?;
    // One descriptor per shard, registered as the F source registers them.
    let fds: Vec<i32> = files.files().iter().map(|f| f.as_raw_fd()).collect();
    ring.submitter().register_files(&fds).context("io_uring: cannot register the model's files")?;
    // Reads land in memory as large as the run's slot pools (up to the landing's cap), each in
    // the place written longest ago, as the run's reads land in its slots: not in `depth`
    // buffers a virtual disk's host keeps warm.
    let landing = Landing::new(seq.pool_bytes, largest * depth as u64)?;
    let mut places = landing.places(largest as usize);
    let mut rounds = Vec::with_capacity(REPLAY_ROUNDS);
    for _ in 0..REPLAY_ROUNDS {
        let mut times = Vec::with_capacity(steps.len());
        for step in &steps {
            let t = Instant::now();
            read_step(&mut ring, fds.len(), &mut places, depth as usize, step)?;
            times.push(t.elapsed().as_secs_f64());
        }
        rounds.push(times);
    }
    // The decode one layer event after the other, as many rounds, the fastest kept.
    let from = seq.prefill_steps;
    let mut by_layer: Option<Vec<f64>> = None;
    for _ in 0..REPLAY_ROUNDS {
        let mut round = vec![0.0; steps.len() - from];
        for (u, range) in events.iter().filter(|e| e.0 >= from) {
            let t = Instant::now();
            read_step(&mut ring, fds.len(), &mut places, depth as usize, &steps[*u][range.clone()])?;
            round[u - from] += t.elapsed().as_secs_f64();
        }
        if by_layer.as_ref().is_none_or(|b| round.iter().sum::<f64>() < b.iter().sum::<f64>()) {
            by_layer = Some(round);
        }
    }
    Ok(Replayed { rounds, decode_by_layer: by_layer.unwrap_or_default(), landing_bytes: landing.len() })
}

/// Runs a read_replay cell and writes its record. A sequence that differs from the run's own
/// reads fails the cell, on record.
pub fn run_read_replay(c: &ReadReplayCell) -> Result<ReadReplayRecord> {
    let staging = Staging::new(&c.record)?;
    let inv = Inventory::of(&c.model)?;
    let mut rec = ReadReplayRecord {
        format: READ_REPLAY_FORMAT.into(),
        outcome: Outcome::Completed,
        error: None,
        model: Some(ModelIdentity::of(&c.model, &inv, None)?),
        build: build_identity()?,
        params: Some(ReadReplayParams {
            of_arm: c.of_arm.clone(),
            of_record: c.of_record.clone(),
            plan: c.plan.clone(),
            depth: c.depth,
            depth_from: c.depth_from.clone(),
            landing_bytes: None,
        }),
        check: None,
        prefill: None,
        decode: None,
        decode_by_layer: None,
        surfaces: BTreeMap::new(),
    };
    let ran = (|| -> Result<()> {
        let (seq, check, _) = sequence_of_record(&c.of, &c.model, &c.plan)?;
        let equal = check.equal;
        let (replayed, run) = (check.replayed, check.run);
        rec.check = Some(check);
        if !equal {
            bail!(
                "the derived reads ({} reads, {} logical bytes) are not the run's own ({} reads, {} logical bytes): wrong arm settings or routes",
                replayed.reads,
                replayed.logical_bytes,
                run.reads,
                run.logical_bytes
            );
        }
        let r = replay_reads(&inv.paths(), &seq, c.depth)?;
        if let Some(p) = rec.params.as_mut() {
            p.landing_bytes = Some(r.landing_bytes);
        }
        let p = seq.prefill_steps;
        let n = seq.steps.len();
        rec.prefill = Some(fastest(&seq.steps[..p], &r.rounds, 0..p));
        rec.decode = Some(fastest(&seq.steps[p..], &r.rounds, p..n));
        rec.decode_by_layer = Some(phase(&seq.steps[p..], &r.decode_by_layer));
        Ok(())
    })();
    seal(staging, rec, ran, "read replay failed closed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::uring::MAX_VECTOR;

    fn read(offset: u64, len: u64) -> Read {
        // A covering read whose extent starts 512 bytes in and stops 256 bytes short of its end.
        Read { offset, len, logical: len - 768, end: len - 256 }
    }

    #[test]
    fn neighbours_in_one_file_become_one_read_as_f_sends_them() {
        let mb = 1 << 20;
        let second_shard = 1 << crate::source::SHARD_SHIFT;
        let reads = [
            read(0, mb),
            read(mb, 2 * mb),
            read(3 * mb, mb),
            // A gap: a read of its own.
            read(5 * mb, mb),
            // Where the file before it would end, but in the next shard: a read of its own.
            read(second_shard, mb),
            read(second_shard + mb, mb),
        ];
        let got = coalesced(&reads, u64::MAX);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].offset, got[0].len), (0, 4 * mb));
        assert_eq!(got[0].logical, 4 * mb - 3 * 768, "the logical bytes of its three extents");
        assert_eq!(got[0].end, 4 * mb - 256, "the last extent's end: fewer bytes back is short");
        assert_eq!((got[1].offset, got[1].len, got[1].end), (5 * mb, mb, mb - 256));
        assert_eq!((got[2].offset, got[2].len), (second_shard, 2 * mb));
        // Bytes are neither lost nor added.
        let sum = |r: &[Read]| (r.iter().map(|r| r.len).sum::<u64>(), r.iter().map(|r| r.logical).sum::<u64>());
        assert_eq!(sum(&got), sum(&reads));
    }

    #[test]
    fn a_joined_read_stops_at_the_vector_limit_and_the_cap() {
        let page = crate::source::ALIGN;
        let run: Vec<Read> = (0..MAX_VECTOR as u64 + 3).map(|i| read(i * 4 * page, 4 * page)).collect();
        let got = coalesced(&run, u64::MAX);
        assert_eq!(got.iter().map(|r| r.len / (4 * page)).collect::<Vec<_>>(), [MAX_VECTOR as u64, 3]);
        let got = coalesced(&run[..6], 8 * page);
        assert_eq!(got.iter().map(|r| r.len).collect::<Vec<_>>(), [8 * page; 3]);
        assert!(coalesced(&[], 1).is_empty());
    }
}
