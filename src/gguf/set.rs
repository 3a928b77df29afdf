//! Shard sets: one model in several GGUF files, as `gguf-split` and the converters'
//! `--split-max-size` write them. Each shard is a complete GGUF (header, metadata, tensor
//! directory, data); the first carries the model's metadata, and every shard carries
//! `split.no`, `split.count` and `split.tensors.count`. llama.cpp finds the others from the
//! first by name, `<prefix>-NNNNN-of-NNNNN.gguf`; so do we.

use super::reader::ShardHead;
use super::{Gguf, GgufWriter, TensorSpec, Value, DEFAULT_ALIGNMENT};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// `prefix-NNNNN-of-NNNNN.gguf` for shard `no` (from 0) of `count`, as `llama_split_path`.
pub fn shard_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{:05}-of-{:05}.gguf", no + 1, count));
    PathBuf::from(s)
}

/// The prefix of a shard's name, where it names shard `no` (from 0) of `count`, as
/// `llama_split_prefix` parses it.
fn prefix_of(path: &Path, no: u32, count: u32) -> Option<PathBuf> {
    let s = path.as_os_str().to_str()?;
    let tail = format!("-{:05}-of-{:05}.gguf", no + 1, count);
    s.strip_suffix(&tail).filter(|p| !p.is_empty()).map(PathBuf::from)
}

/// (`split.no`, `split.count`) of a file, where it names them.
fn split_keys(g: &Gguf) -> Result<Option<(u32, u32)>> {
    let get = |k: &str| -> Result<Option<u64>> {
        match g.get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| anyhow!("{k} is not an unsigned integer")),
        }
    };
    match (get(SPLIT_NO)?, get(SPLIT_COUNT)?) {
        (None, None) => Ok(None),
        (Some(no), Some(count)) => {
            if count == 0 || count > crate::bounds::MAX_SHARDS {
                bail!("{SPLIT_COUNT} is {count}: a set has 1 to {} files", crate::bounds::MAX_SHARDS);
            }
            if no >= count {
                bail!("{SPLIT_NO} is {no}, but the set has {count} files ({SPLIT_COUNT})");
            }
            Ok(Some((no as u32, count as u32)))
        }
        (Some(_), None) => bail!("{SPLIT_NO} without {SPLIT_COUNT}"),
        (None, Some(_)) => bail!("{SPLIT_COUNT} without {SPLIT_NO}"),
    }
}

/// The first file of the model `path` belongs to: `path` itself, or its set's first shard.
/// Reads only `path`'s header.
pub fn first_shard(path: &Path) -> Result<PathBuf> {
    let g = Gguf::open(path)?;
    match split_keys(&g).with_context(|| path.display().to_string())? {
        Some((no, count)) if count > 1 && no > 0 => {
            let prefix = prefix_of(path, no, count).ok_or_else(|| misnamed(path, no, count))?;
            Ok(shard_path(&prefix, 0, count))
        }
        _ => Ok(path.to_path_buf()),
    }
}

/// The files of the model `path` names, in set order: `path` alone, or every shard of its set.
pub fn files(path: &Path) -> Result<Vec<PathBuf>> {
    Ok(Gguf::open_model(path)?.shards.into_iter().map(|s| s.path).collect())
}

fn misnamed(path: &Path, no: u32, count: u32) -> anyhow::Error {
    anyhow!(
        "{}: shard {} of {count} ({SPLIT_NO}, {SPLIT_COUNT}), but its name does not end in -{:05}-of-{:05}.gguf, by which llama.cpp finds the other shards",
        path.display(),
        no + 1,
        no + 1,
        count
    )
}

