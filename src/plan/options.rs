//! What a Plan run is configured with: how bytes are read, the arm's or flags' settings, and
//! the sizes F derives from the manifest where none are given.

use super::Manifest;
use crate::source::fault::FaultCell;
use serde::Serialize;

/// How expert bytes are read (seed 000 §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// Buffered pread through the page cache.
    P,
    /// Blocking O_DIRECT, one window.
    D,
    /// io_uring O_DIRECT, registered windows, bounded depth.
    F,
}

impl SourceKind {
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::P => "p",
            SourceKind::D => "d",
            SourceKind::F => "f",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanOptions {
    pub slots: u32,
    pub policy: super::PolicySpec,
    pub source: SourceKind,
    /// Windows and reads in flight; absent: sized from the manifest (F) or 8 (P).
    #[serde(default)]
    pub windows: Option<u32>,
    #[serde(default)]
    pub depth: Option<u32>,
    /// Layer buffers (0: one pool per layer; 2: double-buffered layer by layer).
    pub layer_buffers: u32,
    pub fault: FaultCell,
    /// The decode token whose every event the timeline keeps (absent: the middle one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_token: Option<u32>,
    /// Distinct experts per engine pass for a one-token ubatch (absent: one pass): fewer than
    /// a token selects lets the engine compute a layer's first groups while the rest is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_pass: Option<u32>,
    /// Distinct experts per engine pass for a ubatch of several tokens (absent: sized; 0: the
    /// layer's unpinned slots, one group at a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pass: Option<u32>,
    /// Slots and policy are sized from this budget before the run loads (`slots` and `policy`
    /// are then placeholders; the `budget` room sizes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::budget::PlanBudget>,
    /// How each read is verified against the digest manifest (absent: XXH3-128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<crate::digests::Verify>,
}

impl PlanOptions {
    /// Every setting away from its default, none left to a budget: what the tests of each form
    /// that carries the settings (`generate`'s flags, a campaign arm's fields) build from, so a
    /// field added here must be named in that form too.
    #[doc(hidden)]
    pub fn every_setting() -> PlanOptions {
        PlanOptions {
            slots: 3,
            policy: "lru:2+prefetch".parse().expect("a policy"),
            source: SourceKind::D,
            windows: Some(2),
            depth: Some(4),
            layer_buffers: 2,
            fault: FaultCell::ShortRead,
            timeline_token: Some(1),
            token_pass: Some(2),
            prompt_pass: Some(16),
            budget: None,
            verify: Some(crate::digests::Verify::Blake3),
        }
    }
}

/// Windows, depth and token pass of a run's source: the flags', or derived from the manifest.
///
/// F's defaults are the configuration the bench measures fastest on its disk, derived from the
/// manifest and the device rather than tuned by flags: one window per slot a pass can miss, a
/// depth of one bundle's extents, or the deeper queue the device's read profile needs
/// ([`Sizing::with_device`]; every bundle with a window is queued behind them in linked
/// chains), and a decode token served in
/// passes of a quarter of its experts, so the engine computes a layer's first experts while
/// the rest are read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Sizing {
    pub from: SizedFrom,
    pub windows: u32,
    pub depth: u32,
    /// What the manifest asks for: the most distinct misses of one pass (a layer's unpinned
    /// slots) and the most extents per bundle.
    pub pass_capacity: u32,
    pub extents_per_bundle: u32,
    /// Distinct experts per engine pass of a one-token ubatch (absent: one pass), and where it
    /// came from (absent in earlier records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_pass: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_pass_from: Option<SizedFrom>,
    /// Distinct experts per engine pass of a ubatch of several tokens (absent: the layer's
    /// unpinned slots, no group read under another's compute), and where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pass: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pass_from: Option<SizedFrom>,
    /// `budget` where slots and policy were sized from a budget (the terms are in the Plan's
    /// `budget`); absent where they were given or defaulted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_from: Option<SizedFrom>,
    /// The device profile F's depth came from, where no flag gave one and the device had a
    /// profile; absent where the manifest sized it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth_device: Option<Box<DeviceDepth>>,
}

