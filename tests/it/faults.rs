//! The deterministic fault cells through the real engine path, in the same binary that
//! runs the principal experiments: fatal cells fail closed, recoverable ones stay exact; a
//! fault campaign's claim carries every cell's validation.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

const CELLS: &[&str] = FAULT_CELLS;

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

/// The shipped faults campaign beside a forged model in `t`, outputs scaled down to 2, the build
/// section set to this build's identity, then `edit` applied; returns the campaign file.
fn shipped_faults(t: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = t.join("campaigns");
    fs::create_dir_all(dir.join("prompts")).unwrap();
    fs::copy(root.join("campaigns/prompts/demo.txt"), dir.join("prompts/demo.txt")).unwrap();
    let text = fs::read_to_string(root.join("campaigns/faults.yaml")).unwrap();
    let (tree, patches) = build_identity();
    let (head, rest) = text.split_at(text.find("build:\n").unwrap());
    let rest = &rest[rest.find("arms:\n").unwrap()..];
    let text = format!("{head}build:\n  engine_tree_sha256: {tree}\n{patches}{rest}")
        .replace("  outputs: 8\n", "  outputs: 2\n")
        .replace("  horizon: 8\n", "  horizon: 2\n");
    let file = dir.join("faults.yaml");
    fs::write(&file, edit(text)).unwrap();
    file
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The campaign's exported ledger as sealed (a plain claim ID from it is anchored by the seal).
fn ledger_of(results: &Path, id: &str, out: &Path) -> (PathBuf, Value) {
    let r = ok(&["export", "--campaign", id, "--results", s(results), "--out", s(out), "--json"]);
    let summary: Value = serde_json::from_str(&r.stdout).unwrap();
    let path = PathBuf::from(summary["ledger"].as_str().unwrap()).join("ledger.json");
    let v = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    (path, v)
}

/// The claim's `fault` entries by record alias.
fn fault_entries(l: &Value, id: &str) -> Vec<Value> {
    l["claims"][id]["replay"].as_array().unwrap().iter().filter_map(|r| r.get("fault").cloned()).collect()
}

fn write_ledger(l: &Value, path: &Path) {
    fs::write(path, serde_json::to_string_pretty(l).unwrap()).unwrap();
}

/// `verify` and `replay` both refuse the claim, naming `needles` on stderr (the ledgers given
/// are rewritten copies: checked for what they say, not for being the published one).
fn refused(ledger: &Path, id: &str, results: &Path, needles: &[&str]) {
    for verb in ["verify", "replay"] {
        let r = run(&[verb, "--claim", id, "--unanchored", "--ledger", s(ledger), "--results", s(results)]);
        assert_eq!(r.code, 1, "{verb} accepted the claim:\n{}{}", r.stdout, r.stderr);
        for n in needles {
            assert!(r.stderr.contains(n), "{verb}: {n:?} not in:\n{}", r.stderr);
        }
    }
}

fn set_fault(l: &mut Value, id: &str, alias: &str, key: &str, value: Value) {
    for r in l["claims"][id]["replay"].as_array_mut().unwrap() {
        if r["fault"]["record"] == alias {
            r["fault"][key] = value.clone();
        }
    }
}

/// `l` with one field of `alias`'s fault entry replaced is refused by verify and replay.
fn refused_with(l: &Value, id: &str, alias: &str, key: &str, value: Value, results: &Path, needles: &[&str]) {
    let mut bad = l.clone();
    set_fault(&mut bad, id, alias, key, value);
    let path = results.with_file_name("forged.json");
    write_ledger(&bad, &path);
    refused(&path, id, results, needles);
}

#[test]
fn the_shipped_fault_campaign_carries_every_cells_validation_into_its_claim() {
    let started = std::time::Instant::now();
    let t = tempfile::tempdir().unwrap();
    fs::create_dir_all(t.path().join("models")).unwrap();
    let model = forge(&t.path().join("models"), "tiny.gguf", 1, &[]);
    let file = shipped_faults(t.path(), |t| t);
    let text = fs::read_to_string(&file).unwrap();
    assert!(text.contains(&format!("sha256: {}", sovereign::util::sha256_file(&model).unwrap())), "faults.yaml names another model");
    let results = t.path().join("results");
    let r = ok(&["campaign", "run", s(&file), "--results", s(&results), "--no-progress"]);
    assert_eq!(r.stderr.matches("validated: sealed").count(), CELLS.len(), "{}", r.stderr);
    let (ledger, l) = ledger_of(&results, "faults-tiny-1", &t.path().join("out"));
    let id = "faults-tiny-1";
    let statement = l["claims"][id]["statement"].as_str().unwrap();
    assert!(statement.ends_with(&format!("{0} fault cells validated, {0} passed", CELLS.len())), "{statement}");
    let faults = fault_entries(&l, id);
    let cells: Vec<&str> = faults.iter().map(|f| f["cell"].as_str().unwrap()).collect();
    assert_eq!(cells, CELLS);
    for f in &faults {
        assert_eq!(f["expect"], serde_json::json!({"passed": true, "failed": []}), "{f}");
        let block = &f["record"].as_str().unwrap()[..3];
        assert_eq!(f["control"], format!("{block}-p0-control"), "{f}");
        // Export draws the timeline of every completed Plan cell (a fail-closed one has none).
        let figure = t.path().join("out").join(format!("timeline-{block}-p0-control.svg"));
        assert!(fs::read_to_string(&figure).is_ok_and(|s| s.contains("<svg")), "{}", figure.display());
    }
    for verb in ["verify", "replay"] {
        let r = ok(&[verb, "--claim", id, "--ledger", s(&ledger), "--results", s(&results)]);
        assert_eq!(r.stdout.matches("  ok   fault b").count(), CELLS.len(), "{}", r.stdout);
    }

    // verify re-hashes the records' models in full on demand: the campaign's model agrees
    // (21 records, one model); a same-named copy with one byte flipped does not.
    let r =
        ok(&["verify", "--claim", id, "--ledger", s(&ledger), "--results", s(&results), "--rehash-models", s(&t.path().join("models"))]);
    assert_eq!(r.stdout.matches("  ok   model b").count(), 1 + 2 * CELLS.len(), "{}", r.stdout);
    let bad = t.path().join("bad");
    fs::create_dir_all(&bad).unwrap();
    let mut bytes = fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(bad.join("tiny.gguf"), bytes).unwrap();
    let r = run(&["verify", "--claim", id, "--ledger", s(&ledger), "--results", s(&results), "--rehash-models", s(&bad.join("tiny.gguf"))]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("tiny.gguf: sha256 ") && r.stderr.contains("; the record names sha256"), "{}", r.stderr);
    assert!(!r.stdout.contains("  ok   model "), "{}", r.stdout);

    // A stated validation the records do not give is refused, and so is another control.
    let stated = serde_json::json!({"passed": false, "failed": ["fault fired"]});
    refused_with(&l, id, "b01-p1-short-read", "expect", stated, &results, &["fault b01-p1-short-read (short_read)", "the ledger states"]);
    refused_with(
        &l,
        id,
        "b03-p1-out-of-order",
        "control",
        "b00-p0-oracle".into(),
        &results,
        &["fault b03-p1-out-of-order", "not the control named here"],
    );
    // Leaving a cell's validation out is refused too.
    let mut bad = l.clone();
    bad["claims"][id]["replay"].as_array_mut().unwrap().retain(|r| r["fault"]["record"] != "b05-p1-wrong-object");
    let path = t.path().join("dropped.json");
    write_ledger(&bad, &path);
    refused(&path, id, &results, &["fault b05-p1-wrong-object (wrong_object)", "without its validation"]);

    // A fatal cell whose record shows output, re-sealed with a cell.json and a ledger that state
    // its validation honestly: the claim still fails, the failing checks named.
    let sealed = |alias: &str| results.join(l["claims"][id]["records"][alias].as_str().unwrap());
    let (fatal, control) = (sealed("b01-p1-short-read"), sealed("b01-p0-control"));
    let copy = t.path().join("staging-forged");
    fs::create_dir_all(&copy).unwrap();
    for dir in [&control, &fatal] {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let to = copy.join(e.file_name());
            let _ = fs::remove_file(&to);
            fs::copy(e.path(), &to).unwrap();
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&to, fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let mut rec: Value = serde_json::from_str(&fs::read_to_string(fatal.join("record.json")).unwrap()).unwrap();
    let ctl: Value = serde_json::from_str(&fs::read_to_string(control.join("record.json")).unwrap()).unwrap();
    rec["counts"] = ctl["counts"].clone();
    rec["surfaces"] = ctl["surfaces"].clone();
    fs::write(copy.join("record.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
    let (v, detail) = sovereign::oracle::fault::verdict(sovereign::source::fault::FaultCell::ShortRead, &copy, Some(&control));
    for check in ["zero tokens accepted", "zero logits accepted", "no output surfaces"] {
        assert!(v.failed.iter().any(|f| f == check), "{check}: {detail}");
    }
    let mut cell: Value = serde_json::from_str(&fs::read_to_string(copy.join("cell.json")).unwrap()).unwrap();
    cell["fault"]["validation"] = serde_json::to_value(&v).unwrap();
    fs::write(copy.join("cell.json"), serde_json::to_vec(&cell).unwrap()).unwrap();
    let resealed = sovereign::record::seal(&copy, &results).unwrap();
    let mut honest = l.clone();
    honest["claims"][id]["records"]["b01-p1-short-read"] = resealed.digest.clone().into();
    set_fault(&mut honest, id, "b01-p1-short-read", "expect", serde_json::to_value(&v).unwrap());
    let path = t.path().join("honest.json");
    write_ledger(&honest, &path);
    // verify names the failing checks beside the journal, which never sealed the re-sealed
    // record; replay recomputes nothing from a campaign whose journal disagrees.
    let journal = "but the journal never sealed it";
    for (verb, needles) in [
        ("verify", &["fault b01-p1-short-read (short_read)", "zero tokens accepted", "no output surfaces", journal][..]),
        ("replay", &[journal][..]),
    ] {
        let r = run(&[verb, "--claim", id, "--unanchored", "--ledger", s(&path), "--results", s(&results)]);
        assert_eq!(r.code, 1, "{verb} accepted the claim:\n{}{}", r.stdout, r.stderr);
        for n in needles {
            assert!(r.stderr.contains(n), "{verb}: {n:?} not in:\n{}", r.stderr);
        }
    }
    eprintln!("shipped fault campaign + checks: {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn a_fault_cell_that_never_fires_fails_the_campaign_claim() {
    // One layer: a held consumer is only ever followed by its own layer, so the cell never fires
    // and the run completes exact.
    let t = tempfile::tempdir().unwrap();
    fs::create_dir_all(t.path().join("models")).unwrap();
    let model = forge(&t.path().join("models"), "one.gguf", 1, &["--layers", "1"]);
    let sha = sovereign::util::sha256_file(&model).unwrap();
    let file = shipped_faults(t.path(), |text| {
        let (head, _) = text.split_at(text.find("    preordered:\n").unwrap());
        let tail = &text[text.find("oracle:\n  arm").unwrap()..];
        let model_sha = &text[text.find("  sha256: ").unwrap() + 10..][..64];
        format!("{head}    preordered:\n      - [control, held-consumer]\n{tail}")
            .replace("id: faults-tiny-1", "id: faults-one-layer")
            .replace(model_sha, &sha)
            .replace("path: ../models/tiny.gguf", "path: ../models/one.gguf")
            .replace("forge: { preset: tiny, seed: 1 }", "forge: { preset: tiny, seed: 1, layers: 1 }")
    });
    let results = t.path().join("results");
    let r = ok(&["campaign", "run", s(&file), "--results", s(&results), "--no-progress"]);
    assert!(
        r.stderr.contains("b01-p1-held-consumer completed") && r.stderr.contains("FAILED its validation (fault fired)"),
        "{}",
        r.stderr
    );
    let id = "faults-one-layer";
    let (ledger, l) = ledger_of(&results, id, &t.path().join("out"));
    let statement = l["claims"][id]["statement"].as_str().unwrap();
    assert!(statement.ends_with("1 fault cells validated, 0 passed, failed: b01-p1-held-consumer (fault fired)"), "{statement}");
    let faults = fault_entries(&l, id);
    assert_eq!(faults.len(), 1);
    assert_eq!(faults[0]["expect"], serde_json::json!({"passed": false, "failed": ["fault fired"]}));
    refused(&ledger, id, &results, &["fault b01-p1-held-consumer (held_consumer)", "fault fired (0)"]);
    // Stating that it passed does not help.
    let stated = serde_json::json!({"passed": true, "failed": []});
    refused_with(&l, id, "b01-p1-held-consumer", "expect", stated, &results, &["fault fired (0)", "the ledger states"]);
    // The validator of one cell run on another cell's record fails too.
    let other = "reset_outstanding".into();
    refused_with(
        &l,
        id,
        "b01-p1-held-consumer",
        "cell",
        other,
        &results,
        &["fault b01-p1-held-consumer (reset_outstanding)", "not reset_outstanding"],
    );
}
