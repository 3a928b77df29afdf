//! The patched engine boundary on its own: a deliberately simple source (every acquire rereads
//! its experts with pread; no reuse) must give output bitwise identical to resident weights,
//! with fewer slots than a prefill's distinct experts, and a failing acquire must fail closed.

use crate::common;

use anyhow::{bail, ensure, Result};
use common::*;
use sovereign::engine::{ExpertSource, SlotPool};
use sovereign::generate;
use sovereign::inventory::{Extent, Inventory};
use sovereign::plan::report::{OtherSource, SourceDescription, SourceReport};
use sovereign::record::format::{ExpertsParams, ExpertsReport};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Pool {
    pool: SlotPool,
    slot_bytes: usize,
}

struct RereadSource {
    file: File,
    n_slots: u32,
    extents: HashMap<(u32, u32, String), Extent>,
    pools: HashMap<(u32, String), Pool>,
    acquires: Arc<AtomicU64>,
    fail_at: Option<u64>,
    /// Negative control: serve expert e+1's bytes for expert e.
    wrong_object: bool,
}

impl RereadSource {
    fn new(model: &Path, inv: &Inventory, n_slots: u32, acquires: Arc<AtomicU64>, fail_at: Option<u64>) -> Self {
        let mut extents = HashMap::new();
        for o in &inv.objects {
            for (role, e) in &o.extents {
                extents.insert((o.layer, o.expert, role.clone()), *e);
            }
        }
        RereadSource { file: File::open(model).unwrap(), n_slots, extents, pools: HashMap::new(), acquires, fail_at, wrong_object: false }
    }
}

fn role(name: &str) -> &str {
    name.split('.').nth(2).and_then(|r| r.strip_prefix("ffn_")).and_then(|r| r.strip_suffix("_exps")).unwrap()
}

impl ExpertSource for RereadSource {
    fn n_slots(&self) -> u32 {
        self.n_slots
    }

    fn pool(&mut self, layer: u32, name: &str, slot_bytes: usize, _: u32, pool: SlotPool) -> Result<u32> {
        self.pools.insert((layer, role(name).to_string()), Pool { pool, slot_bytes });
        // One buffer per layer: nothing shared.
        Ok(layer)
    }

