//! The read path: bundles submitted into Free windows (or straight into host slots), completions validated against their tickets, verified, and published through the copy into the slot.

use super::*;

impl Plan {
    /// Reads, validates, copies and publishes the bundles of `jobs` (slots already Loading).
    pub(super) fn load(&mut self, li: usize, jobs: &[Load]) -> Result<(), PlanError> {
        let mut pending: VecDeque<_> = jobs.iter().copied().collect();
        let mut inflight: HashMap<u32, Bundle> = HashMap::new();
        self.read_until(li, &mut pending, &mut inflight, |_, pending, inflight| Ok(pending.is_empty() && inflight.is_empty()))?;
        self.finish_copies_into(li, jobs)
    }

    /// Submits, waits for, validates and publishes bundles of `pending` until `done`.
    pub(super) fn read_until(
        &mut self,
        li: usize,
        pending: &mut VecDeque<Load>,
        inflight: &mut HashMap<u32, Bundle>,
        done: impl Fn(&Plan, &VecDeque<Load>, &HashMap<u32, Bundle>) -> Result<bool, PlanError>,
    ) -> Result<(), PlanError> {
        loop {
            if done(self, pending, inflight)? {
                return Ok(());
            }
            self.submit_pending(li, pending, inflight)?;
            if inflight.is_empty() {
                return Err(PlanError::OutstandingWork { detail: "no window is Free".into() });
            }
            // With it, every completion already back: they are hashed together. Where copies are
            // asynchronous, those beyond what the pass needs are left to `harvest` after it.
            let mut batch = vec![self.wait_source()?];
            while !self.copies.asynchronous() && self.io.poll_ready() {
                match self.wait_source() {
                    Ok(c) => batch.push(c),
                    Err(e) => return Err(self.retire(&batch, e.into())),
                }
            }
            // The wait freed room in the source: refill it before these completions are hashed,
            // so the device reads the next bundles while the CPU verifies the last ones.
            if let Err(e) = self.submit_pending(li, pending, inflight) {
                return Err(self.retire(&batch, e));
            }
            self.accept_all(li, &batch, inflight)?;
        }
    }

    /// Every pending bundle that has a Free window and room in the source's depth goes out at
    /// once, so the source sees them together (and can coalesce neighbours in the file); the
    /// rest follow as completions free room, so that validating what arrived is never held up
    /// behind a submission waiting for room.
    pub(super) fn submit_pending(
        &mut self,
        li: usize,
        pending: &mut VecDeque<Load>,
        inflight: &mut HashMap<u32, Bundle>,
    ) -> Result<(), PlanError> {
        // Every window holds a copy in flight: the oldest one is finished to free its window.
        let free =
            |p: &Plan| p.io.windows().iter().enumerate().any(|(w, s)| *s == WindowState::Free && !inflight.contains_key(&(w as u32)));
        while !pending.is_empty() && !self.copies.is_empty() && !free(self) {
            let c = self.copies.take_oldest(|_| true).expect("non-empty");
            self.finish_copy(c)?;
        }
        let mut jobs = Vec::new();
        let mut room = self.io.source().room();
        for (w, state) in self.io.windows().iter().enumerate() {
            if *state != WindowState::Free || inflight.contains_key(&(w as u32)) {
                continue;
            }
            let Some(&load) = pending.front() else { break };
            let n = self.manifest.object(load.object).map_or(1, |o| o.extents.len());
            if n > room && !(jobs.is_empty() && inflight.is_empty()) {
                break;
            }
            room = room.saturating_sub(n);
            pending.pop_front();
            jobs.push(Job { window: w as u32, load });
        }
        self.submit_bundles(li, &jobs, inflight)
    }

