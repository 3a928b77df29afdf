//! Certificates through the real binary: the seed's C1 figures, and the certificates of forged-
//! model runs under a 64 MiB cap (P fails admission for its limit events; D and F pass; E holds
//! against a resident oracle), and the refusal to pool records of different binaries.

use crate::common;

use common::*;
use serde_json::Value;
use std::path::Path;

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}\n{}", r.stdout, r.stderr))
}

fn predicate<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["evaluation"]["predicates"].as_array().unwrap().iter().find(|p| p["id"] == id).unwrap()
}

fn status(v: &Value, class: &str) -> String {
    v["evaluation"]["classes"][class]["verdict"]["status"].as_str().unwrap().to_string()
}

#[test]
fn certificate_check_seed_c1() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("certificates/seed-c1.yaml");
    let v = json(&ok(&["certificate", "check", file.to_str().unwrap(), "--json"]));
    assert_eq!(v["ok"], true);
    assert_eq!(predicate(&v, "(2)")["margin"], 11_897_783_296u64);
    assert_eq!(predicate(&v, "(3d)")["margin"], 10_301_210_624u64);
    assert_eq!(predicate(&v, "(3)")["margin"], 9_227_468_800u64);
    assert_eq!(status(&v, "r"), "holds");
    assert_eq!(status(&v, "w"), "holds");
    assert_eq!(predicate(&v, "(1)")["verdict"]["status"], "insufficient_evidence");
    let text = ok(&["certificate", "check", file.to_str().unwrap()]).stdout;
    // The text shows (2) with the margin and verdict its --json states.
    let margin = predicate(&v, "(2)")["margin"].as_u64().unwrap();
    assert!(text.contains(&format!("margin {margin}: holds")), "{text}");
    assert!(text.contains("memory-sovereign execution: holds"), "{text}");
}

#[test]
fn certificate_check_reports_insufficient_evidence_and_positions() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("certificates/seed-c1.yaml")).unwrap();
    // Withhold U_sem^LB: W is then insufficient evidence, not a failure, and R still holds.
    let f = dir.path().join("c.yaml");
    std::fs::write(&f, src.replace("u_sem_lb_bytes: 46808432640", "u_sem_lb_bytes: insufficient public evidence")).unwrap();
    let v = json(&ok(&["certificate", "check", f.to_str().unwrap(), "--json"]));
    assert_eq!(status(&v, "w"), "insufficient_evidence");
    assert_eq!(status(&v, "r"), "holds");
    assert_eq!(v["evaluation"]["sovereign_execution"]["status"], "holds", "R suffices");
    assert!(v["evaluation"]["insufficient_public_evidence"].as_array().unwrap().contains(&Value::from("inventory.u_sem_lb_bytes")));
    // A typo is an error at its position.
    std::fs::write(&f, src.replace("  u_sched_bytes:", "  u_schd_bytes:")).unwrap();
    let r = run(&["certificate", "check", f.to_str().unwrap()]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("c.yaml:12:3: ") && r.stderr.contains("u_schd_bytes"), "{}", r.stderr);
}

fn show(rec: &Path, oracle: &Path) -> Value {
    json(&ok(&[
        "certificate",
        "show",
        rec.to_str().unwrap(),
        "--oracle",
        oracle.to_str().unwrap(),
        "--r-policy",
        "0",
        "--g-decl",
        "0",
        "--g-phys",
        "0",
        "--json",
    ]))
}

