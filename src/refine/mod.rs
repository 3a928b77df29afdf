//! Margin-gated deferred refinement (seed 001 §4): a resident low-bit base generates greedily
//! and records each decision's top-1 margin; decisions under τ are deferred; every W tokens a
//! higher-bit verifier of the same checkpoint teacher-forces the unseen suffix into its own
//! persistent KV cache, and at the first checked flip both caches are trimmed, the verifier's
//! token is accepted and decoding resumes. With verify-all every decision is checked, which is
//! temporal amortization with the base as the proposer: that path is `generate --draft`'s
//! ([`crate::generate::draft`]), with K = W. The verifier is resident, or has its experts
//! streamed from storage through the Plan when it cannot co-reside.

pub mod margins;
pub mod score;

use crate::digests::Loads;
use crate::engine::{Context, ExpertSource, Model};
use crate::exec::{ExecParams, ExecRequest};
use crate::generate::draft::{self, Drafting, Origin, Proposer};
use crate::generate::{argmax, check_finite, load_model, ModelIdentity};
use crate::identity::build_identity;
use crate::inventory::Inventory;
use crate::plan::PlanOptions;
use crate::record::format::{
    ExpertsReport, Outcome, ProcessReport, RefineCounts, RefineParams, RefineReport, RefineTiming, Resident, VerifierParams,
};
use crate::record::{RefineRecord, Staging, REFINE_FORMAT};
use crate::service::PlanSource;
use anyhow::{bail, Context as _, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Defer decisions whose top-1 margin is below this, unless told otherwise.
pub const DEFAULT_TAU: f32 = 1.0;

pub use crate::record::format::{Counters, Mode};

pub struct RefineSpec {
    pub base: PathBuf,
    pub verifier: PathBuf,
    /// Scores the output (mean per-token log-probability); None: not scored.
    pub reference: Option<PathBuf>,
    pub prompts: Vec<Vec<u8>>,
    /// The prompts' file as given, recorded as the `prompt` surface.
    pub prompt_bytes: Vec<u8>,
    pub n_predict: u32,
    pub mode: Mode,
    pub tau: f32,
    pub window: u32,
    pub verify_all: bool,
    /// Without a context, each model's is the work of the longest prompt: its tokens plus
    /// `n_predict` (verification never feeds a model past them), up to the models' trained length.
    pub exec: ExecRequest,
    /// Stream the verifier's experts through the Plan.
    pub stream: Option<PlanOptions>,
    /// Stream the reference's experts through the Plan while it scores.
    pub reference_stream: Option<PlanOptions>,
    pub record: PathBuf,
    /// Seal the record where it is committed.
    pub seal: bool,
}

/// Top-1 minus top-2 logit: how decided a greedy decision was.
pub fn margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Where each output token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Decision {
    /// The base's token, never checked (margin at least τ, or never swept).
    Base = 0,
    /// The base's token, checked by the verifier and kept (with verify-all: an accepted draft).
    Confirmed = 1,
    /// The verifier's token after a flip (rollback; with verify-all: in place of a rejected draft).
    Replaced = 2,
    /// The verifier's own token: decoded by it alone (`--mode verifier`), or, with verify-all,
    /// where the base offered no draft (after the prompt, or after a traversal accepted every
    /// draft).
    Verifier = 3,
}

struct PromptRun {
    prompt: Vec<i32>,
    out: Vec<i32>,
    margins: Vec<f32>,
    decisions: Vec<Decision>,
}

/// The base and verifier of one run with their persistent KV caches.
struct Runtime<'m> {
    base: Option<Context<'m>>,
    verifier: Option<Context<'m>>,
    /// The models, for verify-all's drafted decoding.
    models: (Option<&'m Model>, Option<&'m Model>),
    n_vocab: usize,
    counters: Counters,
}

impl From<Origin> for Decision {
    fn from(o: Origin) -> Decision {
        match o {
            Origin::Target => Decision::Verifier,
            Origin::Accepted => Decision::Confirmed,
            Origin::Corrected => Decision::Replaced,
        }
    }
}

