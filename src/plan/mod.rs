//! The Plan: an immutable [`Manifest`] (objects → extents, covering reads, windows, slots,
//! stable addresses) and the mutable state that decides which bytes those addresses denote.
//!
//! The engine calls, from one thread inside graph compute:
//! - [`Plan::bind`] once per (layer, role) at load time: the engine's pool for it, which the
//!   Plan fills slot by slot through a [`SlotWriter`] (a host-to-device copy on a device).
//!   A Plan made with [`Plan::new`] owns host pools instead ([`Plan::pool`]: stable base
//!   addresses, slot `s` at `pool(L, r) + s * stride(L, r)`; see [`Plan::slot_layout`]).
//! - [`Plan::acquire`] after a MoE layer's router, [`Plan::release`] after the layer, once per
//!   pass (group); a pass whose acquire wrote only -1 has nothing to release.
//! - [`Plan::reset`] between requests, [`Plan::shutdown`] at the end.
//!
//! Publication: a slot's bytes become visible (DeviceReady, then InUse) only after every extent
//! of its bundle was read into a window (or, aligned and into host memory, straight into the
//! Loading slot), every completion was validated (ticket, object, extent, window, epoch,
//! generation, byte count), and the window was copied into the slot.
//! Fail closed: the first error fails the Plan; every later acquire and reset returns an error.
//! Release and shutdown still work on a failed Plan, so that consumers balance and the source
//! drains; a failed Plan's interrupted windows are left as they were and reported.

pub mod budget;
mod consumers;
mod coverage;
mod io;
mod lifecycle;
mod manifest;
pub mod options;
mod policy;
mod pools;
use pools::{Copies, CopyId, InFlightCopy, PoolIx, PoolMem, Pools};
pub use pools::{CopyError, SlotLayout, SlotWriter};
mod prefetch;
mod reads;
pub mod report;
mod serve;
pub mod simulate;
mod slots;
mod stream;
mod table;
use stream::{groups, resident_first};
mod telemetry;
pub mod timeline;
mod verify;
mod work;
use work::{Prefetch, Stream};

pub use coverage::{Coverage, CoverageError, CoverageReport, LayerCoverage};
pub use lifecycle::{LifecycleError, SlotCell, SlotState, SlotTransition, Version, WindowState, WindowTransition};
pub use manifest::{ExtentPlan, LayerPlan, Manifest, ObjectId, ObjectPlan, Role, RoleBytes};
pub use options::{DeviceDepth, PlanOptions, SizedFrom, Sizing, SourceKind};
pub use policy::{PolicySpec, ReplacementPolicy, Retain};
pub use table::{LayerShape, LayerSlots, Lock, SlotError, SlotTable, TableState};
pub use telemetry::{Closure, DigestCheck, Movement, RejectKind, SemanticUnion, Telemetry, Traffic, Union};
pub use timeline::Timeline;

use crate::source::{align_up, AlignedBuf, Completion, ReadRequest, Source, SourceError, ALIGN};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

