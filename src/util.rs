//! Small helpers shared by several rooms.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// SHA-256 of a file, hex, read in large blocks.
pub fn sha256_file(path: &Path) -> Result<String> {
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

/// Makes a directory entry (a rename, a new file) durable by syncing the directory itself.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(if dir.as_os_str().is_empty() { Path::new(".") } else { dir })
        .with_context(|| format!("{}: cannot open directory", dir.display()))?;
    d.sync_all().with_context(|| format!("{}: fsync", dir.display()))?;
    Ok(())
}
