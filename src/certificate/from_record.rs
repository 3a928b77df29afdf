//! A certificate from a `generate` record (a plain record directory or a sealed
//! `results/<digest>/`, which is re-hashed first), optionally with an oracle record for E.
//!
//! Every figure comes from the record; where the record observed nothing, an operator value
//! (`--r-policy`, `--g-decl`, `--g-phys`) may fill the operand, and the authority vector still
//! says the tier was not observed. Records from different binaries are refused.

use super::{AdmissionEvidence, At, Boundaries, Bytes, Certificate, Evidence, ExactResult, Exactness, Grade, Inventory, Lifecycle, Tier};
use crate::oracle::{self, Outcome as Outcome_};
use crate::plan::Telemetry;
use crate::record::format::{ExpertsParams, Outcome};
use crate::record::GenerateRecord;
use anyhow::{bail, Context, Result};
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

/// Reads a generate record; a sealed one is verified against its manifest first.
fn read(dir: &Path) -> Result<(GenerateRecord, Option<String>)> {
    let sealed = if dir.join(crate::record::MANIFEST_FILE).exists() {
        Some(crate::record::verify_sealed(dir).with_context(|| format!("{}: sealed record does not verify", dir.display()))?.digest)
    } else {
        None
    };
    Ok((crate::record::load_generate(dir)?, sealed))
}

fn bytes(b: Option<u64>) -> Evidence<Bytes> {
    b.map(Bytes).into()
}

/// The transitions the Plan's counters show were exercised.
fn transitions(tel: &Telemetry) -> Vec<String> {
    let mut t = Vec::new();
    // Loads went through windows, straight into slots, or both (records from before the
    // movement counters read through windows only).
    let (windowed, direct) = tel.movement.map_or((tel.loads, 0), |m| (if m.window_bytes > 0 { tel.loads } else { 0 }, m.direct_extents));
    for (counter, name, n) in [
        ("loads", "read into window, movement, publication after movement", windowed),
        ("direct_extents", "read straight into a Loading slot, publication after validation", direct),
        ("hits", "reuse of a published version", tel.hits),
        ("recycles", "recycle (Recyclable -> Vacant)", tel.recycles),
        ("consumer_takes", "consumer take and release", tel.consumer_takes),
        ("prefetch_loads", "prefetch publication", tel.prefetch_loads),
        ("resets", "reset", tel.resets),
        ("drained_completions", "drain of outstanding completions", tel.drained_completions),
    ] {
        if n > 0 {
            t.push(format!("{name} ({counter} {n})"));
        }
    }
    t
}

/// An oracle record, read and checked to come from the same binary.
struct OracleRecord {
    path: PathBuf,
    record: GenerateRecord,
    sealed: Option<String>,
}

pub fn from_record(dir: &Path, opts: &RecordOptions) -> Result<Certificate> {
    let (r, sealed) = read(dir)?;
    let oracle = match &opts.oracle {
        Some(o) => {
            let (or, osealed) = read(o)?;
            let (a, b) = (&r.build.binary_sha256, &or.build.binary_sha256);
            if a != b {
                bail!(
                    "refusing to pool evidence from different binaries: {} was produced by {a} and the oracle {} by {b}; certify each binary separately",
                    dir.display(),
                    o.display(),
                );
            }
            Some(OracleRecord { path: o.clone(), record: or, sealed: osealed })
        }
        None => None,
    };
    let mut sources = vec![match &sealed {
        Some(d) => format!("sealed record {} ({d}, manifest verified)", dir.display()),
        None => format!("record {}", dir.display()),
    }];
    if let Some(o) = &oracle {
        sources.push(match &o.sealed {
            Some(d) => format!("oracle: sealed record {} ({d}, manifest verified)", o.path.display()),
            None => format!("oracle: record {}", o.path.display()),
        });
    }
    Ok(Certificate {
        system: system(&r),
        sources,
        inventory: inventory(&r),
        boundaries: boundaries(&r, opts)?,
        exactness: exactness(dir, &r, oracle.as_ref())?,
        lifecycle: lifecycle(&r),
        admission: admission(&r),
    })
}

fn system(r: &GenerateRecord) -> String {
    let source = r.params.as_ref().and_then(|p| match &p.experts {
        ExpertsParams::Plan(d) => Some(d.source.name().to_string()),
        ExpertsParams::Other(o) => Some(o.source.clone()),
        ExpertsParams::Resident => None,
    });
    format!(
        "sovereign generate: {} model {}, {}{}, outcome {}",
        r.model.as_ref().map_or("?", |m| m.architecture.as_str()),
        r.model.as_ref().map_or("?", |m| m.file.as_str()),
        if r.experts().is_some() { "experts served by the Plan" } else { "experts resident" },
        source.map_or(String::new(), |s| format!(" from source {}", s.to_uppercase())),
        r.outcome.name(),
    )
}

