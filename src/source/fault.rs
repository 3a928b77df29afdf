//! Deterministic fault plans (seed 000 §5.4, Table 7), built into the normal binary.
//!
//! Source-level cells wrap any [`Source`] and perturb exactly one completion, chosen by its
//! submission index, so a cell fires at the same point on every run. Ownership-level cells
//! (held consumer, reset with outstanding work, shutdown with a live consumer) are played by
//! the Plan's engine adapter. A cell that never fired fails its validator.

use super::{Completion, ReadRequest, Source, SourceError, SourceStats};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::ptr::NonNull;

/// A deterministic fault cell (seed 000 §5.4, Table 7); `none` is the no-fault control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FaultCell {
    #[default]
    None,
    ShortRead,
    Eio,
    OutOfOrder,
    StaleCompletion,
    WrongObject,
    HeldConsumer,
    ResetOutstanding,
    ShutdownLiveConsumer,
    PartialBundle,
    // A delivered extent with one byte flipped: full byte count, every tag right, so that only
    // the digest check catches it. (No doc comment: the schema lists the cells as plain names.)
    CorruptByte,
}

/// What a cell must show (Table 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// Exact output and clean closure.
    Control,
    /// Zero accepted tokens and logits, nothing invalid published, the source drained.
    Fatal,
    /// Exact against the no-fault control on every surface, balanced closure.
    Recoverable,
}

impl FaultCell {
    /// The name used on the command line and in files.
    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }

    pub fn expect(self) -> Expect {
        match self {
            FaultCell::None => Expect::Control,
            FaultCell::ShortRead
            | FaultCell::Eio
            | FaultCell::StaleCompletion
            | FaultCell::WrongObject
            | FaultCell::PartialBundle
            | FaultCell::CorruptByte => Expect::Fatal,
            FaultCell::OutOfOrder | FaultCell::HeldConsumer | FaultCell::ResetOutstanding | FaultCell::ShutdownLiveConsumer => {
                Expect::Recoverable
            }
        }
    }

    /// The reuse invariant the cell exercises.
    pub fn invariant(self) -> &'static str {
        match self {
            FaultCell::None => "ordinary publication and closure",
            FaultCell::ShortRead | FaultCell::Eio | FaultCell::PartialBundle => "publish only after complete valid movement",
            FaultCell::StaleCompletion | FaultCell::WrongObject => "a published version denotes the requested object and epoch",
            FaultCell::CorruptByte => "a published version holds the requested object's bytes",
            FaultCell::OutOfOrder => "legal completion order is not overconstrained",
            FaultCell::HeldConsumer => "no reuse before declared consumers finish",
            FaultCell::ResetOutstanding | FaultCell::ShutdownLiveConsumer => "drain or invalidate outstanding versions",
        }
    }

    fn perturbs_source(self) -> bool {
        matches!(
            self,
            FaultCell::ShortRead
                | FaultCell::Eio
                | FaultCell::OutOfOrder
                | FaultCell::StaleCompletion
                | FaultCell::WrongObject
                | FaultCell::PartialBundle
                | FaultCell::ResetOutstanding
                | FaultCell::CorruptByte
        )
    }
}

pub struct FaultySource {
    inner: Box<dyn Source>,
    cell: FaultCell,
    submitted: u64,
    /// Completions taken from `inner` and handed out last-first (out of order).
    held: VecDeque<Completion>,
    /// Late duplicates: handed out only when nothing else is outstanding, which a Plan never
    /// waits for; only a reset's or shutdown's drain retires them.
    late: VecDeque<Completion>,
    /// corrupt_byte: the requests in flight and their host targets (addresses), to find where
    /// a completion's bytes landed.
    requests: HashMap<u64, (ReadRequest, Option<usize>)>,
    fired: u64,
}

impl FaultySource {
    pub fn wrap(inner: Box<dyn Source>, cell: FaultCell) -> Box<dyn Source> {
        if !cell.perturbs_source() {
            return inner;
        }
        Box::new(FaultySource {
            inner,
            cell,
            submitted: 0,
            held: VecDeque::new(),
            late: VecDeque::new(),
            requests: HashMap::new(),
            fired: 0,
        })
    }
}

impl Source for FaultySource {
    fn n_windows(&self) -> u32 {
        self.inner.n_windows()
    }

