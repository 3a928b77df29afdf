//! Certificates (seed 000 §2.1–2.2, Table 1): C = (I, B, A, E, L).
//!
//! A run that finishes is not evidence; a certificate is. One certificate states what bytes
//! exist and were demanded (I), the boundary of each memory tier (B) and the authority that
//! bounded it (A), which exactness relation held against which oracle over which horizon (E),
//! and which lifecycle invariants and transitions were exercised, with clean closure or not (L).
//!
//! The same type is built from a run record (`sovereign certificate show RECORD`, see
//! [`from_record`]) and written by hand about any system (`sovereign certificate check
//! FILE.yaml`). A hand-written field may say `insufficient public evidence`; it is then
//! reported as such, never as a failure. [`eval`] computes the predicates (1)–(3) in exact
//! bytes with signed margins and the claim classes R, W, E[E,h] and L[F], each of which
//! holds, fails (with the reason) or lacks evidence. There is no scalar grade.
//!
//! The JSON Schema in `schemas/certificate.schema.json` is generated from these types
//! (`sovereign certificate schema`).

pub mod eval;
pub mod from_record;

pub use eval::{evaluate, Evaluation, Verdict};
pub use from_record::{from_record, RecordOptions};

use crate::spec::{At, Diagnostic};
use anyhow::Result;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::path::Path;

/// The literal a hand-written certificate uses for a figure nobody has published.
pub const INSUFFICIENT: &str = "insufficient public evidence";

/// A figure, or the statement that there is not enough public evidence for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence<T> {
    Value(T),
    Insufficient,
}

impl<T> Evidence<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Evidence::Value(v) => Some(v),
            Evidence::Insufficient => None,
        }
    }
    pub fn is_insufficient(&self) -> bool {
        matches!(self, Evidence::Insufficient)
    }
}

impl<T> From<Option<T>> for Evidence<T> {
    fn from(o: Option<T>) -> Self {
        o.map_or(Evidence::Insufficient, Evidence::Value)
    }
}

impl<T: Serialize> Serialize for Evidence<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Evidence::Value(v) => v.serialize(s),
            Evidence::Insufficient => s.serialize_str(INSUFFICIENT),
        }
    }
}

/// Leaf values only: the value is read as plain data first, so the marker string is
/// recognised for any `T` and a wrong type is reported at the value's position.
impl<'de, T: DeserializeOwned> Deserialize<'de> for Evidence<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        if v.as_str() == Some(INSUFFICIENT) {
            return Ok(Evidence::Insufficient);
        }
        serde_json::from_value(v).map(Evidence::Value).map_err(|e| serde::de::Error::custom(format!("{e} (or `{INSUFFICIENT}`)")))
    }
}

impl<T: JsonSchema> JsonSchema for Evidence<T> {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        format!("Evidence_{}", T::schema_name()).into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let t = g.subschema_for::<T>();
        schemars::json_schema!({ "anyOf": [t, { "const": INSUFFICIENT }] })
    }
}

/// An exact byte count: an integer, or a string with a binary suffix (`11 GiB`, `512M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => {
                n.as_u64().map(Bytes).ok_or_else(|| serde::de::Error::custom(format!("{n} is not a byte count (a whole number >= 0)")))
            }
            serde_json::Value::String(s) => parse_bytes(&s).map(Bytes).map_err(serde::de::Error::custom),
            other => Err(serde::de::Error::custom(format!("expected a byte count, got {other}"))),
        }
    }
}

impl JsonSchema for Bytes {
    fn schema_name() -> Cow<'static, str> {
        "Bytes".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "description": "Exact bytes: an integer, or a string with a binary suffix (`11 GiB`, `512M`).",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^[0-9][0-9_,]* ?([KMGTkmgt](i?[Bb])?)?$" }
            ]
        })
    }
}

pub use crate::bounds::parse_bytes;

/// Authority grades: the one type the record's authority vector and the certificate share.
pub use crate::observe::Grade;

/// The whole certificate.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// What the certificate is about (a system, a paper's cell, a record).
    pub system: String,
    /// Where the figures come from (paper sections, record paths and digests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// I: what bytes exist and were demanded, and whose they are.
    pub inventory: Inventory,
    /// B and A: the boundary of each memory tier and its authority grade.
    pub boundaries: Boundaries,
    /// E: the exactness relation, its surfaces, oracle and horizon.
    pub exactness: Exactness,
    /// L: lifecycle invariants and transitions exercised, and closure.
    pub lifecycle: Lifecycle,
    /// The resource (admission) predicate under the authority vector.
    pub admission: AdmissionEvidence,
}

/// I (seed 000 §2.1: four quantities, never substituted for one another).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// T_repr: the complete canonical tensor payload under `inclusion_rules`.
    pub t_repr_bytes: Evidence<Bytes>,
    /// U_sem^LB: unique canonical bytes selected by the model graph at least once (lower bound).
    pub u_sem_lb_bytes: Evidence<Bytes>,
    /// U_sched: the deduplicated union requested by the source or cache policy.
    pub u_sched_bytes: Evidence<Bytes>,
    /// Q_run: cumulative logical traffic, rereads included.
    pub q_run_logical_bytes: Evidence<Bytes>,
    /// Q_run: cumulative physical (aligned) traffic.
    pub q_run_physical_bytes: Evidence<Bytes>,
    /// S: canonical bytes managed from storage (predicate 1).
    pub managed_bytes: Evidence<Bytes>,
    pub inclusion_rules: Evidence<String>,
    /// SHA-256 of the model file.
    pub model_sha256: At<Evidence<String>>,
    /// SHA-256 of the executable that produced the evidence (the execution identity).
    pub binary_sha256: At<Evidence<String>>,
    /// The executable as its authors name it (version, commit).
    pub executable: Evidence<String>,
}

