//! Sealing: a complete staging directory becomes `results/<digest>`, write-once and read-only.
//!
//! `manifest.json` lists every file of the record (relative `/`-separated path, SHA-256, size),
//! sorted by path, and is written as canonical JSON (see [`crate::util::canonical_json`]), so
//! the record digest is simply the SHA-256 of the `manifest.json` file. The directory is then
//! renamed to `results/<digest>` with `RENAME_NOREPLACE` (an existing record, even an empty
//! directory, is never replaced), its files made 0444 and its directories 0555.
//!
//! [`verify_record`] re-derives all of this: every listed file is re-hashed, files that are not
//! listed or listed but absent fail, and the manifest digest must equal the directory name.
//!
//! A record written at a path of its own (`generate --record DIR`) is sealed where it is
//! committed ([`seal_staging`]): the same manifest and modes, under the name it was given.
//! [`verify_sealed`] verifies a record wherever it lies.

use crate::util::{canonical_json_of, sha256, sha256_file, sync_dir};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const MANIFEST_FORMAT: &str = "sovereign.manifest/1";

/// One file of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the record directory, `/`-separated.
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
}

/// The list of every file of a record; its canonical JSON's SHA-256 is the record digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    /// Sorted by `path` (byte order).
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// Hashes every file below `dir` except a top-level `manifest.json`.
    pub fn of_dir(dir: &Path) -> Result<Manifest> {
        let mut files = Vec::new();
        for rel in walk(dir)?.files {
            if rel == MANIFEST_FILE {
                continue;
            }
            let path = dir.join(&rel);
            let bytes = fs::metadata(&path).with_context(|| format!("{}", path.display()))?.len();
            files.push(FileEntry { sha256: sha256_file(&path)?, path: rel, bytes });
        }
        Ok(Manifest { format: MANIFEST_FORMAT.to_string(), files })
    }

    /// The exact bytes of `manifest.json`.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        canonical_json_of(self).expect("a manifest serializes").into_bytes()
    }

    /// The record digest: SHA-256 of the canonical manifest.
    pub fn digest(&self) -> String {
        sha256(&self.canonical_bytes())
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// A record that has been sealed (or verified) under its digest.
#[derive(Debug, Clone, Serialize)]
pub struct SealedRecord {
    pub digest: String,
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// A staging directory whose manifest is written and digest known, not yet renamed into place.
/// Splitting the two lets a caller journal the digest before the rename, so that after a crash
/// it can tell a sealed record from an unfinished one.
#[derive(Debug)]
pub struct PreparedSeal {
    staging: PathBuf,
    manifest: Manifest,
    digest: String,
}

impl PreparedSeal {
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Makes the files read-only and renames the directory to `results_dir/<digest>`.
    pub fn finish(self, results_dir: &Path) -> Result<SealedRecord> {
        fs::create_dir_all(results_dir).with_context(|| format!("creating {}", results_dir.display()))?;
        let target = results_dir.join(&self.digest);
        if target.exists() {
            bail!("{}: already exists; records are write-once", target.display());
        }
        make_read_only(&self.staging, false)?;
        rename_noreplace(&self.staging, &target)?;
        set_mode(&target, 0o555)?;
        sync_dir(results_dir)?;
        if let Some(parent) = self.staging.parent() {
            let _ = sync_dir(parent);
        }
        Ok(SealedRecord { digest: self.digest, dir: target, manifest: self.manifest })
    }
}

/// Writes `manifest.json` into a complete staging directory (replacing one left by an earlier
/// prepare of the same directory) and returns its digest.
pub fn prepare_seal(staging: &Path) -> Result<PreparedSeal> {
    let meta = fs::symlink_metadata(staging).with_context(|| format!("{}: no staging directory", staging.display()))?;
    if !meta.is_dir() {
        bail!("{}: not a directory", staging.display());
    }
    let manifest = Manifest::of_dir(staging)?;
    if manifest.files.is_empty() {
        bail!("{}: nothing to seal", staging.display());
    }
    let bytes = manifest.canonical_bytes();
    let path = staging.join(MANIFEST_FILE);
    if path.exists() {
        fs::remove_file(&path).with_context(|| format!("{}: removing a stale manifest", path.display()))?;
    }
    crate::util::write_new_durable(&path, &bytes)?;
    sync_dir(staging)?;
    Ok(PreparedSeal { staging: staging.to_path_buf(), digest: sha256(&bytes), manifest })
}

/// Seals `staging_dir` into `results_dir/<digest>`: manifest, digest, atomic no-replace rename,
/// read-only modes. Never overwrites an existing record.
pub fn seal(staging_dir: &Path, results_dir: &Path) -> Result<SealedRecord> {
    prepare_seal(staging_dir)?.finish(results_dir)
}

/// Seals a complete staging directory in place, before its commit renames it: the manifest
/// written and the files made read-only (the caller makes the directory read-only once it is in
/// place, [`finish_modes`]). Returns the record's digest.
pub(super) fn seal_staging(staging: &Path) -> Result<String> {
    let prepared = prepare_seal(staging)?;
    make_read_only(staging, false)?;
    Ok(prepared.digest)
}

/// Re-hashes every file of a sealed record against its manifest and the manifest against the
/// directory name. Any difference fails, naming each file concerned.
pub fn verify_record(dir: &Path) -> Result<SealedRecord> {
    verify(dir, true)
}

/// A sealed record wherever it lies: one named by a digest (a campaign's `results/<digest>`) is
/// verified as [`verify_record`] does, name included; one sealed where it was written
/// (`generate --record DIR`) keeps the name it was given, and every file is checked against
/// its manifest.
pub fn verify_sealed(dir: &Path) -> Result<SealedRecord> {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let digest_named = name.len() == 64 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    verify(dir, digest_named)
}

fn verify(dir: &Path, named: bool) -> Result<SealedRecord> {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mpath = dir.join(MANIFEST_FILE);
    if !mpath.exists() {
        anyhow::bail!("{}: missing (not a sealed record)", mpath.display());
    }
    let bytes = crate::bounds::read_file("a seal manifest", &mpath, crate::bounds::MAX_RECORD_JSON_BYTES)?;
    let manifest: Manifest = serde_json::from_slice(&bytes).with_context(|| format!("{}: not a manifest", mpath.display()))?;
    let mut problems = Vec::new();
    if manifest.format != MANIFEST_FORMAT {
        problems.push(format!("{}: unknown format {:?}", mpath.display(), manifest.format));
    }
    if manifest.canonical_bytes() != bytes {
        problems.push(format!("{}: not in canonical form (edited after sealing)", mpath.display()));
    }
    let digest = sha256(&bytes);
    if named && digest != name {
        problems.push(format!("{}: manifest digest {digest} does not match the directory name", dir.display()));
    }
    let listing = walk(dir)?;
    let listed: std::collections::BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    for rel in &listing.files {
        if rel != MANIFEST_FILE && !listed.contains(rel.as_str()) {
            problems.push(format!("{}: not in the manifest (added after sealing)", dir.join(rel).display()));
        }
    }
    for d in &listing.empty_dirs {
        problems.push(format!("{}: empty directory not in the manifest (added after sealing)", dir.join(d).display()));
    }
    let present: std::collections::BTreeSet<&str> = listing.files.iter().map(String::as_str).collect();
    for f in &manifest.files {
        let path = dir.join(&f.path);
        if !present.contains(f.path.as_str()) {
            problems.push(format!("{}: listed in the manifest but missing", path.display()));
            continue;
        }
        let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(u64::MAX);
        let got = sha256_file(&path)?;
        if got != f.sha256 || len != f.bytes {
            problems.push(format!(
                "{}: content does not match the manifest (sha256 {got}, {len} bytes; sealed {} , {} bytes): tampered or damaged",
                path.display(),
                f.sha256,
                f.bytes
            ));
        }
    }
    if !problems.is_empty() {
        bail!("record {} does not verify: {}", dir.display(), problems.join("; "));
    }
    Ok(SealedRecord { digest, dir: dir.to_path_buf(), manifest })
}

struct Listing {
    /// Regular files, relative and `/`-separated, sorted by byte order.
    files: Vec<String>,
    empty_dirs: Vec<String>,
}

/// Every regular file below `root`; symbolic links and special files are refused, so a digest
/// covers every byte a reader of the record can see.
fn walk(root: &Path) -> Result<Listing> {
    fn go(root: &Path, dir: &Path, out: &mut Listing) -> Result<()> {
        let mut n = 0;
        for e in fs::read_dir(dir).with_context(|| format!("{}: cannot list", dir.display()))? {
            let e = e?;
            n += 1;
            let path = e.path();
            let ty = e.file_type()?;
            let rel = path.strip_prefix(root).expect("below root");
            let rel = rel
                .to_str()
                .with_context(|| format!("{}: file name is not UTF-8", path.display()))?
                .replace(std::path::MAIN_SEPARATOR, "/");
            if ty.is_dir() {
                go(root, &path, out)?;
            } else if ty.is_file() {
                out.files.push(rel);
            } else {
                bail!("{}: not a regular file or directory; records hold only plain files", path.display());
            }
        }
        if n == 0 && dir != root {
            let rel = dir.strip_prefix(root).expect("below root").to_string_lossy().into_owned();
            out.empty_dirs.push(rel);
        }
        Ok(())
    }
    let mut out = Listing { files: Vec::new(), empty_dirs: Vec::new() };
    go(root, root, &mut out)?;
    out.files.sort();
    Ok(out)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("{}: chmod {mode:o}", path.display()))
}

/// Files 0444, directories 0555, bottom-up; the top directory itself only if `top`.
fn make_read_only(dir: &Path, top: bool) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        if e.file_type()?.is_dir() {
            make_read_only(&path, true)?;
        } else {
            set_mode(&path, 0o444)?;
        }
    }
    if top {
        set_mode(dir, 0o555)?;
    }
    Ok(())
}

