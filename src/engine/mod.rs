//! The engine boundary: bindgen FFI to the pinned, patched llama.cpp and a small safe wrapper.
//!
//! Only this room calls into llama.cpp. It loads models, tokenizes, decodes, hands out logits
//! rows, captures routes through the eval callback, and quantizes.

pub mod backends;
mod experts;
mod nextn;
pub mod pin;
mod routes;
#[cfg(test)]
mod skip_rows;

use experts::Bridge;
pub use experts::{ExpertSource, SlotPool, SourceSurface};
pub use routes::RouteRecorder;

use crate::exec::{AllLayers, DeviceBuffers, ExecParams, GpuLayers, Placement, PlacementReport};
use crate::routes::RouteEvent;
use anyhow::{anyhow, bail, Context as _, Result};
use serde::Serialize;
use std::borrow::Cow;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, Once, OnceLock};

#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// One tensor as ggml's own GGUF reader sees it: name, absolute file offset, bytes, ggml type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    pub offset: u64,
    pub bytes: u64,
    pub ggml_type: u32,
}

/// ggml's view of a GGUF file's tensors (metadata only): the reference our own reader is
/// checked against.
pub fn gguf_tensors(path: &Path) -> Result<Vec<GgufTensor>> {
    init();
    let c = CString::new(path.as_os_str().as_encoded_bytes()).context("a path with a NUL byte")?;
    // SAFETY: plain C API over a valid path; the context is freed before returning.
    unsafe {
        let ctx = sys::gguf_init_from_file(c.as_ptr(), sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() });
        if ctx.is_null() {
            bail!("{}: ggml could not read it as GGUF", path.display());
        }
        let data = sys::gguf_get_data_offset(ctx) as u64;
        let out = (0..sys::gguf_get_n_tensors(ctx))
            .map(|i| GgufTensor {
                name: CStr::from_ptr(sys::gguf_get_tensor_name(ctx, i)).to_string_lossy().into_owned(),
                offset: data + sys::gguf_get_tensor_offset(ctx, i) as u64,
                bytes: sys::gguf_get_tensor_size(ctx, i) as u64,
                ggml_type: sys::gguf_get_tensor_type(ctx, i) as u32,
            })
            .collect();
        sys::gguf_free(ctx);
        Ok(out)
    }
}

/// What identifies the engine this binary was built with.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct EngineIdentity {
    pub package: Cow<'static, str>,
    pub version: Cow<'static, str>,
    pub checksum: Cow<'static, str>,
    pub tree_sha256: Cow<'static, str>,
    pub patches: Vec<PatchId>,
    pub cmake_options: Vec<Cow<'static, str>>,
    pub build_key: Cow<'static, str>,
}

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PatchId {
    pub name: Cow<'static, str>,
    pub sha256: Cow<'static, str>,
}

pub fn identity() -> EngineIdentity {
    let split = |s: &'static str| s.split(';').filter(|x| !x.is_empty());
    EngineIdentity {
        package: env!("SOVEREIGN_PIN_PACKAGE").into(),
        version: env!("SOVEREIGN_PIN_VERSION").into(),
        checksum: env!("SOVEREIGN_PIN_CHECKSUM").into(),
        tree_sha256: env!("SOVEREIGN_TREE_SHA256").into(),
        patches: split(env!("SOVEREIGN_PATCHES"))
            .map(|p| {
                let (name, sha256) = p.split_once('=').unwrap_or((p, ""));
                PatchId { name: name.into(), sha256: sha256.into() }
            })
            .collect(),
        cmake_options: split(env!("SOVEREIGN_CMAKE_OPTIONS")).map(Cow::from).collect(),
        build_key: env!("SOVEREIGN_ENGINE_KEY").into(),
    }
}

/// CPU features the ggml CPU backend module reports.
pub fn cpu_features() -> Vec<String> {
    init();
    backends::cpu_features()
}