/// Why a Plan operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The Plan failed earlier, with `first`; it accepts no more work.
    Failed {
        first: Box<PlanError>,
    },
    /// The Plan was shut down.
    Closed,
    UnknownLayer {
        layer: u32,
    },
    SlotsLength {
        ids: usize,
        slots: usize,
    },
    ExpertOutOfRange {
        layer: u32,
        index: usize,
        id: i32,
        n_experts: u32,
    },
    /// A group member found neither a Vacant slot nor a Recyclable one to evict.
    NoSlot {
        object: ObjectId,
    },
    /// A completion was refused before anything became visible.
    Rejected {
        kind: RejectKind,
        ticket: u64,
        detail: String,
    },
    Lifecycle(LifecycleError),
    Slot(SlotError),
    Source(SourceError),
    NoOutstandingAcquire {
        layer: u32,
        pass: u32,
    },
    ConsumersLive {
        consumers: u64,
    },
    OutstandingWork {
        detail: String,
    },
    /// A load into a slot whose shared layer buffer holds another layer's live object.
    BufferLive {
        layer: u32,
        slot: u32,
        other: u32,
        state: String,
    },
    /// A pool request that disagrees with the manifest.
    PoolMismatch {
        detail: String,
    },
    /// The copy of a window into its slot failed.
    Copy(CopyError),
    Config {
        detail: String,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Failed { first } => write!(f, "plan failed earlier: {first}"),
            PlanError::Closed => write!(f, "plan is shut down"),
            PlanError::UnknownLayer { layer } => write!(f, "layer {layer} is not a managed MoE layer"),
            PlanError::SlotsLength { ids, slots } => write!(f, "{ids} expert ids but {slots} slot entries"),
            PlanError::ExpertOutOfRange { layer, index, id, n_experts } => {
                write!(f, "layer {layer}: expert id {id} at index {index} is outside [0, {n_experts})")
            }
            PlanError::NoSlot { object } => write!(f, "object {object}: no Vacant or Recyclable slot"),
            PlanError::BufferLive { layer, slot, other, state } => {
                write!(f, "layer {layer} slot {slot}: its shared buffer holds a {state} object of layer {other}")
            }
            PlanError::Rejected { kind, ticket, detail } => {
                write!(f, "completion of ticket {ticket} rejected ({}): {detail}", kind.name())
            }
            PlanError::Lifecycle(e) => write!(f, "{e}"),
            PlanError::Slot(e) => write!(f, "{e}"),
            PlanError::Source(e) => write!(f, "{e}"),
            PlanError::NoOutstandingAcquire { layer, pass } => {
                write!(f, "release of layer {layer} pass {pass} without an outstanding acquire")
            }
            PlanError::ConsumersLive { consumers } => write!(f, "{consumers} consumers are still live"),
            PlanError::OutstandingWork { detail } => write!(f, "outstanding work: {detail}"),
            PlanError::PoolMismatch { detail } => write!(f, "pool request refused: {detail}"),
            PlanError::Copy(e) => write!(f, "copy into a slot failed: {e}"),
            PlanError::Config { detail } => write!(f, "{detail}"),
        }
    }
}

impl std::error::Error for PlanError {}

impl From<SlotError> for PlanError {
    fn from(e: SlotError) -> Self {
        match e {
            SlotError::Lifecycle(l) => PlanError::Lifecycle(l),
            SlotError::ConsumersLive { consumers } => PlanError::ConsumersLive { consumers },
            e => PlanError::Slot(e),
        }
    }
}

impl From<LifecycleError> for PlanError {
    fn from(e: LifecycleError) -> Self {
        PlanError::Lifecycle(e)
    }
}

impl From<SourceError> for PlanError {
    fn from(e: SourceError) -> Self {
        PlanError::Source(e)
    }
}

/// One submitted read: what its completion must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub id: u64,
    pub object: ObjectId,
    pub extent: u32,
    pub slot: u32,
    pub generation: u64,
    pub epoch: u64,
    pub window: u32,
}

/// A bundle being assembled in a window (or, extent by extent, straight in its slot).
struct Bundle {
    object: ObjectId,
    slot: u32,
    version: Version,
    received: Vec<bool>,
    remaining: usize,
    /// Per extent: its covering read lands in the slot itself, not in the window.
    direct: Vec<bool>,
}

/// A load begun: the object, the slot it loads into and the slot's loading version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Load {
    object: ObjectId,
    slot: u32,
    v: Version,
}

/// One bundle to submit: the window it is read through, and its load.
#[derive(Debug, Clone, Copy)]
struct Job {
    window: u32,
    load: Load,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Running,
    /// The first error, whose kind every later refusal keeps.
    Failed(PlanError),
    Closed,
}

/// One engine pass of a MoE layer, as acquire and release name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PassKey {
    layer: u32,
    pass: u32,
}

/// Time so far in source reads and in window → slot copies, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoTime {
    pub read_ns: u64,
    pub copy_ns: u64,
}

/// A consumer taken on a slot: its layer index, the slot and the version it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    li: usize,
    slot: u32,
    v: Version,
}

