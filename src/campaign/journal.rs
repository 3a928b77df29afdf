//! The campaign journal: `results/campaigns/<id>/journal.jsonl`, one JSON object per line,
//! appended and fsynced before the step it describes is taken further. A block run as a
//! cluster task writes its own `journals/bNN.jsonl` instead (one writer per file on a shared
//! file system); readers merge every file by time ([`Journal::read_all`]).
//!
//! Every line is `{"seq": N, "unix_ms": T, "event": "<kind>", ...fields}`; `seq` counts from 0.
//! Kinds, in the order a cell meets them:
//!
//! | event | fields | meaning |
//! | --- | --- | --- |
//! | `preregistered` | `campaign_sha256` | the campaign was frozen (first line) |
//! | `runner_started` | `pid`, `mode` (`run`/`resume`), `binary_sha256`, `cells` | a runner took the lock |
//! | `cell_started` | `cell`, `index`, `attempt`, `staging` | a fresh child process was started for the cell |
//! | `cell_discarded` | `cell`, `attempt`, `reason` | an attempt was interrupted before it had an outcome; its staging was deleted and the cell will run again (not an outcome-selected rerun) |
//! | `cell_sealing` | `cell`, `attempt`, `digest` | the outcome is complete and its manifest written; the rename to `results/<digest>` follows |
//! | `cell_sealed` | `cell`, `attempt`, `digest`, `status`, `valid`, `exact`, `admission`, `wall_s`, `recovered` | the record is sealed (`recovered`: the rename had happened before a crash, or was finished on resume) |
//! | `cell_skipped` | `cell`, `reason` | a stop rule skipped the cell |
//! | `cell_abandoned` | `cell`, `attempts`, `reason` | interrupted more often than `repetition.max_interrupted_attempts` allows |
//! | `runner_finished` | `sealed`, `skipped`, `abandoned` | every cell is settled |
//! | `journal_repaired` | `dropped_bytes` | a torn last line (power loss mid-write) was cut off |
//!
//! A cell is settled by exactly one of `cell_sealed`, `cell_skipped`, `cell_abandoned`.

use super::executor::CellStatus;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub unix_ms: u64,
    #[serde(flatten)]
    pub event: Event,
}

/// How a runner started, as its journal says: `run` or `resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// Preregister if needed, then continue.
    Run,
    /// The campaign must already be preregistered.
    Resume,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Preregistered {
        campaign_sha256: String,
    },
    RunnerStarted {
        pid: u32,
        mode: RunMode,
        binary_sha256: String,
        cells: usize,
    },
    CellStarted {
        cell: String,
        index: usize,
        attempt: u32,
        staging: String,
    },
    CellDiscarded {
        cell: String,
        attempt: u32,
        reason: String,
    },
    CellSealing {
        cell: String,
        attempt: u32,
        digest: String,
    },
    CellSealed {
        cell: String,
        attempt: u32,
        digest: String,
        status: CellStatus,
        valid: bool,
        exact: Option<bool>,
        admission: Option<bool>,
        wall_s: f64,
        recovered: bool,
    },
    CellSkipped {
        cell: String,
        reason: String,
    },
    CellAbandoned {
        cell: String,
        attempts: u32,
        reason: String,
    },
    RunnerFinished {
        sealed: usize,
        skipped: usize,
        abandoned: usize,
    },
    JournalRepaired {
        dropped_bytes: u64,
    },
}

impl Event {
    /// The cell an event is about, if any.
    pub fn cell(&self) -> Option<&str> {
        match self {
            Event::CellStarted { cell, .. }
            | Event::CellDiscarded { cell, .. }
            | Event::CellSealing { cell, .. }
            | Event::CellSealed { cell, .. }
            | Event::CellSkipped { cell, .. }
            | Event::CellAbandoned { cell, .. } => Some(cell),
            _ => None,
        }
    }
}

