//! `cell`: the worker a contained run or a campaign starts. It runs one cell spec in this
//! process and prints its summary, whatever the cell's kind.

use super::print_json;
use anyhow::Result;
use clap::Args;
use sovereign::cell::{self, Done};
use sovereign::record::format::SessionRecord;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct CellArgs {
    /// The cell spec (JSON), as a contained run or a campaign writes it; `-` reads it from
    /// standard input.
    spec: PathBuf,
    /// Print the summary for a person instead of as JSON.
    #[arg(long, hide = true)]
    human: bool,
}

/// The worker: the summary on stdout (JSON unless `--human`), the error (if any) as one line
/// on stderr.
pub fn cell(a: CellArgs) -> Result<ExitCode> {
    print_done(&cell::worker(&a.spec)?, !a.human)?;
    Ok(ExitCode::SUCCESS)
}

fn print_done(done: &Done, json: bool) -> Result<()> {
    match done {
        Done::Generate(s) if json => print_json(&serde_json::json!({
            "record": s.record,
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "timing": s.timing,
            "digests": s.digests.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        })),
        Done::Generate(s) => {
            println!("record    {}", s.record.display());
            super::print_tokens_and_speed(s.prompt_tokens, s.generated_tokens, &s.timing);
            println!("response  {:?}", s.response);
            for (name, d) in &s.digests {
                println!("sha256    {name:<9} {d}");
            }
            println!("routes    {} events", s.routes.len());
            for (layer, distinct, total, top) in sovereign::generate::route_summary(&s.routes) {
                println!("  layer {layer:>3}: {distinct:>4} distinct experts over {total:>6} selections, busiest {:.1}%", top * 100.0);
            }
            Ok(())
        }
        Done::Session { record, session } if json => {
            let mut v = super::session_json(session)?;
            v["record"] = serde_json::to_value(record)?;
            print_json(&v)
        }
        Done::Session { record, session } => {
            print_session(record, session);
            Ok(())
        }
        Done::Refine(s) => super::refine::print_summary(s, json),
        Done::Measure(sovereign::measure::Summary::Envelope(r)) => print_json(r),
        Done::Measure(sovereign::measure::Summary::ReadReplay(r)) => print_json(r),
    }
}

fn print_session(record: &std::path::Path, s: &SessionRecord) {
    println!("record    {}", record.display());
    println!(
        "session   {} requests, between {}, load {:.2} s, requests+resets {:.2} s",
        s.requests.len(),
        s.between.map_or("-", sovereign::session::Between::name),
        s.timing.map_or(0.0, |t| t.load_s),
        s.timing.map_or(0.0, |t| t.requests_wall_s)
    );
    for r in &s.requests {
        let served = r.served.map_or(String::new(), |v| format!(", read {} bytes, {} hits / {} misses", v.read_bytes, v.hits, v.misses));
        let score = r.score.map_or(String::new(), |v| format!(", F1 {:.3} EM {:.0}", v.f1, v.exact_match));
        println!(
            "  {:<16} {} {} + {} tokens, {:.2} s ({:.3} s before){served}{score}",
            r.id,
            r.outcome.name(),
            r.prompt_tokens,
            r.generated_tokens,
            r.wall_s,
            r.between_s
        );
    }
    if let Some(a) = s.scores {
        println!("scores    {} scored: F1 {:.4}, exact match {:.4}", a.scored, a.f1, a.exact_match);
    }
    if let Some(l) = s.ledger {
        println!(
            "ledger    {} requests, {} resets ({} cold), epoch {}, balanced {}",
            l.requests, l.resets, l.cold_resets, l.epoch, l.balanced
        );
    }
}
