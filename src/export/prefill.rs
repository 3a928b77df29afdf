//! `analysis.prefill_floor`: each arm's prefill time over its floor, max(resident prefill,
//! prefill bytes over the envelope's best cell), and a baseline's prefill time over the arm's,
//! per block, with their paired-log t intervals.

use super::tables::{shown, write_table};
use super::{summary_columns, summary_values, Sealed, MIB};
use crate::campaign::spec::PrefillFloorAnalysis;
use crate::campaign::CellSpec;
use crate::stats::{paired_ratio, PairedRatio};
use anyhow::Result;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One arm's figures over the blocks.
#[derive(Debug, Clone, Serialize)]
pub struct PrefillSummary {
    pub arm: String,
    /// The arm's prefill seconds over its floor; None when a block's floor is broken.
    pub ratio_to_floor: Option<PairedRatio>,
    /// The baseline's prefill seconds over the arm's (above 1: the arm is faster).
    pub baseline: Option<String>,
    pub baseline_over_arm: Option<PairedRatio>,
}

/// What the analysis gave: per arm, and why a floor is an invalid measurement.
#[derive(Debug, Clone, Default)]
pub(super) struct PrefillResult {
    pub arms: Vec<PrefillSummary>,
    pub invalid: Vec<String>,
}

/// `prefill_floor.csv`: one arm in one block.
#[derive(Serialize, Default)]
struct PrefillLine {
    arm: String,
    block: usize,
    order: String,
    arm_cell: String,
    compute_cell: String,
    arm_record: String,
    compute_record: String,
    prompt_tokens: u64,
    #[serde(serialize_with = "shown::f64")]
    arm_prefill_s: f64,
    #[serde(serialize_with = "shown::f64")]
    compute_prefill_s: f64,
    read_bytes: u64,
    #[serde(serialize_with = "shown::f64")]
    bytes_per_prompt_token: f64,
    envelope_cell: String,
    #[serde(serialize_with = "shown::f64")]
    envelope_mib_per_s: f64,
    #[serde(serialize_with = "shown::f64")]
    read_floor_s: f64,
    #[serde(serialize_with = "shown::f64")]
    floor_s: f64,
    /// `compute` or `read`: the larger term.
    bound: &'static str,
    #[serde(serialize_with = "shown::f64")]
    arm_mib_per_s: f64,
    /// Empty where the block's floor is broken.
    #[serde(serialize_with = "shown::opt")]
    ratio_to_floor: Option<f64>,
    baseline_cell: String,
    #[serde(serialize_with = "shown::opt")]
    baseline_prefill_s: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    baseline_over_arm: Option<f64>,
    valid: String,
}

/// A completed cell and its record.
type Done<'a> = (&'a CellSpec, &'a Sealed);