impl Runtime<'_> {
    /// Verify-all is temporal amortization with the base as the proposer (`generate --draft`'s
    /// path): the base drafts `window` tokens, the verifier checks them in one traversal and
    /// commits the agreeing prefix and its own next token, so the output is the verifier's own
    /// greedy one. Margins are the verifier's, from the row that chose or confirmed each output.
    fn run_prompt_drafted(&mut self, spec: &RefineSpec, prompt: Vec<i32>) -> Result<PromptRun> {
        let (Some(base_model), Some(ver_model)) = self.models else { bail!("verify-all needs the base and the verifier") };
        let mut base = self.base.take().expect("the base is loaded");
        base.trim(0)?;
        let v = self.verifier.as_mut().expect("refine mode loads the verifier");
        v.trim(0)?;
        let d = Drafting { n_predict: spec.n_predict, ignore_eos: true, k_max: spec.window, target: "verifier", proposer: "base" };
        let mut proposer = Proposer::new(base_model, base);
        let decoded = draft::decode_prompt(&d, ver_model, v, &mut proposer, &prompt);
        self.base = Some(proposer.into_context());
        let out = decoded?;
        let rep = &out.report;
        let c = &mut self.counters;
        c.sweeps += 1 + rep.traversals + rep.state_restores;
        c.rollbacks += rep.rollbacks;
        c.deferred += rep.drafted;
        c.checked += rep.drafted;
        c.verifier_tokens += (prompt.len() as u64) + rep.traversals + rep.drafted + rep.refed_positions;
        c.base_passes += rep.proposer_decodes;
        let margins = out.rows.chunks(self.n_vocab).map(margin).collect();
        let decisions = out.origins.iter().map(|&o| o.into()).collect();
        Ok(PromptRun { prompt, out: out.tokens, margins, decisions })
    }

    fn run_prompt(&mut self, spec: &RefineSpec, prompt: Vec<i32>) -> Result<PromptRun> {
        if spec.mode == Mode::Refine && spec.verify_all {
            return self.run_prompt_drafted(spec, prompt);
        }
        let n = spec.n_predict as usize;
        let mut r = PromptRun { prompt, out: Vec::new(), margins: Vec::new(), decisions: Vec::new() };
        let p = r.prompt.len() as i32;
        if spec.mode == Mode::Verifier {
            let v = self.verifier.as_mut().expect("verifier mode loads the verifier");
            v.trim(0)?;
            let mut row = Vec::new();
            decode_finite(v, "verifier", &r.prompt, false, &mut row)?;
            self.counters.sweeps += 1;
            self.counters.verifier_tokens += r.prompt.len() as u64;
            while r.out.len() < n {
                let t = argmax(&row) as i32;
                r.out.push(t);
                r.margins.push(margin(&row));
                r.decisions.push(Decision::Verifier);
                if r.out.len() < n {
                    decode_finite(v, "verifier", &[t], false, &mut row)?;
                    self.counters.sweeps += 1;
                    self.counters.verifier_tokens += 1;
                }
            }
            return Ok(r);
        }

        let base = self.base.as_mut().expect("the base is loaded");
        base.trim(0)?;
        if let Some(v) = self.verifier.as_mut() {
            v.trim(0)?;
        }
        let mut row = Vec::new();
        decode_finite(base, "base", &r.prompt, false, &mut row)?;
        self.counters.base_passes += 1;
        let mut deferred: Vec<bool> = Vec::new();
        // Outputs before `verified` are final; the verifier holds positions before `fed`.
        let (mut verified, mut fed, mut since) = (0usize, 0i32, 0u32);
        loop {
            if r.out.len() < n {
                let t = argmax(&row) as i32;
                let m = margin(&row);
                let d = spec.mode == Mode::Refine && m < spec.tau;
                self.counters.deferred += u64::from(d);
                r.out.push(t);
                r.margins.push(m);
                r.decisions.push(Decision::Base);
                deferred.push(d);
                since += 1;
            }
            let done = r.out.len() == n;
            if since >= spec.window || done {
                since = 0;
                if deferred[verified..].iter().any(|&d| d) {
                    if let Some(j) = self.sweep(&mut r, &deferred, verified, &mut fed)? {
                        // Rollback: both caches forget everything from output j on.
                        self.counters.rollbacks += 1;
                        let t = r.out[j];
                        deferred.truncate(j + 1);
                        deferred[j] = false;
                        let base = self.base.as_mut().expect("the base is loaded");
                        base.trim(p + j as i32)?;
                        self.verifier.as_mut().expect("refine mode loads the verifier").trim(p + j as i32)?;
                        fed = p + j as i32;
                        verified = j + 1;
                        if r.out.len() < n {
                            decode_finite(base, "base", &[t], false, &mut row)?;
                            self.counters.base_passes += 1;
                        }
                        continue;
                    }
                }
                verified = r.out.len();
            }
            if done {
                break;
            }
            let base = self.base.as_mut().expect("the base is loaded");
            decode_finite(base, "base", &[*r.out.last().expect("one output at least")], false, &mut row)?;
            self.counters.base_passes += 1;
        }
        Ok(r)
    }

    /// One verification sweep over outputs `from..`: the verifier is fed the unseen suffix in one
    /// pass, then the deferred decisions are checked in order. Returns the first flip, already
    /// applied to `r` (outputs after it dropped, the verifier's token in its place).
    fn sweep(&mut self, r: &mut PromptRun, deferred: &[bool], from: usize, fed: &mut i32) -> Result<Option<usize>> {
        let v = self.verifier.as_mut().expect("refine mode loads the verifier");
        let p = r.prompt.len();
        let seq: Vec<i32> = r.prompt.iter().chain(&r.out).copied().collect();
        // Rows of positions fed..end predict tokens fed+1..=end; output j sits at position p + j.
        let end = p + r.out.len() - 1;
        let start = *fed as usize;
        if start > p + from - 1 || start >= end {
            bail!("verifier cache at {start} cannot check outputs from {from} (prompt {p}, {} outputs)", r.out.len());
        }
        let mut rows = Vec::with_capacity((end - start) * self.n_vocab);
        decode_finite(v, "verifier", &seq[start..end], true, &mut rows)?;
        self.counters.sweeps += 1;
        self.counters.verifier_tokens += (end - start) as u64;
        *fed = end as i32;
        for j in (from..r.out.len()).filter(|&j| deferred[j]) {
            self.counters.checked += 1;
            let i = p + j - 1 - start;
            let vt = argmax(&rows[i * self.n_vocab..(i + 1) * self.n_vocab]) as i32;
            if vt != r.out[j] {
                r.out.truncate(j);
                r.margins.truncate(j);
                r.decisions.truncate(j);
                r.out.push(vt);
                r.margins.push(margin(&rows[i * self.n_vocab..(i + 1) * self.n_vocab]));
                r.decisions.push(Decision::Replaced);
                return Ok(Some(j));
            }
            r.decisions[j] = Decision::Confirmed;
        }
        Ok(None)
    }
}

