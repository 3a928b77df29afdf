//! Typed records: records of the first format (tests/data/records, written by the binary
//! before records had types) read back through the typed loader unchanged, their certificates
//! are what that binary printed, and a record the writer makes now reads back to its own bytes.

use crate::common;

use common::*;
use sovereign::record::format::{ExpertsParams, Outcome};
use sovereign::record::{load_generate, load_refine, load_typed, TypedRecord};
use std::path::{Path, PathBuf};
use std::process::Command;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/records").join(name)
}

/// The record re-serialized as a writer commits it, byte for byte against the file.
fn assert_round_trip(dir: &Path) {
    let file = std::fs::read_to_string(dir.join("record.json")).unwrap();
    let typed = load_typed(dir).unwrap_or_else(|e| panic!("{e:#}"));
    let again = serde_json::to_string_pretty(&serde_json::to_value(&typed).unwrap()).unwrap() + "\n";
    if again != file {
        let (a, b): (serde_json::Value, serde_json::Value) = (serde_json::from_str(&file).unwrap(), serde_json::from_str(&again).unwrap());
        panic!("{}: the typed record does not write back the same bytes (JSON-equal: {})\n{again}", dir.display(), a == b);
    }
}

#[test]
fn first_format_records_read_back_unchanged() {
    for name in ["plan_contained", "resident", "plan_fatal", "refine_plan"] {
        assert_round_trip(&data(name));
    }
    let plan = load_generate(&data("plan_contained")).unwrap();
    assert_eq!(plan.outcome, Outcome::Completed);
    let report = plan.plan().expect("a Plan report");
    assert!(report.clean_closure && report.selections.complete);
    assert_eq!(report.telemetry.u_sem_lb.bytes, 27_525_120);
    let res = plan.resources.as_ref().expect("a contained run states its resources");
    assert_eq!(res.authority.host.grade, sovereign::observe::Grade::HardLimit);
    assert_eq!(plan.params.as_ref().unwrap().experts.plan().unwrap().slots, 4);

    let resident = load_generate(&data("resident")).unwrap();
    assert_eq!(resident.params.as_ref().unwrap().experts, ExpertsParams::Resident);
    assert!(resident.experts().is_none());

    let fatal = load_generate(&data("plan_fatal")).unwrap();
    assert_eq!(fatal.outcome, Outcome::Failed);
    assert!(fatal.error.as_deref().unwrap().contains("io_error"), "{:?}", fatal.error);
    assert!(fatal.surfaces.is_empty());

    let refine = load_refine(&data("refine_plan")).unwrap();
    assert_eq!(refine.counts.as_ref().unwrap().prompts, 2);
    assert!(refine.quality().is_some() && refine.reference().is_some() && refine.experts().unwrap().plan().is_some());
    // Each loader takes only its own format, and says which it found.
    let e = format!("{:#}", load_generate(&data("refine_plan")).unwrap_err());
    assert!(e.contains("refine_plan: not a generate record (format \"sovereign.refine/1\")"), "{e}");
    let e = format!("{:#}", load_refine(&data("resident")).unwrap_err());
    assert!(e.contains("resident: not a refine record (format \"sovereign.generate/1\")"), "{e}");
}

#[test]
fn an_unknown_format_or_a_wrong_field_is_one_error_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(data("plan_contained").join("record.json")).unwrap();
    let case = |name: &str, text: String| {
        let dir = t.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("record.json"), text).unwrap();
        let e = format!("{:#}", load_typed(&dir).unwrap_err());
        assert!(e.contains(&format!("{name}/record.json: ")), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    };
    let e = case("future", original.replace("\"sovereign.generate/1\"", "\"sovereign.generate/9\""));
    assert!(e.contains("unknown record format \"sovereign.generate/9\""), "{e}");
    let e = case("grade", original.replacen("\"grade\": \"hard_limit\"", "\"grade\": \"hard_limt\"", 1));
    assert!(e.contains("hard_limt"), "{e}");
    let e = case("counts", original.replace("\"generated_tokens\": 3", "\"generated_tokens\": \"3\""));
    assert!(e.contains("invalid type") && e.contains("line "), "{e}");
    let e = case("plan", original.replace("\"slots_per_layer\": 4", "\"slots_per_layer\": -4"));
    assert!(e.contains("experts: "), "{e}");
    let e = case("truncated", original[..original.len() / 2].to_string());
    assert!(e.contains("not a record"), "{e}");
}

/// `certificate show` of a first-format record prints what the binary that wrote it printed.
#[test]
fn certificate_show_of_first_format_records_is_unchanged() {
    let root = env!("CARGO_MANIFEST_DIR");
    let d = "tests/data/records";
    for (name, extra) in [
        ("plan_contained", vec!["--oracle", "tests/data/records/resident", "--r-policy", "512M", "--g-decl", "0"]),
        ("resident", vec![]),
        ("plan_fatal", vec![]),
    ] {
        for (json, ext) in [(true, "json"), (false, "txt")] {
            let rec = format!("{d}/{name}");
            let mut args = vec!["certificate", "show", rec.as_str()];
            args.extend(&extra);
            if json {
                args.push("--json");
            }
            let out = Command::new(env!("CARGO_BIN_EXE_sovereign")).args(&args).current_dir(root).output().unwrap();
            let want = std::fs::read(Path::new(root).join(d).join(format!("{name}.certificate.{ext}"))).unwrap();
            let mut got = out.stdout.clone();
            if !json {
                got.extend(&out.stderr);
            }
            assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want), "{name} ({ext})");
        }
    }
}

/// Records the writers make now read back through the typed loader to their own bytes.
#[test]
fn new_records_round_trip_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    let m = forge(t.path(), "m.gguf", 5, &[]);
    let plan = t.path().join("plan");
    assert_eq!(
        generate(&m, "typed", 3, &plan, &["--experts", "plan", "--slots", "4", "--source", "f", "--windows", "2", "--depth", "2"]).code,
        0
    );
    let resident = t.path().join("resident");
    assert_eq!(generate(&m, "typed", 3, &resident, &[]).code, 0);
    let fatal = t.path().join("fatal");
    assert_ne!(generate(&m, "typed", 3, &fatal, &["--experts", "plan", "--slots", "4", "--source", "p", "--fault", "eio"]).code, 0);
    let prompts = t.path().join("prompts.txt");
    std::fs::write(&prompts, "one\ntwo\n").unwrap();
    let refine = t.path().join("refine");
    let ms = m.to_str().unwrap();
    ok(&[
        "refine",
        "--base",
        ms,
        "--verifier",
        ms,
        "--reference",
        ms,
        "--prompts",
        prompts.to_str().unwrap(),
        "--n-predict",
        "3",
        "--tau",
        "0.5",
        "--window",
        "2",
        "--verifier-experts",
        "plan",
        "--slots",
        "4",
        "--source",
        "p",
        "--record",
        refine.to_str().unwrap(),
    ]);
    for dir in [&plan, &resident, &fatal, &refine] {
        assert_round_trip(dir);
    }
    assert!(matches!(load_typed(&refine).unwrap(), TypedRecord::Refine(_)));
    assert_eq!(load_generate(&fatal).unwrap().outcome, Outcome::Failed);
}
