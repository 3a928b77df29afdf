//! One cell: the typed unit of work that crosses the process boundary. The command line turns
//! flags into a [`Cell`] and a campaign turns an arm into one; either runs it in this process
//! or, contained, writes it as JSON and starts one worker (`sovereign cell SPEC`) inside the
//! run's memory cgroup. Nothing rebuilds a command line from settings.

use crate::bounds;
use crate::engine::{self, ExpertSource};
use crate::exec::ExecRequest;
use crate::generate::{self, GenerateSpec};
use crate::identity::build_identity;
use crate::inventory::Inventory;
pub use crate::measure::{EnvelopeCell, ReadReplayCell};
use crate::observe::{self, ContainSpec, RunStatus};
use crate::plan::PlanOptions;
use crate::record::format::{self, TypedRecord};
use crate::record::Staging;
use crate::refine::{self, Mode, RefineSpec};
use crate::service::PlanSource;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Logical and physical batch: fixed on every arm, since batch size changes kernels.
pub const BATCH: u32 = 512;
/// Slots per layer for the reference's experts while it scores, when the verifier streams.
pub const REFERENCE_SLOTS: u32 = 8;
/// The worker's spec inside the staging directory (removed before the record is sealed: it
/// names this machine's paths).
const SPEC_FILE: &str = "cell.spec.json";
/// The worker's output inside the record.
pub const LOG_FILE: &str = "cell.log";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Cell {
    Generate(GenerateCell),
    Refine(RefineCell),
    /// The device's O_DIRECT read ceiling at a few depths.
    Envelope(EnvelopeCell),
    /// A run's own reads replayed with no compute.
    ReadReplay(ReadReplayCell),
}

/// How a run holds its experts: the `--experts` flag and a campaign arm's `experts` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExpertsMode {
    /// Stock llama.cpp: every expert resident.
    Resident,
    /// Experts served from storage through the Plan.
    Plan,
    /// Resident, with the expert tensors kept in host memory by buffer override (`--cpu-moe`).
    Host,
}

