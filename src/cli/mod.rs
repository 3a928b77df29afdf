//! The commands. Each module owns its arguments and its printing; the library does the work.

mod campaign;
mod cell;
mod certificate;
mod choices;
mod claims;
mod device;
mod envelope;
mod generate;
mod model;
pub mod notices;
mod oracle;
mod plan;
mod progress;
mod refine;
mod reproduce;
mod tables;
mod task;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sovereign", version, about = "LLM inference beyond full memory residency, with proof of what happened")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Directory of extra ggml backend modules (libggml-*.so, e.g. libggml-cuda.so) to load;
    /// also SOVEREIGN_BACKEND_DIR.
    #[arg(long, global = true)]
    pub backend_dir: Option<PathBuf>,
}

/// The verbs, in the order a newcomer meets them: make a model, run it, compare and certify
/// the run, then campaigns and their evidence, then the tools around them.
#[derive(Subcommand)]
enum Command {
    /// Make or convert models.
    #[command(subcommand, after_help = "Example:\n  sovereign model forge --preset small --seed 7 --out models/small.gguf")]
    Model(model::ModelCommand),
    /// List a model's tensors, T_repr and expert objects (the file is validated first).
    #[command(after_help = "Example:\n  sovereign inventory models/small.gguf")]
    Inventory(model::InventoryArgs),
    /// Greedy generation with every oracle surface recorded.
    #[command(
        after_help = "Example (experts streamed by the Plan under a 128 MiB hard limit):\n  sovereign generate --model models/small.gguf --prompt-file campaigns/prompts/demo.txt \\\n    --n-predict 64 --experts plan --slots 16 --policy lru:16 --memory-max 128M --record results/f"
    )]
    Generate(generate::GenerateArgs),
    /// Compare two records surface by surface; exit 0 only if every surface is exact.
    #[command(after_help = "Example:\n  sovereign compare runs/oracle runs/f")]
    Compare(oracle::CompareArgs),
    /// Certificates C = (I, B, A, E, L): predicates (1)-(3) and claim classes R, W, E[E,h], L[F].
    #[command(subcommand, after_help = "Example:\n  sovereign certificate show results/f --oracle results/oracle --g-decl 0")]
    Certificate(certificate::CertificateCommand),
    /// Preregistered campaigns: check, run unattended, status, resume.
    #[command(
        subcommand,
        after_help = "Example (makes the campaign's model from its recipe if missing):\n  sovereign campaign run campaigns/exactness.yaml"
    )]
    Campaign(campaign::CampaignCommand),
    /// Write a campaign's records as CSV tables, a pair-ratio figure and a draft claim ledger.
    #[command(after_help = "Example:\n  sovereign export --campaign exactness-resident-1 --out results/export-exactness")]
    Export(tables::ExportArgs),
    /// Re-hash every file of a claim's records and check its assertions and fault validations offline.
    #[command(after_help = "Example:\n  sovereign verify --claim exactness-resident-1 --ledger results/export-exactness/claims.json")]
    Verify(claims::ClaimArgs),
    /// Recompute a claim's summaries (ratios, intervals, predicates, fault validations) from raw operands.
    #[command(after_help = "Example:\n  sovereign replay --claim exactness-resident-1 --ledger results/export-exactness/claims.json")]
    Replay(claims::ClaimArgs),
    /// Run a claim's cells again from its pinned identity, compare every surface with the
    /// originals, recompute its summaries and seal a reproduction report.
    #[command(
        after_help = "Example:\n  sovereign reproduce --claim exactness-resident-1 --ledger results/export-exactness/claims.json \\\n    --campaign campaigns/exactness.yaml --out results/repro"
    )]
    Reproduce(reproduce::ReproduceArgs),
    /// The Plan offline: replacement policies replayed on recorded routes.
    #[command(
        subcommand,
        after_help = "Example:\n  sovereign plan simulate --routes results/oracle --slots 8,16,32 --policy lru:S --policy zero"
    )]
    Plan(plan::PlanCommand),
    /// Cold O_DIRECT read bandwidth by block size x queue depth (io_uring); the best cell is the
    /// device ceiling.
    #[command(after_help = "Example:\n  sovereign envelope --file models/small.gguf --figure results/envelope.svg")]
    Envelope(envelope::EnvelopeArgs),
    /// Statistics over tables of measurements.
    #[command(subcommand, after_help = "Example:\n  sovereign stats pairs --csv results/export-bench-5/pairs.csv --a a --b b")]
    Stats(tables::StatsCommand),
    /// Teacher-force a reference's greedy trajectories through a candidate: per-position top-1
    /// margins and agreement, AUROC of margin as a disagreement predictor, escalation share.
    #[command(
        after_help = "Example:\n  sovereign margins --reference models/tau-f32.gguf --candidate models/tau-q4_k_m.gguf --prompts campaigns/prompts/tau.txt"
    )]
    Margins(refine::MarginsArgs),
    /// Margin-gated deferred refinement: a resident base generates, a higher-bit verifier
    /// checks deferred decisions in windows and rolls back flips.
    #[command(
        after_help = "Example:\n  sovereign campaign run campaigns/tau-sweep.yaml   (the τ sweep; `refine --help` lists one run's flags)"
    )]
    Refine(refine::RefineArgs),
    /// Check a record against the validator of its fault cell (seed 000 Table 7); recoverable
    /// cells are compared with the no-fault control record.
    #[command(after_help = "Example:\n  sovereign fault-check --cell eio --control results/control results/eio")]
    FaultCheck(oracle::FaultCheckArgs),
    /// A device in its own process: ggml's RPC backend over the CPU device.
    #[command(subcommand, after_help = "Example:\n  sovereign device serve --listen 127.0.0.1:50052 --memory-max 256M")]
    Device(device::DeviceCommand),
    /// Print the identity of this build: engine pin, tree digest, patches, binary digest.
    #[command(after_help = "Example:\n  sovereign build-info --json")]
    BuildInfo(model::BuildInfoArgs),
    /// Run one cell spec (JSON) in this process: the worker a contained run or a campaign
    /// starts.
    #[command(hide = true)]
    Cell(cell::CellArgs),
    /// Run one task spec (JSON): a device server or a cluster's block task, as this binary
    /// starts them.
    #[command(hide = true)]
    Task(task::TaskArgs),
}

