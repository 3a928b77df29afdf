//! Temporal amortization (seed 000 §3.5): a proposer drafts up to K tokens greedily, the target
//! checks them all in one traversal (one decode of the last committed token and the drafts),
//! and commits the drafts it agrees with plus its own next token. Rejected positions are taken
//! back from the target's memory (KV cells; for recurrent and hybrid memory the states llama.cpp
//! keeps per position, `n_rs_seq`, where the architecture has them, else by restoring the state
//! snapshotted before the traversal and feeding the committed positions again), so the
//! target's trajectory is its own greedy one.
//!
//! What the run keeps is what one-token decoding would have produced: for every committed
//! position the target's logits row from the traversal that fed it, and its routes renumbered
//! as one ubatch per position. Whether those rows equal the one-token run's bit for bit is the
//! oracle's question (`compare`), not an assumption made here.

use super::{argmax, check_finite, Decoding};
use crate::engine::{Context, Model};
use crate::record::format::SpeculativeReport;
use crate::routes::RouteEvent;
use anyhow::{Context as _, Result};
use std::time::Instant;

/// What a drafted decode needs of its run, and what its errors call the two models.
pub struct Drafting {
    pub n_predict: u32,
    pub ignore_eos: bool,
    /// Drafts one traversal checks at most (K).
    pub k_max: u32,
    pub target: &'static str,
    pub proposer: &'static str,
}

/// Where a committed output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The target's own token where no draft was offered (after the prompt, or after every
    /// draft of a traversal was accepted).
    Target,
    /// A draft the target's row agreed with.
    Accepted,
    /// The target's own token in place of a draft it rejected.
    Corrected,
}

/// One prompt decoded with a proposer from empty memories: each output with its origin, and
/// the target's row that chose or confirmed it (n_vocab floats per output).
pub struct Drafted {
    pub tokens: Vec<i32>,
    pub origins: Vec<Origin>,
    pub rows: Vec<f32>,
    pub report: SpeculativeReport,
}

/// Decodes `prompt` greedily with `proposer`'s drafts checked by the target (`ctx`, empty).
pub fn decode_prompt(d: &Drafting, target: &Model, ctx: &mut Context, proposer: &mut dyn Drafter, prompt: &[i32]) -> Result<Drafted> {
    let n_vocab = target.n_vocab();
    let mut run = Decoding::new(prompt.len() + d.n_predict as usize, n_vocab, d.n_predict);
    let report = run.decode_drafted(d, target, ctx, proposer, prompt)?;
    // The prompt's rows before its last predict nothing of the outputs.
    let rows = run.logits.split_off((prompt.len() - 1) * n_vocab);
    Ok(Drafted { tokens: run.generated, origins: run.origins, rows, report })
}

/// What drafts for a target: told the prompt and every traversal's outcome, with the target's
/// hidden rows of that decode (empty unless the target keeps them, [`Context::keep_hidden`]).
pub trait Drafter {
    /// The target decoded the prompt.
    fn prompted(&mut self, prompt: &[i32], hidden: &[f32], report: &mut SpeculativeReport) -> Result<()>;
    /// Up to `k` drafts after the committed tokens, the last of which, `next`, the target has
    /// not been fed yet. A draft at or past `n_target` (the target's vocabulary) ends them.
    fn draft(&mut self, next: i32, k: usize, n_target: usize, name: &str, report: &mut SpeculativeReport) -> Result<Vec<i32>>;
    /// The traversal that checked `drafts` committed `accepted` of them.
    fn settle(&mut self, drafts: &[i32], accepted: usize, hidden: &[f32], report: &mut SpeculativeReport) -> Result<()>;
}

/// The proposer: its own context over the committed tokens, fed lazily.
pub struct Proposer<'m> {
    ctx: Context<'m>,
    /// Committed tokens not yet fed to the proposer.
    unfed: Vec<i32>,
    /// Where its memory cannot take drafts back by trimming (recurrent): the state after the
    /// committed tokens, snapshotted before each draft, with its position.
    snapshot: Option<(Vec<u8>, i32)>,
    snapshots: bool,
    /// Drafts of the last draft call that were fed to it.
    fed: usize,
    /// The target committed a token outside the proposer's vocabulary: no more drafts.
    lost: bool,
    n_vocab: usize,
    rows: Vec<f32>,
}

/// Whether `ctx` can take back `n` positions of its last ubatch by trimming (KV cells, or the
/// recurrent states llama.cpp keeps for each position of a ubatch); otherwise a snapshot of
/// the state is restored.
fn trims(model: &Model, ctx: &Context, n: u32) -> bool {
    !model.has_recurrent_state() || ctx.rollback() >= n
}

