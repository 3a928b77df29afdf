//! The budget sizes the Plan. With `--memory-max` (slot pools in host memory) or `--gpu-budget`
//! (slot pools on the device) and neither `--slots` nor `--policy`, a probe load of the model
//! with one slot per layer measures what the run holds there besides its slots (weights, KV
//! and recurrent state, compute buffers, exactly as the engine allocates them); the slots per
//! layer are what the budget holds beyond that, a margin and (in host memory) the logits rows
//! and F's windows, and the policy is LRU over all of them. Every term goes on record.

use crate::engine::{Context, ExecRequest, ExpertSource, SlotPool};
use crate::inventory::Inventory;
use crate::plan::{Manifest, PlanOptions, SourceKind};
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Where the slot pools live, and so which budget sizes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Host memory, under `--memory-max`.
    Host,
    /// The offload device (a GPU, an RPC device), under `--gpu-budget`.
    Device,
}

impl Tier {
    pub fn flag(self) -> &'static str {
        match self {
            Tier::Host => "--memory-max",
            Tier::Device => "--gpu-budget",
        }
    }
}

/// The budget a Plan with no slots or policy of its own is sized from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanBudget {
    pub bytes: u64,
    pub tier: Tier,
}

/// The least margin kept free of a budget: the process beside its buffers (host), the
/// runtime's own context and library workspaces (device).
const HOST_MARGIN: u64 = 256 << 20;
const DEVICE_MARGIN: u64 = 768 << 20;

/// Every term of a budget-sized Plan, as the record states it (bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetSizing {
    pub tier: Tier,
    pub budget: u64,
    /// Measured on the tier by the probe load: weights llama.cpp loaded there, KV cache and
    /// recurrent state, compute buffers.
    pub weights: u64,
    pub context: u64,
    pub compute: u64,
    /// Host tier: every logits row the run keeps (prompt and outputs); 0 on the device.
    pub logits: u64,
    /// max(the tier's least margin, a sixteenth of the budget).
    pub margin: u64,
    /// One slot in every MoE layer, every role, as the engine lays it out on the tier (host
    /// pools: a page of head room and tail per pool added), plus, on the host with F, its
    /// window.
    pub per_slot: u64,
    /// Experts per layer: no more slots than that are of use.
    pub n_experts: u32,
    pub slots: u32,
    pub policy: String,
    /// The least budget that holds one slot per layer.
    pub least_budget: u64,
}

impl BudgetSizing {
    fn need(&self) -> u64 {
        self.weights + self.context + self.compute + self.logits + self.margin
    }
}

/// The expert source of the probe load: it takes the engine's pools of one slot and records
/// their device and bytes where the caller reads them (the engine owns the source while the
/// model lives); it never serves (the probe decodes nothing).
struct Probe {
    pools: Arc<Mutex<Vec<(String, u64)>>>,
}

impl ExpertSource for Probe {
    fn n_slots(&self) -> u32 {
        1
    }

    fn pool(&mut self, _layer: u32, _name: &str, _slot_bytes: usize, _n_slots: u32, pool: SlotPool) -> Result<u32> {
        let mut pools = self.pools.lock().map_err(|_| anyhow!("the probe's pools were poisoned"))?;
        pools.push((pool.device().to_string(), pool.bytes()));
        Ok(pools.len() as u32 - 1)
    }

    fn acquire(&mut self, layer: u32, _pass: u32, _ids: &[i32], _slots: &mut [i32]) -> Result<()> {
        bail!("layer {layer}: the sizing probe serves no experts")
    }

    fn release(&mut self, _layer: u32, _pass: u32) -> Result<()> {
        Ok(())
    }
}

