//! Export: a campaign's sealed records as CSV tables and a figure of the pair ratios.
//!
//! Tables are written with the `csv` crate (RFC 4180, header row, `,` separator, UTF-8), which
//! builds in seconds. DESIGN.md names polars; CRATES.md measured it at 3 min (dev) / 9.5 min
//! (release) of build and a 671 MB dev binary, which CI's 90-minute budget on two cores cannot
//! carry for writing a few hundred rows. Nothing here needs a dataframe.
//!
//! Files written to the output directory:
//! - `cells.csv`: one row per cell (identity, arm, block, order, state, times, bytes, peaks,
//!   events, validity, exactness, admission);
//! - `pairs.csv`: one row per block holding both arms of `analysis.pairs` (a, b, b/a);
//! - `pairs_summary.csv`: the paired geometric ratio and its paired-log t interval;
//! - `pairs.svg`, `pairs.png`: the pair ratios with the overall ratio and interval;
//! - `refine.csv`, `quality_bytes.svg`, `quality_bytes.png` (refinement campaigns): the τ sweep
//!   and the quality-versus-bytes figure with the base and verifier endpoints;
//! - `timeline-<cell>.svg` (Plan cells): the timeline of the decode token each record kept;
//! - `claims.json`: a draft claim ledger for the campaign (records, assertions and replay
//!   values as computed now, every fault cell's validation included), ready for `verify` /
//!   `replay`.

mod figure;
mod refine;
pub mod timeline;

pub use figure::envelope as envelope_figure;
pub use figure::{curves as curves_figure, Curve};

use crate::campaign::{histories, read_cell, CellDocument, CellState};
use crate::campaign::spec::Campaign;
use crate::campaign::expand::block_control;
use crate::campaign::{expand, frozen, journal::Journal, CampaignDir, CellSpec, CellStatus};
use crate::oracle::fault::Verdict;
use crate::claims::{Assertion, Check, Claim, Ledger, PairedExpect, Replay, LEDGER_FORMAT};
use crate::record::{verify_record, EnvelopeRecord, GenerateRecord, ReadReplayRecord, RefineRecord, TypedRecord, RECORD_FILE};
use crate::stats::{paired_ratio, PairedRatio};
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What `export` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSummary {
    pub campaign: String,
    pub cells: usize,
    pub sealed: usize,
    pub pairs: usize,
    pub summary: Option<PairedRatio>,
    /// `analysis.floor`: the arm's decode time per token over its floor, per block. None when
    /// the floor is invalid (see `floor_invalid`): a ratio over a broken floor is not printed.
    pub floor: Option<PairedRatio>,
    /// Why the floor is an invalid measurement: a block whose arm decoded faster than a term of
    /// its floor (its reads alone, or the resident compute), named by block, cell and term.
    pub floor_invalid: Vec<String>,
    /// `analysis.floor.envelope`: the arm's bytes per second over the envelope's best cell,
    /// per block. None when any block's floor or envelope is invalid.
    pub envelope: Option<PairedRatio>,
    /// `analysis.wall`: each arm's mean complete wall time against the baseline's.
    pub walls: Vec<WallRow>,
    /// One row per arm: the bench table.
    pub arms: Vec<ArmRow>,
    pub files: Vec<PathBuf>,
    /// Each drafted claim as `ID@DIGEST`: what `verify` and `replay` take to refuse a claim
    /// changed after it was published.
    pub claims: Vec<String>,
    /// The drafted ledger sealed like a record: `results/ledgers/<digest>` (`verify --ledger`).
    pub ledger: PathBuf,
}

/// One arm of the bench table (`arms.csv`).
#[derive(Debug, Clone, Serialize)]
pub struct ArmRow {
    pub arm: String,
    /// `generate`, `refine`, `envelope` or `read_replay`.
    pub kind: String,
    pub cells: usize,
    pub completed: usize,
    /// Mean over completed cells: decode tokens per second of a run; of a read replay, decode
    /// tokens per second its reads alone allow (1 / read seconds per decode token).
    pub decode_tokens_per_s: Option<f64>,
    /// Completed cells admitted, and cells whose admission was evaluated.
    pub admitted: usize,
    pub admission_evaluated: usize,
    /// Completed cells exact against the oracle, and cells compared (none for the oracle and
    /// measurements).
    pub exact: usize,
    pub compared: usize,
    /// Envelope: the best depth's MiB/s (mean over cells).
    pub read_mib_per_s: Option<f64>,
}

