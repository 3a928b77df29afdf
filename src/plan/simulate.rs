//! Cache policies against their bound: a generate record's routes replayed through the Plan
//! itself, with a dry source (reads complete at once, no bytes move) and discarded slot
//! writes, so hits, loads and bytes moved are the Plan's own, without compute or I/O; beside
//! Belady's MIN on the same requests, the fewest loads any policy could make with those slots
//! (exact where every event fits the slots; see [`min_loads`]).
//!
//! Replay follows the engine: per ubatch and MoE layer, the rows' ids in row order make one
//! layer event; the engine runs ceil(min(n_experts, ids) / n_per_pass) passes of it, each an
//! acquire and, when it served anything, a release.

use super::{resident_first, LayerPlan, Manifest, Passes, Plan, PolicySpec, SlotWriter, Telemetry};
use crate::routes::RouteEvent;
use crate::source::{check_request, Completion, ReadRequest, Source, SourceError, SourceStats};
use anyhow::{anyhow, bail, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Windows of the dry source: they bound reads in flight, never what is loaded.
const WINDOWS: u32 = 8;

/// One MoE layer's selections in one ubatch: every row's k ids, in row order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerEvent {
    pub ubatch: u32,
    pub layer: u32,
    pub ids: Vec<i32>,
}

/// Parses a `routes` surface into layer events, refusing anything the engine could not have
/// written ([`crate::routes::decode`]).
pub fn parse_routes(bytes: &[u8], k: usize) -> Result<Vec<LayerEvent>> {
    Ok(layer_events(crate::routes::decode(bytes, k)?))
}

/// One layer event per (ubatch, layer): its rows' ids in row order, as the engine hands them to
/// the Plan. The decoder has already checked the rows come in order.
pub fn layer_events(routes: Vec<RouteEvent>) -> Vec<LayerEvent> {
    let mut out: Vec<LayerEvent> = Vec::new();
    for e in routes {
        match out.last_mut() {
            Some(last) if last.ubatch == e.ubatch && last.layer == e.layer => last.ids.extend(e.experts),
            _ => out.push(LayerEvent { ubatch: e.ubatch, layer: e.layer, ids: e.experts }),
        }
    }
    out
}

/// The decode's layer events as drafted traversals (`generate --draft`) would make them, every
/// draft accepted: ubatches from `decode_from` on, `k + 1` consecutive ones to a traversal, each
/// layer's rows in position order. What a target reads per traversal at best: rejected drafts
/// route rows of their own and only add to the union.
pub fn drafted(events: &[LayerEvent], decode_from: u32, k: u32) -> Vec<LayerEvent> {
    let mut out: Vec<LayerEvent> = events.iter().filter(|e| e.ubatch < decode_from).cloned().collect();
    let mut decode: BTreeMap<(u32, u32), Vec<i32>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.ubatch >= decode_from) {
        let traversal = decode_from + (e.ubatch - decode_from) / (k + 1);
        decode.entry((traversal, e.layer)).or_default().extend(&e.ids);
    }
    out.extend(decode.into_iter().map(|((ubatch, layer), ids)| LayerEvent { ubatch, layer, ids }));
    out
}

/// Passes the engine runs for `n_ids` selections (llama_expert_binding::n_passes).
pub fn n_passes(n_ids: usize, n_experts: u32, n_per_pass: u32) -> u32 {
    let distinct = (n_ids as u64).min(u64::from(n_experts));
    distinct.div_ceil(u64::from(n_per_pass.max(1))).max(1) as u32
}

/// A source whose reads complete at once and move no bytes; requests are still checked
/// against the window geometry.
struct DrySource {
    windows: u32,
    window: Vec<u8>,
    window_size: u64,
    queue: VecDeque<Completion>,
    stats: SourceStats,
    /// Every request submitted, in order, where the caller asked for them.
    log: Option<Arc<Mutex<Vec<ReadRequest>>>>,
}

impl DrySource {
    fn new(manifest: &Manifest, windows: u32, log: Option<Arc<Mutex<Vec<ReadRequest>>>>) -> DrySource {
        DrySource {
            windows,
            window: vec![0; manifest.window_size as usize],
            window_size: manifest.window_size,
            queue: VecDeque::new(),
            stats: SourceStats::default(),
            log,
        }
    }
}

