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
/// Surfaces only some runs have: the recurrent state of hybrid and recurrent families (a
/// digest per state after prefill and every decode step, and the last state's bytes), and the
/// routes of a run's MTP head where it drafted with it. Compared whenever either record has
/// them; a record that lacks one the other has is not exact.
pub const MODEL_SURFACES: &[&str] = &["recurrent", "recurrent_state", "mtp_routes"];

/// The surfaces a record's exactness covers: every output surface and the model surfaces it has.
/// A session's record names its requests' surfaces under `requests/NNNN/`: each of those the
/// exactness covers, so two sessions are exact where every request is.
pub fn surfaces_of(record: &std::collections::BTreeMap<String, Surface>) -> Vec<String> {
    let covered = |name: &str| SURFACES.contains(&name) || MODEL_SURFACES.contains(&name);
    let requests: Vec<String> = record.keys().filter(|k| k.split_once('/').is_some_and(|_| covered(base_name(k)))).cloned().collect();
    if !requests.is_empty() {
        return requests;
    }
    SURFACES.iter().chain(MODEL_SURFACES.iter().filter(|s| record.contains_key(**s))).map(|s| s.to_string()).collect()
}

/// A surface's own name: the last part of a session's `requests/NNNN/NAME`.
fn base_name(surface: &str) -> &str {
    surface.rsplit('/').next().unwrap_or(surface)
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Exact {
        bytes: u64,
    },
    /// First differing byte, and the element (row, event, token) it falls in.
    Differs {
        byte: u64,
        unit: u64,
        unit_byte: u64,
        bytes_a: u64,
        bytes_b: u64,
    },
    Missing {
        in_a: bool,
        in_b: bool,
    },
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
    let mut names = surfaces_of(&sa);
    names.extend(surfaces_of(&sb).into_iter().filter(|n| !names.contains(n)).collect::<Vec<_>>());
    for name in names {
        let outcome = match (sa.get(&name), sb.get(&name)) {
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
        out.push(SurfaceComparison { surface: name, outcome });
    }
    Ok(out)
}

/// The element a surface's unit is called in messages.
pub fn unit_name(surface: &str) -> &'static str {
    match base_name(surface) {
        "logits" => "row",
        "routes" => "event",
        "tokens" => "token",
        "recurrent" => "state",
        _ => "byte",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// Every byte of tokens, full logits rows, response bytes and route events equal, and the
    /// recurrent state after prefill and every decode step where the model keeps one.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Staging;

    /// A record with the four output surfaces, and the recurrent state if given.
    fn record(dir: &Path, name: &str, recurrent: Option<&[u8]>) -> std::path::PathBuf {
        let mut s = Staging::new(&dir.join(name)).unwrap();
        for n in SURFACES {
            s.surface(n, &format!("{n}.bin"), n.as_bytes(), 1, false).unwrap();
        }
        if let Some(r) = recurrent {
            s.surface("recurrent", "recurrent.bin", r, 32, false).unwrap();
        }
        let surfaces = s.surfaces().clone();
        s.commit(&serde_json::json!({ "surfaces": surfaces })).unwrap()
    }

    fn outcome<'a>(cmp: &'a [SurfaceComparison], name: &str) -> Option<&'a Outcome> {
        cmp.iter().find(|c| c.surface == name).map(|c| &c.outcome)
    }

    #[test]
    fn the_recurrent_state_is_compared_when_either_record_has_it() {
        let t = tempfile::tempdir().unwrap();
        let states = [7u8; 64];
        let mut other = states;
        other[40] ^= 1;
        let (a, b) = (record(t.path(), "a", Some(&states)), record(t.path(), "b", Some(&states)));
        let (c, plain) = (record(t.path(), "c", Some(&other)), record(t.path(), "plain", None));
        let same = compare(&a, &b).unwrap();
        assert!(same.iter().all(|c| c.is_exact()) && same.len() == 5);
        let differs = compare(&a, &c).unwrap();
        assert_eq!(outcome(&differs, "recurrent"), Some(&Outcome::Differs { byte: 40, unit: 1, unit_byte: 8, bytes_a: 64, bytes_b: 64 }));
        let missing = compare(&a, &plain).unwrap();
        assert_eq!(outcome(&missing, "recurrent"), Some(&Outcome::Missing { in_a: true, in_b: false }));
        // A model without recurrent state is compared on the output surfaces alone.
        let models = compare(&plain, &plain).unwrap();
        assert!(models.iter().all(|c| c.is_exact()) && outcome(&models, "recurrent").is_none());
    }
}
