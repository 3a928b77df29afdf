//! Each expert extent's bytes checked against the model's digest manifest as its read
//! completes: after its byte count was validated and before anything of its bundle is copied
//! or published, while the bundle's other reads may still be in flight.

use super::telemetry::DigestCheck;
use super::{ObjectId, Plan, PlanError, PoolIx, RejectKind, Ticket};
use crate::digests::{ExtentHashes, ModelDigests, Verify};
use std::collections::HashMap;
use std::time::Instant;

/// The expected digests of every extent of every managed object, in role order, and the one
/// reads are checked with.
pub(super) struct Expected {
    by_object: HashMap<ObjectId, Vec<ExtentHashes>>,
    with: Verify,
}

/// A digest of either algorithm, for messages.
fn hex_of(with: Verify, h: &ExtentHashes) -> String {
    match with {
        Verify::Xxh3 => format!("{:032x}", h.xxh3),
        Verify::Blake3 => hex::encode(h.blake3),
    }
}

impl Plan {
    /// Verifies every extent read from now on against `d` with `with`; refused where `d` lacks
    /// one of the manifest's extents.
    pub fn expect_digests(&mut self, d: &ModelDigests, with: Verify) -> Result<(), PlanError> {
        let mut expected = HashMap::with_capacity(self.manifest.objects.len());
        for o in &self.manifest.objects {
            let mut v = Vec::with_capacity(o.extents.len());
            for e in &o.extents {
                let Some(x) = d.extent(e.extent) else {
                    return Err(PlanError::Config {
                        detail: format!(
                            "object {} {}: the digest manifest {} has no extent at bytes {}..{}",
                            o.id,
                            e.role,
                            d.manifest_sha256,
                            e.extent.offset,
                            e.extent.end()
                        ),
                    });
                };
                v.push(x);
            }
            expected.insert(o.id, v);
        }
        self.obs.digests = Some(Expected { by_object: expected, with });
        self.obs.tel.digests =
            Some(DigestCheck { manifest_sha256: d.manifest_sha256.clone(), algorithm: Some(with.name().into()), ..Default::default() });
        Ok(())
    }

    /// The logical bytes of `t`'s extent where its read landed: its slot when it was read
    /// straight there, else its window.
    fn landed(&self, li: usize, t: &Ticket, direct: bool) -> &[u8] {
        let e = &self.manifest.object(t.object).expect("manifest object").extents[t.extent as usize];
        if direct {
            if let Some(p) = self.direct_target(li, t.extent as usize, t.slot, e) {
                // SAFETY: the slot is Loading and its read has completed: nothing writes it
                // until the bundle is published or discarded, and the region holds the extent.
                return unsafe { std::slice::from_raw_parts(p.as_ptr().add(e.covering.head as usize), e.extent.len as usize) };
            }
        }
        &self.io.source().window(t.window)[e.window_range()]
    }

    /// Says how many CPU threads the engine computes with, so that verification takes no core
    /// they need (see [`Plan::hash_landed`]).
    pub fn engine_threads(&mut self, n: usize) {
        self.obs.engine_threads = Some(n.max(1));
    }

    /// The digests of the checked extents' landed bytes, each with the nanoseconds its hashing
    /// took; None where reads are not verified. Extents that land together are hashed at once,
    /// on this thread and helpers, one lane per core the engine leaves: where layer `li`'s
    /// slots are host memory the engine computes its experts on the CPU, and its threads wait
    /// on cores of their own while this one (the acquiring thread) verifies.
    pub(super) fn hash_landed(&self, li: usize, checked: &[(Ticket, bool)]) -> Option<Vec<(ExtentHashes, u64)>> {
        let with = self.obs.digests.as_ref()?.with;
        let bytes: Vec<&[u8]> = checked.iter().map(|(t, direct)| self.landed(li, t, *direct)).collect();
        let host = self.pools.get(PoolIx { buffer: self.manifest.buffer_of(li), pool: 0 }).host(0).is_some();
        let engine = if host { self.obs.engine_threads } else { None };
        Some(hash_all(with, &bytes, helpers(&bytes, lanes(cores(), engine))))
    }

    /// Compares `t`'s landed extent's digest `got` (and its hashing time) with the manifest: a
    /// mismatch is a rejection.
    pub(super) fn verify_extent(&mut self, t: &Ticket, got: (ExtentHashes, u64)) -> Result<(), PlanError> {
        let Some((want, with)) = self.obs.digests.as_ref().map(|d| (d.by_object.get(&t.object).map(|v| v[t.extent as usize]), d.with))
        else {
            return Ok(());
        };
        let (got, ns) = got;
        let len = self.manifest.object(t.object).expect("manifest object").extents[t.extent as usize].extent.len;
        let ok = want.is_some_and(|w| match with {
            Verify::Xxh3 => w.xxh3 == got.xxh3,
            Verify::Blake3 => w.blake3 == got.blake3,
        });
        let check = self.obs.tel.digests.get_or_insert_with(Default::default);
        check.hash_ns += ns;
        check.extents += 1;
        check.bytes += len;
        if !ok {
            let manifest = check.manifest_sha256.clone();
            return Err(self.reject(
                RejectKind::DigestMismatch,
                t.id,
                format!(
                    "object {} extent {}: its {len} bytes hash to {} ({}), the digest manifest {manifest} says {}",
                    t.object,
                    t.extent,
                    hex_of(with, &got),
                    with.name(),
                    want.map_or("nothing".into(), |w| hex_of(with, &w))
                ),
            ));
        }
        Ok(())
    }
}

