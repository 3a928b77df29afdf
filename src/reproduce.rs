//! Reproduction: a claim run again from its pinned identity, then judged against the original.
//!
//! `sovereign reproduce --claim ID` reads the claim's sealed records and, from each, the cell it
//! was run with (`cell.json`: campaign reference, cell spec with arm and workload). It refuses,
//! in one line, a build whose engine identity (pin, tree digest, patches, CMake options) is not
//! the records', and any input whose digest is not the one they pin; it warns (and records the
//! warning) when CPU features or devices differ. It then runs the campaign again with the
//! campaign runner into `--out` (same arms, same cgroup caps, same executor, same seals; a rerun
//! resumes), compares every new record with its original surface by surface, recomputes the
//! claim's summaries from the new records with the replay code, and seals a report.
//!
//! Inputs found by digest are linked under `<out>/inputs/<campaign id>/` at the campaign's own
//! relative paths, so the runner's identity checks and its executor run unchanged and the new
//! records name the same relative paths as the originals. The whole campaign runs again (the
//! runner's stop rules and oracle comparisons need its order), not only the claim's cells.
//!
//! Judgement, per assertion:
//! - surfaces: every output surface of every reproduced record is bitwise equal to the original's;
//! - exactness: recomputed on the new records, it must state what the claim states;
//! - admission: recomputed on the new records, it must equal the stated predicate;
//! - paired ratios (timing): [`TIMING_RULE`], never equality of point values;
//! - value assertions: the ledger's check, applied to the reproduced record.

use crate::campaign::journal::Journal;
use crate::campaign::{self, CampaignDir, Loaded, ProcessExecutor, RunMode, RunOptions};
use crate::campaign::{histories, read_cell, CellDocument, CellState, CellStatus};
use crate::claims::{self, Claim, Records, Replay};
use crate::engine::backends::Device;
use crate::engine::EngineIdentity;
use crate::oracle::Outcome;
use crate::record::{prepare_seal, verify_record};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

pub const REPORT_FORMAT: &str = "sovereign.reproduction/1";
pub const REPORT_JSON: &str = "reproduction.json";
pub const REPORT_TEXT: &str = "reproduction.txt";
/// How a timing claim (a paired ratio with its interval) is judged.
pub const TIMING_RULE: &str =
    "a paired ratio holds when the reproduced interval overlaps the original one (max(lo) <= min(hi)); without an interval (n < 2) it cannot be judged and does not hold";

pub struct Options {
    pub ledger: PathBuf,
    pub claim: String,
    /// A plain claim ID from a ledger that is not sealed is accepted (see `claims::anchored_ledger`).
    pub unanchored: bool,
    /// Where the original records are.
    pub results: PathBuf,
    /// Where the reproduction's records (and the report) are sealed.
    pub out: PathBuf,
    /// The campaign file the records were run from; its relative paths find the inputs.
    pub campaign: Option<PathBuf>,
    /// Inputs by SHA-256 (`--model DIGEST=PATH`, `--prompt DIGEST=PATH`).
    pub inputs: BTreeMap<String, PathBuf>,
    /// Where the rerun campaign reports its cells.
    pub progress: std::sync::Arc<dyn campaign::Progress>,
}

/// One record of the claim, original and reproduced.
#[derive(Debug, Clone, Serialize)]
pub struct RecordPair {
    pub alias: String,
    pub cell: String,
    pub original: String,
    pub reproduced: Option<String>,
    /// The original cell's status.
    pub status: CellStatus,
    /// Surface → `exact`, or how it differs.
    pub surfaces: BTreeMap<String, String>,
}

/// One judged assertion.
#[derive(Debug, Clone, Serialize)]
pub struct Judged {
    pub kind: &'static str,
    pub what: String,
    pub original: String,
    pub reproduced: String,
    pub holds: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub format: String,
    pub claim: String,
    pub statement: String,
    pub ledger_sha256: String,
    /// This build's engine identity (equal to the records', or nothing ran).
    pub engine: EngineIdentity,
    pub binary_sha256: String,
    pub campaigns: Vec<String>,
    pub warnings: Vec<String>,
    pub timing_rule: String,
    pub records: Vec<RecordPair>,
    pub assertions: Vec<Judged>,
    pub holds: bool,
}

