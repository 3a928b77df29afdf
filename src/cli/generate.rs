//! `generate`: flags to a cell, run here or contained.

use super::{print_json, status};
use anyhow::{bail, Context, Result};
use clap::Args;
use sovereign::bounds::parse_bytes;
use sovereign::cell::{self, Cell, Experts, ExpertsMode, GenerateCell, Prompt, WorkerEnd};
use sovereign::exec::ExecParams;
use sovereign::generate;
use sovereign::observe::ContainSpec;
use sovereign::plan::{PlanOptions, SourceKind};
use sovereign::record::format::{Outcome, TypedRecord};
use sovereign::session::BetweenMode;
use sovereign::source::fault::FaultCell;
use std::path::PathBuf;
use std::process::ExitCode;

/// How the Plan serves experts from storage.
#[derive(Args)]
#[command(next_help_heading = "Plan runs only (with --experts plan)")]
pub struct PlanArgs {
    /// Slots per MoE layer (plan). Default: with neither --slots nor --policy, sized from the
    /// budget of the pools' tier (--memory-max for host pools, --gpu-budget for device pools)
    /// with LRU over every slot; without that budget, 8.
    #[arg(long)]
    slots: Option<u32>,
    /// Replacement policy (plan): `zero`, `lru:K`, `pin:L/E,...`, combined with `+`, and
    /// `+prefetch` for next-layer prefetch. Default: `lru:S` over budget-sized slots, else
    /// `zero`.
    #[arg(long)]
    policy: Option<sovereign::plan::PolicySpec>,
    /// How expert bytes are read (plan): p = buffered pread, d = blocking O_DIRECT with one
    /// window, f = io_uring O_DIRECT with --windows windows and --depth reads in flight.
    #[arg(long, value_parser = super::choices::parser::<SourceKind>(), default_value = "f")]
    source: SourceKind,
    /// Staging windows (p, f). Default for f: the most distinct experts one pass of a layer can
    /// miss (its unpinned slots); p: 8.
    #[arg(long)]
    windows: Option<u32>,
    /// Reads in flight (f). Default: the least depth the device's read profile (measured once
    /// per device and cached) serves within 5 % of its best, and at least the most extents per
    /// expert (each extent is verified before its expert is published).
    #[arg(long)]
    depth: Option<u32>,
    /// Layer buffers (plan): 0 gives every layer its own slot pools; 2 streams layer by layer
    /// through two shared, alternating buffers (layer i uses buffer i mod 2).
    #[arg(long, default_value_t = 0)]
    layer_buffers: u32,
    /// The decode token (0: the first after the prompt) whose every read, copy and acquire the
    /// record keeps in its `timeline` surface (plan); default: the middle one.
    #[arg(long)]
    timeline_token: Option<u32>,
    /// Distinct experts per engine pass when a ubatch has one token (plan). Fewer than a token
    /// selects lets the engine compute a layer's first experts while the Plan still reads the
    /// others. Default for f: a quarter of a token's experts (none with a fault cell); else
    /// all in one pass.
    #[arg(long)]
    token_pass: Option<u32>,
    /// Distinct experts per engine pass when a ubatch has several tokens, a prompt's (plan).
    /// Half the slots lets the Plan read one half's group while the engine computes the
    /// other's. Default for f: half a layer's unpinned slots (none with a fault cell); 0: the
    /// layer's slots, one group at a time.
    #[arg(long)]
    prompt_pass: Option<u32>,
    /// How each read is verified against the model's digest manifest (plan): xxh3 (XXH3-128,
    /// at memory speed) or blake3. Default: xxh3.
    #[arg(long, value_parser = super::choices::parser::<sovereign::digests::Verify>())]
    verify: Option<sovereign::digests::Verify>,
}

impl PlanArgs {
    /// The Plan's options; `budget` sizes slots and policy where neither is given.
    pub fn options(&self, fault: FaultCell, budget: Option<sovereign::plan::budget::PlanBudget>) -> PlanOptions {
        let sized = budget.filter(|_| self.slots.is_none() && self.policy.is_none());
        PlanOptions {
            slots: self.slots.unwrap_or(sovereign::plan::options::DEFAULT_SLOTS),
            policy: self.policy.clone().unwrap_or_default(),
            source: self.source,
            windows: self.windows,
            depth: self.depth,
            layer_buffers: self.layer_buffers,
            fault,
            timeline_token: self.timeline_token,
            token_pass: self.token_pass,
            prompt_pass: self.prompt_pass,
            budget: sized,
            verify: self.verify,
        }
    }
}

