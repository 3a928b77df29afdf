//! `build-info`, `model forge|quantize` and `inventory`.

use super::print_json;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sovereign::digests;
use sovereign::engine::{self, QuantType};
use sovereign::forge::{self, Arch, Overrides, Preset};
use sovereign::gguf::set::SplitBy;
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
        /// The architecture (default: the preset's, qwen3next for `seed`, else qwen3moe).
        #[arg(long, value_parser = super::choices::parser::<Arch>())]
        arch: Option<Arch>,
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
        /// Multi-token-prediction (nextn) blocks after the trunk, as the loaders of qwen35moe,
        /// glm4moe, deepseek32, glm-dsa, mimo2, hy_v3, bailingmoe2 and exaone-moe take them
        /// (`generate --draft mtp` drafts with all but bailingmoe2's and exaone-moe's).
        #[arg(long, default_value_t = 0, value_name = "N")]
        mtp_layers: u64,
        /// Forge straight into a shard set of files of at most this much tensor data each
        /// (e.g. 2G), as gguf-split --split-max-size cuts one; --out is then the set's prefix
        /// (OUT-00001-of-0000N.gguf ...).
        #[arg(long, value_name = "BYTES", value_parser = sovereign::bounds::parse_bytes)]
        split_max_size: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Rewrite a model (one file or a shard set) as a shard set, as gguf-split does:
    /// OUT_PREFIX-00001-of-0000N.gguf ..., the first carrying the metadata.
    #[command(
        after_help = "Example:\n  sovereign model split models/small.gguf models/small-split --max-size 64M\n  sovereign inventory models/small-split-00001-of-00004.gguf"
    )]
    Split {
        input: PathBuf,
        out_prefix: PathBuf,
        /// At most this many tensors per shard.
        #[arg(long, value_name = "N", conflicts_with = "max_size", required_unless_present = "max_size")]
        max_tensors: Option<u64>,
        /// At most this much tensor data per shard (a larger tensor has a shard alone).
        #[arg(long, value_name = "BYTES", value_parser = sovereign::bounds::parse_bytes)]
        max_size: Option<u64>,
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
        ModelCommand::Forge {
            arch,
            preset,
            seed,
            out,
            layers,
            experts,
            top_k,
            embd,
            expert_ff,
            vocab,
            alignment,
            context,
            f16_router,
            tied_output,
            router_skew,
            mtp_layers,
            split_max_size,
            json,
        } => {
            let arch = arch.unwrap_or(preset.arch());
            let dims = preset.dims().with(&Overrides { layers, experts, top_k, embd, expert_ff, vocab, alignment, context })?;
            let split = split_max_size.map(SplitBy::Bytes);
            let out = match split {
                // The set's prefix: `--out m.gguf` and `--out m` both give m-00001-of-0000N.gguf.
                Some(_) => out.to_string_lossy().strip_suffix(".gguf").map_or(out.clone(), PathBuf::from),
                None => out,
            };
            if split.is_none() && out.symlink_metadata().is_ok() {
                bail!("{}: --out exists; forge never overwrites (remove it first)", out.display());
            }
            if let Some(p) = split.and_then(|_| existing_shard(&out)) {
                bail!("{}: exists; forge never overwrites (remove it first)", p.display());
            }
            let t = std::time::Instant::now();
            let mut shown = ForgeProgress::new();
            let variant = forge::Variant { f16_router, tied_output, router_skew, mtp_layers };
            let f = forge::forge_into(arch, dims, variant, seed, &out, split, &mut |d, t| shown.at(d, t))?;
            shown.finish();
            let out = f.shards.first().cloned().unwrap_or(out);
            if json {
                print_json(&f)?;
            } else {
                println!(
                    "{}{}: {} {} layers x {} experts (top-{}), {:.1} MiB in {:.1} s, sha256 {}",
                    out.display(),
                    if f.shards.len() > 1 { format!(" (and {} more shards)", f.shards.len() - 1) } else { String::new() },
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
        ModelCommand::Split { input, out_prefix, max_tensors, max_size, json } => {
            let by = match (max_tensors, max_size) {
                (Some(n), None) => SplitBy::Tensors(n),
                (None, Some(b)) => SplitBy::Bytes(b),
                _ => bail!("give one of --max-tensors and --max-size"),
            };
            let w = sovereign::gguf::set::split_model(&input, &out_prefix, by)?;
            // Read back as the set it must be, before it is reported.
            sovereign::gguf::Gguf::open_model(&w.shards[0].0)
                .with_context(|| format!("{}: the written set does not read back", w.shards[0].0.display()))?;
            if json {
                print_json(&serde_json::json!({
                    "sha256": w.sha256(),
                    "shards": w.shards.iter().map(|(p, h)| serde_json::json!({"path": p, "sha256": h})).collect::<Vec<_>>(),
                }))?;
            } else {
                for (p, h) in &w.shards {
                    println!("{}: sha256 {h}", p.display());
                }
                println!("set sha256 {} ({} shards)", w.sha256(), w.shards.len());
            }
        }
        ModelCommand::Quantize { ty, input, output, threads } => {
            Inventory::of(&input)?;
            // llama.cpp quantizes a set from its first file (into one output file).
            let input = sovereign::gguf::set::first_shard(&input)?;
            let tmp = output.with_extension("partial");
            // Claimed exclusively: a concurrent or interrupted run's file is refused, not reused.
            sovereign::util::claim_partial(&tmp)?;
            // What llama_model_quantize wrote is read back before it gets the final name: with a
            // source whose general.alignment is not GGUF's default it keeps the key but pads
            // tensors to 32 bytes, a file no reader (llama.cpp's included) can open.
            let done = engine::quantize(&input, &tmp, ty, threads)
                .and_then(|()| {
                    sovereign::gguf::Gguf::open(&tmp).map(drop).map_err(|e| {
                        anyhow::anyhow!(
                            "{}: llama_model_quantize wrote an invalid file ({e:#}); quantize a model forged with the default alignment",
                            input.display()
                        )
                    })
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
            "shards": shards(&c.fresh),
            "manifest_sha256": c.fresh.manifest_sha256,
            "cached_manifest_sha256": c.cached,
            "build_s": c.build_s,
            "ranges": c.fresh.files.iter().map(|f| 1 + f.body.tensors.len() + f.body.experts.len()).sum::<usize>(),
            "differ": c.differ,
        });
        if json {
            print_json(&out)?;
        } else {
            println!("{}: sha256 {}, manifest {} (re-hashed in {:.2} s)", inv.file, c.fresh.sha256, c.fresh.manifest_sha256, c.build_s);
            match &c.cached {
                None => println!("no manifest was cached under this identity: nothing to compare; cached now"),
                Some(m) if c.differ.is_empty() => println!("cached manifest {m}: every range agrees"),
                Some(m) => println!("cached manifest {m}: {} ranges differ: {}", c.differ.len(), c.differ.join(", ")),
            }
        }
        if !c.differ.is_empty() {
            eprintln!(
                "{}: {} ranges differ from the cached digest manifest; it was replaced by the fresh one",
                model.display(),
                c.differ.len()
            );
            return Ok(ExitCode::from(1));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let o = digests::obtain(model, &inv, None)?;
    let d = &o.digests;
    let header_bytes: u64 = d.files.iter().map(|f| f.body.header.len).sum();
    let tensors: usize = d.files.iter().map(|f| f.body.tensors.len()).sum();
    let experts: usize = d.files.iter().map(|f| f.body.experts.len()).sum();
    if json {
        print_json(&serde_json::json!({
            "file": inv.file,
            "sha256": d.sha256,
            "shards": shards(d),
            "manifest_sha256": d.manifest_sha256,
            "provenance": o.provenance,
            "cache_file": o.cache_file,
            "header_bytes": header_bytes,
            "tensors": tensors,
            "expert_extents": experts,
        }))?;
    } else {
        let how = match o.provenance.build_s {
            Some(s) => format!("built in {s:.2} s ({:.0} MB/s)", inv.file_bytes as f64 / s.max(1e-9) / 1e6),
            None => "reused (file identity unchanged)".into(),
        };
        println!("{}: sha256 {}", inv.file, d.sha256);
        if d.files.len() > 1 {
            for (s, f) in inv.shards.iter().zip(&d.files) {
                println!("shard      {} sha256 {}", s.file, f.body.sha256);
            }
        }
        println!("manifest   {} ({how})", d.manifest_sha256);
        println!("ranges     header {header_bytes} bytes, {tensors} tensors, {experts} expert extents");
        println!("cache      {}", o.cache_file.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Forging shown as it goes: a bar on a terminal, else a line per tenth on stderr (only for
/// models that take a while: 1 GiB and up).
struct ForgeProgress {
    bar: Option<indicatif::ProgressBar>,
    tenth: u64,
    started: std::time::Instant,
}

impl ForgeProgress {
    fn new() -> ForgeProgress {
        ForgeProgress { bar: None, tenth: 0, started: std::time::Instant::now() }
    }

    fn at(&mut self, done: u64, total: u64) {
        use std::io::IsTerminal;
        if total < 1 << 30 {
            return;
        }
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let b = indicatif::ProgressBar::new(total);
                b.set_style(
                    indicatif::ProgressStyle::with_template("forging {bar:30} {bytes}/{total_bytes} {bytes_per_sec}, ETA {eta}")
                        .expect("a valid template"),
                );
                b
            });
            bar.set_position(done);
        } else if done * 10 / total > self.tenth {
            self.tenth = done * 10 / total;
            let s = self.started.elapsed().as_secs_f64();
            eprintln!(
                "forging: {} of {} ({:.0} MB/s)",
                sovereign::bounds::show_bytes(done),
                sovereign::bounds::show_bytes(total),
                done as f64 / s.max(1e-9) / 1e6
            );
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// An existing file of a set `prefix` would be written as (any shard count).
fn existing_shard(prefix: &std::path::Path) -> Option<PathBuf> {
    let dir = prefix.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let stem = format!("{}-", prefix.file_name()?.to_string_lossy());
    std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).find(|p| {
        p.file_name().map(|n| n.to_string_lossy()).is_some_and(|n| n.starts_with(&stem) && n.contains("-of-") && n.ends_with(".gguf"))
    })
}

/// Each file's SHA-256 where the model is a shard set (null for one file).
fn shards(d: &digests::ModelDigests) -> Option<Vec<String>> {
    (d.files.len() > 1).then(|| d.shard_sha256())
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
    for &l in &inv.mtp_layers {
        let prefix = format!("blk.{l}.");
        let tensors = inv.tensors.iter().filter(|t| t.name.starts_with(&prefix)).count();
        let objects = inv.objects.iter().filter(|o| o.layer == l).count();
        println!("MTP        layer {l} (nextn block): {tensors} tensors, {objects} expert objects");
    }
    println!("extents    {} duplicates, {} overlaps", inv.extent_duplicates, inv.extent_overlaps);
    if inv.is_set() {
        for (i, s) in inv.shards.iter().enumerate() {
            println!("shard {:<4} {} ({} bytes, {} tensors)", i + 1, s.file, s.bytes, s.tensors);
        }
    }
    for t in &inv.tensors {
        let at = if inv.is_set() { format!("{}@{}", t.shard + 1, t.offset) } else { format!("@{}", t.offset) };
        println!("  {:<32} {:<6} {:>24} {:<14} {:>12}", t.name, t.ggml_type, format!("{:?}", t.shape), at, t.bytes);
    }
    Ok(ExitCode::SUCCESS)
}
