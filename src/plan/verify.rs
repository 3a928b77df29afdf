//! Each expert extent's bytes checked against the model's digest manifest as its read
//! completes: after its byte count was validated and before anything of its bundle is copied
//! or published, while the bundle's other reads may still be in flight.

use super::telemetry::DigestCheck;
use super::{ObjectId, Plan, PlanError, RejectKind, Ticket};
use crate::digests::ModelDigests;
use std::collections::HashMap;
use std::time::Instant;

/// The expected SHA-256 of every extent of every managed object, in role order.
pub(super) type Expected = HashMap<ObjectId, Vec<[u8; 32]>>;

impl Plan {
    /// Verifies every extent read from now on against `d`; refused where `d` lacks one of the
    /// manifest's extents.
    pub fn expect_digests(&mut self, d: &ModelDigests) -> Result<(), PlanError> {
        let mut expected = Expected::with_capacity(self.manifest.objects.len());
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
        self.digests = Some(expected);
        self.tel.digests = Some(DigestCheck { manifest_sha256: d.manifest_sha256.clone(), ..Default::default() });
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
                return unsafe { std::slice::from_raw_parts(p.as_ptr(), e.extent.len as usize) };
            }
        }
        &self.source.window(t.window)[e.window_range()]
    }

    /// Hashes `t`'s landed extent and compares it with the manifest: a mismatch is a rejection.
    pub(super) fn verify_extent(&mut self, li: usize, t: &Ticket, direct: bool) -> Result<(), PlanError> {
        let Some(want) = self.digests.as_ref().map(|d| d.get(&t.object).map(|v| v[t.extent as usize])) else {
            return Ok(());
        };
        let started = Instant::now();
        let bytes = self.landed(li, t, direct);
        let len = bytes.len() as u64;
        let got: [u8; 32] = *blake3::hash(bytes).as_bytes();
        let ns = started.elapsed().as_nanos() as u64;
        let check = self.tel.digests.get_or_insert_with(Default::default);
        check.hash_ns += ns;
        check.extents += 1;
        check.bytes += len;
        if want != Some(got) {
            let manifest = check.manifest_sha256.clone();
            return Err(self.reject(
                RejectKind::DigestMismatch,
                t.id,
                format!(
                    "object {} extent {}: its {len} bytes hash to {}, the digest manifest {manifest} says {}",
                    t.object,
                    t.extent,
                    hex::encode(got),
                    want.map_or("nothing".into(), hex::encode)
                ),
            ));
        }
        Ok(())
    }
}
