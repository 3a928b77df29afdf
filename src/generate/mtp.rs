//! The target's own multi-token-prediction head as its proposer (seed 000 A.1).
//!
//! An MTP context runs the model's nextn block. Its entry at position p is the token at p and
//! the target's hidden row (`h_nextn`) at p - 1; its output predicts the token at p + 1. After
//! the prompt the head has an entry for every prompt position. A draft feeds the last
//! committed token beside the target's hidden row before it, then each draft beside the head's
//! own hidden row, as llama.cpp's draft-mtp driver does for one head. Once the target has
//! checked the drafts, the head keeps its first entry (the committed token, a target row
//! beside it), forgets the drafted ones and is fed the accepted drafts beside the target's
//! rows of that traversal, so its memory always holds target rows at committed positions.

use super::check_finite;
use super::draft::Drafter;
use crate::engine::{Context, Model};
use crate::inventory::Inventory;
use crate::record::format::SpeculativeReport;
use crate::routes::RouteEvent;
use anyhow::{bail, Context as _, Result};

/// The architectures whose nextn graph the driver runs: one trained head each.
const ONE_HEAD: [&str; 6] = ["qwen35moe", "glm4moe", "deepseek32", "glm-dsa", "mimo2", "hy_v3"];

/// Refuses a model whose MTP head cannot draft here; the head's layer index where it can.
pub fn check(inv: &Inventory, model: &Model) -> Result<u32> {
    let n = model.n_nextn();
    if n == 0 {
        bail!("--draft mtp: the model has no MTP (nextn) block (<arch>.nextn_predict_layers is 0 or absent)");
    }
    if !ONE_HEAD.contains(&inv.architecture.as_str()) {
        bail!("--draft mtp: the nextn head of `{}` is not driven here (only {})", inv.architecture, ONE_HEAD.join(", "));
    }
    // llama.cpp's MTP graphs of both assert a single block.
    if n != 1 {
        bail!("--draft mtp: `{}` drafts with one nextn block; the model has {n}", inv.architecture);
    }
    let head = inv.mtp_head().with_context(|| format!("--draft mtp: the file declares {n} nextn blocks but names {:?}", inv.mtp_layers))?;
    // A file may keep the key and drop the block (glm4moe's loader then takes the trunk alone);
    // the head's graph asserts these tensors, so their absence is refused here.
    for t in head_tensors(&inv.architecture) {
        let name = format!("blk.{head}.{t}.weight");
        if !inv.tensors.iter().any(|x| x.name == name) {
            bail!("--draft mtp: the file declares a nextn block at layer {head} but has no `{name}` (its MTP tensors were left out)");
        }
    }
    Ok(head)
}

/// The tensors of a nextn block that llama.cpp's MTP graph of `arch` asserts: mimo2's head is
/// a dense block with fused QKV, the others' a MoE block.
fn head_tensors(arch: &str) -> [&'static str; 4] {
    let last = if arch == "mimo2" { "attn_qkv" } else { "ffn_gate_inp" };
    ["nextn.eh_proj", "nextn.enorm", "nextn.hnorm", last]
}

/// The MTP head: its context, and the target's hidden row at the last committed position.
pub struct MtpHead<'m> {
    ctx: Context<'m>,
    n_vocab: usize,
    width: usize,
    /// The target's hidden row at the position before the next entry.
    pending: Vec<f32>,
    /// The head's position when the last draft call began (the target's too).
    base: i32,
    /// Whether the last draft call fed the head its first entry (the committed token).
    fed_first: bool,
    /// The committed token fed first, kept for a traversal without drafts.
    next: i32,
    rows: Vec<f32>,
    /// Every routing of the head's block, in decode order.
    routes: Vec<RouteEvent>,
}

impl<'m> MtpHead<'m> {
    pub fn new(model: &Model, ctx: Context<'m>) -> MtpHead<'m> {
        let width = model.n_embd_out();
        MtpHead {
            ctx,
            n_vocab: model.n_vocab(),
            width,
            pending: vec![0.0; width],
            base: 0,
            fed_first: false,
            next: 0,
            rows: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// Feeds entries (token, state row) at the head's next positions; keeps the last logits row.
    fn feed(&mut self, tokens: &[i32], states: &[f32], name: &str, report: &mut SpeculativeReport) -> Result<()> {
        let at = self.ctx.n_past() as usize + tokens.len() - 1;
        self.rows.clear();
        self.ctx.decode_with_states(tokens, states, false, &mut self.rows).with_context(|| format!("the {name}"))?;
        self.routes.extend(self.ctx.take_routes());
        report.proposer_decodes += 1;
        check_finite(&self.rows, self.n_vocab, 0).with_context(|| format!("{name} logits from position {at}"))
    }

    /// The head's routes (its context captures them when made so).
    pub fn into_routes(self) -> Vec<RouteEvent> {
        self.routes
    }

    /// The target's hidden row `i` of a decode's rows.
    fn row<'a>(&self, hidden: &'a [f32], i: usize) -> Result<&'a [f32]> {
        hidden.get(i * self.width..(i + 1) * self.width).with_context(|| format!("the target kept no hidden row {i}"))
    }
}

impl Drafter for MtpHead<'_> {
    fn prompted(&mut self, prompt: &[i32], hidden: &[f32], report: &mut SpeculativeReport) -> Result<()> {
        // Entry p pairs token p with the target's row at p - 1; the first with zeros.
        let n = prompt.len();
        self.row(hidden, n - 1)?;
        let mut states = Vec::with_capacity(n * self.width);
        states.extend_from_slice(&self.pending);
        states.extend_from_slice(&hidden[..(n - 1) * self.width]);
        self.feed(prompt, &states, "MTP head", report)?;
        self.pending = self.row(hidden, n - 1)?.to_vec();
        Ok(())
    }

    fn draft(&mut self, next: i32, k: usize, n_target: usize, name: &str, report: &mut SpeculativeReport) -> Result<Vec<i32>> {
        self.next = next;
        self.base = self.ctx.n_past();
        self.fed_first = k > 0;
        let mut drafts = Vec::with_capacity(k);
        if k == 0 {
            return Ok(drafts);
        }
        let state = self.pending.clone();
        self.feed(&[next], &state, name, report)?;
        while drafts.len() < k {
            let d = super::argmax(&self.rows) as i32;
            if d as usize >= n_target {
                report.out_of_vocabulary += 1;
                break;
            }
            drafts.push(d);
            if drafts.len() < k {
                // The head's own hidden row of the entry that proposed `d`.
                let own = self.ctx.hidden().to_vec();
                self.feed(&[d], &own, name, report)?;
            }
        }
        Ok(drafts)
    }

    fn settle(&mut self, drafts: &[i32], accepted: usize, hidden: &[f32], report: &mut SpeculativeReport) -> Result<()> {
        // The first entry, where the draft fed it, is what the head keeps: its token is committed
        // and its state is the target's. The drafted entries after it are forgotten.
        self.ctx.trim(self.base + i32::from(self.fed_first)).context("the MTP head could not forget its drafts")?;
        let mut tokens = Vec::with_capacity(accepted + 1);
        let mut states = Vec::with_capacity((accepted + 1) * self.width);
        if !self.fed_first {
            tokens.push(self.next);
            states.extend_from_slice(&self.pending);
        }
        for (i, &d) in drafts[..accepted].iter().enumerate() {
            tokens.push(d);
            states.extend_from_slice(self.row(hidden, i)?);
        }
        if !tokens.is_empty() {
            self.feed(&tokens, &states, "MTP head", report)?;
        }
        self.pending = self.row(hidden, accepted)?.to_vec();
        Ok(())
    }
}
