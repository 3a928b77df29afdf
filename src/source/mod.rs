//! The source boundary: reads of model-file extents into a fixed set of aligned host windows.
//!
//! A source owns its windows and its file; it never decides what is visible. The Plan submits
//! one [`ReadRequest`] per extent (a pass's worth at once through [`Source::submit_vectored`],
//! where F may join neighbours into one read and read aligned extents straight into a slot),
//! takes [`Completion`]s back with [`Source::wait`], one per request, validates them and only
//! then copies bytes out of the window. The Plan does not know which source it
//! has: this module holds the trait and P, the buffered source; the direct sources (D, F) and
//! fault plans live behind the same trait.
//!
//! Placement contract, the same for every source: a request reads the covering aligned range
//! ([`Covering`]) of its logical extent into window `window` starting at `window_offset` (a
//! multiple of [`ALIGN`]); the logical bytes therefore lie at
//! `window_offset + covering.head .. + len`. A completion's `Ok(n)` is the number of *logical*
//! bytes of the extent that were delivered: `n < len` is a short read, for the Plan to reject.

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};
use serde::Serialize;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::str::FromStr;

pub mod fault;
pub mod uring;

pub use uring::UringSource;

/// Alignment of direct I/O: file offsets, lengths, window offsets and buffer addresses.
pub const ALIGN: u64 = 4096;

/// A model is one file or a shard set. A position in it keys a byte by (shard, offset): the
/// shard's index above bit 48, the offset within that shard's file below. Alignment, covering
/// reads and adjacency are the same on positions as on offsets, and no extent or covering read
/// crosses from one shard into the next.
pub const SHARD_SHIFT: u32 = 48;

/// The position of byte `offset` of shard `shard`.
pub fn position(shard: u32, offset: u64) -> u64 {
    debug_assert!(offset < 1 << SHARD_SHIFT);
    (u64::from(shard) << SHARD_SHIFT) | offset
}

/// (shard, offset within its file) of a position.
pub fn shard_offset(position: u64) -> (usize, u64) {
    ((position >> SHARD_SHIFT) as usize, position & ((1 << SHARD_SHIFT) - 1))
}

/// The files of a model, one per shard, in set order; positions select among them.
pub struct ModelFiles {
    files: Vec<File>,
}

impl ModelFiles {
    /// Opens every shard through the page cache (`direct`: false) or around it (`O_DIRECT`).
    pub fn open<P: AsRef<Path>>(paths: &[P], direct: bool) -> Result<ModelFiles> {
        if paths.is_empty() || paths.len() > 1 << 16 {
            bail!("a model has 1 to 65536 files, not {}", paths.len());
        }
        let files = paths
            .iter()
            .map(|p| {
                let p = p.as_ref();
                if direct {
                    open_direct(p)
                } else {
                    File::open(p).with_context(|| format!("{}: cannot open", p.display()))
                }
            })
            .collect::<Result<_>>()?;
        Ok(ModelFiles { files })
    }

    /// The file holding `position` and the offset within it.
    pub fn at(&self, position: u64) -> Result<(&File, u64), SourceError> {
        let (shard, offset) = shard_offset(position);
        self.files.get(shard).map(|f| (f, offset)).ok_or(SourceError::NoSuchShard { shard, n_shards: self.files.len() })
    }

    pub fn files(&self) -> &[File] {
        &self.files
    }
}

pub fn align_down(x: u64) -> u64 {
    x & !(ALIGN - 1)
}

pub fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// The covering aligned read of a logical extent `[offset, offset + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Covering {
    /// Physical (aligned) file offset: `align_down(offset)`.
    pub offset: u64,
    /// Physical length: `align_up(offset + len) - align_down(offset)`.
    pub len: u64,
    /// Bytes of padding before the logical extent: `offset - align_down(offset)`.
    pub head: u64,
}

impl Covering {
    pub fn of(offset: u64, len: u64) -> Covering {
        let start = align_down(offset);
        Covering { offset: start, len: align_up(offset + len) - start, head: offset - start }
    }

    /// Physical bytes that are not logical bytes.
    pub fn padding(&self, logical_len: u64) -> u64 {
        self.len - logical_len
    }
}

