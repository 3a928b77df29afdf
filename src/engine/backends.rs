//! Backend modules: the CPU backend and any module in the backend directory are loaded by exact
//! path before llama.cpp starts, so llama.cpp never searches on its own, and what ran is known.

use super::sys;
use serde::Serialize;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming a directory of extra backend modules (`libggml-*.so`).
pub const BACKEND_DIR_ENV: &str = "SOVEREIGN_BACKEND_DIR";
const CPU_MODULE: &str = "libggml-cpu.so";

/// An engine library or backend module mapped into this process.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct LoadedLibrary {
    pub name: String,
    pub path: String,
    pub sha256: String,
}

/// A device as ggml's registry describes it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Device {
    pub name: String,
    pub description: String,
    pub kind: std::borrow::Cow<'static, str>,
    pub memory_total: u64,
    pub memory_free: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

/// Why a backend module, the RPC backend or pinned host memory is not available.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("{}: NUL in path", .0.display())]
    NulInPath(PathBuf),
    #[error("{BACKEND_DIR_ENV} {}: {reason}", dir.display())]
    BackendDir { dir: PathBuf, reason: String },
    #[error("{}: ggml could not load this backend module", .0.display())]
    Module(PathBuf),
    #[error("{}: ggml could not load the RPC backend module", .0.display())]
    RpcModule(PathBuf),
    #[error("the RPC backend module has no {0}")]
    RpcEntry(String),
    #[error("{flag} {endpoint:?}: NUL in the endpoint")]
    NulInEndpoint { flag: &'static str, endpoint: String },
    #[error("--rpc {0}: no RPC server answered there (sovereign device serve --listen {0})")]
    NoRpcServer(String),
    #[error("no CPU device to serve")]
    NoCpuDevice,
    #[error("the RPC server at {0} stopped (is the address in use?)")]
    RpcServerStopped(String),
    #[error("cannot allocate {0} bytes of pinned host memory")]
    PinnedAlloc(usize),
    #[error("the pinned buffer has no base")]
    PinnedNoBase,
    #[error("no offload device is registered")]
    NoOffloadDevice,
    #[error("{0} offers no host buffer type")]
    NoHostBufferType(String),
}

static LOADED: OnceLock<Result<Vec<String>, BackendError>> = OnceLock::new();

/// Where the CPU module is: next to a carried binary (`<exe dir>/lib`), else the cached build.
fn cpu_module() -> PathBuf {
    module(CPU_MODULE)
}

/// A module built with the engine: next to a carried binary (`<exe dir>/lib`), else the cache.
fn module(name: &str) -> PathBuf {
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(|p| p.join("lib"))) {
        if dir.join(name).is_file() {
            return dir.join(name);
        }
    }
    Path::new(env!("SOVEREIGN_ENGINE_MODDIR")).join(name)
}

const RPC_MODULE: &str = "libggml-rpc.so";
static RPC: OnceLock<Result<usize, BackendError>> = OnceLock::new();

/// ggml's RPC backend registry, its module loaded on first use (only runs that name an RPC
/// device map it, so other records list the libraries they did before).
fn rpc_reg() -> Result<sys::ggml_backend_reg_t, BackendError> {
    ensure_loaded()?;
    let reg = RPC
        .get_or_init(|| {
            let path = module(RPC_MODULE);
            let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| BackendError::NulInPath(path.clone()))?;
            // SAFETY: a NUL-terminated path; ggml keeps the handle for the life of the process.
            let reg = unsafe { sys::ggml_backend_load(c.as_ptr()) };
            if reg.is_null() {
                return Err(BackendError::RpcModule(path));
            }
            Ok(reg as usize)
        })
        .clone()?;
    Ok(reg as sys::ggml_backend_reg_t)
}

/// The RPC module's entry point `name`, as the function type `F`.
///
/// # Safety
/// `F` must be the C signature ggml-rpc.h declares for `name`.
unsafe fn rpc_proc<F: Copy>(name: &CStr) -> Result<F, BackendError> {
    let reg = rpc_reg()?;
    // SAFETY: a live registry and a NUL-terminated name.
    let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) };
    if f.is_null() {
        return Err(BackendError::RpcEntry(name.to_string_lossy().into_owned()));
    }
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut std::ffi::c_void>());
    // SAFETY: the caller names the function's real type; both are pointer-sized.
    Ok(unsafe { std::mem::transmute_copy::<*mut std::ffi::c_void, F>(&f) })
}