impl Source for DrySource {
    fn n_windows(&self) -> u32 {
        self.windows
    }
    fn window_size(&self) -> u64 {
        self.window_size
    }
    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError> {
        let cov = check_request(&req, self.windows, self.window_size)?;
        if let Some(log) = &self.log {
            log.lock().expect("the read log is never poisoned").push(req);
        }
        self.stats.submissions += 1;
        self.stats.record_read(cov.len, &cov, req.len);
        self.queue.push_back(Completion::of(&req, Ok(req.len)));
        self.stats.peak_outstanding = self.stats.peak_outstanding.max(self.queue.len() as u64);
        Ok(())
    }
    fn wait(&mut self) -> Result<Completion, SourceError> {
        let c = self.queue.pop_front().ok_or(SourceError::NothingOutstanding)?;
        self.stats.completions += 1;
        Ok(c)
    }
    fn outstanding(&self) -> usize {
        self.queue.len()
    }
    fn window(&self, _w: u32) -> &[u8] {
        // Every window is the same zeroed memory: nothing reads what is "copied" from it.
        &self.window
    }
    fn stats(&self) -> SourceStats {
        self.stats
    }
}

struct Discard;

impl SlotWriter for Discard {
    fn write(&self, _slot: u32, _src: &[u8]) -> Result<(), super::CopyError> {
        Ok(())
    }
}

/// Replays `events` through a Plan over `manifest` with `policy`; returns its telemetry.
/// `passes`: how the run streamed its events in passes ([`Plan::stream_passes`]).
pub fn replay(manifest: Manifest, policy: &PolicySpec, events: &[LayerEvent], passes: Passes) -> Result<Telemetry> {
    replay_with(manifest, policy, events, WINDOWS, passes, None).map(|(t, _)| t)
}

/// The reads the Plan submits for `events`, in submission order: what a run with these
/// settings (`windows` staging windows) asks of its source, without compute or I/O.
pub struct ReadTrace {
    pub telemetry: Telemetry,
    pub requests: Vec<ReadRequest>,
    /// `requests[starts[n]..starts[n + 1]]` were submitted while serving event n (prefetches
    /// for the next layer included); one more entry than events.
    pub starts: Vec<usize>,
}

pub fn reads(manifest: Manifest, policy: &PolicySpec, events: &[LayerEvent], windows: u32, passes: Passes) -> Result<ReadTrace> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (telemetry, starts) = replay_with(manifest, policy, events, windows, passes, Some(log.clone()))?;
    let requests = std::mem::take(&mut *log.lock().expect("the read log is never poisoned"));
    Ok(ReadTrace { telemetry, requests, starts })
}

fn replay_with(
    manifest: Manifest,
    policy: &PolicySpec,
    events: &[LayerEvent],
    windows: u32,
    passes: Passes,
    log: Option<Arc<Mutex<Vec<ReadRequest>>>>,
) -> Result<(Telemetry, Vec<usize>)> {
    let logged =
        |log: &Option<Arc<Mutex<Vec<ReadRequest>>>>| log.as_ref().map_or(0, |l| l.lock().expect("the read log is never poisoned").len());
    let mut starts = Vec::with_capacity(events.len() + 1);
    let n_per_pass = manifest.layers.iter().map(LayerPlan::capacity).min().unwrap_or(1).max(1);
    let experts: HashMap<u32, (u32, u32)> = manifest.layers.iter().map(|l| (l.layer, (l.n_experts, l.n_used))).collect();
    let binds: Vec<(u32, super::Role, u64, u32)> =
        manifest.layers.iter().flat_map(|l| l.roles.iter().map(move |r| (l.layer, r.role, r.bytes_per_slot, l.n_slots))).collect();
    let source = DrySource::new(&manifest, windows, log.clone());
    let mut plan = Plan::for_engine(manifest, policy, Box::new(source)).map_err(|e| anyhow!("{e}"))?;
    // As the engine: a one-token ubatch (n_used selections) runs passes of the token pass,
    // others of the prompt pass, each at most a layer's unpinned capacity.
    let clamp = |p: Option<u32>| p.map(|g| g.clamp(1, n_per_pass));
    let passes = Passes { token: clamp(passes.token), prompt: clamp(passes.prompt) };
    plan.stream_passes(passes);
    for (layer, role, bytes, n_slots) in binds {
        plan.bind(layer, role, bytes, n_slots, Box::new(Discard)).map_err(|e| anyhow!("{e}"))?;
    }
    let mut slots = Vec::new();
    for (n, ev) in events.iter().enumerate() {
        let at = |e: super::PlanError| anyhow!("layer event {n} (ubatch {}, layer {}): {e}", ev.ubatch, ev.layer);
        let Some(&(n_experts, n_used)) = experts.get(&ev.layer) else {
            bail!("layer event {n}: layer {} is not a MoE layer of the model", ev.layer);
        };
        starts.push(logged(&log));
        slots.resize(ev.ids.len(), -1);
        let per = passes.per_pass(ev.ids.len(), n_used).unwrap_or(n_per_pass);
        for pass in 0..n_passes(ev.ids.len(), n_experts, per) {
            plan.acquire(ev.layer, pass, &ev.ids, &mut slots).map_err(at)?;
            if slots.iter().any(|&s| s >= 0) {
                plan.release(ev.layer, pass).map_err(at)?;
            }
        }
    }
    let closure = plan.shutdown().map_err(|e| anyhow!("{e}"))?;
    if !closure.is_clean() {
        bail!("the replayed Plan did not close clean: {closure:?}");
    }
    starts.push(logged(&log));
    Ok((plan.telemetry(), starts))
}

