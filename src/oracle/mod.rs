//! Exactness oracle: compares the raw surfaces of two records byte for byte.

pub mod fault;
pub mod routes;

use crate::record::{self, Surface};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::Path;

/// Output surfaces of a generate record, in the order they are reported.
pub const SURFACES: &[&str] = &["tokens", "logits", "response", "routes"];

#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Exact { bytes: u64 },
    /// First differing byte, and the element (row, event, token) it falls in.
    Differs { byte: u64, unit: u64, unit_byte: u64, bytes_a: u64, bytes_b: u64 },
    Missing { in_a: bool, in_b: bool },
}

#[derive(Debug, Serialize)]
pub struct SurfaceComparison {
    pub surface: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl SurfaceComparison {
    pub fn is_exact(&self) -> bool {
        matches!(self.outcome, Outcome::Exact { .. })
    }
}

/// Reads a surface's file and checks it against the digest its record states.
pub fn read_checked(dir: &Path, s: &Surface) -> Result<Vec<u8>> {
    let path = dir.join(&s.file);
    let bytes = std::fs::read(&path).with_context(|| format!("{}", path.display()))?;
    let digest = hex::encode(Sha256::digest(&bytes));
    if digest != s.sha256 {
        bail!("{}: content does not match the digest in its record (tampered or damaged)", path.display());
    }
    Ok(bytes)
}

pub fn compare(a: &Path, b: &Path) -> Result<Vec<SurfaceComparison>> {
    let (_, sa) = record::load(a)?;
    let (_, sb) = record::load(b)?;
    let mut out = Vec::new();
    for &name in SURFACES {
        let outcome = match (sa.get(name), sb.get(name)) {
            (Some(x), Some(y)) => {
                let (da, db) = (read_checked(a, x)?, read_checked(b, y)?);
                let unit = x.unit_bytes.max(1);
                match da.iter().zip(&db).position(|(p, q)| p != q) {
                    None if da.len() == db.len() => Outcome::Exact { bytes: da.len() as u64 },
                    pos => {
                        let byte = pos.unwrap_or(da.len().min(db.len())) as u64;
                        Outcome::Differs {
                            byte,
                            unit: byte / unit,
                            unit_byte: byte % unit,
                            bytes_a: da.len() as u64,
                            bytes_b: db.len() as u64,
                        }
                    }
                }
            }
            (x, y) => Outcome::Missing { in_a: x.is_some(), in_b: y.is_some() },
        };
        out.push(SurfaceComparison { surface: name.to_string(), outcome });
    }
    Ok(out)
}

/// The element a surface's unit is called in messages.
pub fn unit_name(surface: &str) -> &'static str {
    match surface {
        "logits" => "row",
        "routes" => "event",
        "tokens" => "token",
        _ => "byte",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// Every byte of tokens, full logits rows, response bytes and route events equal.
    AllSurfaces,
    /// The token surface (prompt and output token ids) equal: for refinement cells, which
    /// record no logits rows.
    Tokens,
}

/// Exactness of a record against the oracle's record under the relation: whether it holds, and
/// the surfaces that differ.
pub fn exactness(relation: Relation, oracle_dir: &Path, cell_dir: &Path) -> Result<(bool, Vec<String>)> {
    match relation {
        Relation::AllSurfaces => {
            let cmp = compare(oracle_dir, cell_dir)?;
            let differing: Vec<String> = cmp.iter().filter(|c| !c.is_exact()).map(|c| c.surface.clone()).collect();
            Ok((differing.is_empty(), differing))
        }
        Relation::Tokens => {
            let cmp = compare(oracle_dir, cell_dir)?;
            let exact = cmp.iter().any(|c| c.surface == "tokens" && c.is_exact());
            Ok((exact, if exact { vec![] } else { vec!["tokens".to_string()] }))
        }
    }
}