/// What `reproduce` returns: the report and where it was sealed.
#[derive(Debug, Clone, Serialize)]
pub struct Reproduction {
    pub report: Report,
    pub sealed: PathBuf,
}

struct Original {
    alias: String,
    digest: String,
    doc: CellDocument,
    record: Option<crate::record::TypedRecord>,
}

fn short(d: &str) -> &str {
    &d[..12.min(d.len())]
}

/// Where `theirs` is another build than `ours`: each field that makes a build the same build,
/// by name, with the record's value and this build's, as a record writes them.
fn build_differences(theirs: &EngineIdentity, ours: &EngineIdentity) -> Vec<(&'static str, String, String)> {
    fn differ<T: PartialEq + Serialize>(name: &'static str, t: &T, u: &T) -> Option<(&'static str, String, String)> {
        (t != u).then(|| (name, json(t), json(u)))
    }
    [
        differ("engine pin (package)", &theirs.package, &ours.package),
        differ("engine pin (version)", &theirs.version, &ours.version),
        differ("engine pin (checksum)", &theirs.checksum, &ours.checksum),
        differ("engine tree digest", &theirs.tree_sha256, &ours.tree_sha256),
        differ("patch digests", &theirs.patches, &ours.patches),
        differ("CMake options", &theirs.cmake_options, &ours.cmake_options),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A device as a build is the same build on it: all but its free memory, which changes
/// between runs.
fn device_itself(d: &Device) -> (&str, &str, &str, u64, Option<&str>) {
    (&d.name, &d.description, &d.kind, d.memory_total, d.device_id.as_deref())
}

/// Refuses a record whose build is not this one; returns warnings for other hardware.
fn check_build(o: &Original, ours: &EngineIdentity, warnings: &mut BTreeSet<String>) -> Result<()> {
    let Some(rec) = &o.record else { return Ok(()) };
    let build = rec.build();
    if let Some((name, theirs, here)) = build_differences(&build.engine, ours).into_iter().next() {
        bail!(
            "record {} ({}): {name} differs: the record has {theirs}, this build has {here}; a reproduction needs the pinned build",
            o.alias,
            short(&o.digest),
        );
    }
    let cpu = crate::engine::cpu_features();
    if build.cpu_features != cpu {
        warnings.insert(format!(
            "CPU features differ from the records' ({} here, {} recorded): kernels may differ",
            json(&cpu),
            json(&build.cpu_features)
        ));
    }
    let devices = crate::engine::backends::devices();
    let here: Vec<_> = devices.iter().map(device_itself).collect();
    let there: Vec<_> = build.devices.iter().map(device_itself).collect();
    if here != there {
        warnings.insert(format!("devices differ from the records' ({} here, {} recorded): kernels may differ", json(&here), json(&there)));
    }
    Ok(())
}

fn json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A value as a report shows it: long ones by size and digest, so a line stays a line.
fn shown(v: Option<&Value>) -> String {
    let Some(v) = v else { return "absent".into() };
    let text = compact(v);
    if text.len() <= 80 {
        return text;
    }
    let size = match v {
        Value::Array(a) => format!("array of {}", a.len()),
        Value::Object(m) => format!("object of {}", m.len()),
        Value::String(x) => format!("string of {} chars", x.chars().count()),
        _ => format!("{} bytes of JSON", text.len()),
    };
    format!("<{size}, sha256 {}>", short(&crate::util::sha256(text.as_bytes())))
}

fn admission(a: Option<bool>) -> &'static str {
    match a {
        Some(true) => "admitted",
        Some(false) => "not admitted",
        None => "not evaluated",
    }
}

fn record_name(alias: &str, key: &str) -> String {
    if alias == key {
        format!("record {alias}")
    } else {
        format!("record {alias} (cell {key})")
    }
}

/// The campaign a record was run from: the file given, else the frozen copy beside the records.
fn find_campaign(id: &str, sha: &str, given: Option<&Loaded>, results: &Path, alias: &str) -> Result<Loaded> {
    if let Some(c) = given.filter(|c| c.id() == id && c.digest == sha) {
        return Ok(c.clone());
    }
    let frozen = CampaignDir::new(results, id).campaign_yaml();
    if let Ok(c) = campaign::load(&frozen) {
        if c.digest == sha {
            return Ok(c);
        }
    }
    match given {
        Some(c) => bail!(
            "{}: campaign `{}` with digest {}, but record {alias} was run by campaign `{id}` with digest {sha}",
            c.file.display(),
            c.id(),
            c.digest
        ),
        None => bail!("record {alias}: campaign `{id}` ({sha}) is not frozen under {}; pass --campaign FILE", results.display()),
    }
}

/// Every input a campaign names: (what, campaign path, digest).
fn needed(c: &Loaded) -> Vec<(&'static str, String, String)> {
    let s = &c.spec;
    let mut v = vec![("model", s.model.path.value.clone(), s.model.sha256.0.clone())];
    if let Ok(i) = s.workload.input() {
        v.push((if i.session { "requests" } else { "prompt" }, i.file.value.clone(), i.sha256.0.clone()));
    }
    if let Some(r) = &s.refine {
        v.push(("model", r.verifier.path.value.clone(), r.verifier.sha256.0.clone()));
        v.push(("model", r.reference.path.value.clone(), r.reference.sha256.0.clone()));
    }
    v.extend(s.proposers.values().map(|m| ("model", m.path.value.clone(), m.sha256.0.clone())));
    v
}

/// Where a relative campaign path lands below `base`, lexically; None if it climbs out of `root`.
fn inside(root: &Path, base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = base.to_path_buf();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() || !out.starts_with(root) {
                    return None;
                }
            }
            _ => return None,
        }
    }
    out.starts_with(root).then_some(out)
}

