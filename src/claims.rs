//! The claim ledger: claim ids mapped to sealed records and to assertions whose expected
//! values are data. `verify` re-hashes every file of every record a claim names and checks its
//! assertions offline; `replay` recomputes the claim's summaries (paired ratios and intervals,
//! exactness, admission predicates) from the records' raw operands and compares them with the
//! values the ledger states.
//!
//! # Ledger format (JSON, default `claims/ledger.json`)
//!
//! ```json
//! {
//!   "format": "sovereign.claims/1",
//!   "claims": {
//!     "C2": {
//!       "statement": "F finishes in 32.3% of D's complete wall time",
//!       "records": { "D1": "<64-hex digest>", "F1": "<64-hex digest>" },
//!       "assertions": [
//!         { "record": "F1", "pointer": "/counts/generated_tokens", "expect": { "eq": 128 } },
//!         { "record": "F1", "file": "cell.json", "pointer": "/outcome/wall_s", "expect": { "approx": { "value": 32.8, "tolerance": 0.5 } } },
//!         { "record": "F1", "pointer": "/surfaces/logits/unit_sha256", "expect": { "len": 135 } },
//!         { "record": "F1", "pointer": "/timing/decode_s", "expect": { "gt": 0 } }
//!       ],
//!       "replay": [
//!         { "paired_ratio": { "pairs": [["D1", "F1"]], "metric": { "file": "cell.json", "pointer": "/outcome/wall_s" },
//!                             "level": 0.95, "expect": { "ratio": 0.3229, "lo": null, "hi": null, "tolerance": 1e-6 } } },
//!         { "exactness": { "oracle": "O", "candidates": ["D1", "F1"], "expect": true } },
//!         { "admission": { "records": ["D1", "F1"], "expect": [true, true] } },
//!         { "fault": { "record": "F1", "cell": "short_read", "control": "C1",
//!                      "expect": { "passed": true, "failed": [] } } }
//!       ]
//!     }
//!   }
//! }
//! ```
//!
//! `records` maps aliases to record digests; a record is found at `<results>/<digest>`.
//! `file` defaults to `record.json`; pointers are RFC 6901. Checks: `eq` (JSON equality,
//! numbers compared as numbers), `approx` (`|actual − value| ≤ tolerance`), `len` (array,
//! string or object size), `gt`, `ge`. Paired ratios are b/a for each `[a, b]` pair.
//!
//! A `fault` entry is a fault cell's validator (seed 000 Table 7) applied to its record against
//! the block's control record; `verify` and `replay` both recompute it. It holds only when the
//! recomputed validation passed and equals both the stated one and the one the record's
//! `cell.json` carries: a fault cell that never fired, a fatal cell with output or a recoverable
//! cell not exact against its control fails the claim, its failing checks named.

use crate::campaign::admission::{self, Operands};
use crate::campaign::read_cell;
use crate::campaign::spec::{default_file, FaultCell, Operand};
use crate::oracle::fault::Verdict;
use crate::oracle::{exactness, Relation};
use crate::record::verify_record;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const LEDGER_FORMAT: &str = "sovereign.claims/1";
pub const DEFAULT_LEDGER: &str = "claims/ledger.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ledger {
    pub format: String,
    pub claims: BTreeMap<String, Claim>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub statement: String,
    /// Alias → record digest.
    pub records: BTreeMap<String, String>,
    #[serde(default)]
    pub assertions: Vec<Assertion>,
    #[serde(default)]
    pub replay: Vec<Replay>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assertion {
    pub record: String,
    #[serde(default = "default_file")]
    pub file: String,
    pub pointer: String,
    pub expect: Check,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    Eq(Value),
    Approx { value: f64, tolerance: f64 },
    Len(u64),
    Gt(f64),
    Ge(f64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Replay {
    /// Paired geometric ratio b/a with its paired-log t interval.
    PairedRatio { pairs: Vec<[String; 2]>, metric: Operand, level: f64, expect: PairedExpect },
    /// Every candidate is exact against the oracle record under `all_surfaces`.
    Exactness { oracle: String, candidates: Vec<String>, expect: bool },
    /// The admission predicate of each record, recomputed from its cell.json operands.
    Admission { records: Vec<String>, expect: Vec<Option<bool>> },
    /// A fault cell's validation, recomputed from its record and its control's.
    Fault { record: String, cell: FaultCell, control: Option<String>, expect: Verdict },
    /// A prespecified criterion: `mean(b) - mean(a) >= min_difference` over the records'
    /// `metric`, stated whether it held or not.
    Criterion { a: Vec<String>, b: Vec<String>, metric: Operand, min_difference: f64, expect: CriterionExpect },
}

/// What a criterion gave: each side's mean and whether it held.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriterionExpect {
    pub mean_a: f64,
    pub mean_b: f64,
    pub holds: bool,
    pub tolerance: f64,
}

impl CriterionExpect {
    /// The criterion over each side's values (none: no mean, an error).
    pub fn of(a: &[f64], b: &[f64], min_difference: f64) -> Result<CriterionExpect> {
        let mean = |v: &[f64], side: &str| -> Result<f64> {
            if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
                bail!("criterion: arm {side} has no finite value to average ({} values)", v.len());
            }
            Ok(v.iter().sum::<f64>() / v.len() as f64)
        };
        let (mean_a, mean_b) = (mean(a, "a")?, mean(b, "b")?);
        Ok(CriterionExpect { mean_a, mean_b, holds: mean_b - mean_a >= min_difference, tolerance: 1e-9 })
    }

    /// `mean_b - mean_a = d >= min: held` as the ledger and reports show it.
    pub fn show(&self, min_difference: f64) -> String {
        format!(
            "{:.6} - {:.6} = {:.6} >= {min_difference}: {}",
            self.mean_b,
            self.mean_a,
            self.mean_b - self.mean_a,
            if self.holds { "holds" } else { "does not hold" }
        )
    }
}

