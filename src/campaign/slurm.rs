//! Campaigns on a Slurm cluster (`campaign run|resume --executor slurm`). The campaign is frozen
//! as for a local run; then every counterbalanced block with unsettled cells becomes one task of
//! a job array (the lead block, which holds the oracle, is its own job and the array starts after
//! it). A task runs this binary on its block's spec (`slurm/block-N.json`, the typed
//! [`CampaignBlock`] that `campaign run-block` parses its flags into): the local runner
//! restricted to that block, with the block's own journal (`journals/bNN.jsonl`, one
//! writer), staging and logs, sealing into the shared results root by the same atomic rename.
//! Both arms of a pair therefore run on one node, back to back.
//!
//! Submissions are journaled in `slurm.jsonl` (job id, blocks); `campaign status` asks `squeue`
//! and, where accounting storage exists, `sacct` for each block's task. A block whose task is
//! pending or running is never submitted again, nor is a block whose cells are all settled.
//! Stop rules see the cells settled when a task reaches them (other blocks may still run).

use super::expand::expand;
use super::journal::{histories, CellHistory, CellState};
use super::journal::{now_ms, Journal, RunMode};
use super::runner::{self, RunOptions, RunSummary};
use super::{flock, preregister_shared, CampaignDir, Loaded, ProcessExecutor};
use crate::cell::{CampaignBlock, Task};
use anyhow::{bail, Context, Result};
use nix::fcntl::FlockArg;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;

pub const SUBMISSIONS_FILE: &str = "slurm.jsonl";

/// What `sbatch` is given besides the array.
#[derive(Debug, Clone, Default)]
pub struct SlurmOptions {
    pub partition: Option<String>,
    pub account: Option<String>,
    /// `--time` as Slurm writes it (e.g. `30`, `2:00:00`).
    pub time: Option<String>,
    /// Further `sbatch` arguments, passed as given.
    pub sbatch_args: Vec<String>,
    /// Whole nodes (the default): cells measure time and memory.
    pub exclusive: bool,
}

/// One `sbatch` call: array task N runs block N.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    pub unix_ms: u64,
    pub job: String,
    pub blocks: Vec<usize>,
    /// The job this array starts after (the lead block's).
    pub after: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SubmitSummary {
    pub campaign: String,
    pub digest: String,
    pub preregistered_now: bool,
    pub blocks: usize,
    /// Blocks whose cells are all settled (never submitted again).
    pub settled_blocks: Vec<usize>,
    /// Blocks whose earlier task is still pending or running: `(block, task)`.
    pub queued: Vec<(usize, String)>,
    pub submitted: Vec<Submission>,
}

/// One block's cluster task as `campaign status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BlockRow {
    pub block: usize,
    pub cells: usize,
    pub settled: usize,
    /// `JOB_N`, the latest task submitted for the block.
    pub task: Option<String>,
    /// Slurm's state (PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, FAILED, ...), or `unknown`.
    pub slurm: String,
    /// Where the state came from: `squeue`, `sacct`, or `journal` (Slurm no longer knows the
    /// job and there is no accounting storage: the block's own journal says how far it got).
    pub source: String,
}

fn settled(h: Option<&CellHistory>) -> bool {
    matches!(h.map(|h| &h.state), Some(CellState::Sealed { .. } | CellState::Skipped { .. } | CellState::Abandoned))
}

/// Terminal Slurm states; anything else (PENDING, RUNNING, COMPLETING, ...) is still queued.
fn ended(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "CANCELLED"
            | "FAILED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "PREEMPTED"
            | "BOOT_FAIL"
            | "DEADLINE"
            | "OUT_OF_MEMORY"
            | "SPECIAL_EXIT"
            | "REVOKED"
            | "unknown"
    )
}