    fn window_size(&self) -> u64 {
        self.inner.window_size()
    }

    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError> {
        self.submitted += 1;
        self.inner.submit(req)?;
        if self.cell == FaultCell::CorruptByte && self.fired == 0 {
            self.requests.insert(req.ticket, (req, None));
        }
        Ok(())
    }

    fn reads_into_host(&self) -> bool {
        self.inner.reads_into_host()
    }

    fn drain(&mut self) -> Result<(), SourceError> {
        self.held.clear();
        self.late.clear();
        self.requests.clear();
        self.inner.drain()
    }

    fn undrained(&self) -> bool {
        self.inner.undrained()
    }

    fn room(&self) -> usize {
        self.inner.room()
    }

    unsafe fn submit_vectored(&mut self, reads: &[(ReadRequest, Option<NonNull<u8>>)]) -> Result<(), (usize, SourceError)> {
        // SAFETY: the caller's guarantees are passed on unchanged.
        let r = unsafe { self.inner.submit_vectored(reads) };
        let n = match &r {
            Ok(()) => reads.len(),
            Err((n, _)) => *n,
        };
        self.submitted += n as u64;
        if self.cell == FaultCell::CorruptByte && self.fired == 0 {
            for (req, into) in &reads[..n] {
                self.requests.insert(req.ticket, (*req, into.map(|p| p.as_ptr() as usize)));
            }
        }
        r
    }

    fn wait(&mut self) -> Result<Completion, SourceError> {
        if self.cell == FaultCell::OutOfOrder && self.fired == 0 && self.inner.outstanding() > 1 {
            // Take every outstanding completion and hand them out last-first, once.
            while self.inner.outstanding() > 0 {
                let c = self.inner.wait()?;
                self.held.push_front(c);
            }
            self.fired += 1;
        }
        if let Some(c) = self.held.pop_front() {
            return Ok(c);
        }
        if self.inner.outstanding() == 0 {
            if let Some(c) = self.late.pop_front() {
                return Ok(c);
            }
        }
        let mut c = self.inner.wait()?;
        // The first completion (fatal cells fire in the prefill, before any logits exist); a
        // partial bundle fails the second extent of a bundle.
        let req = self.requests.remove(&c.ticket);
        let target = match self.cell {
            FaultCell::PartialBundle => c.extent == 1,
            FaultCell::CorruptByte => req.is_some_and(|(r, _)| c.result == Ok(r.len)),
            _ => true,
        };
        if target && self.fired == 0 {
            self.fired += 1;
            match self.cell {
                FaultCell::ShortRead => {
                    if let Ok(n) = c.result {
                        c.result = Ok(n.saturating_sub(1));
                    }
                }
                FaultCell::Eio | FaultCell::PartialBundle => c.result = Err(libc::EIO),
                FaultCell::StaleCompletion => c.epoch = c.epoch.wrapping_sub(1),
                FaultCell::WrongObject => c.object.expert = c.object.expert.wrapping_add(1),
                FaultCell::ResetOutstanding => {
                    // A late duplicate of this completion stays outstanding: only a reset
                    // (which must drain it, never publish it) or a stale check can retire it.
                    self.late.push_back(c);
                }
                FaultCell::CorruptByte => {
                    // The middle byte of the extent's logical bytes, where they landed.
                    let (r, into) = req.expect("checked above");
                    let head = r.offset - super::align_down(r.offset);
                    let flipped = match into {
                        // SAFETY: a host target is valid for the covering read and the source's
                        // alone until this completion is returned (submit_vectored's contract).
                        Some(addr) => unsafe {
                            *((addr as *mut u8).add((head + r.len / 2) as usize)) ^= 0xff;
                            true
                        },
                        None => self.inner.corrupt(r.window, r.window_offset + head + r.len / 2),
                    };
                    if flipped {
                        self.requests.clear();
                    } else {
                        self.fired -= 1;
                    }
                }
                _ => {}
            }
        }
        Ok(c)
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.held.len() + self.late.len()
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn poll_ready(&mut self) -> bool {
        // Completions back together are taken together, as without a fault; late duplicates
        // come back only once nothing else is outstanding.
        !self.held.is_empty() || self.inner.poll_ready()
    }

    fn window(&self, w: u32) -> &[u8] {
        self.inner.window(w)
    }

    fn corrupt(&mut self, w: u32, at: u64) -> bool {
        self.inner.corrupt(w, at)
    }

    fn stats(&self) -> SourceStats {
        let mut s = self.inner.stats();
        s.faults_fired = self.fired;
        s
    }
}