/// The criterion recomputed from the records' own values.
pub fn criterion(recs: &mut Records, a: &[String], b: &[String], metric: &Operand, min_difference: f64) -> Result<CriterionExpect> {
    let values = |recs: &mut Records, side: &[String]| side.iter().map(|x| recs.number(x, metric)).collect::<Result<Vec<f64>>>();
    let (va, vb) = (values(recs, a)?, values(recs, b)?);
    CriterionExpect::of(&va, &vb, min_difference)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedExpect {
    pub ratio: f64,
    pub lo: Option<f64>,
    pub hi: Option<f64>,
    pub tolerance: f64,
}

/// One line of a verify or replay report.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub claim: String,
    pub statement: String,
    pub ok: bool,
    pub items: Vec<Item>,
}

impl Report {
    fn push(&mut self, what: String, ok: bool, detail: String) {
        self.ok &= ok;
        self.items.push(Item { what, ok, detail });
    }
}

/// How a claim is checked.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checking {
    /// Pair records from different nodes (by default a pair must share its node).
    pub allow_mixed_nodes: bool,
    /// Accept a plain claim ID from a ledger that is not sealed: nothing then binds the claim
    /// to what was published, so this is asked for by name.
    pub unanchored: bool,
}

/// The ledger file of a sealed ledger directory (`results/ledgers/<digest>/`).
pub const LEDGER_FILE: &str = "ledger.json";

pub fn load_ledger(path: &Path) -> Result<Ledger> {
    Ok(load_ledger_sealed(path)?.0)
}

/// The ledger at `path` (a ledger file, or a sealed ledger directory) and, when it is sealed,
/// its digest. A sealed ledger whose files no longer match their seal is refused.
pub fn load_ledger_sealed(path: &Path) -> Result<(Ledger, Option<String>)> {
    let sealed_dir = if path.is_dir() {
        Some(path.to_path_buf())
    } else {
        path.parent()
            .filter(|d| path.file_name().is_some_and(|n| n == LEDGER_FILE) && d.join(crate::record::MANIFEST_FILE).is_file())
            .map(Path::to_path_buf)
    };
    let digest = match &sealed_dir {
        Some(d) => Some(
            crate::record::verify_record(d).with_context(|| format!("{}: the ledger was changed after it was sealed", d.display()))?.digest,
        ),
        None => None,
    };
    let file = sealed_dir.as_ref().map_or_else(|| path.to_path_buf(), |d| d.join(LEDGER_FILE));
    let text = crate::bounds::read_text("the ledger", &file, crate::bounds::MAX_LEDGER_BYTES)?;
    let l: Ledger = serde_json::from_str(&text).with_context(|| format!("{}: not a claim ledger", file.display()))?;
    if l.format != LEDGER_FORMAT {
        bail!("{}: format {:?}, expected {LEDGER_FORMAT:?}", file.display(), l.format);
    }
    Ok((l, digest))
}

