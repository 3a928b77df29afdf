//! What the Plan reports: request and cache counters, traffic Q_run, the scheduler union
//! U_sched and the semantic-demand lower bound U_sem^LB.

use super::lifecycle::SlotState;
use crate::source::SourceStats;
use serde::Serialize;
use std::collections::BTreeMap;

/// Why a completion was refused before anything became visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectKind {
    /// No active ticket has this id (never issued, or already completed).
    UnknownTicket,
    WrongObject,
    WrongExtent,
    WrongWindow,
    /// The ticket's epoch is not the current one.
    StaleEpoch,
    /// The ticket's generation is not the slot's loading generation.
    StaleGeneration,
    /// The read failed with an errno.
    IoError,
    /// Fewer logical bytes than the extent.
    ShortRead,
    /// More logical bytes than the extent (object-size disagreement).
    LongRead,
    /// The extent's bytes are not the ones the model's digest manifest names.
    DigestMismatch,
}

impl RejectKind {
    pub fn name(self) -> &'static str {
        match self {
            RejectKind::UnknownTicket => "unknown_ticket",
            RejectKind::WrongObject => "wrong_object",
            RejectKind::WrongExtent => "wrong_extent",
            RejectKind::WrongWindow => "wrong_window",
            RejectKind::StaleEpoch => "stale_epoch",
            RejectKind::StaleGeneration => "stale_generation",
            RejectKind::IoError => "io_error",
            RejectKind::ShortRead => "short_read",
            RejectKind::LongRead => "long_read",
            RejectKind::DigestMismatch => "digest_mismatch",
        }
    }
}

/// Cumulative traffic: every read the Plan submitted, rereads included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Traffic {
    pub reads: u64,
    pub logical_bytes: u64,
    /// Covering aligned reads (what a direct source reads).
    pub physical_bytes: u64,
    pub padding_bytes: u64,
}

/// A deduplicated set of objects and its logical bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Union {
    pub objects: u64,
    pub bytes: u64,
}

/// U_sem^LB: the union of the extents of every object the router selected at least once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SemanticUnion {
    pub objects: u64,
    pub extents: u64,
    pub bytes: u64,
    /// Identical extents counted twice: must be 0.
    pub duplicates: u64,
    /// Overlapping extents: must be 0.
    pub overlaps: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Telemetry {
    pub policy: String,
    pub epoch: u64,
    pub acquires: u64,
    pub releases: u64,
    pub resets: u64,
    /// Resident-object requests: one per object of each acquired group.
    pub object_requests: u64,
    pub hits: u64,
    pub misses: u64,
    /// Hits on objects a prefetch loaded.
    pub prefetch_hits: u64,
    /// Evictions of a loaded object (Recyclable → Vacant).
    pub recycles: u64,
    /// Of those, evictions because another layer sharing the buffer loaded into the slot.
    pub buffer_evictions: u64,
    /// Cold resets ([`super::Plan::reset_cold`]), and the objects they evicted (not recycles).
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub cold_resets: u64,
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub cold_evictions: u64,
    /// Bundles published (demand and prefetch).
    pub loads: u64,
    pub prefetch_loads: u64,
    /// Bytes copied from windows into slots (host-to-device when the pools are on a device).
    pub bytes_copied: u64,
    /// Time in those copies, each observed complete: for asynchronous copies, the time to
    /// queue them plus the time blocked on their events.
    pub copy_ns: u64,
    /// Copies queued on the device's copy stream with an event each (0: every copy was
    /// synchronous), the time blocked waiting for their events, and the time from queueing to
    /// each event seen complete (summed over bundles: copies in flight overlap).
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub async_copies: u64,
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub copy_wait_ns: u64,
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub copy_in_flight_ns: u64,
    /// Completions taken back without blocking at the end of a pass or at a release, so that
    /// their copies run while the engine computes.
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub harvested: u64,
    /// Bundles whose copies a failed Plan waited for and never published.
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub copies_abandoned: u64,
    /// Time in the source's submit and wait: reads the Plan did not overlap with compute.
    pub read_ns: u64,
    pub consumer_takes: u64,
    pub consumer_drops: u64,
    pub rejections: BTreeMap<RejectKind, u64>,
    /// Completions drained by reset or shutdown (never made visible).
    pub drained_completions: u64,
    /// Windows returned to Free by a failed Plan's shutdown, their bundles never copied.
    pub windows_discarded: u64,
    /// Per MoE layer, the generations its slots started (loads begun).
    pub generations: BTreeMap<u32, u64>,
    pub q_run: Traffic,
    pub u_sched: Union,
    pub u_sem_lb: SemanticUnion,
    /// How the reads went out and where their bytes landed (absent in earlier records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub movement: Option<Movement>,
    /// Extents verified against the model's digest manifest as they were read (absent where
    /// the Plan had no manifest, as in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digests: Option<DigestCheck>,
}

