//! `campaign check|run|resume|status|schema`.

use super::print_json;
use anyhow::Result;
use clap::{Args, Subcommand};
use sovereign::campaign;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum CampaignCommand {
    /// Check a campaign file: typos and wrong types as FILE:line:column: message.
    Check {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Preregister (freeze) the campaign, then run every cell unattended.
    Run(RunArgs),
    /// Continue a preregistered campaign after an interruption.
    Resume(RunArgs),
    /// Show each cell's state from the journal.
    Status {
        file: PathBuf,
        #[arg(long, default_value = "results")]
        results: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of campaign files.
    Schema,
}

#[derive(Args)]
pub struct RunArgs {
    file: PathBuf,
    /// Where records and campaign state live.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    no_progress: bool,
    #[arg(long)]
    json: bool,
}

pub fn campaign(c: CampaignCommand) -> Result<ExitCode> {
    match c {
        CampaignCommand::Check { file, json } => {
            let problems = campaign::check(&file)?;
            if json {
                print_json(&serde_json::json!({ "file": file, "ok": problems.is_empty(), "problems": problems }))?;
            } else if problems.is_empty() {
                let l = campaign::load(&file)?;
                println!("{}: ok, campaign {} ({} arms, {} cells), digest {}", file.display(), l.id(), l.spec.arms.len(), campaign::expand(&l.spec).len(), l.digest);
            }
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("{p}");
                }
                return Ok(ExitCode::from(1));
            }
        }
        CampaignCommand::Run(a) => return run(a, campaign::RunMode::Run),
        CampaignCommand::Resume(a) => return run(a, campaign::RunMode::Resume),
        CampaignCommand::Status { file, results, json } => {
            let l = campaign::load(&file)?;
            let r = campaign::status(&l, &results)?;
            if json {
                print_json(&r)?;
            } else {
                print!("{}", r.to_text());
            }
        }
        CampaignCommand::Schema => print!("{}", campaign::schema_json()),
    }
    Ok(ExitCode::SUCCESS)
}

fn run(a: RunArgs, mode: campaign::RunMode) -> Result<ExitCode> {
    let l = campaign::load(&a.file)?;
    let exec = campaign::ProcessExecutor::current(&l.base)?;
    let opts = campaign::RunOptions { results: a.results, mode, progress: !a.no_progress && !a.json };
    let s = campaign::run(&l, &exec, &opts)?;
    if a.json {
        print_json(&s)?;
    } else {
        println!(
            "campaign {} ({}): {} cells, {} sealed, {} skipped, {} abandoned; this run: {} ran, {} interrupted attempts discarded",
            s.campaign, s.digest, s.cells, s.sealed, s.skipped, s.abandoned, s.ran, s.discarded
        );
    }
    Ok(ExitCode::SUCCESS)
}