/// Registers the devices of the RPC server at `endpoint` (`HOST:PORT`), so that layers can be
/// placed there as on a GPU (`--gpu-layers`). Returns the devices' names.
pub fn rpc_add_server(endpoint: &str) -> Result<Vec<String>, BackendError> {
    // Safety of a call: `endpoint` must be NUL-terminated (ggml-rpc.h).
    type AddServer = unsafe extern "C" fn(*const std::ffi::c_char) -> sys::ggml_backend_reg_t;
    let c = CString::new(endpoint).map_err(|_| BackendError::NulInEndpoint { flag: "--rpc", endpoint: endpoint.to_string() })?;
    // SAFETY: ggml-rpc.h: ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint).
    let add: AddServer = unsafe { rpc_proc(c"ggml_backend_rpc_add_server")? };
    // SAFETY: a NUL-terminated endpoint; the registry it returns lives for the process.
    let reg = unsafe { add(c.as_ptr()) };
    if reg.is_null() {
        return Err(BackendError::NoRpcServer(endpoint.to_string()));
    }
    // SAFETY: a live registry; its devices' names are strings it owns.
    unsafe {
        sys::ggml_backend_register(reg);
        Ok((0..sys::ggml_backend_reg_dev_count(reg))
            .map(|i| CStr::from_ptr(sys::ggml_backend_dev_name(sys::ggml_backend_reg_dev_get(reg, i))).to_string_lossy().into_owned())
            .collect())
    }
}

/// Serves this machine's CPU device over ggml's RPC protocol at `endpoint` until killed.
pub fn rpc_serve(endpoint: &str, threads: usize) -> Result<(), BackendError> {
    // Safety of a call: a NUL-terminated endpoint, a cache directory that is NUL-terminated or
    // null, and `n_devices` live devices at `devices` (ggml-rpc.h).
    type StartServer = unsafe extern "C" fn(*const std::ffi::c_char, *const std::ffi::c_char, usize, usize, *mut sys::ggml_backend_dev_t);
    let c = CString::new(endpoint).map_err(|_| BackendError::NulInEndpoint { flag: "--listen", endpoint: endpoint.to_string() })?;
    // SAFETY: ggml-rpc.h: void ggml_backend_rpc_start_server(const char * endpoint,
    // const char * cache_dir, size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices).
    let start: StartServer = unsafe { rpc_proc(c"ggml_backend_rpc_start_server")? };
    // SAFETY: registry queries on the loaded CPU module.
    let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return Err(BackendError::NoCpuDevice);
    }
    // SAFETY: a NUL-terminated endpoint, no cache directory, one live device.
    unsafe { start(c.as_ptr(), std::ptr::null(), threads, 1, &mut cpu) };
    Err(BackendError::RpcServerStopped(endpoint.to_string()))
}

/// Extra modules: every `libggml-*.so` in the backend directory except a CPU module.
fn extra_modules() -> Result<Vec<PathBuf>, BackendError> {
    let Some(dir) = std::env::var_os(BACKEND_DIR_ENV).filter(|d| !d.is_empty()) else {
        return Ok(Vec::new());
    };
    let dir = PathBuf::from(dir);
    let rd = std::fs::read_dir(&dir).map_err(|e| BackendError::BackendDir { dir: dir.clone(), reason: e.to_string() })?;
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            n.starts_with("libggml-") && n.ends_with(".so") && n != CPU_MODULE && n != "libggml-base.so"
        })
        .collect();
    out.sort();
    Ok(out)
}

fn load(path: &Path) -> Result<(), BackendError> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| BackendError::NulInPath(path.to_path_buf()))?;
    // SAFETY: a NUL-terminated path; ggml keeps the handle for the life of the process.
    let reg = unsafe { sys::ggml_backend_load(c.as_ptr()) };
    if reg.is_null() {
        return Err(BackendError::Module(path.to_path_buf()));
    }
    Ok(())
}

