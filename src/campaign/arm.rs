//! An arm parsed into what it is. [`Arm`] stays the file's form, all of its fields optional,
//! because it is what a campaign freezes and what `cell.json` carries: its serialisation fixes
//! every campaign digest. [`Arm::kind`] is the one place its fields are checked against each
//! other; what consumes an arm takes the [`ArmKind`] and finds only the fields that belong. A
//! Plan arm parses into the same [`PlanOptions`] that `generate`'s flags and a cell carry.

use super::spec::{Arm, ExpertsMode, FaultCell, Measure, RefineArm, RpcArm};
use crate::bounds::range;
use crate::exec::GpuLayers;
use crate::plan::budget::{PlanBudget, Tier};
use crate::plan::PlanOptions;

/// A run, or a measurement cell.
#[derive(Debug, Clone, PartialEq)]
pub enum ArmKind {
    Run(RunArm),
    Measure(Measure),
}

/// A run arm: what it runs, how it holds its experts, its threads and host cap.
#[derive(Debug, Clone, PartialEq)]
pub struct RunArm {
    /// Engine threads; absent, the machine that runs the cell derives them
    /// ([`crate::bounds::threads`]) and the record names them.
    pub threads: Option<u32>,
    /// Hard host memory limit over the cell's whole process tree (`memory_cap_bytes`).
    pub memory_cap_bytes: Option<u64>,
    pub experts: ArmExperts,
    pub program: Program,
}

/// How a run arm holds its experts, with the fields only that way has.
#[derive(Debug, Clone, PartialEq)]
pub enum ArmExperts {
    /// `warm`: the runner reads the model through the page cache before the cell.
    Resident {
        warm: bool,
    },
    Host,
    /// `experts: plan`: slots and policy named, or both left to the budget of the pools' tier
    /// (`budget` set: `memory_cap_bytes` for host pools, the device's budget with
    /// `gpu_layers`); the fault absent in the file is `none`, the no-fault control.
    Plan(PlanOptions),
}

/// What a run arm runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Program {
    /// `sovereign generate`, with layers on a device when the arm names `gpu_layers`, and
    /// with a proposer when it names `draft`.
    /// With a session workload, `between` says what carries from one request to the next.
    Generate { device: Option<DeviceArm>, draft: Option<ArmDraft>, between: Option<crate::session::BetweenMode> },
    /// `sovereign refine` (on the CPU: no device fields).
    Refine(RefineArm),
}

/// A generate arm's proposer (`draft`, `draft_max`): one of the campaign's `proposers`, or
/// [`MTP`], the model's own multi-token-prediction head.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmDraft {
    pub proposer: String,
    pub max: u32,
}

pub use super::spec::MTP;

impl ArmDraft {
    pub fn is_mtp(&self) -> bool {
        self.proposer == MTP
    }
}

/// Layers placed on a device, and what only such an arm may name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceArm {
    pub gpu_layers: GpuLayers,
    pub gpu_budget: Option<u64>,
    /// `rpc: local`: a device server the runner starts for each cell.
    pub rpc: Option<LocalDevice>,
}

/// An `rpc: local` device server, in a cgroup of its own under `device_memory_cap_bytes`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalDevice {
    pub memory_cap_bytes: Option<u64>,
}

impl ArmKind {
    pub fn run(&self) -> Option<&RunArm> {
        match self {
            ArmKind::Run(r) => Some(r),
            ArmKind::Measure(_) => None,
        }
    }
}

impl DeviceArm {
    /// The cell's device budget: the device cap, unless `gpu_budget` says less.
    pub fn budget(&self) -> Option<u64> {
        match (self.gpu_budget, self.rpc.and_then(|r| r.memory_cap_bytes)) {
            (Some(b), Some(c)) => Some(b.min(c)),
            (b, c) => b.or(c),
        }
    }

    /// llama's `n_gpu_layers`: -1 for `all`.
    pub fn n_gpu_layers(&self) -> i32 {
        match self.gpu_layers {
            GpuLayers::All(_) => -1,
            GpuLayers::Count(n) => n,
        }
    }
}

impl RunArm {
    pub fn plan(&self) -> Option<&PlanOptions> {
        match &self.experts {
            ArmExperts::Plan(p) => Some(p),
            ArmExperts::Resident { .. } | ArmExperts::Host => None,
        }
    }

