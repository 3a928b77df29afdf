//! Validators of the deterministic fault cells (seed 000 Table 7), read from records.

use crate::record;
use crate::source::fault::{Expect, FaultCell};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;
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
fn rejection(cell: FaultCell) -> Option<&'static str> {
    match cell {
        FaultCell::ShortRead => Some("short_read"),
        FaultCell::Eio | FaultCell::PartialBundle => Some("io_error"),
        FaultCell::StaleCompletion => Some("stale_epoch"),
        FaultCell::WrongObject => Some("wrong_object"),
        _ => None,
    }
}

/// Checks `record` as a run of `cell`; recoverable cells and the control are compared with the
/// no-fault `control` record on every surface.
pub fn validate(cell: FaultCell, record_dir: &Path, control: Option<&Path>) -> Result<Validation> {
    let (rec, _) = record::load(record_dir)?;
    let mut checks = Vec::new();
    let mut check = |name: &'static str, passed: bool, detail: String| checks.push(Check { name, passed, detail });
    let e = &rec["experts"];
    let closure = &e["closure"];
    let u = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
    check("cell on record", e["fault"]["cell"] == serde_json::to_value(cell)?, format!("{}", e["fault"]["cell"]));
    if cell != FaultCell::None {
        check("fault fired", u(&e["fault"]["fired"]) >= 1 && u(&e["fault"]["fired"]) != u64::MAX, format!("{}", e["fault"]["fired"]));
    }
    check("no active tickets", u(&closure["active_tickets"]) == 0, format!("{}", closure["active_tickets"]));
    check("source drained", u(&closure["source_outstanding"]) == 0, format!("{}", closure["source_outstanding"]));
    match cell.expect() {
        Expect::Fatal => {
            check("failed closed", rec["outcome"] == "failed", format!("outcome {}", rec["outcome"]));
            check("zero tokens accepted", u(&rec["counts"]["generated_tokens"]) == 0, format!("{}", rec["counts"]["generated_tokens"]));
            check("zero logits accepted", u(&rec["counts"]["logits_rows"]) == 0, format!("{}", rec["counts"]["logits_rows"]));
            let surfaces = rec["surfaces"].as_object().map_or(0, |m| m.len());
            check("no output surfaces", surfaces == 0, format!("{surfaces} surfaces"));
            let kind = rejection(cell).unwrap_or("");
            let n = e["telemetry"]["rejections"][kind].as_u64().unwrap_or(0);
            check("rejected before visibility", n >= 1, format!("{kind}: {n}; plan failure: {}", closure["failed"]));
            let busy = u(&closure["windows_total"]).saturating_sub(u(&closure["windows_free"]));
            let discarded = u(&e["telemetry"]["windows_discarded"]);
            check(
                "windows free, abandoned bundles discarded",
                busy == 0 && discarded >= 1 && discarded != u64::MAX,
                format!("{busy} window(s) not Free, {discarded} discarded uncopied"),
            );
            check("consumers balanced", u(&closure["consumers_live"]) == 0, format!("{}", closure["consumers_live"]));
        }
        Expect::Control | Expect::Recoverable => {
            check("completed", rec["outcome"] == "completed", format!("outcome {}: {}", rec["outcome"], rec["error"]));
            check("clean closure", e["clean_closure"] == true, format!("{closure}"));
            match control {
                Some(c) if c != record_dir => {
                    let cmp = crate::oracle::compare(c, record_dir)?;
                    let bad: Vec<_> = cmp.iter().filter(|s| !s.is_exact()).map(|s| s.surface.clone()).collect();
                    check("exact against control", bad.is_empty(), format!("differing surfaces: {bad:?}"));
                }
                Some(_) => {}
                None if cell.expect() == Expect::Recoverable => {
                    check("exact against control", false, "no control record given".into())
                }
                None => {}
            }
            if cell == FaultCell::ResetOutstanding {
                let d = u(&closure["drained_completions"]);
                check("stale work drained, never published", d >= 1 && d != u64::MAX, format!("{d} drained"));
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
