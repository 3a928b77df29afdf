//! `certificate show|check|schema`.

use super::print_json;
use anyhow::{Context, Result};
use clap::Subcommand;
use sovereign::bounds::parse_bytes;
use sovereign::certificate;
use sovereign::claims;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum CertificateCommand {
    /// The certificate of a generate record (plain or sealed), or of every record a claim of the
    /// ledger names, evaluated. Exit 0 when it could be built, whatever its verdicts; records of
    /// different binaries are refused (exit 2).
    #[command(after_help = "Example:\n  sovereign certificate show results/f --oracle results/oracle --g-decl 0 --g-phys 0 --r-policy 0")]
    Show {
        /// A record directory, or a claim id of the ledger.
        record: String,
        /// The claim ledger, when RECORD is a claim id.
        #[arg(long, default_value = "claims/ledger.json")]
        ledger: PathBuf,
        /// Where sealed records live, when RECORD is a claim id.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// A same-build record to compare against for E (e.g. a resident run).
        #[arg(long)]
        oracle: Option<PathBuf>,
        /// R_policy: the declared host reserve for predicate (1) (`512M`, bytes).
        #[arg(long, value_parser = parse_bytes)]
        r_policy: Option<u64>,
        /// G_decl where the record audited no GPU allowance (e.g. 0 for a CPU-only build).
        #[arg(long, value_parser = parse_bytes)]
        g_decl: Option<u64>,
        /// G_phys where the record observed no board.
        #[arg(long, value_parser = parse_bytes)]
        g_phys: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Check and evaluate a hand-written certificate (YAML) about any system; fields may say
    /// `insufficient public evidence`. Problems as FILE:line:column: message (exit 1).
    #[command(after_help = "Example:\n  sovereign certificate check certificates/seed-c1.yaml")]
    Check {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of certificates.
    #[command(after_help = "Example:\n  sovereign certificate schema > schemas/certificate.schema.json")]
    Schema,
}

pub fn certificate(c: CertificateCommand) -> Result<ExitCode> {
    let (cert, json, file) = match c {
        CertificateCommand::Show { record, ledger, results, oracle, r_policy, g_decl, g_phys, json } => {
            let opts = certificate::RecordOptions { oracle, r_policy, g_decl, g_phys };
            if Path::new(&record).exists() {
                (certificate::from_record(Path::new(&record), &opts)?, json, None)
            } else {
                return of_claim(&record, &ledger, &results, &opts, json);
            }
        }
        CertificateCommand::Check { file, json } => match certificate::load(&file) {
            Ok(c) => (c, json, Some(file)),
            Err(e) => {
                if json {
                    let problems: Vec<String> = format!("{e}").lines().map(str::to_string).collect();
                    print_json(&serde_json::json!({ "file": file, "ok": false, "problems": problems }))?;
                } else {
                    eprintln!("{e}");
                }
                return Ok(ExitCode::from(1));
            }
        },
        CertificateCommand::Schema => {
            print!("{}", certificate::schema_json());
            return Ok(ExitCode::SUCCESS);
        }
    };
    let eval = certificate::evaluate(&cert);
    if json {
        let mut v = serde_json::json!({ "certificate": cert, "evaluation": eval });
        if let Some(f) = file {
            v["file"] = serde_json::json!(f);
            v["ok"] = serde_json::json!(true);
        }
        print_json(&v)?;
    } else {
        print!("{}", certificate::eval::to_text(&cert, &eval));
    }
    Ok(ExitCode::SUCCESS)
}

/// The certificate of every record a claim names, one per record: evidence of different
/// records is shown side by side, never pooled.
fn of_claim(id: &str, ledger: &Path, results: &Path, opts: &certificate::RecordOptions, json: bool) -> Result<ExitCode> {
    let l = claims::load_ledger(ledger)
        .with_context(|| format!("`{id}` is neither a record directory nor readable as a claim of {}", ledger.display()))?;
    let claim = l.claims.get(id).with_context(|| format!("{}: no claim `{id}`", ledger.display()))?;
    let mut out = serde_json::Map::new();
    for (alias, digest) in &claim.records {
        let cert = certificate::from_record(&results.join(digest), opts)?;
        let eval = certificate::evaluate(&cert);
        if json {
            out.insert(alias.clone(), serde_json::json!({ "record": digest, "certificate": cert, "evaluation": eval }));
        } else {
            println!("== {alias} ({digest})");
            print!("{}", certificate::eval::to_text(&cert, &eval));
        }
    }
    if json {
        print_json(&serde_json::json!({ "claim": id, "statement": claim.statement, "records": out }))?;
    }
    Ok(ExitCode::SUCCESS)
}