    pub fn device(&self) -> Option<&DeviceArm> {
        match &self.program {
            Program::Generate { device, .. } => device.as_ref(),
            Program::Refine(_) => None,
        }
    }

    pub fn warm(&self) -> bool {
        matches!(self.experts, ArmExperts::Resident { warm: true })
    }

    pub fn draft(&self) -> Option<&ArmDraft> {
        match &self.program {
            Program::Generate { draft, .. } => draft.as_ref(),
            Program::Refine(_) => None,
        }
    }
}

/// Why an arm's fields do not make an arm: one line each, naming the arm and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct ArmError(pub Vec<String>);

impl Arm {
    /// Parses the arm into what it is, or every field that is missing, out of range or does not
    /// belong to it.
    pub fn kind(&self) -> Result<ArmKind, ArmError> {
        let id = &self.id.value;
        if let Some(m) = &self.measure {
            let problems = self.measure_problems(m);
            return if problems.is_empty() { Ok(ArmKind::Measure(m.clone())) } else { Err(ArmError(problems)) };
        }
        let Some(mode) = self.experts else {
            return Err(ArmError(vec![format!("arm `{id}` needs `experts` (resident, plan, host), or `measure` (envelope, read_replay)")]));
        };
        let parts = (self.bounded_threads(), self.held_experts(mode), self.program(), self.memory_cap());
        match parts {
            (Ok(()), Ok(experts), Ok(program), Ok(memory_cap_bytes)) => {
                Ok(ArmKind::Run(RunArm { threads: self.threads, memory_cap_bytes, experts, program }))
            }
            (t, e, p, m) => {
                let fields = [t.err(), e.err(), p.err(), m.err()].into_iter().flatten().flatten();
                Err(ArmError(fields.map(|m| format!("arm `{id}`: {m}")).collect()))
            }
        }
    }

    fn bounded_threads(&self) -> Result<(), Vec<String>> {
        match self.threads {
            Some(t) => range("threads", t.into(), 1, crate::bounds::MAX_THREADS as u64, "the run refuses more than 4 x its cores")
                .map_err(|e| vec![e.to_string()]),
            None => Ok(()),
        }
    }

    fn memory_cap(&self) -> Result<Option<u64>, Vec<String>> {
        use crate::bounds::{MAX_MEMORY_MAX, MIN_MEMORY_MAX};
        match self.memory_cap_bytes {
            Some(m) => range("memory_cap_bytes", m, MIN_MEMORY_MAX, MAX_MEMORY_MAX, "1 MiB up to 1 PiB")
                .map(|()| Some(m))
                .map_err(|e| vec![e.to_string()]),
            None => Ok(None),
        }
    }

    /// The experts as `experts` says, with the Plan's fields only under `experts: plan` and
    /// `warm` only on an uncapped resident generate arm.
    fn held_experts(&self, mode: ExpertsMode) -> Result<ArmExperts, Vec<String>> {
        let held = match mode {
            ExpertsMode::Resident => self.no_plan_fields().map(|()| ArmExperts::Resident { warm: self.warm }),
            ExpertsMode::Host => self.no_plan_fields().map(|()| ArmExperts::Host),
            ExpertsMode::Plan => self.plan_options().map(ArmExperts::Plan),
        };
        if self.warm && (mode != ExpertsMode::Resident || self.memory_cap_bytes.is_some() || self.refine.is_some()) {
            // A capped or streaming run must be charged for its own reads.
            let warm = "`warm` applies to resident generate arms without `memory_cap_bytes`".to_string();
            return Err(held.err().unwrap_or_default().into_iter().chain([warm]).collect());
        }
        held
    }

    /// Whether a field is set, by its name in the campaign, for each field of the Plan.
    fn plan_fields(&self) -> [(&'static str, bool); 11] {
        [
            ("slots", self.slots.is_some()),
            ("policy", self.policy.is_some()),
            ("source", self.source.is_some()),
            ("windows", self.windows.is_some()),
            ("depth", self.depth.is_some()),
            ("fault", self.fault.is_some()),
            ("layer_buffers", self.layer_buffers.is_some()),
            ("timeline_token", self.timeline_token.is_some()),
            ("token_pass", self.token_pass.is_some()),
            ("prompt_pass", self.prompt_pass.is_some()),
            ("verify", self.verify.is_some()),
        ]
    }

    fn no_plan_fields(&self) -> Result<(), Vec<String>> {
        let set: Vec<String> = self
            .plan_fields()
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| format!("`{name}` applies only to `experts: plan`"))
            .collect();
        if set.is_empty() {
            Ok(())
        } else {
            Err(set)
        }
    }

