//! Slot pools: the Plan's own or the engine's (filled through a [`SlotWriter`]), bound once, their layout (head and stride) checked before the first read lands in them, and the copies into them still in flight.

use super::*;

/// Slot `s` of a pool starts `head + s * stride` bytes past the start of its memory, so at
/// [`Plan::pool`] + `s * stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    pub head: u64,
    pub stride: u64,
}

/// A pool of the Plan: its layer buffer, and its place (role order) among that buffer's pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PoolIx {
    pub(super) buffer: usize,
    pub(super) pool: usize,
}

pub(super) struct Pool {
    pub(super) role: Role,
    pub(super) bytes_per_slot: u64,
    /// Where a slot starts past a page boundary ([`Manifest::slot_head`]), with slots `stride`
    /// apart: its extents' covering reads land whole in the slot's own stride. `None`: packed
    /// slots (`stride` = `bytes_per_slot`), filled through windows unless page-aligned.
    pub(super) head: Option<u64>,
    pub(super) stride: u64,
    pub(super) mem: PoolMem,
}

impl Pool {
    pub(super) fn new(role: Role, bytes_per_slot: u64, head: Option<u64>, mem: PoolMem) -> Pool {
        Pool { role, bytes_per_slot, head, stride: Pool::stride_of(bytes_per_slot, head), mem }
    }

    /// Slots with a head lie a whole number of pages apart, so each slot's covering reads fit.
    pub(super) fn stride_of(bytes_per_slot: u64, head: Option<u64>) -> u64 {
        head.map_or(bytes_per_slot, |h| align_up(h + bytes_per_slot))
    }

    /// Where `slot`'s bytes lie when the pool is host memory.
    pub(super) fn host(&self, slot: u32) -> Option<std::ptr::NonNull<u8>> {
        match &self.mem {
            // SAFETY: callers pass slot < n_slots: head + slot * stride + bytes_per_slot stays
            // inside the allocation (`Plan::build`).
            PoolMem::Host(buf) => {
                std::ptr::NonNull::new(unsafe { buf.as_ptr().add((self.head.unwrap_or(0) + u64::from(slot) * self.stride) as usize) })
            }
            PoolMem::Engine(Some(w)) => w.host(slot),
            PoolMem::Engine(None) => None,
        }
    }
}

/// The slot pools, per layer buffer in role order: the Plan's own, allocated once, or the
/// engine's, each bound once. Their addresses never move, and the engine's host pools are
/// advised huge pages once, before the first read lands in them.
pub(super) struct Pools {
    by_buffer: Vec<Vec<Pool>>,
    advised: bool,
}

impl Pools {
    /// One pool per role of every layer buffer: host memory allocated now (`host`), or unbound
    /// places for the engine's pools.
    pub(super) fn new(manifest: &Manifest, host: bool) -> Result<Pools, PlanError> {
        let mut by_buffer = Vec::new();
        let n_buffers = if manifest.layer_buffers == 0 { manifest.layers.len() } else { manifest.layer_buffers as usize };
        for (buffer, lp) in manifest.layers[..n_buffers].iter().enumerate() {
            let mut ps = Vec::new();
            for &RoleBytes { role, bytes_per_slot } in &lp.roles {
                let head = manifest.slot_head(buffer, role);
                let stride = Pool::stride_of(bytes_per_slot, head);
                let mem = if host {
                    PoolMem::Host(
                        AlignedBuf::new(head.unwrap_or(0) + stride * u64::from(lp.n_slots))
                            .map_err(|e| PlanError::Config { detail: format!("layer {} {role} pool: {e:#}", lp.layer) })?,
                    )
                } else {
                    PoolMem::Engine(None)
                };
                ps.push(Pool::new(role, bytes_per_slot, head, mem));
            }
            by_buffer.push(ps);
        }
        Ok(Pools { by_buffer, advised: false })
    }

    /// The pools of layer buffer `buffer`, in role order.
    pub(super) fn of_buffer(&self, buffer: usize) -> &[Pool] {
        &self.by_buffer[buffer]
    }

    pub(super) fn get(&self, PoolIx { buffer, pool }: PoolIx) -> &Pool {
        &self.by_buffer[buffer][pool]
    }

