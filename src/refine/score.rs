//! Quality: the mean per-token log-probability of an output under the reference model,
//! teacher-forced (seed 001 §5.1).

use crate::engine::Context;
use crate::exec::ExecParams;
use crate::generate::argmax;
use crate::inventory::Inventory;
use crate::plan::PlanOptions;
use anyhow::Result;

use std::path::Path;

pub use crate::record::format::Quality;

/// log softmax(row)[t], in f64.
pub fn logprob(row: &[f32], t: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row[t] as f64 - max - sum.ln()
}

/// Scores each (prompt, output) pair under the model at `path`.
pub fn score(path: &Path, inv: &Inventory, seqs: &[(&[i32], &[i32])], exec: ExecParams, stream: &Option<PlanOptions>) -> Result<Quality> {
    let model = super::load(path, inv, stream, exec.cpu_threads())?;
    let n_vocab = model.n_vocab();
    let mut ctx = Context::new(&model, exec, false)?;
    let (mut sum, mut tokens, mut agree) = (0.0f64, 0usize, 0usize);
    let mut per_prompt = Vec::new();
    for (prompt, out) in seqs {
        if out.is_empty() {
            per_prompt.push(f64::NAN);
            continue;
        }
        let rows = super::teacher_force(&mut ctx, "reference", n_vocab, prompt, out)?;
        let mut s = 0.0;
        for (&t, row) in out.iter().zip(rows.chunks_exact(n_vocab)) {
            s += logprob(row, t as usize);
            agree += usize::from(argmax(row) == t as usize);
        }
        sum += s;
        tokens += out.len();
        per_prompt.push(s / out.len() as f64);
    }
    drop(ctx);
    if let Some(r) = model.with_source(|s| s.finish().map(crate::record::format::ExpertsReport::from)) {
        r?;
    }
    Ok(Quality {
        mean_logprob: sum / tokens.max(1) as f64,
        per_prompt,
        tokens,
        reference_agreement: agree as f64 / tokens.max(1) as f64,
        reference_streamed: stream.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprob_is_a_normalized_log_softmax() {
        let row = [1.0f32, 2.0, 3.0];
        let total: f64 = (0..3).map(|t| logprob(&row, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!(logprob(&row, 2) > logprob(&row, 1));
        // Shift invariance, and no overflow at large logits.
        assert!((logprob(&[1001.0, 1002.0, 1003.0], 0) - logprob(&row, 0)).abs() < 1e-9);
    }
}
