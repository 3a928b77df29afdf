//! `verify` and `replay`: a claim checked offline from its sealed records.

use super::print_json;
use anyhow::Result;
use clap::Args;
use sovereign::claims;
use std::path::PathBuf;
use std::process::ExitCode;

/// A claim of a ledger and the directory of its records.
#[derive(Args)]
pub struct ClaimRef {
    /// ID@DIGEST as `export` prints it (or a plain ID from a sealed ledger).
    #[arg(long)]
    pub claim: String,
    /// Accept a plain claim ID from a ledger file that is not sealed: nothing then binds the
    /// claim to the published one.
    #[arg(long)]
    pub unanchored: bool,
    #[arg(long, default_value = claims::DEFAULT_LEDGER)]
    pub ledger: PathBuf,
    /// Where the claim's records are.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

#[derive(Args)]
pub struct ClaimArgs {
    #[command(flatten)]
    c: ClaimRef,
    #[arg(long)]
    json: bool,
    /// Pair records from different nodes (by default a pair must share its node).
    #[arg(long)]
    allow_mixed_nodes: bool,
    /// verify: also re-hash, in full, every model file the records name (DIR/<file>, or PATH
    /// for the models of its file name) and compare with the recorded sha256 and digest manifest.
    #[arg(long, value_name = "DIR|PATH")]
    rehash_models: Option<PathBuf>,
}

#[derive(Clone, Copy)]
pub enum Verb {
    Verify,
    Replay,
}

pub fn claim(a: ClaimArgs, verb: Verb) -> Result<ExitCode> {
    let c = &a.c;
    let how = claims::Checking { allow_mixed_nodes: a.allow_mixed_nodes, unanchored: c.unanchored };
    let (r, name) = match verb {
        Verb::Verify => {
            let mut r = claims::verify(&c.ledger, &c.claim, &c.results, how)?;
            if let Some(at) = &a.rehash_models {
                claims::rehash_models(&mut r, &c.ledger, &c.claim, &c.results, at)?;
            }
            (r, "verify")
        }
        Verb::Replay => {
            if a.rehash_models.is_some() {
                anyhow::bail!("--rehash-models: only `verify` re-hashes model files");
            }
            (claims::replay(&c.ledger, &c.claim, &c.results, how)?, "replay")
        }
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
