//! The budget sizes the Plan. With `--memory-max` (slot pools in host memory) or `--gpu-budget`
//! (slot pools on the device) and neither `--slots` nor `--policy`, a probe load of the model
//! with one slot per layer measures what the run holds there besides its slots (weights, KV
//! and recurrent state, compute buffers, exactly as the engine allocates them); the slots per
//! layer are what the budget holds beyond that, a margin and (in host memory) the logits rows
//! and F's windows, and the policy is LRU over all of them ([`crate::plan::budget::settle`]).
//! Every term goes on record.

use crate::engine::{Context, ExpertSource, SlotPool};
use crate::exec::ExecRequest;
use crate::inventory::Inventory;
use crate::plan::budget::{refuse_below_floor, settle, BudgetSizing, PlanBudget, Tier};
use crate::plan::report::{OtherSource, SourceDescription, SourceReport};
use crate::plan::{Manifest, PlanOptions, SourceKind};
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};

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

    fn describe(&self) -> SourceDescription {
        SourceDescription::Other(OtherSource::new("budget probe", &[("slots", 1)]))
    }

    fn finish(&mut self) -> Result<SourceReport> {
        Ok(SourceReport::Other(OtherSource::new("budget probe", &[])))
    }
}

/// Sizes `options` (slots and an LRU policy over them) from `budget` by a probe load of
/// `model` with the run's context (`exec`, the prompt and `n_predict` outputs).
pub fn size(
    model: &Path,
    inv: &Inventory,
    options: &PlanOptions,
    budget: PlanBudget,
    exec: ExecRequest,
    prompt: &[u8],
    n_predict: u32,
) -> Result<(PlanOptions, BudgetSizing)> {
    let n_experts = inv.moe_layers.iter().map(|l| l.experts).max().ok_or_else(|| anyhow!("{}: no MoE layer to size", model.display()))?;
    let mut largest = std::collections::BTreeMap::<u32, u64>::new();
    for o in &inv.objects {
        let e = largest.entry(o.layer).or_default();
        *e = (*e).max(o.bytes());
    }
    refuse_below_floor(budget, largest.values().sum())?;
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
        bail!(
            "{} sizes slot pools on the {}, but the engine placed them on {devices:?}",
            budget.tier.flag(),
            if budget.tier == Tier::Host { "host" } else { "device" }
        );
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