pub struct Journal {
    file: File,
    path: PathBuf,
    next_seq: u64,
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Parses a journal. A last line without its newline that does not parse is a torn write and is
/// reported as `Some(byte offset where it starts)`; any other bad line is an error.
fn parse(path: &Path, text: &str) -> Result<(Vec<Entry>, Option<usize>)> {
    let mut entries = Vec::new();
    let mut offset = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let complete = line.ends_with('\n');
        match serde_json::from_str::<Entry>(line.trim_end()) {
            Ok(e) => {
                if e.seq != entries.len() as u64 {
                    bail!("{}:{}: sequence number {} where {} was expected", path.display(), n + 1, e.seq, entries.len());
                }
                if !complete {
                    return Ok((entries, Some(offset)));
                }
                entries.push(e);
            }
            Err(_) if !complete => return Ok((entries, Some(offset))),
            Err(e) => bail!("{}:{}: not a journal entry: {e}", path.display(), n + 1),
        }
        offset += line.len();
    }
    Ok((entries, None))
}

impl Journal {
    /// Reads a journal without opening it for writing (`campaign status`, `export`).
    pub fn read(path: &Path) -> Result<Vec<Entry>> {
        if !path.exists() {
            return Ok(Vec::new());
        }
        let text = crate::bounds::read_text("the journal", path, crate::bounds::MAX_JOURNAL_BYTES)?;
        Ok(parse(path, &text)?.0)
    }

    /// Reads several journals (the local runner's and one per cluster task, each with a single
    /// writer) as one: merged by time, each file's own order kept. Two files only ever hold
    /// events of one cell when one runner took it over from another (resume), seconds apart, so
    /// node clocks need only agree to within that.
    pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Entry>> {
        let mut files: Vec<std::collections::VecDeque<Entry>> =
            paths.iter().map(|p| Journal::read(p).map(Into::into)).collect::<Result<_>>()?;
        let mut all = Vec::new();
        while let Some(i) = (0..files.len()).filter(|&i| !files[i].is_empty()).min_by_key(|&i| files[i][0].unix_ms) {
            all.push(files[i].pop_front().expect("not empty"));
        }
        Ok(all)
    }

    /// Opens (creating) a journal for appending and returns what it already holds; a torn last
    /// line is cut off and the repair itself journaled.
    pub fn open(path: &Path) -> Result<(Journal, Vec<Entry>)> {
        let text =
            if path.exists() { crate::bounds::read_text("the journal", path, crate::bounds::MAX_JOURNAL_BYTES)? } else { String::new() };
        let (entries, torn) = parse(path, &text)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("{}: cannot open for appending", path.display()))?;
        let mut j = Journal { file, path: path.to_path_buf(), next_seq: entries.len() as u64 };
        if let Some(at) = torn {
            j.file.set_len(at as u64).with_context(|| format!("{}: truncating a torn line", path.display()))?;
            j.append(Event::JournalRepaired { dropped_bytes: (text.len() - at) as u64 })?;
        }
        if let Some(parent) = path.parent() {
            crate::util::sync_dir(parent)?;
        }
        Ok((j, entries))
    }

    /// Appends one event as one `write` and makes it durable before returning.
    pub fn append(&mut self, event: Event) -> Result<Entry> {
        let entry = Entry { seq: self.next_seq, unix_ms: now_ms(), event };
        let mut line = serde_json::to_string(&entry)?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).with_context(|| format!("{}: append", self.path.display()))?;
        self.file.sync_data().with_context(|| format!("{}: fsync", self.path.display()))?;
        self.next_seq += 1;
        Ok(entry)
    }
}

/// What the journal says about one cell so far.
#[derive(Debug, Clone, PartialEq)]
pub enum CellState {
    Pending,
    Started { attempt: u32, staging: String },
    Sealing { attempt: u32, digest: String },
    Sealed { digest: String, status: CellStatus, admission: Option<bool> },
    Skipped { reason: String },
    Abandoned,
}

#[derive(Debug, Clone)]
pub struct CellHistory {
    pub state: CellState,
    pub attempts: u32,
    pub discards: u32,
}

