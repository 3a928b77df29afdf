//! Next-layer prefetch: reads of the predicted experts run while the engine computes this layer.

use super::*;

impl Plan {
    /// Starts loading the next layer's predicted experts into its Vacant slots and free windows,
    /// without waiting: the reads proceed while the engine computes this layer, and the next
    /// Plan call completes them ([`Plan::complete_prefetch`]). Evicts nothing.
    pub(super) fn prefetch(&mut self, next: u32) -> Result<(), PlanError> {
        let Some(nli) = self.manifest.layer_index(next) else { return Ok(()) };
        if !self.consumers.prefetched(nli).is_empty() || self.work.prefetching() {
            return Ok(());
        }
        let (n_experts, capacity) = (self.manifest.layers[nli].n_experts, self.manifest.layers[nli].capacity());
        let free: Vec<u32> = (0..self.io.windows().len() as u32).filter(|&w| self.io.is_free(w)).collect();
        let mut loads = Vec::new();
        for expert in self.slots.predict(next).into_iter().take(capacity as usize) {
            if expert >= n_experts || self.slots.find(nli, expert).is_some() {
                continue;
            }
            let Some(slot) = self.slots.vacant(nli) else { break };
            let object = ObjectId { layer: next, expert };
            let v = self.begin_load(nli, slot, object)?;
            loads.push(Load { object, slot, v });
        }
        let mut inflight = HashMap::new();
        let submitted = free.len().min(loads.len());
        // As many bundles as there are free windows go out now; the rest load at completion.
        let jobs: Vec<Job> = loads.iter().zip(&free).map(|(&load, &window)| Job { window, load }).collect();
        self.submit_bundles(nli, &jobs, &mut inflight)?;
        if !loads.is_empty() {
            self.work.put_prefetch(Prefetch { li: nli, loads, submitted, inflight })?;
        }
        Ok(())
    }

    /// Takes back the prefetch reads in flight: each bundle is validated, copied and published,
    /// then held by one prefetch consumer until its layer's next acquire.
    pub(super) fn complete_prefetch(&mut self) -> Result<(), PlanError> {
        let Some(Prefetch { li: nli, loads, submitted, mut inflight }) = self.work.take_prefetch() else { return Ok(()) };
        while !inflight.is_empty() {
            let c = self.wait_source()?;
            self.accept(nli, c, &mut inflight)?;
        }
        self.load(nli, &loads[submitted..])?;
        self.finish_copies_into(nli, &loads)?;
        for Load { object, slot, .. } in loads {
            let v = self.slots.consume(nli, slot, object)?;
            self.obs.tel.consumer_takes += 1;
            self.obs.tel.prefetch_loads += 1;
            self.consumers.hold_prefetched(Hold { li: nli, slot, v });
        }
        Ok(())
    }

    /// Prefetch reads that have landed by a release start their copies, which then run while
    /// the engine computes up to the next layer's acquire.
    pub(super) fn harvest_prefetch(&mut self) -> Result<(), PlanError> {
        let Some(mut p) = self.work.take_prefetch() else { return Ok(()) };
        let r = self.harvest(p.li, &mut VecDeque::new(), &mut p.inflight);
        self.work.put_prefetch(p)?;
        r
    }
}