/// One read of one extent of one object, tagged with everything the Plan will check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReadRequest {
    pub ticket: u64,
    pub object: ObjectId,
    /// Index of the extent inside the object's bundle (role order).
    pub extent: u32,
    /// Logical file offset and length of the extent.
    pub offset: u64,
    pub len: u64,
    pub window: u32,
    /// Where the covering read starts inside the window (a multiple of [`ALIGN`]).
    pub window_offset: u64,
    pub epoch: u64,
    pub generation: u64,
}

/// What came back for one request: the tags present at submission and the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Completion {
    pub ticket: u64,
    pub object: ObjectId,
    pub extent: u32,
    pub window: u32,
    pub epoch: u64,
    pub generation: u64,
    /// Logical bytes delivered, or an errno.
    pub result: Result<u64, i32>,
}

impl Completion {
    /// The completion of `req` with the given outcome: every tag copied from the request.
    pub fn of(req: &ReadRequest, result: Result<u64, i32>) -> Completion {
        Completion {
            ticket: req.ticket,
            object: req.object,
            extent: req.extent,
            window: req.window,
            epoch: req.epoch,
            generation: req.generation,
            result,
        }
    }
}

/// Counters every source keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SourceStats {
    pub submissions: u64,
    pub completions: u64,
    /// Logical bytes delivered into windows.
    pub logical_bytes: u64,
    /// Bytes actually read from the file (covering reads).
    pub physical_bytes: u64,
    /// `physical_bytes - logical_bytes`.
    pub padding_bytes: u64,
    /// Completions that carried an errno.
    pub failed: u64,
    /// Most requests outstanding at once.
    pub peak_outstanding: u64,
    /// Read latency: bucket i counts reads that took [2^i, 2^(i+1)) microseconds (F: SQEs
    /// that waited behind no other read of their chain).
    pub latency_us_log2: [u64; 32],
    /// Completions a deterministic fault cell perturbed (see [`fault`]).
    pub faults_fired: u64,
    /// Reads handed to the device (SQEs for F): fewer than `submissions` when adjacent
    /// requests went out as one vectored read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sqes: u64,
    /// Of those, vectored reads that carried more than one request, and the requests they carried.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub coalesced_sqes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub coalesced_requests: u64,
    /// Requests whose covering read landed in host memory the caller named (a slot) instead of
    /// a window, and their logical bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_target_requests: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_target_bytes: u64,
    /// SQEs linked behind another read of their chain (F: the kernel started them as the one
    /// ahead completed), and SQEs submitted again, alone, after a read ahead of them in their
    /// chain failed or ended short.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub linked_sqes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub relinked: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl SourceStats {
    /// Accounts a covering read that returned `phys` bytes; returns the logical bytes of the
    /// extent it delivered (short where the read stopped early).
    pub fn record_read(&mut self, phys: u64, cov: &Covering, len: u64) -> u64 {
        let logical = phys.saturating_sub(cov.head).min(len);
        self.physical_bytes += phys;
        self.logical_bytes += logical;
        self.padding_bytes += phys - logical;
        logical
    }

    pub fn record_latency(&mut self, took: std::time::Duration) {
        let micros = (took.as_micros() as u64).max(1);
        self.latency_us_log2[(63 - micros.leading_zeros() as usize).min(31)] += 1;
    }
}

/// A request the source refuses outright (nothing was read, no completion will come).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    NoSuchWindow {
        window: u32,
        n_windows: u32,
    },
    MisalignedWindowOffset {
        window_offset: u64,
    },
    OutsideWindow {
        window: u32,
        window_offset: u64,
        len: u64,
        window_size: u64,
    },
    /// `wait` with nothing outstanding.
    NothingOutstanding,
    /// The I/O service itself failed (e.g. `io_uring_enter`): no completion can be trusted.
    Io {
        errno: i32,
    },
    /// A request named host memory this source cannot read into, or memory not aligned to
    /// [`ALIGN`].
    HostTarget {
        detail: &'static str,
    },
    /// Reads in flight could not be drained: the kernel may still write into the windows and
    /// into host targets (see [`Source::drain`]).
    Undrained,
    /// A position in a shard the model does not have.
    NoSuchShard {
        shard: usize,
        n_shards: usize,
    },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::NoSuchWindow { window, n_windows } => {
                write!(f, "source: window {window} does not exist ({n_windows} windows)")
            }
            SourceError::MisalignedWindowOffset { window_offset } => {
                write!(f, "source: window offset {window_offset} is not a multiple of {ALIGN}")
            }
            SourceError::OutsideWindow { window, window_offset, len, window_size } => write!(
                f,
                "source: a covering read of {len} bytes at offset {window_offset} of window {window} \
                 overflows the window ({window_size} bytes)"
            ),
            SourceError::NothingOutstanding => write!(f, "source: wait with no request outstanding"),
            SourceError::Io { errno } => {
                write!(f, "source: I/O service failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
            SourceError::HostTarget { detail } => write!(f, "source: refused a read into host memory: {detail}"),
            SourceError::Undrained => write!(f, "source: reads in flight could not be drained; the memory they target is leaked"),
            SourceError::NoSuchShard { shard, n_shards } => write!(f, "source: a read in shard {shard} of a model of {n_shards} files"),
        }
    }
}