#[test]
fn certificate_show_p_d_f_runs_under_a_cap() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 1, &["--layers", "4", "--experts", "32"]);
    let oracle = dir.path().join("resident");
    let r = generate(&m, "hello world", 8, &oracle, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let cap = 64u64 << 20;
    for source in ["p", "d", "f"] {
        let rec = dir.path().join(source);
        let r = generate(&m, "hello world", 8, &rec, &["--experts", "plan", "--slots", "4", "--source", source, "--memory-max", "64M"]);
        assert_eq!(r.code, 0, "{source}: {}", r.stderr);
        let v = show(&rec, &oracle);
        let c = &v["certificate"];
        let ev = &v["evaluation"];
        assert_eq!(c["boundaries"]["host"]["bytes"], cap, "{source}");
        assert_eq!(c["boundaries"]["host"]["grade"], "hard_limit", "{source}");
        let t_repr = c["inventory"]["t_repr_bytes"].as_u64().unwrap();
        assert_eq!(predicate(&v, "(2)")["margin"].as_i64().unwrap(), t_repr as i64 - cap as i64, "{source}");
        assert_eq!(status(&v, "r"), "holds", "{source}: {}", ev["classes"]);
        let s = c["inventory"]["managed_bytes"].as_u64().unwrap();
        assert_eq!(predicate(&v, "(1)")["margin"].as_i64().unwrap(), s as i64 - cap as i64, "{source}");
        assert_eq!(status(&v, "e"), "holds", "{source}: {}", ev["classes"]["e"]);
        assert_eq!(ev["classes"]["e"]["class"], "E[all_surfaces, 8]");
        assert_eq!(status(&v, "l"), "holds", "{source}: {}", c["lifecycle"]);
        assert_eq!(c["lifecycle"]["fault_cell"], "none");
        // The transitions named are the ones the run took: F reads straight into its host
        // slots, P and D through their windows.
        let names = c["lifecycle"]["transitions"].to_string();
        let (direct, windowed) = (names.contains("read straight into a Loading slot"), names.contains("read into window"));
        assert_eq!((direct, windowed), (source == "f", source != "f"), "{source}: {names}");
        if source == "p" {
            assert_eq!(ev["resource"]["status"], "fails", "{source}: {}", ev["resource"]);
            let reason = ev["resource"]["reason"].as_str().unwrap();
            assert!(reason.contains("limit events: "), "{reason}");
            assert_eq!(ev["sovereign_execution"]["status"], "fails");
        } else {
            assert_eq!(ev["resource"]["status"], "holds", "{source}: {}", ev["resource"]);
            assert_eq!(ev["sovereign_execution"]["status"], "holds", "{source}: {}", ev["sovereign_execution"]);
        }
        let text = ok(&["certificate", "show", rec.to_str().unwrap(), "--oracle", oracle.to_str().unwrap()]).stdout;
        assert!(text.contains("memory-sovereign execution: "), "{text}");
    }

    // Without an oracle, E lacks evidence; it does not fail.
    let d = dir.path().join("d");
    let v = json(&ok(&["certificate", "show", d.to_str().unwrap(), "--json"]));
    assert_eq!(status(&v, "e"), "insufficient_evidence");
    assert_eq!(v["evaluation"]["sovereign_execution"]["status"], "insufficient_evidence");

    // A record of another binary is never pooled with this one.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    for e in std::fs::read_dir(&oracle).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), other.join(e.file_name())).unwrap();
    }
    let path = other.join("record.json");
    let mut rec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    rec["build"]["binary_sha256"] = Value::from("0".repeat(64));
    std::fs::write(&path, serde_json::to_string_pretty(&rec).unwrap()).unwrap();
    // Sealed again where it lies, as that other binary's `generate --record` would have.
    sovereign::record::prepare_seal(&other).unwrap();
    let r = run(&["certificate", "show", d.to_str().unwrap(), "--oracle", other.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 2, "an error, not a verdict: {}", r.stdout);
    assert!(r.stderr.contains("refusing to pool evidence from different binaries"), "{}", r.stderr);
}

#[test]
fn certificate_show_takes_a_claim_id() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 61, &[]);
    let results = dir.path().join("results");
    std::fs::create_dir_all(&results).unwrap();
    assert_eq!(generate(&m, "claim", 4, &results.join("rec-a"), &["--experts", "plan", "--slots", "4"]).code, 0);
    let ledger = dir.path().join("ledger.json");
    std::fs::write(&ledger, r#"{"format":"sovereign.claims/1","claims":{"c-1":{"statement":"one plan run","records":{"a":"rec-a"}}}}"#)
        .unwrap();
    let r = run(&["certificate", "show", "c-1", "--ledger", ledger.to_str().unwrap(), "--results", results.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let v = json(&r);
    assert_eq!(v["claim"], "c-1");
    assert!(v["records"]["a"]["certificate"].is_object(), "{v}");
    let missing = run(&["certificate", "show", "no-such-claim", "--ledger", ledger.to_str().unwrap()]);
    assert_eq!(missing.code, 2);
    assert!(missing.stderr.contains("no claim `no-such-claim`"), "{}", missing.stderr);
}