/// Belady's MIN for one layer: on a miss it evicts the resident object, outside the current
/// group, whose next event is furthest away. Events (distinct ids) are served in `capacity`
/// groups, each wholly resident at once; an event larger than the slots is served resident ids
/// first, as the Plan streams it (its resident ids then all fall in its first group, so the
/// next event orders candidates as the next group would). Exact, the fewest loads any policy
/// could make, where every event fits the slots; where one does not, its order is not fixed, and
/// an order that looks ahead (ending an event with what the next one needs) may load fewer.
pub fn min_loads(events: &[Vec<u32>], capacity: usize) -> u64 {
    assert!(capacity > 0, "MIN needs a slot");
    // next[t][i]: the next event after t that names events[t][i] (usize::MAX: none).
    let mut next: Vec<HashMap<u32, usize>> = vec![HashMap::new(); events.len()];
    let mut seen: HashMap<u32, usize> = HashMap::new();
    for (t, r) in events.iter().enumerate().rev() {
        next[t] = r.iter().map(|&e| (e, seen.get(&e).copied().unwrap_or(usize::MAX))).collect();
        for &e in r {
            seen.insert(e, t);
        }
    }
    // Resident objects with their next use; `candidates` holds those outside the group.
    let mut resident: HashMap<u32, usize> = HashMap::new();
    let mut candidates: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut loads = 0;
    for (t, r) in events.iter().enumerate() {
        let order = resident_first(r, |e| resident.contains_key(&e));
        for group in order.chunks(capacity) {
            let mut misses = 0;
            for e in group {
                match resident.get(e) {
                    Some(&nu) => {
                        candidates.remove(&(nu, *e));
                    }
                    None => misses += 1,
                }
            }
            // Loaded objects enter `resident` below: count them as they come.
            let mut occupied = resident.len();
            for _ in 0..misses {
                if occupied == capacity {
                    let (_, victim) = candidates.pop_last().expect("a group fits its slots");
                    resident.remove(&victim);
                } else {
                    occupied += 1;
                }
                loads += 1;
            }
            for &e in group {
                let nu = next[t][&e];
                resident.insert(e, nu);
                candidates.insert((nu, e));
            }
        }
    }
    loads
}

/// Per MoE layer, the object requests `events` make: each event's distinct experts in order of
/// first appearance ([`min_loads`] groups them by the slots).
pub fn layer_requests(manifest: &Manifest, events: &[LayerEvent]) -> Result<BTreeMap<u32, Vec<Vec<u32>>>> {
    let mut out: BTreeMap<u32, Vec<Vec<u32>>> = BTreeMap::new();
    for (n, ev) in events.iter().enumerate() {
        let lp = manifest.layer(ev.layer).ok_or_else(|| anyhow!("layer event {n}: layer {} is not a MoE layer", ev.layer))?;
        let mut distinct = Vec::new();
        for &id in &ev.ids {
            if id < 0 || id as u32 >= lp.n_experts {
                bail!("layer event {n}: expert id {id} of layer {} is outside [0, {})", ev.layer, lp.n_experts);
            }
            if !distinct.contains(&(id as u32)) {
                distinct.push(id as u32);
            }
        }
        out.entry(ev.layer).or_default().push(distinct);
    }
    Ok(out)
}

