//! The digest manifest of a model file: the BLAKE3 of its header, of every non-expert tensor
//! and of every expert extent (one per role of each layer/expert object, as the Plan reads
//! them), and the SHA-256 of the whole file, all from one O_DIRECT pass. Ranges use BLAKE3
//! because a run verifies every extent it reads on the thread that takes completions: at
//! several GB/s it stays below the device, where SHA-256 (about 1.9 GB/s here) did not. It is built once per file and
//! cached under the file's identity (device, inode, size, mtime, ctime); a run then names the
//! manifest's digest and verifies only the bytes it reads, instead of hashing the whole file.

use crate::inventory::{Extent, Inventory};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub const FORMAT: &str = "sovereign.digests/3";
/// A cache file is not read past 64 KiB plus 1 KiB per range of the model (a range takes about
/// 200 bytes of JSON), so a hostile one costs no more memory than the model's own manifest.
const CACHE_BASE_BYTES: u64 = 64 << 10;
const CACHE_BYTES_PER_RANGE: u64 = 1 << 10;
/// Block of the hashing pass, and blocks in flight between its reader and its two hashers:
/// 12 MiB in all, so that a run that builds its manifest does not raise its own peak much.
const BLOCK: usize = 4 << 20;
const BLOCKS: usize = 3;

/// What identifies a file's current contents without reading them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileKey {
    pub fn of(path: &Path) -> Result<FileKey> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).with_context(|| format!("{}: cannot stat", path.display()))?;
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        Ok(FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }

    /// The fields that differ from `now`, named.
    fn changes(&self, now: &FileKey) -> String {
        let mut c = Vec::new();
        if self.dev != now.dev || self.ino != now.ino {
            c.push("device/inode (replaced)".to_string());
        }
        if self.size != now.size {
            c.push(format!("size {} -> {}", self.size, now.size));
        }
        if self.mtime_ns != now.mtime_ns {
            c.push("mtime".into());
        }
        if self.ctime_ns != now.ctime_ns {
            c.push("ctime".into());
        }
        c.join(", ")
    }
}

/// One hashed byte range of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeDigest {
    pub name: String,
    pub offset: u64,
    pub len: u64,
    pub blake3: String,
}

/// One expert extent: object `layer/expert`, role as in the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtentDigest {
    pub layer: u32,
    pub expert: u32,
    pub role: String,
    pub offset: u64,
    pub len: u64,
    pub blake3: String,
    /// XXH3-128 of the same bytes (32 hex digits): what reads are verified with by default, at
    /// memory speed. It detects corruption and wrong objects, not deliberate collisions.
    pub xxh3: String,
}

/// The manifest proper; its digest is the SHA-256 of its canonical JSON, so it depends only on
/// the file's bytes and layout, not on where or when it was built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Body {
    pub format: String,
    pub file_bytes: u64,
    /// The whole file.
    pub sha256: String,
    /// Bytes before the tensor data (GGUF header, metadata, padding).
    pub header: RangeDigest,
    /// Every tensor that is not an expert tensor, in file order.
    pub tensors: Vec<RangeDigest>,
    /// Every expert extent, in file order.
    pub experts: Vec<ExtentDigest>,
}

impl Body {
    pub fn digest(&self) -> Result<String> {
        Ok(crate::util::sha256(crate::util::canonical_json_of(self)?.as_bytes()))
    }
}

/// What the cache holds for one model path.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    format: String,
    /// For people reading the cache; lookups go by the file name (a digest of this path).
    path: String,
    key: FileKey,
    build_s: f64,
    manifest_sha256: String,
    body: Body,
}

/// One file's manifest in memory, with its digest.
#[derive(Debug)]
pub struct FileDigests {
    pub body: Body,
    pub manifest_sha256: String,
}

/// A model's manifests in memory (one per file, in set order), with its expert extents indexed
/// by position.
#[derive(Debug)]
pub struct ModelDigests {
    pub files: Vec<Arc<FileDigests>>,
    /// What names the model: the file's SHA-256, or its set's (`gguf::set::set_sha256`).
    pub sha256: String,
    /// The file's manifest digest, or for a set the SHA-256 of `sovereign.digests-set/1` and
    /// each shard's manifest digest, in order, one per line.
    pub manifest_sha256: String,
    by_position: HashMap<u64, (u64, ExtentHashes)>,
}

