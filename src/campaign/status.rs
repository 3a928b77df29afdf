//! `campaign status`: the journal folded per cell, read-only (safe while a runner is active),
//! with each block's cluster job where the campaign went to Slurm.

use super::executor::CellStatus;
use super::journal::{histories, CellHistory, CellState, Journal};
use super::slurm::{blocks_text, BlockRow};
use super::{expand, frozen, CampaignDir, Loaded};
use anyhow::Result;
use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// One row of `campaign status`.
#[derive(Debug, Clone, Serialize)]
pub struct CellRow {
    pub index: usize,
    pub cell: String,
    pub arm: String,
    pub block: usize,
    pub order: String,
    /// pending, running, interrupted, sealing, sealed, skipped, abandoned
    pub state: String,
    pub record: Option<String>,
    pub status: Option<CellStatus>,
    pub admission: Option<bool>,
    pub attempts: u32,
    pub discards: u32,
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub campaign: String,
    pub digest: String,
    pub preregistered: bool,
    /// The file given no longer has the frozen digest.
    pub file_changed: bool,
    pub runner_active: bool,
    pub finished: bool,
    pub counts: BTreeMap<String, usize>,
    pub cells: Vec<CellRow>,
    /// Each block's cluster job, where the campaign was submitted to Slurm.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<BlockRow>,
    /// Why the cluster could not be asked about those jobs (the states come from the journals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_unreachable: Option<String>,
}

/// `campaign status`: the journal folded per cell (read-only; safe while a runner is active).
pub fn status(c: &Loaded, results: &Path) -> Result<StatusReport> {
    let dir = CampaignDir::new(results, c.id());
    let preregistered = dir.campaign_json().exists();
    let (spec, digest, file_changed) = if preregistered {
        let (spec, d) = frozen(results, c.id())?;
        let changed = d != c.digest;
        (spec, d, changed)
    } else {
        (c.spec.clone(), c.digest.clone(), false)
    };
    let entries = Journal::read_all(&dir.journal_files()?)?;
    let hist = histories(&entries);
    let active = preregistered && is_locked(&dir);
    let mut counts = BTreeMap::new();
    let mut cells = Vec::new();
    for cell in expand(&spec) {
        let h = hist.get(&cell.key).cloned().unwrap_or(CellHistory { state: CellState::Pending, attempts: 0, discards: 0 });
        let (state, record, status, admission, note) = match h.state {
            CellState::Pending => ("pending", None, None, None, None),
            CellState::Started { .. } => (if active { "running" } else { "interrupted" }, None, None, None, None),
            CellState::Sealing { digest, .. } => ("sealing", Some(digest), None, None, None),
            CellState::Sealed { digest, status, admission } => ("sealed", Some(digest), Some(status), admission, None),
            CellState::Skipped { reason } => ("skipped", None, None, None, Some(reason)),
            CellState::Abandoned => ("abandoned", None, None, None, None),
        };
        *counts.entry(state.to_string()).or_insert(0) += 1;
        cells.push(CellRow {
            index: cell.index,
            cell: cell.key.clone(),
            arm: cell.arm.id.value.clone(),
            block: cell.block,
            order: cell.order.clone(),
            state: state.to_string(),
            record,
            status,
            admission,
            attempts: h.attempts,
            discards: h.discards,
            note,
        });
    }
    let finished = cells.iter().all(|r| matches!(r.state.as_str(), "sealed" | "skipped" | "abandoned"));
    Ok(StatusReport {
        campaign: c.id().to_string(),
        digest,
        preregistered,
        file_changed,
        runner_active: active,
        finished,
        counts,
        cells,
        blocks: Vec::new(),
        cluster_unreachable: None,
    })
}

impl StatusReport {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "campaign {} ({}){}{}\n",
            self.campaign,
            self.digest,
            if !self.preregistered {
                ", not preregistered yet"
            } else if self.runner_active {
                ", runner active"
            } else {
                ""
            },
            if self.file_changed { ", WARNING: the file no longer matches the frozen campaign" } else { "" }
        );
        for r in &self.cells {
            s += &format!(
                "  {:<22} {:<12} {:<14} {:<10} {:<9} {}{}\n",
                r.cell,
                r.state,
                r.record.as_deref().map_or("-".to_string(), |d| d[..12.min(d.len())].to_string()),
                r.status.map_or("-", CellStatus::name),
                match r.admission {
                    Some(true) => "admitted",
                    Some(false) => "refused",
                    None => "-",
                },
                if r.discards > 0 { format!("{} interrupted attempt(s) discarded", r.discards) } else { String::new() },
                r.note.as_deref().map_or(String::new(), |n| format!(" {n}")),
            );
        }
        let counts: Vec<String> = self.counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
        s += &format!("{} cells: {}{}\n", self.cells.len(), counts.join(", "), if self.finished { " (finished)" } else { "" });
        s += &blocks_text(&self.blocks, self.cluster_unreachable.as_deref());
        s
    }
}

fn is_locked(dir: &CampaignDir) -> bool {
    match fs::OpenOptions::new().write(true).open(dir.lock()) {
        // Released when the lock drops.
        Ok(f) => Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err(),
        Err(_) => false,
    }
}
