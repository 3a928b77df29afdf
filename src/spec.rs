//! Primitives of the files people write (campaigns, certificates): values that keep their
//! position, digests, and diagnostics as `FILE:line:column: message`.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;

/// A value with the line and column where the campaign file wrote it (0:0 when it came from
/// JSON, e.g. a frozen campaign). Serializes, compares and has the schema of the bare value.
#[derive(Debug, Clone)]
pub struct At<T> {
    pub value: T,
    pub line: u64,
    pub column: u64,
}

impl<T> At<T> {
    pub fn new(value: T) -> At<T> {
        At { value, line: 0, column: 0 }
    }
}

impl<T: PartialEq> PartialEq for At<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        Ok(At { value: s.value, line: s.referenced.line(), column: s.referenced.column() })
    }
}

impl<T: Serialize> Serialize for At<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<T: JsonSchema> JsonSchema for At<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        T::json_schema(g)
    }
}

impl AsRef<std::path::Path> for At<String> {
    fn as_ref(&self) -> &std::path::Path {
        self.value.as_ref()
    }
}

impl AsRef<std::ffi::OsStr> for At<String> {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.value.as_ref()
    }
}

impl<T: fmt::Display> fmt::Display for At<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl AsRef<str> for At<String> {
    fn as_ref(&self) -> &str {
        &self.value
    }
}

impl<T> std::ops::Deref for At<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// A lowercase hexadecimal SHA-256 digest (64 digits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Sha256Hex(pub String);

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(serde::de::Error::custom(format!(
                "expected a SHA-256 digest (64 lowercase hexadecimal digits), got {s:?}"
            )));
        }
        Ok(Sha256Hex(s))
    }
}

impl JsonSchema for Sha256Hex {
    fn schema_name() -> Cow<'static, str> {
        "Sha256Hex".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "description": "A SHA-256 digest: 64 lowercase hexadecimal digits.",
            "type": "string",
            "pattern": "^[0-9a-f]{64}$"
        })
    }
}

impl fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A problem in a campaign or certificate file, at a position when one is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl Diagnostic {
    pub fn at<T>(v: &At<T>, message: impl Into<String>) -> Diagnostic {
        Diagnostic { line: v.line, column: v.column, message: message.into() }
    }

    /// `FILE:line:column: message` (or `FILE: message` without a position).
    pub fn render(&self, file: &str) -> String {
        if self.line > 0 {
            format!("{file}:{}:{}: {}", self.line, self.column, self.message)
        } else {
            format!("{file}: {}", self.message)
        }
    }
}

/// Deserializes YAML; a syntax error, typo'd key or wrong type comes back as one diagnostic at
/// its position (shared by campaign and certificate files).
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> std::result::Result<T, Vec<Diagnostic>> {
    serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((0, 0));
        let message = e.without_snippet().to_string();
        // The message may itself carry a position; keep the first line, without it.
        let first = message.lines().next().unwrap_or("").trim().to_string();
        vec![Diagnostic { line, column, message: strip_position(&first) }]
    })
}

/// serde-saphyr writes `... at line L, column C` into some messages; we print the position once.
fn strip_position(msg: &str) -> String {
    for marker in [" at line ", " (line "] {
        if let Some(i) = msg.rfind(marker) {
            let tail = &msg[i + marker.len()..];
            if tail.chars().next().is_some_and(|c| c.is_ascii_digit()) && tail.contains("column") {
                return msg[..i].trim_end_matches([',', ':']).to_string();
            }
        }
    }
    msg.to_string()
}
