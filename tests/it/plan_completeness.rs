//! Pins with prefills larger than the slots: exact against resident, and every selection of
//! every event served by exactly one pass, counted per layer in the record. An engine that
//! builds fewer passes than the Plan forms groups must fail the decode closed.

use crate::common;

use anyhow::Result;
use common::*;
use sovereign::engine::{ExpertSource, SlotPool};
use sovereign::generate;
use sovereign::plan::report::{SourceDescription, SourceReport};
use sovereign::plan::PlanOptions;
use sovereign::service::PlanSource;
use std::path::Path;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog while experts stream from storage into slots.";
const OUTPUTS: u32 = 16;

/// The shape of the model the report used: 3 layers x 12 experts, top-3.
fn model(dir: &Path) -> std::path::PathBuf {
    forge(dir, "m.gguf", 11, &["--layers", "3", "--experts", "12", "--top-k", "3", "--embd", "64", "--expert-ff", "96"])
}

fn record(rec: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
}

/// Every layer: at least one event, served == demanded, and the report says complete.
fn assert_complete(rec: &serde_json::Value, n_layers: usize) {
    let s = &rec["experts"]["selections"];
    assert_eq!(s["complete"], true, "{s}");
    let layers = s["layers"].as_array().unwrap();
    assert_eq!(layers.len(), n_layers, "{s}");
    for l in layers {
        assert!(l["events"].as_u64().unwrap() > 0, "{l}");
        assert!(l["demanded"].as_u64().unwrap() > 0, "{l}");
        assert_eq!(l["served"], l["demanded"], "{l}");
    }
}

#[test]
fn pins_serve_every_selection_and_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let resident = dir.path().join("resident");
    assert_eq!(generate(&m, PROMPT, OUTPUTS, &resident, &[]).code, 0);
    for (name, args) in [
        ("pin1", &["--slots", "4", "--policy", "pin:0/0"][..]),
        ("pin2", &["--slots", "4", "--policy", "pin:0/0,0/1"][..]),
        ("pin-lru", &["--slots", "5", "--policy", "pin:1/2,1/3,2/4+lru:2", "--source", "p"][..]),
    ] {
        let rec = dir.path().join(name);
        let mut extra = vec!["--experts", "plan"];
        extra.extend_from_slice(args);
        let r = generate(&m, PROMPT, OUTPUTS, &rec, &extra);
        assert_eq!(r.code, 0, "{name}: {}{}", r.stdout, r.stderr);
        let c = run(&["compare", resident.to_str().unwrap(), rec.to_str().unwrap()]);
        assert_eq!(c.code, 0, "{name} differs from resident:\n{}", c.stdout);
        let rec = record(&rec);
        assert_eq!(rec["outcome"], "completed");
        assert_complete(&rec, 3);
        // The prefill needs more passes than the slots alone would give (the original fault).
        let passes = rec["experts"]["selections"]["layers"][0]["passes"].as_u64().unwrap();
        let events = rec["experts"]["selections"]["layers"][0]["events"].as_u64().unwrap();
        assert!(passes > events, "{name}: no event ran in passes ({passes} passes, {events} events)");
    }
}

/// A Plan source whose engine is told one pass serves all its slots, as before pins were
/// accounted for: the Plan forms more groups than the engine builds passes.
struct SlotCountPasses(PlanSource);

impl ExpertSource for SlotCountPasses {
    fn n_slots(&self) -> u32 {
        self.0.n_slots()
    }
    fn pool(&mut self, layer: u32, name: &str, slot_bytes: usize, n_slots: u32, pool: SlotPool) -> Result<u32> {
        self.0.pool(layer, name, slot_bytes, n_slots, pool)
    }
    fn acquire(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<()> {
        self.0.acquire(layer, pass, ids, slots)
    }
    fn release(&mut self, layer: u32, pass: u32) -> Result<()> {
        self.0.release(layer, pass)
    }
    fn decoded(&mut self, ok: bool) -> Result<()> {
        self.0.decoded(ok)
    }
    fn describe(&self) -> SourceDescription {
        self.0.describe()
    }
    fn finish(&mut self) -> Result<SourceReport> {
        self.0.finish()
    }
}

#[test]
fn fewer_passes_than_groups_fail_the_decode_closed() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let rec = dir.path().join("short");
    let spec = generate_spec(&m, &rec, PROMPT, OUTPUTS);
    let options = PlanOptions { windows: Some(4), depth: Some(4), ..plan_options("pin:0/0", 4) };
    let e = generate::run_with(&spec, |inv| {
        let s = PlanSource::new(&m, inv, options)?;
        assert_eq!(s.n_per_pass(), 3, "4 slots, one pinned: 3 unpinned per pass");
        Ok(Some(Box::new(SlotCountPasses(s)) as Box<dyn ExpertSource>))
    })
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("incomplete service") && msg.contains("layer 0"), "{msg}");
    let r = record(&rec);
    assert_eq!(r["outcome"], "failed");
    assert!(r["surfaces"].as_object().unwrap().is_empty(), "a failed run keeps no surface");
    let s = &r["experts"]["selections"];
    assert_eq!(s["complete"], false, "{s}");
    assert!(s["error"].as_str().unwrap().contains("incomplete service"), "{s}");
    let l0 = &s["layers"][0];
    assert!(l0["served"].as_u64().unwrap() < l0["demanded"].as_u64().unwrap(), "{l0}");
}
