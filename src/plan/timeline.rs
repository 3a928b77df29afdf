//! The time of decode tokens, layer by layer: each read submitted and taken back (ticket,
//! object, extent, bytes), each window → slot copy, each publication, each acquire (entered
//! once the router has run, returned when the expert matmuls can start) and release (the pass's
//! expert compute ended), and the time blocked waiting for completions.
//!
//! Memory is fixed when the Plan is made: the events of one chosen decode token go into a
//! buffer allocated up front (events past it are counted, not kept), and every token gets a
//! summary computed as its events arrive. The summary sweeps the token's time once: each
//! interval is busy (at least one read submitted and not yet taken back) or idle, and either
//! way it is charged to what the engine's thread was doing then, so the parts add up to the
//! token's wall time exactly, in the clock's nanoseconds.
//!
//! Busy is what the host can see: a read counts as busy until the source is seen to hold its
//! completion (io_uring's completion queue reaped), which may be before the Plan takes it back
//! (while it verifies the ones ahead of it); a read the device finished while the engine
//! computed counts as busy until the next look. So busy bounds the device's own from above.

use super::ObjectId;
use crate::source::Completion;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Instant;

/// The format of the `timeline` surface.
pub const TIMELINE_FORMAT: &str = "sovereign.timeline/1";
/// The surface's name and file in a record.
pub const SURFACE: &str = "timeline";
pub const SURFACE_FILE: &str = "timeline.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// llama_decode was called for the token.
    Begin,
    /// The router of `layer` has run; the Plan is asked for its experts.
    AcquireEnter,
    /// A read went to the source: `dur_ns` is the time inside the source's submit (a
    /// synchronous source reads there).
    Submit,
    /// A completion was taken back at `t_ns + dur_ns`, after `dur_ns` blocked waiting for it;
    /// the source was first seen to hold it at `landed_ns`, at or before then.
    Complete,
    /// A window was copied into a slot during `[t_ns, t_ns + dur_ns)`; for an asynchronous copy
    /// (`window` set) the time to queue it, and the copy is in flight until its `CopyDone`.
    Copy,
    /// The event of the asynchronous copy from `window` completed at `t_ns + dur_ns`, after
    /// `dur_ns` blocked waiting for it.
    CopyDone,
    /// The slot became DeviceReady.
    Publish,
    /// The acquire returned: the expert matmuls can start.
    AcquireReturn,
    /// The pass's expert compute ended.
    Release,
    /// llama_decode returned.
    End,
}

/// One mark, in nanoseconds from the token's start (the end of the previous decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub t_ns: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dur_ns: u64,
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landed_ns: Option<u64>,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl Event {
    fn at(t_ns: u64, kind: Kind) -> Event {
        Event {
            t_ns,
            dur_ns: 0,
            kind,
            layer: None,
            pass: None,
            ticket: None,
            expert: None,
            extent: None,
            bytes: None,
            slot: None,
            window: None,
            landed_ns: None,
        }
    }

    /// When the event ends (`t_ns` for a mark without duration).
    pub fn end_ns(&self) -> u64 {
        self.t_ns + self.dur_ns
    }
}

/// What the engine's thread was doing, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    /// Between tokens: outside llama_decode (taking the logits row, choosing the next token).
    pub between_ns: u64,
    /// Non-expert compute: inside llama_decode, outside acquires and expert matmuls (attention,
    /// router, norms, the output head).
    pub compute_ns: u64,
    /// Expert matmuls: from an acquire's return to its pass's release.
    pub expert_compute_ns: u64,
    /// Window → slot copies.
    pub copy_ns: u64,
    /// Inside an acquire, neither copying nor blocked on the source: validation and Plan
    /// bookkeeping.
    pub plan_ns: u64,
    /// Inside the source's submit.
    pub submit_ns: u64,
    /// Blocked waiting for a completion.
    pub wait_ns: u64,
}

impl Activity {
    pub fn sum(&self) -> u64 {
        self.between_ns + self.compute_ns + self.expert_compute_ns + self.copy_ns + self.plan_ns + self.submit_ns + self.wait_ns
    }

    fn add(&mut self, o: &Activity) {
        self.between_ns += o.between_ns;
        self.compute_ns += o.compute_ns;
        self.expert_compute_ns += o.expert_compute_ns;
        self.copy_ns += o.copy_ns;
        self.plan_ns += o.plan_ns;
        self.submit_ns += o.submit_ns;
        self.wait_ns += o.wait_ns;
    }