/// How reads are verified against the manifest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// XXH3-128 (default): at memory speed; detects corruption and wrong objects.
    #[default]
    Xxh3,
    /// BLAKE3: cryptographic, several times slower on the completion thread.
    Blake3,
}

impl Verify {
    pub fn name(self) -> &'static str {
        match self {
            Verify::Xxh3 => "xxh3-128",
            Verify::Blake3 => "blake3",
        }
    }
}

/// An expert extent's digests in the manifest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtentHashes {
    pub blake3: [u8; 32],
    pub xxh3: u128,
}

impl FileDigests {
    pub fn new(body: Body) -> Result<FileDigests> {
        Ok(FileDigests { manifest_sha256: body.digest()?, body })
    }
}

impl ModelDigests {
    /// A one-file model's manifest from its body, its digest computed.
    pub fn new(body: Body) -> Result<ModelDigests> {
        Self::of_files(vec![Arc::new(FileDigests::new(body)?)])
    }

    /// A model's manifest from its files' manifests, in set order.
    pub fn of_files(files: Vec<Arc<FileDigests>>) -> Result<ModelDigests> {
        let mut by_position = HashMap::with_capacity(files.iter().map(|f| f.body.experts.len()).sum());
        for (shard, f) in files.iter().enumerate() {
            for e in &f.body.experts {
                let what = || format!("extent {}/{} {}", e.layer, e.expert, e.role);
                let xxh3 = u128::from_str_radix(&e.xxh3, 16)
                    .ok()
                    .filter(|_| e.xxh3.len() == 32)
                    .with_context(|| format!("{}: XXH3 {:?} is not 32 hex digits", what(), e.xxh3))?;
                let at = crate::source::position(shard as u32, e.offset);
                by_position.insert(at, (e.len, ExtentHashes { blake3: parse_hex(&e.blake3).with_context(what)?, xxh3 }));
            }
        }
        let sha256 = crate::gguf::set::set_sha256(&files.iter().map(|f| f.body.sha256.clone()).collect::<Vec<_>>());
        let manifest_sha256 = match files.as_slice() {
            [one] => one.manifest_sha256.clone(),
            _ => {
                let mut s = String::from("sovereign.digests-set/1\n");
                for f in &files {
                    s.push_str(&f.manifest_sha256);
                    s.push('\n');
                }
                crate::util::sha256(s.as_bytes())
            }
        };
        Ok(ModelDigests { files, sha256, manifest_sha256, by_position })
    }

    /// The digests of the expert extent `e` (at its position), if the manifest has exactly
    /// that extent.
    pub fn extent(&self, e: Extent) -> Option<ExtentHashes> {
        self.by_position.get(&e.offset).filter(|(len, _)| *len == e.len).map(|(_, d)| *d)
    }

    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Each file's SHA-256, in set order.
    pub fn shard_sha256(&self) -> Vec<String> {
        self.files.iter().map(|f| f.body.sha256.clone()).collect()
    }
}

fn parse_hex(s: &str) -> Result<[u8; 32]> {
    let mut d = [0u8; 32];
    if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        bail!("`{}` is not a SHA-256 in lowercase hex", s.chars().take(80).collect::<String>());
    }
    hex::decode_to_slice(s, &mut d).map_err(|e| anyhow!("{e}"))?;
    Ok(d)
}

/// How a run came by its manifest; goes on record with the model's identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub manifest_sha256: String,
    /// Taken from the cache (identity unchanged) rather than built by this process.
    pub reused: bool,
    /// Seconds of the one hashing pass, when this process built it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_s: Option<f64>,
    /// Why a cached manifest was not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt_because: Option<String>,
    /// The ranges llama.cpp loads itself, hashed at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_check: Option<LoadCheck>,
}

/// The bytes llama.cpp loads from the file (the header and every tensor it does not leave to
/// the Plan), hashed just before the load and compared with the manifest: through the page cache
/// a resident run then maps, or with O_DIRECT as a served run's loader reads them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadCheck {
    pub how: String,
    pub ranges: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// The manifest of `path` and how it was obtained.
pub struct Obtained {
    pub digests: Arc<ModelDigests>,
    pub provenance: Provenance,
    pub cache_file: PathBuf,
}

/// The cache directory: `SOVEREIGN_CACHE`, else `$XDG_CACHE_HOME/sovereign`, else
/// `~/.cache/sovereign`.
pub fn cache_dir() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("SOVEREIGN_CACHE") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Ok(d.join("sovereign"));
    }
    var("HOME").map(|h| h.join(".cache").join("sovereign")).ok_or_else(|| anyhow!("no cache directory: set SOVEREIGN_CACHE"))
}

