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
//! - `requests.csv` (session campaigns): one row per request of every sealed session (its
//!   place, id, outcome, tokens, times, bytes, hits, epoch, scores, record digest);
//! - `pairs.csv`: one row per block holding both arms of `analysis.pairs` (a, b, b/a);
//! - `pairs_summary.csv`: the paired geometric ratio and its paired-log t interval;
//! - `pairs.svg`, `pairs.png`: the pair ratios with the overall ratio and interval;
//! - `refine.csv`, `quality_bytes.svg`, `quality_bytes.png` (refinement campaigns): the τ sweep
//!   and the quality-versus-bytes figure with the base and verifier endpoints;
//! - `timeline-<cell>.svg` (Plan cells): the timeline of the decode token each record kept;
//! - `claims.json`: a draft claim ledger for the campaign (records, assertions and replay
//!   values as computed now, every fault cell's validation included), ready for `verify` /
//!   `replay`.

mod criterion;
mod figure;
mod prefill;
mod refine;
mod tables;
pub mod timeline;

pub use criterion::CriterionResult;
pub use figure::envelope as envelope_figure;
pub use figure::{curves as curves_figure, Curve};
pub use prefill::PrefillSummary;

use crate::campaign::expand::block_control;
use crate::campaign::spec::{Campaign, FloorAnalysis, PairAnalysis};
use crate::campaign::{expand, frozen, journal::Journal, CampaignDir, CellSpec, CellStatus};
use crate::campaign::{histories, read_cell, CellDocument, CellState};
use crate::claims::{Assertion, Check, Claim, Ledger, PairedExpect, Replay, LEDGER_FORMAT};
use crate::oracle::fault::Verdict;
use crate::record::{
    verify_record, EnvelopeRecord, GenerateRecord, ReadReplayRecord, RefineRecord, ReplayDecode, TypedRecord, RECORD_FILE,
};
use crate::stats::{paired_ratio, PairedRatio};
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tables::{write_table, ArmLine, CellRow, FloorLine, PairRow, PairSide, WallLine};

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
    /// `analysis.prefill_floor`: per arm, its prefill time over its floor (None when a block's
    /// floor is invalid, see `prefill_invalid`) and the baseline's prefill time over its own.
    pub prefill: Vec<PrefillSummary>,
    /// Why a prefill floor is an invalid measurement, by arm, block, cell and term.
    pub prefill_invalid: Vec<String>,
    /// One row per arm: the bench table.
    pub arms: Vec<ArmRow>,
    /// `analysis.criterion`, judged.
    pub criterion: Option<CriterionResult>,
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
                .filter_map(|x| {
                    x.decode_s_per_token().or_else(|| x.read_replay().and_then(ReadReplayRecord::decode_floor_s_per_token).map(|f| f.0))
                })
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
        cells
            .iter()
            .filter(|c| c.arm.id.value == arm)
            .filter_map(|c| sealed.get(&c.key))
            .filter(|x| x.completed())
            .map(|x| x.doc.outcome.wall_s)
            .collect()
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

/// One term of a floor: a completed cell, its record and its decode seconds per token.
#[derive(Clone, Copy)]
struct Term<'a> {
    cell: &'a CellSpec,
    sealed: &'a Sealed,
    s_per_token: f64,
}

/// One block of `analysis.floor`.
struct FloorRow<'a> {
    block: usize,
    order: String,
    arm: Term<'a>,
    replay: Term<'a>,
    compute: Term<'a>,
    /// The replay's decode phase that gave the read term (the faster).
    replay_phase: ReplayDecode,
    /// Decode bytes per token of the arm (its replay's), and the replay's bytes per second.
    bytes_per_token: f64,
    replay_bytes_per_s: f64,
    /// The envelope's best cell in the campaign and its bytes per second.
    envelope: Option<(&'a CellSpec, f64)>,
}

const MIB: f64 = 1048576.0;

