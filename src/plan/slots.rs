//! The slots: the table of slot states and the replacement policy that chooses among them, kept
//! in step. Every unpinned slot that becomes Recyclable is offered to the policy, every reuse and
//! eviction is reported to it, and a victim it names is evicted only where the table agrees.

use super::{Manifest, ObjectId, PlanError, ReplacementPolicy, SlotCell, SlotState, SlotTable, TableState, Version};

/// An unpinned object whose slot a release left Recyclable: the policy must be offered it
/// ([`Slots::offer`]), or it could never be chosen as a victim.
#[must_use = "a freed object goes to Slots::offer"]
pub(super) struct Freed(ObjectId);

pub(super) struct Slots {
    table: SlotTable,
    policy: Box<dyn ReplacementPolicy>,
}

impl Slots {
    pub fn new(table: SlotTable, policy: Box<dyn ReplacementPolicy>) -> Slots {
        Slots { table, policy }
    }

    pub fn epoch(&self) -> u64 {
        self.table.epoch()
    }

    pub fn snapshot(&self) -> TableState {
        self.table.snapshot()
    }

    /// Live consumers over all slots.
    pub fn consumers(&self) -> u64 {
        self.table.consumers()
    }

    pub fn cell(&self, li: usize, slot: u32) -> Result<SlotCell, PlanError> {
        Ok(self.table.cell(li, slot)?)
    }

    /// The slot holding this expert of layer index `li` (any state but Vacant).
    pub fn find(&self, li: usize, expert: u32) -> Option<u32> {
        self.table.find(li, expert)
    }

    /// The lowest Vacant slot of layer index `li`.
    pub fn vacant(&self, li: usize) -> Option<u32> {
        self.table.vacant(li)
    }

    /// The routing of an event's first pass, for policies that learn from it.
    pub fn observe(&mut self, layer: u32, distinct: &[u32]) {
        self.policy.observe(layer, distinct);
    }

    /// The experts the policy expects layer `next` to select, most likely first.
    pub fn predict(&mut self, next: u32) -> Vec<u32> {
        self.policy.prefetch(next)
    }

    /// The policy's choice among the Recyclable slots of `layer`.
    pub fn victim(&mut self, layer: u32) -> Option<ObjectId> {
        self.policy.victim(layer)
    }

    pub fn begin_load(&self, li: usize, slot: u32, object: ObjectId) -> Result<Version, PlanError> {
        Ok(self.table.begin_load(li, slot, object)?)
    }

    pub fn publish(&self, li: usize, slot: u32, v: Version) -> Result<(), PlanError> {
        Ok(self.table.publish(li, slot, v)?)
    }

    /// The first consumer on a load just published (never in the policy's hands).
    pub fn consume(&self, li: usize, slot: u32, object: ObjectId) -> Result<Version, PlanError> {
        Ok(self.table.consume(li, slot, object)?)
    }

    /// A consumer on a resident object: one that was Recyclable leaves the policy's candidates.
    pub fn hit(&mut self, li: usize, slot: u32, object: ObjectId, pinned: bool) -> Result<Version, PlanError> {
        let before = self.table.cell(li, slot)?;
        let v = self.table.consume(li, slot, object)?;
        if before.state == SlotState::Recyclable && !pinned {
            self.policy.reused(object);
        }
        Ok(v)
    }

    /// Evicts `victim` from layer index `li` (never pinned, never in use: the table refuses
    /// anything but Recyclable) and returns its slot, now Vacant.
    pub fn evict(&mut self, manifest: &Manifest, li: usize, victim: ObjectId) -> Result<u32, PlanError> {
        if manifest.is_pinned(victim) || victim.layer != manifest.layers[li].layer {
            return Err(PlanError::Config { detail: format!("the policy named {victim}, which it may not evict") });
        }
        let slot = self
            .table
            .find(li, victim.expert)
            .ok_or_else(|| PlanError::Config { detail: format!("the policy named {victim}, which is not resident") })?;
        self.table.evict(li, slot)?;
        self.policy.evicted(victim);
        Ok(slot)
    }

    /// One consumer fewer on version `v`. A slot left Recyclable and unpinned comes back as
    /// [`Freed`], which the caller hands to [`Slots::offer`].
    pub fn release(&self, manifest: &Manifest, li: usize, slot: u32, v: Version) -> Result<Option<Freed>, PlanError> {
        if self.table.release(li, slot, v)? != SlotState::Recyclable {
            return Ok(None);
        }
        let object = self.table.cell(li, slot)?.object.expect("a Recyclable slot holds an object");
        Ok((!manifest.is_pinned(object)).then_some(Freed(object)))
    }

    /// Offers a freed object to the policy and evicts what the policy then gives up; returns
    /// how many were evicted.
    pub fn offer(&mut self, manifest: &Manifest, Freed(object): Freed) -> Result<u64, PlanError> {
        let mut evicted = 0;
        for victim in self.policy.released(object) {
            let vli = manifest.layer_index(victim.layer).ok_or(PlanError::UnknownLayer { layer: victim.layer })?;
            self.evict(manifest, vli, victim)?;
            evicted += 1;
        }
        Ok(evicted)
    }

    /// One consumer fewer on version `v` of a Plan that is failing: the slot's state follows and
    /// the policy is not consulted, since a failed Plan claims no slot again.
    pub fn release_failed(&self, li: usize, slot: u32, v: Version) -> bool {
        self.table.release(li, slot, v).is_ok()
    }

    /// Evicts every object a slot still holds, pinned ones too, and starts over with `policy`,
    /// where nothing holds or loads any (every such slot is Recyclable); else changes nothing.
    /// Returns how many were evicted.
    pub fn empty(&mut self, policy: Box<dyn ReplacementPolicy>) -> Result<u64, PlanError> {
        let snapshot = self.table.snapshot();
        let held = snapshot.layers.iter().enumerate().flat_map(|(li, l)| l.slots.iter().enumerate().map(move |(s, c)| (li, s as u32, c)));
        let held: Vec<_> = held.filter(|(_, _, c)| c.object.is_some()).collect();
        if let Some((_, slot, c)) = held.iter().find(|(_, _, c)| c.state != SlotState::Recyclable) {
            return Err(PlanError::OutstandingWork { detail: format!("{} is {:?} in slot {slot}", c.object.expect("held"), c.state) });
        }
        for &(li, slot, _) in &held {
            self.table.evict(li, slot)?;
        }
        self.policy = policy;
        Ok(held.len() as u64)
    }

    /// Advances the epoch; refused while consumers are live.
    pub fn reset(&self) -> Result<u64, PlanError> {
        Ok(self.table.reset()?)
    }
}
