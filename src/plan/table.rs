//! The slot table: the publish / consume / recycle / reset protocol over every slot of every
//! MoE layer, safe to share between threads.
//!
//! The Plan drives it from one thread today; a loader thread (an asynchronous source), the
//! engine's consumer and a resetter may drive it concurrently later. Every operation is one
//! critical section under the table's [`Lock`], which is a type parameter so that the model
//! check (shuttle) runs this very code with instrumented primitives.
//!
//! Protocol:
//! - `begin_load` takes a Vacant slot to Loading, starts a new generation and stamps it with
//!   the current epoch; the returned [`Version`] is the loader's ticket for the slot.
//! - The loader writes the slot's bytes, then `publish`es its version: accepted only if the slot
//!   is still Loading that very generation *and* that epoch is still current. A reset in
//!   between makes the publication stale: refused, nothing becomes visible.
//! - `consume` hands a published version of a named object to a consumer; `release` returns
//!   it (by version: a consumer can only release what it took). A slot with consumers cannot be
//!   evicted, so the bytes a consumer holds are never reloaded under it.
//! - `reset` refuses while any consumer is live, then advances the epoch. Loads of older epochs
//!   can then only be `invalidate`d (Loading → Vacant).

use super::lifecycle::{LifecycleError, SlotCell, SlotState, SlotTransition, Version};
use super::ObjectId;
use serde::Serialize;
use std::fmt;

/// The mutual exclusion the table needs: std's `Mutex` in the Plan, shuttle's in the model check.
pub trait Lock<T>: Send + Sync {
    fn new(value: T) -> Self;
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

impl<T: Send> Lock<T> for std::sync::Mutex<T> {
    fn new(value: T) -> Self {
        std::sync::Mutex::new(value)
    }

    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // A panic inside a critical section leaves no half-made transition: every operation
        // checks before it writes. The state is therefore still consistent.
        f(&mut self.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// The slots of one layer and which slot holds each expert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerSlots {
    pub layer: u32,
    pub slots: Vec<SlotCell>,
    /// expert → slot holding it (any state but Vacant).
    pub owner: Vec<Option<u32>>,
}

/// Everything the lock protects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableState {
    pub epoch: u64,
    pub layers: Vec<LayerSlots>,
}

impl TableState {
    pub fn consumers(&self) -> u64 {
        self.layers.iter().flat_map(|l| &l.slots).map(|c| u64::from(c.consumers)).sum()
    }
}

/// Why a table operation was refused. Nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SlotError {
    Lifecycle(LifecycleError),
    NoSuchSlot {
        layer_index: usize,
        slot: u32,
    },
    /// The slot no longer holds the version the caller names (recycled or reloaded).
    StaleGeneration {
        layer: u32,
        slot: u32,
        held: Version,
        current: Version,
    },
    /// The version's epoch was retired by a reset (publish), or is current (invalidate).
    StaleEpoch {
        layer: u32,
        slot: u32,
        held: Version,
        epoch: u64,
    },
    /// The slot holds another object (or none).
    WrongObject {
        layer: u32,
        slot: u32,
        wanted: ObjectId,
        holds: Option<ObjectId>,
    },
    /// The object is held by another slot already.
    AlreadyResident {
        object: ObjectId,
        slot: u32,
    },
    /// Reset refused: consumers still hold versions.
    ConsumersLive {
        consumers: u64,
    },
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotError::Lifecycle(e) => write!(f, "{e}"),
            SlotError::NoSuchSlot { layer_index, slot } => write!(f, "no slot {slot} in layer index {layer_index}"),
            SlotError::StaleGeneration { layer, slot, held, current } => {
                write!(f, "layer {layer} slot {slot}: version {held:?} is stale, the slot is at {current:?}")
            }
            SlotError::StaleEpoch { layer, slot, held, epoch } => {
                write!(f, "layer {layer} slot {slot}: version {held:?} against epoch {epoch}")
            }
            SlotError::WrongObject { layer, slot, wanted, holds } => {
                write!(f, "layer {layer} slot {slot}: holds {holds:?}, not {wanted}")
            }
            SlotError::AlreadyResident { object, slot } => write!(f, "object {object} is already in slot {slot}"),
            SlotError::ConsumersLive { consumers } => write!(f, "{consumers} consumers are live"),
        }
    }
}