impl FloorRow<'_> {
    fn floor(&self) -> f64 {
        self.replay.s_per_token.max(self.compute.s_per_token)
    }

    /// The arm's decode bytes per second.
    fn arm_bytes_per_s(&self) -> f64 {
        self.bytes_per_token / self.arm.s_per_token
    }

    /// The least the arm could take per token with the device idle it had, were its reads as
    /// fast as their replay (and never less than the compute term): what the idle alone keeps
    /// between the arm and its floor.
    fn idle_bound(&self) -> Option<f64> {
        self.arm.sealed.decode_idle_s_per_token().map(|idle| idle_bound(self.replay.s_per_token, idle, self.compute.s_per_token))
    }

    /// The idle bound with the reads replayed one layer event after the other, as the router
    /// orders the arm's: what the arm loses beyond that dependence, queue drains included.
    fn layer_bound(&self) -> Option<f64> {
        let by_layer = self.replay.sealed.read_replay()?.decode_by_layer_s_per_token()?;
        self.arm.sealed.decode_idle_s_per_token().map(|idle| idle_bound(by_layer, idle, self.compute.s_per_token))
    }

    /// Which term of the floor or the envelope this block breaks, if any.
    fn broken_term(&self) -> Option<&'static str> {
        broken_floor(self.arm.s_per_token, self.replay.s_per_token, self.compute.s_per_token)
            // Faster than its replay plus its idle: its reads beat their replay, so the replay
            // (the floor's read term) was mismeasured.
            .or_else(|| {
                let at_least =
                    |b: f64| matches!(self.arm.s_per_token.partial_cmp(&b), Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal));
                self.idle_bound().filter(|&b| !at_least(b)).map(|_| "idle")
            })
            .or_else(|| self.envelope.and_then(|(_, e)| beyond_envelope(self.arm_bytes_per_s(), self.replay_bytes_per_s, e)))
    }

    /// Why this block's floor cannot be right, if it cannot.
    fn broken(&self) -> Option<String> {
        let term = self.broken_term()?;
        let (env_cell, env) = self.envelope.map_or((String::new(), f64::NAN), |(c, e)| (c.key.clone(), e / MIB));
        Some(match term {
            "read" | "compute" => {
                let t = if term == "read" { self.replay } else { self.compute };
                let (cell, s) = (&t.cell.key, t.s_per_token);
                format!(
                    "block {}: arm cell {} decoded at {:.6} s/token, faster than the floor's {term} term ({cell}, {s:.6} s/token)",
                    self.block, self.arm.cell.key, self.arm.s_per_token
                )
            }
            "idle" => format!(
                "block {}: arm cell {} decoded at {:.6} s/token, faster than its replay ({}, {:.6} s/token) plus its device idle ({:.6} s/token)",
                self.block,
                self.arm.cell.key,
                self.arm.s_per_token,
                self.replay.cell.key,
                self.replay.s_per_token,
                self.arm.sealed.decode_idle_s_per_token().unwrap_or(f64::NAN)
            ),
            "replay" => format!(
                "block {}: replay cell {} read at {:.1} MiB/s, faster than the envelope's best cell ({env_cell}, {env:.1} MiB/s)",
                self.block,
                self.replay.cell.key,
                self.replay_bytes_per_s / MIB
            ),
            _ => format!(
                "block {}: arm cell {} moved {:.1} MiB/s, more than the envelope's best cell ({env_cell}, {env:.1} MiB/s)",
                self.block,
                self.arm.cell.key,
                self.arm_bytes_per_s() / MIB
            ),
        })
    }
}

/// How far apart two measurements of one device's rate may lie: an envelope cell and its reread
/// differed by up to 2 % at the plain depths of bench-5-o8-b2, and a replay reading the same
/// pattern into memory as cold lands within that of the best cell, on either side.
pub const ENVELOPE_RESOLUTION: f64 = 0.03;

/// Whether a rate is within the device's measured ceiling, to the envelope's resolution.
pub(super) fn within_envelope(bytes_per_s: f64, envelope_bytes_per_s: f64) -> bool {
    bytes_per_s.is_finite() && bytes_per_s <= envelope_bytes_per_s * (1.0 + ENVELOPE_RESOLUTION)
}