    fn slot(&mut self, cpu: Cpu) -> &mut u64 {
        match cpu {
            Cpu::Between => &mut self.between_ns,
            Cpu::Compute => &mut self.compute_ns,
            Cpu::ExpertCompute => &mut self.expert_compute_ns,
            Cpu::Copy => &mut self.copy_ns,
            Cpu::Plan => &mut self.plan_ns,
            Cpu::Submit => &mut self.submit_ns,
            Cpu::Wait => &mut self.wait_ns,
        }
    }
}

/// One token's time (or the sum over tokens): `busy_ns + idle_ns = wall_ns`, and each of the
/// two is split by what the engine's thread was doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Times {
    /// From the end of the previous decode to the end of this one.
    pub wall_ns: u64,
    /// At least one read submitted and not yet taken back.
    pub busy_ns: u64,
    /// No read in flight: the device sits idle.
    pub idle_ns: u64,
    /// Why the device sat idle (its submit and wait are 0: a read is in flight during both).
    pub idle: Activity,
    /// What the engine did while reads were in flight (submit and wait: compute stalled).
    pub busy: Activity,
    /// Compute stalled waiting for reads: inside submit or blocked in wait.
    pub stalled_on_reads_ns: u64,
    /// Reads submitted (one per extent), as marked.
    pub reads: u64,
    pub read_bytes: u64,
    /// Completions taken back.
    pub completions: u64,
    pub copies: u64,
    pub copy_bytes: u64,
    /// At least one asynchronous copy in flight (queued, its event not yet seen complete).
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub copy_in_flight_ns: u64,
    /// Of that, time the engine's thread spent computing (non-expert compute or expert
    /// matmuls): copies overlapping compute.
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub copy_overlap_compute_ns: u64,
    pub publishes: u64,
    pub acquires: u64,
    pub releases: u64,
    /// The Plan's own count of reads submitted during the token.
    pub plan_reads: u64,
}

impl Times {
    fn add(&mut self, o: &Times) {
        self.wall_ns += o.wall_ns;
        self.busy_ns += o.busy_ns;
        self.idle_ns += o.idle_ns;
        self.idle.add(&o.idle);
        self.busy.add(&o.busy);
        self.stalled_on_reads_ns += o.stalled_on_reads_ns;
        self.reads += o.reads;
        self.read_bytes += o.read_bytes;
        self.completions += o.completions;
        self.copies += o.copies;
        self.copy_bytes += o.copy_bytes;
        self.copy_in_flight_ns += o.copy_in_flight_ns;
        self.copy_overlap_compute_ns += o.copy_overlap_compute_ns;
        self.publishes += o.publishes;
        self.acquires += o.acquires;
        self.releases += o.releases;
        self.plan_reads += o.plan_reads;
    }
}

/// One decode token's summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenTime {
    /// Decode token index: 0 is the first token decoded after the prompt.
    pub token: u32,
    pub times: Times,
}

/// The timeline in the record: every decode token's summary and their sum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineReport {
    /// Resolution of the monotonic clock every time comes from.
    pub clock_resolution_ns: u64,
    /// Decode tokens summarized.
    pub tokens: u32,
    pub total: Times,
    pub per_token: Vec<TokenTime>,
    /// The prompt's decode calls (every ubatch of several tokens), summed: their reads, passes
    /// (acquires and releases), and the time the device was busy or sat idle, split by what
    /// the engine was doing (absent in earlier records, and where no prompt ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Times>,
    /// The token whose every event is in the `timeline` surface (None: no decode token ran).
    pub events_token: Option<u32>,
    pub events: u64,
    /// Events of that token past the buffer's capacity, counted and not kept (0: complete).
    pub events_dropped: u64,
    pub events_capacity: u64,
}

/// The `timeline` surface: one decode token's every event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineFile {
    pub format: String,
    pub token: u32,
    pub clock_resolution_ns: u64,
    /// The MoE layers, in order.
    pub layers: Vec<u32>,
    pub times: Times,
    pub events_dropped: u64,
    pub events: Vec<Event>,
}

/// What the engine's thread is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cpu {
    Between,
    Compute,
    ExpertCompute,
    Copy,
    Plan,
    Submit,
    Wait,
}

