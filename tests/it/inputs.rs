//! Hostile inputs: each is refused with one line naming the flag or file, never an abort, a
//! hang or a huge allocation; non-finite logits fail the run.

use crate::common;

use common::*;
use sovereign::gguf::{Gguf, GgufWriter, TensorSpec};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A fresh directory for one test, removed when the test ends (however it ends).
struct Tmp(std::path::PathBuf);

impl std::ops::Deref for Tmp {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn tmp(name: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("sovereign-inputs-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

/// Runs with a wall-clock bound; a hang fails the test instead of the suite.
fn run_bounded(args: &[&std::ffi::OsStr], secs: u64) -> Run {
    let mut child =
        Reaped::new(bin().args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap());
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sovereign {args:?} still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn os(v: &[&str]) -> Vec<std::ffi::OsString> {
    v.iter().map(Into::into).collect()
}

fn refs(v: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    v.iter().map(|s| s.as_os_str()).collect()
}

#[test]
fn invalid_utf8_prompt_is_refused_not_aborted() {
    let d = tmp("utf8");
    let m = forge(&d, "m.gguf", 11, &[]);
    let bad = b"\xf7\x8f\xbc\xbf";
    let pf = d.join("p.txt");
    fs::write(&pf, bad).unwrap();
    let rec = d.join("r1");
    let r = run(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--prompt-file",
        pf.to_str().unwrap(),
        "--n-predict",
        "2",
        "--record",
        rec.to_str().unwrap(),
    ]);
    assert_one_line_error(&r, &["--prompt-file", "UTF-8"]);
    let mut a =
        os(&["generate", "--model", m.to_str().unwrap(), "--n-predict", "2", "--record", d.join("r2").to_str().unwrap(), "--prompt"]);
    a.push(std::ffi::OsStr::from_bytes(bad).into());
    let r = run_bounded(&refs(&a), 60);
    assert!(r.code == 2 && !r.stderr.contains("invalid codepoint"), "{}{}", r.stdout, r.stderr);
    assert!(!rec.exists());
}

#[test]
fn absurd_run_parameters_are_refused_with_the_flag() {
    let d = tmp("bounds");
    let m = forge(&d, "m.gguf", 11, &[]);
    let rec = d.join("r");
    let m = m.to_str().unwrap();
    let rec = rec.to_str().unwrap();
    for (extra, needle) in [
        (&["--threads", "100000"][..], "--threads"),
        (&["--n-predict", "4294967295"][..], "--n-predict"),
        (&["--batch", "4294967295"][..], "--batch"),
        (&["--ctx", "4294967295"][..], "--ctx"),
        (&["--experts", "plan", "--windows", "4294967295"][..], "--windows"),
        (&["--experts", "plan", "--depth", "4294967295"][..], "--depth"),
        (&["--experts", "plan", "--slots", "4294967295"][..], "--slots"),
        (&["--experts", "plan", "--policy", "lru:0"][..], "lru:0"),
        (&["--policy", "lru:2"][..], "--experts plan"),
        (&["--slots", "4"][..], "--experts plan"),
        (&["--fault", "short_read"][..], "--experts plan"),
        (&["--layer-buffers", "2"][..], "--experts plan"),
        (&["--token-pass", "2"][..], "--experts plan"),
        (&["--timeline-token", "1"][..], "--experts plan"),
        (&["--source", "d"][..], "--experts plan"),
        (&["--windows", "2"][..], "--experts plan"),
        (&["--depth", "2"][..], "--experts plan"),
        (&["--experts", "host", "--token-pass", "2"][..], "--experts plan"),
    ] {
        let mut a = vec!["generate", "--model", m, "--prompt", "hi", "--record", rec];
        a.extend_from_slice(extra);
        let t = Instant::now();
        let r = run(&a);
        assert_one_line_error(&r, &[needle]);
        assert!(t.elapsed() < Duration::from_secs(20), "{extra:?} took {:?}", t.elapsed());
    }
    let r = run(&["generate", "--model", m, "--prompt", "hi", "--record", rec, "--memory-max", "1"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("memory") && r.stderr.contains("out of range"), "{}", r.stderr);
    assert!(!std::path::Path::new(rec).exists());
}

#[test]
fn non_regular_model_is_refused_not_waited_on() {
    let d = tmp("fifo");
    let fifo = d.join("fifo.gguf");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a plain mkfifo on a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for model in [fifo.clone(), d.to_path_buf()] {
        let m = model.to_str().unwrap();
        let r = run_bounded(&refs(&os(&["inventory", m])), 20);
        assert_one_line_error(&r, &["not a regular file"]);
        let r = run_bounded(&refs(&os(&["generate", "--model", m, "--prompt", "hi", "--record", d.join("r").to_str().unwrap()])), 20);
        assert_one_line_error(&r, &["--model", "not a regular file"]);
    }
}

#[test]
fn forge_refuses_to_overwrite() {
    let d = tmp("forge");
    let out = d.join("m.gguf");
    fs::write(&out, b"keep").unwrap();
    let r = run(&["model", "forge", "--preset", "tiny", "--seed", "1", "--out", out.to_str().unwrap()]);
    assert_one_line_error(&r, &["--out exists"]);
    assert_eq!(fs::read(&out).unwrap(), b"keep");
}

const CAMPAIGN: &str = "tests/data/inputs-campaign.yaml";

/// The test campaign in `d` (beside its `m.gguf` and `p.txt`), pinned to their digests and to
/// this build, then edited.
fn campaign_with(d: &std::path::Path, edit: impl Fn(String) -> String) -> Run {
    let zeros = "0".repeat(64);
    let (tree, patches) = build_identity();
    let pinned = fs::read_to_string(CAMPAIGN)
        .unwrap()
        .replacen(&zeros, &sovereign::util::sha256_file(&d.join("m.gguf")).unwrap(), 1)
        .replacen(&zeros, &sovereign::util::sha256_file(&d.join("p.txt")).unwrap(), 1)
        .replacen(&zeros, &tree, 1)
        .replacen("  patches: []\n", &patches, 1);
    let text = edit(pinned);
    let f = d.join("c.yaml");
    fs::write(&f, text).unwrap();
    let t = Instant::now();
    // Bounded address space: a refusal needs no more than a few hundred MiB.
    let r = {
        let out = std::process::Command::new("prlimit")
            .arg("--as=2147483648")
            .arg(env!("CARGO_BIN_EXE_sovereign"))
            .args(["campaign", "check", f.to_str().unwrap()])
            .output()
            .unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    };
    assert!(t.elapsed() < Duration::from_secs(10));
    r
}

#[test]
fn campaign_check_applies_the_same_bounds() {
    let d = tmp("campaign");
    fs::write(d.join("m.gguf"), b"model").unwrap();
    fs::write(d.join("p.txt"), b"prompt").unwrap();
    let good = campaign_with(&d, |t| t);
    assert_eq!(good.code, 0, "{}{}", good.stdout, good.stderr);
    for (from, to, needle) in [
        ("count: 3", "count: 4294967295", "cells"),
        ("count: 3", "count: 3000000", "cells"),
        ("threads: 2", "threads: 4294967295", "threads"),
        ("slots: 4", "slots: 4294967295", "slots"),
        ("windows: 4", "windows: 4294967295", "windows"),
        ("depth: 4", "depth: 4294967295", "depth"),
        ("path: m.gguf", "path: missing.gguf", "model.path"),
        ("prompt_file: p.txt", "prompt_file: .", "workload.prompt_file"),
    ] {
        let r = campaign_with(&d, |t| t.replacen(from, to, 1));
        assert_eq!(r.code, 1, "{to}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(needle) && !r.stderr.contains("memory allocation"), "{to}: {}", r.stderr);
        // The campaign's own field name, not the command line's flag.
        assert!(!r.stderr.contains(&format!("--{needle}")), "{to}: {}", r.stderr);
    }
}

/// Files read whole are regular files with a cap: a device is refused at once, an oversized or
/// non-UTF-8 campaign file names itself (with the position of the bad byte), and a campaign id
/// that would not make a directory name is refused by `check`, at its position.
#[test]
fn files_read_whole_are_bounded_and_named() {
    let d = tmp("bounded");
    fs::write(d.join("m.gguf"), b"model").unwrap();
    fs::write(d.join("p.txt"), b"prompt").unwrap();
    let t = Instant::now();
    let r = run_bounded(&refs(&os(&["verify", "--ledger", "/dev/zero", "--claim", "c"])), 10);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("/dev/zero: cannot read the ledger") && r.stderr.contains("not a regular file"), "{}", r.stderr);
    assert!(t.elapsed() < Duration::from_secs(5), "a device is refused before it is read");

    // An oversized or non-UTF-8 campaign file: one line that names the file once, the same
    // from `check` and `run` (which adds `error: `).
    let big = d.join("big.yaml");
    fs::write(&big, vec![b'#'; (sovereign::bounds::MAX_CAMPAIGN_FILE_BYTES + 1) as usize]).unwrap();
    let bad = d.join("bad.yaml");
    fs::write(&bad, b"id: ok\nmodel:\n  path: m\xffgguf\n").unwrap();
    for (file, want) in [
        (&big, format!("{}: the campaign file of 4194305 bytes is over the 4194304-byte limit", big.display())),
        (&bad, format!("{}:3:10: the campaign file is not UTF-8 (invalid byte at offset 23)", bad.display())),
    ] {
        let r = run_bounded(&refs(&os(&["campaign", "check", file.to_str().unwrap()])), 10);
        assert_eq!((r.code, r.stderr.as_str()), (1, format!("{want}\n").as_str()));
        let results = d.join("results");
        let r = run_bounded(&refs(&os(&["campaign", "run", file.to_str().unwrap(), "--results", results.to_str().unwrap()])), 10);
        assert_eq!((r.code, r.stderr.as_str()), (2, format!("error: {want}\n").as_str()));
        assert!(!results.exists());
    }

    for (id, needle) in
        [("a".repeat(129), "1 to 128 bytes"), ("ok/../x".to_string(), "found '/'"), (".hidden".to_string(), "may not start with `.`")]
    {
        let r = campaign_with(&d, |t| {
            let at = t.find("\nid: ").map(|i| i + 1).unwrap_or_else(|| if t.starts_with("id: ") { 0 } else { panic!("no id line") });
            let end = at + t[at..].find('\n').unwrap();
            format!("{}id: {id:?}{}", &t[..at], &t[end..])
        });
        assert_eq!(r.code, 1, "{id}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(needle) && r.stderr.contains("c.yaml:"), "{id}: {}", r.stderr);
    }
    // The id at the limit is fine.
    let r = campaign_with(&d, |t| {
        let at = t.find("\nid: ").map(|i| i + 1).unwrap_or(0);
        let end = at + t[at..].find('\n').unwrap();
        format!("{}id: {}{}", &t[..at], "a".repeat(128), &t[end..])
    });
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

/// Rewrites the model `src` into `dst` through the project's GGUF writer: metadata whose key
/// `keep_kv` accepts, and the tensor directory `tensors` returns. A tensor kept with its name,
/// type and shape keeps its payload; any other is zeros.
fn rewrite(src: &Path, dst: &Path, keep_kv: impl Fn(&str) -> bool, tensors: impl FnOnce(&Gguf) -> Vec<TensorSpec>) {
    let g = Gguf::open(src).unwrap();
    let mut w = GgufWriter::default();
    for (k, v) in g.metadata.iter().filter(|(k, _)| keep_kv(k)) {
        w.kv(k.clone(), v.clone());
    }
    for t in tensors(&g) {
        w.tensor(t);
    }
    let data = fs::read(src).unwrap();
    w.write(dst, |_, spec, buf| {
        if let Some(t) = g.tensor(&spec.name).filter(|t| t.dims == spec.dims && t.ggml_type == spec.ggml_type) {
            buf.copy_from_slice(&data[t.offset as usize..t.end() as usize]);
        }
    })
    .unwrap();
}

fn spec_of(t: &sovereign::gguf::TensorInfo) -> TensorSpec {
    TensorSpec::new(t.name.clone(), t.ggml_type, &t.dims)
}

/// Address space the binary may use when it refuses a file: far below what the file's counts
/// would make a careless reader allocate.
const REFUSAL_AS: u64 = 1 << 30;

/// Runs the binary under RLIMIT_AS = [`REFUSAL_AS`]; returns its result and peak RSS (wait4),
/// which is the child's own only where the test runs [`alone`].
fn run_in_little_memory(args: &[&str]) -> (Run, u64) {
    use std::os::unix::process::CommandExt;
    let d = tempfile::tempdir().unwrap();
    let (out, err) = (d.path().join("out"), d.path().join("err"));
    let mut cmd = bin();
    cmd.args(args).stdout(fs::File::create(&out).unwrap()).stderr(fs::File::create(&err).unwrap());
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: REFUSAL_AS, rlim_max: REFUSAL_AS };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = Reaped::new(cmd.spawn().unwrap());
    let (mut status, mut ru) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for our own child; status and rusage are valid out-parameters.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert_eq!(pid, child.id() as libc::pid_t);
    #[allow(clippy::zombie_processes, reason = "wait4 above reaped it")]
    let _ = child.reaped_by_hand();
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -libc::WTERMSIG(status) };
    let run = Run { code, stdout: fs::read_to_string(&out).unwrap(), stderr: fs::read_to_string(&err).unwrap() };
    (run, ru.ru_maxrss as u64 * 1024)
}

#[test]
fn absurd_counts_and_shapes_are_refused_in_little_memory() {
    if !alone() {
        return;
    }
    let d = tmp("absurd");
    let m = forge(&d, "m.gguf", 11, &[]);
    let expert = |n: &str| n.contains("_exps.");
    // Experts counted only by their shapes: no expert_count, no routers, each expert tensor
    // [1, 1, 2^20] in the bytes of the real one (a million experts per layer).
    let shapes = d.join("shapes.gguf");
    rewrite(
        &m,
        &shapes,
        |k| !k.contains("expert_"),
        |g| {
            g.tensors
                .iter()
                .filter(|t| !t.name.contains("ffn_gate_inp"))
                .map(|t| if expert(&t.name) { TensorSpec::new(t.name.clone(), t.ggml_type, &[1, 1, 1 << 20]) } else { spec_of(t) })
                .collect()
        },
    );
    // One merged gate_up tensor per layer, [1, 1, 3 x 2^20], in place of gate, up and down.
    let gate_up = d.join("gate_up.gguf");
    rewrite(
        &m,
        &gate_up,
        |_| true,
        |g| {
            g.tensors
                .iter()
                .filter_map(|t| match t.name.strip_suffix("ffn_gate_exps.weight") {
                    Some(blk) => Some(TensorSpec::new(format!("{blk}ffn_gate_up_exps.weight"), t.ggml_type, &[1, 1, 3 << 20])),
                    None => (!expert(&t.name)).then(|| spec_of(t)),
                })
                .collect()
        },
    );
    // A metadata array of 2^25 one-byte values: every element is in the file.
    let array = d.join("array.gguf");
    {
        let n: u64 = 1 << 25;
        let key = b"general.padding";
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.resize(b.len() + n as usize, 7);
        fs::write(&array, b).unwrap();
    }
    for (file, needle) in [(&shapes, "expert"), (&gate_up, "gate_up"), (&array, "general.padding")] {
        let f = file.to_str().unwrap();
        let (r, rss) = run_in_little_memory(&["inventory", f]);
        eprintln!("inventory {}: exit {}, peak RSS {} KiB: {}", file.display(), r.code, rss >> 10, r.stderr.trim());
        assert_one_line_error(&r, &[f, needle]);
        assert!(rss < 256 << 20, "inventory of {f} peaked at {rss} bytes");
        let rec = d.join("r");
        let (r, rss) = run_in_little_memory(&["generate", "--model", f, "--prompt", "hi", "--record", rec.to_str().unwrap()]);
        assert_one_line_error(&r, &[f, needle]);
        assert!(rss < 256 << 20, "generate on {f} peaked at {rss} bytes");
        assert!(!rec.exists() && !d.join("r.partial").exists());
    }
}

#[test]
fn nan_logits_fail_the_run_naming_the_row() {
    let d = tmp("nan");
    let m = forge(&d, "m.gguf", 11, &[]);
    let nan = with_nan(&m, "token_embd.weight", &d.join("nan.gguf"));
    let rec = d.join("r");
    let r = generate(&nan, "Every logit is NaN.", 8, &rec, &[]);
    assert_ne!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("logits row 0 is not finite"), "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    assert_eq!(v["outcome"], "failed");
    assert!(v["error"].as_str().unwrap().contains("logits row 0 is not finite (vocabulary entry 0 is NaN)"), "{v}");
    assert_eq!(v["counts"]["generated_tokens"], 0);
    assert!(!rec.join("tokens.bin").exists() && !d.join("r.partial").exists());
}

/// The verbs are listed in the order a newcomer meets them, and each one's help ends with a
/// worked example that names the verb itself.
#[test]
fn every_verb_teaches_with_an_example() {
    let top = ok(&["--help"]).stdout;
    let verbs: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|v| *v != "help")
        .collect();
    assert_eq!(&verbs[..4], ["model", "inventory", "generate", "compare"], "{top}");
    assert!(verbs.len() >= 18, "{verbs:?}");
    let commands = |help: &str| -> Vec<String> {
        help.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .filter(|v| v != "help")
            .collect()
    };
    let mut nested = 0;
    for v in verbs {
        let help = ok(&[v, "--help"]).stdout;
        let example = help.rsplit("Example").next().unwrap_or_default();
        assert!(
            help.contains("Example") && example.contains(&format!("sovereign {}", if v == "refine" { "campaign" } else { v })),
            "{v}: {help}"
        );
        // Each subcommand's help ends with an example of that very subcommand.
        for sub in commands(&help) {
            let help = ok(&[v, &sub, "--help"]).stdout;
            let example = help.rsplit("Example").next().unwrap_or_default();
            assert!(help.contains("Example") && example.contains(&format!("sovereign {v} {sub}")), "{v} {sub}: {help}");
            nested += 1;
        }
    }
    assert!(nested >= 14, "{nested} subcommands");
}