impl std::error::Error for SourceError {}

/// The service that moves extents of the model file into host windows.
pub trait Source: Send {
    fn n_windows(&self) -> u32;
    fn window_size(&self) -> u64;
    /// Starts one read. On `Ok` exactly one completion for it will be returned by `wait`.
    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError>;
    /// The next completion, blocking; completions may come in any order.
    fn wait(&mut self) -> Result<Completion, SourceError>;
    /// Requests submitted whose completion was not yet returned by `wait`.
    fn outstanding(&self) -> usize;
    /// Of those, the ones the device has not yet been seen to finish: less the completions the
    /// source already took from the device and holds for `wait`. Default: every outstanding one.
    fn in_flight(&self) -> usize {
        self.outstanding()
    }
    fn window(&self, w: u32) -> &[u8];
    fn stats(&self) -> SourceStats;

    /// Whether [`Source::submit_vectored`] takes host targets (reads straight into a slot).
    fn reads_into_host(&self) -> bool {
        false
    }

    /// Reads that can be submitted now without blocking for room (a bounded queue).
    fn room(&self) -> usize {
        usize::MAX
    }

    /// Whether `wait` would return a completion now without blocking (false when unsure).
    fn poll_ready(&mut self) -> bool {
        false
    }

    /// Submits `reads` in order, each with one completion as if submitted alone. Requests whose
    /// covering reads follow each other in the file may go out as one vectored read. Tickets
    /// rise in the order their bytes are needed: a source that queues more reads than it serves
    /// at once starts the lowest tickets first. A request
    /// with a host target reads its covering range there instead of into its window (the
    /// window's bytes are then left as they were). `Err((n, e))`: the first `n` requests were
    /// submitted and will complete, the others were not.
    ///
    /// # Safety
    /// Each host target is valid for writes of its request's covering length and is neither
    /// read nor written by anyone but the source until that request's completion has been
    /// returned by `wait`, or [`Source::drain`] has returned `Ok`. Should draining fail, the
    /// target stays the source's forever: its owner must leak it, never free or reuse it.
    unsafe fn submit_vectored(&mut self, reads: &[(ReadRequest, Option<NonNull<u8>>)]) -> Result<(), (usize, SourceError)> {
        for (i, (req, into)) in reads.iter().enumerate() {
            if into.is_some() {
                return Err((i, SourceError::HostTarget { detail: "this source reads only into its windows" }));
            }
            self.submit(*req).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Flips every bit of the byte at `at` of window `w` (a fault cell's doing); false where
    /// this source cannot.
    fn corrupt(&mut self, _w: u32, _at: u64) -> bool {
        false
    }

    /// Waits until no read is in flight; completions `wait` has not returned are discarded.
    /// After `Ok` the source writes nothing more anywhere, so the host targets it was lent may
    /// be freed. After `Err` (and from then on [`Source::undrained`]) reads may still land: the
    /// source refuses new reads and leaks its windows when dropped, and the owner must leak
    /// every host target of a request whose completion `wait` did not return. An owner that
    /// lends host targets drains before it frees them; a dropped source drains itself too, but
    /// then cannot tell the owner.
    fn drain(&mut self) -> Result<(), SourceError> {
        while self.outstanding() > 0 {
            self.wait()?;
        }
        Ok(())
    }

    /// Whether draining failed (see [`Source::drain`]).
    fn undrained(&self) -> bool {
        false
    }
}

/// Checks a request against the window geometry; returns its covering read.
pub fn check_request(req: &ReadRequest, n_windows: u32, window_size: u64) -> Result<Covering, SourceError> {
    if req.window >= n_windows {
        return Err(SourceError::NoSuchWindow { window: req.window, n_windows });
    }
    if !req.window_offset.is_multiple_of(ALIGN) {
        return Err(SourceError::MisalignedWindowOffset { window_offset: req.window_offset });
    }
    let cov = Covering::of(req.offset, req.len);
    if req.window_offset.checked_add(cov.len).is_none_or(|end| end > window_size) {
        return Err(SourceError::OutsideWindow { window: req.window, window_offset: req.window_offset, len: cov.len, window_size });
    }
    Ok(cov)
}

/// Buffers of at least this size start on a 2 MiB boundary with transparent huge pages
/// advised: an O_DIRECT read into physically contiguous memory goes to the device as a few large
/// segments instead of one per 4 KiB page, which a virtual disk serves far faster (measured
/// with fio on the bench machine: 1.1 to 1.5 GB/s into 4 KiB pages, 2.3 to 2.9 GB/s into 2 MiB ones).
pub const HUGE: u64 = 2 << 20;

/// Advises transparent huge pages for `[ptr, ptr + len)` (whole 2 MiB pages inside it only take
/// effect, and only for pages not yet touched). Returns the bytes the kernel took the advice
/// for: 0 when it refused, or when no whole 2 MiB page lies inside.
pub fn advise_huge(ptr: *mut u8, len: usize) -> usize {
    let start = (ptr as usize).next_multiple_of(HUGE as usize);
    let end = (ptr as usize + len) / HUGE as usize * HUGE as usize;
    if end <= start {
        return 0;
    }
    let Some(at) = NonNull::new(start as *mut libc::c_void) else { return 0 };
    // SAFETY: a hint on pages the caller owns; it changes no contents.
    let ok = unsafe { madvise(at, end - start, MmapAdvise::MADV_HUGEPAGE) }.is_ok();
    if ok {
        end - start
    } else {
        0
    }
}

/// A zeroed buffer aligned to [`ALIGN`], allocated once, freed on drop; it never moves. From
/// [`HUGE`] bytes up it is its own mapping at a 2 MiB boundary with huge pages advised.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Bytes mapped (a multiple of [`HUGE`]) when the buffer is its own mapping, and of those
    /// the bytes advised huge pages.
    mapped: usize,
    advised: usize,
    /// Memory another allocator owns (a device's pinned host buffer), freed when this drops.
    owner: Option<Box<dyn Send + Sync>>,
}

/// How a source gets each of its windows (`AlignedBuf::new` unless a device offers pinned memory).
pub type WindowAlloc<'a> = &'a mut dyn FnMut(u64) -> Result<AlignedBuf>;

// SAFETY: the buffer is plain owned memory; access goes through &self / &mut self.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: u64) -> Result<AlignedBuf> {
        if len == 0 {
            bail!("an aligned buffer needs at least one byte");
        }
        if len >= HUGE {
            return AlignedBuf::huge(len);
        }
        let size = usize::try_from(align_up(len)).context("buffer size")?;
        let layout = Layout::from_size_align(size, ALIGN as usize).context("buffer layout")?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else { bail!("cannot allocate {size} aligned bytes") };
        Ok(AlignedBuf { ptr, layout, mapped: 0, advised: 0, owner: None })
    }

