//! Events served in passes while later groups are read: each group is claimed and its reads go out as soon as the layer's capacity holds it beside the groups still in use, and each pass returns once its own group is published.

use super::*;

impl Plan {
    /// Pass 0 of a streamed event: the first groups are claimed (as many as the layer's
    /// unpinned capacity holds), and the call returns once group 0 is published.
    pub(super) fn start_stream(
        &mut self,
        li: usize,
        layer: u32,
        groups: Vec<Vec<u32>>,
        ids: &[i32],
        slots: &mut [i32],
    ) -> Result<(), PlanError> {
        let n = groups.len();
        let mut s = Stream {
            li,
            layer,
            next: 0,
            groups,
            claimed: 0,
            hits: vec![Vec::new(); n],
            loads: vec![Vec::new(); n],
            pending: VecDeque::new(),
            inflight: HashMap::new(),
        };
        // Prefetch holds of this layer end at its acquire, once the hits of the groups claimed
        // now have their consumers (so no miss evicts them).
        let r = self.claim_ahead(&mut s, 0);
        // The stream exists from here on: what it claimed is dropped with it if this fails.
        self.work.put_stream(s)?;
        r?;
        self.stream_pass(ids, slots)
    }

    /// Claims groups `s.claimed..` in order while they fit beside the groups `held..` already
    /// claimed: their hits take consumers (through `taking` until every miss has its slot),
    /// then their misses claim slots, begin loading and queue their reads.
    pub(super) fn claim_ahead(&mut self, s: &mut Stream, held: usize) -> Result<(), PlanError> {
        let (li, layer) = (s.li, s.layer);
        let capacity = self.manifest.layers[li].capacity();
        let unpinned = |p: &Plan, g: &[u32]| g.iter().filter(|&&e| !p.manifest.is_pinned(ObjectId { layer, expert: e })).count() as u32;
        let mut used: u32 = s.groups[held.min(s.claimed)..s.claimed].iter().map(|g| unpinned(self, g)).sum();
        let mut to = s.claimed;
        while let Some(g) = s.groups.get(to).map(|g| unpinned(self, g)).filter(|g| used + g <= capacity) {
            used += g;
            to += 1;
        }
        if to == s.claimed {
            return Ok(());
        }
        let mut hits = vec![Vec::new(); to - s.claimed];
        let mut misses = vec![Vec::new(); to - s.claimed];
        for (k, j) in (s.claimed..to).enumerate() {
            for &expert in &s.groups[j] {
                let object = ObjectId { layer, expert };
                self.obs.tel.object_requests += 1;
                match self.slots.find(li, expert) {
                    Some(slot) => hits[k].push(self.hit(li, slot, object)?),
                    None => misses[k].push(object),
                }
            }
        }
        if s.claimed == 0 {
            for Hold { li: hli, slot, v } in self.consumers.take_prefetched(li) {
                self.drop_consumer(hli, slot, v)?;
            }
        }
        let mut loads = vec![Vec::new(); to - s.claimed];
        for (k, group) in misses.iter().enumerate() {
            for &object in group {
                self.obs.tel.misses += 1;
                let slot = self.claim_slot(li, object)?;
                let v = self.begin_load(li, slot, object)?;
                loads[k].push(Load { object, slot, v });
            }
        }
        // Every consumer and load is the stream's now.
        let _handed_to_the_stream = self.consumers.abandon();
        for (k, (h, l)) in hits.into_iter().zip(loads).enumerate() {
            s.pending.extend(l.iter().copied());
            s.hits[s.claimed + k] = h;
            s.loads[s.claimed + k] = l;
        }
        s.claimed = to;
        Ok(())
    }

    /// The engine's next pass of the streamed event: reads on until its group is published,
    /// then serves that group; the last pass ends the stream (and starts the next layer's
    /// prefetch, which never runs beside a stream).
    pub(super) fn stream_pass(&mut self, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let mut s = self.work.take_stream().expect("a stream");
        let r = self.serve_stream_pass(&mut s, ids, slots);
        if r.is_err() || (s.next as usize) < s.hits.len() {
            self.work.put_stream(s)?;
            return r;
        }
        match self.manifest.next_layer(s.layer) {
            Some(next) => self.prefetch(next),
            None => Ok(()),
        }
    }

    pub(super) fn serve_stream_pass(&mut self, s: &mut Stream, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let (li, layer, k) = (s.li, s.layer, s.next as usize);
        if k > 0 {
            self.obs.tel.acquires += 1;
        }
        // The groups before k are released: group k (and any after it that now fit) is claimed.
        self.claim_ahead(s, k)?;
        // Reads on until every load of group k is published; later groups stay in flight.
        let group = &s.loads[k];
        self.read_until(li, &mut s.pending, &mut s.inflight, |p, _, _| {
            for &Load { slot, .. } in group {
                if p.slots.cell(li, slot)?.state == SlotState::Loading && !p.copy_in_flight(li, slot) {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        self.finish_copies_into(li, group)?;
        // Through `taking`: a failure below drops them.
        self.consumers.adopt(&mut s.hits[k]);
        self.take_loads(li, &s.loads[k])?;
        self.serve_taking(li, layer, k as u32, ids, slots)?;
        s.next += 1;
        // While the engine computes group k, the groups that fit beside it are claimed and
        // their reads go out; later groups' reads that have already landed start their copies
        // now, so that they run on the copy stream while the engine computes this pass.
        self.claim_ahead(s, k)?;
        self.submit_pending(li, &mut s.pending, &mut s.inflight)?;
        self.harvest(li, &mut s.pending, &mut s.inflight)
    }

    /// Takes back every completion the source has ready without blocking (refilling its room),
    /// each validated and its copies started: nothing waits, and nothing is published here
    /// that a synchronous copy would not have published.
    pub(super) fn harvest(
        &mut self,
        li: usize,
        pending: &mut VecDeque<Load>,
        inflight: &mut HashMap<u32, Bundle>,
    ) -> Result<(), PlanError> {
        if !self.copies.asynchronous() {
            return Ok(());
        }
        while !inflight.is_empty() && self.io.poll_ready() {
            let c = self.wait_source()?;
            self.obs.tel.harvested += 1;
            self.submit_pending(li, pending, inflight)?;
            self.accept(li, c, inflight)?;
        }
        Ok(())
    }

    /// Ends a streamed event the engine left unfinished: the consumers taken for passes it never
    /// asked for are dropped; reads still in flight are drained with the rest.
    pub(super) fn drop_stream(&mut self) -> Result<(), PlanError> {
        if let Some(s) = self.work.take_stream() {
            for Hold { li, slot, v } in s.hits.into_iter().skip(s.next as usize).flatten() {
                self.drop_consumer(li, slot, v)?;
            }
            if self.status == Status::Running {
                let e = PlanError::Config {
                    detail: format!("layer {}'s streamed event ended at pass {}: its later groups were never served", s.layer, s.next),
                };
                self.fail(&e);
            }
        }
        Ok(())
    }
}

/// `distinct` with its resident members first, each part in its own order: how a streamed
/// event (and MIN, which mirrors it) orders its experts before grouping them.
pub(super) fn resident_first(distinct: &[u32], resident: impl Fn(u32) -> bool) -> Vec<u32> {
    let (mut order, missing): (Vec<u32>, Vec<u32>) = distinct.iter().partition(|&&e| resident(e));
    order.extend(missing);
    order
}

/// Splits distinct experts into groups with at most `capacity` unpinned members each.
pub(super) fn groups(distinct: &[u32], capacity: u32, pinned: impl Fn(u32) -> bool) -> Vec<Vec<u32>> {
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