/// Finds every input by digest (a file given for it, else the campaign's path beside the
/// campaign file), refuses a missing file or another digest, and lays the inputs out under
/// `farm` at the campaign's relative paths, so the runner and executor find them unchanged.
/// Returns the directory to use as the campaign's base.
fn lay_out_inputs(
    c: &Loaded,
    opts: &Options,
    beside: Option<&Path>,
    farm: &Path,
    hashed: &mut BTreeMap<PathBuf, String>,
) -> Result<PathBuf> {
    let inputs = needed(c);
    let depth = inputs
        .iter()
        .map(|(_, p, _)| Path::new(p).components().take_while(|c| matches!(c, Component::ParentDir | Component::CurDir)).count())
        .max()
        .unwrap_or(0);
    if farm.exists() {
        // Only links this command made; remove_dir_all does not follow them.
        std::fs::remove_dir_all(farm).with_context(|| format!("removing {}", farm.display()))?;
    }
    let base = (0..depth).fold(farm.to_path_buf(), |p, _| p.join("base"));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    for (what, path, sha) in inputs {
        let source = match (opts.inputs.get(&sha), beside) {
            (Some(p), _) => p.clone(),
            (None, Some(dir)) => dir.join(&path),
            (None, None) => bail!("{what} {path} ({sha}): not given; pass --{what} {sha}=PATH or --campaign FILE"),
        };
        let got = match hashed.get(&source) {
            Some(g) => g.clone(),
            None => {
                // A model's whole-file digest comes from its digest manifest (hashed once per file).
                let g = if what == "model" { crate::digests::model_sha256(&source, None) } else { crate::util::sha256_file(&source) }
                    .with_context(|| format!("{what} {}: cannot read", source.display()))?;
                hashed.insert(source.clone(), g.clone());
                g
            }
        };
        if got != sha {
            bail!("{what} {}: sha256 {got}, but the records pin {sha}", source.display());
        }
        if Path::new(&path).is_absolute() {
            if source != Path::new(&path) {
                bail!("{what} {path}: the campaign names an absolute path, so another file cannot stand in for it");
            }
            continue;
        }
        let link = inside(farm, &base, &path).with_context(|| format!("{what} {path}: not a path below the campaign's directory"))?;
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // A shard set is linked whole: each shard under the name llama.cpp derives from the first.
        let sources = if what == "model" { crate::gguf::set::files(&source)? } else { vec![source.clone()] };
        let links = match sources.len() {
            1 => vec![link],
            n => {
                let prefix = link.to_string_lossy().strip_suffix(&format!("-00001-of-{n:05}.gguf")).map(PathBuf::from);
                let prefix = prefix.with_context(|| {
                    format!("{what} {path}: names a set of {n} shards, but not by its first file (NAME-00001-of-{n:05}.gguf), by which llama.cpp finds the others")
                })?;
                (0..n as u32).map(|i| crate::gguf::set::shard_path(&prefix, i, n as u32)).collect()
            }
        };
        for (source, link) in sources.iter().zip(links) {
            let target = std::fs::canonicalize(source).with_context(|| format!("{what} {}", source.display()))?;
            if let Err(e) = std::os::unix::fs::symlink(&target, &link) {
                // Two names for one digest are fine; anything else is not.
                if !(e.kind() == std::io::ErrorKind::AlreadyExists && std::fs::canonicalize(&link).ok() == Some(target)) {
                    return Err(e).with_context(|| format!("linking {}", link.display()));
                }
            }
        }
    }
    Ok(base)
}

