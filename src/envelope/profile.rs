//! A device's read profile: F's request size read at each depth, reads landing as F's do,
//! measured once per device, block size and read shape and cached beside the digest manifests. F's default
//! depth is the least depth the device serves within [`WITHIN`] of its best, so a device that
//! needs a deeper queue gets one and a device that does not is not crowded. The profile reads
//! as F's decode does ([`ReadShape`]): an expert's neighbouring extents as one vectored read, a
//! layer's selected experts in one burst drained before the next (the router picks the next
//! layer's only then). A depth is rated by how soon a burst's reads land on average, not by
//! when the last does: the Plan verifies, and the engine computes, the first while the rest are
//! read. On a disk whose rate is its bandwidth whatever the depth, a shallow queue lands a
//! burst's reads one after the other; with every read in flight at once they all land at the
//! end, and both wait. Each depth is read in [`ROUNDS`] interleaved rounds and rated by its
//! median against the best depth in the same round: a virtual disk's rate drifts by a quarter
//! from one moment to the next, and a depth read at a slow moment must not decide the default.

use super::{measure_cells, Cell, Pattern, Shape, ALIGN};
use crate::inventory::Inventory;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const PROFILE_FORMAT: &str = "sovereign.device_profile/2";
/// Depths a profile reads at.
pub const DEPTHS: &[usize] = &[1, 2, 4, 8, 16, 32];
/// Rounds over every depth, ascending and descending in turn, so a drift over the measurement
/// weighs on every depth alike, and a depth's median leaves out slow or fast moments.
pub const ROUNDS: usize = 5;
/// Bytes each depth reads per round (64 MiB cells read once ascending and once descending, 35
/// ms each, differed by a quarter on a virtual disk: the default depth moved between 4 and 32
/// from one profile to the next).
pub const BYTES_PER_CELL: u64 = 128 << 20;
/// A depth within this share of the best serves as well as the best.
pub const WITHIN: f64 = 0.95;
/// Model files smaller than this are not profiled (their depth stays the manifest's): their
/// reads are few and a profile would mostly reread them.
pub const MIN_FILE_BYTES: u64 = 64 << 20;

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
    pub shape: ReadShape,
    pub landing_bytes: u64,
    /// Each depth's [`ROUNDS`] cells, in the order read.
    pub cells: Vec<Cell>,
    /// Each depth's median rate over its rounds (MiB/s), in [`DEPTHS`] order.
    pub mib_per_s: Vec<(u32, f64)>,
    /// Each depth's median over its rounds of how soon a read lands after its burst goes out,
    /// on average (ms), in [`DEPTHS`] order.
    pub landing_ms: Vec<(u32, f64)>,
    /// Each depth's median share of the best depth's landing speed (the inverse of its
    /// landing time) in the same round, in [`DEPTHS`] order.
    pub share_of_best: Vec<(u32, f64)>,
    /// The least depth whose share is within [`WITHIN`].
    pub depth: u32,
    pub measured_unix_s: u64,
}

/// F's read size for a model: its median expert extent, to a power of two from 64 KiB to 4 MiB.
pub fn block_of(inv: &Inventory) -> u64 {
    block_of_extents(inv.objects.iter().flat_map(|o| o.extents.iter().map(|(_, e)| e.len)).collect())
}

/// How F reads one decode layer of a model: `burst` reads, each of `vector` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadShape {
    /// Reads a layer sends at once, drained before the next layer's.
    pub burst: u32,
    /// Blocks per read: an expert's extents where they lie side by side in the file (F joins
    /// them into one vectored read), else one.
    pub vector: u32,
}

/// The longest burst a profile reads (a model selecting more experts than this is read in
/// bursts of this many reads).
pub const MAX_BURST: u32 = 1024;
/// The most bytes a profile's burst reads (a longer layer is read in bursts of this), so that a
/// profile stays a few GiB of reads whatever the model.
pub const MAX_BURST_BYTES: u64 = 128 << 20;