/// Seals `ledger` like a record: `results/ledgers/<digest>/ledger.json` with its manifest,
/// read-only, the digest its identity. The same ledger sealed again is found in place.
pub fn seal_ledger(results: &Path, ledger: &Ledger) -> Result<PathBuf> {
    let root = results.join("ledgers");
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let staging = root.join(format!(".staging-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    std::fs::create_dir(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let text = serde_json::to_string_pretty(ledger)? + "\n";
    crate::util::write_new_durable(&staging.join(LEDGER_FILE), text.as_bytes())?;
    let prepared = crate::record::prepare_seal(&staging)?;
    let target = root.join(prepared.digest());
    if target.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
        crate::record::verify_record(&target)?;
        return Ok(target);
    }
    Ok(prepared.finish(&root)?.dir)
}

/// The report line that says whether the ledger is sealed.
fn ledger_item(r: &mut Report, sealed: &Option<String>) {
    let detail = match sealed {
        Some(d) => format!("sealed as {d}: its files match their seal"),
        None => "not sealed (a ledger file as written: bound only by an ID@DIGEST anchor, else checked --unanchored)".to_string(),
    };
    r.push("ledger".into(), true, detail);
}

impl Claim {
    /// The claim's identity: the SHA-256 of its canonical JSON (statement, records by digest,
    /// assertions with their tolerances, replays). A claim anchored by it (`ID@DIGEST`) cannot
    /// be weakened or re-pointed without the digest changing.
    pub fn digest(&self) -> Result<String> {
        Ok(crate::util::sha256(crate::util::canonical_json_of(self)?.as_bytes()))
    }

    /// Why the claim asserts nothing, if it does not: no assertion and no replay, or a
    /// tolerance that admits every value (at least the stated value's own magnitude, or not
    /// finite).
    pub fn vacuous(&self) -> Option<String> {
        if self.assertions.is_empty() && self.replay.is_empty() {
            return Some("it has no assertions and nothing to replay".into());
        }
        let wide = |value: f64, tol: f64| !tol.is_finite() || !value.is_finite() || tol < 0.0 || (value != 0.0 && tol >= value.abs());
        for a in &self.assertions {
            match &a.expect {
                Check::Approx { value, tolerance } if wide(*value, *tolerance) => {
                    return Some(format!("{} {}{}: tolerance {tolerance} admits any value near {value}", a.record, a.file, a.pointer));
                }
                Check::Gt(y) | Check::Ge(y) if !y.is_finite() => {
                    return Some(format!("{} {}{}: bound {y} is not finite", a.record, a.file, a.pointer))
                }
                _ => {}
            }
        }
        for r in &self.replay {
            if let Replay::PairedRatio { expect, .. } = r {
                if wide(expect.ratio, expect.tolerance) {
                    return Some(format!("paired ratio: tolerance {} admits any ratio near {}", expect.tolerance, expect.ratio));
                }
            }
        }
        None
    }
}

/// The claim `ID` of the ledger, or `ID@DIGEST`: then its digest must be DIGEST. A vacuous
/// claim is refused either way.
pub fn claim<'a>(l: &'a Ledger, id: &str, path: &Path) -> Result<&'a Claim> {
    let (name, anchor) = split_anchor(id);
    let c = l.claims.get(name).with_context(|| {
        format!("{}: no claim {name:?} (claims: {})", path.display(), l.claims.keys().cloned().collect::<Vec<_>>().join(", "))
    })?;
    let digest = c.digest()?;
    if let Some(want) = anchor.filter(|&d| d != digest) {
        bail!("{}: claim {name:?} has digest {digest}, not the anchored {want}: it was changed after it was published", path.display());
    }
    if let Some(why) = c.vacuous() {
        bail!("{}: claim {name:?} is vacuous: {why}", path.display());
    }
    Ok(c)
}

fn split_anchor(id: &str) -> (&str, Option<&str>) {
    match id.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (id, None),
    }
}

/// The ledger at `path` and its claim `id`, bound to what was published: by the claim's digest
/// (`ID@DIGEST`) or by the ledger's seal. A plain ID from a ledger file that is not sealed binds
/// nothing (anyone can rewrite the file and its claim with it) and is refused unless
/// `unanchored` says so. Returns the ledger and its seal's digest, if sealed.
pub fn anchored_ledger(path: &Path, id: &str, unanchored: bool) -> Result<(Ledger, Option<String>)> {
    let (l, sealed) = load_ledger_sealed(path)?;
    let (name, anchor) = split_anchor(id);
    if anchor.is_none() && sealed.is_none() && !unanchored {
        let digest = l.claims.get(name).map(Claim::digest).transpose()?;
        let hint = digest.map_or(String::new(), |d| format!(" (--claim {name}@{d}, as `export` prints it)"));
        bail!(
            "{}: claim {name:?} is not anchored: the ledger is not sealed and the claim is not given as ID@DIGEST{hint}; \
             give the published digest, or the sealed ledger (results/ledgers/<digest>), or --unanchored to check it as it stands",
            path.display()
        );
    }
    Ok((l, sealed))
}

/// Every record of the claim that belongs to a campaign must name the campaign's frozen
/// preregistration by its digest: the frozen file under `results` is hashed again.
fn check_preregistration(r: &mut Report, recs: &mut Records) {
    let mut seen = std::collections::BTreeMap::new();
    for alias in recs.claim.records.keys().cloned().collect::<Vec<_>>() {
        let Ok(dir) = recs.dir(&alias) else { continue };
        if !dir.join(crate::campaign::document::CELL_FILE).is_file() {
            continue;
        }
        let named = crate::campaign::document::read_cell(&dir).map(|d| (d.campaign.id, d.campaign.sha256));
        let (id, sha) = match named {
            Ok(x) => x,
            Err(e) => {
                r.push(format!("record {alias} campaign"), false, format!("{e:#}"));
                continue;
            }
        };
        // The JSON's digest, and whether the YAML frozen beside it parses to the same campaign.
        let frozen = seen.entry(id.clone()).or_insert_with(|| {
            crate::campaign::frozen_json(&recs.results, &id)
                .map(|(_, d)| {
                    let yaml = crate::campaign::frozen_yaml_agrees(&recs.results, &id, &d).map_err(|e| format!("{e:#}"));
                    (d, yaml)
                })
                .map_err(|e| format!("{e:#}"))
        });
        let (ok, detail) = match frozen {
            Ok((d, _)) if *d != sha => (false, format!("campaign {id}: the record names {sha}, the frozen preregistration hashes to {d}")),
            Ok((_, Err(e))) => (false, format!("campaign {id}: {e}")),
            Ok(_) => (true, format!("campaign {id} {sha}: the frozen preregistration (campaign.json, campaign.yaml) hashes to it")),
            Err(e) => (false, format!("campaign {id}: {e}")),
        };
        r.push(format!("record {alias} campaign"), ok, detail);
    }
    // The journal of each campaign must agree with the records: what it sealed, and nothing more.
    for id in seen.keys() {
        let (ok, detail) = match crate::campaign::audit::journal_disagreements(&recs.results, id) {
            Ok(d) if d.is_empty() => (true, "the journal names exactly the campaign's records, with their outcomes".to_string()),
            Ok(d) => (false, d.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
            Err(e) => (false, format!("{e:#}")),
        };
        r.push(format!("campaign {id} journal"), ok, detail);
    }
}

/// A claim's records as found in one results directory: the originals, or a reproduction's
/// records substituted under the same aliases.
pub struct Records<'a> {
    claim: &'a Claim,
    results: PathBuf,
    docs: BTreeMap<(String, String), Value>,
    allow_mixed_nodes: bool,
}

