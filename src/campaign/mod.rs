//! Campaigns: a YAML file fixes model, workload, build, arms, schedule, oracle, admission
//! predicate, stop rules and repetition rule; `campaign run` preregisters it (canonical JSON
//! and its SHA-256, frozen under `results/campaigns/<id>/`), expands it into cells and runs
//! them unattended, one fresh child process per cell, sealing each outcome as an immutable
//! record. `campaign resume` continues after any interruption without re-running or losing a
//! sealed cell.
//!
//! Layout of `results/`:
//! ```text
//! results/<digest>/                      sealed records (manifest.json, record.json, cell.json, surfaces)
//! results/campaigns/<id>/campaign.json   frozen canonical campaign; its SHA-256 is the campaign digest
//! results/campaigns/<id>/campaign.yaml   the file as it was when frozen (comments included)
//! results/campaigns/<id>/journal.jsonl   the runner's journal (see journal.rs)
//! results/campaigns/<id>/logs/<cell>.a<N>.log   output of attempt N of a cell
//! results/campaigns/<id>/staging/        cells in progress (never records)
//! results/campaigns/<id>/journals/bNN.jsonl   the journal of block NN run as a cluster task
//!                                        (also logs/bNN/, staging/bNN/; see slurm.rs)
//! results/campaigns/<id>/slurm.jsonl     cluster submissions: job, array tasks, blocks
//! ```

pub mod admission;
pub mod arm;
pub mod audit;
pub mod document;
pub mod executor;
pub mod expand;
pub mod gate;
pub mod journal;
pub mod models;
pub mod runner;
pub mod slurm;
pub mod spec;
pub mod status;

pub use arm::{ArmError, ArmExperts, ArmKind, DeviceArm, Program, RunArm};
pub use document::{read_cell, CellDocument, CELL_FILE};
pub use executor::{
    measure_cell, worker_cell, BlockRecord, CellExecutor, CellInputs, CellOutcome, CellPaths, CellStatus, ProcessExecutor, Telemetry,
};
pub use expand::{expand, CellSpec};
pub use journal::{histories, CellHistory, CellState, RunMode};
pub use runner::{run, Progress, Quiet, RunOptions, RunSummary};
pub use spec::{parse, schema_json, Campaign, Diagnostic};
pub use status::{status, StatusReport};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A parsed and validated campaign file.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub file: PathBuf,
    /// Relative paths inside the campaign are taken from here.
    pub base: PathBuf,
    pub source: String,
    pub spec: Campaign,
    /// Canonical JSON of `spec`.
    pub canonical: String,
    /// SHA-256 of `canonical`: the campaign digest.
    pub digest: String,
}

impl Loaded {
    pub fn id(&self) -> &str {
        &self.spec.id.value
    }
}

/// Reads and checks a campaign file; errors are `FILE:line:column: message`, one per line.
pub fn load(file: &Path) -> Result<Loaded> {
    let source = crate::bounds::read_text("the campaign file", file, crate::bounds::MAX_CAMPAIGN_FILE_BYTES)?;
    let spec = parse(&source)
        .map_err(|d| anyhow::anyhow!(d.iter().map(|d| d.render(&file.display().to_string())).collect::<Vec<_>>().join("\n")))?;
    let (canonical, digest) = spec::canonical(&spec)?;
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let base = if base.as_os_str().is_empty() { PathBuf::from(".") } else { base };
    Ok(Loaded { file: file.to_path_buf(), base, source, spec, canonical, digest })
}

/// `campaign check`: the problems of a file, one line each, or none. A file that cannot be read
/// or does not parse gives [`load`]'s lines; one that does gives what every command refuses
/// before a campaign's first cell ([`gate::problems`]). A missing model with a recipe is
/// `campaign run`'s to make ([`models::pending`]), not a problem.
pub fn check(file: &Path) -> Vec<String> {
    match load(file) {
        Err(e) => format!("{e:#}").lines().map(str::to_string).collect(),
        Ok(c) => gate::problems(&c, models::Recipes::Pending).iter().map(|d| d.render(&file.display().to_string())).collect(),
    }
}