/// `rename(2)` that fails if `to` exists (plain rename would replace an empty directory).
pub fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    use nix::errno::Errno;
    use nix::fcntl::{renameat2, RenameFlags};
    let Err(errno) = renameat2(None, from, None, to, RenameFlags::RENAME_NOREPLACE) else { return Ok(()) };
    let err = std::io::Error::from(errno);
    match errno {
        // File systems without RENAME_NOREPLACE: an existence check, then a rename that
        // cannot replace a non-empty directory (and a record is never empty).
        Errno::EINVAL | Errno::ENOSYS => {
            if to.exists() {
                bail!("{}: already exists; records are write-once", to.display());
            }
            fs::rename(from, to).with_context(|| format!("renaming {} to {}", from.display(), to.display()))
        }
        Errno::EEXIST | Errno::ENOTEMPTY => bail!("{}: already exists; records are write-once", to.display()),
        _ => Err(err).with_context(|| format!("renaming {} to {}", from.display(), to.display())),
    }
}

/// Makes a sealed record's top directory read-only again (a crash between the rename and the
/// chmod can leave it writable); contents are left as they are.
pub fn finish_modes(dir: &Path) -> Result<()> {
    set_mode(dir, 0o555)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staging(root: &Path) -> PathBuf {
        let s = root.join("stage");
        fs::create_dir_all(s.join("sub")).unwrap();
        fs::write(s.join("record.json"), b"{\"a\":1}\n").unwrap();
        fs::write(s.join("logits.bin"), [1u8, 2, 3, 4]).unwrap();
        fs::write(s.join("sub/x.txt"), b"x").unwrap();
        s
    }

    fn writable(p: &Path) {
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
    }

    #[test]
    fn seal_then_verify_then_tamper() {
        let t = tempfile::tempdir().unwrap();
        let s = staging(t.path());
        let results = t.path().join("results");
        let r = seal(&s, &results).unwrap();
        assert!(!s.exists());
        assert_eq!(r.dir, results.join(&r.digest));
        assert_eq!(r.manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["logits.bin", "record.json", "sub/x.txt"]);
        assert_eq!(sha256(&fs::read(r.dir.join(MANIFEST_FILE)).unwrap()), r.digest);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&r.dir), 0o555);
        assert_eq!(mode(&r.dir.join("sub")), 0o555);
        assert_eq!(mode(&r.dir.join("logits.bin")), 0o444);
        verify_record(&r.dir).unwrap();

        // One flipped byte fails, naming the file.
        writable(&r.dir);
        let f = r.dir.join("logits.bin");
        writable(&f);
        fs::write(&f, [1u8, 2, 3, 5]).unwrap();
        let e = format!("{:#}", verify_record(&r.dir).unwrap_err());
        assert!(e.contains("logits.bin") && e.contains("tampered"), "{e}");
        fs::write(&f, [1u8, 2, 3, 4]).unwrap();
        verify_record(&r.dir).unwrap();

        // Extra and missing files fail too.
        fs::write(r.dir.join("extra.txt"), b"").unwrap();
        let e = format!("{:#}", verify_record(&r.dir).unwrap_err());
        assert!(e.contains("extra.txt") && e.contains("not in the manifest"), "{e}");
        fs::remove_file(r.dir.join("extra.txt")).unwrap();
        writable(&r.dir.join("sub"));
        fs::remove_file(r.dir.join("sub/x.txt")).unwrap();
        let e = format!("{:#}", verify_record(&r.dir).unwrap_err());
        assert!(e.contains("sub/x.txt") && e.contains("missing"), "{e}");
    }

    #[test]
    fn a_renamed_record_fails_and_nothing_is_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let results = t.path().join("results");
        let r = seal(&staging(t.path()), &results).unwrap();
        // The same content again has the same digest: refused, not replaced.
        let e = seal(&staging(t.path()), &results).unwrap_err();
        assert!(format!("{e:#}").contains("write-once"), "{e:#}");
        // An empty directory squatting on the name is not replaced either.
        writable(&r.dir);
        let moved = results.join("elsewhere");
        fs::rename(&r.dir, &moved).unwrap();
        fs::create_dir(&r.dir).unwrap();
        assert!(seal(&t.path().join("stage"), &results).is_err());
        let e = format!("{:#}", verify_record(&moved).unwrap_err());
        assert!(e.contains("does not match the directory name"), "{e}");
    }
}