/// `sovereign reproduce --claim ID`.
pub fn reproduce(opts: &Options) -> Result<Reproduction> {
    let (ledger, _) = claims::anchored_ledger(&opts.ledger, &opts.claim, opts.unanchored)?;
    let claim = claims::claim(&ledger, &opts.claim, &opts.ledger)?;
    check_originals_stand(opts, claim)?;
    let originals = read_originals(claim, &opts.results)?;
    let engine = crate::engine::identity();
    let mut warnings = BTreeSet::new();
    for o in &originals {
        check_build(o, &engine, &mut warnings)?;
    }
    let laid = lay_out_campaigns(opts, &originals)?;
    for w in &warnings {
        log::warn!("{w}");
    }
    rerun(opts, &laid)?;
    let new_digest = reproduced_digests(opts, &laid, &originals)?;

    let mut judged = Vec::new();
    let mut pairs = Vec::new();
    for o in &originals {
        let (pair, j) = judge_record(opts, o, new_digest.get(&o.alias))?;
        judged.push(j);
        pairs.push(pair);
    }
    // The claim with the reproduced records under the same aliases, read by the replay code.
    let substituted = Claim { records: new_digest.clone(), ..claim.clone() };
    let mut old = Records::new(claim, &opts.results, false);
    let mut new = Records::new(&substituted, &opts.out, false);
    for rp in &claim.replay {
        judged.extend(judge_replay(rp, &mut old, &mut new));
    }
    judged.extend(claim.assertions.iter().map(|a| judge_value(a, &mut old, &mut new)));

    let report = Report {
        format: REPORT_FORMAT.into(),
        claim: opts.claim.clone(),
        statement: claim.statement.clone(),
        ledger_sha256: crate::util::sha256_file(&opts.ledger)?,
        engine,
        binary_sha256: crate::identity::build_identity()?.binary_sha256,
        campaigns: laid.iter().map(|c| format!("{} {}", c.id(), c.digest)).collect(),
        warnings: warnings.into_iter().collect(),
        timing_rule: TIMING_RULE.into(),
        holds: judged.iter().all(|j| j.holds),
        records: pairs,
        assertions: judged,
    };
    let sealed = seal_report(&report, &opts.out)?;
    Ok(Reproduction { report, sealed })
}

/// The originals must stand as claimed before anything runs again, and the reproduction needs
/// a results directory of its own.
fn check_originals_stand(opts: &Options, claim: &Claim) -> Result<()> {
    let same_dir = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    if same_dir(&opts.out, &opts.results) {
        bail!("--out {}: is the results directory of the original records; a reproduction needs its own", opts.out.display());
    }
    let how = claims::Checking { allow_mixed_nodes: false, unanchored: opts.unanchored };
    let mut checks = vec![("verify", claims::verify(&opts.ledger, &opts.claim, &opts.results, how)?)];
    if !claim.replay.is_empty() {
        checks.push(("replay", claims::replay(&opts.ledger, &opts.claim, &opts.results, how)?));
    }
    for (verb, r) in checks {
        if let Some(first) = r.failures().into_iter().next() {
            bail!("claim {} does not {verb} from its own records ({first}); nothing to reproduce", opts.claim);
        }
    }
    Ok(())
}