/// The engine's own block size and bytes per block of a ggml type (for cross-checks).
pub fn ggml_type_layout(ty: u32) -> (u64, u64) {
    // SAFETY: pure table lookups; callers pass ids below GGML_TYPE_COUNT.
    unsafe { (sys::ggml_blck_size(ty) as u64, sys::ggml_type_size(ty) as u64) }
}

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
const LOG_KEEP: usize = 40;

/// ggml's log callback.
///
/// # Safety
/// `text` is NUL-terminated (or NULL) for the duration of the call, as ggml passes it. ggml may
/// call it from any of its threads at once: it touches only `LOG`, behind a mutex. A panic here
/// aborts the process rather than unwinding into C.
unsafe extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let line = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if std::env::var_os("SOVEREIGN_ENGINE_LOG").is_some() {
        log::info!("engine: {}", line.trim_end());
    }
    if level >= sys::ggml_log_level_GGML_LOG_LEVEL_WARN || level == sys::ggml_log_level_GGML_LOG_LEVEL_CONT {
        let mut log = LOG.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() >= LOG_KEEP {
            log.remove(0);
        }
        log.push(line.trim_end().to_string());
    }
}

/// The engine's last warnings and errors, for error messages.
fn last_log() -> String {
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    log.iter().rev().find(|l| !l.is_empty()).cloned().unwrap_or_default()
}

/// Why llama.cpp refused a model: its loader's own message (`error loading model: …`), which
/// the last line (`failed to load model`) only summarises; when that message only says the
/// GGUF reader failed, the reader's first complaint.
fn load_error() -> String {
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    let why = log.iter().rev().find_map(|l| l.split_once("error loading model: ").map(|(_, why)| why.trim()));
    let reader = || log.iter().find(|l| l.starts_with("gguf_")).map(|l| l.trim());
    match why {
        Some(w) if w.starts_with("llama_model_loader: failed to load model") => reader().unwrap_or(w).to_string(),
        Some(w) if !w.is_empty() => w.to_string(),
        _ => log.iter().rev().find(|l| !l.is_empty()).cloned().unwrap_or_default(),
    }
}

/// Initializes the backend once per process and routes llama.cpp's log through us.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `log_callback` meets its own contract for every call ggml makes (see there)
        // and takes no user data, so a null pointer is what it expects.
        unsafe { sys::llama_log_set(Some(log_callback), std::ptr::null_mut()) };
        // Modules first, by exact path: llama_backend_init only searches when none is loaded.
        if let Err(e) = backends::ensure_loaded() {
            LOG.lock().unwrap_or_else(|p| p.into_inner()).push(e.to_string());
        }
        // SAFETY: takes no arguments; `Once` runs it once per process, and every engine entry
        // point calls `init` first, so it precedes them all.
        unsafe { sys::llama_backend_init() };
    });
}

/// Why the backend modules could not be loaded, if they could not.
pub fn backend_error() -> Option<backends::BackendError> {
    init();
    backends::ensure_loaded().err()
}

fn cstring(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| anyhow!("{}: path contains NUL", p.display()))
}

static PLACEMENT: OnceLock<Placement> = OnceLock::new();

/// Sets the placement of every model this process loads; once, before the first load.
pub fn set_placement(p: Placement) -> Result<()> {
    if PLACEMENT.set(p).is_err() && PLACEMENT.get() != Some(&p) {
        bail!("the model placement was already set differently in this process");
    }
    Ok(())
}

pub fn placement() -> Placement {
    PLACEMENT.get().copied().unwrap_or_default()
}