    /// `len` bytes at `ptr` that `owner` keeps allocated (freed when the buffer drops); zeroed
    /// here. Refused unless `ptr` is [`ALIGN`]-aligned and `len` a multiple of it.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `owner` lives, and
    /// nothing else may use that memory meanwhile.
    pub unsafe fn foreign(ptr: NonNull<u8>, len: usize, owner: Box<dyn Send + Sync>) -> Result<AlignedBuf> {
        if !(ptr.as_ptr() as usize).is_multiple_of(ALIGN as usize) || len == 0 || !(len as u64).is_multiple_of(ALIGN) {
            bail!("foreign window memory at {ptr:p} of {len} bytes is not {ALIGN}-aligned");
        }
        // SAFETY: the caller's contract; the memory is ours alone.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        let layout = Layout::from_size_align(len, ALIGN as usize).context("buffer layout")?;
        Ok(AlignedBuf { ptr, layout, mapped: 0, advised: 0, owner: Some(owner) })
    }

    /// A buffer of its own mapping at a 2 MiB boundary, rounded up to whole 2 MiB pages, with
    /// huge pages advised before any page is touched (the kernel's pages are zero).
    pub fn huge(len: u64) -> Result<AlignedBuf> {
        let size = usize::try_from(align_up(len.max(1))).context("buffer size")?;
        let huge = HUGE as usize;
        let mapped = size.checked_next_multiple_of(huge).context("buffer size")?;
        let reserve = mapped.checked_add(huge).context("buffer size")?;
        let length = NonZeroUsize::new(reserve).context("buffer size")?;
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks; nothing
        // else refers to it.
        let base = unsafe { mmap_anonymous(None, length, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE) }
            .map_err(|e| anyhow!("cannot map {mapped} bytes: {}", std::io::Error::from(e)))?;
        let base = base.as_ptr() as usize;
        let start = base.next_multiple_of(huge);
        let tail = base + reserve - (start + mapped);
        // SAFETY: head and tail lie inside the reservation and are not used.
        unsafe {
            if let Some(head) = NonNull::new(base as *mut libc::c_void).filter(|_| start > base) {
                let _ = munmap(head, start - base);
            }
            if let Some(tail_at) = NonNull::new((start + mapped) as *mut libc::c_void).filter(|_| tail > 0) {
                let _ = munmap(tail_at, tail);
            }
        }
        let advised = advise_huge(start as *mut u8, mapped);
        let layout = Layout::from_size_align(size, ALIGN as usize).context("buffer layout")?;
        Ok(AlignedBuf { ptr: NonNull::new(start as *mut u8).expect("a mapping is never at 0"), layout, mapped, advised, owner: None })
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Bytes of the buffer advised to be huge pages when it was mapped.
    pub fn huge_bytes(&self) -> usize {
        self.advised
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes, initialized (zeroed) at allocation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// Flips every bit of byte `at`; false outside the buffer. Only that byte is touched, so
    /// reads still landing elsewhere in the buffer are not aliased.
    pub fn flip(&mut self, at: u64) -> bool {
        if at >= self.len() as u64 {
            return false;
        }
        // SAFETY: inside the allocation; &mut self is exclusive on our side.
        unsafe { *self.ptr.as_ptr().add(at as usize) ^= 0xff };
        true
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.owner.take().is_some() {
            // The owner freed the memory as it dropped.
            return;
        }
        if self.mapped > 0 {
            // SAFETY: the mapping made in `huge`, unmapped once.
            let _ = unsafe { munmap(self.ptr.cast(), self.mapped) };
            return;
        }
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A logical expert object: model semantics, not file layout. Every read and completion
/// names the object it is for, so a wrong one is caught before publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectId {
    pub layer: u32,
    pub expert: u32,
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.layer, self.expert)
    }
}

impl FromStr for ObjectId {
    type Err = anyhow::Error;