impl<'m> Proposer<'m> {
    /// llama.cpp keeps per-position recurrent states only for the positions of one ubatch; the
    /// proposer decodes one token at a time, so a recurrent proposer always snapshots.
    pub fn new(model: &Model, ctx: Context<'m>) -> Proposer<'m> {
        let snapshots = model.has_recurrent_state();
        Proposer { ctx, unfed: Vec::new(), snapshot: None, snapshots, fed: 0, lost: false, n_vocab: model.n_vocab(), rows: Vec::new() }
    }

    /// The proposer's context back (its memory holds what it was fed).
    pub fn into_context(self) -> Context<'m> {
        self.ctx
    }

    /// Decodes `tokens` for one row; a row that is not finite has no draft and fails the run.
    fn step(&mut self, tokens: &[i32], rows: &mut Vec<f32>, name: &str, report: &mut SpeculativeReport) -> Result<()> {
        let at = self.ctx.n_past() as usize + tokens.len() - 1;
        rows.clear();
        self.ctx.decode(tokens, false, rows).with_context(|| format!("the {name}"))?;
        report.proposer_decodes += 1;
        check_finite(rows, self.n_vocab, 0).with_context(|| format!("{name} logits from position {at}"))
    }

    /// Drafts `k` tokens after the committed ones: feeds what it has not seen, then decodes
    /// its own greedy tokens one at a time (the last draft is not fed).
    /// A draft outside the target's vocabulary (a larger, padded proposer vocabulary) ends the
    /// drafts there: the target could not be fed it, and would never have chosen it.
    fn draft_into(
        &mut self,
        k: usize,
        n_target: usize,
        name: &str,
        rows: &mut Vec<f32>,
        report: &mut SpeculativeReport,
    ) -> Result<Vec<i32>> {
        let mut drafts = Vec::with_capacity(k);
        let feed = std::mem::take(&mut self.unfed);
        // A committed token the proposer's (smaller) vocabulary lacks: it cannot follow the
        // target any further, and the run goes on one token per traversal.
        if self.lost || feed.iter().any(|&t| t < 0 || t as usize >= self.n_vocab) {
            report.out_of_vocabulary += u64::from(!self.lost);
            self.lost = true;
            self.fed = 0;
            return Ok(drafts);
        }
        self.step(&feed, rows, name, report)?;
        if self.snapshots {
            self.snapshot = Some((self.ctx.snapshot().with_context(|| format!("the {name}"))?, self.ctx.n_past()));
        }
        while drafts.len() < k {
            let d = argmax(rows) as i32;
            if d as usize >= n_target {
                report.out_of_vocabulary += 1;
                break;
            }
            drafts.push(d);
            if drafts.len() < k {
                self.step(&[d], rows, name, report)?;
            }
        }
        // Every draft but a last one of k was fed.
        self.fed = if drafts.len() == k { k - 1 } else { drafts.len() };
        Ok(drafts)
    }

    /// After a traversal that committed `accepted` of the drafts: forgets the rejected ones it
    /// fed, and keeps an accepted one it never fed to feed.
    fn settle_fed(&mut self, drafts: &[i32], accepted: usize) -> Result<()> {
        let fed = self.fed;
        if accepted < fed {
            match &self.snapshot {
                Some((state, at)) => {
                    self.ctx.restore(state, *at).context("the proposer")?;
                    self.unfed.extend_from_slice(&drafts[..accepted]);
                }
                None => {
                    let keep = self.ctx.n_past() - (fed - accepted) as i32;
                    self.ctx.trim(keep).context("the proposer could not take back its rejected drafts")?;
                }
            }
        } else if accepted > fed {
            self.unfed.push(drafts[fed]);
        }
        Ok(())
    }
}

impl Drafter for Proposer<'_> {
    fn prompted(&mut self, prompt: &[i32], _: &[f32], _: &mut SpeculativeReport) -> Result<()> {
        self.unfed.extend_from_slice(prompt);
        Ok(())
    }

    fn draft(&mut self, next: i32, k: usize, n_target: usize, name: &str, report: &mut SpeculativeReport) -> Result<Vec<i32>> {
        self.unfed.push(next);
        if k == 0 {
            self.fed = 0;
            return Ok(Vec::new());
        }
        // The row buffer is reused across traversals; `draft_into` borrows self beside it.
        let mut rows = std::mem::take(&mut self.rows);
        let drafts = self.draft_into(k, n_target, name, &mut rows, report);
        self.rows = rows;
        drafts
    }

    fn settle(&mut self, drafts: &[i32], accepted: usize, _: &[f32], _: &mut SpeculativeReport) -> Result<()> {
        if drafts.is_empty() {
            return Ok(());
        }
        self.settle_fed(drafts, accepted)
    }
}

