//! A certificate from a `generate` record (a plain record directory or a sealed
//! `results/<digest>/`, which is re-hashed first), optionally with an oracle record for E.
//!
//! Every figure comes from the record; where the record observed nothing, an operator value
//! (`--r-policy`, `--g-decl`, `--g-phys`) may fill the operand, and the authority vector still
//! says the tier was not observed. Records from different binaries are refused.

use super::{At, AdmissionEvidence, Boundaries, Bytes, Certificate, Evidence, ExactResult, Exactness, Grade, Inventory, Lifecycle, Tier};
use crate::oracle::{self, Outcome};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct RecordOptions {
    /// A record of the same build to compare against (E).
    pub oracle: Option<PathBuf>,
    /// R_policy: the operator's declared host reserve.
    pub r_policy: Option<u64>,
    /// G_decl, where the record has no audited GPU allowance.
    pub g_decl: Option<u64>,
    /// G_phys, where the record observed no board.
    pub g_phys: Option<u64>,
}

/// Reads a record; a sealed one is verified against its manifest first.
fn read(dir: &Path) -> Result<(Value, Option<String>)> {
    let sealed = if dir.join(crate::record::MANIFEST_FILE).exists() {
        Some(crate::record::verify_record(dir).with_context(|| format!("{}: sealed record does not verify", dir.display()))?.digest)
    } else {
        None
    };
    let (v, _) = crate::record::load(dir)?;
    if v.get("format").and_then(Value::as_str) != Some("sovereign.generate/1") {
        bail!("{}: not a generate record (format {})", dir.display(), v.get("format").unwrap_or(&Value::Null));
    }
    Ok((v, sealed))
}

fn binary(v: &Value) -> Option<&str> {
    v.pointer("/build/binary_sha256").and_then(Value::as_str)
}

fn bytes_at(v: &Value, p: &str) -> Evidence<Bytes> {
    v.pointer(p).and_then(Value::as_u64).map(Bytes).into()
}

fn grade_of(tier: &Value) -> Evidence<Grade> {
    let g = tier.pointer("/grade/grade").and_then(Value::as_str);
    serde_json::from_value::<Grade>(Value::from(g)).ok().into()
}

/// The transitions the Plan's counters show were exercised.
fn transitions(tel: &Value) -> Vec<String> {
    let n = |k: &str| tel.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut t = Vec::new();
    for (counter, name) in [
        ("loads", "read into window, movement, publication after movement"),
        ("hits", "reuse of a published version"),
        ("recycles", "recycle (Recyclable -> Vacant)"),
        ("consumer_takes", "consumer take and release"),
        ("prefetch_loads", "prefetch publication"),
        ("resets", "reset"),
        ("drained_completions", "drain of outstanding completions"),
    ] {
        if n(counter) > 0 {
            t.push(format!("{name} ({counter} {})", n(counter)));
        }
    }
    t
}