    /// `L/E`, e.g. `3/17`.
    fn from_str(s: &str) -> Result<ObjectId> {
        let (l, e) = s.trim().split_once('/').ok_or_else(|| anyhow!("`{s}`: an object is LAYER/EXPERT"))?;
        let parse = |x: &str| x.trim().parse::<u32>().map_err(|_| anyhow!("`{s}`: an object is LAYER/EXPERT"));
        Ok(ObjectId { layer: parse(l)?, expert: parse(e)? })
    }
}

/// Opens `path` for reads that bypass the page cache (`O_DIRECT`): D, F and the envelope.
pub fn open_direct(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("{}: cannot open with O_DIRECT", path.display()))
}

/// P: synchronous `pread` through the page cache. `submit` performs the covering read at once
/// and queues its completion; `wait` returns queued completions in submission order.
/// D is the same reader over an `O_DIRECT` descriptor with one window ([`BufferedSource::open_direct`]).
pub struct BufferedSource {
    files: ModelFiles,
    windows: Vec<AlignedBuf>,
    window_size: u64,
    queue: VecDeque<Completion>,
    stats: SourceStats,
}

impl BufferedSource {
    /// Opens `path` and allocates `n_windows` windows of `window_size` bytes (rounded up to
    /// [`ALIGN`]); nothing else is allocated afterwards.
    pub fn open(path: &Path, n_windows: u32, window_size: u64) -> Result<BufferedSource> {
        Self::open_with(&[path], n_windows, window_size, &mut AlignedBuf::new)
    }