fn cache_file_of(canonical: &Path) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let name = crate::util::sha256(canonical.as_os_str().as_bytes());
    Ok(cache_dir()?.join("digests").join(format!("{}.json", &name[..32])))
}

/// The file this machine's digest cache holds a manifest of, whose whole-file SHA-256 is
/// `sha256` and which is still what was hashed (the same device, inode, size and times), if
/// any: where a record's model is, when the record names it by its file name only.
pub fn cached_file_with(sha256: &str) -> Option<PathBuf> {
    /// What a lookup reads of a cache file; the rest of it is skipped.
    #[derive(Deserialize)]
    struct Head {
        path: PathBuf,
        key: FileKey,
        body: HeadBody,
    }
    #[derive(Deserialize)]
    struct HeadBody {
        sha256: String,
    }
    let dir = cache_dir().ok()?.join("digests");
    let entries = std::fs::read_dir(dir).ok()?;
    entries.flatten().take(crate::bounds::MAX_CACHED_MANIFESTS).find_map(|e| {
        let meta = e.metadata().ok().filter(|m| m.is_file())?;
        // A manifest is some hundreds of bytes per range; none is read past the bound.
        let f = std::fs::File::open(e.path()).ok()?;
        let reader = std::io::BufReader::new(std::io::Read::take(f, meta.len().min(crate::bounds::MAX_RECORD_JSON_BYTES)));
        let h: Head = serde_json::from_reader(reader).ok()?;
        (h.body.sha256 == sha256 && FileKey::of(&h.path).ok()? == h.key).then_some(h.path)
    })
}

/// Manifests this process already holds, by canonical path, with how it first came by them.
type Held = (PathBuf, FileKey, Arc<FileDigests>, Provenance);
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// The manifest of the model `path` names (already inventoried as `inv`): each of its files'
/// the one this process holds or the cached one while the file's identity is unchanged, else
/// built now (one line on stderr says why) and cached. With `pin`, a model whose SHA-256 (the
/// file's, or the set's) is another is refused.
pub fn obtain(path: &Path, inv: &Inventory, pin: Option<&str>) -> Result<Obtained> {
    let n = inv.shards.len().max(1);
    let mut files = Vec::with_capacity(n);
    let mut provenance =
        Provenance { manifest_sha256: String::new(), reused: true, build_s: None, rebuilt_because: None, load_check: None };
    let mut cache_file = PathBuf::new();
    let mut why = Vec::new();
    for shard in 0..n {
        let file = inv.shards.get(shard).map_or(path, |s| s.path.as_path());
        // A one-file model is refused before its manifest is cached; a set once it is whole.
        let (d, p, c) = obtain_file(file, inv, shard, pin.filter(|_| n == 1))?;
        provenance.reused &= p.reused;
        if let Some(b) = p.build_s {
            *provenance.build_s.get_or_insert(0.0) += b;
        }
        why.extend(p.rebuilt_because);
        if shard == 0 {
            cache_file = c;
        }
        files.push(d);
    }
    provenance.rebuilt_because = (!why.is_empty()).then(|| why.join("; "));
    let digests = Arc::new(ModelDigests::of_files(files)?);
    provenance.manifest_sha256 = digests.manifest_sha256.clone();
    finish(path, pin, Obtained { digests, provenance, cache_file })
}