/// How the Plan's reads went out: batches handed to the source, the device reads (SQEs) they
/// became, and where the bytes landed. `q_run.reads` counts extent reads (one per ticket).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Movement {
    /// Calls that handed extent reads to the source, and the most extent reads in one.
    pub batches: u64,
    pub max_batch: u64,
    /// Reads the source issued (io_uring SQEs; one per extent for P and D).
    pub sqes: u64,
    /// Vectored reads that carried more than one extent, and the extents they carried.
    pub coalesced_sqes: u64,
    pub coalesced_extents: u64,
    /// Extent reads that landed straight in their slot, and their logical bytes.
    pub direct_extents: u64,
    pub direct_bytes: u64,
    /// Logical bytes copied from a window into a slot.
    pub window_bytes: u64,
    /// Bytes of host slot memory in whole 2 MiB pages advised to be huge pages before the
    /// first read (reads into them reach the device in fewer, larger segments).
    #[serde(default)]
    pub huge_advised_bytes: u64,
    /// Host slot pools laid out for reads straight into their slots (every extent of the role
    /// at one offset within a page), and those filled through windows (offsets that vary from
    /// expert to expert: an extent length that is not a multiple of the page).
    #[serde(default)]
    pub host_pools_direct: u64,
    #[serde(default)]
    pub host_pools_windowed: u64,
}

/// What the Plan verified of the bytes it read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DigestCheck {
    /// The digest of the manifest the extents were compared with.
    pub manifest_sha256: String,
    pub extents: u64,
    /// Logical bytes hashed: every byte read that could have become visible.
    pub bytes: u64,
    /// Time hashing them, on the thread that takes completions.
    pub hash_ns: u64,
    /// The algorithm (`xxh3-128`, `blake3`); absent in records from before the choice, which
    /// verified with BLAKE3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
}

/// The terminal ledger of a Plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Closure {
    pub epoch: u64,
    /// Tickets submitted whose completion never came back: must be 0.
    pub active_tickets: u64,
    pub windows_free: u32,
    pub windows_total: u32,
    pub consumers_live: u64,
    pub consumer_takes: u64,
    pub consumer_drops: u64,
    pub source_outstanding: u64,
    pub drained_completions: u64,
    pub slots: BTreeMap<String, u64>,
    /// The error that failed the Plan, if any.
    pub failed: Option<String>,
    pub source: SourceStats,
}

impl Telemetry {
    /// The counters of a new request: what names the run (policy, epoch, the layers, the pools'
    /// layout, the digest manifest) carries on, every count starts again at zero.
    pub fn restarted(&self) -> Telemetry {
        Telemetry {
            policy: self.policy.clone(),
            epoch: self.epoch,
            generations: self.generations.keys().map(|&l| (l, 0)).collect(),
            movement: self.movement.map(|m| Movement {
                huge_advised_bytes: m.huge_advised_bytes,
                host_pools_direct: m.host_pools_direct,
                host_pools_windowed: m.host_pools_windowed,
                ..Default::default()
            }),
            digests: self.digests.as_ref().map(|d| DigestCheck {
                manifest_sha256: d.manifest_sha256.clone(),
                algorithm: d.algorithm.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl Closure {
    /// Balanced tickets, windows, consumers and source, and no failure.
    pub fn is_clean(&self) -> bool {
        self.balanced() && self.failed.is_none()
    }

    /// Balanced tickets, windows, consumers and source (a failed Plan can be balanced).
    pub fn balanced(&self) -> bool {
        self.active_tickets == 0
            && self.windows_free == self.windows_total
            && self.consumers_live == 0
            && self.consumer_takes == self.consumer_drops
            && self.source_outstanding == 0
    }

    pub(crate) fn slot_states<'a>(cells: impl Iterator<Item = &'a SlotState>) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for s in cells {
            *m.entry(format!("{s:?}")).or_insert(0) += 1;
        }
        m
    }
}