/// How a run holds its experts, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Experts {
    /// llama.cpp loads every expert (the stock path).
    Resident,
    /// Resident, with the expert tensors kept in host memory by buffer override.
    Host,
    /// Served from storage through the Plan.
    Plan(PlanOptions),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Prompt {
    Text(String),
    File(PathBuf),
    /// A session: the requests of a JSON Lines file, served in order through one model load
    /// and one expert source; the cell's record is the session's.
    Requests {
        file: PathBuf,
        between: crate::session::Between,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateCell {
    pub model: PathBuf,
    pub prompt: Prompt,
    pub n_predict: u32,
    /// The context left out (`None`) is sized to the work in the worker, once the prompt is
    /// tokenized; the record states the context the run took.
    pub exec: ExecRequest,
    pub ignore_eos: bool,
    pub experts: Experts,
    /// llama's `n_gpu_layers` (negative: all).
    pub gpu_layers: i32,
    /// Device bytes the run may hold.
    pub gpu_budget: Option<u64>,
    /// RPC servers (`HOST:PORT`) whose devices are registered before the model loads, so that
    /// `gpu_layers` places layers (and their slot pools) there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    /// The memory cgroup of the RPC device's server, read after the run: the device's memory
    /// audited hard by the kernel's own peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_cgroup: Option<PathBuf>,
    /// A proposer whose drafts the target checks several per traversal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<generate::Draft>,
    /// Record directory (must not exist).
    pub record: PathBuf,
    /// Seal the record where it is committed. A campaign's cells leave it unsealed: the
    /// campaign seals each record under its digest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seal: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefineCell {
    pub base: PathBuf,
    pub verifier: PathBuf,
    pub reference: Option<PathBuf>,
    /// Prompts, one per non-empty line.
    pub prompts: PathBuf,
    pub n_predict: u32,
    pub mode: Mode,
    pub tau: f32,
    pub window: u32,
    pub verify_all: bool,
    /// As a generate cell's: the context left out is sized to the longest prompt's work.
    pub exec: ExecRequest,
    /// Stream the verifier's (and the reference's) experts through the Plan.
    pub stream: Option<PlanOptions>,
    pub reference_slots: u32,
    pub record: PathBuf,
    /// As a generate cell's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seal: bool,
}

/// What an in-process run produced.
pub enum Done {
    Generate(generate::Summary),
    /// A session's record and where it was committed.
    Session {
        record: PathBuf,
        session: Box<format::SessionRecord>,
    },
    Refine(refine::Summary),
    Measure(crate::measure::Summary),
}

impl Cell {
    pub fn record(&self) -> &Path {
        match self {
            Cell::Generate(g) => &g.record,
            Cell::Refine(r) => &r.record,
            Cell::Envelope(e) => &e.record,
            Cell::ReadReplay(r) => &r.record,
        }
    }

    fn record_mut(&mut self) -> &mut PathBuf {
        match self {
            Cell::Generate(g) => &mut g.record,
            Cell::Refine(r) => &mut r.record,
            Cell::Envelope(e) => &mut e.record,
            Cell::ReadReplay(r) => &mut r.record,
        }
    }

    /// Whether the record is sealed where it is committed (measurements are a campaign's).
    pub fn seals(&self) -> bool {
        match self {
            Cell::Generate(g) => g.seal,
            Cell::Refine(r) => r.seal,
            Cell::Envelope(_) | Cell::ReadReplay(_) => false,
        }
    }

    /// The same cell, its record left unsealed (a worker whose record another commit takes in).
    fn unsealed(mut self) -> Cell {
        match &mut self {
            Cell::Generate(g) => g.seal = false,
            Cell::Refine(r) => r.seal = false,
            Cell::Envelope(_) | Cell::ReadReplay(_) => {}
        }
        self
    }

    /// The model files the cell reads.
    pub fn models(&self) -> Vec<&Path> {
        match self {
            Cell::Generate(g) => std::iter::once(g.model.as_path()).chain(g.draft.as_ref().and_then(|d| d.model())).collect(),
            Cell::Refine(r) => {
                [Some(&r.base), Some(&r.verifier), r.reference.as_ref()].into_iter().flatten().map(PathBuf::as_path).collect()
            }
            Cell::Envelope(e) => vec![e.model.as_path()],
            Cell::ReadReplay(r) => vec![r.model.as_path()],
        }
    }

    /// The format of the record this cell writes.
    pub fn format(&self) -> &'static str {
        match self {
            Cell::Generate(g) if g.session().is_some() => format::SESSION_FORMAT,
            Cell::Generate(_) => format::GENERATE_FORMAT,
            Cell::Refine(_) => format::REFINE_FORMAT,
            Cell::Envelope(_) => format::ENVELOPE_FORMAT,
            Cell::ReadReplay(_) => format::READ_REPLAY_FORMAT,
        }
    }

    /// Every path rewritten by `f` (to show a cell without this machine's paths).
    pub fn map_paths(&self, f: impl Fn(&Path) -> PathBuf) -> Cell {
        let mut c = self.clone();
        match &mut c {
            Cell::Generate(g) => {
                g.model = f(&g.model);
                if let Some(generate::Draft { proposer: generate::Proposer::Model(m), .. }) = &mut g.draft {
                    *m = f(m);
                }
                match &mut g.prompt {
                    Prompt::File(p) | Prompt::Requests { file: p, .. } => *p = f(p),
                    Prompt::Text(_) => {}
                }
                g.record = f(&g.record);
            }
            Cell::Refine(r) => {
                r.base = f(&r.base);
                r.verifier = f(&r.verifier);
                r.reference = r.reference.as_deref().map(&f);
                r.prompts = f(&r.prompts);
                r.record = f(&r.record);
            }
            Cell::Envelope(e) => {
                e.model = f(&e.model);
                e.record = f(&e.record);
            }
            Cell::ReadReplay(r) => {
                r.model = f(&r.model);
                r.of = f(&r.of);
                r.record = f(&r.record);
            }
        }
        c
    }

    /// Refuses, before anything runs, values outside the shared bounds, a policy that does not
    /// parse, inputs that are not regular files and prompts that are not text.
    pub fn check(&self) -> Result<()> {
        match self {
            Cell::Generate(g) => {
                run_params(&g.exec, g.n_predict)?;
                if let Experts::Plan(p) = &g.experts {
                    check_plan(p)?;
                }
                for e in &g.rpc {
                    e.parse::<std::net::SocketAddr>().map_err(|err| anyhow::anyhow!("--rpc {e:?}: not HOST:PORT ({err})"))?;
                }
                if g.rpc.len() > bounds::MAX_RPC_SERVERS {
                    bail!("--rpc names {} servers; ggml takes at most {}", g.rpc.len(), bounds::MAX_RPC_SERVERS);
                }
                bounds::regular_file("--model", &g.model)?;
                if let Some(d) = &g.draft {
                    if let Some(m) = d.model() {
                        bounds::regular_file("--draft", m)?;
                    }
                    bounds::range(
                        "--draft-max",
                        d.max as u64,
                        1,
                        bounds::MAX_DRAFT.min(g.exec.n_ubatch.saturating_sub(1)).max(1) as u64,
                        "drafts one traversal checks, below the ubatch",
                    )?;
                }
                match &g.prompt {
                    Prompt::Text(_) => bounds::prompt_text("--prompt", &g.prompt_bytes()?)?,
                    Prompt::File(f) => {
                        bounds::regular_file("--prompt-file", f)?;
                        bounds::prompt_text("--prompt-file", &g.prompt_bytes()?)?;
                    }
                    Prompt::Requests { file, .. } => {
                        if g.draft.is_some() {
                            bail!("--draft with --requests: a session's requests are decoded without a proposer");
                        }
                        bounds::regular_file("--requests", file)?;
                        crate::session::requests::read(file, g.n_predict)?;
                    }
                }
            }
            Cell::Refine(r) => {
                run_params(&r.exec, 0)?;
                if let Some(p) = &r.stream {
                    check_plan(p)?;
                    bounds::range("--reference-slots", r.reference_slots as u64, 1, bounds::MAX_SLOTS as u64, "expert slots per layer")?;
                }
                r.prompt_bytes()?;
            }
            Cell::Envelope(e) => {
                crate::measure::check_envelope(e.block_bytes, &e.depths, e.bytes_per_depth)?;
                bounds::regular_file("--model", &e.model)?;
            }
            Cell::ReadReplay(r) => {
                check_plan(&r.plan)?;
                bounds::range("depth", r.depth as u64, 1, crate::measure::MAX_DEPTH as u64, "reads in flight")?;
                bounds::regular_file("--model", &r.model)?;
            }
        }
        Ok(())
    }

    /// Where the engine puts the model's layers, as this cell asks.
    pub fn placement(&self) -> crate::exec::Placement {
        match self {
            Cell::Generate(g) => {
                crate::exec::Placement { gpu_layers: g.gpu_layers, experts_host: g.experts == Experts::Host, gpu_budget: g.gpu_budget }
            }
            Cell::Refine(_) | Cell::Envelope(_) | Cell::ReadReplay(_) => crate::exec::Placement::default(),
        }
    }
}

/// Checks a run's execution parameters against [`bounds::RunParams`].
pub fn run_params(exec: &ExecRequest, n_predict: u32) -> Result<()> {
    bounds::RunParams {
        threads: exec.threads as i64,
        threads_batch: exec.threads_batch.map(i64::from),
        ctx: exec.n_ctx,
        batch: exec.n_batch,
        n_predict,
    }
    .check()
}

fn check_plan(p: &PlanOptions) -> Result<()> {
    let (windows, depth) = (p.windows.unwrap_or(1), p.depth.unwrap_or(1));
    bounds::PlanParams { slots: p.slots, windows, depth, layer_buffers: p.layer_buffers }.check()?;
    Ok(())
}

impl GenerateCell {
    /// The one prompt of a cell that is not a session.
    pub fn prompt_bytes(&self) -> Result<Vec<u8>> {
        match &self.prompt {
            Prompt::Text(t) => Ok(t.as_bytes().to_vec()),
            Prompt::File(f) => bounds::read_file("the prompt file", f, bounds::MAX_PROMPT_FILE_BYTES),
            Prompt::Requests { file, .. } => bail!("{}: a session's requests are not one prompt", file.display()),
        }
    }

    /// The requests file and what carries between its requests, for a session's cell.
    pub fn session(&self) -> Option<(&Path, crate::session::Between)> {
        match &self.prompt {
            Prompt::Requests { file, between } => Some((file.as_path(), *between)),
            Prompt::Text(_) | Prompt::File(_) => None,
        }
    }
}

impl RefineCell {
    pub fn prompt_bytes(&self) -> Result<Vec<u8>> {
        read_prompts(&self.prompts)
    }
}

/// A prompts file (one prompt per non-empty line): a regular file of text.
pub fn read_prompts(path: &Path) -> Result<Vec<u8>> {
    bounds::regular_file("--prompts", path)?;
    let b = bounds::read_file("the prompts file", path, bounds::MAX_PROMPT_FILE_BYTES)?;
    bounds::prompt_text(&path.display().to_string(), &b)?;
    Ok(b)
}

/// Runs the cell in this process; its record is written to the cell's record directory.
pub fn run(cell: &Cell) -> Result<Done> {
    cell.check()?;
    engine::set_placement(cell.placement())?;
    match cell {
        Cell::Generate(g) => run_generate(g),
        Cell::Refine(r) => {
            let prompt_bytes = r.prompt_bytes()?;
            let spec = RefineSpec {
                base: r.base.clone(),
                verifier: r.verifier.clone(),
                reference: r.reference.clone(),
                prompts: refine::prompts_of(&prompt_bytes),
                prompt_bytes,
                n_predict: r.n_predict,
                mode: r.mode,
                tau: r.tau,
                window: r.window,
                verify_all: r.verify_all,
                exec: r.exec,
                stream: r.stream.clone(),
                reference_stream: r.stream.clone().map(|o| PlanOptions { slots: r.reference_slots, ..o }),
                record: r.record.clone(),
                seal: r.seal,
            };
            Ok(Done::Refine(refine::run(&spec)?))
        }
        Cell::Envelope(e) => Ok(Done::Measure(crate::measure::Summary::Envelope(Box::new(crate::measure::run_envelope(e)?)))),
        Cell::ReadReplay(r) => Ok(Done::Measure(crate::measure::Summary::ReadReplay(Box::new(crate::measure::run_read_replay(r)?)))),
    }
}

/// A generate cell in this process: one prompt, or a session of requests.
fn run_generate(g: &GenerateCell) -> Result<Done> {
    if !g.rpc.is_empty() {
        // A device that goes away must be an error of the engine (which names it), not
        // a SIGPIPE that says nothing.
        // SAFETY: setting a signal disposition; no handler runs.
        let _ = unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) };
    }
    for e in &g.rpc {
        // ggml-rpc aborts when it cannot connect: ask first, and say how to fix it.
        let addr: std::net::SocketAddr = e.parse().map_err(|err| anyhow::anyhow!("--rpc {e:?}: not HOST:PORT ({err})"))?;
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)).map_err(|err| {
            anyhow::anyhow!("--rpc {e}: no RPC server answers ({err}); start one with `sovereign device serve --listen {e}`")
        })?;
        engine::backends::rpc_add_server(e).map_err(|e| anyhow::anyhow!(e))?;
    }
    let placed = engine::placement_report();
    if placed.gpu_layers != crate::exec::GpuLayers::Count(0) && placed.gpu_devices.is_empty() {
        // Offload asked for and nowhere to go: a run on the CPU would not be what was asked.
        let found: Vec<String> = engine::backends::devices().into_iter().map(|d| format!("{} ({})", d.name, d.kind)).collect();
        anyhow::bail!(
            "--gpu-layers: no GPU device is loaded (devices found: {}); load a GPU backend module (--backend-dir DIR with libggml-cuda.so), name an RPC device (--rpc HOST:PORT of `sovereign device serve`), or leave --gpu-layers out",
            found.join(", ")
        );
    }
    if let Some(dir) = &g.device_cgroup {
        // Before the run, so that a wrong path is refused before anything is decoded.
        crate::observe::audit_device(dir).context("--device-cgroup")?;
        generate::audit_device_at(dir.clone());
    }
    let plan = match &g.experts {
        Experts::Plan(o) => Some(o.clone()),
        Experts::Resident | Experts::Host => None,
    };
    if let Some((file, between)) = g.session() {
        let requests = crate::session::requests::read(file, g.n_predict)?;
        if between == crate::session::Between::Separate {
            let session = Box::new(run_separate(g, &requests)?);
            return Ok(Done::Session { record: g.record.clone(), session });
        }
        // A budget sizes the Plan for the request with the longest prompt and the most outputs.
        let prompt = requests.iter().map(|r| &r.prompt).max_by_key(|p| p.len()).cloned().unwrap_or_default();
        let most = requests.iter().map(|r| r.n_predict).max().unwrap_or(0);
        let spec = generate::session::SessionSpec {
            model: g.model.clone(),
            requests,
            between,
            exec: g.exec,
            ignore_eos: g.ignore_eos,
            record: g.record.clone(),
            seal: g.seal,
        };
        let make = expert_source(g.model.clone(), plan, g.exec, prompt, most);
        let session = Box::new(generate::session::run_with(&spec, make)?);
        return Ok(Done::Session { record: g.record.clone(), session });
    }
    let spec = GenerateSpec {
        model: g.model.clone(),
        prompt: g.prompt_bytes()?,
        n_predict: g.n_predict,
        exec: g.exec,
        ignore_eos: g.ignore_eos,
        draft: g.draft.clone(),
        record: g.record.clone(),
        seal: g.seal,
    };
    let make = expert_source(g.model.clone(), plan, g.exec, spec.prompt.clone(), g.n_predict);
    let n_decode = g.n_predict.saturating_sub(1);
    Ok(Done::Generate(generate::run_with(&spec, move |inv: &Inventory| make(inv, None, n_decode))?))
}

