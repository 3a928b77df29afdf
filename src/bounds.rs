//! One table of limits for every run parameter, shared by the CLI, `campaign check` and refine.
//! A value outside its bound is refused with one line naming the flag; nothing is allocated first.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// Threads: 4 x the available cores (oversubscription beyond that only slows the run), and at
/// most 1024 (ggml's thread pool keeps per-thread state sized by this count).
pub fn max_threads() -> u32 {
    (4 * cores()).min(MAX_THREADS)
}

/// The cores this process may run on (its affinity and cgroup quota).
fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as u32
}
/// The machine-independent ceiling, for files that run elsewhere (campaigns).
pub const MAX_THREADS: u32 = 1024;

/// Engine threads when a run names none: every available core, for decoding and batches alike,
/// whether or not the Plan streams experts. On 2 cores, two engine threads decoded faster than
/// one in every Plan configuration measured: 1.2-1.6x with LRU slots (sized by the budget on
/// the bench model; every expert in a slot on a 24 x 64 model), about 5 % with policy `zero`,
/// where every token reads its experts. Per-row results do not depend on the thread count, so
/// the default changes no output bit.
pub fn default_threads() -> u32 {
    cores().clamp(1, MAX_THREADS)
}

/// A run's (decode, batch) threads from what it names: decoding takes `threads` or the
/// default above; multi-token batches (the prompt, drafted traversals) take `batch`, else
/// `threads`, else the default.
pub fn threads(threads: Option<i64>, batch: Option<i64>) -> (i64, i64) {
    let default = i64::from(default_threads());
    (threads.unwrap_or(default), batch.or(threads).unwrap_or(default))
}
/// Expert slots per MoE layer: far above any expert count a GGUF here carries.
pub const MAX_SLOTS: u32 = 65_536;
/// Host staging windows: each is one registered buffer, and all of them are bounded below.
pub const MAX_WINDOWS: u32 = 4_096;
/// io_uring's own maximum number of submission entries (IORING_MAX_ENTRIES).
pub const MAX_DEPTH: u32 = 32_768;
/// Per-layer staging buffers.
pub const MAX_LAYER_BUFFERS: u32 = 4_096;
/// Context tokens: llama.cpp sizes its KV cache by this; 1 Mi tokens is beyond every model here.
pub const MAX_CTX: u32 = 1 << 20;
/// Logical/physical batch: llama.cpp takes at most the context of it.
pub const MAX_BATCH: u32 = MAX_CTX;
/// Generated tokens: bounded by the context anyway; this keeps the reservation finite.
pub const MAX_N_PREDICT: u32 = MAX_CTX;
/// LRU entries per layer.
pub const MAX_LRU: u32 = MAX_SLOTS;
/// Drafts one target traversal checks: llama.cpp keeps one recurrent state per position it
/// may take back, so a hybrid target's memory grows with it.
pub const MAX_DRAFT: u32 = 64;
/// Cells of a campaign: each is a full model run and about 1.5 KiB in memory once expanded;
/// 10 000 is far beyond any schedule worth running and keeps expansion near 15 MiB.
pub const MAX_CELLS: u64 = 10_000;
/// Times a cell interrupted from outside is run again before it is abandoned: each attempt is a
/// whole model run, so a larger number only postpones abandoning a cell that cannot finish.
pub const MAX_INTERRUPTED_ATTEMPTS: u32 = 100;
/// Prompt tokens a campaign expects: the prompt must fit the context.
pub const MAX_PROMPT_TOKENS: u32 = MAX_CTX;
/// A refinement's verify window, in generated tokens: at most the outputs a run may have.
pub const MAX_REFINE_WINDOW: u32 = MAX_N_PREDICT;
/// The decode token whose events a record's timeline keeps: an index into the outputs.
pub const MAX_TIMELINE_TOKEN: u32 = MAX_N_PREDICT;
/// Distinct experts per engine pass: never more than a layer's experts, bounded as slots are.
pub const MAX_TOKEN_PASS: u32 = MAX_SLOTS;
/// A forged model's tensor bytes (its experts and embeddings at F32): 1 TiB, far above the bench
/// preset's 5 GB, and below what a count typed by mistake would have it write.
pub const MAX_FORGED_BYTES: u64 = 1 << 40;
/// RPC servers one run registers (ggml-rpc.h GGML_RPC_MAX_SERVERS).
pub const MAX_RPC_SERVERS: usize = 16;
/// Files of one shard set: a position keeps the shard in its top 16 bits
/// (`source::SHARD_SHIFT`), and llama.cpp names at most 99,999.
pub const MAX_SHARDS: u64 = 1 << 16;
/// A cell spec a worker reads (its prompt travels inside it).
pub const MAX_CELL_SPEC_BYTES: u64 = 64 << 20;
/// Smallest memory limit a contained run may ask for: below it no worker can even start, so
/// the number is a typo; between it and the worker's need the run is an OOM on record.
pub const MIN_MEMORY_MAX: u64 = 1 << 20;
/// Largest memory limit: 1 PiB, beyond any host.
pub const MAX_MEMORY_MAX: u64 = 1 << 50;