pub fn placement_report() -> PlacementReport {
    init();
    let p = placement();
    let gpus: Vec<String> = backends::devices().into_iter().filter(|d| d.kind == "gpu" || d.kind == "igpu").map(|d| d.name).collect();
    let effective = if p.gpu_layers == 0 {
        "every layer on the CPU".to_string()
    } else if gpus.is_empty() {
        "no GPU device is loaded: nothing offloaded, every layer on the CPU".to_string()
    } else if p.gpu_layers < 0 {
        format!("all layers offloaded to {}", gpus.join(", "))
    } else {
        format!("{} layers offloaded to {}", p.gpu_layers, gpus.join(", "))
    };
    PlacementReport {
        gpu_layers: if p.gpu_layers < 0 { GpuLayers::All(AllLayers::All) } else { GpuLayers::Count(p.gpu_layers) },
        experts_host: p.experts_host,
        gpu_budget: p.gpu_budget,
        rpc_protocol: gpus
            .iter()
            .any(|g| g.starts_with("RPC"))
            .then(|| format!("{}.{}.{}", sys::RPC_PROTO_MAJOR_VERSION, sys::RPC_PROTO_MINOR_VERSION, sys::RPC_PROTO_PATCH_VERSION)),
        gpu_devices: gpus,
        effective,
        device_before_decode: None,
        device_audit: None,
    }
}

/// Expert tensors (`ffn_{up,down,gate,gate_up}_exps`) as llama.cpp's `--cpu-moe` names them.
const EXPERTS_HOST_PATTERN: &CStr = c"\\.ffn_(up|down|gate|gate_up)_(ch|)exps";

pub struct Model {
    ptr: NonNull<sys::llama_model>,
    /// The file it was loaded from, for errors that arise later.
    path: PathBuf,
    // Owned through a raw pointer: llama.cpp holds it and calls back into it; freed after the model.
    bridge: Option<NonNull<Bridge>>,
}

// SAFETY: a llama_model is immutable after load and used from one thread at a time here.
unsafe impl Send for Model {}

impl Model {
    /// Loads a model whose file was already validated by `gguf`. Weights stay on the CPU, the
    /// plain CPU buffer type is used for every tensor (no repacking), and the file is mapped.
    pub fn load(path: &Path) -> Result<Model> {
        Self::load_with(path, None)
    }

    /// With an expert source, llama.cpp loads everything but the MoE expert weights, which the
    /// source serves into slot pools; the file is read, not mapped, so expert bytes never enter
    /// the process through a mapping. It is read with O_DIRECT where the file system allows it
    /// (llama.cpp falls back to buffered reads where not): a buffered load holds each
    /// non-expert byte twice, in the page cache and in its buffer, until the load ends, which
    /// under a memory limit near the run's own need is a reclaim storm at the limit.
    pub fn load_with(path: &Path, source: Option<Box<dyn ExpertSource>>) -> Result<Model> {
        Self::load_full(path, source, false)
    }

