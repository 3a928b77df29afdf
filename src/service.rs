//! The Plan as the engine's expert source: pools, acquire and release through the patched
//! llama.cpp boundary, with the source chosen at run time (P, D or F). The Plan itself knows
//! nothing of the engine; this room is where the two meet.

use crate::engine::{ExpertSource, SlotPool};
use crate::inventory::Inventory;
use crate::plan::options::per_pass;
use crate::plan::report::{
    CopyReport, FaultReport, ManifestReport, PlanDescription, PlanMode, PlanReport, PrefillReport, SourceBound, SourceDescription,
    SourceReport, StepTimes, StepsReport, STEP_FIELDS,
};
use crate::plan::timeline::{self, Timeline};
use crate::plan::{CopyError, Coverage, Manifest, Passes, Plan, PlanOptions, Role, SizedFrom, Sizing, SlotState, SlotWriter, SourceKind};
use crate::source::fault::{FaultCell, FaultySource};
use crate::source::{AlignedBuf, BufferedSource, Source, UringSource};
use anyhow::{anyhow, bail, Result};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// A slot and the generation it held.
type SlotGeneration = (u32, u64);

/// The consumer the held_consumer cell keeps past its release point: its layer and pass, and
/// the slots it held then.
struct HeldConsumer {
    layer: u32,
    pass: u32,
    slots: Vec<SlotGeneration>,
}

pub struct PlanSource {
    plan: Plan,
    options: PlanOptions,
    sizing: Sizing,
    n_slots: u32,
    /// Time the engine spent blocked in acquire: the exposed source wait.
    wait: Duration,
    /// Time inside acquire, and the counters where the first step, the current step and the
    /// latest acquire began or ended; with the finished steps' [read, copy, compute, wait].
    in_calls: Duration,
    marks: Option<Marks>,
    per_step: Vec<StepTimes>,
    /// Per finished step, the bytes read and its tokens; the current step's tokens; the
    /// experts a token selects (to count a step's tokens from its selections).
    step_bytes: Vec<u64>,
    step_tokens: Vec<u64>,
    /// Steps of the prompt, once the run said it was decoded (`ExpertSource::prompted`).
    prompt_steps: Option<usize>,
    tokens: u64,
    n_used: u64,
    /// The backend devices holding the slot pools (where window → slot copies go), and the
    /// bytes of the distinct (buffer, role) pools there.
    devices: BTreeSet<String>,
    /// Of those, the devices whose pools copy asynchronously, and the others.
    asynchronous: BTreeSet<String>,
    synchronous: BTreeSet<String>,
    pools: HashSet<(u32, Role)>,
    pool_bytes: u64,
    acquire_calls: u64,
    uring_registered: Option<bool>,
    /// Where the windows live, as the record says it.
    windows_memory: String,
    /// held_consumer: the deferred release and what was seen of its slots while it was held.
    held: Option<HeldConsumer>,
    /// Evidence of the ownership-level cells, for their validators.
    fault_log: Vec<String>,
    fault_fired: u64,
    /// Selections demanded and served per layer: every one exactly once, or the run fails.
    coverage: Coverage,
    /// Where slots and policy were sized from a budget: every term.
    budget: Option<crate::plan::budget::BudgetSizing>,
}

/// The cached read profile of the device F reads from (the model's largest file's), where F
/// sizes its own depth; none where no profile was measured (the manifest sizes it then).
fn device_depth(model: &Path, inv: &Inventory, o: &PlanOptions) -> Option<crate::plan::DeviceDepth> {
    if o.source != SourceKind::F || o.depth.is_some() {
        return None;
    }
    let file = inv.shards.iter().max_by_key(|s| s.bytes).map_or(model, |s| s.path.as_path());
    if !crate::envelope::profile::profiled(file) {
        return None;
    }
    use crate::envelope::profile;
    let p = profile::cached(file, profile::block_of(inv), profile::shape_of(inv))?;
    let rate = |d: u32| p.mib_per_s.iter().find(|&&(x, _)| x == d).map_or(0.0, |&(_, r)| r);
    let best = p.mib_per_s.iter().map(|&(_, r)| r).fold(0.0, f64::max);
    Some(crate::plan::DeviceDepth {
        device: p.device.label(),
        block_bytes: p.block_bytes,
        burst_reads: Some(p.shape.burst),
        vector_blocks: Some(p.shape.vector),
        depth: p.depth,
        mib_per_s: rate(p.depth).round() as u64,
        best_mib_per_s: best.round() as u64,
        measured_unix_s: p.measured_unix_s,
    })
}

