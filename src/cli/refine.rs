//! `margins` and `refine` (seed 001).

use super::print_json;
use anyhow::{bail, Context, Result};
use clap::Args;
use sovereign::cell::{self, Cell, ExpertsMode, RefineCell};
use sovereign::exec::{ExecParams, ExecRequest};
use sovereign::refine::{self, margins, Mode};
use sovereign::source::fault::FaultCell;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct MarginsArgs {
    /// The full-precision model whose greedy trajectories are teacher-forced.
    #[arg(long)]
    reference: PathBuf,
    /// The quantized model whose margins and agreement are measured.
    #[arg(long)]
    candidate: PathBuf,
    /// Prompts, one per non-empty line.
    #[arg(long)]
    prompts: PathBuf,
    /// Tokens per trajectory.
    #[arg(long, default_value_t = 64)]
    n_predict: u32,
    /// Agreement the escalation share is computed for.
    #[arg(long, default_value_t = 0.99)]
    target: f64,
    #[command(flatten)]
    exec: ExecArgs,
    /// Write every position (prompt, position, tokens, margin, agreement) as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RefineArgs {
    /// The resident low-bit base that generates.
    #[arg(long)]
    base: PathBuf,
    /// The higher-bit variant of the same checkpoint that verifies.
    #[arg(long)]
    verifier: PathBuf,
    /// Scores the output: mean per-token log-probability under this (F32/F16) model.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Prompts, one per non-empty line.
    #[arg(long)]
    prompts: PathBuf,
    #[arg(long, default_value_t = 64)]
    n_predict: u32,
    /// Defer decisions whose top-1 margin is below τ.
    #[arg(long, default_value_t = refine::DEFAULT_TAU)]
    tau: f32,
    /// Verify every W generated tokens (with --verify-all: W drafts per verifier traversal).
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Check every position, not only deferred ones: drafted decoding with the base as the
    /// proposer (as `generate --draft`), whose output is the verifier's own greedy one.
    #[arg(long)]
    verify_all: bool,
    /// `refine` (the runtime), `base` (the base alone) or `verifier` (the verifier alone).
    #[arg(long, value_parser = super::choices::parser::<Mode>(), default_value = "refine")]
    mode: Mode,
    #[command(flatten)]
    exec: ExecArgs,
    /// `resident`: the verifier is loaded whole. `plan`: its experts (and the reference's) are
    /// streamed from storage through the Plan, for when it cannot co-reside with the base.
    #[arg(long, value_parser = super::choices::parser::<ExpertsMode>(), default_value = "resident")]
    verifier_experts: ExpertsMode,
    #[command(flatten)]
    plan: super::generate::PlanArgs,
    /// Slots per layer for the reference's experts while it scores, when the verifier streams
    /// (its experts are larger: F32).
    #[arg(long, default_value_t = cell::REFERENCE_SLOTS)]
    reference_slots: u32,
    #[command(flatten)]
    contained: super::generate::ContainArgs,
    /// Record directory (must not exist).
    #[arg(long)]
    record: PathBuf,
    #[arg(long)]
    json: bool,
}

/// Kernel-relevant execution parameters, the same for every model of a run.
#[derive(Args)]
pub struct ExecArgs {
    /// Engine threads decoding one token at a time (default: every core, streamed or not).
    #[arg(long)]
    threads: Option<i32>,
    /// Engine threads for multi-token batches (default: `--threads` when given, else every
    /// core).
    #[arg(long)]
    threads_batch: Option<i32>,
    /// Context size of each model, tokens (the KV caches are charged to the run; default: the
    /// longest prompt's tokens plus --n-predict, up to the models' trained length).
    #[arg(long)]
    ctx: Option<u32>,
    /// Logical and physical batch size.
    #[arg(long, default_value_t = cell::BATCH)]
    batch: u32,
}

impl ExecArgs {
    /// Resident models only (margins).
    fn params(&self) -> Result<ExecRequest> {
        let exec = self.unchecked();
        cell::run_params(&exec, 0)?;
        Ok(exec)
    }

