//! The commands. Each module owns its arguments and its printing; the library does the work.

mod campaign;
mod certificate;
mod claims;
mod device;
mod envelope;
mod generate;
mod model;
mod oracle;
mod plan;
mod refine;
mod reproduce;
mod tables;

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

#[derive(Subcommand)]
enum Command {
    /// Print the identity of this build: engine pin, tree digest, patches, binary digest.
    BuildInfo(model::BuildInfoArgs),
    /// Make or convert models.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// List a model's tensors, T_repr and expert objects (the file is validated first).
    Inventory(model::InventoryArgs),
    /// Greedy generation with every oracle surface recorded.
    Generate(generate::GenerateArgs),
    /// A device in its own process: ggml's RPC backend over the CPU device.
    #[command(subcommand)]
    Device(device::DeviceCommand),
    /// Run one cell spec (JSON) in this process: the worker a contained run or a campaign
    /// starts.
    #[command(hide = true)]
    Cell(generate::CellArgs),
    /// Cold O_DIRECT read bandwidth by block size x queue depth (io_uring); the best cell is the
    /// device ceiling.
    Envelope(envelope::EnvelopeArgs),
    /// Teacher-force a reference's greedy trajectories through a candidate: per-position top-1
    /// margins and agreement, AUROC of margin as a disagreement predictor, escalation share.
    Margins(refine::MarginsArgs),
    /// Margin-gated deferred refinement: a resident base generates, a higher-bit verifier
    /// checks deferred decisions in windows and rolls back flips.
    Refine(refine::RefineArgs),
    /// Check a record against the validator of its fault cell (seed 000 Table 7); recoverable
    /// cells are compared with the no-fault control record.
    FaultCheck(oracle::FaultCheckArgs),
    /// Compare two records surface by surface; exit 0 only if every surface is exact.
    Compare(oracle::CompareArgs),
    /// Preregistered campaigns: check, run unattended, status, resume.
    #[command(subcommand)]
    Campaign(campaign::CampaignCommand),
    /// Certificates C = (I, B, A, E, L): predicates (1)-(3) and claim classes R, W, E[E,h], L[F].
    #[command(subcommand)]
    Certificate(certificate::CertificateCommand),
    /// Re-hash every file of a claim's records and check its assertions and fault validations offline.
    Verify(claims::ClaimArgs),
    /// Recompute a claim's summaries (ratios, intervals, predicates, fault validations) from raw operands.
    Replay(claims::ClaimArgs),
    /// The Plan offline: replacement policies replayed on recorded routes.
    #[command(subcommand)]
    Plan(plan::PlanCommand),
    /// Run a claim's cells again from its pinned identity, compare every surface with the
    /// originals, recompute its summaries and seal a reproduction report.
    Reproduce(reproduce::ReproduceArgs),
    /// Statistics over tables of measurements.
    #[command(subcommand)]
    Stats(tables::StatsCommand),
    /// Write a campaign's records as CSV tables, a pair-ratio figure and a draft claim ledger.
    Export(tables::ExportArgs),
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

pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::BuildInfo(a) => model::build_info(a),
        Command::Model(c) => model::model(c),
        Command::Inventory(a) => model::inventory(a),
        Command::Generate(a) => generate::generate(a),
        Command::Device(c) => device::device(c),
        Command::Cell(a) => generate::cell(a),
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

/// Exit status of a command that ran: 0 when `ok`, 1 otherwise (2 is for errors).
fn status(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
