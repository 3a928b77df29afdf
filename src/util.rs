//! Small helpers shared by several rooms.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// SHA-256 of a file, hex, read in large blocks with O_DIRECT where the file system allows it,
/// so that hashing a model does not fill (and charge) the page cache with its bytes.
pub fn sha256_file(path: &Path) -> Result<String> {
    match sha256_file_direct(path) {
        Ok(d) => Ok(d),
        Err(_) => sha256_file_buffered(path),
    }
}

fn sha256_file_direct(path: &Path) -> Result<String> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4 << 20;
    let f = crate::source::open_direct(path)?;
    let len = f.metadata()?.len();
    let layout = std::alloc::Layout::from_size_align(BLOCK, 4096)?;
    // SAFETY: non-zero size; freed below.
    let ptr = unsafe { std::alloc::alloc(layout) };
    anyhow::ensure!(!ptr.is_null(), "out of memory");
    // SAFETY: ptr is valid for BLOCK bytes until dealloc.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, BLOCK) };
    let mut h = Sha256::new();
    let mut off = 0u64;
    let res = (|| -> Result<()> {
        while off < len {
            let n = f.read_at(buf, off)?;
            anyhow::ensure!(n > 0, "{}: unexpected end of file", path.display());
            let n = n.min((len - off) as usize);
            h.update(&buf[..n]);
            off += n as u64;
        }
        Ok(())
    })();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    res?;
    Ok(hex::encode(h.finalize()))
}

fn sha256_file_buffered(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("{}: read", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// SHA-256 of bytes, hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Drops a file's clean pages from the page cache, so the next reader pays (and is charged for)
/// the reads itself. Returns whether the kernel accepted the advice.
pub fn drop_file_cache(path: &Path) -> Result<()> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    f.sync_all().ok();
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    if let Err(e) = posix_fadvise(f.as_raw_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED) {
        anyhow::bail!("{}: posix_fadvise(DONTNEED) failed: {}", path.display(), std::io::Error::from(e));
    }
    Ok(())
}

/// Reads `path` through the page cache, start to end, so that a run mapping it finds its
/// pages resident; returns the bytes read.
pub fn warm_file_cache(path: &Path) -> Result<u64> {
    use std::io::Read;
    let mut f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(anyhow::Error::new(e).context(format!("{}: reading into the page cache", path.display()))),
        }
    }
}

/// Canonical JSON: object keys sorted by byte order, no insignificant whitespace, strings and
/// numbers as serde_json writes them. Digests of JSON documents are taken over this form, so
/// they do not depend on field order or pretty-printing (nor on serde_json's `preserve_order`).
pub fn canonical_json(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).expect("a string serializes"));
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Canonical JSON of any serializable value (see [`canonical_json`]).
pub fn canonical_json_of<T: serde::Serialize>(v: &T) -> Result<String> {
    Ok(canonical_json(&serde_json::to_value(v)?))
}

/// Claims `path` as a run's partial output: created new, so that a file another run is writing
/// (or one an interrupted run left) is refused rather than reused or removed.
pub fn claim_partial(path: &Path) -> Result<File> {
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
            "{}: already exists (another run is writing it, or one was interrupted: remove it to start again)",
            path.display()
        ),
        Err(e) => Err(e).with_context(|| format!("{}: cannot create", path.display())),
    }
}

/// Writes `bytes` to `path` (created new, never replacing a file) and makes them durable.
pub fn write_new_durable(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("{}: cannot create", path.display()))?;
    f.write_all(bytes).with_context(|| format!("{}: write", path.display()))?;
    f.sync_all().with_context(|| format!("{}: fsync", path.display()))?;
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file and a rename: `path` is either absent or
/// whole. Writers of one `path` hold a lock over it (two would share the temporary file).
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e).with_context(|| format!("removing {}", tmp.display())),
        _ => {}
    }
    write_new_durable(&tmp, bytes)?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Makes a directory entry (a rename, a new file) durable by syncing the directory itself.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(if dir.as_os_str().is_empty() { Path::new(".") } else { dir })
        .with_context(|| format!("{}: cannot open directory", dir.display()))?;
    d.sync_all().with_context(|| format!("{}: fsync", dir.display()))?;
    Ok(())
}

/// For `skip_serializing_if`: fields added to a record format stay out of records that never
/// used them, so older records write back their own bytes.
pub fn is_zero(x: &u64) -> bool {
    *x == 0
}

pub fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

pub fn is_zero_f32(x: &f32) -> bool {
    *x == 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_output_is_claimed_once_and_a_missing_directory_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.partial");
        claim_partial(&p).unwrap();
        let again = claim_partial(&p).unwrap_err();
        assert!(again.downcast_ref::<std::io::Error>().is_none(), "a claimed file is refused as such: {again:#}");
        assert!(p.exists(), "the other run's file stays");
        let missing = claim_partial(&dir.path().join("absent").join("m.partial")).unwrap_err();
        let io = missing.root_cause().downcast_ref::<std::io::Error>().expect("the OS error is kept");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }
}
