//! A Plan sized by a budget: the budget of the pools' tier, the terms measured against it, and
//! the arithmetic that turns them into slots and a policy ([`settle`]). The measuring (a probe
//! load of the model) is the `budget` room's, above the engine.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

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

/// Refuses a host budget below the least margin and one expert per layer (the raw bytes of each
/// MoE layer's largest expert), from the file alone: [`settle`] would refuse it after the probe
/// load, which such a limit cannot hold (the worker would be killed instead of saying why).
pub fn refuse_below_floor(budget: PlanBudget, one_expert_per_layer: u64) -> Result<()> {
    let floor = HOST_MARGIN + one_expert_per_layer;
    if budget.tier == Tier::Host && budget.bytes < floor {
        bail!(
            "{} {}: too small to hold one expert per layer beside the run's own memory (margin {HOST_MARGIN}, one expert per layer {one_expert_per_layer} bytes, before the weights, KV/state and compute buffers a probe load measures); the least budget that would is above {floor} bytes",
            budget.tier.flag(),
            budget.bytes
        );
    }
    Ok(())
}

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
    pub fn need(&self) -> u64 {
        self.weights + self.context + self.compute + self.logits + self.margin
    }
}

/// The margin, the least budget, the slots and the policy from the measured terms; refused
/// where the budget cannot hold one slot per layer beside them.
pub fn settle(mut s: BudgetSizing) -> Result<BudgetSizing> {
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
    fn a_host_budget_below_the_margin_and_one_expert_per_layer_is_refused_before_the_probe() {
        let host = |bytes| PlanBudget { bytes, tier: Tier::Host };
        let floor = HOST_MARGIN + (36 << 20);
        let e = refuse_below_floor(host(floor - 1), 36 << 20).unwrap_err().to_string();
        assert!(e.contains(&format!("--memory-max {}: too small", floor - 1)) && e.contains(&format!("is above {floor} bytes")), "{e}");
        refuse_below_floor(host(floor), 36 << 20).unwrap();
        // The floor is below what settle asks for the same slot: whatever passes here is the probe's to size.
        let least = settle(terms(Tier::Host, 1 << 30)).unwrap().least_budget;
        assert!(floor < least);
        // A device budget is the probe's alone: it does not bound the host process.
        refuse_below_floor(PlanBudget { bytes: 1, tier: Tier::Device }, 36 << 20).unwrap();
    }

    #[test]
    fn the_least_budget_holds_one_slot_and_a_byte_less_is_refused() {
        // Measured terms far above the margin: the least budget's margin is its sixteenth.
        let big = |tier, budget| BudgetSizing { weights: (7 << 30) + 12345, ..terms(tier, budget) };
        for (t, tier, budget) in [
            (terms as fn(Tier, u64) -> BudgetSizing, Tier::Host, 1u64 << 30),
            (terms, Tier::Device, 2 << 30),
            (terms, Tier::Host, 64 << 30),
            (big, Tier::Device, 16 << 30),
        ] {
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