    /// P over the model's files (one per shard) with each window from `alloc`.
    pub fn open_with<P: AsRef<Path>>(paths: &[P], n_windows: u32, window_size: u64, alloc: WindowAlloc) -> Result<BufferedSource> {
        if n_windows == 0 {
            bail!("a source needs at least one window");
        }
        Self::with_files(ModelFiles::open(paths, false)?, n_windows, window_size, alloc)
    }

    /// D: blocking `O_DIRECT` reads into one aligned window; the page cache never holds them.
    pub fn open_direct(path: &Path, window_size: u64) -> Result<BufferedSource> {
        Self::open_direct_with(&[path], window_size, &mut AlignedBuf::new)
    }

    /// D over the model's files with its window from `alloc`.
    pub fn open_direct_with<P: AsRef<Path>>(paths: &[P], window_size: u64, alloc: WindowAlloc) -> Result<BufferedSource> {
        Self::with_files(ModelFiles::open(paths, true)?, 1, window_size, alloc)
    }

    fn with_files(files: ModelFiles, n_windows: u32, window_size: u64, alloc: WindowAlloc) -> Result<BufferedSource> {
        let window_size = align_up(window_size);
        let windows = (0..n_windows).map(|_| alloc(window_size)).collect::<Result<_>>()?;
        Ok(BufferedSource { files, windows, window_size, queue: VecDeque::new(), stats: SourceStats::default() })
    }
}

/// Reads `buf.len()` bytes at `offset`, stopping early only at end of file.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> Result<u64, i32> {
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
    Ok(done as u64)
}

impl Source for BufferedSource {
    fn n_windows(&self) -> u32 {
        self.windows.len() as u32
    }

    fn window_size(&self) -> u64 {
        self.window_size
    }

    fn submit(&mut self, req: ReadRequest) -> Result<(), SourceError> {
        let cov = check_request(&req, self.n_windows(), self.window_size)?;
        let (file, offset) = self.files.at(cov.offset)?;
        let start = req.window_offset as usize;
        let window = &mut self.windows[req.window as usize];
        let t = std::time::Instant::now();
        let read = read_full(file, &mut window.as_mut_slice()[start..start + cov.len as usize], offset);
        self.stats.record_latency(t.elapsed());
        self.stats.submissions += 1;
        self.stats.sqes += 1;
        let result = match read {
            Ok(phys) => Ok(self.stats.record_read(phys, &cov, req.len)),
            Err(errno) => {
                self.stats.failed += 1;
                Err(errno)
            }
        };
        self.queue.push_back(Completion::of(&req, result));
        self.stats.peak_outstanding = self.stats.peak_outstanding.max(self.queue.len() as u64);
        Ok(())
    }

    fn wait(&mut self) -> Result<Completion, SourceError> {
        let c = self.queue.pop_front().ok_or(SourceError::NothingOutstanding)?;
        self.stats.completions += 1;
        Ok(c)
    }

    fn outstanding(&self) -> usize {
        self.queue.len()
    }

    fn poll_ready(&mut self) -> bool {
        !self.queue.is_empty()
    }

    fn window(&self, w: u32) -> &[u8] {
        self.windows[w as usize].as_slice()
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }

    fn corrupt(&mut self, w: u32, at: u64) -> bool {
        self.windows.get_mut(w as usize).is_some_and(|b| b.flip(at))
    }
}

#[cfg(test)]
mod tests {
    use super::ObjectId;
    use super::*;
    use std::io::Write;