/// One extent's digest (only the algorithm's field set) and the nanoseconds it took.
fn hash_one(with: Verify, bytes: &[u8]) -> (ExtentHashes, u64) {
    let started = Instant::now();
    let h = match with {
        Verify::Xxh3 => ExtentHashes { xxh3: twox_hash::XxHash3_128::oneshot(bytes), ..Default::default() },
        Verify::Blake3 => ExtentHashes { blake3: *blake3::hash(bytes).as_bytes(), ..Default::default() },
    };
    (h, started.elapsed().as_nanos() as u64)
}

/// The bytes a helper thread must take over to pay for its start and join: on a 2-core
/// virtual machine a bundle of three 1 MiB extents took 0.45-0.47 ms to verify with one helper
/// on a core the engine left free, against 0.37 ms on this thread alone.
const HELPER_MIN_BYTES: usize = 2 << 20;

fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Hashing lanes on `cores` beside an engine computing on `engine` CPU threads (None: on a
/// device, or not said): this thread's, plus each core no engine thread runs on. An engine
/// thread with no work of its own during the wait still spins on its core, and a helper
/// beside it hashed more slowly than this thread alone.
fn lanes(cores: usize, engine: Option<usize>) -> usize {
    engine.map_or(cores, |n| cores.saturating_sub(n) + 1).clamp(1, cores.max(1))
}

/// Helper threads worth starting for `items`: one fewer than the lanes that could share them,
/// a lane per extent and per `lanes` at most, and per [`HELPER_MIN_BYTES`] of the whole at
/// least (small extents that land together, as a prompt pass's do, are hashed on this thread
/// alone).
fn helpers(items: &[&[u8]], lanes: usize) -> usize {
    let total: usize = items.iter().map(|b| b.len()).sum();
    items.len().min(lanes).min(total / HELPER_MIN_BYTES).saturating_sub(1)
}

/// The digests of `items`, in order: this thread hashes every `helpers + 1`-th one from the
/// first, each scoped helper the ones after it, all joined before returning.
fn hash_all(with: Verify, items: &[&[u8]], helpers: usize) -> Vec<(ExtentHashes, u64)> {
    if helpers == 0 {
        return items.iter().map(|b| hash_one(with, b)).collect();
    }
    let stride = helpers + 1;
    let lane = |k: usize| items.iter().skip(k).step_by(stride).map(|b| hash_one(with, b)).collect::<Vec<_>>();
    let lanes: Vec<Vec<(ExtentHashes, u64)>> = std::thread::scope(|s| {
        let spawned: Vec<_> = (1..stride).map(|k| s.spawn(move || lane(k))).collect();
        let mut lanes = vec![lane(0)];
        // A helper that panicked re-raises here, as if this thread had hashed its share.
        lanes.extend(spawned.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))));
        lanes
    });
    (0..items.len()).map(|i| lanes[i % stride][i / stride]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_hashed_across_helpers_come_back_in_order_with_their_own_digests() {
        let items: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i; 4096 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        for with in [Verify::Xxh3, Verify::Blake3] {
            let alone = hash_all(with, &refs, 0);
            for helpers in 1..4 {
                let spread = hash_all(with, &refs, helpers);
                assert_eq!(
                    spread.iter().map(|h| h.0).collect::<Vec<_>>(),
                    alone.iter().map(|h| h.0).collect::<Vec<_>>(),
                    "{helpers} helpers"
                );
            }
            for (h, b) in alone.iter().zip(&items) {
                assert_eq!(h.0.xxh3 != 0, with == Verify::Xxh3);
                if with == Verify::Xxh3 {
                    assert_eq!(h.0.xxh3, xxhash_rust::xxh3::xxh3_128(b));
                } else {
                    assert_eq!(h.0.blake3, *blake3::hash(b).as_bytes());
                }
            }
        }
        let (small, large) = (vec![0u8; 128 << 10], vec![0u8; 1 << 20]);
        let (small, large) = (small.as_slice(), large.as_slice());
        assert_eq!(helpers(&[large], 16), 0, "one extent is one lane");
        assert_eq!(helpers(&[small; 24], 16), 0, "3 MiB in small extents pays for no helper");
        assert_eq!(helpers(&[large; 3], 16), 0, "nor a bundle of three 1 MiB extents");
        assert_eq!(helpers(&[large; 8], 16), 3, "8 MiB: a lane per 2 MiB");
        assert_eq!(helpers(&[large; 8], 2), 1, "as the lanes allow");
        assert_eq!(helpers(&[large; 64], 16), 15);
        assert_eq!(helpers(&[large; 64], 1), 0);
    }

    #[test]
    fn verification_takes_the_cores_an_engine_on_the_cpu_leaves() {
        assert_eq!(lanes(2, Some(2)), 1, "an engine on both cores: this thread alone");
        assert_eq!(lanes(2, Some(1)), 2);
        assert_eq!(lanes(16, Some(4)), 13);
        assert_eq!(lanes(4, Some(8)), 1, "more engine threads than cores");
        assert_eq!(lanes(16, None), 16, "an engine on a device, or not said: every core");
        assert_eq!(lanes(1, None), 1);
    }
}