impl<'a> Records<'a> {
    pub fn new(claim: &'a Claim, results: &Path, allow_mixed_nodes: bool) -> Records<'a> {
        Records { claim, results: results.to_path_buf(), docs: BTreeMap::new(), allow_mixed_nodes }
    }

    pub fn dir(&self, alias: &str) -> Result<PathBuf> {
        let d = self.claim.records.get(alias).with_context(|| format!("record alias {alias:?} is not in the claim's `records`"))?;
        record_dir(&self.results, d)
    }

    pub fn doc(&mut self, alias: &str, file: &str) -> Result<&Value> {
        let key = (alias.to_string(), file.to_string());
        if !self.docs.contains_key(&key) {
            let p = self.dir(alias)?.join(inside_record(file)?);
            let text = crate::bounds::read_text("a record document", &p, crate::bounds::MAX_RECORD_JSON_BYTES)?;
            let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", p.display()))?;
            self.docs.insert(key.clone(), v);
        }
        Ok(&self.docs[&key])
    }

    /// The node a record ran on (None: not recorded, e.g. a failed cell or an older record).
    fn node(&mut self, alias: &str) -> Option<String> {
        crate::record::format::node_id(self.doc(alias, crate::record::RECORD_FILE).ok()?)
    }

    fn number(&mut self, alias: &str, op: &Operand) -> Result<f64> {
        let v = self.doc(alias, &op.file)?;
        v.pointer(&op.pointer)
            .and_then(Value::as_f64)
            .with_context(|| format!("record {alias}: {} {} is not a number", op.file, op.pointer))
    }
}

/// A record is addressed by its digest only: 64 lowercase hex digits, never a path.
fn record_dir(results: &Path, digest: &str) -> Result<PathBuf> {
    if digest.len() != 64 || !digest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        bail!("record {digest:?}: not a record digest (64 lowercase hex digits)");
    }
    Ok(results.join(digest))
}

/// A file of a record: a relative path of plain names, so it can only name a file inside the
/// record (a verified record holds no symbolic links).
fn inside_record(file: &str) -> Result<&str> {
    let ok = !file.is_empty()
        && !file.starts_with('/')
        && file.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\\') && !c.contains('\0'));
    if !ok {
        bail!("file {file:?}: not a path inside the record (relative, no `.`, `..` or empty parts)");
    }
    Ok(file)
}

/// Every decimal number of a statement must be rendered from a replayed value: the number as
/// printed equals one of `values` (or 100× one, before a `%`) rounded to the printed digits.
fn check_statement(statement: &str, values: &[f64]) -> (bool, String) {
    let b = statement.as_bytes();
    let mut bad = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.')) {
            let start = if i > 0 && b[i - 1] == b'-' { i - 1 } else { i };
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
                j += 1;
                let frac = j;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                let text = &statement[start..j];
                let digits = (j - frac) as i32;
                let percent = statement[j..].starts_with('%');
                let printed: f64 = text.parse().unwrap_or(f64::NAN);
                let matches = values.iter().any(|v| {
                    let v = if percent { v * 100.0 } else { *v };
                    format!("{:.*}", digits as usize, v).parse::<f64>().ok() == Some(printed)
                });
                if !matches {
                    bad.push(text.to_string());
                }
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    if bad.is_empty() {
        (true, "every number stated is a replayed value".into())
    } else {
        (false, format!("states {} which no replayed value gives", bad.join(", ")))
    }
}

/// The paired ratios the claim replays, recomputed from the records' operands.
fn replayed_values(recs: &mut Records) -> Vec<f64> {
    let mut out = Vec::new();
    let claim = recs.claim;
    for rp in &claim.replay {
        match rp {
            Replay::PairedRatio { pairs, metric, level, .. } => {
                if let Ok(p) = paired(recs, pairs, metric, *level) {
                    out.extend([Some(p.ratio), p.lo, p.hi].into_iter().flatten());
                }
            }
            Replay::Criterion { a, b, metric, min_difference, .. } => {
                if let Ok(k) = criterion(recs, a, b, metric, *min_difference) {
                    out.extend([k.mean_b, k.mean_a, k.mean_b - k.mean_a, *min_difference]);
                }
            }
            Replay::Exactness { .. } | Replay::Admission { .. } | Replay::Fault { .. } => {}
        }
    }
    out
}