fn identity_of(path: &Path, loads: Option<Loads>) -> Result<(ModelIdentity, Inventory)> {
    let inv = Inventory::of(path)?;
    Ok((ModelIdentity::of(path, &inv, loads)?, inv))
}

/// What llama.cpp loads itself of a model: all of it, or all but the experts when streamed.
fn loads(loaded: bool, stream: &Option<PlanOptions>) -> Option<Loads> {
    loaded.then_some(if stream.is_some() { Loads::NonExpert } else { Loads::All })
}

/// Loads `path` resident, or with its experts served through the Plan.
fn load(path: &Path, inv: &Inventory, stream: &Option<PlanOptions>, threads: usize) -> Result<Model> {
    let source = match stream {
        None => None,
        Some(o) => Some(Box::new(PlanSource::new(path, inv, o.clone())?.engine_threads(threads)) as Box<dyn ExpertSource>),
    };
    load_model(path, source)
}

/// Decodes `tokens` into `rows` (cleared first). Every row read must be finite, as in generate:
/// a NaN row has no argmax, margin or log-probability, and would pass for a decision.
fn decode_finite(ctx: &mut Context, who: &str, tokens: &[i32], all: bool, rows: &mut Vec<f32>) -> Result<()> {
    let first = ctx.n_past() as usize + if all { 0 } else { tokens.len() - 1 };
    rows.clear();
    ctx.decode(tokens, all, rows)?;
    let n_rows = if all { tokens.len() } else { 1 };
    check_finite(rows, rows.len() / n_rows, 0).with_context(|| format!("{who} logits from position {first}"))
}

