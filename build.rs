//! Builds the pinned, patched llama.cpp and its bindings.
//!
//! 1. find the pinned package that cargo downloaded and checksum-verified (fetching it if needed);
//! 2. copy its `llama.cpp/` tree into a cache directory keyed by pin + patch digests + CMake
//!    options, and refuse it unless its tree digest equals `vendor/llama.cpp.pin`;
//! 3. apply `patches/*.patch` in name order, build shared engine libraries and the CPU backend
//!    as a loadable module (`GGML_BACKEND_DL`) with CMake;
//! 4. generate bindings with bindgen and export the build identity to the crate.

#[path = "src/engine/pin.rs"]
mod pin;

use sha2::{Digest, Sha256};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// CMake options of the engine build. Part of the cache key and of `build-info`.
const CMAKE_OPTIONS: &[(&str, &str)] = &[
    // Shared engine libraries with loadable backends: the same harness binary drives the CPU
    // module built here and a CUDA module built elsewhere against the same ggml-base.
    ("BUILD_SHARED_LIBS", "ON"),
    ("GGML_BACKEND_DL", "ON"),
    ("LLAMA_BUILD_COMMON", "OFF"),
    ("LLAMA_BUILD_APP", "OFF"),
    ("LLAMA_BUILD_TESTS", "OFF"),
    ("LLAMA_BUILD_EXAMPLES", "OFF"),
    ("LLAMA_BUILD_TOOLS", "OFF"),
    ("LLAMA_BUILD_SERVER", "OFF"),
    ("LLAMA_OPENSSL", "OFF"),
    ("GGML_NATIVE", "OFF"),
    // Repacked kernels give other bits than the plain CPU buffer and forbid per-slot writes.
    ("GGML_CPU_REPACK", "OFF"),
    ("GGML_OPENMP", "ON"),
    ("CMAKE_BUILD_TYPE", "Release"),
];

