//! The campaign's page of every sealed record: `cell.json`, which the runner adds beside
//! `record.json` (the campaign, the cell spec, its outcome, validity, exactness, admission).
//! Claims, export and reproduction read records of a campaign through this.

use super::admission::CellAdmission;
use super::executor::CellOutcome;
use super::expand::CellSpec;
use super::spec::{Admission, FaultCell, Relation};
use crate::oracle::fault::Verdict;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const CELL_FILE: &str = "cell.json";
pub const CELL_FORMAT: &str = "sovereign.cell/1";

/// `cell.json`, added by the runner to every record it seals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellDocument {
    pub format: String,
    pub campaign: CampaignRef,
    pub cell: CellSpec,
    pub attempt: u32,
    pub outcome: CellOutcome,
    pub validity: Validity,
    pub oracle: OracleRef,
    pub admission_rule: Admission,
    pub admission: CellAdmission,
    /// A fault cell's validation (absent for arms without `fault`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultRef>,
}

/// The fault cell's validator (seed 000 Table 7) applied to this record, against the sealed
/// record of the block's control.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRef {
    pub cell: FaultCell,
    /// Digest of the control's sealed record (None: the block has none sealed before this cell).
    pub control: Option<String>,
    pub validation: Verdict,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignRef {
    pub id: String,
    pub sha256: String,
}

/// Whether the record matches what the campaign preregistered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Validity {
    pub valid: bool,
    pub problems: Vec<String>,
}

/// The oracle this cell was compared with, and the result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OracleRef {
    pub arm: String,
    pub relation: Relation,
    pub horizon: u32,
    /// Digest of the oracle's sealed record (None: this is the oracle, or it has no record).
    pub record: Option<String>,
    /// None: not compared.
    pub exact: Option<bool>,
    /// Surfaces that differ (or are missing), in oracle order.
    pub differing: Vec<String>,
}

/// Reads `cell.json` of a sealed record.
pub fn read_cell(dir: &Path) -> Result<CellDocument> {
    let p = dir.join(CELL_FILE);
    let text = crate::bounds::read_text("a cell document", &p, crate::bounds::MAX_RECORD_JSON_BYTES)?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a cell document", p.display()))
}