/// Where a campaign keeps its state below the results directory.
#[derive(Debug, Clone)]
pub struct CampaignDir {
    pub root: PathBuf,
    /// The block a cluster task runs: its own journal, lock, logs and staging.
    pub block: Option<usize>,
}

impl CampaignDir {
    pub fn new(results: &Path, id: &str) -> CampaignDir {
        CampaignDir { root: results.join("campaigns").join(id), block: None }
    }
    /// The state of one block run as its own task (`--executor slurm`).
    pub fn block(&self, b: usize) -> CampaignDir {
        CampaignDir { root: self.root.clone(), block: Some(b) }
    }
    fn sub(&self, plain: &str, dir: &str, ext: &str) -> PathBuf {
        match self.block {
            None => self.root.join(plain),
            Some(b) => self.root.join(dir).join(format!("b{b:02}{ext}")),
        }
    }
    /// Every journal of the campaign: the local runner's, then one per block task.
    pub fn journal_files(&self) -> Result<Vec<PathBuf>> {
        let mut files = vec![self.root.join("journal.jsonl")];
        let dir = self.root.join("journals");
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let mut more: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "jsonl")).collect();
            more.sort();
            files.extend(more);
        }
        Ok(files)
    }
    /// The lock a local runner holds exclusively and block tasks hold shared.
    pub fn campaign_lock(&self) -> PathBuf {
        self.root.join("lock")
    }
    pub fn campaign_json(&self) -> PathBuf {
        self.root.join("campaign.json")
    }
    pub fn campaign_yaml(&self) -> PathBuf {
        self.root.join("campaign.yaml")
    }
    pub fn journal(&self) -> PathBuf {
        self.sub("journal.jsonl", "journals", ".jsonl")
    }
    pub fn lock(&self) -> PathBuf {
        self.sub("lock", "journals", ".lock")
    }
    pub fn logs(&self) -> PathBuf {
        self.sub("logs", "logs", "")
    }
    pub fn staging(&self) -> PathBuf {
        self.sub("staging", "staging", "")
    }
}

/// A frozen campaign read back from `campaign.json`, with its digest. The frozen
/// `campaign.yaml` beside it (what `reproduce` runs again) must parse to the same campaign:
/// a file changed after it was frozen is refused, whichever of the two was changed.
pub fn frozen(results: &Path, id: &str) -> Result<(Campaign, String)> {
    let (spec, digest) = frozen_json(results, id)?;
    frozen_yaml_agrees(results, id, &digest)?;
    Ok((spec, digest))
}

/// `campaign.json` alone, with its digest (see [`frozen`], which checks the YAML too).
pub fn frozen_json(results: &Path, id: &str) -> Result<(Campaign, String)> {
    let path = CampaignDir::new(results, id).campaign_json();
    if !path.exists() {
        anyhow::bail!("campaign `{id}` is not preregistered under {}", results.display());
    }
    let text = crate::bounds::read_text("the frozen campaign", &path, 4 * crate::bounds::MAX_CAMPAIGN_FILE_BYTES)?;
    let spec: Campaign = serde_json::from_str(&text).with_context(|| format!("{}: not a campaign", path.display()))?;
    Ok((spec, crate::util::sha256(text.as_bytes())))
}

/// The frozen `campaign.yaml` parses to the campaign whose digest is `digest`.
pub fn frozen_yaml_agrees(results: &Path, id: &str, digest: &str) -> Result<()> {
    let yaml = CampaignDir::new(results, id).campaign_yaml();
    let source = load(&yaml).with_context(|| format!("{}: the frozen campaign file no longer parses", yaml.display()))?;
    if source.digest != digest {
        bail!(
            "{}: the frozen campaign file hashes to {}, not the campaign digest {digest}: it was changed after it was frozen",
            yaml.display(),
            source.digest
        );
    }
    Ok(())
}