/// Loads the modules once; the error, if any, is kept and returned on every call.
pub fn ensure_loaded() -> Result<(), BackendError> {
    LOADED
        .get_or_init(|| {
            let mut done = Vec::new();
            for p in extra_modules()? {
                load(&p)?;
                done.push(p.display().to_string());
            }
            let cpu = cpu_module();
            load(&cpu)?;
            done.push(cpu.display().to_string());
            Ok(done)
        })
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// Engine libraries and backend modules mapped into the process, with their SHA-256.
pub fn loaded_libraries() -> Vec<LoadedLibrary> {
    let maps = procfs::process::Process::myself().and_then(|p| p.maps()).map(|m| m.0).unwrap_or_default();
    let mut paths: Vec<String> = maps
        .into_iter()
        .filter_map(|m| match m.pathname {
            procfs::process::MMapPath::Path(p) => Some(p.to_string_lossy().into_owned()),
            _ => None,
        })
        .filter(|p| {
            let n = p.rsplit('/').next().unwrap_or("");
            n.starts_with("libllama") || n.starts_with("libggml") || n.starts_with("libcudart") || n.starts_with("libcublas")
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .map(|p| LoadedLibrary {
            name: p.rsplit('/').next().unwrap_or(&p).to_string(),
            sha256: crate::util::sha256_file(Path::new(&p)).unwrap_or_else(|e| format!("unreadable: {e}")),
            path: p,
        })
        .collect()
}

/// Devices ggml's registry knows, in registry order.
pub fn devices() -> Vec<Device> {
    let s = |p: *const std::ffi::c_char| {
        // SAFETY: only called on the props' name fields, NUL-terminated strings the modules own.
        if p.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: registry queries; props point at strings owned by the loaded modules.
    unsafe {
        (0..sys::ggml_backend_dev_count())
            .map(|i| {
                let d = sys::ggml_backend_dev_get(i);
                let mut p: sys::ggml_backend_dev_props = std::mem::zeroed();
                sys::ggml_backend_dev_get_props(d, &mut p);
                let kind = match p.type_ {
                    sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_CPU => "cpu",
                    sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_GPU => "gpu",
                    sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU => "igpu",
                    _ => "accel",
                };
                Device {
                    name: s(p.name),
                    description: s(p.description),
                    kind: kind.into(),
                    memory_total: p.memory_total as u64,
                    memory_free: p.memory_free as u64,
                    device_id: (!p.device_id.is_null()).then(|| s(p.device_id)),
                }
            })
            .collect()
    }
}

/// Host memory from the host buffer type of the device layers are offloaded to (CUDA's pinned
/// memory): the source's windows, so that copies from them are true asynchronous DMA.
pub struct PinnedHost {
    buf: sys::ggml_backend_buffer_t,
}

// SAFETY: a ggml buffer is plain memory owned by this value; ggml frees it once, in drop.
unsafe impl Send for PinnedHost {}
unsafe impl Sync for PinnedHost {}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: allocated in `pinned_host`, freed once.
        unsafe { sys::ggml_backend_buffer_free(self.buf) };
    }
}

/// The host buffer type of the first offload device (GPU type: CUDA, RPC), with its name, or
/// why there is none.
pub fn offload_host_buffer_type() -> Result<(usize, String), BackendError> {
    ensure_loaded()?;
    // SAFETY: registry queries on loaded modules; names are strings the modules own.
    unsafe {
        let dev = (0..sys::ggml_backend_dev_count())
            .map(|i| sys::ggml_backend_dev_get(i))
            .find(|&d| sys::ggml_backend_dev_type(d) == sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_GPU)
            .ok_or(BackendError::NoOffloadDevice)?;
        let name = CStr::from_ptr(sys::ggml_backend_dev_name(dev)).to_string_lossy().into_owned();
        let buft = sys::ggml_backend_dev_host_buffer_type(dev);
        if buft.is_null() {
            return Err(BackendError::NoHostBufferType(name));
        }
        Ok((buft as usize, CStr::from_ptr(sys::ggml_backend_buft_name(buft)).to_string_lossy().into_owned()))
    }
}

/// `len` bytes (a multiple of 4096) of the offload device's host buffer type, 4096-aligned, and
/// the buffer that owns them.
pub fn pinned_host(buft: usize, len: usize) -> Result<(std::ptr::NonNull<u8>, PinnedHost), BackendError> {
    const PAGE: usize = 4096;
    let buft = buft as sys::ggml_backend_buffer_type_t;
    // SAFETY: a host buffer type from `offload_host_buffer_type`; the buffer is freed by PinnedHost.
    unsafe {
        let buf = sys::ggml_backend_buft_alloc_buffer(buft, len + PAGE);
        if buf.is_null() {
            return Err(BackendError::PinnedAlloc(len));
        }
        let owner = PinnedHost { buf };
        let base = sys::ggml_backend_buffer_get_base(buf) as usize;
        let p = std::ptr::NonNull::new(base.next_multiple_of(PAGE) as *mut u8).ok_or(BackendError::PinnedNoBase)?;
        Ok((p, owner))
    }
}

/// Whether a GPU device is registered.
pub fn has_gpu() -> bool {
    devices().iter().any(|d| d.kind == "gpu" || d.kind == "igpu")
}

/// Features the CPU backend module reports (the registry's `ggml_backend_get_features`).
pub fn cpu_features() -> Vec<String> {
    // SAFETY: the proc address, when present, has the documented signature; the array ends
    // with a NULL name.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(c"CPU".as_ptr());
        if reg.is_null() {
            return Vec::new();
        }
        let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_get_features".as_ptr());
        let Some(f) = std::mem::transmute::<*mut std::ffi::c_void, sys::ggml_backend_get_features_t>(f) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut p = f(reg);
        while !p.is_null() && !(*p).name.is_null() {
            let n = CStr::from_ptr((*p).name).to_string_lossy().to_lowercase();
            let v = CStr::from_ptr((*p).value).to_string_lossy().into_owned();
            out.push(if v == "1" { n } else { format!("{n}={v}") });
            p = p.add(1);
        }
        out
    }
}

/// Writes the patched source tree of this build (its `src/` as `llama.cpp/`) as a tar file,
/// compressed as its suffix says (`.tar.gz`, `.tar.xz`).
pub fn export_source(to: &Path) -> anyhow::Result<()> {
    let src = Path::new(env!("SOVEREIGN_ENGINE_SRCDIR"));
    if !src.join("CMakeLists.txt").is_file() {
        anyhow::bail!("{}: the engine source tree of this build is not on this machine", src.display());
    }
    let parent = src.parent().unwrap_or(src);
    let st = std::process::Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "--exclude=.git"])
        .arg("--transform=s,^src,llama.cpp,")
        .arg("-caf")
        .arg(to)
        .arg("-C")
        .arg(parent)
        .arg("src")
        .status()
        .map_err(|e| anyhow::anyhow!("running tar: {e}"))?;
    if !st.success() {
        anyhow::bail!("{}: tar failed ({st})", to.display());
    }
    Ok(())
}