/// The manifest of one file of the model: shard `shard` of `inv`.
fn obtain_file(path: &Path, inv: &Inventory, shard: usize, pin: Option<&str>) -> Result<(Arc<FileDigests>, Provenance, PathBuf)> {
    let canonical = std::fs::canonicalize(path).with_context(|| format!("{}: cannot resolve", path.display()))?;
    let key = FileKey::of(&canonical)?;
    let cache_file = cache_file_of(&canonical)?;
    let held = HELD
        .lock()
        .map_err(|_| anyhow!("digest manifests: lock poisoned"))?
        .iter()
        .find(|(p, k, _, _)| *p == canonical && *k == key)
        .map(|(_, _, d, v)| (d.clone(), v.clone()));
    if let Some((d, v)) = held {
        return Ok((d, v, cache_file));
    }
    let why = match read_cache(&cache_file, inv, shard) {
        Ok(c) if c.key == key => {
            let d = Arc::new(FileDigests::new(c.body)?);
            let provenance = Provenance {
                manifest_sha256: d.manifest_sha256.clone(),
                reused: true,
                build_s: None,
                rebuilt_because: None,
                load_check: None,
            };
            hold(&canonical, key, &d, &provenance)?;
            return Ok((d, provenance, cache_file));
        }
        Ok(c) => format!("{} changed since its digest manifest was built ({})", path.display(), c.key.changes(&key)),
        Err(e) if e.is::<Missing>() => String::new(),
        Err(e) => format!("digest cache {}: {e:#}", cache_file.display()),
    };
    // A first build is silent (the record says it was built, and how long it took); a
    // rebuild says why.
    if !why.is_empty() {
        log::info!("{why}; rebuilding its digest manifest");
    }
    let t = Instant::now();
    let body = build_body(&canonical, inv, shard)?;
    let build_s = t.elapsed().as_secs_f64();
    let after = FileKey::of(&canonical)?;
    if after != key {
        bail!("{}: the file changed while its digest manifest was built ({})", path.display(), key.changes(&after));
    }
    let d = Arc::new(FileDigests::new(body)?);
    if let Some(p) = pin.filter(|p| *p != d.body.sha256) {
        bail!("{}: sha256 {}, but {p} is pinned; refused (its digest manifest was not cached)", path.display(), d.body.sha256);
    }
    let cached = write_cache(
        &cache_file,
        &CacheFile {
            format: FORMAT.into(),
            path: canonical.display().to_string(),
            key,
            build_s,
            manifest_sha256: d.manifest_sha256.clone(),
            body: d.body.clone(),
        },
    );
    // The manifest holds for this run either way; only the next run pays the pass again.
    if let Err(e) = cached {
        log::warn!("digest manifest of {} not cached: {e:#}", path.display());
    }
    let provenance = Provenance {
        manifest_sha256: d.manifest_sha256.clone(),
        reused: false,
        build_s: Some(build_s),
        rebuilt_because: (!why.is_empty()).then_some(why),
        load_check: None,
    };
    hold(&canonical, key, &d, &provenance)?;
    Ok((d, provenance, cache_file))
}

fn finish(path: &Path, pin: Option<&str>, o: Obtained) -> Result<Obtained> {
    if let Some(p) = pin.filter(|p| *p != o.digests.sha256) {
        let what = if o.digests.files.len() > 1 { "shard set sha256" } else { "sha256" };
        bail!("{}: {what} {} (digest manifest {}), but {p} is pinned; refused", path.display(), o.digests.sha256, o.cache_file.display());
    }
    Ok(o)
}

fn hold(canonical: &Path, key: FileKey, d: &Arc<FileDigests>, provenance: &Provenance) -> Result<()> {
    let mut held = HELD.lock().map_err(|_| anyhow!("digest manifests: lock poisoned"))?;
    held.retain(|(p, _, _, _)| p != canonical);
    held.push((canonical.to_path_buf(), key, d.clone(), provenance.clone()));
    Ok(())
}

/// No cache file: the first build, not worth a line of its own.
#[derive(Debug)]
struct Missing;

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no cache file")
    }
}

impl std::error::Error for Missing {}

fn read_cache(file: &Path, inv: &Inventory, shard: usize) -> Result<CacheFile> {
    let meta = match std::fs::symlink_metadata(file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Missing.into()),
        Err(e) => return Err(e).context("cannot stat"),
    };
    if !meta.is_file() {
        bail!("not a regular file");
    }
    let max = CACHE_BASE_BYTES + CACHE_BYTES_PER_RANGE * ranges(inv, shard).len() as u64;
    if meta.len() > max {
        bail!("{} bytes, more than the {max} this model's manifest may take", meta.len());
    }
    let mut bytes = Vec::new();
    // Bounded even if the file grows after the stat above.
    std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(file).context("cannot open")?, max + 1), &mut bytes)
        .context("cannot read")?;
    if bytes.len() as u64 > max {
        bail!("more than the {max} bytes this model's manifest may take");
    }
    let c: CacheFile = serde_json::from_slice(&bytes).map_err(|e| anyhow!("not a digest manifest: {e}"))?;
    if c.format != FORMAT || c.body.format != FORMAT {
        bail!("format {:?}, not {FORMAT:?}", c.format);
    }
    let digest = c.body.digest()?;
    if digest != c.manifest_sha256 {
        bail!("its body digests to {digest}, not the {} it names (corrupt)", c.manifest_sha256);
    }
    consistent(&c.body, inv, shard)?;
    Ok(c)
}

