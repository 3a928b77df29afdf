//! `build-info`, `model forge|quantize` and `inventory`.

use super::print_json;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sovereign::engine::{self, QuantType};
use sovereign::forge::{self, Arch, Overrides, Preset};
use sovereign::identity::build_identity;
use sovereign::inventory::Inventory;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct BuildInfoArgs {
    #[arg(long)]
    json: bool,
    /// Write the patched engine source tree this binary was built from as a tar file
    /// (what scripts/build-backend.sh builds a backend module from).
    #[arg(long, value_name = "FILE.tar[.gz]")]
    export_source: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Write a deterministic synthetic GGUF of a real architecture.
    Forge {
        #[arg(long, value_enum, default_value_t = Arch::Qwen3moe)]
        arch: Arch,
        #[arg(long, value_enum)]
        preset: Preset,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        layers: Option<u64>,
        #[arg(long)]
        experts: Option<u64>,
        #[arg(long)]
        top_k: Option<u64>,
        #[arg(long)]
        embd: Option<u64>,
        #[arg(long)]
        expert_ff: Option<u64>,
        #[arg(long)]
        vocab: Option<u64>,
        /// Tensor data alignment (general.alignment, a power of two); 4096 puts every expert of
        /// a 4096-multiple size on its own pages, so direct reads land straight in slots.
        #[arg(long)]
        alignment: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Quantize through llama.cpp's own llama_model_quantize.
    Quantize {
        #[arg(long = "type", value_enum)]
        ty: QuantType,
        input: PathBuf,
        output: PathBuf,
        #[arg(long, default_value_t = 0)]
        threads: i32,
    },
}

#[derive(Args)]
pub struct InventoryArgs {
    model: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn build_info(a: BuildInfoArgs) -> Result<ExitCode> {
    if let Some(to) = a.export_source {
        engine::backends::export_source(&to)?;
        eprintln!("{}: engine source written", to.display());
        return Ok(ExitCode::SUCCESS);
    }
    let id = build_identity()?;
    if a.json {
        print_json(&id)?;
        return Ok(ExitCode::SUCCESS);
    }
    let e = &id.engine;
    println!("sovereign {}", id.sovereign_version);
    println!("engine     {} {} (checksum {})", e.package, e.version, e.checksum);
    println!("tree       {}", e.tree_sha256);
    for p in &e.patches {
        println!("patch      {} {}", p.name, p.sha256);
    }
    println!("cmake      {}", e.cmake_options.join(" "));
    println!("binary     {}", id.binary_sha256);
    println!("cpu        {}", id.cpu_features.join(" "));
    for l in &id.libraries {
        println!("library    {} {} {}", l.name, l.sha256, l.path);
    }
    for d in &id.devices {
        println!("device     {} {} ({}, {} MiB)", d.kind, d.name, d.description, d.memory_total >> 20);
    }
    println!("gpu        {}", serde_json::to_string(&id.gpu)?);
    Ok(ExitCode::SUCCESS)
}

pub fn model(c: ModelCommand) -> Result<ExitCode> {
    match c {
        ModelCommand::Forge { arch, preset, seed, out, layers, experts, top_k, embd, expert_ff, vocab, alignment, json } => {
            let dims = preset.dims().with(&Overrides { layers, experts, top_k, embd, expert_ff, vocab, alignment })?;
            if out.symlink_metadata().is_ok() {
                bail!("{}: --out exists; forge never overwrites (remove it first)", out.display());
            }
            let t = std::time::Instant::now();
            let f = forge::forge(arch, dims, seed, &out)?;
            if json {
                print_json(&f)?;
            } else {
                println!(
                    "{}: {:?} {} layers x {} experts (top-{}), {:.1} MiB in {:.1} s, sha256 {}",
                    out.display(),
                    arch,
                    dims.layers,
                    dims.experts,
                    dims.top_k,
                    f.bytes as f64 / (1 << 20) as f64,
                    t.elapsed().as_secs_f64(),
                    f.sha256
                );
            }
        }
        ModelCommand::Quantize { ty, input, output, threads } => {
            Inventory::of(&input)?;
            let tmp = output.with_extension("partial");
            // Claimed exclusively: a concurrent or interrupted run's file is refused, not reused.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .with_context(|| format!("{}: cannot claim (another run is writing it, or one was interrupted)", tmp.display()))?;
            let done = engine::quantize(&input, &tmp, ty, threads).and_then(|()| sovereign::record::rename_noreplace(&tmp, &output));
            if let Err(e) = done {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            println!("{}: {:?}, {} bytes", output.display(), ty, std::fs::metadata(&output)?.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn inventory(a: InventoryArgs) -> Result<ExitCode> {
    let inv = Inventory::of(&a.model)?;
    if a.json {
        print_json(&inv)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} ({}), {} bytes", inv.file, inv.architecture, inv.file_bytes);
    println!("T_repr     {} bytes ({})", inv.t_repr_bytes, inv.t_repr_rule);
    println!("experts    {} bytes in {} objects over {} MoE layers", inv.expert_bytes, inv.objects.len(), inv.moe_layers.len());
    println!("non-expert {} bytes", inv.non_expert_bytes);
    println!("extents    {} duplicates, {} overlaps", inv.extent_duplicates, inv.extent_overlaps);
    for t in &inv.tensors {
        println!("  {:<32} {:<6} {:>24} @{:<12} {:>12}", t.name, t.ggml_type, format!("{:?}", t.shape), t.offset, t.bytes);
    }
    Ok(ExitCode::SUCCESS)
}