impl std::error::Error for SlotError {}

impl From<LifecycleError> for SlotError {
    fn from(e: LifecycleError) -> Self {
        SlotError::Lifecycle(e)
    }
}

/// One MoE layer as the slot table holds it: its experts and its slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerShape {
    pub layer: u32,
    pub n_experts: u32,
    pub n_slots: u32,
}

pub struct SlotTable<L: Lock<TableState> = std::sync::Mutex<TableState>> {
    lock: L,
}

impl<L: Lock<TableState>> SlotTable<L> {
    /// One entry per layer: (layer number, experts, slots). Every slot starts Vacant, epoch 0.
    pub fn new(layers: &[LayerShape]) -> Self {
        let layers = layers
            .iter()
            .map(|s| LayerSlots {
                layer: s.layer,
                slots: vec![SlotCell::default(); s.n_slots as usize],
                owner: vec![None; s.n_experts as usize],
            })
            .collect();
        SlotTable { lock: L::new(TableState { epoch: 0, layers }) }
    }

    /// The lock itself (the model check reads its instrumentation).
    pub fn lock(&self) -> &L {
        &self.lock
    }

    pub fn snapshot(&self) -> TableState {
        self.lock.with(|t| t.clone())
    }

    pub fn epoch(&self) -> u64 {
        self.lock.with(|t| t.epoch)
    }

    pub fn cell(&self, li: usize, slot: u32) -> Result<SlotCell, SlotError> {
        self.lock.with(|t| Ok(*cell(t, li, slot)?))
    }

    /// The slot holding `object` (any state but Vacant).
    pub fn find(&self, li: usize, expert: u32) -> Option<u32> {
        self.lock.with(|t| t.layers.get(li)?.owner.get(expert as usize).copied().flatten())
    }

    /// The lowest Vacant slot of a layer.
    pub fn vacant(&self, li: usize) -> Option<u32> {
        self.lock.with(|t| t.layers.get(li)?.slots.iter().position(|c| c.state == SlotState::Vacant).map(|s| s as u32))
    }

    /// Live consumers over all slots.
    pub fn consumers(&self) -> u64 {
        self.lock.with(|t| t.consumers())
    }

    /// Vacant → Loading for `object`; a new generation stamped with the current epoch.
    pub fn begin_load(&self, li: usize, slot: u32, object: ObjectId) -> Result<Version, SlotError> {
        self.lock.with(|t| {
            let epoch = t.epoch;
            let ls = t.layers.get_mut(li).ok_or(SlotError::NoSuchSlot { layer_index: li, slot })?;
            if let Some(&Some(s)) = ls.owner.get(object.expert as usize) {
                return Err(SlotError::AlreadyResident { object, slot: s });
            }
            if object.layer != ls.layer || object.expert as usize >= ls.owner.len() {
                return Err(SlotError::WrongObject { layer: ls.layer, slot, wanted: object, holds: None });
            }
            let layer = ls.layer;
            let c = ls.slots.get_mut(slot as usize).ok_or(SlotError::NoSuchSlot { layer_index: li, slot })?;
            c.step(layer, slot, SlotTransition::Load)?;
            c.generation += 1;
            c.epoch = epoch;
            c.object = Some(object);
            ls.owner[object.expert as usize] = Some(slot);
            Ok(c.version())
        })
    }

    /// Loading → DeviceReady, for the loading generation of the current epoch only.
    pub fn publish(&self, li: usize, slot: u32, v: Version) -> Result<(), SlotError> {
        self.lock.with(|t| {
            let epoch = t.epoch;
            let (layer, c) = cell_mut(t, li, slot)?;
            if c.state != SlotState::Loading {
                return Err(lifecycle(layer, slot, c, SlotTransition::Publish));
            }
            if c.version() != v {
                return Err(SlotError::StaleGeneration { layer, slot, held: v, current: c.version() });
            }
            if v.epoch != epoch {
                return Err(SlotError::StaleEpoch { layer, slot, held: v, epoch });
            }
            c.step(layer, slot, SlotTransition::Publish)?;
            Ok(())
        })
    }