/// F's decode layer of `inv`: the experts a token selects, each one read of its extents where
/// most experts' extents are neighbours, else one read per extent.
pub fn shape_of(inv: &Inventory) -> ReadShape {
    let objects: Vec<Vec<(u64, u64)>> = inv.objects.iter().map(|o| o.extents.iter().map(|(_, e)| (e.offset, e.len)).collect()).collect();
    shape_of_objects(inv.n_used(), &objects)
}

fn shape_of_objects(n_used: Option<u32>, objects: &[Vec<(u64, u64)>]) -> ReadShape {
    let mut per_object: Vec<usize> = objects.iter().map(Vec::len).collect();
    per_object.sort_unstable();
    let extents = per_object.get(per_object.len() / 2).copied().unwrap_or(1).clamp(1, MAX_VECTOR as usize) as u32;
    // Neighbours as F's source joins them: each starts where the one before ends, or within the
    // page the two share.
    let joined = |o: &Vec<(u64, u64)>| {
        let mut o = o.clone();
        o.sort_unstable();
        o.windows(2).all(|w| w[1].0 >= w[0].0 + w[0].1 && w[1].0 - (w[0].0 + w[0].1) < ALIGN as u64)
    };
    let vector = if extents > 1 && objects.iter().filter(|o| joined(o)).count() * 2 > objects.len() { extents } else { 1 };
    let experts = n_used.unwrap_or(1).max(1);
    let burst = if vector > 1 { experts } else { experts.saturating_mul(extents) };
    ReadShape { burst: burst.min(MAX_BURST), vector }
}

/// The most blocks a profile's vectored read carries.
pub const MAX_VECTOR: u32 = 16;

fn block_of_extents(mut lens: Vec<u64>) -> u64 {
    lens.sort_unstable();
    let median = lens.get(lens.len() / 2).copied().unwrap_or(1 << 20);
    median.next_power_of_two().clamp(64 << 10, 4 << 20)
}

/// Reads `file` (on the device being profiled) at every depth, [`ROUNDS`] times, in
/// `block`-sized blocks read as `shape` says.
pub fn measure(file: &Path, block: u64, shape: ReadShape) -> Result<DeviceProfile> {
    measure_with(file, block, shape, BYTES_PER_CELL)
}

fn measure_with(file: &Path, block: u64, shape: ReadShape, bytes_per_cell: u64) -> Result<DeviceProfile> {
    if !(ALIGN as u64..=4 << 20).contains(&block) || !block.is_power_of_two() {
        bail!("a profile's block of {block} bytes: expected a power of two from 4 KiB to 4 MiB");
    }
    if !(1..=MAX_BURST).contains(&shape.burst) || !(1..=MAX_VECTOR).contains(&shape.vector) {
        bail!("a profile's bursts of {} reads of {} blocks: expected 1 to {MAX_BURST} of 1 to {MAX_VECTOR}", shape.burst, shape.vector);
    }
    let device = DeviceId::of(file)?;
    let pattern = if shape.vector > 1 { Pattern::Vectored } else { Pattern::Plain };
    let burst = burst_reads(block, shape);
    let reads = Shape { depth: 1, pattern, vector: shape.vector as usize, burst_reads: burst as usize };
    // A cell holds whole bursts, at least two.
    let burst_bytes = block * u64::from(shape.vector) * burst;
    let bytes_per_cell = bytes_per_cell.max(2 * burst_bytes) / burst_bytes * burst_bytes;
    let (cells, landing_bytes) = measure_cells(file, bytes_per_cell, block as usize, &round_order(), reads)?;
    let mib_per_s = medians(&cells, |c| c.mib_per_s);
    let landing_ms = medians(&cells, |c| c.landing_s.unwrap_or(f64::INFINITY) * 1e3);
    let share_of_best = median_shares(&cells, |c| 1.0 / c.landing_s.unwrap_or(f64::INFINITY));
    let depth = least_within(&share_of_best);
    let measured_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(DeviceProfile {
        format: PROFILE_FORMAT.into(),
        device,
        block_bytes: block,
        shape,
        landing_bytes,
        cells,
        mib_per_s,
        landing_ms,
        share_of_best,
        depth,
        measured_unix_s,
    })
}

