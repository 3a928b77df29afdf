//! Each expert extent's bytes checked against the model's digest manifest as its read
//! completes: after its byte count was validated and before anything of its bundle is copied
//! or published, while the bundle's other reads may still be in flight.

use super::telemetry::DigestCheck;
use super::{ObjectId, Plan, PlanError, RejectKind, Ticket};
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

    /// Hashes `t`'s landed extent and compares it with the manifest: a mismatch is a rejection.
    pub(super) fn verify_extent(&mut self, li: usize, t: &Ticket, direct: bool) -> Result<(), PlanError> {
        let Some((want, with)) = self.obs.digests.as_ref().map(|d| (d.by_object.get(&t.object).map(|v| v[t.extent as usize]), d.with))
        else {
            return Ok(());
        };
        let started = Instant::now();
        let bytes = self.landed(li, t, direct);
        let len = bytes.len() as u64;
        // On the hot path: the digest is spelled only for a mismatch's message.
        let got = match with {
            Verify::Xxh3 => ExtentHashes { xxh3: xxhash_rust::xxh3::xxh3_128(bytes), ..Default::default() },
            Verify::Blake3 => ExtentHashes { blake3: *blake3::hash(bytes).as_bytes(), ..Default::default() },
        };
        let ok = want.is_some_and(|w| match with {
            Verify::Xxh3 => w.xxh3 == got.xxh3,
            Verify::Blake3 => w.blake3 == got.blake3,
        });
        let ns = started.elapsed().as_nanos() as u64;
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