    /// The budget the arm's slot pools are sized from where it names neither slots nor policy:
    /// the device's (`gpu_budget`, or the `rpc: local` server's cap, the lesser) where layers go
    /// to a device, else `memory_cap_bytes`.
    fn plan_budget(&self) -> Option<PlanBudget> {
        match self.device_arm().filter(|d| d.n_gpu_layers() != 0) {
            Some(d) => d.budget().map(|bytes| PlanBudget { bytes, tier: Tier::Device }),
            None => self.memory_cap_bytes.map(|bytes| PlanBudget { bytes, tier: Tier::Host }),
        }
    }

    /// The device fields as the arm names them (checked against each other in `program`).
    fn device_arm(&self) -> Option<DeviceArm> {
        self.gpu_layers.map(|gpu_layers| DeviceArm {
            gpu_layers,
            gpu_budget: self.gpu_budget,
            rpc: self.rpc.map(|RpcArm::Local| LocalDevice { memory_cap_bytes: self.device_memory_cap_bytes }),
        })
    }

    /// Slots, policy and source named; windows, depth and layer buffers within the Plan's
    /// bounds (`bounds::PlanParams`); counts at least 1. Slots and policy both absent: the
    /// placeholders the budget replaces before the run loads.
    fn plan_options(&self) -> Result<PlanOptions, Vec<String>> {
        let mut msgs: Vec<String> = self.plan_bounds().err().map(|e| e.to_string()).into_iter().collect();
        if self.source.is_none() {
            msgs.push("`experts: plan` needs `source`".to_string());
        }
        // Slots and policy: both named, or both left to the budget of the pools' tier.
        let budget = self.plan_budget();
        match (self.slots.is_some(), self.policy.is_some()) {
            (true, true) => {}
            (false, false) if budget.is_some() => {}
            (false, false) => msgs.push(
                "`experts: plan` needs `slots` and `policy`, or a budget to size them from (`memory_cap_bytes`; with `gpu_layers`, `gpu_budget` or `device_memory_cap_bytes`)".to_string(),
            ),
            (set, _) => msgs.push(format!("`experts: plan` names `{}` without `{}`: name both, or neither to size them from the budget", if set { "slots" } else { "policy" }, if set { "policy" } else { "slots" })),
        }
        let counts = [("slots", self.slots), ("windows", self.windows), ("depth", self.depth), ("token_pass", self.token_pass)];
        msgs.extend(counts.iter().filter(|(_, v)| *v == Some(0)).map(|(name, _)| format!("`{name}` must be at least 1")));
        match self.source {
            Some(source) if msgs.is_empty() => Ok(PlanOptions {
                slots: self.slots.unwrap_or(crate::plan::options::DEFAULT_SLOTS),
                policy: self.policy.clone().unwrap_or_default(),
                source,
                windows: self.windows,
                depth: self.depth,
                layer_buffers: self.layer_buffers.unwrap_or(0),
                fault: self.fault.unwrap_or(FaultCell::None),
                timeline_token: self.timeline_token,
                token_pass: self.token_pass,
                prompt_pass: self.prompt_pass,
                budget: budget.filter(|_| self.slots.is_none()),
                verify: self.verify,
            }),
            _ => Err(msgs),
        }
    }

