//! Replacement policy: which objects stay, which go, which come early. Separate from the
//! lifecycle: a policy only names objects; the Plan carries its choices out through the slot
//! table, which refuses anything the lifecycle does not allow (a policy cannot evict an object
//! in use), and never hands a pinned object to a policy.
//!
//! Policy strings: `zero`, `lru:K`, `pin:L/E,L/E,...` (pins, zero for the rest), each
//! optionally followed by `+prefetch`; parts joined by `+` may also combine `lru:K+pin:...`.

use super::manifest::Manifest;
use super::ObjectId;
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;

/// The decisions the Plan asks of a policy. Objects are never pinned ones.
pub trait ReplacementPolicy: Send {
    fn describe(&self) -> String;
    /// The object's last consumer left (its slot is Recyclable). Returns the objects to evict
    /// now — possibly this one — in order.
    fn released(&mut self, object: ObjectId) -> Vec<ObjectId>;
    /// A Recyclable object was taken again (a hit).
    fn reused(&mut self, object: ObjectId);
    /// A miss of `layer` found no Vacant slot: the Recyclable object to evict, if any.
    fn victim(&mut self, layer: u32) -> Option<ObjectId>;
    /// The Plan evicted `object` (for whatever reason).
    fn evicted(&mut self, object: ObjectId);
    /// The distinct experts `layer` selected in an event, in order of first appearance.
    fn observe(&mut self, _layer: u32, _experts: &[u32]) {}
    /// Called after an acquire of a layer whose next MoE layer is `next`: experts of `next` to
    /// load early into Vacant slots, most wanted first.
    fn prefetch(&mut self, _next: u32) -> Vec<u32> {
        Vec::new()
    }
}

/// A parsed policy string; it crosses processes and records as that string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PolicySpec {
    /// Recyclable objects retained per layer (LRU); 0 is `zero`.
    pub retain: u32,
    pub pinned: Vec<ObjectId>,
    pub prefetch: bool,
}

impl FromStr for PolicySpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<PolicySpec> {
        let mut spec = PolicySpec::default();
        let (mut base, mut pins) = (false, false);
        for part in s.split('+').map(str::trim) {
            if part == "zero" || part.starts_with("lru:") {
                if base {
                    bail!("policy `{s}`: name zero or lru:K once");
                }
                base = true;
                if let Some(k) = part.strip_prefix("lru:") {
                    spec.retain = k.parse().map_err(|_| anyhow!("policy `{s}`: lru:K needs a whole number K"))?;
                    // Same bound as `campaign check`: lru:0 is spelled `zero`.
                    if !(1..=crate::bounds::MAX_LRU).contains(&spec.retain) {
                        bail!("policy `{s}`: lru:K needs 1 <= K <= {}", crate::bounds::MAX_LRU);
                    }
                }
            } else if let Some(list) = part.strip_prefix("pin:") {
                if pins {
                    bail!("policy `{s}`: name pin: once");
                }
                pins = true;
                spec.pinned = list.split(',').map(str::parse).collect::<Result<_>>()?;
                if spec.pinned.is_empty() {
                    bail!("policy `{s}`: pin: needs objects");
                }
            } else if part == "prefetch" {
                if spec.prefetch {
                    bail!("policy `{s}`: prefetch named twice");
                }
                spec.prefetch = true;
            } else {
                bail!("policy `{s}`: `{part}` is not zero, lru:K, pin:L/E,... or prefetch");
            }
        }
        if !base && !pins {
            bail!("policy `{s}`: name zero, lru:K or pin:L/E,...");
        }
        Ok(spec)
    }
}

impl schemars::JsonSchema for PolicySpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Policy".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Expert replacement policy: `zero` (no reuse), `lru:K` (per-layer LRU with K entries) or `pin:L/E,...` (objects held for the whole run), parts joined by `+`, optionally with `+prefetch` (next-layer prefetch); the `--policy` flag's syntax.",
            "type": "string",
            "pattern": "^[a-z0-9:/,+]+$"
        })
    }
}

impl TryFrom<String> for PolicySpec {
    type Error = anyhow::Error;

    fn try_from(s: String) -> Result<PolicySpec> {
        s.parse()
    }
}

impl From<PolicySpec> for String {
    fn from(p: PolicySpec) -> String {
        p.to_string()
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.retain {
            0 if !self.pinned.is_empty() => {}
            0 => f.write_str("zero")?,
            k => write!(f, "lru:{k}")?,
        }
        if !self.pinned.is_empty() {
            if self.retain > 0 {
                f.write_str("+")?;
            }
            let list: Vec<String> = self.pinned.iter().map(ToString::to_string).collect();
            write!(f, "pin:{}", list.join(","))?;
        }
        if self.prefetch {
            f.write_str("+prefetch")?;
        }
        Ok(())
    }
}