/// How a run is contained: a memory cgroup, its limit, observers, and the page-cache protocol.
#[derive(Args)]
#[command(next_help_heading = "Containment and observation")]
pub struct ContainArgs {
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
    pub gpu_budget: Option<u64>,
    /// Sampling period of the cgroup, /proc and NVML observers, in milliseconds.
    #[arg(long, default_value_t = 50)]
    sample_ms: u64,
    /// A contained run normally starts cold (the model's pages dropped from the page cache, so
    /// the run is charged for its own reads); keep them instead.
    #[arg(long)]
    warm_cache: bool,
}

impl ContainArgs {
    pub fn enabled(&self) -> bool {
        self.memory_max.is_some() || self.contain
    }

    fn spec(&self, cell: &Cell) -> ContainSpec {
        ContainSpec {
            memory_max: self.memory_max,
            gpu_declared: self.gpu_declared,
            gpu_budget: self.gpu_budget,
            device_cgroup: match cell {
                Cell::Generate(g) => g.device_cgroup.clone(),
                _ => None,
            },
            sample_interval: std::time::Duration::from_millis(self.sample_ms.max(1)),
        }
    }

    /// Runs `cell` (checked by the caller) as its own process tree under these bounds; the
    /// committed record.
    pub fn run(&self, cell: &Cell) -> Result<(TypedRecord, PathBuf)> {
        let cache = cell::cache_protocol(cell, self.warm_cache)?;
        cell::run_in_cgroup(cell, &self.spec(cell), cache, None)
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, conflicts_with_all = ["prompt_file", "requests"], required_unless_present_any = ["prompt_file", "requests"])]
    prompt: Option<String>,
    #[arg(long, conflicts_with = "requests")]
    prompt_file: Option<PathBuf>,
    /// A session: requests as JSON Lines (`{"id": .., "prompt": .. | "prompt_file": ..,
    /// "n_predict": .., "expected": .., "fault": ..}`), served in order through one model load
    /// and one expert source, each request's sequence cleared before it; --n-predict is the
    /// default of a request that names none. A request that fails closed (or names its own
    /// fault cell) is followed by a new Plan. The record is the session's, each request's
    /// record inside it.
    #[arg(long, help_heading = "Sessions")]
    requests: Option<PathBuf>,
    /// What the expert source carries from one request of a session to the next (default: auto).
    #[arg(long, value_parser = super::choices::parser::<BetweenMode>(), help_heading = "Sessions")]
    between: Option<BetweenMode>,
    #[arg(long, default_value_t = 64)]
    n_predict: u32,
    /// Engine threads decoding one token at a time (default: every core, streamed or not).
    #[arg(long)]
    threads: Option<i32>,
    /// Engine threads for multi-token batches: the prompt, drafted traversals (default:
    /// `--threads` when given, else every core).
    #[arg(long)]
    threads_batch: Option<i32>,
    /// Context size in tokens (default: the prompt's tokens plus --n-predict, up to the
    /// model's trained length).
    #[arg(long)]
    ctx: Option<u32>,
    /// Logical and physical batch size (fixed on every arm: batch size changes kernels).
    #[arg(long, default_value_t = cell::BATCH)]
    batch: u32,
    #[arg(long)]
    flash_attn: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// `resident`: llama.cpp loads every expert (stock path). `plan`: experts are served from
    /// storage through a bounded slot pool. `host`: resident, expert tensors in host memory.
    #[arg(long, value_parser = super::choices::parser::<ExpertsMode>(), default_value = "resident")]
    experts: ExpertsMode,
    #[command(flatten)]
    plan: PlanArgs,
    /// Deterministic fault cell (plan): fatal cells must fail closed with nothing accepted,
    /// recoverable ones must stay exact against the no-fault control.
    #[arg(long, value_parser = super::choices::parser::<FaultCell>(), default_value = "none")]
    fault: FaultCell,
    /// Layers llama.cpp offloads to the GPU (`n_gpu_layers`; `all` for every layer). Without a
    /// GPU or RPC device the run is refused, naming the devices found.
    #[arg(long, value_parser = parse_gpu_layers, default_value = "0", help_heading = "Devices")]
    gpu_layers: i32,
    /// RPC servers (HOST:PORT, comma-separated; `sovereign device serve`) whose devices take
    /// the offloaded layers, as llama.cpp's `--rpc` does.
    #[arg(long, value_delimiter = ',', help_heading = "Devices")]
    rpc: Vec<String>,
    /// The memory cgroup directory of the RPC device's server (`device serve --memory-max`
    /// prints it): after the run its kernel peak is put on record against `--gpu-budget`.
    #[arg(long, requires = "rpc", help_heading = "Devices")]
    device_cgroup: Option<PathBuf>,
    /// A proposer (a model with the target's vocabulary, resident) whose greedy drafts the
    /// target checks several per traversal; committed tokens stay the target's own greedy ones.
    /// `mtp`: the model's own multi-token-prediction head, its experts served as the target's.
    #[arg(long, value_name = "MODEL|mtp", help_heading = "Temporal amortization")]
    draft: Option<PathBuf>,
    /// Drafts one target traversal checks at most.
    #[arg(long, requires = "draft", default_value_t = 4, help_heading = "Temporal amortization")]
    draft_max: u32,
    #[command(flatten)]
    contained: ContainArgs,
    /// Record directory (must not exist).
    #[arg(long, help_heading = "Output")]
    record: PathBuf,
    #[arg(long, help_heading = "Output")]
    json: bool,
    /// Plan flags given on the command line (filled from the matches).
    #[arg(skip)]
    plan_given: Vec<String>,
}

