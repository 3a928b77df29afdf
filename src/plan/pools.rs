//! Slot pools: the Plan's own or the engine's, bound once, their layout (head and stride) checked before the first read lands in them.

use super::*;

impl Plan {
    /// The (layer, role) pool's buffer and pool, when the request agrees with the manifest.
    pub(super) fn pool_of(&self, layer: u32, role: Role, bytes_per_slot: u64, n_slots: u32) -> Result<(usize, usize), PlanError> {
        let mismatch = |detail: String| PlanError::PoolMismatch { detail };
        let li = self.manifest.layer_index(layer).ok_or_else(|| mismatch(format!("layer {layer} is not managed")))?;
        let lp = &self.manifest.layers[li];
        let buffer = self.manifest.buffer_of(li);
        let i =
            self.pools[buffer].iter().position(|p| p.role == role).ok_or_else(|| mismatch(format!("layer {layer} has no {role} role")))?;
        let pool = &self.pools[buffer][i];
        if pool.bytes_per_slot != bytes_per_slot || lp.n_slots != n_slots {
            return Err(mismatch(format!(
                "layer {layer} {role}: asked {n_slots} slots of {bytes_per_slot} bytes, the manifest has {} of {}",
                lp.n_slots, pool.bytes_per_slot
            )));
        }
        Ok((buffer, i))
    }

    /// Where slots of (layer, role) start past a page boundary (the engine asks before it
    /// allocates a host pool) when `bytes_per_slot` is the manifest's; `None`: packed slots.
    pub fn slot_head(&self, layer: u32, role: Role, bytes_per_slot: u64) -> Option<u64> {
        let li = self.manifest.layer_index(layer)?;
        let pool = self.pools[self.manifest.buffer_of(li)].iter().find(|p| p.role == role)?;
        (pool.bytes_per_slot == bytes_per_slot).then_some(pool.head).flatten()
    }

    /// (head, stride) of the (layer, role) pool: slot `s` starts `head + s * stride` bytes past
    /// the start of its memory, so [`Plan::pool`] + `s * stride`.
    pub fn slot_layout(&self, layer: u32, role: Role) -> Option<(u64, u64)> {
        let li = self.manifest.layer_index(layer)?;
        let pool = self.pools[self.manifest.buffer_of(li)].iter().find(|p| p.role == role)?;
        Some((pool.head.unwrap_or(0), pool.stride))
    }

    /// The stable address of slot 0 of the (layer, role) host pool. Refuses, without failing the
    /// Plan, any request whose role, bytes per slot or slot count disagrees with the manifest.
    pub fn pool(&self, layer: u32, role: Role, bytes_per_slot: u64, n_slots: u32) -> Result<*mut u8, PlanError> {
        let (buffer, i) = self.pool_of(layer, role, bytes_per_slot, n_slots)?;
        let pool = &self.pools[buffer][i];
        match &pool.mem {
            // SAFETY: the head lies inside the allocation (`Plan::build`).
            PoolMem::Host(buf) => Ok(unsafe { buf.as_ptr().add(pool.head.unwrap_or(0) as usize) }),
            PoolMem::Engine(_) => Err(PlanError::PoolMismatch { detail: "the engine owns this pool".into() }),
        }
    }

    /// Binds the engine's pool of (layer, role) and returns its buffer: layers that share a
    /// buffer share one pool, so the first binding of a buffer is kept. Refuses, without
    /// failing the Plan, a request that disagrees with the manifest or a Plan with host pools.
    pub fn bind(
        &mut self,
        layer: u32,
        role: Role,
        bytes_per_slot: u64,
        n_slots: u32,
        writer: Box<dyn SlotWriter>,
    ) -> Result<u32, PlanError> {
        let (buffer, i) = self.pool_of(layer, role, bytes_per_slot, n_slots)?;
        match &mut self.pools[buffer][i].mem {
            PoolMem::Host(_) => return Err(PlanError::PoolMismatch { detail: "this Plan owns its pools".into() }),
            PoolMem::Engine(w) => {
                if w.is_none() {
                    self.copies_async |= writer.asynchronous();
                    *w = Some(writer);
                }
            }
        }
        Ok(buffer as u32)
    }

