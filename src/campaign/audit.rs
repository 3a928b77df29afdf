//! The journal against the records: the journal is the runner's account of what it sealed, and
//! each record it names must exist, verify under its digest, belong to this campaign's frozen
//! preregistration and to that cell, and carry the outcome the journal wrote when sealing it.
//! A record of the campaign that the journal never named (a cell re-sealed and re-pointed) is a
//! disagreement too. `export` refuses to tabulate from a journal that disagrees; `verify`
//! reports each disagreement for the campaigns its claim's records belong to. Both re-hash the
//! records they read themselves, so the audit checks only that each record is sealed under the
//! digest the journal names (its manifest hashes to it), not every file again.

use super::journal::{Event, Journal};
use super::{frozen, read_cell, CampaignDir, CELL_FILE};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One way the journal and the records disagree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Disagreement {
    /// The cell concerned, where there is one.
    pub cell: Option<String>,
    pub detail: String,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cell {
            Some(c) => write!(f, "cell {c}: {}", self.detail),
            None => f.write_str(&self.detail),
        }
    }
}

/// Every disagreement between campaign `id`'s journal files and the records under `results`
/// (empty: they agree). Errors are for what cannot be read at all (no frozen campaign).
pub fn journal_disagreements(results: &Path, id: &str) -> Result<Vec<Disagreement>> {
    let (_, campaign_sha) = frozen(results, id)?;
    let mut out = Vec::new();
    let mut say = |cell: Option<&str>, detail: String| out.push(Disagreement { cell: cell.map(str::to_string), detail });
    let files: Vec<_> = CampaignDir::new(results, id).journal_files()?.into_iter().filter(|p| p.is_file()).collect();
    if files.is_empty() {
        say(None, format!("no journal: {} is missing", CampaignDir::new(results, id).journal().display()));
        return Ok(out);
    }
    let entries = match Journal::read_all(&files) {
        Ok(e) => e,
        Err(e) => {
            say(None, format!("{e:#}"));
            return Ok(out);
        }
    };
    let mut preregistered = false;
    // Per cell, what the journal wrote when it sealed it: (digest, the cell_sealed event).
    let mut sealed: BTreeMap<String, (String, &Event)> = BTreeMap::new();
    // A seal under way (journaled, not yet confirmed) names its record until the cell is sealed.
    let mut sealing: BTreeMap<String, String> = BTreeMap::new();
    for e in &entries {
        match &e.event {
            Event::Preregistered { campaign_sha256 } => {
                preregistered = true;
                if *campaign_sha256 != campaign_sha {
                    say(None, format!("the journal preregistered {campaign_sha256}, the frozen campaign hashes to {campaign_sha}"));
                }
            }
            Event::CellSealing { cell, digest, .. } => {
                sealing.insert(cell.clone(), digest.clone());
            }
            Event::CellSealed { cell, digest, .. } => {
                if let Some((prev, _)) = sealed.insert(cell.clone(), (digest.clone(), &e.event)) {
                    if prev != *digest {
                        say(Some(cell), format!("sealed twice, as {prev} and as {digest}"));
                    }
                }
            }
            _ => {}
        }
    }
    let named: BTreeSet<String> = sealed
        .values()
        .map(|(d, _)| d.clone())
        .chain(sealing.iter().filter(|(c, _)| !sealed.contains_key(*c)).map(|(_, d)| d.clone()))
        .collect();
    if !preregistered {
        say(None, "the journal has no preregistration line".into());
    }
    for (cell, (digest, event)) in &sealed {
        let Event::CellSealed { status, valid, exact, admission, wall_s, .. } = event else { continue };
        let dir = results.join(digest);
        let doc = match sealed_as(&dir, digest).and_then(|()| read_cell(&dir)) {
            Ok(d) => d,
            Err(e) => {
                say(Some(cell), format!("record {digest}: {e:#}"));
                continue;
            }
        };
        let mut differ = Vec::new();
        if doc.campaign.id != id || doc.campaign.sha256 != campaign_sha {
            differ.push(format!("campaign {} {} (frozen: {id} {campaign_sha})", doc.campaign.id, doc.campaign.sha256));
        }
        if doc.cell.key != *cell {
            differ.push(format!("cell {}", doc.cell.key));
        }
        if doc.outcome.status != *status {
            differ.push(format!("status {} (journal: {})", doc.outcome.status.name(), status.name()));
        }
        if doc.validity.valid != *valid {
            differ.push(format!("valid {} (journal: {valid})", doc.validity.valid));
        }
        if doc.oracle.exact != *exact {
            differ.push(format!("exact {:?} (journal: {exact:?})", doc.oracle.exact));
        }
        if doc.admission.passed != *admission {
            differ.push(format!("admission {:?} (journal: {admission:?})", doc.admission.passed));
        }
        if doc.outcome.wall_s.to_bits() != wall_s.to_bits() {
            differ.push(format!("wall_s {} (journal: {wall_s})", doc.outcome.wall_s));
        }
        if !differ.is_empty() {
            say(Some(cell), format!("record {digest} says {}", differ.join(", ")));
        }
    }
    // Records of this campaign the journal never named: a cell sealed again outside the runner.
    for (digest, cell) in campaign_records(results, id) {
        if !named.contains(&digest) {
            let now = sealed.get(&cell).map_or("nothing".to_string(), |(d, _)| d.clone());
            say(Some(&cell), format!("record {digest} belongs to this cell, but the journal never sealed it (it seals {now})"));
        }
    }
    Ok(out)
}

/// That `dir` is a record sealed under `digest`: its manifest exists and hashes to it.
fn sealed_as(dir: &Path, digest: &str) -> Result<()> {
    let m = dir.join(crate::record::MANIFEST_FILE);
    if !m.is_file() {
        anyhow::bail!("{}: missing (not a sealed record)", m.display());
    }
    let got = crate::util::sha256(&crate::bounds::read_file("a seal manifest", &m, crate::bounds::MAX_RECORD_JSON_BYTES)?);
    if got != digest {
        anyhow::bail!("{}: hashes to {got}, not the digest it is sealed under", m.display());
    }
    Ok(())
}

/// (digest, cell) of every sealed record directly under `results` whose `cell.json` names
/// campaign `id`. Unreadable entries are skipped: they belong to no campaign that can be told.
fn campaign_records(results: &Path, id: &str) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(results) else { return Vec::new() };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) || !e.path().join(CELL_FILE).is_file() {
            continue;
        }
        if let Ok(doc) = read_cell(&e.path()) {
            if doc.campaign.id == id {
                out.push((name, doc.cell.key));
            }
        }
    }
    out.sort();
    out
}