/// A session whose every request runs in a worker process of its own, one after another: a
/// new model load and a new expert source each, the page cache as the last left it. Each
/// request's record (and its worker's log, `NNNN.log`) is committed inside the session's, whose
/// record names them as a session's does. A request that fails fails the session, which goes on
/// as a session in one process does (each request is a new process anyway); a worker that left
/// no record of its request ends it.
fn run_separate(g: &GenerateCell, requests: &[crate::session::Request]) -> Result<format::SessionRecord> {
    use crate::record::format::{load_generate, RequestEntry, Served, SessionRecord};
    let staging = Staging::new(&g.record)?.sealing(g.seal);
    std::fs::create_dir(staging.dir().join("requests"))?;
    let (mut entries, mut failed, mut load_s, mut model) = (Vec::new(), None, 0.0, None);
    for (i, r) in requests.iter().enumerate() {
        let place = format!("requests/{i:04}");
        let prompt = String::from_utf8(r.prompt.clone()).with_context(|| format!("request {:?}: the prompt is not UTF-8", r.id))?;
        let experts = match (&g.experts, r.fault) {
            (e, crate::source::fault::FaultCell::None) => e.clone(),
            (Experts::Plan(o), fault) => Experts::Plan(PlanOptions { fault, ..o.clone() }),
            (_, fault) => {
                bail!("request {:?} names the fault cell {fault:?}: fault cells perturb a Plan's reads, and this session has none", r.id)
            }
        };
        let cell = Cell::Generate(GenerateCell {
            prompt: Prompt::Text(prompt),
            n_predict: r.n_predict,
            experts,
            record: staging.dir().join(&place),
            seal: g.seal,
            ..g.clone()
        });
        let (spec, log) = (staging.dir().join(format!("{place}.spec.json")), staging.dir().join(format!("{place}.log")));
        let started = std::time::Instant::now();
        let mut cmd = worker_command(None, &cell, SpecFrom::File(&spec), WorkerOutput::Log(std::fs::File::create(&log)?), &[])?;
        observe::die_with_parent(&mut cmd);
        let status = cmd.status().context("starting a request's worker");
        std::fs::remove_file(&spec)?;
        let status = status?;
        let wall_s = started.elapsed().as_secs_f64();
        let dir = staging.dir().join(&place);
        if !status.success() {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let why = format!("request {:?} failed: {}", r.id, observe::worker_failure(&RunStatus::from_exit(status), None, Some(&said)));
            failed.get_or_insert(why);
            // Failed closed, its record says so; a worker that died before it wrote one ends the session.
            if !dir.join(crate::record::RECORD_FILE).exists() {
                break;
            }
        }
        let rec = load_generate(&dir)?;
        load_s += rec.timing.as_ref().map_or(0.0, |t| t.load_s);
        model = model.or(rec.model.clone());
        let response = match rec.surfaces.get("response") {
            Some(s) => String::from_utf8_lossy(&crate::oracle::read_checked(&dir, s)?).into_owned(),
            None => String::new(),
        };
        entries.push(RequestEntry {
            id: r.id.clone(),
            record_sha256: crate::util::sha256_file(&dir.join(crate::record::RECORD_FILE))?,
            record: place,
            outcome: rec.outcome,
            n_predict: r.n_predict,
            prompt_tokens: rec.counts.as_ref().map_or(0, |c| c.prompt_tokens),
            generated_tokens: rec.counts.as_ref().map_or(0, |c| c.generated_tokens),
            between_s: 0.0,
            wall_s,
            served: rec.plan().map(Served::of),
            score: crate::session::score::score(&response, &r.expected),
        });
    }
    let mut record = SessionRecord::begun(model, build_identity()?, Some(crate::session::Between::Separate));
    if let Some(e) = &failed {
        record.fail(e.clone());
    }
    record.take_requests(staging.dir(), entries, load_s)?;
    record.scores = crate::session::score::aggregate(record.requests.iter().map(|r| &r.score));
    let dir = staging.commit(&record)?;
    match failed {
        Some(e) => bail!("{e}; session record {}", dir.display()),
        None => Ok(record),
    }
}