    /// As [`Model::load_with`]; `mtp` also loads the model's nextn (MTP) blocks, which only an
    /// MTP context runs (their experts are served by the source like the trunk's).
    pub fn load_full(path: &Path, source: Option<Box<dyn ExpertSource>>, mtp: bool) -> Result<Model> {
        if let Some(e) = backend_error() {
            bail!("engine backends: {e}");
        }
        // llama.cpp loads a shard set from its first file and finds the others by name.
        let first = crate::gguf::set::first_shard(path)?;
        let c = cstring(&first)?;
        let bridge = source.map(|s| NonNull::from(Box::leak(Bridge::new(s))));
        // SAFETY: default params are plain data; the path and the bridge outlive the call.
        let place = placement();
        // NULL-terminated; outlives the load call, which is the only reader.
        let overrides = [
            sys::llama_model_tensor_buft_override {
                pattern: EXPERTS_HOST_PATTERN.as_ptr(),
                // SAFETY: the host buffer type lives in ggml-base for the life of the process.
                buft: unsafe { sys::ggml_backend_cpu_buffer_type() },
            },
            sys::llama_model_tensor_buft_override { pattern: std::ptr::null(), buft: std::ptr::null_mut() },
        ];
        let ptr = unsafe {
            let mut p = sys::llama_model_default_params();
            p.n_gpu_layers = place.gpu_layers;
            if place.experts_host {
                p.tensor_buft_overrides = overrides.as_ptr();
            }
            p.use_extra_bufts = false;
            p.load_mtp = mtp;
            p.load_mode = sys::llama_load_mode_LLAMA_LOAD_MODE_MMAP;
            if let Some(b) = bridge {
                p.expert_source = &(*b.as_ptr()).c;
                p.load_mode = sys::llama_load_mode_LLAMA_LOAD_MODE_DIRECT_IO;
            }
            sys::llama_model_load_from_file(c.as_ptr(), p)
        };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(Model { ptr, path: path.to_path_buf(), bridge }),
            None => {
                // SAFETY: llama.cpp dropped every reference to the bridge when the load failed.
                let why = bridge.and_then(|b| unsafe { Box::from_raw(b.as_ptr()) }.error).unwrap_or_else(load_error);
                bail!("{}: llama.cpp could not load the model: {why}", path.display())
            }
        }
    }

    /// The expert source's first error, if it reported one.
    pub fn expert_error(&self) -> Option<String> {
        // SAFETY: no decode runs while the caller holds only &Model between decodes.
        self.bridge.and_then(|b| unsafe { (*b.as_ptr()).error.clone() })
    }

    /// Access to the expert source between decodes.
    pub fn with_source<R>(&self, f: impl FnOnce(&mut dyn ExpertSource) -> R) -> Option<R> {
        // SAFETY: callbacks only run inside llama.cpp calls (decode, load), and none is in
        // progress while this closure runs: the caller is between them on the same thread.
        self.bridge.map(|b| f(unsafe { &mut *(*b.as_ptr()).source }))
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    pub fn n_vocab(&self) -> usize {
        // SAFETY: the vocab belongs to the live model.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) as usize }
    }

    /// Whether the model keeps a recurrent state per sequence (recurrent or hybrid memory).
    pub fn has_recurrent_state(&self) -> bool {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_is_recurrent(self.ptr.as_ptr()) || sys::llama_model_is_hybrid(self.ptr.as_ptr()) }
    }

    /// `general.architecture`, as llama.cpp read it.
    pub fn architecture(&self) -> String {
        let key = c"general.architecture";
        let mut buf = [0u8; 128];
        // SAFETY: the model is alive; llama.cpp writes at most buf.len() bytes, NUL included.
        let n = unsafe { sys::llama_model_meta_val_str(self.ptr.as_ptr(), key.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        match usize::try_from(n) {
            Ok(n) => String::from_utf8_lossy(&buf[..n.min(buf.len() - 1)]).into_owned(),
            Err(_) => "this architecture".into(),
        }
    }

    /// Why a model whose context keeps no memory (no KV cache, no recurrent state) cannot be
    /// generated from: each decode would see only its own tokens.
    fn stateless_reason(&self) -> String {
        let arch = self.architecture();
        // SAFETY: the model is alive.
        if unsafe { sys::llama_model_is_diffusion(self.ptr.as_ptr()) } {
            format!(
                "{arch} is a diffusion model: it denoises a whole sequence at once with no KV cache, \
                 and sovereign generates one token after another, so it cannot run it"
            )
        } else {
            format!(
                "llama.cpp keeps no KV cache or recurrent state for {arch} (an encoder or embedding \
                 model), so it cannot generate one token after another"
            )
        }
    }

    pub fn is_eog(&self, token: i32) -> bool {
        // SAFETY: as above.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    pub fn tokenize(&self, text: &[u8], add_special: bool) -> Result<Vec<i32>> {
        let len = i32::try_from(text.len()).map_err(|_| anyhow!("prompt too long"))?;
        let mut out = vec![0i32; text.len() + 8];
        for _ in 0..2 {
            // SAFETY: buffers are valid for the lengths passed.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr() as *const c_char,
                    len,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    false,
                )
            };
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out);
            }
            out.resize((-n) as usize, 0);
        }
        bail!("tokenization failed")
    }

    /// Vocabularies whose sizes differ by at most this many ids (padding rows converters add)
    /// still match on their common ids, as llama.cpp's own speculative decoding allows.
    pub const VOCABULARY_PADDING: usize = 128;

    /// The first token id at which two vocabularies differ (a token's text, control tokens
    /// included, or whether it ends generation), or their sizes when those differ by more than
    /// [`Model::VOCABULARY_PADDING`]; `None` when every common id means the same in both. A
    /// proposer must speak its target's vocabulary: its drafts are token ids the target checks.
    pub fn vocabulary_difference(&self, other: &Model) -> Option<String> {
        let (a, b) = (self.n_vocab(), other.n_vocab());
        if a.abs_diff(b) > Self::VOCABULARY_PADDING {
            return Some(format!("{a} tokens against {b}"));
        }
        (0..a.min(b) as i32).find_map(|t| {
            let (x, y) = (self.piece(t, true), other.piece(t, true));
            if x != y {
                Some(format!("token {t} is {:?} against {:?}", String::from_utf8_lossy(&x), String::from_utf8_lossy(&y)))
            } else if self.is_eog(t) != other.is_eog(t) {
                Some(format!("token {t} ends generation in one and not in the other"))
            } else {
                None
            }
        })
    }

    /// The bytes a token stands for (byte tokens give raw bytes; control tokens give none).
    pub fn token_bytes(&self, token: i32) -> Vec<u8> {
        self.piece(token, false)
    }

    /// A token's text; control tokens give their text only with `special`.
    fn piece(&self, token: i32, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: buffer valid for its length.
            let n =
                unsafe { sys::llama_token_to_piece(self.vocab(), token, buf.as_mut_ptr() as *mut c_char, buf.len() as i32, 0, special) };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: contexts borrow the model, so none is alive here; the bridge is freed only
        // after llama.cpp released the slot pools that point into the source's memory.
        unsafe {
            sys::llama_model_free(self.ptr.as_ptr());
            if let Some(b) = self.bridge.take() {
                drop(Box::from_raw(b.as_ptr()));
            }
        }
    }
}

