//! The immutable half of the Plan: objects → source extents, covering reads, windows, slots.

use crate::inventory::{Extent, Inventory};
use crate::source::{Covering, ALIGN};
use anyhow::{anyhow, bail, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

pub use crate::source::ObjectId;

/// The role of one extent inside an expert bundle. Declaration order is role order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Gate,
    Up,
    GateUp,
    Down,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Gate, Role::Up, Role::GateUp, Role::Down];

    pub fn name(self) -> &'static str {
        match self {
            Role::Gate => "gate",
            Role::Up => "up",
            Role::GateUp => "gate_up",
            Role::Down => "down",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s).ok_or_else(|| anyhow!("`{s}` is not an expert role"))
    }
}

/// One extent of an object and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExtentPlan {
    pub role: Role,
    /// Logical bytes in the model file.
    pub extent: Extent,
    /// The aligned read that covers it.
    pub covering: Covering,
    /// Where the covering read starts inside a window (a multiple of [`ALIGN`]).
    pub window_offset: u64,
}

impl ExtentPlan {
    pub fn padding(&self) -> u64 {
        self.covering.padding(self.extent.len)
    }

    /// Where the logical bytes lie inside the window.
    pub fn window_range(&self) -> std::ops::Range<usize> {
        let start = (self.window_offset + self.covering.head) as usize;
        start..start + self.extent.len as usize
    }
}

/// One object: its extents in role order, logical and physical sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectPlan {
    pub id: ObjectId,
    pub extents: Vec<ExtentPlan>,
    pub logical_bytes: u64,
    /// Sum of the covering reads: also the window bytes the bundle needs.
    pub physical_bytes: u64,
    pub padding_bytes: u64,
}

/// One role of a layer's slots and the bytes of one slot's region of it (the extent length of
/// that role, identical for every expert of the layer). Written as a `[role, bytes]` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "(Role, u64)")]
pub struct RoleBytes {
    pub role: Role,
    pub bytes_per_slot: u64,
}

impl From<RoleBytes> for (Role, u64) {
    fn from(r: RoleBytes) -> (Role, u64) {
        (r.role, r.bytes_per_slot)
    }
}

/// One MoE layer: its slots and their per-role sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerPlan {
    pub layer: u32,
    pub n_experts: u32,
    /// Slots of this layer: the requested count clamped to `n_experts`.
    pub n_slots: u32,
    /// Roles in role order with the bytes of one slot's region of each.
    pub roles: Vec<RoleBytes>,
    /// Experts of this layer named by the pin policy.
    pub pinned: Vec<u32>,
    /// Experts a token selects in this layer (0: the model names no count): an event of that
    /// many ids is a one-token event.
    #[serde(skip)]
    pub n_used: u32,
    #[serde(skip)]
    first_object: usize,
}

impl LayerPlan {
    pub fn bytes_per_slot(&self, role: Role) -> Option<u64> {
        self.roles.iter().find(|r| r.role == role).map(|r| r.bytes_per_slot)
    }

    /// Bytes of one slot over all roles.
    pub fn slot_bytes(&self) -> u64 {
        self.roles.iter().map(|r| r.bytes_per_slot).sum()
    }

    /// Slots available to objects that are not pinned: at least 1 (checked by the manifest).
    pub fn capacity(&self) -> u32 {
        self.n_slots - self.pinned.len() as u32
    }

    /// Slot compatibility: any slot of a layer holds any object of that layer, and nothing else.
    pub fn compatible(&self, object: ObjectId, slot: u32) -> bool {
        object.layer == self.layer && object.expert < self.n_experts && slot < self.n_slots
    }
}

/// The immutable manifest.
#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub alignment: u64,
    pub requested_slots: u32,
    /// Window size W: the largest bundle with every extent at its own aligned window offset.
    pub window_size: u64,
    pub layers: Vec<LayerPlan>,
    pub objects: Vec<ObjectPlan>,
    pub pinned: Vec<ObjectId>,
    /// Logical bytes of every managed object.
    pub managed_bytes: u64,
    /// Layer buffers B: 0 gives every layer its own pools; B >= 2 makes layer index i use the
    /// memory of buffer i mod B, so B layers' slots are resident at most (double-buffered
    /// layer-by-layer streaming for B = 2).
    pub layer_buffers: u32,
    #[serde(skip)]
    layer_index: BTreeMap<u32, usize>,
}