impl PolicySpec {
    /// The policy for `manifest`, whose pins must be this spec's: K may not exceed a layer's
    /// slots.
    pub fn build(&self, manifest: &Manifest) -> Result<Box<dyn ReplacementPolicy>> {
        let mut mine = self.pinned.clone();
        mine.sort();
        if mine != manifest.pinned {
            bail!("policy {self}: its pins differ from the manifest's {:?}", manifest.pinned);
        }
        for lp in &manifest.layers {
            if self.retain > lp.n_slots {
                bail!("policy {self}: lru:{} exceeds the {} slots of layer {}", self.retain, lp.n_slots, lp.layer);
            }
        }
        Ok(Box::new(Retain { k: self.retain as usize, name: self.to_string(), prefetch: self.prefetch, ..Default::default() }))
    }
}

/// Per-layer LRU of up to `k` Recyclable objects (`k = 0` is zero: nothing survives its
/// event), with the next-layer predictor: a layer's experts of its previous event.
#[derive(Default)]
pub struct Retain {
    k: usize,
    name: String,
    prefetch: bool,
    /// Per layer, Recyclable objects, least recently used first.
    recyclable: HashMap<u32, VecDeque<ObjectId>>,
    last: HashMap<u32, Vec<u32>>,
}

impl ReplacementPolicy for Retain {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn released(&mut self, object: ObjectId) -> Vec<ObjectId> {
        let q = self.recyclable.entry(object.layer).or_default();
        q.retain(|o| *o != object);
        q.push_back(object);
        let over = q.len().saturating_sub(self.k);
        q.drain(..over).collect()
    }

    fn reused(&mut self, object: ObjectId) {
        self.evicted(object);
    }

    fn victim(&mut self, layer: u32) -> Option<ObjectId> {
        self.recyclable.get_mut(&layer)?.pop_front()
    }

    fn evicted(&mut self, object: ObjectId) {
        if let Some(q) = self.recyclable.get_mut(&object.layer) {
            q.retain(|o| *o != object);
        }
    }

    fn observe(&mut self, layer: u32, experts: &[u32]) {
        if self.prefetch {
            self.last.insert(layer, experts.to_vec());
        }
    }

    fn prefetch(&mut self, next: u32) -> Vec<u32> {
        if !self.prefetch {
            return Vec::new();
        }
        self.last.get(&next).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_policy_strings() {
        let p: PolicySpec = "zero".parse().unwrap();
        assert_eq!(p, PolicySpec::default());
        let p: PolicySpec = "lru:4+prefetch".parse().unwrap();
        assert_eq!(p, PolicySpec { retain: 4, pinned: vec![], prefetch: true });
        assert_eq!(p.to_string(), "lru:4+prefetch");
        let p: PolicySpec = "pin:0/1,2/3".parse().unwrap();
        assert_eq!(p.pinned, vec![ObjectId { layer: 0, expert: 1 }, ObjectId { layer: 2, expert: 3 }]);
        assert_eq!(p.retain, 0);
        assert_eq!(p.to_string(), "pin:0/1,2/3");
        assert_eq!("lru:2+pin:1/1".parse::<PolicySpec>().unwrap().to_string(), "lru:2+pin:1/1");
        for bad in ["", "lru", "lru:x", "lru:-1", "zero+lru:2", "pin:", "pin:1", "pin:a/b", "prefetch", "zero+prefetch+prefetch", "mru:2"] {
            assert!(bad.parse::<PolicySpec>().is_err(), "`{bad}` parsed");
        }
    }

    #[test]
    fn lru_evicts_least_recently_used_beyond_k() {
        let o = |e| ObjectId { layer: 1, expert: e };
        let mut p = Retain { k: 2, ..Default::default() };
        assert!(p.released(o(1)).is_empty());
        assert!(p.released(o(2)).is_empty());
        p.reused(o(1));
        assert!(p.released(o(1)).is_empty()); // 1 is now most recent
        assert_eq!(p.released(o(3)), vec![o(2)]);
        assert_eq!(p.victim(1), Some(o(1)));
        assert_eq!(p.victim(1), Some(o(3)));
        assert_eq!(p.victim(1), None);
        let mut z = Retain::default();
        assert_eq!(z.released(o(5)), vec![o(5)]);
        assert_eq!(z.victim(1), None);
    }
}