pub struct Context<'m> {
    ptr: NonNull<sys::llama_context>,
    model: &'m Model,
    params: ExecParams,
    // Boxed so the callback's user-data pointer stays valid while the context lives.
    routes: Option<Box<RouteRecorder>>,
    n_past: i32,
    /// The hidden rows (`h_nextn`) kept from the last decode, where asked for.
    hidden: Option<nextn::Hidden>,
}

impl<'m> Context<'m> {
    pub fn new(model: &'m Model, params: ExecParams, capture_routes: bool) -> Result<Context<'m>> {
        Self::with_rollback(model, params, capture_routes, 0)
    }

    /// A context whose recurrent memory keeps the states of the last `rollback` positions, so
    /// that [`Context::trim`] can take back up to that many positions of a recurrent or hybrid
    /// model (llama.cpp's `n_rs_seq`; it is 0, no rollback, for architectures without it).
    pub fn with_rollback(model: &'m Model, params: ExecParams, capture_routes: bool, rollback: u32) -> Result<Context<'m>> {
        Self::of_type(model, params, capture_routes, rollback, sys::llama_context_type_LLAMA_CONTEXT_TYPE_DEFAULT)
    }

    fn of_type(
        model: &'m Model,
        params: ExecParams,
        capture_routes: bool,
        rollback: u32,
        ctx_type: sys::llama_context_type,
    ) -> Result<Context<'m>> {
        let mut routes = capture_routes.then(|| Box::new(RouteRecorder::default()));
        // SAFETY: params are plain data; the recorder outlives the context (dropped after it).
        let ptr = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = params.n_ctx;
            p.n_batch = params.n_batch;
            p.n_ubatch = params.n_ubatch;
            p.n_seq_max = 1;
            p.n_threads = params.threads;
            p.n_threads_batch = params.threads_batch.unwrap_or(params.threads);
            p.flash_attn_type = if params.flash_attn {
                sys::llama_flash_attn_type_LLAMA_FLASH_ATTN_TYPE_ENABLED
            } else {
                sys::llama_flash_attn_type_LLAMA_FLASH_ATTN_TYPE_DISABLED
            };
            p.no_perf = true;
            p.n_rs_seq = rollback;
            p.ctx_type = ctx_type;
            if let Some(r) = routes.as_mut() {
                p.cb_eval = Some(routes::eval_callback);
                p.cb_eval_user_data = (&mut **r) as *mut RouteRecorder as *mut c_void;
            }
            sys::llama_init_from_model(model.ptr.as_ptr(), p)
        };
        let ptr =
            NonNull::new(ptr).ok_or_else(|| anyhow!("{}: llama.cpp could not create a context: {}", model.path.display(), last_log()))?;
        let ctx = Context { ptr, model, params, routes, n_past: 0, hidden: None };
        // SAFETY: the context is alive; its memory is owned by it (NULL when it keeps none).
        if unsafe { sys::llama_get_memory(ctx.ptr.as_ptr()) }.is_null() {
            bail!("{}: {}", model.path.display(), model.stateless_reason());
        }
        Ok(ctx)
    }

