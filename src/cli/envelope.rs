//! `envelope`: the device's cold-read ceiling.

use super::print_json;
use anyhow::{bail, Context, Result};
use clap::Args;
use sovereign::envelope;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct EnvelopeArgs {
    #[arg(long)]
    file: PathBuf,
    /// Bytes read per cell (each cell reads its own region of the file where it fits).
    #[arg(long, default_value_t = 64 << 20)]
    bytes_per_cell: u64,
    /// Write the cells as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw the envelope (log-log, one line per queue depth) here: `.svg` or `.png`.
    #[arg(long)]
    figure: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn envelope(a: EnvelopeArgs) -> Result<ExitCode> {
    if let Some(f) = &a.figure {
        if !matches!(f.extension().and_then(|x| x.to_str()), Some("svg" | "png")) {
            bail!("--figure {}: the name must end in .svg or .png", f.display());
        }
    }
    let e = envelope::measure_envelope(
        &a.file,
        a.bytes_per_cell,
        envelope::BLOCK_SIZES,
        envelope::DEPTHS,
        &[envelope::Pattern::Plain],
        envelope::Rereads::Skipped,
    )?;
    if let Some(out) = &a.csv {
        std::fs::write(out, envelope::to_csv(&e)).with_context(|| format!("{}", out.display()))?;
    }
    if let Some(f) = &a.figure {
        sovereign::export::envelope_figure(f, &e)?;
    }
    if a.json {
        print_json(&e)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:>9} {:>6} {:>10} {:>10}", "block", "depth", "MiB/s", "IOPS");
    for c in &e.cells {
        println!("{:>9} {:>6} {:>10.1} {:>10.0}", c.block_bytes, c.depth, c.mib_per_s, c.iops);
    }
    let c = &e.ceiling;
    println!("ceiling: {:.1} MiB/s at block {} depth {}", c.mib_per_s, c.block_bytes, c.depth);
    Ok(ExitCode::SUCCESS)
}
