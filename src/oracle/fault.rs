//! Validators of the deterministic fault cells (seed 000 Table 7), read from records.

use crate::plan::RejectKind;
use crate::record::{self, format::Outcome};
use crate::source::fault::{Expect, FaultCell};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Validation {
    pub cell: FaultCell,
    pub expect: Expect,
    pub invariant: &'static str,
    pub passed: bool,
    pub checks: Vec<Check>,
}

/// The rejection a fatal cell must cause.
fn rejection(cell: FaultCell) -> Option<RejectKind> {
    match cell {
        FaultCell::ShortRead => Some(RejectKind::ShortRead),
        FaultCell::Eio | FaultCell::PartialBundle => Some(RejectKind::IoError),
        FaultCell::StaleCompletion => Some(RejectKind::StaleEpoch),
        FaultCell::WrongObject => Some(RejectKind::WrongObject),
        FaultCell::CorruptByte => Some(RejectKind::DigestMismatch),
        _ => None,
    }
}

/// Checks `record` as a run of `cell`; recoverable cells and the control are compared with the
/// no-fault `control` record on every surface.
pub fn validate(cell: FaultCell, record_dir: &Path, control: Option<&Path>) -> Result<Validation> {
    let rec = record::load_generate(record_dir)?;
    let mut checks = Vec::new();
    let mut check = |name: &'static str, passed: bool, detail: String| checks.push(Check { name, passed, detail });
    // A record whose source did not report (or not as the Plan) fails every check it names.
    let plan = rec.plan();
    let closure = plan.map(|p| &p.closure);
    let fault = plan.map(|p| &p.fault);
    let shown = |v: Option<u64>| v.map_or("not on record".to_string(), |v| v.to_string());
    let counts = rec.counts.as_ref();
    let on_record = fault.map(|f| f.cell);
    check("cell on record", on_record == Some(cell), on_record.map_or("not on record".into(), |c| c.name()));
    if cell != FaultCell::None {
        let fired = fault.map(|f| f.fired);
        check("fault fired", fired.is_some_and(|n| n >= 1), shown(fired));
    }
    let active = closure.map(|c| c.active_tickets);
    check("no active tickets", active == Some(0), shown(active));
    let outstanding = closure.map(|c| c.source_outstanding);
    check("source drained", outstanding == Some(0), shown(outstanding));
    let outcome = rec.outcome;
    match cell.expect() {
        Expect::Fatal => {
            check("failed closed", outcome == Outcome::Failed, format!("outcome {}", outcome.name()));
            let generated = counts.map(|c| c.generated_tokens as u64);
            check("zero tokens accepted", generated == Some(0), shown(generated));
            let rows = counts.map(|c| c.logits_rows as u64);
            check("zero logits accepted", rows == Some(0), shown(rows));
            let surfaces = rec.surfaces.len();
            check("no output surfaces", surfaces == 0, format!("{surfaces} surfaces"));
            let kind = rejection(cell);
            let n = kind.and_then(|k| plan.and_then(|p| p.telemetry.rejections.get(&k).copied())).unwrap_or(0);
            let kind = kind.map_or("none", RejectKind::name);
            let failure = closure.and_then(|c| c.failed.as_deref()).unwrap_or("none");
            check("rejected before visibility", n >= 1, format!("{kind}: {n}; plan failure: {failure}"));
            let busy = closure.map(|c| c.windows_total.saturating_sub(c.windows_free));
            let discarded = plan.map(|p| p.telemetry.windows_discarded);
            check(
                "windows free, abandoned bundles discarded",
                busy == Some(0) && discarded.is_some_and(|d| d >= 1),
                format!("{} window(s) not Free, {} discarded uncopied", shown(busy.map(u64::from)), shown(discarded)),
            );
            let live = closure.map(|c| c.consumers_live);
            check("consumers balanced", live == Some(0), shown(live));
        }
        Expect::Control | Expect::Recoverable => {
            check(
                "completed",
                outcome == Outcome::Completed,
                format!("outcome {}: {}", outcome.name(), rec.error.as_deref().unwrap_or("no error")),
            );
            let clean = plan.is_some_and(|p| p.clean_closure);
            check("clean closure", clean, closure.map_or("no closure on record".into(), |c| serde_json::to_string(c).unwrap_or_default()));
            match control {
                Some(c) if c != record_dir => {
                    let cmp = crate::oracle::compare(c, record_dir)?;
                    let bad: Vec<_> = cmp.iter().filter(|s| !s.is_exact()).map(|s| s.surface.clone()).collect();
                    check("exact against control", bad.is_empty(), format!("differing surfaces: {bad:?}"));
                }
                Some(_) => {}
                None if cell.expect() == Expect::Recoverable => check("exact against control", false, "no control record given".into()),
                None => {}
            }
            if cell == FaultCell::ResetOutstanding {
                let d = closure.map(|c| c.drained_completions);
                check("stale work drained, never published", d.is_some_and(|d| d >= 1), format!("{} drained", shown(d)));
            }
        }
    }
    let passed = checks.iter().all(|c| c.passed);
    Ok(Validation { cell, expect: cell.expect(), invariant: cell.invariant(), passed, checks })
}

/// A cell's validation as a campaign's `cell.json` and claim ledger carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    pub passed: bool,
    /// The checks that failed, by name.
    pub failed: Vec<String>,
}

impl Verdict {
    /// The failing checks with their details, for reports.
    pub fn explain(v: &Validation) -> String {
        let bad: Vec<String> = v.checks.iter().filter(|c| !c.passed).map(|c| format!("{} ({})", c.name, c.detail)).collect();
        if bad.is_empty() {
            "every check passed".into()
        } else {
            format!("failed: {}", bad.join("; "))
        }
    }
}

/// [`validate`] that never errs: a record or control that cannot be read is a failing check,
/// so a cell without evidence fails its validation instead of passing unseen.
pub fn verdict(cell: FaultCell, record_dir: &Path, control: Option<&Path>) -> (Verdict, String) {
    let v = validate(cell, record_dir, control).unwrap_or_else(|e| Validation {
        cell,
        expect: cell.expect(),
        invariant: cell.invariant(),
        passed: false,
        checks: vec![Check { name: "records readable", passed: false, detail: format!("{e:#}") }],
    });
    let failed = v.checks.iter().filter(|c| !c.passed).map(|c| c.name.to_string()).collect();
    (Verdict { passed: v.passed, failed }, Verdict::explain(&v))
}
