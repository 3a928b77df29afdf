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
            return Err(serde::de::Error::custom(format!("expected a SHA-256 digest (64 lowercase hexadecimal digits), got {s:?}")));
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
///
/// Scalars are taken strictly, so that what a file is digested as is what it says: booleans
/// are `true` or `false` only (no YAML 1.1 `yes`, `no`, `on`, `off`), a tag the parser does
/// not know (`!custom 1`) is refused rather than dropped, and a quoted scalar is a string: a
/// number or boolean field written `"1"` or `'true'` is refused ([`quoted_scalars`]).
pub fn from_yaml<T: serde::de::DeserializeOwned + Serialize>(text: &str) -> std::result::Result<T, Vec<Diagnostic>> {
    let value: T = serde_saphyr::from_str_with_options(text, strict_options()).map_err(|e| vec![saphyr_diagnostic(&e)])?;
    let problems = quoted_scalars(text, &value);
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(problems)
    }
}

fn strict_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.reject_unsupported_tags = true;
    o
}

fn saphyr_diagnostic(e: &serde_saphyr::Error) -> Diagnostic {
    let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((0, 0));
    let message = e.without_snippet().to_string();
    // The message may itself carry a position; keep the first line, without it.
    let first = message.lines().next().unwrap_or("").trim().to_string();
    Diagnostic { line, column, message: strip_position(&first) }
}

/// A YAML node as written, before any field type is applied: a quoted scalar stays a string.
#[derive(Debug)]
enum Node {
    Map(Vec<(String, serde_saphyr::Spanned<Node>)>),
    Seq(Vec<serde_saphyr::Spanned<Node>>),
    Str(String),
    Other,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_i128<E>(self, _: i128) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_u128<E>(self, _: u128) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_unit<E>(self) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_none<E>(self) -> std::result::Result<Node, E> {
        Ok(Node::Other)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> std::result::Result<Node, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Node::Seq(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> std::result::Result<Node, A::Error> {
        let mut v = Vec::new();
        while let Some(k) = a.next_key::<KeyText>()? {
            v.push((k.0, a.next_value()?));
        }
        Ok(Node::Map(v))
    }
}

/// A mapping key as text, whatever scalar it is (a field name is matched by its text).
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let n = serde_saphyr::Spanned::<Node>::deserialize(d)?;
        Ok(KeyText(match n.value {
            Node::Str(s) => s,
            _ => String::new(),
        }))
    }
}

/// A number or boolean the typed value holds where the file wrote a string that would be that
/// number or boolean unquoted (`"1"`, `'true'`): the YAML parser converts such strings
/// silently, so they are refused here, at the string's position. `value` is what `text`
/// deserialized into.
pub fn quoted_scalars<T: Serialize>(text: &str, value: &T) -> Vec<Diagnostic> {
    let Ok(json) = serde_json::to_value(value) else { return Vec::new() };
    match serde_saphyr::from_str_with_options::<serde_saphyr::Spanned<Node>>(text, strict_options()) {
        Ok(tree) => {
            let mut out = Vec::new();
            walk_quoted(&json, &tree, "", &mut out);
            out
        }
        Err(e) => vec![saphyr_diagnostic(&e)],
    }
}

fn walk_quoted(json: &serde_json::Value, yaml: &serde_saphyr::Spanned<Node>, path: &str, out: &mut Vec<Diagnostic>) {
    use serde_json::Value as J;
    let at = |message: String| Diagnostic { line: yaml.referenced.line(), column: yaml.referenced.column(), message };
    match (json, &yaml.value) {
        (J::Object(fields), Node::Map(entries)) => {
            for (k, j) in fields {
                if let Some((_, y)) = entries.iter().rev().find(|(name, _)| name == k) {
                    walk_quoted(j, y, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out);
                }
            }
        }
        (J::Array(items), Node::Seq(nodes)) => {
            for (i, (j, y)) in items.iter().zip(nodes).enumerate() {
                walk_quoted(j, y, &format!("{path}[{i}]"), out);
            }
        }
        (J::Number(_), Node::Str(s)) if plain_is_typed(s) => {
            out.push(at(format!("{path}: expected a number, got the string {s:?} (numbers are written without quotes)")))
        }
        (J::Bool(_), Node::Str(s)) if plain_is_typed(s) => {
            out.push(at(format!("{path}: expected true or false, got the string {s:?} (booleans are written without quotes)")))
        }
        _ => {}
    }
}

/// Whether `s`, written without quotes, would be a number or boolean: the parser's own coercion
/// of a quoted scalar. A string a field parses by its own rules (a byte size, `23 GiB`) is not.
fn plain_is_typed(s: &str) -> bool {
    matches!(serde_saphyr::from_str_with_options::<Node>(s, strict_options()), Ok(Node::Other)) && !s.trim().is_empty()
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