impl Manifest {
    /// Builds the manifest of `inv` with `n_slots` slots per MoE layer.
    ///
    /// `n_slots` must be at least 1; a layer with fewer experts gets `n_experts` slots (clamped:
    /// more slots than objects could never be filled). Every object of a layer must have the
    /// same role set — `gate, up, down` or `gate_up, down` — with the same extent length per
    /// role. `pinned` objects must exist, be distinct, and leave at least one unpinned slot per
    /// layer.
    pub fn new(inv: &Inventory, n_slots: u32, pinned: &[ObjectId]) -> Result<Manifest> {
        // Every refusal names the model file it is about.
        Self::of(inv, n_slots, pinned).map_err(|e| if e.to_string().starts_with(&inv.file) { e } else { e.context(inv.file.clone()) })
    }

    fn of(inv: &Inventory, n_slots: u32, pinned: &[ObjectId]) -> Result<Manifest> {
        if n_slots == 0 {
            bail!("a Plan needs at least one slot per layer");
        }
        if inv.moe_layers.is_empty() || inv.objects.is_empty() {
            bail!("{}: no MoE expert objects to manage", inv.file);
        }
        let mut by_layer: BTreeMap<u32, Vec<&crate::inventory::ExpertObject>> = BTreeMap::new();
        for o in &inv.objects {
            by_layer.entry(o.layer).or_default().push(o);
        }
        let mut layers = Vec::new();
        let mut objects = Vec::new();
        let mut layer_index = BTreeMap::new();
        for ml in &inv.moe_layers {
            let mut objs = by_layer.remove(&ml.layer).unwrap_or_default();
            objs.sort_by_key(|o| o.expert);
            if objs.len() != ml.experts as usize || objs.iter().enumerate().any(|(i, o)| o.expert != i as u32) {
                bail!("layer {}: expected experts 0..{}, the inventory has {} objects", ml.layer, ml.experts, objs.len());
            }
            let first_object = objects.len();
            let mut roles: Option<Vec<RoleBytes>> = None;
            for o in objs {
                let plan = object_plan(o)?;
                let these: Vec<RoleBytes> = plan.extents.iter().map(|e| RoleBytes { role: e.role, bytes_per_slot: e.extent.len }).collect();
                match &roles {
                    None => roles = Some(these),
                    Some(r) if *r != these => {
                        let pairs =
                            |r: &[RoleBytes]| r.iter().map(|r| format!("{} {}", r.role, r.bytes_per_slot)).collect::<Vec<_>>().join(", ");
                        bail!(
                            "object {}: roles/sizes [{}] differ from the layer's [{}]: slots would not be compatible",
                            plan.id,
                            pairs(&these),
                            pairs(r)
                        )
                    }
                    Some(_) => {}
                }
                objects.push(plan);
            }
            layer_index.insert(ml.layer, layers.len());
            layers.push(LayerPlan {
                layer: ml.layer,
                n_experts: ml.experts,
                n_slots: n_slots.min(ml.experts),
                roles: roles.unwrap_or_default(),
                pinned: Vec::new(),
                n_used: ml.expert_used.and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
                first_object,
            });
        }
        if let Some((l, _)) = by_layer.into_iter().next() {
            bail!("inventory objects of layer {l} belong to no MoE layer");
        }
        let mut seen = BTreeSet::new();
        for p in pinned {
            let Some(&li) = layer_index.get(&p.layer) else { bail!("pinned object {p}: layer {} is not a MoE layer", p.layer) };
            let lp = &mut layers[li];
            if p.expert >= lp.n_experts {
                bail!("pinned object {p}: layer {} has {} experts", p.layer, lp.n_experts);
            }
            if !seen.insert(*p) {
                bail!("pinned object {p} named twice");
            }
            lp.pinned.push(p.expert);
            if lp.pinned.len() as u32 >= lp.n_slots {
                bail!("layer {}: {} pinned objects leave none of its {} slots to the others", p.layer, lp.pinned.len(), lp.n_slots);
            }
        }
        let window_size = objects.iter().map(|o| o.physical_bytes).max().unwrap_or(0);
        let managed_bytes = objects.iter().map(|o| o.logical_bytes).sum();
        Ok(Manifest {
            alignment: ALIGN,
            requested_slots: n_slots,
            window_size,
            layers,
            objects,
            pinned: seen.into_iter().collect(),
            managed_bytes,
            layer_buffers: 0,
            layer_index,
        })
    }

    /// Shares pool memory between layers whose indices agree mod `buffers` (see
    /// [`Manifest::layer_buffers`]). Layers must then be alike, and nothing may be pinned: a
    /// pinned object's memory would be overwritten by the next layer that shares it.
    pub fn with_layer_buffers(mut self, buffers: u32) -> Result<Manifest> {
        if buffers == 0 {
            self.layer_buffers = 0;
            return Ok(self);
        }
        if buffers < 2 {
            bail!("layer buffers: at least 2 (one layer computes while the next one loads)");
        }
        if buffers as usize >= self.layers.len() {
            bail!("layer buffers: {buffers} is not fewer than the {} MoE layers; leave it at 0", self.layers.len());
        }
        if !self.pinned.is_empty() {
            bail!("layer buffers cannot keep pinned experts: their memory is shared with other layers");
        }
        let first = &self.layers[0];
        if let Some(l) = self.layers.iter().find(|l| l.roles != first.roles || l.n_slots != first.n_slots) {
            bail!("layer buffers need alike layers: layer {} differs from layer {} in slots or roles", l.layer, first.layer);
        }
        self.layer_buffers = buffers;
        Ok(self)
    }