/// What builds a run's expert source once the model's inventory is known: none for a resident
/// run, else a Plan (its slots and policy sized by a probe load first, once, where a budget is
/// left to size them, for `prompt` and `n_predict`) with `fault` where given (else its own
/// cell), expecting `n_decode` tokens after its prompt. A session builds one per Plan it runs.
fn expert_source(
    model: PathBuf,
    plan: Option<PlanOptions>,
    exec: ExecRequest,
    prompt: Vec<u8>,
    n_predict: u32,
) -> impl Fn(&Inventory, Option<crate::source::fault::FaultCell>, u32) -> Result<Option<Box<dyn ExpertSource>>> {
    let sized = std::cell::OnceCell::new();
    move |inv: &Inventory, fault, n_decode| {
        let Some(o) = &plan else { return Ok(None) };
        let (o, by) = match sized.get() {
            Some(done) => done,
            None => {
                let done = match o.budget {
                    Some(b) => {
                        let (o, s) = crate::budget::size(&model, inv, o, b, exec, &prompt, n_predict)?;
                        (o, Some(s))
                    }
                    None => (o.clone(), None),
                };
                sized.get_or_init(|| done)
            }
        };
        let o = PlanOptions { fault: fault.unwrap_or(o.fault), ..o.clone() };
        let source = PlanSource::new(&model, inv, o)?.expecting(n_decode).sized_by(by.clone());
        Ok(Some(Box::new(source.engine_threads(exec.cpu_threads())) as Box<dyn ExpertSource>))
    }
}

