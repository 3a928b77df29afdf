//! The τ sweep of a refinement campaign: one row per completed cell, and the
//! quality-versus-bytes figure (seed 001 Figure 3) with the pure-base and verifier endpoints.

use super::{figure, s, Sealed};
use crate::campaign::{CellSpec, CellStatus};
use crate::record::format::VerifierParams;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const COLUMNS: &[&str] = &[
    "cell",
    "arm",
    "mode",
    "tau",
    "verify_all",
    "window",
    "verifier",
    "prompts",
    "generated_tokens",
    "sweeps",
    "rollbacks",
    "deferred",
    "checked",
    "verification_bytes_per_token",
    "bytes_per_token_over_verifier",
    "served_bytes_per_token",
    "verifier_bytes",
    "tokens_per_s",
    "mean_logprob",
    "reference_agreement",
    "memory_cap_bytes",
    "memory_peak_bytes",
    "limit_events",
    "admitted",
    "exact_vs_oracle",
    "record",
];

use super::figure::{Point, PointKind};

pub fn write(out: &Path, title: &str, cells: &[CellSpec], sealed: &BTreeMap<String, Sealed>) -> Result<Vec<PathBuf>> {
    let path = out.join("refine.csv");
    let mut w = csv::Writer::from_path(&path)?;
    w.write_record(COLUMNS)?;
    let mut points = Vec::new();
    for cell in cells {
        let (Some(ra), Some(x)) = (&cell.arm.refine, sealed.get(&cell.key)) else { continue };
        if x.doc.outcome.status != CellStatus::Completed {
            continue;
        }
        let r = x.refine();
        let params = r.and_then(|r| r.params.as_ref());
        let counters = r.and_then(|r| r.refine.as_ref()).map(|c| &c.counters);
        let report = r.and_then(|r| r.refine.as_ref());
        let quality = r.and_then(|r| r.quality());
        let host = r.and_then(|r| r.resources.as_ref()).map(|res| &res.host);
        let streamed = params.is_some_and(|p| matches!(p.verifier, VerifierParams::Streamed { .. }));
        w.write_record([
            cell.key.clone(),
            cell.arm.id.value.clone(),
            s(params.map(|p| p.mode)),
            ra.tau.map(|t| t.to_string()).unwrap_or_default(),
            ra.verify_all.to_string(),
            s(params.map(|p| p.window)),
            if streamed { "streamed" } else { "resident" }.to_string(),
            s(r.and_then(|r| r.counts.as_ref()).map(|c| c.prompts)),
            s(r.and_then(|r| r.counts.as_ref()).map(|c| c.generated_tokens)),
            s(counters.map(|c| c.sweeps)),
            s(counters.map(|c| c.rollbacks)),
            s(counters.map(|c| c.deferred)),
            s(counters.map(|c| c.checked)),
            s(report.map(|c| c.verification_bytes_per_token)),
            s(report.map(|c| c.bytes_per_token_over_verifier)),
            s(report.and_then(|c| c.served_bytes_per_token)),
            s(report.map(|c| c.verifier_bytes)),
            s(r.and_then(|r| r.timing.as_ref()).map(|t| t.tokens_per_s)),
            s(quality.map(|q| q.mean_logprob)),
            s(quality.map(|q| q.reference_agreement)),
            cell.arm.memory_cap_bytes.map(|b| b.to_string()).unwrap_or_default(),
            s(host.and_then(|h| h.kernel_peak)),
            s(host.map(|h| h.limit_events)),
            x.doc.admission.passed.map(|p| p.to_string()).unwrap_or_default(),
            x.doc.oracle.exact.map(|e| e.to_string()).unwrap_or_default(),
            x.digest.clone(),
        ])?;
        if let (Some(b), Some(q)) = (report.map(|c| c.verification_bytes_per_token), quality.map(|q| q.mean_logprob)) {
            let kind = match ra.mode {
                crate::refine::Mode::Base => PointKind::Base,
                crate::refine::Mode::Verifier => PointKind::Verifier,
                crate::refine::Mode::Refine if streamed => PointKind::Streamed,
                crate::refine::Mode::Refine => PointKind::Refine,
            };
            points.push(Point { label: cell.arm.id.value.clone(), bytes_per_token: b, quality: q, kind });
        }
    }
    w.flush()?;
    let mut files = vec![path];
    if !points.is_empty() {
        files.extend(figure::quality_bytes(out, title, &points)?);
    }
    Ok(files)
}
