//! Campaigns on a real one-node Slurm cluster (scripts/slurm.sh: munge, slurmctld, slurmd):
//! the shipped exactness campaign as a job array, sealed exactly once, verified and replayed;
//! a task cancelled mid-cell, resumed, and the same again. No mock of sbatch.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Starts the cluster once for this test binary (idempotent); its SLURM_CONF, or None (skipped).
fn cluster() -> Option<String> {
    static CONF: OnceLock<Result<String, String>> = OnceLock::new();
    let r = CONF.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("starting slurmd needs root".into());
        }
        let out = Command::new(Path::new(ROOT).join("scripts/slurm.sh")).arg("start").output().map_err(|e| format!("scripts/slurm.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!("scripts/slurm.sh start failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
        }
        let env = Command::new(Path::new(ROOT).join("scripts/slurm.sh")).arg("env").output().unwrap();
        let line = String::from_utf8_lossy(&env.stdout).trim().to_string();
        Ok(line.strip_prefix("export SLURM_CONF=").expect("slurm.sh env prints the config").to_string())
    });
    match r {
        Ok(c) => Some(c.clone()),
        Err(why) => {
            skip(&test_name(), why);
            None
        }
    }
}

struct Cluster {
    conf: String,
}

impl Cluster {
    fn sovereign(&self, args: &[&str]) -> Run {
        let out = bin().args(args).env("SLURM_CONF", &self.conf).output().expect("spawn sovereign");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
    fn ok(&self, args: &[&str]) -> Run {
        let r = self.sovereign(args);
        assert_eq!(r.code, 0, "sovereign {args:?} failed:\n{}\n{}", r.stdout, r.stderr);
        r
    }
    fn slurm(&self, cmd: &str, args: &[&str]) -> String {
        let out = Command::new(cmd).args(args).env("SLURM_CONF", &self.conf).output().unwrap();
        assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// This build's `build:` section of a campaign file.
fn build_section() -> String {
    let v: Value = serde_json::from_str(&ok(&["build-info", "--json"]).stdout).unwrap();
    let patches: String = v["engine"]["patches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("    - name: {}\n      sha256: {}\n", p["name"].as_str().unwrap(), p["sha256"].as_str().unwrap()))
        .collect();
    let patches = if patches.is_empty() { "  patches: []\n".to_string() } else { format!("  patches:\n{patches}") };
    format!("build:\n  engine_tree_sha256: {}\n{patches}", v["engine"]["tree_sha256"].as_str().unwrap())
}

/// The shipped exactness campaign beside its forged model, with this build's identity (a
/// campaign names the build it runs on); `edit` may change the text further (a new id).
fn shipped(tmp: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let dir = tmp.join("campaigns");
    fs::create_dir_all(dir.join("prompts")).unwrap();
    fs::copy(Path::new(ROOT).join("campaigns/prompts/demo.txt"), dir.join("prompts/demo.txt")).unwrap();
    fs::create_dir_all(tmp.join("models")).unwrap();
    forge(&tmp.join("models"), "tiny.gguf", 1, &[]);
    let file = dir.join("exactness.yaml");
    let text = fs::read_to_string(Path::new(ROOT).join("campaigns/exactness.yaml")).unwrap();
    let (head, rest) = text.split_at(text.find("\nbuild:\n").expect("a build section") + 1);
    let tail = &rest[rest.find("\narms:\n").expect("arms after build") + 1..];
    fs::write(&file, edit(format!("{head}{}{tail}", build_section()))).unwrap();
    file
}

/// Every journal of the campaign (the local runner's and one per block task), line by line.
fn journals(results: &Path, id: &str) -> Vec<Value> {
    let root = results.join("campaigns").join(id);
    let mut files = vec![root.join("journal.jsonl")];
    if let Ok(rd) = fs::read_dir(root.join("journals")) {
        files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "jsonl")));
    }
    files.iter().flat_map(|f| fs::read_to_string(f).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect::<Vec<Value>>()).collect()
}

fn count(j: &[Value], kind: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in j.iter().filter(|e| e["event"] == kind) {
        *m.entry(e["cell"].as_str().unwrap().to_string()).or_insert(0) += 1;
    }
    m
}

fn files_under(p: &Path) -> usize {
    fs::read_dir(p).map_or(0, |rd| rd.flatten().map(|e| if e.path().is_dir() { files_under(&e.path()) + 1 } else { 1 }).sum())
}

fn status(c: &Cluster, file: &Path, results: &Path) -> Value {
    serde_json::from_str(&c.ok(&["campaign", "status", s(file), "--results", s(results), "--json"]).stdout).unwrap()
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// No block task of the campaign is pending or running any more.
/// The shipped exactness campaign under its own id, with cells long enough to be ended
/// mid-run, submitted to the cluster; returns the campaign file and the results root.
fn submit_long(c: &Cluster, tmp: &Path, id: &str) -> (PathBuf, PathBuf) {
    let file = shipped(tmp, |t| t.replace("id: exactness-resident-1", &format!("id: {id}")).replace("outputs: 16", "outputs: 400").replace("horizon: 16", "horizon: 400"));
    let results = tmp.join("results");
    c.ok(&["campaign", "run", s(&file), "--executor", "slurm", "--results", s(&results), "--time", "20"]);
    (file, results)
}

/// Waits until some block's task has started its first cell (its journal ends in that
/// cell_started) and returns the block and the cell.
fn first_cell_started(results: &Path, id: &str) -> (usize, String) {
    let jdir = results.join("campaigns").join(id).join("journals");
    let mut victim = None;
    wait_until("a block's first cell to start", 600, || {
        for b in 1..=3 {
            let text = fs::read_to_string(jdir.join(format!("b{b:02}.jsonl"))).unwrap_or_default();
            if let Some(last) = text.lines().last().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
                if last["event"] == "cell_started" && last["cell"].as_str().unwrap().contains("-p0-") {
                    victim = Some((b, last["cell"].as_str().unwrap().to_string()));
                    return true;
                }
            }
        }
        false
    });
    victim.unwrap()
}

fn idle(v: &Value) -> bool {
    v["blocks"].as_array().unwrap().iter().all(|b| !matches!(b["slurm"].as_str().unwrap(), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"))
}

/// Every cell sealed exactly once, every record verifies, nothing left in staging; then
/// export, verify and replay of the draft ledger pass. Returns the journals.
fn check_finished(c: &Cluster, file: &Path, results: &Path, id: &str, cells: usize) -> Vec<Value> {
    let j = journals(results, id);
    let sealed = count(&j, "cell_sealed");
    assert_eq!(sealed.len(), cells, "sealed cells: {sealed:?}");
    assert!(sealed.values().all(|n| *n == 1), "a cell was sealed twice: {sealed:?}");
    let records: Vec<PathBuf> =
        fs::read_dir(results).unwrap().flatten().map(|e| e.path()).filter(|p| p.file_name().unwrap().len() == 64).collect();
    assert_eq!(records.len(), cells, "records: {records:?}");
    for r in &records {
        sovereign::record::verify_record(r).unwrap_or_else(|e| panic!("{e:#}"));
    }
    for e in j.iter().filter(|e| e["event"] == "cell_sealed") {
        assert_eq!(e["status"], "completed", "{e}");
        assert_ne!(e["exact"], Value::Bool(false), "{e}");
    }
    let staging = results.join("campaigns").join(id).join("staging");
    assert_eq!(fs::read_dir(&staging).map_or(0, |rd| rd.flatten().filter(|e| files_under(&e.path()) > 0 || e.path().is_file()).count()), 0);
    let v = status(c, file, results);
    assert_eq!(v["finished"], true, "{v}");

    let out = results.join("export");
    let claim = anchored_claim(&c.ok(&["export", "--campaign", id, "--results", s(results), "--out", s(&out)]).stdout, id);
    let ledger = out.join("claims.json");
    assert!(c.ok(&["verify", "--claim", &claim, "--ledger", s(&ledger), "--results", s(results)]).stdout.contains("verify passed"));
    let r = c.ok(&["replay", "--claim", &claim, "--ledger", s(&ledger), "--results", s(results)]);
    assert!(r.stdout.contains("paired ratio") && r.stdout.contains("replay passed"), "{}", r.stdout);

    // Every record names this node, and the tables carry it.
    let info: Value = serde_json::from_str(&ok(&["build-info", "--json"]).stdout).unwrap();
    let node = info["node"].as_str().map(str::to_string).unwrap_or_else(|| info["node"]["id"].as_str().unwrap().to_string());
    assert_eq!(node.len(), 64);
    let mut rd = csv::Reader::from_path(out.join("cells.csv")).unwrap();
    let col = rd.headers().unwrap().iter().position(|h| h == "node").expect("a node column");
    let nodes: Vec<String> = rd.records().map(|r| r.unwrap()[col].to_string()).collect();
    assert_eq!(nodes, vec![node.clone(); cells]);
    let mut rd = csv::Reader::from_path(out.join("pairs.csv")).unwrap();
    let h = rd.headers().unwrap().clone();
    let (ia, ib) = (h.iter().position(|x| x == "a_node").unwrap(), h.iter().position(|x| x == "b_node").unwrap());
    for r in rd.records() {
        let r = r.unwrap();
        assert_eq!((&r[ia], &r[ib]), (node.as_str(), node.as_str()));
    }
    j
}

#[test]
fn shipped_exactness_campaign_as_a_job_array() {
    let Some(conf) = cluster() else { return };
    let c = Cluster { conf };
    let tmp = tempfile::tempdir().unwrap();
    let file = shipped(tmp.path(), |t| t);
    let results = tmp.path().join("results");
    let started = Instant::now();
    let r = c.ok(&["campaign", "run", s(&file), "--executor", "slurm", "--results", s(&results), "--time", "10", "--json"]);
    let sub: Value = serde_json::from_str(&r.stdout).unwrap();
    // The lead block (the oracle) is its own job; the three blocks are one array after it.
    let jobs = sub["submitted"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{sub}");
    assert_eq!(jobs[0]["blocks"], serde_json::json!([0]));
    assert_eq!(jobs[1]["blocks"], serde_json::json!([1, 2, 3]));
    assert_eq!(jobs[1]["after"], jobs[0]["job"]);
    // Submitting again while the tasks are queued submits nothing.
    let again: Value = serde_json::from_str(&c.ok(&["campaign", "run", s(&file), "--executor", "slurm", "--results", s(&results), "--json"]).stdout).unwrap();
    assert!(again["submitted"].as_array().unwrap().is_empty(), "{again}");

    wait_until("the campaign to finish", 600, || {
        let v = status(&c, &file, &results);
        v["finished"] == true && idle(&v)
    });
    eprintln!("shipped exactness campaign on Slurm: 7 cells in {:.1} s", started.elapsed().as_secs_f64());
    let j = check_finished(&c, &file, &results, "exactness-resident-1", 7);
    assert!(count(&j, "cell_discarded").is_empty());
    // Each block's cells were journaled by that block's task, both arms of a pair in one task.
    let v = status(&c, &file, &results);
    for b in v["blocks"].as_array().unwrap() {
        assert_eq!(b["slurm"], "COMPLETED", "{b}");
        assert_eq!(b["settled"], b["cells"]);
    }
    let text = c.ok(&["campaign", "status", s(&file), "--results", s(&results)]).stdout;
    assert!(text.contains("blocks on Slurm:") && text.contains("COMPLETED"), "{text}");
    // Resume finds nothing to submit: no sealed cell runs again.
    let r: Value = serde_json::from_str(&c.ok(&["campaign", "resume", s(&file), "--executor", "slurm", "--results", s(&results), "--json"]).stdout).unwrap();
    assert!(r["submitted"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(r["settled_blocks"], serde_json::json!([0, 1, 2, 3]));
    // A cluster that cannot be asked (no controller configuration here): status still shows
    // every cell from the journal and says the cluster could not be asked.
    let unreachable = Cluster { conf: tmp.path().join("no-such-slurm.conf").display().to_string() };
    let v: Value = serde_json::from_str(&unreachable.ok(&["campaign", "status", s(&file), "--results", s(&results), "--json"]).stdout).unwrap();
    assert_eq!((&v["finished"], &v["counts"]["sealed"]), (&Value::Bool(true), &serde_json::json!(7)), "{v}");
    assert!(v["cluster_unreachable"].as_str().is_some_and(|w| w.contains("squeue")), "{v}");
    let text = unreachable.ok(&["campaign", "status", s(&file), "--results", s(&results)]).stdout;
    assert!(text.contains("the cluster could not be asked") && text.contains("7 sealed"), "{text}");
}

#[test]
fn a_cancelled_task_leaves_no_half_record_and_resume_reruns_only_its_block() {
    let Some(conf) = cluster() else { return };
    let c = Cluster { conf };
    let tmp = tempfile::tempdir().unwrap();
    let id = "exactness-cancel";
    let (file, results) = submit_long(&c, tmp.path(), id);

    // Cancel a block's task while its first cell runs (its journal ends in that cell_started).
    let (block, _) = first_cell_started(&results, id);
    let v = status(&c, &file, &results);
    let task = v["blocks"][block]["task"].as_str().unwrap().to_string();
    assert_eq!(v["blocks"][block]["slurm"], "RUNNING", "{v}");
    c.slurm("scancel", &[&task]);
    wait_until("the other tasks to end", 600, || idle(&status(&c, &file, &results)));

    // No half record: the cell killed mid-run has no cell_sealed and no record; its block is
    // unsettled.
    let v = status(&c, &file, &results);
    assert_eq!(v["blocks"][block]["slurm"], "CANCELLED", "{v}");
    assert!(v["blocks"][block]["settled"].as_u64().unwrap() < 2, "{v}");
    let j = journals(&results, id);
    let (started, sealed) = (count(&j, "cell_started"), count(&j, "cell_sealed"));
    let dangling: Vec<&String> = started.keys().filter(|k| !sealed.contains_key(*k)).collect();
    assert_eq!(dangling.len(), 1, "one cell was killed mid-run: started {started:?}, sealed {sealed:?}");
    let cell = dangling[0].clone();
    assert!(cell.starts_with(&format!("b{block:02}-")), "{cell}");
    assert!(!count(&j, "cell_sealed").contains_key(&cell), "{cell} sealed although cancelled");
    let records = fs::read_dir(&results).unwrap().flatten().filter(|e| e.file_name().len() == 64).count();
    assert_eq!(records, count(&j, "cell_sealed").len());
    let text = c.ok(&["campaign", "status", s(&file), "--results", s(&results)]).stdout;
    assert!(text.contains("CANCELLED"), "{text}");

    // Resume submits that block only, and its cell runs again after the discarded attempt.
    let r: Value = serde_json::from_str(&c.ok(&["campaign", "resume", s(&file), "--executor", "slurm", "--results", s(&results), "--json"]).stdout).unwrap();
    let sub = r["submitted"].as_array().unwrap();
    assert_eq!(sub.len(), 1, "{r}");
    assert_eq!(sub[0]["blocks"], serde_json::json!([block]), "{r}");
    wait_until("the resumed block to finish", 600, || {
        let v = status(&c, &file, &results);
        v["finished"] == true && idle(&v)
    });
    let j = check_finished(&c, &file, &results, id, 7);
    assert_eq!(count(&j, "cell_discarded").get(&cell), Some(&1), "the cancelled attempt is discarded once");
    let attempts: Vec<u64> = j.iter().filter(|e| e["event"] == "cell_sealed" && e["cell"] == cell.as_str()).map(|e| e["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [2]);
}

#[test]
fn a_requeued_task_reruns_its_cell_as_an_interrupted_attempt_and_its_arm_goes_on() {
    let Some(conf) = cluster() else { return };
    let c = Cluster { conf };
    let tmp = tempfile::tempdir().unwrap();
    let id = "exactness-requeue";
    let (file, results) = submit_long(&c, tmp.path(), id);

    // Requeue a block's task (what preemption with PreemptMode=REQUEUE does) while its first
    // cell runs: Slurm ends the task and starts it again by itself, with no resume.
    let (block, cell) = first_cell_started(&results, id);
    let v = status(&c, &file, &results);
    let task = v["blocks"][block]["task"].as_str().unwrap().to_string();
    c.slurm("scontrol", &["requeue", &task]);
    wait_until("the requeued block to finish", 900, || {
        let v = status(&c, &file, &results);
        v["finished"] == true && idle(&v)
    });
    // The attempt the scheduler ended is discarded as interrupted, saying so; the cell then
    // seals on its next attempt and the arm's later cells are not skipped.
    let j = check_finished(&c, &file, &results, id, 7);
    let discards: Vec<&Value> = j.iter().filter(|e| e["event"] == "cell_discarded" && e["cell"] == cell.as_str()).collect();
    // (The worker may see the scheduler's signal a moment before its runner does: then that
    // runner discards the attempt first, and the restarted task discards the next one.)
    assert!(!discards.is_empty() && discards.len() <= 2, "{discards:?}");
    assert!(discards.iter().any(|d| d["reason"].as_str().unwrap().contains("preempted or requeued")), "{discards:?}");
    assert!(j.iter().all(|e| e["event"] != "cell_skipped" && e["event"] != "cell_abandoned"), "nothing is skipped after a requeue");
    let attempts: Vec<u64> = j.iter().filter(|e| e["event"] == "cell_sealed" && e["cell"] == cell.as_str()).map(|e| e["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [discards.len() as u64 + 1]);
}

#[test]
fn stats_pairs_refuses_values_from_different_nodes() {
    let t = tempfile::tempdir().unwrap();
    let csv = t.path().join("pairs.csv");
    let n1 = "1".repeat(64);
    let n2 = "2".repeat(64);
    fs::write(&csv, format!("a,b,a_node,b_node\n1.0,2.0,{n1},{n1}\n1.0,2.5,{n1},{n2}\n")).unwrap();
    let r = run(&["stats", "pairs", "--csv", s(&csv), "--a", "a", "--b", "b"]);
    assert_one_line_error(&r, &["row 2", "different nodes", "--allow-mixed-nodes"]);
    ok(&["stats", "pairs", "--csv", s(&csv), "--a", "a", "--b", "b", "--allow-mixed-nodes"]);
    fs::write(&csv, format!("a,b,a_node,b_node\n1.0,2.0,{n1},{n1}\n1.0,2.5,{n2},{n2}\n")).unwrap();
    ok(&["stats", "pairs", "--csv", s(&csv), "--a", "a", "--b", "b"]);
}