/// Sizes `options` (slots and an LRU policy over them) from `budget` by a probe load of
/// `model` with the run's context (`exec`, the prompt and `n_predict` outputs).
pub fn size(model: &Path, inv: &Inventory, options: &PlanOptions, budget: PlanBudget, exec: ExecRequest, prompt: &[u8], n_predict: u32) -> Result<(PlanOptions, BudgetSizing)> {
    let n_experts = inv.moe_layers.iter().map(|l| l.experts).max().ok_or_else(|| anyhow!("{}: no MoE layer to size", model.display()))?;
    let pools = Arc::new(Mutex::new(Vec::new()));
    let (buffers, rows, n_vocab) = {
        let m = crate::generate::load_model(model, Some(Box::new(Probe { pools: pools.clone() })))?;
        let tokens = m.tokenize(prompt, true)?.len();
        let n_ctx = crate::bounds::context(exec.n_ctx, "prompt", tokens, n_predict, inv.trained_context().as_ref())
            .map_err(|e| anyhow!("{}: {e}", model.display()))?;
        let ctx = Context::new(&m, exec.with_ctx(n_ctx), false)?;
        (ctx.device_memory(), tokens + n_predict as usize, m.n_vocab())
    };
    let pools = pools.lock().map_err(|_| anyhow!("the probe's pools were poisoned"))?.clone();
    let on_tier = |device: &str| (device == "CPU") == (budget.tier == Tier::Host);
    let measured = buffers.iter().filter(|b| on_tier(&b.device));
    let (weights, context, compute) = measured.fold((0, 0, 0), |(w, c, k), b| (w + b.model, c + b.context, k + b.compute));
    let tier_pools: Vec<u64> = pools.iter().filter(|(d, _)| on_tier(d)).map(|&(_, b)| b).collect();
    if tier_pools.is_empty() {
        let devices: Vec<&str> = pools.iter().map(|(d, _)| d.as_str()).collect();
        bail!("{} sizes slot pools on the {}, but the engine placed them on {devices:?}", budget.tier.flag(), if budget.tier == Tier::Host { "host" } else { "device" });
    }
    let window = if budget.tier == Tier::Host && options.source == SourceKind::F { Manifest::new(inv, 1, &[])?.window_size } else { 0 };
    let page_per_pool = if budget.tier == Tier::Host { 4096 } else { 0 };
    let per_slot = tier_pools.iter().map(|b| b + page_per_pool).sum::<u64>() + window;
    let logits = if budget.tier == Tier::Host { (rows * n_vocab * 4) as u64 } else { 0 };
    let s = settle(BudgetSizing {
        tier: budget.tier,
        budget: budget.bytes,
        weights,
        context,
        compute,
        logits,
        margin: 0,
        per_slot,
        n_experts,
        slots: 0,
        policy: String::new(),
        least_budget: 0,
    })?;
    let policy = s.policy.parse().map_err(|e| anyhow!("{e}"))?;
    Ok((PlanOptions { slots: s.slots, policy, budget: None, ..options.clone() }, s))
}

/// The margin, the least budget, the slots and the policy from the measured terms; refused
/// where the budget cannot hold one slot per layer beside them.
fn settle(mut s: BudgetSizing) -> Result<BudgetSizing> {
    let least = if s.tier == Tier::Host { HOST_MARGIN } else { DEVICE_MARGIN };
    s.margin = least.max(s.budget / 16);
    // The least budget: the need at that budget (its margin grows with it) plus one slot. The
    // need less the budget only falls as the budget grows, so the first that holds is the least.
    let fixed = s.weights + s.context + s.compute + s.logits + s.per_slot;
    let holds = |b: u64| b >= fixed + least.max(b / 16);
    let mut b = if holds(fixed + least) { fixed + least } else { (fixed * 16 / 15).saturating_sub(2) };
    while !holds(b) {
        b += 1;
    }
    s.least_budget = b;
    if s.budget < s.need() + s.per_slot {
        bail!(
            "{} {}: too small to hold one expert per layer beside the run's own memory (weights {}, KV/state {}, compute {}, logits {}, margin {}, one slot per layer {} bytes); the least budget that would is {} bytes",
            s.tier.flag(),
            s.budget,
            s.weights,
            s.context,
            s.compute,
            s.logits,
            s.margin,
            s.per_slot,
            s.least_budget
        );
    }
    s.slots = u32::try_from((s.budget - s.need()) / s.per_slot).unwrap_or(u32::MAX).clamp(1, s.n_experts);
    s.policy = format!("lru:{}", s.slots);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(tier: Tier, budget: u64) -> BudgetSizing {
        BudgetSizing {
            tier,
            budget,
            weights: 100 << 20,
            context: 8 << 20,
            compute: 30 << 20,
            logits: 2 << 20,
            margin: 0,
            per_slot: 36 << 20,
            n_experts: 128,
            slots: 0,
            policy: String::new(),
            least_budget: 0,
        }
    }

    #[test]
    fn the_least_budget_holds_one_slot_and_a_byte_less_is_refused() {
        // Measured terms far above the margin: the least budget's margin is its sixteenth.
        let big = |tier, budget| BudgetSizing { weights: (7 << 30) + 12345, ..terms(tier, budget) };
        for (t, tier, budget) in [(terms as fn(Tier, u64) -> BudgetSizing, Tier::Host, 1u64 << 30), (terms, Tier::Device, 2 << 30), (terms, Tier::Host, 64 << 30), (big, Tier::Device, 16 << 30)] {
            let terms = t;
            let least = settle(terms(tier, budget)).unwrap().least_budget;
            assert_eq!(settle(terms(tier, least)).unwrap().slots, 1, "{tier:?}");
            let e = settle(terms(tier, least - 1)).unwrap_err().to_string();
            assert!(e.contains(&format!("the least budget that would is {least} bytes")) && e.contains(tier.flag()), "{e}");
        }
    }

    #[test]
    fn slots_are_what_the_budget_holds_beyond_the_terms_and_never_more_than_the_experts() {
        let s = settle(terms(Tier::Host, 2 << 30)).unwrap();
        // 2 GiB less 140 MiB measured and the 256 MiB margin, in slots of 36 MiB: 45.
        assert_eq!((s.margin, s.slots, s.policy.as_str()), (256 << 20, 45, "lru:45"));
        // A sixteenth of a large budget is the margin; every expert fits, and no more slots.
        let s = settle(terms(Tier::Device, 64 << 30)).unwrap();
        assert_eq!((s.margin, s.slots), (4 << 30, 128));
    }
}