/// Which of a block's read rates exceeds the device's measured ceiling (`replay`: the replay
/// of the arm's reads; `arm`: the arm's own decode), or None. Nothing reads faster than the
/// device does: a rate above the envelope's best cell, beyond its resolution, is a
/// mismeasurement.
fn beyond_envelope(arm_bytes_per_s: f64, replay_bytes_per_s: f64, envelope_bytes_per_s: f64) -> Option<&'static str> {
    if !within_envelope(replay_bytes_per_s, envelope_bytes_per_s) {
        Some("replay")
    } else if !within_envelope(arm_bytes_per_s, envelope_bytes_per_s) {
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

/// The least an arm can take per token with `idle_s` of it spent with no read in flight: its
/// reads, at best their replay's `read_s`, plus that idle, and never less than `compute_s`.
fn idle_bound(read_s: f64, idle_s: f64, compute_s: f64) -> f64 {
    (read_s + idle_s).max(compute_s)
}

/// Per block holding the arm's and the replay's completed cells: the floor and the ratio.
fn floor_rows<'a>(f: &FloorAnalysis, cells: &'a [CellSpec], sealed: &'a BTreeMap<String, Sealed>) -> Vec<FloorRow<'a>> {
    let find = |block: usize, arm: &str| {
        cells
            .iter()
            .find(|c| c.block == block && c.arm.id.value == arm)
            .and_then(|c| sealed.get(&c.key).filter(|x| x.completed()).map(|x| (c, x)))
    };
    let blocks: std::collections::BTreeSet<usize> = cells.iter().map(|c| c.block).collect();
    // The envelope's best cell over the whole campaign: the device's ceiling.
    let envelope = f.envelope.as_ref().and_then(|e| {
        cells
            .iter()
            .filter(|c| c.arm.id.value == e.value)
            .filter_map(|c| {
                sealed.get(&c.key).filter(|x| x.completed()).and_then(|x| Some((c, x.envelope()?.best.as_ref()?.mib_per_s * MIB)))
            })
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
        let (Some(a), Some((r, phase))) = (xa.decode_s_per_token(), xr.read_replay().and_then(ReadReplayRecord::decode_floor_s_per_token))
        else {
            continue;
        };
        let Some(d) = xr.read_replay().and_then(|x| x.decode.as_ref()).filter(|d| d.steps > 0) else { continue };
        let bytes_per_token = d.physical_bytes as f64 / d.steps as f64;
        rows.push(FloorRow {
            block: b,
            order: ca.order.clone(),
            arm: Term { cell: ca, sealed: xa, s_per_token: a },
            replay: Term { cell: cr, sealed: xr, s_per_token: r },
            compute: Term { cell: cc, sealed: xc, s_per_token: c },
            replay_phase: phase,
            bytes_per_token,
            replay_bytes_per_s: bytes_per_token / r,
            envelope,
        });
    }
    rows
}

/// A one-row summary table: the `names` columns, then the paired ratio (as `ratio`) with its
/// interval and the statistics it came from.
fn write_summary(path: &Path, names: &[(&str, &String)], ratio: &str, pr: &PairedRatio) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(names.iter().map(|(n, _)| *n).chain(summary_columns(ratio)))?;
    w.write_record(names.iter().map(|(_, v)| v.to_string()).chain(summary_values(pr)))?;
    w.flush()?;
    Ok(())
}

/// The columns of a paired ratio in a summary table, the ratio named `ratio`.
fn summary_columns(ratio: &str) -> [&str; 9] {
    ["n", "df", "level", ratio, "lo", "hi", "mean_log", "sd_log", "t"]
}

/// A paired ratio's values under [`summary_columns`].
fn summary_values(pr: &PairedRatio) -> [String; 9] {
    [
        pr.n.to_string(),
        pr.df.to_string(),
        pr.level.to_string(),
        pr.ratio.to_string(),
        opt(pr.lo),
        opt(pr.hi),
        pr.mean_log.to_string(),
        opt(pr.sd_log),
        opt(pr.t),
    ]
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

    /// Decode seconds per decode token with no read in flight while the engine computed (the
    /// Plan's timeline): the device sat idle while the engine finished a layer, ran the next
    /// one's router or chose the next token, the idle the router's dependence leaves.
    fn decode_idle_s_per_token(&self) -> Option<f64> {
        let (t, n) = self.decode_timeline()?;
        let i = &t.idle;
        Some((i.between_ns + i.compute_ns + i.expert_compute_ns) as f64 / 1e9 / n)
    }

    /// Decode seconds per decode token with no read in flight while the Plan worked (verified,
    /// copied, kept its books or waited on nothing): the arm's own idle, no bound forgives it.
    fn decode_plan_idle_s_per_token(&self) -> Option<f64> {
        let (t, n) = self.decode_timeline()?;
        let i = &t.idle;
        Some((i.plan_ns + i.copy_ns + i.submit_ns + i.wait_ns) as f64 / 1e9 / n)
    }

    /// Decode seconds per decode token with a read in flight (the Plan's timeline): over the
    /// replay's time, how much slower the arm's reads ran than the same reads with nothing
    /// else to do.
    fn decode_busy_s_per_token(&self) -> Option<f64> {
        let (t, n) = self.decode_timeline()?;
        Some(t.busy_ns as f64 / 1e9 / n)
    }

    /// Decode seconds per decode token the Plan worked (verified, published, kept its books)
    /// while reads were in flight: work the replay never does, which costs where it holds
    /// back the next submission.
    fn decode_plan_busy_s_per_token(&self) -> Option<f64> {
        let (t, n) = self.decode_timeline()?;
        Some(t.busy.plan_ns as f64 / 1e9 / n)
    }

    /// A completed generate run's decode timeline totals and its token count.
    fn decode_timeline(&self) -> Option<(crate::plan::timeline::Times, f64)> {
        let t = self.generate().filter(|_| self.completed())?.plan()?.timeline.as_ref()?;
        (t.tokens > 0).then_some((t.total, t.tokens as f64))
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

/// The campaign's cells as the journal and the records say: each cell's state name, and the
/// sealed ones loaded, verified and sized.
struct Loaded {
    states: BTreeMap<String, &'static str>,
    sealed: BTreeMap<String, Sealed>,
    sizes: BTreeMap<String, u64>,
}

fn state_name(state: &CellState) -> &'static str {
    match state {
        CellState::Pending => "pending",
        CellState::Started { .. } => "interrupted",
        CellState::Sealing { .. } => "sealing",
        CellState::Sealed { .. } => "sealed",
        CellState::Skipped { .. } => "skipped",
        CellState::Abandoned => "abandoned",
    }
}

fn load_cells(results: &Path, id: &str, cells: &[CellSpec]) -> Result<Loaded> {
    let disagree = crate::campaign::audit::journal_disagreements(results, id)?;
    if let Some(first) = disagree.first() {
        anyhow::bail!(
            "campaign `{id}`: the journal and the records disagree ({} in all; first: {first}); nothing was exported",
            disagree.len()
        );
    }
    let hist = histories(&Journal::read_all(&CampaignDir::new(results, id).journal_files()?)?);
    let mut loaded = Loaded { states: BTreeMap::new(), sealed: BTreeMap::new(), sizes: BTreeMap::new() };
    for cell in cells {
        let state = hist.get(&cell.key).map(|h| h.state.clone()).unwrap_or(CellState::Pending);
        loaded.states.insert(cell.key.clone(), state_name(&state));
        if let CellState::Sealed { digest, .. } = state {
            let rdir = results.join(&digest);
            let v = verify_record(&rdir).with_context(|| format!("cell {}", cell.key))?;
            loaded.sizes.insert(cell.key.clone(), v.manifest.total_bytes());
            let doc = read_cell(&rdir)?;
            let record = if rdir.join(RECORD_FILE).is_file() { Some(crate::record::load_typed(&rdir)?) } else { None };
            loaded.sealed.insert(cell.key.clone(), Sealed { digest, doc, record });
        }
    }
    Ok(loaded)
}

/// Blocks holding both prespecified arms, both completed, with the metric in both records.
fn pair_rows(p: &PairAnalysis, cells: &[CellSpec], sealed: &BTreeMap<String, Sealed>) -> Vec<PairRow> {
    let mut by_block: BTreeMap<usize, Vec<&CellSpec>> = BTreeMap::new();
    for c in cells {
        by_block.entry(c.block).or_default().push(c);
    }
    by_block
        .iter()
        .filter_map(|(block, bc)| Some(PairRow::new(p, *block, pair_side(p, bc, sealed, &p.a)?, pair_side(p, bc, sealed, &p.b)?)))
        .collect()
}

/// The block's cell of `arm`, if it completed and its record holds the metric.
fn pair_side<'a>(p: &PairAnalysis, block: &[&'a CellSpec], sealed: &'a BTreeMap<String, Sealed>, arm: &str) -> Option<PairSide<'a>> {
    let cell = *block.iter().find(|c| c.arm.id.value == arm)?;
    let sealed = sealed.get(&cell.key).filter(|x| x.completed())?;
    let value = number(sealed, &p.metric.file, &p.metric.pointer)?;
    Some(PairSide { cell, sealed, value })
}

/// `pairs.csv`, and where a block has both arms, `pairs_summary.csv` and the figure.
fn write_pairs(out: &Path, spec: &Campaign, p: &PairAnalysis, rows: &[PairRow], files: &mut Vec<PathBuf>) -> Result<Option<PairedRatio>> {
    let pairs_csv = out.join("pairs.csv");
    write_table(&pairs_csv, rows)?;
    files.push(pairs_csv);
    if rows.is_empty() {
        return Ok(None);
    }
    let labels: Vec<String> = rows.iter().map(|r| format!("block {} ({})", r.block, r.order)).collect();
    let a: Vec<f64> = rows.iter().map(|r| r.a).collect();
    let b: Vec<f64> = rows.iter().map(|r| r.b).collect();
    let pr = paired_ratio(&labels, &a, &b, p.level)?;
    let sum_csv = out.join("pairs_summary.csv");
    let names = [("a_arm", &p.a.value), ("b_arm", &p.b.value), ("metric_file", &p.metric.file), ("metric_pointer", &p.metric.pointer)];
    write_summary(&sum_csv, &names, "ratio_b_over_a", &pr)?;
    files.push(sum_csv);
    let title = format!("{}: {} / {} ({}{})", spec.id.value, p.b.value, p.a.value, p.metric.file, p.metric.pointer);
    let blocks: Vec<String> = rows.iter().map(|r| format!("{}\n{}", r.block, r.order)).collect();
    files.extend(figure::pair_ratios(out, &title, &blocks, &pr)?);
    Ok(Some(pr))
}

/// What `analysis.floor` gave: its ratios (None when the floor is broken) and why it is broken.
#[derive(Default)]
struct FloorResult {
    floor: Option<PairedRatio>,
    envelope: Option<PairedRatio>,
    invalid: Vec<String>,
}

/// `floor.csv`, and over a floor no arm beat, `floor_summary.csv` and `envelope_summary.csv`.
fn write_floor(
    out: &Path,
    f: &FloorAnalysis,
    cells: &[CellSpec],
    sealed: &BTreeMap<String, Sealed>,
    files: &mut Vec<PathBuf>,
) -> Result<FloorResult> {
    let rows = floor_rows(f, cells, sealed);
    let invalid: Vec<String> = rows.iter().filter_map(FloorRow::broken).collect();
    let path = out.join("floor.csv");
    write_table(&path, &rows.iter().map(FloorLine::new).collect::<Vec<_>>())?;
    files.push(path);
    // A floor an arm beat was mismeasured: no summary, no ratio (the caller fails closed).
    if rows.is_empty() || !invalid.is_empty() {
        return Ok(FloorResult { invalid, ..FloorResult::default() });
    }
    let labels: Vec<String> = rows.iter().map(|r| format!("block {} ({})", r.block, r.order)).collect();
    let a: Vec<f64> = rows.iter().map(FloorRow::floor).collect();
    let b: Vec<f64> = rows.iter().map(|r| r.arm.s_per_token).collect();
    let pr = paired_ratio(&labels, &a, &b, f.level)?;
    let path = out.join("floor_summary.csv");
    let names = [("arm", &f.arm.value), ("replay", &f.replay.value), ("compute", &f.compute.value)];
    write_summary(&path, &names, "ratio_to_floor", &pr)?;
    files.push(path);
    let mut envelope = None;
    if let Some(e) = f.envelope.as_ref().filter(|_| rows.iter().all(|r| r.envelope.is_some())) {
        let a: Vec<f64> = rows.iter().filter_map(|r| r.envelope.map(|(_, e)| e)).collect();
        let b: Vec<f64> = rows.iter().map(FloorRow::arm_bytes_per_s).collect();
        let pr = paired_ratio(&labels, &a, &b, f.level)?;
        let path = out.join("envelope_summary.csv");
        write_summary(&path, &[("arm", &f.arm.value), ("envelope", &e.value)], "arm_over_envelope", &pr)?;
        files.push(path);
        envelope = Some(pr);
    }
    Ok(FloorResult { floor: Some(pr), envelope, invalid })
}

/// `timeline-<cell>.svg` for each sealed generate record that kept a timeline.
fn write_timelines(
    out: &Path,
    results: &Path,
    cells: &[CellSpec],
    sealed: &BTreeMap<String, Sealed>,
    files: &mut Vec<PathBuf>,
) -> Result<()> {
    for cell in cells {
        if let Some(x) = sealed.get(&cell.key).filter(|x| x.generate().is_some_and(|r| r.surfaces.contains_key(timeline::SURFACE))) {
            let path = out.join(format!("timeline-{}.svg", cell.key));
            let f = timeline::read(&results.join(&x.digest)).with_context(|| format!("cell {}", cell.key))?;
            timeline::figure(&path, &f, &format!("{}: ", cell.key))?;
            files.push(path);
        }
    }
    Ok(())
}

/// `sovereign export --campaign ID --out DIR`.
pub fn export(results: &Path, id: &str, out: &Path) -> Result<ExportSummary> {
    let (spec, digest) = frozen(results, id)?;
    let cells = expand(&spec);
    let Loaded { states, sealed, sizes } = load_cells(results, id, &cells)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut files = Vec::new();

    let rows: Vec<CellRow> =
        cells.iter().map(|c| CellRow::new(&spec, &digest, c, states[&c.key], sealed.get(&c.key), sizes.get(&c.key).copied())).collect();
    let cells_csv = out.join("cells.csv");
    write_table(&cells_csv, &rows)?;
    files.push(cells_csv);
    if spec.workload.is_session() {
        let rows: Vec<tables::RequestRow> =
            cells.iter().filter_map(|c| Some(tables::RequestRow::of(c, sealed.get(&c.key)?))).flatten().collect();
        let requests_csv = out.join("requests.csv");
        write_table(&requests_csv, &rows)?;
        files.push(requests_csv);
    }

    let analysis = spec.analysis.as_ref();
    let (pairs, summary) = match analysis.and_then(|a| a.pairs.as_ref()) {
        Some(p) => {
            let rows = pair_rows(p, &cells, &sealed);
            let summary = write_pairs(out, &spec, p, &rows, &mut files)?;
            (rows, summary)
        }
        None => (Vec::new(), None),
    };
    let floor = match analysis.and_then(|a| a.floor.as_ref()) {
        Some(f) => write_floor(out, f, &cells, &sealed, &mut files)?,
        None => FloorResult::default(),
    };
    let prefill = match analysis.and_then(|a| a.prefill_floor.as_ref()) {
        Some(f) => prefill::write(out, f, &cells, &sealed, &mut files)?,
        None => prefill::PrefillResult::default(),
    };
    let walls = analysis.and_then(|a| a.wall.as_ref()).map(|w| wall_rows(w, &cells, &sealed)).unwrap_or_default();
    if analysis.is_some_and(|a| a.wall.is_some()) {
        let path = out.join("wall.csv");
        write_table(&path, &walls.iter().map(WallLine::from).collect::<Vec<_>>())?;
        files.push(path);
    }
    let arms = arm_rows(&spec, &cells, &sealed);
    let path = out.join("arms.csv");
    write_table(&path, &arms.iter().map(ArmLine::from).collect::<Vec<_>>())?;
    files.push(path);
    if spec.refine.is_some() {
        let title = format!("{}: quality versus verification bytes", spec.id.value);
        files.extend(refine::write(out, &title, &cells, &sealed)?);
    }
    write_timelines(out, results, &cells, &sealed, &mut files)?;
    let criterion = match analysis.and_then(|a| a.criterion.as_ref()) {
        Some(k) => {
            files.push(out.join("criterion.csv"));
            Some(criterion::judge(out, k, &cells, &sealed)?)
        }
        None => None,
    };

    // A draft claim ledger: what the records say now, for `verify` and `replay` later.
    let ledger_pairs: Vec<(String, String)> = pairs.iter().map(|r| (r.a_cell.clone(), r.b_cell.clone())).collect();
    let ledger = draft_ledger(results, &spec, &cells, &sealed, &ledger_pairs, summary.as_ref(), criterion.as_ref());
    let lpath = out.join("claims.json");
    std::fs::write(&lpath, serde_json::to_string_pretty(&ledger)? + "\n")?;
    files.push(lpath);
    let claims = ledger.claims.iter().map(|(id, c)| Ok(format!("{id}@{}", c.digest()?))).collect::<Result<Vec<_>>>()?;
    let ledger = crate::claims::seal_ledger(results, &ledger)?;

    Ok(ExportSummary {
        campaign: id.to_string(),
        cells: cells.len(),
        sealed: sealed.len(),
        pairs: pairs.len(),
        summary,
        floor: floor.floor,
        floor_invalid: floor.invalid,
        envelope: floor.envelope,
        walls,
        prefill: prefill.arms,
        prefill_invalid: prefill.invalid,
        arms,
        criterion,
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
    criterion: Option<&CriterionResult>,
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
            assertions.push(Assertion {
                record: c.key.clone(),
                file: RECORD_FILE.into(),
                pointer: "/counts/generated_tokens".into(),
                expect: Check::Eq(n.into()),
            });
        }
        if let Some(rows) = x.generate().and_then(|r| r.counts.as_ref()).map(|c| c.logits_rows as u64) {
            assertions.push(Assertion {
                record: c.key.clone(),
                file: RECORD_FILE.into(),
                pointer: "/surfaces/logits/unit_sha256".into(),
                expect: Check::Len(rows),
            });
        }
        assertions.push(Assertion {
            record: c.key.clone(),
            file: "cell.json".into(),
            pointer: "/outcome/wall_s".into(),
            expect: Check::Gt(0.0),
        });
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
    let judged = criterion.map_or(String::new(), |k| k.stated(&mut replay));
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
    } + &judged
        + &fault_statement(&faults);
    let mut claims = BTreeMap::new();
    claims.insert(id.clone(), Claim { statement, records, assertions, replay });
    Ledger { format: LEDGER_FORMAT.into(), claims }
}

/// What the claim says of its fault cells: how many were validated, and which failed why.
fn fault_statement(faults: &[(String, Verdict)]) -> String {
    if faults.is_empty() {
        return String::new();
    }
    let failed: Vec<String> = faults.iter().filter(|(_, v)| !v.passed).map(|(k, v)| format!("{k} ({})", v.failed.join(", "))).collect();
    format!(
        "; {} fault cells validated, {} passed{}",
        faults.len(),
        faults.len() - failed.len(),
        if failed.is_empty() { String::new() } else { format!(", failed: {}", failed.join(", ")) }
    )
}

#[cfg(test)]
mod floor_tests {
    use super::{beyond_envelope, broken_floor, idle_bound};

    #[test]
    fn a_rate_above_the_envelope_is_a_mismeasurement() {
        let mib = 1048576.0;
        assert_eq!(beyond_envelope(2000.0 * mib, 2500.0 * mib, 3000.0 * mib), None);
        assert_eq!(beyond_envelope(3000.0 * mib, 3000.0 * mib, 3000.0 * mib), None, "equal to the ceiling is a ceiling met");
        assert_eq!(beyond_envelope(2000.0 * mib, 3080.0 * mib, 3000.0 * mib), None, "2.7 % over: the same rate measured twice");
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

    #[test]
    fn the_idle_bound_adds_the_idle_to_the_reads_and_never_drops_below_compute() {
        assert_eq!(idle_bound(0.069, 0.016, 0.016), 0.069 + 0.016);
        assert_eq!(idle_bound(0.010, 0.002, 0.020), 0.020, "a compute-bound arm's bound is its compute");
    }
}