/// An expert object's extent: (layer, expert, role).
type ExpertRole = (u32, u32, String);

/// A range the manifest covers: its name, extent and expert object, if any.
type Range = (String, Extent, Option<ExpertRole>);

/// The ranges of file `shard` of the model the manifest must cover, from the inventory, at
/// their offsets in that file: (name, extent, expert object).
fn ranges(inv: &Inventory, shard: usize) -> Vec<Range> {
    let data_offset = inv.shards.get(shard).map_or(inv.data_offset, |s| s.data_offset);
    let mut out = vec![("header".to_string(), Extent { offset: 0, len: data_offset }, None)];
    let expert_tensors: std::collections::BTreeSet<&str> =
        inv.moe_layers.iter().flat_map(|l| l.tensors.values().map(String::as_str)).collect();
    for t in inv.tensors.iter().filter(|t| t.shard as usize == shard && !expert_tensors.contains(t.name.as_str())) {
        out.push((t.name.clone(), Extent { offset: t.offset, len: t.bytes }, None));
    }
    for o in &inv.objects {
        for (role, e) in &o.extents {
            let (s, offset) = e.shard_offset();
            if s == shard {
                out.push((
                    format!("{}/{}/{role}", o.layer, o.expert),
                    Extent { offset, len: e.len },
                    Some((o.layer, o.expert, role.clone())),
                ));
            }
        }
    }
    out
}

/// A cached body must describe exactly the inventory's ranges.
fn consistent(b: &Body, inv: &Inventory, shard: usize) -> Result<()> {
    let bytes = inv.shards.get(shard).map_or(inv.file_bytes, |s| s.bytes);
    if b.file_bytes != bytes {
        bail!("it describes a file of {} bytes, the model's has {bytes}", b.file_bytes);
    }
    parse_hex(&b.sha256).context("whole-file sha256")?;
    let want = ranges(inv, shard);
    let mut got: Vec<Range> = Vec::with_capacity(want.len());
    got.push((b.header.name.clone(), Extent { offset: b.header.offset, len: b.header.len }, None));
    got.extend(b.tensors.iter().map(|t| (t.name.clone(), Extent { offset: t.offset, len: t.len }, None)));
    got.extend(b.experts.iter().map(|e| {
        (format!("{}/{}/{}", e.layer, e.expert, e.role), Extent { offset: e.offset, len: e.len }, Some((e.layer, e.expert, e.role.clone())))
    }));
    let key = |v: &mut Vec<Range>| v.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    let mut want = want;
    key(&mut want);
    key(&mut got);
    if got != want {
        bail!("its {} ranges are not the model's {} tensors and extents", got.len(), want.len());
    }
    for r in std::iter::once(&b.header).chain(&b.tensors) {
        parse_hex(&r.blake3).with_context(|| r.name.clone())?;
    }
    Ok(())
}

