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

mod coverage;
pub mod engine;
mod lifecycle;
mod manifest;
mod policy;
pub mod report;
pub mod simulate;
mod table;
mod telemetry;
mod verify;
pub mod timeline;

pub use coverage::{Coverage, CoverageReport, LayerCoverage};
pub use lifecycle::{LifecycleError, SlotCell, SlotState, SlotTransition, Version, WindowState, WindowTransition};
pub use manifest::{ExtentPlan, LayerPlan, Manifest, ObjectId, ObjectPlan, Role};
pub use policy::{PolicySpec, ReplacementPolicy, Retain};
pub use table::{LayerSlots, Lock, SlotError, SlotTable, TableState};
pub use telemetry::{Closure, DigestCheck, Movement, RejectKind, SemanticUnion, Telemetry, Traffic, Union};
pub use timeline::Timeline;

use crate::source::{align_up, AlignedBuf, Completion, ReadRequest, Source, SourceError, ALIGN};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

/// Why a Plan operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The Plan failed earlier; it accepts no more work.
    Failed {
        reason: String,
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
    Copy {
        detail: String,
    },
    Config {
        detail: String,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Failed { reason } => write!(f, "plan failed earlier: {reason}"),
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
            PlanError::Copy { detail } => write!(f, "copy into a slot failed: {detail}"),
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

/// One bundle to submit: its window, object, slot and the slot's loading version.
type Job = (u32, ObjectId, u32, Version);

struct Pool {
    role: Role,
    bytes_per_slot: u64,
    /// Where a slot starts past a page boundary ([`Manifest::slot_head`]), with slots `stride`
    /// apart: its extents' covering reads land whole in the slot's own stride. `None`: packed
    /// slots (`stride` = `bytes_per_slot`), filled through windows unless page-aligned.
    head: Option<u64>,
    stride: u64,
    mem: PoolMem,
}

impl Pool {
    fn new(role: Role, bytes_per_slot: u64, head: Option<u64>, mem: PoolMem) -> Pool {
        Pool { role, bytes_per_slot, head, stride: Pool::stride_of(bytes_per_slot, head), mem }
    }

    /// Slots with a head lie a whole number of pages apart, so each slot's covering reads fit.
    fn stride_of(bytes_per_slot: u64, head: Option<u64>) -> u64 {
        head.map_or(bytes_per_slot, |h| align_up(h + bytes_per_slot))
    }

    /// Where `slot`'s bytes lie when the pool is host memory.
    fn host(&self, slot: u32) -> Option<std::ptr::NonNull<u8>> {
        match &self.mem {
            // SAFETY: callers pass slot < n_slots: head + slot * stride + bytes_per_slot stays
            // inside the allocation (`Plan::build`).
            PoolMem::Host(buf) => std::ptr::NonNull::new(unsafe {
                buf.as_ptr().add((self.head.unwrap_or(0) + u64::from(slot) * self.stride) as usize)
            }),
            PoolMem::Engine(Some(w)) => w.host(slot),
            PoolMem::Engine(None) => None,
        }
    }
}

/// The engine's way to fill one slot of a pool it owns.
pub trait SlotWriter: Send {
    /// Copies `src` (one slot's bytes) into `slot`; returns once the copy has completed.
    fn write(&self, slot: u32, src: &[u8]) -> Result<(), String>;
    /// Where `slot` lies when the pool is plain host memory, so that a write would be a memcpy
    /// there; `None` otherwise (device memory, or not allocated yet). A source may then read
    /// straight into it.
    fn host(&self, _slot: u32) -> Option<std::ptr::NonNull<u8>> {
        None
    }
    /// [`SlotWriter::begin`] returns before the copy completes (a copy stream and events).
    fn asynchronous(&self) -> bool {
        false
    }
    /// Starts copying `src` into `slot`; the id goes to [`SlotWriter::wait`]. The default
    /// copies synchronously.
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until `wait` returned for the id.
    unsafe fn begin(&self, slot: u32, src: &[u8]) -> Result<u64, String> {
        self.write(slot, src).map(|()| 0)
    }
    /// Waits for copy `id` alone: once it returns, the bytes are in the slot.
    fn wait(&self, _id: u64) -> Result<(), String> {
        Ok(())
    }
}

/// A bundle whose window → slot copies are in flight on the device's copy stream: its window
/// stays Copying and its slot Loading until every copy's event has completed.
struct InFlightCopy {
    li: usize,
    window: u32,
    object: ObjectId,
    slot: u32,
    version: Version,
    /// (pool index in the layer's buffer, copy id)
    ids: Vec<(usize, u64)>,
    issued: Instant,
    copied: u64,
}

enum PoolMem {
    /// Memory the Plan owns.
    Host(AlignedBuf),
    /// The engine's pool, once bound.
    Engine(Option<Box<dyn SlotWriter>>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Running,
    Failed(String),
    Closed,
}

/// A consumer taken on a slot: (layer index, slot, version).
type Hold = (usize, u32, Version);

pub struct Plan {
    /// First, so that it drops (draining every read still in flight) before the pools the
    /// reads may land in.
    source: Box<dyn Source>,
    manifest: Manifest,
    /// Per layer index, one pool per role in role order.
    pools: Vec<Vec<Pool>>,
    table: SlotTable,
    windows: Vec<WindowState>,
    policy: Box<dyn ReplacementPolicy>,
    tickets: HashMap<u64, Ticket>,
    next_ticket: u64,
    /// Outstanding acquire events per (layer, pass), innermost last.
    events: HashMap<(u32, u32), Vec<Vec<Hold>>>,
    /// Consumers held by prefetch, per layer index, until that layer's next acquire.
    holds: Vec<Vec<Hold>>,
    /// Next-layer prefetch reads submitted but not yet taken back: (layer index, loads, bundles
    /// by window). They run while the engine computes; the next Plan call completes them.
    prefetching: Option<Prefetch>,
    /// Consumers taken by the acquire in progress (released if it fails).
    taking: Vec<Hold>,
    status: Status,
    tel: Telemetry,
    tl: Timeline,
    sem: BTreeSet<ObjectId>,
    sched: BTreeSet<ObjectId>,
    /// Expected extent digests ([`Plan::expect_digests`]); None verifies nothing.
    digests: Option<verify::Expected>,
    /// The engine's host slot pools were advised huge pages ([`Plan::advise_engine_pools`]).
    advised: bool,
    /// (selections of one token, experts per pass): one-token events are streamed in passes
    /// of that many experts ([`Plan::stream_token_passes`]).
    token_pass: Option<(usize, u32)>,
    /// The streamed event whose later groups are still being read.
    stream: Option<Stream>,
    /// Copies in flight, oldest first.
    copies: VecDeque<InFlightCopy>,
    /// Some engine pool copies asynchronously (set as pools are bound).
    copies_async: bool,
}

/// Next-layer prefetch reads in flight while the engine computes.
struct Prefetch {
    /// The layer index they load.
    li: usize,
    /// Every load, in order; the first `submitted` have their reads out.
    loads: Vec<(ObjectId, u32, Version)>,
    submitted: usize,
    /// Bundles by window, for the loads submitted and not yet published.
    inflight: HashMap<u32, Bundle>,
}

/// A one-token layer event served in passes while its later groups are still being read: every
/// miss got its slot and every hit its consumer at pass 0, and the reads run on, in group order,
/// while the engine computes the earlier passes.
struct Stream {
    li: usize,
    layer: u32,
    /// The pass the engine asks for next.
    next: u32,
    /// Per pass: the consumers its hits took at pass 0, and its loads.
    hits: Vec<Vec<Hold>>,
    loads: Vec<Vec<(ObjectId, u32, Version)>>,
    pending: VecDeque<(ObjectId, u32, Version)>,
    inflight: HashMap<u32, Bundle>,
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
    pub fn with_policy(
        manifest: Manifest,
        policy: Box<dyn ReplacementPolicy>,
        source: Box<dyn Source>,
    ) -> Result<Plan, PlanError> {
        Plan::build(manifest, policy, source, true)
    }

    fn build(
        manifest: Manifest,
        policy: Box<dyn ReplacementPolicy>,
        source: Box<dyn Source>,
        host_pools: bool,
    ) -> Result<Plan, PlanError> {
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
        let mut pools = Vec::new();
        let n_buffers = if manifest.layer_buffers == 0 { manifest.layers.len() } else { manifest.layer_buffers as usize };
        for (buffer, lp) in manifest.layers[..n_buffers].iter().enumerate() {
            let mut ps = Vec::new();
            for &(role, bytes_per_slot) in &lp.roles {
                let head = manifest.slot_head(buffer, role);
                let stride = Pool::stride_of(bytes_per_slot, head);
                let mem = if host_pools {
                    PoolMem::Host(
                        AlignedBuf::new(head.unwrap_or(0) + stride * u64::from(lp.n_slots))
                            .map_err(|e| config(format!("layer {} {role} pool: {e:#}", lp.layer)))?,
                    )
                } else {
                    PoolMem::Engine(None)
                };
                ps.push(Pool::new(role, bytes_per_slot, head, mem));
            }
            pools.push(ps);
        }
        let shape: Vec<(u32, u32, u32)> = manifest.layers.iter().map(|l| (l.layer, l.n_experts, l.n_slots)).collect();
        let n_layers = manifest.layers.len();
        let tel = Telemetry {
            policy: policy.describe(),
            generations: manifest.layers.iter().map(|l| (l.layer, 0)).collect(),
            ..Default::default()
        };
        Ok(Plan {
            windows: vec![WindowState::Free; source.n_windows() as usize],
            table: SlotTable::new(&shape),
            manifest,
            pools,
            source,
            policy,
            tickets: HashMap::new(),
            next_ticket: 1,
            events: HashMap::new(),
            holds: vec![Vec::new(); n_layers],
            prefetching: None,
            taking: Vec::new(),
            status: Status::Running,
            tel,
            tl: Timeline::default(),
            sem: BTreeSet::new(),
            sched: BTreeSet::new(),
            digests: None,
            advised: false,
            token_pass: None,
            stream: None,
            copies: VecDeque::new(),
            copies_async: false,
        })
    }

    /// Streams events of `n_used` selections (one token) in passes of `per_pass` distinct
    /// experts: the whole selection is claimed and read at pass 0, and each pass returns once
    /// its own group is published, so the engine computes it while the rest is still read.
    /// Only where every layer's unpinned capacity holds the selection; otherwise as usual.
    pub fn stream_token_passes(&mut self, n_used: usize, per_pass: u32) {
        self.token_pass = (n_used > 0 && per_pass > 0).then_some((n_used, per_pass));
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn epoch(&self) -> u64 {
        self.table.epoch()
    }

    /// The error that failed the Plan, if it failed.
    pub fn failure(&self) -> Option<&str> {
        match &self.status {
            Status::Failed(r) => Some(r),
            _ => None,
        }
    }

    pub fn window_states(&self) -> &[WindowState] {
        &self.windows
    }

    /// The slots of a MoE layer.
    pub fn slots(&self, layer: u32) -> Option<Vec<SlotCell>> {
        let li = self.manifest.layer_index(layer)?;
        Some(self.table.snapshot().layers.swap_remove(li).slots)
    }

    /// Tickets submitted and not yet completed.
    pub fn active_tickets(&self) -> usize {
        self.tickets.len()
    }

    /// The (layer, role) pool's buffer and pool, when the request agrees with the manifest.
    fn pool_of(&self, layer: u32, role: Role, bytes_per_slot: u64, n_slots: u32) -> Result<(usize, usize), PlanError> {
        let mismatch = |detail: String| PlanError::PoolMismatch { detail };
        let li = self.manifest.layer_index(layer).ok_or_else(|| mismatch(format!("layer {layer} is not managed")))?;
        let lp = &self.manifest.layers[li];
        let buffer = self.manifest.buffer_of(li);
        let i = self.pools[buffer]
            .iter()
            .position(|p| p.role == role)
            .ok_or_else(|| mismatch(format!("layer {layer} has no {role} role")))?;
        let pool = &self.pools[buffer][i];
        if pool.bytes_per_slot != bytes_per_slot || lp.n_slots != n_slots {
            return Err(mismatch(format!(
                "layer {layer} {role}: asked {n_slots} slots of {bytes_per_slot} bytes, the manifest has {} of {}",
                lp.n_slots, pool.bytes_per_slot
            )));
        }
        Ok((buffer, i))
    }

    /// Where slots of (layer, role) start past a page boundary (the engine asks before it
    /// allocates a host pool) when `bytes_per_slot` is the manifest's; `None`: packed slots.
    pub fn slot_head(&self, layer: u32, role: Role, bytes_per_slot: u64) -> Option<u64> {
        let li = self.manifest.layer_index(layer)?;
        let pool = self.pools[self.manifest.buffer_of(li)].iter().find(|p| p.role == role)?;
        (pool.bytes_per_slot == bytes_per_slot).then_some(pool.head).flatten()
    }

    /// (head, stride) of the (layer, role) pool: slot `s` starts `head + s * stride` bytes past
    /// the start of its memory, so [`Plan::pool`] + `s * stride`.
    pub fn slot_layout(&self, layer: u32, role: Role) -> Option<(u64, u64)> {
        let li = self.manifest.layer_index(layer)?;
        let pool = self.pools[self.manifest.buffer_of(li)].iter().find(|p| p.role == role)?;
        Some((pool.head.unwrap_or(0), pool.stride))
    }

    /// The stable address of slot 0 of the (layer, role) host pool. Refuses, without failing the
    /// Plan, any request whose role, bytes per slot or slot count disagrees with the manifest.
    pub fn pool(&self, layer: u32, role: Role, bytes_per_slot: u64, n_slots: u32) -> Result<*mut u8, PlanError> {
        let (buffer, i) = self.pool_of(layer, role, bytes_per_slot, n_slots)?;
        let pool = &self.pools[buffer][i];
        match &pool.mem {
            // SAFETY: the head lies inside the allocation (`Plan::build`).
            PoolMem::Host(buf) => Ok(unsafe { buf.as_ptr().add(pool.head.unwrap_or(0) as usize) }),
            PoolMem::Engine(_) => Err(PlanError::PoolMismatch { detail: "the engine owns this pool".into() }),
        }
    }

    /// Binds the engine's pool of (layer, role) and returns its buffer: layers that share a
    /// buffer share one pool, so the first binding of a buffer is kept. Refuses, without
    /// failing the Plan, a request that disagrees with the manifest or a Plan with host pools.
    pub fn bind(
        &mut self,
        layer: u32,
        role: Role,
        bytes_per_slot: u64,
        n_slots: u32,
        writer: Box<dyn SlotWriter>,
    ) -> Result<u32, PlanError> {
        let (buffer, i) = self.pool_of(layer, role, bytes_per_slot, n_slots)?;
        match &mut self.pools[buffer][i].mem {
            PoolMem::Host(_) => return Err(PlanError::PoolMismatch { detail: "this Plan owns its pools".into() }),
            PoolMem::Engine(w) => {
                if w.is_none() {
                    self.copies_async |= writer.asynchronous();
                    *w = Some(writer);
                }
            }
        }
        Ok(buffer as u32)
    }

    /// The bytes of `slot`'s region of a host pool's `role` (whatever its state: read-only
    /// inspection); `None` for the engine's pools.
    pub fn slot_bytes(&self, layer: u32, role: Role, slot: u32) -> Option<&[u8]> {
        let li = self.manifest.layer_index(layer)?;
        if slot >= self.manifest.layers[li].n_slots {
            return None;
        }
        let p = self.pools[self.manifest.buffer_of(li)].iter().find(|p| p.role == role)?;
        let PoolMem::Host(buf) = &p.mem else { return None };
        let start = (p.head.unwrap_or(0) + u64::from(slot) * p.stride) as usize;
        Some(&buf.as_slice()[start..start + p.bytes_per_slot as usize])
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
            for (li, slot, v) in std::mem::take(&mut self.taking) {
                if self.table.release(li, slot, v).is_ok() {
                    self.tel.consumer_drops += 1;
                }
            }
            self.fail(e);
        }
        r
    }

    /// Drops the consumers taken by the latest outstanding acquire of (layer, pass).
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

    /// The token timeline, for the engine side's marks; off unless [`Plan::set_timeline`].
    pub fn timeline(&mut self) -> &mut Timeline {
        &mut self.tl
    }

    pub fn set_timeline(&mut self, tl: Timeline) {
        self.tl = tl;
    }

    /// Reads submitted so far.
    pub fn reads(&self) -> u64 {
        self.tel.q_run.reads
    }

    /// Time so far in source reads and in window → slot copies, in nanoseconds.
    pub fn io_ns(&self) -> (u64, u64) {
        (self.tel.read_ns, self.tel.copy_ns)
    }

    /// The counters so far.
    pub fn telemetry(&self) -> Telemetry {
        let mut t = self.tel.clone();
        t.epoch = self.table.epoch();
        if let Some(mv) = &mut t.movement {
            let st = self.source.stats();
            (mv.sqes, mv.coalesced_sqes, mv.coalesced_extents) = (st.sqes, st.coalesced_sqes, st.coalesced_requests);
        }
        t.u_sched = Union {
            objects: self.sched.len() as u64,
            bytes: self.sched.iter().filter_map(|o| self.manifest.object(*o)).map(|o| o.logical_bytes).sum(),
        };
        let mut extents: Vec<(u64, u64)> = self
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
            objects: self.sem.len() as u64,
            extents: extents.len() as u64,
            bytes: extents.iter().map(|e| e.1).sum(),
            duplicates,
            overlaps,
        };
        t
    }

    /// The ledger now (what shutdown returns).
    pub fn closure(&self) -> Closure {
        let snap = self.table.snapshot();
        Closure {
            epoch: snap.epoch,
            active_tickets: self.tickets.len() as u64,
            windows_free: self.windows.iter().filter(|w| **w == WindowState::Free).count() as u32,
            windows_total: self.windows.len() as u32,
            consumers_live: snap.consumers(),
            consumer_takes: self.tel.consumer_takes,
            consumer_drops: self.tel.consumer_drops,
            source_outstanding: self.source.outstanding() as u64,
            drained_completions: self.tel.drained_completions,
            slots: Closure::slot_states(snap.layers.iter().flat_map(|l| l.slots.iter().map(|c| &c.state))),
            failed: match &self.status {
                Status::Failed(r) => Some(r.clone()),
                _ => None,
            },
            source: self.source.stats(),
        }
    }

    fn running(&self) -> Result<(), PlanError> {
        match &self.status {
            Status::Running => Ok(()),
            Status::Failed(reason) => Err(PlanError::Failed { reason: reason.clone() }),
            Status::Closed => Err(PlanError::Closed),
        }
    }

    fn fail(&mut self, e: &PlanError) {
        if self.status == Status::Running {
            self.status = Status::Failed(e.to_string());
        }
    }

    fn acquire_event(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let li = self.manifest.layer_index(layer).ok_or(PlanError::UnknownLayer { layer })?;
        if slots.len() != ids.len() {
            return Err(PlanError::SlotsLength { ids: ids.len(), slots: slots.len() });
        }
        if let Some(s) = &self.stream {
            if (s.layer, s.next) != (layer, pass) {
                return Err(PlanError::Config {
                    detail: format!(
                        "layer {layer} pass {pass} acquired while layer {} waits for its pass {}: a streamed event must be served pass by pass",
                        s.layer, s.next
                    ),
                });
            }
            return self.stream_pass(ids, slots);
        }
        self.complete_prefetch()?;
        let (n_experts, capacity) = {
            let lp = &self.manifest.layers[li];
            (lp.n_experts, lp.capacity())
        };
        let mut seen = vec![false; n_experts as usize];
        let mut distinct = Vec::new();
        for (index, &id) in ids.iter().enumerate() {
            if id < 0 || id as u32 >= n_experts {
                return Err(PlanError::ExpertOutOfRange { layer, index, id, n_experts });
            }
            if !std::mem::replace(&mut seen[id as usize], true) {
                distinct.push(id as u32);
            }
        }
        self.tel.acquires += 1;
        if pass == 0 {
            self.sem.extend(distinct.iter().map(|&expert| ObjectId { layer, expert }));
            self.policy.observe(layer, &distinct);
        }
        let pinned = |e: u32| self.manifest.is_pinned(ObjectId { layer, expert: e });
        if let Some((n_used, per_pass)) = self.token_pass {
            let unpinned = distinct.iter().filter(|&&e| !pinned(e)).count() as u32;
            if pass == 0 && ids.len() == n_used && per_pass < unpinned && unpinned <= capacity {
                let groups = groups(&distinct, per_pass, pinned);
                return self.start_stream(li, layer, groups, ids, slots);
            }
        }
        let group = groups(&distinct, capacity, pinned).into_iter().nth(pass as usize).unwrap_or_default();
        if group.is_empty() {
            return Ok(());
        }

        // Hits first, so that no object of this group can be chosen as a victim below.
        let mut misses = Vec::new();
        for &expert in &group {
            let object = ObjectId { layer, expert };
            self.tel.object_requests += 1;
            let Some(slot) = self.table.find(li, expert) else {
                misses.push(object);
                continue;
            };
            self.hit(li, slot, object)?;
        }
        // Prefetch holds of this layer end at its acquire, before misses claim slots: used ones
        // stay InUse through the consumer just taken, unused ones become Recyclable victims.
        for (hli, slot, v) in std::mem::take(&mut self.holds[li]) {
            self.drop_consumer(hli, slot, v)?;
        }
        let mut loads = Vec::new();
        for &object in &misses {
            self.tel.misses += 1;
            let slot = self.claim_slot(li, object)?;
            let v = self.begin_load(li, slot, object)?;
            loads.push((object, slot, v));
        }
        self.load(li, &loads)?;
        self.take_loads(li, &loads)?;
        if pass == 0 {
            if let Some(next) = self.manifest.next_layer(layer) {
                self.prefetch(next)?;
            }
        }
        self.serve_taking(li, layer, pass, ids, slots)
    }

    /// One consumer on each published load, taken through `taking`.
    fn take_loads(&mut self, li: usize, loads: &[(ObjectId, u32, Version)]) -> Result<(), PlanError> {
        for &(object, slot, _) in loads {
            let v = self.table.consume(li, slot, object)?;
            self.tel.consumer_takes += 1;
            self.taking.push((li, slot, v));
        }
        Ok(())
    }

    /// Writes the slot of every selection the consumers in `taking` serve (-1 for the others)
    /// and files those consumers as the outstanding event (layer, pass).
    fn serve_taking(&mut self, li: usize, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let mut slot_of = vec![-1i32; self.manifest.layers[li].n_experts as usize];
        for &(_, slot, v) in &self.taking {
            let object = self.table.cell(li, slot)?.object.expect("a consumed slot holds an object");
            debug_assert_eq!(self.table.cell(li, slot)?.version(), v);
            slot_of[object.expert as usize] = slot as i32;
        }
        for (s, &id) in slots.iter_mut().zip(ids) {
            *s = slot_of[id as usize];
        }
        let taken = std::mem::take(&mut self.taking);
        self.events.entry((layer, pass)).or_default().push(taken);
        Ok(())
    }

    /// A hit on `slot`: one more consumer, taken through `taking`.
    fn hit(&mut self, li: usize, slot: u32, object: ObjectId) -> Result<Hold, PlanError> {
        let before = self.table.cell(li, slot)?;
        let v = self.table.consume(li, slot, object)?;
        self.tel.consumer_takes += 1;
        self.taking.push((li, slot, v));
        self.tel.hits += 1;
        if self.holds[li].iter().any(|h| h.1 == slot && h.2 == v) {
            self.tel.prefetch_hits += 1;
        }
        if before.state == SlotState::Recyclable && !self.manifest.is_pinned(object) {
            self.policy.reused(object);
        }
        Ok((li, slot, v))
    }

    /// Pass 0 of a streamed event: the hits of every group take their consumers (so no miss can
    /// evict them), every miss claims its slot and begins loading, the reads go out in group
    /// order, and the call returns once group 0 is published.
    fn start_stream(&mut self, li: usize, layer: u32, groups: Vec<Vec<u32>>, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let n = groups.len();
        let mut hits = vec![Vec::new(); n];
        let mut misses = vec![Vec::new(); n];
        for (k, group) in groups.iter().enumerate() {
            for &expert in group {
                let object = ObjectId { layer, expert };
                self.tel.object_requests += 1;
                let Some(slot) = self.table.find(li, expert) else {
                    misses[k].push(object);
                    continue;
                };
                // Through `taking` until the event is set up: a failure below drops them all.
                hits[k].push(self.hit(li, slot, object)?);
            }
        }
        for (hli, slot, v) in std::mem::take(&mut self.holds[li]) {
            self.drop_consumer(hli, slot, v)?;
        }
        let mut loads = vec![Vec::new(); n];
        for (k, group) in misses.iter().enumerate() {
            for &object in group {
                self.tel.misses += 1;
                let slot = self.claim_slot(li, object)?;
                let v = self.begin_load(li, slot, object)?;
                loads[k].push((object, slot, v));
            }
        }
        self.taking.clear();
        let pending = loads.iter().flatten().copied().collect();
        self.stream = Some(Stream { li, layer, next: 0, hits, loads, pending, inflight: HashMap::new() });
        self.stream_pass(ids, slots)
    }

    /// The engine's next pass of the streamed event: reads on until its group is published,
    /// then serves that group; the last pass ends the stream (and starts the next layer's
    /// prefetch, which never runs beside a stream).
    fn stream_pass(&mut self, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let mut s = self.stream.take().expect("a stream");
        let r = self.serve_stream_pass(&mut s, ids, slots);
        if r.is_err() || (s.next as usize) < s.hits.len() {
            self.stream = Some(s);
            return r;
        }
        match self.manifest.next_layer(s.layer) {
            Some(next) => self.prefetch(next),
            None => Ok(()),
        }
    }

    fn serve_stream_pass(&mut self, s: &mut Stream, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let (li, layer, k) = (s.li, s.layer, s.next as usize);
        if k > 0 {
            self.tel.acquires += 1;
        }
        // Reads on until every load of group k is published; later groups stay in flight.
        let group = &s.loads[k];
        self.read_until(li, &mut s.pending, &mut s.inflight, |p, _, _| {
            for &(_, slot, _) in group {
                if p.table.cell(li, slot)?.state == SlotState::Loading && !p.copy_in_flight(li, slot) {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        self.finish_copies_into(li, group)?;
        // Through `taking`: a failure below drops them.
        self.taking.append(&mut s.hits[k]);
        self.take_loads(li, &s.loads[k])?;
        self.serve_taking(li, layer, k as u32, ids, slots)?;
        s.next += 1;
        // Later groups' reads that have already landed start their copies now, so that they
        // run on the copy stream while the engine computes this pass.
        self.harvest(li, &mut s.pending, &mut s.inflight)
    }

    /// Takes back every completion the source has ready without blocking (refilling its room),
    /// each validated and its copies started: nothing waits, and nothing is published here
    /// that a synchronous copy would not have published.
    fn harvest(
        &mut self,
        li: usize,
        pending: &mut VecDeque<(ObjectId, u32, Version)>,
        inflight: &mut HashMap<u32, Bundle>,
    ) -> Result<(), PlanError> {
        if !self.copies_async {
            return Ok(());
        }
        while !inflight.is_empty() && self.source.poll_ready() {
            let c = self.wait_source()?;
            self.tel.harvested += 1;
            self.submit_pending(li, pending, inflight)?;
            self.accept(li, c, inflight)?;
        }
        Ok(())
    }

    /// Ends a streamed event the engine left unfinished: the consumers taken for passes it never
    /// asked for are dropped; reads still in flight are drained with the rest.
    fn drop_stream(&mut self) -> Result<(), PlanError> {
        if let Some(s) = self.stream.take() {
            for (li, slot, v) in s.hits.into_iter().skip(s.next as usize).flatten() {
                self.drop_consumer(li, slot, v)?;
            }
            if self.status == Status::Running {
                let e = PlanError::Config { detail: format!("layer {}'s streamed event ended at pass {}: its later groups were never served", s.layer, s.next) };
                self.fail(&e);
            }
        }
        Ok(())
    }

    /// A slot for a miss: the lowest Vacant one, else the policy's victim (Recyclable, never
    /// pinned, never in use: the table refuses anything else).
    fn claim_slot(&mut self, li: usize, object: ObjectId) -> Result<u32, PlanError> {
        if let Some(slot) = self.table.vacant(li) {
            return Ok(slot);
        }
        let victim = self.policy.victim(object.layer).ok_or(PlanError::NoSlot { object })?;
        self.evict(li, victim)
    }

    fn evict(&mut self, li: usize, victim: ObjectId) -> Result<u32, PlanError> {
        if self.manifest.is_pinned(victim) || victim.layer != self.manifest.layers[li].layer {
            return Err(PlanError::Config { detail: format!("the policy named {victim}, which it may not evict") });
        }
        let slot = self
            .table
            .find(li, victim.expert)
            .ok_or_else(|| PlanError::Config { detail: format!("the policy named {victim}, which is not resident") })?;
        self.table.evict(li, slot)?;
        self.policy.evicted(victim);
        self.tel.recycles += 1;
        Ok(slot)
    }

    fn begin_load(&mut self, li: usize, slot: u32, object: ObjectId) -> Result<Version, PlanError> {
        self.clear_aliases(li, slot)?;
        let v = self.table.begin_load(li, slot, object)?;
        *self.tel.generations.entry(object.layer).or_default() += 1;
        Ok(v)
    }

    /// With shared layer buffers, `slot` of layer index `li` is the same memory as that slot of
    /// every layer sharing its buffer: a cached object there is evicted before the load; one
    /// that is loading, published or in use refuses the load (its bytes would change under it).
    fn clear_aliases(&mut self, li: usize, slot: u32) -> Result<(), PlanError> {
        if self.manifest.layer_buffers == 0 {
            return Ok(());
        }
        let buffer = self.manifest.buffer_of(li);
        let sharing: Vec<usize> = (0..self.manifest.layers.len()).filter(|&lj| lj != li && self.manifest.buffer_of(lj) == buffer).collect();
        for lj in sharing {
            let cell = self.table.cell(lj, slot)?;
            match (cell.state, cell.object) {
                (SlotState::Vacant, _) => {}
                (SlotState::Recyclable, Some(victim)) => {
                    self.evict(lj, victim)?;
                    self.tel.buffer_evictions += 1;
                }
                (state, _) => {
                    return Err(PlanError::BufferLive {
                        layer: self.manifest.layers[li].layer,
                        slot,
                        other: self.manifest.layers[lj].layer,
                        state: format!("{state:?}"),
                    })
                }
            }
        }
        Ok(())
    }

    /// Starts loading the next layer's predicted experts into its Vacant slots and free windows,
    /// without waiting: the reads proceed while the engine computes this layer, and the next
    /// Plan call completes them ([`Plan::complete_prefetch`]). Evicts nothing.
    fn prefetch(&mut self, next: u32) -> Result<(), PlanError> {
        let Some(nli) = self.manifest.layer_index(next) else { return Ok(()) };
        if !self.holds[nli].is_empty() || self.prefetching.is_some() {
            return Ok(());
        }
        let (n_experts, capacity) = (self.manifest.layers[nli].n_experts, self.manifest.layers[nli].capacity());
        let free: Vec<u32> =
            (0..self.windows.len() as u32).filter(|&w| self.windows[w as usize] == WindowState::Free).collect();
        let mut loads = Vec::new();
        for expert in self.policy.prefetch(next).into_iter().take(capacity as usize) {
            if expert >= n_experts || self.table.find(nli, expert).is_some() {
                continue;
            }
            let Some(slot) = self.table.vacant(nli) else { break };
            let object = ObjectId { layer: next, expert };
            let v = self.begin_load(nli, slot, object)?;
            loads.push((object, slot, v));
        }
        let mut inflight = HashMap::new();
        let submitted = free.len().min(loads.len());
        // As many bundles as there are free windows go out now; the rest load at completion.
        let jobs: Vec<Job> = loads.iter().zip(&free).map(|(&(object, slot, version), &w)| (w, object, slot, version)).collect();
        self.submit_bundles(nli, &jobs, &mut inflight)?;
        if !loads.is_empty() {
            self.prefetching = Some(Prefetch { li: nli, loads, submitted, inflight });
        }
        Ok(())
    }

    /// Takes back the prefetch reads in flight: each bundle is validated, copied and published,
    /// then held by one prefetch consumer until its layer's next acquire.
    fn complete_prefetch(&mut self) -> Result<(), PlanError> {
        let Some(Prefetch { li: nli, loads, submitted, mut inflight }) = self.prefetching.take() else { return Ok(()) };
        while !inflight.is_empty() {
            let c = self.wait_source()?;
            self.accept(nli, c, &mut inflight)?;
        }
        self.load(nli, &loads[submitted..])?;
        self.finish_copies_into(nli, &loads)?;
        for (object, slot, _) in loads {
            let v = self.table.consume(nli, slot, object)?;
            self.tel.consumer_takes += 1;
            self.tel.prefetch_loads += 1;
            self.holds[nli].push((nli, slot, v));
        }
        Ok(())
    }

    /// Reads, validates, copies and publishes the bundles of `jobs` (slots already Loading).
    fn load(&mut self, li: usize, jobs: &[(ObjectId, u32, Version)]) -> Result<(), PlanError> {
        let mut pending: VecDeque<_> = jobs.iter().copied().collect();
        let mut inflight: HashMap<u32, Bundle> = HashMap::new();
        self.read_until(li, &mut pending, &mut inflight, |_, pending, inflight| Ok(pending.is_empty() && inflight.is_empty()))?;
        self.finish_copies_into(li, jobs)
    }

    /// Submits, waits for, validates and publishes bundles of `pending` until `done`.
    fn read_until(
        &mut self,
        li: usize,
        pending: &mut VecDeque<(ObjectId, u32, Version)>,
        inflight: &mut HashMap<u32, Bundle>,
        done: impl Fn(&Plan, &VecDeque<(ObjectId, u32, Version)>, &HashMap<u32, Bundle>) -> Result<bool, PlanError>,
    ) -> Result<(), PlanError> {
        loop {
            if done(self, pending, inflight)? {
                return Ok(());
            }
            self.submit_pending(li, pending, inflight)?;
            if inflight.is_empty() {
                return Err(PlanError::OutstandingWork { detail: "no window is Free".into() });
            }
            let c = self.wait_source()?;
            // The wait freed room in the source: refill it before this completion is hashed, so
            // the device reads the next bundles while the CPU verifies the last ones.
            self.submit_pending(li, pending, inflight)?;
            self.accept(li, c, inflight)?;
        }
    }

    /// Every pending bundle that has a Free window and room in the source's depth goes out at
    /// once, so the source sees them together (and can coalesce neighbours in the file); the
    /// rest follow as completions free room, so that validating what arrived is never held up
    /// behind a submission waiting for room.
    fn submit_pending(
        &mut self,
        li: usize,
        pending: &mut VecDeque<(ObjectId, u32, Version)>,
        inflight: &mut HashMap<u32, Bundle>,
    ) -> Result<(), PlanError> {
        // Every window holds a copy in flight: the oldest one is finished to free its window.
        let free = |p: &Plan| p.windows.iter().enumerate().any(|(w, s)| *s == WindowState::Free && !inflight.contains_key(&(w as u32)));
        while !pending.is_empty() && !self.copies.is_empty() && !free(self) {
            let c = self.copies.pop_front().expect("non-empty");
            self.finish_copy(c)?;
        }
        let mut jobs = Vec::new();
        let mut room = self.source.room();
        for (w, state) in self.windows.iter().enumerate() {
            if *state != WindowState::Free || inflight.contains_key(&(w as u32)) {
                continue;
            }
            let Some(&(object, slot, version)) = pending.front() else { break };
            let n = self.manifest.object(object).map_or(1, |o| o.extents.len());
            if n > room && !(jobs.is_empty() && inflight.is_empty()) {
                break;
            }
            room = room.saturating_sub(n);
            pending.pop_front();
            jobs.push((w as u32, object, slot, version));
        }
        self.submit_bundles(li, &jobs, inflight)
    }

    /// Where the covering read of extent `i` of a bundle for `slot` of layer index `li` can
    /// land straight in the slot: a source that takes host targets, pool memory on the host
    /// whose slots start at the extent's offset within a page (its head) past a page boundary,
    /// and a covering read that fits the slot's stride. The logical bytes then start at the
    /// slot's address; the padding falls in the slot's margins. `None`: the window.
    fn direct_target(&self, li: usize, i: usize, slot: u32, e: &ExtentPlan) -> Option<std::ptr::NonNull<u8>> {
        if !self.source.reads_into_host() {
            return None;
        }
        let pool = &self.pools[self.manifest.buffer_of(li)][i];
        let head = pool.head?;
        if pool.role != e.role || pool.bytes_per_slot != e.extent.len || e.covering.head != head || e.covering.len > pool.stride {
            return None;
        }
        let p = pool.host(slot)?.as_ptr();
        if (p as u64).wrapping_sub(head) % ALIGN != 0 {
            return None;
        }
        // The head room lies inside the slot's stride, so inside the pool's memory.
        std::ptr::NonNull::new(p.wrapping_sub(head as usize))
    }

    /// Advises huge pages for the engine's host slot pools once, before the first read touches
    /// them (the Plan's own pools are advised when allocated): the pool memory exists only after
    /// the engine allocated it, which is after binding.
    fn advise_engine_pools(&mut self) {
        if std::mem::replace(&mut self.advised, true) {
            return;
        }
        let mut advised = 0u64;
        for (li, lp) in self.manifest.layers.iter().enumerate() {
            if self.manifest.buffer_of(li) != li || lp.n_slots == 0 {
                continue;
            }
            for pool in &mut self.pools[li] {
                let PoolMem::Engine(Some(w)) = &pool.mem else { continue };
                let (Some(first), Some(last)) = (w.host(0), w.host(lp.n_slots - 1)) else {
                    // Device memory: filled by copies, so no layout to honour.
                    pool.head = None;
                    continue;
                };
                let span = pool.stride as usize * (lp.n_slots as usize - 1);
                if last.as_ptr() as usize != first.as_ptr() as usize + span {
                    // The engine did not lay the slots out as asked: no read goes straight in.
                    pool.head = None;
                    continue;
                }
                let head = pool.head.unwrap_or(0) as usize;
                let len = head + pool.stride as usize * lp.n_slots as usize;
                advised += crate::source::advise_huge(first.as_ptr().wrapping_sub(head), len) as u64;
            }
        }
        let (mut direct, mut windowed) = (0, 0);
        for pool in self.pools.iter().flatten() {
            if pool.host(0).is_some() {
                if pool.head.is_some() { direct += 1 } else { windowed += 1 }
            }
        }
        for pool in self.pools.iter().flatten() {
            if let PoolMem::Host(buf) = &pool.mem {
                advised += buf.huge_bytes() as u64;
            }
        }
        let mv = self.tel.movement.get_or_insert_with(Default::default);
        mv.huge_advised_bytes = advised;
        (mv.host_pools_direct, mv.host_pools_windowed) = (direct, windowed);
    }

    /// Starts the reads of every bundle of `jobs` (windows Free, slots Loading) and adds the
    /// bundles to `inflight`. All extent reads go to the source in one call, in file order, so
    /// that neighbours in the file can become one read; an aligned extent whose slot is host
    /// memory is read straight into the slot. Either way each extent keeps its own ticket.
    fn submit_bundles(&mut self, li: usize, jobs: &[Job], inflight: &mut HashMap<u32, Bundle>) -> Result<(), PlanError> {
        if jobs.is_empty() {
            return Ok(());
        }
        self.advise_engine_pools();
        let mut reads = Vec::new();
        for &(w, object, slot, version) in jobs {
            self.windows[w as usize].step(w, WindowTransition::BeginRead)?;
            let extents = self.manifest.object(object).expect("manifest object").extents.clone();
            let mut direct = Vec::with_capacity(extents.len());
            for (i, e) in extents.iter().enumerate() {
                let id = self.next_ticket;
                self.next_ticket += 1;
                let t = Ticket {
                    id,
                    object,
                    extent: i as u32,
                    slot,
                    generation: version.generation,
                    epoch: version.epoch,
                    window: w,
                };
                let into = self.direct_target(li, i, slot, e);
                direct.push(into.is_some());
                reads.push((
                    ReadRequest {
                        ticket: id,
                        object,
                        extent: i as u32,
                        offset: e.extent.offset,
                        len: e.extent.len,
                        window: w,
                        window_offset: e.window_offset,
                        epoch: version.epoch,
                        generation: version.generation,
                    },
                    into,
                ));
                self.tickets.insert(id, t);
            }
            let n = extents.len();
            inflight.insert(w, Bundle { object, slot, version, received: vec![false; n], remaining: n, direct });
        }
        reads.sort_by_key(|(r, _)| r.offset);
        let started = Instant::now();
        // SAFETY: each host target is the start of a Loading slot's region of its pool, valid
        // for the extent's bytes (checked in `direct_target`); no consumer reads a Loading slot,
        // no copy writes it, and the slot is not published or reloaded before every completion
        // of its bundle came back (a failed Plan publishes nothing and drains the source).
        let submitted = unsafe { self.source.submit_vectored(&reads) };
        self.tel.read_ns += started.elapsed().as_nanos() as u64;
        let mv = self.tel.movement.get_or_insert_with(Default::default);
        mv.batches += 1;
        mv.max_batch = mv.max_batch.max(reads.len() as u64);
        let done = match submitted {
            Ok(()) => reads.len(),
            Err((n, _)) => n,
        };
        // The batch's time in submit is the first read's; the others follow it on the timeline.
        let mut at = started;
        for (r, into) in &reads[..done] {
            let e = &self.manifest.object(r.object).expect("manifest object").extents[r.extent as usize];
            self.tel.q_run.reads += 1;
            self.tel.q_run.logical_bytes += e.extent.len;
            self.tel.q_run.physical_bytes += e.covering.len;
            self.tel.q_run.padding_bytes += e.padding();
            self.tl.submitted(at, r.ticket, r.object, r.extent, e.extent.len, r.window);
            at = Instant::now();
            if into.is_some() {
                mv.direct_extents += 1;
            }
        }
        if let Err((_, e)) = submitted {
            // Requests the source never took have no completion to wait for.
            for (r, _) in &reads[done..] {
                self.tickets.remove(&r.ticket);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// The next completion; the time spent waiting for it is read time.
    fn wait_source(&mut self) -> Result<Completion, SourceError> {
        let started = Instant::now();
        let c = self.source.wait();
        self.tel.read_ns += started.elapsed().as_nanos() as u64;
        if let Ok(c) = &c {
            self.tl.completed(started, c);
        }
        c
    }

    fn reject(&mut self, kind: RejectKind, ticket: u64, detail: String) -> PlanError {
        *self.tel.rejections.entry(kind.name().to_string()).or_default() += 1;
        PlanError::Rejected { kind, ticket, detail }
    }

    /// Validates one completion; publishes its bundle when it was the last extent.
    fn accept(&mut self, li: usize, c: Completion, inflight: &mut HashMap<u32, Bundle>) -> Result<(), PlanError> {
        let Some(t) = self.tickets.remove(&c.ticket) else {
            return Err(self.reject(RejectKind::UnknownTicket, c.ticket, format!("{c:?}")));
        };
        if c.object != t.object {
            return Err(self.reject(
                RejectKind::WrongObject,
                t.id,
                format!("completion names {}, ticket {}", c.object, t.object),
            ));
        }
        if c.extent != t.extent {
            return Err(self.reject(RejectKind::WrongExtent, t.id, format!("extent {} for {}", c.extent, t.extent)));
        }
        if c.window != t.window {
            return Err(self.reject(RejectKind::WrongWindow, t.id, format!("window {} for {}", c.window, t.window)));
        }
        let epoch = self.table.epoch();
        if c.epoch != t.epoch || t.epoch != epoch {
            return Err(self.reject(
                RejectKind::StaleEpoch,
                t.id,
                format!("completion epoch {}, ticket epoch {}, current {epoch}", c.epoch, t.epoch),
            ));
        }
        let cell = self.table.cell(li, t.slot)?;
        let bundle = inflight.get_mut(&t.window).filter(|b| b.object == t.object && b.slot == t.slot);
        if c.generation != t.generation
            || cell.generation != t.generation
            || cell.state != SlotState::Loading
            || bundle.is_none()
        {
            return Err(self.reject(
                RejectKind::StaleGeneration,
                t.id,
                format!("completion generation {}, ticket {}, slot {:?}", c.generation, t.generation, cell.version()),
            ));
        }
        let len = self.manifest.object(t.object).expect("manifest object").extents[t.extent as usize].extent.len;
        match c.result {
            Err(errno) => return Err(self.reject(RejectKind::IoError, t.id, format!("errno {errno}"))),
            Ok(n) if n < len => return Err(self.reject(RejectKind::ShortRead, t.id, format!("{n} of {len} bytes"))),
            Ok(n) if n > len => return Err(self.reject(RejectKind::LongRead, t.id, format!("{n} of {len} bytes"))),
            Ok(_) => {}
        }
        let b = bundle.expect("checked");
        let direct = b.direct[t.extent as usize];
        self.verify_extent(li, &t, direct)?;
        let b = inflight.get_mut(&t.window).expect("checked");
        b.received[t.extent as usize] = true;
        b.remaining -= 1;
        if b.remaining == 0 {
            let b = inflight.remove(&t.window).expect("present");
            debug_assert!(b.received.iter().all(|&r| r));
            self.publish(li, t.window, b)?;
        }
        Ok(())
    }

    /// HostReady → Copying: the copies into the slot start. Synchronous ones have completed on
    /// return and the slot is published now (Copying → Free, DeviceReady); asynchronous ones
    /// stay in flight on the device's copy stream, the window Copying and the slot Loading,
    /// until [`Plan::finish_copy`] has seen every copy's event complete.
    fn publish(&mut self, li: usize, w: u32, b: Bundle) -> Result<(), PlanError> {
        self.windows[w as usize].step(w, WindowTransition::Assembled)?;
        self.windows[w as usize].step(w, WindowTransition::BeginCopy)?;
        let op = self.manifest.object(b.object).expect("manifest object");
        let window = self.source.window(w);
        let started = Instant::now();
        let (mut direct_bytes, mut copied) = (0, 0);
        let mut ids = Vec::new();
        let pools = &self.pools[self.manifest.buffer_of(li)];
        for (pi, ((e, pool), &direct)) in op.extents.iter().zip(pools).zip(&b.direct).enumerate() {
            assert_eq!(e.role, pool.role, "pools are in role order");
            if direct {
                // Read straight into the slot and validated like every extent: nothing to copy.
                direct_bytes += e.extent.len;
                continue;
            }
            copied += e.extent.len;
            let src = &window[e.window_range()];
            assert_eq!(src.len() as u64, pool.bytes_per_slot);
            match &pool.mem {
                // SAFETY: the destination is slot `b.slot`'s region of this pool, inside the
                // allocation (slot < n_slots); the slot is Loading, so no consumer reads it; the
                // window is the source's own memory, disjoint from every pool.
                PoolMem::Host(_) => unsafe {
                    let dst = pool.host(b.slot).expect("host pool").as_ptr();
                    std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
                },
                PoolMem::Engine(Some(writer)) if writer.asynchronous() => {
                    // SAFETY: the window stays Copying until `finish_copy` waited for this copy:
                    // no read lands in it and no other bundle is assembled there; the source
                    // (and its windows) lives as long as the Plan, and a Plan that fails or
                    // closes waits for every copy in flight first.
                    let id = unsafe { writer.begin(b.slot, src) }.map_err(|detail| PlanError::Copy { detail })?;
                    ids.push((pi, id));
                }
                PoolMem::Engine(Some(writer)) => {
                    writer.write(b.slot, src).map_err(|detail| PlanError::Copy { detail })?;
                }
                PoolMem::Engine(None) => {
                    return Err(PlanError::Copy { detail: format!("the engine never bound the {} pool", pool.role) })
                }
            }
        }
        self.tel.copy_ns += started.elapsed().as_nanos() as u64;
        let mv = self.tel.movement.get_or_insert_with(Default::default);
        mv.direct_bytes += direct_bytes;
        mv.window_bytes += copied;
        let c = InFlightCopy { li, window: w, object: op.id, slot: b.slot, version: b.version, ids, issued: started, copied };
        if c.ids.is_empty() {
            self.tl.copied(started, c.object, c.slot, copied);
            return self.finish_copy(c);
        }
        self.tel.async_copies += c.ids.len() as u64;
        self.tl.copy_queued(started, c.object, c.slot, w, copied);
        self.copies.push_back(c);
        Ok(())
    }

    /// Waits for each copy event of `c` (that event alone, not the whole device), then Copying
    /// → Free for its window and Loading → DeviceReady for its slot.
    fn finish_copy(&mut self, c: InFlightCopy) -> Result<(), PlanError> {
        if !c.ids.is_empty() {
            let started = Instant::now();
            let mut first = None;
            for &(pi, id) in &c.ids {
                let PoolMem::Engine(Some(w)) = &self.pools[self.manifest.buffer_of(c.li)][pi].mem else {
                    unreachable!("only engine pools copy asynchronously")
                };
                // Every id is waited for, even after a failure: the device may still read the window.
                if let Err(detail) = w.wait(id) {
                    first.get_or_insert(PlanError::Copy { detail });
                }
            }
            let waited = started.elapsed().as_nanos() as u64;
            self.tel.copy_ns += waited;
            self.tel.copy_wait_ns += waited;
            self.tel.copy_in_flight_ns += c.issued.elapsed().as_nanos() as u64;
            self.tl.copy_done(started, c.object, c.slot, c.window);
            if let Some(e) = first {
                return Err(e);
            }
        }
        self.windows[c.window as usize].step(c.window, WindowTransition::CopyDone)?;
        self.table.publish(c.li, c.slot, c.version)?;
        self.tl.published(c.object, c.slot);
        self.tel.loads += 1;
        self.tel.bytes_copied += c.copied;
        self.sched.insert(c.object);
        Ok(())
    }

    /// Finishes the copies in flight that `which` selects, oldest first.
    fn finish_copies(&mut self, which: impl Fn(&InFlightCopy) -> bool) -> Result<(), PlanError> {
        let mut i = 0;
        while i < self.copies.len() {
            if which(&self.copies[i]) {
                let c = self.copies.remove(i).expect("in range");
                self.finish_copy(c)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Finishes the copies in flight into `slots` of layer index `li`.
    fn finish_copies_into(&mut self, li: usize, slots: &[(ObjectId, u32, Version)]) -> Result<(), PlanError> {
        self.finish_copies(|c| c.li == li && slots.iter().any(|&(_, s, v)| s == c.slot && v == c.version))
    }

    /// Whether slot `slot` of layer index `li` is Loading only because its copy is in flight.
    fn copy_in_flight(&self, li: usize, slot: u32) -> bool {
        self.copies.iter().any(|c| c.li == li && c.slot == slot)
    }

    /// Prefetch reads that have landed by a release start their copies, which then run while
    /// the engine computes up to the next layer's acquire.
    fn harvest_prefetch(&mut self) -> Result<(), PlanError> {
        let Some(mut p) = self.prefetching.take() else { return Ok(()) };
        let r = self.harvest(p.li, &mut VecDeque::new(), &mut p.inflight);
        self.prefetching = Some(p);
        r
    }

    fn release_event(&mut self, layer: u32, pass: u32) -> Result<(), PlanError> {
        let stack = self.events.get_mut(&(layer, pass));
        let Some(event) = stack.and_then(|s| s.pop()) else {
            return Err(PlanError::NoOutstandingAcquire { layer, pass });
        };
        if self.events.get(&(layer, pass)).is_some_and(Vec::is_empty) {
            self.events.remove(&(layer, pass));
        }
        self.tel.releases += 1;
        for (li, slot, v) in event {
            self.drop_consumer(li, slot, v)?;
        }
        Ok(())
    }

    /// One consumer fewer; a slot left Recyclable goes to the policy (pinned ones stay).
    fn drop_consumer(&mut self, li: usize, slot: u32, v: Version) -> Result<(), PlanError> {
        let state = self.table.release(li, slot, v)?;
        self.tel.consumer_drops += 1;
        if state != SlotState::Recyclable {
            return Ok(());
        }
        let object = self.table.cell(li, slot)?.object.expect("a Recyclable slot holds an object");
        if self.manifest.is_pinned(object) {
            return Ok(());
        }
        for victim in self.policy.released(object) {
            let vli = self.manifest.layer_index(victim.layer).ok_or(PlanError::UnknownLayer { layer: victim.layer })?;
            self.evict(vli, victim)?;
        }
        Ok(())
    }

    fn release_holds(&mut self) -> Result<(), PlanError> {
        for li in 0..self.holds.len() {
            for (hli, slot, v) in std::mem::take(&mut self.holds[li]) {
                self.drop_consumer(hli, slot, v)?;
            }
        }
        Ok(())
    }

    fn reset_inner(&mut self) -> Result<(), PlanError> {
        if let Some(s) = &self.stream {
            return Err(PlanError::OutstandingWork { detail: format!("layer {}'s streamed event is at pass {}", s.layer, s.next) });
        }
        self.complete_prefetch()?;
        self.finish_copies(|_| true)?;
        self.release_holds()?;
        let consumers = self.table.consumers();
        if consumers > 0 {
            return Err(PlanError::ConsumersLive { consumers });
        }
        let busy = self.windows.iter().filter(|w| **w != WindowState::Free).count();
        if !self.tickets.is_empty() || busy > 0 {
            return Err(PlanError::OutstandingWork {
                detail: format!("{} active tickets, {busy} windows not Free", self.tickets.len()),
            });
        }
        self.table.reset()?;
        self.tel.resets += 1;
        self.drain()
    }

    /// Waits for every copy still in flight without publishing its slot (a failed Plan): the
    /// device may still read those windows, so none is discarded before its event completed.
    fn wait_copies(&mut self) {
        for c in std::mem::take(&mut self.copies) {
            for &(pi, id) in &c.ids {
                if let PoolMem::Engine(Some(w)) = &self.pools[self.manifest.buffer_of(c.li)][pi].mem {
                    let _ = w.wait(id);
                }
            }
            self.tel.copies_abandoned += 1;
        }
    }

    /// Takes every queued completion out of the source; none becomes visible.
    fn drain(&mut self) -> Result<(), PlanError> {
        while self.source.outstanding() > 0 {
            let c = self.source.wait()?;
            self.tl.completed(std::time::Instant::now(), &c);
            self.tickets.remove(&c.ticket);
            self.tel.drained_completions += 1;
        }
        Ok(())
    }

    fn shutdown_inner(&mut self) -> Result<Closure, PlanError> {
        self.drop_stream()?;
        if self.status == Status::Running {
            self.complete_prefetch()?;
            self.finish_copies(|_| true)?;
        }
        self.wait_copies();
        self.prefetching = None;
        self.drain()?;
        self.release_holds()?;
        let consumers = self.table.consumers();
        if consumers > 0 {
            return Err(PlanError::ConsumersLive { consumers });
        }
        if matches!(self.status, Status::Failed(_)) {
            // Every read was drained and nothing of these bundles was copied: the windows go
            // back to Free, counted, so the source closes with all windows free.
            for (w, state) in self.windows.iter_mut().enumerate() {
                if *state != WindowState::Free {
                    state.step(w as u32, WindowTransition::Discard)?;
                    self.tel.windows_discarded += 1;
                }
            }
        }
        let closure = self.closure();
        self.status = Status::Closed;
        Ok(closure)
    }
}

/// Splits distinct experts into groups with at most `capacity` unpinned members each.
fn groups(distinct: &[u32], capacity: u32, pinned: impl Fn(u32) -> bool) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let (mut cur, mut n) = (Vec::new(), 0);
    for &e in distinct {
        if !pinned(e) {
            if n == capacity {
                out.push(std::mem::take(&mut cur));
                n = 0;
            }
            n += 1;
        }
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
