//! `build-info`, `model forge|quantize` and `inventory`.

use super::print_json;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sovereign::digests;
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
    #[command(after_help = "Example:\n  sovereign model forge --preset small --seed 7 --out models/small.gguf")]
    Forge {
        #[arg(long, value_parser = super::choices::parser::<Arch>(), default_value = "qwen3moe")]
        arch: Arch,
        #[arg(long, value_parser = super::choices::parser::<Preset>())]
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
        /// The trained context length (<arch>.context_length) in tokens; default 4096. Runs size
        /// their context to the work up to it.
        #[arg(long)]
        context: Option<u64>,
        /// Store every router (ffn_gate_inp) as F16, as some converters do.
        #[arg(long)]
        f16_router: bool,
        /// Leave out output.weight: the head is tied to token_embd.
        #[arg(long)]
        tied_output: bool,
        /// Skew every router toward a few experts: a Zipf exponent (0: nearly uniform, as
        /// forged routers are; 1.5 sends most selections of a layer to a tenth of its experts).
        #[arg(long, default_value_t = 0.0)]
        router_skew: f32,
        #[arg(long)]
        json: bool,
    },
    /// Quantize through llama.cpp's own llama_model_quantize.
    #[command(after_help = "Example:\n  sovereign model quantize --type q8_0 models/small.gguf models/small-q8_0.gguf")]
    Quantize {
        #[arg(long = "type", value_parser = super::choices::parser::<QuantType>())]
        ty: QuantType,
        input: PathBuf,
        output: PathBuf,
        #[arg(long, default_value_t = 0)]
        threads: i32,
    },
    /// Build (once per file identity) or show the model's digest manifest: the SHA-256 of
    /// every expert extent, every other tensor and the whole file. SOVEREIGN_CACHE (else
    /// $XDG_CACHE_HOME/sovereign, else ~/.cache/sovereign) holds it.
    #[command(after_help = "Example:\n  sovereign model digests models/small.gguf --check")]
    Digests {
        model: PathBuf,
        /// Re-hash everything and compare with the cached manifest.
        #[arg(long)]
        check: bool,
        #[arg(long)]
        json: bool,
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
        ModelCommand::Forge { arch, preset, seed, out, layers, experts, top_k, embd, expert_ff, vocab, alignment, context, f16_router, tied_output, router_skew, json } => {
            let dims = preset.dims().with(&Overrides { layers, experts, top_k, embd, expert_ff, vocab, alignment, context })?;
            if out.symlink_metadata().is_ok() {
                bail!("{}: --out exists; forge never overwrites (remove it first)", out.display());
            }
            let t = std::time::Instant::now();
            let f = forge::forge_variant(arch, dims, forge::Variant { f16_router, tied_output, router_skew }, seed, &out)?;
            if json {
                print_json(&f)?;
            } else {
                println!(
                    "{}: {} {} layers x {} experts (top-{}), {:.1} MiB in {:.1} s, sha256 {}",
                    out.display(),
                    arch.name(),
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
            // What llama_model_quantize wrote is read back before it gets the final name: with a
            // source whose general.alignment is not GGUF's default it keeps the key but pads
            // tensors to 32 bytes, a file no reader (llama.cpp's included) can open.
            let done = engine::quantize(&input, &tmp, ty, threads)
                .and_then(|()| {
                    sovereign::gguf::Gguf::open(&tmp)
                        .map(drop)
                        .map_err(|e| anyhow::anyhow!("{}: llama_model_quantize wrote an invalid file ({e:#}); quantize a model forged with the default alignment", input.display()))
                })
                .and_then(|()| sovereign::record::rename_noreplace(&tmp, &output));
            if let Err(e) = done {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            println!("{}: {:?}, {} bytes", output.display(), ty, std::fs::metadata(&output)?.len());
        }
        ModelCommand::Digests { model, check, json } => return digests(&model, check, json),
    }
    Ok(ExitCode::SUCCESS)
}

fn digests(model: &std::path::Path, check: bool, json: bool) -> Result<ExitCode> {
    let inv = Inventory::of(model)?;
    if check {
        let c = digests::check(model, &inv)?;
        let out = serde_json::json!({
            "file": inv.file,
            "sha256": c.fresh.sha256,
            "manifest_sha256": c.fresh_sha256,
            "cached_manifest_sha256": c.cached,
            "build_s": c.build_s,
            "ranges": 1 + c.fresh.tensors.len() + c.fresh.experts.len(),
            "differ": c.differ,
        });
        if json {
            print_json(&out)?;
        } else {
            println!("{}: sha256 {}, manifest {} (re-hashed in {:.2} s)", inv.file, c.fresh.sha256, c.fresh_sha256, c.build_s);
            match &c.cached {
                None => println!("no manifest was cached under this identity: nothing to compare; cached now"),
                Some(m) if c.differ.is_empty() => println!("cached manifest {m}: every range agrees"),
                Some(m) => println!("cached manifest {m}: {} ranges differ: {}", c.differ.len(), c.differ.join(", ")),
            }
        }
        if !c.differ.is_empty() {
            eprintln!("{}: {} ranges differ from the cached digest manifest; it was replaced by the fresh one", model.display(), c.differ.len());
            return Ok(ExitCode::from(1));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let o = digests::obtain(model, &inv, None)?;
    let b = &o.digests.body;
    if json {
        print_json(&serde_json::json!({
            "file": inv.file,
            "sha256": b.sha256,
            "manifest_sha256": o.digests.manifest_sha256,
            "provenance": o.provenance,
            "cache_file": o.cache_file,
            "header_bytes": b.header.len,
            "tensors": b.tensors.len(),
            "expert_extents": b.experts.len(),
        }))?;
    } else {
        let how = match o.provenance.build_s {
            Some(s) => format!("built in {s:.2} s ({:.0} MB/s)", b.file_bytes as f64 / s.max(1e-9) / 1e6),
            None => "reused (file identity unchanged)".into(),
        };
        println!("{}: sha256 {}", inv.file, b.sha256);
        println!("manifest   {} ({how})", o.digests.manifest_sha256);
        println!("ranges     header {} bytes, {} tensors, {} expert extents", b.header.len, b.tensors.len(), b.experts.len());
        println!("cache      {}", o.cache_file.display());
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
