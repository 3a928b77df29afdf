//! The two lifecycles of seed 000 §3.4, as total functions that name every illegal step.
//!
//! ```text
//! window:  Free → Reading → HostReady → Copying → Free
//! slot:    Vacant → Loading → DeviceReady → InUse → Recyclable → Vacant
//! ```
//!
//! Retention (LRU, pins, prefetch) reads the slot lifecycle this way:
//! - `Consume` takes one consumer. `DeviceReady → InUse` (first use after publication) and
//!   `Recyclable → InUse` (a cache hit on a retained object: same generation, consumer count
//!   0 → 1) are the two ways in; `InUse → InUse` adds a consumer to a slot already in use.
//! - `Release` drops one consumer: `InUse → InUse` while others remain, `InUse → Recyclable`
//!   when the last one leaves.
//! - `Evict` is `Recyclable → Vacant`: the only way a loaded object leaves its slot.
//! - `Invalidate` is `Loading → Vacant` and exists for reset only: a load whose epoch a reset
//!   retired can never publish, and invalidating it is how its slot comes back. The slot table
//!   refuses it for a load of the current epoch.
//!
//! Every other (state, transition) pair is a [`LifecycleError`] and changes nothing.

use serde::Serialize;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum WindowState {
    Free,
    Reading,
    HostReady,
    Copying,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum WindowTransition {
    /// Free → Reading: the bundle's reads are submitted.
    BeginRead,
    /// Reading → HostReady: every extent completed and was validated.
    Assembled,
    /// HostReady → Copying: the copy into the slot starts.
    BeginCopy,
    /// Copying → Free: the copy completed.
    CopyDone,
    /// Reading | HostReady | Copying → Free: the bundle was abandoned after its reads were
    /// drained (or its copy failed); its slot was never published. Only a failed Plan's
    /// shutdown takes this step.
    Discard,
}

impl WindowTransition {
    pub const ALL: [WindowTransition; 5] = [
        WindowTransition::BeginRead,
        WindowTransition::Assembled,
        WindowTransition::BeginCopy,
        WindowTransition::CopyDone,
        WindowTransition::Discard,
    ];
}

impl WindowState {
    pub const ALL: [WindowState; 4] = [WindowState::Free, WindowState::Reading, WindowState::HostReady, WindowState::Copying];

    /// The state after `t`, or `None` where the lifecycle has no such step.
    pub fn next(self, t: WindowTransition) -> Option<WindowState> {
        use WindowState::*;
        use WindowTransition::*;
        match (self, t) {
            (Free, BeginRead) => Some(Reading),
            (Reading, Assembled) => Some(HostReady),
            (HostReady, BeginCopy) => Some(Copying),
            (Copying, CopyDone) => Some(Free),
            (Reading | HostReady | Copying, Discard) => Some(Free),
            _ => None,
        }
    }

    /// Applies `t` to window `window`; on error the state is left as it was.
    pub fn step(&mut self, window: u32, t: WindowTransition) -> Result<(), LifecycleError> {
        *self = self.next(t).ok_or(LifecycleError::Window { window, from: *self, attempted: t })?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SlotState {
    Vacant,
    Loading,
    DeviceReady,
    InUse,
    Recyclable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SlotTransition {
    /// Vacant → Loading (a new generation starts).
    Load,
    /// Loading → DeviceReady: the whole bundle was read, validated and copied.
    Publish,
    /// DeviceReady | Recyclable → InUse, InUse → InUse: one more consumer.
    Consume,
    /// InUse → InUse | Recyclable: one consumer fewer.
    Release,
    /// Recyclable → Vacant.
    Evict,
    /// Loading → Vacant, for a load retired by a reset.
    Invalidate,
}

impl SlotTransition {
    pub const ALL: [SlotTransition; 6] = [
        SlotTransition::Load,
        SlotTransition::Publish,
        SlotTransition::Consume,
        SlotTransition::Release,
        SlotTransition::Evict,
        SlotTransition::Invalidate,
    ];
}

impl SlotState {
    pub const ALL: [SlotState; 5] =
        [SlotState::Vacant, SlotState::Loading, SlotState::DeviceReady, SlotState::InUse, SlotState::Recyclable];

    /// The (state, consumers) after `t`, or `None` where the lifecycle has no such step.
    /// Consumers are non-zero exactly in `InUse`.
    pub fn next(self, consumers: u32, t: SlotTransition) -> Option<(SlotState, u32)> {
        use SlotState::*;
        use SlotTransition::*;
        match (self, t) {
            (Vacant, Load) => Some((Loading, 0)),
            (Loading, Publish) => Some((DeviceReady, 0)),
            (DeviceReady | Recyclable, Consume) => Some((InUse, 1)),
            (InUse, Consume) => consumers.checked_add(1).map(|c| (InUse, c)),
            (InUse, Release) if consumers > 1 => Some((InUse, consumers - 1)),
            (InUse, Release) if consumers == 1 => Some((Recyclable, 0)),
            (Recyclable, Evict) => Some((Vacant, 0)),
            (Loading, Invalidate) => Some((Vacant, 0)),
            _ => None,
        }
    }
}

/// Whose state an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LifecycleError {
    Window { window: u32, from: WindowState, attempted: WindowTransition },
    Slot { layer: u32, slot: u32, from: SlotState, consumers: u32, attempted: SlotTransition },
}

impl fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifecycleError::Window { window, from, attempted } => {
                write!(f, "window {window}: {attempted:?} is not a transition from {from:?}")
            }
            LifecycleError::Slot { layer, slot, from, consumers, attempted } => {
                write!(f, "layer {layer} slot {slot}: {attempted:?} is not a transition from {from:?} ({consumers} consumers)")
            }
        }
    }
}