/// Teacher-forces `prompt` + `out` (all but its last token) from position 0 through `who`: row j
/// of the result (n_vocab floats each) is the distribution that predicts `out[j]`.
fn teacher_force(ctx: &mut Context, who: &str, n_vocab: usize, prompt: &[i32], out: &[i32]) -> Result<Vec<f32>> {
    ctx.trim(0)?;
    let seq: Vec<i32> = prompt.iter().chain(&out[..out.len() - 1]).copied().collect();
    let mut rows = Vec::with_capacity(seq.len() * n_vocab);
    decode_finite(ctx, who, &seq, true, &mut rows)?;
    Ok(rows.split_off((prompt.len() - 1) * n_vocab))
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub record: PathBuf,
    pub mode: Mode,
    pub tau: f32,
    pub window: u32,
    pub verify_all: bool,
    pub generated_tokens: usize,
    pub counters: Counters,
    pub verification_bytes_per_token: f64,
    pub tokens_per_s: f64,
    pub quality: Option<score::Quality>,
}

/// Splits a prompts file into prompts: one per non-empty line.
pub fn prompts_of(text: &[u8]) -> Vec<Vec<u8>> {
    text.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(<[u8]>::to_vec)
        .collect()
}

/// Refuses a spec no run can honour.
fn check(spec: &RefineSpec) -> Result<()> {
    if spec.prompts.is_empty() {
        bail!("no prompts (one per non-empty line)");
    }
    if spec.n_predict == 0 {
        bail!("--n-predict must be at least 1");
    }
    if spec.window == 0 {
        bail!("--window must be at least 1");
    }
    if !spec.tau.is_finite() || spec.tau < 0.0 {
        bail!("--tau must be a finite number at least 0");
    }
    // Verify-all drafts `window` tokens per traversal, which must be one ubatch.
    let most = crate::bounds::MAX_DRAFT.min(spec.exec.n_ubatch.saturating_sub(1));
    if spec.verify_all && spec.window > most {
        bail!("--window {} with --verify-all: at most {most} drafts per verifier traversal", spec.window);
    }
    Ok(())
}

/// Every prompt as tokens, and the run's parameters with the context that fits the longest
/// with its outputs (the one given, or sized to it): the least trained length of the models
/// bounds it.
fn tokenize(model: &Model, spec: &RefineSpec, invs: &[&Inventory]) -> Result<(Vec<Vec<i32>>, ExecParams)> {
    let mut tokenized: Vec<Vec<i32>> = Vec::new();
    for (i, p) in spec.prompts.iter().enumerate() {
        let t = model.tokenize(p, true)?;
        if t.is_empty() {
            bail!("prompt {} tokenized to nothing", i + 1);
        }
        tokenized.push(t);
    }
    let trained = invs.iter().filter_map(|inv| inv.trained_context().map(|t| (t, inv.load_path()))).min_by_key(|(t, _)| t.tokens);
    // The error names the model whose trained length binds (else the base).
    let named = trained.as_ref().map_or(spec.base.as_path(), |(_, p)| *p);
    let exec = sized(spec.exec, &tokenized, spec.n_predict, trained.as_ref().map(|(t, _)| t))
        .map_err(|e| anyhow::anyhow!("{}: {e}", named.display()))?;
    Ok((tokenized, exec))
}

