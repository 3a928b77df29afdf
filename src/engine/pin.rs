//! The engine pin: parsing `vendor/llama.cpp.pin` and the tree digest.
//!
//! Shared verbatim by `build.rs` (through `#[path]`) and the crate, so the digest the build
//! checks is the one `sovereign build-info` explains.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The fields of `vendor/llama.cpp.pin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub package: String,
    pub version: String,
    pub checksum: String,
    pub tree_sha256: String,
}

impl Pin {
    /// Parses `key = "value"` lines; `#` starts a comment. Unknown or missing keys are errors.
    pub fn parse(text: &str) -> Result<Pin, PinError> {
        let mut kv = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or(PinError::NotKeyValue { line: n + 1 })?;
            let v = v.trim();
            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).ok_or(PinError::Unquoted { line: n + 1 })?;
            let k = k.trim();
            if !matches!(k, "package" | "version" | "checksum" | "tree_sha256") {
                return Err(PinError::UnknownKey { line: n + 1, key: k.to_string() });
            }
            kv.insert(k.to_string(), v.to_string());
        }
        let mut take = |k: &'static str| kv.remove(k).ok_or(PinError::Missing(k));
        Ok(Pin { package: take("package")?, version: take("version")?, checksum: take("checksum")?, tree_sha256: take("tree_sha256")? })
    }
}

/// Why `vendor/llama.cpp.pin` was refused. Written out by hand: `build.rs` includes this file
/// and has no `thiserror`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinError {
    NotKeyValue { line: usize },
    Unquoted { line: usize },
    UnknownKey { line: usize, key: String },
    Missing(&'static str),
}

impl std::fmt::Display for PinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PinError::NotKeyValue { line } => write!(f, "line {line}: expected key = \"value\""),
            PinError::Unquoted { line } => write!(f, "line {line}: value must be quoted"),
            PinError::UnknownKey { line, key } => write!(f, "line {line}: unknown key `{key}`"),
            PinError::Missing(key) => write!(f, "missing key `{key}`"),
        }
    }
}

impl std::error::Error for PinError {}

/// SHA-256 over a directory tree: every regular file, in byte order of its `/`-separated
/// relative path, contributes `path NUL sha256(content) LF`. Symbolic links and other special
/// files are refused, so the digest covers every byte the build can read.
pub fn tree_digest(root: &Path) -> io::Result<String> {
    let mut files = Vec::new();
    collect(root, root, &mut files)?;
    files.sort();
    let mut outer = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    for rel in &files {
        let mut f = fs::File::open(root.join(rel))?;
        let mut inner = Sha256::new();
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            inner.update(&buf[..n]);
        }
        outer.update(rel.as_bytes());
        outer.update([0u8]);
        outer.update(hex::encode(inner.finalize()).as_bytes());
        outer.update(b"\n");
    }
    Ok(hex::encode(outer.finalize()))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path: PathBuf = entry.path();
        let ty = entry.file_type()?;
        if ty.is_dir() {
            collect(root, &path, out)?;
        } else if ty.is_file() {
            let rel = path.strip_prefix(root).expect("below root");
            let rel = rel.to_str().ok_or_else(|| io::Error::other(format!("non-UTF-8 path {}", rel.display())))?;
            out.push(rel.replace(std::path::MAIN_SEPARATOR, "/"));
        } else {
            return Err(io::Error::other(format!("{} is neither a file nor a directory", path.display())));
        }
    }
    Ok(())
}

/// SHA-256 of one file, hex.
pub fn file_digest(path: &Path) -> io::Result<String> {
    Ok(hex::encode(Sha256::digest(fs::read(path)?)))
}

#[cfg(test)]
mod tests {
    use super::{Pin, PinError};

    #[test]
    fn each_refusal_says_its_line_or_key() {
        let good = "# pin\npackage = \"p\"\nversion = \"1\"\nchecksum = \"c\"\ntree_sha256 = \"t\"\n";
        assert_eq!(Pin::parse(good).map(|p| p.tree_sha256), Ok("t".to_string()));
        assert_eq!(Pin::parse("package \"p\""), Err(PinError::NotKeyValue { line: 1 }));
        assert_eq!(Pin::parse("\npackage = p"), Err(PinError::Unquoted { line: 2 }));
        assert_eq!(Pin::parse("colour = \"red\""), Err(PinError::UnknownKey { line: 1, key: "colour".into() }));
        assert_eq!(Pin::parse("package = \"p\""), Err(PinError::Missing("version")));
    }
}