pub struct Plan {
    /// First, so that its source drops (draining every read still in flight) before the pools
    /// the reads may land in.
    io: io::Io,
    manifest: Manifest,
    /// Per layer buffer, one slot pool per role in role order.
    pools: Pools,
    /// The slot table and the replacement policy, kept in step.
    slots: slots::Slots,
    /// Consumers held on slots: by the acquire in progress, by acquire events, by prefetch.
    consumers: consumers::Consumers,
    /// Next-layer prefetch reads submitted but not yet taken back: (layer index, loads, bundles
    /// by window). They run while the engine computes; the next Plan call completes them.
    status: Status,
    /// What observes the lifecycle without steering it.
    obs: Observers,
    /// A prefetch in flight or a streamed event in progress, and how events are cut into passes.
    work: work::Work,
    /// Copies in flight, oldest first.
    copies: Copies,
}

/// What the Plan records of its own work: counters, the timeline, the unions the bounds are
/// stated over, and the digests reads are checked against. None of it decides a transition.
struct Observers {
    tel: Telemetry,
    tl: Timeline,
    sem: BTreeSet<ObjectId>,
    sched: BTreeSet<ObjectId>,
    /// Expected extent digests ([`Plan::expect_digests`]); None verifies nothing.
    digests: Option<verify::Expected>,
    /// The engine's CPU threads ([`Plan::engine_threads`]); None: not said.
    engine_threads: Option<usize>,
    /// The source's counters when the current request began ([`Plan::observe_anew`]).
    source_base: crate::source::SourceStats,
}

/// Distinct experts per engine pass where events are streamed ([`Plan::stream_passes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Passes {
    /// Per pass of a one-token event (absent: not streamed).
    pub token: Option<u32>,
    /// Per pass of an event of several tokens, a prompt ubatch (absent: not streamed).
    pub prompt: Option<u32>,
}

impl Passes {
    /// The pass size of an event of `n_ids` selections in a layer where a token selects
    /// `n_used` (0: unknown), where it is streamed.
    pub fn per_pass(&self, n_ids: usize, n_used: u32) -> Option<u32> {
        // The engine runs a one-token ubatch in passes of the prompt pass where no token pass is set.
        let p = if n_used > 0 && n_ids == n_used as usize { self.token.or(self.prompt) } else { self.prompt };
        p.filter(|&p| p > 0)
    }
}

impl Plan {
    /// A Plan over `manifest` with the policy `spec` (whose pins must be the manifest's).
    pub fn new(manifest: Manifest, spec: &PolicySpec, source: Box<dyn Source>) -> Result<Plan, PlanError> {
        let policy = spec.build(&manifest).map_err(|e| PlanError::Config { detail: format!("{e:#}") })?;
        Plan::with_policy(manifest, policy, source)
    }

    /// A Plan whose slot pools are the engine's, each bound with [`Plan::bind`] before use.
    pub fn for_engine(manifest: Manifest, spec: &PolicySpec, source: Box<dyn Source>) -> Result<Plan, PlanError> {
        let policy = spec.build(&manifest).map_err(|e| PlanError::Config { detail: format!("{e:#}") })?;
        Plan::build(manifest, policy, source, false)
    }

    /// A Plan with any policy. Allocates every slot pool now; addresses never move.
    pub fn with_policy(manifest: Manifest, policy: Box<dyn ReplacementPolicy>, source: Box<dyn Source>) -> Result<Plan, PlanError> {
        Plan::build(manifest, policy, source, true)
    }