/// Drops the cell's model files from the page cache, so that a contained run is charged for
/// its own reads, unless `warm`; says which, for the record.
pub fn cache_protocol(cell: &Cell, warm: bool) -> Result<&'static str> {
    if warm {
        return Ok("warm: page cache left as found");
    }
    for m in cell.models() {
        for f in crate::gguf::set::files(m)? {
            crate::util::drop_file_cache(&f)?;
        }
    }
    Ok("cold: model files dropped from the page cache (POSIX_FADV_DONTNEED) before the run")
}

/// Before a worker starts: an F run that sizes its own depth reads it from the read profile of
/// the model's device, measured here, outside any cap the worker runs under, the first time
/// the device is seen. A profile that cannot be measured or cached leaves the depth to the
/// manifest, said in one line.
fn profile_device(cell: &Cell) {
    use crate::envelope::profile;
    let Cell::Generate(g) = cell else { return };
    let Experts::Plan(o) = &g.experts else { return };
    if o.source != crate::plan::SourceKind::F || o.depth.is_some() {
        return;
    }
    let Ok(inv) = Inventory::of(&g.model) else { return };
    let file = inv.shards.iter().max_by_key(|s| s.bytes).map_or(g.model.as_path(), |s| s.path.as_path());
    let (block, shape) = (profile::block_of(&inv), profile::shape_of(&inv));
    if !profile::profiled(file) || profile::cached(file, block, shape).is_some() {
        return;
    }
    let device = profile::DeviceId::of(file).map_or_else(|_| file.display().to_string(), |d| d.label());
    // A few seconds, once per device: the record names the profile, so no line is printed.
    let (n, kib) = (shape.burst, (u64::from(shape.vector) * block) >> 10);
    log::debug!("measuring the read profile of device {device} once: bursts of {n} reads of {kib} KiB at depths 1 to 32");
    match profile::ensure(file, block, shape) {
        Ok(p) => log::debug!("device {device}: F's reads of {} KiB need a depth of {} (cached)", block >> 10, p.depth),
        Err(e) => log::warn!("device {device}: no read profile ({e:#}); F's depth is sized from the manifest"),
    }
}

