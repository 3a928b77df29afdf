//! `stats` and `export`: tables of measurements.

use super::print_json;
use anyhow::Result;
use clap::{Args, Subcommand};
use sovereign::{export, stats};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum StatsCommand {
    /// Paired geometric ratio b/a and paired-log Student-t interval (df = n - 1) of two columns.
    Pairs {
        #[arg(long)]
        csv: PathBuf,
        /// Denominator column.
        #[arg(long)]
        a: String,
        /// Numerator column.
        #[arg(long)]
        b: String,
        #[arg(long, default_value_t = 0.95)]
        level: f64,
        #[arg(long)]
        json: bool,
        /// Pair values from different nodes (`<COL>_node` columns); refused by default.
        #[arg(long)]
        allow_mixed_nodes: bool,
    },
}

#[derive(Args)]
pub struct ExportArgs {
    /// Campaign id (as in its file's `id`).
    #[arg(long)]
    campaign: String,
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn stats(c: StatsCommand) -> Result<ExitCode> {
    let StatsCommand::Pairs { csv, a, b, level, json, allow_mixed_nodes } = c;
    if !allow_mixed_nodes {
        stats::check_pair_nodes(&csv, &a, &b)?;
    }
    let (labels, xa, xb) = stats::read_pairs_csv(&csv, &a, &b)?;
    let r = stats::paired_ratio(&labels, &xa, &xb, level)?;
    if json {
        print_json(&r)?;
    } else {
        print!("{}", r.to_text(&a, &b));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn export(a: ExportArgs) -> Result<ExitCode> {
    let s = export::export(&a.results, &a.campaign, &a.out)?;
    if a.json {
        print_json(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}: {} cells ({} sealed), {} pairs", s.campaign, s.cells, s.sealed, s.pairs);
    for f in &s.files {
        println!("wrote {}", f.display());
    }
    println!("{}", export::ArmRow::header());
    for r in &s.arms {
        println!("{}", r.line());
    }
    let interval = |p: &stats::PairedRatio| match (p.lo, p.hi) {
        (Some(lo), Some(hi)) => format!("{:.4}, {:.0}% paired-log t interval [{lo:.4}, {hi:.4}] (n = {})", p.ratio, p.level * 100.0, p.n),
        _ => format!("{:.4} (n = {}: no interval)", p.ratio, p.n),
    };
    if let Some(p) = &s.summary {
        println!("paired ratio: {}", interval(p));
    }
    if let Some(p) = &s.floor {
        println!("ratio to floor: {}", interval(p));
    }
    Ok(ExitCode::SUCCESS)
}
