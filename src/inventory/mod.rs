//! Inventory of a model: tensors, T_repr, and the logical expert objects of its MoE layers.

use crate::gguf::{expert_role, Gguf};
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

pub const T_REPR_RULE: &str =
    "sum of the payload bytes of every tensor in the GGUF data section; header, metadata and alignment padding excluded";

#[derive(Debug, Clone, Serialize)]
pub struct Tensor {
    pub name: String,
    #[serde(rename = "type")]
    pub ggml_type: String,
    pub shape: Vec<u64>,
    /// The file of the set that holds it (0: the first, or the only one).
    #[serde(skip_serializing_if = "is_zero")]
    pub shard: u32,
    /// Offset within its file.
    pub offset: u64,
    pub bytes: u64,
}

impl Tensor {
    /// Its bytes as an extent of the model.
    pub fn extent(&self) -> Extent {
        Extent { offset: crate::source::position(self.shard, self.offset), len: self.bytes }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One contiguous byte range of the model: `offset` is a position (`source::position`), the
/// shard in its top bits, so a set's extents order and compare as (shard, offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// (shard, offset within its file).
    pub fn shard_offset(&self) -> (usize, u64) {
        crate::source::shard_offset(self.offset)
    }
}

/// As the file has it: `{"offset", "len"}`, with `"shard"` first where it is not the first.
impl Serialize for Extent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (shard, offset) = self.shard_offset();
        let mut st = s.serialize_struct("Extent", 3)?;
        if shard > 0 {
            st.serialize_field("shard", &shard)?;
        } else {
            st.skip_field("shard")?;
        }
        st.serialize_field("offset", &offset)?;
        st.serialize_field("len", &self.len)?;
        st.end()
    }
}

/// One file of the model.
#[derive(Debug, Clone, Serialize)]
pub struct ShardFile {
    pub file: String,
    /// Where it was found (the file names are what identify it).
    #[serde(skip)]
    pub path: std::path::PathBuf,
    pub bytes: u64,
    pub data_offset: u64,
    pub alignment: u64,
    pub tensors: usize,
}

/// The weights of one expert of one layer: the unit the Plan moves.
#[derive(Debug, Clone, Serialize)]
pub struct ExpertObject {
    pub layer: u32,
    pub expert: u32,
    /// (role, extent), role being `gate`, `up`, `down` or `gate_up`.
    pub extents: Vec<(String, Extent)>,
}

