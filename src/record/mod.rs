//! Run records: a directory of raw surfaces and `record.json` with their digests.
//!
//! A record is written into `DIR.partial` and renamed into place only when complete, so a
//! crash never leaves a half-written record under its final name; an existing record is never
//! overwritten.
//!
//! [`seal`] then turns a complete record directory into an immutable one named by its digest
//! (`results/<digest>`, see `seal.rs`); a record written at a path of its own (`generate
//! --record DIR`) is sealed there as it is committed ([`Staging::sealing`]). Claims about sealed
//! records live a room above, in `crate::claims`.

pub mod format;
mod seal;

pub use format::{
    load_envelope, load_generate, load_read_replay, load_refine, load_typed, EnvelopeRecord, GenerateRecord, ReadReplayRecord,
    RefineRecord, ReplayDecode, TypedRecord, ENVELOPE_FORMAT, GENERATE_FORMAT, READ_REPLAY_FORMAT, REFINE_FORMAT,
};
pub use seal::{
    finish_modes, prepare_seal, rename_noreplace, seal, verify_record, verify_sealed, FileEntry, Manifest, PreparedSeal, SealedRecord,
    MANIFEST_FILE, MANIFEST_FORMAT,
};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub const RECORD_FILE: &str = "record.json";

/// One raw surface: a file of the record and how to index into it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Surface {
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
    /// Bytes of one element (a logits row, a route event, a token); 1 for plain bytes.
    pub unit_bytes: u64,
    /// SHA-256 of every unit, for surfaces where a unit is a row worth certifying alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unit_sha256: Vec<String>,
}

pub struct Staging {
    final_dir: PathBuf,
    dir: PathBuf,
    surfaces: BTreeMap<String, Surface>,
    committed: bool,
    /// Seal the record as it is committed.
    seal: bool,
    /// The staging directory, open and `flock`ed for the run's lifetime: a partial whose lock
    /// is free belongs to no live run.
    _lock: Flock<File>,
}

/// Takes `f`'s exclusive flock without waiting (held until the result is dropped); None when
/// another open file holds it.
fn try_lock(f: File) -> Option<Flock<File>> {
    Flock::lock(f, FlockArg::LockExclusiveNonblock).ok()
}

static NEXT_STAGING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A run that ends without committing leaves nothing behind.
impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Staging {
    /// Claims `DIR.partial` exclusively and holds its lock for the run's lifetime. The
    /// directory appears already locked (made under a private name, locked, then renamed into
    /// place), so two runs can never write into one staging directory. An existing partial
    /// whose lock is held (a live run's) is refused; one whose lock is free was left by a run
    /// that died: it is moved aside to `DIR.abandoned-<unix time>`, with one line naming it,
    /// and this run proceeds.
    pub fn new(final_dir: &Path) -> Result<Staging> {
        if fs::symlink_metadata(final_dir).is_ok() {
            bail!("{}: already exists; records are write-once", final_dir.display());
        }
        let base = final_dir.file_name().context("record path has no name")?.to_string_lossy().into_owned();
        let dir = final_dir.with_file_name(format!("{base}.partial"));
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let n = NEXT_STAGING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mine = final_dir.with_file_name(format!(".{base}.staging-{}-{n}", std::process::id()));
        fs::create_dir(&mine).with_context(|| format!("creating {}", mine.display()))?;
        let lock = File::open(&mine).with_context(|| format!("opening {}", mine.display()))?;
        let claimed = (|| -> Result<Flock<File>> {
            let Some(lock) = try_lock(lock) else {
                bail!("{}: cannot lock its own staging directory", mine.display());
            };
            for _ in 0..2 {
                if rename_noreplace(&mine, &dir).is_ok() {
                    return Ok(lock);
                }
                let Ok(other) = File::open(&dir) else { continue };
                let Some(_other_lock) = try_lock(other) else {
                    bail!(
                        "{}: already exists and a live run holds it (another run is writing this record); choose another --record",
                        dir.display()
                    );
                };
                let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let aside = final_dir.with_file_name(format!("{base}.abandoned-{secs}"));
                rename_noreplace(&dir, &aside).with_context(|| format!("{}: left by a run that died; moving it aside", dir.display()))?;
                log::info!("{} was left by a run that died; moved to {}", dir.display(), aside.display());
            }
            bail!("{}: could not be claimed", dir.display())
        })();
        let lock = match claimed {
            Ok(lock) => lock,
            Err(e) => {
                let _ = fs::remove_dir(&mine);
                return Err(e);
            }
        };
        Ok(Staging { final_dir: final_dir.to_path_buf(), dir, surfaces: BTreeMap::new(), committed: false, seal: false, _lock: lock })
    }

    /// With `seal`, the commit seals the record where it is committed: its manifest written and
    /// its files made read-only before the rename, so it never appears unsealed, and its
    /// directory read-only after. Its digest is its manifest's; its name stays the one given.
    pub fn sealing(mut self, seal: bool) -> Staging {
        self.seal = seal;
        self
    }

    /// Writes a surface; with `unit_digests` each `unit_bytes` slice also gets its SHA-256.
    pub fn surface(&mut self, name: &str, file: &str, bytes: &[u8], unit_bytes: u64, unit_digests: bool) -> Result<()> {
        let path = self.dir.join(file);
        let mut f = BufWriter::new(File::create(&path).with_context(|| format!("creating {}", path.display()))?);
        f.write_all(bytes)?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        let unit_sha256 = if unit_digests && unit_bytes > 0 {
            bytes.chunks(unit_bytes as usize).map(|c| hex::encode(Sha256::digest(c))).collect()
        } else {
            Vec::new()
        };
        self.surfaces.insert(
            name.to_string(),
            Surface {
                file: file.to_string(),
                sha256: hex::encode(Sha256::digest(bytes)),
                bytes: bytes.len() as u64,
                unit_bytes,
                unit_sha256,
            },
        );
        Ok(())
    }

    /// The staging directory (files placed here become part of the record at commit).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn surfaces(&self) -> &BTreeMap<String, Surface> {
        &self.surfaces
    }

    /// Writes `record.json` (and, sealing, the manifest) and renames the directory into place.
    pub fn commit<T: Serialize>(mut self, record: &T) -> Result<PathBuf> {
        let path = self.dir.join(RECORD_FILE);
        let mut f = File::create(&path)?;
        // Through a JSON value, so keys are sorted as every record's have been.
        serde_json::to_writer_pretty(&mut f, &serde_json::to_value(record)?)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        if self.seal {
            seal::seal_staging(&self.dir)?;
        }
        rename_noreplace(&self.dir, &self.final_dir)?;
        self.committed = true;
        if self.seal {
            finish_modes(&self.final_dir)?;
        }
        if let Some(parent) = self.final_dir.parent() {
            if let Ok(d) = File::open(if parent.as_os_str().is_empty() { Path::new(".") } else { parent }) {
                let _ = d.sync_all();
            }
        }
        Ok(self.final_dir.clone())
    }
}