struct Row<'a> {
    arm: &'a str,
    block: usize,
    cell: Done<'a>,
    prefill_s: f64,
    tokens: u64,
    read_bytes: u64,
    compute: (Done<'a>, f64),
    envelope: (&'a CellSpec, f64),
    baseline: Option<(Done<'a>, f64)>,
}

impl Row<'_> {
    fn read_floor_s(&self) -> f64 {
        self.read_bytes as f64 / self.envelope.1
    }

    fn floor_s(&self) -> f64 {
        self.compute.1.max(self.read_floor_s())
    }

    fn bytes_per_s(&self) -> f64 {
        self.read_bytes as f64 / self.prefill_s
    }

    /// Why this block's floor cannot be right, if it cannot.
    fn broken(&self) -> Option<String> {
        let (cell, compute) = (&self.cell.0.key, self.compute.1);
        broken_prefill(self.prefill_s, compute, self.bytes_per_s(), self.envelope.1).map(|term| match term {
            "compute" => format!(
                "block {}: arm cell {cell} prefilled in {:.6} s, faster than the floor's compute term ({}, {compute:.6} s)",
                self.block, self.prefill_s, self.compute.0 .0.key
            ),
            _ => format!(
                "block {}: arm cell {cell} read its prefill at {:.1} MiB/s, faster than the envelope's best cell ({}, {:.1} MiB/s)",
                self.block,
                self.bytes_per_s() / MIB,
                self.envelope.0.key,
                self.envelope.1 / MIB
            ),
        })
    }

    fn line(&self) -> PrefillLine {
        let broken = self.broken();
        let ((ca, xa), ((cc, xc), compute_s)) = (self.cell, self.compute);
        PrefillLine {
            arm: self.arm.to_string(),
            block: self.block,
            order: ca.order.clone(),
            arm_cell: ca.key.clone(),
            compute_cell: cc.key.clone(),
            arm_record: xa.digest.clone(),
            compute_record: xc.digest.clone(),
            prompt_tokens: self.tokens,
            arm_prefill_s: self.prefill_s,
            compute_prefill_s: compute_s,
            read_bytes: self.read_bytes,
            bytes_per_prompt_token: self.read_bytes as f64 / self.tokens.max(1) as f64,
            envelope_cell: self.envelope.0.key.clone(),
            envelope_mib_per_s: self.envelope.1 / MIB,
            read_floor_s: self.read_floor_s(),
            floor_s: self.floor_s(),
            bound: if compute_s >= self.read_floor_s() { "compute" } else { "read" },
            arm_mib_per_s: self.bytes_per_s() / MIB,
            ratio_to_floor: broken.is_none().then(|| self.prefill_s / self.floor_s()),
            baseline_cell: self.baseline.map(|((c, _), _)| c.key.clone()).unwrap_or_default(),
            baseline_prefill_s: self.baseline.map(|(_, s)| s),
            baseline_over_arm: self.baseline.map(|(_, s)| s / self.prefill_s),
            valid: broken.unwrap_or_else(|| "yes".into()),
        }
    }
}

/// The term of a prefill floor an arm beat (`compute`: the resident prefill; `read`: its bytes
/// at the envelope's best rate), or None. Neither can be beaten: if one was, it was mismeasured.
fn broken_prefill(arm_s: f64, compute_s: f64, arm_bytes_per_s: f64, envelope_bytes_per_s: f64) -> Option<&'static str> {
    if !(arm_s.is_finite() && arm_s > 0.0 && compute_s.is_finite() && arm_s >= compute_s) {
        Some("compute")
    } else if !super::within_envelope(arm_bytes_per_s, envelope_bytes_per_s) {
        Some("read")
    } else {
        None
    }
}

/// A completed generate cell's prefill seconds.
fn prefill_s(x: &Sealed) -> Option<f64> {
    x.generate().filter(|_| x.completed())?.timing.as_ref().map(|t| t.prefill_s)
}

fn rows<'a>(f: &'a PrefillFloorAnalysis, cells: &'a [CellSpec], sealed: &'a BTreeMap<String, Sealed>) -> Vec<Row<'a>> {
    let done = |c: &'a CellSpec| sealed.get(&c.key).filter(|x| x.completed()).map(|x| (c, x));
    let of = |arm: &'a str| cells.iter().filter(move |c| c.arm.id.value == arm).filter_map(done);
    // The envelope's best cell over the whole campaign: the device's ceiling.
    let Some(envelope) = of(&f.envelope.value)
        .filter_map(|(c, x)| Some((c, x.envelope()?.best.as_ref()?.mib_per_s * MIB)))
        .max_by(|p, q| p.1.total_cmp(&q.1))
    else {
        return Vec::new();
    };
    // The compute term: the least resident prefill of the block, else of the campaign, so that
    // one slow (cold, contended) cell does not raise the floor above the arm.
    let least = |block: Option<usize>| {
        of(&f.compute.value)
            .filter(|(c, _)| block.is_none_or(|b| c.block == b))
            .filter_map(|(c, x)| Some(((c, x), prefill_s(x)?)))
            .min_by(|p, q| p.1.total_cmp(&q.1))
    };
    let blocks: BTreeSet<usize> = cells.iter().map(|c| c.block).collect();
    let mut out = Vec::new();
    for arm in &f.arms {
        for &b in &blocks {
            let Some((ca, xa)) = of(&arm.value).find(|(c, _)| c.block == b) else { continue };
            let Some(p) = xa.generate().and_then(|g| g.plan()).and_then(|r| r.prefill.as_ref()) else { continue };
            let (Some(s), Some(compute)) = (prefill_s(xa), least(Some(b)).or_else(|| least(None))) else { continue };
            let baseline = f.baseline.as_ref().and_then(|base| {
                let (c, x) = of(&base.value).find(|(c, _)| c.block == b)?;
                Some(((c, x), prefill_s(x)?))
            });
            out.push(Row {
                arm: &arm.value,
                block: b,
                cell: (ca, xa),
                prefill_s: s,
                tokens: p.tokens,
                read_bytes: p.read_bytes,
                compute,
                envelope,
                baseline,
            });
        }
    }
    out
}

