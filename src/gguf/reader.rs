//! Validating GGUF reader: header, metadata and tensor directory; tensor data stays on disk.

use super::{GgmlType, Value, DEFAULT_ALIGNMENT, MAGIC};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// Limits that keep a hostile header from making us allocate without bound.
const MAX_STRING: u64 = 1 << 24;
const MAX_DIMS: u32 = 4;
/// Smallest directory entries in the file: a tensor (empty name, one dimension, type, offset)
/// and a metadata pair (empty key, type, one byte). Counts are bounded by the bytes left.
const MIN_TENSOR_ENTRY: u64 = 8 + 4 + 8 + 4 + 8;
const MIN_KV_ENTRY: u64 = 8 + 4 + 1;
/// Metadata values decoded in all: each takes a `Value` in memory (32 bytes), however few bytes
/// it has in the file. Four times the largest tokenizer (tokens, scores, types, merges) known.
const MAX_VALUES: u64 = 1 << 22;
/// Directory entries reserved up front; more grow as they are actually read.
const RESERVE: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml order: dims[0] is the contiguous dimension.
    pub dims: Vec<u64>,
    /// Offset relative to the start of the data section, as stored.
    pub rel_offset: u64,
    /// The file of the model that holds it (0 unless the model is a shard set).
    pub shard: u32,
    /// Absolute offset in its file.
    pub offset: u64,
    /// Payload bytes.
    pub bytes: u64,
}

impl TensorInfo {
    pub fn end(&self) -> u64 {
        self.offset + self.bytes
    }

    /// Where it starts in the model: (shard, offset) as one position (`source::position`).
    pub fn position(&self) -> u64 {
        crate::source::position(self.shard, self.offset)
    }
}

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardHead {
    pub path: PathBuf,
    pub file_len: u64,
    pub data_offset: u64,
    pub alignment: u64,
    pub tensors: usize,
}

#[derive(Debug, Clone)]
pub struct Gguf {
    /// The file, or a shard set's first file.
    pub path: PathBuf,
    pub version: u32,
    /// Bytes of the file (of every shard, for a set).
    pub file_len: u64,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: BTreeMap<String, Value>,
    /// In file order of the tensor directory (shard by shard, for a set).
    pub tensors: Vec<TensorInfo>,
    /// The model's files: this one, or every shard of its set in order.
    pub shards: Vec<ShardHead>,
}

impl Gguf {
    /// Reads and validates `path`. The error names the file and the first problem found.
    pub fn open(path: &Path) -> Result<Gguf> {
        Self::open_inner(path).with_context(|| path.display().to_string())
    }