/// `value` must lie in `lo..=hi`; the error names `flag` and the reason.
pub fn range(flag: &str, value: u64, lo: u64, hi: u64, why: &str) -> Result<()> {
    if value < lo || value > hi {
        bail!("{flag} {value} is out of range {lo}..={hi} ({why})");
    }
    Ok(())
}

/// The run-time parameters every generate, campaign arm and refine shares.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunParams {
    pub threads: i64,
    /// Threads for multi-token batches, where a run names them apart.
    pub threads_batch: Option<i64>,
    /// `--ctx` where given; without it the context is sized to the work ([`context`]).
    pub ctx: Option<u32>,
    pub batch: u32,
    pub n_predict: u32,
}

impl RunParams {
    pub fn check(&self) -> Result<()> {
        let why = "at most 4 x the available cores, and 1024";
        for (flag, n) in [("--threads", Some(self.threads)), ("--threads-batch", self.threads_batch)] {
            match n {
                // Quoted as given: a negative count is not "0".
                Some(n) if n < 1 => bail!("{flag} {n} is out of range 1..={} ({why})", max_threads()),
                Some(n) => range(flag, n as u64, 1, max_threads() as u64, why)?,
                None => {}
            }
        }
        if let Some(ctx) = self.ctx {
            range("--ctx", ctx as u64, 1, MAX_CTX as u64, "tokens of KV cache")?;
        }
        // A batch may exceed the context (one sized to a short prompt is): llama.cpp takes at most
        // the context of it, and every batch the harness feeds fits the context, so none is split
        // otherwise than it would be under a larger one.
        range("--batch", self.batch as u64, 1, MAX_BATCH as u64, "tokens per engine batch")?;
        let ctx = self.ctx.unwrap_or(MAX_CTX);
        range("--n-predict", self.n_predict as u64, 0, MAX_N_PREDICT.min(ctx) as u64, "at most the context")?;
        Ok(())
    }
}

/// A model's trained context length, as its file states it (`<arch>.context_length`, which
/// llama.cpp reads as `n_ctx_train`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainedContext {
    pub tokens: u64,
    /// The key it was read from, e.g. `qwen3moe.context_length`.
    pub key: String,
}

/// The context a run takes for its work, `prompt_tokens` (of `prompt`, as the error names it)
/// plus `n_predict`: `--ctx` where given, else exactly the work, up to the model's trained
/// length. A drafted run needs no more (a traversal never drafts past `n_predict`), so drafted
/// and one-token runs of one work get one context. Work that does not fit is refused in one
/// line naming `--ctx` and the trained length; an explicit `--ctx` may exceed the latter.
pub fn context(asked: Option<u32>, prompt: &str, prompt_tokens: usize, n_predict: u32, trained: Option<&TrainedContext>) -> Result<u32> {
    let need = prompt_tokens as u64 + u64::from(n_predict);
    let work = format!("{prompt} ({prompt_tokens} tokens) + --n-predict {n_predict} needs a context of {need}");
    let trained_is = |t: &TrainedContext| format!("the model's trained length is {} ({})", t.tokens, t.key);
    match (asked, trained) {
        (Some(c), t) if need > u64::from(c) => match t {
            Some(t) => bail!("{work}, over --ctx {c} ({})", trained_is(t)),
            None => bail!("{work}, over --ctx {c} (the model states no trained length)"),
        },
        (Some(c), _) => Ok(c),
        (None, Some(t)) if need > t.tokens => {
            bail!("{work}, over the model's trained length of {} ({}); pass --ctx to set it", t.tokens, t.key)
        }
        (None, _) if need > u64::from(MAX_CTX) => bail!("{work}, over {MAX_CTX} tokens, the most --ctx takes"),
        (None, _) => Ok(need as u32),
    }
}