impl ExpertObject {
    pub fn bytes(&self) -> u64 {
        self.extents.iter().map(|(_, e)| e.len).sum()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MoeLayer {
    pub layer: u32,
    pub experts: u32,
    /// Experts a token selects in this layer: `expert_used_count`, or this layer's value where
    /// the model gives one per layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_used: Option<u64>,
    /// Role → tensor name.
    pub tensors: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// The file, or a shard set's first file.
    pub file: String,
    pub architecture: String,
    /// Bytes of the file, or of every shard of the set.
    pub file_bytes: u64,
    /// The first file's data section and alignment (each shard's are in `shards`).
    pub data_offset: u64,
    pub alignment: u64,
    /// The model's files in order: one, or each shard of its set.
    pub shards: Vec<ShardFile>,
    pub t_repr_bytes: u64,
    pub t_repr_rule: &'static str,
    pub expert_bytes: u64,
    pub non_expert_bytes: u64,
    /// Experts a token selects: `expert_used_count`, or where it gives one value per layer, the
    /// most of any MoE layer (each layer's is in `moe_layers`).
    pub expert_used_count: Option<u64>,
    /// The trained context length (`<arch>.context_length`), where the file states one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    pub tensors: Vec<Tensor>,
    pub moe_layers: Vec<MoeLayer>,
    /// The multi-token-prediction (nextn) blocks: the last `<arch>.nextn_predict_layers` of
    /// `<arch>.block_count`, which the target never runs and an MTP context does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mtp_layers: Vec<u32>,
    pub objects: Vec<ExpertObject>,
    pub extent_duplicates: u64,
    pub extent_overlaps: u64,
}

impl Inventory {
    /// The experts a token selects (`expert_used_count`), where the model names a count that
    /// fits a u32.
    pub fn n_used(&self) -> Option<u32> {
        self.expert_used_count.and_then(|n| u32::try_from(n).ok())
    }

    /// The MTP head's layer index, where the model has exactly one nextn block.
    pub fn mtp_head(&self) -> Option<u32> {
        match self.mtp_layers[..] {
            [l] => Some(l),
            _ => None,
        }
    }

    /// The trained context length and the key that states it, for sizing a run's context. A
    /// length of 0 states none (llama.cpp then takes the context it is given).
    pub fn trained_context(&self) -> Option<crate::bounds::TrainedContext> {
        self.context_length
            .filter(|&n| n > 0)
            .map(|tokens| crate::bounds::TrainedContext { tokens, key: format!("{}.context_length", self.architecture) })
    }

    /// The paths of the model's files, in set order.
    pub fn paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The path llama.cpp loads the model from: the file, or the set's first shard.
    pub fn load_path(&self) -> &Path {
        &self.shards[0].path
    }

    pub fn is_set(&self) -> bool {
        self.shards.len() > 1
    }

    /// Validates the model (one file, or the shard set `path` is any file of) and builds its
    /// inventory. A model without expert tensors is refused.
    pub fn of(path: &Path) -> Result<Inventory> {
        let g = Gguf::open_model(path)?;
        // A dense model is named as such before its hyperparameters are judged as a MoE's.
        if !g.tensors.iter().any(|t| expert_role(&t.name).is_some()) {
            bail!(
                "{}: architecture `{}` has no Mixture-of-Experts expert tensors (blk.N.ffn_*_exps)",
                path.display(),
                g.architecture().unwrap_or("unknown")
            );
        }
        let inv = Self::from_gguf(&g)?;
        if inv.objects.is_empty() {
            bail!("{}: architecture `{}` has no Mixture-of-Experts expert tensors (blk.N.ffn_*_exps)", path.display(), inv.architecture);
        }
        Ok(inv)
    }

    pub fn from_gguf(g: &Gguf) -> Result<Inventory> {
        crate::gguf::check(g)?;
        let architecture = g.architecture()?.to_string();
        let mut layers: BTreeMap<u32, MoeLayer> = BTreeMap::new();
        let mut objects: BTreeMap<(u32, u32), ExpertObject> = BTreeMap::new();
        let mut expert_bytes = 0;
        for t in &g.tensors {
            let Some((layer, role)) = expert_role(&t.name) else { continue };
            // The checks above bound the expert count; the objects are made only within it.
            if t.dims.len() != 3 || Some(t.dims[2]) != g.arch_u64("expert_count") {
                bail!("{}: expert tensor `{}` has shape {:?}, not [_, _, expert_count]", g.path.display(), t.name, t.dims);
            }
            let n = t.dims[2];
            let entry =
                layers.entry(layer).or_insert_with(|| MoeLayer { layer, experts: n as u32, expert_used: None, tensors: BTreeMap::new() });
            if u64::from(entry.experts) != n {
                bail!("{}: `{}` has {n} experts, other tensors of layer {layer} have {}", g.path.display(), t.name, entry.experts);
            }
            entry.tensors.insert(role.to_string(), t.name.clone());
            let per = t.bytes / n;
            for e in 0..n as u32 {
                let ext = Extent { offset: t.position() + u64::from(e) * per, len: per };
                objects
                    .entry((layer, e))
                    .or_insert_with(|| ExpertObject { layer, expert: e, extents: Vec::new() })
                    .extents
                    .push((role.to_string(), ext));
            }
            expert_bytes += t.bytes;
        }
        // `get_key_or_arr`: one value for every layer, or one per layer.
        let used = g.get(&format!("{architecture}.expert_used_count"));
        for (layer, l) in &mut layers {
            l.expert_used = match used {
                Some(crate::gguf::Value::Array(a)) => a.get(*layer as usize).and_then(crate::gguf::Value::as_u64),
                v => v.and_then(crate::gguf::Value::as_u64),
            };
        }
        let expert_used_count = layers.values().filter_map(|l| l.expert_used).max();
        let objects: Vec<ExpertObject> = objects.into_values().collect();
        let mut all: Vec<Extent> = objects.iter().flat_map(|o| o.extents.iter().map(|(_, e)| *e)).collect();
        all.sort();
        let (mut duplicates, mut overlaps) = (0, 0);
        for w in all.windows(2) {
            if w[0] == w[1] {
                duplicates += 1;
            } else if w[0].end() > w[1].offset {
                overlaps += 1;
            }
        }
        let t_repr_bytes: u64 = g.tensors.iter().map(|t| t.bytes).sum();
        // gguf::check bounds both counts (nextn within the blocks).
        let blocks = g.arch_u64("block_count").unwrap_or(0);
        let nextn = g.arch_u64("nextn_predict_layers").unwrap_or(0).min(blocks);
        let mtp_layers = (blocks - nextn..blocks).map(|l| l as u32).collect();
        Ok(Inventory {
            file: g.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            architecture,
            file_bytes: g.file_len,
            data_offset: g.data_offset,
            alignment: g.alignment,
            shards: g
                .shards
                .iter()
                .map(|h| ShardFile {
                    file: h.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                    path: h.path.clone(),
                    bytes: h.file_len,
                    data_offset: h.data_offset,
                    alignment: h.alignment,
                    tensors: h.tensors,
                })
                .collect(),
            t_repr_bytes,
            t_repr_rule: T_REPR_RULE,
            expert_bytes,
            non_expert_bytes: t_repr_bytes - expert_bytes,
            expert_used_count: expert_used_count.or_else(|| g.arch_u64("expert_used_count")),
            context_length: g.arch_u64("context_length"),
            tensors: g
                .tensors
                .iter()
                .map(|t| Tensor {
                    name: t.name.clone(),
                    ggml_type: t.ggml_type.name().to_string(),
                    shape: t.dims.clone(),
                    shard: t.shard,
                    offset: t.offset,
                    bytes: t.bytes,
                })
                .collect(),
            moe_layers: layers.into_values().collect(),
            mtp_layers,
            objects,
            extent_duplicates: duplicates,
            extent_overlaps: overlaps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        assert_eq!(expert_role("blk.12.ffn_up_exps.weight"), Some((12, "up")));
        assert_eq!(expert_role("blk.0.ffn_gate_up_exps.weight"), Some((0, "gate_up")));
        assert_eq!(expert_role("blk.0.ffn_up_shexp.weight"), None);
        assert_eq!(expert_role("blk.0.ffn_gate_inp.weight"), None);
        assert_eq!(expert_role("blk.x.ffn_up_exps.weight"), None);
    }
}