    #[test]
    fn large_buffers_are_their_own_huge_page_mapping() {
        let mut b = AlignedBuf::new(3 << 20).unwrap();
        assert_eq!(b.as_ptr() as u64 % HUGE, 0, "starts on a 2 MiB boundary");
        assert_eq!(b.len(), 3 << 20);
        assert!(b.as_slice().iter().all(|&x| x == 0), "zeroed");
        b.as_mut_slice()[(3 << 20) - 1] = 7;
        assert!(b.flip(0));
        assert_eq!((b.as_slice()[0], b.as_slice()[(3 << 20) - 1]), (0xff, 7));
        // Memory another allocator owns: aligned only, zeroed, and freed by its owner alone.
        struct Owner(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Owner {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let layout = Layout::from_size_align(3 * 4096, 4096).unwrap();
        // SAFETY: a fresh allocation of that layout, freed below after the buffer dropped.
        let raw = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
        unsafe { std::ptr::write_bytes(raw.as_ptr(), 0xa5, layout.size()) };
        let freed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // SAFETY: valid for its size until freed below; nothing else uses it.
        let f = unsafe { AlignedBuf::foreign(raw, layout.size(), Box::new(Owner(freed.clone()))) }.unwrap();
        assert!(f.as_slice().iter().all(|&b| b == 0) && f.len() == 3 * 4096);
        drop(f);
        assert!(freed.load(std::sync::atomic::Ordering::SeqCst));
        // SAFETY: an address inside the allocation, refused before anything is written.
        let off = NonNull::new(unsafe { raw.as_ptr().add(512) }).unwrap();
        assert!(unsafe { AlignedBuf::foreign(off, 4096, Box::new(())) }.is_err());
        assert!(unsafe { AlignedBuf::foreign(raw, 5000, Box::new(())) }.is_err());
        unsafe { std::alloc::dealloc(raw.as_ptr(), layout) };
        let small = AlignedBuf::new(8192).unwrap();
        assert_eq!(small.as_ptr() as u64 % ALIGN, 0);
        let forced = AlignedBuf::huge(5000).unwrap();
        assert_eq!((forced.as_ptr() as u64 % HUGE, forced.len()), (0, 8192));
        assert_eq!(advise_huge(small.as_ptr(), small.len()), 0, "no whole 2 MiB page inside 8 KiB");
    }

    #[test]
    fn covering_reads() {
        assert_eq!(Covering::of(0, 4096), Covering { offset: 0, len: 4096, head: 0 });
        assert_eq!(Covering::of(100, 10), Covering { offset: 0, len: 4096, head: 100 });
        assert_eq!(Covering::of(4000, 200), Covering { offset: 0, len: 8192, head: 4000 });
        assert_eq!(Covering::of(8192, 1), Covering { offset: 8192, len: 4096, head: 0 });
        assert_eq!(Covering::of(5000, 4096).padding(4096), 4096);
    }

    fn req(offset: u64, len: u64, window: u32, window_offset: u64) -> ReadRequest {
        ReadRequest {
            ticket: 7,
            object: ObjectId { layer: 1, expert: 2 },
            extent: 0,
            offset,
            len,
            window,
            window_offset,
            epoch: 3,
            generation: 4,
        }
    }

    #[test]
    fn buffered_reads_place_bytes_and_count_padding() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let mut s = BufferedSource::open(f.path(), 2, 3 * 4096).unwrap();
        assert_eq!((s.n_windows(), s.window_size()), (2, 3 * 4096));
        s.submit(req(5000, 3000, 1, 4096)).unwrap();
        assert_eq!(s.outstanding(), 1);
        let c = s.wait().unwrap();
        assert_eq!(c.result, Ok(3000));
        assert_eq!((c.ticket, c.window, c.epoch, c.generation), (7, 1, 3, 4));
        let head = (5000 - 4096) as usize;
        assert_eq!(&s.window(1)[4096 + head..4096 + head + 3000], &data[5000..8000]);
        let st = s.stats();
        // [5000, 8000) is covered by [4096, 8192).
        assert_eq!((st.logical_bytes, st.physical_bytes, st.padding_bytes), (3000, 4096, 1096));
        // A covering read past the end of the file is short physically, complete logically.
        s.submit(req(19_000, 1000, 0, 0)).unwrap();
        assert_eq!(s.wait().unwrap().result, Ok(1000));
        // Past the end of the file: short.
        s.submit(req(19_500, 1000, 0, 0)).unwrap();
        assert_eq!(s.wait().unwrap().result, Ok(500));
        assert_eq!(s.wait(), Err(SourceError::NothingOutstanding));
    }

    #[test]
    fn buffered_refuses_bad_geometry() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut s = BufferedSource::open(f.path(), 1, 4096).unwrap();
        assert_eq!(s.submit(req(0, 10, 1, 0)), Err(SourceError::NoSuchWindow { window: 1, n_windows: 1 }));
        assert_eq!(s.submit(req(0, 10, 0, 100)), Err(SourceError::MisalignedWindowOffset { window_offset: 100 }));
        assert!(matches!(s.submit(req(4000, 200, 0, 0)), Err(SourceError::OutsideWindow { len: 8192, .. })));
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.stats().submissions, 0);
    }
}
