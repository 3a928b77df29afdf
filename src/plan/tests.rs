//! The Plan against a real forged model and the buffered source; faults through a tampering
//! source wrapped around it.

use super::*;
use crate::forge::{forge, Arch, Preset};
use crate::inventory::Inventory;
use crate::source::{BufferedSource, SourceStats};
use std::path::PathBuf;
use std::sync::OnceLock;

struct Model {
    path: PathBuf,
    bytes: Vec<u8>,
    inv: Inventory,
}

/// `--preset tiny` (3 layers, 16 experts, top-4, F32 experts of 256 KiB per role), seed 7.
fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| forged("tiny-seed7.gguf", Preset::Tiny.dims()))
}

/// Forged once into `target/plan-test/` through a temporary file renamed into place, and
/// reused by later runs: the tests compare slots with the bytes of that very file.
fn forged(name: &str, dims: crate::forge::Dims) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/plan-test");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    if !path.exists() {
        let tmp = tempfile::Builder::new().suffix(".gguf").tempfile_in(&dir).unwrap();
        forge(Arch::Qwen3moe, dims, 7, tmp.path()).unwrap();
        tmp.persist(&path).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let inv = Inventory::of(&path).unwrap();
    Model { path, bytes, inv }
}

fn obj(layer: u32, expert: u32) -> ObjectId {
    ObjectId { layer, expert }
}

fn plan_with(policy: &str, n_slots: u32, n_windows: u32, fault: Fault) -> Plan {
    let m = model();
    let spec: PolicySpec = policy.parse().unwrap();
    let manifest = Manifest::new(&m.inv, n_slots, &spec.pinned).unwrap();
    let inner = BufferedSource::open(&m.path, n_windows, manifest.window_size).unwrap();
    Plan::new(manifest, &spec, Box::new(Tamper::new(inner, fault))).unwrap()
}

fn plan(policy: &str, n_slots: u32) -> Plan {
    plan_with(policy, n_slots, 1, Fault::None)
}

/// Acquires and returns the slots written.
fn acq(p: &mut Plan, layer: u32, pass: u32, ids: &[i32]) -> Result<Vec<i32>, PlanError> {
    let mut slots = vec![i32::MIN; ids.len()];
    p.acquire(layer, pass, ids, &mut slots)?;
    Ok(slots)
}

/// Every role region of `slot` holds exactly the file bytes of `object`'s extents.
fn assert_holds(p: &Plan, slot: u32, object: ObjectId) {
    let m = model();
    let op = p.manifest().object(object).unwrap();
    for e in &op.extents {
        let want = &m.bytes[e.extent.offset as usize..e.extent.end() as usize];
        let got = p.slot_bytes(object.layer, e.role, slot).unwrap();
        assert!(got == want, "layer {} slot {slot} role {}: bytes are not those of {object}", object.layer, e.role);
    }
    let cell = p.slots(object.layer).unwrap()[slot as usize];
    assert_eq!(cell.object, Some(object));
    assert!(matches!(cell.state, SlotState::InUse | SlotState::Recyclable | SlotState::DeviceReady), "{cell:?}");
}

/// Checks the slots an acquire wrote against the group it should have made resident.
fn assert_group(p: &Plan, layer: u32, ids: &[i32], slots: &[i32], group: &[u32]) {
    let mut seen: HashMap<i32, i32> = HashMap::new();
    for (&id, &s) in ids.iter().zip(slots) {
        if group.contains(&(id as u32)) {
            assert!(s >= 0, "expert {id} of the group got no slot");
            assert_holds(p, s as u32, obj(layer, id as u32));
            assert_eq!(*seen.entry(id).or_insert(s), s, "expert {id} got two slots");
        } else {
            assert_eq!(s, -1, "expert {id} is not in this group");
        }
    }
    let mut distinct: Vec<i32> = seen.values().copied().collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), seen.len(), "two experts share a slot");
    assert_eq!(seen.len(), group.len());
}

// ---------------------------------------------------------------------------------------------
// A source that tampers with the completions of the buffered source.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// The k-th completion carries this epoch.
    Epoch {
        at: u64,
        epoch: u64,
    },
    /// The k-th completion names another object.
    Object {
        at: u64,
    },
    /// The k-th completion has this outcome.
    Outcome {
        at: u64,
        result: Result<u64, i32>,
    },
    /// The k-th completion names another generation.
    Generation {
        at: u64,
    },
    /// All queued completions come back in reverse order.
    Reverse,
    /// A copy of the k-th completion comes back at the next wait.
    LateDuplicate {
        at: u64,
    },
}

struct Tamper {
    inner: BufferedSource,
    fault: Fault,
    seen: u64,
    reversed: VecDeque<Completion>,
    late: Option<Completion>,
}

impl Tamper {
    fn new(inner: BufferedSource, fault: Fault) -> Tamper {
        Tamper { inner, fault, seen: 0, reversed: VecDeque::new(), late: None }
    }
}

impl Source for Tamper {
    fn n_windows(&self) -> u32 {
        self.inner.n_windows()
    }

    fn window_size(&self) -> u64 {
        self.inner.window_size()
    }

    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError> {
        self.inner.submit(req)
    }

    fn wait(&mut self) -> Result<Completion, SourceError> {
        if self.fault == Fault::Reverse {
            if self.reversed.is_empty() {
                while self.inner.outstanding() > 0 {
                    let c = self.inner.wait()?;
                    self.reversed.push_front(c);
                }
            }
            return self.reversed.pop_front().ok_or(SourceError::NothingOutstanding);
        }
        if let Some(c) = self.late.take() {
            return Ok(c);
        }
        let mut c = self.inner.wait()?;
        let k = self.seen;
        self.seen += 1;
        match self.fault {
            Fault::Epoch { at, epoch } if at == k => c.epoch = epoch,
            Fault::Object { at } if at == k => c.object.expert ^= 1,
            Fault::Outcome { at, result } if at == k => c.result = result,
            Fault::Generation { at } if at == k => c.generation += 1,
            Fault::LateDuplicate { at } if at == k => self.late = Some(c),
            _ => {}
        }
        Ok(c)
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.reversed.len() + usize::from(self.late.is_some())
    }

    fn poll_ready(&mut self) -> bool {
        // As the sources it stands for: completions already back are taken together. A late
        // duplicate is still on its way: only a blocking wait meets it.
        !self.reversed.is_empty() || self.inner.poll_ready()
    }

    fn window(&self, w: u32) -> &[u8] {
        self.inner.window(w)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }
}

// ---------------------------------------------------------------------------------------------
// Manifest

#[test]
fn manifest_of_forged_tiny() {
    let m = model();
    let man = Manifest::new(&m.inv, 4, &[]).unwrap();
    let role_bytes = 256 * 256 * 4;
    assert_eq!(man.layers.len(), 3);
    assert_eq!(man.objects.len(), 48);
    for (i, lp) in man.layers.iter().enumerate() {
        assert_eq!((lp.layer, lp.n_experts, lp.n_slots, lp.capacity()), (i as u32, 16, 4, 4));
        let rb = |role| RoleBytes { role, bytes_per_slot: role_bytes };
        assert_eq!(lp.roles, vec![rb(Role::Gate), rb(Role::Up), rb(Role::Down)]);
        // Written as the (role, bytes) pairs manifests always held.
        assert_eq!(serde_json::to_value(lp.roles[1]).unwrap(), serde_json::to_value((Role::Up, role_bytes)).unwrap());
        assert!(lp.compatible(obj(i as u32, 15), 3));
        assert!(!lp.compatible(obj(i as u32, 16), 0) && !lp.compatible(obj(i as u32, 0), 4));
        assert!(!lp.compatible(obj(i as u32 + 1, 0), 0));
    }
    assert_eq!(man.next_layer(0), Some(1));
    assert_eq!(man.next_layer(2), None);
    let mut max_physical = 0;
    for inv_o in &m.inv.objects {
        let o = man.object(obj(inv_o.layer, inv_o.expert)).unwrap();
        // Same extents as the inventory, in role order.
        let mut want: Vec<(Role, crate::inventory::Extent)> = inv_o.extents.iter().map(|(r, e)| (r.parse().unwrap(), *e)).collect();
        want.sort_by_key(|(r, _)| *r);
        let got: Vec<(Role, crate::inventory::Extent)> = o.extents.iter().map(|e| (e.role, e.extent)).collect();
        assert_eq!(got, want);
        assert_eq!(o.logical_bytes, 3 * role_bytes);
        let mut window_offset = 0;
        for e in &o.extents {
            let c = e.covering;
            assert_eq!(c.offset % 4096, 0);
            assert_eq!(c.len % 4096, 0);
            assert!(c.offset <= e.extent.offset && e.extent.end() <= c.offset + c.len);
            assert!(c.offset + 4096 > e.extent.offset, "covering read starts a whole block early");
            assert!(c.offset + c.len < e.extent.end() + 4096, "covering read ends a whole block late");
            assert_eq!(c.head, e.extent.offset - c.offset);
            assert_eq!(e.window_offset, window_offset);
            window_offset += c.len;
        }
        assert_eq!(o.physical_bytes, window_offset);
        assert_eq!(o.padding_bytes, o.physical_bytes - o.logical_bytes);
        max_physical = max_physical.max(o.physical_bytes);
    }
    assert_eq!(man.window_size, max_physical);
    assert_eq!(man.managed_bytes, m.inv.expert_bytes);
}

