//! `plan simulate`: the Plan's replacement policies replayed on recorded routes, against MIN.

use super::print_json;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sovereign::export::{curves_figure, Curve};
use sovereign::plan::options::{default_prompt_pass, per_pass};
use sovereign::plan::simulate::{self, Row};
use sovereign::plan::{Manifest, Passes};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum PlanCommand {
    /// Replay a generate record's routes through the Plan's replacement policies, without
    /// compute or I/O: per slot count, hits, loads and bytes moved, beside Belady's MIN (the
    /// fewest loads any policy could make with those slots, where every event fits them).
    #[command(after_help = "Example:\n  sovereign plan simulate --routes results/oracle --slots 8,16,32 --policy lru:S --policy zero")]
    Simulate(SimulateArgs),
}

#[derive(Args)]
pub struct SimulateArgs {
    /// A completed generate record (its routes surface).
    #[arg(long)]
    routes: PathBuf,
    /// Slot counts per MoE layer, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    slots: Vec<u32>,
    /// Replacement policy as `generate --policy` takes it, where `lru:S` retains as many
    /// objects as the slot count; repeat for several.
    #[arg(long = "policy", required = true)]
    policies: Vec<String>,
    /// The model file. Default: the file the record names, here, else the unchanged file of its
    /// SHA-256 that this machine hashed for its digest manifest.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw bytes moved versus slots (.svg or .png).
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Distinct experts per pass of a one-token ubatch (absent: the record's own, if it was a
    /// Plan run streamed in token passes; else one pass).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    token_pass: Option<u32>,
    /// Also estimate temporal amortization (`generate --draft`) for K = 1..=N drafts per
    /// traversal: the decode's positions replayed K + 1 to a traversal, every draft accepted,
    /// at the first slot count; expert bytes read per output against one-token decoding
    /// (a lower bound: rejected drafts only add).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=sovereign::bounds::MAX_DRAFT as i64))]
    draft_max: Option<u32>,
}

/// One K of the temporal-amortization estimate.
#[derive(serde::Serialize)]
struct DraftRow {
    policy: String,
    slots: u32,
    draft: u32,
    traversals: u64,
    outputs: u64,
    bytes_read: u64,
    bytes_per_output: f64,
    /// Bytes per output over one-token decoding's (K = 0).
    ratio: f64,
}

/// Decode bytes read per output for K = 0..=max: each replay of the whole record minus the
/// replay of its prompt alone (the same for every K).
fn draft_rows(
    rec: &sovereign::oracle::routes::Recorded,
    slots: u32,
    policies: &[String],
    max: u32,
    passes_at: impl Fn(&Manifest) -> Passes,
) -> Result<Vec<DraftRow>> {
    let from = rec.decode_from.context("the record decoded no output after its prompt: nothing to draft")?;
    let prompt: Vec<_> = rec.events.iter().filter(|e| e.ubatch < from).cloned().collect();
    let outputs = rec.events.iter().filter(|e| e.ubatch >= from).map(|e| e.ubatch).collect::<std::collections::BTreeSet<_>>().len() as u64;
    let manifest = || Manifest::new(&rec.inventory, slots, &[]);
    let mut rows = Vec::new();
    for template in policies {
        let p = simulate::policy_at(template, slots)?;
        let m = manifest()?;
        let passes = passes_at(&m);
        let base = simulate::replay(m, &p, &prompt, passes)?.q_run.physical_bytes;
        let mut one = None;
        for k in 0..=max {
            let events = simulate::drafted(&rec.events, from, k);
            let t = simulate::replay(manifest()?, &p, &events, passes)?;
            let bytes_read = t.q_run.physical_bytes - base;
            let per = bytes_read as f64 / outputs.max(1) as f64;
            let one = *one.get_or_insert(per);
            rows.push(DraftRow {
                policy: template.clone(),
                slots,
                draft: k,
                traversals: outputs.div_ceil(u64::from(k) + 1),
                outputs,
                bytes_read,
                bytes_per_output: per,
                ratio: per / one,
            });
        }
    }
    Ok(rows)
}

pub fn plan(c: PlanCommand) -> Result<ExitCode> {
    let PlanCommand::Simulate(a) = c;
    for p in &a.policies {
        simulate::policy_at(p, 1).with_context(|| "--policy")?;
    }
    if let Some(s) = a.slots.iter().find(|&&s| s == 0 || s > sovereign::bounds::MAX_SLOTS) {
        bail!("--slots {s}: expected 1..={}", sovereign::bounds::MAX_SLOTS);
    }
    if let Some(f) = a.figure.as_ref().filter(|f| !matches!(f.extension().and_then(|x| x.to_str()), Some("svg" | "png"))) {
        bail!("--figure {}: the name must end in .svg or .png", f.display());
    }
    let rec = sovereign::oracle::routes::load(&a.routes, a.model.as_deref())?;
    let inv = &rec.inventory;
    // The run's own passes: an event served in passes requests its groups apart. A prompt pass
    // the run sized from its slots is sized again at each slot count.
    let mut passes = rec.passes;
    if let Some(g) = a.token_pass {
        inv.expert_used_count.context("the model names no expert_used_count, which --token-pass needs")?;
        passes.token = Some(g);
    }
    let passes_at = |m: &Manifest| {
        let mut p = passes;
        if rec.prompt_pass_sized {
            p.prompt = default_prompt_pass(per_pass(m, 0), p.token);
        }
        p
    };
    let rows = simulate::simulate(|s, pins| Manifest::new(inv, s, pins), &a.slots, &a.policies, &rec.events, passes_at)?;
    let drafts = a.draft_max.map(|n| draft_rows(&rec, a.slots[0], &a.policies, n, passes_at)).transpose()?;
    if let Some(path) = &a.csv {
        write_csv(path, &rows).with_context(|| format!("--csv {}", path.display()))?;
    }
    if let Some(path) = &a.figure {
        let mut names = a.policies.clone();
        names.push("MIN".into());
        let curves: Vec<Curve> = names
            .iter()
            .map(|n| Curve {
                label: n.clone(),
                points: rows
                    .iter()
                    .filter(|r| r.policy == *n && r.refused.is_none())
                    .map(|r| (f64::from(r.slots), r.bytes_moved as f64 / 1e6))
                    .collect(),
                bound: *n == "MIN",
            })
            .collect();
        let title = format!("Bytes moved versus slots: {} layer events of {}", rec.events.len(), rec.model.display());
        curves_figure(path, &title, ("slots per MoE layer", "bytes moved (MB, logical)"), &curves)?;
    }
    if a.json {
        print_json(&serde_json::json!({
            "record": a.routes,
            "model": rec.model,
            "layer_events": rec.events.len(),
            "rows": rows,
            "drafted": drafts,
            "mtp_head": rec.mtp_head.map(|(layer, per)| serde_json::json!({ "layer": layer, "bytes_per_output": per })),
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}: {} layer events, model {}", a.routes.display(), rec.events.len(), rec.model.display());
    println!("{:<24} {:>6} {:>10} {:>10} {:>10} {:>14} {:>8}", "policy", "slots", "requests", "hits", "loads", "bytes moved", "vs MIN");
    for r in &rows {
        if let Some(why) = &r.refused {
            println!("{:<24} {:>6} refused: {why}", r.policy, r.slots);
            continue;
        }
        let min = rows.iter().find(|m| m.policy == "MIN" && m.slots == r.slots).map_or(0, |m| m.bytes_moved);
        let ratio = if min == 0 { "-".to_string() } else { format!("{:.3}", r.bytes_moved as f64 / min as f64) };
        println!("{:<24} {:>6} {:>10} {:>10} {:>10} {:>14} {:>8}", r.policy, r.slots, r.requests, r.hits, r.loads, r.bytes_moved, ratio);
    }
    if let Some(d) = &drafts {
        println!("\ndrafted decoding, every draft accepted (a lower bound on bytes per output):");
        println!("{:<24} {:>6} {:>6} {:>10} {:>16} {:>8}", "policy", "slots", "K", "traversals", "bytes per output", "vs K=0");
        for r in d {
            println!("{:<24} {:>6} {:>6} {:>10} {:>16.0} {:>8.3}", r.policy, r.slots, r.draft, r.traversals, r.bytes_per_output, r.ratio);
        }
        if let Some((layer, per)) = rec.mtp_head {
            println!("the run drafted with its MTP head (layer {layer}): the head's own reads, {per:.0} bytes per output as measured, come on top");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_csv(path: &std::path::Path, rows: &[Row]) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record([
        "policy",
        "slots",
        "requests",
        "hits",
        "loads",
        "prefetch_loads",
        "prefetch_hits",
        "bytes_moved",
        "bytes_read",
        "refused",
    ])?;
    for r in rows {
        let n = |v: u64| v.to_string();
        w.write_record([
            r.policy.clone(),
            n(u64::from(r.slots)),
            n(r.requests),
            n(r.hits),
            n(r.loads),
            n(r.prefetch_loads),
            n(r.prefetch_hits),
            n(r.bytes_moved),
            r.bytes_read.map(n).unwrap_or_default(),
            r.refused.clone().unwrap_or_default(),
        ])?;
    }
    w.flush()?;
    Ok(())
}
