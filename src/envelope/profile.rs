//! A device's read profile: F's request size read at each depth, reads landing as F's do,
//! measured once per device and block size and cached beside the digest manifests. F's default
//! depth is the least depth the device serves within [`WITHIN`] of its best, so a device that
//! needs a deeper queue gets one and a device that does not is not crowded.

use super::{measure_cells, Cell, Pattern, ALIGN};
use crate::inventory::Inventory;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const PROFILE_FORMAT: &str = "sovereign.device_profile/1";
/// Depths a profile reads at.
pub const DEPTHS: &[usize] = &[1, 2, 4, 8, 16, 32];
/// Bytes each depth reads per round (two rounds: ascending, then descending, so a device's
/// drift over the measurement weighs on every depth alike).
pub const BYTES_PER_CELL: u64 = 64 << 20;
/// A depth within this share of the best rate serves as well as the best.
pub const WITHIN: f64 = 0.95;
/// Model files smaller than one cell's reads are not profiled (their depth stays the
/// manifest's): their reads are few and a profile would mostly reread them.
pub const MIN_FILE_BYTES: u64 = BYTES_PER_CELL;

/// The block device a file lies on, as the kernel names it (`dev` alone where the file system
/// has no block device of its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceId {
    /// `major:minor` of the file's device.
    pub dev: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl DeviceId {
    pub fn of(path: &Path) -> Result<DeviceId> {
        let dev = std::fs::metadata(path).with_context(|| format!("{}: cannot stat", path.display()))?.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let mut id = DeviceId { dev: format!("{major}:{minor}"), name: None, model: None, serial: None, bytes: None };
        let Ok(mut disk) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else { return Ok(id) };
        if disk.join("partition").exists() {
            disk.pop();
        }
        let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        id.name = disk.file_name().map(|n| n.to_string_lossy().into_owned());
        id.model = read(disk.join("device/model"));
        id.serial = read(disk.join("device/serial")).or_else(|| read(disk.join("serial")));
        id.bytes = read(disk.join("size")).and_then(|s| s.parse::<u64>().ok()).map(|sectors| sectors * 512);
        Ok(id)
    }

    /// How records name it: its kernel name and `major:minor`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} ({})", self.dev),
            None => self.dev.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    pub format: String,
    pub device: DeviceId,
    pub block_bytes: u64,
    pub landing_bytes: u64,
    /// Each depth's two rounds, in the order read.
    pub cells: Vec<Cell>,
    /// Each depth's rate over both rounds (MiB/s), in [`DEPTHS`] order.
    pub mib_per_s: Vec<(u32, f64)>,
    /// The least depth within [`WITHIN`] of the best.
    pub depth: u32,
    pub measured_unix_s: u64,
}

/// F's read size for a model: its median expert extent, to a power of two from 64 KiB to 4 MiB.
pub fn block_of(inv: &Inventory) -> u64 {
    block_of_extents(inv.objects.iter().flat_map(|o| o.extents.iter().map(|(_, e)| e.len)).collect())
}

fn block_of_extents(mut lens: Vec<u64>) -> u64 {
    lens.sort_unstable();
    let median = lens.get(lens.len() / 2).copied().unwrap_or(1 << 20);
    median.next_power_of_two().clamp(64 << 10, 4 << 20)
}

/// Reads `file` (on the device being profiled) at every depth, twice, in `block`-sized reads.
pub fn measure(file: &Path, block: u64) -> Result<DeviceProfile> {
    if !(ALIGN as u64..=4 << 20).contains(&block) || !block.is_power_of_two() {
        bail!("a profile's block of {block} bytes: expected a power of two from 4 KiB to 4 MiB");
    }
    let device = DeviceId::of(file)?;
    let order: Vec<usize> = DEPTHS.iter().chain(DEPTHS.iter().rev()).copied().collect();
    let (cells, landing_bytes) = measure_cells(file, BYTES_PER_CELL, block as usize, &order, Pattern::Plain)?;
    let mib_per_s: Vec<(u32, f64)> = DEPTHS
        .iter()
        .map(|&d| {
            let (bytes, secs) = cells.iter().filter(|c| c.depth == d).fold((0u64, 0f64), |(b, s), c| (b + c.bytes, s + c.seconds));
            (d as u32, bytes as f64 / (1 << 20) as f64 / secs.max(1e-9))
        })
        .collect();
    let best = mib_per_s.iter().map(|&(_, r)| r).fold(0.0, f64::max);
    let depth = mib_per_s.iter().find(|&&(_, r)| r >= WITHIN * best).map_or(1, |&(d, _)| d);
    let measured_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(DeviceProfile { format: PROFILE_FORMAT.into(), device, block_bytes: block, landing_bytes, cells, mib_per_s, depth, measured_unix_s })
}

/// Whether `file` is large enough to profile its device by ([`MIN_FILE_BYTES`]).
pub fn profiled(file: &Path) -> bool {
    std::fs::metadata(file).is_ok_and(|m| m.len() >= MIN_FILE_BYTES)
}

fn cache_file(cache: &Path, device: &DeviceId, block: u64) -> Result<PathBuf> {
    let key = serde_json::to_string(&(device, block))?;
    let name = crate::util::sha256(key.as_bytes());
    Ok(cache.join("devices").join(format!("{}.json", &name[..32])))
}