#[test]
fn manifest_validates_its_inputs() {
    let m = model();
    assert!(Manifest::new(&m.inv, 0, &[]).is_err());
    // Clamped: no more slots than experts.
    assert_eq!(Manifest::new(&m.inv, 100, &[]).unwrap().layers[0].n_slots, 16);
    // Pins: must exist, once, and leave an unpinned slot.
    let man = Manifest::new(&m.inv, 3, &[obj(1, 2), obj(0, 5)]).unwrap();
    assert_eq!(man.pinned, vec![obj(0, 5), obj(1, 2)]);
    assert_eq!(man.layers[1].capacity(), 2);
    assert!(man.is_pinned(obj(1, 2)) && !man.is_pinned(obj(1, 3)));
    assert!(Manifest::new(&m.inv, 3, &[obj(7, 0)]).is_err());
    assert!(Manifest::new(&m.inv, 3, &[obj(0, 16)]).is_err());
    assert!(Manifest::new(&m.inv, 3, &[obj(0, 1), obj(0, 1)]).is_err());
    assert!(Manifest::new(&m.inv, 2, &[obj(0, 1), obj(0, 2)]).is_err());
    // A role of another size in one object: slots would not be compatible.
    let mut inv = m.inv.clone();
    inv.objects[5].extents[0].1.len -= 4;
    assert!(Manifest::new(&inv, 4, &[]).is_err());
    // gate_up with gate: not a bundle.
    let mut inv = m.inv.clone();
    for o in &mut inv.objects {
        o.extents[0].0 = "gate_up".into();
    }
    let roles: Vec<&str> = m.inv.objects[0].extents.iter().map(|(r, _)| r.as_str()).collect();
    assert!(roles.contains(&"gate") && roles.contains(&"up"));
    assert!(Manifest::new(&inv, 4, &[]).is_err());
    // A missing expert.
    let mut inv = m.inv.clone();
    inv.objects.remove(3);
    assert!(Manifest::new(&inv, 4, &[]).is_err());
    // An expert without its up role: refused, naming the model file.
    let mut inv = m.inv.clone();
    inv.objects[1].extents.retain(|(r, _)| r != "up");
    let e = format!("{:#}", Manifest::new(&inv, 4, &[]).unwrap_err());
    assert!(e.starts_with(&m.inv.file) && e.contains("are neither gate, up, down"), "{e}");
    // One expert without its gate among gated ones: the layer's slots would not agree.
    let mut inv = m.inv.clone();
    inv.objects[1].extents.retain(|(r, _)| r != "gate");
    assert!(Manifest::new(&inv, 4, &[]).is_err());
    // Every expert without its gate (ungated experts, as llama.cpp's loaders allow): a bundle
    // of up and down, and slots of that size.
    let mut inv = m.inv.clone();
    inv.objects.iter_mut().for_each(|o| o.extents.retain(|(r, _)| r != "gate"));
    let ungated = Manifest::new(&inv, 4, &[]).unwrap();
    let roles: Vec<Role> = ungated.layers[0].roles.iter().map(|r| r.role).collect();
    assert_eq!(roles, [Role::Up, Role::Down]);
    let gated = Manifest::new(&m.inv, 4, &[]).unwrap();
    assert_eq!(ungated.layers[0].slot_bytes() * 3, gated.layers[0].slot_bytes() * 2, "each role the same size");
}

#[test]
fn pools_are_stable_aligned_and_refuse_disagreement() {
    let mut p = plan("zero", 4);
    let bps = 256 * 256 * 4;
    let base = p.pool(1, Role::Up, bps, 4).unwrap();
    let SlotLayout { head, stride } = p.slot_layout(1, Role::Up).unwrap();
    // Slots start at their extents' offset within a page, a whole number of pages apart.
    let e = &p.manifest().object(obj(1, 0)).unwrap().extents[1];
    assert_eq!((e.role, head, stride), (Role::Up, e.covering.head, crate::source::align_up(head + bps)));
    assert_eq!((base as u64 - head) % 4096, 0);
    let gate = p.pool(1, Role::Gate, bps, 4).unwrap();
    assert_ne!(base, gate);
    for bad in [p.pool(1, Role::Up, bps + 1, 4), p.pool(1, Role::Up, bps, 5), p.pool(1, Role::GateUp, bps, 4), p.pool(9, Role::Up, bps, 4)]
    {
        assert!(matches!(bad, Err(PlanError::PoolMismatch { .. })), "{bad:?}");
    }
    assert!(p.failure().is_none());
    let slots = acq(&mut p, 1, 0, &[3, 9]).unwrap();
    // The slot's region is at base + s * stride.
    let s = slots[0] as u64;
    assert_eq!(p.slot_bytes(1, Role::Up, s as u32).unwrap().as_ptr(), base.wrapping_add((s * stride) as usize) as *const u8);
    p.release(1, 0).unwrap();
    assert_eq!(p.pool(1, Role::Up, bps, 4).unwrap(), base);
}

// ---------------------------------------------------------------------------------------------
// Acquire / release

#[test]
fn acquire_publishes_the_file_bytes_of_each_object() {
    let mut p = plan_with("zero", 4, 2, Fault::None);
    // Two tokens, top-4, with a repeat: distinct 3, 5, 7, 9.
    let ids = [3, 5, 7, 9, 5, 3, 9, 7];
    let slots = acq(&mut p, 0, 0, &ids).unwrap();
    assert_group(&p, 0, &ids, &slots, &[3, 5, 7, 9]);
    // One consumer per object per event, whatever the number of rows.
    for c in p.slots(0).unwrap() {
        assert_eq!((c.state, c.consumers), (SlotState::InUse, 1));
    }
    let t = p.telemetry();
    assert_eq!((t.object_requests, t.hits, t.misses, t.loads), (4, 0, 4, 4));
    let obj_bytes = 3 * 256 * 256 * 4;
    assert_eq!(t.bytes_copied, 4 * obj_bytes);
    assert_eq!(t.q_run.logical_bytes, 4 * obj_bytes);
    assert_eq!(t.q_run.reads, 12);
    let physical: u64 = [3, 5, 7, 9].iter().map(|&e| p.manifest().object(obj(0, e)).unwrap().physical_bytes).sum();
    assert_eq!(t.q_run.physical_bytes, physical);
    assert_eq!(t.q_run.padding_bytes, physical - 4 * obj_bytes);
    assert_eq!(t.generations[&0], 4);
    p.release(0, 0).unwrap();
    for c in p.slots(0).unwrap() {
        assert_eq!(c.state, SlotState::Vacant, "zero keeps nothing");
    }
    assert_eq!(p.telemetry().recycles, 4);
    let closure = p.shutdown().unwrap();
    assert!(closure.is_clean(), "{closure:?}");
    assert_eq!(closure.source.physical_bytes, physical);
    assert_eq!((closure.source.submissions, closure.source.completions), (12, 12));
    assert!(matches!(p.acquire(0, 0, &[1], &mut [0]), Err(PlanError::Closed)));
}

#[test]
fn groups_serve_more_distinct_experts_than_slots() {
    let mut p = plan("zero", 2);
    let ids = [4, 1, 4, 6, 2, 1, 8, 6];
    // Distinct in order of first appearance: 4, 1, 6, 2, 8 → [4, 1], [6, 2], [8].
    for (pass, group) in [(0, vec![4, 1]), (1, vec![6, 2]), (2, vec![8])] {
        let slots = acq(&mut p, 2, pass, &ids).unwrap();
        assert_group(&p, 2, &ids, &slots, &group);
        p.release(2, pass).unwrap();
    }
    let slots = acq(&mut p, 2, 3, &ids).unwrap();
    assert!(slots.iter().all(|&s| s == -1));
    assert!(matches!(p.release(2, 3), Err(PlanError::NoOutstandingAcquire { layer: 2, pass: 3 })));
    let t = p.telemetry();
    assert_eq!((t.object_requests, t.misses, t.loads), (5, 5, 5));
    assert_eq!(t.u_sem_lb.objects, 5);
}

#[test]
fn held_consumers_are_never_evicted() {
    let mut p = plan("lru:2", 2);
    acq(&mut p, 0, 0, &[1, 2]).unwrap();
    // The next group needs slots; both hold consumers of the first.
    let before = p.slots(0).unwrap();
    let err = acq(&mut p, 0, 1, &[1, 2, 3]).unwrap_err();
    assert_eq!(err, PlanError::NoSlot { object: obj(0, 3) });
    assert_eq!(p.slots(0).unwrap(), before, "a failed acquire touched slots in use");
    assert_eq!(p.failure(), Some(&PlanError::NoSlot { object: obj(0, 3) }));
    // Every later refusal carries the first error, kind included.
    assert!(matches!(acq(&mut p, 0, 0, &[1]), Err(PlanError::Failed { first }) if *first == PlanError::NoSlot { object: obj(0, 3) }));
    // Release still balances a failed Plan, and shutdown reports it.
    p.release(0, 0).unwrap();
    let c = p.shutdown().unwrap();
    assert!(c.balanced() && c.failed.is_some(), "{c:?}");
}

#[test]
fn the_same_layer_acquired_twice_counts_two_consumers() {
    let mut p = plan("lru:4", 4);
    let a = acq(&mut p, 1, 0, &[5, 6]).unwrap();
    let b = acq(&mut p, 1, 0, &[6, 5]).unwrap();
    assert_eq!(a, vec![b[1], b[0]]);
    let cell = p.slots(1).unwrap()[a[0] as usize];
    assert_eq!((cell.state, cell.consumers), (SlotState::InUse, 2));
    p.release(1, 0).unwrap();
    assert_eq!(p.slots(1).unwrap()[a[0] as usize].state, SlotState::InUse);
    p.release(1, 0).unwrap();
    assert_eq!(p.slots(1).unwrap()[a[0] as usize].state, SlotState::Recyclable);
    assert!(p.release(1, 0).is_err());
}

