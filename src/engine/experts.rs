//! The expert-source boundary (patches/0001-expert-source.patch): llama.cpp allocates slot pools
//! where it keeps each layer's weights and hands the source a [`SlotPool`] to fill them; during
//! decode it asks the source to make experts resident.

use super::sys;
use crate::plan::report::{SourceDescription, SourceReport};
use anyhow::{bail, Result};
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One engine-owned slot pool: the source writes whole slots into it (a host-to-device copy
/// when the pool lives on a device), never through a pointer.
pub struct SlotPool {
    handle: *mut c_void,
    write: unsafe extern "C" fn(*mut c_void, u32, *const c_void, usize) -> i32,
    host: Option<unsafe extern "C" fn(*mut c_void, u32) -> *mut c_void>,
    copy_begin: Option<unsafe extern "C" fn(*mut c_void, u32, *const c_void, usize) -> i64>,
    copy_wait: Option<unsafe extern "C" fn(*mut c_void, i64) -> i32>,
    asynchronous: bool,
    device: String,
    bytes: u64,
}

// SAFETY: the handle is the engine's pool, valid until the model is freed; writes are made
// from the compute thread's callbacks, one at a time.
unsafe impl Send for SlotPool {}

impl SlotPool {
    /// The backend device holding the pool (`CPU`, `CUDA0`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Memory the pool holds: its slots.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Copies `src` (exactly one slot) into `slot`; returns once the bytes are in the slot.
    pub fn write(&self, slot: u32, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is valid for its length during the call; the engine checks slot and size.
        if unsafe { (self.write)(self.handle, slot, src.as_ptr().cast(), src.len()) } != 0 {
            bail!("the engine refused a write of {} bytes into slot {slot} of a {} pool", src.len(), self.device);
        }
        Ok(())
    }

    /// Copies run on a copy stream of their own with an event each ([`SlotPool::begin`] returns
    /// before the copy completes); false where the device has no asynchronous set or events.
    pub fn asynchronous(&self) -> bool {
        self.asynchronous && self.copy_begin.is_some() && self.copy_wait.is_some()
    }

    /// Starts copying `src` (exactly one slot) into `slot` and returns the copy's id for
    /// [`SlotPool::wait`]. Asynchronous pools queue the copy and record its event; the others
    /// have copied when this returns.
    ///
    /// # Safety
    /// `src` must stay valid and unchanged until `wait` returned for the id (the device reads it
    /// while the copy is in flight).
    pub unsafe fn begin(&self, slot: u32, src: &[u8]) -> Result<u64> {
        let Some(f) = self.copy_begin else {
            self.write(slot, src)?;
            return Ok(0);
        };
        // SAFETY: the caller keeps `src` alive until the copy's wait; the engine checks slot and size.
        let id = unsafe { f(self.handle, slot, src.as_ptr().cast(), src.len()) };
        if id < 0 {
            bail!("the engine refused a copy of {} bytes into slot {slot} of a {} pool", src.len(), self.device);
        }
        Ok(id as u64)
    }

    /// Waits for copy `id`'s event (not the whole device): the bytes are in the slot.
    pub fn wait(&self, id: u64) -> Result<()> {
        let Some(f) = self.copy_wait else { return Ok(()) };
        // SAFETY: the handle is this pool's; the engine refuses an id it did not hand out.
        if unsafe { f(self.handle, id as i64) } != 0 {
            bail!("the engine has no copy {id} in flight on the {} pool", self.device);
        }
        Ok(())
    }

    /// Where `slot` lies in host memory when the pool is plain host memory (a write is then a
    /// memcpy there); `None` on a device, for a slot out of range, or before the engine has
    /// allocated the pool (after the pool callback returns).
    pub fn host(&self, slot: u32) -> Option<std::ptr::NonNull<u8>> {
        let f = self.host?;
        // SAFETY: the handle is this pool's; the engine checks the slot and returns NULL when it
        // has no host address.
        std::ptr::NonNull::new(unsafe { f(self.handle, slot) }.cast())
    }
}

/// What owns the expert weights when they are not loaded by llama.cpp.
pub trait ExpertSource: Send {
    /// Slots per MoE layer.
    fn n_slots(&self) -> u32;
    /// Distinct experts one pass serves in every layer (1..=n_slots): the engine builds
    /// ceil(distinct / n_per_pass) passes, so no group the source forms goes unserved.
    fn n_per_pass(&self) -> u32 {
        self.n_slots()
    }
    /// The same for a ubatch of one token (1..=n_per_pass): smaller passes let the source still
    /// be reading a layer's later groups while the engine computes the earlier ones.
    fn n_per_token_pass(&self) -> u32 {
        self.n_per_pass()
    }
    /// Takes the engine's pool of expert tensor `name` of `layer` (`n_slots` slots of
    /// `slot_bytes`) and returns its buffer: pools of one role with the same buffer share memory.
    fn pool(&mut self, layer: u32, name: &str, slot_bytes: usize, n_slots: u32, pool: SlotPool) -> Result<u32>;
    /// Asked before [`ExpertSource::pool`] for a pool of plain host memory: `Some(head)` (under
    /// 4096) places each slot `head` bytes past a page boundary, slots `round_up(head +
    /// slot_bytes, 4096)` apart, so that an extent at that offset within a page of the file can
    /// be read straight into a slot. `None`: packed slots.
    fn slot_head(&mut self, layer: u32, name: &str, slot_bytes: usize) -> Option<u64> {
        let _ = (layer, name, slot_bytes);
        None
    }
    /// Make group `pass` of the distinct experts in `ids` resident; `slots[i]` gets the slot of
    /// `ids[i]`, or -1 when that expert belongs to another group.
    fn acquire(&mut self, layer: u32, pass: u32, ids: &[i32], slots: &mut [i32]) -> Result<()>;
    /// The slots of (layer, pass) are no longer read.
    fn release(&mut self, layer: u32, pass: u32) -> Result<()>;
    /// A llama_decode of `n_tokens` is about to start (a token's begin mark).
    fn decoding(&mut self, n_tokens: usize) {
        let _ = n_tokens;
    }
    /// The request's prompt is decoded: the decodes so far are its prefill (a drafted run's
    /// traversals that follow feed several tokens too, and are not).
    fn prompted(&mut self) {}
    /// A decode returned (`ok`) or failed: the events it started are over. An error fails
    /// that decode closed.
    fn decoded(&mut self, ok: bool) -> Result<()> {
        let _ = ok;
        Ok(())
    }
    /// Ends a request of a session (every event released) with what the source saw of it
    /// alone; what it counts starts again for the next. A source that serves one request
    /// only refuses.
    fn end_request(&mut self) -> Result<SourceReport> {
        anyhow::bail!("this expert source serves one request: it cannot end one and go on")
    }
    /// Readies the source for the next request of a session, of `outputs` tokens after its
    /// prompt, as `between` says, or refuses (the session then fails closed). A source that
    /// serves one request only refuses.
    fn between(&mut self, between: crate::session::Between, outputs: u32) -> Result<()> {
        let _ = outputs;
        anyhow::bail!("this expert source serves one request: it cannot go on to another ({between:?})")
    }
    /// What the source is, for the record's parameters.
    fn describe(&self) -> SourceDescription;
    /// Closes the source after the run and reports what it saw.
    fn finish(&mut self) -> Result<SourceReport>;
    /// Expert bytes read from storage so far, where the source counts them.
    fn bytes_read(&self) -> Option<u64> {
        None
    }
    /// Surfaces the source recorded, for the record (after `finish`).
    fn surfaces(&mut self) -> Vec<SourceSurface> {
        Vec::new()
    }
}

/// A surface an expert source recorded: its name in the record, its file, its bytes.
pub struct SourceSurface {
    pub name: String,
    pub file: String,
    pub bytes: Vec<u8>,
}

/// The source as llama.cpp sees it, plus the first error it reported (for the decode's error).
pub(super) struct Bridge {
    pub source: Box<dyn ExpertSource>,
    pub error: Option<String>,
    pub c: sys::llama_expert_source,
}

impl Bridge {
    pub fn new(source: Box<dyn ExpertSource>) -> Box<Bridge> {
        let n_slots = source.n_slots();
        let n_per_pass = source.n_per_pass();
        let n_per_token_pass = source.n_per_token_pass();
        let mut b = Box::new(Bridge {
            source,
            error: None,
            c: sys::llama_expert_source {
                user: std::ptr::null_mut(),
                n_slots,
                n_per_pass,
                n_per_token_pass,
                pool: Some(pool_cb),
                acquire: Some(acquire_cb),
                release: Some(release_cb),
                slot_head: Some(slot_head_cb),
            },
        });
        b.c.user = (&mut *b) as *mut Bridge as *mut c_void;
        b
    }

    fn fail(&mut self, what: String) {
        if self.error.is_none() {
            self.error = Some(what);
        }
    }
}

/// Runs a callback body without letting a panic cross into C; failures are kept in the bridge.
fn guarded(user: *mut c_void, f: impl FnOnce(&mut Bridge) -> Result<()>) -> bool {
    // SAFETY: `user` is the Bridge registered with llama.cpp; it outlives the model, and
    // llama.cpp calls back one at a time from the compute thread.
    let bridge = unsafe { &mut *(user as *mut Bridge) };
    match catch_unwind(AssertUnwindSafe(|| f(bridge))) {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            bridge.fail(format!("{e:#}"));
            false
        }
        Err(_) => {
            bridge.fail("expert source panicked".into());
            false
        }
    }
}