/// The cell as its own process tree under `contain`: one worker (`exe cell SPEC`, this binary
/// unless told otherwise) writes its record inside ours; we add what bounded each memory tier
/// and the admission outcome, then commit to the cell's record directory. A worker that dies
/// still leaves a record of how it died. Returns the record and where it was committed.
pub fn run_in_cgroup(cell: &Cell, contain: &ContainSpec, cache_protocol: &str, exe: Option<&Path>) -> Result<(TypedRecord, PathBuf)> {
    cell.check()?;
    for m in cell.models() {
        Inventory::of(m)?;
    }
    profile_device(cell);
    let staging = Staging::new(cell.record())?.sealing(cell.seals());
    let inner = staging.dir().join("cell");
    let spec_path = staging.dir().join(SPEC_FILE);
    let log_path = staging.dir().join(LOG_FILE);
    // The worker's record is taken into ours, which is the one sealed.
    let mut worker = cell.clone().unsealed();
    *worker.record_mut() = inner.clone();
    let log = std::fs::File::create(&log_path)?;
    let cmd = worker_command(exe, &worker, SpecFrom::File(&spec_path), WorkerOutput::Log(log), &[])?;
    let run = observe::run_contained(cmd, contain);
    std::fs::remove_file(&spec_path)?;
    let mut run = run?;
    let rec_path = inner.join(crate::record::RECORD_FILE);
    let mut rec = match std::fs::read_to_string(&rec_path) {
        Ok(text) if run.status.success() => {
            let rec = format::parse(&rec_path, &text).context("the worker's record")?;
            for entry in std::fs::read_dir(&inner)? {
                let entry = entry?;
                std::fs::rename(entry.path(), staging.dir().join(entry.file_name()))?;
            }
            std::fs::remove_dir(&inner)?;
            rec
        }
        // A worker that did not exit 0 proves nothing, whatever it wrote.
        _ => {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&inner);
            let error = observe::worker_failure(&run.status, Some(&observe::LimitSeen::of(&run.host)), Some(&log));
            TypedRecord::failed(cell.format(), error, build_identity()?)?
        }
    };
    let completed = rec.outcome() == format::Outcome::Completed;
    run.admission.require_run("outcome completed", completed, rec.outcome().name().to_string());
    rec.set_contained(run, cache_protocol);
    let dir = staging.commit(&rec)?;
    Ok((rec, dir))
}