/// `exec` with the context that fits the longest of `prompts` with `n_predict` outputs: the one
/// given, or sized to it ([`crate::bounds::context`]), within `trained`.
fn sized(exec: ExecRequest, prompts: &[Vec<i32>], n_predict: u32, trained: Option<&crate::bounds::TrainedContext>) -> Result<ExecParams> {
    // The first of the longest, so that an error names the prompt that does not fit.
    let (longest, len) = prompts.iter().enumerate().fold((0, 0), |(i, n), (j, t)| if t.len() > n { (j, t.len()) } else { (i, n) });
    let n_ctx = crate::bounds::context(exec.n_ctx, &format!("prompt {}", longest + 1), len, n_predict, trained)?;
    Ok(exec.with_ctx(n_ctx))
}

/// The run's surfaces: the prompt always; outputs only when the run completed.
fn write_surfaces(staging: &mut Staging, spec: &RefineSpec, runs: &[PromptRun], responses: &[Vec<u8>], completed: bool) -> Result<()> {
    let mut tokens = Vec::new();
    let mut margins = Vec::new();
    let mut decisions = Vec::new();
    for r in runs {
        tokens.extend(r.prompt.iter().chain(&r.out).flat_map(|t| t.to_le_bytes()));
        margins.extend(r.margins.iter().flat_map(|m| m.to_le_bytes()));
        decisions.extend(r.decisions.iter().map(|&d| d as u8));
    }
    staging.surface("prompt", "prompt.bin", &spec.prompt_bytes, 1, false)?;
    if completed {
        staging.surface("tokens", "tokens.bin", &tokens, 4, false)?;
        staging.surface("response", "response.bin", &responses.join(&b"\n"[..]), 1, false)?;
        staging.surface("margins", "margins.bin", &margins, 4, false)?;
        staging.surface("decisions", "decisions.bin", &decisions, 1, false)?;
    }
    Ok(())
}