    /// One consumer more on the published version of `object` in `slot`.
    pub fn consume(&self, li: usize, slot: u32, object: ObjectId) -> Result<Version, SlotError> {
        self.lock.with(|t| {
            let (layer, c) = cell_mut(t, li, slot)?;
            if c.object != Some(object) {
                return Err(SlotError::WrongObject { layer, slot, wanted: object, holds: c.object });
            }
            c.step(layer, slot, SlotTransition::Consume)?;
            Ok(c.version())
        })
    }

    /// One consumer fewer on version `v`; returns the slot's state after.
    pub fn release(&self, li: usize, slot: u32, v: Version) -> Result<SlotState, SlotError> {
        self.lock.with(|t| {
            let (layer, c) = cell_mut(t, li, slot)?;
            if c.version() != v {
                return Err(SlotError::StaleGeneration { layer, slot, held: v, current: c.version() });
            }
            c.step(layer, slot, SlotTransition::Release)?;
            Ok(c.state)
        })
    }

    /// Recyclable → Vacant; returns the object that left.
    pub fn evict(&self, li: usize, slot: u32) -> Result<ObjectId, SlotError> {
        self.lock.with(|t| {
            let (layer, c) = cell_mut(t, li, slot)?;
            c.step(layer, slot, SlotTransition::Evict)?;
            let object = c.object.take().expect("a Recyclable slot holds an object");
            t.layers[li].owner[object.expert as usize] = None;
            Ok(object)
        })
    }

    /// Loading → Vacant for a load whose epoch a reset retired.
    pub fn invalidate(&self, li: usize, slot: u32, v: Version) -> Result<(), SlotError> {
        self.lock.with(|t| {
            let epoch = t.epoch;
            let (layer, c) = cell_mut(t, li, slot)?;
            if c.state != SlotState::Loading {
                return Err(lifecycle(layer, slot, c, SlotTransition::Invalidate));
            }
            if c.version() != v {
                return Err(SlotError::StaleGeneration { layer, slot, held: v, current: c.version() });
            }
            if v.epoch == epoch {
                return Err(SlotError::StaleEpoch { layer, slot, held: v, epoch });
            }
            c.step(layer, slot, SlotTransition::Invalidate)?;
            let object = c.object.take().expect("a Loading slot holds an object");
            t.layers[li].owner[object.expert as usize] = None;
            Ok(())
        })
    }

    /// Advances the epoch; refused while consumers are live. Returns the new epoch.
    pub fn reset(&self) -> Result<u64, SlotError> {
        self.lock.with(|t| {
            let consumers = t.consumers();
            if consumers > 0 {
                return Err(SlotError::ConsumersLive { consumers });
            }
            t.epoch += 1;
            Ok(t.epoch)
        })
    }
}

fn cell(t: &TableState, li: usize, slot: u32) -> Result<&SlotCell, SlotError> {
    t.layers.get(li).and_then(|l| l.slots.get(slot as usize)).ok_or(SlotError::NoSuchSlot { layer_index: li, slot })
}

fn cell_mut(t: &mut TableState, li: usize, slot: u32) -> Result<(u32, &mut SlotCell), SlotError> {
    let ls = t.layers.get_mut(li).ok_or(SlotError::NoSuchSlot { layer_index: li, slot })?;
    let layer = ls.layer;
    let c = ls.slots.get_mut(slot as usize).ok_or(SlotError::NoSuchSlot { layer_index: li, slot })?;
    Ok((layer, c))
}

fn lifecycle(layer: u32, slot: u32, c: &SlotCell, attempted: SlotTransition) -> SlotError {
    SlotError::Lifecycle(LifecycleError::Slot { layer, slot, from: c.state, consumers: c.consumers, attempted })
}