    pub fn params(&self) -> ExecParams {
        self.params
    }

    /// Decodes `tokens` at the next positions in batches of at most n_batch, appending to
    /// `rows` every token's logits row (`all_logits`) or only the last token's. llama.cpp keeps
    /// only the last batch's rows, so they are taken after each batch.
    pub fn decode(&mut self, tokens: &[i32], all_logits: bool, rows: &mut Vec<f32>) -> Result<()> {
        self.decode_states(tokens, None, all_logits, rows)
    }

    /// [`Context::decode`], each token with a state row beside it where `states` holds n_embd
    /// floats a token (an MTP context's hidden-state input).
    fn decode_states(&mut self, tokens: &[i32], states: Option<&[f32]>, all_logits: bool, rows: &mut Vec<f32>) -> Result<()> {
        if tokens.is_empty() {
            bail!("nothing to decode");
        }
        if self.n_past as usize + tokens.len() > self.params.n_ctx as usize {
            bail!("context of {} tokens exceeded", self.params.n_ctx);
        }
        let n_batch = self.params.n_batch as usize;
        let width = states.map(|s| s.len() / tokens.len());
        if let Some(h) = self.hidden.as_mut() {
            h.rows.clear();
        }
        let n_chunks = tokens.len().div_ceil(n_batch);
        for (c, chunk) in tokens.chunks(n_batch).enumerate() {
            let n = chunk.len() as i32;
            let state = states.zip(width).map(|(s, w)| &s[c * n_batch * w..(c * n_batch + chunk.len()) * w]);
            self.model.with_source(|s| s.decoding(chunk.len()));
            // SAFETY: the batch is allocated for n tokens with one sequence id each and freed below.
            let rc = unsafe {
                let mut b = sys::llama_batch_init(n, 0, 1);
                for (i, &t) in chunk.iter().enumerate() {
                    *b.token.add(i) = t;
                    *b.pos.add(i) = self.n_past + i as i32;
                    *b.n_seq_id.add(i) = 1;
                    **b.seq_id.add(i) = 0;
                    *b.logits.add(i) = i8::from(all_logits || i + 1 == chunk.len());
                }
                b.n_tokens = n;
                // Borrowed for the call: llama.cpp copies the rows into its own batch.
                if let Some(s) = state {
                    b.embd = s.as_ptr() as *mut f32;
                }
                let rc = sys::llama_decode(self.ptr.as_ptr(), b);
                b.embd = std::ptr::null_mut();
                sys::llama_batch_free(b);
                rc
            };
            // The source checks that the decode's events were served completely.
            let closed = self.model.with_source(|s| s.decoded(rc == 0)).unwrap_or(Ok(()));
            if rc != 0 {
                match self.model.expert_error() {
                    Some(e) => bail!("llama_decode failed closed (status {rc}): expert source: {e}"),
                    None => match closed {
                        Err(e) => bail!("llama_decode failed closed (status {rc}): expert source: {e:#}"),
                        Ok(()) => bail!("llama_decode failed with status {rc}: {}", last_log()),
                    },
                }
            }
            if let Err(e) = closed {
                bail!("llama_decode failed closed: expert source: {e:#}");
            }
            self.n_past += n;
            self.keep_hidden_rows(chunk.len(), all_logits)?;
            if all_logits {
                for i in 0..chunk.len() {
                    rows.extend_from_slice(self.logits(i as i32)?);
                }
            } else if c + 1 == n_chunks {
                rows.extend_from_slice(self.logits(-1)?);
            }
        }
        Ok(())
    }