    /// The bytes of `slot`'s region of a host pool's `role` (whatever its state: read-only
    /// inspection); `None` for the engine's pools.
    pub fn slot_bytes(&self, layer: u32, role: Role, slot: u32) -> Option<&[u8]> {
        let li = self.manifest.layer_index(layer)?;
        if slot >= self.manifest.layers[li].n_slots {
            return None;
        }
        let p = self.pools[self.manifest.buffer_of(li)].iter().find(|p| p.role == role)?;
        let PoolMem::Host(buf) = &p.mem else { return None };
        let start = (p.head.unwrap_or(0) + u64::from(slot) * p.stride) as usize;
        Some(&buf.as_slice()[start..start + p.bytes_per_slot as usize])
    }

    /// Where the covering read of extent `i` of a bundle for `slot` of layer index `li` can
    /// land straight in the slot: a source that takes host targets, pool memory on the host
    /// whose slots start at the extent's offset within a page (its head) past a page boundary,
    /// and a covering read that fits the slot's stride. The logical bytes then start at the
    /// slot's address; the padding falls in the slot's margins. `None`: the window.
    pub(super) fn direct_target(&self, li: usize, i: usize, slot: u32, e: &ExtentPlan) -> Option<std::ptr::NonNull<u8>> {
        if !self.io.source().reads_into_host() {
            return None;
        }
        let pool = &self.pools[self.manifest.buffer_of(li)][i];
        let head = pool.head?;
        if pool.role != e.role || pool.bytes_per_slot != e.extent.len || e.covering.head != head || e.covering.len > pool.stride {
            return None;
        }
        let p = pool.host(slot)?.as_ptr();
        if (p as u64).wrapping_sub(head) % ALIGN != 0 {
            return None;
        }
        // The head room lies inside the slot's stride, so inside the pool's memory.
        std::ptr::NonNull::new(p.wrapping_sub(head as usize))
    }

    /// Advises huge pages for the engine's host slot pools once, before the first read touches
    /// them (the Plan's own pools are advised when allocated): the pool memory exists only after
    /// the engine allocated it, which is after binding.
    pub(super) fn advise_engine_pools(&mut self) {
        if std::mem::replace(&mut self.advised, true) {
            return;
        }
        let mut advised = 0u64;
        for (li, lp) in self.manifest.layers.iter().enumerate() {
            if self.manifest.buffer_of(li) != li || lp.n_slots == 0 {
                continue;
            }
            for pool in &mut self.pools[li] {
                let PoolMem::Engine(Some(w)) = &pool.mem else { continue };
                let (Some(first), Some(last)) = (w.host(0), w.host(lp.n_slots - 1)) else {
                    // Device memory: filled by copies, so no layout to honour.
                    pool.head = None;
                    continue;
                };
                let span = pool.stride as usize * (lp.n_slots as usize - 1);
                if last.as_ptr() as usize != first.as_ptr() as usize + span {
                    // The engine did not lay the slots out as asked: no read goes straight in.
                    pool.head = None;
                    continue;
                }
                let head = pool.head.unwrap_or(0) as usize;
                let len = head + pool.stride as usize * lp.n_slots as usize;
                advised += crate::source::advise_huge(first.as_ptr().wrapping_sub(head), len) as u64;
            }
        }
        let (mut direct, mut windowed) = (0, 0);
        for pool in self.pools.iter().flatten() {
            if pool.host(0).is_some() {
                if pool.head.is_some() {
                    direct += 1
                } else {
                    windowed += 1
                }
            }
        }
        for pool in self.pools.iter().flatten() {
            if let PoolMem::Host(buf) = &pool.mem {
                advised += buf.huge_bytes() as u64;
            }
        }
        let mv = self.obs.tel.movement.get_or_insert_with(Default::default);
        mv.huge_advised_bytes = advised;
        (mv.host_pools_direct, mv.host_pools_windowed) = (direct, windowed);
    }
}