/// The Plan's parameters (`--experts plan`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PlanParams {
    pub slots: u32,
    pub windows: u32,
    pub depth: u32,
    pub layer_buffers: u32,
}

impl PlanParams {
    pub fn check(&self) -> Result<()> {
        range("--slots", self.slots as u64, 1, MAX_SLOTS as u64, "expert slots per layer")?;
        range("--windows", self.windows as u64, 1, MAX_WINDOWS as u64, "registered staging windows")?;
        range("--depth", self.depth as u64, 1, MAX_DEPTH as u64, "io_uring's maximum of submission entries")?;
        range("--layer-buffers", self.layer_buffers as u64, 0, MAX_LAYER_BUFFERS as u64, "staging buffers per layer")?;
        Ok(())
    }
}

/// A byte count or memory limit that was refused; the message quotes what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("`{given}`: unknown size suffix `{suffix}` (use K, M, G or T, binary)")]
    UnknownSuffix { given: String, suffix: String },
    #[error("`{0}` is not a byte count")]
    NotACount(String),
    #[error("memory limit {0} is out of range {lo}..={hi} (1 MiB up to 1 PiB)", lo = MIN_MEMORY_MAX, hi = MAX_MEMORY_MAX)]
    MemoryMaxOutOfRange(u64),
}

/// `48405005312`, `48,405,005,312`, `11 GiB`, `11G`, `512MiB`: exact, binary multiples.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, ByteSizeError> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, suffix) = (t[..split].trim(), &t[split..]);
    let mul: u64 = match suffix.to_ascii_uppercase().trim_end_matches('B').trim_end_matches('I') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(ByteSizeError::UnknownSuffix { given: s.to_string(), suffix: suffix.to_string() }),
    };
    let digits: String = num.chars().filter(|c| *c != ',' && *c != '_').collect();
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| !digits.is_empty())
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| ByteSizeError::NotACount(s.to_string()))
}

/// A byte count as a person reads it, in the binary units [`parse_bytes`] takes: `4 MiB`,
/// `1.5 GiB`, `512 bytes` (exact below 1 KiB, one decimal above unless whole).
pub fn show_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 5] = [("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return match n % size {
                0 => format!("{} {unit}", n / size),
                _ => format!("{:.1} {unit}", n as f64 / size as f64),
            };
        }
    }
    format!("{n} bytes")
}

/// A memory limit in bytes, bounded.
pub fn parse_memory_max(s: &str) -> std::result::Result<u64, ByteSizeError> {
    let v = parse_bytes(s)?;
    if !(MIN_MEMORY_MAX..=MAX_MEMORY_MAX).contains(&v) {
        return Err(ByteSizeError::MemoryMaxOutOfRange(v));
    }
    Ok(v)
}

/// `path` must be an existing regular file (not a FIFO, directory, device or socket, which
/// would hang or fail a reader). Follows symlinks; never opens the file.
pub fn regular_file(what: &str, path: &Path) -> Result<()> {
    let m = std::fs::metadata(path).with_context(|| format!("{}: cannot open {what}", path.display()))?;
    if !m.is_file() {
        bail!("{}: {what} is not a regular file", path.display());
    }
    Ok(())
}

/// Opens `path` for reading without blocking on a FIFO, and refuses anything but a regular file.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    // Regular files ignore O_NONBLOCK; clear it anyway so reads behave as ever.
    {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use std::os::fd::AsRawFd;
        let fd = f.as_raw_fd();
        if let Ok(fl) = fcntl(fd, FcntlArg::F_GETFL) {
            let _ = fcntl(fd, FcntlArg::F_SETFL(OFlag::from_bits_retain(fl) & !OFlag::O_NONBLOCK));
        }
    }
    Ok(f)
}

/// Caps on the files the harness reads whole: each one is a regular file, stat'ed first, and
/// read no further than its cap (a file that grows while read is refused too).
pub const MAX_CAMPAIGN_FILE_BYTES: u64 = 4 << 20;
pub const MAX_LEDGER_BYTES: u64 = 64 << 20;
pub const MAX_PROMPT_FILE_BYTES: u64 = 64 << 20;
pub const MAX_RECORD_JSON_BYTES: u64 = 1 << 30;
pub const MAX_JOURNAL_BYTES: u64 = 1 << 30;
/// A campaign id names directories: at most this many bytes of `[A-Za-z0-9._-]`.
pub const MAX_CAMPAIGN_ID_BYTES: usize = 128;
/// Digest manifests a lookup by SHA-256 reads from the cache at most (one per model file hashed
/// on this machine).
pub const MAX_CACHED_MANIFESTS: usize = 4096;

