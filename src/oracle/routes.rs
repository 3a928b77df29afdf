//! The routes a generate record captured, read back as the Plan's layer events, with the model
//! they came from: what `plan simulate` replays.

use crate::inventory::Inventory;
use crate::plan::simulate::{layer_events, LayerEvent};
use crate::plan::{Passes, SizedFrom};
use crate::record::format::{Outcome, ProposerKind};
use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};

/// A generate record's routes and the model they came from, checked against each other.
pub struct Recorded {
    pub events: Vec<LayerEvent>,
    pub inventory: Inventory,
    pub model: PathBuf,
    /// The passes the run streamed its events in: a replay of its Plan runs the same ones.
    pub passes: Passes,
    /// The run's prompt pass was sized from its slots (so a replay at other slot counts sizes
    /// its own), not given.
    pub prompt_pass_sized: bool,
    /// The first ubatch that decodes an output (after the prompt's), if the run decoded any.
    pub decode_from: Option<u32>,
    /// Where the run drafted with the model's own MTP head through a source: the head's layer
    /// and the expert bytes per output its decodes read. The routes are the target's only, so
    /// a replay of them leaves the head's reads out.
    pub mtp_head: Option<(u32, f64)>,
}

/// Reads the routes of the completed generate record `dir` (digest checked) and inventories
/// its model: `model`, else the file the record names (here, or where this machine hashed it,
/// unchanged). Object sizes need only the model's layout, so the file must agree with the
/// record's size, architecture, T_repr and expert bytes (and with the Plan manifest the record
/// states, if any); its digest is not needed.
pub fn load(dir: &Path, model: Option<&Path>) -> Result<Recorded> {
    let rec = crate::record::load_generate(dir)?;
    let name = dir.display();
    let (Outcome::Completed, Some(counts), Some(m)) = (rec.outcome, &rec.counts, &rec.model) else {
        bail!("{name}: not a completed generate record (outcome {})", rec.outcome.name());
    };
    let surface = rec.surfaces.get("routes").ok_or_else(|| anyhow!("{name}: the record has no routes surface"))?;
    let k = counts.route_k;
    if surface.unit_bytes != crate::routes::unit_bytes(k) {
        bail!("{name}: routes unit of {} bytes disagrees with route_k {k}", surface.unit_bytes);
    }
    let bytes = super::read_checked(dir, surface)?;
    let events = crate::routes::decode(&bytes, k).map_err(|e| anyhow!("{name}/{}: {e}", surface.file))?;
    let decode_from = events.iter().filter(|e| e.pos as usize >= counts.prompt_tokens).map(|e| e.ubatch).min();
    let events = layer_events(events);
    let model = match model {
        Some(p) => p.to_path_buf(),
        // The record names its model by file name: here, else the unchanged file of the same
        // SHA-256 (a set's first shard's) this machine hashed for its digest manifest.
        None => {
            let named = PathBuf::from(&m.file);
            let first = m.shards.as_ref().and_then(|s| s.first()).map_or(&m.sha256, |s| &s.sha256);
            if named.exists() {
                named
            } else {
                crate::digests::cached_file_with(first).unwrap_or(named)
            }
        }
    };
    let inventory = Inventory::of(&model).map_err(|e| anyhow!("{e:#} (the model of record {name}; name another with --model)"))?;
    let agree = [
        ("bytes", m.bytes, inventory.file_bytes),
        ("t_repr_bytes", m.t_repr_bytes, inventory.t_repr_bytes),
        ("expert_bytes", m.expert_bytes, inventory.expert_bytes),
    ];
    for (field, want, got) in agree {
        if want != got {
            bail!("{}: {field} {got} differs from record {name}'s {want}", model.display());
        }
    }
    if m.architecture != inventory.architecture {
        bail!("{}: architecture {} differs from record {name}'s {}", model.display(), inventory.architecture, m.architecture);
    }
    if let Some(plan) = rec.plan() {
        let ours: u64 = inventory.objects.iter().map(|o| o.bytes()).sum();
        if plan.manifest.managed_bytes != ours {
            bail!("{}: {ours} bytes of expert objects, record {name}'s Plan managed {}", model.display(), plan.manifest.managed_bytes);
        }
    }
    let plan = rec.params.as_ref().and_then(|p| p.experts.plan());
    let passes = Passes { token: plan.and_then(|d| d.token_pass), prompt: plan.and_then(|d| d.prompt_pass) };
    let prompt_pass_sized = plan.and_then(|d| d.sizing.as_ref()).and_then(|s| s.prompt_pass_from) == Some(SizedFrom::Manifest);
    let draft = rec.params.as_ref().and_then(|p| p.draft.as_ref()).filter(|d| d.proposer == ProposerKind::Mtp);
    let mtp_head = draft
        .and_then(|d| d.head_layer)
        .zip(rec.speculative.as_ref().and_then(|s| s.proposer_expert_bytes.map(|b| b as f64 / s.outputs.max(1) as f64)));
    Ok(Recorded { events, inventory, model, passes, prompt_pass_sized, decode_from, mtp_head })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::RouteEvent;

    #[test]
    fn rows_of_one_ubatch_and_layer_make_one_layer_event() {
        let ev = |ubatch, row, layer, experts: &[i32]| RouteEvent { ubatch, row, pos: row, layer, experts: experts.to_vec() };
        let routes = vec![ev(0, 0, 1, &[3, 4]), ev(0, 1, 1, &[4, 5]), ev(0, 0, 2, &[0, 1]), ev(1, 0, 1, &[7, 3])];
        assert_eq!(
            layer_events(routes),
            vec![
                LayerEvent { ubatch: 0, layer: 1, ids: vec![3, 4, 4, 5] },
                LayerEvent { ubatch: 0, layer: 2, ids: vec![0, 1] },
                LayerEvent { ubatch: 1, layer: 1, ids: vec![7, 3] },
            ]
        );
    }
}