/// Bumped when this script changes how the cached tree is produced.
const CACHE_SALT: &str = "sovereign-engine-build-1";

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        println!("cargo:warning=engine build failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    for p in ["build.rs", "src/engine/pin.rs", "vendor", "patches", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=SOVEREIGN_ENGINE_CACHE");

    let pin_text = fs::read_to_string(root.join("vendor/llama.cpp.pin")).map_err(|e| format!("vendor/llama.cpp.pin: {e}"))?;
    let pin = pin::Pin::parse(&pin_text).map_err(|e| format!("vendor/llama.cpp.pin: {e}"))?;
    check_lockfile(&root, &pin)?;

    let patches = patch_series(&root)?;
    let key = cache_key(&pin_text, &patches);
    let cache =
        env::var_os("SOVEREIGN_ENGINE_CACHE").map(PathBuf::from).unwrap_or_else(|| target_dir(&out_dir).join("llama")).join(&key[..16]);
    let install = cache.join("install");
    // Builds of other profiles (or trees sharing SOVEREIGN_ENGINE_CACHE) may run this at the
    // same time: one builds the engine, the others wait for it instead of removing its tree.
    fs::create_dir_all(cache.parent().expect("a parent")).map_err(|e| format!("{}: {e}", cache.display()))?;
    let lock_path = cache.with_extension("lock");
    let lock = fs::File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    let tree_digest;
    if cache.join(".complete").exists() {
        tree_digest = fs::read_to_string(cache.join(".tree_sha256")).map_err(|e| e.to_string())?;
    } else {
        let _ = fs::remove_dir_all(&cache);
        fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        let pristine = find_package(&root, &pin)?.join("llama.cpp");
        let src = cache.join("src");
        copy_tree(&pristine, &src).map_err(|e| format!("copying {}: {e}", pristine.display()))?;
        tree_digest = pin::tree_digest(&src).map_err(|e| format!("digest of {}: {e}", src.display()))?;
        if tree_digest != pin.tree_sha256 {
            return Err(format!(
                "llama.cpp tree digest {tree_digest} differs from the pin {} (vendor/llama.cpp.pin); \
                 refusing to build an unpinned engine",
                pin.tree_sha256
            ));
        }
        for (name, _, path) in &patches {
            apply_patch(&src, path).map_err(|e| format!("patch {name}: {e}"))?;
        }
        build_cmake(&src, &cache, &install);
        fs::write(cache.join(".tree_sha256"), &tree_digest).map_err(|e| e.to_string())?;
        fs::write(cache.join(".complete"), &key).map_err(|e| e.to_string())?;
    }

    // ggml's RPC backend, a device whose buffers live in another process: what the device tier
    // is tested on without a GPU. The same build tree reconfigured with GGML_RPC=ON; only its
    // module is built (seconds), so the engine libraries above stay as they are.
    if !install.join("bin").join(RPC_MODULE).is_file() {
        build_rpc_module(&install)?;
    }
    bindings(&install.join("include"), &out_dir)?;
    for lib in ["lib", "lib64"] {
        println!("cargo:rustc-link-search=native={}", install.join(lib).display());
    }
    for lib in ["llama", "ggml", "ggml-base"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    // Carried next to the binary (`$ORIGIN/lib`) on another machine, else the cached build here.
    let libdir = install.join("lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/lib:{}", libdir.display());
    println!("cargo:rustc-env=SOVEREIGN_ENGINE_LIBDIR={}", libdir.display());
    println!("cargo:rustc-env=SOVEREIGN_ENGINE_MODDIR={}", install.join("bin").display());
    println!("cargo:rustc-env=SOVEREIGN_ENGINE_SRCDIR={}", cache.join("src").display());

    let patch_ids: Vec<String> = patches.iter().map(|(n, d, _)| format!("{n}={d}")).collect();
    let opts: Vec<String> = CMAKE_OPTIONS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("cargo:rustc-env=SOVEREIGN_PIN_PACKAGE={}", pin.package);
    println!("cargo:rustc-env=SOVEREIGN_PIN_VERSION={}", pin.version);
    println!("cargo:rustc-env=SOVEREIGN_PIN_CHECKSUM={}", pin.checksum);
    println!("cargo:rustc-env=SOVEREIGN_TREE_SHA256={tree_digest}");
    println!("cargo:rustc-env=SOVEREIGN_PATCHES={}", patch_ids.join(";"));
    println!("cargo:rustc-env=SOVEREIGN_CMAKE_OPTIONS={}", opts.join(";"));
    println!("cargo:rustc-env=SOVEREIGN_ENGINE_KEY={key}");
    Ok(())
}

/// `target/` of this build, derived from OUT_DIR (`target/<profile>/build/<pkg>/out`), so that
/// debug and release builds share one engine build.
fn target_dir(out_dir: &Path) -> PathBuf {
    out_dir.ancestors().nth(4).map(Path::to_path_buf).unwrap_or_else(|| out_dir.to_path_buf())
}

