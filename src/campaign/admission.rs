//! The admission predicate of a cell, computed from raw operands only (so `replay` can redo it):
//! the cell completed with a valid record, is exact against the oracle when required, and,
//! under a memory cap, kept positive headroom of at least `min_headroom_bytes` with at most
//! `max_limit_events` limit events. An operand that was not observed leaves the predicate
//! unevaluated (`passed: None`) unless another operand already fails it.

use super::executor::{CellStatus, Telemetry};
use super::spec::Admission;
use serde::{Deserialize, Serialize};

/// A campaign cell's admission: the campaign's rule ([`Admission`]) applied to the cell's
/// outcome, as `cell.json` records it (a run's own predicate is `observe::authority::RunAdmission`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellAdmission {
    /// `Some(true)` admitted, `Some(false)` refused, `None` not evaluable (operand not observed).
    pub passed: Option<bool>,
    /// cap − peak, when both are known.
    pub headroom_bytes: Option<i64>,
    /// Why it failed or could not be evaluated.
    pub reasons: Vec<String>,
}

/// The operands of the predicate for one cell.
pub struct Operands<'a> {
    pub status: CellStatus,
    pub valid: bool,
    pub is_oracle: bool,
    /// Exactness against the oracle (None: not compared).
    pub exact: Option<bool>,
    pub memory_cap_bytes: Option<u64>,
    pub telemetry: &'a Telemetry,
}

pub fn evaluate(rule: &Admission, o: &Operands) -> CellAdmission {
    let mut failed = Vec::new();
    let mut unknown = Vec::new();
    if o.status != CellStatus::Completed {
        failed.push("the cell failed".to_string());
    }
    if !o.valid {
        failed.push("the record does not match the preregistered identities".to_string());
    }
    if rule.require_exact && !o.is_oracle {
        match o.exact {
            Some(true) => {}
            Some(false) => failed.push("not exact against the oracle".to_string()),
            None if o.status == CellStatus::Completed => unknown.push("exactness against the oracle was not evaluated".to_string()),
            None => {}
        }
    }
    let mut headroom_bytes = None;
    if let Some(cap) = o.memory_cap_bytes {
        match o.telemetry.memory_peak_bytes {
            Some(peak) => {
                let h = cap as i64 - peak as i64;
                headroom_bytes = Some(h);
                if h <= 0 || (h as u64) < rule.min_headroom_bytes {
                    failed.push(format!("headroom {h} bytes below the required {} (and > 0)", rule.min_headroom_bytes));
                }
            }
            None => unknown.push("memory peak not observed".to_string()),
        }
        match o.telemetry.memory_max_events {
            Some(n) if n > rule.max_limit_events => failed.push(format!("{n} limit events (at most {} allowed)", rule.max_limit_events)),
            Some(_) => {}
            None => unknown.push("limit events not observed".to_string()),
        }
    }
    let passed = if !failed.is_empty() {
        Some(false)
    } else if !unknown.is_empty() {
        None
    } else {
        Some(true)
    };
    failed.extend(unknown);
    CellAdmission { passed, headroom_bytes, reasons: failed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicate_cases() {
        let rule = Admission { require_exact: true, min_headroom_bytes: 10, max_limit_events: 0 };
        let t = Telemetry::default();
        let base = Operands {
            status: CellStatus::Completed,
            valid: true,
            is_oracle: false,
            exact: Some(true),
            memory_cap_bytes: None,
            telemetry: &t,
        };
        assert_eq!(evaluate(&rule, &base).passed, Some(true));
        assert_eq!(evaluate(&rule, &Operands { exact: Some(false), ..base }).passed, Some(false));
        assert_eq!(evaluate(&rule, &Operands { exact: None, ..base }).passed, None);
        assert_eq!(evaluate(&rule, &Operands { exact: None, is_oracle: true, ..base }).passed, Some(true));
        assert_eq!(evaluate(&rule, &Operands { memory_cap_bytes: Some(100), ..base }).passed, None);
        // Seed 000 §5.3: the P cell is exact but reaches the ceiling with limit events.
        let hot = Telemetry { memory_peak_bytes: Some(100), memory_max_events: Some(33_481), ..Telemetry::default() };
        let r = evaluate(&rule, &Operands { memory_cap_bytes: Some(100), telemetry: &hot, ..base });
        assert_eq!((r.passed, r.headroom_bytes), (Some(false), Some(0)));
        let ok = Telemetry { memory_peak_bytes: Some(80), memory_max_events: Some(0), ..Telemetry::default() };
        let r = evaluate(&rule, &Operands { memory_cap_bytes: Some(100), telemetry: &ok, ..base });
        assert_eq!((r.passed, r.headroom_bytes), (Some(true), Some(20)));
    }
}