impl Gguf {
    /// A model given by any of its files: the file alone, or the whole set it is a shard of,
    /// as one `Gguf` (the first shard's metadata, every shard's tensors, each keeping its
    /// shard). A set missing a shard, shards of different sets, a truncated shard or a tensor
    /// in two shards is refused with one line naming the shard.
    pub fn open_model(path: &Path) -> Result<Gguf> {
        let given = Gguf::open(path)?;
        let Some((no, count)) = split_keys(&given).with_context(|| path.display().to_string())? else {
            return Ok(given);
        };
        if count == 1 {
            return Ok(given);
        }
        let prefix = prefix_of(path, no, count).ok_or_else(|| misnamed(path, no, count))?;
        let mut given = Some(given);
        let mut shards = Vec::with_capacity(count as usize);
        for i in 0..count {
            let p = shard_path(&prefix, i, count);
            let g = if i == no {
                given.take().expect("the given shard is taken once")
            } else {
                match std::fs::symlink_metadata(&p) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        bail!("{}: shard {} of {count} is missing (the set of {})", p.display(), i + 1, path.display())
                    }
                    _ => Gguf::open(&p)?,
                }
            };
            match split_keys(&g).with_context(|| p.display().to_string())? {
                Some((n, c)) if n == i && c == count => {}
                Some((n, c)) => {
                    bail!("{}: names itself shard {} of {c}, not shard {} of {count}: it belongs to another set", p.display(), n + 1, i + 1)
                }
                None => bail!("{}: has no {SPLIT_NO}/{SPLIT_COUNT}: not a shard of the set of {}", p.display(), path.display()),
            }
            shards.push(g);
        }
        merge(shards)
    }
}

/// One `Gguf` of a set's shards, checked against each other.
fn merge(shards: Vec<Gguf>) -> Result<Gguf> {
    let count = shards.len();
    let first = &shards[0];
    let tensors_count = |g: &Gguf| -> Result<u64> {
        g.get(SPLIT_TENSORS_COUNT)
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("{}: no {SPLIT_TENSORS_COUNT} as an integer, which a set's first shard carries", g.path.display()))
    };
    let want = tensors_count(first)?;
    let arch = first.get("general.architecture").and_then(Value::as_str);
    let mut owner: HashMap<&str, usize> = HashMap::new();
    let mut total = 0u64;
    for (i, g) in shards.iter().enumerate() {
        // llama.cpp reads the count from the first shard only; another shard's, where stated,
        // must agree with it.
        let n = if i == 0 || g.get(SPLIT_TENSORS_COUNT).is_some() { tensors_count(g)? } else { want };
        if n != want {
            bail!(
                "{}: {SPLIT_TENSORS_COUNT} is {n}, shard 1 ({}) says {want}: shards of different sets",
                g.path.display(),
                first.path.display()
            );
        }
        if let Some(a) = g.get("general.architecture").and_then(Value::as_str).filter(|a| Some(*a) != arch) {
            bail!(
                "{}: general.architecture is `{a}`, shard 1 ({}) says `{}`: shards of different models",
                g.path.display(),
                first.path.display(),
                arch.unwrap_or("none")
            );
        }
        for t in &g.tensors {
            if let Some(j) = owner.insert(t.name.as_str(), i) {
                bail!("{}: tensor `{}` is also in shard {} ({})", g.path.display(), t.name, j + 1, shards[j].path.display());
            }
        }
        total += g.tensors.len() as u64;
    }
    if total != want {
        bail!("{}: {SPLIT_TENSORS_COUNT} is {want}, but the {count} shards hold {total} tensors", first.path.display());
    }
    let mut heads = Vec::with_capacity(count);
    let mut tensors = Vec::with_capacity(total as usize);
    let mut file_len = 0u64;
    for (i, g) in shards.iter().enumerate() {
        heads.push(ShardHead {
            path: g.path.clone(),
            file_len: g.file_len,
            data_offset: g.data_offset,
            alignment: g.alignment,
            tensors: g.tensors.len(),
        });
        file_len += g.file_len;
        tensors.extend(g.tensors.iter().cloned().map(|mut t| {
            t.shard = i as u32;
            t
        }));
    }
    let mut shards = shards;
    let first = shards.swap_remove(0);
    Ok(Gguf { tensors, shards: heads, file_len, ..first })
}

