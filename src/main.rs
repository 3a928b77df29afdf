//! The `sovereign` command line.

mod refine_cli;

use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use sovereign::campaign;
use sovereign::certificate;
use sovereign::engine::{self, ExecParams, QuantType};
use sovereign::export;
use sovereign::record::claims;
use sovereign::stats;
use sovereign::forge::{self, Arch, Overrides, Preset};
use sovereign::generate::{self, GenerateSpec};
use sovereign::identity::build_identity;
use sovereign::inventory::Inventory;
use sovereign::oracle::{self, Outcome};
use sovereign::plan::engine::{PlanOptions, PlanSource, SourceKind};
use sovereign::bounds::parse_bytes;
use sovereign::source::fault::FaultCell;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sovereign", version, about = "LLM inference beyond full memory residency, with proof of what happened")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Directory of extra ggml backend modules (libggml-*.so, e.g. libggml-cuda.so) to load;
    /// also SOVEREIGN_BACKEND_DIR.
    #[arg(long, global = true)]
    backend_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the identity of this build: engine pin, tree digest, patches, binary digest.
    BuildInfo {
        #[arg(long)]
        json: bool,
        /// Write the patched engine source tree this binary was built from as a tar file
        /// (what scripts/build-backend.sh builds a backend module from).
        #[arg(long, value_name = "FILE.tar[.gz]")]
        export_source: Option<PathBuf>,
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
    /// Cold O_DIRECT read bandwidth by block size x queue depth (io_uring); the best cell is the
    /// device ceiling.
    Envelope {
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
    },
    /// Teacher-force a reference's greedy trajectories through a candidate: per-position top-1
    /// margins and agreement, AUROC of margin as a disagreement predictor, escalation share.
    Margins(refine_cli::MarginsArgs),
    /// Margin-gated deferred refinement: a resident base generates, a higher-bit verifier
    /// checks deferred decisions in windows and rolls back flips.
    Refine(refine_cli::RefineArgs),
    /// Check a record against the validator of its fault cell (seed 000 Table 7); recoverable
    /// cells are compared with the no-fault control record.
    FaultCheck {
        #[arg(long, value_enum)]
        cell: FaultCell,
        record: PathBuf,
        #[arg(long)]
        control: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
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
    /// Certificates C = (I, B, A, E, L): predicates (1)-(3) and claim classes R, W, E[E,h], L[F].
    #[command(subcommand)]
    Certificate(CertificateCommand),
    /// Re-hash every file of a claim's records and check its assertions and fault validations offline.
    Verify(ClaimArgs),
    /// Recompute a claim's summaries (ratios, intervals, predicates, fault validations) from raw operands.
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

#[derive(Subcommand)]
enum CertificateCommand {
    /// The certificate of a generate record (plain or sealed), or of every record a claim of the
    /// ledger names, evaluated. Exit 0 when it could be built, whatever its verdicts; records of
    /// different binaries are refused (exit 2).
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
    Check {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of certificates.
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

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Experts {
    Resident,
    Plan,
    /// Resident, with the expert tensors kept in host memory by buffer override (`--cpu-moe`).
    Host,
}

/// How the Plan serves experts from storage.
#[derive(Args)]
struct PlanArgs {
    /// Slots per MoE layer (plan).
    #[arg(long, default_value_t = 8)]
    slots: u32,
    /// Replacement policy (plan): `zero`, `lru:K`, `pin:L/E,...`, combined with `+`, and
    /// `+prefetch` for next-layer prefetch.
    #[arg(long, default_value = "zero")]
    policy: String,
    /// How expert bytes are read (plan): p = buffered pread, d = blocking O_DIRECT with one
    /// window, f = io_uring O_DIRECT with --windows windows and --depth reads in flight.
    #[arg(long, value_enum, default_value_t = SourceKind::F)]
    source: SourceKind,
    #[arg(long, default_value_t = 8)]
    windows: u32,
    #[arg(long, default_value_t = 8)]
    depth: u32,
    /// Layer buffers (plan): 0 gives every layer its own slot pools; 2 streams layer by layer
    /// through two shared, alternating buffers (layer i uses buffer i mod 2).
    #[arg(long, default_value_t = 0)]
    layer_buffers: u32,
}

impl PlanArgs {
    /// Refuses values outside the shared bounds, and a policy that does not parse.
    fn check(&self) -> Result<()> {
        sovereign::bounds::PlanParams { slots: self.slots, windows: self.windows, depth: self.depth, layer_buffers: self.layer_buffers }.check()?;
        self.policy.parse::<sovereign::plan::PolicySpec>().context("--policy")?;
        Ok(())
    }

    /// The plan flags given on the command line (resident runs refuse them).
    fn given(m: &clap::ArgMatches) -> Vec<&'static str> {
        ["slots", "policy", "source", "windows", "depth", "layer_buffers", "fault"]
            .into_iter()
            .filter(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
            .collect()
    }

    fn options(&self, fault: FaultCell) -> PlanOptions {
        PlanOptions {
            slots: self.slots,
            policy: self.policy.clone(),
            source: self.source,
            windows: self.windows,
            depth: self.depth,
            layer_buffers: self.layer_buffers,
            fault,
        }
    }

    /// The same options as command-line arguments.
    fn args(&self) -> Vec<std::ffi::OsString> {
        let source = match self.source {
            SourceKind::P => "p",
            SourceKind::D => "d",
            SourceKind::F => "f",
        };
        [
            ("--slots", self.slots.to_string()),
            ("--policy", self.policy.clone()),
            ("--source", source.to_string()),
            ("--windows", self.windows.to_string()),
            ("--depth", self.depth.to_string()),
            ("--layer-buffers", self.layer_buffers.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.into(), v.into()])
        .collect()
    }
}

/// How a run is contained: a memory cgroup, its limit, observers, and the page-cache protocol.
#[derive(Args)]
struct ContainArgs {
    /// Run as its own process tree in a memory cgroup with this hard limit (bytes, or with a
    /// K/M/G suffix, binary), swap off; the record then states what bounded each memory tier
    /// and whether the run is admitted (positive margin, zero limit events, no OOM, no swap).
    #[arg(long, value_parser = sovereign::bounds::parse_memory_max)]
    memory_max: Option<u64>,
    /// Run in its own cgroup for accounting even without a limit.
    #[arg(long)]
    contain: bool,
    /// Declared GPU allowance (bytes or K/M/G), audited against whole-board use.
    #[arg(long, value_parser = parse_bytes)]
    gpu_declared: Option<u64>,
    /// Device bound of the run (bytes or K/M/G): its device buffers must fit before decoding
    /// (refused otherwise) and its NVML-sampled own usage must stay below it.
    #[arg(long, value_parser = parse_bytes)]
    gpu_budget: Option<u64>,
    /// Sampling period of the cgroup, /proc and NVML observers, in milliseconds.
    #[arg(long, default_value_t = 50)]
    sample_ms: u64,
    /// A contained run normally starts cold (the model's pages dropped from the page cache, so
    /// the run is charged for its own reads); keep them instead.
    #[arg(long)]
    warm_cache: bool,
}

impl ContainArgs {
    fn enabled(&self) -> bool {
        self.memory_max.is_some() || self.contain
    }

    fn spec(&self) -> sovereign::observe::ContainSpec {
        sovereign::observe::ContainSpec {
            memory_max: self.memory_max,
            gpu_declared: self.gpu_declared,
            gpu_budget: self.gpu_budget,
            sample_interval: std::time::Duration::from_millis(self.sample_ms.max(1)),
        }
    }

    /// Starts the run cold unless asked otherwise; says which, for the record.
    fn cache_protocol(&self, models: &[&Path]) -> Result<&'static str> {
        if self.warm_cache {
            return Ok("warm: page cache left as found");
        }
        for m in models {
            sovereign::util::drop_file_cache(m)?;
        }
        Ok("cold: model files dropped from the page cache (POSIX_FADV_DONTNEED) before the run")
    }
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
    /// `resident`: llama.cpp loads every expert (stock path). `plan`: experts are served from
    /// storage through a bounded slot pool. `host`: resident, expert tensors in host memory.
    #[arg(long, value_enum, default_value_t = Experts::Resident)]
    experts: Experts,
    #[command(flatten)]
    plan: PlanArgs,
    /// Deterministic fault cell (plan): fatal cells must fail closed with nothing accepted,
    /// recoverable ones must stay exact against the no-fault control.
    #[arg(long, value_enum, default_value_t = FaultCell::None)]
    fault: FaultCell,
    /// Layers llama.cpp offloads to the GPU (`n_gpu_layers`; `all` for every layer). Without a
    /// GPU device nothing is offloaded and the record says so.
    #[arg(long, value_parser = parse_gpu_layers, default_value = "0")]
    gpu_layers: i32,
    #[command(flatten)]
    contained: ContainArgs,
    /// Record directory (must not exist).
    #[arg(long)]
    record: PathBuf,
    #[arg(long)]
    json: bool,
    /// Plan flags given on the command line (filled from the matches).
    #[arg(skip)]
    plan_given: Vec<&'static str>,
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`sovereign inventory M | head`), like other Unix tools.
    // SAFETY: setting a signal disposition before any threads start.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let m = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    if let (Command::Generate(a), Some(g)) = (&mut cli.command, m.subcommand_matches("generate")) {
        a.plan_given = PlanArgs::given(g);
    }
    if let Some(d) = &cli.backend_dir {
        // Before any thread starts; child cells inherit it.
        std::env::set_var(sovereign::engine::backends::BACKEND_DIR_ENV, d);
    }
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
        Command::BuildInfo { json, export_source } => {
            if let Some(to) = export_source {
                sovereign::engine::backends::export_source(&to)?;
                eprintln!("{}: engine source written", to.display());
                return Ok(ExitCode::SUCCESS);
            }
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
                for l in &id.libraries {
                    println!("library    {} {} {}", l.name, l.sha256, l.path);
                }
                for d in &id.devices {
                    println!("device     {} {} ({}, {} MiB)", d.kind, d.name, d.description, d.memory_total >> 20);
                }
                println!("gpu        {}", serde_json::to_string(&id.gpu)?);
            }
        }
        Command::Model(ModelCommand::Forge { arch, preset, seed, out, layers, experts, top_k, embd, expert_ff, vocab, json }) => {
            let dims = preset.dims().with(&Overrides { layers, experts, top_k, embd, expert_ff, vocab })?;
            if out.symlink_metadata().is_ok() {
                bail!("{}: --out exists; forge never overwrites (remove it first)", out.display());
            }
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
            // Claimed exclusively: a concurrent or interrupted run's file is refused, not reused.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .with_context(|| format!("{}: cannot claim (another run is writing it, or one was interrupted)", tmp.display()))?;
            if let Err(e) = engine::quantize(&input, &tmp, ty, threads) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            if let Err(e) = sovereign::record::rename_noreplace(&tmp, &output) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
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
        Command::FaultCheck { cell, record, control, json } => {
            let v = sovereign::oracle::fault::validate(cell, &record, control.as_deref())?;
            if json {
                print_json(&v)?;
            } else {
                for c in &v.checks {
                    println!("{} {:<36} {}", if c.passed { "ok  " } else { "FAIL" }, c.name, c.detail);
                }
                println!("{:?} ({:?}: {}): {}", v.cell, v.expect, v.invariant, if v.passed { "passes" } else { "FAILS" });
            }
            if !v.passed {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Envelope { file, bytes_per_cell, csv, figure, json } => {
            if let Some(f) = &figure {
                if !matches!(f.extension().and_then(|x| x.to_str()), Some("svg" | "png")) {
                    bail!("--figure {}: the name must end in .svg or .png", f.display());
                }
            }
            let e = sovereign::envelope::measure_envelope(
                &file,
                bytes_per_cell,
                sovereign::envelope::BLOCK_SIZES,
                sovereign::envelope::DEPTHS,
            )?;
            if let Some(out) = csv {
                std::fs::write(&out, sovereign::envelope::to_csv(&e)).with_context(|| format!("{}", out.display()))?;
            }
            if let Some(f) = &figure {
                export::envelope_figure(f, &e)?;
            }
            if json {
                print_json(&e)?;
            } else {
                println!("{:>9} {:>6} {:>10} {:>10}", "block", "depth", "MiB/s", "IOPS");
                for c in &e.cells {
                    println!("{:>9} {:>6} {:>10.1} {:>10.0}", c.block_bytes, c.depth, c.mib_per_s, c.iops);
                }
                let c = &e.ceiling;
                println!("ceiling: {:.1} MiB/s at block {} depth {}", c.mib_per_s, c.block_bytes, c.depth);
            }
        }
        Command::Margins(a) => return refine_cli::margins_cmd(a),
        Command::Refine(a) => return refine_cli::refine_cmd(a),
        Command::Compare { a, b, json } => {
            // A sealed record is compared only if it still verifies against its manifest.
            for d in [&a, &b] {
                if d.join(sovereign::record::MANIFEST_FILE).exists() {
                    sovereign::record::verify_record(d)?;
                }
            }
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
        Command::Certificate(c) => return certificate_cmd(c),
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

fn certificate_cmd(c: CertificateCommand) -> Result<ExitCode> {
    let (cert, json, file) = match c {
        CertificateCommand::Show { record, ledger, results, oracle, r_policy, g_decl, g_phys, json } => {
            let opts = certificate::RecordOptions { oracle, r_policy, g_decl, g_phys };
            if Path::new(&record).exists() {
                (certificate::from_record(Path::new(&record), &opts)?, json, None)
            } else {
                return certificate_of_claim(&record, &ledger, &results, &opts, json);
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
fn certificate_of_claim(
    id: &str,
    ledger: &Path,
    results: &Path,
    opts: &certificate::RecordOptions,
    json: bool,
) -> Result<ExitCode> {
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

/// `--gpu-layers`: a layer count or `all` (llama's negative n_gpu_layers).
fn parse_gpu_layers(s: &str) -> Result<i32, String> {
    if s == "all" {
        return Ok(-1);
    }
    s.parse::<u16>().map(i32::from).map_err(|_| format!("`{s}` is neither a layer count nor `all`"))
}

/// The same run as a child process writing its record to `record`.
fn child_args(a: &GenerateArgs, record: &Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = vec!["generate".into(), "--model".into(), a.model.clone().into()];
    match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => v.extend(["--prompt".into(), p.into()]),
        (None, Some(f)) => v.extend(["--prompt-file".into(), f.clone().into()]),
        (None, None) => {}
    }
    for (k, val) in [
        ("--n-predict", a.n_predict.to_string()),
        ("--threads", a.threads.to_string()),
        ("--ctx", a.ctx.to_string()),
        ("--batch", a.batch.to_string()),
    ] {
        v.extend([k.into(), val.into()]);
    }
    for (on, flag) in [(a.flash_attn, "--flash-attn"), (a.ignore_eos, "--ignore-eos")] {
        if on {
            v.push(flag.into());
        }
    }
    if a.gpu_layers != 0 {
        let n = if a.gpu_layers < 0 { "all".to_string() } else { a.gpu_layers.to_string() };
        v.extend(["--gpu-layers".into(), n.into()]);
    }
    if let Some(b) = a.contained.gpu_budget {
        v.extend(["--gpu-budget".into(), b.to_string().into()]);
    }
    if a.experts == Experts::Host {
        v.extend(["--experts".into(), "host".into()]);
    }
    if a.experts == Experts::Plan {
        v.extend(["--experts".into(), "plan".into()]);
        v.extend(a.plan.args());
        if a.fault != FaultCell::None {
            v.extend(["--fault".into(), a.fault.name().into()]);
        }
    }
    v.extend(["--record".into(), record.into(), "--json".into()]);
    v
}

fn read_prompt(a: &GenerateArgs) -> Result<Vec<u8>> {
    match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => Ok(p.as_bytes().to_vec()),
        (None, Some(f)) => std::fs::read(f).with_context(|| format!("{}: cannot read prompt file", f.display())),
        (None, None) => bail!("give --prompt or --prompt-file"),
    }
}

fn generate_cmd(a: GenerateArgs) -> Result<ExitCode> {
    sovereign::bounds::RunParams { threads: a.threads as i64, ctx: a.ctx, batch: a.batch, n_predict: a.n_predict }.check()?;
    if a.experts == Experts::Plan {
        a.plan.check()?;
    } else if !a.plan_given.is_empty() {
        bail!("--{} need --experts plan (resident runs load every expert)", a.plan_given.iter().map(|f| f.replace('_', "-")).collect::<Vec<_>>().join(", --"));
    }
    sovereign::bounds::regular_file("--model", &a.model)?;
    if let Some(f) = &a.prompt_file {
        sovereign::bounds::regular_file("--prompt-file", f)?;
    }
    sovereign::bounds::prompt_text(if a.prompt.is_some() { "--prompt" } else { "--prompt-file" }, &read_prompt(&a)?)?;
    engine::set_placement(engine::Placement {
        gpu_layers: a.gpu_layers,
        experts_host: a.experts == Experts::Host,
        gpu_budget: a.contained.gpu_budget,
    })?;
    if a.contained.enabled() {
        return generate_contained(&a);
    }
    let spec = GenerateSpec {
        model: a.model.clone(),
        prompt: read_prompt(&a)?,
        n_predict: a.n_predict,
        exec: ExecParams { n_ctx: a.ctx, n_batch: a.batch, n_ubatch: a.batch, threads: a.threads, flash_attn: a.flash_attn },
        ignore_eos: a.ignore_eos,
        record: a.record.clone(),
    };
    let plan = (a.experts == Experts::Plan).then(|| a.plan.options(a.fault));
    let model = a.model.clone();
    let s = generate::run_with(&spec, move |inv| match plan {
        None => Ok(None),
        Some(o) => Ok(Some(Box::new(PlanSource::new(&model, inv, o)?) as Box<dyn sovereign::engine::ExpertSource>)),
    })?;
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

fn generate_contained(a: &GenerateArgs) -> Result<ExitCode> {
    // Refuse bad input here, before any cgroup is made.
    sovereign::inventory::Inventory::of(&a.model)?;
    read_prompt(a)?;
    let spec = a.contained.spec();
    let cache = a.contained.cache_protocol(&[&a.model])?;
    let (rec, dir) = generate::run_contained(&a.record, |cell| child_args(a, cell), &spec, cache, "sovereign.generate/1")?;
    let res = &rec["resources"];
    if a.json {
        print_json(&serde_json::json!({
            "record": dir,
            "outcome": rec["outcome"],
            "admission": res["admission"],
            "authority": res["authority"],
            "digests": rec["surfaces"].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v["sha256"].clone())).collect::<serde_json::Map<_, _>>()),
        }))?;
    } else {
        println!("record    {}", display(&dir));
        println!("outcome   {}", rec["outcome"].as_str().unwrap_or("?"));
        if let Some(e) = rec["error"].as_str() {
            println!("error     {e}");
        }
        let host = &res["host"];
        println!(
            "host      limit {} bytes, kernel peak {} bytes, limit events {}, OOM kills {}",
            host["limit"], host["kernel_peak"], host["limit_events"], host["oom_kills"]
        );
        println!("authority host {} / gpu {}", res["authority"]["host"]["grade"], res["authority"]["gpu"]["grade"]);
        let adm = &res["admission"];
        println!(
            "admission {}{}",
            if adm["admitted"] == true { "admitted" } else { "NOT admitted" },
            adm["failed"].as_array().filter(|f| !f.is_empty()).map(|f| format!(": {}", f.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", "))).unwrap_or_default()
        );
    }
    Ok(if rec["outcome"] == "completed" { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