/// The lockfile must carry the pinned checksum: that is what cargo verified the download against.
fn check_lockfile(root: &Path, pin: &pin::Pin) -> Result<(), String> {
    let lock = fs::read_to_string(root.join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let needle = format!("name = \"{}\"\nversion = \"{}\"\n", pin.package, pin.version);
    let at = lock.find(&needle).ok_or_else(|| format!("Cargo.lock has no {} {}", pin.package, pin.version))?;
    let entry = &lock[at..lock[at..].find("\n\n").map(|e| at + e).unwrap_or(lock.len())];
    if !entry.contains(&format!("checksum = \"{}\"", pin.checksum)) {
        return Err(format!("Cargo.lock checksum of {} {} differs from vendor/llama.cpp.pin", pin.package, pin.version));
    }
    Ok(())
}

/// `patches/*.patch` in name order, with their SHA-256.
fn patch_series(root: &Path) -> Result<Vec<(String, String, PathBuf)>, String> {
    let dir = root.join("patches");
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(&dir) {
        for e in rd {
            let path = e.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|x| x == "patch") {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let digest = pin::file_digest(&path).map_err(|e| format!("{name}: {e}"))?;
                out.push((name, digest, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn cache_key(pin_text: &str, patches: &[(String, String, PathBuf)]) -> String {
    let mut h = Sha256::new();
    h.update(CACHE_SALT);
    h.update(pin_text);
    for (name, digest, _) in patches {
        h.update(format!("\npatch {name} {digest}"));
    }
    for (k, v) in CMAKE_OPTIONS {
        h.update(format!("\n-D{k}={v}"));
    }
    hex::encode(h.finalize())
}

/// The unpacked package in cargo's registry cache; fetched through cargo when absent.
fn find_package(root: &Path, pin: &pin::Pin) -> Result<PathBuf, String> {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let dir_name = format!("{}-{}", pin.package, pin.version);
    let look = || -> Option<PathBuf> {
        let src = cargo_home.join("registry/src");
        fs::read_dir(&src).ok()?.flatten().map(|e| e.path().join(&dir_name)).find(|p| p.join("llama.cpp").is_dir())
    };
    if let Some(p) = look() {
        return Ok(p);
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["fetch", "--locked", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .status()
        .map_err(|e| format!("running cargo fetch: {e}"))?;
    if !status.success() {
        return Err(format!("cargo fetch failed ({status}); run `cargo fetch` and retry"));
    }
    look().ok_or_else(|| format!("{dir_name} is not in {} after cargo fetch", cargo_home.display()))
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let ty = e.file_type()?;
        let dst = to.join(e.file_name());
        if ty.is_dir() {
            copy_tree(&e.path(), &dst)?;
        } else if ty.is_file() {
            fs::copy(e.path(), &dst)?;
        } else {
            return Err(std::io::Error::other(format!("{} is not a regular file", e.path().display())));
        }
    }
    Ok(())
}

fn apply_patch(src: &Path, patch: &Path) -> Result<(), String> {
    let out = Command::new("patch")
        .args(["-p1", "--forward", "--batch", "--silent", "-d"])
        .arg(src)
        .arg("-i")
        .arg(patch)
        .output()
        .map_err(|e| format!("running patch (is it installed?): {e}"))?;
    if !out.status.success() {
        return Err(format!("does not apply:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

fn build_cmake(src: &Path, cache: &Path, install: &Path) {
    let mut cfg = cmake::Config::new(src);
    cfg.out_dir(install).profile("Release").no_default_flags(true);
    for (k, v) in CMAKE_OPTIONS {
        cfg.define(k, v);
    }
    // A compiler cache only speeds rebuilds of identical sources; it is not part of the identity.
    if Command::new("ccache").arg("--version").output().is_ok_and(|o| o.status.success()) {
        cfg.define("CMAKE_C_COMPILER_LAUNCHER", "ccache");
        cfg.define("CMAKE_CXX_COMPILER_LAUNCHER", "ccache");
        cfg.env("CCACHE_BASEDIR", cache.parent().unwrap_or(cache));
        cfg.env("CCACHE_NOHASHDIR", "1");
    }
    cfg.build();
}

const RPC_MODULE: &str = "libggml-rpc.so";

fn build_rpc_module(install: &Path) -> Result<(), String> {
    let tree = install.join("build");
    let run = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("cmake").args(args).current_dir(&tree).output().map_err(|e| format!("cmake: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!("cmake {}: {}", args.join(" "), err.lines().rev().take(5).collect::<Vec<_>>().join(" | ")));
        }
        Ok(())
    };
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    run(&["-DGGML_RPC=ON", "."])?;
    run(&["--build", ".", "--target", "ggml-rpc", "-j", &jobs])?;
    let built = tree.join("bin").join(RPC_MODULE);
    fs::copy(&built, install.join("bin").join(RPC_MODULE)).map_err(|e| format!("{}: {e}", built.display()))?;
    Ok(())
}

fn bindings(include: &Path, out_dir: &Path) -> Result<(), String> {
    let b = bindgen::Builder::default()
        .header_contents("sovereign_engine.h", "#include <llama.h>\n#include <gguf.h>\n#include <ggml-backend.h>\n#include <ggml-rpc.h>\n")
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("(llama|ggml|gguf)_.*")
        .allowlist_type("(llama|ggml|gguf)_.*")
        .allowlist_var("(LLAMA|GGML|GGUF|RPC_PROTO)_.*")
        .derive_default(true)
        .layout_tests(false)
        .generate()
        .map_err(|e| format!("bindgen: {e} (is libclang-dev installed?)"))?;
    b.write_to_file(out_dir.join("bindings.rs")).map_err(|e| e.to_string())
}
