//! The consumers the Plan holds on slots, by who holds them: an acquire in progress, the
//! acquire events the engine has yet to release (per layer and pass, innermost last), and
//! next-layer prefetch. Each consumer is in exactly one of these until it is dropped.

use super::{Hold, PassKey};
use std::collections::HashMap;

pub(super) struct Consumers {
    /// Taken by the acquire in progress (dropped if it fails).
    taking: Vec<Hold>,
    /// Outstanding acquire events per layer and pass, innermost last.
    events: HashMap<PassKey, Vec<Vec<Hold>>>,
    /// Held by prefetch, per layer index, until that layer's next acquire.
    prefetched: Vec<Vec<Hold>>,
}

impl Consumers {
    pub(super) fn new(n_layers: usize) -> Consumers {
        Consumers { taking: Vec::new(), events: HashMap::new(), prefetched: vec![Vec::new(); n_layers] }
    }

    /// A consumer the acquire in progress took.
    pub(super) fn take(&mut self, h: Hold) {
        self.taking.push(h);
    }

    /// Consumers taken earlier (a streamed pass's hits) that the acquire in progress serves.
    pub(super) fn adopt(&mut self, hits: &mut Vec<Hold>) {
        self.taking.append(hits);
    }

    pub(super) fn taking(&self) -> &[Hold] {
        &self.taking
    }

    /// The acquire in progress ends without an event: its consumers, for the caller to drop
    /// (a failed acquire) or to keep elsewhere (a stream's groups).
    pub(super) fn abandon(&mut self) -> Vec<Hold> {
        std::mem::take(&mut self.taking)
    }

    /// The acquire in progress succeeded: its consumers are the event of `key`.
    pub(super) fn commit(&mut self, key: PassKey) {
        let taken = std::mem::take(&mut self.taking);
        self.events.entry(key).or_default().push(taken);
    }

    /// Whether the innermost event of `key` holds a consumer.
    pub(super) fn holds_event(&self, key: PassKey) -> bool {
        self.events.get(&key).and_then(|e| e.last()).is_some_and(|taken| !taken.is_empty())
    }

    /// The innermost event of `key`, released; `None` without one.
    pub(super) fn release(&mut self, key: PassKey) -> Option<Vec<Hold>> {
        let stack = self.events.get_mut(&key)?;
        let event = stack.pop();
        if stack.is_empty() {
            self.events.remove(&key);
        }
        event
    }

    pub(super) fn hold_prefetched(&mut self, h: Hold) {
        self.prefetched[h.li].push(h);
    }

    /// The consumers prefetch holds on layer index `li`.
    pub(super) fn prefetched(&self, li: usize) -> &[Hold] {
        &self.prefetched[li]
    }

    /// Layer index `li`'s prefetch consumers, for the caller to drop.
    pub(super) fn take_prefetched(&mut self, li: usize) -> Vec<Hold> {
        std::mem::take(&mut self.prefetched[li])
    }

    /// Every prefetch consumer, for the caller to drop.
    pub(super) fn take_all_prefetched(&mut self) -> Vec<Hold> {
        self.prefetched.iter_mut().flat_map(std::mem::take).collect()
    }
}