    /// Starts the reads of every bundle of `jobs` (windows Free, slots Loading) and adds the
    /// bundles to `inflight`. All extent reads go to the source in one call, in file order, so
    /// that neighbours in the file can become one read; an aligned extent whose slot is host
    /// memory is read straight into the slot. Either way each extent keeps its own ticket.
    pub(super) fn submit_bundles(&mut self, li: usize, jobs: &[Job], inflight: &mut HashMap<u32, Bundle>) -> Result<(), PlanError> {
        if jobs.is_empty() {
            return Ok(());
        }
        self.advise_engine_pools();
        let mut reads = Vec::new();
        for &Job { window: w, load: Load { object, slot, v: version } } in jobs {
            self.io.step(w, WindowTransition::BeginRead)?;
            let extents = self.manifest.object(object).expect("manifest object").extents.clone();
            let mut direct = Vec::with_capacity(extents.len());
            for (i, e) in extents.iter().enumerate() {
                let id = self.io.ticket(object, i as u32, slot, version, w).id;
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
        let submitted = unsafe { self.io.submit(&reads) };
        self.obs.tel.read_ns += started.elapsed().as_nanos() as u64;
        let mv = self.obs.tel.movement.get_or_insert_with(Default::default);
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
            self.obs.tel.q_run.reads += 1;
            self.obs.tel.q_run.logical_bytes += e.extent.len;
            self.obs.tel.q_run.physical_bytes += e.covering.len;
            self.obs.tel.q_run.padding_bytes += e.padding();
            self.obs.tl.submitted(at, r.ticket, r.object, r.extent, e.extent.len, r.window);
            at = Instant::now();
            if into.is_some() {
                mv.direct_extents += 1;
            }
        }
        if let Err((_, e)) = submitted {
            return Err(e.into());
        }
        Ok(())
    }

    /// The next completion; the time spent waiting for it is read time.
    pub(super) fn wait_source(&mut self) -> Result<Completion, SourceError> {
        let started = Instant::now();
        let c = self.io.wait();
        self.obs.tel.read_ns += started.elapsed().as_nanos() as u64;
        if let Ok(c) = &c {
            let (in_flight, held) = self.io.in_flight();
            self.obs.tl.completed(started, c, in_flight, held);
        }
        c
    }

    pub(super) fn reject(&mut self, kind: RejectKind, ticket: u64, detail: String) -> PlanError {
        *self.obs.tel.rejections.entry(kind).or_default() += 1;
        PlanError::Rejected { kind, ticket, detail }
    }

    /// Validates one completion; publishes its bundle when it was the last extent.
    pub(super) fn accept(&mut self, li: usize, c: Completion, inflight: &mut HashMap<u32, Bundle>) -> Result<(), PlanError> {
        self.accept_all(li, &[c], inflight)
    }

    /// Validates completions that came back together: each one's tags first, then their
    /// extents hashed at once (across the cores the engine leaves), then each verified and its
    /// bundle published in turn. A rejection fails the batch before anything after it is used.
    pub(super) fn accept_all(&mut self, li: usize, batch: &[Completion], inflight: &mut HashMap<u32, Bundle>) -> Result<(), PlanError> {
        let mut checked = Vec::with_capacity(batch.len());
        for (i, &c) in batch.iter().enumerate() {
            match self.check(li, c, inflight) {
                Ok(t) => checked.push(t),
                Err(e) => return Err(self.retire(&batch[i + 1..], e)),
            }
        }
        let hashed = self.hash_landed(li, &checked);
        for (i, (t, _)) in checked.into_iter().enumerate() {
            if let Some(h) = &hashed {
                self.verify_extent(&t, h[i])?;
            }
            let b = inflight.get_mut(&t.window).expect("checked");
            b.received[t.extent as usize] = true;
            b.remaining -= 1;
            if b.remaining == 0 {
                let b = inflight.remove(&t.window).expect("present");
                debug_assert!(b.received.iter().all(|&r| r));
                self.publish(li, t.window, b)?;
            }
        }
        Ok(())
    }

    /// Completions taken from the source that an error leaves unexamined: their tickets are
    /// taken back and they are counted drained, as the failed Plan's shutdown drains the rest;
    /// none becomes visible. Returns `e`.
    fn retire(&mut self, batch: &[Completion], e: PlanError) -> PlanError {
        for c in batch {
            self.io.take(c.ticket);
            self.obs.tel.drained_completions += 1;
        }
        e
    }

    /// One completion's tags against its ticket, its slot and its bundle, and its byte count:
    /// the ticket taken back, and whether the extent was read straight into its slot.
    fn check(&mut self, li: usize, c: Completion, inflight: &mut HashMap<u32, Bundle>) -> Result<(Ticket, bool), PlanError> {
        let Some(t) = self.io.take(c.ticket) else {
            return Err(self.reject(RejectKind::UnknownTicket, c.ticket, format!("{c:?}")));
        };
        if c.object != t.object {
            return Err(self.reject(RejectKind::WrongObject, t.id, format!("completion names {}, ticket {}", c.object, t.object)));
        }
        if c.extent != t.extent {
            return Err(self.reject(RejectKind::WrongExtent, t.id, format!("extent {} for {}", c.extent, t.extent)));
        }
        if c.window != t.window {
            return Err(self.reject(RejectKind::WrongWindow, t.id, format!("window {} for {}", c.window, t.window)));
        }
        let epoch = self.slots.epoch();
        if c.epoch != t.epoch || t.epoch != epoch {
            return Err(self.reject(
                RejectKind::StaleEpoch,
                t.id,
                format!("completion epoch {}, ticket epoch {}, current {epoch}", c.epoch, t.epoch),
            ));
        }
        let cell = self.slots.cell(li, t.slot)?;
        let bundle = inflight.get_mut(&t.window).filter(|b| b.object == t.object && b.slot == t.slot);
        if c.generation != t.generation || cell.generation != t.generation || cell.state != SlotState::Loading || bundle.is_none() {
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
        Ok((t, bundle.expect("checked").direct[t.extent as usize]))
    }

    /// HostReady → Copying: the copies into the slot start. Synchronous ones have completed on
    /// return and the slot is published now (Copying → Free, DeviceReady); asynchronous ones
    /// stay in flight on the device's copy stream, the window Copying and the slot Loading,
    /// until [`Plan::finish_copy`] has seen every copy's event complete.
    pub(super) fn publish(&mut self, li: usize, w: u32, b: Bundle) -> Result<(), PlanError> {
        self.io.step(w, WindowTransition::Assembled)?;
        self.io.step(w, WindowTransition::BeginCopy)?;
        let op = self.manifest.object(b.object).expect("manifest object");
        let window = self.io.source().window(w);
        let started = Instant::now();
        let (mut direct_bytes, mut copied) = (0, 0);
        let mut ids = Vec::new();
        let pools = self.pools.of_buffer(self.manifest.buffer_of(li));
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
                    let id = unsafe { writer.begin(b.slot, src) }.map_err(PlanError::Copy)?;
                    ids.push(CopyId { pool: pi, id });
                }
                PoolMem::Engine(Some(writer)) => {
                    writer.write(b.slot, src).map_err(PlanError::Copy)?;
                }
                PoolMem::Engine(None) => {
                    return Err(PlanError::Copy(CopyError { detail: format!("the engine never bound the {} pool", pool.role) }))
                }
            }
        }
        self.obs.tel.copy_ns += started.elapsed().as_nanos() as u64;
        let mv = self.obs.tel.movement.get_or_insert_with(Default::default);
        mv.direct_bytes += direct_bytes;
        mv.window_bytes += copied;
        let c = InFlightCopy { li, window: w, object: op.id, slot: b.slot, version: b.version, ids, issued: started, copied };
        if c.ids.is_empty() {
            self.obs.tl.copied(started, c.object, c.slot, copied);
            return self.finish_copy(c);
        }
        self.obs.tel.async_copies += c.ids.len() as u64;
        self.obs.tl.copy_queued(started, c.object, c.slot, w, copied);
        self.copies.push(c);
        Ok(())
    }

    /// Waits for each copy event of `c` (that event alone, not the whole device), then Copying
    /// → Free for its window and Loading → DeviceReady for its slot.
    pub(super) fn finish_copy(&mut self, c: InFlightCopy) -> Result<(), PlanError> {
        if !c.ids.is_empty() {
            let started = Instant::now();
            let mut first = None;
            for &CopyId { pool, id } in &c.ids {
                let Some(w) = self.pools.writer(PoolIx { buffer: self.manifest.buffer_of(c.li), pool }) else {
                    unreachable!("only engine pools copy asynchronously")
                };
                // Every id is waited for, even after a failure: the device may still read the window.
                if let Err(e) = w.wait(id) {
                    first.get_or_insert(PlanError::Copy(e));
                }
            }
            let waited = started.elapsed().as_nanos() as u64;
            self.obs.tel.copy_ns += waited;
            self.obs.tel.copy_wait_ns += waited;
            self.obs.tel.copy_in_flight_ns += c.issued.elapsed().as_nanos() as u64;
            self.obs.tl.copy_done(started, c.object, c.slot, c.window);
            if let Some(e) = first {
                return Err(e);
            }
        }
        self.io.step(c.window, WindowTransition::CopyDone)?;
        self.slots.publish(c.li, c.slot, c.version)?;
        self.obs.tl.published(c.object, c.slot);
        self.obs.tel.loads += 1;
        self.obs.tel.bytes_copied += c.copied;
        self.obs.sched.insert(c.object);
        Ok(())
    }

    /// Finishes the copies in flight that `which` selects, oldest first.
    pub(super) fn finish_copies(&mut self, which: impl Fn(&InFlightCopy) -> bool) -> Result<(), PlanError> {
        // One at a time: a copy that fails leaves the rest queued, for `wait_copies`.
        while let Some(c) = self.copies.take_oldest(&which) {
            self.finish_copy(c)?;
        }
        Ok(())
    }

    /// Finishes the copies in flight into `slots` of layer index `li`.
    pub(super) fn finish_copies_into(&mut self, li: usize, slots: &[Load]) -> Result<(), PlanError> {
        self.finish_copies(|c| c.li == li && slots.iter().any(|l| l.slot == c.slot && l.v == c.version))
    }

    /// Whether slot `slot` of layer index `li` is Loading only because its copy is in flight.
    pub(super) fn copy_in_flight(&self, li: usize, slot: u32) -> bool {
        self.copies.copying_into(li, slot)
    }

    /// Waits for every copy still in flight without publishing its slot (a failed Plan): the
    /// device may still read those windows, so none is discarded before its event completed.
    pub(super) fn wait_copies(&mut self) {
        for c in self.copies.take_all() {
            for &CopyId { pool, id } in &c.ids {
                if let Some(w) = self.pools.writer(PoolIx { buffer: self.manifest.buffer_of(c.li), pool }) {
                    let _ = w.wait(id);
                }
            }
            self.obs.tel.copies_abandoned += 1;
        }
    }

    /// Takes every queued completion out of the source; none becomes visible.
    pub(super) fn drain(&mut self) -> Result<(), PlanError> {
        while let Some(c) = self.io.drain_one()? {
            let (in_flight, held) = self.io.in_flight();
            self.obs.tl.completed(std::time::Instant::now(), &c, in_flight, held);
            self.obs.tel.drained_completions += 1;
        }
        Ok(())
    }
}