pub fn paired(recs: &mut Records, pairs: &[[String; 2]], metric: &Operand, level: f64) -> Result<crate::stats::PairedRatio> {
    let (mut labels, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for [x, y] in pairs {
        if !recs.allow_mixed_nodes {
            let (nx, ny) = (recs.node(x), recs.node(y));
            if nx != ny {
                let show = |n: &Option<String>| n.as_deref().map_or("not recorded".to_string(), |n| n[..12.min(n.len())].to_string());
                bail!(
                    "pair {x}/{y}: records from different nodes ({} and {}); --allow-mixed-nodes pairs them anyway",
                    show(&nx),
                    show(&ny)
                );
            }
        }
        labels.push(format!("{x}/{y}"));
        a.push(recs.number(x, metric)?);
        b.push(recs.number(y, metric)?);
    }
    crate::stats::paired_ratio(&labels, &a, &b, level)
}

/// Re-hashes every file of every record the claim names; the items name each failing file.
/// What `verify` and `replay` both check before they read a value: every record's files
/// against its seal, and each campaign's frozen preregistration and journal against the
/// records.
fn integrity(r: &mut Report, recs: &mut Records) {
    verify_records(r, recs);
    check_preregistration(r, recs);
}

fn verify_records(r: &mut Report, recs: &Records) {
    for (alias, digest) in &recs.claim.records {
        match record_dir(&recs.results, digest).and_then(|d| verify_record(&d)) {
            Ok(s) => r.push(
                format!("record {alias}"),
                true,
                format!("{digest}: {} files, {} bytes verified", s.manifest.files.len(), s.manifest.total_bytes()),
            ),
            Err(e) => r.push(format!("record {alias}"), false, format!("{e:#}")),
        }
    }
}

pub fn check(actual: Option<&Value>, c: &Check) -> (bool, String) {
    let Some(a) = actual else { return (false, "pointer not found".into()) };
    let num = a.as_f64();
    match c {
        Check::Eq(want) => {
            let ok = match (a.as_f64(), want.as_f64()) {
                (Some(x), Some(y)) => x == y,
                _ => a == want,
            };
            (ok, format!("{a} == {want}"))
        }
        Check::Approx { value, tolerance } => match num {
            Some(x) => ((x - value).abs() <= *tolerance, format!("{x} ≈ {value} ± {tolerance}")),
            None => (false, format!("{a} is not a number")),
        },
        Check::Len(n) => {
            let len = match a {
                Value::Array(v) => Some(v.len()),
                Value::String(s) => Some(s.chars().count()),
                Value::Object(m) => Some(m.len()),
                _ => None,
            };
            match len {
                Some(l) => (l as u64 == *n, format!("len {l} == {n}")),
                None => (false, format!("{a} has no length")),
            }
        }
        Check::Gt(y) => match num {
            Some(x) => (x > *y, format!("{x} > {y}")),
            None => (false, format!("{a} is not a number")),
        },
        Check::Ge(y) => match num {
            Some(x) => (x >= *y, format!("{x} >= {y}")),
            None => (false, format!("{a} is not a number")),
        },
    }
}

/// `sovereign verify --claim ID`.
pub fn verify(ledger_path: &Path, id: &str, results: &Path, how: Checking) -> Result<Report> {
    let (l, sealed) = anchored_ledger(ledger_path, id, how.unanchored)?;
    let c = claim(&l, id, ledger_path)?;
    let mut r = Report { claim: id.to_string(), statement: c.statement.clone(), ok: true, items: Vec::new() };
    ledger_item(&mut r, &sealed);
    let mut recs = Records::new(c, results, how.allow_mixed_nodes);
    integrity(&mut r, &mut recs);
    for a in &c.assertions {
        let what = format!("{} {}{} {}", a.record, a.file, a.pointer, serde_json::to_string(&a.expect).unwrap_or_default());
        match recs.doc(&a.record, &a.file) {
            Ok(v) => {
                let (ok, detail) = check(v.pointer(&a.pointer), &a.expect);
                r.push(what, ok, detail);
            }
            Err(e) => r.push(what, false, format!("{e:#}")),
        }
    }
    let (ok, detail) = check_statement(&c.statement, &replayed_values(&mut recs));
    r.push("statement".into(), ok, detail);
    for rp in &c.replay {
        if let Replay::Fault { record, cell, control, expect } = rp {
            fault_item(&mut r, &recs, record, *cell, control.as_deref(), expect);
        }
    }
    unvalidated_faults(&mut r, &recs);
    Ok(r)
}

/// `verify --rehash-models AT`: every model file the claim's records name (`AT/<file>` where AT
/// is a directory, else AT itself for the models of its file name) hashed again in full and
/// compared with the recorded whole-file sha256 and digest manifest.
pub fn rehash_models(r: &mut Report, ledger_path: &Path, id: &str, results: &Path, at: &Path) -> Result<()> {
    let l = load_ledger(ledger_path)?;
    let c = claim(&l, id, ledger_path)?;
    let recs = Records::new(c, results, true);
    // Err is the report's line itself, shared by every record naming the path (anyhow::Error is not Clone).
    let mut fresh: BTreeMap<PathBuf, std::result::Result<(String, String, f64), String>> = BTreeMap::new();
    for alias in c.records.keys() {
        let rec = match recs.dir(alias).and_then(|d| crate::record::load_typed(&d)) {
            Ok(rec) => rec,
            Err(e) => {
                r.push(format!("models of {alias}"), false, format!("{e:#}"));
                continue;
            }
        };
        for (role, m) in rec.models() {
            let what = format!("model {alias} {role} {}", m.file);
            let path = if at.is_dir() { at.join(&m.file) } else { at.to_path_buf() };
            if !at.is_dir() && path.file_name().map(|n| n.to_string_lossy().into_owned()).as_deref() != Some(m.file.as_str()) {
                r.push(what, false, format!("not re-hashed: {} is not {}", at.display(), m.file));
                continue;
            }
            let got = fresh.entry(path.clone()).or_insert_with(|| {
                let t = std::time::Instant::now();
                crate::inventory::Inventory::of(&path)
                    .and_then(|inv| crate::digests::rehash(&inv))
                    .map(|(sha, manifest)| (sha, manifest, t.elapsed().as_secs_f64()))
                    .map_err(|e| format!("{e:#}"))
            });
            match got {
                Err(e) => r.push(what, false, e.clone()),
                Ok((sha, manifest, secs)) => {
                    let recorded = m.digests.as_ref().map(|d| d.manifest_sha256.as_str());
                    let ok = *sha == m.sha256 && recorded.is_none_or(|d| d == manifest);
                    let mut d = format!("{}: sha256 {sha}, digest manifest {manifest} (re-hashed in {secs:.2} s)", path.display());
                    if *sha != m.sha256 {
                        d += &format!("; the record names sha256 {}", m.sha256);
                    }
                    if let Some(x) = recorded.filter(|x| x != manifest) {
                        d += &format!("; the record names digest manifest {x}");
                    }
                    r.push(what, ok, d);
                }
            }
        }
    }
    Ok(())
}

/// A record of a fault cell that the claim names without a `fault` entry: a ledger cannot
/// leave a cell's validation out.
fn unvalidated_faults(r: &mut Report, recs: &Records) {
    for alias in recs.claim.records.keys() {
        let covered = recs.claim.replay.iter().any(|rp| matches!(rp, Replay::Fault { record, .. } if record == alias));
        let fault = recs.dir(alias).and_then(|d| read_cell(&d)).ok().and_then(|doc| doc.cell.arm.fault);
        if let (Some(f), false) = (fault, covered) {
            r.push(format!("fault {alias} ({})", f.name()), false, "a fault cell's record without its validation in the claim".into());
        }
    }
}

/// Recomputes a fault cell's validation; the item holds only when it passed and agrees with
/// the ledger and with the record's cell.json.
pub fn fault_item(r: &mut Report, recs: &Records, alias: &str, cell: FaultCell, control: Option<&str>, expect: &Verdict) {
    let what = format!("fault {alias} ({})", cell.name());
    let computed = (|| -> Result<(Verdict, String, Verdict)> {
        let dir = recs.dir(alias)?;
        let cdir = control.map(|c| recs.dir(c)).transpose()?;
        let doc = read_cell(&dir)?;
        let recorded = match &doc.fault {
            None => bail!("its cell.json carries no fault validation"),
            Some(f) if f.cell != cell || doc.cell.arm.fault != Some(cell) => {
                bail!("its cell.json is a run of {:?}, not {}", doc.cell.arm.fault.map(|f| f.name()), cell.name())
            }
            Some(f) if f.control.as_deref() != control.and_then(|c| recs.claim.records.get(c)).map(String::as_str) => {
                bail!("its cell.json was validated against control {:?}, not the control named here", f.control)
            }
            Some(f) => f.validation.clone(),
        };
        let (got, detail) = crate::oracle::fault::verdict(cell, &dir, cdir.as_deref());
        Ok((got, detail, recorded))
    })();
    match computed {
        Ok((got, detail, recorded)) => {
            let agrees = &got == expect && recorded == got;
            let mut d = format!("recomputed: {detail}");
            if &got != expect {
                d += &format!("; the ledger states {}", serde_json::to_string(expect).unwrap_or_default());
            }
            if recorded != got {
                d += &format!("; cell.json records {}", serde_json::to_string(&recorded).unwrap_or_default());
            }
            r.push(what, got.passed && agrees, d);
        }
        Err(e) => r.push(what, false, format!("{e:#}")),
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn close_opt(a: Option<f64>, b: Option<f64>, tol: f64) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => close(x, y, tol),
        (None, None) => true,
        _ => false,
    }
}

/// `sovereign replay --claim ID`.
pub fn replay(ledger_path: &Path, id: &str, results: &Path, how: Checking) -> Result<Report> {
    let (l, sealed) = anchored_ledger(ledger_path, id, how.unanchored)?;
    let c = claim(&l, id, ledger_path)?;
    let mut r = Report { claim: id.to_string(), statement: c.statement.clone(), ok: true, items: Vec::new() };
    ledger_item(&mut r, &sealed);
    let mut recs = Records::new(c, results, how.allow_mixed_nodes);
    // Recomputing from damaged operands proves nothing: everything `verify` checks of the
    // records, their campaigns and journals holds first.
    integrity(&mut r, &mut recs);
    if !r.ok {
        return Ok(r);
    }
    if c.replay.is_empty() {
        r.push("replay".into(), false, "the claim states nothing to replay".into());
    }
    let (ok, detail) = check_statement(&c.statement, &replayed_values(&mut recs));
    r.push("statement".into(), ok, detail);
    for rp in &c.replay {
        match rp {
            Replay::PairedRatio { pairs, metric, level, expect } => {
                let what = format!("paired ratio {} over {} pairs", metric.pointer, pairs.len());
                let computed = paired(&mut recs, pairs, metric, *level);
                match computed {
                    Ok(p) => {
                        let ok = close(p.ratio, expect.ratio, expect.tolerance)
                            && close_opt(p.lo, expect.lo, expect.tolerance)
                            && close_opt(p.hi, expect.hi, expect.tolerance);
                        let detail = format!(
                            "recomputed {:.6} [{}, {}] vs stated {:.6} [{}, {}] (tolerance {})",
                            p.ratio,
                            p.lo.map_or("-".into(), |v| format!("{v:.6}")),
                            p.hi.map_or("-".into(), |v| format!("{v:.6}")),
                            expect.ratio,
                            expect.lo.map_or("-".into(), |v| format!("{v:.6}")),
                            expect.hi.map_or("-".into(), |v| format!("{v:.6}")),
                            expect.tolerance
                        );
                        r.push(what, ok, detail);
                    }
                    Err(e) => r.push(what, false, format!("{e:#}")),
                }
            }
            Replay::Exactness { oracle, candidates, expect } => {
                for cand in candidates {
                    let what = format!("exactness {cand} vs {oracle}");
                    match recs
                        .dir(oracle)
                        .and_then(|o| Ok((o, recs.dir(cand)?)))
                        .and_then(|(o, d)| exactness(Relation::AllSurfaces, &o, &d))
                    {
                        Ok((exact, differing)) => {
                            let detail =
                                if exact { "all surfaces exact".to_string() } else { format!("differs in {}", differing.join(", ")) };
                            r.push(what, exact == *expect, format!("{detail} (stated {})", if *expect { "exact" } else { "not exact" }));
                        }
                        Err(e) => r.push(what, false, format!("{e:#}")),
                    }
                }
            }
            Replay::Admission { records, expect } => {
                if records.len() != expect.len() {
                    r.push("admission".into(), false, "records and expect differ in length".into());
                    continue;
                }
                for (alias, want) in records.iter().zip(expect) {
                    let what = format!("admission {alias}");
                    match replay_admission(&recs, alias) {
                        Ok((got, stored)) => r.push(
                            what,
                            got == *want && got == stored,
                            format!("recomputed {got:?}, stated {want:?}, recorded in cell.json {stored:?}"),
                        ),
                        Err(e) => r.push(what, false, format!("{e:#}")),
                    }
                }
            }
            Replay::Fault { record, cell, control, expect } => fault_item(&mut r, &recs, record, *cell, control.as_deref(), expect),
            Replay::Criterion { a, b, metric, min_difference, expect } => {
                let what = format!("criterion {}{}: mean over {} records less mean over {}", metric.file, metric.pointer, b.len(), a.len());
                match criterion(&mut recs, a, b, metric, *min_difference) {
                    Ok(got) => {
                        let ok = close(got.mean_a, expect.mean_a, expect.tolerance)
                            && close(got.mean_b, expect.mean_b, expect.tolerance)
                            && got.holds == expect.holds;
                        r.push(what, ok, format!("recomputed {} vs stated {}", got.show(*min_difference), expect.show(*min_difference)));
                    }
                    Err(e) => r.push(what, false, format!("{e:#}")),
                }
            }
        }
    }
    unvalidated_faults(&mut r, &recs);
    Ok(r)
}

/// The admission predicate of one record recomputed from raw operands: telemetry, cap and
/// validity from its cell.json, exactness by comparing its surfaces with the oracle record.
pub fn replay_admission(recs: &Records, alias: &str) -> Result<(Option<bool>, Option<bool>)> {
    let dir = recs.dir(alias)?;
    let doc = read_cell(&dir)?;
    let exact = match (&doc.oracle.record, doc.outcome.status) {
        (Some(o), crate::campaign::CellStatus::Completed) => {
            let odir = recs.results.join(o);
            verify_record(&odir).with_context(|| format!("the oracle record of {alias}"))?;
            Some(exactness(doc.oracle.relation, &odir, &dir)?.0)
        }
        _ => None,
    };
    let got = admission::evaluate(
        &doc.admission_rule,
        &Operands {
            status: doc.outcome.status,
            valid: doc.validity.valid,
            is_oracle: doc.cell.is_oracle,
            exact,
            memory_cap_bytes: doc.cell.arm.memory_cap_bytes,
            telemetry: &doc.outcome.telemetry,
        },
    );
    Ok((got.passed, doc.admission.passed))
}

impl Report {
    /// One line per item, `ok`/`FAIL`, then a verdict line.
    pub fn to_text(&self, verb: &str) -> String {
        let mut s = format!("claim {}: {}\n", self.claim, self.statement);
        for i in &self.items {
            s += &format!("  {:<4} {}: {}\n", if i.ok { "ok" } else { "FAIL" }, i.what, i.detail);
        }
        s += &format!("{verb} {}\n", if self.ok { "passed" } else { "FAILED" });
        s
    }

    /// The failing items, one line each (for stderr).
    pub fn failures(&self) -> Vec<String> {
        self.items.iter().filter(|i| !i.ok).map(|i| format!("{}: {}", i.what, i.detail)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_criterion_is_judged_when_it_fails_and_refused_without_values() {
        let k = CriterionExpect::of(&[0.5, 0.7], &[0.55, 0.6], -0.01).unwrap();
        assert_eq!((k.mean_a, k.mean_b, k.holds), (0.6, 0.575, false));
        assert!(k.show(-0.01).ends_with("does not hold"), "{}", k.show(-0.01));
        assert!(CriterionExpect::of(&[0.5, 0.7], &[0.55, 0.6], -0.03).unwrap().holds);
        assert!(CriterionExpect::of(&[0.2], &[0.2], 0.0).unwrap().holds, "a difference of 0 meets 0");
        assert!(CriterionExpect::of(&[], &[0.2], 0.0).unwrap_err().to_string().contains("arm a has no finite value"));
        assert!(CriterionExpect::of(&[0.2], &[f64::NAN], 0.0).is_err());
    }

    #[test]
    fn statements_state_only_replayed_values() {
        let s = "campaign c: 4 cells sealed; paired f/d ratio 0.322900, 95% paired-log t interval [0.300000, 0.350000]";
        assert!(check_statement(s, &[0.3229, 0.3, 0.35]).0);
        let (ok, d) = check_statement(&s.replace("0.322900", "9.999999"), &[0.3229, 0.3, 0.35]);
        assert!(!ok && d.contains("9.999999"), "{d}");
        assert!(check_statement("F finishes in 32.3% of D's wall time", &[0.32291]).0);
        assert!(!check_statement("F finishes in 32.3% of D's wall time", &[]).0);
        assert!(check_statement("campaign t-run: 3 cells sealed", &[]).0);
    }

    #[test]
    fn replay_refuses_pairs_from_different_nodes() {
        let t = tempfile::tempdir().unwrap();
        let results = t.path().join("results");
        let seal = |name: &str, node: Option<&str>, x: f64| {
            let st = t.path().join(name);
            std::fs::create_dir_all(&st).unwrap();
            let build = node.map_or(serde_json::json!({}), |n| serde_json::json!({ "node": { "id": n } }));
            std::fs::write(st.join("record.json"), serde_json::json!({ "build": build, "x": x, "name": name }).to_string()).unwrap();
            crate::record::prepare_seal(&st).unwrap().finish(&results).unwrap().digest
        };
        let (n1, n2) = ("1".repeat(64), "2".repeat(64));
        let recs = [seal("a1", Some(&n1), 1.0), seal("b1", Some(&n1), 2.0), seal("a2", Some(&n1), 1.0), seal("b2", Some(&n2), 3.0)];
        let want = crate::stats::paired_ratio(&["1".into(), "2".into()], &[1.0, 1.0], &[2.0, 3.0], 0.95).unwrap();
        let ledger = |pairs: serde_json::Value| {
            let l = serde_json::json!({ "format": LEDGER_FORMAT, "claims": { "c": {
                "statement": "pairs",
                "records": { "a1": recs[0], "b1": recs[1], "a2": recs[2], "b2": recs[3] },
                "assertions": [],
                "replay": [{ "paired_ratio": { "pairs": pairs, "metric": { "file": "record.json", "pointer": "/x" }, "level": 0.95,
                    "expect": { "ratio": want.ratio, "lo": want.lo, "hi": want.hi, "tolerance": 1e-9 } } }] } } });
            let p = t.path().join("ledger.json");
            std::fs::write(&p, l.to_string()).unwrap();
            p
        };
        let p = ledger(serde_json::json!([["a1", "b1"], ["a2", "b2"]]));
        let how = |allow_mixed_nodes| Checking { allow_mixed_nodes, unanchored: true };
        let r = replay(&p, "c", &results, how(false)).unwrap();
        assert!(!r.ok && r.failures().iter().any(|f| f.contains("different nodes")), "{:?}", r.failures());
        let r = replay(&p, "c", &results, how(true)).unwrap();
        assert!(r.ok, "{:?}", r.failures());

        // A plain ID from this unsealed file binds nothing: refused unless asked for, naming
        // the anchored form; anchored by its digest, or from the sealed ledger, it stands.
        let digest = load_ledger(&p).unwrap().claims["c"].digest().unwrap();
        let plain = Checking { allow_mixed_nodes: true, unanchored: false };
        for check in [verify, replay] {
            let e = format!("{:#}", check(&p, "c", &results, plain).unwrap_err());
            assert!(e.contains("is not anchored") && e.contains(&format!("c@{digest}")) && e.contains("--unanchored"), "{e}");
            assert!(check(&p, &format!("c@{digest}"), &results, plain).unwrap().ok);
            let e = format!("{:#}", check(&p, &format!("c@{}", "0".repeat(64)), &results, plain).unwrap_err());
            assert!(e.contains("changed after it was published"), "{e}");
        }
        let sealed = seal_ledger(&results, &load_ledger(&p).unwrap()).unwrap();
        assert!(replay(&sealed, "c", &results, plain).unwrap().ok);
    }

    #[test]
    fn records_and_files_stay_inside_results() {
        let r = Path::new("/results");
        let d = "a".repeat(64);
        assert_eq!(record_dir(r, &d).unwrap(), r.join(&d));
        for bad in [format!("../elsewhere/{d}"), format!("/abs/{d}"), "A".repeat(64), "ab".into()] {
            assert!(record_dir(r, &bad).is_err(), "{bad}");
        }
        assert_eq!(inside_record("sub/cell.json").unwrap(), "sub/cell.json");
        for bad in ["../../x.json", "/etc/passwd", "a/../../b", "./x", "", "a//b"] {
            assert!(inside_record(bad).is_err(), "{bad}");
        }
    }
}