/// Expert bytes the target's source has read so far (None: resident, or not the Plan).
fn source_bytes(model: &Model) -> Option<u64> {
    model.with_source(|s| s.bytes_read()).flatten()
}

/// Mean distinct experts a layer selects in one traversal (all its rows, rejected ones too).
fn union_per_layer(events: &[RouteEvent]) -> (u64, u64) {
    let mut by_layer: std::collections::BTreeMap<u32, std::collections::BTreeSet<i32>> = Default::default();
    for e in events {
        by_layer.entry(e.layer).or_default().extend(&e.experts);
    }
    (by_layer.values().map(|s| s.len() as u64).sum(), by_layer.len() as u64)
}

impl Decoding {
    /// Greedy decoding with a proposer: prefill as in one-token decoding, then traversals of
    /// the last committed token and up to `k` drafts until `n_predict` tokens.
    pub(super) fn decode_drafted(
        &mut self,
        spec: &Drafting,
        model: &Model,
        ctx: &mut Context,
        proposer: &mut dyn Drafter,
        prompt: &[i32],
    ) -> Result<SpeculativeReport> {
        let (n_vocab, k_max) = (model.n_vocab(), spec.k_max);
        let n = spec.n_predict as usize;
        let mut report = SpeculativeReport {
            draft_max: k_max,
            accepted_by_position: vec![0; k_max as usize],
            offered_by_position: vec![0; k_max as usize],
            ..Default::default()
        };
        let t1 = Instant::now();
        ctx.decode(prompt, true, &mut self.logits)?;
        check_finite(&self.logits, n_vocab, 0).with_context(|| format!("{} logits from position 0", spec.target))?;
        self.prefill_s = t1.elapsed().as_secs_f64();
        model.with_source(|s| s.prompted());
        let prefill_routes = ctx.take_routes();
        let ubatches = prefill_routes.last().map_or(0, |e| e.ubatch + 1);
        self.routes.extend(prefill_routes);
        self.recurrent.capture(ctx)?;
        let t2 = Instant::now();
        // The proposer's pass over the prompt (an MTP head's) is the prompt's, not a traversal's.
        proposer.prompted(prompt, ctx.hidden(), &mut report)?;
        let bytes_before = source_bytes(model);
        let mut meter = ProposerBytes { model, bytes: 0 };
        let (mut union_sum, mut union_n) = (0u64, 0u64);
        let mut rows = Vec::new();
        let mut next = argmax(&self.logits[self.logits.len() - n_vocab..]) as i32;
        let mut origin = Origin::Target;
        loop {
            if !spec.ignore_eos && model.is_eog(next) {
                self.stop = "end_of_generation";
                break;
            }
            self.generated.push(next);
            self.origins.push(origin);
            self.response.extend(model.token_bytes(next));
            if self.generated.len() == n {
                break;
            }
            // Each traversal commits at most k + 1 tokens: never past n_predict.
            let k = (k_max as usize).min(n - self.generated.len() - 1);
            let pt = Instant::now();
            let drafts = meter.around(|| proposer.draft(next, k, n_vocab, spec.proposer, &mut report))?;
            report.proposer_s += pt.elapsed().as_secs_f64();
            let base = ctx.n_past();
            let fed: Vec<i32> = std::iter::once(next).chain(drafts.iter().copied()).collect();
            let snapshot = if k > 0 && !trims(model, ctx, k as u32) { Some(ctx.snapshot()?) } else { None };
            rows.clear();
            ctx.decode(&fed, true, &mut rows)?;
            report.traversal(fed.len(), model.has_recurrent_state());
            let hidden = ctx.hidden().to_vec();
            let events = ctx.take_routes();
            let (u, l) = union_per_layer(&events);
            union_sum += u;
            union_n += l;
            // Row i follows fed[i]; draft i is accepted while the target's row agrees.
            let row = |i: usize| &rows[i * n_vocab..(i + 1) * n_vocab];
            let mut accepted = 0;
            while accepted < drafts.len() && argmax(row(accepted)) as i32 == drafts[accepted] {
                accepted += 1;
            }
            report.count(drafts.len(), accepted);
            // An accepted end of generation ends the run where one-token decoding would.
            let eog = drafts[..accepted].iter().position(|&d| !spec.ignore_eos && model.is_eog(d));
            let committed = eog.unwrap_or(accepted);
            // As one-token decoding numbers them, its ubatches after the prompt's.
            let ubatch = ubatches + (base as u32 - prompt.len() as u32);
            self.keep_committed(&rows, events, committed, n_vocab, (base as u32, spec.target), ubatch)?;
            for &d in &drafts[..committed] {
                self.generated.push(d);
                self.origins.push(Origin::Accepted);
                self.response.extend(model.token_bytes(d));
            }
            if eog.is_some() {
                self.stop = "end_of_generation";
                break;
            }
            if accepted < drafts.len() {
                take_back(ctx, model, snapshot.as_deref(), &fed, base, accepted, &mut report)?;
            }
            let pt = Instant::now();
            meter.around(|| proposer.settle(&drafts, accepted, &hidden, &mut report))?;
            report.proposer_s += pt.elapsed().as_secs_f64();
            self.recurrent.capture(ctx)?;
            // The target's own token after the accepted drafts: committed at the loop's top.
            next = argmax(row(accepted)) as i32;
            origin = if accepted < drafts.len() { Origin::Corrected } else { Origin::Target };
        }
        self.decode_s = t2.elapsed().as_secs_f64() - self.recurrent.capture_s;
        report.outputs = self.generated.len().saturating_sub(1) as u64;
        report.outputs_per_traversal = report.outputs as f64 / report.traversals.max(1) as f64;
        report.mean_union_experts = union_sum as f64 / union_n.max(1) as f64;
        if let (Some(a), Some(b)) = (bytes_before, source_bytes(model)) {
            report.expert_bytes = Some(b - a);
            report.expert_bytes_per_output = Some((b - a) as f64 / report.outputs.max(1) as f64);
            report.expert_bytes_per_traversal = Some((b - a) as f64 / report.traversals.max(1) as f64);
            report.proposer_expert_bytes = Some(meter.bytes);
        }
        Ok(report)
    }