impl ArmRow {
    pub fn header() -> String {
        format!("{:<12} {:<12} {:>6} {:>14} {:>10} {:>8} {:>10}", "arm", "kind", "cells", "decode tok/s", "admitted", "exact", "MiB/s")
    }
    pub fn line(&self) -> String {
        let frac = |k: usize, n: usize| if n == 0 { "-".to_string() } else { format!("{k}/{n}") };
        format!(
            "{:<12} {:<12} {:>6} {:>14} {:>10} {:>8} {:>10}",
            self.arm,
            self.kind,
            format!("{}/{}", self.completed, self.cells),
            self.decode_tokens_per_s.map_or("-".to_string(), |v| format!("{v:.3}")),
            frac(self.admitted, self.admission_evaluated),
            frac(self.exact, self.compared),
            self.read_mib_per_s.map_or("-".to_string(), |v| format!("{v:.1}")),
        )
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The bench table: per arm, over its sealed cells.
fn arm_rows(spec: &Campaign, cells: &[CellSpec], sealed: &BTreeMap<String, Sealed>) -> Vec<ArmRow> {
    spec.arms
        .iter()
        .map(|a| {
            let mine: Vec<&Sealed> = cells.iter().filter(|c| c.arm.id.value == a.id.value).filter_map(|c| sealed.get(&c.key)).collect();
            let done: Vec<&&Sealed> = mine.iter().filter(|x| x.completed()).collect();
            let kind = match (&a.measure, &a.refine) {
                (Some(m), _) => measure_name(m),
                (None, Some(_)) => "refine",
                (None, None) => "generate",
            };
            let tps: Vec<f64> = done
                .iter()
                .filter_map(|x| x.decode_s_per_token().or_else(|| x.read_replay().and_then(ReadReplayRecord::decode_s_per_token)))
                .filter(|&t| t > 0.0)
                .map(|t| 1.0 / t)
                .collect();
            let mib: Vec<f64> = done.iter().filter_map(|x| x.envelope().and_then(|e| e.best.as_ref()).map(|b| b.mib_per_s)).collect();
            ArmRow {
                arm: a.id.value.clone(),
                kind: kind.to_string(),
                cells: cells.iter().filter(|c| c.arm.id.value == a.id.value).count(),
                completed: done.len(),
                decode_tokens_per_s: mean(&tps),
                admitted: mine.iter().filter(|x| x.doc.admission.passed == Some(true)).count(),
                admission_evaluated: mine.iter().filter(|x| x.doc.admission.passed.is_some()).count(),
                exact: mine.iter().filter(|x| x.doc.oracle.exact == Some(true)).count(),
                compared: mine.iter().filter(|x| x.doc.oracle.exact.is_some()).count(),
                read_mib_per_s: mean(&mib),
            }
        })
        .collect()
}

/// One arm of `analysis.wall` against its baseline (`wall.csv`).
#[derive(Debug, Clone, Serialize)]
pub struct WallRow {
    pub arm: String,
    pub baseline: String,
    /// Mean complete wall seconds over the completed cells, and how many.
    pub arm_wall_s: Option<f64>,
    pub arm_cells: usize,
    pub baseline_wall_s: Option<f64>,
    pub baseline_cells: usize,
    /// `baseline_wall_s / arm_wall_s`: how many times faster the arm completed.
    pub speedup: Option<f64>,
}

fn wall_rows(w: &crate::campaign::spec::WallAnalysis, cells: &[CellSpec], sealed: &BTreeMap<String, Sealed>) -> Vec<WallRow> {
    let walls = |arm: &str| -> Vec<f64> {
        cells.iter().filter(|c| c.arm.id.value == arm).filter_map(|c| sealed.get(&c.key)).filter(|x| x.completed()).map(|x| x.doc.outcome.wall_s).collect()
    };
    let base = walls(&w.baseline.value);
    w.arms
        .iter()
        .map(|a| {
            let mine = walls(&a.value);
            let (am, bm) = (mean(&mine), mean(&base));
            WallRow {
                arm: a.value.clone(),
                baseline: w.baseline.value.clone(),
                arm_wall_s: am,
                arm_cells: mine.len(),
                baseline_wall_s: bm,
                baseline_cells: base.len(),
                speedup: am.zip(bm).filter(|(a, _)| *a > 0.0).map(|(a, b)| b / a),
            }
        })
        .collect()
}

/// One block of `analysis.floor`.
struct FloorRow<'a> {
    block: usize,
    order: String,
    arm: (&'a CellSpec, &'a Sealed, f64),
    replay: (&'a CellSpec, &'a Sealed, f64),
    compute: (&'a CellSpec, &'a Sealed, f64),
    /// Decode bytes per token of the arm (its replay's), and the replay's bytes per second.
    bytes_per_token: f64,
    replay_bytes_per_s: f64,
    /// The envelope's best cell in the campaign and its bytes per second.
    envelope: Option<(&'a CellSpec, f64)>,
}

const MIB: f64 = 1048576.0;

impl FloorRow<'_> {
    fn floor(&self) -> f64 {
        self.replay.2.max(self.compute.2)
    }

    /// The arm's decode bytes per second.
    fn arm_bytes_per_s(&self) -> f64 {
        self.bytes_per_token / self.arm.2
    }

    /// Which term of the floor or the envelope this block breaks, if any.
    fn broken_term(&self) -> Option<&'static str> {
        broken_floor(self.arm.2, self.replay.2, self.compute.2)
            .or_else(|| self.envelope.and_then(|(_, e)| beyond_envelope(self.arm_bytes_per_s(), self.replay_bytes_per_s, e)))
    }

    /// Why this block's floor cannot be right, if it cannot.
    fn broken(&self) -> Option<String> {
        let term = self.broken_term()?;
        let (env_cell, env) = self.envelope.map_or((String::new(), f64::NAN), |(c, e)| (c.key.clone(), e / MIB));
        Some(match term {
            "read" | "compute" => {
                let (cell, s) = if term == "read" { (&self.replay.0.key, self.replay.2) } else { (&self.compute.0.key, self.compute.2) };
                format!(
                    "block {}: arm cell {} decoded at {:.6} s/token, faster than the floor's {term} term ({cell}, {s:.6} s/token)",
                    self.block, self.arm.0.key, self.arm.2
                )
            }
            "replay" => format!(
                "block {}: replay cell {} read at {:.1} MiB/s, faster than the envelope's best cell ({env_cell}, {env:.1} MiB/s)",
                self.block,
                self.replay.0.key,
                self.replay_bytes_per_s / MIB
            ),
            _ => format!(
                "block {}: arm cell {} moved {:.1} MiB/s, more than the envelope's best cell ({env_cell}, {env:.1} MiB/s)",
                self.block,
                self.arm.0.key,
                self.arm_bytes_per_s() / MIB
            ),
        })
    }
}