impl std::error::Error for LifecycleError {}

/// A slot's version: the generation of its current object and the epoch it was loaded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Version {
    pub generation: u64,
    pub epoch: u64,
}

/// The mutable state of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlotCell {
    pub state: SlotState,
    pub object: Option<crate::plan::ObjectId>,
    /// Incremented each time the slot starts loading a new object.
    pub generation: u64,
    /// The epoch the current generation was loaded in.
    pub epoch: u64,
    pub consumers: u32,
}

impl Default for SlotCell {
    fn default() -> Self {
        SlotCell { state: SlotState::Vacant, object: None, generation: 0, epoch: 0, consumers: 0 }
    }
}

impl SlotCell {
    pub fn version(&self) -> Version {
        Version { generation: self.generation, epoch: self.epoch }
    }

    /// Applies the state part of `t` (state and consumer count) to slot (`layer`, `slot`);
    /// on error nothing changes. Object, generation and epoch are the table's business.
    pub fn step(&mut self, layer: u32, slot: u32, t: SlotTransition) -> Result<(), LifecycleError> {
        let (state, consumers) = self.state.next(self.consumers, t).ok_or(LifecycleError::Slot {
            layer,
            slot,
            from: self.state,
            consumers: self.consumers,
            attempted: t,
        })?;
        self.state = state;
        self.consumers = consumers;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The reference: the edges of §3.4 plus the retention reading documented above, written
    // out independently of `next` as data.
    const WINDOW_EDGES: [(WindowState, WindowTransition, WindowState); 7] = [
        (WindowState::Free, WindowTransition::BeginRead, WindowState::Reading),
        (WindowState::Reading, WindowTransition::Assembled, WindowState::HostReady),
        (WindowState::HostReady, WindowTransition::BeginCopy, WindowState::Copying),
        (WindowState::Copying, WindowTransition::CopyDone, WindowState::Free),
        (WindowState::Reading, WindowTransition::Discard, WindowState::Free),
        (WindowState::HostReady, WindowTransition::Discard, WindowState::Free),
        (WindowState::Copying, WindowTransition::Discard, WindowState::Free),
    ];

    /// Reference slot model: (state, consumers) → (state, consumers).
    fn slot_reference(s: SlotState, c: u32, t: SlotTransition) -> Option<(SlotState, u32)> {
        const EDGES: [(SlotState, SlotTransition, SlotState); 8] = [
            (SlotState::Vacant, SlotTransition::Load, SlotState::Loading),
            (SlotState::Loading, SlotTransition::Publish, SlotState::DeviceReady),
            (SlotState::DeviceReady, SlotTransition::Consume, SlotState::InUse),
            (SlotState::Recyclable, SlotTransition::Consume, SlotState::InUse),
            (SlotState::InUse, SlotTransition::Consume, SlotState::InUse),
            (SlotState::InUse, SlotTransition::Release, SlotState::Recyclable),
            (SlotState::Recyclable, SlotTransition::Evict, SlotState::Vacant),
            (SlotState::Loading, SlotTransition::Invalidate, SlotState::Vacant),
        ];
        let (_, _, to) = EDGES.iter().find(|(f, tr, _)| *f == s && *tr == t)?;
        match t {
            SlotTransition::Consume => c.checked_add(1).map(|c2| (*to, c2)),
            SlotTransition::Release => match c {
                0 => None,
                1 => Some((SlotState::Recyclable, 0)),
                _ => Some((SlotState::InUse, c - 1)),
            },
            _ => Some((*to, 0)),
        }
    }

    fn window_transition() -> impl Strategy<Value = WindowTransition> {
        prop::sample::select(WindowTransition::ALL.to_vec())
    }

    fn slot_transition() -> impl Strategy<Value = SlotTransition> {
        prop::sample::select(SlotTransition::ALL.to_vec())
    }

    /// A legal window sequence: whole cycles, cut anywhere.
    fn legal_window_sequence() -> impl Strategy<Value = Vec<WindowTransition>> {
        (0usize..40).prop_map(|n| (0..n).map(|i| WindowTransition::ALL[i % 4]).collect())
    }

    /// A legal slot sequence, built by a walk that only takes edges the reference allows,
    /// driven by random choices.
    fn legal_slot_sequence() -> impl Strategy<Value = Vec<SlotTransition>> {
        prop::collection::vec(0usize..6, 0..60).prop_map(|choices| {
            let (mut s, mut c) = (SlotState::Vacant, 0);
            let mut out = Vec::new();
            for k in choices {
                let legal: Vec<SlotTransition> = SlotTransition::ALL.into_iter().filter(|&t| slot_reference(s, c, t).is_some()).collect();
                let t = legal[k % legal.len()];
                (s, c) = slot_reference(s, c, t).unwrap();
                out.push(t);
            }
            out
        })
    }

    proptest! {
        #[test]
        fn legal_window_sequences_succeed(seq in legal_window_sequence()) {
            let mut w = WindowState::Free;
            for (i, t) in seq.iter().enumerate() {
                prop_assert_eq!(w.step(3, *t), Ok(()));
                prop_assert_eq!(w, WINDOW_EDGES[i % 4].2);
            }
        }

        #[test]
        fn any_window_sequence_matches_reference(seq in prop::collection::vec(window_transition(), 0..60)) {
            let mut w = WindowState::Free;
            for t in seq {
                let before = w;
                let expected = WINDOW_EDGES.iter().find(|(f, tr, _)| *f == before && *tr == t).map(|e| e.2);
                match (w.step(5, t), expected) {
                    (Ok(()), Some(to)) => prop_assert_eq!(w, to),
                    (Err(e), None) => {
                        prop_assert_eq!(e, LifecycleError::Window { window: 5, from: before, attempted: t });
                        prop_assert_eq!(w, before, "an illegal step changed the state");
                    }
                    (got, want) => prop_assert!(false, "{:?} --{:?}--> got {:?}, reference {:?}", before, t, got, want),
                }
            }
        }

        #[test]
        fn legal_slot_sequences_succeed(seq in legal_slot_sequence()) {
            let mut cell = SlotCell::default();
            for t in seq {
                let want = slot_reference(cell.state, cell.consumers, t).unwrap();
                prop_assert_eq!(cell.step(1, 2, t), Ok(()));
                prop_assert_eq!((cell.state, cell.consumers), want);
                prop_assert_eq!(cell.consumers > 0, cell.state == SlotState::InUse);
            }
        }

        #[test]
        fn any_slot_sequence_matches_reference(seq in prop::collection::vec(slot_transition(), 0..80)) {
            let mut cell = SlotCell::default();
            for t in seq {
                let before = cell;
                match (cell.step(4, 9, t), slot_reference(before.state, before.consumers, t)) {
                    (Ok(()), Some(want)) => prop_assert_eq!((cell.state, cell.consumers), want),
                    (Err(e), None) => {
                        prop_assert_eq!(e, LifecycleError::Slot {
                            layer: 4, slot: 9, from: before.state, consumers: before.consumers, attempted: t
                        });
                        prop_assert_eq!(cell, before, "an illegal step changed the slot");
                    }
                    (got, want) => prop_assert!(false, "{:?} --{:?}--> got {:?}, reference {:?}", before, t, got, want),
                }
            }
        }
    }

    #[test]
    fn every_pair_is_decided() {
        // 7 legal window pairs of 20; 8 legal slot edges, Release split by consumer count.
        let legal =
            WindowState::ALL.iter().flat_map(|s| WindowTransition::ALL.iter().map(move |t| s.next(*t))).filter(Option::is_some).count();
        assert_eq!(legal, 7);
        assert_eq!(SlotState::Recyclable.next(0, SlotTransition::Release), None);
        assert_eq!(SlotState::InUse.next(1, SlotTransition::Release), Some((SlotState::Recyclable, 0)));
        assert_eq!(SlotState::InUse.next(3, SlotTransition::Release), Some((SlotState::InUse, 2)));
        assert_eq!(SlotState::Vacant.next(0, SlotTransition::Publish), None);
        assert_eq!(SlotState::DeviceReady.next(0, SlotTransition::Evict), None);
        assert_eq!(SlotState::InUse.next(1, SlotTransition::Evict), None);
        assert_eq!(SlotState::InUse.next(u32::MAX, SlotTransition::Consume), None);
    }
}