pub fn submissions(dir: &CampaignDir) -> Result<Vec<Submission>> {
    let path = dir.root.join(SUBMISSIONS_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = crate::bounds::read_text("the submissions file", &path, crate::bounds::MAX_JOURNAL_BYTES)?;
    text.lines()
        .enumerate()
        .map(|(n, l)| serde_json::from_str(l).with_context(|| format!("{}:{}: not a submission", path.display(), n + 1)))
        .collect()
}

/// The latest task submitted for each block.
fn tasks(subs: &[Submission]) -> BTreeMap<usize, String> {
    let mut t = BTreeMap::new();
    for s in subs {
        for b in &s.blocks {
            t.insert(*b, format!("{}_{b}", s.job));
        }
    }
    t
}

/// Why the Slurm commands cannot reach a cluster, said before one runs: `SLURM_CONF` naming a
/// file that is not there sends every command into a DNS lookup of about a minute before it
/// fails. Unset, Slurm finds its configuration itself (its default file, or configless DNS).
fn conf_missing(conf: Option<&std::ffi::OsStr>) -> Option<String> {
    let conf = Path::new(conf?);
    (!conf.is_file()).then(|| format!("SLURM_CONF={} is not a file; point it at the cluster's slurm.conf", conf.display()))
}

fn check_conf() -> Result<()> {
    match conf_missing(std::env::var_os("SLURM_CONF").as_deref()) {
        Some(why) => bail!(why),
        None => Ok(()),
    }
}

fn slurm_command(name: &str) -> Command {
    let mut c = Command::new(name);
    c.stdin(std::process::Stdio::null());
    c
}

/// Each task's Slurm state and the command that told it (`squeue` or `sacct`), by task id.
type TaskStates = BTreeMap<String, (String, &'static str)>;

/// Slurm's state of each task of these jobs, from `squeue` (jobs the controller still holds),
/// then `sacct`. Returns the states and whether `sacct` could be asked.
fn states(jobs: &BTreeSet<String>) -> Result<(TaskStates, bool)> {
    check_conf()?;
    let mut out = BTreeMap::new();
    let mut sacct_ok = true;
    for job in jobs {
        let r = slurm_command("squeue").args(["-h", "-r", "-t", "all", "-o", "%i|%T", "-j", job]).output().context("running squeue")?;
        let stderr = String::from_utf8_lossy(&r.stderr);
        if !r.status.success() && !stderr.contains("Invalid job id") {
            bail!("squeue -j {job}: {}", stderr.trim());
        }
        for line in String::from_utf8_lossy(&r.stdout).lines() {
            if let Some((id, st)) = line.split_once('|') {
                out.insert(id.trim().to_string(), (st.trim().to_string(), "squeue"));
            }
        }
        if !out.keys().any(|k| k.starts_with(&format!("{job}_"))) && sacct_ok {
            match slurm_command("sacct").args(["-n", "-P", "-X", "-o", "JobID,State", "-j", job]).output() {
                Ok(r) if r.status.success() => {
                    for line in String::from_utf8_lossy(&r.stdout).lines() {
                        if let Some((id, st)) = line.split_once('|') {
                            // "CANCELLED by 0": the state is the first word.
                            let st = st.split_whitespace().next().unwrap_or("unknown");
                            out.insert(id.trim().to_string(), (st.to_string(), "sacct"));
                        }
                    }
                }
                _ => sacct_ok = false,
            }
        }
    }
    Ok((out, sacct_ok))
}

/// Each block's cells, settled count and cluster task (empty when never submitted to Slurm),
/// and why the cluster could not be asked, if it could not: the journals still say how far
/// every block got, so the rows then come from them alone.
pub fn block_rows(c: &Loaded, results: &Path) -> Result<(Vec<BlockRow>, Option<String>)> {
    let dir = CampaignDir::new(results, c.id());
    let subs = submissions(&dir)?;
    if subs.is_empty() {
        return Ok((Vec::new(), None));
    }
    let (spec, _) = super::frozen(results, c.id())?;
    let cells = expand(&spec);
    let hist = histories(&Journal::read_all(&dir.journal_files()?)?);
    let tasks = tasks(&subs);
    let jobs: BTreeSet<String> = subs.iter().map(|s| s.job.clone()).collect();
    let (states, unreachable) = match states(&jobs) {
        Ok((st, _)) => (st, None),
        Err(e) => (BTreeMap::new(), Some(format!("{e:#}").replace('\n', " "))),
    };
    let blocks: BTreeSet<usize> = cells.iter().map(|x| x.block).collect();
    let rows = blocks
        .into_iter()
        .map(|b| {
            let mine: Vec<_> = cells.iter().filter(|x| x.block == b).collect();
            let done = mine.iter().filter(|x| settled(hist.get(&x.key))).count();
            let task = tasks.get(&b).cloned();
            let (slurm, source) = match task.as_ref().and_then(|t| states.get(t)) {
                Some((s, src)) => (s.clone(), src.to_string()),
                None if task.is_none() => ("-".to_string(), "journal".to_string()),
                None => ("unknown".to_string(), "journal".to_string()),
            };
            BlockRow { block: b, cells: mine.len(), settled: done, task, slurm, source }
        })
        .collect();
    Ok((rows, unreachable))
}

/// The blocks as `campaign status` prints them; `unreachable`: why the cluster was not asked.
pub fn blocks_text(rows: &[BlockRow], unreachable: Option<&str>) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from("blocks on Slurm:\n");
    for r in rows {
        let st = match (r.slurm.as_str(), r.source.as_str()) {
            (_, _) if unreachable.is_some() => "state not asked (from the journal)".to_string(),
            ("unknown", _) if r.settled == r.cells => "ended (all cells settled)".to_string(),
            ("unknown", _) => "ended, unsettled (killed, failed or timed out: resume resubmits it)".to_string(),
            (st, src) => format!("{st} ({src})"),
        };
        s += &format!("  b{:02}  {:<10} {}/{} settled  {st}\n", r.block, r.task.as_deref().unwrap_or("-"), r.settled, r.cells);
    }
    if let Some(why) = unreachable {
        s += &format!("  (the cluster could not be asked: {why}; every cell's state above comes from the journals)\n");
    } else if rows.iter().any(|r| r.source == "journal" && r.task.is_some()) {
        s += "  (squeue no longer holds these jobs and sacct has no accounting storage here: their state comes from the journals)\n";
    }
    s
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The array task's shell command: this executable on the spec of the task's block, which
/// Slurm names in `$SLURM_ARRAY_TASK_ID`.
fn task_script(exe: &Path, specs: &Path) -> Result<String> {
    const BLOCK: &str = "@BLOCK@";
    let cmd = crate::cell::task_command(Some(exe), &specs.join(format!("block-{BLOCK}.json")))?;
    let words: Vec<String> = std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|w| sh_quote(&w.to_string_lossy())).collect();
    Ok(format!("exec {}", words.join(" ").replace(BLOCK, "'\"$SLURM_ARRAY_TASK_ID\"'")))
}

/// `campaign run|resume --executor slurm`: freeze, then submit every block with unsettled
/// cells that has no task pending or running.
pub fn submit(c: &Loaded, results: &Path, mode: RunMode, o: &SlurmOptions) -> Result<SubmitSummary> {
    let dir = CampaignDir::new(results, c.id());
    if mode == RunMode::Resume && !dir.campaign_json().exists() {
        bail!("campaign `{}` is not preregistered under {}; start it with `campaign run`", c.id(), results.display());
    }
    runner::check_identities(c)?;
    check_conf()?;
    // Held shared: no local runner beside the blocks' tasks.
    let (preregistered_now, _no_local) = preregister_shared(c, results)?;
    let _submitting =
        flock(&dir.root.join("slurm.lock"), FlockArg::LockExclusiveNonblock, || "another submission of this campaign is under way".into())?;

    let cells = expand(&c.spec);
    let hist = histories(&Journal::read_all(&dir.journal_files()?)?);
    let subs = submissions(&dir)?;
    let jobs: BTreeSet<String> = subs.iter().map(|s| s.job.clone()).collect();
    let (st, _) = states(&jobs)?;
    let tasks = tasks(&subs);
    let queued_state = |b: usize| tasks.get(&b).and_then(|t| st.get(t)).filter(|(s, _)| !ended(s)).map(|_| tasks[&b].clone());

    let blocks: BTreeSet<usize> = cells.iter().map(|x| x.block).collect();
    let has_lead = blocks.contains(&0);
    let mut summary = SubmitSummary {
        campaign: c.id().to_string(),
        digest: c.digest.clone(),
        preregistered_now,
        blocks: blocks.len(),
        settled_blocks: Vec::new(),
        queued: Vec::new(),
        submitted: Vec::new(),
    };
    let mut todo = Vec::new();
    for &b in &blocks {
        if cells.iter().filter(|x| x.block == b).all(|x| settled(hist.get(&x.key))) {
            summary.settled_blocks.push(b);
        } else if let Some(t) = queued_state(b) {
            summary.queued.push((b, t));
        } else {
            todo.push(b);
        }
    }
    if todo.is_empty() {
        return Ok(summary);
    }

    fs::create_dir_all(results).with_context(|| format!("creating {}", results.display()))?;
    let exe = std::env::current_exe().context("locating this executable")?;
    let file = fs::canonicalize(&c.file).with_context(|| format!("{}", c.file.display()))?;
    let root = fs::canonicalize(results).with_context(|| format!("{}", results.display()))?;
    let out_dir = dir.root.join("slurm");
    fs::create_dir_all(&out_dir)?;
    let out_dir = fs::canonicalize(&out_dir)?;
    // Each block's task spec; the task refuses a binary that changed on the shared file system
    // since submission.
    let binary = crate::identity::build_identity()?.binary_sha256;
    for &block in &todo {
        let task = CampaignBlock { file: file.clone(), block, results: root.clone(), binary_sha256: Some(binary.clone()) };
        crate::cell::write_task(&Task::CampaignBlock(task), &out_dir.join(format!("block-{block}.json")))?;
    }
    let wrap = task_script(&exe, &out_dir)?;
    let sbatch = |blocks: &[usize], after: Option<&str>| -> Result<Submission> {
        let list: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
        let mut cmd = slurm_command("sbatch");
        cmd.arg("--parsable")
            .arg(format!("--job-name=sovereign:{}", c.id()))
            .arg(format!("--array={}", list.join(",")))
            .arg(format!("--output={}/%A_%a.out", out_dir.display()))
            .arg(format!("--chdir={}", root.display()));
        if o.exclusive {
            cmd.arg("--exclusive");
        }
        for (flag, v) in [("--partition", &o.partition), ("--account", &o.account), ("--time", &o.time)] {
            if let Some(v) = v {
                cmd.arg(format!("{flag}={v}"));
            }
        }
        if let Some(a) = after {
            cmd.arg(format!("--dependency=afterany:{a}"));
        }
        cmd.args(&o.sbatch_args).arg(format!("--wrap={wrap}"));
        let r = cmd.output().context("running sbatch (is Slurm installed and SLURM_CONF set?)")?;
        if !r.status.success() {
            bail!("sbatch: {}", String::from_utf8_lossy(&r.stderr).trim().replace('\n', " "));
        }
        let text = String::from_utf8_lossy(&r.stdout);
        let job = text.trim().split(';').next().unwrap_or("").to_string();
        if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
            bail!("sbatch --parsable printed {:?}, not a job id", text.trim());
        }
        let s = Submission { unix_ms: now_ms(), job, blocks: blocks.to_vec(), after: after.map(str::to_string) };
        let path = dir.root.join(SUBMISSIONS_FILE);
        let mut f = fs::OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("{}", path.display()))?;
        f.write_all(format!("{}\n", serde_json::to_string(&s)?).as_bytes())?;
        f.sync_data()?;
        Ok(s)
    };
    // The oracle's block first; the other blocks compare against its sealed record.
    let mut after = if has_lead { queued_state(0).map(|t| t.split('_').next().unwrap_or_default().to_string()) } else { None };
    if todo.first() == Some(&0) {
        let s = sbatch(&[0], None)?;
        after = Some(s.job.clone());
        summary.submitted.push(s);
        todo.remove(0);
    }
    if !todo.is_empty() {
        summary.submitted.push(sbatch(&todo, after.as_deref())?);
    }
    Ok(summary)
}