fn write_cache(file: &Path, c: &CacheFile) -> Result<()> {
    let dir = file.parent().expect("a cache file has a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the digest cache", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        file.file_name().and_then(|n| n.to_str()).unwrap_or("digests"),
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0)
    ));
    let res = (|| -> Result<()> {
        crate::util::write_new_durable(&tmp, &serde_json::to_vec(c)?)?;
        std::fs::rename(&tmp, file).with_context(|| format!("{}: cannot rename into place", file.display()))?;
        crate::util::sync_dir(dir)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Hashes the whole file `path` (file `shard` of the model `inv`) and every range of it in one
/// pass: a reader (O_DIRECT where the file system allows it, so the page cache never holds the
/// file), a hasher of the ranges and a hasher of the whole file, with a few blocks in flight
/// between them.
pub fn build_body(path: &Path, inv: &Inventory, shard: usize) -> Result<Body> {
    use std::os::unix::fs::FileExt;
    use std::sync::mpsc::sync_channel;
    let mut rs = ranges(inv, shard);
    rs.sort_by_key(|r| r.1);
    if let Some(w) = rs.windows(2).find(|w| w[0].1.end() > w[1].1.offset) {
        bail!("{}: ranges {} and {} overlap", path.display(), w[0].0, w[1].0);
    }
    let file = match crate::source::open_direct(path) {
        Ok(f) => f,
        Err(_) => std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?,
    };
    let len = file.metadata()?.len();
    let want = inv.shards.get(shard).map_or(inv.file_bytes, |s| s.bytes);
    if len != want {
        bail!("{}: {len} bytes, the inventory read {want}", path.display());
    }
    if let Some(r) = rs.last().filter(|r| r.1.end() > len) {
        bail!("{}: {} ends past the end of the file", path.display(), r.0);
    }
    let (free_tx, free_rx) = sync_channel::<crate::source::AlignedBuf>(BLOCKS);
    for _ in 0..BLOCKS {
        free_tx.send(crate::source::AlignedBuf::new(BLOCK as u64)?).expect("room for every block");
    }
    let (full_tx, full_rx) = sync_channel::<(crate::source::AlignedBuf, u64, usize)>(BLOCKS);
    let (whole_tx, whole_rx) = sync_channel::<(crate::source::AlignedBuf, usize)>(BLOCKS);
    let (digests, whole) = std::thread::scope(|s| -> Result<(Vec<(String, String)>, String)> {
        // Owned here, so that an early return ends the other two threads.
        let (full_rx, whole_tx) = (full_rx, whole_tx);
        let reader = s.spawn(move || -> Result<()> {
            let mut off = 0u64;
            while off < len {
                let Ok(mut buf) = free_rx.recv() else { return Ok(()) };
                let mut n = 0usize;
                while n < BLOCK && off + (n as u64) < len {
                    let got = file
                        .read_at(&mut buf.as_mut_slice()[n..BLOCK], off + n as u64)
                        .with_context(|| format!("{}: read at {}", path.display(), off + n as u64))?;
                    if got == 0 {
                        bail!("{}: unexpected end of file at {}", path.display(), off + n as u64);
                    }
                    n += got;
                }
                let n = n.min((len - off) as usize);
                off += n as u64;
                if full_tx.send((buf, off - n as u64, n)).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        });
        let whole = s.spawn(move || {
            let mut h = Sha256::new();
            while let Ok((buf, n)) = whole_rx.recv() {
                h.update(&buf.as_slice()[..n]);
                let _ = free_tx.send(buf);
            }
            hex::encode(h.finalize())
        });
        let mut out = Vec::with_capacity(rs.len());
        let mut i = 0;
        let mut h = blake3::Hasher::new();
        let mut x = twox_hash::XxHash3_128::new();
        let mut expect = 0u64;
        while let Ok((buf, off, n)) = full_rx.recv() {
            if off != expect {
                bail!("{}: read out of order at {off}", path.display());
            }
            expect = off + n as u64;
            let end = off + n as u64;
            while i < rs.len() && rs[i].1.offset < end {
                let r = rs[i].1;
                let (a, b) = (r.offset.max(off), r.end().min(end));
                if a < b {
                    let bytes = &buf.as_slice()[(a - off) as usize..(b - off) as usize];
                    h.update(bytes);
                    x.write(bytes);
                }
                if r.end() <= end {
                    let xxh3 = format!("{:032x}", std::mem::take(&mut x).finish_128());
                    out.push((std::mem::take(&mut h).finalize().to_hex().to_string(), xxh3));
                    i += 1;
                } else {
                    break;
                }
            }
            if whole_tx.send((buf, n)).is_err() {
                break;
            }
        }
        drop(whole_tx);
        // Empty ranges at the very end of the file.
        while i < rs.len() && rs[i].1.len == 0 && rs[i].1.offset == expect {
            out.push((std::mem::take(&mut h).finalize().to_hex().to_string(), format!("{:032x}", twox_hash::XxHash3_128::oneshot(&[]))));
            i += 1;
        }
        reader.join().map_err(|_| anyhow!("the digest reader panicked"))??;
        let whole = whole.join().map_err(|_| anyhow!("the digest hasher panicked"))?;
        if expect != len || i != rs.len() {
            bail!("{}: the pass stopped at {expect} of {len} bytes", path.display());
        }
        Ok((out, whole))
    })?;
    Ok(assemble(len, whole, rs, digests))
}

/// The manifest body of a file of `len` bytes with SHA-256 `whole`: each range with its
/// (BLAKE3, XXH3-128) digests, by kind.
fn assemble(len: u64, whole: String, rs: Vec<Range>, digests: Vec<(String, String)>) -> Body {
    let mut body = Body {
        format: FORMAT.into(),
        file_bytes: len,
        sha256: whole,
        header: RangeDigest { name: String::new(), offset: 0, len: 0, blake3: String::new() },
        tensors: Vec::new(),
        experts: Vec::new(),
    };
    for ((name, e, obj), (blake3, xxh3)) in rs.into_iter().zip(digests) {
        match obj {
            Some((layer, expert, role)) => {
                body.experts.push(ExtentDigest { layer, expert, role, offset: e.offset, len: e.len, blake3, xxh3 })
            }
            None if name == "header" && e.offset == 0 => body.header = RangeDigest { name, offset: 0, len: e.len, blake3 },
            None => body.tensors.push(RangeDigest { name, offset: e.offset, len: e.len, blake3 }),
        }
    }
    body
}

/// Which ranges llama.cpp loads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loads {
    /// Everything: the experts are resident.
    All,
    /// Everything but the expert extents, which the Plan serves (and verifies as it reads).
    NonExpert,
}

/// Hashes the ranges llama.cpp is about to load (header and tensors; the expert extents too
/// when they are resident) of each of the model's files and compares each with the manifest.
/// A resident run maps the file, so its ranges are hashed through the page cache it maps. A
/// served run's loader reads with O_DIRECT, and so does this check where the file system
/// allows it: through the page cache, each non-expert byte would be charged twice under the
/// run's limit (a cached copy beside the loaded one) until the load ended.
pub fn check_load(inv: &Inventory, d: &ModelDigests, loads: Loads) -> Result<LoadCheck> {
    use std::os::unix::fs::FileExt;
    let t = Instant::now();
    if inv.shards.len() != d.files.len() {
        bail!("{}: {} files, the digest manifest has {}", inv.file, inv.shards.len(), d.files.len());
    }
    let mut buf = crate::source::AlignedBuf::new(BLOCK as u64)?;
    let (mut bytes, mut ranges) = (0u64, 0u64);
    let mut direct = loads == Loads::NonExpert;
    for (shard, f) in inv.shards.iter().zip(&d.files) {
        let path = &shard.path;
        let opened = if direct { crate::source::open_direct(path).ok() } else { None };
        direct &= opened.is_some();
        let file = match opened {
            Some(f) => f,
            None => std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?,
        };
        let b = &f.body;
        let mut list: Vec<(String, u64, u64, &str)> =
            std::iter::once(&b.header).chain(&b.tensors).map(|r| (r.name.clone(), r.offset, r.len, r.blake3.as_str())).collect();
        if loads == Loads::All {
            list.extend(b.experts.iter().map(|e| (format!("{}/{}/{}", e.layer, e.expert, e.role), e.offset, e.len, e.blake3.as_str())));
        }
        list.sort_by_key(|r| r.1);
        ranges += list.len() as u64;
        for (name, offset, len, want) in list {
            let mut h = blake3::Hasher::new();
            // Aligned blocks covering the range, as O_DIRECT needs; the bytes outside it are
            // read and left unhashed.
            let mut at = offset & !(crate::source::ALIGN - 1);
            while at < offset + len {
                let block = buf.as_mut_slice();
                let mut got = 0usize;
                while got < block.len() && at + (got as u64) < offset + len {
                    match file.read_at(&mut block[got..], at + got as u64) {
                        Ok(0) => bail!("{}: {name}: unexpected end of file at {}", path.display(), at + got as u64),
                        Ok(n) => got += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e).with_context(|| format!("{}: {name}: read at {}", path.display(), at + got as u64)),
                    }
                }
                let (a, b) = (offset.max(at), (offset + len).min(at + got as u64));
                h.update(&block[(a - at) as usize..(b - at) as usize]);
                at += got as u64;
            }
            let got = h.finalize().to_hex().to_string();
            if got != want {
                bail!(
                    "{}: {name} (bytes {offset}..{}) hashes to {got}, its digest manifest says {want}; refused",
                    path.display(),
                    offset + len
                );
            }
            bytes += len;
        }
    }
    let how = match loads {
        Loads::All => "header and every tensor (experts resident), hashed through the page cache just before llama.cpp loads them",
        Loads::NonExpert if direct => "header and every non-expert tensor, hashed from the files with O_DIRECT just before llama.cpp reads them with O_DIRECT; expert extents are verified by the Plan as they are read",
        Loads::NonExpert => "header and every non-expert tensor, hashed through the page cache just before llama.cpp loads them; expert extents are verified by the Plan as they are read",
    };
    Ok(LoadCheck { how: how.into(), ranges, bytes, seconds: t.elapsed().as_secs_f64() })
}

/// A fresh pass over every file of the model compared with the cached manifests: the ranges
/// whose digests differ.
pub struct Check {
    pub fresh: ModelDigests,
    pub build_s: f64,
    /// The cached manifest digest, where every file had one cached under its identity.
    pub cached: Option<String>,
    pub differ: Vec<String>,
}

/// `model digests --check`: re-hashes every file, compares with the cached manifests (where
/// cached under the current identity), and caches the fresh ones.
pub fn check(path: &Path, inv: &Inventory) -> Result<Check> {
    let mut fresh = Vec::new();
    let mut cached_all = Vec::new();
    let mut differ = Vec::new();
    let mut build_s = 0.0;
    let n = inv.shards.len().max(1);
    for shard in 0..n {
        let path = inv.shards.get(shard).map_or(path, |s| s.path.as_path());
        // In a set, each range is named with its file.
        let name = |r: String| if n > 1 { format!("{}: {r}", inv.shards[shard].file) } else { r };
        let canonical = std::fs::canonicalize(path).with_context(|| format!("{}: cannot resolve", path.display()))?;
        let key = FileKey::of(&canonical)?;
        let cache_file = cache_file_of(&canonical)?;
        let cached = match read_cache(&cache_file, inv, shard) {
            Ok(c) if c.key == key => Some(c),
            Ok(c) => {
                log::info!(
                    "{} changed since its digest manifest was built ({}); nothing cached to compare",
                    path.display(),
                    c.key.changes(&key)
                );
                None
            }
            Err(e) => {
                if cache_file.exists() {
                    log::info!("digest cache {}: {e:#}; nothing cached to compare", cache_file.display());
                }
                None
            }
        };
        let t = Instant::now();
        let body = build_body(&canonical, inv, shard)?;
        let secs = t.elapsed().as_secs_f64();
        build_s += secs;
        if FileKey::of(&canonical)? != key {
            bail!("{}: the file changed while it was hashed", path.display());
        }
        if let Some(c) = &cached {
            let b = &c.body;
            if b.sha256 != body.sha256 {
                differ.push(name("whole file".to_string()));
            }
            for (x, y) in std::iter::once((&b.header, &body.header)).chain(b.tensors.iter().zip(&body.tensors)) {
                if x != y {
                    differ.push(name(y.name.clone()));
                }
            }
            for (x, y) in b.experts.iter().zip(&body.experts) {
                if x != y {
                    differ.push(name(format!("{}/{}/{}", y.layer, y.expert, y.role)));
                }
            }
        }
        let d = FileDigests::new(body)?;
        // The fresh pass is the file's truth under this identity: it replaces what was cached.
        write_cache(
            &cache_file,
            &CacheFile {
                format: FORMAT.into(),
                path: canonical.display().to_string(),
                key,
                build_s: secs,
                manifest_sha256: d.manifest_sha256.clone(),
                body: d.body.clone(),
            },
        )?;
        cached_all.push(cached.map(|c| Arc::new(FileDigests { body: c.body, manifest_sha256: c.manifest_sha256 })));
        fresh.push(Arc::new(d));
    }
    let cached = cached_all.into_iter().collect::<Option<Vec<_>>>().map(ModelDigests::of_files).transpose()?.map(|m| m.manifest_sha256);
    Ok(Check { fresh: ModelDigests::of_files(fresh)?, build_s, cached, differ })
}

/// Every file of the model hashed afresh (nothing cached is used or written): its SHA-256 and
/// its manifest's digest, as a record names them.
pub fn rehash(inv: &Inventory) -> Result<(String, String)> {
    let files = (0..inv.shards.len())
        .map(|i| Ok(Arc::new(FileDigests::new(build_body(&inv.shards[i].path, inv, i)?)?)))
        .collect::<Result<Vec<_>>>()?;
    let d = ModelDigests::of_files(files)?;
    Ok((d.sha256, d.manifest_sha256))
}

/// The SHA-256 of a model (the file's, or its set's) through its manifest (cached or built),
/// refused where it is not `pin`. A file that is no MoE model has no manifest: it is hashed
/// whole.
pub fn model_sha256(path: &Path, pin: Option<&str>) -> Result<String> {
    let sha = match Inventory::of(path) {
        Ok(inv) => return Ok(obtain(path, &inv, pin)?.digests.sha256.clone()),
        Err(_) => crate::util::sha256_file(path)?,
    };
    if let Some(p) = pin.filter(|p| *p != sha) {
        bail!("{}: sha256 {sha}, but {p} is pinned; refused", path.display());
    }
    Ok(sha)
}
