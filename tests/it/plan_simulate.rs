//! `plan simulate` against the real Plan: replaying a run's recorded routes through the
//! simulator gives the hits, loads and bytes that run's own Plan telemetry recorded, for the
//! same slots and policy; the command writes its CSV and figure and refuses bad input in one line.

use crate::common;

use common::*;
use std::path::Path;

const PROMPT: &str = "Experts move from storage into bounded slots; the simulator replays where they went.";

fn simulate(rec: &Path, model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["plan", "simulate", "--routes", rec.to_str().unwrap(), "--model", model.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&args).stdout).unwrap()
}

#[test]
fn simulated_policies_match_the_runs_own_telemetry() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "tiny.gguf", 11, &[]);
    // tiny: 16 experts, top-4: the prefill selects more distinct experts than 5 slots hold
    // (several passes), decode fewer; prefetch loads ahead into the next layer.
    for (slots, policy) in [("5", "lru:3"), ("6", "zero+prefetch"), ("8", "lru:4+prefetch")] {
        let rec = dir.path().join(format!("rec-{slots}-{}", policy.replace([':', '+'], "-")));
        let r = generate(&m, PROMPT, 8, &rec, &["--experts", "plan", "--slots", slots, "--policy", policy]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        let record: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
        let t = &record["experts"]["telemetry"];
        assert!(t["loads"].as_u64().unwrap() > 0);
        let s = simulate(&rec, &m, &["--slots", slots, "--policy", policy]);
        let rows = s["rows"].as_array().unwrap();
        let row = rows.iter().find(|r| r["policy"] == policy).expect("the policy's row");
        let what = format!("slots {slots} {policy}");
        assert_eq!(row["requests"], t["object_requests"], "{what}");
        assert_eq!(row["hits"], t["hits"], "{what}");
        assert_eq!(row["loads"], t["loads"], "{what}");
        assert_eq!(row["prefetch_loads"], t["prefetch_loads"], "{what}");
        assert_eq!(row["prefetch_hits"], t["prefetch_hits"], "{what}");
        // Bytes put into slots: copied from windows, or read straight in.
        let moved = t["bytes_copied"].as_u64().unwrap() + t["movement"]["direct_bytes"].as_u64().unwrap();
        assert_eq!(row["bytes_moved"].as_u64(), Some(moved), "{what}");
        assert_eq!(row["bytes_read"], t["q_run"]["physical_bytes"], "{what}");
        let min = rows.iter().find(|r| r["policy"] == "MIN").unwrap();
        assert!(min["loads"].as_u64() <= row["loads"].as_u64(), "{what}: MIN above the policy");
        assert_eq!(min["requests"], row["requests"]);
    }
}

#[test]
fn simulate_writes_csv_and_figure_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "tiny.gguf", 12, &[]);
    let rec = dir.path().join("resident");
    let r = generate(&m, PROMPT, 8, &rec, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let (csv, svg, png) = (dir.path().join("sim.csv"), dir.path().join("sim.svg"), dir.path().join("sim.png"));
    let rec_s = rec.to_str().unwrap();
    let m_s = m.to_str().unwrap();
    let base = [
        "plan", "simulate", "--routes", rec_s, "--model", m_s, "--slots", "2,4,8,16", "--policy", "zero", "--policy", "lru:4", "--policy",
        "lru:S",
    ];
    let out = ok(&[&base[..], &["--csv", csv.to_str().unwrap(), "--figure", svg.to_str().unwrap()]].concat());
    assert!(out.stdout.contains("MIN"), "{}", out.stdout);
    assert!(out.stdout.contains("refused: lru:4 exceeds the 2 slots"), "{}", out.stdout);
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "policy,slots,requests,hits,loads,prefetch_loads,prefetch_hits,bytes_moved,bytes_read,refused");
    assert_eq!(lines.len(), 1 + 4 * 4, "{text}");
    // With a slot and an LRU place for every expert, LRU and MIN both load each selected
    // object once; a smaller LRU loads more.
    let col = |l: &str, i: usize| l.split(',').nth(i).unwrap().to_string();
    let at16: Vec<&str> = lines.iter().copied().filter(|l| col(l, 1) == "16").collect();
    let find = |p: &str| *at16.iter().find(|l| l.starts_with(&format!("{p},"))).unwrap();
    assert_eq!(col(find("lru:S"), 4), col(find("MIN"), 4), "{text}");
    assert!(col(find("lru:4"), 4).parse::<u64>().unwrap() > col(find("MIN"), 4).parse().unwrap(), "{text}");
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("MIN") && svg_text.contains("lru:4"), "figure");
    ok(&[&base[..], &["--figure", png.to_str().unwrap()]].concat());
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");

    let bad = |extra: &[&str], needles: &[&str]| {
        let r = run(&[&["plan", "simulate", "--slots", "4", "--model", m_s][..], extra].concat());
        assert_one_line_error(&r, needles);
    };
    bad(&["--routes", rec_s, "--policy", "mru:2"], &["--policy", "mru:2"]);
    bad(&["--routes", rec_s, "--policy", "zero", "--figure", "x.pdf"], &["--figure", ".svg"]);
    bad(&["--routes", dir.path().to_str().unwrap(), "--policy", "zero"], &["not a record"]);
    // The record names its model by file name only: without --model it is looked for here, then
    // where this machine hashed the file of its SHA-256, while that file is unchanged.
    let named = |what: &str| {
        let r = run(&["plan", "simulate", "--slots", "4", "--routes", rec_s, "--policy", "zero", "--json"]);
        (r.code == 0).then(|| serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap_or_else(|e| panic!("{what}: {e}"))).ok_or(r)
    };
    assert!(!Path::new("tiny.gguf").exists());
    let found = named("found").unwrap_or_else(|r| panic!("{}", r.stderr));
    assert_eq!(found["model"].as_str(), m.to_str(), "{found}");
    let f = std::fs::File::options().append(true).open(&m).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30)).unwrap();
    drop(f);
    let r = named("changed").expect_err("a file changed since it was hashed is not taken for the record's");
    assert_one_line_error(&r, &["tiny.gguf", "--model"]);
    // A model of another layout is refused.
    let other = dir.path().join("small.gguf");
    ok(&["model", "forge", "--preset", "tiny", "--layers", "2", "--seed", "12", "--out", other.to_str().unwrap()]);
    let r = run(&["plan", "simulate", "--slots", "4", "--routes", rec_s, "--policy", "zero", "--model", other.to_str().unwrap()]);
    assert_one_line_error(&r, &["small.gguf", "differs from record"]);
    // A damaged routes surface is refused by its digest.
    let routes = rec.join("routes.bin");
    let mut bytes = std::fs::read(&routes).unwrap();
    bytes[20] ^= 1;
    std::fs::write(&routes, bytes).unwrap();
    bad(&["--routes", rec_s, "--policy", "zero"], &["routes.bin", "digest"]);
}