/// Takes a lock on `path` (created if missing) without waiting; `busy` says who holds it. The
/// kernel releases it when the returned value drops or the process dies.
pub(crate) fn flock(path: &Path, arg: FlockArg, busy: impl FnOnce() -> String) -> Result<Flock<File>> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let f =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).with_context(|| format!("{}", path.display()))?;
    Flock::lock(f, arg).map_err(|_| anyhow::anyhow!("{}", busy()))
}

fn run_elsewhere(id: &str) -> String {
    format!("campaign `{id}` is being run by another process")
}

/// Freezes the campaign (first time) or checks that the file still has the frozen digest,
/// holding the campaign's lock exclusively, so the frozen files and the journal's first event
/// have one writer however many runners start at once; one that finds the lock taken stops
/// with one line. Returns whether this call froze it, and the lock, still held: a local
/// runner keeps it for its run, a cluster submission or block task turns it shared
/// ([`preregister_shared`]).
pub fn preregister(c: &Loaded, results: &Path) -> Result<(bool, Flock<File>)> {
    let dir = CampaignDir::new(results, c.id());
    let lock = flock(&dir.campaign_lock(), FlockArg::LockExclusiveNonblock, || run_elsewhere(c.id()))?;
    Ok((freeze(c, results)?, lock))
}