    fn plan_bounds(&self) -> anyhow::Result<()> {
        use crate::bounds::{MAX_DEPTH, MAX_LAYER_BUFFERS, MAX_SLOTS, MAX_TIMELINE_TOKEN, MAX_TOKEN_PASS, MAX_WINDOWS};
        range("slots", self.slots.unwrap_or(1).into(), 1, MAX_SLOTS as u64, "expert slots per layer")
            .and_then(|()| range("windows", self.windows.unwrap_or(1).into(), 1, MAX_WINDOWS as u64, "registered staging windows"))
            .and_then(|()| range("depth", self.depth.unwrap_or(1).into(), 1, MAX_DEPTH as u64, "io_uring's maximum of submission entries"))
            .and_then(|()| {
                range("layer_buffers", self.layer_buffers.unwrap_or(0).into(), 0, MAX_LAYER_BUFFERS as u64, "staging buffers per layer")
            })
            .and_then(|()| {
                range("timeline_token", self.timeline_token.unwrap_or(0).into(), 0, MAX_TIMELINE_TOKEN as u64, "a decode token's index")
            })
            .and_then(|()| {
                range("token_pass", self.token_pass.unwrap_or(1).into(), 0, MAX_TOKEN_PASS as u64, "distinct experts per engine pass")
            })
            .and_then(|()| {
                range("prompt_pass", self.prompt_pass.unwrap_or(0).into(), 0, MAX_SLOTS as u64, "distinct experts per engine pass")
            })
    }

    /// Generate or refine, with the device fields (`gpu_layers`, `rpc`, `gpu_budget`,
    /// `device_memory_cap_bytes`) each against the fields it needs or excludes.
    fn program(&self) -> Result<Program, Vec<String>> {
        let mut msgs = Vec::new();
        if self.rpc.is_some() && self.gpu_layers.is_none() {
            msgs.push("`rpc` needs `gpu_layers` (which layers go to the device)".to_string());
        }
        if self.gpu_budget.is_some() && self.gpu_layers.is_none() {
            msgs.push("`gpu_budget` needs `gpu_layers` (a budget bounds the device's memory)".to_string());
        }
        if self.device_memory_cap_bytes.is_some() && self.rpc.is_none() {
            msgs.push("`device_memory_cap_bytes` caps the `rpc: local` device server; this arm has no `rpc`".to_string());
        }
        if let Some(c) =
            self.device_memory_cap_bytes.filter(|&c| !(crate::bounds::MIN_MEMORY_MAX..=crate::bounds::MAX_MEMORY_MAX).contains(&c))
        {
            msgs.push(format!("`device_memory_cap_bytes` {c} is out of range (1 MiB up to 1 PiB)"));
        }
        msgs.extend(self.draft_problems());
        if self.draft.is_some() && self.between.is_some() {
            msgs.push("`draft` with `between`: a session's requests are decoded without a proposer".to_string());
        }
        if self.refine.is_some() {
            // A refine cell runs on the CPU: device fields would be silently ignored.
            let fields = [
                ("rpc", self.rpc.is_some()),
                ("gpu_layers", self.gpu_layers.is_some()),
                ("gpu_budget", self.gpu_budget.is_some()),
                ("draft", self.draft.is_some()),
                ("between", self.between.is_some()),
            ];
            for (field, set) in fields {
                if set {
                    msgs.push(format!("`{field}` applies to generate arms, not `refine`"));
                }
            }
        }
        if let Some(GpuLayers::Count(n)) = self.gpu_layers {
            if !(0..=i32::from(u16::MAX)).contains(&n) {
                msgs.push(format!("gpu_layers {n}: expected 0..={} or `all`", u16::MAX));
            }
        }
        if !msgs.is_empty() {
            return Err(msgs);
        }
        Ok(match &self.refine {
            Some(r) => Program::Refine(r.clone()),
            None => Program::Generate {
                device: self.device_arm(),
                draft: self.draft.clone().zip(self.draft_max).map(|(proposer, max)| ArmDraft { proposer, max }),
                between: self.between,
            },
        })
    }

    /// `draft` and `draft_max` come together, K within what one traversal (a ubatch) holds.
    fn draft_problems(&self) -> Vec<String> {
        match (&self.draft, self.draft_max) {
            (None, None) => Vec::new(),
            (Some(_), None) => vec!["`draft` needs `draft_max` (drafts one traversal checks)".to_string()],
            (None, Some(_)) => vec!["`draft_max` needs `draft` (the proposer)".to_string()],
            (Some(_), Some(k)) => {
                let max = crate::bounds::MAX_DRAFT.min(crate::cell::BATCH - 1);
                range("draft_max", k.into(), 1, max.into(), "drafts one traversal checks, below the ubatch")
                    .err()
                    .map(|e| e.to_string())
                    .into_iter()
                    .collect()
            }
        }
    }

