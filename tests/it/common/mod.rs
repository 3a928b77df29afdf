//! Shared helpers for integration tests: the built binary and forged models.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

/// The digest cache of the suite's runs, under target/.
pub fn test_cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-cache")
}

/// The binary, with its digest cache under target/ unless SOVEREIGN_CACHE says otherwise.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sovereign"));
    if std::env::var_os("SOVEREIGN_CACHE").is_none() {
        c.env("SOVEREIGN_CACHE", test_cache());
    }
    c
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(args: &[&str]) -> Run {
    let out: Output = bin().args(args).output().expect("spawn sovereign");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn ok(args: &[&str]) -> Run {
    let r = run(args);
    assert_eq!(r.code, 0, "sovereign {args:?} failed:\n{}\n{}", r.stdout, r.stderr);
    r
}

/// A small forged qwen3moe model (fast to generate and run).
pub fn forge(dir: &Path, name: &str, seed: u64, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let seed = seed.to_string();
    let mut args = vec!["model", "forge", "--preset", "tiny", "--seed", &seed, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    ok(&args);
    out
}

pub fn generate(model: &Path, prompt: &str, n: u32, record: &Path, extra: &[&str]) -> Run {
    let n = n.to_string();
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        prompt,
        "--n-predict",
        &n,
        "--threads",
        "2",
        "--record",
        record.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// Plan options for F with `policy` over `slots` slots, every other setting its default.
pub fn plan_options(policy: &str, slots: u32) -> sovereign::plan::PlanOptions {
    sovereign::plan::PlanOptions {
        slots,
        policy: policy.parse().unwrap(),
        source: sovereign::plan::SourceKind::F,
        windows: None,
        depth: None,
        layer_buffers: 0,
        timeline_token: None,
        token_pass: None,
        prompt_pass: None,
        budget: None,
        verify: None,
        fault: sovereign::source::fault::FaultCell::None,
    }
}

/// A library run's spec: 2 threads, batch 512, context 512.
pub fn generate_spec(model: &Path, record: &Path, prompt: &str, n: u32) -> sovereign::generate::GenerateSpec {
    sovereign::generate::GenerateSpec {
        model: model.to_path_buf(),
        prompt: prompt.as_bytes().to_vec(),
        n_predict: n,
        exec: sovereign::exec::ExecParams {
            n_ctx: Some(512),
            n_batch: 512,
            n_ubatch: 512,
            threads: 2,
            threads_batch: None,
            flash_attn: false,
        },
        ignore_eos: false,
        draft: None,
        record: record.to_path_buf(),
        seal: false,
    }
}

/// A process a test started, killed (SIGKILL) and reaped when this is dropped: at the end of the
/// test and on every path out of it, a failed assertion's unwinding included, so no test leaves a
/// process running. Every `.spawn()` in tests/ goes through it (tests/it/architecture.rs checks).
pub struct Reaped(Option<Child>);

impl Reaped {
    pub fn new(child: Child) -> Reaped {
        Reaped(Some(child))
    }

    /// Waits for the process to end and collects its piped output (it is then reaped).
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        self.0.take().expect("a process not yet waited for").wait_with_output()
    }

    /// The process, once the caller has reaped it by other means (`wait4`): it must not be
    /// signalled again, since its pid may already name another process.
    pub fn reaped_by_hand(mut self) -> Child {
        self.0.take().expect("a process not yet waited for")
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("a process not yet waited for")
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("a process not yet waited for")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            // Both are harmless where the process has already ended or been waited for.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A bad-input run: exit code 2, one line on stderr, no panic, naming what it should.
pub fn assert_one_line_error(r: &Run, needles: &[&str]) {
    assert_eq!(r.code, 2, "expected exit 2, got {}: {}{}", r.code, r.stdout, r.stderr);
    assert!(!r.stderr.contains("panicked"), "panic: {}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {:?}", r.stderr);
    for n in needles {
        assert!(lines[0].contains(n), "error line {:?} does not mention {n:?}", lines[0]);
    }
}

/// A test that cannot run here: locally it says so and skips, visibly; in CI (`CI=true`) the
/// missing prerequisite fails the test, so CI never passes by skipping.
pub fn skip(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
        panic!("{test}: CI=true and {why}");
    }
    eprintln!("SKIP {test}: {why}");
}

/// Whether memory cgroups can be made here; where not, [`skip`] (fails under CI=true).
pub fn cgroups_usable() -> bool {
    match sovereign::observe::cleanup_stale() {
        Ok(_) => true,
        Err(e) => {
            skip(&test_name(), &format!("no usable memory cgroup here: {e:#}"));
            false
        }
    }
}

/// The running test's name (libtest names its threads after the tests).
pub fn test_name() -> String {
    std::thread::current().name().unwrap_or("test").to_string()
}

/// Whether this process runs the calling test alone. In the suite's process it runs the test
/// again in a fresh process of this binary, checks that it passed, and returns false (the
/// caller returns); in that process it returns true. For tests that measure a child's peak
/// RSS: a forked child starts with its parent's resident pages, which wait4's ru_maxrss counts,
/// and the suite's process holds the memory of every test running beside it.
pub fn alone() -> bool {
    const ALONE: &str = "SOVEREIGN_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let test = test_name();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test, "--nocapture", "--test-threads", "1"])
        .env(ALONE, &test)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{test}, run alone:\n{text}");
    eprint!("{text}");
    false
}

/// This build's engine tree digest and its patch series as a campaign's `build:` lines.
pub fn build_identity() -> (String, String) {
    let r = ok(&["build-info", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let tree = v["engine"]["tree_sha256"].as_str().unwrap().to_string();
    let patches: Vec<String> = v["engine"]["patches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("    - {{ name: {}, sha256: {} }}\n", p["name"].as_str().unwrap(), p["sha256"].as_str().unwrap()))
        .collect();
    (tree, if patches.is_empty() { "  patches: []\n".into() } else { format!("  patches:\n{}", patches.concat()) })
}

/// A copy of `model` at `out` whose F32 tensor `tensor` holds only NaN: every logit it feeds
/// becomes NaN, which must fail a run, never pass for a decision.
pub fn with_nan(model: &Path, tensor: &str, out: &Path) -> PathBuf {
    let g = sovereign::gguf::Gguf::open(model).unwrap();
    let t = g.tensor(tensor).unwrap_or_else(|| panic!("{} has no `{tensor}`", model.display()));
    assert_eq!(t.ggml_type, sovereign::gguf::GgmlType::F32);
    let mut bytes = std::fs::read(model).unwrap();
    for v in bytes[t.offset as usize..t.end() as usize].chunks_exact_mut(4) {
        v.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(out, bytes).unwrap();
    out.to_path_buf()
}

/// Tensors of a rewritten model: each (name, shape, sources), its data the sources' bytes one
/// after another (its type the first source's).
pub type Rewrite = Vec<(String, Vec<u64>, Vec<String>)>;

/// A copy of `model` with its metadata edited by `meta` and its tensors made by `plan`.
pub fn rewrite(
    model: &Path,
    out: &Path,
    meta: impl Fn(&mut Vec<(String, sovereign::gguf::Value)>),
    plan: impl Fn(&sovereign::gguf::Gguf) -> Rewrite,
) -> PathBuf {
    use std::io::{Read, Seek, SeekFrom};
    let g = sovereign::gguf::Gguf::open(model).unwrap();
    let mut w =
        sovereign::gguf::GgufWriter { metadata: g.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), ..Default::default() };
    meta(&mut w.metadata);
    let tensors = plan(&g);
    for (name, dims, from) in &tensors {
        w.tensor(sovereign::gguf::TensorSpec::new(name.clone(), g.tensor(&from[0]).unwrap().ggml_type, dims));
    }
    let mut f = std::fs::File::open(model).unwrap();
    w.write(out, |i, _, buf| {
        let mut at = 0;
        for src in &tensors[i].2 {
            let t = g.tensor(src).unwrap();
            f.seek(SeekFrom::Start(t.offset)).unwrap();
            f.read_exact(&mut buf[at..at + t.bytes as usize]).unwrap();
            at += t.bytes as usize;
        }
        assert_eq!(at, buf.len());
    })
    .unwrap();
    out.to_path_buf()
}

/// `m` at weight type `ty` (`f32`: `m` itself), quantized by `model quantize` into `dir`.
pub fn quantized(dir: &Path, m: &Path, ty: &str) -> PathBuf {
    if ty == "f32" {
        return m.to_path_buf();
    }
    let q = dir.join(format!("{ty}.gguf"));
    ok(&["model", "quantize", "--type", ty, m.to_str().unwrap(), q.to_str().unwrap()]);
    q
}

/// Every deterministic fault cell (seed 000 Table 7), as `--fault` names them.
pub const FAULT_CELLS: &[&str] = &[
    "short_read",
    "eio",
    "out_of_order",
    "stale_completion",
    "wrong_object",
    "held_consumer",
    "reset_outstanding",
    "shutdown_live_consumer",
    "partial_bundle",
    "corrupt_byte",
];

/// The claim `id` as `export` prints it, anchored by its digest (`ID@DIGEST`).
pub fn anchored_claim(export_stdout: &str, id: &str) -> String {
    let prefix = format!("claim {id}@");
    export_stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|d| format!("{id}@{d}"))
        .unwrap_or_else(|| panic!("export printed no claim {id}:\n{export_stdout}"))
}

/// A record directory's `record.json`.
pub fn record_json(rec: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
}

/// Surface name -> exact, from `compare --json`.
pub fn compare_surfaces(a: &Path, b: &Path) -> Vec<(String, bool)> {
    let r = run(&["compare", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", r.stdout, r.stderr));
    v["surfaces"].as_array().unwrap().iter().map(|s| (s["surface"].as_str().unwrap().to_string(), s["status"] == "exact")).collect()
}

/// A CSV table: its rows, and a column's index by name.
pub struct Table {
    pub headers: csv::StringRecord,
    pub rows: Vec<csv::StringRecord>,
}

impl Table {
    pub fn read(path: &Path) -> Table {
        let mut rd = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let headers = rd.headers().unwrap().clone();
        Table { headers, rows: rd.records().map(Result::unwrap).collect() }
    }

    pub fn col(&self, name: &str) -> usize {
        self.headers.iter().position(|c| c == name).unwrap_or_else(|| panic!("{name} in {:?}", self.headers))
    }
}

/// `reproduce` of a claim from an export's ledger; its report (`holds`, `records`, ...).
pub fn reproduce_claim(claim: &str, ledger: &Path, results: &Path, out: &Path, campaign: &Path) -> serde_json::Value {
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let r = ok(&[
        "reproduce",
        "--claim",
        claim,
        "--ledger",
        &s(ledger),
        "--results",
        &s(results),
        "--out",
        &s(out),
        "--campaign",
        &s(campaign),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v["report"].clone()
}

/// Runs `campaign` into `results`, checks how many records it sealed, exports it into `out`
/// and returns its anchored claim (`ID@DIGEST`).
pub fn run_and_export(campaign: &Path, id: &str, results: &Path, out: &Path, sealed: u64) -> String {
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let r = ok(&["campaign", "run", &s(campaign), "--results", &s(results), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["sealed"], sealed, "{v}");
    anchored_claim(&ok(&["export", "--campaign", id, "--results", &s(results), "--out", &s(out)]).stdout, id)
}

/// A tiny forged model of `arch` at `seed`, named after its arguments.
pub fn forge_arch(dir: &Path, arch: &str, seed: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("{arch}-{seed}{}.gguf", extra.concat()));
    let mut args = vec!["model", "forge", "--arch", arch, "--preset", "tiny", "--seed", seed, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    ok(&args);
    out
}

/// `generate --ignore-eos` that must succeed; its record.
pub fn generate_record(model: &Path, prompt: &str, n: u32, rec: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--ignore-eos"];
    args.extend_from_slice(extra);
    let r = generate(model, prompt, n, rec, &args);
    assert_eq!(r.code, 0, "{} {extra:?}: {}{}", model.display(), r.stdout, r.stderr);
    record_json(rec)
}

/// A campaign's closing sections as the tests write them: exactness required, no headroom
/// asked, stops on failure, no reruns.
pub const CAMPAIGN_TAIL: &str = "admission:\n  require_exact: true\n  min_headroom_bytes: 0\n  max_limit_events: 0\n\
stop:\n  arm_after_admission_failure: true\n  campaign_after_oracle_failure: true\n\
repetition:\n  outcome_selected_reruns: none\n  max_interrupted_attempts: 3\n";