    /// The logits row `i` of the last decode (negative counts from the end).
    pub fn logits(&self, i: i32) -> Result<&[f32]> {
        let n = self.model.n_vocab();
        // SAFETY: llama.cpp returns null for an invalid index, else a row of n_vocab floats
        // that stays valid until the next decode (which needs &mut self).
        let p = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), i) };
        if p.is_null() {
            bail!("no logits row {i}");
        }
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// Forgets every position from `keep` on (KV-cache trim for rollback); the next decode
    /// continues at `keep`.
    pub fn trim(&mut self, keep: i32) -> Result<()> {
        if keep < 0 || keep > self.n_past {
            bail!("cannot trim to {keep}: {} positions are held", self.n_past);
        }
        // SAFETY: the memory handle belongs to this live context; -1 means "to the end".
        let ok = unsafe {
            let mem = sys::llama_get_memory(self.ptr.as_ptr());
            sys::llama_memory_seq_rm(mem, 0, keep, -1)
        };
        if !ok {
            bail!("llama.cpp refused to trim the KV cache to {keep} positions");
        }
        self.n_past = keep;
        Ok(())
    }

    /// Forgets the whole sequence, as a new context would start: the KV cache and recurrent
    /// states cleared with their bytes, the position back to 0, and the route capture restarted
    /// (routes not yet taken are dropped, and ubatches count from 0 again).
    pub fn clear(&mut self) {
        // SAFETY: the memory handle belongs to this live context; no decode is running (&mut self).
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) };
        self.n_past = 0;
        if let Some(r) = self.routes.as_mut() {
            // In place: llama.cpp holds the box's address as the callback's user data.
            **r = RouteRecorder::default();
        }
    }

    pub fn n_past(&self) -> i32 {
        self.n_past
    }

    /// Positions [`Context::trim`] can take back on a recurrent or hybrid model (llama.cpp's
    /// `n_rs_seq` as the context was created; 0 where the architecture has no rollback).
    pub fn rollback(&self) -> u32 {
        // SAFETY: a live context.
        unsafe { sys::llama_n_rs_seq(self.ptr.as_ptr()) }
    }

    /// The device memory this context holds, per device, from its buffers' sizes: weights,
    /// context memory (KV cache, recurrent state), compute buffers and the slot pools.
    pub fn device_memory(&self) -> Vec<DeviceBuffers> {
        let mut out: Vec<DeviceBuffers> = Vec::new();
        let mut i = 0;
        loop {
            let (mut dev, mut model, mut context, mut compute, mut pools) = (std::ptr::null(), 0usize, 0usize, 0usize, 0usize);
            // SAFETY: a live context; the out-pointers are valid locals; the device name is a
            // string the backend registry owns for the process's life.
            let n = unsafe { sys::llama_expert_memory(self.ptr.as_ptr(), i, &mut dev, &mut model, &mut context, &mut compute, &mut pools) };
            if i >= n {
                break;
            }
            let device = if dev.is_null() { "?".to_string() } else { unsafe { CStr::from_ptr(dev) }.to_string_lossy().into_owned() };
            let b = match out.iter_mut().find(|b| b.device == device) {
                Some(b) => b,
                None => {
                    out.push(DeviceBuffers { device, ..Default::default() });
                    out.last_mut().expect("pushed")
                }
            };
            b.model += model as u64;
            b.context += context as u64;
            b.compute += compute as u64;
            b.pools += pools as u64;
            i += 1;
        }
        out
    }

    /// Sequence 0's recurrent state as llama.cpp serializes it (its conv and SSM states, no KV
    /// cache: `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`); `None` for a model without one.
    pub fn recurrent_state(&self) -> Result<Option<Vec<u8>>> {
        if !self.model.has_recurrent_state() {
            return Ok(None);
        }
        let flags = sys::LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY;
        // SAFETY: the context is alive; the buffer is valid for the size passed.
        let size = unsafe { sys::llama_state_seq_get_size_ext(self.ptr.as_ptr(), 0, flags) };
        let mut buf = vec![0u8; size];
        let n = unsafe { sys::llama_state_seq_get_data_ext(self.ptr.as_ptr(), buf.as_mut_ptr(), buf.len(), 0, flags) };
        if n != size || size == 0 {
            bail!("llama.cpp wrote {n} of the {size} bytes of the recurrent state: {}", last_log());
        }
        Ok(Some(buf))
    }

    /// Sequence 0's whole state (KV cells and recurrent states) as llama.cpp serializes it, to
    /// come back to with [`Context::restore`] where a trim cannot take positions back.
    pub fn snapshot(&self) -> Result<Vec<u8>> {
        // SAFETY: the context is alive; the buffer is valid for the size passed.
        let size = unsafe { sys::llama_state_seq_get_size_ext(self.ptr.as_ptr(), 0, 0) };
        let mut buf = vec![0u8; size];
        let n = unsafe { sys::llama_state_seq_get_data_ext(self.ptr.as_ptr(), buf.as_mut_ptr(), buf.len(), 0, 0) };
        if n != size || size == 0 {
            bail!("llama.cpp wrote {n} of the {size} bytes of the sequence's state: {}", last_log());
        }
        Ok(buf)
    }

    /// Puts back a [`Context::snapshot`] taken when `n_past` positions were held.
    pub fn restore(&mut self, state: &[u8], n_past: i32) -> Result<()> {
        // SAFETY: the context is alive; the buffer is valid for its length. llama.cpp clears the
        // sequence before reading the state into it.
        let n = unsafe { sys::llama_state_seq_set_data_ext(self.ptr.as_ptr(), state.as_ptr(), state.len(), 0, 0) };
        if n != state.len() {
            bail!("llama.cpp read {n} of the {} bytes of a sequence state: {}", state.len(), last_log());
        }
        self.n_past = n_past;
        Ok(())
    }

    pub fn take_routes(&mut self) -> Vec<RouteEvent> {
        self.routes.as_mut().map(|r| r.take()).unwrap_or_default()
    }

    pub fn route_k(&self) -> Option<usize> {
        self.routes.as_ref().and_then(|r| r.k())
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: created by llama_init_from_model; the route recorder is dropped after this.
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

/// Quantization targets offered by `model quantize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum QuantType {
    #[serde(rename = "f16")]
    F16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
    #[serde(rename = "q4_k_m")]
    Q4KM,
}