impl GenerateArgs {
    /// The budget of the slot pools' tier: the device's where layers are offloaded, else the
    /// host's.
    fn budget(&self) -> Option<sovereign::plan::budget::PlanBudget> {
        use sovereign::plan::budget::{PlanBudget, Tier};
        match (self.gpu_layers != 0, self.contained.gpu_budget, self.contained.memory_max) {
            (true, Some(bytes), _) => Some(PlanBudget { bytes, tier: Tier::Device }),
            (false, _, Some(bytes)) => Some(PlanBudget { bytes, tier: Tier::Host }),
            _ => None,
        }
    }

    pub fn note_given(&mut self, m: &clap::ArgMatches) {
        // Every flag of PlanArgs, read from its definition so a new one cannot be missed, and
        // the fault cell (a Plan fault).
        let plan = <PlanArgs as clap::Args>::augment_args(clap::Command::new("plan"));
        let ids = plan.get_arguments().map(|a| a.get_id().as_str().to_string()).chain(["fault".to_string()]);
        self.plan_given = ids.filter(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)).collect();
    }

    /// The flags as the cell they ask for.
    fn cell(&self) -> Result<Cell> {
        if self.between.is_some() && self.requests.is_none() {
            // Not clap's `requires`: it lets a flag through beside one that conflicts with
            // the flag it requires.
            bail!("--between needs --requests (it says what carries between a session's requests)");
        }
        if self.experts != ExpertsMode::Plan && !self.plan_given.is_empty() {
            let flags: Vec<String> = self.plan_given.iter().map(|f| f.replace('_', "-")).collect();
            bail!("--{} need --experts plan (resident runs load every expert)", flags.join(", --"));
        }
        Ok(Cell::Generate(GenerateCell {
            model: self.model.clone(),
            prompt: match (&self.prompt, &self.prompt_file, &self.requests) {
                (Some(p), _, _) => Prompt::Text(p.clone()),
                (None, Some(f), _) => Prompt::File(f.clone()),
                (None, None, Some(file)) => Prompt::Requests { file: file.clone(), between: self.between.unwrap_or_default().resolve() },
                (None, None, None) => bail!("give --prompt, --prompt-file or --requests"),
            },
            n_predict: self.n_predict,
            exec: ExecParams::new(
                self.ctx,
                self.batch,
                sovereign::bounds::threads(self.threads.map(i64::from), self.threads_batch.map(i64::from)),
                self.flash_attn,
            ),
            ignore_eos: self.ignore_eos,
            experts: match self.experts {
                ExpertsMode::Resident => Experts::Resident,
                ExpertsMode::Host => Experts::Host,
                ExpertsMode::Plan => Experts::Plan(self.plan.options(self.fault, self.budget())),
            },
            gpu_layers: self.gpu_layers,
            gpu_budget: self.contained.gpu_budget,
            rpc: self.rpc.clone(),
            device_cgroup: self.device_cgroup.clone(),
            draft: self.draft.as_ref().map(|m| generate::Draft {
                // `mtp` names the model's own head; a file of that name is `./mtp`.
                proposer: if m.as_os_str() == "mtp" { generate::Proposer::Mtp } else { generate::Proposer::Model(m.clone()) },
                max: self.draft_max,
            }),
            record: self.record.clone(),
            seal: true,
        }))
    }
}

