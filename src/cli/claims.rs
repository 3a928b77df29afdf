//! `verify` and `replay`: a claim checked offline from its sealed records.

use super::print_json;
use anyhow::Result;
use clap::Args;
use sovereign::claims;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ClaimArgs {
    #[arg(long)]
    claim: String,
    #[arg(long, default_value = claims::DEFAULT_LEDGER)]
    ledger: PathBuf,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
    /// Pair records from different nodes (by default a pair must share its node).
    #[arg(long)]
    allow_mixed_nodes: bool,
}

#[derive(Clone, Copy)]
pub enum Verb {
    Verify,
    Replay,
}

pub fn claim(a: ClaimArgs, verb: Verb) -> Result<ExitCode> {
    let (r, name) = match verb {
        Verb::Verify => (claims::verify(&a.ledger, &a.claim, &a.results, a.allow_mixed_nodes)?, "verify"),
        Verb::Replay => (claims::replay(&a.ledger, &a.claim, &a.results, a.allow_mixed_nodes)?, "replay"),
    };
    if a.json {
        print_json(&r)?;
    } else {
        print!("{}", r.to_text(name));
    }
    if !r.ok {
        for f in r.failures() {
            eprintln!("{name} failed: {f}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