/// Which of a block's read rates exceeds the device's measured ceiling (`replay`: the replay
/// of the arm's reads; `arm`: the arm's own decode), or None. Nothing reads faster than the
/// device does: a rate above the envelope's best cell is a mismeasurement.
fn beyond_envelope(arm_bytes_per_s: f64, replay_bytes_per_s: f64, envelope_bytes_per_s: f64) -> Option<&'static str> {
    if !(replay_bytes_per_s.is_finite() && replay_bytes_per_s <= envelope_bytes_per_s) {
        Some("replay")
    } else if !(arm_bytes_per_s.is_finite() && arm_bytes_per_s <= envelope_bytes_per_s) {
        Some("arm")
    } else {
        None
    }
}

/// The term of a floor that an arm beat (`read`: the replay of its own reads; `compute`: the
/// resident run), or None. An arm cannot decode faster than its reads alone or than the same
/// compute with every expert resident: if it did, the floor was mismeasured, and no ratio over
/// it is a result.
fn broken_floor(arm_s: f64, read_s: f64, compute_s: f64) -> Option<&'static str> {
    if !(arm_s.is_finite() && read_s.is_finite() && compute_s.is_finite()) {
        return Some(if read_s.is_finite() { "compute" } else { "read" });
    }
    if arm_s < compute_s {
        Some("compute")
    } else if arm_s < read_s {
        Some("read")
    } else {
        None
    }
}

/// Per block holding the arm's and the replay's completed cells: the floor and the ratio.
fn floor_rows<'a>(f: &crate::campaign::spec::FloorAnalysis, cells: &'a [CellSpec], sealed: &'a BTreeMap<String, Sealed>) -> Vec<FloorRow<'a>> {
    let find = |block: usize, arm: &str| {
        cells.iter().find(|c| c.block == block && c.arm.id.value == arm).and_then(|c| sealed.get(&c.key).filter(|x| x.completed()).map(|x| (c, x)))
    };
    let blocks: std::collections::BTreeSet<usize> = cells.iter().map(|c| c.block).collect();
    // The envelope's best cell over the whole campaign: the device's ceiling.
    let envelope = f.envelope.as_ref().and_then(|e| {
        cells
            .iter()
            .filter(|c| c.arm.id.value == e.value)
            .filter_map(|c| sealed.get(&c.key).filter(|x| x.completed()).and_then(|x| Some((c, x.envelope()?.best.as_ref()?.mib_per_s * MIB))))
            .max_by(|p, q| p.1.total_cmp(&q.1))
    });
    let mut rows = Vec::new();
    for b in blocks {
        let (Some((ca, xa)), Some((cr, xr))) = (find(b, &f.arm), find(b, &f.replay)) else { continue };
        // The compute term is the least of the compute arm's cells in the block, else of all
        // its cells: one slow (cold, contended) cell must not raise the floor above the arm.
        let least = |mine: &dyn Fn(&CellSpec) -> bool| {
            cells
                .iter()
                .filter(|c| c.arm.id.value == f.compute.value && mine(c))
                .filter_map(|c| sealed.get(&c.key).filter(|x| x.completed()).and_then(|x| Some((c, x, x.decode_s_per_token()?))))
                .min_by(|p, q| p.2.total_cmp(&q.2))
        };
        let Some((cc, xc, c)) = least(&|c| c.block == b).or_else(|| least(&|_| true)) else { continue };
        let (Some(a), Some(r)) = (xa.decode_s_per_token(), xr.read_replay().and_then(ReadReplayRecord::decode_s_per_token)) else {
            continue;
        };
        let Some(d) = xr.read_replay().and_then(|x| x.decode.as_ref()).filter(|d| d.steps > 0) else { continue };
        rows.push(FloorRow {
            block: b,
            order: ca.order.clone(),
            arm: (ca, xa, a),
            replay: (cr, xr, r),
            compute: (cc, xc, c),
            bytes_per_token: d.physical_bytes as f64 / d.steps as f64,
            replay_bytes_per_s: d.physical_bytes as f64 / d.seconds,
            envelope,
        });
    }
    rows
}

/// A one-row summary table: the `names` columns, then the paired ratio (as `ratio`) with its
/// interval and the statistics it came from.
fn write_summary(path: &Path, names: &[(&str, &String)], ratio: &str, pr: &PairedRatio) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    let stats = ["n", "df", "level", ratio, "lo", "hi", "mean_log", "sd_log", "t"];
    w.write_record(names.iter().map(|(n, _)| *n).chain(stats))?;
    let values = [
        pr.n.to_string(),
        pr.df.to_string(),
        pr.level.to_string(),
        pr.ratio.to_string(),
        opt(pr.lo),
        opt(pr.hi),
        pr.mean_log.to_string(),
        opt(pr.sd_log),
        opt(pr.t),
    ];
    w.write_record(names.iter().map(|(_, v)| v.to_string()).chain(values))?;
    w.flush()?;
    Ok(())
}

/// One sealed cell, loaded and verified.
struct Sealed {
    digest: String,
    doc: CellDocument,
    record: Option<TypedRecord>,
}

impl Sealed {
    /// The node the record ran on (None: not recorded).
    fn node(&self) -> Option<&String> {
        self.record.as_ref().and_then(|r| r.build().node.as_ref()).map(|n| &n.id)
    }

    fn generate(&self) -> Option<&GenerateRecord> {
        match &self.record {
            Some(TypedRecord::Generate(r)) => Some(r),
            _ => None,
        }
    }

