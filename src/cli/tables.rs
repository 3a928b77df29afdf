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
    #[command(after_help = "Example:\n  sovereign stats pairs --csv results/export-bench-5/pairs.csv --a a --b b")]
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
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ExportArgs {
    #[command(subcommand)]
    what: Option<ExportCommand>,
    /// Campaign id (as in its file's `id`).
    #[arg(long, required = true)]
    campaign: Option<String>,
    #[arg(long, required = true)]
    out: Option<PathBuf>,
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

#[derive(Subcommand)]
enum ExportCommand {
    /// The timeline of the decode token a Plan run's record kept (its `timeline` surface):
    /// reads per extent, copies, acquires, compute; SVG or PNG by the name's extension.
    #[command(after_help = "Example:\n  sovereign export timeline --record results/f --out results/f-timeline.svg")]
    Timeline {
        #[arg(long)]
        record: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Print the token's summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn export_timeline(record: &std::path::Path, out: &std::path::Path, json: bool) -> Result<ExitCode> {
    let f = export::timeline::export(record, out)?;
    if json {
        print_json(&f.times)?;
    } else {
        let ms = |ns: u64| ns as f64 / 1e6;
        let (t, i) = (&f.times, &f.times.idle);
        println!(
            "decode token {}: {:.2} ms, {} reads; device busy {:.2} ms, idle {:.2} ms: compute {:.2}, expert matmuls {:.2}, copy {:.2}, Plan {:.2}, between tokens {:.2}; compute stalled on reads {:.2} ms",
            f.token,
            ms(t.wall_ns),
            t.reads,
            ms(t.busy_ns),
            ms(t.idle_ns),
            ms(i.compute_ns),
            ms(i.expert_compute_ns),
            ms(i.copy_ns),
            ms(i.plan_ns + i.submit_ns + i.wait_ns),
            ms(i.between_ns),
            ms(t.stalled_on_reads_ns)
        );
        println!("wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn export(a: ExportArgs) -> Result<ExitCode> {
    if let Some(ExportCommand::Timeline { record, out, json }) = &a.what {
        return export_timeline(record, out, *json);
    }
    let (Some(campaign), Some(out)) = (&a.campaign, &a.out) else { anyhow::bail!("export needs --campaign and --out") };
    let s = export::export(&a.results, campaign, out)?;
    if a.json {
        print_json(&s)?;
        return Ok(if s.floor_invalid.is_empty() && s.prefill_invalid.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    println!("{}: {} cells ({} sealed), {} pairs", s.campaign, s.cells, s.sealed, s.pairs);
    for f in &s.files {
        println!("wrote {}", f.display());
    }
    for c in &s.claims {
        println!("claim {c}");
    }
    println!("ledger {} (sealed)", s.ledger.display());
    // Anchored by the claim's digest: what a reader checks is then the claim as published.
    let exe = std::env::args().next().unwrap_or_else(|| "sovereign".into());
    for c in &s.claims {
        for verb in ["verify", "replay"] {
            println!("  {exe} {verb} --claim {c} --ledger {} --results {}", out.join("claims.json").display(), a.results.display());
        }
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
    if let Some(p) = &s.envelope {
        println!("bytes per second over the envelope: {}", interval(p));
    }
    for w in &s.walls {
        let secs = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} s"));
        println!(
            "complete wall {} over {}: {} ({} cells) against {} ({} cells): {}",
            w.arm,
            w.baseline,
            secs(w.arm_wall_s),
            w.arm_cells,
            secs(w.baseline_wall_s),
            w.baseline_cells,
            w.speedup.map_or("no ratio".to_string(), |x| format!("{x:.2}x faster"))
        );
    }
    for p in &s.prefill {
        match &p.ratio_to_floor {
            Some(r) => println!("prefill of {} over its floor: {}", p.arm, interval(r)),
            None => println!("prefill of {} over its floor: no ratio", p.arm),
        }
        if let (Some(b), Some(r)) = (&p.baseline, &p.baseline_over_arm) {
            println!("prefill of {b} over {}'s: {}", p.arm, interval(r));
        }
    }
    if !s.prefill_invalid.is_empty() {
        eprintln!(
            "error: prefill over its floor: invalid measurement ({} blocks): {}",
            s.prefill_invalid.len(),
            s.prefill_invalid.join("; ")
        );
    }
    if let Some(k) = &s.criterion {
        let a = &k.analysis;
        let what =
            format!("criterion mean {}{} of {} less {}'s >= {}", a.metric.file, a.metric.pointer, a.b.value, a.a.value, a.min_difference);
        match &k.judged {
            Ok(e) => println!("{what}: {}", e.show(a.min_difference)),
            Err(e) => {
                // A criterion that cannot be judged is a failed analysis, not a result.
                eprintln!("error: {what}: not judged: {e}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    if !s.floor_invalid.is_empty() {
        // An impossible figure is a failed measurement, not a result.
        eprintln!("error: ratio to floor: invalid measurement ({} blocks): {}", s.floor_invalid.len(), s.floor_invalid.join("; "));
        return Ok(ExitCode::from(1));
    }
    if !s.prefill_invalid.is_empty() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
