//! The Plan's work between calls: a next-layer prefetch in flight, or a streamed event whose
//! later passes are still to serve, never both. A stream starts once the prefetch before it is
//! completed, and its last pass is what starts the next prefetch.

use super::{Bundle, Hold, Load, Passes, PlanError};
use std::collections::{HashMap, VecDeque};

pub(super) struct Work {
    /// How events are cut into streamed passes ([`super::Plan::stream_passes`]).
    passes: Passes,
    now: Now,
}

enum Now {
    Idle,
    Prefetch(Prefetch),
    Stream(Stream),
}

impl Work {
    pub fn new() -> Work {
        Work { passes: Passes::default(), now: Now::Idle }
    }

    pub fn passes(&self) -> Passes {
        self.passes
    }

    pub fn set_passes(&mut self, passes: Passes) {
        self.passes = passes;
    }

    /// The streamed event in progress.
    pub fn stream(&self) -> Option<&Stream> {
        match &self.now {
            Now::Stream(s) => Some(s),
            _ => None,
        }
    }

    pub fn prefetching(&self) -> bool {
        matches!(self.now, Now::Prefetch(_))
    }

    pub fn take_stream(&mut self) -> Option<Stream> {
        match std::mem::replace(&mut self.now, Now::Idle) {
            Now::Stream(s) => Some(s),
            other => {
                self.now = other;
                None
            }
        }
    }

    pub fn take_prefetch(&mut self) -> Option<Prefetch> {
        match std::mem::replace(&mut self.now, Now::Idle) {
            Now::Prefetch(p) => Some(p),
            other => {
                self.now = other;
                None
            }
        }
    }

    /// Files the streamed event; refused beside a prefetch or another stream.
    pub fn put_stream(&mut self, s: Stream) -> Result<(), PlanError> {
        self.put(Now::Stream(s))
    }

    /// Files the prefetch in flight; refused beside a stream or another prefetch.
    pub fn put_prefetch(&mut self, p: Prefetch) -> Result<(), PlanError> {
        self.put(Now::Prefetch(p))
    }

    fn put(&mut self, next: Now) -> Result<(), PlanError> {
        let busy = match &self.now {
            Now::Idle => {
                self.now = next;
                return Ok(());
            }
            Now::Prefetch(p) => format!("layer index {}'s prefetch is in flight", p.li),
            Now::Stream(s) => format!("layer {}'s streamed event is at pass {}", s.layer, s.next),
        };
        Err(PlanError::OutstandingWork { detail: busy })
    }
}

/// Next-layer prefetch reads in flight while the engine computes.
pub(super) struct Prefetch {
    /// The layer index they load.
    pub li: usize,
    /// Every load, in order; the first `submitted` have their reads out.
    pub loads: Vec<Load>,
    pub submitted: usize,
    /// Bundles by window, for the loads submitted and not yet published.
    pub inflight: HashMap<u32, Bundle>,
}

/// A layer event served in passes while its later groups are still being read: each group is
/// claimed (hits take consumers, misses their slots, reads go out in group order) as soon as
/// the groups still held leave room for it in the layer's unpinned capacity, and the reads run
/// on while the engine computes the earlier passes.
pub(super) struct Stream {
    pub li: usize,
    pub layer: u32,
    /// The pass the engine asks for next.
    pub next: u32,
    /// Per pass: its experts; the first `claimed` groups have their consumers and loads.
    pub groups: Vec<Vec<u32>>,
    pub claimed: usize,
    /// Per pass: the consumers its hits took when it was claimed, and its loads.
    pub hits: Vec<Vec<Hold>>,
    pub loads: Vec<Vec<Load>>,
    pub pending: VecDeque<Load>,
    pub inflight: HashMap<u32, Bundle>,
}
