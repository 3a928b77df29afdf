//! Campaigns on a real one-node Slurm cluster (scripts/slurm.sh: munge, slurmctld, slurmd):
//! the shipped exactness campaign as a job array, sealed exactly once, verified and replayed;
//! a task cancelled mid-cell, resumed, and the same again. No mock of sbatch.

use crate::common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

const DAEMONS: [&str; 3] = ["munged", "slurmctld", "slurmd"];

/// scripts/slurm.sh with `args`; its stdout, or why it failed. What it starts is noted as
/// started by `tests` (the backstop `make test` ends with stops those).
fn slurm_sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(Path::new(ROOT).join("scripts/slurm.sh"))
        .args(args)
        .env("SOVEREIGN_SLURM_STARTED_BY", "tests")
        .output()
        .map_err(|e| format!("scripts/slurm.sh: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("scripts/slurm.sh {} failed: {text}{}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(text)
}

/// Whether `pid` is that daemon, alive (a zombie has ended; a reused pid is another program).
fn daemon_alive(name: &str, pid: u32) -> bool {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
    comm.trim() == name && state.is_some_and(|s| s != "Z")
}

/// The cluster this test binary's tests share. libtest runs them on parallel threads, has no
/// teardown hook and never drops statics, so each test holds a [`Lease`]: the first lease
/// starts the cluster, and when the last one ends (passed or panicked) the daemons that start
/// started are stopped. Daemons that were running before (scripts/slurm.sh says which it
/// started) are left running. (With one test thread the cluster is started for each test.)
struct Shared {
    leases: usize,
    conf: String,
    /// The daemons this binary's start started, with their pids.
    started: Vec<(String, u32)>,
    /// Why there is no cluster here: asked once.
    refused: Option<String>,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared { leases: 0, conf: String::new(), started: Vec::new(), refused: None });

fn shared() -> MutexGuard<'static, Shared> {
    SHARED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the cluster: its SLURM_CONF and the daemons this call started, with their pids.
fn start() -> Result<(String, Vec<(String, u32)>), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("starting slurmd needs root".into());
    }
    let out = slurm_sh(&["start"])?;
    let line = slurm_sh(&["env"])?.trim().to_string();
    let conf = line.strip_prefix("export SLURM_CONF=").expect("slurm.sh env prints the config").to_string();
    let names = out
        .lines()
        .find_map(|l| l.strip_prefix("slurm: started by this call: "))
        .unwrap_or_else(|| panic!("scripts/slurm.sh start did not say what it started: {out}"));
    let dir = Path::new(&conf).parent().unwrap().to_path_buf();
    let started: Vec<(String, u32)> = names
        .split_whitespace()
        .filter(|n| *n != "none")
        .map(|n| {
            let pid = fs::read_to_string(dir.join(format!("{n}.pid"))).unwrap_or_default();
            let pid = pid.trim().parse().unwrap_or_else(|_| panic!("{n} was started but {}/{n}.pid holds no pid", dir.display()));
            eprintln!("slurm: this test binary started {n} (pid {pid})");
            (n.to_string(), pid)
        })
        .collect();
    Ok((conf, started))
}

/// A lease on the shared cluster, or None (skipped; a failure under CI=true) where there is none.
fn cluster() -> Option<Cluster> {
    let mut s = shared();
    if s.refused.is_none() && s.leases == 0 {
        match start() {
            Ok((conf, started)) => (s.conf, s.started) = (conf, started),
            Err(why) => s.refused = Some(why),
        }
    }
    if let Some(why) = s.refused.clone() {
        drop(s);
        skip(&test_name(), &why);
        return None;
    }
    s.leases += 1;
    Some(Cluster { conf: s.conf.clone(), _lease: Some(Lease(())) })
}

/// One test's hold on the shared cluster; see [`Shared`].
struct Lease(());

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = shared();
        s.leases -= 1;
        if s.leases > 0 || s.started.is_empty() {
            return;
        }
        let started = std::mem::take(&mut s.started);
        let names: Vec<&str> = started.iter().map(|(n, _)| n.as_str()).collect();
        // Stopping the controller cancels the cluster's jobs first (a test that failed
        // mid-campaign leaves some), so no job outlives it either.
        let stopped = slurm_sh(&[&["stop"], &names[..]].concat());
        let left: Vec<&(String, u32)> = started.iter().filter(|(n, pid)| daemon_alive(n, *pid)).collect();
        eprintln!("slurm: this test binary stopped {names:?}");
        let trouble = match stopped {
            Err(e) => Some(e),
            Ok(_) if !left.is_empty() => Some(format!("still running after scripts/slurm.sh stop: {left:?}")),
            Ok(_) => None,
        };
        if let Some(t) = trouble {
            drop(s);
            if std::thread::panicking() {
                eprintln!("{t}");
            } else {
                panic!("{t}");
            }
        }
    }
}

