//! Acquire and release: hits take consumers, misses claim a Vacant or Recyclable slot (evicting by the policy) and load, and each event's consumers are dropped at its release.

use super::*;

impl Plan {
    pub(super) fn acquire_event(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let li = self.manifest.layer_index(layer).ok_or(PlanError::UnknownLayer { layer })?;
        if slots.len() != ids.len() {
            return Err(PlanError::SlotsLength { ids: ids.len(), slots: slots.len() });
        }
        if let Some(s) = self.work.stream() {
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
        self.obs.tel.acquires += 1;
        if pass == 0 {
            self.obs.sem.extend(distinct.iter().map(|&expert| ObjectId { layer, expert }));
            self.slots.observe(layer, &distinct);
        }
        let pinned = |e: u32| self.manifest.is_pinned(ObjectId { layer, expert: e });
        if let Some(per) = self.work.passes().per_pass(ids.len(), self.manifest.layers[li].n_used) {
            let unpinned = distinct.iter().filter(|&&e| !pinned(e)).count() as u32;
            let per = per.min(capacity);
            if pass == 0 && per < unpinned {
                // Resident experts first: the first passes are served at once while the misses
                // of later groups are read, and no miss evicts an expert this event still needs.
                // Pass order leaves the result as it is (each pass writes only its own rows).
                let order = resident_first(&distinct, |e| self.slots.find(li, e).is_some());
                let groups = groups(&order, per, pinned);
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
            self.obs.tel.object_requests += 1;
            let Some(slot) = self.slots.find(li, expert) else {
                misses.push(object);
                continue;
            };
            self.hit(li, slot, object)?;
        }
        // Prefetch holds of this layer end at its acquire, before misses claim slots: used ones
        // stay InUse through the consumer just taken, unused ones become Recyclable victims.
        for Hold { li: hli, slot, v } in self.consumers.take_prefetched(li) {
            self.drop_consumer(hli, slot, v)?;
        }
        let mut loads = Vec::new();
        for &object in &misses {
            self.obs.tel.misses += 1;
            let slot = self.claim_slot(li, object)?;
            let v = self.begin_load(li, slot, object)?;
            loads.push(Load { object, slot, v });
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
    pub(super) fn take_loads(&mut self, li: usize, loads: &[Load]) -> Result<(), PlanError> {
        for &Load { object, slot, .. } in loads {
            let v = self.slots.consume(li, slot, object)?;
            self.obs.tel.consumer_takes += 1;
            self.consumers.take(Hold { li, slot, v });
        }
        Ok(())
    }

    /// Writes the slot of every selection the consumers in `taking` serve (-1 for the others)
    /// and files those consumers as the outstanding event (layer, pass).
    pub(super) fn serve_taking(&mut self, li: usize, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<(), PlanError> {
        let mut slot_of = vec![-1i32; self.manifest.layers[li].n_experts as usize];
        for &Hold { slot, v, .. } in self.consumers.taking() {
            let object = self.slots.cell(li, slot)?.object.expect("a consumed slot holds an object");
            debug_assert_eq!(self.slots.cell(li, slot)?.version(), v);
            slot_of[object.expert as usize] = slot as i32;
        }
        for (s, &id) in slots.iter_mut().zip(ids) {
            *s = slot_of[id as usize];
        }
        self.consumers.commit(PassKey { layer, pass });
        Ok(())
    }

    /// A hit on `slot`: one more consumer, taken through `taking`.
    pub(super) fn hit(&mut self, li: usize, slot: u32, object: ObjectId) -> Result<Hold, PlanError> {
        let v = self.slots.hit(li, slot, object, self.manifest.is_pinned(object))?;
        self.obs.tel.consumer_takes += 1;
        self.consumers.take(Hold { li, slot, v });
        self.obs.tel.hits += 1;
        if self.consumers.prefetched(li).iter().any(|h| h.slot == slot && h.v == v) {
            self.obs.tel.prefetch_hits += 1;
        }
        Ok(Hold { li, slot, v })
    }

    /// A slot for a miss: the lowest Vacant one, else the policy's victim (Recyclable, never
    /// pinned, never in use: the table refuses anything else).
    pub(super) fn claim_slot(&mut self, li: usize, object: ObjectId) -> Result<u32, PlanError> {
        if let Some(slot) = self.slots.vacant(li) {
            return Ok(slot);
        }
        let victim = self.slots.victim(object.layer).ok_or(PlanError::NoSlot { object })?;
        self.evict(li, victim)
    }

    pub(super) fn evict(&mut self, li: usize, victim: ObjectId) -> Result<u32, PlanError> {
        let slot = self.slots.evict(&self.manifest, li, victim)?;
        self.obs.tel.recycles += 1;
        Ok(slot)
    }

    pub(super) fn begin_load(&mut self, li: usize, slot: u32, object: ObjectId) -> Result<Version, PlanError> {
        self.clear_aliases(li, slot)?;
        let v = self.slots.begin_load(li, slot, object)?;
        *self.obs.tel.generations.entry(object.layer).or_default() += 1;
        Ok(v)
    }

    /// With shared layer buffers, `slot` of layer index `li` is the same memory as that slot of
    /// every layer sharing its buffer: a cached object there is evicted before the load; one
    /// that is loading, published or in use refuses the load (its bytes would change under it).
    pub(super) fn clear_aliases(&mut self, li: usize, slot: u32) -> Result<(), PlanError> {
        if self.manifest.layer_buffers == 0 {
            return Ok(());
        }
        let buffer = self.manifest.buffer_of(li);
        let sharing: Vec<usize> = (0..self.manifest.layers.len()).filter(|&lj| lj != li && self.manifest.buffer_of(lj) == buffer).collect();
        for lj in sharing {
            let cell = self.slots.cell(lj, slot)?;
            match (cell.state, cell.object) {
                (SlotState::Vacant, _) => {}
                (SlotState::Recyclable, Some(victim)) => {
                    self.evict(lj, victim)?;
                    self.obs.tel.buffer_evictions += 1;
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

    pub(super) fn release_event(&mut self, layer: u32, pass: u32) -> Result<(), PlanError> {
        let Some(event) = self.consumers.release(PassKey { layer, pass }) else {
            return Err(PlanError::NoOutstandingAcquire { layer, pass });
        };
        self.obs.tel.releases += 1;
        for Hold { li, slot, v } in event {
            self.drop_consumer(li, slot, v)?;
        }
        Ok(())
    }

    /// One consumer fewer; a slot left Recyclable goes to the policy (pinned ones stay).
    pub(super) fn drop_consumer(&mut self, li: usize, slot: u32, v: Version) -> Result<(), PlanError> {
        let freed = self.slots.release(&self.manifest, li, slot, v)?;
        self.obs.tel.consumer_drops += 1;
        if let Some(freed) = freed {
            self.obs.tel.recycles += self.slots.offer(&self.manifest, freed)?;
        }
        Ok(())
    }

    pub(super) fn release_holds(&mut self) -> Result<(), PlanError> {
        for Hold { li, slot, v } in self.consumers.take_all_prefetched() {
            self.drop_consumer(li, slot, v)?;
        }
        Ok(())
    }
}