/// What a device's read profile said, as a run's sizing keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DeviceDepth {
    /// The device, as the kernel names it.
    pub device: String,
    /// The profile's block, its reads per burst and blocks per read (both absent in records
    /// before a profile read as F's decode does) and its least depth whose reads land within
    /// 5 % as soon as the best depth's.
    pub block_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_reads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector_blocks: Option<u32>,
    pub depth: u32,
    /// Its rate at that depth and its best, in whole MiB/s.
    pub mib_per_s: u64,
    pub best_mib_per_s: u64,
    pub measured_unix_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SizedFrom {
    /// Both given on the command line or in the arm.
    Flags,
    /// Both sized from the manifest.
    Manifest,
    /// One given, the other sized.
    Mixed,
    /// Sized from the run's memory budget ([`crate::budget`]).
    Budget,
}

/// Slots per layer where a run names none and no budget sizes them.
pub const DEFAULT_SLOTS: u32 = 8;

/// Windows of P when none are given (P reads synchronously: more windows only batch).
const P_WINDOWS: u32 = 8;

/// F's default token pass: a quarter of a token's experts, at least one.
fn default_token_pass(n_used: u32, per_pass: u32) -> Option<u32> {
    (n_used >= 2).then(|| n_used.div_ceil(4).clamp(1, per_pass.max(1)))
}

/// The smallest default prompt pass: every pass of a prompt ubatch pays for its whole merge and
/// activations, which passes of fewer experts cost more than reading under compute saves
/// (measured on the CPU, 512 experts: 16 slots in passes of 8 prefilled 7–11 % slower than one
/// group of 16 at a time; 64 slots in passes of 32, 18–23 % faster than one group of 64).
pub const MIN_PROMPT_PASS: u32 = 16;

/// F's default prompt pass: half the unpinned slots, so that one half's group is read while the
/// engine computes the other's (at least the token pass, which the engine needs no larger);
/// none where that leaves no room for a second group or a pass under [`MIN_PROMPT_PASS`].
pub fn default_prompt_pass(per_pass: u32, token_pass: Option<u32>) -> Option<u32> {
    let p = (per_pass / 2).max(token_pass.unwrap_or(1)).max(1);
    (p < per_pass && p >= MIN_PROMPT_PASS).then_some(p)
}

impl Sizing {
    /// `n_used`: the experts a token selects (the model's `expert_used_count`).
    pub fn of(m: &Manifest, o: &PlanOptions, n_used: Option<u32>) -> Sizing {
        let pass_capacity = m.layers.iter().map(|l| l.capacity()).max().unwrap_or(1).max(1);
        let extents_per_bundle = m.objects.iter().map(|o| o.extents.len() as u32).max().unwrap_or(1).max(1);
        let sized_windows = pass_capacity.min(crate::bounds::MAX_WINDOWS);
        let (windows, depth) = match o.source {
            SourceKind::D => (1, 1),
            SourceKind::P => (o.windows.unwrap_or(P_WINDOWS), 1),
            SourceKind::F => {
                let windows = o.windows.unwrap_or(sized_windows);
                let depth = o.depth.unwrap_or(extents_per_bundle.min(crate::bounds::MAX_DEPTH));
                (windows, depth)
            }
        };
        let from = match (o.windows.is_some(), o.depth.is_some()) {
            (true, true) => SizedFrom::Flags,
            (false, false) => SizedFrom::Manifest,
            _ => SizedFrom::Mixed,
        };
        // Token passes stream F's reads under compute; fault cells script whole passes.
        let derived = match (o.source, o.fault, n_used) {
            (SourceKind::F, FaultCell::None, Some(n)) => default_token_pass(n, per_pass(m, 0)),
            _ => None,
        };
        let (token_pass, token_pass_from) = match (o.token_pass, derived) {
            (Some(g), _) => (Some(g), Some(SizedFrom::Flags)),
            (None, Some(g)) => (Some(g), Some(SizedFrom::Manifest)),
            (None, None) => (None, None),
        };
        let streams = o.source == SourceKind::F && o.fault == FaultCell::None;
        let (prompt_pass, prompt_pass_from) = match o.prompt_pass {
            Some(0) => (None, Some(SizedFrom::Flags)),
            Some(g) => (Some(g), Some(SizedFrom::Flags)),
            None if streams => match default_prompt_pass(per_pass(m, 0), token_pass) {
                Some(g) => (Some(g), Some(SizedFrom::Manifest)),
                None => (None, None),
            },
            None => (None, None),
        };
        Sizing {
            from,
            windows,
            depth,
            pass_capacity,
            extents_per_bundle,
            token_pass,
            token_pass_from,
            prompt_pass,
            prompt_pass_from,
            slots_from: None,
            depth_device: None,
        }
    }

