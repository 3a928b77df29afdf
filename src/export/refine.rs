//! The τ sweep of a refinement campaign: one row per completed cell, and the
//! quality-versus-bytes figure (seed 001 Figure 3) with the pure-base and verifier endpoints.

use super::{figure, get, s, Sealed};
use crate::campaign::{CellSpec, CellStatus};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const COLUMNS: &[&str] = &[
    "cell", "arm", "mode", "tau", "verify_all", "window", "verifier", "prompts", "generated_tokens", "sweeps", "rollbacks",
    "deferred", "checked", "verification_bytes_per_token", "bytes_per_token_over_verifier", "served_bytes_per_token",
    "verifier_bytes", "tokens_per_s", "mean_logprob", "reference_agreement", "memory_cap_bytes", "memory_peak_bytes",
    "limit_events", "admitted", "exact_vs_oracle", "record",
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
        let r = &x.record;
        let f = |p: &str| get(r, p).and_then(|v| v.as_f64());
        let streamed = get(r, "/params/verifier/streamed").is_some();
        w.write_record([
            cell.key.clone(),
            cell.arm.id.value.clone(),
            s(get(r, "/params/mode")),
            ra.tau.map(|t| t.to_string()).unwrap_or_default(),
            ra.verify_all.to_string(),
            s(get(r, "/params/window")),
            if streamed { "streamed" } else { "resident" }.to_string(),
            s(get(r, "/counts/prompts")),
            s(get(r, "/counts/generated_tokens")),
            s(get(r, "/refine/counters/sweeps")),
            s(get(r, "/refine/counters/rollbacks")),
            s(get(r, "/refine/counters/deferred")),
            s(get(r, "/refine/counters/checked")),
            s(get(r, "/refine/verification_bytes_per_token")),
            s(get(r, "/refine/bytes_per_token_over_verifier")),
            s(get(r, "/refine/served_bytes_per_token")),
            s(get(r, "/refine/verifier_bytes")),
            s(get(r, "/timing/tokens_per_s")),
            s(get(r, "/quality/mean_logprob")),
            s(get(r, "/quality/reference_agreement")),
            cell.arm.memory_cap_bytes.map(|b| b.to_string()).unwrap_or_default(),
            s(get(r, "/resources/host/kernel_peak")),
            s(get(r, "/resources/host/limit_events")),
            x.doc.admission.passed.map(|p| p.to_string()).unwrap_or_default(),
            x.doc.oracle.exact.map(|e| e.to_string()).unwrap_or_default(),
            x.digest.clone(),
        ])?;
        if let (Some(b), Some(q)) = (f("/refine/verification_bytes_per_token"), f("/quality/mean_logprob")) {
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