    fn build(manifest: Manifest, policy: Box<dyn ReplacementPolicy>, source: Box<dyn Source>, host_pools: bool) -> Result<Plan, PlanError> {
        let config = |detail: String| PlanError::Config { detail };
        if source.n_windows() == 0 {
            return Err(config("the source has no windows".into()));
        }
        if source.window_size() < manifest.window_size {
            return Err(config(format!(
                "source windows of {} bytes are smaller than the manifest's window {}",
                source.window_size(),
                manifest.window_size
            )));
        }
        let pools = Pools::new(&manifest, host_pools)?;
        let shape: Vec<LayerShape> =
            manifest.layers.iter().map(|l| LayerShape { layer: l.layer, n_experts: l.n_experts, n_slots: l.n_slots }).collect();
        let n_layers = manifest.layers.len();
        let tel = Telemetry {
            policy: policy.describe(),
            generations: manifest.layers.iter().map(|l| (l.layer, 0)).collect(),
            ..Default::default()
        };
        Ok(Plan {
            io: io::Io::new(source),
            slots: slots::Slots::new(SlotTable::new(&shape), policy),
            manifest,
            pools,
            consumers: consumers::Consumers::new(n_layers),
            status: Status::Running,
            obs: Observers {
                tel,
                tl: Timeline::default(),
                sem: BTreeSet::new(),
                sched: BTreeSet::new(),
                digests: None,
                engine_threads: None,
                source_base: Default::default(),
            },
            work: work::Work::new(),
            copies: Copies::default(),
        })
    }

    /// Streams one-token events (as many ids as their layer's `n_used`) in passes of
    /// `per_pass` distinct experts ([`Plan::stream_passes`]).
    pub fn stream_token_passes(&mut self, per_pass: u32) {
        self.work.set_passes(Passes { token: Some(per_pass), prompt: None });
    }

    /// Streams every event with more distinct experts than its pass size (the token pass for a
    /// one-token event, the prompt pass for others) in passes of that size: each pass returns
    /// once its own group is published, and the groups after it are claimed and read as far
    /// ahead as the layer's unpinned capacity allows, so the engine computes a pass while the
    /// next ones are still read. A one-token selection that fits is claimed whole at pass 0.
    pub fn stream_passes(&mut self, passes: Passes) {
        self.work.set_passes(passes);
    }