    /// The pool of `role` in layer buffer `buffer`.
    pub(super) fn find(&self, buffer: usize, role: Role) -> Option<PoolIx> {
        let pool = self.by_buffer[buffer].iter().position(|p| p.role == role)?;
        Some(PoolIx { buffer, pool })
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Pool> {
        self.by_buffer.iter().flatten()
    }

    /// The engine's writer of a bound pool.
    pub(super) fn writer(&self, ix: PoolIx) -> Option<&dyn SlotWriter> {
        match &self.get(ix).mem {
            PoolMem::Engine(Some(w)) => Some(w.as_ref()),
            _ => None,
        }
    }

    /// Binds the engine's writer to pool `ix` unless one is bound already (layers that share a
    /// buffer share one pool); returns whether this one was, and whether it copies asynchronously.
    pub(super) fn bind(&mut self, ix: PoolIx, writer: Box<dyn SlotWriter>) -> Result<Option<bool>, PlanError> {
        match &mut self.by_buffer[ix.buffer][ix.pool].mem {
            PoolMem::Host(_) => Err(PlanError::PoolMismatch { detail: "this Plan owns its pools".into() }),
            PoolMem::Engine(Some(_)) => Ok(None),
            PoolMem::Engine(w @ None) => {
                let asynchronous = writer.asynchronous();
                *w = Some(writer);
                Ok(Some(asynchronous))
            }
        }
    }

    /// Forgets the Plan's own pools without freeing them (reads may still land there); returns
    /// their bytes. The engine's pools are the engine's to keep.
    pub(super) fn leak_host(&mut self) -> u64 {
        let mut leaked = 0u64;
        for pool in self.by_buffer.iter_mut().flatten() {
            if let PoolMem::Host(buf) = std::mem::replace(&mut pool.mem, PoolMem::Engine(None)) {
                leaked += buf.len() as u64;
                std::mem::forget(buf);
            }
        }
        leaked
    }

    /// Advises huge pages for the engine's host pools, once (`None` after the first call); a
    /// pool in device memory, or laid out otherwise than asked, loses its head (no read goes
    /// straight in). Returns the bytes advised over all host pools.
    fn advise_engine(&mut self, manifest: &Manifest) -> Option<u64> {
        if std::mem::replace(&mut self.advised, true) {
            return None;
        }
        let mut advised = 0u64;
        for (li, lp) in manifest.layers.iter().enumerate() {
            if manifest.buffer_of(li) != li || lp.n_slots == 0 {
                continue;
            }
            for pool in &mut self.by_buffer[li] {
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
        for pool in self.iter() {
            if let PoolMem::Host(buf) = &pool.mem {
                advised += buf.huge_bytes() as u64;
            }
        }
        Some(advised)
    }
}

/// Why the engine could not copy into one of its slots, in its own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyError {
    pub detail: String,
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for CopyError {}

/// The engine's way to fill one slot of a pool it owns.
pub trait SlotWriter: Send {
    /// Copies `src` (one slot's bytes) into `slot`; returns once the copy has completed.
    fn write(&self, slot: u32, src: &[u8]) -> Result<(), CopyError>;
    /// Where `slot` lies when the pool is plain host memory, so that a write would be a memcpy
    /// there; `None` otherwise (device memory, or not allocated yet). A source may then read
    /// straight into it.
    fn host(&self, _slot: u32) -> Option<std::ptr::NonNull<u8>> {
        None
    }
    /// [`SlotWriter::begin`] returns before the copy completes (a copy stream and events).
    fn asynchronous(&self) -> bool {
        false
    }
    /// Starts copying `src` into `slot`; the id goes to [`SlotWriter::wait`]. The default
    /// copies synchronously.
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until `wait` returned for the id.
    unsafe fn begin(&self, slot: u32, src: &[u8]) -> Result<u64, CopyError> {
        self.write(slot, src).map(|()| 0)
    }
    /// Waits for copy `id` alone: once it returns, the bytes are in the slot.
    fn wait(&self, _id: u64) -> Result<(), CopyError> {
        Ok(())
    }
}

/// A bundle whose window → slot copies are in flight on the device's copy stream: its window
/// stays Copying and its slot Loading until every copy's event has completed.
pub(super) struct InFlightCopy {
    pub(super) li: usize,
    pub(super) window: u32,
    pub(super) object: ObjectId,
    pub(super) slot: u32,
    pub(super) version: Version,
    pub(super) ids: Vec<CopyId>,
    pub(super) issued: Instant,
    pub(super) copied: u64,
}

/// The copies into slots still in flight, oldest first: each holds its window Copying and its
/// slot Loading until it is finished (published) or, on a failed Plan, waited for.
#[derive(Default)]
pub(super) struct Copies {
    queue: VecDeque<InFlightCopy>,
    /// Some bound pool copies asynchronously (set as pools are bound).
    asynchronous: bool,
}

impl Copies {
    /// A pool was bound whose writer copies asynchronously or not.
    pub(super) fn bound(&mut self, asynchronous: bool) {
        self.asynchronous |= asynchronous;
    }

    /// Whether any copy can be left in flight (some bound pool copies asynchronously).
    pub(super) fn asynchronous(&self) -> bool {
        self.asynchronous
    }

    pub(super) fn push(&mut self, c: InFlightCopy) {
        self.queue.push_back(c);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The oldest copy in flight that `which` selects, no longer queued.
    pub(super) fn take_oldest(&mut self, which: impl Fn(&InFlightCopy) -> bool) -> Option<InFlightCopy> {
        let i = self.queue.iter().position(which)?;
        self.queue.remove(i)
    }

    /// Whether a copy into slot `slot` of layer index `li` is in flight.
    pub(super) fn copying_into(&self, li: usize, slot: u32) -> bool {
        self.queue.iter().any(|c| c.li == li && c.slot == slot)
    }

    /// Every copy in flight, no longer queued.
    pub(super) fn take_all(&mut self) -> VecDeque<InFlightCopy> {
        std::mem::take(&mut self.queue)
    }
}

pub(super) enum PoolMem {
    /// Memory the Plan owns.
    Host(AlignedBuf),
    /// The engine's pool, once bound.
    Engine(Option<Box<dyn SlotWriter>>),
}

/// An asynchronous copy into a slot: the pool (its index in the layer's buffer) and the id
/// its writer returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CopyId {
    pub(super) pool: usize,
    pub(super) id: u64,
}

impl Plan {
    /// The (layer, role) pool's buffer and pool, when the request agrees with the manifest.
    pub(super) fn pool_of(&self, layer: u32, role: Role, bytes_per_slot: u64, n_slots: u32) -> Result<PoolIx, PlanError> {
        let mismatch = |detail: String| PlanError::PoolMismatch { detail };
        let li = self.manifest.layer_index(layer).ok_or_else(|| mismatch(format!("layer {layer} is not managed")))?;
        let lp = &self.manifest.layers[li];
        let buffer = self.manifest.buffer_of(li);
        let ix = self.pools.find(buffer, role).ok_or_else(|| mismatch(format!("layer {layer} has no {role} role")))?;
        let pool = self.pools.get(ix);
        if pool.bytes_per_slot != bytes_per_slot || lp.n_slots != n_slots {
            return Err(mismatch(format!(
                "layer {layer} {role}: asked {n_slots} slots of {bytes_per_slot} bytes, the manifest has {} of {}",
                lp.n_slots, pool.bytes_per_slot
            )));
        }
        Ok(ix)
    }

    /// Where slots of (layer, role) start past a page boundary (the engine asks before it
    /// allocates a host pool) when `bytes_per_slot` is the manifest's; `None`: packed slots.
    pub fn slot_head(&self, layer: u32, role: Role, bytes_per_slot: u64) -> Option<u64> {
        let li = self.manifest.layer_index(layer)?;
        let pool = self.pools.get(self.pools.find(self.manifest.buffer_of(li), role)?);
        (pool.bytes_per_slot == bytes_per_slot).then_some(pool.head).flatten()
    }

    /// How the slots of the (layer, role) pool lie in its memory.
    pub fn slot_layout(&self, layer: u32, role: Role) -> Option<SlotLayout> {
        let li = self.manifest.layer_index(layer)?;
        let pool = self.pools.get(self.pools.find(self.manifest.buffer_of(li), role)?);
        Some(SlotLayout { head: pool.head.unwrap_or(0), stride: pool.stride })
    }

    /// The stable address of slot 0 of the (layer, role) host pool. Refuses, without failing the
    /// Plan, any request whose role, bytes per slot or slot count disagrees with the manifest.
    pub fn pool(&self, layer: u32, role: Role, bytes_per_slot: u64, n_slots: u32) -> Result<*mut u8, PlanError> {
        let pool = self.pools.get(self.pool_of(layer, role, bytes_per_slot, n_slots)?);
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
        let ix = self.pool_of(layer, role, bytes_per_slot, n_slots)?;
        if let Some(asynchronous) = self.pools.bind(ix, writer)? {
            self.copies.bound(asynchronous);
        }
        Ok(ix.buffer as u32)
    }

    /// The bytes of `slot`'s region of a host pool's `role` (whatever its state: read-only
    /// inspection); `None` for the engine's pools.
    pub fn slot_bytes(&self, layer: u32, role: Role, slot: u32) -> Option<&[u8]> {
        let li = self.manifest.layer_index(layer)?;
        if slot >= self.manifest.layers[li].n_slots {
            return None;
        }
        let p = self.pools.get(self.pools.find(self.manifest.buffer_of(li), role)?);
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
        let pool = self.pools.get(PoolIx { buffer: self.manifest.buffer_of(li), pool: i });
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
        let Some(advised) = self.pools.advise_engine(&self.manifest) else { return };
        let (mut direct, mut windowed) = (0, 0);
        for pool in self.pools.iter() {
            if pool.host(0).is_some() {
                if pool.head.is_some() {
                    direct += 1
                } else {
                    windowed += 1
                }
            }
        }
        let mv = self.obs.tel.movement.get_or_insert_with(Default::default);
        mv.huge_advised_bytes = advised;
        (mv.host_pools_direct, mv.host_pools_windowed) = (direct, windowed);
    }
}