pub fn from_record(dir: &Path, opts: &RecordOptions) -> Result<Certificate> {
    let (v, sealed) = read(dir)?;
    let oracle = match &opts.oracle {
        Some(o) => {
            let (ov, osealed) = read(o)?;
            match (binary(&v), binary(&ov)) {
                (Some(a), Some(b)) if a == b => {}
                (a, b) => bail!(
                    "refusing to pool evidence from different binaries: {} was produced by {} and the oracle {} by {}; certify each binary separately",
                    dir.display(),
                    a.unwrap_or("an unknown binary"),
                    o.display(),
                    b.unwrap_or("an unknown binary")
                ),
            }
            Some((o.clone(), ov, osealed))
        }
        None => None,
    };

    let experts = v.get("experts").filter(|e| e.is_object());
    let tel = experts.and_then(|e| e.get("telemetry"));
    let sem_ok = tel
        .map(|t| t.pointer("/u_sem_lb/duplicates").and_then(Value::as_u64) == Some(0) && t.pointer("/u_sem_lb/overlaps").and_then(Value::as_u64) == Some(0))
        .unwrap_or(false);
    let inventory = Inventory {
        t_repr_bytes: bytes_at(&v, "/model/t_repr_bytes"),
        u_sem_lb_bytes: if sem_ok { tel.map_or(Evidence::Insufficient, |t| bytes_at(t, "/u_sem_lb/bytes")) } else { Evidence::Insufficient },
        u_sched_bytes: tel.map_or(Evidence::Insufficient, |t| bytes_at(t, "/u_sched/bytes")),
        q_run_logical_bytes: tel.map_or(Evidence::Insufficient, |t| bytes_at(t, "/q_run/logical_bytes")),
        q_run_physical_bytes: tel.map_or(Evidence::Insufficient, |t| bytes_at(t, "/q_run/physical_bytes")),
        managed_bytes: experts.map_or(Evidence::Insufficient, |e| bytes_at(e, "/manifest/managed_bytes")),
        inclusion_rules: Evidence::Value(format!(
            "T_repr: {}; U_sem^LB: extents of every expert object the router selected at least once (zero duplicates, zero overlaps); U_sched: objects the Plan loaded; S: the Plan manifest's expert objects",
            crate::inventory::T_REPR_RULE
        )),
        model_sha256: At::new(v.pointer("/model/sha256").and_then(Value::as_str).map(str::to_string).into()),
        binary_sha256: At::new(binary(&v).map(str::to_string).into()),
        executable: v
            .pointer("/build/sovereign_version")
            .and_then(Value::as_str)
            .map(|ver| {
                let engine = v.pointer("/build/engine/version").and_then(Value::as_str).unwrap_or("?");
                let key = v.pointer("/build/engine/build_key").and_then(Value::as_str).unwrap_or("?");
                format!("sovereign {ver}, engine llama-cpp-sys-2 {engine} ({key})")
            })
            .into(),
    };

    let res = v.get("resources");
    let auth = res.and_then(|r| r.get("authority"));
    let host_t = auth.and_then(|a| a.get("host"));
    let gpu_t = auth.and_then(|a| a.get("gpu"));
    let host = match host_t {
        Some(h) => Tier {
            bytes: bytes_at(h, "/boundary"),
            grade: grade_of(h),
            note: Some(format!(
                "process-tree cgroup charge; peak {} ({})",
                h.get("peak").and_then(Value::as_u64).map_or("?".into(), |p| p.to_string()),
                h.pointer("/peak_grade/grade").and_then(Value::as_str).unwrap_or("?")
            )),
        },
        None => Tier {
            bytes: Evidence::Insufficient,
            grade: Evidence::Insufficient,
            note: Some("run without --memory-max: no host boundary was set or observed".into()),
        },
    };
    let gpu_grade = gpu_t.map_or(Evidence::Insufficient, grade_of);
    let gpu_reason = gpu_t.and_then(|g| g.pointer("/grade/reason")).and_then(Value::as_str).map(str::to_string);
    let (g_decl, g_note) = match (gpu_grade.value(), gpu_t) {
        (Some(Grade::SampledAudit), Some(g)) => {
            let b = bytes_at(g, "/boundary");
            if let (Some(rec), Some(flag)) = (b.value(), opts.g_decl) {
                if rec.0 != flag {
                    bail!("--g-decl {flag} contradicts the audited allowance {} in the record", rec.0);
                }
            }
            (b, "declared allowance, audited by whole-board samples".to_string())
        }
        _ => (
            opts.g_decl.map(Bytes).into(),
            match (opts.g_decl, &gpu_reason) {
                (Some(_), Some(r)) => format!("G_decl declared by the operator (--g-decl); GPU not observed: {r}"),
                (Some(_), None) => "G_decl declared by the operator (--g-decl); no audited allowance in the record".into(),
                (None, Some(r)) => format!("GPU not observed: {r}"),
                (None, None) => "no GPU allowance declared or audited".into(),
            },
        ),
    };
    let observed_phys = gpu_t.and_then(|g| g.get("ceiling")).and_then(Value::as_u64);
    if let (Some(rec), Some(flag)) = (observed_phys, opts.g_phys) {
        if rec != flag {
            bail!("--g-phys {flag} contradicts the observed board size {rec} in the record");
        }
    }
    let boundaries = Boundaries {
        host,
        gpu: Tier { bytes: g_decl, grade: gpu_grade, note: Some(g_note) },
        gpu_physical_bytes: observed_phys.or(opts.g_phys).map(Bytes).into(),
        r_policy_bytes: opts.r_policy.map(Bytes).into(),
    };

    let generated = v.pointer("/counts/generated_tokens").and_then(Value::as_u64);
    let mut sources = vec![match &sealed {
        Some(d) => format!("sealed record {} ({d}, manifest verified)", dir.display()),
        None => format!("record {}", dir.display()),
    }];
    let exactness = match &oracle {
        None => Exactness {
            relation: Evidence::Insufficient,
            surfaces: Evidence::Insufficient,
            oracle: Evidence::Insufficient,
            same_build: At::new(Evidence::Insufficient),
            oracle_binary_sha256: None,
            horizon: At::new(Evidence::Insufficient),
            result: Evidence::Insufficient,
            detail: Some("no oracle comparison (--oracle RECORD)".into()),
        },
        Some((opath, ov, osealed)) => {
            sources.push(match osealed {
                Some(d) => format!("oracle: sealed record {} ({d}, manifest verified)", opath.display()),
                None => format!("oracle: record {}", opath.display()),
            });
            let mode = ov.pointer("/params/experts/mode").and_then(Value::as_str).or(ov.pointer("/params/experts").and_then(Value::as_str)).unwrap_or("?");
            let mut problems = Vec::new();
            if v.pointer("/model/sha256") != ov.pointer("/model/sha256") {
                problems.push("the oracle ran a different model".to_string());
            }
            if v.get("outcome").and_then(Value::as_str) != Some("completed") {
                problems.push("the run did not complete".to_string());
            }
            if ov.get("outcome").and_then(Value::as_str) != Some("completed") {
                problems.push("the oracle did not complete".to_string());
            }
            if problems.is_empty() {
                for c in oracle::compare(dir, opath)? {
                    match c.outcome {
                        Outcome::Exact { .. } => {}
                        Outcome::Differs { byte, unit, .. } => problems.push(format!(
                            "{} differs at byte {byte} ({} {unit})",
                            c.surface,
                            oracle::unit_name(&c.surface)
                        )),
                        Outcome::Missing { in_a, in_b } => {
                            problems.push(format!("{} missing (in run: {in_a}, in oracle: {in_b})", c.surface))
                        }
                    }
                }
            }
            Exactness {
                relation: Evidence::Value("all_surfaces".into()),
                surfaces: Evidence::Value(oracle::SURFACES.iter().map(|s| s.to_string()).collect()),
                oracle: Evidence::Value(format!("same-build {mode} run {}", opath.display())),
                same_build: At::new(Evidence::Value(true)),
                oracle_binary_sha256: binary(ov).map(|b| At::new(b.to_string())),
                horizon: At::new(generated.into()),
                result: Evidence::Value(if problems.is_empty() { ExactResult::Exact } else { ExactResult::Differs }),
                detail: if problems.is_empty() {
                    Some(format!("every byte of {} surfaces equal over {} outputs", oracle::SURFACES.len(), generated.unwrap_or(0)))
                } else {
                    Some(problems.join("; "))
                },
            }
        }
    };

    let lifecycle = match experts {
        Some(e) => {
            let cell = e.pointer("/fault/cell").and_then(Value::as_str).map(str::to_string);
            let closure = e.get("closure");
            let failed = closure.and_then(|c| c.get("failed")).and_then(Value::as_str);
            Lifecycle {
                invariants: e.pointer("/fault/invariant").and_then(Value::as_str).map(|s| vec![s.to_string()]).into(),
                transitions: tel
                    .map(|t| {
                        let mut f = transitions(t);
                        if closure.is_some() {
                            f.push("shutdown with closure ledger".into());
                        }
                        f
                    })
                    .into(),
                clean_closure: e.get("clean_closure").and_then(Value::as_bool).into(),
                fault_cell: cell.into(),
                detail: Some(match (closure, failed) {
                    (_, Some(f)) => format!("the Plan failed: {f}"),
                    (Some(c), None) => format!(
                        "closure: {} active tickets, {}/{} windows free, {} live consumers, {} source outstanding",
                        c.get("active_tickets").unwrap_or(&Value::Null),
                        c.get("windows_free").unwrap_or(&Value::Null),
                        c.get("windows_total").unwrap_or(&Value::Null),
                        c.get("consumers_live").unwrap_or(&Value::Null),
                        c.get("source_outstanding").unwrap_or(&Value::Null)
                    ),
                    (None, None) => "no closure recorded".into(),
                }),
            }
        }
        None => Lifecycle {
            invariants: Evidence::Insufficient,
            transitions: Evidence::Insufficient,
            clean_closure: Evidence::Insufficient,
            fault_cell: Evidence::Insufficient,
            detail: Some(match v.get("experts") {
                Some(Value::Null) | None => "no Plan report (the run failed before its source finished)".into(),
                _ => "resident run: no Plan lifecycle".into(),
            }),
        },
    };

    let adm = res.and_then(|r| r.get("admission"));
    let admission = AdmissionEvidence {
        admitted: adm.and_then(|a| a.get("admitted")).and_then(Value::as_bool).into(),
        failed: adm
            .and_then(|a| a.get("failed"))
            .and_then(Value::as_array)
            .map(|f| f.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
    };

    let source = v.pointer("/params/experts/source").and_then(Value::as_str);
    let system = format!(
        "sovereign generate: {} model {}, {}{}, outcome {}",
        v.pointer("/model/architecture").and_then(Value::as_str).unwrap_or("?"),
        v.pointer("/model/file").and_then(Value::as_str).unwrap_or("?"),
        if experts.is_some() { "experts served by the Plan" } else { "experts resident" },
        source.map_or(String::new(), |s| format!(" from source {}", s.to_uppercase())),
        v.get("outcome").and_then(Value::as_str).unwrap_or("?"),
    );
    Ok(Certificate { system, sources, inventory, boundaries, exactness, lifecycle, admission })
}