/// B and A per tier. `gpu.bytes` is G_decl; `gpu_physical_bytes` is G_phys.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Boundaries {
    /// H_cap and its grade.
    pub host: Tier,
    /// G_decl and its grade.
    pub gpu: Tier,
    /// G_phys: the physical board capacity (a physical ceiling by definition).
    pub gpu_physical_bytes: Evidence<Bytes>,
    /// R_policy: the operator-declared reserve for non-target host state (predicate 1).
    pub r_policy_bytes: Evidence<Bytes>,
    /// The device the run's layers were placed on (absent: every layer on the CPU): its budget
    /// and how it was audited (hard_limit: the RPC device server's own cgroup; sampled_audit:
    /// NVML; not_observed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Tier>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub bytes: Evidence<Bytes>,
    pub grade: Evidence<Grade>,
    /// How the boundary was set or observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The result of comparing the surfaces against the oracle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExactResult {
    Exact,
    Differs,
}

/// E (seed 000 §2.2: exactness is scoped by identity and horizon).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Exactness {
    /// The relation's name, e.g. `E_64-out` or `all_surfaces`.
    pub relation: Evidence<String>,
    /// The surfaces the relation compares.
    pub surfaces: Evidence<Vec<String>>,
    /// The oracle's identity.
    pub oracle: Evidence<String>,
    /// Whether the oracle ran the same executable (`binary_sha256`). Evidence from different
    /// binaries is never pooled: `false` is refused.
    pub same_build: At<Evidence<bool>>,
    /// The oracle's executable digest, where known; must equal `inventory.binary_sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_binary_sha256: Option<At<String>>,
    /// Outputs compared (the horizon h).
    pub horizon: At<Evidence<u64>>,
    pub result: Evidence<ExactResult>,
    /// The first difference, or other detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// L (seed 000 Table 1).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// The reuse invariants the evidence bears on.
    pub invariants: Evidence<Vec<String>>,
    /// The transitions actually exercised (the set F of L[F]).
    pub transitions: Evidence<Vec<String>>,
    pub clean_closure: Evidence<bool>,
    /// `none`, or the fault cell that was injected.
    pub fault_cell: Evidence<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The resource predicate's outcome (positive margins, zero limit/OOM/swap/foreign events).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmissionEvidence {
    pub admitted: Evidence<bool>,
    /// `conjunct: value` of each failed conjunct, e.g. `limit events: 33481`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
}

/// The JSON Schema of certificates, as checked in at `schemas/certificate.schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(Certificate);
    let mut s = serde_json::to_string_pretty(&schema).expect("a schema serializes");
    s.push('\n');
    s
}

fn diag<T>(at: &At<T>, message: impl Into<String>) -> Diagnostic {
    Diagnostic { line: at.line, column: at.column, message: message.into() }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks the type cannot express. Pooling evidence from different binaries is refused here.
pub fn validate(c: &Certificate) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (name, f) in [("inventory.model_sha256", &c.inventory.model_sha256), ("inventory.binary_sha256", &c.inventory.binary_sha256)] {
        if let Some(v) = f.value() {
            if !is_sha256(v) {
                out.push(diag(f, format!("{name}: expected a SHA-256 digest (64 lowercase hexadecimal digits), got {v:?}")));
            }
        }
    }
    if let Some(o) = &c.exactness.oracle_binary_sha256 {
        if !is_sha256(o) {
            out.push(diag(o, format!("exactness.oracle_binary_sha256: expected a SHA-256 digest, got {:?}", o.value)));
        } else if let Some(b) = c.inventory.binary_sha256.value() {
            if b != &o.value {
                out.push(diag(
                    o,
                    format!("refusing to pool evidence from different binaries: the oracle ran {} but the evidence is from {b}", o.value),
                ));
            }
        }
        if c.exactness.same_build.value() == Some(&true) && c.inventory.binary_sha256.is_insufficient() {
            out.push(diag(
                &c.exactness.same_build,
                "exactness.same_build: true needs inventory.binary_sha256 to compare the oracle's digest with",
            ));
        }
    }
    if c.exactness.same_build.value() == Some(&false) {
        out.push(diag(
            &c.exactness.same_build,
            "refusing to pool evidence from different binaries (exactness.same_build: false): certify each binary separately",
        ));
    }
    if c.exactness.horizon.value() == Some(&0) {
        out.push(diag(&c.exactness.horizon, "exactness.horizon must be at least 1 output"));
    }
    if let (Some(u), Some(t)) = (c.inventory.u_sem_lb_bytes.value(), c.inventory.t_repr_bytes.value()) {
        if u > t {
            out.push(Diagnostic {
                line: 0,
                column: 0,
                message: format!(
                    "inventory.u_sem_lb_bytes ({}) exceeds t_repr_bytes ({}): a semantic-demand lower bound is part of the representation",
                    u.0, t.0
                ),
            });
        }
    }
    out
}

/// Parses a hand-written certificate; errors come back with their line and column.
pub fn parse(text: &str) -> std::result::Result<Certificate, Vec<Diagnostic>> {
    let c: Certificate = crate::spec::from_yaml(text)?;
    let problems = validate(&c);
    if problems.is_empty() {
        Ok(c)
    } else {
        Err(problems)
    }
}

/// Reads and checks a certificate file; problems are `FILE:line:column: message`, one per line.
pub fn load(file: &Path) -> Result<Certificate> {
    let text = crate::bounds::read_text("the certificate", file, crate::bounds::MAX_CAMPAIGN_FILE_BYTES)?;
    parse(&text).map_err(|d| anyhow::anyhow!(d.iter().map(|d| d.render(&file.display().to_string())).collect::<Vec<_>>().join("\n")))
}

#[cfg(test)]
mod tests;
