//! `reproduce`: a claim run again from its pinned identity and judged against the original.

use super::claims::ClaimRef;
use super::{print_json, status};
use anyhow::{bail, Result};
use clap::Args;
use sovereign::reproduce::{self, Options};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ReproduceArgs {
    #[command(flatten)]
    c: ClaimRef,
    /// Where the reproduced records and the report are sealed [default: reproductions/CLAIM].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The campaign file the records were run from; its relative paths find models and prompts.
    #[arg(long)]
    campaign: Option<PathBuf>,
    /// A model by digest: SHA256=PATH (repeatable).
    #[arg(long, value_name = "SHA256=PATH")]
    model: Vec<String>,
    /// A prompt file by digest: SHA256=PATH (repeatable).
    #[arg(long, value_name = "SHA256=PATH")]
    prompt: Vec<String>,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    no_progress: bool,
    #[arg(long)]
    json: bool,
}

fn by_digest(flag: &str, given: &[String], into: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for g in given {
        let Some((d, p)) = g.split_once('=') else { bail!("--{flag} {g:?}: expected SHA256=PATH") };
        if d.len() != 64 || !d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) || p.is_empty() {
            bail!("--{flag} {g:?}: expected SHA256=PATH with 64 lowercase hex digits");
        }
        if into.insert(d.to_string(), PathBuf::from(p)).is_some_and(|old| old.as_path() != std::path::Path::new(p)) {
            bail!("--{flag} {d}: given twice with different paths");
        }
    }
    Ok(())
}

/// The claim's ID without its `@DIGEST` anchor.
fn claim_name(claim: &str) -> &str {
    claim.split_once('@').map_or(claim, |(n, _)| n)
}

pub fn reproduce(a: ReproduceArgs) -> Result<ExitCode> {
    let mut inputs = BTreeMap::new();
    by_digest("model", &a.model, &mut inputs)?;
    by_digest("prompt", &a.prompt, &mut inputs)?;
    let plain = |c: &str| !c.is_empty() && !c.starts_with('.') && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    let out = match a.out {
        Some(o) => o,
        None if plain(claim_name(&a.c.claim)) => PathBuf::from("reproductions").join(claim_name(&a.c.claim)),
        None => bail!("--claim {:?}: not a plain name, so there is no default --out; give one", a.c.claim),
    };
    let progress = super::progress::on_stderr(!a.no_progress && !a.json);
    let opts = Options {
        ledger: a.c.ledger,
        claim: a.c.claim,
        unanchored: a.c.unanchored,
        results: a.c.results,
        out,
        campaign: a.campaign,
        inputs,
        progress,
    };
    let r = reproduce::reproduce(&opts)?;
    if a.json {
        print_json(&r)?;
    } else {
        print!("{}", r.report.to_text());
        println!("report sealed: {}", r.sealed.display());
    }
    for j in r.report.assertions.iter().filter(|j| !j.holds) {
        eprintln!("reproduce failed: {}: original {}; reproduced {}", j.what, j.original, j.reproduced);
    }
    Ok(status(r.report.holds))
}