/// The decode token in progress.
struct Open {
    token: u32,
    origin: Instant,
    /// Time charged so far, from the origin.
    last: u64,
    cpu: Cpu,
    times: Times,
    plan_reads: u64,
    keep: bool,
    /// A call of several tokens (the prompt): summed into the prompt's times, not a token.
    prompt: bool,
}

/// The timeline of a Plan. A default one is off and records nothing.
#[derive(Default)]
pub struct Timeline {
    on: bool,
    /// The token asked for; otherwise the middle of the expected decode tokens, else the last.
    asked: Option<u32>,
    want: u32,
    layers: Vec<u32>,
    events: Vec<Event>,
    kept: Option<(u32, Times)>,
    dropped: u64,
    open: Option<Open>,
    next: u32,
    last_end: Option<Instant>,
    /// Reads submitted and not yet seen finished (across tokens).
    outstanding: u64,
    /// When the completions seen finished and not yet taken back were seen, in the order the
    /// source hands them out.
    landed: VecDeque<Instant>,
    /// Asynchronous copies queued and not yet seen complete.
    copies_in_flight: u64,
    per_token: Vec<TokenTime>,
    total: Times,
    prompt: Option<Times>,
}

impl Timeline {
    /// A timeline keeping the events of decode token `token` (None: the middle one once
    /// [`Timeline::expect`] says how many there will be, else the last), up to `capacity`.
    pub fn new(token: Option<u32>, layers: Vec<u32>, capacity: usize) -> Timeline {
        Timeline {
            on: true,
            asked: token,
            want: token.unwrap_or(u32::MAX),
            layers,
            events: Vec::with_capacity(capacity),
            landed: VecDeque::with_capacity(64),
            ..Default::default()
        }
    }

    /// Events of one token are bounded by the manifest: per layer, a few acquire and release
    /// marks per pass, and for up to two slot groups (demand and prefetch) a submit and a
    /// completion per extent plus a copy and a publication per bundle.
    pub fn capacity_for(n_layers: usize, n_slots: u32, n_roles: usize) -> usize {
        2 + n_layers * (12 + 2 * n_slots as usize * (2 * n_roles + 2))
    }

    /// The run will decode `n` tokens after its prompt: room for their summaries, and the
    /// middle one's events unless a token was asked for.
    pub fn expect(&mut self, n: u32) {
        if self.asked.is_none() {
            self.want = n / 2;
        }
        self.per_token.reserve_exact(n as usize);
    }

