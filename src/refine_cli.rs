//! `sovereign margins` and `sovereign refine` (seed 001).

use anyhow::{Context, Result};
use clap::Args;
use sovereign::engine::ExecParams;
use sovereign::plan::engine::PlanOptions;
use sovereign::refine::{self, margins, Mode};
use sovereign::source::fault::FaultCell;
use std::path::{Path, PathBuf};
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

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum VerifierExperts {
    Resident,
    Plan,
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
    #[arg(long, default_value_t = 1.0)]
    tau: f32,
    /// Verify every W generated tokens.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Check every position, not only deferred ones.
    #[arg(long)]
    verify_all: bool,
    /// `refine` (the runtime), `base` (the base alone) or `verifier` (the verifier alone).
    #[arg(long, value_enum, default_value_t = Mode::Refine)]
    mode: Mode,
    #[command(flatten)]
    exec: ExecArgs,
    /// `resident`: the verifier is loaded whole. `plan`: its experts (and the reference's) are
    /// streamed from storage through the Plan, for when it cannot co-reside with the base.
    #[arg(long, value_enum, default_value_t = VerifierExperts::Resident)]
    verifier_experts: VerifierExperts,
    #[command(flatten)]
    plan: super::PlanArgs,
    /// Slots per layer for the reference's experts while it scores, when the verifier streams
    /// (its experts are larger: F32).
    #[arg(long, default_value_t = 8)]
    reference_slots: u32,
    #[command(flatten)]
    contained: super::ContainArgs,
    /// Record directory (must not exist).
    #[arg(long)]
    record: PathBuf,
    #[arg(long)]
    json: bool,
}

/// Kernel-relevant execution parameters, the same for every model of a run.
#[derive(Args)]
pub struct ExecArgs {
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// Context size of each model, tokens (the KV caches are charged to the run).
    #[arg(long, default_value_t = 1024)]
    ctx: u32,
    /// Logical and physical batch size.
    #[arg(long, default_value_t = 512)]
    batch: u32,
}

impl ExecArgs {
    fn params(&self) -> Result<ExecParams> {
        sovereign::bounds::RunParams { threads: self.threads as i64, ctx: self.ctx, batch: self.batch, n_predict: 0 }.check()?;
        Ok(ExecParams { n_ctx: self.ctx, n_batch: self.batch, n_ubatch: self.batch, threads: self.threads, flash_attn: false })
    }