/// I: what bytes exist and were demanded, and whose they are.
fn inventory(r: &GenerateRecord) -> Inventory {
    let plan = r.plan();
    let tel = plan.map(|p| &p.telemetry);
    let sem_ok = tel.is_some_and(|t| t.u_sem_lb.duplicates == 0 && t.u_sem_lb.overlaps == 0);
    let b = &r.build;
    Inventory {
        t_repr_bytes: bytes(r.model.as_ref().map(|m| m.t_repr_bytes)),
        u_sem_lb_bytes: if sem_ok { bytes(tel.map(|t| t.u_sem_lb.bytes)) } else { Evidence::Insufficient },
        u_sched_bytes: bytes(tel.map(|t| t.u_sched.bytes)),
        q_run_logical_bytes: bytes(tel.map(|t| t.q_run.logical_bytes)),
        q_run_physical_bytes: bytes(tel.map(|t| t.q_run.physical_bytes)),
        managed_bytes: bytes(plan.map(|p| p.manifest.managed_bytes)),
        inclusion_rules: Evidence::Value(format!(
            "T_repr: {}; U_sem^LB: extents of every expert object the router selected at least once (zero duplicates, zero overlaps); U_sched: objects the Plan loaded; S: the Plan manifest's expert objects",
            crate::inventory::T_REPR_RULE
        )),
        model_sha256: At::new(r.model.as_ref().map(|m| m.sha256.clone()).into()),
        binary_sha256: At::new(Evidence::Value(r.build.binary_sha256.clone())),
        executable: Evidence::Value(format!(
            "sovereign {}, engine llama-cpp-sys-2 {} ({})",
            b.sovereign_version, b.engine.version, b.engine.build_key
        )),
    }
}