/// One row of the result: a policy (or MIN) at one slot count.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// The policy string, or `MIN`.
    pub policy: String,
    pub slots: u32,
    /// Object requests: one per expert of each group served.
    pub requests: u64,
    pub hits: u64,
    /// Objects published into slots, prefetched ones included.
    pub loads: u64,
    pub prefetch_loads: u64,
    pub prefetch_hits: u64,
    /// Logical bytes of those loads (what moves into slots).
    pub bytes_moved: u64,
    /// Covering aligned reads an O_DIRECT source would make (MIN: not modelled).
    pub bytes_read: Option<u64>,
    /// Why this cell was not simulated (e.g. lru:K above the slots).
    pub refused: Option<String>,
}

impl Row {
    fn refused(policy: String, slots: u32, why: String) -> Row {
        Row {
            policy,
            slots,
            requests: 0,
            hits: 0,
            loads: 0,
            prefetch_loads: 0,
            prefetch_hits: 0,
            bytes_moved: 0,
            bytes_read: None,
            refused: Some(why),
        }
    }
}

/// MIN over `events` with `manifest`'s slots (no pins): loads and their bytes.
pub fn min_row(manifest: &Manifest, events: &[LayerEvent]) -> Result<Row> {
    let (mut requests, mut loads, mut bytes) = (0, 0, 0);
    for (layer, reqs) in layer_requests(manifest, events)? {
        let lp = manifest.layer(layer).expect("a manifest layer");
        let l = min_loads(&reqs, lp.n_slots as usize);
        requests += reqs.iter().map(|r| r.len() as u64).sum::<u64>();
        loads += l;
        // Every object of a layer has the layer's role sizes: loads decide the bytes.
        bytes += l * lp.slot_bytes();
    }
    Ok(Row {
        policy: "MIN".into(),
        slots: manifest.requested_slots,
        requests,
        hits: requests - loads,
        loads,
        prefetch_loads: 0,
        prefetch_hits: 0,
        bytes_moved: bytes,
        bytes_read: None,
        refused: None,
    })
}

/// The policy `template` names at `slots` slots: `lru:S` retains as many objects as there are
/// slots (whole-cache LRU); any other policy string stands for itself.
pub fn policy_at(template: &str, slots: u32) -> Result<PolicySpec> {
    let parts: Vec<String> =
        template.split('+').map(|p| if p.trim() == "lru:S" { format!("lru:{slots}") } else { p.to_string() }).collect();
    parts.join("+").parse()
}