struct Cluster {
    conf: String,
    /// None for a configuration no cluster answers.
    _lease: Option<Lease>,
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
    files
        .iter()
        .flat_map(|f| fs::read_to_string(f).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect::<Vec<Value>>())
        .collect()
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
    let file = shipped(tmp, |t| {
        t.replace("id: exactness-resident-1", &format!("id: {id}"))
            .replace("outputs: 16", "outputs: 400")
            .replace("horizon: 16", "horizon: 400")
    });
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
    v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| !matches!(b["slurm"].as_str().unwrap(), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"))
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
    let Some(c) = cluster() else { return };
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
    let again: Value =
        serde_json::from_str(&c.ok(&["campaign", "run", s(&file), "--executor", "slurm", "--results", s(&results), "--json"]).stdout)
            .unwrap();
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
    let r: Value =
        serde_json::from_str(&c.ok(&["campaign", "resume", s(&file), "--executor", "slurm", "--results", s(&results), "--json"]).stdout)
            .unwrap();
    assert!(r["submitted"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(r["settled_blocks"], serde_json::json!([0, 1, 2, 3]));
    // A cluster that cannot be asked (a configuration that names no controller): status still
    // shows every cell from the journal and says the cluster could not be asked. A SLURM_CONF
    // that is not there is said as such, before any Slurm command looks for a configuration
    // server in DNS for a minute.
    let missing = Cluster { conf: tmp.path().join("missing.conf").display().to_string(), _lease: None };
    let v: Value = serde_json::from_str(&missing.ok(&["campaign", "status", s(&file), "--results", s(&results), "--json"]).stdout).unwrap();
    assert!(v["cluster_unreachable"].as_str().is_some_and(|w| w.contains("SLURM_CONF=") && w.contains("is not a file")), "{v}");
    assert_eq!(v["counts"]["sealed"], serde_json::json!(7), "{v}");
    let r = missing.sovereign(&["campaign", "resume", s(&file), "--executor", "slurm", "--results", s(&results)]);
    assert_one_line_error(&r, &["SLURM_CONF=", "missing.conf"]);
    let no_controller = tmp.path().join("no-controller.conf");
    fs::write(&no_controller, "").unwrap();
    let unreachable = Cluster { conf: no_controller.display().to_string(), _lease: None };
    let v: Value =
        serde_json::from_str(&unreachable.ok(&["campaign", "status", s(&file), "--results", s(&results), "--json"]).stdout).unwrap();
    assert_eq!((&v["finished"], &v["counts"]["sealed"]), (&Value::Bool(true), &serde_json::json!(7)), "{v}");
    assert!(v["cluster_unreachable"].as_str().is_some_and(|w| w.contains("squeue")), "{v}");
    let text = unreachable.ok(&["campaign", "status", s(&file), "--results", s(&results)]).stdout;
    assert!(text.contains("the cluster could not be asked") && text.contains("7 sealed"), "{text}");
}

#[test]
fn a_cancelled_task_leaves_no_half_record_and_resume_reruns_only_its_block() {
    let Some(c) = cluster() else { return };
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
    let r: Value =
        serde_json::from_str(&c.ok(&["campaign", "resume", s(&file), "--executor", "slurm", "--results", s(&results), "--json"]).stdout)
            .unwrap();
    let sub = r["submitted"].as_array().unwrap();
    assert_eq!(sub.len(), 1, "{r}");
    assert_eq!(sub[0]["blocks"], serde_json::json!([block]), "{r}");
    wait_until("the resumed block to finish", 600, || {
        let v = status(&c, &file, &results);
        v["finished"] == true && idle(&v)
    });
    let j = check_finished(&c, &file, &results, id, 7);
    assert_eq!(count(&j, "cell_discarded").get(&cell), Some(&1), "the cancelled attempt is discarded once");
    let attempts: Vec<u64> =
        j.iter().filter(|e| e["event"] == "cell_sealed" && e["cell"] == cell.as_str()).map(|e| e["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [2]);
}

#[test]
fn a_requeued_task_reruns_its_cell_as_an_interrupted_attempt_and_its_arm_goes_on() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let id = "exactness-requeue";
    let (file, results) = submit_long(&c, tmp.path(), id);

    // Requeue a block's task (what preemption with PreemptMode=REQUEUE does) while its first
    // cell runs: Slurm ends the task and starts it again by itself, with no resume.
    let (block, cell) = first_cell_started(&results, id);
    let v = status(&c, &file, &results);
    let task = v["blocks"][block]["task"].as_str().unwrap().to_string();
    c.slurm("scontrol", &["requeue", &task]);
    // Slurm holds a requeued job for two minutes (its begin time): once it is pending again,
    // let it start at once.
    wait_until("the requeued task to be pending", 120, || {
        c.slurm("squeue", &["-h", "-t", "all", "-j", &task, "-o", "%T"]).trim() == "PENDING"
    });
    c.slurm("scontrol", &["update", &format!("jobid={task}"), "StartTime=now"]);
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
    let attempts: Vec<u64> =
        j.iter().filter(|e| e["event"] == "cell_sealed" && e["cell"] == cell.as_str()).map(|e| e["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [discards.len() as u64 + 1]);
}

/// A job given to sbatch runs on the node and completes.
#[test]
fn the_cluster_runs_a_job() {
    let Some(c) = cluster() else { return };
    let out = c.slurm("sbatch", &["--parsable", "--output=/dev/null", "--wrap", "true"]);
    let job = out.trim().split(';').next().unwrap().to_string();
    let mut state = String::new();
    wait_until("the job to complete", 120, || {
        state = c.slurm("squeue", &["-h", "-t", "all", "-j", &job, "-o", "%T"]).trim().to_string();
        !matches!(state.as_str(), "" | "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING")
    });
    assert_eq!(state, "COMPLETED", "job {job}");
}

/// The suite stops what it starts: a run of this test binary (one cluster test, in a child
/// process, with a Slurm directory and ports of its own) leaves none of the daemons it started
/// running; and where a cluster was running before it, it uses that one and leaves it running.
#[test]
fn a_test_run_stops_the_daemons_it_started_and_no_others() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(&test_name(), "starting slurmd needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("slurm");
    // Two consecutive ports no one listens on, for slurmctld and slurmd.
    let port = (0..50)
        .find_map(|_| {
            let a = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
            let p = a.local_addr().ok()?.port();
            let _b = std::net::TcpListener::bind(("127.0.0.1", p.checked_add(1)?)).ok()?;
            Some(p)
        })
        .expect("two free consecutive ports")
        .to_string();
    let with_env = |cmd: &mut Command| {
        cmd.env("SOVEREIGN_SLURM_DIR", &dir).env("SOVEREIGN_SLURM_PORT", &port);
    };
    let child_run = || {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "slurm::the_cluster_runs_a_job", "--nocapture", "--test-threads", "1"]);
        with_env(&mut cmd);
        let out = cmd.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "the child run failed:\n{text}");
        let started: Vec<(String, u32)> = text
            .lines()
            .filter_map(|l| {
                let (name, pid) = l.strip_prefix("slurm: this test binary started ")?.split_once(" (pid ")?;
                Some((name.to_string(), pid.trim_end_matches(')').parse().unwrap()))
            })
            .collect();
        (started, text)
    };
    let pid_file = |n: &str| dir.join(format!("{n}.pid"));

    // Nothing running before: the run starts all three and stops them when its test ends.
    let (started, text) = child_run();
    assert_eq!(started.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), DAEMONS, "{text}");
    for (n, pid) in &started {
        assert!(!daemon_alive(n, *pid), "{n} (pid {pid}) is still running after the run that started it ended:\n{text}");
        assert!(!pid_file(n).exists() && !dir.join(format!("{n}.started-by")).exists(), "{n}'s files are left");
    }

    // Running before (started by hand): the run uses the cluster and leaves it running.
    struct ByHand<'a>(&'a dyn Fn(&mut Command));
    impl Drop for ByHand<'_> {
        fn drop(&mut self) {
            let mut cmd = Command::new(Path::new(ROOT).join("scripts/slurm.sh"));
            cmd.arg("stop");
            (self.0)(&mut cmd);
            let _ = cmd.output();
        }
    }
    let mut cmd = Command::new(Path::new(ROOT).join("scripts/slurm.sh"));
    cmd.arg("start").env("SOVEREIGN_SLURM_STARTED_BY", "hand");
    with_env(&mut cmd);
    let by_hand = ByHand(&with_env);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let before: Vec<(&str, u32)> = DAEMONS.iter().map(|n| (*n, fs::read_to_string(pid_file(n)).unwrap().trim().parse().unwrap())).collect();
    let (started, text) = child_run();
    assert!(started.is_empty(), "the run started {started:?} although the cluster was running:\n{text}");
    for (n, pid) in &before {
        assert!(daemon_alive(n, *pid), "{n} (pid {pid}), running before the run, was stopped by it:\n{text}");
        assert_eq!(fs::read_to_string(dir.join(format!("{n}.started-by"))).unwrap().trim(), "hand");
    }
    drop(by_hand);
    for (n, pid) in &before {
        assert!(!daemon_alive(n, *pid), "scripts/slurm.sh stop left {n} (pid {pid}) running");
    }
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