/// A `--gpu-layers` value that is neither.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is neither a layer count nor `all`")]
struct NotGpuLayers(String);

/// `--gpu-layers`: a layer count or `all` (llama's negative n_gpu_layers).
fn parse_gpu_layers(s: &str) -> Result<i32, NotGpuLayers> {
    if s == "all" {
        return Ok(-1);
    }
    s.parse::<u16>().map(i32::from).map_err(|_| NotGpuLayers(s.to_string()))
}

pub fn generate(a: GenerateArgs) -> Result<ExitCode> {
    let cell = a.cell()?;
    cell.check()?;
    if a.contained.enabled() {
        let (rec, dir) = a.contained.run(&cell)?;
        print_contained(&rec, &dir, a.json)?;
        return Ok(status(rec.outcome() == Outcome::Completed));
    }
    isolated(&cell, a.json)
}

/// Runs `cell` in a worker of its own, which prints its summary (JSON with `json`); an engine
/// abort there becomes one line, a failed record here and, with `json`, its document.
pub fn isolated(cell: &Cell, json: bool) -> Result<ExitCode> {
    match cell::run_isolated(cell, if json { &[] } else { &["--human"] })? {
        WorkerEnd::Completed { stderr } => {
            eprint!("{stderr}");
            Ok(ExitCode::SUCCESS)
        }
        WorkerEnd::Exited { code, stderr } => {
            eprint!("{stderr}");
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(2)))
        }
        WorkerEnd::Died { error, record } => {
            eprintln!("error: {error}; record {} (failed)", record.display());
            if json {
                // The document a contained failure prints; nothing was admitted or observed.
                print_json(&serde_json::json!({
                    "record": record,
                    "outcome": Outcome::Failed,
                    "error": error,
                    "admission": null,
                    "authority": null,
                }))?;
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// What a contained run put on record: outcome, what bounded memory, admission; a failed
/// run's error, in words, on stderr (also under `--json`, whose document carries it too).
pub fn print_contained(rec: &TypedRecord, dir: &std::path::Path, json: bool) -> Result<()> {
    let res = rec.resources().context("a contained record without its resources")?;
    if rec.outcome() != Outcome::Completed {
        eprintln!("error: {}; record {} (failed)", rec.error().unwrap_or("the run failed and its record says no more"), dir.display());
    }
    if json {
        let mut v = serde_json::json!({
            "record": dir,
            "outcome": rec.outcome(),
            "error": rec.error(),
            "admission": res.admission,
            "authority": res.authority,
        });
        match rec {
            TypedRecord::Refine(r) => {
                v["refine"] = serde_json::to_value(&r.refine)?;
                v["quality"] = serde_json::to_value(r.quality())?;
            }
            TypedRecord::Generate(g) => {
                v["digests"] =
                    serde_json::to_value(g.surfaces.iter().map(|(k, s)| (k, &s.sha256)).collect::<std::collections::BTreeMap<_, _>>())?;
            }
            TypedRecord::Session(s) => v["session"] = super::session_json(s)?,
            TypedRecord::Envelope(_) | TypedRecord::ReadReplay(_) => {}
        }
        return print_json(&v);
    }
    println!("record    {}", dir.display());
    println!("outcome   {}", rec.outcome().name());
    if let TypedRecord::Generate(g) = rec {
        if let (Some(c), Some(t)) = (&g.counts, &g.timing) {
            super::print_tokens_and_speed(c.prompt_tokens, c.generated_tokens, t);
        }
    }
    let host = &res.host;
    let or_dash = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "host      limit {} bytes, kernel peak {} bytes, limit events {}, OOM kills {}",
        or_dash(host.limit),
        or_dash(host.kernel_peak),
        host.limit_events,
        host.oom_kills
    );
    if let TypedRecord::Refine(r) = rec {
        if let Some(x) = &r.refine {
            println!("bytes     {:.0} verification bytes per token (logical)", x.verification_bytes_per_token);
        }
        if let Some(q) = r.quality() {
            println!("quality   mean log-prob {:.4}", q.mean_logprob);
        }
    }
    println!("authority host {} / gpu {}", res.authority.host.grade.grade.name(), res.authority.gpu.grade.grade.name());
    let adm = &res.admission;
    let failed = if adm.failed().is_empty() { String::new() } else { format!(": {}", adm.failed().join(", ")) };
    println!("admission {}{failed}", if adm.admitted { "admitted" } else { "NOT admitted" });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;
    use sovereign::plan::budget::{PlanBudget, Tier};

    /// `generate` with `flags`, parsed as `main` does, to the Plan options of its cell.
    fn options(flags: &[String]) -> Result<PlanOptions> {
        let base = ["generate", "--model", "m.gguf", "--prompt", "p", "--record", "r", "--experts", "plan"];
        let m = GenerateArgs::augment_args(clap::Command::new("generate"))
            .try_get_matches_from(base.iter().map(|s| s.to_string()).chain(flags.iter().cloned()))?;
        let mut a = GenerateArgs::from_arg_matches(&m)?;
        a.note_given(&m);
        match a.cell()? {
            Cell::Generate(GenerateCell { experts: Experts::Plan(o), .. }) => Ok(o),
            other => bail!("not a Plan cell: {other:?}"),
        }
    }

    #[test]
    fn every_plan_setting_has_a_flag_that_the_one_conversion_carries_into_the_cell() {
        let want = PlanOptions::every_setting();
        let serde_json::Value::Object(settings) = serde_json::to_value(&want).unwrap() else { panic!("an object") };
        let flags: Vec<String> = settings
            .iter()
            .flat_map(|(name, value)| {
                let value = value.as_str().map_or_else(|| value.to_string(), str::to_string);
                [format!("--{}", name.replace('_', "-")), value]
            })
            .collect();
        assert_eq!(options(&flags).unwrap(), want);
        // The budget: --memory-max for host pools, --gpu-budget for a device's, where neither
        // --slots nor --policy is given.
        let left_to_budget: Vec<String> = flags.chunks(2).filter(|f| f[0] != "--slots" && f[0] != "--policy").flatten().cloned().collect();
        let with =
            |extra: &[&str]| options(&[left_to_budget.clone(), extra.iter().map(|s| s.to_string()).collect()].concat()).unwrap().budget;
        assert_eq!(with(&["--memory-max", "64M"]), Some(PlanBudget { bytes: 64 << 20, tier: Tier::Host }));
        assert_eq!(
            with(&["--gpu-layers", "all", "--gpu-budget", "16M", "--rpc", "127.0.0.1:1"]),
            Some(PlanBudget { bytes: 16 << 20, tier: Tier::Device })
        );
        assert_eq!(with(&[]), None);
        // Each is a Plan flag: refused, by name, without --experts plan.
        for f in flags.chunks(2) {
            let m = GenerateArgs::augment_args(clap::Command::new("generate"))
                .try_get_matches_from(["generate", "--model", "m", "--prompt", "p", "--record", "r", &f[0], &f[1]])
                .unwrap();
            let mut a = GenerateArgs::from_arg_matches(&m).unwrap();
            a.note_given(&m);
            let e = a.cell().unwrap_err().to_string();
            assert_eq!(e, format!("{} need --experts plan (resident runs load every expert)", f[0]));
        }
    }
}