/// Each record of the claim with the cell it was run as; only campaign records qualify.
fn read_originals(claim: &Claim, results: &Path) -> Result<Vec<Original>> {
    let mut originals = Vec::new();
    for (alias, digest) in &claim.records {
        let dir = results.join(digest);
        let doc = read_cell(&dir).with_context(|| format!("record {alias}: only campaign records (with cell.json) can be run again"))?;
        let record = match dir.join(crate::record::RECORD_FILE).is_file() {
            true => Some(crate::record::load_typed(&dir)?),
            false => None,
        };
        originals.push(Original { alias: alias.clone(), digest: digest.clone(), doc, record });
    }
    Ok(originals)
}

/// The campaigns the originals ran in, each as frozen and holding their cells, with their
/// inputs laid out under `<out>/inputs/<campaign id>/`.
fn lay_out_campaigns(opts: &Options, originals: &[Original]) -> Result<Vec<Loaded>> {
    let given = opts.campaign.as_deref().map(campaign::load).transpose()?;
    let beside = given.as_ref().map(|c| c.base.clone());
    let mut campaigns: BTreeMap<(String, String), Loaded> = BTreeMap::new();
    for o in originals {
        let key = (o.doc.campaign.id.clone(), o.doc.campaign.sha256.clone());
        if !campaigns.contains_key(&key) {
            let c = find_campaign(&key.0, &key.1, given.as_ref(), &opts.results, &o.alias)?;
            campaigns.insert(key.clone(), c);
        }
        let c = &campaigns[&key];
        if !campaign::expand(&c.spec).contains(&o.doc.cell) {
            bail!("record {}: cell {} is not a cell of campaign `{}` as frozen", o.alias, o.doc.cell.key, c.id());
        }
    }
    let mut hashed = BTreeMap::new();
    let mut laid = Vec::new();
    for c in campaigns.values() {
        let farm = opts.out.join("inputs").join(c.id());
        let base = lay_out_inputs(c, opts, beside.as_deref(), &farm, &mut hashed)?;
        laid.push(Loaded { base, ..c.clone() });
    }
    Ok(laid)
}

/// Run again: the campaign runner, its executor and its seals; a rerun resumes.
fn rerun(opts: &Options, laid: &[Loaded]) -> Result<()> {
    for c in laid {
        let exec = ProcessExecutor::current(&c.base)?;
        let s = campaign::run(
            c,
            &exec,
            &RunOptions { results: opts.out.clone(), mode: RunMode::Run, progress: opts.progress.clone(), block: None },
        )?;
        log::info!("campaign {}: {} cells, {} ran now, {} sealed", s.campaign, s.cells, s.ran, s.sealed);
    }
    Ok(())
}

/// The reproduced record of each alias, by cell key, from the rerun's journals.
fn reproduced_digests(opts: &Options, laid: &[Loaded], originals: &[Original]) -> Result<BTreeMap<String, String>> {
    let mut new_digest: BTreeMap<String, String> = BTreeMap::new();
    for c in laid {
        let hist = histories(&Journal::read(&CampaignDir::new(&opts.out, c.id()).journal())?);
        for o in originals.iter().filter(|o| o.doc.campaign.id == c.id()) {
            if let Some(CellState::Sealed { digest, .. }) = hist.get(&o.doc.cell.key).map(|h| &h.state) {
                if *digest == o.digest {
                    bail!("record {}: the reproduction's record is the original itself; --out must not hold the original run", o.alias);
                }
                new_digest.insert(o.alias.clone(), digest.clone());
            }
        }
    }
    Ok(new_digest)
}