/// How a model is cut into shards, as gguf-split's `--split-max-tensors` and
/// `--split-max-size` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitBy {
    /// At most this many tensors per shard.
    Tensors(u64),
    /// A new shard before a tensor that would take the current one's tensor data (each tensor
    /// padded to 32 bytes) past this many bytes; a tensor larger than that has a shard alone.
    Bytes(u64),
}

/// The tensors of each shard, in order, for tensors of `sizes` bytes.
pub fn partition(sizes: &[u64], by: SplitBy) -> Result<Vec<std::ops::Range<usize>>> {
    match by {
        SplitBy::Tensors(0) | SplitBy::Bytes(0) => bail!("a shard holds at least one tensor: the limit must be positive"),
        _ => {}
    }
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0usize, 0u64);
    for (i, &n) in sizes.iter().enumerate() {
        let padded = n.div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        let cut = i > start
            && match by {
                SplitBy::Tensors(max) => (i - start) as u64 >= max,
                SplitBy::Bytes(max) => bytes + padded > max,
            };
        if cut {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += padded;
    }
    if start < sizes.len() || out.is_empty() {
        out.push(start..sizes.len());
    }
    if out.len() as u64 > crate::bounds::MAX_SHARDS {
        bail!("{} shards: a set has at most {}", out.len(), crate::bounds::MAX_SHARDS);
    }
    Ok(out)
}

/// The SHA-256 that names a model: the file's own, or for a set of several files the SHA-256
/// of `sovereign.shard-set/1` and each shard's SHA-256, in order, one per line.
pub fn set_sha256(shards: &[String]) -> String {
    match shards {
        [one] => one.clone(),
        _ => {
            let mut s = String::from("sovereign.shard-set/1\n");
            for h in shards {
                s.push_str(h);
                s.push('\n');
            }
            crate::util::sha256(s.as_bytes())
        }
    }
}

/// What writing a set produced: each shard's path and SHA-256, in order.
pub struct Written {
    pub shards: Vec<(PathBuf, String)>,
}

impl Written {
    pub fn sha256(&self) -> String {
        set_sha256(&self.shards.iter().map(|(_, h)| h.clone()).collect::<Vec<_>>())
    }
}

impl GgufWriter {
    /// Writes the model as a shard set `prefix-NNNNN-of-NNNNN.gguf`: the first shard carries
    /// every metadata pair, each shard its split keys (and the alignment, where it is not
    /// GGUF's default, so tensors keep theirs). `fill` is as in [`GgufWriter::write`], with
    /// the tensor's index in the whole model. A single shard is still written as a set of one.
    pub fn write_split(&self, prefix: &Path, by: SplitBy, mut fill: impl FnMut(usize, &TensorSpec, &mut [u8])) -> Result<Written> {
        let sizes: Vec<u64> = self.tensors.iter().map(TensorSpec::bytes).collect();
        let parts = partition(&sizes, by)?;
        let count = parts.len() as u32;
        let n_tensors = i32::try_from(self.tensors.len()).map_err(|_| anyhow!("{} tensors: more than a set names", self.tensors.len()))?;
        let alignment = self.metadata.iter().find(|(k, _)| k == "general.alignment").map(|(_, v)| v.clone());
        let mut shards = Vec::with_capacity(parts.len());
        for (i, range) in parts.into_iter().enumerate() {
            let mut w = GgufWriter::default();
            if i == 0 {
                w.metadata.extend(self.metadata.iter().filter(|(k, _)| !k.starts_with("split.")).cloned());
            } else if let Some(a) = &alignment {
                w.kv("general.alignment", a.clone());
            }
            w.kv(SPLIT_NO, Value::U16(i as u16)).kv(SPLIT_COUNT, Value::U16(count as u16)).kv(SPLIT_TENSORS_COUNT, Value::I32(n_tensors));
            w.tensors.extend(self.tensors[range.clone()].iter().cloned());
            let path = shard_path(prefix, i as u32, count);
            let sha = w.write(&path, |j, t, buf| fill(range.start + j, t, buf))?;
            shards.push((path, sha));
        }
        Ok(Written { shards })
    }
}

