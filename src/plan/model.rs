//! Model check (shuttle) of the slot table's publish / consume / recycle / reset protocol:
//! the very `SlotTable` the Plan uses, under shuttle's mutex, driven by a loader, a consumer
//! and a resetter thread, over many explored schedules.
//!
//! Two kinds of evidence per schedule:
//! - the consumer reads the slot's payload (the stand-in for its bytes, written by the loader
//!   before it publishes) right after it consumes and again before it releases: it must be
//!   the version it consumed both times (never before publication, never recycled while held);
//! - the lock records the table state after every critical section; the history must consist
//!   of lifecycle steps only, publish only within the epoch the load began in, keep a held
//!   slot's version, and change the epoch only with no consumer live.

use super::lifecycle::{SlotState, SlotTransition};
use super::table::{Lock, SlotError, SlotTable, TableState};
use super::ObjectId;
use shuttle::sync::atomic::{AtomicU64, Ordering};
use shuttle::sync::{Arc, Mutex};
use shuttle::thread;

/// Shuttle's mutex, recording the protected state after every critical section.
struct Logged<T> {
    inner: Mutex<(T, Vec<T>)>,
}

impl<T: Send + Clone> Lock<T> for Logged<T> {
    fn new(value: T) -> Self {
        Logged { inner: Mutex::new((value.clone(), vec![value])) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut g = self.inner.lock().unwrap();
        let r = f(&mut g.0);
        let snap = g.0.clone();
        g.1.push(snap);
        r
    }
}

impl<T: Clone> Logged<T> {
    fn history(&self) -> Vec<T> {
        self.inner.lock().unwrap().1.clone()
    }
}

type Table = SlotTable<Logged<TableState>>;

const LAYER: u32 = 0;
const SLOTS: u32 = 2;
const EXPERTS: u32 = 3;

fn stamp(object: ObjectId, generation: u64) -> u64 {
    (u64::from(object.expert) + 1) << 32 | generation
}

/// Checks a recorded history; returns the first violation.
fn check_history(h: &[TableState]) -> Result<(), String> {
    for (i, w) in h.windows(2).enumerate() {
        let (a, b) = (&w[0], &w[1]);
        if b.epoch != a.epoch {
            if b.epoch != a.epoch + 1 || a.consumers() != 0 || a.layers != b.layers {
                return Err(format!("step {i}: epoch {} → {} with consumers {} or slot changes", a.epoch, b.epoch, a.consumers()));
            }
            continue;
        }
        for (la, lb) in a.layers.iter().zip(&b.layers) {
            for (s, (ca, cb)) in la.slots.iter().zip(&lb.slots).enumerate() {
                if ca == cb {
                    continue;
                }
                let legal = SlotTransition::ALL.iter().any(|&t| ca.state.next(ca.consumers, t) == Some((cb.state, cb.consumers)));
                if !legal {
                    return Err(format!("step {i} slot {s}: {ca:?} → {cb:?} is no lifecycle step"));
                }
                if ca.consumers > 0 && (ca.object, ca.generation) != (cb.object, cb.generation) {
                    return Err(format!("step {i} slot {s}: held version changed {ca:?} → {cb:?}"));
                }
                if cb.state == SlotState::DeviceReady && ca.state == SlotState::Loading && ca.epoch != a.epoch {
                    return Err(format!("step {i} slot {s}: a load of epoch {} published in epoch {}", ca.epoch, a.epoch));
                }
                if cb.state == SlotState::Loading && (cb.generation != ca.generation + 1 || cb.epoch != a.epoch) {
                    return Err(format!("step {i} slot {s}: a load without a new generation of this epoch"));
                }
                if ca.state != SlotState::Vacant && cb.state != SlotState::Vacant && ca.object != cb.object {
                    return Err(format!("step {i} slot {s}: object changed without eviction"));
                }
            }
            for (e, o) in lb.owner.iter().enumerate() {
                let holder = lb.slots.iter().position(|c| c.object.map(|x| x.expert) == Some(e as u32));
                if *o != holder.map(|p| p as u32) {
                    return Err(format!("step {i}: owner of expert {e} is {o:?}, slots say {holder:?}"));
                }
            }
        }
    }
    Ok(())
}

/// How the loader orders its writes: the protocol, or a broken variant (negative control).
#[derive(Clone, Copy, PartialEq)]
enum Loader {
    WriteThenPublish,
    PublishThenWrite,
}

fn scenario(loader: Loader) {
    let table = Arc::new(Table::new(&[super::LayerShape { layer: LAYER, n_experts: EXPERTS, n_slots: SLOTS }]));
    let payload: Arc<Vec<AtomicU64>> = Arc::new((0..SLOTS).map(|_| AtomicU64::new(0)).collect());
    let obj = |expert| ObjectId { layer: LAYER, expert };

    let l = {
        let (table, payload) = (table.clone(), payload.clone());
        thread::spawn(move || {
            // Load experts 0, 1, 2 into two slots: the third needs a recycled slot.
            for expert in 0..EXPERTS {
                let slot = match table.vacant(0) {
                    Some(s) => s,
                    None => {
                        // Recycle any Recyclable slot; a held one must be refused.
                        let Some(s) = (0..SLOTS).find(|&s| table.evict(0, s).is_ok()) else { continue };
                        s
                    }
                };
                let v = match table.begin_load(0, slot, obj(expert)) {
                    Ok(v) => v,
                    Err(SlotError::Lifecycle(_)) | Err(SlotError::AlreadyResident { .. }) => continue,
                    Err(e) => panic!("begin_load: {e}"),
                };
                if loader == Loader::WriteThenPublish {
                    payload[slot as usize].store(stamp(obj(expert), v.generation), Ordering::SeqCst);
                }
                match table.publish(0, slot, v) {
                    Ok(()) => {}
                    Err(SlotError::StaleEpoch { .. }) => {
                        table.invalidate(0, slot, v).expect("a load retired by reset can be invalidated");
                        continue;
                    }
                    Err(e) => panic!("publish: {e}"),
                }
                if loader == Loader::PublishThenWrite {
                    payload[slot as usize].store(stamp(obj(expert), v.generation), Ordering::SeqCst);
                }
            }
        })
    };
    let c = {
        let (table, payload) = (table.clone(), payload.clone());
        thread::spawn(move || {
            for expert in [0, 1, 2, 0] {
                let Some(slot) = table.find(0, expert) else { continue };
                let Ok(v) = table.consume(0, slot, obj(expert)) else { continue };
                let want = stamp(obj(expert), v.generation);
                assert_eq!(payload[slot as usize].load(Ordering::SeqCst), want, "consumed before publication");
                thread::yield_now();
                assert_eq!(payload[slot as usize].load(Ordering::SeqCst), want, "recycled while held");
                let after = table.release(0, slot, v).expect("release of a held version");
                assert!(matches!(after, SlotState::InUse | SlotState::Recyclable));
            }
        })
    };
    let r = {
        let table = table.clone();
        thread::spawn(move || {
            for _ in 0..2 {
                match table.reset() {
                    Ok(_) | Err(SlotError::ConsumersLive { .. }) => {}
                    Err(e) => panic!("reset: {e}"),
                }
            }
        })
    };
    l.join().unwrap();
    c.join().unwrap();
    r.join().unwrap();
    let end = table.snapshot();
    assert_eq!(end.consumers(), 0);
    assert!(end.layers[0].slots.iter().all(|c| c.state != SlotState::Loading), "a load was left behind: {end:?}");
    if let Err(e) = check_history(&table.lock().history()) {
        panic!("history: {e}");
    }
}

#[test]
fn protocol_holds_under_explored_schedules() {
    shuttle::check_pct(|| scenario(Loader::WriteThenPublish), 3000, 3);
    shuttle::check_random(|| scenario(Loader::WriteThenPublish), 3000);
    shuttle::check_dfs(|| scenario(Loader::WriteThenPublish), Some(20_000));
}

#[test]
fn publishing_before_the_bytes_land_is_caught() {
    // Negative control: a loader that publishes first must fail in some explored schedule.
    let caught = std::panic::catch_unwind(|| shuttle::check_pct(|| scenario(Loader::PublishThenWrite), 3000, 3));
    let payload = caught.expect_err("the model check did not notice publication before movement");
    let msg =
        payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
    assert!(msg.contains("consumed before publication"), "caught for another reason: {msg}");
}

#[test]
fn the_history_check_can_fail() {
    use super::lifecycle::{SlotCell, Version};
    use super::table::LayerSlots;
    let o = ObjectId { layer: 0, expert: 0 };
    let state = |epoch, cell: SlotCell| TableState {
        epoch,
        layers: vec![LayerSlots { layer: 0, slots: vec![cell], owner: vec![cell.object.map(|_| 0)] }],
    };
    let loading = SlotCell { state: SlotState::Loading, object: Some(o), generation: 1, epoch: 0, consumers: 0 };
    let published = SlotCell { state: SlotState::DeviceReady, ..loading };
    let vacant = SlotCell::default();
    let begin = state(0, SlotCell { state: SlotState::Vacant, object: None, generation: 0, ..vacant });
    // Legal: load and publish in one epoch.
    assert_eq!(check_history(&[begin.clone(), state(0, loading), state(0, published)]), Ok(()));
    // A publication after the epoch moved on.
    assert!(check_history(&[begin.clone(), state(0, loading), state(1, loading), state(1, published)]).is_err());
    // A held version replaced.
    let held = SlotCell { state: SlotState::InUse, consumers: 1, ..published };
    let other = SlotCell { generation: 2, ..held };
    assert!(check_history(&[state(0, held), state(0, other)]).is_err());
    // A reset with a consumer live.
    assert!(check_history(&[state(0, held), state(1, held)]).is_err());
    // Not a lifecycle step.
    assert!(check_history(&[begin, state(0, published)]).is_err());
    let _ = Version::default();
}