/// Reads a record's `record.json` as loose JSON plus its surfaces.
pub fn load(dir: &Path) -> Result<(serde_json::Value, BTreeMap<String, Surface>)> {
    let path = dir.join(RECORD_FILE);
    if !path.exists() {
        anyhow::bail!("{}: not a record (no {})", dir.display(), path.display());
    }
    let text = crate::bounds::read_text("a record", &path, crate::bounds::MAX_RECORD_JSON_BYTES)?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let surfaces = serde_json::from_value(v.get("surfaces").cloned().unwrap_or_default())
        .with_context(|| format!("{}: bad `surfaces`", path.display()))?;
    Ok((v, surfaces))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_is_exclusive_and_commit_never_replaces() {
        let t = tempfile::tempdir().unwrap();
        let rec = t.path().join("same");
        let mut a = Staging::new(&rec).unwrap();
        a.surface("tokens", "tokens.bin", b"AAAA", 4, false).unwrap();
        // A second run on the same record is refused and leaves the first's staging alone.
        let e = format!("{:#}", Staging::new(&rec).err().expect("second staging refused"));
        assert!(e.contains("same.partial") && e.contains("already exists"), "{e}");
        assert_eq!(fs::read(a.dir().join("tokens.bin")).unwrap(), b"AAAA");
        // A record that appeared meanwhile is not replaced by the commit.
        fs::create_dir(&rec).unwrap();
        let e = format!("{:#}", a.commit(&serde_json::json!({})).unwrap_err());
        assert!(e.contains("write-once"), "{e}");
        assert_eq!(fs::read_dir(&rec).unwrap().count(), 0);
    }

    #[test]
    fn a_sealing_commit_appears_sealed_under_its_own_name() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let rec = t.path().join("run");
        let mut s = Staging::new(&rec).unwrap().sealing(true);
        s.surface("tokens", "tokens.bin", b"AAAA", 4, false).unwrap();
        s.commit(&serde_json::json!({ "format": "x" })).unwrap();
        let sealed = verify_sealed(&rec).unwrap();
        assert_eq!(sealed.manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["record.json", "tokens.bin"]);
        assert_eq!(sealed.digest, crate::util::sha256(&fs::read(rec.join(MANIFEST_FILE)).unwrap()));
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&rec), mode(&rec.join("tokens.bin")), mode(&rec.join(RECORD_FILE))), (0o555, 0o444, 0o444));
        // Its name is not its digest: the strict check of a campaign's records refuses it.
        assert!(format!("{:#}", verify_record(&rec).unwrap_err()).contains("does not match the directory name"));
        // Without sealing, a commit writes no manifest.
        let plain = t.path().join("plain");
        Staging::new(&plain).unwrap().commit(&serde_json::json!({})).unwrap();
        assert!(!plain.join(MANIFEST_FILE).exists());
        fs::set_permissions(&rec, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_partial_is_refused_while_held_and_moved_aside_once_free() {
        let t = tempfile::tempdir().unwrap();
        let rec = t.path().join("x");
        let held = Staging::new(&rec).unwrap();
        fs::write(held.dir().join("keep"), b"k").unwrap();
        assert!(Staging::new(&rec).is_err(), "a live run's staging is refused");
        assert_eq!(fs::read(held.dir().join("keep")).unwrap(), b"k");
        drop(held);
        // A run that died leaves its directory with nobody holding its lock.
        let other = t.path().join("y");
        fs::create_dir(t.path().join("y.partial")).unwrap();
        fs::write(t.path().join("y.partial/keep"), b"k").unwrap();
        let s = Staging::new(&other).expect("an unlocked partial is stale");
        assert!(s.dir().exists() && fs::read_dir(s.dir()).unwrap().count() == 0, "this run's staging is fresh");
        let aside: Vec<_> =
            fs::read_dir(t.path()).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("y.abandoned-")).collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(fs::read(aside[0].path().join("keep")).unwrap(), b"k");
    }
}