    pub fn passes(&self) -> Passes {
        self.work.passes()
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn epoch(&self) -> u64 {
        self.slots.epoch()
    }

    /// The error that failed the Plan, if it failed.
    pub fn failure(&self) -> Option<&PlanError> {
        match &self.status {
            Status::Failed(r) => Some(r),
            _ => None,
        }
    }

    pub fn window_states(&self) -> &[WindowState] {
        self.io.windows()
    }

    /// The slots of a MoE layer.
    pub fn slots(&self, layer: u32) -> Option<Vec<SlotCell>> {
        let li = self.manifest.layer_index(layer)?;
        Some(self.slots.snapshot().layers.swap_remove(li).slots)
    }

    /// Tickets submitted and not yet completed.
    pub fn active_tickets(&self) -> usize {
        self.io.active()
    }

    /// Makes group `pass` of this event's distinct experts resident and writes, for each id,
    /// its slot (or -1 when its expert belongs to another group).
    ///
    /// Groups: distinct experts in order of first appearance, cut whenever a group holds the
    /// layer's unpinned capacity (`n_slots` minus its pinned objects); pinned experts join the
    /// current group without counting, since their slots are reserved. Without pins a group is
    /// `n_slots` experts. Each resident object gets one consumer per acquire.
    pub fn acquire(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        slots.fill(-1);
        self.running()?;
        let r = self.acquire_event(layer, pass, ids, slots);
        if let Err(e) = &r {
            slots.fill(-1);
            for Hold { li, slot, v } in self.consumers.abandon() {
                if self.slots.release_failed(li, slot, v) {
                    self.obs.tel.consumer_drops += 1;
                }
            }
            self.fail(e);
        }
        r
    }

    /// Drops the consumers taken by the latest outstanding acquire of (layer, pass).
    /// An acquire of (layer, pass) took consumers that no release has dropped yet.
    pub fn holds_event(&self, layer: u32, pass: u32) -> bool {
        self.consumers.holds_event(PassKey { layer, pass })
    }

    pub fn release(&mut self, layer: u32, pass: u32) -> Result<(), PlanError> {
        if self.status == Status::Closed {
            return Err(PlanError::Closed);
        }
        let mut r = self.release_event(layer, pass);
        if r.is_ok() && self.status == Status::Running {
            r = self.harvest_prefetch();
        }
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Advances the epoch, after checking that no consumer is live and no read is in flight.
    /// Completions still queued in the source carry the old epoch: they are drained, counted
    /// and never made visible. Prefetch holds are released first.
    pub fn reset(&mut self) -> Result<(), PlanError> {
        self.running()?;
        let r = self.reset_inner();
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Brings the Plan to rest between requests without a new epoch: the prefetch in flight is
    /// completed, every copy finished and the prefetch holds dropped, so that its ledger
    /// ([`Plan::closure`]) balances once the engine has released every event.
    pub fn settle(&mut self) -> Result<(), PlanError> {
        self.running()?;
        let r = self.settle_inner();
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// [`Plan::reset`], then every object left in a slot is evicted, pinned ones too, and
    /// `policy` (a new one, built as the first was) replaces the policy and all it learnt: the
    /// next request loads every expert it selects, as the first request of a new Plan would.
    pub fn reset_cold(&mut self, policy: Box<dyn ReplacementPolicy>) -> Result<(), PlanError> {
        self.running()?;
        let r = self.reset_inner().and_then(|()| self.slots.empty(policy));
        match r {
            Ok(evicted) => {
                self.obs.tel.cold_resets += 1;
                self.obs.tel.cold_evictions += evicted;
                Ok(())
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Drains the source, releases prefetch holds and closes the Plan, reporting its ledger.
    /// Refused while an engine consumer is live (the Plan stays as it was); release, then shut down.
    pub fn shutdown(&mut self) -> Result<Closure, PlanError> {
        if self.status == Status::Closed {
            return Err(PlanError::Closed);
        }
        let r = self.shutdown_inner();
        match &r {
            // A refused transition leaves the state as it was: release, then shut down.
            Ok(_) | Err(PlanError::ConsumersLive { .. }) => {}
            Err(e) => self.fail(e),
        }
        r
    }

    /// Starts observing a new request: its telemetry, unions and timeline (`tl`) begin again,
    /// while the ledger (epoch, closure) and the digests expected carry on. Observers decide no
    /// transition, so the Plan serves as it would have.
    pub fn observe_anew(&mut self, tl: Timeline) {
        let tel = self.obs.tel.restarted();
        self.obs.tel = tel;
        self.obs.tl = tl;
        self.obs.sem.clear();
        self.obs.sched.clear();
        self.obs.source_base = self.io.source().stats();
    }

    /// The token timeline, for the engine side's marks; off unless [`Plan::set_timeline`].
    pub fn timeline(&mut self) -> &mut Timeline {
        &mut self.obs.tl
    }

    pub fn set_timeline(&mut self, tl: Timeline) {
        self.obs.tl = tl;
    }

    /// Reads submitted so far.
    pub fn reads(&self) -> u64 {
        self.obs.tel.q_run.reads
    }

    /// Logical bytes read so far.
    pub fn read_bytes(&self) -> u64 {
        self.obs.tel.q_run.logical_bytes
    }

    /// Time so far in source reads and in window → slot copies.
    pub fn io_time(&self) -> IoTime {
        IoTime { read_ns: self.obs.tel.read_ns, copy_ns: self.obs.tel.copy_ns }
    }

    /// The counters so far.
    pub fn telemetry(&self) -> Telemetry {
        let mut t = self.obs.tel.clone();
        t.epoch = self.slots.epoch();
        if let Some(mv) = &mut t.movement {
            let st = self.io.source().stats();
            let base = &self.obs.source_base;
            (mv.sqes, mv.coalesced_sqes, mv.coalesced_extents) =
                (st.sqes - base.sqes, st.coalesced_sqes - base.coalesced_sqes, st.coalesced_requests - base.coalesced_requests);
        }
        t.u_sched = Union {
            objects: self.obs.sched.len() as u64,
            bytes: self.obs.sched.iter().filter_map(|o| self.manifest.object(*o)).map(|o| o.logical_bytes).sum(),
        };
        let mut extents: Vec<(u64, u64)> = self
            .obs
            .sem
            .iter()
            .filter_map(|o| self.manifest.object(*o))
            .flat_map(|o| o.extents.iter().map(|e| (e.extent.offset, e.extent.len)))
            .collect();
        extents.sort();
        let (mut duplicates, mut overlaps) = (0, 0);
        for w in extents.windows(2) {
            if w[0] == w[1] {
                duplicates += 1;
            } else if w[0].0 + w[0].1 > w[1].0 {
                overlaps += 1;
            }
        }
        t.u_sem_lb = SemanticUnion {
            objects: self.obs.sem.len() as u64,
            extents: extents.len() as u64,
            bytes: extents.iter().map(|e| e.1).sum(),
            duplicates,
            overlaps,
        };
        t
    }

    /// The ledger now (what shutdown returns).
    pub fn closure(&self) -> Closure {
        let snap = self.slots.snapshot();
        Closure {
            epoch: snap.epoch,
            active_tickets: self.io.active() as u64,
            windows_free: self.io.windows().iter().filter(|w| **w == WindowState::Free).count() as u32,
            windows_total: self.io.windows().len() as u32,
            consumers_live: snap.consumers(),
            consumer_takes: self.obs.tel.consumer_takes,
            consumer_drops: self.obs.tel.consumer_drops,
            source_outstanding: self.io.source().outstanding() as u64,
            drained_completions: self.obs.tel.drained_completions,
            slots: Closure::slot_states(snap.layers.iter().flat_map(|l| l.slots.iter().map(|c| &c.state))),
            failed: match &self.status {
                Status::Failed(r) => Some(r.to_string()),
                _ => None,
            },
            source: self.io.source().stats(),
        }
    }

    fn running(&self) -> Result<(), PlanError> {
        match &self.status {
            Status::Running => Ok(()),
            Status::Failed(first) => Err(PlanError::Failed { first: Box::new(first.clone()) }),
            Status::Closed => Err(PlanError::Closed),
        }
    }

    fn fail(&mut self, e: &PlanError) {
        if self.status == Status::Running {
            // A refusal of a failed Plan is not a new first error.
            let first = match e {
                PlanError::Failed { first } => (**first).clone(),
                e => e.clone(),
            };
            self.status = Status::Failed(first);
        }
    }

    fn settle_inner(&mut self) -> Result<(), PlanError> {
        self.complete_prefetch()?;
        self.finish_copies(|_| true)?;
        self.release_holds()
    }

    fn reset_inner(&mut self) -> Result<(), PlanError> {
        if let Some(s) = self.work.stream() {
            return Err(PlanError::OutstandingWork { detail: format!("layer {}'s streamed event is at pass {}", s.layer, s.next) });
        }
        self.settle_inner()?;
        let consumers = self.slots.consumers();
        if consumers > 0 {
            return Err(PlanError::ConsumersLive { consumers });
        }
        if let Some(detail) = self.io.busy() {
            return Err(PlanError::OutstandingWork { detail });
        }
        self.slots.reset()?;
        self.obs.tel.resets += 1;
        self.drain()
    }

    fn shutdown_inner(&mut self) -> Result<Closure, PlanError> {
        self.drop_stream()?;
        if self.status == Status::Running {
            self.complete_prefetch()?;
            self.finish_copies(|_| true)?;
        }
        self.wait_copies();
        self.work.take_prefetch();
        self.drain()?;
        self.release_holds()?;
        let consumers = self.slots.consumers();
        if consumers > 0 {
            return Err(PlanError::ConsumersLive { consumers });
        }
        if matches!(self.status, Status::Failed(_)) {
            // Every read was drained and nothing of these bundles was copied: the windows go
            // back to Free, counted, so the source closes with all windows free.
            self.obs.tel.windows_discarded += self.io.discard_windows()?;
        }
        let closure = self.closure();
        self.status = Status::Closed;
        Ok(closure)
    }
}

impl Drop for Plan {
    /// Reads may land in host slots the Plan lent the source: it drains before any pool is
    /// freed, and where it cannot, the Plan's own pools are leaked rather than freed under the
    /// kernel's writes (the engine's pools are the engine's to keep; the failure is logged).
    fn drop(&mut self) {
        if self.io.drained() {
            return;
        }
        let leaked = self.pools.leak_host();
        log::warn!("the Plan's source could not be drained: {leaked} bytes of its own slot pools leaked rather than freed while reads may still land");
    }
}

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