/// `campaign run-block`: one array task. Blocks after the lead wait for the oracle's record.
pub fn run_block(
    c: &Loaded,
    results: &Path,
    block: usize,
    binary_sha256: Option<&str>,
    progress: std::sync::Arc<dyn runner::Progress>,
) -> Result<RunSummary> {
    if let Some(want) = binary_sha256 {
        let have = crate::identity::build_identity()?.binary_sha256;
        if have != want {
            bail!("block {block}: this binary's sha256 is {have}, but the campaign was submitted with {want}; the shared binary changed (resume resubmits with the new one)");
        }
    }
    let cells = expand(&c.spec);
    if !cells.iter().any(|x| x.block == block) {
        let have: BTreeSet<usize> = cells.iter().map(|x| x.block).collect();
        bail!("--block {block}: campaign `{}` has blocks {:?}", c.id(), have);
    }
    if block != 0 {
        let dir = CampaignDir::new(results, c.id());
        let hist = histories(&Journal::read_all(&dir.journal_files()?)?);
        let open: Vec<&str> = cells.iter().filter(|x| x.block == 0 && !settled(hist.get(&x.key))).map(|x| x.key.as_str()).collect();
        if !open.is_empty() {
            bail!("block {block}: the lead block's cells {} are not settled yet (resume runs it first)", open.join(", "));
        }
    }
    let exec = ProcessExecutor::current(&c.base)?;
    runner::run(c, &exec, &RunOptions { results: results.to_path_buf(), mode: RunMode::Resume, progress, block: Some(block) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slurm_conf_that_is_not_there_is_said_before_any_command_waits_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("slurm.conf");
        let why = conf_missing(Some(missing.as_os_str())).expect("a missing file is said");
        assert!(why.contains("SLURM_CONF=") && why.contains("slurm.conf"), "{why}");
        assert!(conf_missing(Some(dir.path().as_os_str())).is_some(), "a directory is not a conf file");
        // A conf file that is there (even empty), or none named: Slurm's own business.
        std::fs::write(&missing, "").unwrap();
        assert_eq!(conf_missing(Some(missing.as_os_str())), None);
        assert_eq!(conf_missing(None), None);
    }

    #[test]
    fn an_array_task_runs_the_spec_of_its_own_block_whatever_the_paths_hold() {
        let dir = tempfile::tempdir().unwrap();
        // A directory whose name a shell would split, expand or unquote.
        let specs = dir.path().join("it's $HOME *");
        let script = task_script(Path::new("/bin/echo"), &specs).unwrap();
        let out = Command::new("sh").arg("-c").arg(&script).env("SLURM_ARRAY_TASK_ID", "7").output().unwrap();
        assert!(out.status.success(), "{script}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("task {}\n", specs.join("block-7.json").display()));
    }
}