    /// F's depth from the device's profile where no flag gave one: the profile's depth, never
    /// below one bundle's extents (the manifest's default: each extent is verified before its
    /// expert is published, so fewer in flight only waits).
    pub fn with_device(mut self, o: &PlanOptions, d: DeviceDepth) -> Sizing {
        if o.source == SourceKind::F && o.depth.is_none() {
            let floor = self.extents_per_bundle.min(crate::bounds::MAX_DEPTH);
            self.depth = d.depth.clamp(floor, crate::bounds::MAX_DEPTH);
            self.depth_device = Some(Box::new(d));
        }
        self
    }
}

/// Distinct experts one engine pass serves: the unpinned capacity of the layer with the least.
pub fn per_pass(m: &Manifest, n_slots: u32) -> u32 {
    m.layers.iter().map(|l| l.capacity()).min().unwrap_or(n_slots).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_profile_deepens_f_where_no_flag_names_a_depth_and_never_below_a_bundle() {
        let opts = |source: &str, depth: Option<u32>| -> PlanOptions {
            let mut o: PlanOptions =
                serde_json::from_str(&format!(r#"{{"slots":4,"policy":"zero","source":"{source}","layer_buffers":0,"fault":"none"}}"#))
                    .unwrap();
            o.depth = depth;
            o
        };
        let base = Sizing {
            from: SizedFrom::Manifest,
            windows: 4,
            depth: 3,
            pass_capacity: 4,
            extents_per_bundle: 3,
            token_pass: None,
            token_pass_from: None,
            prompt_pass: None,
            prompt_pass_from: None,
            slots_from: None,
            depth_device: None,
        };
        let device = |depth| DeviceDepth {
            device: "vda (254:0)".into(),
            block_bytes: 1 << 20,
            burst_reads: Some(8),
            vector_blocks: Some(3),
            depth,
            mib_per_s: 2400,
            best_mib_per_s: 2500,
            measured_unix_s: 1,
        };
        let s = base.clone().with_device(&opts("f", None), device(16));
        assert_eq!((s.depth, s.depth_device), (16, Some(Box::new(device(16)))));
        // A device that serves one read as fast as many keeps one bundle's extents in flight.
        assert_eq!(base.clone().with_device(&opts("f", None), device(1)).depth, 3);
        assert_eq!(base.clone().with_device(&opts("f", None), device(u32::MAX)).depth, crate::bounds::MAX_DEPTH);
        // A flag's depth, and sources that read one at a time, are left as they are.
        assert_eq!(base.clone().with_device(&opts("f", Some(2)), device(16)), base);
        assert_eq!(base.clone().with_device(&opts("d", None), device(16)), base);
    }

    #[test]
    fn the_default_prompt_pass_is_half_the_slots_where_both_halves_hold_a_worthwhile_pass() {
        assert_eq!(default_prompt_pass(64, Some(2)), Some(32));
        assert_eq!(default_prompt_pass(33, None), Some(16));
        // Passes under the minimum, or no room for a second group: one group at a time.
        assert_eq!(default_prompt_pass(16, Some(2)), None);
        assert_eq!(default_prompt_pass(1, None), None);
        // Never smaller than the token pass, and then only while a second group still fits.
        assert_eq!(default_prompt_pass(64, Some(40)), Some(40));
        assert_eq!(default_prompt_pass(64, Some(64)), None);
    }
}