/// `prefill_floor.csv`, and over floors no arm beat, `prefill_floor_summary.csv`.
pub(super) fn write(
    out: &Path,
    f: &PrefillFloorAnalysis,
    cells: &[CellSpec],
    sealed: &BTreeMap<String, Sealed>,
    files: &mut Vec<PathBuf>,
) -> Result<PrefillResult> {
    let rows = rows(f, cells, sealed);
    let invalid: Vec<String> = rows.iter().filter_map(|r| r.broken().map(|why| format!("{}: {why}", r.arm))).collect();
    let path = out.join("prefill_floor.csv");
    write_table(&path, &rows.iter().map(Row::line).collect::<Vec<_>>())?;
    files.push(path);
    let mut result = PrefillResult { arms: Vec::new(), invalid };
    let mut summary = csv::Writer::from_path(out.join("prefill_floor_summary.csv"))?;
    summary.write_record(["arm", "measure"].into_iter().chain(summary_columns("ratio")))?;
    for arm in &f.arms {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.arm == arm.value).collect();
        let labels: Vec<String> = mine.iter().map(|r| format!("block {} ({})", r.block, r.cell.0.order)).collect();
        // A floor an arm beat was mismeasured: no ratio over it (the caller fails closed).
        let ratio_to_floor = if mine.is_empty() || mine.iter().any(|r| r.broken().is_some()) {
            None
        } else {
            let floor: Vec<f64> = mine.iter().map(|r| r.floor_s()).collect();
            let arm_s: Vec<f64> = mine.iter().map(|r| r.prefill_s).collect();
            Some(paired_ratio(&labels, &floor, &arm_s, f.level)?)
        };
        let with_base: Vec<&&Row> = mine.iter().filter(|r| r.baseline.is_some()).collect();
        let baseline_over_arm = if with_base.is_empty() {
            None
        } else {
            let labels: Vec<String> = with_base.iter().map(|r| format!("block {} ({})", r.block, r.cell.0.order)).collect();
            let arm_s: Vec<f64> = with_base.iter().map(|r| r.prefill_s).collect();
            let base_s: Vec<f64> = with_base.iter().filter_map(|r| r.baseline.map(|(_, s)| s)).collect();
            Some(paired_ratio(&labels, &arm_s, &base_s, f.level)?)
        };
        for (measure, pr) in [("ratio_to_floor", &ratio_to_floor), ("baseline_over_arm", &baseline_over_arm)] {
            if let Some(pr) = pr {
                summary.write_record([arm.value.clone(), measure.to_string()].into_iter().chain(summary_values(pr)))?;
            }
        }
        result.arms.push(PrefillSummary {
            arm: arm.value.clone(),
            ratio_to_floor,
            baseline: f.baseline.as_ref().map(|b| b.value.clone()),
            baseline_over_arm,
        });
    }
    summary.flush()?;
    files.push(out.join("prefill_floor_summary.csv"));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::broken_prefill;

    #[test]
    fn an_arm_faster_than_a_term_of_its_prefill_floor_breaks_it() {
        let mib = 1048576.0;
        assert_eq!(broken_prefill(12.0, 9.9, 200.0 * mib, 3000.0 * mib), None);
        assert_eq!(broken_prefill(9.9, 9.9, 200.0 * mib, 3000.0 * mib), None, "equal to the resident prefill is a floor met");
        assert_eq!(broken_prefill(9.0, 9.9, 200.0 * mib, 3000.0 * mib), Some("compute"));
        assert_eq!(broken_prefill(12.0, 9.9, 3100.0 * mib, 3000.0 * mib), Some("read"));
        assert_eq!(broken_prefill(f64::NAN, 9.9, 200.0 * mib, 3000.0 * mib), Some("compute"));
        assert_eq!(broken_prefill(0.0, 0.0, f64::INFINITY, 3000.0 * mib), Some("compute"));
        assert_eq!(broken_prefill(12.0, 9.9, f64::NAN, 3000.0 * mib), Some("read"));
    }
}