    fn open_inner(path: &Path) -> Result<Gguf> {
        // A FIFO would block a plain open forever: stat first, then open without blocking.
        if !std::fs::metadata(path).map_err(|e| anyhow!("cannot open: {e}"))?.is_file() {
            bail!("not a regular file");
        }
        let file = crate::bounds::open_regular(path).map_err(|e| anyhow!("cannot open: {e}"))?;
        let meta = file.metadata()?;
        let file_len = meta.len();
        let mut r = Cursor { inner: BufReader::with_capacity(1 << 16, file), pos: 0, len: file_len, values: 0 };

        let mut magic = [0u8; 4];
        r.exact(&mut magic).map_err(|_| anyhow!("not a GGUF file (shorter than its magic)"))?;
        if magic != MAGIC {
            bail!("not a GGUF file (magic {:02x?}, expected \"GGUF\")", magic);
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            bail!("unsupported GGUF version {version} (2 and 3 are supported)");
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        // Each entry needs at least a few bytes: bound the counts by the bytes left.
        let need = n_tensors.checked_mul(MIN_TENSOR_ENTRY).and_then(|t| n_kv.checked_mul(MIN_KV_ENTRY).and_then(|k| k.checked_add(t)));
        if need.is_none_or(|n| n > r.left()) {
            bail!("header claims {n_tensors} tensors and {n_kv} metadata entries: more than the file's {} bytes can hold (truncated or corrupt)", file_len);
        }

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string().with_context(|| format!("metadata entry {i}"))?;
            let ty = r.u32()?;
            let value = r.value(ty, 0).with_context(|| format!("metadata `{key}`"))?;
            if metadata.insert(key.clone(), value).is_some() {
                bail!("duplicate metadata key `{key}`");
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let a = v.as_u64().ok_or_else(|| anyhow!("general.alignment is not an integer"))?;
                if a == 0 || !a.is_power_of_two() {
                    bail!("general.alignment {a} is not a power of two");
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors.min(RESERVE) as usize);
        let mut names = HashSet::new();
        for i in 0..n_tensors {
            let name = r.string().with_context(|| format!("tensor {i}"))?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                bail!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)");
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64()?;
                if d == 0 || d > i64::MAX as u64 {
                    bail!("tensor `{name}` has dimension {d}");
                }
                dims.push(d);
            }
            let ggml_type = GgmlType(r.u32()?);
            if !ggml_type.is_known() {
                bail!("tensor `{name}` has unknown type id {}", ggml_type.0);
            }
            let rel_offset = r.u64()?;
            if rel_offset % alignment != 0 {
                bail!("tensor `{name}` offset {rel_offset} is not aligned to {alignment}");
            }
            if dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none_or(|n| n > i64::MAX as u64) {
                bail!("tensor `{name}` shape {dims:?} has more elements than a tensor can (overflow)");
            }
            let blck = ggml_type.block_size().unwrap_or(1);
            if dims[0] % blck != 0 {
                bail!("tensor `{name}` shape {dims:?} does not fit type {ggml_type} (block size {blck})");
            }
            let bytes = ggml_type
                .tensor_bytes(&dims)
                .filter(|&b| b <= file_len)
                .ok_or_else(|| anyhow!("tensor `{name}` shape {dims:?} of {ggml_type} needs more bytes than the file's {file_len}"))?;
            if !names.insert(name.clone()) {
                bail!("duplicate tensor `{name}`");
            }
            tensors.push(TensorInfo { name, ggml_type, dims, rel_offset, shard: 0, offset: 0, bytes });
        }
        let data_offset = r.pos.div_ceil(alignment) * alignment;
        for t in &mut tensors {
            t.offset = data_offset.checked_add(t.rel_offset).ok_or_else(|| anyhow!("tensor `{}` offset overflows", t.name))?;
            let end = t.offset.checked_add(t.bytes).ok_or_else(|| anyhow!("tensor `{}` size overflows", t.name))?;
            if end > file_len {
                bail!("truncated: tensor `{}` ends at byte {end} but the file has {file_len} bytes", t.name);
            }
        }
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
        by_offset.sort_by_key(|t| t.offset);
        for w in by_offset.windows(2) {
            if w[0].end() > w[1].offset {
                bail!("tensors `{}` and `{}` overlap", w[0].name, w[1].name);
            }
        }
        let shards = vec![ShardHead { path: path.to_path_buf(), file_len, data_offset, alignment, tensors: tensors.len() }];
        Ok(Gguf { path: path.to_path_buf(), version, file_len, alignment, data_offset, metadata, tensors, shards })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn architecture(&self) -> Result<&str> {
        self.get("general.architecture").and_then(Value::as_str).ok_or_else(|| anyhow!("{}: no general.architecture", self.path.display()))
    }

    /// `{arch}.{key}` as an unsigned integer.
    pub fn arch_u64(&self, key: &str) -> Option<u64> {
        let arch = self.architecture().ok()?;
        self.get(&format!("{arch}.{key}")).and_then(Value::as_u64)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

struct Cursor {
    inner: BufReader<File>,
    pos: u64,
    len: u64,
    /// Metadata values decoded so far.
    values: u64,
}

/// Bytes one value of GGUF type `ty` takes in the file at least; None: not a value type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 4 + 8,
        _ => return None,
    })
}

impl Cursor {
    fn left(&self) -> u64 {
        self.len - self.pos
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<()> {
        if self.pos + buf.len() as u64 > self.len {
            bail!("truncated: header needs byte {} but the file has {} bytes", self.pos + buf.len() as u64, self.len);
        }
        self.inner.read_exact(buf)?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.exact(&mut b)?;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        if n > MAX_STRING || self.pos + n > self.len {
            bail!("truncated: string of {n} bytes runs past the end of the file");
        }
        let mut b = vec![0u8; n as usize];
        self.exact(&mut b)?;
        String::from_utf8(b).map_err(|_| anyhow!("string is not UTF-8"))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        self.values += 1;
        if self.values > MAX_VALUES {
            bail!("the metadata holds more than {MAX_VALUES} values");
        }
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => bail!("bool value {b}"),
            },
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 0 {
                    bail!("nested arrays are not supported");
                }
                let elem = self.u32()?;
                let n = self.u64()?;
                let size = min_value_bytes(elem).ok_or_else(|| anyhow!("array of unknown value type {elem}"))?;
                if n.checked_mul(size).is_none_or(|b| b > self.left()) {
                    bail!("truncated: array of {n} elements runs past the end of the file");
                }
                if n > MAX_VALUES - self.values {
                    bail!("array of {n} elements: the metadata may hold at most {MAX_VALUES} values");
                }
                let mut v = Vec::with_capacity(n.min(RESERVE) as usize);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            t => bail!("unknown value type {t}"),
        })
    }
}
