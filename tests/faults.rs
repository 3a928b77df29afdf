//! The ten deterministic fault cells through the real engine path, in the same binary that
//! runs the principal experiments: fatal cells fail closed, recoverable ones stay exact.

mod common;

use common::*;

const CELLS: &[&str] = &[
    "short_read",
    "eio",
    "out_of_order",
    "stale_completion",
    "wrong_object",
    "held_consumer",
    "reset_outstanding",
    "shutdown_live_consumer",
    "partial_bundle",
];

fn cell_run(model: &std::path::Path, rec: &std::path::Path, source: &str, cell: &str) -> Run {
    generate(
        model,
        "Deterministic faults, fail closed or stay exact.",
        24,
        rec,
        &["--experts", "plan", "--slots", "5", "--source", source, "--fault", cell],
    )
}

#[test]
fn every_cell_passes_its_validator_through_f_and_p() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 51, &[]);
    for source in ["f", "p"] {
        let control = dir.path().join(format!("{source}-none"));
        assert_eq!(cell_run(&m, &control, source, "none").code, 0);
        let c = run(&["fault-check", "--cell", "none", control.to_str().unwrap()]);
        assert_eq!(c.code, 0, "control: {}", c.stdout);
        for cell in CELLS {
            let rec = dir.path().join(format!("{source}-{cell}"));
            let r = cell_run(&m, &rec, source, cell);
            let check = run(&["fault-check", "--cell", cell, rec.to_str().unwrap(), "--control", control.to_str().unwrap(), "--json"]);
            assert_eq!(check.code, 0, "{source} {cell}: {}\n{}", check.stdout, r.stderr);
            let v: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
            if v["expect"] == "fatal" {
                assert_ne!(r.code, 0, "{cell}: a fatal cell must not report success");
                assert!(r.stderr.contains("failed closed"), "{cell}: rejects, not crashes: {}", r.stderr);
                assert!(!r.stderr.contains("panicked"), "{cell}: {}", r.stderr);
            } else {
                assert_eq!(r.code, 0, "{cell}: {}", r.stderr);
            }
        }
    }
}

#[test]
fn a_cell_that_never_fired_fails_its_validator() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 52, &[]);
    let control = dir.path().join("none");
    assert_eq!(cell_run(&m, &control, "f", "none").code, 0);
    for cell in CELLS {
        let check = run(&["fault-check", "--cell", cell, control.to_str().unwrap(), "--control", control.to_str().unwrap()]);
        assert_eq!(check.code, 1, "{cell} validated a run where it never fired:\n{}", check.stdout);
    }
}