/// Reads the regular file `path` whole, refusing anything else (a device, a FIFO) and anything
/// over `cap` bytes, with one line that names the file and `what` it is.
pub fn read_file(what: &str, path: &Path, cap: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = open_regular(path).with_context(|| format!("{}: cannot read {what}", path.display()))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > cap {
        bail!("{}: {what} of {len} bytes is over the {cap}-byte limit", path.display());
    }
    let mut out = Vec::with_capacity(len as usize);
    f.take(cap + 1).read_to_end(&mut out).with_context(|| format!("{}: cannot read {what}", path.display()))?;
    if out.len() as u64 > cap {
        bail!("{}: {what} grew past the {cap}-byte limit while it was read", path.display());
    }
    Ok(out)
}

/// [`read_file`] for text: refused, with the byte offset, unless UTF-8.
pub fn read_text(what: &str, path: &Path, cap: u64) -> Result<String> {
    String::from_utf8(read_file(what, path, cap)?).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        anyhow::anyhow!("{}:{line}:{column}: {what} is not UTF-8 (invalid byte at offset {at})", path.display())
    })
}

/// Why a campaign id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CampaignIdError {
    #[error("the campaign id must have 1 to {MAX_CAMPAIGN_ID_BYTES} bytes (it has {0})")]
    Length(usize),
    #[error("the campaign id may use letters, digits, `.`, `_` and `-` only (found {0:?})")]
    Character(char),
    #[error("the campaign id may not start with `.`")]
    LeadingDot,
}

/// A campaign id: bounded, and only characters that are safe in a directory name.
pub fn campaign_id(id: &str) -> std::result::Result<(), CampaignIdError> {
    if id.is_empty() || id.len() > MAX_CAMPAIGN_ID_BYTES {
        return Err(CampaignIdError::Length(id.len()));
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(CampaignIdError::Character(c));
    }
    if id.starts_with('.') {
        return Err(CampaignIdError::LeadingDot);
    }
    Ok(())
}