impl PlanSource {
    pub fn new(model: &Path, inv: &Inventory, options: PlanOptions) -> Result<PlanSource> {
        let policy = options.policy.clone();
        let manifest = Manifest::new(inv, options.slots, &policy.pinned)?.with_layer_buffers(options.layer_buffers)?;
        let n_slots = manifest.layers.first().map(|l| l.n_slots).ok_or_else(|| anyhow!("no MoE layer"))?;
        if manifest.layers.iter().any(|l| l.n_slots != n_slots) {
            bail!("layers with different expert counts need per-layer slot counts, which the engine does not take");
        }
        let w = manifest.window_size;
        let sizing = Sizing::of(&manifest, &options, inv.n_used());
        let sizing = match device_depth(model, inv, &options) {
            Some(d) => sizing.with_device(&options, d),
            None => sizing,
        };
        let (mut alloc, windows_memory) = window_memory();
        // The model's files, one per shard; a one-file inventory made without them reads `model`.
        let files = if inv.shards.is_empty() { vec![model] } else { inv.paths() };
        let (source, registered): (Box<dyn Source>, Option<bool>) = match options.source {
            SourceKind::P => (Box::new(BufferedSource::open_with(&files, sizing.windows, w, &mut *alloc)?), None),
            SourceKind::D => (Box::new(BufferedSource::open_direct_with(&files, w, &mut *alloc)?), None),
            SourceKind::F => {
                let s = UringSource::open_with(&files, sizing.windows, w, sizing.depth, &mut *alloc)?;
                let r = s.registered();
                (Box::new(s), Some(r))
            }
        };
        let source = FaultySource::wrap(source, options.fault);
        let coverage = Coverage::new(manifest.layers.iter().map(|l| l.layer));
        let timeline = new_timeline(&manifest, n_slots, options.timeline_token);
        let mut plan = Plan::for_engine(manifest, &policy, source).map_err(|e| anyhow!("{e}"))?;
        plan.set_timeline(timeline);
        let n_per_pass = per_pass(plan.manifest(), n_slots);
        if let Some(g) = sizing.token_pass {
            if g == 0 || g > n_per_pass {
                bail!("token pass of {g} experts: expected 1..={n_per_pass} (the unpinned slots of a layer)");
            }
            if options.fault != FaultCell::None {
                bail!("token passes are not combined with fault cells (cell {:?})", options.fault);
            }
        }
        if let Some(g) = sizing.prompt_pass {
            if g > n_per_pass {
                bail!("prompt pass of {g} experts: expected 1..={n_per_pass} (the unpinned slots of a layer; 0: one group at a time)");
            }
            if options.fault != FaultCell::None {
                bail!("prompt passes are not combined with fault cells (cell {:?})", options.fault);
            }
            if let Some(t) = sizing.token_pass.filter(|&t| t > g) {
                bail!("token pass of {t} experts exceeds the prompt pass of {g}: a one-token pass is never the larger");
            }
        }
        if sizing.token_pass.is_some() || sizing.prompt_pass.is_some() {
            inv.expert_used_count.ok_or_else(|| anyhow!("the model names no expert_used_count, which streamed passes need"))?;
            plan.stream_passes(Passes { token: sizing.token_pass, prompt: sizing.prompt_pass });
        }
        // Every extent read is verified against the model's digest manifest.
        let digests = crate::digests::obtain(model, inv, None)?.digests;
        plan.expect_digests(&digests, options.verify.unwrap_or_default()).map_err(|e| anyhow!("{e}"))?;
        Ok(PlanSource {
            coverage,
            budget: None,
            plan,
            options,
            sizing,
            n_slots,
            wait: Duration::ZERO,
            in_calls: Duration::ZERO,
            marks: None,
            per_step: Vec::new(),
            step_bytes: Vec::new(),
            step_tokens: Vec::new(),
            prompt_steps: None,
            tokens: 0,
            n_used: u64::from(inv.n_used().unwrap_or(1).max(1)),
            devices: BTreeSet::new(),
            asynchronous: BTreeSet::new(),
            synchronous: BTreeSet::new(),
            pools: HashSet::new(),
            pool_bytes: 0,
            acquire_calls: 0,
            uring_registered: registered,
            windows_memory,
            held: None,
            fault_log: Vec::new(),
            fault_fired: 0,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The run will decode `n` tokens after its prompt (the timeline keeps the middle one's
    /// events unless told which).
    pub fn expecting(mut self, n: u32) -> PlanSource {
        self.plan.timeline().expect(n);
        self
    }

    /// Tells the Plan how many CPU threads the engine decodes with (see
    /// [`crate::plan::Plan::engine_threads`]).
    pub fn engine_threads(mut self, n: usize) -> PlanSource {
        self.plan.engine_threads(n);
        self
    }

    /// Notes that its slots and policy were sized from a budget, for the record.
    pub fn sized_by(mut self, budget: Option<crate::plan::budget::BudgetSizing>) -> PlanSource {
        self.sizing.slots_from = budget.is_some().then_some(SizedFrom::Budget);
        self.budget = budget;
        self
    }

    fn mark(&self, at: Instant) -> Mark {
        let crate::plan::IoTime { read_ns, copy_ns } = self.plan.io_time();
        let read_bytes = self.plan.read_bytes();
        Mark { at, read_ns, copy_ns, read_bytes, wait: self.wait, in_calls: self.in_calls }
    }

    /// Starts a step at the first MoE layer's first pass: one ubatch (of `n_ids` selections)
    /// through the model.
    fn step(&mut self, layer: u32, pass: u32, n_ids: usize, t: Instant) {
        if pass != 0 || self.plan.manifest().layers.first().map(|l| l.layer) != Some(layer) {
            return;
        }
        let now = self.mark(t);
        match &mut self.marks {
            None => self.marks = Some(Marks { first: now, step: now, last: now }),
            Some(m) => {
                self.per_step.push(m.step.until(&now));
                self.step_bytes.push(now.read_bytes - m.step.read_bytes);
                self.step_tokens.push(self.tokens);
                m.step = now;
            }
        }
        // The first MoE layer's selections per token, where the model gives one per layer.
        let n_used = self.plan.manifest().layers.first().map_or(0, |l| u64::from(l.n_used));
        self.tokens = (n_ids as u64).div_ceil(if n_used > 0 { n_used } else { self.n_used });
    }

    /// Counts the time of an acquire that started at `t`.
    fn call_done(&mut self, t: Instant) {
        self.in_calls += t.elapsed();
        let now = self.mark(Instant::now());
        if let Some(m) = &mut self.marks {
            m.last = now;
        }
    }
}

/// Where the first step, the current step and the latest acquire began or ended.
#[derive(Clone, Copy)]
struct Marks {
    first: Mark,
    step: Mark,
    last: Mark,
}

/// Cumulative counters at one instant, to cut the run into steps.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    read_ns: u64,
    copy_ns: u64,
    /// Logical bytes read so far.
    read_bytes: u64,
    wait: Duration,
    in_calls: Duration,
}

impl Mark {
    /// [read, copy, compute, exposed wait] in seconds from `self` to `end`; compute is engine
    /// time outside acquire, read and copy happen inside it.
    fn until(&self, end: &Mark) -> StepTimes {
        let compute = (end.at - self.at).saturating_sub(end.in_calls - self.in_calls);
        StepTimes {
            read_s: (end.read_ns - self.read_ns) as f64 * 1e-9,
            copy_s: (end.copy_ns - self.copy_ns) as f64 * 1e-9,
            compute_s: compute.as_secs_f64(),
            exposed_wait_s: (end.wait - self.wait).as_secs_f64(),
        }
    }
}

/// A timeline of the manifest's layers, with room for one token's events.
fn new_timeline(manifest: &Manifest, n_slots: u32, token: Option<u32>) -> Timeline {
    let n_roles = manifest.layers.iter().map(|l| l.roles.len()).max().unwrap_or(0);
    let capacity = Timeline::capacity_for(manifest.layers.len(), n_slots, n_roles);
    Timeline::new(token, manifest.layers.iter().map(|l| l.layer).collect(), capacity)
}

/// How the source's windows are allocated, and how the record says it: from the offload
/// device's host buffer type (pinned: its copies are DMA the host need not stage) when layers
/// are offloaded and the device offers one, else aligned mappings.
fn window_memory() -> (Box<dyn FnMut(u64) -> Result<AlignedBuf>>, String) {
    let aligned = |why: String| -> (Box<dyn FnMut(u64) -> Result<AlignedBuf>>, String) {
        (Box::new(AlignedBuf::new), format!("aligned mapping ({why})"))
    };
    let p = crate::engine::placement();
    if p.gpu_layers == 0 {
        return aligned("every layer on the CPU".into());
    }
    match crate::engine::backends::offload_host_buffer_type() {
        Err(why) => aligned(why.to_string()),
        Ok((buft, name)) => (
            Box::new(move |len| {
                let (ptr, owner) = crate::engine::backends::pinned_host(buft, len as usize).map_err(|e| anyhow!(e))?;
                // SAFETY: `pinned_host` gives `len` bytes at `ptr` that `owner` keeps until it drops.
                unsafe { AlignedBuf::foreign(ptr, len as usize, Box::new(owner)) }
            }),
            format!("pinned ({name})"),
        ),
    }
}

impl SlotWriter for SlotPool {
    fn write(&self, slot: u32, src: &[u8]) -> Result<(), CopyError> {
        SlotPool::write(self, slot, src).map_err(copy_error)
    }

    fn host(&self, slot: u32) -> Option<std::ptr::NonNull<u8>> {
        SlotPool::host(self, slot)
    }

    fn asynchronous(&self) -> bool {
        SlotPool::asynchronous(self)
    }

    unsafe fn begin(&self, slot: u32, src: &[u8]) -> Result<u64, CopyError> {
        // SAFETY: the caller's contract is the pool's.
        unsafe { SlotPool::begin(self, slot, src) }.map_err(copy_error)
    }

    fn wait(&self, id: u64) -> Result<(), CopyError> {
        SlotPool::wait(self, id).map_err(copy_error)
    }
}

fn copy_error(e: anyhow::Error) -> CopyError {
    CopyError { detail: format!("{e:#}") }
}

impl PlanSource {
    /// (slot, generation) of every InUse slot of `layer`.
    fn in_use(&self, layer: u32) -> Vec<SlotGeneration> {
        self.plan
            .slots(layer)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == SlotState::InUse)
            .map(|(i, c)| (i as u32, c.generation))
            .collect()
    }

    /// Ownership-level fault cells act between events.
    fn before_acquire(&mut self, layer: u32) -> Result<()> {
        if let Some(HeldConsumer { layer: held_layer, pass, slots }) = self.held.take() {
            if held_layer != layer {
                // Another layer ran while the consumer was held: its slots must not have moved.
                let now = self.in_use(held_layer);
                if slots.iter().any(|s| !now.contains(s)) {
                    bail!("a held slot was reused before its consumer finished: {slots:?} -> {now:?}");
                }
                self.fault_log.push(format!(
                    "held the consumer of layer {held_layer} pass {pass} ({} slots) while layer {layer} acquired: \
                     no held slot reused; released",
                    slots.len()
                ));
                self.plan.release(held_layer, pass)?;
                self.fault_fired += 1;
            } else {
                // The same layer needs its slots again at once (another pass): release and hold
                // a later consumer instead.
                self.plan.release(held_layer, pass)?;
            }
        }
        if self.options.fault == FaultCell::ResetOutstanding && self.plan.closure().source_outstanding > 0 {
            let before = self.plan.closure().drained_completions;
            self.plan.reset().map_err(|e| anyhow!("{e}"))?;
            let drained = self.plan.closure().drained_completions - before;
            self.fault_log.push(format!("reset with {drained} outstanding completion(s): drained, epoch {}", self.plan.epoch()));
            self.fault_fired += 1;
        }
        Ok(())
    }
}

fn role_of(name: &str) -> Result<Role> {
    let role = name
        .split('.')
        .nth(2)
        .and_then(|r| r.strip_prefix("ffn_"))
        .and_then(|r| r.strip_suffix("_exps"))
        .ok_or_else(|| anyhow!("`{name}` is not an expert weight"))?;
    role.parse()
}

impl ExpertSource for PlanSource {
    fn n_slots(&self) -> u32 {
        self.n_slots
    }

    /// Pinned slots serve their experts in every pass, so a pass groups only the unpinned
    /// capacity; the layer with the least of it sets the engine's pass count.
    fn n_per_pass(&self) -> u32 {
        self.sizing.prompt_pass.unwrap_or_else(|| per_pass(self.plan.manifest(), self.n_slots))
    }

    fn n_per_token_pass(&self) -> u32 {
        self.sizing.token_pass.unwrap_or_else(|| self.n_per_pass())
    }

    fn pool(&mut self, layer: u32, name: &str, slot_bytes: usize, n_slots: u32, pool: SlotPool) -> Result<u32> {
        let (role, bytes) = (role_of(name)?, pool.bytes());
        self.devices.insert(pool.device().to_string());
        let lane = if pool.asynchronous() { &mut self.asynchronous } else { &mut self.synchronous };
        lane.insert(pool.device().to_string());
        let buffer = self.plan.bind(layer, role, slot_bytes as u64, n_slots, Box::new(pool))?;
        if self.pools.insert((buffer, role)) {
            self.pool_bytes += bytes;
        }
        Ok(buffer)
    }

    fn slot_head(&mut self, layer: u32, name: &str, slot_bytes: usize) -> Option<u64> {
        self.plan.slot_head(layer, role_of(name).ok()?, slot_bytes as u64)
    }

    fn acquire(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<()> {
        self.plan.timeline().acquire_enter(layer, pass);
        let r = self.acquire_event(layer, pass, ids, slots);
        self.plan.timeline().acquire_return(layer, pass);
        r
    }

    fn release(&mut self, layer: u32, pass: u32) -> Result<()> {
        self.plan.timeline().release(layer, pass);
        let r = self.release_event(layer, pass);
        self.plan.timeline().resume_compute();
        r
    }

    fn decoding(&mut self, n_tokens: usize) {
        let reads = self.plan.reads();
        self.plan.timeline().begin(n_tokens, reads);
    }

    fn prompted(&mut self) {
        // The step still open (its next layer-0 pass has not begun) is the prompt's last.
        self.prompt_steps = Some(self.per_step.len() + usize::from(self.marks.is_some()));
    }

    fn decoded(&mut self, ok: bool) -> Result<()> {
        let reads = self.plan.reads();
        self.plan.timeline().end(reads);
        self.decode_closed(ok)
    }

    fn end_request(&mut self) -> Result<SourceReport> {
        Ok(SourceReport::Plan(Box::new(PlanSource::end_request(self)?)))
    }

    fn between(&mut self, between: crate::session::Between, outputs: u32) -> Result<()> {
        if between == crate::session::Between::Separate {
            anyhow::bail!("separate requests are served by processes of their own, not by one source");
        }
        self.request_over()?;
        match between {
            crate::session::Between::Reset => self.plan.reset()?,
            crate::session::Between::Cold | crate::session::Between::Separate => {
                let policy = self.options.policy.build(self.plan.manifest())?;
                self.plan.reset_cold(policy)?
            }
        }
        self.plan.timeline().expect(outputs);
        Ok(())
    }

    fn describe(&self) -> SourceDescription {
        SourceDescription::Plan(self.description())
    }

    fn finish(&mut self) -> Result<SourceReport> {
        Ok(SourceReport::Plan(Box::new(self.report()?)))
    }

    fn bytes_read(&self) -> Option<u64> {
        Some(self.plan.telemetry().q_run.physical_bytes)
    }

    fn surfaces(&mut self) -> Vec<crate::engine::SourceSurface> {
        let file = self.plan.timeline().file();
        file.and_then(|f| serde_json::to_vec(&f).ok())
            .map(|bytes| {
                vec![crate::engine::SourceSurface { name: timeline::SURFACE.to_string(), file: timeline::SURFACE_FILE.to_string(), bytes }]
            })
            .unwrap_or_default()
    }
}

impl PlanSource {
    fn acquire_event(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<()> {
        self.coverage.begin(layer, pass, ids).map_err(anyhow::Error::from)?;
        let t = Instant::now();
        self.step(layer, pass, ids.len(), t);
        let r = self.before_acquire(layer).and_then(|()| Ok(self.plan.acquire(layer, pass, ids, slots)?));
        self.wait += t.elapsed();
        self.acquire_calls += 1;
        self.call_done(t);
        r?;
        self.coverage.served(layer, pass, slots).map_err(anyhow::Error::from)?;
        Ok(())
    }

    fn release_event(&mut self, layer: u32, pass: u32) -> Result<()> {
        // The graph sizes its passes for the worst case; a pass past the last group took no
        // consumer, so the Plan holds no event for it.
        if self.plan.holds_event(layer, pass) && self.held.as_ref().is_none_or(|h| (h.layer, h.pass) != (layer, pass)) {
            if self.options.fault == FaultCell::HeldConsumer && self.fault_fired == 0 {
                // The consumer of this first event keeps its slots past its release point.
                self.held = Some(HeldConsumer { layer, pass, slots: self.in_use(layer) });
                return Ok(());
            }
            self.plan.release(layer, pass)?;
        }
        Ok(())
    }

    fn decode_closed(&mut self, ok: bool) -> Result<()> {
        // A decode the engine failed on its own, with the Plan healthy and no fault injected,
        // is checked too: an unserved selection is then its cause.
        if ok || (self.plan.failure().is_none() && self.options.fault == FaultCell::None) {
            self.coverage.close_all().map_err(anyhow::Error::from)
        } else {
            self.coverage.abandon();
            Ok(())
        }
    }
}

impl PlanSource {
    /// What this Plan is, for the record's parameters.
    pub fn description(&self) -> PlanDescription {
        PlanDescription {
            mode: PlanMode::Plan,
            slots: self.n_slots,
            layer_buffers: self.plan.manifest().layer_buffers,
            policy: self.plan.telemetry().policy,
            source: self.options.source,
            windows: self.plan.window_states().len() as u64,
            window_bytes: self.plan.manifest().window_size,
            depth: if self.options.source == SourceKind::F { Some(self.sizing.depth) } else { None },
            sizing: Some(self.sizing.clone()),
            token_pass: self.sizing.token_pass,
            prompt_pass: self.sizing.prompt_pass,
            budget: self.budget.clone(),
        }
    }

    /// Closes the Plan after the run: its telemetry and closure.
    pub fn report(&mut self) -> Result<PlanReport> {
        if let Some(HeldConsumer { layer, pass, .. }) = self.held.take() {
            self.plan.release(layer, pass)?;
        }
        if self.options.fault == FaultCell::ShutdownLiveConsumer && self.plan.failure().is_none() {
            // Shut down while a consumer is live: refused, state unchanged; then release.
            let layer = self.plan.manifest().layers[0].layer;
            let mut slot = [0i32];
            self.plan.acquire(layer, 0, &[0], &mut slot)?;
            match self.plan.shutdown() {
                Ok(_) => bail!("shutdown with a live consumer was accepted"),
                Err(e) => self.fault_log.push(format!("shutdown refused: {e}")),
            }
            self.plan.release(layer, 0)?;
            self.fault_fired += 1;
        }
        // Every decode reports its end, so no event should be open here; one that is must be
        // shown complete now, or the run fails.
        let open = if self.coverage.open_events() > 0 { self.coverage.close_all() } else { Ok(()) };
        let closure = self.plan.shutdown().map_err(|e| anyhow!("{e}"))?;
        open.map_err(|e| anyhow!("{e}"))?;
        Ok(self.report_of(closure))
    }

    /// Ends a request of a session with its report: the Plan settled and its ledger now, the
    /// request's own counters, steps and timeline; then each of those starts again for the next
    /// request. Refused where the request left an event open or a consumer held.
    pub fn end_request(&mut self) -> Result<PlanReport> {
        self.request_over()?;
        self.plan.settle()?;
        let report = self.report_of(self.plan.closure());
        self.plan.observe_anew(new_timeline(self.plan.manifest(), self.n_slots, self.options.timeline_token));
        self.coverage = Coverage::new(self.plan.manifest().layers.iter().map(|l| l.layer));
        (self.wait, self.in_calls, self.marks, self.tokens, self.acquire_calls) = (Duration::ZERO, Duration::ZERO, None, 0, 0);
        self.per_step.clear();
        self.step_bytes.clear();
        self.step_tokens.clear();
        Ok(report)
    }

    /// Refused while the request still holds a consumer or has an event of its last decode open.
    fn request_over(&self) -> Result<()> {
        if let Some(h) = &self.held {
            bail!("layer {} pass {}'s consumer is still held as the request ends", h.layer, h.pass);
        }
        if self.coverage.open_events() > 0 {
            bail!("the request ended with {} events of its last decode outstanding", self.coverage.open_events());
        }
        Ok(())
    }

    /// The report over `closure`: the Plan's telemetry, steps, copies, faults and timeline.
    fn report_of(&mut self, closure: crate::plan::Closure) -> PlanReport {
        let tel = self.plan.telemetry();
        let mut steps = std::mem::take(&mut self.per_step);
        let (mut step_bytes, mut step_tokens) = (std::mem::take(&mut self.step_bytes), std::mem::take(&mut self.step_tokens));
        if let Some(Marks { step, last, .. }) = self.marks {
            steps.push(step.until(&last));
            step_bytes.push(last.read_bytes - step.read_bytes);
            step_tokens.push(self.tokens);
        }
        let prefill = PrefillReport::of(&steps, &step_bytes, &step_tokens, self.prompt_steps.take());
        let m = self.plan.manifest();
        let windows = self.plan.window_states().len() as u64;
        let meta = std::mem::size_of::<Plan>() as u64;
        PlanReport {
            manifest: ManifestReport {
                objects: m.objects.len() as u64,
                managed_bytes: m.managed_bytes,
                window_bytes: m.window_size,
                slots_per_layer: self.n_slots,
                layer_buffers: m.layer_buffers,
                slot_pool_bytes: self.pool_bytes,
            },
            clean_closure: closure.is_clean(),
            selections: self.coverage.report(),
            exposed_source_wait_s: self.wait.as_secs_f64(),
            copy: CopyReport {
                devices: self.devices.clone(),
                bytes: tel.bytes_copied,
                seconds: tel.copy_ns as f64 * 1e-9,
                asynchronous: self.asynchronous.clone(),
                synchronous: self.synchronous.clone(),
                async_copies: tel.async_copies,
                wait_seconds: tel.copy_wait_ns as f64 * 1e-9,
                in_flight_seconds: tel.copy_in_flight_ns as f64 * 1e-9,
            },
            steps: StepsReport {
                fields: STEP_FIELDS.iter().map(|f| f.to_string()).collect(),
                total: self.marks.map(|m| m.first.until(&m.last)),
                per_step: steps,
                read_bytes: step_bytes,
                tokens: step_tokens,
            },
            prefill,
            acquire_calls: self.acquire_calls,
            uring_registered_buffers: self.uring_registered,
            fault: FaultReport {
                cell: self.options.fault,
                expect: self.options.fault.expect(),
                invariant: self.options.fault.invariant().to_string(),
                fired: self.fault_fired + closure.source.faults_fired,
                log: self.fault_log.clone(),
            },
            m_source_bound: SourceBound {
                n_windows: windows,
                window_bytes: m.window_size,
                windows_bytes: windows * m.window_size,
                queue_entries: if self.options.source == SourceKind::F {
                    crate::source::uring::entries(self.sizing.windows, self.sizing.depth)
                } else {
                    1
                },
                plan_struct_bytes: meta,
                windows_memory: Some(self.windows_memory.clone()),
            },
            telemetry: tel,
            closure,
            timeline: self.plan.timeline().report(),
        }
    }
}