impl QuantType {
    /// The name `model quantize --type` takes.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F16 => "f16",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4KM => "q4_k_m",
        }
    }

    /// llama.cpp's `llama_ftype`, which a quantized file stores as `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            QuantType::F16 => sys::llama_ftype_LLAMA_FTYPE_MOSTLY_F16,
            QuantType::Q8_0 => sys::llama_ftype_LLAMA_FTYPE_MOSTLY_Q8_0,
            QuantType::Q4_0 => sys::llama_ftype_LLAMA_FTYPE_MOSTLY_Q4_0,
            QuantType::Q4KM => sys::llama_ftype_LLAMA_FTYPE_MOSTLY_Q4_K_M,
        }
    }
}

pub fn quantize(input: &Path, output: &Path, ty: QuantType, threads: i32) -> Result<()> {
    init();
    let (i, o) = (cstring(input)?, cstring(output)?);
    let ftype = ty.file_type();
    // SAFETY: params are plain data; paths outlive the call.
    let rc = unsafe {
        let mut p = sys::llama_model_quantize_default_params();
        p.ftype = ftype;
        p.nthread = threads;
        sys::llama_model_quantize(i.as_ptr(), o.as_ptr(), &p)
    };
    if rc != 0 {
        bail!("{}: quantization failed: {}", input.display(), last_log());
    }
    Ok(())
}