/// llama.cpp's pool callback.
///
/// # Safety
/// `user` is the [`Bridge`] registered with the model; `name` is NUL-terminated and `pool`
/// points at a valid pool description for the duration of the call.
unsafe extern "C" fn pool_cb(
    user: *mut c_void,
    il: i32,
    name: *const c_char,
    slot_bytes: usize,
    n_slots: u32,
    pool: *const sys::llama_expert_pool,
) -> i32 {
    let mut out = -1;
    guarded(user, |b| {
        // SAFETY: llama.cpp passes a NUL-terminated tensor name and a valid pool description.
        let (name, pool) = unsafe { (CStr::from_ptr(name).to_string_lossy(), &*pool) };
        let Some(write) = pool.write else { bail!("the engine gave no write function for {name}") };
        // SAFETY: the device name is NUL-terminated and owned by the backend registry.
        let device = if pool.device.is_null() { "?".into() } else { unsafe { CStr::from_ptr(pool.device) }.to_string_lossy().into_owned() };
        let buffer = b.source.pool(
            il as u32,
            &name,
            slot_bytes,
            n_slots,
            SlotPool {
                handle: pool.handle,
                write,
                host: pool.host,
                copy_begin: pool.copy_begin,
                copy_wait: pool.copy_wait,
                asynchronous: pool.async_,
                device,
                bytes: pool.bytes as u64,
            },
        )?;
        out = i32::try_from(buffer)?;
        Ok(())
    });
    out
}