impl Cli {
    /// Notes which flags were given on the command line (not defaulted), where a command
    /// refuses flags that do not apply.
    pub fn note_given(&mut self, m: &clap::ArgMatches) {
        if let (Command::Generate(a), Some(g)) = (&mut self.command, m.subcommand_matches("generate")) {
            a.note_given(g);
        }
    }
}

/// Exits on a command line clap refused. A value its parser refused (a policy, a size) is one
/// line, as every other refusal of a value is; help, version and usage errors stay clap's own.
pub fn refuse(e: clap::Error) -> ! {
    if e.kind() == clap::error::ErrorKind::ValueValidation {
        let text = e.render().to_string();
        eprintln!("{}", text.lines().next().unwrap_or("error: invalid value"));
        std::process::exit(2);
    }
    e.exit()
}

pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::BuildInfo(a) => model::build_info(a),
        Command::Model(c) => model::model(c),
        Command::Inventory(a) => model::inventory(a),
        Command::Generate(a) => generate::generate(a),
        Command::Device(c) => device::device(c),
        Command::Cell(a) => cell::cell(a),
        Command::Task(a) => task::task(a),
        Command::Envelope(a) => envelope::envelope(a),
        Command::Margins(a) => refine::margins(a),
        Command::Refine(a) => refine::refine(a),
        Command::FaultCheck(a) => oracle::fault_check(a),
        Command::Compare(a) => oracle::compare(a),
        Command::Campaign(c) => campaign::campaign(c),
        Command::Certificate(c) => certificate::certificate(c),
        Command::Verify(a) => claims::claim(a, claims::Verb::Verify),
        Command::Replay(a) => claims::claim(a, claims::Verb::Replay),
        Command::Plan(c) => plan::plan(c),
        Command::Reproduce(a) => reproduce::reproduce(a),
        Command::Stats(c) => tables::stats(c),
        Command::Export(a) => tables::export(a),
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A generate run's token counts and speeds, as its summary and a contained run's print them.
fn print_tokens_and_speed(prompt: usize, generated: usize, t: &sovereign::record::format::Timing) {
    println!("tokens    {prompt} prompt + {generated} generated");
    println!("speed     prefill {:.1} tok/s, decode {:.1} tok/s (load {:.2} s)", t.prefill_tokens_per_s, t.decode_tokens_per_s, t.load_s);
}

/// Exit status of a command that ran: 0 when `ok`, 1 otherwise (2 is for errors).
fn status(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// A session's summary as JSON: each request's outcome, tokens, times, bytes and score; the
/// scores' aggregate, the ledger, and the session's request+reset wall time.
pub fn session_json(s: &sovereign::record::format::SessionRecord) -> Result<serde_json::Value> {
    Ok(serde_json::json!({
        "outcome": s.outcome,
        "error": s.error,
        "between": s.between,
        "timing": s.timing,
        "requests": s.requests,
        "scores": s.scores,
        "ledger": s.ledger,
    }))
}
