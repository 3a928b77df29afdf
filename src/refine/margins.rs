//! Margins (seed 001 §3, expG): the reference's greedy trajectories are teacher-forced through a
//! candidate; at each position the candidate's top-1 margin is paired with whether its argmax
//! agrees with the reference. A good gate has disagreements at small margins: AUROC of the
//! margin as a predictor of disagreement, and the share of tokens that must be escalated (the
//! smallest margins first) to reach a target agreement.

use super::margin;
use crate::engine::{Context, Model};
use crate::exec::ExecRequest;
use crate::generate::argmax;
use anyhow::{bail, Result};
use serde::Serialize;
use std::path::PathBuf;

pub struct MarginsSpec {
    pub reference: PathBuf,
    pub candidate: PathBuf,
    pub prompts: Vec<Vec<u8>>,
    pub n_predict: u32,
    /// Without a context, the longest prompt's tokens plus `n_predict`.
    pub exec: ExecRequest,
    /// Agreement the escalation share is computed for (0.99).
    pub target: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Position {
    pub prompt: usize,
    pub position: usize,
    pub reference_token: i32,
    pub candidate_token: i32,
    pub margin: f32,
    pub agree: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Escalation {
    pub target_agreement: f64,
    /// Share of positions escalated: every margin below `tau`.
    pub share: f64,
    /// The threshold that reaches the target (None: every position must be escalated).
    pub tau: Option<f32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub reference_sha256: String,
    pub candidate_sha256: String,
    /// The digest manifests both whole-file digests come from, and the load checks.
    pub reference_digests: Option<crate::digests::Provenance>,
    pub candidate_digests: Option<crate::digests::Provenance>,
    pub prompts: usize,
    pub positions: usize,
    pub agreement: f64,
    /// AUROC of (small) margin predicting disagreement; None without both classes.
    pub auroc: Option<f64>,
    pub escalation: Escalation,
    pub median_margin_agree: Option<f32>,
    pub median_margin_disagree: Option<f32>,
}

/// AUROC of low margin as a detector of disagreement (Mann–Whitney U with tied ranks averaged):
/// the probability that a disagreeing position has a smaller margin than an agreeing one.
pub fn auroc(points: &[(f32, bool)]) -> Option<f64> {
    let n_pos = points.iter().filter(|p| !p.1).count();
    let n_neg = points.len() - n_pos;
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    let mut v: Vec<(f32, bool)> = points.to_vec();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the (average, 1-based) ranks of the agreeing positions.
    let (mut rank_sum, mut i) = (0.0f64, 0usize);
    while i < v.len() {
        let mut j = i;
        while j < v.len() && v[j].0 == v[i].0 {
            j += 1;
        }
        let avg = (i + 1 + j) as f64 / 2.0;
        rank_sum += avg * v[i..j].iter().filter(|p| p.1).count() as f64;
        i = j;
    }
    let u = rank_sum - (n_neg * (n_neg + 1)) as f64 / 2.0;
    Some(u / (n_pos as f64 * n_neg as f64))
}

/// The smallest threshold τ such that escalating every position with margin < τ (the escalated
/// positions then agree) leaves agreement at least `target`.
pub fn escalation(points: &[(f32, bool)], target: f64) -> Escalation {
    let n = points.len();
    let mut v: Vec<(f32, bool)> = points.to_vec();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let allowed = ((n as f64) * (1.0 - target) + 1e-9).floor() as usize;
    let mut remaining = v.iter().filter(|p| !p.1).count();
    let mut k = 0;
    loop {
        if remaining <= allowed {
            let tau = if k < n { Some(v[k].0) } else { None };
            return Escalation { target_agreement: target, share: k as f64 / n.max(1) as f64, tau };
        }
        // Escalate the next tie group whole: a threshold cannot split equal margins.
        let m = v[k].0;
        while k < n && v[k].0 == m {
            remaining -= usize::from(!v[k].1);
            k += 1;
        }
    }
}

fn median(mut v: Vec<f32>) -> Option<f32> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f32::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

pub fn run(spec: &MarginsSpec) -> Result<(Report, Vec<Position>)> {
    if spec.prompts.is_empty() {
        bail!("no prompts (one per non-empty line)");
    }
    if spec.n_predict == 0 {
        bail!("--n-predict must be at least 1");
    }
    if !(spec.target > 0.0 && spec.target <= 1.0) {
        bail!("--target must lie in (0, 1]");
    }
    let identity = |p: &std::path::Path| -> Result<(crate::record::format::ModelIdentity, Option<crate::bounds::TrainedContext>)> {
        let inv = crate::inventory::Inventory::of(p)?;
        Ok((crate::record::format::ModelIdentity::of(p, &inv, Some(crate::digests::Loads::All))?, inv.trained_context()))
    };
    let (reference, reference_trained) = identity(&spec.reference)?;
    let (candidate, candidate_trained) = identity(&spec.candidate)?;
    let trained = [reference_trained, candidate_trained].into_iter().flatten().min_by_key(|t| t.tokens);
    let (reference_sha256, reference_digests) = (reference.sha256, reference.digests);
    let (candidate_sha256, candidate_digests) = (candidate.sha256, candidate.digests);

    // The reference's greedy trajectories.
    let mut trajectories = Vec::new();
    let reference_vocab;
    let exec;
    {
        let model = Model::load(&spec.reference)?;
        reference_vocab = model.n_vocab();
        let mut prompts = Vec::new();
        for (i, p) in spec.prompts.iter().enumerate() {
            let prompt = model.tokenize(p, true)?;
            if prompt.is_empty() {
                bail!("prompt {} tokenized to nothing", i + 1);
            }
            prompts.push(prompt);
        }
        exec = super::sized(spec.exec, &prompts, spec.n_predict, trained.as_ref())?;
        let mut ctx = Context::new(&model, exec, false)?;
        for prompt in prompts {
            ctx.trim(0)?;
            let mut row = Vec::new();
            super::decode_finite(&mut ctx, "reference", &prompt, false, &mut row)?;
            let mut out = Vec::new();
            loop {
                let t = argmax(&row) as i32;
                out.push(t);
                if out.len() == spec.n_predict as usize {
                    break;
                }
                super::decode_finite(&mut ctx, "reference", &[t], false, &mut row)?;
            }
            trajectories.push((prompt, out));
        }
    }

    // Teacher-forced through the candidate.
    let model = Model::load(&spec.candidate)?;
    let n_vocab = model.n_vocab();
    if n_vocab != reference_vocab {
        bail!("candidate and reference vocabularies differ ({n_vocab} vs {reference_vocab} tokens)");
    }
    let mut ctx = Context::new(&model, exec, false)?;
    let mut positions = Vec::new();
    for (pi, (prompt, out)) in trajectories.iter().enumerate() {
        let rows = super::teacher_force(&mut ctx, "candidate", n_vocab, prompt, out)?;
        for (j, (&t, row)) in out.iter().zip(rows.chunks_exact(n_vocab)).enumerate() {
            let c = argmax(row) as i32;
            positions.push(Position {
                prompt: pi,
                position: j,
                reference_token: t,
                candidate_token: c,
                margin: margin(row),
                agree: c == t,
            });
        }
    }
    let points: Vec<(f32, bool)> = positions.iter().map(|p| (p.margin, p.agree)).collect();
    let agree = points.iter().filter(|p| p.1).count();
    let report = Report {
        reference_sha256,
        candidate_sha256,
        reference_digests,
        candidate_digests,
        prompts: trajectories.len(),
        positions: points.len(),
        agreement: agree as f64 / points.len() as f64,
        auroc: auroc(&points),
        escalation: escalation(&points, spec.target),
        median_margin_agree: median(points.iter().filter(|p| p.1).map(|p| p.0).collect()),
        median_margin_disagree: median(points.iter().filter(|p| !p.1).map(|p| p.0).collect()),
    };
    Ok((report, positions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auroc_of_a_perfect_a_useless_and_a_tied_gate() {
        // Every disagreement below every agreement: 1.
        assert_eq!(auroc(&[(0.1, false), (0.2, false), (1.0, true), (2.0, true)]), Some(1.0));
        // Reversed: 0.
        assert_eq!(auroc(&[(3.0, false), (0.2, true)]), Some(0.0));
        // All tied: 0.5.
        assert_eq!(auroc(&[(1.0, false), (1.0, true), (1.0, true)]), Some(0.5));
        // One of two pairs ordered: 0.5.
        assert_eq!(auroc(&[(1.0, false), (0.5, true), (2.0, true)]), Some(0.5));
        assert_eq!(auroc(&[(1.0, true)]), None);
    }

    #[test]
    fn escalation_takes_the_smallest_margins_first_and_whole_tie_groups() {
        // 100 positions, 2 disagreements at margins 0.1 and 0.3: 99% needs one escalated.
        let mut p: Vec<(f32, bool)> = (0..98).map(|i| (1.0 + i as f32, true)).collect();
        p.push((0.1, false));
        p.push((0.3, false));
        let e = escalation(&p, 0.99);
        assert_eq!(e.share, 0.01);
        assert_eq!(e.tau, Some(0.3));
        // Full agreement needs both.
        assert_eq!(escalation(&p, 1.0).share, 0.02);
        // Already there: nothing escalated.
        let all: Vec<(f32, bool)> = (0..10).map(|i| (i as f32, true)).collect();
        assert_eq!(escalation(&all, 0.99), Escalation { target_agreement: 0.99, share: 0.0, tau: Some(0.0) });
        // A tie group cannot be split.
        let tied = [(0.5, false), (0.5, true), (0.5, true), (2.0, true)];
        assert_eq!(escalation(&tied, 1.0).share, 0.75);
        // Disagreement at the largest margin: everything.
        assert_eq!(escalation(&[(0.1, true), (5.0, false)], 1.0).tau, None);
    }
}
