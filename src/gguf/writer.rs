//! Streaming GGUF writer: metadata and tensor directory first, then each tensor's payload as
//! the caller produces it. Written under a temporary name and renamed, so a crash never leaves
//! a half-written model under the final name.

use super::{GgmlType, Value, DEFAULT_ALIGNMENT, MAGIC};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub ggml_type: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, ggml_type: GgmlType, dims: &[u64]) -> TensorSpec {
        TensorSpec { name: name.into(), ggml_type, dims: dims.to_vec() }
    }

    pub fn bytes(&self) -> u64 {
        self.ggml_type.tensor_bytes(&self.dims).expect("tensor shape fits its type")
    }
}

#[derive(Debug, Default)]
pub struct GgufWriter {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    pub fn kv(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    pub fn tensor(&mut self, spec: TensorSpec) -> &mut Self {
        self.tensors.push(spec);
        self
    }

    /// Total bytes of the file this writer produces.
    pub fn file_len(&self) -> u64 {
        let (header, offsets) = self.layout();
        let last = self.tensors.last().map(|t| offsets.last().unwrap() + t.bytes()).unwrap_or(0);
        header.len() as u64 + last
    }

    /// The data alignment: `general.alignment` when the metadata sets it, as readers take it.
    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", Value::U32(a)) if a.is_power_of_two() => Some(u64::from(*a)),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Header bytes (padded to the alignment) and each tensor's offset in the data section.
    fn layout(&self) -> (Vec<u8>, Vec<u64>) {
        let align = self.alignment();
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut at = 0u64;
        for t in &self.tensors {
            offsets.push(at);
            at = (at + t.bytes()).div_ceil(align) * align;
        }
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut h, k);
            h.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut h, v);
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ggml_type.0.to_le_bytes());
            h.extend_from_slice(&off.to_le_bytes());
        }
        h.resize((h.len() as u64).div_ceil(align) as usize * align as usize, 0);
        (h, offsets)
    }

    /// Writes the file and returns its SHA-256 (hashed as written, not reread);
    /// `fill(i, spec, buf)` fills tensor `i`'s payload (`buf` has its size).
    pub fn write(&self, path: &Path, mut fill: impl FnMut(usize, &TensorSpec, &mut [u8])) -> Result<String> {
        let tmp = path.with_extension("partial");
        let mut hash = Sha256::new();
        // Claimed exclusively (outside the clean-up below: a file that is not ours is never removed).
        let f = crate::util::claim_partial(&tmp)?;
        let res = (|| -> Result<()> {
            let mut out = BufWriter::with_capacity(1 << 22, f);
            let mut put = |out: &mut BufWriter<File>, bytes: &[u8]| -> Result<()> {
                hash.update(bytes);
                Ok(out.write_all(bytes)?)
            };
            let (header, offsets) = self.layout();
            put(&mut out, &header)?;
            let mut written = 0u64;
            let mut buf = Vec::new();
            for (i, t) in self.tensors.iter().enumerate() {
                if written != offsets[i] {
                    put(&mut out, &vec![0u8; (offsets[i] - written) as usize])?;
                    written = offsets[i];
                }
                buf.clear();
                buf.resize(t.bytes() as usize, 0);
                fill(i, t, &mut buf);
                put(&mut out, &buf)?;
                written += buf.len() as u64;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok(())
        })();
        if let Err(e) = res {
            let _ = fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        if path.is_dir() {
            bail!("{} is a directory", path.display());
        }
        fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
        Ok(hex::encode(hash.finalize()))
    }
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(*x as u8),
        Value::Str(s) => put_str(h, s),
        Value::Array(a) => {
            let elem = a.first().map(Value::type_id).unwrap_or(8);
            h.extend_from_slice(&elem.to_le_bytes());
            h.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                put_value(h, x);
            }
        }
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
    }
}