    /// A llama_decode of `n_tokens` starts; `plan_reads` is the Plan's read count now. A call
    /// of one token is a decode token; longer ones (the prompt) are summed into the prompt's
    /// times, from the call's start, and keep no events.
    pub fn begin(&mut self, n_tokens: usize, plan_reads: u64) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.open = None;
        if n_tokens != 1 {
            self.open = Some(Open {
                token: 0,
                origin: now,
                last: 0,
                cpu: Cpu::Compute,
                times: Times::default(),
                plan_reads,
                keep: false,
                prompt: true,
            });
            return;
        }
        let token = self.next;
        self.next += 1;
        let origin = self.last_end.unwrap_or(now);
        // Keep the latest token up to the one wanted, so a run that stops early still has one.
        let keep = token <= self.want;
        if keep {
            self.events.clear();
            self.dropped = 0;
        }
        self.open = Some(Open { token, origin, last: 0, cpu: Cpu::Between, times: Times::default(), plan_reads, keep, prompt: false });
        self.advance(now, Cpu::Compute);
        self.push(now, 0, |e| e, Kind::Begin);
    }

    /// The llama_decode returned.
    pub fn end(&mut self, plan_reads: u64) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.last_end = Some(now);
        self.advance(now, Cpu::Between);
        self.push(now, 0, |e| e, Kind::End);
        let Some(mut o) = self.open.take() else { return };
        o.times.plan_reads = plan_reads.saturating_sub(o.plan_reads);
        o.times.stalled_on_reads_ns = o.times.busy.submit_ns + o.times.busy.wait_ns + o.times.idle.submit_ns + o.times.idle.wait_ns;
        if o.prompt {
            self.prompt.get_or_insert_with(Times::default).add(&o.times);
            return;
        }
        if o.keep {
            self.kept = Some((o.token, o.times));
        }
        self.total.add(&o.times);
        self.per_token.push(TokenTime { token: o.token, times: o.times });
    }

    pub fn acquire_enter(&mut self, layer: u32, pass: u32) {
        self.mark(Cpu::Plan, Kind::AcquireEnter, layer, pass);
    }

    pub fn acquire_return(&mut self, layer: u32, pass: u32) {
        if let Some(o) = &mut self.open {
            o.times.acquires += 1;
        }
        self.mark(Cpu::ExpertCompute, Kind::AcquireReturn, layer, pass);
    }

    /// The pass's expert compute ended; the Plan's release work follows, then
    /// [`Timeline::resume_compute`].
    pub fn release(&mut self, layer: u32, pass: u32) {
        if let Some(o) = &mut self.open {
            o.times.releases += 1;
        }
        self.mark(Cpu::Plan, Kind::Release, layer, pass);
    }

    /// The release returned: the engine computes again.
    pub fn resume_compute(&mut self) {
        if self.on {
            self.advance(Instant::now(), Cpu::Compute);
        }
    }

    fn mark(&mut self, then: Cpu, kind: Kind, layer: u32, pass: u32) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(now, then);
        self.push(now, 0, |e| Event { layer: Some(layer), pass: Some(pass), ..e }, kind);
    }

    /// A read submitted at `started` (the source's submit has returned).
    pub(crate) fn submitted(&mut self, started: Instant, ticket: u64, object: ObjectId, extent: u32, bytes: u64, window: u32) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(started, Cpu::Submit);
        self.outstanding += 1;
        self.advance(now, Cpu::Plan);
        if let Some(o) = &mut self.open {
            o.times.reads += 1;
            o.times.read_bytes += bytes;
        }
        let e = |e| Event {
            ticket: Some(ticket),
            layer: Some(object.layer),
            expert: Some(object.expert),
            extent: Some(extent),
            bytes: Some(bytes),
            window: Some(window),
            ..e
        };
        self.push(started, dur(started, now), e, Kind::Submit);
    }

    /// A completion taken back after waiting from `started`; then `in_flight` reads are still
    /// at the device and `held` more finished ones wait in the source to be taken (see
    /// [`crate::source::Source::in_flight`]).
    pub(crate) fn completed(&mut self, started: Instant, c: &Completion, in_flight: usize, held: usize) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(started, Cpu::Wait);
        self.advance(now, Cpu::Plan);
        // Those no longer in flight were seen finished now; this one is the oldest seen (marks
        // of completions a drain discarded are dropped).
        let seen = self.outstanding.saturating_sub(in_flight as u64);
        self.landed.extend(std::iter::repeat_n(now, seen as usize));
        while self.landed.len() > held + 1 {
            self.landed.pop_front();
        }
        let landed = if self.landed.len() == held + 1 { self.landed.pop_front().unwrap_or(now) } else { now };
        self.outstanding = in_flight as u64;
        let landed_ns = self.open.as_ref().map(|o| landed.saturating_duration_since(o.origin).as_nanos() as u64);
        if let Some(o) = &mut self.open {
            o.times.completions += 1;
        }
        let e = |e| Event {
            landed_ns,
            ticket: Some(c.ticket),
            layer: Some(c.object.layer),
            expert: Some(c.object.expert),
            extent: Some(c.extent),
            bytes: Some(c.result.unwrap_or(0)),
            window: Some(c.window),
            ..e
        };
        self.push(started, dur(started, now), e, Kind::Complete);
    }

    /// A window → slot copy of `bytes` that started at `started` and has completed.
    pub(crate) fn copied(&mut self, started: Instant, object: ObjectId, slot: u32, bytes: u64) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(started, Cpu::Copy);
        self.advance(now, Cpu::Plan);
        if let Some(o) = &mut self.open {
            o.times.copies += 1;
            o.times.copy_bytes += bytes;
        }
        let e = |e| Event { layer: Some(object.layer), expert: Some(object.expert), slot: Some(slot), bytes: Some(bytes), ..e };
        self.push(started, dur(started, now), e, Kind::Copy);
    }

    /// An asynchronous copy from `window` queued during `[started, now)`; in flight until
    /// [`Timeline::copy_done`].
    pub(crate) fn copy_queued(&mut self, started: Instant, object: ObjectId, slot: u32, window: u32, bytes: u64) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(started, Cpu::Copy);
        self.copies_in_flight += 1;
        self.advance(now, Cpu::Plan);
        if let Some(o) = &mut self.open {
            o.times.copies += 1;
            o.times.copy_bytes += bytes;
        }
        let e = |e| Event {
            layer: Some(object.layer),
            expert: Some(object.expert),
            slot: Some(slot),
            window: Some(window),
            bytes: Some(bytes),
            ..e
        };
        self.push(started, dur(started, now), e, Kind::Copy);
    }

    /// The copy from `window` seen complete after waiting from `started` for its event.
    pub(crate) fn copy_done(&mut self, started: Instant, object: ObjectId, slot: u32, window: u32) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(started, Cpu::Copy);
        // In flight while waited for, too.
        self.advance(now, Cpu::Plan);
        self.copies_in_flight = self.copies_in_flight.saturating_sub(1);
        let e = |e| Event { layer: Some(object.layer), expert: Some(object.expert), slot: Some(slot), window: Some(window), ..e };
        self.push(started, dur(started, now), e, Kind::CopyDone);
    }

    pub(crate) fn published(&mut self, object: ObjectId, slot: u32) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        self.advance(now, Cpu::Plan);
        if let Some(o) = &mut self.open {
            o.times.publishes += 1;
        }
        self.push(now, 0, |e| Event { layer: Some(object.layer), expert: Some(object.expert), slot: Some(slot), ..e }, Kind::Publish);
    }

    /// Charges the open token's time up to `to` to busy or idle and to what the thread was
    /// doing, then notes that it does `then` from `to` on.
    fn advance(&mut self, to: Instant, then: Cpu) {
        let busy = self.outstanding > 0;
        let copying = self.copies_in_flight > 0;
        let Some(o) = &mut self.open else { return };
        let at = to.saturating_duration_since(o.origin).as_nanos() as u64;
        let d = at.saturating_sub(o.last);
        o.times.wall_ns += d;
        if copying {
            o.times.copy_in_flight_ns += d;
            if matches!(o.cpu, Cpu::Compute | Cpu::ExpertCompute) {
                o.times.copy_overlap_compute_ns += d;
            }
        }
        if busy {
            o.times.busy_ns += d;
            *o.times.busy.slot(o.cpu) += d;
        } else {
            o.times.idle_ns += d;
            *o.times.idle.slot(o.cpu) += d;
        }
        o.last = o.last.max(at);
        o.cpu = then;
    }

    fn push(&mut self, at: Instant, dur_ns: u64, fill: impl FnOnce(Event) -> Event, kind: Kind) {
        let Some(o) = &self.open else { return };
        if !o.keep {
            return;
        }
        let t = at.saturating_duration_since(o.origin).as_nanos() as u64;
        if self.events.len() == self.events.capacity() {
            self.dropped += 1;
            return;
        }
        self.events.push(fill(Event { dur_ns, ..Event::at(t, kind) }));
    }

    /// The summaries for the record (None when off).
    pub fn report(&self) -> Option<TimelineReport> {
        if !self.on {
            return None;
        }
        Some(TimelineReport {
            clock_resolution_ns: clock_resolution_ns(),
            tokens: self.per_token.len() as u32,
            total: self.total,
            per_token: self.per_token.clone(),
            prompt: self.prompt,
            events_token: self.kept.map(|k| k.0),
            events: if self.kept.is_some() { self.events.len() as u64 } else { 0 },
            events_dropped: self.dropped,
            events_capacity: self.events.capacity() as u64,
        })
    }

    /// The kept token's events (None when off or when no decode token ended).
    pub fn file(&self) -> Option<TimelineFile> {
        let (token, times) = self.kept.filter(|_| self.on)?;
        Some(TimelineFile {
            format: TIMELINE_FORMAT.into(),
            token,
            clock_resolution_ns: clock_resolution_ns(),
            layers: self.layers.clone(),
            times,
            events_dropped: self.dropped,
            events: self.events.clone(),
        })
    }
}