/// Rewrites the model `input` (one file, or any file of a set) as the shard set
/// `prefix-NNNNN-of-NNNNN.gguf`: the same metadata (less any split keys) and tensors, in order,
/// byte for byte. Refuses to replace an existing file.
pub fn split_model(input: &Path, prefix: &Path, by: SplitBy) -> Result<Written> {
    use std::os::unix::fs::FileExt;
    let g = Gguf::open_model(input)?;
    let mut w = GgufWriter::default();
    w.metadata.extend(g.metadata.iter().filter(|(k, _)| !k.starts_with("split.")).map(|(k, v)| (k.clone(), v.clone())));
    w.tensors.extend(g.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), ggml_type: t.ggml_type, dims: t.dims.clone() }));
    let parts = partition(&w.tensors.iter().map(TensorSpec::bytes).collect::<Vec<_>>(), by)?;
    for i in 0..parts.len() as u32 {
        let p = shard_path(prefix, i, parts.len() as u32);
        if p.symlink_metadata().is_ok() {
            bail!("{}: exists; split never overwrites (remove it first)", p.display());
        }
    }
    let files = g
        .shards
        .iter()
        .map(|s| std::fs::File::open(&s.path).with_context(|| format!("{}: cannot open", s.path.display())))
        .collect::<Result<Vec<_>>>()?;
    let mut failed: Option<anyhow::Error> = None;
    let written = w.write_split(prefix, by, |i, _, buf| {
        let t = &g.tensors[i];
        if failed.is_none() {
            if let Err(e) = files[t.shard as usize].read_exact_at(buf, t.offset) {
                failed = Some(anyhow!("{}: tensor `{}`: {e}", g.shards[t.shard as usize].path.display(), t.name));
            }
        }
    })?;
    if let Some(e) = failed {
        for (p, _) in &written.shards {
            let _ = std::fs::remove_file(p);
        }
        return Err(e.context("nothing was kept"));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_llama_cpp_builds_and_parses_them() {
        assert_eq!(shard_path(Path::new("m/x"), 0, 4), PathBuf::from("m/x-00001-of-00004.gguf"));
        assert_eq!(prefix_of(Path::new("m/x-00003-of-00004.gguf"), 2, 4), Some(PathBuf::from("m/x")));
        assert_eq!(prefix_of(Path::new("m/x-00003-of-00004.gguf"), 1, 4), None);
        assert_eq!(prefix_of(Path::new("-00001-of-00002.gguf"), 0, 2), None);
    }

    #[test]
    fn partitions_as_gguf_split() {
        let r = |v: Vec<std::ops::Range<usize>>| v.into_iter().map(|r| (r.start, r.end)).collect::<Vec<_>>();
        assert_eq!(r(partition(&[10, 10, 10, 10, 10], SplitBy::Tensors(2)).unwrap()), [(0, 2), (2, 4), (4, 5)]);
        // Each tensor padded to 32: two fit in 64 bytes, a third would not.
        assert_eq!(r(partition(&[10, 30, 1, 100, 5], SplitBy::Bytes(64)).unwrap()), [(0, 2), (2, 3), (3, 4), (4, 5)]);
        assert_eq!(r(partition(&[], SplitBy::Bytes(64)).unwrap()), [(0, 0)]);
        assert!(partition(&[1], SplitBy::Tensors(0)).is_err());
    }

    #[test]
    fn a_set_of_one_is_named_by_its_file() {
        assert_eq!(set_sha256(&["ab".into()]), "ab");
        let two = set_sha256(&["ab".into(), "cd".into()]);
        assert_ne!(two, set_sha256(&["cd".into(), "ab".into()]), "order is part of the identity");
        assert_eq!(two.len(), 64);
    }

    /// A tiny forged model and its split into `n` tensors a shard: (dir, file, first shard).
    fn set_of(layers: u64, max_tensors: u64) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m.gguf");
        let dims = crate::forge::Preset::Tiny.dims().with(&crate::forge::Overrides { layers: Some(layers), ..Default::default() }).unwrap();
        crate::forge::forge(crate::forge::Arch::Qwen3moe, dims, 3, &m).unwrap();
        let w = split_model(&m, &dir.path().join("s"), SplitBy::Tensors(max_tensors)).unwrap();
        let first = w.shards[0].0.clone();
        (dir, m, first)
    }

    fn refused(path: &Path) -> String {
        let e = Gguf::open_model(path).map(|_| ()).expect_err("refused");
        let s = format!("{e:#}");
        assert!(!s.contains('\n'), "one line: {s}");
        s
    }

    #[test]
    fn a_set_holds_its_files_tensors_byte_for_byte_from_any_shard() {
        use std::os::unix::fs::FileExt;
        let (dir, m, first) = set_of(3, 7);
        let one = Gguf::open(&m).unwrap();
        let third = dir.path().join("s-00003-of-00006.gguf");
        for given in [&first, &third] {
            let set = Gguf::open_model(given).unwrap();
            assert_eq!(set.shards.len(), 6);
            assert_eq!(set.path, first, "named by its first file");
            assert_eq!(set.file_len, set.shards.iter().map(|s| s.file_len).sum::<u64>());
            assert_eq!(set.tensors.len(), one.tensors.len());
            for (a, b) in one.tensors.iter().zip(&set.tensors) {
                assert_eq!((&a.name, a.ggml_type, &a.dims), (&b.name, b.ggml_type, &b.dims));
                let mut x = vec![0u8; a.bytes as usize];
                let mut y = vec![0u8; b.bytes as usize];
                std::fs::File::open(&m).unwrap().read_exact_at(&mut x, a.offset).unwrap();
                std::fs::File::open(&set.shards[b.shard as usize].path).unwrap().read_exact_at(&mut y, b.offset).unwrap();
                assert!(x == y, "{}", a.name);
            }
            // The model's metadata, less nothing but the split keys.
            let mut meta = set.metadata.clone();
            meta.retain(|k, _| !k.starts_with("split."));
            assert_eq!(meta, one.metadata);
        }
        assert_eq!(first_shard(&third).unwrap(), first);
        assert_eq!(files(&third).unwrap().len(), 6);
        // The inventory spans the set: each object's extents lie in the shards that hold them.
        let (a, b) = (crate::inventory::Inventory::of(&m).unwrap(), crate::inventory::Inventory::of(&third).unwrap());
        assert_eq!((a.objects.len(), a.t_repr_bytes, a.expert_bytes), (b.objects.len(), b.t_repr_bytes, b.expert_bytes));
        assert!(b.objects.iter().flat_map(|o| &o.extents).any(|(_, e)| e.shard_offset().0 > 0));
        assert_eq!(b.shards.len(), 6);
    }

    #[test]
    fn bad_sets_are_refused_with_one_line_naming_the_shard() {
        let (dir, _, first) = set_of(3, 7);
        let d = dir.path();
        let shard = |i: u32| d.join(format!("s-{i:05}-of-00006.gguf"));
        // Missing.
        std::fs::rename(shard(4), d.join("away")).unwrap();
        let e = refused(&first);
        assert!(e.contains(&shard(4).display().to_string()) && e.contains("shard 4 of 6 is missing"), "{e}");
        std::fs::rename(d.join("away"), shard(4)).unwrap();
        Gguf::open_model(&first).unwrap();
        // Truncated.
        let bytes = std::fs::read(shard(5)).unwrap();
        std::fs::write(shard(5), &bytes[..bytes.len() - 100]).unwrap();
        let e = refused(&first);
        assert!(e.contains(&shard(5).display().to_string()) && e.contains("truncated"), "{e}");
        std::fs::write(shard(5), &bytes).unwrap();
        // A shard of another set of as many files, with another tensor count.
        let (other, _, _) = set_of(4, 9);
        let theirs = other.path().join("s-00002-of-00006.gguf");
        assert!(theirs.exists(), "4 layers at 9 tensors a shard is 6 shards too");
        let mine = std::fs::read(shard(2)).unwrap();
        std::fs::copy(&theirs, shard(2)).unwrap();
        let e = refused(&first);
        assert!(e.contains(&shard(2).display().to_string()) && e.contains("different sets"), "{e}");
        // A shard of a set of another size.
        let (other, _, _) = set_of(3, 20);
        std::fs::copy(other.path().join("s-00002-of-00002.gguf"), shard(2)).unwrap();
        let e = refused(&first);
        assert!(e.contains(&shard(2).display().to_string()) && e.contains("not shard 2 of 6"), "{e}");
        std::fs::write(shard(2), &mine).unwrap();
        Gguf::open_model(&shard(6)).unwrap();
        // A shard renamed away from its set's name.
        std::fs::copy(shard(3), d.join("renamed.gguf")).unwrap();
        let e = refused(&d.join("renamed.gguf"));
        assert!(e.contains("renamed.gguf") && e.contains("-00003-of-00006.gguf"), "{e}");
    }

    /// Shards written by hand: `tensors[i]` names shard i's tensors, `arch[i]` its architecture.
    fn hand_set(dir: &Path, tensors: &[&[&str]], arch: &[Option<&str>], count: i32) -> PathBuf {
        let n = tensors.len() as u32;
        for (i, names) in tensors.iter().enumerate() {
            let mut w = GgufWriter::default();
            if let Some(a) = arch[i] {
                w.kv("general.architecture", Value::Str(a.into()));
            }
            w.kv(SPLIT_NO, Value::U16(i as u16)).kv(SPLIT_COUNT, Value::U16(n as u16)).kv(SPLIT_TENSORS_COUNT, Value::I32(count));
            for t in *names {
                w.tensor(TensorSpec::new(*t, super::super::GgmlType::F32, &[32]));
            }
            w.write(&shard_path(&dir.join("h"), i as u32, n), |_, _, b| b.fill(1)).unwrap();
        }
        shard_path(&dir.join("h"), 0, n)
    }

    #[test]
    fn a_tensor_in_two_shards_or_shards_of_two_models_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let first = hand_set(d, &[&["a", "b"], &["c", "a"]], &[Some("llama"), None], 4);
        let e = refused(&first);
        assert!(e.contains("h-00002-of-00002.gguf") && e.contains("tensor `a` is also in shard 1"), "{e}");
        let first = hand_set(d, &[&["a", "b"], &["c", "d"]], &[Some("llama"), Some("qwen3moe")], 4);
        let e = refused(&first);
        assert!(e.contains("h-00002-of-00002.gguf") && e.contains("different models"), "{e}");
        let first = hand_set(d, &[&["a", "b"], &["c"]], &[Some("llama"), None], 4);
        let e = refused(&first);
        assert!(e.contains("h-00001-of-00002.gguf") && e.contains("hold 3 tensors"), "{e}");
        // The valid set, its other shards naming the same architecture or none.
        let first = hand_set(d, &[&["a", "b"], &["c", "d"]], &[Some("llama"), Some("llama")], 4);
        assert_eq!(Gguf::open_model(&first).unwrap().tensors.len(), 4);
        // Valid too: a later shard without split.tensors.count (llama.cpp reads the first's).
        let mut w = GgufWriter::default();
        w.kv(SPLIT_NO, Value::U16(1)).kv(SPLIT_COUNT, Value::U16(2));
        w.tensor(TensorSpec::new("c", super::super::GgmlType::F32, &[32])).tensor(TensorSpec::new("d", super::super::GgmlType::F32, &[32]));
        let second = shard_path(&d.join("h"), 1, 2);
        std::fs::remove_file(&second).unwrap();
        w.write(&second, |_, _, b| b.fill(1)).unwrap();
        assert_eq!(Gguf::open_model(&second).unwrap().tensors.len(), 4);
    }
}