/// Folds the journal into one history per cell key.
pub fn histories(entries: &[Entry]) -> BTreeMap<String, CellHistory> {
    let mut h: BTreeMap<String, CellHistory> = BTreeMap::new();
    for e in entries {
        let Some(cell) = e.event.cell() else { continue };
        let c = h.entry(cell.to_string()).or_insert(CellHistory { state: CellState::Pending, attempts: 0, discards: 0 });
        match &e.event {
            Event::CellStarted { attempt, staging, .. } => {
                c.attempts = c.attempts.max(*attempt);
                c.state = CellState::Started { attempt: *attempt, staging: staging.clone() };
            }
            Event::CellDiscarded { .. } => {
                c.discards += 1;
                c.state = CellState::Pending;
            }
            Event::CellSealing { attempt, digest, .. } => c.state = CellState::Sealing { attempt: *attempt, digest: digest.clone() },
            Event::CellSealed { digest, status, admission, .. } => {
                c.state = CellState::Sealed { digest: digest.clone(), status: *status, admission: *admission }
            }
            Event::CellSkipped { reason, .. } => c.state = CellState::Skipped { reason: reason.clone() },
            Event::CellAbandoned { .. } => c.state = CellState::Abandoned,
            _ => {}
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_status_and_mode_keep_their_journal_strings() {
        let sealed = r#"{"seq":3,"unix_ms":9,"event":"cell_sealed","cell":"c","attempt":1,"digest":"d","status":"failed","valid":true,"exact":null,"admission":null,"wall_s":0.5,"recovered":false}"#;
        let e: Entry = serde_json::from_str(sealed).unwrap();
        assert!(matches!(e.event, Event::CellSealed { status: CellStatus::Failed, .. }));
        assert_eq!(serde_json::to_string(&e).unwrap(), sealed);
        let started = r#"{"seq":0,"unix_ms":1,"event":"runner_started","pid":7,"mode":"resume","binary_sha256":"b","cells":2}"#;
        let e: Entry = serde_json::from_str(started).unwrap();
        assert!(matches!(e.event, Event::RunnerStarted { mode: RunMode::Resume, .. }));
        assert_eq!(serde_json::to_string(&e).unwrap(), started);
        assert!(serde_json::from_str::<Entry>(&sealed.replace("failed", "done")).is_err(), "an unknown status is refused");
    }

    #[test]
    fn append_read_and_repair_a_torn_tail() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("journal.jsonl");
        {
            let (mut j, old) = Journal::open(&p).unwrap();
            assert!(old.is_empty());
            j.append(Event::Preregistered { campaign_sha256: "ab".into() }).unwrap();
            j.append(Event::CellSkipped { cell: "b01-p0-A".into(), reason: "r".into() }).unwrap();
        }
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"seq\":2,\"unix_ms\":1,\"ev").unwrap();
        drop(f);
        let (mut j, old) = Journal::open(&p).unwrap();
        assert_eq!(old.len(), 2);
        assert_eq!(old[1].event.cell(), Some("b01-p0-A"));
        j.append(Event::RunnerFinished { sealed: 0, skipped: 1, abandoned: 0 }).unwrap();
        let all = Journal::read(&p).unwrap();
        assert_eq!(all.len(), 4);
        assert!(matches!(all[2].event, Event::JournalRepaired { dropped_bytes: 24 }));
        assert!(std::fs::read_to_string(&p).unwrap().lines().all(|l| serde_json::from_str::<Entry>(l).is_ok()));
        // Two writers' journals merge by time, each file in its own order.
        let q = t.path().join("other.jsonl");
        let line = |seq: u64, ms: u64, cell: &str| {
            serde_json::to_string(&Entry { seq, unix_ms: ms, event: Event::CellSkipped { cell: cell.into(), reason: String::new() } })
                .unwrap()
                + "\n"
        };
        std::fs::write(&q, [line(0, 1, "x"), line(1, u64::MAX, "y")].concat()).unwrap();
        let merged = Journal::read_all(&[p.clone(), q]).unwrap();
        assert_eq!(merged.len(), 6);
        assert_eq!(merged[0].event.cell(), Some("x"));
        assert_eq!(merged[5].event.cell(), Some("y"));
        // A bad line in the middle is an error, not silently skipped.
        std::fs::write(&p, "garbage\n{}\n").unwrap();
        assert!(Journal::read(&p).is_err());
    }
}