/// The cached profile of the device `file` lies on at `block`, if one was measured; a cache
/// file that does not parse, or names another device or block, is not one.
pub fn cached(file: &Path, block: u64) -> Option<DeviceProfile> {
    cached_in(&crate::digests::cache_dir().ok()?, file, block)
}

/// The cached profile, or one measured now and cached (one process measures a device at a
/// time: others wait for it, then read its profile).
pub fn ensure(file: &Path, block: u64) -> Result<DeviceProfile> {
    ensure_in(&crate::digests::cache_dir()?, file, block)
}

/// [`cached`] under the cache directory `cache`.
pub fn cached_in(cache: &Path, file: &Path, block: u64) -> Option<DeviceProfile> {
    let device = DeviceId::of(file).ok()?;
    let path = cache_file(cache, &device, block).ok()?;
    let text = crate::bounds::read_text("a device profile", &path, 1 << 20).ok()?;
    let p: DeviceProfile = serde_json::from_str(&text).ok()?;
    (p.format == PROFILE_FORMAT && p.device == device && p.block_bytes == block && DEPTHS.contains(&(p.depth as usize))).then_some(p)
}

/// [`ensure`] under the cache directory `cache`.
pub fn ensure_in(cache: &Path, file: &Path, block: u64) -> Result<DeviceProfile> {
    if let Some(p) = cached_in(cache, file, block) {
        return Ok(p);
    }
    let path = cache_file(cache, &DeviceId::of(file)?, block)?;
    let dir = path.parent().expect("a cache directory");
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let lock = std::fs::File::create(dir.join(".lock")).with_context(|| format!("{}: cannot lock", dir.display()))?;
    let _held =
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).context("locking the device profiles")?;
    if let Some(p) = cached_in(cache, file, block) {
        return Ok(p);
    }
    let p = measure(file, block)?;
    let tmp = path.with_file_name(format!(".{}.{}.tmp", path.file_name().expect("a name").to_string_lossy(), std::process::id()));
    crate::util::write_new_durable(&tmp, serde_json::to_string_pretty(&p)?.as_bytes())?;
    std::fs::rename(&tmp, &path).with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_device_is_profiled_once_per_block_and_its_depth_is_the_least_within_reach_of_its_best() {
        let cache = tempfile::tempdir().unwrap();
        let mut f = tempfile::NamedTempFile::new_in(std::env::current_dir().unwrap()).unwrap();
        let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for _ in 0..(MIN_FILE_BYTES >> 20) + 2 {
            f.write_all(&chunk).unwrap();
        }
        f.as_file().sync_all().unwrap();
        assert!(profiled(f.path()));
        let p = ensure_in(cache.path(), f.path(), 1 << 20).unwrap();
        assert_eq!(p.format, PROFILE_FORMAT);
        assert_eq!(p.device, DeviceId::of(f.path()).unwrap());
        let order: Vec<usize> = p.cells.iter().map(|c| c.depth).collect();
        assert_eq!(order, [1, 2, 4, 8, 16, 32, 32, 16, 8, 4, 2, 1], "each depth twice, ascending then descending");
        assert!(p.cells.iter().all(|c| c.block_bytes == 1 << 20 && c.bytes >= BYTES_PER_CELL / 2 && c.mib_per_s > 0.0));
        let best = p.mib_per_s.iter().map(|&(_, r)| r).fold(0.0, f64::max);
        let rate = |d: u32| p.mib_per_s.iter().find(|&&(x, _)| x == d).unwrap().1;
        assert!(rate(p.depth) >= WITHIN * best);
        assert!(p.mib_per_s.iter().filter(|&&(d, _)| d < p.depth).all(|&(_, r)| r < WITHIN * best), "{:?}", p.mib_per_s);
        // Measured once: the second call reads the cache.
        assert_eq!(ensure_in(cache.path(), f.path(), 1 << 20).unwrap(), p);
        // Another block is another profile; a cache file that does not parse is none.
        assert!(cached_in(cache.path(), f.path(), 512 << 10).is_none());
        let file = cache_file(cache.path(), &p.device, 1 << 20).unwrap();
        std::fs::write(&file, "{").unwrap();
        assert!(cached_in(cache.path(), f.path(), 1 << 20).is_none());
        // A small file does not profile its device.
        let small = tempfile::NamedTempFile::new_in(std::env::current_dir().unwrap()).unwrap();
        assert!(!profiled(small.path()));
    }

    #[test]
    fn the_profile_block_is_the_median_extent_to_a_power_of_two_within_bounds() {
        let inv = |lens: &[u64]| lens.to_vec();
        assert_eq!(block_of_extents(inv(&[3 << 20, 1 << 20, 1 << 20])), 1 << 20);
        assert_eq!(block_of_extents(inv(&[700 << 10, 900 << 10, 800 << 10])), 1 << 20);
        assert_eq!(block_of_extents(inv(&[4096])), 64 << 10);
        assert_eq!(block_of_extents(inv(&[64 << 20])), 4 << 20);
        assert!(measure(Path::new("/nonexistent"), 3 << 20).is_err(), "not a power of two");
    }
}
