//! A session's requests, as a user writes them: JSON Lines, one request per line,
//! `{"id": ..., "prompt": ... | "prompt_file": ..., "n_predict": ..., "expected": ..., "fault": ...}`.
//! Every request is checked before any runs, and a bad line is refused with its line number.

use crate::bounds::{self, MAX_N_PREDICT, MAX_PROMPT_FILE_BYTES};
use crate::source::fault::FaultCell;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Requests in one session at most.
pub const MAX_REQUESTS: usize = 10_000;
/// A requests file's size, and its prompts' bytes in all, at most.
pub const MAX_REQUESTS_FILE_BYTES: u64 = 64 << 20;
pub const MAX_SESSION_PROMPT_BYTES: u64 = 256 << 20;
/// A request id (a string or a whole number, as datasets write them) has at most this many bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// One request of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: String,
    pub prompt: Vec<u8>,
    /// The file the prompt came from, as the line names it (absent: given inline).
    pub prompt_file: Option<PathBuf>,
    pub n_predict: u32,
    /// Answers the response is scored against (none: not scored).
    pub expected: Vec<String>,
    /// A deterministic fault cell for this request alone: it runs through a Plan of its own
    /// whose source the cell perturbs (`none`: the session's own).
    pub fault: FaultCell,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    id: Id,
    prompt: Option<String>,
    prompt_file: Option<PathBuf>,
    n_predict: Option<u32>,
    expected: Option<Expected>,
    fault: Option<FaultCell>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Id {
    Text(String),
    Number(u64),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Expected {
    One(String),
    Any(Vec<String>),
}

/// Reads the requests file at `path`; `n_predict` is the default for lines that give none. A
/// `prompt_file` is read relative to the requests file's directory.
pub fn read(path: &Path, n_predict: u32) -> Result<Vec<Request>> {
    let text = bounds::read_text("a requests file", path, MAX_REQUESTS_FILE_BYTES)?;
    parse(path, &text, n_predict)
}

/// [`read`] of text already in hand (`path` names it and anchors its prompt files).
pub fn parse(path: &Path, text: &str, n_predict: u32) -> Result<Vec<Request>> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    let mut lines_of: HashMap<String, usize> = HashMap::new();
    let mut prompt_bytes = 0u64;
    for (i, raw) in text.lines().enumerate() {
        let at = |e: anyhow::Error| e.context(format!("{}:{}", path.display(), i + 1));
        if raw.trim().is_empty() {
            continue;
        }
        if out.len() == MAX_REQUESTS {
            bail!("{}:{}: a session holds at most {MAX_REQUESTS} requests", path.display(), i + 1);
        }
        let r = request(raw, base, n_predict).map_err(at)?;
        if let Some(first) = lines_of.insert(r.id.clone(), i + 1) {
            bail!("{}:{}: request id {:?} is already used on line {first}", path.display(), i + 1, r.id);
        }
        prompt_bytes += r.prompt.len() as u64;
        if prompt_bytes > MAX_SESSION_PROMPT_BYTES {
            bail!("{}:{}: the session's prompts exceed {MAX_SESSION_PROMPT_BYTES} bytes in all", path.display(), i + 1);
        }
        out.push(r);
    }
    if out.is_empty() {
        bail!("{}: no requests (one JSON object per line)", path.display());
    }
    Ok(out)
}

fn request(raw: &str, base: &Path, default_n_predict: u32) -> Result<Request> {
    let line: Line = serde_json::from_str(raw).context("not a request")?;
    let id = match line.id {
        Id::Text(id) => request_id(id)?,
        Id::Number(n) => n.to_string(),
    };
    let (prompt, prompt_file) = match (line.prompt, line.prompt_file) {
        (Some(p), None) => (p.into_bytes(), None),
        (None, Some(f)) => {
            let bytes = bounds::read_file("a prompt file", &base.join(&f), MAX_PROMPT_FILE_BYTES)?;
            bounds::prompt_text(&f.display().to_string(), &bytes)?;
            (bytes, Some(f))
        }
        (Some(_), Some(_)) => bail!("request {:?} gives both `prompt` and `prompt_file`", id),
        (None, None) => bail!("request {:?} gives neither `prompt` nor `prompt_file`", id),
    };
    if prompt.is_empty() {
        bail!("request {:?} has an empty prompt", id);
    }
    let n_predict = line.n_predict.unwrap_or(default_n_predict);
    if n_predict == 0 || n_predict > MAX_N_PREDICT {
        bail!("request {:?}: `n_predict` must be 1 to {MAX_N_PREDICT} (got {n_predict})", id);
    }
    let expected = match line.expected {
        None => Vec::new(),
        Some(Expected::One(a)) => vec![a],
        Some(Expected::Any(a)) if a.is_empty() => bail!("request {:?}: `expected` lists no answer", id),
        Some(Expected::Any(a)) => a,
    };
    Ok(Request { id, prompt, prompt_file, n_predict, expected, fault: line.fault.unwrap_or_default() })
}