/// B and A: the boundary of each memory tier and its authority grade.
fn boundaries(r: &GenerateRecord, opts: &RecordOptions) -> Result<Boundaries> {
    let auth = r.resources.as_ref().map(|res| &res.authority);
    let host = match auth.map(|a| &a.host) {
        Some(h) => Tier {
            bytes: bytes(h.boundary),
            grade: Evidence::Value(h.grade.grade),
            note: Some(format!(
                "process-tree cgroup charge; peak {} ({})",
                h.peak.map_or("?".into(), |p| p.to_string()),
                h.peak_grade.grade.name()
            )),
        },
        None => Tier {
            bytes: Evidence::Insufficient,
            grade: Evidence::Insufficient,
            note: Some("run without --memory-max: no host boundary was set or observed".into()),
        },
    };
    let gpu_t = auth.map(|a| &a.gpu);
    let gpu_grade = gpu_t.map_or(Evidence::Insufficient, |g| Evidence::Value(g.grade.grade));
    let gpu_reason = gpu_t.and_then(|g| g.grade.reason.clone());
    let (g_decl, g_note) = match (gpu_grade.value(), gpu_t) {
        (Some(Grade::SampledAudit), Some(g)) => {
            let b = bytes(g.boundary);
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
    let observed_phys = gpu_t.and_then(|g| g.ceiling);
    if let (Some(rec), Some(flag)) = (observed_phys, opts.g_phys) {
        if rec != flag {
            bail!("--g-phys {flag} contradicts the observed board size {rec} in the record");
        }
    }
    Ok(Boundaries {
        host,
        gpu: Tier { bytes: g_decl, grade: gpu_grade, note: Some(g_note) },
        gpu_physical_bytes: observed_phys.or(opts.g_phys).map(Bytes).into(),
        r_policy_bytes: opts.r_policy.map(Bytes).into(),
        device: device_tier(r),
    })
}

/// The device tier of a run with layers on a device: its budget, the buffers checked against
/// it before decoding, and the authority that audited it during the run.
fn device_tier(r: &GenerateRecord) -> Option<Tier> {
    let p = r.params.as_ref()?.placement.as_ref()?;
    if p.gpu_devices.is_empty() || matches!(p.gpu_layers, crate::exec::GpuLayers::Count(0)) {
        return None;
    }
    let before = p.device_before_decode.as_ref();
    let buffers =
        before.map_or("no buffer check in the record".to_string(), |d| format!("buffers {} bytes before decoding", d.device_bytes));
    let budget: Evidence<Bytes> = p.gpu_budget.map(Bytes).into();
    let (grade, how) = match (&p.device_audit, before) {
        (Some(a), _) => (
            Grade::HardLimit,
            format!(
                "device server cgroup {}: limit {}, kernel peak {}, limit events {}, OOM kills {}",
                a.cgroup,
                a.limit.map_or("none".into(), |l| l.to_string()),
                a.peak.map_or("not kept".into(), |p| p.to_string()),
                a.limit_events,
                a.oom_kills
            ),
        ),
        (None, Some(d)) if d.observed => {
            (Grade::SampledAudit, format!("NVML: the process's own device memory {} bytes before decoding", d.own_bytes.unwrap_or(0)))
        }
        (None, Some(d)) => (Grade::NotObserved, format!("not observed: {}", d.reason.as_deref().unwrap_or("no device audit"))),
        (None, None) => (Grade::NotObserved, "not observed".to_string()),
    };
    Some(Tier { bytes: budget, grade: Evidence::Value(grade), note: Some(format!("{}; {buffers}; {how}", p.effective)) })
}

/// E: every surface of the run against a same-build oracle record.
fn exactness(dir: &Path, r: &GenerateRecord, oracle: Option<&OracleRecord>) -> Result<Exactness> {
    let generated = r.counts.as_ref().map(|c| c.generated_tokens as u64);
    let Some(o) = oracle else {
        return Ok(Exactness {
            relation: Evidence::Insufficient,
            surfaces: Evidence::Insufficient,
            oracle: Evidence::Insufficient,
            same_build: At::new(Evidence::Insufficient),
            oracle_binary_sha256: None,
            horizon: At::new(Evidence::Insufficient),
            result: Evidence::Insufficient,
            detail: Some("no oracle comparison (--oracle RECORD)".into()),
        });
    };
    let mode = match o.record.params.as_ref().map(|p| &p.experts) {
        Some(ExpertsParams::Resident) => "resident",
        Some(ExpertsParams::Plan(_)) => "plan",
        Some(ExpertsParams::Other(o)) => o.source.as_str(),
        None => "?",
    };
    let mut problems = Vec::new();
    if r.model.as_ref().map(|m| &m.sha256) != o.record.model.as_ref().map(|m| &m.sha256) {
        problems.push("the oracle ran a different model".to_string());
    }
    if r.outcome != Outcome::Completed {
        problems.push("the run did not complete".to_string());
    }
    if o.record.outcome != Outcome::Completed {
        problems.push("the oracle did not complete".to_string());
    }
    if problems.is_empty() {
        for c in oracle::compare(dir, &o.path)? {
            match c.outcome {
                Outcome_::Exact { .. } => {}
                Outcome_::Differs { byte, unit, .. } => {
                    problems.push(format!("{} differs at byte {byte} ({} {unit})", c.surface, oracle::unit_name(&c.surface)))
                }
                Outcome_::Missing { in_a, in_b } => problems.push(format!("{} missing (in run: {in_a}, in oracle: {in_b})", c.surface)),
            }
        }
    }
    // The recurrent state is a term of E for the models that keep one.
    let covered = oracle::surfaces_of(&r.surfaces);
    Ok(Exactness {
        relation: Evidence::Value("all_surfaces".into()),
        surfaces: Evidence::Value(covered.iter().map(|s| s.to_string()).collect()),
        oracle: Evidence::Value(format!("same-build {mode} run {}", o.path.display())),
        same_build: At::new(Evidence::Value(true)),
        oracle_binary_sha256: Some(At::new(o.record.build.binary_sha256.clone())),
        horizon: At::new(generated.into()),
        result: Evidence::Value(if problems.is_empty() { ExactResult::Exact } else { ExactResult::Differs }),
        detail: if problems.is_empty() {
            Some(format!("every byte of {} surfaces equal over {} outputs", covered.len(), generated.unwrap_or(0)))
        } else {
            Some(problems.join("; "))
        },
    })
}

/// L: the Plan's lifecycle as its report shows it.
fn lifecycle(r: &GenerateRecord) -> Lifecycle {
    let Some(e) = r.experts() else {
        return Lifecycle {
            invariants: Evidence::Insufficient,
            transitions: Evidence::Insufficient,
            clean_closure: Evidence::Insufficient,
            fault_cell: Evidence::Insufficient,
            detail: Some(match r.experts() {
                None => "no Plan report (the run failed before its source finished)".into(),
                Some(_) => "resident run: no Plan lifecycle".into(),
            }),
        };
    };
    let plan = e.plan();
    let closure = plan.map(|p| &p.closure);
    Lifecycle {
        invariants: plan.map(|p| vec![p.fault.invariant.clone()]).into(),
        transitions: plan
            .map(|p| {
                let mut f = transitions(&p.telemetry);
                f.push("shutdown with closure ledger".into());
                f
            })
            .into(),
        clean_closure: plan.map(|p| p.clean_closure).into(),
        fault_cell: plan.map(|p| p.fault.cell.name()).into(),
        detail: Some(match (closure, closure.and_then(|c| c.failed.as_deref())) {
            (_, Some(f)) => format!("the Plan failed: {f}"),
            (Some(c), None) => format!(
                "closure: {} active tickets, {}/{} windows free, {} live consumers, {} source outstanding",
                c.active_tickets, c.windows_free, c.windows_total, c.consumers_live, c.source_outstanding
            ),
            (None, None) => "no closure recorded".into(),
        }),
    }
}

fn admission(r: &GenerateRecord) -> AdmissionEvidence {
    let adm = r.resources.as_ref().map(|res| &res.admission);
    AdmissionEvidence { admitted: adm.map(|a| a.admitted).into(), failed: adm.map(|a| a.failed()).unwrap_or_default() }
}