    fn acquire(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<()> {
        let n = self.acquires.fetch_add(1, Ordering::SeqCst);
        if Some(n) == self.fail_at {
            bail!("injected failure at acquire {n}");
        }
        let mut distinct = Vec::new();
        for &id in ids {
            if !distinct.contains(&id) {
                distinct.push(id);
            }
        }
        let s = self.n_slots as usize;
        let group: Vec<i32> = distinct.iter().copied().skip(pass as usize * s).take(s).collect();
        for (slot, &expert) in group.iter().enumerate() {
            for ((l, r), pool) in &self.pools {
                if *l != layer {
                    continue;
                }
                let served = if self.wrong_object { (expert as u32 + 1) % 16 } else { expert as u32 };
                let e = self.extents[&(layer, served, r.clone())];
                ensure!(e.len as usize == pool.slot_bytes, "slot size mismatch");
                let mut bytes = vec![0u8; pool.slot_bytes];
                self.file.read_exact_at(&mut bytes, e.offset)?;
                pool.pool.write(slot as u32, &bytes)?;
            }
        }
        for (i, id) in ids.iter().enumerate() {
            slots[i] = group.iter().position(|g| g == id).map_or(-1, |p| p as i32);
        }
        Ok(())
    }

    fn release(&mut self, _: u32, _: u32) -> Result<()> {
        Ok(())
    }

    fn describe(&self) -> SourceDescription {
        SourceDescription::Other(OtherSource::new("reread", &[("slots", self.n_slots.into())]))
    }

    fn finish(&mut self) -> Result<SourceReport> {
        Ok(SourceReport::Other(OtherSource::new("reread", &[("acquires", self.acquires.load(Ordering::SeqCst))])))
    }
}

fn with_source(model: &Path, record: &Path, prompt: &str, n: u32, slots: u32, fail_at: Option<u64>) -> Result<u64> {
    let acquires = Arc::new(AtomicU64::new(0));
    let a = acquires.clone();
    generate::run_with(&generate_spec(model, record, prompt, n), move |inv| {
        Ok(Some(Box::new(RereadSource::new(model, inv, slots, a, fail_at)) as Box<dyn ExpertSource>))
    })?;
    let n = acquires.load(Ordering::SeqCst);
    // The record keeps what the source said it was and counted, and reads it back typed.
    let r = sovereign::record::load_generate(record)?;
    let params = r.params.as_ref().map(|p| p.experts.clone());
    assert_eq!(params, Some(ExpertsParams::Other(OtherSource::new("reread", &[("slots", slots.into())]))));
    assert_eq!(r.experts(), Some(&ExpertsReport::Other(OtherSource::new("reread", &[("acquires", n)]))));
    Ok(n)
}

const PROMPT: &str = "A prefill long enough that every layer selects all of its experts.";

#[test]
fn served_experts_are_bitwise_identical_to_resident() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 21, &[]);
    let resident = dir.path().join("resident");
    generate::run(&generate_spec(&m, &resident, PROMPT, 24)).unwrap();
    // tiny: 16 experts, top-4. 16 slots: one pass; 4 slots: four passes per prefill layer and
    // one per decode step; 3 slots: even decode needs two passes.
    for slots in [16, 4, 3] {
        let rec = dir.path().join(format!("s{slots}"));
        let acquires = with_source(&m, &rec, PROMPT, 24, slots, None).unwrap();
        assert!(acquires > 0);
        let r = run(&["compare", "--unsealed", resident.to_str().unwrap(), rec.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{slots} slots:\n{}", r.stdout);
    }
}

#[test]
fn quantized_experts_are_bitwise_identical_to_resident() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 22, &[]);
    for ty in ["q8_0", "q4_k_m"] {
        let q = dir.path().join(format!("{ty}.gguf"));
        ok(&["model", "quantize", "--type", ty, m.to_str().unwrap(), q.to_str().unwrap()]);
        let resident = dir.path().join(format!("{ty}-resident"));
        generate::run(&generate_spec(&q, &resident, PROMPT, 16)).unwrap();
        let rec = dir.path().join(format!("{ty}-served"));
        with_source(&q, &rec, PROMPT, 16, 5, None).unwrap();
        let r = run(&["compare", "--unsealed", resident.to_str().unwrap(), rec.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{ty}:\n{}", r.stdout);
    }
}

#[test]
fn serving_the_wrong_expert_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 24, &[]);
    let resident = dir.path().join("resident");
    generate::run(&generate_spec(&m, &resident, PROMPT, 8)).unwrap();
    let rec = dir.path().join("wrong");
    let acquires = Arc::new(AtomicU64::new(0));
    let model = m.clone();
    generate::run_with(&generate_spec(&m, &rec, PROMPT, 8), move |inv| {
        let mut s = RereadSource::new(&model, inv, 4, acquires, None);
        s.wrong_object = true;
        Ok(Some(Box::new(s) as Box<dyn ExpertSource>))
    })
    .unwrap();
    let r = run(&["compare", "--unsealed", resident.to_str().unwrap(), rec.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stdout.contains("logits    DIFFERS at byte 0"), "{}", r.stdout);
}

#[test]
fn a_failed_acquire_fails_the_decode_closed() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 23, &[]);
    for fail_at in [0, 7, 40] {
        let rec = dir.path().join(format!("f{fail_at}"));
        let err = with_source(&m, &rec, PROMPT, 16, 4, Some(fail_at)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("failed closed") && msg.contains(&format!("injected failure at acquire {fail_at}")), "{msg}");
        // The failure is on record, with nothing accepted; no partial directory is left.
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
        assert_eq!(r["outcome"], "failed");
        assert_eq!(r["counts"]["logits_rows"], 0);
        assert!(!rec.join("logits.bin").exists());
        assert!(!dir.path().join(format!("f{fail_at}.partial")).exists());
    }
}