    /// The offset within a page that every extent of `role` has in the layers using pool
    /// memory `buffer`: slots placed that far past a page boundary (and a page apart, rounded
    /// up) take those extents' covering reads whole, straight from the file. `None` where the
    /// offsets differ: an extent length that is not a multiple of the page moves each expert's
    /// offset, and those extents go through windows.
    pub fn slot_head(&self, buffer: usize, role: Role) -> Option<u64> {
        let mut head = None;
        for (li, lp) in self.layers.iter().enumerate() {
            if self.buffer_of(li) != buffer {
                continue;
            }
            for o in &self.objects[lp.first_object..lp.first_object + lp.n_experts as usize] {
                let h = o.extents.iter().find(|e| e.role == role)?.covering.head;
                if *head.get_or_insert(h) != h {
                    return None;
                }
            }
        }
        head
    }

    /// The pool memory layer index `li` uses.
    pub fn buffer_of(&self, li: usize) -> usize {
        if self.layer_buffers == 0 {
            li
        } else {
            li % self.layer_buffers as usize
        }
    }

    /// Bytes of the slot pools the layers use (shared buffers counted once): the memory a run's
    /// reads land in.
    pub fn slot_pool_bytes(&self) -> u64 {
        self.layers.iter().enumerate().filter(|&(li, _)| self.buffer_of(li) == li).map(|(_, l)| l.slot_bytes() * l.n_slots as u64).sum()
    }

    /// Index of a MoE layer in `layers`.
    pub fn layer_index(&self, layer: u32) -> Option<usize> {
        self.layer_index.get(&layer).copied()
    }

    pub fn layer(&self, layer: u32) -> Option<&LayerPlan> {
        self.layer_index(layer).map(|i| &self.layers[i])
    }

    pub fn object(&self, id: ObjectId) -> Option<&ObjectPlan> {
        let lp = self.layer(id.layer)?;
        (id.expert < lp.n_experts).then(|| &self.objects[lp.first_object + id.expert as usize])
    }

    pub fn is_pinned(&self, id: ObjectId) -> bool {
        self.layer(id.layer).is_some_and(|lp| lp.pinned.contains(&id.expert))
    }

    /// The MoE layer that follows `layer`, if any.
    pub fn next_layer(&self, layer: u32) -> Option<u32> {
        self.layer_index.range(layer + 1..).next().map(|(&l, _)| l)
    }
}

fn object_plan(o: &crate::inventory::ExpertObject) -> Result<ObjectPlan> {
    let id = ObjectId { layer: o.layer, expert: o.expert };
    let mut ext: Vec<(Role, Extent)> = Vec::new();
    for (name, e) in &o.extents {
        let role: Role = name.parse()?;
        if ext.iter().any(|(r, _)| *r == role) {
            bail!("object {id}: role `{role}` appears twice");
        }
        if e.len == 0 {
            bail!("object {id}: role `{role}` has an empty extent");
        }
        ext.push((role, *e));
    }
    ext.sort_by_key(|(r, _)| *r);
    let roles: Vec<Role> = ext.iter().map(|(r, _)| *r).collect();
    // The bundles llama.cpp's MoE FFN computes: gated, gate and up merged, or ungated (the
    // loaders that leave `ffn_gate_exps` optional: an expert is then act(up) then down).
    const BUNDLES: [&[Role]; 3] = [&[Role::Gate, Role::Up, Role::Down], &[Role::GateUp, Role::Down], &[Role::Up, Role::Down]];
    if !BUNDLES.contains(&roles.as_slice()) {
        bail!("object {id}: roles {roles:?} are neither gate, up, down nor gate_up, down nor up, down");
    }
    let mut window_offset = 0;
    let mut extents = Vec::new();
    for (role, extent) in ext {
        let covering = Covering::of(extent.offset, extent.len);
        extents.push(ExtentPlan { role, extent, covering, window_offset });
        window_offset += covering.len;
    }
    let logical_bytes = extents.iter().map(|e| e.extent.len).sum();
    Ok(ObjectPlan { id, extents, logical_bytes, physical_bytes: window_offset, padding_bytes: window_offset - logical_bytes })
}