    fn refine(&self) -> Option<&RefineRecord> {
        match &self.record {
            Some(TypedRecord::Refine(r)) => Some(r),
            _ => None,
        }
    }

    fn read_replay(&self) -> Option<&ReadReplayRecord> {
        match &self.record {
            Some(TypedRecord::ReadReplay(r)) => Some(r),
            _ => None,
        }
    }

    fn envelope(&self) -> Option<&EnvelopeRecord> {
        match &self.record {
            Some(TypedRecord::Envelope(r)) => Some(r),
            _ => None,
        }
    }

    fn completed(&self) -> bool {
        self.doc.outcome.status == CellStatus::Completed
    }

    /// A completed generate run's decode seconds per decode token (the first output comes
    /// from the prefill's logits).
    fn decode_s_per_token(&self) -> Option<f64> {
        let g = self.generate().filter(|_| self.completed())?;
        let steps = g.counts.as_ref()?.generated_tokens.checked_sub(1).filter(|&n| n > 0)?;
        Some(g.timing.as_ref()?.decode_s / steps as f64)
    }
}

/// A record value as a CSV field, written as the record writes it (nothing for none or null).
fn s<T: Serialize>(v: Option<T>) -> String {
    match v.map(serde_json::to_value) {
        None | Some(Ok(Value::Null)) | Some(Err(_)) => String::new(),
        Some(Ok(Value::String(s))) => s,
        Some(Ok(x)) => x.to_string(),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

const CELL_COLUMNS: &[&str] = &[
    "campaign",
    "campaign_sha256",
    "index",
    "cell",
    "arm",
    "block",
    "position",
    "order",
    "experts",
    "source",
    "policy",
    "slots",
    "windows",
    "depth",
    "fault",
    "threads",
    "memory_cap_bytes",
    "state",
    "record",
    "attempt",
    "status",
    "valid",
    "exact",
    "admission",
    "wall_s",
    "load_s",
    "prefill_s",
    "decode_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "prompt_tokens",
    "generated_tokens",
    "model_sha256",
    "binary_sha256",
    "engine_tree_sha256",
    "node",
    "record_bytes",
    "logits_bytes",
    "source_logical_bytes",
    "source_physical_bytes",
    "memory_peak_bytes",
    "memory_max_events",
    "oom_kill_events",
    "swap_peak_bytes",
    "child_max_rss_bytes",
    "error",
    "fault_validated",
    "fault_failed_checks",
    "measure",
    "decode_s_per_token",
    "read_s_per_decode_token",
    "read_s_prefill",
    "replay_depth",
    "envelope_best_depth",
    "envelope_best_mib_per_s",
];

fn cell_row(c: &Campaign, digest: &str, cell: &CellSpec, state: &str, sealed: Option<&Sealed>, record_bytes: Option<u64>) -> Vec<String> {
    let a = &cell.arm;
    let rec = sealed.and_then(|x| x.record.as_ref());
    let doc = sealed.map(|x| &x.doc);
    let generate = sealed.and_then(Sealed::generate);
    let refine = sealed.and_then(Sealed::refine);
    let timing = generate.and_then(|r| r.timing.as_ref());
    let q_run = generate.and_then(|r| r.plan()).map(|p| &p.telemetry.q_run);
    let replay = sealed.and_then(Sealed::read_replay);
    let envelope = sealed.and_then(Sealed::envelope);
    let t = doc.map(|d| &d.outcome.telemetry);
    vec![
        c.id.value.clone(),
        digest.to_string(),
        cell.index.to_string(),
        cell.key.clone(),
        a.id.value.clone(),
        cell.block.to_string(),
        cell.position.to_string(),
        cell.order.clone(),
        opt(a.experts.map(|e| format!("{e:?}").to_lowercase())),
        opt(a.source.map(|v| format!("{v:?}").to_lowercase())),
        opt(a.policy.as_ref()),
        opt(a.slots),
        opt(a.windows),
        opt(a.depth),
        opt(a.fault.map(|f| f.name())),
        opt(a.threads),
        opt(a.memory_cap_bytes),
        state.to_string(),
        opt(sealed.map(|x| &x.digest)),
        opt(doc.map(|d| d.attempt)),
        opt(doc.map(|d| d.outcome.status.name())),
        opt(doc.map(|d| d.validity.valid)),
        opt(doc.and_then(|d| d.oracle.exact)),
        opt(doc.and_then(|d| d.admission.passed)),
        opt(doc.map(|d| d.outcome.wall_s)),
        s(generate.and_then(|r| r.timing.as_ref()).map(|t| t.load_s).or(refine.and_then(|r| r.timing.as_ref()).map(|t| t.load_s))),
        s(timing.map(|t| t.prefill_s)),
        s(timing.map(|t| t.decode_s)),
        s(timing.map(|t| t.prefill_tokens_per_s)),
        s(timing.map(|t| t.decode_tokens_per_s)),
        s(rec.and_then(TypedRecord::prompt_tokens)),
        s(rec.and_then(TypedRecord::generated_tokens)),
        s(rec.and_then(|r| r.model()).map(|m| &m.sha256)),
        s(rec.map(|r| &r.build().binary_sha256)),
        s(rec.map(|r| &r.build().engine.tree_sha256)),
        s(rec.and_then(|r| r.build().node.as_ref()).map(|n| &n.id)),
        opt(record_bytes),
        s(rec.and_then(|r| r.surfaces().get("logits")).map(|l| l.bytes)),
        // Plan arms report their source traffic (Q_run) in the Plan's telemetry.
        s(q_run.map(|q| q.logical_bytes)),
        s(q_run.map(|q| q.physical_bytes)),
        opt(t.and_then(|t| t.memory_peak_bytes)),
        opt(t.and_then(|t| t.memory_max_events)),
        opt(t.and_then(|t| t.oom_kill_events)),
        opt(t.and_then(|t| t.swap_peak_bytes)),
        opt(t.and_then(|t| t.child_max_rss_bytes)),
        opt(doc.and_then(|d| d.outcome.error.clone())),
        opt(doc.and_then(|d| d.fault.as_ref()).map(|f| f.validation.passed)),
        opt(doc.and_then(|d| d.fault.as_ref()).map(|f| f.validation.failed.join(";"))),
        opt(a.measure.as_ref().map(measure_name)),
        opt(sealed.and_then(Sealed::decode_s_per_token)),
        opt(replay.and_then(|r| r.decode_s_per_token())),
        opt(replay.and_then(|r| r.prefill.as_ref()).map(|p| p.seconds)),
        opt(replay.and_then(|r| r.params.as_ref()).map(|p| p.depth)),
        opt(envelope.and_then(|e| e.best.as_ref()).map(|b| b.depth)),
        opt(envelope.and_then(|e| e.best.as_ref()).map(|b| b.mib_per_s)),
    ]
}

fn measure_name(m: &crate::campaign::spec::Measure) -> &'static str {
    match m {
        crate::campaign::spec::Measure::Envelope(_) => "envelope",
        crate::campaign::spec::Measure::ReadReplay(_) => "read_replay",
    }
}

fn number(x: &Sealed, file: &str, pointer: &str) -> Option<f64> {
    if file == crate::campaign::CELL_FILE {
        serde_json::to_value(&x.doc).ok()?.pointer(pointer)?.as_f64()
    } else {
        // The campaign names its metric by JSON pointer into the record as written.
        serde_json::to_value(x.record.as_ref()?).ok()?.pointer(pointer)?.as_f64()
    }
}

/// `sovereign export --campaign ID --out DIR`.
pub fn export(results: &Path, id: &str, out: &Path) -> Result<ExportSummary> {
    let (spec, digest) = frozen(results, id)?;
    let dir = CampaignDir::new(results, id);
    let disagree = crate::campaign::audit::journal_disagreements(results, id)?;
    if let Some(first) = disagree.first() {
        anyhow::bail!(
            "campaign `{id}`: the journal and the records disagree ({} in all; first: {first}); nothing was exported",
            disagree.len()
        );
    }
    let hist = histories(&Journal::read_all(&dir.journal_files()?)?);
    let cells = expand(&spec);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;

    let mut sealed: BTreeMap<String, Sealed> = BTreeMap::new();
    let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
    let mut states: BTreeMap<String, String> = BTreeMap::new();
    for cell in &cells {
        let state = hist.get(&cell.key).map(|h| h.state.clone()).unwrap_or(CellState::Pending);
        let name = match &state {
            CellState::Pending => "pending",
            CellState::Started { .. } => "interrupted",
            CellState::Sealing { .. } => "sealing",
            CellState::Sealed { .. } => "sealed",
            CellState::Skipped { .. } => "skipped",
            CellState::Abandoned => "abandoned",
        };
        states.insert(cell.key.clone(), name.to_string());
        if let CellState::Sealed { digest, .. } = state {
            let rdir = results.join(&digest);
            let v = verify_record(&rdir).with_context(|| format!("cell {}", cell.key))?;
            sizes.insert(cell.key.clone(), v.manifest.total_bytes());
            let doc = read_cell(&rdir)?;
            let record = if rdir.join(RECORD_FILE).is_file() { Some(crate::record::load_typed(&rdir)?) } else { None };
            sealed.insert(cell.key.clone(), Sealed { digest, doc, record });
        }
    }

    let mut files = Vec::new();
    let cells_csv = out.join("cells.csv");
    let mut w = csv::Writer::from_path(&cells_csv).with_context(|| format!("{}: cannot create", cells_csv.display()))?;
    w.write_record(CELL_COLUMNS)?;
    for cell in &cells {
        w.write_record(cell_row(&spec, &digest, cell, &states[&cell.key], sealed.get(&cell.key), sizes.get(&cell.key).copied()))?;
    }
    w.flush()?;
    files.push(cells_csv);

    // Pairs: blocks holding both prespecified arms, both completed.
    let mut pair_rows = Vec::new();
    let mut summary = None;
    let mut ledger_pairs = Vec::new();
    if let Some(p) = spec.analysis.as_ref().and_then(|a| a.pairs.as_ref()) {
        let mut by_block: BTreeMap<usize, Vec<&CellSpec>> = BTreeMap::new();
        for c in &cells {
            by_block.entry(c.block).or_default().push(c);
        }
        for (block, bc) in &by_block {
            let find = |arm: &str| bc.iter().find(|c| c.arm.id.value == arm).and_then(|c| sealed.get(&c.key).map(|x| (*c, x)));
            let (Some((ca, xa)), Some((cb, xb))) = (find(&p.a), find(&p.b)) else { continue };
            if xa.doc.outcome.status != CellStatus::Completed || xb.doc.outcome.status != CellStatus::Completed {
                continue;
            }
            let (Some(va), Some(vb)) = (number(xa, &p.metric.file, &p.metric.pointer), number(xb, &p.metric.file, &p.metric.pointer)) else {
                continue;
            };
            ledger_pairs.push((ca.key.clone(), cb.key.clone()));
            pair_rows.push((*block, ca.order.clone(), ca, cb, xa, xb, va, vb));
        }
        let pairs_csv = out.join("pairs.csv");
        let mut w = csv::Writer::from_path(&pairs_csv)?;
        w.write_record([
            "block", "order", "a_arm", "b_arm", "a_cell", "b_cell", "a_record", "b_record", "metric_file", "metric_pointer", "a", "b",
            "ratio_b_over_a", "log_ratio", "a_admission", "b_admission", "a_node", "b_node",
        ])?;
        for (block, order, ca, cb, xa, xb, va, vb) in &pair_rows {
            w.write_record([
                block.to_string(),
                order.clone(),
                p.a.value.clone(),
                p.b.value.clone(),
                ca.key.clone(),
                cb.key.clone(),
                xa.digest.clone(),
                xb.digest.clone(),
                p.metric.file.clone(),
                p.metric.pointer.clone(),
                va.to_string(),
                vb.to_string(),
                (vb / va).to_string(),
                (vb / va).ln().to_string(),
                opt(xa.doc.admission.passed),
                opt(xb.doc.admission.passed),
                s(xa.node()),
                s(xb.node()),
            ])?;
        }
        w.flush()?;
        files.push(pairs_csv);
        if !pair_rows.is_empty() {
            let labels: Vec<String> = pair_rows.iter().map(|r| format!("block {} ({})", r.0, r.1)).collect();
            let a: Vec<f64> = pair_rows.iter().map(|r| r.6).collect();
            let b: Vec<f64> = pair_rows.iter().map(|r| r.7).collect();
            let pr = paired_ratio(&labels, &a, &b, p.level)?;
            let sum_csv = out.join("pairs_summary.csv");
            let names = [("a_arm", &p.a.value), ("b_arm", &p.b.value), ("metric_file", &p.metric.file), ("metric_pointer", &p.metric.pointer)];
            write_summary(&sum_csv, &names, "ratio_b_over_a", &pr)?;
            files.push(sum_csv);
            let title = format!("{}: {} / {} ({}{})", spec.id.value, p.b.value, p.a.value, p.metric.file, p.metric.pointer);
            let blocks: Vec<String> = pair_rows.iter().map(|r| format!("{}\n{}", r.0, r.1)).collect();
            files.extend(figure::pair_ratios(out, &title, &blocks, &pr)?);
            summary = Some(pr);
        }
    }

    let mut floor = None;
    let mut envelope = None;
    let mut floor_invalid = Vec::new();
    if let Some(f) = spec.analysis.as_ref().and_then(|a| a.floor.as_ref()) {
        let rows = floor_rows(f, &cells, &sealed);
        floor_invalid = rows.iter().filter_map(FloorRow::broken).collect();
        let path = out.join("floor.csv");
        let mut w = csv::Writer::from_path(&path)?;
        w.write_record([
            "block", "order", "arm_cell", "replay_cell", "compute_cell", "arm_record", "replay_record", "compute_record", "arm_s_per_token",
            "read_s_per_token", "compute_s_per_token", "floor_s_per_token", "bound", "ratio_to_floor", "replay_depth", "valid",
            "decode_bytes_per_token", "arm_mib_per_s", "replay_mib_per_s", "envelope_cell", "envelope_mib_per_s", "arm_over_envelope",
        ])?;
        for r in &rows {
            let broken = r.broken_term();
            w.write_record([
                r.block.to_string(),
                r.order.clone(),
                r.arm.0.key.clone(),
                r.replay.0.key.clone(),
                r.compute.0.key.clone(),
                r.arm.1.digest.clone(),
                r.replay.1.digest.clone(),
                r.compute.1.digest.clone(),
                r.arm.2.to_string(),
                r.replay.2.to_string(),
                r.compute.2.to_string(),
                r.floor().to_string(),
                if r.replay.2 >= r.compute.2 { "read" } else { "compute" }.to_string(),
                if broken.is_some() { String::new() } else { (r.arm.2 / r.floor()).to_string() },
                opt(r.replay.1.read_replay().and_then(|x| x.params.as_ref()).map(|p| p.depth)),
                match broken {
                    None => "true".to_string(),
                    Some(t @ ("read" | "compute")) => format!("false: faster than its {t} term"),
                    Some(t) => format!("false: {t} faster than the envelope"),
                },
                r.bytes_per_token.to_string(),
                (r.arm_bytes_per_s() / MIB).to_string(),
                (r.replay_bytes_per_s / MIB).to_string(),
                r.envelope.map(|(c, _)| c.key.clone()).unwrap_or_default(),
                opt(r.envelope.map(|(_, e)| e / MIB)),
                match (broken, r.envelope) {
                    (None, Some((_, e))) => (r.arm_bytes_per_s() / e).to_string(),
                    _ => String::new(),
                },
            ])?;
        }
        w.flush()?;
        files.push(path);
        // A floor an arm beat was mismeasured: no summary, no ratio (the caller fails closed).
        if !rows.is_empty() && floor_invalid.is_empty() {
            let labels: Vec<String> = rows.iter().map(|r| format!("block {} ({})", r.block, r.order)).collect();
            let a: Vec<f64> = rows.iter().map(FloorRow::floor).collect();
            let b: Vec<f64> = rows.iter().map(|r| r.arm.2).collect();
            let pr = paired_ratio(&labels, &a, &b, f.level)?;
            let path = out.join("floor_summary.csv");
            let names = [("arm", &f.arm.value), ("replay", &f.replay.value), ("compute", &f.compute.value)];
            write_summary(&path, &names, "ratio_to_floor", &pr)?;
            files.push(path);
            floor = Some(pr);
            if let Some(e) = f.envelope.as_ref().filter(|_| rows.iter().all(|r| r.envelope.is_some())) {
                let a: Vec<f64> = rows.iter().filter_map(|r| r.envelope.map(|(_, e)| e)).collect();
                let b: Vec<f64> = rows.iter().map(FloorRow::arm_bytes_per_s).collect();
                let pr = paired_ratio(&labels, &a, &b, f.level)?;
                let path = out.join("envelope_summary.csv");
                write_summary(&path, &[("arm", &f.arm.value), ("envelope", &e.value)], "arm_over_envelope", &pr)?;
                files.push(path);
                envelope = Some(pr);
            }
        }
    }

    let mut walls = Vec::new();
    if let Some(wa) = spec.analysis.as_ref().and_then(|a| a.wall.as_ref()) {
        walls = wall_rows(wa, &cells, &sealed);
        let path = out.join("wall.csv");
        let mut w = csv::Writer::from_path(&path)?;
        w.write_record(["arm", "baseline", "arm_wall_s", "arm_cells", "baseline_wall_s", "baseline_cells", "speedup"])?;
        for r in &walls {
            w.write_record([
                r.arm.clone(),
                r.baseline.clone(),
                opt(r.arm_wall_s),
                r.arm_cells.to_string(),
                opt(r.baseline_wall_s),
                r.baseline_cells.to_string(),
                opt(r.speedup),
            ])?;
        }
        w.flush()?;
        files.push(path);
    }

    let arms = arm_rows(&spec, &cells, &sealed);
    let path = out.join("arms.csv");
    let mut w = csv::Writer::from_path(&path)?;
    w.write_record(["arm", "kind", "cells", "completed", "decode_tokens_per_s", "admitted", "admission_evaluated", "exact", "compared", "read_mib_per_s"])?;
    for r in &arms {
        w.write_record([
            r.arm.clone(),
            r.kind.clone(),
            r.cells.to_string(),
            r.completed.to_string(),
            opt(r.decode_tokens_per_s),
            r.admitted.to_string(),
            r.admission_evaluated.to_string(),
            r.exact.to_string(),
            r.compared.to_string(),
            opt(r.read_mib_per_s),
        ])?;
    }
    w.flush()?;
    files.push(path);

    if spec.refine.is_some() {
        let title = format!("{}: quality versus verification bytes", spec.id.value);
        files.extend(refine::write(out, &title, &cells, &sealed)?);
    }

    for cell in &cells {
        if let Some(x) = sealed.get(&cell.key).filter(|x| x.generate().is_some_and(|r| r.surfaces.contains_key(timeline::SURFACE))) {
            let path = out.join(format!("timeline-{}.svg", cell.key));
            let f = timeline::read(&results.join(&x.digest)).with_context(|| format!("cell {}", cell.key))?;
            timeline::figure(&path, &f, &format!("{}: ", cell.key))?;
            files.push(path);
        }
    }

    // A draft claim ledger: what the records say now, for `verify` and `replay` later.
    let ledger = draft_ledger(results, &spec, &cells, &sealed, &ledger_pairs, summary.as_ref());
    let lpath = out.join("claims.json");
    std::fs::write(&lpath, serde_json::to_string_pretty(&ledger)? + "\n")?;
    files.push(lpath);
    let claims = ledger.claims.iter().map(|(id, c)| Ok(format!("{id}@{}", c.digest()?))).collect::<Result<Vec<_>>>()?;
    let ledger = crate::claims::seal_ledger(results, &ledger)?;

    Ok(ExportSummary {
        campaign: id.to_string(),
        cells: cells.len(),
        sealed: sealed.len(),
        pairs: pair_rows.len(),
        summary,
        floor,
        floor_invalid,
        envelope,
        walls,
        arms,
        files,
        claims,
        ledger,
    })
}

fn draft_ledger(
    results: &Path,
    spec: &Campaign,
    cells: &[CellSpec],
    sealed: &BTreeMap<String, Sealed>,
    pairs: &[(String, String)],
    summary: Option<&PairedRatio>,
) -> Ledger {
    let id = &spec.id.value;
    let records: BTreeMap<String, String> = sealed.iter().map(|(k, v)| (k.clone(), v.digest.clone())).collect();
    let mut assertions = Vec::new();
    let mut replay = Vec::new();
    // Measurement cells run no workload: their records are named, not asserted as runs.
    let completed: Vec<&CellSpec> = cells
        .iter()
        .filter(|c| c.arm.measure.is_none() && sealed.get(&c.key).is_some_and(|x| x.doc.outcome.status == CellStatus::Completed))
        .collect();
    for c in &completed {
        let x = &sealed[&c.key];
        assertions.push(Assertion {
            record: c.key.clone(),
            file: RECORD_FILE.into(),
            pointer: "/model/sha256".into(),
            expect: Check::Eq(Value::String(spec.model.sha256.0.clone())),
        });
        assertions.push(Assertion {
            record: c.key.clone(),
            file: RECORD_FILE.into(),
            pointer: "/counts/prompt_tokens".into(),
            expect: Check::Eq((*spec.workload.prompt_tokens).into()),
        });
        if let Some(n) = x.record.as_ref().and_then(TypedRecord::generated_tokens) {
            assertions.push(Assertion { record: c.key.clone(), file: RECORD_FILE.into(), pointer: "/counts/generated_tokens".into(), expect: Check::Eq(n.into()) });
        }
        if let Some(rows) = x.generate().and_then(|r| r.counts.as_ref()).map(|c| c.logits_rows as u64) {
            assertions.push(Assertion { record: c.key.clone(), file: RECORD_FILE.into(), pointer: "/surfaces/logits/unit_sha256".into(), expect: Check::Len(rows) });
        }
        assertions.push(Assertion { record: c.key.clone(), file: "cell.json".into(), pointer: "/outcome/wall_s".into(), expect: Check::Gt(0.0) });
    }
    let oracle = completed.iter().find(|c| c.is_oracle).map(|c| c.key.clone());
    if let Some(o) = &oracle {
        let candidates: Vec<String> = completed.iter().filter(|c| !c.is_oracle).map(|c| c.key.clone()).collect();
        if !candidates.is_empty() {
            let all_exact = candidates.iter().all(|k| sealed[k].doc.oracle.exact == Some(true));
            if all_exact {
                replay.push(Replay::Exactness { oracle: o.clone(), candidates, expect: true });
            }
        }
    }
    let adm: Vec<String> = completed.iter().map(|c| c.key.clone()).collect();
    if !adm.is_empty() {
        let expect = adm.iter().map(|k| sealed[k].doc.admission.passed).collect();
        replay.push(Replay::Admission { records: adm, expect });
    }
    if let (Some(p), Some(sum)) = (spec.analysis.as_ref().and_then(|a| a.pairs.as_ref()), summary) {
        replay.push(Replay::PairedRatio {
            pairs: pairs.iter().map(|(a, b)| [a.clone(), b.clone()]).collect(),
            metric: p.metric.clone(),
            level: p.level,
            expect: PairedExpect { ratio: sum.ratio, lo: sum.lo, hi: sum.hi, tolerance: 1e-9 },
        });
    }
    // Every fault cell's validation as recomputed from the sealed records now; a cell without a
    // sealed record is named anyway, so the claim cannot hold without it.
    let mut faults = Vec::new();
    for c in cells {
        let Some(f) = c.arm.fault else { continue };
        let control = block_control(cells, c).filter(|k| sealed.contains_key(&k.key)).map(|k| k.key.clone());
        let expect = match sealed.get(&c.key) {
            Some(x) => {
                let cdir = control.as_ref().map(|k| results.join(&sealed[k].digest));
                crate::oracle::fault::verdict(f, &results.join(&x.digest), cdir.as_deref()).0
            }
            None => Verdict { passed: false, failed: vec!["sealed record".into()] },
        };
        faults.push((c.key.clone(), expect.clone()));
        replay.push(Replay::Fault { record: c.key.clone(), cell: f, control, expect });
    }
    let fault_part = if faults.is_empty() {
        String::new()
    } else {
        let failed: Vec<String> =
            faults.iter().filter(|(_, v)| !v.passed).map(|(k, v)| format!("{k} ({})", v.failed.join(", "))).collect();
        format!(
            "; {} fault cells validated, {} passed{}",
            faults.len(),
            faults.len() - failed.len(),
            if failed.is_empty() { String::new() } else { format!(", failed: {}", failed.join(", ")) }
        )
    };
    let statement = match summary {
        Some(s) => format!(
            "campaign {id}: {} cells sealed; paired {}/{} ratio {:.6}{}",
            sealed.len(),
            spec.analysis.as_ref().and_then(|a| a.pairs.as_ref()).map_or(String::new(), |p| p.b.value.clone()),
            spec.analysis.as_ref().and_then(|a| a.pairs.as_ref()).map_or(String::new(), |p| p.a.value.clone()),
            s.ratio,
            match (s.lo, s.hi) {
                (Some(lo), Some(hi)) => format!(", {:.0}% paired-log t interval [{lo:.6}, {hi:.6}]", s.level * 100.0),
                _ => String::new(),
            }
        ),
        None => format!("campaign {id}: {} cells sealed", sealed.len()),
    } + &fault_part;
    let mut claims = BTreeMap::new();
    claims.insert(id.clone(), Claim { statement, records, assertions, replay });
    Ledger { format: LEDGER_FORMAT.into(), claims }
}

#[cfg(test)]
mod floor_tests {
    use super::{beyond_envelope, broken_floor};

    #[test]
    fn a_rate_above_the_envelope_is_a_mismeasurement() {
        let mib = 1048576.0;
        assert_eq!(beyond_envelope(2000.0 * mib, 2500.0 * mib, 3000.0 * mib), None);
        assert_eq!(beyond_envelope(3000.0 * mib, 3000.0 * mib, 3000.0 * mib), None, "equal to the ceiling is a ceiling met");
        assert_eq!(beyond_envelope(2000.0 * mib, 3100.0 * mib, 3000.0 * mib), Some("replay"));
        assert_eq!(beyond_envelope(3100.0 * mib, 2500.0 * mib, 3000.0 * mib), Some("arm"));
        assert_eq!(beyond_envelope(f64::NAN, 2500.0 * mib, 3000.0 * mib), Some("arm"));
        assert_eq!(beyond_envelope(2000.0 * mib, f64::INFINITY, 3000.0 * mib), Some("replay"));
    }

    #[test]
    fn an_arm_faster_than_a_term_of_its_floor_breaks_it() {
        assert_eq!(broken_floor(0.150, 0.141, 0.013), None);
        assert_eq!(broken_floor(0.141, 0.141, 0.013), None, "equal to its reads is a floor met, not beaten");
        // The bench's impossible figure: a resident lead cell at 1.19 tok/s, F at 6.12.
        assert_eq!(broken_floor(1.0 / 6.12, 1.0 / 8.42, 1.0 / 1.19), Some("compute"));
        assert_eq!(broken_floor(0.100, 0.141, 0.013), Some("read"));
        assert_eq!(broken_floor(0.100, f64::NAN, 0.013), Some("read"));
        assert_eq!(broken_floor(f64::INFINITY, 0.141, 0.013), Some("compute"));
    }
}