/// One original against its reproduction: the same status, and every surface bitwise equal.
fn judge_record(opts: &Options, o: &Original, reproduced: Option<&String>) -> Result<(RecordPair, Judged)> {
    let mut p = RecordPair {
        alias: o.alias.clone(),
        cell: o.doc.cell.key.clone(),
        original: o.digest.clone(),
        reproduced: reproduced.cloned(),
        status: o.doc.outcome.status,
        surfaces: BTreeMap::new(),
    };
    let (holds, reproduced) = match reproduced {
        None => (false, "not reproduced (the cell was not sealed)".to_string()),
        Some(d) => {
            let ndir = opts.out.join(d);
            verify_record(&ndir)?;
            let ndoc = read_cell(&ndir)?;
            if ndoc.outcome.status != o.doc.outcome.status {
                (false, format!("status {}", ndoc.outcome.status.name()))
            } else if o.record.is_none() {
                (true, format!("status {} (no surfaces)", ndoc.outcome.status.name()))
            } else {
                compare_surfaces(&opts.results.join(&o.digest), &ndir, &mut p.surfaces)?
            }
        }
    };
    let judged = Judged {
        kind: "surfaces",
        what: record_name(&o.alias, &o.doc.cell.key),
        original: format!("{} {}", short(&o.digest), o.doc.outcome.status.name()),
        reproduced,
        holds,
    };
    Ok((p, judged))
}

/// Every surface of two records compared, each shown in `shown`; whether they all agree, and
/// how they do.
fn compare_surfaces(original: &Path, reproduced: &Path, shown: &mut BTreeMap<String, String>) -> Result<(bool, String)> {
    let cmp = crate::oracle::compare(original, reproduced)?;
    // A surface neither record has (a fail-closed run's) is reproduced too.
    let absent = |s: &crate::oracle::SurfaceComparison| matches!(s.outcome, Outcome::Missing { in_a: false, in_b: false });
    for s in &cmp {
        let v = serde_json::to_value(&s.outcome)?;
        let how = if s.is_exact() {
            "exact".into()
        } else if absent(s) {
            "absent in both".into()
        } else {
            compact(&v)
        };
        shown.insert(s.surface.clone(), how);
    }
    let differing: Vec<&str> = cmp.iter().filter(|s| !s.is_exact() && !absent(s)).map(|s| s.surface.as_str()).collect();
    let exact = cmp.iter().filter(|s| s.is_exact()).count();
    Ok(match (differing.is_empty(), cmp.len() - exact) {
        (true, 0) => (true, format!("{exact} surfaces bitwise equal")),
        (true, n) => (true, format!("{exact} surfaces bitwise equal, {n} absent in both")),
        (false, _) => (false, format!("differs in {}", differing.join(", "))),
    })
}

/// A value assertion of the ledger, checked on the reproduced record.
fn judge_value(a: &claims::Assertion, old: &mut Records, new: &mut Records) -> Judged {
    let what = format!("{} {}{} {}", a.record, a.file, a.pointer, serde_json::to_string(&a.expect).unwrap_or_default());
    let value = |r: &mut Records| r.doc(&a.record, &a.file).map(|v| v.pointer(&a.pointer).cloned());
    let o = value(old).ok().flatten();
    let (holds, reproduced) = match value(new) {
        Ok(v) => {
            let (ok, detail) = claims::check(v.as_ref(), &a.expect);
            let detail = if detail.len() <= 80 { format!(" ({detail})") } else { String::new() };
            (ok, format!("{}{detail}", shown(v.as_ref())))
        }
        Err(e) => (false, format!("{e:#}")),
    };
    Judged { kind: "value", what, original: shown(o.as_ref()), reproduced, holds }
}

fn interval(lo: Option<f64>, hi: Option<f64>) -> String {
    match (lo, hi) {
        (Some(l), Some(h)) => format!("[{l:.6}, {h:.6}]"),
        _ => "no interval".into(),
    }
}

/// [`TIMING_RULE`]: two intervals overlap; a missing (or non-finite) interval never holds.
fn overlap(a: (Option<f64>, Option<f64>), b: (Option<f64>, Option<f64>)) -> bool {
    match (a, b) {
        ((Some(lo), Some(hi)), (Some(lo2), Some(hi2))) => [lo, hi, lo2, hi2].iter().all(|x| x.is_finite()) && lo.max(lo2) <= hi.min(hi2),
        _ => false,
    }
}