#[test]
fn lru_hits_keep_slot_and_generation_and_evict_least_recent() {
    let mut p = plan("lru:3", 3);
    let mut slot_of = HashMap::new();
    for e in [1, 2, 3] {
        let s = acq(&mut p, 0, 0, &[e]).unwrap()[0];
        slot_of.insert(e, s);
        p.release(0, 0).unwrap();
    }
    let gen_before: Vec<u64> = p.slots(0).unwrap().iter().map(|c| c.generation).collect();
    // 2 is a hit: same slot, same generation, Recyclable → InUse.
    let s = acq(&mut p, 0, 0, &[2, 2]).unwrap();
    assert_eq!(s, vec![slot_of[&2]; 2]);
    assert_eq!(p.slots(0).unwrap()[s[0] as usize].generation, gen_before[s[0] as usize]);
    assert_holds(&p, s[0] as u32, obj(0, 2));
    p.release(0, 0).unwrap();
    // 4 misses: the least recently used is 1.
    let s = acq(&mut p, 0, 0, &[4]).unwrap();
    assert_eq!(s[0], slot_of[&1]);
    assert_holds(&p, s[0] as u32, obj(0, 4));
    p.release(0, 0).unwrap();
    assert_holds(&p, slot_of[&2] as u32, obj(0, 2));
    assert_holds(&p, slot_of[&3] as u32, obj(0, 3));
    let t = p.telemetry();
    assert_eq!((t.hits, t.misses, t.recycles, t.loads), (1, 4, 1, 4));
    assert_eq!(t.u_sched, Union { objects: 4, bytes: 4 * 3 * 256 * 256 * 4 });
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn zero_never_hits_across_events() {
    let mut p = plan("zero", 4);
    for _ in 0..3 {
        let ids = [7, 8, 7, 9];
        let slots = acq(&mut p, 1, 0, &ids).unwrap();
        assert_group(&p, 1, &ids, &slots, &[7, 8, 9]);
        p.release(1, 0).unwrap();
        assert!(p.slots(1).unwrap().iter().all(|c| c.state == SlotState::Vacant));
    }
    let t = p.telemetry();
    assert_eq!((t.hits, t.misses, t.loads, t.recycles), (0, 9, 9, 9));
    assert_eq!(t.u_sched.objects, 3);
    assert_eq!(t.u_sem_lb.objects, 3);
    assert_eq!(t.q_run.logical_bytes, 9 * 3 * 256 * 256 * 4, "rereads count in Q_run");
}

#[test]
fn pinned_objects_are_never_evicted() {
    let mut p = plan("pin:0/1", 3);
    acq(&mut p, 0, 0, &[1, 2]).unwrap();
    p.release(0, 0).unwrap();
    let pinned_slot = p.slots(0).unwrap().iter().position(|c| c.object == Some(obj(0, 1))).unwrap();
    let gen = p.slots(0).unwrap()[pinned_slot].generation;
    // Others: zero. Capacity for unpinned objects is 2, so [3, 4, 5, 6] takes two passes.
    let ids = [3, 4, 5, 6];
    for (pass, group) in [(0, [3, 4]), (1, [5, 6])] {
        let slots = acq(&mut p, 0, pass, &ids).unwrap();
        assert_group(&p, 0, &ids, &slots, &group);
        p.release(0, pass).unwrap();
    }
    // A pinned expert rides along in a full group without taking an unpinned slot.
    let ids = [7, 1, 8];
    let slots = acq(&mut p, 0, 0, &ids).unwrap();
    assert_group(&p, 0, &ids, &slots, &[7, 1, 8]);
    assert_eq!(slots[1], pinned_slot as i32);
    p.release(0, 0).unwrap();
    let cell = p.slots(0).unwrap()[pinned_slot];
    assert_eq!((cell.object, cell.generation, cell.state), (Some(obj(0, 1)), gen, SlotState::Recyclable));
    let t = p.telemetry();
    assert_eq!(t.hits, 1);
    assert_eq!(t.loads, 1 + 1 + 4 + 2);
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn prefetch_loads_the_next_layer_early() {
    let mut p = plan("zero+prefetch", 4);
    let token = |p: &mut Plan, l1: &[i32]| {
        for (layer, ids) in [(0, &[1, 2][..]), (1, l1), (2, &[5, 6][..])] {
            let slots = acq(p, layer, 0, ids).unwrap();
            let group: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
            assert_group(p, layer, ids, &slots, &group);
            p.release(layer, 0).unwrap();
        }
    };
    token(&mut p, &[3, 4]);
    assert_eq!(p.telemetry().prefetch_loads, 0, "nothing to predict yet");
    token(&mut p, &[3, 4]);
    let t = p.telemetry();
    // Layer 0's acquire prefetched layer 1's {3, 4}, layer 1's prefetched layer 2's {5, 6}.
    assert_eq!((t.prefetch_loads, t.prefetch_hits), (4, 4));
    assert_eq!((t.hits, t.misses), (4, 8));
    // A wrong prediction is released and recycled at the next acquire of its layer.
    token(&mut p, &[9, 10]);
    let t = p.telemetry();
    assert_eq!((t.prefetch_loads, t.prefetch_hits), (8, 6));
    assert!(p.slots(1).unwrap().iter().all(|c| c.state == SlotState::Vacant));
    // Layer 0's acquire starts layer 1's prediction {9, 10} and returns: the reads are in
    // flight while the engine computes, the slots Loading, nothing visible; shutdown completes
    // them and lets them go.
    acq(&mut p, 0, 0, &[1, 2]).unwrap();
    p.release(0, 0).unwrap();
    let loading: Vec<_> = p.slots(1).unwrap().into_iter().filter(|c| c.state == SlotState::Loading).collect();
    assert_eq!(loading.len(), 2);
    let c = p.shutdown().unwrap();
    assert!(c.is_clean(), "{c:?}");
    assert!(p.slots(1).unwrap().iter().all(|c| c.state == SlotState::Vacant), "shutdown released the holds");
}

#[test]
fn semantic_union_counts_router_selections_on_pass_zero() {
    let mut p = plan("lru:2", 2);
    let ids = [0, 1, 2, 1];
    acq(&mut p, 0, 0, &ids).unwrap();
    p.release(0, 0).unwrap();
    acq(&mut p, 0, 1, &ids).unwrap();
    p.release(0, 1).unwrap();
    acq(&mut p, 2, 0, &[15]).unwrap();
    p.release(2, 0).unwrap();
    let t = p.telemetry();
    let per = 3 * 256 * 256 * 4;
    assert_eq!(t.u_sem_lb, SemanticUnion { objects: 4, extents: 12, bytes: 4 * per, duplicates: 0, overlaps: 0 });
    let json = serde_json::to_value(&t).unwrap();
    for key in ["hits", "misses", "recycles", "loads", "bytes_copied", "rejections", "generations", "q_run", "u_sched", "u_sem_lb"] {
        assert!(json.get(key).is_some(), "telemetry lacks {key}");
    }
}

// ---------------------------------------------------------------------------------------------
// Rejections and fail-closed behaviour

/// After a rejected completion: Failed, nothing published, later acquires refused, and a
/// shutdown that drains the source and reports the interrupted window.
fn assert_failed_closed(mut p: Plan, err: PlanError, kind: RejectKind, layer: u32) {
    assert!(matches!(&err, PlanError::Rejected { kind: k, .. } if *k == kind), "{err:?}");
    assert_eq!(p.failure(), Some(&err));
    assert_eq!(p.telemetry().rejections.get(&kind), Some(&1));
    for c in p.slots(layer).unwrap() {
        assert!(matches!(c.state, SlotState::Vacant | SlotState::Loading), "published after a rejection: {c:?}");
        assert_eq!(c.consumers, 0);
    }
    assert!(matches!(acq(&mut p, layer, 0, &[0]), Err(PlanError::Failed { first }) if *first == err));
    assert!(matches!(p.reset(), Err(PlanError::Failed { first }) if *first == err));
    let c = p.shutdown().unwrap();
    assert_eq!((c.active_tickets, c.source_outstanding, c.consumers_live), (0, 0, 0), "{c:?}");
    assert_eq!(c.windows_free, c.windows_total, "the interrupted window is discarded uncopied: {c:?}");
    assert_eq!(p.telemetry().windows_discarded, 1);
    assert!(c.failed.is_some() && !c.is_clean());
}

#[test]
fn stale_epoch_completion_is_rejected() {
    let mut p = plan_with("zero", 4, 1, Fault::Epoch { at: 4, epoch: 0 });
    acq(&mut p, 0, 0, &[1]).unwrap();
    p.release(0, 0).unwrap();
    p.reset().unwrap();
    assert_eq!(p.epoch(), 1);
    // Completions 3..5 are object 2's; the second of them claims epoch 0.
    let err = acq(&mut p, 0, 0, &[2]).unwrap_err();
    // Object 2 took object 1's old slot; nothing was copied over object 1's bytes.
    let slot = p.slots(0).unwrap().iter().position(|c| c.object == Some(obj(0, 2))).unwrap();
    let m = model();
    for e in &p.manifest().object(obj(0, 1)).unwrap().extents {
        let old = &m.bytes[e.extent.offset as usize..e.extent.end() as usize];
        assert!(p.slot_bytes(0, e.role, slot as u32).unwrap() == old, "bytes were copied");
    }
    assert_failed_closed(p, err, RejectKind::StaleEpoch, 0);
}

#[test]
fn wrong_object_completion_is_rejected_before_any_copy() {
    let mut p = plan_with("zero", 4, 1, Fault::Object { at: 0 });
    let err = acq(&mut p, 1, 0, &[6, 7]).unwrap_err();
    assert_eq!(p.telemetry().bytes_copied, 0);
    for s in 0..4 {
        for r in [Role::Gate, Role::Up, Role::Down] {
            assert!(p.slot_bytes(1, r, s).unwrap().iter().all(|&b| b == 0));
        }
    }
    assert_failed_closed(p, err, RejectKind::WrongObject, 1);
}

#[test]
fn short_failed_and_stale_generation_extents_fail_the_bundle() {
    // The third extent (down) of the second object: two whole extents were already accepted.
    for (fault, kind) in [
        (Fault::Outcome { at: 5, result: Ok(100) }, RejectKind::ShortRead),
        (Fault::Outcome { at: 5, result: Err(libc::EIO) }, RejectKind::IoError),
        (Fault::Outcome { at: 5, result: Ok(1 << 30) }, RejectKind::LongRead),
        (Fault::Generation { at: 5 }, RejectKind::StaleGeneration),
    ] {
        let mut p = plan_with("zero", 4, 1, fault);
        let err = acq(&mut p, 2, 0, &[10, 11]).unwrap_err();
        // The first object was published, then its consumer rolled back with the failed event.
        let t = p.telemetry();
        assert_eq!(t.loads, 1, "{kind:?}");
        let cells = p.slots(2).unwrap();
        assert!(cells.iter().any(|c| c.object == Some(obj(2, 11)) && c.state == SlotState::Loading));
        assert!(cells.iter().all(|c| c.consumers == 0));
        let c = p.closure();
        assert_eq!(c.consumer_takes, c.consumer_drops);
        // Layer 2 now holds one published object (10) and a Loading 11: check 10 directly.
        let s10 = cells.iter().position(|c| c.object == Some(obj(2, 10))).unwrap() as u32;
        assert_holds(&p, s10, obj(2, 10));
        assert!(matches!(&err, PlanError::Rejected { kind: k, .. } if *k == kind), "{err:?}");
        assert!(matches!(acq(&mut p, 2, 0, &[10]), Err(PlanError::Failed { .. })));
        let c = p.shutdown().unwrap();
        assert_eq!(c.windows_free, c.windows_total);
        assert_eq!(p.telemetry().windows_discarded, 1);
        assert_eq!(c.active_tickets, 0);
    }
}

#[test]
fn out_of_range_ids_fail_the_plan_before_any_read() {
    for bad in [16, -1, i32::MAX] {
        let mut p = plan("zero", 4);
        let err = acq(&mut p, 0, 0, &[1, 2, bad, 3]).unwrap_err();
        assert_eq!(err, PlanError::ExpertOutOfRange { layer: 0, index: 2, id: bad, n_experts: 16 });
        assert!(p.failure().is_some());
        assert_eq!(p.telemetry().q_run.reads, 0);
        assert!(matches!(acq(&mut p, 0, 0, &[1]), Err(PlanError::Failed { .. })));
        assert!(p.shutdown().unwrap().balanced());
    }
    let mut p = plan("zero", 4);
    assert_eq!(acq(&mut p, 3, 0, &[1]).unwrap_err(), PlanError::UnknownLayer { layer: 3 });
    let mut p = plan("zero", 4);
    assert_eq!(p.acquire(0, 0, &[1, 2], &mut [0]).unwrap_err(), PlanError::SlotsLength { ids: 2, slots: 1 });
}

#[test]
fn out_of_order_completions_are_legal() {
    let mut p = plan_with("zero", 4, 4, Fault::Reverse);
    let ids = [12, 13, 14, 15];
    let slots = acq(&mut p, 1, 0, &ids).unwrap();
    assert_group(&p, 1, &ids, &slots, &[12, 13, 14, 15]);
    p.release(1, 0).unwrap();
    let c = p.shutdown().unwrap();
    assert!(c.is_clean(), "{c:?}");
    assert_eq!(c.source.peak_outstanding, 12, "all four bundles were in flight together");
}

#[test]
fn reset_drains_late_completions_and_refuses_live_consumers() {
    // A copy of an old completion is still queued in the source when the request ends.
    let mut p = plan_with("lru:4", 4, 1, Fault::LateDuplicate { at: 5 });
    acq(&mut p, 0, 0, &[4, 5]).unwrap();
    p.release(0, 0).unwrap();
    assert_eq!(p.closure().source_outstanding, 1);
    p.reset().unwrap();
    let c = p.closure();
    assert_eq!((c.drained_completions, c.source_outstanding, c.epoch), (1, 0, 1));
    // Retained objects survive the reset; new loads carry the new epoch.
    let s = acq(&mut p, 0, 0, &[4, 6]).unwrap();
    assert_holds(&p, s[0] as u32, obj(0, 4));
    assert_holds(&p, s[1] as u32, obj(0, 6));
    assert_eq!(p.slots(0).unwrap()[s[1] as usize].epoch, 1);
    assert_eq!(p.telemetry().hits, 1);
    // Reset while the engine holds a consumer: refused, and the Plan fails closed.
    assert_eq!(p.reset().unwrap_err(), PlanError::ConsumersLive { consumers: 2 });
    assert!(p.failure().is_some());
    p.release(0, 0).unwrap();
    assert!(p.shutdown().unwrap().balanced());
}

#[test]
fn a_late_completion_during_an_acquire_is_rejected() {
    let mut p = plan_with("zero", 4, 1, Fault::LateDuplicate { at: 2 });
    acq(&mut p, 0, 0, &[4]).unwrap();
    p.release(0, 0).unwrap();
    let err = acq(&mut p, 0, 0, &[5]).unwrap_err();
    assert_failed_closed(p, err, RejectKind::UnknownTicket, 0);
}

#[test]
fn shutdown_with_a_live_consumer_is_refused_then_balanced() {
    let mut p = plan("zero", 4);
    acq(&mut p, 0, 0, &[1, 2]).unwrap();
    assert_eq!(p.shutdown().unwrap_err(), PlanError::ConsumersLive { consumers: 2 });
    p.release(0, 0).unwrap();
    let c = p.shutdown().unwrap();
    assert!(c.balanced(), "{c:?}");
    assert_eq!((c.consumer_takes, c.consumer_drops), (2, 2));
    assert_eq!(p.shutdown().unwrap_err(), PlanError::Closed);
}

#[test]
fn release_without_acquire_fails_the_plan() {
    let mut p = plan("zero", 4);
    assert_eq!(p.release(1, 0).unwrap_err(), PlanError::NoOutstandingAcquire { layer: 1, pass: 0 });
    assert!(matches!(acq(&mut p, 1, 0, &[1]), Err(PlanError::Failed { .. })));
}

#[test]
fn policy_and_source_must_fit_the_manifest() {
    let m = model();
    let man = Manifest::new(&m.inv, 2, &[]).unwrap();
    let small = BufferedSource::open(&m.path, 1, man.window_size - 4096).unwrap();
    assert!(Plan::new(man.clone(), &"zero".parse().unwrap(), Box::new(small)).is_err());
    let w = man.window_size;
    let src = || Box::new(BufferedSource::open(&m.path, 1, w).unwrap());
    assert!(Plan::new(man.clone(), &"lru:3".parse().unwrap(), src()).is_err());
    assert!(Plan::new(man.clone(), &"pin:0/1".parse().unwrap(), src()).is_err(), "pins not in the manifest");
    assert!(Plan::new(man, &"lru:2".parse().unwrap(), src()).is_ok());
}

#[test]
fn shared_layer_buffers_evict_cached_objects_and_refuse_live_ones() {
    let m = model();
    let spec: PolicySpec = "lru:4".parse().unwrap();
    // Three layers, two buffers: layers 0 and 2 share memory.
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap().with_layer_buffers(2).unwrap();
    let source = BufferedSource::open(&m.path, 1, manifest.window_size).unwrap();
    let mut p = Plan::new(manifest, &spec, Box::new(source)).unwrap();
    let (l0, l2) = (p.manifest().layers[0].layer, p.manifest().layers[2].layer);
    let slot = p.manifest().layers[0].slot_bytes() / 3;
    let role = p.manifest().layers[0].roles[0].role;
    assert_eq!(
        p.pool(l0, role, p.manifest().layers[0].roles[0].bytes_per_slot, 4).unwrap(),
        p.pool(l2, role, p.manifest().layers[0].roles[0].bytes_per_slot, 4).unwrap()
    );
    assert!(slot > 0);

    // Layer 0's experts are cached (Recyclable) after release; layer 2 evicts them to load.
    let s0 = acq(&mut p, l0, 0, &[1, 2]).unwrap();
    p.release(l0, 0).unwrap();
    let s2 = acq(&mut p, l2, 0, &[5, 6]).unwrap();
    assert_eq!(s0, s2, "the same slots of the shared buffer");
    assert_holds(&p, s2[0] as u32, obj(l2, 5));
    assert_holds(&p, s2[1] as u32, obj(l2, 6));
    assert_eq!(p.telemetry().buffer_evictions, 2);
    assert!(p.slots(l0).unwrap().iter().all(|c| c.state == SlotState::Vacant));

    // While layer 2 is in use, layer 0 cannot load into its memory: the Plan fails closed.
    let err = acq(&mut p, l0, 0, &[3]).unwrap_err();
    assert!(matches!(err, PlanError::BufferLive { .. }), "{err}");
    assert!(p.failure().is_some());
}

/// An engine pool in memory the test can read: each write lands in `mem`, or fails on demand.
struct TestPool {
    mem: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    bytes_per_slot: usize,
    fail: bool,
}

impl SlotWriter for TestPool {
    fn write(&self, slot: u32, src: &[u8]) -> Result<(), CopyError> {
        if self.fail || src.len() != self.bytes_per_slot {
            return Err(CopyError { detail: format!("refused {} bytes into slot {slot}", src.len()) });
        }
        let start = slot as usize * self.bytes_per_slot;
        self.mem.lock().unwrap()[start..start + src.len()].copy_from_slice(src);
        Ok(())
    }
}

/// An engine pool with a copy stream: `begin` queues the bytes, and they land in `mem` only
/// when `wait` sees the copy's "event" (so a slot read before its wait holds stale bytes).
struct AsyncPool {
    pool: TestPool,
    queued: std::sync::Mutex<HashMap<u64, (u32, Vec<u8>)>>,
    next: std::sync::atomic::AtomicU64,
    /// Copy ids whose wait reports a failure.
    fail_wait: bool,
}

impl SlotWriter for AsyncPool {
    fn write(&self, slot: u32, src: &[u8]) -> Result<(), CopyError> {
        self.pool.write(slot, src)
    }
    fn asynchronous(&self) -> bool {
        true
    }
    unsafe fn begin(&self, slot: u32, src: &[u8]) -> Result<u64, CopyError> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.queued.lock().unwrap().insert(id, (slot, src.to_vec()));
        Ok(id)
    }
    fn wait(&self, id: u64) -> Result<(), CopyError> {
        let (slot, bytes) = self.queued.lock().unwrap().remove(&id).ok_or_else(|| CopyError { detail: format!("no copy {id}") })?;
        if self.fail_wait {
            return Err(CopyError { detail: format!("copy {id} failed on the device") });
        }
        self.pool.write(slot, &bytes)
    }
}

/// The bytes each engine pool (layer, role) holds, as the test writer saw them.
type PoolBytes = HashMap<(u32, Role), std::sync::Arc<std::sync::Mutex<Vec<u8>>>>;

fn async_engine_plan(fail_wait: bool) -> (Plan, PoolBytes) {
    bound_plan(None, |pool| Box::new(AsyncPool { pool, queued: Default::default(), next: Default::default(), fail_wait }))
}

#[test]
fn asynchronous_copies_publish_a_slot_only_after_its_event_and_free_the_window_then() {
    let m = model();
    let (mut p, mems) = async_engine_plan(false);
    let layer = p.manifest().layers[1].layer;
    // Two windows, three misses: the third bundle needs a window whose copy is still in flight.
    let ids = [3, 9, 11];
    let slots = acq(&mut p, layer, 0, &ids).unwrap();
    for (&id, &s) in ids.iter().zip(&slots) {
        for e in &p.manifest().object(obj(layer, id as u32)).unwrap().extents {
            let mem = mems[&(layer, e.role)].lock().unwrap();
            let start = s as usize * e.extent.len as usize;
            assert!(
                mem[start..start + e.extent.len as usize] == m.bytes[e.extent.offset as usize..e.extent.end() as usize],
                "slot {s} {} holds expert {id}",
                e.role
            );
        }
    }
    assert!(p.window_states().iter().all(|w| *w == WindowState::Free), "{:?}", p.window_states());
    let tel = p.telemetry();
    assert_eq!((tel.loads, tel.async_copies, tel.copies_abandoned), (3, tel.q_run.reads, 0), "{tel:?}");
    p.release(layer, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_failed_copy_event_fails_the_plan_closed_and_publishes_nothing() {
    let (mut p, _) = async_engine_plan(true);
    let layer = p.manifest().layers[0].layer;
    let err = acq(&mut p, layer, 0, &[1, 2, 5]).unwrap_err();
    assert!(matches!(err, PlanError::Copy { .. }), "{err}");
    assert!(p.slots(layer).unwrap().iter().all(|c| !matches!(c.state, SlotState::DeviceReady | SlotState::InUse)));
    let closure = p.shutdown().unwrap();
    assert!(closure.balanced() && closure.failed.is_some(), "{closure:?}");
    assert!(p.window_states().iter().all(|w| *w == WindowState::Free));
}

fn engine_plan(fail_role: Option<Role>) -> (Plan, PoolBytes) {
    bound_plan(fail_role, |pool| Box::new(pool))
}

/// A Plan over two P windows whose pools are bound to writers `wrap` makes of test pools.
fn bound_plan(fail_role: Option<Role>, wrap: impl Fn(TestPool) -> Box<dyn SlotWriter>) -> (Plan, PoolBytes) {
    let m = model();
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
    let source = BufferedSource::open(&m.path, 2, manifest.window_size).unwrap();
    let mut p = Plan::for_engine(manifest, &spec, Box::new(source)).unwrap();
    let mut mems = HashMap::new();
    for lp in p.manifest().layers.clone() {
        for &RoleBytes { role, bytes_per_slot: bps } in &lp.roles {
            let mem = std::sync::Arc::new(std::sync::Mutex::new(vec![0u8; (bps * u64::from(lp.n_slots)) as usize]));
            let pool = TestPool { mem: mem.clone(), bytes_per_slot: bps as usize, fail: fail_role == Some(role) };
            assert_eq!(p.bind(lp.layer, role, bps, lp.n_slots, wrap(pool)).unwrap() as usize, p.manifest().layer_index(lp.layer).unwrap());
            mems.insert((lp.layer, role), mem);
        }
    }
    (p, mems)
}

#[test]
fn engine_pools_get_each_slot_through_the_writer() {
    let m = model();
    let (mut p, mems) = engine_plan(None);
    let layer = p.manifest().layers[1].layer;
    let RoleBytes { role, bytes_per_slot: bps } = p.manifest().layers[1].roles[0];
    // Host-pool inspection and addresses do not exist for the engine's pools.
    assert!(p.slot_bytes(layer, role, 0).is_none());
    assert!(matches!(p.pool(layer, role, bps, 4), Err(PlanError::PoolMismatch { .. })));
    let ids = [3, 9, 3, 11];
    let slots = acq(&mut p, layer, 0, &ids).unwrap();
    for (&id, &s) in ids.iter().zip(&slots) {
        let op = p.manifest().object(obj(layer, id as u32)).unwrap();
        for e in &op.extents {
            let mem = mems[&(layer, e.role)].lock().unwrap();
            let start = s as usize * e.extent.len as usize;
            assert!(
                mem[start..start + e.extent.len as usize] == m.bytes[e.extent.offset as usize..e.extent.end() as usize],
                "slot {s} {} holds the bytes of expert {id}",
                e.role
            );
        }
    }
    let tel = p.telemetry();
    assert_eq!(tel.loads, 3);
    assert!(tel.copy_ns > 0 && tel.read_ns > 0, "{tel:?}");
    p.release(layer, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_failed_slot_copy_fails_the_plan_and_drains_clean() {
    let (mut p, _) = engine_plan(Some(Role::Up));
    let layer = p.manifest().layers[0].layer;
    let err = acq(&mut p, layer, 0, &[1, 2]).unwrap_err();
    assert!(matches!(err, PlanError::Copy { .. }), "{err}");
    assert!(p.failure().is_some());
    // The slot never became DeviceReady; the copying window is discarded at shutdown.
    assert!(p.slots(layer).unwrap().iter().all(|c| !matches!(c.state, SlotState::DeviceReady | SlotState::InUse)));
    let closure = p.shutdown().unwrap();
    assert!(closure.balanced() && closure.failed.is_some(), "{closure:?}");
    assert!(p.telemetry().windows_discarded >= 1);

    // A pool the engine never bound fails the same way.
    let m = model();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
    let source = BufferedSource::open(&m.path, 1, manifest.window_size).unwrap();
    let mut p = Plan::for_engine(manifest, &"zero".parse().unwrap(), Box::new(source)).unwrap();
    assert!(matches!(acq(&mut p, layer, 0, &[1]), Err(PlanError::Copy { .. })));
    assert!(p.shutdown().unwrap().balanced());
}

// ---------------------------------------------------------------------------------------------
// All of a pass's reads at once: coalesced neighbours, reads straight into host slots

/// The tiny preset of seed 7 forged with 4096-byte tensor alignment: every expert extent (256
/// KiB of F32) starts on a page, so covering reads are exact and neighbours abut.
fn aligned_model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| forged("tiny-seed7-a4096.gguf", crate::forge::Dims { alignment: 4096, ..Preset::Tiny.dims() }))
}

/// A Plan with host pools over F (io_uring) reading `file` (the model's own file unless given),
/// sized as a run without flags would be: one window per slot, 3 extents per window.
fn uring_plan(m: &Model, n_slots: u32, file: Option<&std::path::Path>, cell: crate::source::fault::FaultCell) -> Plan {
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, n_slots, &[]).unwrap();
    let source = crate::source::UringSource::open(file.unwrap_or(&m.path), n_slots, manifest.window_size, 3 * n_slots).unwrap();
    Plan::new(manifest, &spec, crate::source::fault::FaultySource::wrap(Box::new(source), cell)).unwrap()
}

fn assert_holds_file(p: &Plan, m: &Model, slot: u32, object: ObjectId) {
    for e in &p.manifest().object(object).unwrap().extents {
        let want = &m.bytes[e.extent.offset as usize..e.extent.end() as usize];
        assert!(p.slot_bytes(object.layer, e.role, slot).unwrap() == want, "slot {slot} {}: not the bytes of {object}", e.role);
    }
}

#[test]
fn neighbours_go_out_as_one_read_straight_into_host_slots() {
    let m = aligned_model();
    let mut p = uring_plan(m, 4, None, crate::source::fault::FaultCell::None);
    // Experts 4..7 are neighbours in each of the three tensors: three vectored reads of four
    // extents each, every byte read into its slot.
    let ids = [5, 4, 7, 6, 5];
    let slots = acq(&mut p, 1, 0, &ids).unwrap();
    for (&id, &s) in ids.iter().zip(&slots) {
        assert_holds_file(&p, m, s as u32, obj(1, id as u32));
    }
    let t = p.telemetry();
    let mv = t.movement.unwrap();
    let extent = 256 * 256 * 4;
    assert_eq!((t.q_run.reads, mv.batches, mv.max_batch), (12, 1, 12), "{mv:?}");
    assert_eq!((mv.sqes, mv.coalesced_sqes, mv.coalesced_extents), (3, 3, 12), "{mv:?}");
    assert_eq!((mv.direct_extents, mv.direct_bytes, mv.window_bytes, t.bytes_copied), (12, 12 * extent, 0, 0), "{mv:?}");
    p.release(1, 0).unwrap();
    // Scattered experts: one read each, still straight into the slots.
    let slots = acq(&mut p, 2, 0, &[0, 9]).unwrap();
    assert_holds_file(&p, m, slots[0] as u32, obj(2, 0));
    assert_holds_file(&p, m, slots[1] as u32, obj(2, 9));
    let mv = p.telemetry().movement.unwrap();
    assert_eq!((mv.sqes, mv.coalesced_sqes, mv.direct_extents), (9, 3, 18), "{mv:?}");
    p.release(2, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_shallow_source_queues_every_bundle_at_once_and_serves_them_at_its_depth() {
    // Depth 3 (one bundle's extents): all four bundles go out in one batch, as three linked
    // chains, so the kernel keeps three reads in flight without the Plan taking completions.
    let m = aligned_model();
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
    let source = crate::source::UringSource::open(&m.path, 4, manifest.window_size, 3).unwrap();
    let mut p = Plan::new(manifest, &spec, Box::new(source)).unwrap();
    let ids = [9, 2, 14, 6];
    let slots = acq(&mut p, 1, 0, &ids).unwrap();
    for (&id, &s) in ids.iter().zip(&slots) {
        assert_holds_file(&p, m, s as u32, obj(1, id as u32));
    }
    let mv = p.telemetry().movement.unwrap();
    assert_eq!((mv.batches, mv.max_batch, mv.sqes, mv.direct_extents), (1, 12, 12, 12), "{mv:?}");
    let st = p.closure().source;
    assert_eq!((st.linked_sqes, st.relinked), (9, 0), "three chains of four: {st:?}");
    p.release(1, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

/// A source of bounded depth over P's reads that logs what the Plan asks of it: each SQE's
/// room is freed when a wait reaps it, as io_uring frees entries.
struct Shallow {
    inner: BufferedSource,
    depth: usize,
    reaped: VecDeque<Completion>,
    log: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl Source for Shallow {
    fn n_windows(&self) -> u32 {
        self.inner.n_windows()
    }

    fn window_size(&self) -> u64 {
        self.inner.window_size()
    }

    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError> {
        self.log.lock().unwrap().push("submit");
        self.inner.submit(req)
    }

    fn room(&self) -> usize {
        self.depth.saturating_sub(self.inner.outstanding())
    }

    fn wait(&mut self) -> Result<Completion, SourceError> {
        self.log.lock().unwrap().push("wait");
        while self.inner.outstanding() > 0 {
            let c = self.inner.wait()?;
            self.reaped.push_back(c);
        }
        self.reaped.pop_front().ok_or(SourceError::NothingOutstanding)
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.reaped.len()
    }

    fn window(&self, w: u32) -> &[u8] {
        self.log.lock().unwrap().push("window");
        self.inner.window(w)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }
}

#[test]
fn room_freed_by_a_wait_is_refilled_before_the_completion_is_verified() {
    // Depth 3, one bundle: the next bundle must be in flight while the CPU hashes the one that
    // arrived, or the device idles for every verification.
    let m = model();
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let inner = BufferedSource::open(&m.path, 4, manifest.window_size).unwrap();
    let source = Shallow { inner, depth: 3, reaped: VecDeque::new(), log: log.clone() };
    let mut p = Plan::new(manifest, &spec, Box::new(source)).unwrap();
    p.expect_digests(digests(), crate::digests::Verify::Xxh3).unwrap();
    let ids = [9, 2, 14, 6];
    let slots = acq(&mut p, 1, 0, &ids).unwrap();
    for (&id, &s) in ids.iter().zip(&slots) {
        assert_holds(&p, s as u32, obj(1, id as u32));
    }
    let log = log.lock().unwrap().clone();
    // A bundle's three extents go out together (three submits), four bundles in all.
    assert_eq!(log.iter().filter(|&&e| e == "submit").count(), 12, "{log:?}");
    let mut i = 0;
    let mut bundles_left = 4;
    while i < log.len() {
        if log[i] == "submit" {
            bundles_left -= 1;
            i += 3;
            continue;
        }
        if log[i] == "wait" && bundles_left > 0 && (i == 0 || log[i - 1] != "wait") {
            // The first wait after a bundle's extents reaped them: the next bundle goes out
            // before any byte is read for verification.
            let next = log[i + 1..].iter().find(|&&e| e != "wait").copied();
            assert_eq!(next, Some("submit"), "at {i}: {log:?}");
        }
        i += 1;
    }
    assert_eq!(bundles_left, 0, "{log:?}");
    p.release(1, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

/// A Plan over the shallow source (one bundle in flight) streaming one-token events (the
/// model's 4 selections) in passes of `per_pass` experts.
fn streaming_plan(policy: &str, n_slots: u32, per_pass: u32) -> Plan {
    let m = model();
    let spec: PolicySpec = policy.parse().unwrap();
    let manifest = Manifest::new(&m.inv, n_slots, &spec.pinned).unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let inner = BufferedSource::open(&m.path, n_slots, manifest.window_size).unwrap();
    let source = Shallow { inner, depth: 3, reaped: VecDeque::new(), log };
    let mut p = Plan::new(manifest, &spec, Box::new(source)).unwrap();
    p.expect_digests(digests(), crate::digests::Verify::Xxh3).unwrap();
    p.stream_token_passes(per_pass);
    p
}

/// Selections of `ids` that pass `pass` served hold their objects' file bytes; the others got -1.
fn assert_served(p: &Plan, layer: u32, ids: &[i32], slots: &[i32], group: &[i32]) {
    for (&id, &s) in ids.iter().zip(slots) {
        if group.contains(&id) {
            assert!(s >= 0, "expert {id} of group {group:?} got no slot: {slots:?}");
            assert_holds(p, s as u32, obj(layer, id as u32));
        } else {
            assert_eq!(s, -1, "expert {id} is not in group {group:?}: {slots:?}");
        }
    }
}

#[test]
fn a_streamed_event_serves_each_pass_while_later_groups_are_still_read() {
    let mut p = streaming_plan("zero", 4, 2);
    let ids = [9, 2, 14, 6];
    let slots = acq(&mut p, 1, 0, &ids).unwrap();
    assert_served(&p, 1, &ids, &slots, &[9, 2]);
    // Pass 0 returned with group 1's reads still out: the engine computes while they land.
    let c = p.closure();
    assert!(c.active_tickets > 0 && c.source_outstanding > 0, "{c:?}");
    assert_eq!(p.slots(1).unwrap().iter().filter(|c| c.state == SlotState::Loading).count(), 2);
    p.release(1, 0).unwrap();
    let slots = acq(&mut p, 1, 1, &ids).unwrap();
    assert_served(&p, 1, &ids, &slots, &[14, 6]);
    p.release(1, 1).unwrap();
    // Every byte was verified; a later event of two selections is not streamed (one group).
    let t = p.telemetry();
    assert_eq!((t.loads, t.digests.as_ref().unwrap().extents), (4, 12));
    let slots = acq(&mut p, 1, 0, &[3, 5, 3, 5]).unwrap();
    assert_served(&p, 1, &[3, 5, 3, 5], &slots, &[3, 5]);
    p.release(1, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_prompt_event_reads_its_next_group_while_the_engine_computes_this_one() {
    // Four slots in passes of two: three tokens with six distinct experts run in three passes,
    // and no more groups are claimed at once than the slots hold.
    let mut p = streaming_plan("zero", 4, 2);
    p.stream_passes(Passes { token: None, prompt: Some(2) });
    let ids = [9, 2, 14, 6, 9, 2, 3, 5, 14, 6, 3, 5];
    let loading = |p: &Plan| p.slots(1).unwrap().iter().filter(|c| c.state == SlotState::Loading).count();
    let s0 = acq(&mut p, 1, 0, &ids).unwrap();
    assert_served(&p, 1, &ids, &s0, &[9, 2]);
    // Group 1 is claimed and its reads are out while the engine computes group 0; group 2 waits.
    assert_eq!(loading(&p), 2);
    assert!(p.closure().source_outstanding > 0, "{:?}", p.closure());
    p.release(1, 0).unwrap();
    let s1 = acq(&mut p, 1, 1, &ids).unwrap();
    assert_served(&p, 1, &ids, &s1, &[14, 6]);
    // Group 0's slots, released, now load group 2.
    assert_eq!(loading(&p), 2);
    let in_use: Vec<i32> = s1.iter().copied().filter(|&s| s >= 0).collect();
    p.release(1, 1).unwrap();
    let s2 = acq(&mut p, 1, 2, &ids).unwrap();
    assert_served(&p, 1, &ids, &s2, &[3, 5]);
    assert!(s2.iter().all(|s| !in_use.contains(s) || *s < 0), "{s2:?} reuses {in_use:?}");
    p.release(1, 2).unwrap();
    let t = p.telemetry();
    assert_eq!((t.loads, t.digests.as_ref().unwrap().extents), (6, 18));
    // A one-token event with no token pass of its own runs in prompt passes too; two distinct
    // experts fit one pass and are not streamed.
    let one = [9, 2, 14, 6];
    let s = acq(&mut p, 2, 0, &one).unwrap();
    assert_served(&p, 2, &one, &s, &[9, 2]);
    p.release(2, 0).unwrap();
    let s = acq(&mut p, 2, 1, &one).unwrap();
    assert_served(&p, 2, &one, &s, &[14, 6]);
    p.release(2, 1).unwrap();
    let s = acq(&mut p, 2, 0, &[3, 5, 3, 5]).unwrap();
    assert_served(&p, 2, &[3, 5, 3, 5], &s, &[3, 5]);
    p.release(2, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_streamed_event_serves_its_resident_experts_first() {
    // Four slots, all cached after the first event. The second event names two misses before
    // the cached 14 and 6: pass 0 serves 14 and 6 where they were, at once, while the misses
    // are read into the slots of 9 and 2 (never of 14 or 6, which pass 0 holds), served by pass 1.
    let mut p = streaming_plan("lru:4", 4, 2);
    let first = [9, 2, 14, 6];
    for pass in 0..2 {
        acq(&mut p, 1, pass, &first).unwrap();
        p.release(1, pass).unwrap();
    }
    let at = |p: &Plan, e: u32| p.slots(1).unwrap().iter().position(|c| c.object == Some(obj(1, e))).map(|s| s as i32);
    let kept: Vec<i32> = [14, 6].iter().map(|&e| at(&p, e).unwrap()).collect();
    let freed: BTreeSet<i32> = [9, 2].iter().map(|&e| at(&p, e).unwrap()).collect();
    let loads = p.telemetry().loads;
    let ids = [1, 3, 14, 6];
    let s0 = acq(&mut p, 1, 0, &ids).unwrap();
    assert_served(&p, 1, &ids, &s0, &[14, 6]);
    assert_eq!(&s0[2..], &kept[..]);
    assert_eq!(p.telemetry().hits, 2);
    p.release(1, 0).unwrap();
    let s1 = acq(&mut p, 1, 1, &ids).unwrap();
    assert_served(&p, 1, &ids, &s1, &[1, 3]);
    assert_eq!(s1[..2].iter().copied().collect::<BTreeSet<i32>>(), freed);
    assert_eq!(p.telemetry().loads, loads + 2);
    p.release(1, 1).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_streamed_event_left_unfinished_fails_closed() {
    let mut p = streaming_plan("zero", 4, 2);
    let ids = [9, 2, 14, 6];
    acq(&mut p, 1, 0, &ids).unwrap();
    p.release(1, 0).unwrap();
    // Another layer before pass 1: refused, and the Plan is failed.
    let e = acq(&mut p, 2, 0, &ids).unwrap_err();
    assert!(e.to_string().contains("pass by pass"), "{e}");
    assert!(p.failure().is_some());
    // Shutdown drains the reads, drops pass 1's consumers and discards the windows.
    let c = p.shutdown().unwrap();
    assert_eq!((c.consumers_live, c.active_tickets, c.source_outstanding), (0, 0, 0), "{c:?}");
    assert_eq!(c.windows_free, c.windows_total);
    // A Plan the engine simply stops using mid-event is failed at shutdown.
    let mut p = streaming_plan("zero", 4, 2);
    acq(&mut p, 1, 0, &ids).unwrap();
    p.release(1, 0).unwrap();
    let c = p.shutdown().unwrap();
    assert!(c.failed.as_deref().is_some_and(|f| f.contains("never served")), "{c:?}");
}

/// The tiny preset with an expert FFN of 258: each F32 expert extent (258 KiB) is not a whole
/// number of pages, so the experts of one tensor start at offsets within a page that alternate.
fn odd_model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| forged("tiny-seed7-ff258.gguf", crate::forge::Dims { expert_ff: 258, ..Preset::Tiny.dims() }))
}

#[test]
fn reads_land_straight_in_slots_at_every_offset_within_a_page() {
    // Alignments 32 (the default), 64 and 4096: every expert of a tensor starts at one offset
    // within a page, so slots placed there take the covering read whole and nothing is copied.
    static A64: OnceLock<Model> = OnceLock::new();
    let a64 = A64.get_or_init(|| forged("tiny-seed7-a64.gguf", crate::forge::Dims { alignment: 64, ..Preset::Tiny.dims() }));
    for m in [model(), a64, aligned_model()] {
        let heads: BTreeSet<u64> = m.inv.objects.iter().flat_map(|o| o.extents.iter().map(|(_, e)| e.offset % 4096)).collect();
        let mut p = uring_plan(m, 4, None, crate::source::fault::FaultCell::None);
        for layer in [0, 1, 2] {
            let ids = [3, 2, 11, 12];
            let slots = acq(&mut p, layer, 0, &ids).unwrap();
            for (&id, &s) in ids.iter().zip(&slots) {
                assert_holds_file(&p, m, s as u32, obj(layer, id as u32));
            }
            p.release(layer, 0).unwrap();
        }
        let t = p.telemetry();
        let mv = t.movement.unwrap();
        assert_eq!(
            (mv.direct_extents, mv.direct_bytes, mv.window_bytes, t.bytes_copied),
            (36, t.q_run.logical_bytes, 0, 0),
            "heads {heads:?}: {mv:?}"
        );
        assert_eq!((mv.host_pools_direct, mv.host_pools_windowed), (9, 0), "{mv:?}");
        assert!(p.shutdown().unwrap().is_clean());
    }
    assert!(model().inv.objects.iter().any(|o| o.extents.iter().any(|(_, e)| e.offset % 4096 != 0)), "the test needs unaligned extents");
}

#[test]
fn pools_whose_offsets_differ_go_through_windows_and_are_counted() {
    // Mixed: with two layer buffers, layers 0 and 2 share pool memory; where their extents'
    // offsets within a page differ, that pool cannot be laid out for both and is filled through
    // windows, while layer 1's pools still take reads straight in. Every byte lands either way.
    let m = model();
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap().with_layer_buffers(2).unwrap();
    let expect: Vec<Option<u64>> =
        [0, 1].iter().flat_map(|&b| [Role::Gate, Role::Up, Role::Down].map(|r| manifest.slot_head(b, r))).collect();
    let windowed = expect.iter().filter(|h| h.is_none()).count() as u64;
    assert!(windowed > 0 && windowed < 6, "the test needs layers whose offsets differ: {expect:?}");
    let source = crate::source::UringSource::open(&m.path, 4, manifest.window_size, 12).unwrap();
    let mut p = Plan::new(manifest, &spec, Box::new(source)).unwrap();
    let mut direct = 0;
    for layer in [0, 1, 2] {
        let slots = acq(&mut p, layer, 0, &[5, 6]).unwrap();
        assert_holds_file(&p, m, slots[0] as u32, obj(layer, 5));
        assert_holds_file(&p, m, slots[1] as u32, obj(layer, 6));
        p.release(layer, 0).unwrap();
        let b = (layer % 2) as usize;
        direct += 2 * expect[3 * b..3 * b + 3].iter().filter(|h| h.is_some()).count() as u64;
    }
    let mv = p.telemetry().movement.unwrap();
    assert_eq!((mv.host_pools_direct, mv.host_pools_windowed), (6 - windowed, windowed), "{mv:?}");
    assert_eq!(mv.direct_extents, direct, "{mv:?}");
    assert!(mv.window_bytes > 0 && mv.direct_bytes > 0, "{mv:?}");
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn unaligned_neighbours_share_their_boundary_block_through_windows() {
    // Expert extents that are not whole pages start at offsets within a page that vary, so no
    // slot layout fits them all: they go through windows. Neighbours share a block; one read
    // carries both; the shared block is copied into the second window; nothing goes direct.
    let m = odd_model();
    assert!(m.inv.objects.iter().any(|o| o.extents.iter().any(|(_, e)| e.offset % 4096 != 0)), "the test needs unaligned extents");
    let mut p = uring_plan(m, 4, None, crate::source::fault::FaultCell::None);
    let ids = [2, 3, 1, 0];
    let slots = acq(&mut p, 0, 0, &ids).unwrap();
    for (&id, &s) in ids.iter().zip(&slots) {
        assert_holds_file(&p, m, s as u32, obj(0, id as u32));
    }
    let t = p.telemetry();
    let mv = t.movement.unwrap();
    assert_eq!((mv.sqes, mv.coalesced_sqes, mv.coalesced_extents, mv.direct_extents), (3, 3, 12, 0), "{mv:?}");
    assert_eq!(mv.window_bytes, t.q_run.logical_bytes);
    // Each file byte was read once: the union of the covering reads, shared blocks counted once.
    let mut covs: Vec<(u64, u64)> = ids
        .iter()
        .flat_map(|&id| {
            p.manifest().object(obj(0, id as u32)).unwrap().extents.iter().map(|e| (e.covering.offset, e.covering.offset + e.covering.len))
        })
        .collect();
    covs.sort();
    let (mut union, mut end) = (0, 0);
    for (a, b) in covs {
        union += b - a.max(end).min(b);
        end = end.max(b);
    }
    assert!(union < t.q_run.physical_bytes, "neighbours share blocks here");
    assert_eq!(p.closure().source.physical_bytes, union);
    p.release(0, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_short_coalesced_read_fails_the_tickets_it_did_not_cover() {
    let m = aligned_model();
    let man = Manifest::new(&m.inv, 4, &[]).unwrap();
    let down1 = man.object(obj(2, 1)).unwrap().extents[2].extent;
    assert_eq!(down1.end() + 14 * down1.len, m.bytes.len() as u64, "layer 2's down is the file's last tensor");
    // The file ends halfway through layer 2's down of expert 1: the vectored read of downs 0
    // and 1 returns down 0 whole and half of down 1.
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &m.bytes[..(down1.offset + down1.len / 2) as usize]).unwrap();
    let mut p = uring_plan(m, 4, Some(&cut), crate::source::fault::FaultCell::None);
    let err = acq(&mut p, 2, 0, &[0, 1]).unwrap_err();
    let PlanError::Rejected { kind: RejectKind::ShortRead, ticket, ref detail } = err else { panic!("{err:?}") };
    assert!(detail.contains(&format!("{} of {}", down1.len / 2, down1.len)), "{detail}");
    assert_eq!(ticket, 6, "down of expert 1 (tickets 1..3 are expert 0's, 4..6 expert 1's)");
    let st = p.closure().source;
    assert_eq!((st.sqes, st.coalesced_sqes), (3, 3), "{st:?}");
    // Expert 0 was whole and may be published; expert 1 never.
    let cells = p.slots(2).unwrap();
    assert!(cells.iter().any(|c| c.object == Some(obj(2, 1)) && c.state == SlotState::Loading), "{cells:?}");
    assert_eq!(p.telemetry().rejections.get(&RejectKind::ShortRead), Some(&1));
    assert_failed_closed_direct(p, 2, Some(obj(2, 0)));
}

/// Nothing of the layer is visible after a rejection on the direct path, and the Plan drains.
fn assert_failed_closed_direct(mut p: Plan, layer: u32, whole: Option<ObjectId>) {
    assert!(p.failure().is_some());
    for c in p.slots(layer).unwrap() {
        let published_ok = c.object.is_some() && c.object == whole && c.state == SlotState::DeviceReady;
        assert!(published_ok || matches!(c.state, SlotState::Vacant | SlotState::Loading), "published after a rejection: {c:?}");
        assert_eq!(c.consumers, 0);
    }
    assert!(matches!(acq(&mut p, layer, 0, &[0]), Err(PlanError::Failed { .. })));
    let c = p.shutdown().unwrap();
    assert_eq!((c.active_tickets, c.source_outstanding, c.consumers_live), (0, 0, 0), "{c:?}");
    assert!(c.balanced() && c.failed.is_some(), "{c:?}");
}

#[test]
fn wrong_object_and_stale_completions_into_slots_are_rejected() {
    use crate::source::fault::FaultCell;
    let m = aligned_model();
    for (cell, kind) in [(FaultCell::WrongObject, RejectKind::WrongObject), (FaultCell::StaleCompletion, RejectKind::StaleEpoch)] {
        let mut p = uring_plan(m, 4, None, cell);
        let err = acq(&mut p, 1, 0, &[3, 4]).unwrap_err();
        assert!(matches!(&err, PlanError::Rejected { kind: k, .. } if *k == kind), "{cell:?}: {err:?}");
        let st = p.closure().source;
        assert_eq!(st.faults_fired, 1);
        assert!(st.host_target_requests >= 1 && st.coalesced_sqes >= 1, "the reads went straight to the slots: {st:?}");
        assert_eq!(p.telemetry().loads, 0);
        assert_failed_closed_direct(p, 1, None);
    }
}

// ---------------------------------------------------------------------------------------------
// Digests: every extent verified against the model's digest manifest as it is read.

fn digests() -> &'static crate::digests::ModelDigests {
    static D: OnceLock<crate::digests::ModelDigests> = OnceLock::new();
    D.get_or_init(|| {
        let m = model();
        crate::digests::ModelDigests::new(crate::digests::build_body(&m.path, &m.inv, 0).unwrap()).unwrap()
    })
}

/// A Plan over the buffered source wrapped in the binary's own fault cell `cell`.
fn plan_faulty(cell: crate::source::fault::FaultCell, verify: bool) -> Plan {
    let m = model();
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
    let inner = BufferedSource::open(&m.path, 2, manifest.window_size).unwrap();
    let mut p = Plan::new(manifest, &spec, crate::source::fault::FaultySource::wrap(Box::new(inner), cell)).unwrap();
    if verify {
        p.expect_digests(digests(), crate::digests::Verify::Xxh3).unwrap();
    }
    p
}

#[test]
fn digest_manifest_matches_the_file() {
    let m = model();
    let d = digests();
    assert_eq!(d.files[0].body.sha256, crate::util::sha256(&m.bytes));
    assert_eq!(d.files[0].body.experts.len(), 3 * 16 * 3);
    for e in d.files[0].body.experts.iter().chain(std::iter::empty()) {
        assert_eq!(
            e.blake3,
            blake3::hash(&m.bytes[e.offset as usize..(e.offset + e.len) as usize]).to_hex().as_str(),
            "{}/{} {}",
            e.layer,
            e.expert,
            e.role
        );
    }
    for t in std::iter::once(&d.files[0].body.header).chain(&d.files[0].body.tensors) {
        assert_eq!(t.blake3, blake3::hash(&m.bytes[t.offset as usize..(t.offset + t.len) as usize]).to_hex().as_str(), "{}", t.name);
    }
    // Every byte of every tensor is in exactly one range.
    let covered: u64 = d.files[0].body.experts.iter().map(|e| e.len).chain(d.files[0].body.tensors.iter().map(|t| t.len)).sum();
    assert_eq!(covered, m.inv.t_repr_bytes);
    assert_eq!(d.files[0].body.header.len, m.inv.data_offset);
}

#[test]
fn verified_reads_count_every_logical_byte() {
    let mut p = plan_faulty(crate::source::fault::FaultCell::None, true);
    let slots = acq(&mut p, 1, 0, &[3, 9]).unwrap();
    assert_group(&p, 1, &[3, 9], &slots, &[3, 9]);
    p.release(1, 0).unwrap();
    let t = p.telemetry().clone();
    let d = t.digests.expect("a Plan with digests reports them");
    assert_eq!(d.manifest_sha256, digests().manifest_sha256);
    assert_eq!((d.extents, d.bytes), (t.q_run.reads, t.q_run.logical_bytes));
    assert!(d.bytes > 0 && d.hash_ns > 0);
    assert!(p.shutdown().unwrap().is_clean());
}

#[test]
fn a_flipped_byte_is_caught_only_by_the_digest() {
    use crate::source::fault::FaultCell;
    // Without the digest check the flipped byte is published: the fault is real and nothing
    // else sees it.
    let mut p = plan_faulty(FaultCell::CorruptByte, false);
    let slots = acq(&mut p, 1, 0, &[6]).unwrap();
    let m = model();
    let e = p.manifest().object(obj(1, 6)).unwrap().extents[0];
    let want = &m.bytes[e.extent.offset as usize..e.extent.end() as usize];
    let got = p.slot_bytes(1, e.role, slots[0] as u32).unwrap();
    let differ: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    assert_eq!(differ, vec![want.len() / 2], "exactly the middle byte of the first extent is flipped");
    assert!(p.telemetry().rejections.is_empty());
    p.release(1, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());

    // With it, the same completion is rejected before anything is copied.
    let mut p = plan_faulty(FaultCell::CorruptByte, true);
    let err = acq(&mut p, 1, 0, &[6]).unwrap_err();
    assert_eq!(p.telemetry().bytes_copied, 0);
    assert!(err.to_string().contains(&digests().manifest_sha256), "{err}");
    assert_failed_closed(p, err, RejectKind::DigestMismatch, 1);
}

#[test]
fn a_manifest_without_the_extent_is_refused() {
    let m = model();
    let mut body = digests().files[0].body.clone();
    body.experts.retain(|e| !(e.layer == 2 && e.expert == 5 && e.role == "up"));
    let partial = crate::digests::ModelDigests::new(body).unwrap();
    let spec: PolicySpec = "zero".parse().unwrap();
    let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
    let inner = BufferedSource::open(&m.path, 1, manifest.window_size).unwrap();
    let mut p = Plan::new(manifest, &spec, Box::new(inner)).unwrap();
    let e = p.expect_digests(&partial, crate::digests::Verify::Xxh3).unwrap_err().to_string();
    assert!(e.contains("object 2/5 up") && e.contains("has no extent"), "{e}");
}

#[test]
fn a_flipped_byte_read_straight_into_a_slot_is_caught_by_the_digest() {
    use crate::source::fault::FaultCell;
    let m = aligned_model();
    let d = crate::digests::ModelDigests::new(crate::digests::build_body(&m.path, &m.inv, 0).unwrap()).unwrap();
    // Without the digest check the flip lands in the slot and is published.
    let mut p = uring_plan(m, 4, None, FaultCell::CorruptByte);
    let slots = acq(&mut p, 1, 0, &[6]).unwrap();
    assert_eq!(p.closure().source.faults_fired, 1);
    assert!(p.telemetry().movement.unwrap().direct_extents > 0);
    // The object's three reads complete in any order; whichever came back first holds the
    // flip, at the middle of its extent, and the other two are the file's bytes.
    let flipped: Vec<_> = (p.manifest().object(obj(1, 6)).unwrap().extents.iter().enumerate())
        .map(|(i, e)| {
            let want = &m.bytes[e.extent.offset as usize..e.extent.end() as usize];
            let got = p.slot_bytes(1, e.role, slots[0] as u32).unwrap();
            (i, (0..want.len()).filter(|&j| got[j] != want[j]).collect::<Vec<_>>(), want.len() / 2)
        })
        .filter(|(_, differ, _)| !differ.is_empty())
        .collect();
    assert!(matches!(flipped.as_slice(), [(_, d, half)] if *d == vec![*half]), "{flipped:?}");
    p.release(1, 0).unwrap();
    assert!(p.shutdown().unwrap().is_clean());
    // With it, the slot's own bytes are hashed and the completion is rejected, by either
    // algorithm, and the record names the one that ran.
    for with in [crate::digests::Verify::Xxh3, crate::digests::Verify::Blake3] {
        let mut p = uring_plan(m, 4, None, FaultCell::CorruptByte);
        p.expect_digests(&d, with).unwrap();
        let err = acq(&mut p, 1, 0, &[6]).unwrap_err();
        assert!(matches!(&err, PlanError::Rejected { kind: RejectKind::DigestMismatch, .. }), "{err:?}");
        assert!(err.to_string().contains(with.name()), "{err}");
        // The message spells both digests in the algorithm's width, and they differ.
        let msg = err.to_string();
        let after = |k: &str| msg.split(k).nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_default().to_string();
        let (got, want) = (after("hash to "), after(" says "));
        let width = if with == crate::digests::Verify::Xxh3 { 32 } else { 64 };
        assert!(got.len() == width && want.len() == width && got != want, "{msg}");
        assert!(got.chars().chain(want.chars()).all(|c| c.is_ascii_hexdigit()), "{msg}");
        assert_eq!(p.telemetry().digests.unwrap().algorithm.as_deref(), Some(with.name()));
        assert_eq!(p.telemetry().loads, 0);
        assert_failed_closed_direct(p, 1, None);
    }
}

#[test]
fn the_manifest_holds_each_extents_xxh3_of_its_own_bytes_and_both_algorithms_pass_clean_reads() {
    let m = model();
    let d = digests();
    // The manifest hashes the file in 4 MiB blocks: some extents span two, so the digest
    // carried across a block is checked against a one-shot digest of a second implementation.
    assert!(d.files[0].body.experts.iter().any(|e| e.offset >> 22 != (e.offset + e.len - 1) >> 22));
    for e in &d.files[0].body.experts {
        let bytes = &m.bytes[e.offset as usize..(e.offset + e.len) as usize];
        assert_eq!(e.xxh3, format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes)), "{}/{} {}", e.layer, e.expert, e.role);
        assert_eq!(e.blake3, blake3::hash(bytes).to_hex().to_string());
    }
    for with in [crate::digests::Verify::Xxh3, crate::digests::Verify::Blake3] {
        let spec: PolicySpec = "zero".parse().unwrap();
        let manifest = Manifest::new(&m.inv, 4, &[]).unwrap();
        let source = BufferedSource::open(&m.path, 4, manifest.window_size).unwrap();
        let mut p = Plan::new(manifest, &spec, Box::new(source)).unwrap();
        p.expect_digests(d, with).unwrap();
        acq(&mut p, 1, 0, &[3, 7]).unwrap();
        let check = p.telemetry().digests.unwrap();
        assert_eq!((check.extents, check.algorithm.as_deref()), (6, Some(with.name())), "{check:?}");
        p.release(1, 0).unwrap();
        assert!(p.shutdown().unwrap().is_clean());
    }
}

#[test]
fn a_warm_reset_keeps_published_experts_and_a_cold_one_empties_every_slot() {
    let policy = "pin:0/3+lru:4";
    let mut p = plan(policy, 4);
    let ids = [3, 5, 7];
    // One request: each layer selects the same experts; every slot holds exactly its bytes.
    let request = |p: &mut Plan| {
        for layer in 0..3 {
            let slots = acq(p, layer, 0, &ids).unwrap();
            for (&e, &s) in ids.iter().zip(&slots) {
                assert_holds(p, s as u32, obj(layer, e as u32));
            }
            p.release(layer, 0).unwrap();
        }
    };
    request(&mut p);
    assert_eq!(p.telemetry().misses, 9);
    p.reset().unwrap();
    request(&mut p);
    assert_eq!((p.telemetry().misses, p.telemetry().hits), (9, 9), "a warm reset keeps what was published");
    let fresh = policy.parse::<PolicySpec>().unwrap().build(p.manifest()).unwrap();
    p.reset_cold(fresh).unwrap();
    for layer in 0..3 {
        assert!(p.slots(layer).unwrap().iter().all(|c| c.state == SlotState::Vacant && c.object.is_none()), "layer {layer}");
    }
    let t = p.telemetry();
    // Every object, the pinned one too, was evicted; none counts as a recycle.
    assert_eq!((t.cold_resets, t.cold_evictions, t.recycles, t.resets, t.epoch), (1, 9, 0, 2, 2));
    request(&mut p);
    assert_eq!((p.telemetry().misses, p.telemetry().hits), (18, 9), "a cold reset loads everything again");
    // Refused while the engine holds a consumer, and the Plan fails closed.
    acq(&mut p, 0, 0, &ids).unwrap();
    let fresh = policy.parse::<PolicySpec>().unwrap().build(p.manifest()).unwrap();
    assert_eq!(p.reset_cold(fresh).unwrap_err(), PlanError::ConsumersLive { consumers: 3 });
    assert!(p.failure().is_some());
    p.release(0, 0).unwrap();
    assert!(p.shutdown().unwrap().balanced());
}