fn dur(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_nanos() as u64
}

/// The resolution of CLOCK_MONOTONIC (what `Instant` reads on Linux), in nanoseconds.
pub fn clock_resolution_ns() -> u64 {
    match nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => (ts.tv_sec() as u64) * 1_000_000_000 + ts.tv_nsec() as u64,
        Err(_) => 1,
    }
}

/// A read's `[start, end)` in nanoseconds: its submit event, to the completion's return (None
/// where no completion came back in the token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedRead {
    pub submit: Event,
    pub done_ns: Option<u64>,
}

impl TimelineFile {
    /// Reads a `timeline` surface; a file that is not one is one error naming it.
    pub fn parse(what: &str, bytes: &[u8]) -> anyhow::Result<TimelineFile> {
        let f: TimelineFile = serde_json::from_slice(bytes).map_err(|e| anyhow::anyhow!("{what}: not a timeline ({e})"))?;
        if f.format != TIMELINE_FORMAT {
            anyhow::bail!("{what}: unknown timeline format {:?} (known: {TIMELINE_FORMAT})", f.format);
        }
        Ok(f)
    }

    /// Reads, one per submitted ticket, with when each came back.
    pub fn reads(&self) -> Vec<TimedRead> {
        let done: std::collections::HashMap<u64, u64> = self
            .events
            .iter()
            .filter(|e| e.kind == Kind::Complete)
            .filter_map(|e| Some((e.ticket?, e.landed_ns.unwrap_or(e.end_ns()))))
            .collect();
        self.events
            .iter()
            .filter(|e| e.kind == Kind::Submit)
            .map(|e| TimedRead { submit: *e, done_ns: e.ticket.and_then(|t| done.get(&t).copied()) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Completion;

    fn completion(ticket: u64, layer: u32, expert: u32, extent: u32, n: u64) -> Completion {
        Completion { ticket, object: ObjectId { layer, expert }, extent, window: 0, epoch: 0, generation: 1, result: Ok(n) }
    }

    /// Busy is the union of [submit, taken back] over reads, computed here apart from the sweep.
    fn union_busy(f: &TimelineFile, end: u64) -> u64 {
        let mut iv: Vec<(u64, u64)> = f.reads().into_iter().map(|r| (r.submit.t_ns, r.done_ns.unwrap_or(end))).collect();
        iv.sort();
        let (mut total, mut cur): (u64, Option<(u64, u64)>) = (0, None);
        for (a, b) in iv {
            cur = match cur {
                Some((s, e)) if a <= e => Some((s, e.max(b))),
                Some((s, e)) => {
                    total += e - s;
                    Some((a, b))
                }
                None => Some((a, b)),
            };
        }
        total + cur.map_or(0, |(s, e)| e - s)
    }

    fn spin(us: u64) {
        let t = Instant::now();
        while t.elapsed().as_micros() < us as u128 {}
    }

    /// Three decode tokens with one layer each; the middle one is kept.
    fn run() -> Timeline {
        let mut tl = Timeline::new(None, vec![0], Timeline::capacity_for(1, 2, 3));
        tl.expect(3);
        tl.begin(5, 0);
        tl.end(0);
        let mut reads = 0;
        for token in 0..3u64 {
            spin(200);
            tl.begin(1, reads);
            spin(100);
            tl.acquire_enter(0, 0);
            for x in 0..3u32 {
                let started = Instant::now();
                spin(20);
                tl.submitted(started, token * 10 + u64::from(x), ObjectId { layer: 0, expert: 1 }, x, 4096, 0);
                reads += 1;
            }
            // The first wait sees all three finished; the Plan takes the other two after.
            for x in 0..3u32 {
                let started = Instant::now();
                spin(50);
                tl.completed(started, &completion(token * 10 + u64::from(x), 0, 1, x, 4096), 0, 2 - x as usize);
            }
            let started = Instant::now();
            spin(30);
            tl.copied(started, ObjectId { layer: 0, expert: 1 }, 0, 3 * 4096);
            tl.published(ObjectId { layer: 0, expert: 1 }, 0);
            tl.acquire_return(0, 0);
            spin(100);
            tl.release(0, 0);
            tl.resume_compute();
            spin(50);
            tl.end(reads);
        }
        tl
    }

    #[test]
    fn an_asynchronous_copy_in_flight_while_the_engine_computes_counts_as_overlap() {
        let mut tl = Timeline::new(Some(0), vec![0], 64);
        let o = ObjectId { layer: 0, expert: 2 };
        tl.begin(1, 0);
        tl.acquire_enter(0, 0);
        tl.copy_queued(Instant::now(), o, 1, 3, 4096);
        tl.acquire_return(0, 0);
        spin(200);
        tl.release(0, 0);
        tl.resume_compute();
        spin(100);
        tl.acquire_enter(0, 1);
        let started = Instant::now();
        spin(50);
        tl.copy_done(started, o, 1, 3);
        tl.acquire_return(0, 1);
        spin(100);
        tl.end(0);
        let x = tl.report().unwrap().total;
        assert!(x.copy_overlap_compute_ns >= 300_000, "{x:?}");
        assert!(x.copy_in_flight_ns >= x.copy_overlap_compute_ns + 50_000, "{x:?}");
        // Nothing in flight after the event was seen: the last 100 us are not counted.
        assert!(x.copy_in_flight_ns < x.wall_ns - 100_000, "{x:?}");
        let f = tl.file().unwrap();
        let kinds: Vec<Kind> = f.events.iter().map(|e| e.kind).filter(|k| matches!(k, Kind::Copy | Kind::CopyDone)).collect();
        assert_eq!(kinds, [Kind::Copy, Kind::CopyDone]);
    }

    #[test]
    fn busy_and_idle_partition_each_token_and_match_the_read_intervals() {
        let tl = run();
        let r = tl.report().unwrap();
        assert_eq!(r.tokens, 3);
        assert_eq!(r.events_token, Some(1));
        assert_eq!(r.events_dropped, 0);
        for t in &r.per_token {
            let x = &t.times;
            assert_eq!(x.busy_ns + x.idle_ns, x.wall_ns, "token {}", t.token);
            assert_eq!(x.idle.sum(), x.idle_ns);
            assert_eq!(x.busy.sum(), x.busy_ns);
            assert_eq!((x.reads, x.completions, x.plan_reads, x.copies, x.publishes, x.acquires, x.releases), (3, 3, 3, 1, 1, 1, 1));
            // Spins set lower bounds on each part.
            assert!(x.idle.between_ns >= 200_000 && x.idle.compute_ns >= 150_000 && x.idle.expert_compute_ns >= 100_000, "{x:?}");
            assert!(x.busy.wait_ns >= 50_000 && x.idle.copy_ns >= 30_000 && x.stalled_on_reads_ns >= 210_000, "{x:?}");
            // Taking back the two seen finished with the first is not device time.
            assert!(x.idle.wait_ns >= 100_000, "{x:?}");
        }
        let f = tl.file().unwrap();
        assert_eq!(f.token, 1);
        let end = f.events.last().unwrap();
        assert_eq!(end.kind, Kind::End);
        assert_eq!(end.t_ns, f.times.wall_ns);
        // The sweep's busy time is the union of the read intervals, computed apart.
        assert_eq!(union_busy(&f, end.t_ns), f.times.busy_ns);
        assert!(f.events.windows(2).all(|w| w[0].t_ns <= w[1].t_ns), "events in time order");
        assert!(f.reads().iter().all(|r| r.done_ns.is_some()));
        // All three were seen finished at the first completion's end.
        let done: Vec<Event> = f.events.iter().filter(|e| e.kind == Kind::Complete).copied().collect();
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|e| e.landed_ns == Some(done[0].end_ns())), "{done:?}");
        assert!(done[2].end_ns() >= done[0].end_ns() + 100_000, "{done:?}");
        let total: u64 = r.per_token.iter().map(|t| t.times.wall_ns).sum();
        assert_eq!(r.total.wall_ns, total);
    }

    #[test]
    fn the_buffer_is_fixed_and_overflow_is_counted() {
        let mut tl = Timeline::new(Some(0), vec![0], 4);
        let cap = tl.events.capacity();
        tl.begin(1, 0);
        for t in 0..10 {
            tl.submitted(Instant::now(), t, ObjectId { layer: 0, expert: 0 }, 0, 1, 0);
        }
        tl.end(10);
        let r = tl.report().unwrap();
        assert_eq!(tl.events.capacity(), cap, "no allocation past the buffer");
        assert_eq!(r.events + r.events_dropped, 12);
        assert!(r.events_dropped > 0);
        // A token after the chosen one leaves the kept events alone.
        tl.begin(1, 10);
        tl.end(10);
        assert_eq!(tl.file().unwrap().token, 0);
        assert!(Timeline::default().report().is_none());
    }
}
