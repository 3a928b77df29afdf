//! `compare` and `fault-check`: the oracle's verdicts on records.

use super::{print_json, status};
use anyhow::Result;
use clap::Args;
use sovereign::oracle::{self, Outcome};
use sovereign::source::fault::FaultCell;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct CompareArgs {
    a: PathBuf,
    b: PathBuf,
    #[arg(long)]
    json: bool,
    /// The records were written by another tool and never sealed: compare them without a seal.
    /// Every record sovereign writes is sealed, so without it a record with no `manifest.json`
    /// is refused: a sealed record whose manifest was deleted looks the same.
    #[arg(long)]
    unsealed: bool,
}

#[derive(Args)]
pub struct FaultCheckArgs {
    #[arg(long, value_parser = super::choices::parser::<FaultCell>())]
    cell: FaultCell,
    record: PathBuf,
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn compare(a: CompareArgs) -> Result<ExitCode> {
    // A sealed record is compared only if it still verifies against its manifest, wherever it
    // was sealed (under its digest, or at its `--record` path).
    for d in [&a.a, &a.b] {
        if d.join(sovereign::record::MANIFEST_FILE).exists() {
            sovereign::record::verify_sealed(d)?;
        } else if !a.unsealed {
            anyhow::bail!(
                "{}: no seal ({} is missing): compare refuses a record it cannot verify; pass --unsealed for records another tool wrote and never sealed",
                d.display(),
                sovereign::record::MANIFEST_FILE
            );
        }
    }
    let cmp = oracle::compare(&a.a, &a.b)?;
    let exact = cmp.iter().all(|c| c.is_exact());
    if a.json {
        print_json(&serde_json::json!({ "exact": exact, "surfaces": cmp }))?;
        return Ok(status(exact));
    }
    for c in &cmp {
        match &c.outcome {
            Outcome::Exact { bytes } => println!("{:<9} exact ({bytes} bytes)", c.surface),
            Outcome::Differs { byte, unit, unit_byte, bytes_a, bytes_b } => println!(
                "{:<9} DIFFERS at byte {byte}: {} {unit}, byte {unit_byte} ({bytes_a} vs {bytes_b} bytes)",
                c.surface,
                oracle::unit_name(&c.surface)
            ),
            Outcome::Missing { in_a, in_b } => println!("{:<9} MISSING (in A: {in_a}, in B: {in_b})", c.surface),
        }
    }
    println!("{}", if exact { "all surfaces exact" } else { "NOT exact" });
    Ok(status(exact))
}

pub fn fault_check(a: FaultCheckArgs) -> Result<ExitCode> {
    let v = oracle::fault::validate(a.cell, &a.record, a.control.as_deref())?;
    if a.json {
        print_json(&v)?;
    } else {
        for c in &v.checks {
            println!("{} {:<36} {}", if c.passed { "ok  " } else { "FAIL" }, c.name, c.detail);
        }
        println!("{:?} ({:?}: {}): {}", v.cell, v.expect, v.invariant, if v.passed { "passes" } else { "FAILS" });
    }
    Ok(status(v.passed))
}