    fn args(&self) -> Vec<std::ffi::OsString> {
        [("--threads", self.threads.to_string()), ("--ctx", self.ctx.to_string()), ("--batch", self.batch.to_string())]
            .into_iter()
            .flat_map(|(k, v)| [k.into(), v.into()])
            .collect()
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    sovereign::bounds::regular_file("--prompts", path)?;
    let b = std::fs::read(path).with_context(|| format!("{}: cannot read prompts", path.display()))?;
    sovereign::bounds::prompt_text(&path.display().to_string(), &b)?;
    Ok(b)
}

pub fn margins_cmd(a: MarginsArgs) -> Result<ExitCode> {
    let spec = margins::MarginsSpec {
        reference: a.reference,
        candidate: a.candidate,
        prompts: refine::prompts_of(&read(&a.prompts)?),
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
        super::print_json(&report)?;
    } else {
        let f = |v: Option<f32>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!("positions   {} over {} prompts", report.positions, report.prompts);
        println!("agreement   {:.2}%", report.agreement * 100.0);
        println!("AUROC       {}", report.auroc.map_or("- (one class only)".into(), |v| format!("{v:.3}")));
        println!("median      margin {} when agreeing, {} when disagreeing", f(report.median_margin_agree), f(report.median_margin_disagree));
        println!(
            "escalate    {:.1}% of tokens (margin < {}) for {:.0}% agreement",
            report.escalation.share * 100.0,
            f(report.escalation.tau),
            report.escalation.target_agreement * 100.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The same run as a child process writing its record to `record` (no cgroup options).
fn child_args(a: &RefineArgs, record: &Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = vec!["refine".into()];
    let mut kv = |k: &str, val: std::ffi::OsString| {
        v.push(k.into());
        v.push(val);
    };
    kv("--base", a.base.clone().into());
    kv("--verifier", a.verifier.clone().into());
    if let Some(r) = &a.reference {
        kv("--reference", r.clone().into());
    }
    kv("--prompts", a.prompts.clone().into());
    for (k, val) in [
        ("--n-predict", a.n_predict.to_string()),
        ("--tau", a.tau.to_string()),
        ("--window", a.window.to_string()),
        ("--mode", format!("{:?}", a.mode).to_lowercase()),
    ] {
        kv(k, val.into());
    }
    v.extend(a.exec.args());
    if a.verifier_experts == VerifierExperts::Plan {
        v.extend(["--verifier-experts".into(), "plan".into()]);
        v.extend(a.plan.args());
        v.extend(["--reference-slots".into(), a.reference_slots.to_string().into()]);
    }
    if a.verify_all {
        v.push("--verify-all".into());
    }
    v.extend(["--record".into(), record.into(), "--json".into()]);
    v
}

pub fn refine_cmd(a: RefineArgs) -> Result<ExitCode> {
    if a.verifier_experts == VerifierExperts::Plan {
        a.plan.check()?;
        sovereign::bounds::range("--reference-slots", a.reference_slots as u64, 1, sovereign::bounds::MAX_SLOTS as u64, "expert slots per layer")?;
    }
    let prompt_bytes = read(&a.prompts)?;
    let exec = a.exec.params()?;
    if a.contained.enabled() {
        return refine_contained(&a);
    }
    let spec = refine::RefineSpec {
        base: a.base.clone(),
        verifier: a.verifier.clone(),
        reference: a.reference.clone(),
        prompts: refine::prompts_of(&prompt_bytes),
        prompt_bytes,
        n_predict: a.n_predict,
        mode: a.mode,
        tau: a.tau,
        window: a.window,
        verify_all: a.verify_all,
        exec,
        stream: (a.verifier_experts == VerifierExperts::Plan).then(|| a.plan.options(FaultCell::None)),
        reference_stream: (a.verifier_experts == VerifierExperts::Plan)
            .then(|| PlanOptions { slots: a.reference_slots, ..a.plan.options(FaultCell::None) }),
        record: a.record.clone(),
    };
    let s = refine::run(&spec)?;
    if a.json {
        super::print_json(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("record    {}", s.record.display());
    println!("mode      {:?}, tau {}, window {}{}", s.mode, s.tau, s.window, if s.verify_all { ", verify-all" } else { "" });
    let c = &s.counters;
    println!("tokens    {} generated, {:.1} tok/s", s.generated_tokens, s.tokens_per_s);
    println!("verify    {} sweeps, {} rollbacks, {} deferred, {} checked", c.sweeps, c.rollbacks, c.deferred, c.checked);
    println!("bytes     {:.0} verification bytes per token (logical)", s.verification_bytes_per_token);
    if let Some(q) = &s.quality {
        println!("quality   mean log-prob {:.4} under the reference ({:.1}% of tokens its greedy choice)", q.mean_logprob, q.reference_agreement * 100.0);
    }
    Ok(ExitCode::SUCCESS)
}

fn refine_contained(a: &RefineArgs) -> Result<ExitCode> {
    let models: Vec<&Path> = [Some(&a.base), Some(&a.verifier), a.reference.as_ref()].into_iter().flatten().map(PathBuf::as_path).collect();
    for m in &models {
        sovereign::inventory::Inventory::of(m)?;
    }
    let spec = a.contained.spec();
    let cache = a.contained.cache_protocol(&models)?;
    let (rec, dir) = sovereign::generate::run_contained(&a.record, |cell| child_args(a, cell), &spec, cache, "sovereign.refine/1")?;
    let res = &rec["resources"];
    if a.json {
        super::print_json(&serde_json::json!({
            "record": dir,
            "outcome": rec["outcome"],
            "admission": res["admission"],
            "authority": res["authority"],
            "refine": rec["refine"],
            "quality": rec["quality"],
        }))?;
    } else {
        println!("record    {}", dir.display());
        println!("outcome   {}", rec["outcome"].as_str().unwrap_or("?"));
        if let Some(e) = rec["error"].as_str() {
            println!("error     {e}");
        }
        let host = &res["host"];
        println!("host      limit {} bytes, kernel peak {} bytes, limit events {}", host["limit"], host["kernel_peak"], host["limit_events"]);
        println!("bytes     {} verification bytes per token (logical)", rec["refine"]["verification_bytes_per_token"]);
        println!("quality   mean log-prob {}", rec["quality"]["mean_logprob"]);
        println!("admission {}", if res["admission"]["admitted"] == true { "admitted" } else { "NOT admitted" });
    }
    Ok(if rec["outcome"] == "completed" { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
