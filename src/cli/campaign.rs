//! `campaign check|run|resume|status|schema`.

use super::print_json;
use anyhow::Result;
use clap::{Args, Subcommand};
use sovereign::campaign;
use sovereign::cell::CampaignBlock;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum CampaignCommand {
    /// Check a campaign file: typos and wrong types as FILE:line:column: message.
    #[command(after_help = "Example:\n  sovereign campaign check campaigns/exactness.yaml")]
    Check {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        /// Then make the missing models from their recipes, as `campaign run` does first.
        #[arg(long)]
        make_models: bool,
    },
    /// Preregister (freeze) the campaign, then run every cell unattended.
    #[command(
        after_help = "Example:\n  sovereign campaign run campaigns/exactness.yaml\n  sovereign campaign run campaigns/exactness.yaml --executor slurm --time 30   (a task per block)"
    )]
    Run(RunArgs),
    /// Continue a preregistered campaign after an interruption.
    #[command(after_help = "Example:\n  sovereign campaign resume campaigns/exactness.yaml")]
    Resume(RunArgs),
    /// Show each cell's state from the journal.
    #[command(after_help = "Example:\n  sovereign campaign status campaigns/exactness.yaml --json")]
    Status {
        file: PathBuf,
        #[arg(long, default_value = "results")]
        results: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of campaign files.
    #[command(after_help = "Example:\n  sovereign campaign schema > schemas/campaign.schema.json")]
    Schema,
    /// Run one block of a preregistered campaign (what a Slurm array task runs).
    #[command(hide = true)]
    RunBlock {
        file: PathBuf,
        #[arg(long)]
        block: usize,
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// Refuse to run unless this executable has this SHA-256 (the submitter's).
        #[arg(long)]
        binary_sha256: Option<String>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Executor {
    /// Every cell on this machine, one after another.
    Local,
    /// One Slurm job array: a task per counterbalanced block, sealing into the shared --results.
    Slurm,
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
    /// Where cells run.
    #[arg(long, value_enum, default_value = "local")]
    executor: Executor,
    /// Slurm partition (--executor slurm).
    #[arg(long)]
    partition: Option<String>,
    /// Slurm account (--executor slurm).
    #[arg(long)]
    account: Option<String>,
    /// Time limit of one block's task, as sbatch takes it (--executor slurm).
    #[arg(long)]
    time: Option<String>,
    /// A further sbatch argument, repeatable (--executor slurm), e.g. --sbatch-arg=--qos=long.
    #[arg(long = "sbatch-arg", allow_hyphen_values = true)]
    sbatch_arg: Vec<String>,
    /// Share nodes with other jobs (by default a block's node is allocated exclusively, as
    /// cells measure time and memory).
    #[arg(long)]
    no_exclusive: bool,
}

pub fn campaign(c: CampaignCommand) -> Result<ExitCode> {
    match c {
        CampaignCommand::Check { file, json, make_models } => return check(&file, json, make_models),
        CampaignCommand::Run(a) => return run(a, campaign::RunMode::Run),
        CampaignCommand::Resume(a) => return run(a, campaign::RunMode::Resume),
        CampaignCommand::Status { file, results, json } => {
            let l = campaign::load(&file)?;
            let mut r = campaign::status(&l, &results)?;
            if r.preregistered {
                (r.blocks, r.cluster_unreachable) = campaign::slurm::block_rows(&l, &results)?;
            }
            if json {
                print_json(&r)?;
            } else {
                print!("{}", r.to_text());
            }
        }
        CampaignCommand::Schema => print!("{}", campaign::schema_json()),
        CampaignCommand::RunBlock { file, block, results, binary_sha256 } => {
            return run_block(&CampaignBlock { file, block, results, binary_sha256 });
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One block of a campaign, as a cluster's array task runs it.
pub fn run_block(b: &CampaignBlock) -> Result<ExitCode> {
    let l = campaign::load(&b.file)?;
    let s = campaign::slurm::run_block(&l, &b.results, b.block, b.binary_sha256.as_deref(), super::progress::on_stderr(false))?;
    println!(
        "campaign {} block {}: {} interrupted attempts of its cells discarded in all (as `campaign status` counts them); this task: {} ran, {} attempts discarded",
        s.campaign, b.block, s.discarded, s.ran, s.discarded_now
    );
    Ok(ExitCode::SUCCESS)
}

/// One line per model made from its recipe (stderr under `--json`).
fn report_made(made: &[campaign::models::Made], json: bool) {
    for m in made {
        let line = format!("made {} ({}) from its recipe in {:.1} s: {}", m.path.display(), m.field, m.seconds, m.recipe);
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
}

/// The problems of a file on stderr, one per line (and in `problems` under `--json`); a file
/// with none is summarized, with the models `campaign run` will make from their recipes.
fn check(file: &std::path::Path, json: bool, make_models: bool) -> Result<ExitCode> {
    let mut problems = campaign::check(file);
    if problems.is_empty() && make_models {
        report_made(&campaign::models::make_missing(&campaign::load(file)?)?, json);
        problems = campaign::check(file);
    }
    if json {
        print_json(&serde_json::json!({ "file": file, "ok": problems.is_empty(), "problems": problems }))?;
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("{p}");
        }
        return Ok(ExitCode::from(1));
    }
    if !json {
        let l = campaign::load(file)?;
        println!(
            "{}: ok, campaign {} ({} arms, {} cells), digest {}",
            file.display(),
            l.id(),
            l.spec.arms.len(),
            campaign::expand(&l.spec).len(),
            l.digest
        );
        for (field, path) in campaign::models::pending(&l.spec, &l.base) {
            println!("{}: {field} {} is missing; `campaign run` makes it from its recipe", file.display(), path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run(a: RunArgs, mode: campaign::RunMode) -> Result<ExitCode> {
    let l = campaign::load(&a.file)?;
    // What `campaign check` refuses, before any model is made or anything frozen.
    campaign::gate::refuse(&l, campaign::models::Recipes::Pending)?;
    let made = campaign::models::make_missing(&l)?;
    report_made(&made, a.json);
    if a.executor == Executor::Slurm {
        return submit(a, &l, mode);
    }
    for (flag, given) in [
        ("--partition", a.partition.is_some()),
        ("--account", a.account.is_some()),
        ("--time", a.time.is_some()),
        ("--sbatch-arg", !a.sbatch_arg.is_empty()),
        ("--no-exclusive", a.no_exclusive),
    ] {
        if given {
            anyhow::bail!("{flag} needs --executor slurm");
        }
    }
    let exec = campaign::ProcessExecutor::current(&l.base)?;
    let opts =
        campaign::RunOptions { results: a.results, mode, progress: super::progress::on_stderr(!a.no_progress && !a.json), block: None };
    let s = campaign::run(&l, &exec, &opts)?;
    if a.json {
        print_json(&s)?;
    } else {
        println!(
            "campaign {} ({}): {} cells, {} sealed, {} skipped, {} abandoned, {} interrupted attempts discarded in all (as `campaign status` counts them); this run: {} ran, {} attempts discarded",
            s.campaign, s.digest, s.cells, s.sealed, s.skipped, s.abandoned, s.discarded, s.ran, s.discarded_now
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn submit(a: RunArgs, l: &campaign::Loaded, mode: campaign::RunMode) -> Result<ExitCode> {
    let o = campaign::slurm::SlurmOptions {
        partition: a.partition,
        account: a.account,
        time: a.time,
        sbatch_args: a.sbatch_arg,
        exclusive: !a.no_exclusive,
    };
    let s = campaign::slurm::submit(l, &a.results, mode, &o)?;
    if a.json {
        print_json(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "campaign {} ({}): {} blocks, {} settled, {} still queued",
        s.campaign,
        s.digest,
        s.blocks,
        s.settled_blocks.len(),
        s.queued.len()
    );
    for x in &s.submitted {
        let after = x.after.as_deref().map_or(String::new(), |j| format!(", after job {j}"));
        println!("submitted job {}: blocks {:?}{after}", x.job, x.blocks);
    }
    if s.submitted.is_empty() {
        println!("nothing to submit");
    }
    println!("watch: sovereign campaign status {} --results {}", a.file.display(), a.results.display());
    Ok(ExitCode::SUCCESS)
}