fn judge_replay(rp: &Replay, old: &mut Records, new: &mut Records) -> Vec<Judged> {
    match rp {
        Replay::Criterion { a, b, metric, min_difference, expect } => {
            let (holds, reproduced) = match claims::criterion(new, a, b, metric, *min_difference) {
                Ok(got) => (got.holds == expect.holds, got.show(*min_difference)),
                Err(e) => (false, format!("{e:#}")),
            };
            vec![Judged {
                kind: "criterion",
                what: format!("criterion {}{}", metric.file, metric.pointer),
                original: expect.show(*min_difference),
                reproduced,
                holds,
            }]
        }
        Replay::Fault { record, cell, control, expect } => {
            let mut r = claims::Report { claim: String::new(), statement: String::new(), ok: true, items: Vec::new() };
            claims::fault_item(&mut r, new, record, *cell, control.as_deref(), expect);
            r.items
                .into_iter()
                .map(|i| Judged {
                    kind: "fault",
                    what: i.what,
                    original: if expect.passed {
                        "validated".into()
                    } else {
                        format!("not validated: {}", compact(&serde_json::to_value(expect).unwrap_or_default()))
                    },
                    reproduced: i.detail,
                    holds: i.ok,
                })
                .collect()
        }
        Replay::PairedRatio { pairs, metric, level, expect } => {
            let what = format!("paired ratio {}{} over {} pairs", metric.file, metric.pointer, pairs.len());
            let original = format!("{:.6} {}", expect.ratio, interval(expect.lo, expect.hi));
            let (holds, reproduced) = match claims::paired(new, pairs, metric, *level) {
                Ok(p) => (overlap((expect.lo, expect.hi), (p.lo, p.hi)), format!("{:.6} {}", p.ratio, interval(p.lo, p.hi))),
                Err(e) => (false, format!("{e:#}")),
            };
            vec![Judged { kind: "timing", what, original, reproduced, holds }]
        }
        Replay::Exactness { oracle, candidates, expect } => candidates
            .iter()
            .map(|cand| {
                let exact = |r: &mut Records| -> Result<(bool, Vec<String>)> {
                    let (o, d) = (r.dir(oracle)?, r.dir(cand)?);
                    crate::oracle::exactness(crate::oracle::Relation::AllSurfaces, &o, &d)
                };
                let show = |x: &Result<(bool, Vec<String>)>| match x {
                    Ok((true, _)) => "bitwise exact".to_string(),
                    Ok((false, d)) => format!("differs in {}", d.join(", ")),
                    Err(e) => format!("{e:#}"),
                };
                let (o, n) = (exact(&mut *old), exact(&mut *new));
                Judged {
                    kind: "exactness",
                    what: format!("exactness {cand} vs {oracle} (stated {})", if *expect { "exact" } else { "not exact" }),
                    original: show(&o),
                    reproduced: show(&n),
                    holds: matches!(n, Ok((e, _)) if e == *expect),
                }
            })
            .collect(),
        Replay::Admission { records, expect } => records
            .iter()
            .zip(expect)
            .map(|(alias, want)| {
                let (holds, reproduced) = match claims::replay_admission(&*new, alias) {
                    Ok((got, stored)) => (got == *want && got == stored, format!("{} (sealed: {})", admission(got), admission(stored))),
                    Err(e) => (false, format!("{e:#}")),
                };
                Judged { kind: "admission", what: format!("admission {alias}"), original: admission(*want).into(), reproduced, holds }
            })
            .collect(),
    }
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = format!("reproduction of claim {}: {}\n", self.claim, self.statement);
        for w in &self.warnings {
            s += &format!("  warning: {w}\n");
        }
        s += &format!("  timing rule: {}\n", self.timing_rule);
        for j in &self.assertions {
            s += &format!(
                "  {:<5} {:<10} {}: original {}; reproduced {}\n",
                if j.holds { "holds" } else { "FAILS" },
                j.kind,
                j.what,
                j.original,
                j.reproduced
            );
        }
        s += &format!("reproduction {}\n", if self.holds { "holds" } else { "FAILED" });
        s
    }
}