/// How a worker gets its spec.
pub enum SpecFrom<'a> {
    /// A file, written by [`worker_command`]; the worker's stdin is closed.
    File(&'a Path),
    /// Its standard input, piped: the caller writes the spec and closes it.
    Stdin,
}

/// Where a worker's output goes.
pub enum WorkerOutput {
    /// stdout and stderr both into one log.
    Log(std::fs::File),
    /// stdout shared with this process (the summary), stderr piped back to the caller.
    Shared,
}

/// `EXE cell SPEC ARGS...` (EXE: this executable unless given): the one place a worker's command
/// is built, for every way a cell runs in a process of its own.
pub fn worker_command(
    exe: Option<&Path>,
    cell: &Cell,
    spec: SpecFrom,
    output: WorkerOutput,
    args: &[&str],
) -> Result<std::process::Command> {
    use std::process::Stdio;
    let mut cmd = std::process::Command::new(executable(exe)?);
    cmd.arg("cell");
    match spec {
        SpecFrom::File(path) => {
            std::fs::write(path, serde_json::to_vec_pretty(cell)?).with_context(|| format!("{}", path.display()))?;
            cmd.arg(path).stdin(Stdio::null());
        }
        SpecFrom::Stdin => {
            cmd.arg("-").stdin(Stdio::piped());
        }
    }
    cmd.args(args);
    match output {
        WorkerOutput::Log(log) => cmd.stdout(log.try_clone()?).stderr(log),
        // ggml prints a backtrace on abort through gdb where one is installed, to stdout: the
        // shared stdout carries the summary or `--json` alone (the abort's line is on stderr).
        WorkerOutput::Shared => cmd.stdout(Stdio::inherit()).stderr(Stdio::piped()).env("GGML_NO_BACKTRACE", "1"),
    };
    Ok(cmd)
}

/// How a worker started by [`run_isolated`] ended.
#[derive(Debug)]
pub enum WorkerEnd {
    /// It exited 0: its record is committed and its summary went to the shared stdout; what
    /// it said on stderr (notices).
    Completed { stderr: String },
    /// It exited non-zero on its own (a refusal, or a run that failed closed and said so):
    /// its exit code and what it wrote to stderr.
    Exited { code: i32, stderr: String },
    /// It died by a signal (the engine aborted, or it was killed): nothing it staged survives,
    /// and a failed record at the cell's record path says what killed it.
    Died { error: String, record: PathBuf },
}

