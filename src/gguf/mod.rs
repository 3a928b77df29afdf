//! GGUF: a validating reader and a streaming writer.
//!
//! The reader checks everything llama.cpp would otherwise trip over (truncation, bounds,
//! alignment, overlapping tensors, unknown types) so that a bad file gives one clear error
//! before the engine sees it.

mod check;
mod reader;
pub mod set;
mod types;
mod writer;

pub use check::check;
pub use reader::{Gguf, TensorInfo};
pub use types::GgmlType;
pub use writer::{GgufWriter, TensorSpec};

use std::fmt;

/// Parses an expert tensor name, `blk.L.ffn_ROLE_exps.weight`, into its layer and role.
pub fn expert_role(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let role = rest.strip_prefix("ffn_")?.strip_suffix("_exps.weight")?;
    matches!(role, "gate" | "up" | "down" | "gate_up").then_some(())?;
    // Canonical numbers only: `blk.01` and `blk.1` must not name one layer twice.
    let n: u32 = layer.parse().ok()?;
    (n.to_string() == layer).then_some((n, role))
}

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// An unsigned integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "[{} values]", a.len()),
            Value::Bool(b) => write!(f, "{b}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            other => write!(f, "{}", other.as_u64().map(|v| v.to_string()).unwrap_or_default()),
        }
    }
}
