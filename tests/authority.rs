//! Seed 000's admission result in miniature, through the real binary and real cgroups: under a
//! hard host cap below the expert bytes, P completes exact but at the ceiling (page cache
//! charged), D and F complete exact with zero limit events and a positive margin.

mod common;

use common::*;
use std::path::Path;


fn contained(model: &Path, rec: &Path, cap: &str, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["--memory-max", cap, "--sample-ms", "20"];
    args.extend_from_slice(extra);
    let r = generate(model, "Bounded memory, exact output.", 12, rec, &args);
    let rec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    (r.code, rec)
}

fn no_run_cgroups_left() {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = own.lines().find_map(|l| l.strip_prefix("4:memory:").or_else(|| l.split(":memory:").nth(1))).unwrap_or("/");
    for base in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        let dir = Path::new(base).join(path.trim_start_matches('/'));
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let left: Vec<_> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("sovereign-{}-", std::process::id())) || n.starts_with("sovereign-"))
                .filter(|n| {
                    // Only cgroups of harnesses that are gone count as leftovers.
                    let pid: u32 = n.split('-').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
                    !Path::new(&format!("/proc/{pid}")).exists()
                })
                .collect();
            assert!(left.is_empty(), "leftover run cgroups in {}: {left:?}", dir.display());
        }
    }
}

#[test]
fn p_hits_the_ceiling_while_d_and_f_stay_under_it() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 4 layers x 32 experts: 96 MiB of experts; 4 slots hold 12 MiB. Cap: 64 MiB, which leaves
    // P's page cache room to be reclaimed from rather than an OOM kill on a busy machine.
    let m = forge(dir.path(), "m.gguf", 41, &["--layers", "4", "--experts", "32"]);
    let cap = 64u64 << 20;
    // Page cache is charged to whoever touches it first: an uncontained run first brings this
    // binary's code pages in, so that no contained run is charged for the executable itself.
    let warm = generate(&m, "warm", 2, &dir.path().join("warm"), &["--experts", "plan", "--slots", "4"]);
    assert_eq!(warm.code, 0, "{}", warm.stderr);
    let mut recs = Vec::new();
    for source in ["p", "d", "f"] {
        let rec = dir.path().join(source);
        let (code, r) = contained(&m, &rec, "64M", &["--experts", "plan", "--slots", "4", "--source", source]);
        assert_eq!(r["outcome"], "completed", "{source}: {}", r["error"]);
        let res = &r["resources"];
        assert_eq!(res["host"]["limit"], cap, "{source}");
        assert_eq!(res["authority"]["host"]["grade"]["grade"], "hard_limit", "{source}: {}", res["authority"]);
        assert_eq!(res["authority"]["gpu"]["grade"]["grade"].as_str().is_some(), true);
        assert!(r["cache_protocol"].as_str().unwrap().starts_with("cold"));
        let events = res["host"]["limit_events"].as_u64().unwrap();
        let margin = res["authority"]["host"]["margin"].as_i64().unwrap();
        if source == "p" {
            assert!(events > 0, "P must be charged its page cache and hit the limit");
            assert_eq!(res["admission"]["admitted"], false);
            assert_eq!(code, 0, "P still completes");
            let anon = res["host"]["stat_at_peak"]["anon"].as_u64().unwrap();
            assert!(anon < cap, "P's own (anonymous) memory {anon} stays below the cap: the rest is page cache");
        } else {
            assert_eq!(events, 0, "{source}: limit events");
            assert!(margin > 0, "{source}: margin {margin}");
            assert_eq!(res["admission"]["admitted"], true, "{source}: {}", res["admission"]);
        }
        recs.push(rec);
    }
    for pair in recs.windows(2) {
        let r = run(&["compare", pair[0].to_str().unwrap(), pair[1].to_str().unwrap()]);
        assert_eq!(r.code, 0, "{}", r.stdout);
    }
    no_run_cgroups_left();
}

#[test]
fn a_cap_below_the_need_is_an_oom_on_record() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 42, &[]);
    let rec = dir.path().join("oom");
    let (code, r) = contained(&m, &rec, "8M", &[]);
    assert_eq!(code, 1);
    assert_eq!(r["outcome"], "failed");
    let res = &r["resources"];
    assert!(res["host"]["oom_kills"].as_u64().unwrap() >= 1, "{}", res["host"]);
    assert!(res["status"]["signal"].as_i64().is_some() || res["status"]["code"] != 0, "{}", res["status"]);
    assert_eq!(res["admission"]["admitted"], false);
    assert!(res["host"]["removed"] == true, "{}", res["host"]);
    no_run_cgroups_left();
}