/// A prompt must be UTF-8: llama.cpp's tokenizer aborts the process on an invalid sequence.
pub fn prompt_text(what: &str, bytes: &[u8]) -> Result<()> {
    if let Err(e) = std::str::from_utf8(bytes) {
        bail!("{what}: the prompt is not valid UTF-8 (byte {})", e.valid_up_to());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_id_is_refused_by_what_is_wrong_with_it() {
        assert_eq!(campaign_id("bench-1.v2"), Ok(()));
        assert_eq!(campaign_id(""), Err(CampaignIdError::Length(0)));
        assert_eq!(campaign_id(&"x".repeat(MAX_CAMPAIGN_ID_BYTES + 1)), Err(CampaignIdError::Length(MAX_CAMPAIGN_ID_BYTES + 1)));
        assert_eq!(campaign_id("a/b"), Err(CampaignIdError::Character('/')));
        assert_eq!(campaign_id(".hidden"), Err(CampaignIdError::LeadingDot));
    }

    #[test]
    fn bounds_refuse_extremes_and_take_defaults() {
        assert!(RunParams { threads: 2, threads_batch: None, ctx: Some(4096), batch: 512, n_predict: 64 }.check().is_ok());
        assert!(RunParams { threads: 100_000, threads_batch: None, ctx: Some(4096), batch: 512, n_predict: 64 }.check().is_err());
        let e = RunParams { threads: -1, threads_batch: None, ctx: Some(4096), batch: 512, n_predict: 64 }.check().unwrap_err().to_string();
        assert!(e.starts_with("--threads -1 is out of range 1..="), "{e}");
        assert!(RunParams { threads: 2, threads_batch: None, ctx: Some(u32::MAX), batch: 512, n_predict: 64 }.check().is_err());
        assert!(PlanParams { slots: 8, windows: 8, depth: 8, layer_buffers: 0 }.check().is_ok());
        let e = PlanParams { slots: 8, windows: 8, depth: u32::MAX, layer_buffers: 0 }.check().unwrap_err().to_string();
        assert!(e.contains("--depth") && e.contains("out of range"), "{e}");
        assert!(PlanParams { slots: 8, windows: u32::MAX, depth: 8, layer_buffers: 0 }.check().is_err());
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert!(parse_memory_max("1").is_err());
        assert_eq!(
            parse_memory_max("1").unwrap_err().to_string(),
            "memory limit 1 is out of range 1048576..=1125899906842624 (1 MiB up to 1 PiB)"
        );
        assert_eq!(parse_bytes("3X").unwrap_err().to_string(), "`3X`: unknown size suffix `X` (use K, M, G or T, binary)");
        assert_eq!(parse_bytes("GiB").unwrap_err().to_string(), "`GiB` is not a byte count");
        assert!(prompt_text("p", b"\xf7\x8f\xbc\xbf").is_err());
    }

    #[test]
    fn the_context_is_the_work_unless_given_and_never_past_what_bounds_it() {
        let t = TrainedContext { tokens: 4096, key: "qwen3moe.context_length".into() };
        // Sized to the work, up to and including the trained length.
        assert_eq!(context(None, "prompt", 5000, 4, Some(&TrainedContext { tokens: 8192, ..t.clone() })).unwrap(), 5004);
        assert_eq!(context(None, "prompt", 4092, 4, Some(&t)).unwrap(), 4096);
        assert_eq!(context(None, "prompt", 3, 2, None).unwrap(), 5);
        let e = context(None, "prompt", 9000, 4, Some(&t)).unwrap_err().to_string();
        assert_eq!(e, "prompt (9000 tokens) + --n-predict 4 needs a context of 9004, over the model's trained length of 4096 (qwen3moe.context_length); pass --ctx to set it");
        // A given context is taken as given, past the trained length too, and never too small.
        assert_eq!(context(Some(1024), "prompt", 3, 2, Some(&t)).unwrap(), 1024);
        assert_eq!(context(Some(9004), "prompt", 9000, 4, Some(&t)).unwrap(), 9004);
        let e = context(Some(4096), "prompt 2", 5000, 4, Some(&TrainedContext { tokens: 32768, ..t.clone() })).unwrap_err().to_string();
        assert_eq!(e, "prompt 2 (5000 tokens) + --n-predict 4 needs a context of 5004, over --ctx 4096 (the model's trained length is 32768 (qwen3moe.context_length))");
        let e = context(None, "prompt", MAX_CTX as usize, 1, None).unwrap_err().to_string();
        assert!(e.contains("over 1048576 tokens, the most --ctx takes"), "{e}");
        // Without --ctx, only the batch's and the outputs' own ceilings apply before the work is known.
        assert!(RunParams { threads: 2, threads_batch: None, ctx: None, batch: 512, n_predict: 5000 }.check().is_ok());
        assert!(RunParams { threads: 2, threads_batch: None, ctx: Some(4096), batch: 512, n_predict: 5000 }.check().is_err());
    }

    #[test]
    fn byte_counts_read_back_in_the_units_they_parse_from() {
        assert_eq!(show_bytes(4 << 20), "4 MiB");
        assert_eq!(parse_bytes(&show_bytes(4 << 20)), Ok(4 << 20));
        assert_eq!(show_bytes(3 << 29), "1.5 GiB");
        assert_eq!(show_bytes(1023), "1023 bytes");
        assert_eq!(show_bytes(1 << 50), "1 PiB");
    }

    #[test]
    fn the_default_threads_are_every_core_and_named_counts_win() {
        let cores = cores();
        assert_eq!(default_threads(), cores);
        let within =
            |t: u32| RunParams { threads: t.into(), threads_batch: Some(t.into()), ctx: Some(4096), batch: 512, n_predict: 64 }.check();
        assert!(within(default_threads()).is_ok());
        // Both take every core unless the run names threads; a named --threads sets both.
        let all = i64::from(cores);
        assert_eq!(threads(None, None), (all, all));
        assert_eq!(threads(Some(3), None), (3, 3));
        assert_eq!(threads(Some(3), Some(5)), (3, 5));
        assert_eq!(threads(None, Some(5)), (all, 5));
        let e =
            RunParams { threads: 1, threads_batch: Some(0), ctx: Some(4096), batch: 512, n_predict: 64 }.check().unwrap_err().to_string();
        assert!(e.starts_with("--threads-batch 0 is out of range 1..="), "{e}");
    }
}