pub fn run(spec: &RefineSpec) -> Result<Summary> {
    check(spec)?;
    let (base_id, base_inv) = identity_of(&spec.base, loads(spec.mode != Mode::Verifier, &None)).context("--base")?;
    let (ver_id, ver_inv) = identity_of(&spec.verifier, loads(spec.mode != Mode::Base, &spec.stream)).context("--verifier")?;
    if base_inv.architecture != ver_inv.architecture {
        bail!("base ({}) and verifier ({}) are not the same architecture", base_inv.architecture, ver_inv.architecture);
    }
    let reference = match &spec.reference {
        Some(r) => Some(identity_of(r, loads(true, &spec.reference_stream)).context("--reference")?),
        None => None,
    };
    let staging = Staging::new(&spec.record)?.sealing(spec.seal);

    let t0 = Instant::now();
    let (mut base_model, ver_model) = load_models(spec, &ver_inv)?;
    let load_s = t0.elapsed().as_secs_f64();
    let tok_model = base_model.as_ref().or(ver_model.as_ref()).expect("one model at least");
    let n_vocab = tok_model.n_vocab();
    let mut invs = vec![&base_inv, &ver_inv];
    invs.extend(reference.as_ref().map(|(_, inv)| inv));
    let (tokenized, exec) = tokenize(tok_model, spec, &invs)?;
    // Verify-all's verifier takes back up to `window` rejected positions per traversal.
    let rollback = if spec.verify_all { spec.window } else { 0 };
    let mut rt = Runtime {
        base: base_model.as_ref().map(|m| Context::new(m, exec, false)).transpose()?,
        verifier: ver_model.as_ref().map(|m| Context::with_rollback(m, exec, false, rollback)).transpose()?,
        models: (base_model.as_ref(), ver_model.as_ref()),
        n_vocab,
        counters: Counters::default(),
    };
    let t1 = Instant::now();
    let (runs, mut failure) = rt.run_prompts(spec, tokenized);
    let gen_s = t1.elapsed().as_secs_f64();
    let counters = rt.counters.clone();
    drop(rt);
    let stream_report = close_verifier_source(ver_model.as_ref(), &mut failure)?;
    let responses: Vec<Vec<u8>> = runs.iter().map(|r| r.out.iter().flat_map(|&t| tok_model.token_bytes(t)).collect()).collect();
    drop(ver_model);
    if base_model.take().is_some() {
        // The base's mapped pages are unmapped now; give them back before the reference loads.
        for f in crate::gguf::set::files(&spec.base)? {
            crate::util::drop_file_cache(&f)?;
        }
    }

    let generated: usize = runs.iter().map(|r| r.out.len()).sum();
    let prompt_tokens: usize = runs.iter().map(|r| r.prompt.len()).sum();
    let report = refine_report(&counters, ver_id.t_repr_bytes, generated, stream_report.as_ref());
    let quality = match (&failure, &reference) {
        (None, Some((_, inv))) => score_under_reference(spec, exec, inv, &runs).map_err(|e| failure = Some(e)).ok(),
        _ => None,
    };

    let mut staging = staging;
    write_surfaces(&mut staging, spec, &runs, &responses, failure.is_none())?;
    let tokens_per_s = generated as f64 / gen_s.max(1e-9);
    let per_token = report.verification_bytes_per_token;
    let record = RefineRecord {
        format: REFINE_FORMAT.into(),
        outcome: if failure.is_some() { Outcome::Failed } else { Outcome::Completed },
        error: failure.as_ref().map(|e| format!("{e:#}")),
        model: Some(base_id),
        reference: Some(reference.map(|(id, _)| id)),
        build: build_identity()?,
        params: Some(params_of(spec, exec)),
        counts: Some(RefineCounts {
            prompts: spec.prompts.len(),
            prompt_tokens: if failure.is_some() { None } else { Some(prompt_tokens) },
            prompt_tokens_each: runs.iter().map(|r| r.prompt.len()).collect(),
            generated_tokens: generated,
            n_vocab,
        }),
        refine: Some(report),
        verifier: Some(ver_id),
        timing: Some(RefineTiming { load_s, generate_s: gen_s, tokens_per_s }),
        experts: Some(stream_report),
        quality: Some(quality.clone()),
        process: Some(ProcessReport::now()),
        surfaces: staging.surfaces().clone(),
        resources: None,
        cache_protocol: None,
    };
    let dir = staging.commit(&record)?;
    if let Some(e) = failure {
        return Err(e.context(format!("run failed closed; record {}", dir.display())));
    }
    Ok(Summary {
        record: dir,
        mode: spec.mode,
        tau: spec.tau,
        window: spec.window,
        verify_all: spec.verify_all,
        generated_tokens: generated,
        counters,
        verification_bytes_per_token: per_token,
        tokens_per_s,
        quality,
    })
}

/// The models the mode needs: the base unless only the verifier runs, the verifier (streamed
/// where asked) unless only the base runs; two must share a vocabulary.
fn load_models(spec: &RefineSpec, ver_inv: &Inventory) -> Result<(Option<Model>, Option<Model>)> {
    let base_model = match spec.mode {
        Mode::Verifier => None,
        _ => Some(Model::load(&spec.base)?),
    };
    let ver_model = match spec.mode {
        Mode::Base => None,
        _ => Some(load(&spec.verifier, ver_inv, &spec.stream, spec.exec.cpu_threads())?),
    };
    if let (Some(b), Some(v)) = (&base_model, &ver_model) {
        if b.n_vocab() != v.n_vocab() {
            bail!("base and verifier vocabularies differ ({} vs {})", b.n_vocab(), v.n_vocab());
        }
    }
    Ok((base_model, ver_model))
}