    /// A measurement arm names its measurement and nothing of a run.
    fn measure_problems(&self, m: &Measure) -> Vec<String> {
        let id = &self.id.value;
        let run_fields = [
            ("experts", self.experts.is_some()),
            ("refine", self.refine.is_some()),
            ("memory_cap_bytes", self.memory_cap_bytes.is_some()),
            ("threads", self.threads.is_some()),
            ("gpu_layers", self.gpu_layers.is_some()),
            ("rpc", self.rpc.is_some()),
            ("gpu_budget", self.gpu_budget.is_some()),
            ("device_memory_cap_bytes", self.device_memory_cap_bytes.is_some()),
            ("warm", self.warm),
            ("draft", self.draft.is_some()),
            ("draft_max", self.draft_max.is_some()),
            ("between", self.between.is_some()),
        ];
        let set = self.plan_fields().into_iter().chain(run_fields).filter(|(_, set)| *set);
        let mut out: Vec<String> = set.map(|(name, _)| format!("arm `{id}`: `{name}` does not apply to a `measure` arm")).collect();
        match m {
            Measure::Envelope(e) => {
                if let Err(err) = crate::measure::check_envelope(e.block_bytes, &e.depths, e.bytes_per_depth) {
                    out.push(format!("arm `{id}`: measure.{err}"));
                }
            }
            Measure::ReadReplay(r) => {
                if let Some(d) = r.depth.filter(|&d| d == 0 || d > crate::measure::MAX_DEPTH) {
                    out.push(format!("arm `{id}`: measure.read_replay.depth {d}: expected 1..={}", crate::measure::MAX_DEPTH));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::parse;

    fn arm(c: &crate::campaign::Campaign, id: &str) -> ArmKind {
        c.arms.iter().find(|a| a.id.value == id).expect("defined").kind().expect("parses")
    }

    fn arm_of(fields: serde_json::Value) -> Arm {
        serde_json::from_value(fields).expect("arm fields")
    }

    #[test]
    fn every_plan_setting_is_an_arm_field_that_parses_into_the_one_plan_options() {
        let want = PlanOptions::every_setting();
        let serde_json::Value::Object(settings) = serde_json::to_value(&want).unwrap() else { panic!("an object") };
        let mut fields = settings.clone();
        fields.insert("id".into(), "A".into());
        fields.insert("experts".into(), "plan".into());
        let ArmKind::Run(r) = arm_of(fields.clone().into()).kind().unwrap() else { panic!("a run") };
        assert_eq!(r.plan(), Some(&want));
        // The budget: slots and policy left to the cap of the pools' tier.
        fields.remove("slots");
        fields.remove("policy");
        let budget = |fields: &serde_json::Map<String, serde_json::Value>| {
            let ArmKind::Run(r) = arm_of(fields.clone().into()).kind().unwrap() else { panic!("a run") };
            let plan = r.plan().unwrap().clone();
            assert_eq!((plan.slots, &plan.policy), (crate::plan::options::DEFAULT_SLOTS, &Default::default()));
            plan.budget
        };
        fields.insert("memory_cap_bytes".into(), (64u64 << 20).into());
        assert_eq!(budget(&fields), Some(PlanBudget { bytes: 64 << 20, tier: Tier::Host }));
        fields.insert("gpu_layers".into(), "all".into());
        fields.insert("rpc".into(), "local".into());
        fields.insert("device_memory_cap_bytes".into(), (32u64 << 20).into());
        assert_eq!(budget(&fields), Some(PlanBudget { bytes: 32 << 20, tier: Tier::Device }));
        fields.insert("gpu_budget".into(), (16u64 << 20).into());
        assert_eq!(budget(&fields), Some(PlanBudget { bytes: 16 << 20, tier: Tier::Device }));
        // A resident arm naming any one of them is refused by that name.
        for (name, value) in &settings {
            let a = arm_of(serde_json::json!({ "id": "A", "experts": "resident", name.as_str(): value }));
            assert_eq!(a.kind().unwrap_err().0, [format!("arm `A`: `{name}` applies only to `experts: plan`")]);
        }
    }

    #[test]
    fn arms_parse_into_what_they_are() {
        let c = parse(crate::campaign::tests::GOOD).unwrap();
        let ArmKind::Run(o) = arm(&c, "O") else { panic!("O is a run") };
        assert_eq!((o.threads, &o.experts, o.memory_cap_bytes), (Some(1), &ArmExperts::Resident { warm: false }, None));
        assert_eq!(o.program, Program::Generate { device: None, draft: None, between: None });
        let ArmKind::Run(d) = arm(&c, "D") else { panic!("D is a run") };
        assert_eq!(d.memory_cap_bytes, Some(16_777_216));
        let plan = d.plan().expect("D streams");
        assert_eq!(
            (plan.slots, &plan.policy, plan.source, plan.windows, plan.fault),
            (4, &"lru:2".parse().unwrap(), crate::plan::SourceKind::D, Some(1), FaultCell::None)
        );
        let ArmKind::Run(f) = arm(&c, "F") else { panic!("F is a run") };
        assert_eq!(f.plan().map(|p| p.fault), Some(FaultCell::ShortRead));
    }

    #[test]
    fn an_arm_without_threads_leaves_them_to_the_machine_that_runs_it() {
        let c = parse(crate::campaign::tests::GOOD).unwrap();
        for id in ["O", "D"] {
            let mut a = c.arms.iter().find(|a| a.id.value == id).unwrap().clone();
            a.threads = None;
            let ArmKind::Run(r) = a.kind().unwrap() else { panic!("{id} is a run") };
            assert_eq!(r.threads, None);
        }
    }

    #[test]
    fn a_device_arm_carries_its_budget_and_server() {
        let text = crate::campaign::tests::GOOD.replace(
            "  - id: O\n    experts: resident\n",
            "  - id: O\n    experts: resident\n    gpu_layers: all\n    rpc: local\n    gpu_budget: 4194304\n    device_memory_cap_bytes: 2097152\n",
        );
        let c = parse(&text).unwrap();
        let ArmKind::Run(o) = arm(&c, "O") else { panic!("O is a run") };
        let device = o.device().expect("O places layers on a device");
        assert_eq!(
            (device.n_gpu_layers(), device.rpc, device.budget()),
            (-1, Some(LocalDevice { memory_cap_bytes: Some(2_097_152) }), Some(2_097_152))
        );
    }

    #[test]
    fn a_drafted_arm_names_its_proposer_and_k_together() {
        let c = parse(crate::campaign::tests::GOOD).unwrap();
        let mut o = c.arms.iter().find(|a| a.id.value == "O").unwrap().clone();
        (o.draft, o.draft_max) = (Some("q4".into()), Some(4));
        let ArmKind::Run(r) = o.kind().unwrap() else { panic!("O is a run") };
        assert_eq!(r.draft(), Some(&ArmDraft { proposer: "q4".into(), max: 4 }));
        for (draft, max, want) in [
            (Some("q4"), None, "arm `O`: `draft` needs `draft_max` (drafts one traversal checks)"),
            (None, Some(4), "arm `O`: `draft_max` needs `draft` (the proposer)"),
            (Some("q4"), Some(0), "arm `O`: draft_max 0 is out of range"),
            (Some("q4"), Some(65), "arm `O`: draft_max 65 is out of range"),
        ] {
            (o.draft, o.draft_max) = (draft.map(str::to_string), max);
            let e = o.kind().unwrap_err();
            assert!(e.0.len() == 1 && e.0[0].starts_with(want), "{e:?}");
        }
    }

    #[test]
    fn a_field_that_does_not_belong_is_refused_by_name() {
        let c = parse(crate::campaign::tests::GOOD).unwrap();
        let mut o = c.arms.iter().find(|a| a.id.value == "O").unwrap().clone();
        o.slots = Some(3);
        o.threads = Some(0);
        let e = o.kind().unwrap_err();
        assert_eq!(e.0.len(), 2, "{e:?}");
        assert!(e.0[0].starts_with("arm `O`: threads 0 is out of range"), "{e:?}");
        assert_eq!(e.0[1], "arm `O`: `slots` applies only to `experts: plan`");
        // A measurement arm names nothing of a run, the Plan's fields included.
        let mut m = o.clone();
        (m.experts, m.slots, m.threads, m.timeline_token) = (None, None, None, Some(1));
        m.measure = Some(Measure::Envelope(crate::campaign::spec::EnvelopeMeasure {
            block_bytes: 1 << 20,
            depths: vec![1],
            bytes_per_depth: 1 << 20,
        }));
        assert_eq!(m.kind().unwrap_err().0, ["arm `O`: `timeline_token` does not apply to a `measure` arm"]);
    }
}
