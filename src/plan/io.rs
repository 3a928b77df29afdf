//! The Plan's I/O: the source, the states of its windows and the tickets of the reads it has
//! out. It keeps two invariants the rest of the Plan relies on: a window moves only along the
//! lifecycle's transitions, and a ticket exists exactly while its read may still complete.

use super::{LifecycleError, ObjectId, Ticket, Version, WindowState, WindowTransition};
use crate::source::{Completion, ReadRequest, Source, SourceError};
use std::collections::HashMap;
use std::ptr::NonNull;

/// Reads in flight through one source.
pub(super) struct Io {
    /// First, so that it drops (draining every read still in flight) before anything else of
    /// the Plan, the pools the reads may land in included.
    source: Box<dyn Source>,
    windows: Vec<WindowState>,
    tickets: HashMap<u64, Ticket>,
    next_ticket: u64,
}

impl Io {
    pub(super) fn new(source: Box<dyn Source>) -> Io {
        let windows = vec![WindowState::Free; source.n_windows() as usize];
        Io { source, windows, tickets: HashMap::new(), next_ticket: 1 }
    }

    pub(super) fn source(&self) -> &dyn Source {
        self.source.as_ref()
    }

    pub(super) fn windows(&self) -> &[WindowState] {
        &self.windows
    }

    /// Whether window `w` is Free (and so may take a bundle).
    pub(super) fn is_free(&self, w: u32) -> bool {
        self.windows.get(w as usize) == Some(&WindowState::Free)
    }

    pub(super) fn step(&mut self, w: u32, t: WindowTransition) -> Result<(), LifecycleError> {
        self.windows[w as usize].step(w, t)
    }

    /// Every window not Free goes back to Free (a failed Plan whose reads were drained and
    /// whose bundles were never copied); the number discarded.
    pub(super) fn discard_windows(&mut self) -> Result<u64, LifecycleError> {
        let mut discarded = 0;
        for (w, state) in self.windows.iter_mut().enumerate() {
            if *state != WindowState::Free {
                state.step(w as u32, WindowTransition::Discard)?;
                discarded += 1;
            }
        }
        Ok(discarded)
    }

    /// A new ticket for extent `extent` of `object`, read into `slot` at `version` through
    /// window `w`; it stays active until its completion is taken ([`Io::take`]).
    pub(super) fn ticket(&mut self, object: ObjectId, extent: u32, slot: u32, version: Version, w: u32) -> Ticket {
        let id = self.next_ticket;
        self.next_ticket += 1;
        let t = Ticket { id, object, extent, slot, generation: version.generation, epoch: version.epoch, window: w };
        self.tickets.insert(id, t);
        t
    }

    /// The ticket a completion names, no longer active; `None` for a ticket never issued or
    /// already taken.
    pub(super) fn take(&mut self, id: u64) -> Option<Ticket> {
        self.tickets.remove(&id)
    }

    /// Tickets issued and not yet taken.
    pub(super) fn active(&self) -> usize {
        self.tickets.len()
    }

    /// What is still out: active tickets or windows not Free; `None` when idle.
    pub(super) fn busy(&self) -> Option<String> {
        let busy = self.windows.iter().filter(|w| **w != WindowState::Free).count();
        (!self.tickets.is_empty() || busy > 0).then(|| format!("{} active tickets, {busy} windows not Free", self.tickets.len()))
    }

    /// Starts `reads` (each with the host slot it is read straight into, or none for its
    /// window) in one call; on an error, how many of the first reads the source took, and why.
    /// The tickets of the reads it never took are taken back: no completion will name them.
    ///
    /// # Safety
    /// Each host target must be valid for its request's covering bytes, and neither read nor written
    /// by anything else until that read's completion was taken from the source (a failed Plan
    /// drains the source before it frees or reuses such memory).
    pub(super) unsafe fn submit(&mut self, reads: &[(ReadRequest, Option<NonNull<u8>>)]) -> Result<(), (usize, SourceError)> {
        // SAFETY: the caller's contract for each target.
        let submitted = unsafe { self.source.submit_vectored(reads) };
        if let Err((done, _)) = &submitted {
            for (r, _) in &reads[*done..] {
                self.tickets.remove(&r.ticket);
            }
        }
        submitted
    }

    pub(super) fn wait(&mut self) -> Result<Completion, SourceError> {
        self.source.wait()
    }

    pub(super) fn poll_ready(&mut self) -> bool {
        self.source.poll_ready()
    }

    /// Reads the device has not yet been seen to finish (see [`Source::in_flight`]), and
    /// finished ones the source holds for `wait`.
    pub(super) fn in_flight(&self) -> (usize, usize) {
        let n = self.source.in_flight();
        (n, self.source.outstanding().saturating_sub(n))
    }

    /// The next completion still queued in the source, its ticket taken back; `None` once
    /// nothing is outstanding.
    pub(super) fn drain_one(&mut self) -> Result<Option<Completion>, SourceError> {
        if self.source.outstanding() == 0 {
            return Ok(None);
        }
        let c = self.source.wait()?;
        self.tickets.remove(&c.ticket);
        Ok(Some(c))
    }

    /// Whether every read the source took has come back (what dropping the Plan's pools needs).
    pub(super) fn drained(&mut self) -> bool {
        self.source.drain().is_ok() && !self.source.undrained()
    }
}