/// Every (slot count, policy) cell and MIN per slot count. `manifest_for` builds the manifest
/// for a slot count and pins, `passes_at` the passes a run at that slot count streams. A
/// policy the Plan refuses at a slot count (lru:K over the slots, pins filling a layer)
/// becomes a refused row.
pub fn simulate(
    manifest_for: impl Fn(u32, &[super::ObjectId]) -> Result<Manifest>,
    slots: &[u32],
    policies: &[String],
    events: &[LayerEvent],
    passes_at: impl Fn(&Manifest) -> Passes,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &s in slots {
        for template in policies {
            let name = template.clone();
            let p = policy_at(template, s)?;
            let manifest = match manifest_for(s, &p.pinned) {
                Ok(m) => m,
                Err(e) => {
                    rows.push(Row::refused(name, s, format!("{e:#}")));
                    continue;
                }
            };
            if let Some(lp) = manifest.layers.iter().find(|l| p.retain > l.n_slots) {
                rows.push(Row::refused(name, s, format!("lru:{} exceeds the {} slots of layer {}", p.retain, lp.n_slots, lp.layer)));
                continue;
            }
            let passes = passes_at(&manifest);
            let t = replay(manifest, &p, events, passes)?;
            rows.push(Row {
                policy: name,
                slots: s,
                requests: t.object_requests,
                hits: t.hits,
                loads: t.loads,
                prefetch_loads: t.prefetch_loads,
                prefetch_hits: t.prefetch_hits,
                bytes_moved: t.bytes_copied,
                bytes_read: Some(t.q_run.physical_bytes),
                refused: None,
            });
        }
        rows.push(min_row(&manifest_for(s, &[])?, events)?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The optimum by exhaustive search over resident sets (demand loading, which no other
    /// schedule beats): the fewest loads serving `requests` with `capacity` slots (objects below 32).
    fn brute_force(requests: &[Vec<u32>], capacity: usize) -> u64 {
        let mut best: HashMap<u32, u64> = HashMap::from([(0u32, 0)]);
        for r in requests {
            let need: u32 = r.iter().map(|e| 1 << e).sum();
            let mut next: HashMap<u32, u64> = HashMap::new();
            for (&set, &cost) in &best {
                let cost = cost + u64::from((need & !set).count_ones());
                let all = set | need;
                // Keep `need` and any subset of the rest that fits.
                let rest = all & !need;
                let mut sub = rest;
                loop {
                    let keep = need | sub;
                    if keep.count_ones() as usize <= capacity {
                        let c = next.entry(keep).or_insert(u64::MAX);
                        *c = (*c).min(cost);
                    }
                    if sub == 0 {
                        break;
                    }
                    sub = (sub - 1) & rest;
                }
            }
            best = next;
        }
        best.values().copied().min().unwrap_or(0)
    }

    #[test]
    fn min_on_a_hand_worked_trace() {
        // 3 slots. Requests: {0,1} {2} {3} {0} {1,2} {3}.
        // t0: load 0,1 (2). t1: load 2 (3). t2: full {0,1,2}; next uses 0@3, 1@4, 2@4 -> evict
        // 1 or 2 (furthest, 4; ties by id: 2); load 3 (4). t3: 0 hit. t4: {1,2}: 1 resident,
        // 2 missing; candidates 0 (never again), 3 (@5): evict 0, load 2 (5). t5: 3 hit.
        // LRU with 3 slots would load 0,1,2,3,0,1,2,3 minus hits: 7.
        let reqs = vec![vec![0, 1], vec![2], vec![3], vec![0], vec![1, 2], vec![3]];
        assert_eq!(min_loads(&reqs, 3), 5);
        assert_eq!(brute_force(&reqs, 3), 5);
        // One slot: every change of object is a load.
        let one = vec![vec![0], vec![0], vec![1], vec![0], vec![0]];
        assert_eq!(min_loads(&one, 1), 3);
        // A request of the whole capacity keeps nothing else.
        let whole = vec![vec![0, 1], vec![2, 3], vec![0, 1]];
        assert_eq!(min_loads(&whole, 2), 6);
    }

    /// xorshift64*: the test's own seeded randomness.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn random_requests(rng: &mut Rng, n: u32, capacity: usize, len: usize) -> Vec<Vec<u32>> {
        (0..len)
            .map(|_| {
                let size = 1 + rng.below(capacity as u64) as usize;
                let mut r = Vec::new();
                while r.len() < size {
                    let e = rng.below(u64::from(n)) as u32;
                    if !r.contains(&e) {
                        r.push(e);
                    }
                }
                r
            })
            .collect()
    }

    #[test]
    fn min_equals_brute_force_on_random_traces() {
        let mut rng = Rng(0x5eed_0001);
        for case in 0..300 {
            let n = 3 + rng.below(5) as u32; // 3..=7 objects
            let capacity = 1 + rng.below(u64::from(n - 1)) as usize;
            let len = 1 + rng.below(14) as usize;
            let reqs = random_requests(&mut rng, n, capacity, len);
            assert_eq!(min_loads(&reqs, capacity), brute_force(&reqs, capacity), "case {case}: {reqs:?} capacity {capacity}");
        }
    }

    /// A manifest of `layers` MoE layers of `experts` experts with small, distinct extents, each
    /// token selecting `k`.
    fn manifest(layers: u32, experts: u32, k: u64, slots: u32, pinned: &[super::super::ObjectId]) -> Result<Manifest> {
        use crate::inventory::{ExpertObject, Extent, Inventory, MoeLayer};
        let mut objects = Vec::new();
        let mut offset = 0;
        for layer in 0..layers {
            for expert in 0..experts {
                let mut extents = Vec::new();
                for role in ["gate", "up", "down"] {
                    extents.push((role.to_string(), Extent { offset, len: 1000 }));
                    offset += 4096;
                }
                objects.push(ExpertObject { layer, expert, extents });
            }
        }
        let inv = Inventory {
            file: "simulated".into(),
            architecture: "qwen3moe".into(),
            file_bytes: offset,
            data_offset: 0,
            alignment: 4096,
            shards: Vec::new(),
            t_repr_bytes: offset,
            t_repr_rule: crate::inventory::T_REPR_RULE,
            expert_bytes: offset,
            non_expert_bytes: 0,
            expert_used_count: None,
            context_length: None,
            tensors: Vec::new(),
            moe_layers: (0..layers).map(|layer| MoeLayer { layer, experts, expert_used: Some(k), tensors: BTreeMap::new() }).collect(),
            mtp_layers: Vec::new(),
            objects,
            extent_duplicates: 0,
            extent_overlaps: 0,
        };
        Manifest::new(&inv, slots, pinned)
    }

    fn random_events(rng: &mut Rng, layers: u32, experts: u32, k: usize, ubatches: u32) -> Vec<LayerEvent> {
        let mut out = Vec::new();
        for ubatch in 0..ubatches {
            // Mostly one row (decode), sometimes a prefill of several.
            let rows = if rng.below(4) == 0 { 1 + rng.below(4) as usize } else { 1 };
            for layer in 0..layers {
                let mut ids = Vec::new();
                for _ in 0..rows {
                    let mut row: Vec<i32> = Vec::new();
                    while row.len() < k {
                        // Skewed: low ids more often, as real routers are.
                        let e = (rng.below(u64::from(experts)) * rng.below(u64::from(experts)) / u64::from(experts)) as i32;
                        if !row.contains(&e) {
                            row.push(e);
                        }
                    }
                    ids.extend(row);
                }
                out.push(LayerEvent { ubatch, layer, ids });
            }
        }
        out
    }

    #[test]
    fn min_never_loads_more_than_any_policy() {
        let mut rng = Rng(0x5eed_0002);
        let p = |s: &str| s.to_string();
        for case in 0..40 {
            let (layers, experts, k) = (3, 8, 2);
            let events = random_events(&mut rng, layers, experts, k, 12);
            for slots in [2u32, 3, 4, 6, 8] {
                let mut policies = vec![p("zero"), p("zero+prefetch"), p("lru:1"), p("lru:1+prefetch")];
                if slots >= 2 {
                    policies.push(p("lru:S"));
                    policies.push(p(&format!("lru:{}+prefetch", slots / 2)));
                }
                // Whole events, and events streamed in passes of one and two (resident experts
                // first): MIN is exact where every event fits the slots, and the streamed
                // order of a larger event is not fixed (see min_loads).
                let fits = events.iter().all(|e| e.ids.iter().collect::<BTreeSet<_>>().len() <= slots as usize);
                for passes in [Passes::default(), Passes { token: Some(1), prompt: Some(1) }, Passes { token: Some(1), prompt: Some(2) }] {
                    let rows =
                        simulate(|s, pins| manifest(layers, experts, k as u64, s, pins), &[slots], &policies, &events, |_| passes).unwrap();
                    let min = rows.iter().find(|r| r.policy == "MIN").unwrap();
                    for r in rows.iter().filter(|r| r.refused.is_none()) {
                        if passes == Passes::default() || fits {
                            assert!(
                                min.loads <= r.loads,
                                "case {case} slots {slots} {passes:?}: MIN {} > {} {}",
                                min.loads,
                                r.policy,
                                r.loads
                            );
                            assert!(min.bytes_moved <= r.bytes_moved);
                        }
                        assert_eq!(r.requests, min.requests, "case {case}: {} served other requests", r.policy);
                        assert_eq!(r.hits + r.loads - r.prefetch_loads, r.requests, "{}", r.policy);
                    }
                }
            }
        }
    }

    #[test]
    fn lru_with_every_slot_retained_loads_each_object_once() {
        let events = random_events(&mut Rng(7), 2, 8, 2, 30);
        let distinct: BTreeSet<(u32, i32)> = events.iter().flat_map(|e| e.ids.iter().map(move |&i| (e.layer, i))).collect();
        let rows = simulate(|s, pins| manifest(2, 8, 2, s, pins), &[8], &["lru:S".into()], &events, |_| Passes::default()).unwrap();
        assert_eq!(rows[0].loads, distinct.len() as u64);
        assert_eq!(rows[1].loads, distinct.len() as u64, "MIN with room for everything");
        assert_eq!(rows[0].bytes_moved, distinct.len() as u64 * 3000);
    }

    #[test]
    fn lru_above_the_slots_is_a_refused_row() {
        let events = random_events(&mut Rng(9), 2, 8, 2, 3);
        let rows = simulate(|s, pins| manifest(2, 8, 2, s, pins), &[2], &["lru:4".into()], &events, |_| Passes::default()).unwrap();
        assert!(rows[0].refused.as_deref().unwrap().contains("lru:4 exceeds the 2 slots"), "{:?}", rows[0]);
        assert_eq!(rows[1].policy, "MIN");
    }

    fn encode(events: &[(u32, u32, u32, u32, Vec<i32>)]) -> Vec<u8> {
        events
            .iter()
            .flat_map(|(u, r, p, l, ids)| {
                [*u, *r, *p, *l].into_iter().flat_map(u32::to_le_bytes).chain(ids.iter().flat_map(|x| x.to_le_bytes())).collect::<Vec<u8>>()
            })
            .collect()
    }

    #[test]
    fn drafted_traversals_merge_consecutive_decode_positions_layer_by_layer() {
        let ev = |ubatch, layer, ids: &[i32]| LayerEvent { ubatch, layer, ids: ids.to_vec() };
        let events = vec![
            ev(0, 1, &[1, 2, 3, 4]),
            ev(0, 2, &[5, 6, 7, 8]),
            ev(1, 1, &[9, 2]),
            ev(1, 2, &[3, 3]),
            ev(2, 1, &[4, 5]),
            ev(2, 2, &[6, 7]),
            ev(3, 1, &[8, 9]),
            ev(3, 2, &[1, 1]),
        ];
        // K = 0 leaves the events as they are.
        assert_eq!(drafted(&events, 1, 0), events);
        // K = 1: positions (1, 2) and (3) make two traversals; the prompt's ubatch stays.
        assert_eq!(
            drafted(&events, 1, 1),
            vec![
                ev(0, 1, &[1, 2, 3, 4]),
                ev(0, 2, &[5, 6, 7, 8]),
                ev(1, 1, &[9, 2, 4, 5]),
                ev(1, 2, &[3, 3, 6, 7]),
                ev(2, 1, &[8, 9]),
                ev(2, 2, &[1, 1])
            ]
        );
        // Every selection is kept, only regrouped.
        let all: usize = events.iter().map(|e| e.ids.len()).sum();
        assert_eq!(drafted(&events, 1, 5).iter().map(|e| e.ids.len()).sum::<usize>(), all);
    }

    #[test]
    fn routes_parse_into_layer_events_and_refuse_disorder() {
        let b = encode(&[(0, 0, 0, 1, vec![3, 4]), (0, 1, 1, 1, vec![4, 5]), (0, 0, 0, 2, vec![0, 1]), (1, 0, 2, 1, vec![7, 3])]);
        let ev = parse_routes(&b, 2).unwrap();
        assert_eq!(
            ev,
            vec![
                LayerEvent { ubatch: 0, layer: 1, ids: vec![3, 4, 4, 5] },
                LayerEvent { ubatch: 0, layer: 2, ids: vec![0, 1] },
                LayerEvent { ubatch: 1, layer: 1, ids: vec![7, 3] },
            ]
        );
        assert!(parse_routes(&b[..b.len() - 1], 2).unwrap_err().to_string().contains("whole number"));
        assert!(parse_routes(&b, 0).is_err());
        let back = encode(&[(0, 0, 0, 2, vec![1]), (0, 0, 0, 1, vec![1])]);
        assert!(parse_routes(&back, 1).unwrap_err().to_string().contains("out of order"));
        let skip = encode(&[(0, 0, 0, 2, vec![1]), (0, 2, 2, 2, vec![1])]);
        assert!(parse_routes(&skip, 1).unwrap_err().to_string().contains("expected row 1"));
    }

    #[test]
    fn lru_s_is_the_slot_count() {
        assert_eq!(policy_at("lru:S+prefetch", 12).unwrap().to_string(), "lru:12+prefetch");
        assert_eq!(policy_at("zero", 12).unwrap().to_string(), "zero");
        assert!(policy_at("lru:T", 12).is_err());
    }

    #[test]
    fn passes_follow_the_engine() {
        assert_eq!(n_passes(4, 16, 5), 1);
        assert_eq!(n_passes(40, 16, 5), 4);
        assert_eq!(n_passes(1, 16, 5), 1);
        assert_eq!(n_passes(0, 16, 5), 1);
    }
}