/// A request id: not empty, bounded, and without control characters (it is shown in one-line
/// errors and tables). Records are named by the request's place, so any such id is kept as given.
fn request_id(id: String) -> Result<String> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES {
        bail!("a request id must have 1 to {MAX_REQUEST_ID_BYTES} bytes (it has {})", id.len());
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        bail!("request id {id:?} holds the control character {c:?}");
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        format!("{:#}", parse(Path::new("/nowhere/r.jsonl"), text, 16).unwrap_err())
    }

    #[test]
    fn requests_are_read_in_order_with_their_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("long.txt"), "a prompt from a file").unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(
            &path,
            concat!(
                "{\"id\": \"q1\", \"prompt\": \"What is it?\", \"expected\": \"a tower\"}\n",
                "\n",
                "{\"id\": \"q-2.b_c\", \"prompt_file\": \"long.txt\", \"n_predict\": 3, \"expected\": [\"x\", \"y\"]}\n",
                "{\"id\": \"free\", \"prompt\": \"ünïcode\"}\n",
                "{\"id\": 57, \"prompt\": \"a numbered request\"}\n",
                "{\"id\": \"../ a/b .c\", \"prompt\": \"any id is kept as given\", \"fault\": \"corrupt_byte\"}",
            ),
        )
        .unwrap();
        let r = read(&path, 16).unwrap();
        assert_eq!(r.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["q1", "q-2.b_c", "free", "57", "../ a/b .c"]);
        assert_eq!((r[0].prompt.as_slice(), r[0].n_predict, r[0].expected.clone()), (&b"What is it?"[..], 16, vec!["a tower".to_string()]));
        assert_eq!((r[1].prompt.as_slice(), r[1].prompt_file.clone()), (&b"a prompt from a file"[..], Some(PathBuf::from("long.txt"))));
        assert_eq!((r[1].n_predict, r[1].expected.len()), (3, 2));
        assert_eq!((r[2].prompt.clone(), r[2].expected.clone()), ("ünïcode".as_bytes().to_vec(), Vec::<String>::new()));
        assert_eq!((r[0].fault, r[4].fault), (FaultCell::None, FaultCell::CorruptByte));
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number() {
        let ok = "{\"id\": \"a\", \"prompt\": \"p\"}\n";
        for (text, says) in [
            ("", "no requests"),
            ("\n  \n", "no requests"),
            ("{\"id\": \"a\", \"prompt\": \"p\"\n", "r.jsonl:1: not a request"),
            (&format!("{ok}{{\"id\": \"b\", \"promt\": \"p\"}}"), "r.jsonl:2: not a request: unknown field `promt`"),
            (&format!("{ok}{ok}"), "r.jsonl:2: request id \"a\" is already used on line 1"),
            ("{\"id\": \"a\\tb\", \"prompt\": \"p\"}", "the control character '\\t'"),
            ("{\"id\": \"\", \"prompt\": \"p\"}", "1 to 256 bytes"),
            ("{\"id\": -3, \"prompt\": \"p\"}", "not a request"),
            ("{\"id\": \"a\"}", "neither `prompt` nor `prompt_file`"),
            ("{\"id\": \"a\", \"prompt\": \"p\", \"prompt_file\": \"f\"}", "both `prompt` and `prompt_file`"),
            ("{\"id\": \"a\", \"prompt\": \"\"}", "an empty prompt"),
            ("{\"id\": \"a\", \"prompt\": \"p\", \"n_predict\": 0}", "`n_predict` must be 1 to"),
            ("{\"id\": \"a\", \"prompt\": \"p\", \"n_predict\": -1}", "not a request"),
            ("{\"id\": \"a\", \"prompt\": \"p\", \"expected\": []}", "lists no answer"),
            ("{\"id\": \"a\", \"prompt\": \"p\", \"expected\": 3}", "not a request"),
            ("{\"id\": \"a\", \"prompt\": \"p\", \"fault\": \"sometimes\"}", "not a request"),
            ("{\"id\": \"a\", \"prompt_file\": \"missing.txt\"}", "/nowhere/missing.txt: cannot read a prompt file"),
        ] {
            let e = err(text);
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_prompt_file_must_be_utf8_text() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.txt"), [b'a', 0xff, b'b']).unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, "{\"id\": \"a\", \"prompt_file\": \"bad.txt\"}\n").unwrap();
        let e = format!("{:#}", read(&path, 4).unwrap_err());
        assert!(e.contains("r.jsonl:1") && e.contains("not valid UTF-8 (byte 1)"), "{e}");
    }
}
