//! Expansion: a campaign becomes the ordered list of cells (arm × block × position) it runs.

use super::arm::{ArmError, ArmKind};
use super::spec::{Arm, Campaign, ModelSpec, RefineModels, Workload};
use serde::{Deserialize, Serialize};

/// One cell: a single run of one arm at one place in the schedule. This is what an executor
/// receives and what `cell.json` inside the sealed record repeats (paths as the campaign wrote
/// them, never resolved machine paths).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellSpec {
    /// Position in the whole campaign, from 0.
    pub index: usize,
    /// Stable name: `b{block:02}-p{position}-{arm}`.
    pub key: String,
    /// 0 for `schedule.lead`, then 1.. for the blocks.
    pub block: usize,
    /// Position inside the block, from 0.
    pub position: usize,
    /// The block's arms in execution order, joined by `>` (e.g. `D>F`).
    pub order: String,
    pub arm: CellArm,
    /// This cell is the oracle arm's.
    pub is_oracle: bool,
    pub model: ModelSpec,
    /// The verifier and reference of a refinement campaign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refine: Option<RefineModels>,
    /// The proposer the arm's `draft` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposer: Option<ModelSpec>,
    pub workload: Workload,
}

/// A cell's arm: the file form, which `cell.json` and the journal repeat as it is (campaign
/// digests fix its serialisation), and what it parsed into, parsed once when the cell is made
/// or read back. Derefs to the file form for the fields that name the arm (id, fault).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Arm", into = "Arm")]
pub struct CellArm {
    file: Arm,
    kind: ArmKind,
}

impl CellArm {
    /// What the arm is (the one parse of its fields, [`Arm::kind`]).
    pub fn kind(&self) -> &ArmKind {
        &self.kind
    }
}

impl TryFrom<Arm> for CellArm {
    type Error = ArmError;

    fn try_from(file: Arm) -> Result<CellArm, ArmError> {
        Ok(CellArm { kind: file.kind()?, file })
    }
}

impl From<CellArm> for Arm {
    fn from(a: CellArm) -> Arm {
        a.file
    }
}

impl std::ops::Deref for CellArm {
    type Target = Arm;

    fn deref(&self) -> &Arm {
        &self.file
    }
}

/// The control a fault cell is validated against: the nearest earlier cell of its block whose
/// arm plays no fault (so its record is sealed before the fault cell runs).
pub fn block_control<'a>(cells: &'a [CellSpec], cell: &CellSpec) -> Option<&'a CellSpec> {
    use super::spec::FaultCell;
    cells.iter().rev().find(|c| c.block == cell.block && c.position < cell.position && matches!(c.arm.fault, None | Some(FaultCell::None)))
}

/// Every cell of a (validated) campaign in execution order.
pub fn expand(c: &Campaign) -> Vec<CellSpec> {
    let mut blocks: Vec<(usize, Vec<String>)> = Vec::new();
    if !c.schedule.lead.is_empty() {
        blocks.push((0, c.schedule.lead.iter().map(|a| a.value.clone()).collect()));
    }
    for (i, b) in c.schedule.blocks.orders().into_iter().enumerate() {
        blocks.push((i + 1, b));
    }
    let mut cells = Vec::new();
    for (block, arms) in blocks {
        let order = arms.join(">");
        for (position, arm_id) in arms.iter().enumerate() {
            let arm = c.arms.iter().find(|a| a.id.value == *arm_id).expect("validated: every scheduled arm exists").clone();
            let arm = CellArm::try_from(arm).expect("validated: every arm parses");
            cells.push(CellSpec {
                index: cells.len(),
                key: format!("b{block:02}-p{position}-{arm_id}"),
                block,
                position,
                order: order.clone(),
                is_oracle: *arm_id == c.oracle.arm.value,
                model: c.model.clone(),
                refine: c.refine.clone(),
                proposer: arm.draft.as_ref().and_then(|d| c.proposers.get(d)).cloned(),
                arm,
                workload: c.workload.clone(),
            });
        }
    }
    cells
}