/// llama.cpp's slot layout callback: 0 with `*head` set, or 1 for packed slots.
///
/// # Safety
/// `user` is the [`Bridge`] registered with the model; `name` is NUL-terminated and `head` is
/// valid for a write for the duration of the call.
unsafe extern "C" fn slot_head_cb(user: *mut c_void, il: i32, name: *const c_char, slot_bytes: usize, head: *mut usize) -> i32 {
    let mut out = None;
    guarded(user, |b| {
        // SAFETY: llama.cpp passes a NUL-terminated tensor name.
        let name = unsafe { CStr::from_ptr(name).to_string_lossy() };
        out = b.source.slot_head(il as u32, &name, slot_bytes).filter(|&h| h < crate::source::ALIGN);
        Ok(())
    });
    match out {
        Some(h) => {
            // SAFETY: `head` is valid for a write for the duration of the call.
            unsafe { *head = h as usize };
            0
        }
        None => 1,
    }
}

/// llama.cpp's acquire callback.
///
/// # Safety
/// `user` is the registered [`Bridge`]; `ids` and `slots` hold `n_ids` entries each for the
/// duration of the call.
unsafe extern "C" fn acquire_cb(user: *mut c_void, il: i32, pass: i32, ids: *const i32, n_ids: i64, slots: *mut i32) -> i32 {
    let ok = guarded(user, |b| {
        // SAFETY: both arrays hold n_ids entries for the duration of the call.
        let (ids, slots) =
            unsafe { (std::slice::from_raw_parts(ids, n_ids as usize), std::slice::from_raw_parts_mut(slots, n_ids as usize)) };
        b.source.acquire(il as u32, pass as u32, ids, slots)
    });
    if ok {
        0
    } else {
        1
    }
}

/// llama.cpp's release callback.
///
/// # Safety
/// `user` is the registered [`Bridge`].
unsafe extern "C" fn release_cb(user: *mut c_void, il: i32, pass: i32) -> i32 {
    if guarded(user, |b| b.source.release(il as u32, pass as u32)) {
        0
    } else {
        1
    }
}
