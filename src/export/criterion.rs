//! `analysis.criterion`: a prespecified criterion on a recorded number, `mean(b) - mean(a) >=
//! min_difference` over each arm's completed cells, judged whether it holds or not and
//! written to `criterion.csv`. The claim states it, and `replay` recomputes it.

use super::tables::{shown, write_table};
use super::{number, Sealed};
use crate::campaign::spec::CriterionAnalysis;
use crate::campaign::CellSpec;
use crate::claims::{CriterionExpect, Replay};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The criterion as judged: the cells of each side and what they gave (an error where a side
/// has no value: the analysis fails closed).
#[derive(Debug, Clone, Serialize)]
pub struct CriterionResult {
    pub analysis: CriterionAnalysis,
    pub a_cells: Vec<String>,
    pub b_cells: Vec<String>,
    pub judged: Result<CriterionExpect, String>,
}

#[derive(Serialize, Default)]
struct CriterionRow {
    a_arm: String,
    b_arm: String,
    metric_file: String,
    metric_pointer: String,
    a_cells: usize,
    b_cells: usize,
    #[serde(serialize_with = "shown::opt")]
    mean_a: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    mean_b: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    difference: Option<f64>,
    #[serde(serialize_with = "shown::f64")]
    min_difference: f64,
    holds: Option<bool>,
    error: Option<String>,
}

/// Judges `k` over the completed cells that hold its metric, and writes `criterion.csv`.
pub(super) fn judge(out: &Path, k: &CriterionAnalysis, cells: &[CellSpec], sealed: &BTreeMap<String, Sealed>) -> Result<CriterionResult> {
    let side = |arm: &str| -> (Vec<String>, Vec<f64>) {
        cells
            .iter()
            .filter(|c| c.arm.id.value == arm)
            .filter_map(|c| {
                let x = sealed.get(&c.key).filter(|x| x.completed())?;
                Some((c.key.clone(), number(x, &k.metric.file, &k.metric.pointer)?))
            })
            .unzip()
    };
    let ((a_cells, a), (b_cells, b)) = (side(&k.a.value), side(&k.b.value));
    let judged = CriterionExpect::of(&a, &b, k.min_difference).map_err(|e| format!("{e:#}"));
    let ok = judged.as_ref().ok();
    let row = CriterionRow {
        a_arm: k.a.value.clone(),
        b_arm: k.b.value.clone(),
        metric_file: k.metric.file.clone(),
        metric_pointer: k.metric.pointer.clone(),
        a_cells: a_cells.len(),
        b_cells: b_cells.len(),
        mean_a: ok.map(|j| j.mean_a),
        mean_b: ok.map(|j| j.mean_b),
        difference: ok.map(|j| j.mean_b - j.mean_a),
        min_difference: k.min_difference,
        holds: ok.map(|j| j.holds),
        error: judged.as_ref().err().cloned(),
    };
    write_table(&out.join("criterion.csv"), &[row])?;
    Ok(CriterionResult { analysis: k.clone(), a_cells, b_cells, judged })
}

impl CriterionResult {
    /// What the claim says of the criterion, held or not, with its replay item; one that could
    /// not be judged is said so, and the claim has nothing of it to replay.
    pub(super) fn stated(&self, replay: &mut Vec<Replay>) -> String {
        let a = &self.analysis;
        let what = format!("criterion mean {}{} of {} less {}'s", a.metric.file, a.metric.pointer, a.b.value, a.a.value);
        match &self.judged {
            Ok(e) => {
                replay.push(Replay::Criterion {
                    a: self.a_cells.clone(),
                    b: self.b_cells.clone(),
                    metric: a.metric.clone(),
                    min_difference: a.min_difference,
                    expect: *e,
                });
                format!("; {what}: {}", e.show(a.min_difference))
            }
            Err(e) => format!("; {what}: not judged ({e})"),
        }
    }
}
