//! The `sovereign` command line.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use sovereign::campaign;
use sovereign::engine::{self, ExecParams, QuantType};
use sovereign::export;
use sovereign::record::claims;
use sovereign::stats;
use sovereign::forge::{self, Arch, Overrides, Preset};
use sovereign::generate::{self, GenerateSpec};
use sovereign::identity::build_identity;
use sovereign::inventory::Inventory;
use sovereign::oracle::{self, Outcome};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sovereign", version, about = "LLM inference beyond full memory residency, with proof of what happened")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the identity of this build: engine pin, tree digest, patches, binary digest.
    BuildInfo {
        #[arg(long)]
        json: bool,
    },
    /// Make or convert models.
    #[command(subcommand)]
    Model(ModelCommand),
    /// List a model's tensors, T_repr and expert objects (the file is validated first).
    Inventory {
        model: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Greedy generation with every oracle surface recorded.
    Generate(GenerateArgs),
    /// Compare two records surface by surface; exit 0 only if every surface is exact.
    Compare {
        a: PathBuf,
        b: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Preregistered campaigns: check, run unattended, status, resume.
    #[command(subcommand)]
    Campaign(CampaignCommand),
    /// Re-hash every file of a claim's records and check its assertions offline.
    Verify(ClaimArgs),
    /// Recompute a claim's summaries (ratios, intervals, predicates) from raw operands.
    Replay(ClaimArgs),
    /// Statistics over tables of measurements.
    #[command(subcommand)]
    Stats(StatsCommand),
    /// Write a campaign's records as CSV tables, a pair-ratio figure and a draft claim ledger.
    Export {
        /// Campaign id (as in its file's `id`).
        #[arg(long)]
        campaign: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "results")]
        results: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum CampaignCommand {
    /// Check a campaign file: typos and wrong types as FILE:line:column: message.
    Check {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Preregister (freeze) the campaign, then run every cell unattended.
    Run(CampaignRunArgs),
    /// Continue a preregistered campaign after an interruption.
    Resume(CampaignRunArgs),
    /// Show each cell's state from the journal.
    Status {
        file: PathBuf,
        #[arg(long, default_value = "results")]
        results: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of campaign files.
    Schema,
}

#[derive(Args)]
struct CampaignRunArgs {
    file: PathBuf,
    /// Where records and campaign state live.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    no_progress: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ClaimArgs {
    #[arg(long)]
    claim: String,
    #[arg(long, default_value = sovereign::record::claims::DEFAULT_LEDGER)]
    ledger: PathBuf,
    #[arg(long, default_value = "results")]
    results: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum StatsCommand {
    /// Paired geometric ratio b/a and paired-log Student-t interval (df = n - 1) of two columns.
    Pairs {
        #[arg(long)]
        csv: PathBuf,
        /// Denominator column.
        #[arg(long)]
        a: String,
        /// Numerator column.
        #[arg(long)]
        b: String,
        #[arg(long, default_value_t = 0.95)]
        level: f64,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
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
struct GenerateArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, conflicts_with = "prompt_file", required_unless_present = "prompt_file")]
    prompt: Option<String>,
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    #[arg(long, default_value_t = 64)]
    n_predict: u32,
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// Context size in tokens.
    #[arg(long, default_value_t = 4096)]
    ctx: u32,
    /// Logical and physical batch size (fixed on every arm: batch size changes kernels).
    #[arg(long, default_value_t = 512)]
    batch: u32,
    #[arg(long)]
    flash_attn: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// How experts are held; only `resident` (stock llama.cpp path) exists in this build.
    #[arg(long, default_value = "resident", value_parser = ["resident"])]
    experts: String,
    /// Record directory (must not exist).
    #[arg(long)]
    record: PathBuf,
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`sovereign inventory M | head`), like other Unix tools.
    // SAFETY: setting a signal disposition before any threads start.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::BuildInfo { json } => {
            let id = build_identity()?;
            if json {
                print_json(&id)?;
            } else {
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
            }
        }
        Command::Model(ModelCommand::Forge { arch, preset, seed, out, layers, experts, top_k, embd, expert_ff, vocab, json }) => {
            let dims = preset.dims().with(&Overrides { layers, experts, top_k, embd, expert_ff, vocab })?;
            let t = std::time::Instant::now();
            let f = forge::forge(arch, dims, seed, &out)?;
            if json {
                print_json(&f)?;
            } else {
                let secs = t.elapsed().as_secs_f64();
                println!(
                    "{}: {:?} {} layers x {} experts (top-{}), {:.1} MiB in {:.1} s, sha256 {}",
                    out.display(),
                    arch,
                    dims.layers,
                    dims.experts,
                    dims.top_k,
                    f.bytes as f64 / (1 << 20) as f64,
                    secs,
                    f.sha256
                );
            }
        }
        Command::Model(ModelCommand::Quantize { ty, input, output, threads }) => {
            Inventory::of(&input)?;
            let tmp = output.with_extension("partial");
            engine::quantize(&input, &tmp, ty, threads)?;
            std::fs::rename(&tmp, &output).with_context(|| format!("renaming into {}", output.display()))?;
            println!("{}: {:?}, {} bytes", output.display(), ty, std::fs::metadata(&output)?.len());
        }
        Command::Inventory { model, json } => {
            let inv = Inventory::of(&model)?;
            if json {
                print_json(&inv)?;
            } else {
                println!("{} ({}), {} bytes", inv.file, inv.architecture, inv.file_bytes);
                println!("T_repr     {} bytes ({})", inv.t_repr_bytes, inv.t_repr_rule);
                println!("experts    {} bytes in {} objects over {} MoE layers", inv.expert_bytes, inv.objects.len(), inv.moe_layers.len());
                println!("non-expert {} bytes", inv.non_expert_bytes);
                println!("extents    {} duplicates, {} overlaps", inv.extent_duplicates, inv.extent_overlaps);
                for t in &inv.tensors {
                    println!("  {:<32} {:<6} {:>24} @{:<12} {:>12}", t.name, t.ggml_type, format!("{:?}", t.shape), t.offset, t.bytes);
                }
            }
        }
        Command::Generate(a) => return generate_cmd(a),
        Command::Compare { a, b, json } => {
            let cmp = oracle::compare(&a, &b)?;
            let exact = cmp.iter().all(|c| c.is_exact());
            if json {
                print_json(&serde_json::json!({ "exact": exact, "surfaces": cmp }))?;
            } else {
                for c in &cmp {
                    match &c.outcome {
                        Outcome::Exact { bytes } => println!("{:<9} exact ({bytes} bytes)", c.surface),
                        Outcome::Differs { byte, unit, unit_byte, bytes_a, bytes_b } => println!(
                            "{:<9} DIFFERS at byte {byte}: {} {unit}, byte {unit_byte} ({bytes_a} vs {bytes_b} bytes)",
                            c.surface,
                            oracle::unit_name(&c.surface)
                        ),
                        Outcome::Missing { in_a, in_b } => {
                            println!("{:<9} MISSING (in A: {in_a}, in B: {in_b})", c.surface)
                        }
                    }
                }
                println!("{}", if exact { "all surfaces exact" } else { "NOT exact" });
            }
            if !exact {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Campaign(c) => return campaign_cmd(c),
        Command::Verify(a) => return claim_cmd(a, "verify"),
        Command::Replay(a) => return claim_cmd(a, "replay"),
        Command::Stats(StatsCommand::Pairs { csv, a, b, level, json }) => {
            let (labels, xa, xb) = stats::read_pairs_csv(&csv, &a, &b)?;
            let r = stats::paired_ratio(&labels, &xa, &xb, level)?;
            if json {
                print_json(&r)?;
            } else {
                print!("{}", r.to_text(&a, &b));
            }
        }
        Command::Export { campaign, out, results, json } => {
            let s = export::export(&results, &campaign, &out)?;
            if json {
                print_json(&s)?;
            } else {
                println!("{}: {} cells ({} sealed), {} pairs", s.campaign, s.cells, s.sealed, s.pairs);
                for f in &s.files {
                    println!("wrote {}", f.display());
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn campaign_cmd(c: CampaignCommand) -> Result<ExitCode> {
    match c {
        CampaignCommand::Check { file, json } => {
            let problems = campaign::check(&file)?;
            if json {
                print_json(&serde_json::json!({ "file": file, "ok": problems.is_empty(), "problems": problems }))?;
            } else if problems.is_empty() {
                let l = campaign::load(&file)?;
                println!("{}: ok, campaign {} ({} arms, {} cells), digest {}", file.display(), l.id(), l.spec.arms.len(), campaign::expand(&l.spec).len(), l.digest);
            }
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("{p}");
                }
                return Ok(ExitCode::from(1));
            }
        }
        CampaignCommand::Run(a) => return campaign_run(a, campaign::RunMode::Run),
        CampaignCommand::Resume(a) => return campaign_run(a, campaign::RunMode::Resume),
        CampaignCommand::Status { file, results, json } => {
            let l = campaign::load(&file)?;
            let r = campaign::status(&l, &results)?;
            if json {
                print_json(&r)?;
            } else {
                print!("{}", r.to_text());
            }
        }
        CampaignCommand::Schema => print!("{}", campaign::schema_json()),
    }
    Ok(ExitCode::SUCCESS)
}

fn campaign_run(a: CampaignRunArgs, mode: campaign::RunMode) -> Result<ExitCode> {
    let l = campaign::load(&a.file)?;
    let exec = campaign::ProcessExecutor::current(&l.base)?;
    let opts = campaign::RunOptions { results: a.results, mode, progress: !a.no_progress && !a.json };
    let s = campaign::run(&l, &exec, &opts)?;
    if a.json {
        print_json(&s)?;
    } else {
        println!(
            "campaign {} ({}): {} cells, {} sealed, {} skipped, {} abandoned; this run: {} ran, {} interrupted attempts discarded",
            s.campaign, s.digest, s.cells, s.sealed, s.skipped, s.abandoned, s.ran, s.discarded
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn claim_cmd(a: ClaimArgs, verb: &str) -> Result<ExitCode> {
    let r = if verb == "verify" {
        claims::verify(&a.ledger, &a.claim, &a.results)?
    } else {
        claims::replay(&a.ledger, &a.claim, &a.results)?
    };
    if a.json {
        print_json(&r)?;
    } else {
        print!("{}", r.to_text(verb));
    }
    if !r.ok {
        for f in r.failures() {
            eprintln!("{verb} failed: {f}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn read_prompt(a: &GenerateArgs) -> Result<Vec<u8>> {
    match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => Ok(p.as_bytes().to_vec()),
        (None, Some(f)) => std::fs::read(f).with_context(|| format!("{}: cannot read prompt file", f.display())),
        (None, None) => bail!("give --prompt or --prompt-file"),
    }
}

fn generate_cmd(a: GenerateArgs) -> Result<ExitCode> {
    if a.threads < 1 {
        bail!("--threads must be at least 1");
    }
    if a.batch < 1 {
        bail!("--batch must be at least 1");
    }
    let spec = GenerateSpec {
        model: a.model.clone(),
        prompt: read_prompt(&a)?,
        n_predict: a.n_predict,
        exec: ExecParams { n_ctx: a.ctx, n_batch: a.batch, n_ubatch: a.batch, threads: a.threads, flash_attn: a.flash_attn },
        ignore_eos: a.ignore_eos,
        record: a.record.clone(),
    };
    let s = generate::run(&spec)?;
    if a.json {
        print_json(&serde_json::json!({
            "record": s.record,
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "timing": s.timing,
            "digests": s.digests.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("record    {}", display(&s.record));
    println!("tokens    {} prompt + {} generated", s.prompt_tokens, s.generated_tokens);
    println!(
        "speed     prefill {:.1} tok/s, decode {:.1} tok/s (load {:.2} s)",
        s.timing.prefill_tokens_per_s, s.timing.decode_tokens_per_s, s.timing.load_s
    );
    println!("response  {:?}", s.response);
    for (name, d) in &s.digests {
        println!("sha256    {name:<9} {d}");
    }
    println!("routes    {} events", s.routes.len());
    for (layer, distinct, total, top) in generate::route_summary(&s.routes) {
        println!("  layer {layer:>3}: {distinct:>4} distinct experts over {total:>6} selections, busiest {:.1}%", top * 100.0);
    }
    Ok(ExitCode::SUCCESS)
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