    /// Rows 0..=committed of a traversal followed committed tokens: the rows one-token decoding
    /// would have produced, kept with their routes renumbered as its ubatches (one a position,
    /// from `ubatch`, layers in order). The others followed rejected drafts and are dropped.
    fn keep_committed(
        &mut self,
        rows: &[f32],
        events: Vec<RouteEvent>,
        committed: usize,
        n_vocab: usize,
        (base, who): (u32, &str),
        ubatch: u32,
    ) -> Result<()> {
        let kept = &rows[..(committed + 1) * n_vocab];
        check_finite(kept, n_vocab, 0).with_context(|| format!("{who} logits from position {base}"))?;
        self.logits.extend_from_slice(kept);
        let first = self.routes.len();
        for e in events.into_iter().filter(|e| (e.row as usize) <= committed) {
            self.routes.push(RouteEvent { ubatch: ubatch + e.row, row: 0, pos: base + e.row, layer: e.layer, experts: e.experts });
        }
        self.routes[first..].sort_by_key(|e| (e.ubatch, e.layer));
        Ok(())
    }
}

/// Expert bytes the target's source reads while the proposer works.
struct ProposerBytes<'a> {
    model: &'a Model,
    bytes: u64,
}

impl ProposerBytes<'_> {
    fn around<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let before = source_bytes(self.model);
        let r = f();
        if let (Some(b), Some(a)) = (before, source_bytes(self.model)) {
            self.bytes += a - b;
        }
        r
    }
}

impl SpeculativeReport {
    /// A target traversal fed `positions`: with recurrent state, one state staged a position,
    /// the winner committed and the others rebased onto it.
    fn traversal(&mut self, positions: usize, recurrent: bool) {
        self.traversals += 1;
        if recurrent {
            self.state_stages += positions as u64;
            self.winner_commits += 1;
            self.loser_rebases += positions as u64 - 1;
        }
    }

    /// A traversal offered `drafted` drafts and accepted the first `accepted`.
    fn count(&mut self, drafted: usize, accepted: usize) {
        for i in 0..drafted {
            self.offered_by_position[i] += 1;
            self.accepted_by_position[i] += u64::from(i < accepted);
        }
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
    }
}

/// Takes the rejected positions after `fed[..=accepted]` back from the target: a trim where its
/// memory can, else the state before the traversal restored and the committed positions fed
/// again (one more target decode, whose rows and routes are not the run's).
fn take_back(
    ctx: &mut Context,
    model: &Model,
    snapshot: Option<&[u8]>,
    fed: &[i32],
    base: i32,
    accepted: usize,
    report: &mut SpeculativeReport,
) -> Result<()> {
    let rejected = fed.len() - 1 - accepted;
    report.rollbacks += 1;
    report.rolled_back_positions += rejected as u64;
    match snapshot {
        None => {
            report.state_rollbacks += u64::from(model.has_recurrent_state());
            ctx.trim(base + 1 + accepted as i32).with_context(|| format!("the target could not take back {rejected} rejected positions"))
        }
        Some(state) => {
            ctx.restore(state, base)?;
            let mut again = Vec::new();
            ctx.decode(&fed[..=accepted], false, &mut again)?;
            ctx.take_routes();
            report.state_restores += 1;
            report.refed_positions += accepted as u64 + 1;
            Ok(())
        }
    }
}