/// Reads a profile's burst holds: the shape's, within [`MAX_BURST_BYTES`] (one at least).
fn burst_reads(block: u64, shape: ReadShape) -> u64 {
    u64::from(shape.burst).min((MAX_BURST_BYTES / (block * u64::from(shape.vector))).max(1))
}

/// Every depth once a round, ascending in even rounds and descending in odd ones.
fn round_order() -> Vec<usize> {
    (0..ROUNDS).flat_map(|r| if r % 2 == 0 { DEPTHS.to_vec() } else { DEPTHS.iter().rev().copied().collect() }).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each depth's median of `value` over its cells, in [`DEPTHS`] order.
fn medians(cells: &[Cell], value: impl Fn(&Cell) -> f64) -> Vec<(u32, f64)> {
    DEPTHS.iter().map(|&d| (d as u32, median(cells.iter().filter(|c| c.depth == d).map(&value).collect()))).collect()
}

/// Each depth's median share of the best depth's `rate` (the best median, higher is better) in
/// the same round (a round: one cell of every depth, read one after the other, so a drift
/// between rounds cancels). Not a share of each round's best cell: where depths serve alike,
/// the best of six is a lucky moment, and every depth would fall short of it.
fn median_shares(cells: &[Cell], rate: impl Fn(&Cell) -> f64) -> Vec<(u32, f64)> {
    let rates = medians(cells, &rate);
    let best = rates.iter().fold(rates[0], |b, &r| if r.1 > b.1 { r } else { b }).0 as usize;
    let rounds: Vec<&[Cell]> = cells.chunks(DEPTHS.len()).collect();
    let share = |round: &[Cell], d: usize| {
        let at = |d: usize| round.iter().find(|c| c.depth == d).map(&rate);
        Some(at(d)? / at(best)?.max(f64::MIN_POSITIVE))
    };
    DEPTHS.iter().map(|&d| (d as u32, median(rounds.iter().filter_map(|r| share(r, d)).collect()))).collect()
}

/// The least depth whose share of the best is within [`WITHIN`].
fn least_within(shares: &[(u32, f64)]) -> u32 {
    shares.iter().find(|&&(_, s)| s >= WITHIN).map_or(1, |&(d, _)| d)
}

/// Whether `file` is large enough to profile its device by ([`MIN_FILE_BYTES`]).
pub fn profiled(file: &Path) -> bool {
    std::fs::metadata(file).is_ok_and(|m| m.len() >= MIN_FILE_BYTES)
}

fn cache_file(cache: &Path, device: &DeviceId, block: u64, shape: ReadShape) -> Result<PathBuf> {
    let key = serde_json::to_string(&(device, block, shape))?;
    let name = crate::util::sha256(key.as_bytes());
    Ok(cache.join("devices").join(format!("{}.json", &name[..32])))
}

/// The cached profile of the device `file` lies on at `block` and `shape`, if one was measured;
/// a cache file that does not parse, is of another format, or names another device, block or
/// shape, is not one.
pub fn cached(file: &Path, block: u64, shape: ReadShape) -> Option<DeviceProfile> {
    cached_in(&crate::digests::cache_dir().ok()?, file, block, shape)
}

/// The cached profile, or one measured now and cached (one process measures a device at a
/// time: others wait for it, then read its profile).
pub fn ensure(file: &Path, block: u64, shape: ReadShape) -> Result<DeviceProfile> {
    ensure_in(&crate::digests::cache_dir()?, file, block, shape)
}

/// [`cached`] under the cache directory `cache`.
pub fn cached_in(cache: &Path, file: &Path, block: u64, shape: ReadShape) -> Option<DeviceProfile> {
    let device = DeviceId::of(file).ok()?;
    let path = cache_file(cache, &device, block, shape).ok()?;
    let text = crate::bounds::read_text("a device profile", &path, 1 << 20).ok()?;
    let p: DeviceProfile = serde_json::from_str(&text).ok()?;
    let ours = p.format == PROFILE_FORMAT && p.device == device && p.block_bytes == block && p.shape == shape;
    (ours && DEPTHS.contains(&(p.depth as usize))).then_some(p)
}

/// [`ensure`] under the cache directory `cache`.
pub fn ensure_in(cache: &Path, file: &Path, block: u64, shape: ReadShape) -> Result<DeviceProfile> {
    ensure_with(cache, file, block, shape, BYTES_PER_CELL)
}

fn ensure_with(cache: &Path, file: &Path, block: u64, shape: ReadShape, bytes_per_cell: u64) -> Result<DeviceProfile> {
    if let Some(p) = cached_in(cache, file, block, shape) {
        return Ok(p);
    }
    let path = cache_file(cache, &DeviceId::of(file)?, block, shape)?;
    let dir = path.parent().expect("a cache directory");
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let lock = std::fs::File::create(dir.join(".lock")).with_context(|| format!("{}: cannot lock", dir.display()))?;
    let _held =
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).context("locking the device profiles")?;
    if let Some(p) = cached_in(cache, file, block, shape) {
        return Ok(p);
    }
    let p = measure_with(file, block, shape, bytes_per_cell)?;
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
        // Cells smaller than a real profile's, so that the test reads ~300 MiB, not 3.75 GiB:
        // bursts of 8 reads of 3 blocks (a merged expert's gate, up and down).
        let cell = 10 << 20;
        let shape = ReadShape { burst: 8, vector: 3 };
        let p = ensure_with(cache.path(), f.path(), 1 << 20, shape, cell).unwrap();
        assert_eq!(p.format, PROFILE_FORMAT);
        assert_eq!(p.device, DeviceId::of(f.path()).unwrap());
        let order: Vec<usize> = p.cells.iter().map(|c| c.depth).collect();
        let up = [1, 2, 4, 8, 16, 32];
        let down = [32, 16, 8, 4, 2, 1];
        assert_eq!(order, [up, down, up, down, up].concat(), "each depth once a round, ascending and descending in turn");
        // Whole bursts of 24 MiB: the cell of 10 MiB asked for grows to two.
        let want = (p.shape, 48 << 20, 8, 3, Pattern::Vectored);
        assert!(p.cells.iter().all(|c| (p.shape, c.bytes, c.burst_reads, c.vector, c.pattern) == want && c.mib_per_s > 0.0), "{p:?}");
        // Each depth's rate and landing time are its middle round's; its share, the middle of
        // its rounds' shares of the landing speed of the depth that lands soonest.
        let middle = |d: u32, of: fn(&Cell) -> f64| {
            let mut v: Vec<f64> = p.cells.iter().filter(|c| c.depth == d as usize).map(of).collect();
            v.sort_by(f64::total_cmp);
            v[2]
        };
        let landing = |c: &Cell| c.landing_s.expect("a burst cell's landing time");
        let best = p.landing_ms.iter().fold(p.landing_ms[0], |b, &r| if r.1 < b.1 { r } else { b }).0 as usize;
        for ((&(d, r), &(_, ms)), &(_, share)) in p.mib_per_s.iter().zip(&p.landing_ms).zip(&p.share_of_best) {
            assert_eq!(r, middle(d, |c| c.mib_per_s), "depth {d}");
            assert_eq!(ms, middle(d, |c| c.landing_s.unwrap() * 1e3), "depth {d}");
            let at = |round: &[Cell], d: usize| 1.0 / landing(round.iter().find(|c| c.depth == d).unwrap());
            let mut shares: Vec<f64> = p.cells.chunks(6).map(|round| at(round, d as usize) / at(round, best)).collect();
            shares.sort_by(f64::total_cmp);
            assert_eq!(share, shares[2], "depth {d}");
        }
        let share = |d: u32| p.share_of_best.iter().find(|&&(x, _)| x == d).unwrap().1;
        assert!(share(p.depth) >= WITHIN);
        assert!(p.share_of_best.iter().filter(|&&(d, _)| d < p.depth).all(|&(_, s)| s < WITHIN), "{:?}", p.share_of_best);
        // Measured once: the second call reads the cache.
        assert_eq!(ensure_in(cache.path(), f.path(), 1 << 20, shape).unwrap(), p);
        // Another block or shape is another profile; a cache file that does not parse is none,
        // nor is one of an earlier format.
        assert!(cached_in(cache.path(), f.path(), 512 << 10, shape).is_none());
        assert!(cached_in(cache.path(), f.path(), 1 << 20, ReadShape { burst: 24, vector: 1 }).is_none());
        let file = cache_file(cache.path(), &p.device, 1 << 20, shape).unwrap();
        let older = serde_json::to_string(&DeviceProfile { format: "sovereign.device_profile/1".into(), ..p.clone() }).unwrap();
        std::fs::write(&file, older).unwrap();
        assert!(cached_in(cache.path(), f.path(), 1 << 20, shape).is_none());
        std::fs::write(&file, "{").unwrap();
        assert!(cached_in(cache.path(), f.path(), 1 << 20, shape).is_none());
        // A small file does not profile its device.
        let small = tempfile::NamedTempFile::new_in(std::env::current_dir().unwrap()).unwrap();
        assert!(!profiled(small.path()));
    }

    #[test]
    fn a_slow_moment_does_not_move_the_depth() {
        let cell = |depth: usize, mib_per_s: f64| Cell {
            block_bytes: 1 << 20,
            depth,
            pattern: Pattern::Plain,
            bytes: 1 << 27,
            seconds: 128.0 / mib_per_s,
            mib_per_s,
            iops: 0.0,
            reread: false,
            burst_reads: 24,
            vector: 0,
            landing_s: None,
        };
        // Every depth from 4 up serves 1,000 MiB/s at a steady moment; depths 1 and 2, 700.
        // The device slows to half in round 1 and runs 30 % fast through round 3; depth 4 is
        // read at a slow moment in round 0, depth 2 at a fast one in round 4.
        let mut cells = Vec::new();
        for (i, &d) in round_order().iter().enumerate() {
            let round = i / DEPTHS.len();
            let moment = [1.0, 0.5, 1.0, 1.3, 1.0][round];
            let rate = match (d, round) {
                (4, 0) => 600.0,
                (2, 4) => 1000.0,
                (1 | 2, _) => 700.0,
                _ => 1000.0,
            };
            cells.push(cell(d, rate * moment));
        }
        let shares = median_shares(&cells, |c| c.mib_per_s);
        assert_eq!(shares, [(1, 0.7), (2, 0.7), (4, 1.0), (8, 1.0), (16, 1.0), (32, 1.0)]);
        assert_eq!(least_within(&shares), 4);
        assert_eq!(medians(&cells, |c| c.mib_per_s)[2], (4, 1000.0));
        // Where every depth serves alike and each cell lies a few percent off at random, each
        // round's best cell is a lucky moment: shares of it would put depths 1 and 2 short of
        // 95 % (0.943 and 0.924 here) and choose 4; shares of the best depth choose 1.
        let jitter = [
            1.0, 0.97, 1.03, 0.94, 1.06, 0.99, 1.02, 0.96, 1.04, 0.98, 1.01, 0.95, 1.05, 0.97, 1.0, 1.03, 0.96, 1.02, 0.98, 1.04, 0.95,
            1.0, 1.03, 0.97, 1.01, 0.96, 1.05, 0.99, 0.94, 1.02,
        ];
        let flat: Vec<Cell> = round_order().iter().zip(jitter).map(|(&d, j)| cell(d, 1000.0 * j)).collect();
        let shares = median_shares(&flat, |c| c.mib_per_s);
        assert_eq!(least_within(&shares), 1, "{shares:?}");
        // Depths that read alike but land differently: one read at a time waits on each read's
        // latency; with a whole burst in flight, its reads land together at its end.
        let landed = |d: usize, ms: f64| Cell { landing_s: Some(ms / 1e3), ..cell(d, 1000.0) };
        let cells: Vec<Cell> = round_order()
            .iter()
            .map(|&d| {
                landed(
                    d,
                    if d == 1 {
                        9.0
                    } else if d <= 4 {
                        7.0
                    } else {
                        12.0
                    },
                )
            })
            .collect();
        let shares = median_shares(&cells, |c| 1.0 / c.landing_s.unwrap());
        assert_eq!(least_within(&shares), 2, "{shares:?}");
        // An even count takes the mean of the middle two.
        assert_eq!(median(vec![100.0, 300.0]), 200.0);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn f_reads_a_layer_as_one_read_per_expert_where_its_extents_are_neighbours() {
        let mib = 1u64 << 20;
        // Merged: gate, up and down side by side; then with a shared page between them.
        let merged: Vec<Vec<(u64, u64)>> = (0..4).map(|e| (0..3).map(|k| ((3 * e + k) * mib, mib)).collect()).collect();
        assert_eq!(shape_of_objects(Some(8), &merged), ReadShape { burst: 8, vector: 3 });
        let shared: Vec<Vec<(u64, u64)>> = (0..4).map(|e| (0..3).map(|k| (e * 4 * mib + k * (mib + 32), mib + 32)).collect()).collect();
        assert_eq!(shape_of_objects(Some(8), &shared), ReadShape { burst: 8, vector: 3 });
        // Per-tensor layout (each role its own tensor): one read per extent.
        let tensors: Vec<Vec<(u64, u64)>> = (0..4).map(|e| (0..3).map(|k| (k * 64 * mib + e * mib, mib)).collect()).collect();
        assert_eq!(shape_of_objects(Some(8), &tensors), ReadShape { burst: 24, vector: 1 });
        // A fused gate_up beside its down; a model that names no count; bounds.
        let fused: Vec<Vec<(u64, u64)>> = (0..4).map(|e| vec![(e * 3 * mib, 2 * mib), (e * 3 * mib + 2 * mib, mib)]).collect();
        assert_eq!(shape_of_objects(Some(4), &fused), ReadShape { burst: 4, vector: 2 });
        assert_eq!(shape_of_objects(None, &[]), ReadShape { burst: 1, vector: 1 });
        assert_eq!(shape_of_objects(Some(u32::MAX), &tensors).burst, MAX_BURST);
        assert!(measure(Path::new("/nonexistent"), 1 << 20, ReadShape { burst: 0, vector: 1 }).is_err(), "no burst");
        // A layer longer than MAX_BURST_BYTES is read in bursts of that.
        assert_eq!(burst_reads(1 << 20, ReadShape { burst: 24, vector: 1 }), 24);
        assert_eq!(burst_reads(1 << 20, ReadShape { burst: MAX_BURST, vector: 1 }), 128);
        assert_eq!(burst_reads(4 << 20, ReadShape { burst: 8, vector: 16 }), 2);
        assert_eq!(burst_reads(4 << 20, ReadShape { burst: 8, vector: 64 }), 1);
        assert!(measure(Path::new("/nonexistent"), 1 << 20, ReadShape { burst: 1, vector: MAX_VECTOR + 1 }).is_err());
    }

    #[test]
    fn the_profile_block_is_the_median_extent_to_a_power_of_two_within_bounds() {
        let inv = |lens: &[u64]| lens.to_vec();
        assert_eq!(block_of_extents(inv(&[3 << 20, 1 << 20, 1 << 20])), 1 << 20);
        assert_eq!(block_of_extents(inv(&[700 << 10, 900 << 10, 800 << 10])), 1 << 20);
        assert_eq!(block_of_extents(inv(&[4096])), 64 << 10);
        assert_eq!(block_of_extents(inv(&[64 << 20])), 4 << 20);
        assert!(measure(Path::new("/nonexistent"), 3 << 20, ReadShape { burst: 8, vector: 1 }).is_err(), "not a power of two");
    }
}