/// Runs `cell` (checked by the caller) in a worker process of its own, with no cgroup: a
/// llama.cpp assertion aborts the worker, not this process, and its death becomes one line
/// quoting the engine and a failed record. `args` go to the worker after its spec (`--human`).
pub fn run_isolated(cell: &Cell, args: &[&str]) -> Result<WorkerEnd> {
    use std::io::Write;
    for m in cell.models() {
        Inventory::of(m)?;
    }
    profile_device(cell);
    let record = cell.record().to_path_buf();
    // Refused here, before the worker exists, so that whatever `DIR.partial` a dead worker
    // leaves is its own.
    drop(Staging::new(&record)?);
    let mut cmd = worker_command(None, cell, SpecFrom::Stdin, WorkerOutput::Shared, args)?;
    observe::die_with_parent(&mut cmd);
    let mut child = cmd.spawn().context("starting the worker")?;
    let spec = serde_json::to_vec(cell)?;
    let mut stdin = child.stdin.take().context("the worker's stdin")?;
    // A worker that dies before reading its spec closes the pipe; its status says why.
    let _ = stdin.write_all(&spec);
    drop(stdin);
    let out = child.wait_with_output().context("waiting for the worker")?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        return Ok(WorkerEnd::Completed { stderr });
    }
    if let Some(code) = out.status.code() {
        return Ok(WorkerEnd::Exited { code, stderr });
    }
    let status = RunStatus::from_exit(out.status);
    let mut partial = record.file_name().context("record path has no name")?.to_os_string();
    partial.push(".partial");
    let _ = std::fs::remove_dir_all(record.with_file_name(partial));
    let mut error = observe::worker_failure(&status, None, Some(&stderr));
    if observe::engine_abort(&stderr).is_some() {
        error = format!("{}: {error}", cell.models()[0].display());
    }
    let rec = TypedRecord::failed(cell.format(), error.clone(), build_identity()?)?;
    let dir = Staging::new(&record)?.sealing(cell.seals()).commit(&rec)?;
    Ok(WorkerEnd::Died { error, record: dir })
}

/// `sovereign cell SPEC`: the worker. Reads the spec (`-`: standard input), runs it here, and
/// prints the summary.
pub fn worker(spec: &Path) -> Result<Done> {
    let text = if spec == Path::new("-") {
        let mut t = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(std::io::stdin(), bounds::MAX_CELL_SPEC_BYTES), &mut t)
            .context("reading the cell spec from stdin")?;
        t
    } else {
        bounds::regular_file("cell spec", spec)?;
        bounds::read_text("the cell spec", spec, bounds::MAX_CELL_SPEC_BYTES)?
    };
    let cell: Cell = serde_json::from_str(&text).with_context(|| format!("{}: not a cell spec", spec.display()))?;
    if cell.record().as_os_str().is_empty() {
        bail!("{}: the cell names no record directory", spec.display());
    }
    run(&cell)
}

/// Work other than a cell that this binary starts a process of its own for: a device server,
/// a cluster's block task. The process gets it as a typed spec (`sovereign task SPEC`), as a
/// worker gets its cell, so no caller spells the flags of the command it stands for; that
/// command's flags become the same type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Task {
    /// `device serve`: this machine's CPU device over ggml's RPC protocol, until killed.
    DeviceServe(DeviceServe),
    /// `campaign run-block`: one block of a campaign submitted to a cluster.
    CampaignBlock(CampaignBlock),
}

/// Threads a device server computes with unless told otherwise.
pub const DEVICE_SERVE_THREADS: usize = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceServe {
    /// HOST:PORT, a loopback address.
    pub listen: String,
    pub threads: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignBlock {
    pub file: PathBuf,
    pub block: usize,
    pub results: PathBuf,
    /// The submitter's executable: a task refuses a binary that changed since submission.
    pub binary_sha256: Option<String>,
}

/// `exe`, or this executable when `None`.
fn executable(exe: Option<&Path>) -> Result<PathBuf> {
    match exe {
        Some(e) => Ok(e.to_path_buf()),
        None => std::env::current_exe().context("locating this executable"),
    }
}

/// The command that starts `exe` (this executable when `None`) on the task spec file `spec`.
pub fn task_command(exe: Option<&Path>, spec: &Path) -> Result<std::process::Command> {
    let mut cmd = std::process::Command::new(executable(exe)?);
    cmd.arg("task").arg(spec);
    Ok(cmd)
}

/// Writes `task` as the spec file `spec`, whole or not at all.
pub fn write_task(task: &Task, spec: &Path) -> Result<()> {
    crate::util::write_whole(spec, &serde_json::to_vec_pretty(task)?)
}

/// Reads a task spec file, bounded.
pub fn read_task(spec: &Path) -> Result<Task> {
    bounds::regular_file("task spec", spec)?;
    let text = bounds::read_text("the task spec", spec, bounds::MAX_CELL_SPEC_BYTES)?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a task spec", spec.display()))
}