/// Seals the report (JSON and text) like a record under `out`; the same report sealed again
/// (a rerun after the cells are done) is the same record.
fn seal_report(r: &Report, out: &Path) -> Result<PathBuf> {
    let staging = out.join("reports").join(format!(".{}.{}", r.claim.replace('/', "_"), std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    crate::util::write_new_durable(&staging.join(REPORT_JSON), (serde_json::to_string_pretty(r)? + "\n").as_bytes())?;
    crate::util::write_new_durable(&staging.join(REPORT_TEXT), r.to_text().as_bytes())?;
    let prepared = prepare_seal(&staging)?;
    let target = out.join(prepared.digest());
    if target.exists() {
        verify_record(&target)?;
        std::fs::remove_dir_all(&staging)?;
        return Ok(target);
    }
    Ok(prepared.finish(out)?.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_differs_by_the_typed_fields_that_make_it_one_and_a_device_not_by_its_free_memory() {
        let ours = crate::engine::identity();
        assert!(build_differences(&ours, &ours).is_empty());
        let mut theirs = ours.clone();
        theirs.patches[0].sha256 = "0".repeat(64).into();
        theirs.build_key = "another key".into();
        let d = build_differences(&theirs, &ours);
        assert_eq!(d.iter().map(|(name, ..)| *name).collect::<Vec<_>>(), ["patch digests"], "{d:?}");
        assert!(d[0].1.contains(&"0".repeat(64)) && !d[0].2.contains(&"0".repeat(64)), "{d:?}");
        let cpu = Device {
            name: "CPU".into(),
            description: "a CPU".into(),
            kind: "cpu".into(),
            memory_total: 1 << 30,
            memory_free: 1 << 29,
            device_id: None,
        };
        let later = Device { memory_free: 1 << 28, ..cpu.clone() };
        assert_eq!(device_itself(&cpu), device_itself(&later));
        assert_ne!(device_itself(&cpu), device_itself(&Device { memory_total: 2 << 30, ..cpu.clone() }));
    }

    #[test]
    fn timing_holds_only_on_overlapping_intervals() {
        let i = |lo: f64, hi: f64| (Some(lo), Some(hi));
        assert!(overlap(i(0.30, 0.35), i(0.34, 0.40)));
        assert!(overlap(i(0.30, 0.35), i(0.35, 0.40)), "touching intervals overlap");
        assert!(overlap(i(0.30, 0.35), i(0.10, 0.90)));
        assert!(!overlap(i(0.30, 0.35), i(0.36, 0.40)));
        assert!(!overlap(i(0.30, 0.35), i(0.20, 0.29)));
        assert!(!overlap(i(0.30, 0.35), (None, None)), "no interval: not judged to hold");
        assert!(!overlap((None, None), (None, None)));
        assert!(!overlap(i(0.30, 0.35), i(f64::NAN, f64::NAN)));
    }

    #[test]
    fn campaign_paths_stay_inside_the_input_directory() {
        let (root, base) = (Path::new("/r"), Path::new("/r/base"));
        assert_eq!(inside(root, base, "../models/m.gguf"), Some(PathBuf::from("/r/models/m.gguf")));
        assert_eq!(inside(root, base, "prompts/./p.txt"), Some(PathBuf::from("/r/base/prompts/p.txt")));
        assert_eq!(inside(root, base, "../../m.gguf"), None);
        assert_eq!(inside(root, base, "a/../../../m.gguf"), None);
        assert_eq!(inside(root, base, "/abs/m.gguf"), None);
    }

    #[test]
    fn long_values_are_shown_by_size_and_digest() {
        assert_eq!(shown(None), "absent");
        assert_eq!(shown(Some(&Value::from(181))), "181");
        let long = Value::from(vec!["a".repeat(64); 3]);
        let s = shown(Some(&long));
        assert!(s.starts_with("<array of 3, sha256 ") && s.len() < 50, "{s}");
    }
}