impl Runtime<'_> {
    /// Every prompt in order, up to the first that fails: the runs before it, and its error.
    fn run_prompts(&mut self, spec: &RefineSpec, tokenized: Vec<Vec<i32>>) -> (Vec<PromptRun>, Option<anyhow::Error>) {
        let mut runs = Vec::new();
        let total = tokenized.len();
        for (i, prompt) in tokenized.into_iter().enumerate() {
            match self.run_prompt(spec, prompt) {
                Ok(r) => runs.push(r),
                Err(e) => return (runs, Some(e.context(format!("prompt {} of {total}", i + 1)))),
            }
        }
        (runs, None)
    }
}

/// The verifier's source closed and reported. A source that cannot close clean is evidence
/// too: it goes into the record, not lost, and fails a run that had not failed already.
fn close_verifier_source(ver_model: Option<&Model>, failure: &mut Option<anyhow::Error>) -> Result<Option<ExpertsReport>> {
    Ok(match ver_model.and_then(|m| m.with_source(|s| s.finish().map(ExpertsReport::from))) {
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => {
            if failure.is_none() {
                *failure = Some(anyhow::anyhow!("the verifier's expert source did not close clean: {e:#}"));
            }
            Some(ExpertsReport::FinishError(format!("{e:#}")))
        }
        None => None,
    })
}

/// What the verifier cost per generated token.
fn refine_report(counters: &Counters, verifier_bytes: u64, generated: usize, stream: Option<&ExpertsReport>) -> RefineReport {
    // Logical verification bytes: one pass over the verifier checkpoint per sweep (seed 001).
    let verification_bytes = counters.sweeps * verifier_bytes;
    let per_token = verification_bytes as f64 / generated.max(1) as f64;
    RefineReport {
        counters: counters.clone(),
        verification_bytes_logical: verification_bytes,
        verification_bytes_per_token: per_token,
        verifier_bytes,
        bytes_per_token_over_verifier: per_token / verifier_bytes.max(1) as f64,
        rollbacks_per_token: counters.rollbacks as f64 / generated.max(1) as f64,
        served_bytes_per_token: stream
            .and_then(ExpertsReport::plan)
            .map(|r| r.telemetry.q_run.logical_bytes as f64 / generated.max(1) as f64),
    }
}

fn params_of(spec: &RefineSpec, exec: ExecParams) -> RefineParams {
    RefineParams {
        mode: spec.mode,
        tau: spec.tau,
        window: spec.window,
        verify_all: spec.verify_all,
        n_predict: spec.n_predict,
        prompts: spec.prompts.len(),
        sampling: crate::generate::SAMPLING.into(),
        verifier: match &spec.stream {
            None => VerifierParams::Resident(Resident::Resident),
            Some(o) => VerifierParams::Streamed { streamed: o.clone() },
        },
        exec,
    }
}

/// The outputs scored under `--reference`; a reference that cannot score them fails the run
/// on record.
fn score_under_reference(spec: &RefineSpec, exec: ExecParams, inv: &Inventory, runs: &[PromptRun]) -> Result<score::Quality> {
    let r = spec.reference.as_ref().expect("reference identity implies a path");
    let seqs: Vec<(&[i32], &[i32])> = runs.iter().map(|r| (r.prompt.as_slice(), r.out.as_slice())).collect();
    score::score(r, inv, &seqs, exec, &spec.reference_stream).map_err(|e| e.context("scoring under --reference"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_is_top1_minus_top2() {
        assert_eq!(margin(&[1.0, 3.0, 2.5, -1.0]), 0.5);
        assert_eq!(margin(&[2.0, 2.0]), 0.0);
        assert_eq!(margin(&[5.0, 1.0, 4.0]), 1.0);
    }

    #[test]
    fn prompts_are_non_empty_lines() {
        assert_eq!(prompts_of(b"a b\n\n  \r\nc\r\n"), vec![b"a b".to_vec(), b"c".to_vec()]);
        assert!(prompts_of(b"\n\n").is_empty());
    }
}