/// [`preregister`] for those who run beside each other (cluster block tasks, a submission):
/// the campaign lock held shared. While a sibling holds it shared the campaign is frozen
/// already, and only its digest is checked; the exclusive lock is needed (and waited for, a
/// few seconds at most) only while the campaign is not frozen yet.
pub fn preregister_shared(c: &Loaded, results: &Path) -> Result<(bool, Flock<File>)> {
    let dir = CampaignDir::new(results, c.id());
    let local = || format!("campaign `{}` is being run by a local runner", c.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(lock) = flock(&dir.campaign_lock(), FlockArg::LockExclusiveNonblock, String::new) {
            let now = freeze(c, results)?;
            lock.relock(FlockArg::LockSharedNonblock).map_err(|_| anyhow::anyhow!("{}", local()))?;
            return Ok((now, lock));
        }
        if dir.campaign_json().exists() {
            check_digest(c, results)?;
            return Ok((false, flock(&dir.campaign_lock(), FlockArg::LockSharedNonblock, local)?));
        }
        if std::time::Instant::now() > deadline {
            bail!("{}", run_elsewhere(c.id()));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn check_digest(c: &Loaded, results: &Path) -> Result<()> {
    let (_, digest) = frozen(results, c.id())?;
    if digest != c.digest {
        bail!(
            "{}: campaign `{}` was preregistered with digest {digest}, but this file now has digest {}; \
             a preregistered campaign cannot change (give the changed campaign a new id)",
            c.file.display(),
            c.id(),
            c.digest
        );
    }
    Ok(())
}

/// Under the exclusive lock: freezes the campaign if `campaign.json` is missing (the YAML
/// first, so that the JSON, whose presence means frozen, always has its YAML), else checks its
/// digest; then makes sure the journal opens with the preregistration, which a runner that
/// died between the two writes never journaled.
fn freeze(c: &Loaded, results: &Path) -> Result<bool> {
    let dir = CampaignDir::new(results, c.id());
    let now = if dir.campaign_json().exists() {
        check_digest(c, results)?;
        false
    } else {
        // Under the campaign's exclusive lock: one writer of these files.
        crate::util::write_whole(&dir.campaign_yaml(), c.source.as_bytes())?;
        crate::util::write_whole(&dir.campaign_json(), c.canonical.as_bytes())?;
        crate::util::sync_dir(&dir.root)?;
        true
    };
    let (mut j, entries) = journal::Journal::open(&dir.journal())?;
    if entries.is_empty() {
        j.append(journal::Event::Preregistered { campaign_sha256: c.digest.clone() })?;
    }
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const GOOD: &str = r#"
id: t
model:
  path: m.gguf
  sha256: "0000000000000000000000000000000000000000000000000000000000000000"
workload:
  prompt_file: p.txt
  prompt_sha256: "0000000000000000000000000000000000000000000000000000000000000000"
  prompt_tokens: 3
  outputs: 2
  ignore_eos: true
build:
  engine_tree_sha256: "0000000000000000000000000000000000000000000000000000000000000000"
  patches: []
arms:
  - id: O
    experts: resident
    threads: 1
  - id: D
    experts: plan
    slots: 4
    policy: lru:2
    source: d
    windows: 1
    depth: 1
    memory_cap_bytes: 16777216
    threads: 1
  - id: F
    experts: plan
    slots: 4
    policy: zero
    source: f
    windows: 8
    depth: 8
    fault: short_read
    threads: 1
schedule:
  lead: [O]
  blocks:
    preordered:
      - [D, F]
      - [F, D]
oracle:
  arm: O
  relation: all_surfaces
  horizon: 2
admission:
  require_exact: true
  min_headroom_bytes: 1
  max_limit_events: 0
stop:
  arm_after_admission_failure: true
  campaign_after_oracle_failure: true
repetition:
  outcome_selected_reruns: none
  max_interrupted_attempts: 3
analysis:
  pairs:
    a: D
    b: F
    metric: { file: cell.json, pointer: /outcome/wall_s }
    level: 0.95
"#;

    fn diag(text: &str) -> Vec<Diagnostic> {
        parse(text).expect_err("should not parse")
    }

    #[test]
    fn good_file_parses_expands_and_round_trips_through_json() {
        let c = parse(GOOD).unwrap();
        let cells = expand(&c);
        let keys: Vec<&str> = cells.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, ["b00-p0-O", "b01-p0-D", "b01-p1-F", "b02-p0-F", "b02-p1-D"]);
        assert_eq!(cells[3].order, "F>D");
        assert!(cells[0].is_oracle && !cells[1].is_oracle);
        let (json, digest) = spec::canonical(&c).unwrap();
        let back: Campaign = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        assert_eq!(spec::canonical(&back).unwrap().1, digest);
        // Comments and key order do not change the digest; a value does.
        let reordered = GOOD.replace("id: t\n", "# a comment\nid: t\n");
        assert_eq!(spec::canonical(&parse(&reordered).unwrap()).unwrap().1, digest);
        let changed = GOOD.replace("outputs: 2", "outputs: 3").replace("horizon: 2", "horizon: 3");
        assert_ne!(spec::canonical(&parse(&changed).unwrap()).unwrap().1, digest);
    }

    #[test]
    fn typo_and_wrong_type_have_line_and_column() {
        let d = diag(&GOOD.replace("    threads: 1\n  - id: D", "    thraeds: 1\n  - id: D"));
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].line, d[0].column), (18, 5), "{d:?}");
        assert!(d[0].message.contains("thraeds"), "{d:?}");
        let d = diag(&GOOD.replace("prompt_tokens: 3", "prompt_tokens: three"));
        assert_eq!((d[0].line, d[0].column), (9, 18), "{d:?}");
        let d = diag(&GOOD.replace("policy: lru:2", "policy: lru:0"));
        assert_eq!(d[0].line, 22, "{d:?}");
        assert!(d[0].message.contains("lru:K"), "{d:?}");
    }

    #[test]
    fn semantic_errors_point_at_the_reference() {
        let d = diag(&GOOD.replace("      - [F, D]", "      - [F, X]"));
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].line, d[0].column), (42, 13), "{d:?}");
        assert!(d[0].message.contains("`X`"));
        let d = diag(&GOOD.replace("    policy: zero\n", ""));
        assert!(d.iter().any(|d| d.message.contains("names `slots` without `policy`") && d.line == 28), "{d:?}");
        // Neither slots nor policy: sized from the arm's budget, which it must have.
        let d = diag(&GOOD.replace("    slots: 4\n    policy: zero\n", ""));
        assert!(d.iter().any(|d| d.message.contains("needs `slots` and `policy`, or a budget") && d.line == 28), "{d:?}");
        let c = parse(&GOOD.replace("    slots: 4\n    policy: lru:2\n", "")).expect("D sized from its memory cap");
        let d = c.arms.iter().find(|a| a.id.value == "D").unwrap().kind().unwrap();
        let plan = d.run().and_then(|r| r.plan()).unwrap();
        let budget = crate::plan::budget::PlanBudget { bytes: 16_777_216, tier: crate::plan::budget::Tier::Host };
        assert_eq!(plan.budget, Some(budget));
        let d = diag(&GOOD.replace("  lead: [O]\n", ""));
        assert!(d.iter().any(|d| d.message.contains("must be the first cell")), "{d:?}");
        let d = diag(&GOOD.replace("  - id: O\n    experts: resident\n", "  - id: O\n    experts: resident\n    slots: 3\n"));
        assert!(d.iter().any(|d| d.message.contains("`slots` applies only")), "{d:?}");
        // F's windows and depth may be left to the manifest; a resident arm may not name them.
        parse(&GOOD.replace("    windows: 8\n    depth: 8\n", "")).expect("F sized from the manifest");
        let d = diag(&GOOD.replace("  - id: O\n    experts: resident\n", "  - id: O\n    experts: resident\n    depth: 3\n"));
        assert!(d.iter().any(|d| d.message.contains("`depth` applies only")), "{d:?}");
        // Token passes: a Plan arm's, at least one.
        parse(&GOOD.replace("    windows: 8\n    depth: 8\n", "    windows: 8\n    depth: 8\n    token_pass: 2\n"))
            .expect("F in token passes");
        let d = diag(&GOOD.replace("    windows: 8\n    depth: 8\n", "    windows: 8\n    depth: 8\n    token_pass: 0\n"));
        assert!(d.iter().any(|d| d.message.contains("`token_pass` must be at least 1")), "{d:?}");
        let d = diag(&GOOD.replace("  - id: O\n    experts: resident\n", "  - id: O\n    experts: resident\n    token_pass: 2\n"));
        assert!(d.iter().any(|d| d.message.contains("`token_pass` applies only")), "{d:?}");
    }

    #[test]
    fn a_prefill_floor_names_plan_arms_a_resident_compute_arm_and_an_envelope() {
        let env = "  - id: E\n    measure:\n      envelope: { block_bytes: 4096, depths: [1], bytes_per_depth: 4096 }\nschedule:";
        let with =
            |floor: &str| GOOD.replacen("schedule:", env, 1).replacen("analysis:\n", &format!("analysis:\n  prefill_floor: {floor}\n"), 1);
        let c = parse(&with("{ arms: [F, D], compute: O, envelope: E, baseline: O, level: 0.95 }")).expect("a prefill floor");
        let f = c.analysis.as_ref().and_then(|a| a.prefill_floor.as_ref()).unwrap();
        assert_eq!((f.arms.len(), f.baseline.as_ref().map(|b| b.value.as_str())), (2, Some("O")));
        for (floor, needle) in [
            ("{ arms: [O], compute: O, envelope: E, level: 0.95 }", "analysis.prefill_floor.arms: `O` must be a Plan arm"),
            ("{ arms: [F], compute: D, envelope: E, level: 0.95 }", "analysis.prefill_floor.compute `D` must be a resident arm"),
            ("{ arms: [F], compute: O, envelope: D, level: 0.95 }", "analysis.prefill_floor.envelope `D` must be an envelope arm"),
            (
                "{ arms: [F], compute: O, envelope: E, baseline: E, level: 0.95 }",
                "analysis.prefill_floor.baseline `E` must be an arm that runs the workload",
            ),
            ("{ arms: [], compute: O, envelope: E, level: 0.95 }", "analysis.prefill_floor.arms names no arm"),
            ("{ arms: [X], compute: O, envelope: E, level: 0.95 }", "analysis.prefill_floor.arms names arm `X`, which is not defined"),
            ("{ arms: [F], compute: O, envelope: E, level: 1.5 }", "analysis.prefill_floor.level must lie strictly between 0 and 1"),
        ] {
            let d = diag(&with(floor));
            assert!(d.len() == 1 && d[0].message.contains(needle), "{floor}: {d:?}");
        }
    }

    /// Scalars are what they are written as: the digest of every accepted file is the digest
    /// of what it says, so YAML 1.1 booleans, unknown tags and quoted numbers are refused.
    #[test]
    fn scalars_are_strict_and_each_refusal_is_at_the_value() {
        let digest = |t: &str| spec::canonical(&parse(t).unwrap()).unwrap().1;
        let base = digest(GOOD);
        for (from, to, at, message) in [
            ("  ignore_eos: true", "  ignore_eos: yes", (11, 15), "invalid boolean (strict mode expects true/false)"),
            ("  ignore_eos: true", "  ignore_eos: off", (11, 15), "invalid boolean (strict mode expects true/false)"),
            ("    threads: 1\n  - id: D", "    threads: !custom 1\n  - id: D", (18, 22), "unsupported tag `!custom`"),
            (
                "    threads: 1\n  - id: D",
                "    threads: \"1\"\n  - id: D",
                (18, 14),
                "arms[0].threads: expected a number, got the string \"1\" (numbers are written without quotes)",
            ),
            (
                "  ignore_eos: true",
                "  ignore_eos: 'true'",
                (11, 15),
                "workload.ignore_eos: expected true or false, got the string \"true\" (booleans are written without quotes)",
            ),
            ("  outputs: 2", "  outputs: !!str 2", (10, 18), "invalid u32"),
            (
                "    level: 0.95",
                "    level: \"0.95\"",
                (62, 12),
                "analysis.pairs.level: expected a number, got the string \"0.95\" (numbers are written without quotes)",
            ),
        ] {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "{to}");
            let d = diag(&text);
            assert_eq!(d.len(), 1, "{to}: {d:?}");
            assert_eq!(((d[0].line, d[0].column), d[0].message.as_str()), (at, message), "{to}");
        }
        // What is genuinely a string may be quoted, booleans are true or false in any case, and
        // neither changes the digest.
        for (from, to) in [
            ("id: t\n", "id: \"t\"\n"),
            ("  ignore_eos: true", "  ignore_eos: True"),
            ("    source: d\n", "    source: 'd'\n"),
            ("policy: lru:2", "policy: \"lru:2\""),
        ] {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "{to}");
            assert_eq!(digest(&text), base, "{to}");
        }
    }

    /// A workload names one prompt or a session's requests, each with its digest; `between`
    /// belongs to a session's arms, and a session is not a refinement or a floor analysis.
    #[test]
    fn a_session_workload_names_its_requests_and_its_arms_what_carries_between_them() {
        const PROMPT: &str =
            "  prompt_file: p.txt\n  prompt_sha256: \"0000000000000000000000000000000000000000000000000000000000000000\"\n";
        let zeros = "\"0000000000000000000000000000000000000000000000000000000000000000\"";
        let requests = format!("  requests: r.jsonl\n  requests_sha256: {zeros}\n");
        let session = GOOD.replacen(PROMPT, &requests, 1);
        assert_ne!(session, GOOD);
        let c = parse(&session.replacen("    source: d\n", "    source: d\n    between: cold\n", 1)).unwrap();
        let input = c.workload.input().unwrap();
        assert!(input.session && input.file.value == "r.jsonl" && c.workload.is_session());
        // Plain and session workloads keep their digests: the new fields are left out when absent.
        assert!(!spec::canonical(&parse(GOOD).unwrap()).unwrap().0.contains("requests"));
        for (text, line, needle) in [
            (GOOD.replacen(PROMPT, "", 1), 8, "name `prompt_file` (one prompt) or `requests` (a session)"),
            (GOOD.replacen(PROMPT, &format!("{PROMPT}{requests}"), 1), 12, "not both"),
            (session.replacen(&format!("  requests_sha256: {zeros}\n"), "", 1), 9, "workload.requests needs `requests_sha256`"),
            (
                GOOD.replacen("  prompt_sha256: \"0000000000000000000000000000000000000000000000000000000000000000\"\n", "", 1),
                9,
                "needs `prompt_sha256`",
            ),
            (
                GOOD.replacen("    source: d\n", "    source: d\n    between: reset\n", 1),
                19,
                "sets `between`, but the workload names no `requests`",
            ),
        ] {
            let d = diag(&text);
            assert!(d.len() == 1 && d[0].line == line && d[0].message.contains(needle), "{needle}: {d:?}");
        }
        let d = diag(&session.replacen("    source: d\n", "    source: d\n    between: sometimes\n", 1));
        assert!(d.iter().any(|d| d.message.contains("sometimes")), "{d:?}");
    }

    /// Every count in the file is bounded by `bounds`, at its value.
    #[test]
    fn counts_are_bounded() {
        for (from, to, line, needle) in [
            (
                "  max_interrupted_attempts: 3",
                "  max_interrupted_attempts: 4294967295",
                56,
                "repetition.max_interrupted_attempts 4294967295: expected 1..=100",
            ),
            ("  prompt_tokens: 3", "  prompt_tokens: 4294967295", 9, "workload.prompt_tokens 4294967295: expected 1..=1048576"),
            (
                "    fault: short_read\n",
                "    fault: short_read\n    timeline_token: 4294967295\n",
                28,
                "timeline_token 4294967295 is out of range 0..=1048576",
            ),
            (
                "    fault: short_read\n",
                "    fault: short_read\n    token_pass: 4294967295\n",
                28,
                "token_pass 4294967295 is out of range 0..=65536",
            ),
        ] {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "{to}");
            let d = diag(&text);
            assert!(d.len() == 1 && d[0].line == line && d[0].message.contains(needle), "{to}: {d:?}");
        }
        parse(&GOOD.replacen("  max_interrupted_attempts: 3", "  max_interrupted_attempts: 100", 1)).expect("the bound itself");
        // Written-out blocks count toward the cells' bound like drawn ones.
        let many = "      - [D, F]\n".repeat(4_999);
        let d = diag(&GOOD.replacen("      - [D, F]\n", &many, 1));
        assert!(d.iter().any(|d| d.message.contains("10001 cells, more than 10000") && d.line == 41), "{d:?}");
    }

    #[test]
    fn seeded_random_blocks_are_fixed_by_the_seed() {
        let text =
            GOOD.replace("    preordered:\n      - [D, F]\n      - [F, D]\n", "    seeded_random: { seed: 42, count: 8, arms: [D, F] }\n");
        let a = expand(&parse(&text).unwrap());
        let b = expand(&parse(&text).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.len(), 1 + 16);
        let orders: Vec<&str> = a[1..].iter().step_by(2).map(|c| c.order.as_str()).collect();
        assert!(orders.contains(&"D>F") && orders.contains(&"F>D"), "{orders:?}");
        let other = expand(&parse(&text.replace("seed: 42", "seed: 43")).unwrap());
        assert_ne!(a.iter().map(|c| &c.order).collect::<Vec<_>>(), other.iter().map(|c| &c.order).collect::<Vec<_>>());
    }

    #[test]
    fn checked_in_schema_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/campaign.schema.json");
        let want = schema_json();
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(have == want, "{} is stale: regenerate with `cargo run -- campaign schema > schemas/campaign.schema.json`", path.display());
    }
}