    fn unchecked(&self) -> ExecRequest {
        let threads = sovereign::bounds::threads(self.threads.map(i64::from), self.threads_batch.map(i64::from));
        ExecParams::new(self.ctx, self.batch, threads, false)
    }
}

impl RefineArgs {
    /// The flags as the cell they ask for.
    fn cell(&self) -> Result<Cell> {
        let stream = match self.verifier_experts {
            ExpertsMode::Resident => None,
            ExpertsMode::Plan => Some(self.plan.options(FaultCell::None, None)),
            ExpertsMode::Host => bail!("--verifier-experts is `resident` or `plan`"),
        };
        Ok(Cell::Refine(RefineCell {
            base: self.base.clone(),
            verifier: self.verifier.clone(),
            reference: self.reference.clone(),
            prompts: self.prompts.clone(),
            n_predict: self.n_predict,
            mode: self.mode,
            tau: self.tau,
            window: self.window,
            verify_all: self.verify_all,
            exec: self.exec.unchecked(),
            stream,
            reference_slots: self.reference_slots,
            record: self.record.clone(),
            seal: true,
        }))
    }
}

pub fn margins(a: MarginsArgs) -> Result<ExitCode> {
    let spec = margins::MarginsSpec {
        reference: a.reference,
        candidate: a.candidate,
        prompts: refine::prompts_of(&cell::read_prompts(&a.prompts)?),
        n_predict: a.n_predict,
        exec: a.exec.params()?,
        target: a.target,
    };
    let (report, positions) = margins::run(&spec)?;
    if let Some(path) = &a.csv {
        let mut w = csv::Writer::from_path(path).with_context(|| format!("{}", path.display()))?;
        for p in &positions {
            w.serialize(p)?;
        }
        w.flush()?;
    }
    if a.json {
        print_json(&report)?;
    } else {
        let f = |v: Option<f32>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!("positions   {} over {} prompts", report.positions, report.prompts);
        println!("agreement   {:.2}%", report.agreement * 100.0);
        println!("AUROC       {}", report.auroc.map_or("- (one class only)".into(), |v| format!("{v:.3}")));
        println!(
            "median      margin {} when agreeing, {} when disagreeing",
            f(report.median_margin_agree),
            f(report.median_margin_disagree)
        );
        println!(
            "escalate    {:.1}% of tokens (margin < {}) for {:.0}% agreement",
            report.escalation.share * 100.0,
            f(report.escalation.tau),
            report.escalation.target_agreement * 100.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn refine(a: RefineArgs) -> Result<ExitCode> {
    let cell = a.cell()?;
    cell.check()?;
    if a.contained.enabled() {
        let (rec, dir) = a.contained.run(&cell)?;
        super::generate::print_contained(&rec, &dir, a.json)?;
        return Ok(super::status(rec.outcome() == sovereign::record::format::Outcome::Completed));
    }
    super::generate::isolated(&cell, a.json)
}

pub fn print_summary(s: &refine::Summary, json: bool) -> Result<()> {
    if json {
        return print_json(s);
    }
    println!("record    {}", s.record.display());
    println!("mode      {:?}, tau {}, window {}{}", s.mode, s.tau, s.window, if s.verify_all { ", verify-all" } else { "" });
    let c = &s.counters;
    println!("tokens    {} generated, {:.1} tok/s", s.generated_tokens, s.tokens_per_s);
    println!("verify    {} sweeps, {} rollbacks, {} deferred, {} checked", c.sweeps, c.rollbacks, c.deferred, c.checked);
    println!("bytes     {:.0} verification bytes per token (logical)", s.verification_bytes_per_token);
    if let Some(q) = &s.quality {
        println!(
            "quality   mean log-prob {:.4} under the reference ({:.1}% of tokens its greedy choice)",
            q.mean_logprob,
            q.reference_agreement * 100.0
        );
    }
    Ok(())
}
