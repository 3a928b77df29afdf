//! Campaigns end to end on a forged tiny model: check, preregistration, unattended run,
//! SIGKILL + resume, verify / replay / tamper, stats, export.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A campaign directory: the tiny model, the demo prompt and a resident-only campaign file.
struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    file: PathBuf,
    results: PathBuf,
}

fn sha256(p: &Path) -> String {
    sovereign::util::sha256_file(p).unwrap()
}

/// `blocks` lines under `preordered:`; `outputs` tokens per cell.
fn setup(id: &str, blocks: &[&str], outputs: u32) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("campaigns");
    fs::create_dir_all(&dir).unwrap();
    let model = forge(tmp.path(), "tiny.gguf", 1, &[]);
    let prompt = dir.join("prompt.txt");
    fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("campaigns/prompts/demo.txt"), &prompt).unwrap();
    let (tree, patches) = build_identity();
    let blocks: String = blocks.iter().map(|b| format!("      - {b}\n")).collect();
    let text = format!(
        "# test campaign\n\
id: {id}\n\
model:\n  path: ../tiny.gguf\n  sha256: {model_sha}\n\
workload:\n  prompt_file: prompt.txt\n  prompt_sha256: {prompt_sha}\n  prompt_tokens: 181\n  outputs: {outputs}\n  ignore_eos: true\n\
build:\n  engine_tree_sha256: {tree}\n{patches}\
arms:\n  - id: oracle\n    experts: resident\n    threads: 2\n  - id: A\n    experts: resident\n    threads: 2\n  - id: B\n    experts: resident\n    threads: 1\n\
schedule:\n  lead: [oracle]\n  blocks:\n    preordered:\n{blocks}\
oracle:\n  arm: oracle\n  relation: all_surfaces\n  horizon: {outputs}\n\
admission:\n  require_exact: true\n  min_headroom_bytes: 0\n  max_limit_events: 0\n\
stop:\n  arm_after_admission_failure: true\n  campaign_after_oracle_failure: true\n\
repetition:\n  outcome_selected_reruns: none\n  max_interrupted_attempts: 3\n\
analysis:\n  pairs:\n    a: A\n    b: B\n    metric: {{ file: cell.json, pointer: /outcome/wall_s }}\n    level: 0.95\n",
        model_sha = sha256(&model),
        prompt_sha = sha256(&prompt),
    );
    let file = dir.join(format!("{id}.yaml"));
    fs::write(&file, text).unwrap();
    let results = tmp.path().join("results");
    Setup { dir, file, results, _tmp: tmp }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn journal(results: &Path, id: &str) -> Vec<Value> {
    fs::read_to_string(results.join("campaigns").join(id).join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn events<'a>(j: &'a [Value], kind: &str) -> Vec<&'a Value> {
    j.iter().filter(|e| e["event"] == kind).collect()
}

fn record_dirs(results: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        fs::read_dir(results).unwrap().flatten().map(|e| e.path()).filter(|p| p.file_name().unwrap().len() == 64).collect();
    v.sort();
    v
}

/// Every expanded cell has exactly one `cell_sealed`, its record exists and verifies, and
/// nothing else is in results/.
fn assert_sealed_exactly_once(results: &Path, id: &str, cells: usize) -> Vec<Value> {
    let j = journal(results, id);
    let sealed = events(&j, "cell_sealed");
    let mut keys: Vec<&str> = sealed.iter().map(|e| e["cell"].as_str().unwrap()).collect();
    keys.sort();
    let n = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), n, "a cell was sealed twice: {sealed:?}");
    assert_eq!(n, cells, "sealed {n} of {cells} cells");
    let dirs = record_dirs(results);
    assert_eq!(dirs.len(), cells, "records in results/: {dirs:?}");
    for e in &sealed {
        let d = results.join(e["digest"].as_str().unwrap());
        sovereign::record::verify_record(&d).unwrap_or_else(|err| panic!("{err:#}"));
        assert_eq!(e["status"], "completed");
        assert_ne!(e["exact"], Value::Bool(false));
    }
    let staging = results.join("campaigns").join(id).join("staging");
    assert_eq!(fs::read_dir(&staging).map(|d| d.count()).unwrap_or(0), 0, "staging must be empty when finished");
    j
}

/// `DIR/campaigns/` holding a copy of the shipped prompts and nothing else.
fn shipped_prompts(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = dir.join("campaigns");
    fs::create_dir_all(shipped.join("prompts")).unwrap();
    for e in fs::read_dir(root.join("campaigns/prompts")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), shipped.join("prompts").join(e.file_name())).unwrap();
    }
    shipped
}

/// Every campaign the repository ships (campaigns/*.yaml).
fn shipped_campaigns() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("campaigns");
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    v.sort();
    assert!(v.len() >= 8, "{v:?}");
    v
}

#[test]
fn check_reports_line_and_column_and_shipped_campaigns_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let t = tempfile::tempdir().unwrap();
    // The shipped campaigns in a fresh directory, without the models they name.
    let shipped = shipped_prompts(t.path());
    let models = t.path().join("models");
    for f in &shipped_campaigns() {
        fs::copy(root.join("campaigns").join(f), shipped.join(f)).unwrap();
    }
    // Every shipped campaign passes from a clean directory: `check` names the models `run`
    // will make from their recipes and makes none (the benches' are several GiB).
    for f in &shipped_campaigns() {
        let r = ok(&["campaign", "check", s(&shipped.join(f))]);
        assert!(r.stdout.lines().any(|l| l.ends_with("is missing; `campaign run` makes it from its recipe")), "{f}: {}", r.stdout);
    }
    assert!(!models.exists(), "check made nothing");
    // Without its recipe, a missing model is refused with the fix.
    let bench = fs::read_to_string(shipped.join("bench.yaml")).unwrap();
    let bad = shipped.join("recipe.yaml");
    fs::write(&bad, bench.replacen("  forge: { preset: bench, seed: 1 }\n", "", 1)).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("model.path is missing") && r.stderr.contains("gives no recipe") && r.stderr.lines().count() == 1,
        "{}",
        r.stderr
    );
    // A model present is checked against its recipe and its pin.
    fs::create_dir_all(&models).unwrap();
    forge(&models, "tiny.gguf", 1, &[]);
    assert!(!ok(&["campaign", "check", s(&shipped.join("exactness.yaml"))]).stdout.contains("is missing"));
    let exact = fs::read_to_string(shipped.join("exactness.yaml")).unwrap();
    fs::write(&bad, exact.replacen("forge: { preset: tiny, seed: 1 }", "forge: { preset: tiny, seed: 2 }", 1)).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("has seed 1, but model.forge says 2") && r.stderr.lines().count() == 1, "{}", r.stderr);
    // `run` makes what `check` only names; a recipe that does not make the pinned bytes leaves
    // nothing behind.
    fs::write(
        &bad,
        exact.replacen("forge: { preset: tiny, seed: 1 }", "forge: { preset: tiny, seed: 2 }", 1).replacen(
            "../models/tiny.gguf",
            "../models/other.gguf",
            1,
        ),
    )
    .unwrap();
    ok(&["campaign", "check", s(&bad)]);
    let r = run(&["campaign", "run", s(&bad), "--results", s(&t.path().join("results"))]);
    assert_one_line_error(&r, &["does not make the pinned model"]);
    assert!(
        r.stderr.starts_with(&format!("error: {}:", bad.display())) && r.stderr.matches(&*bad.display().to_string()).count() == 1,
        "{}",
        r.stderr
    );
    let left: Vec<String> = fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("other"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Both recipes at once is a problem of the file.
    fs::write(
        &bad,
        exact.replacen("forge: { preset: tiny, seed: 1 }", "forge: { preset: tiny, seed: 1 }\n  quantize: { from: x.gguf, type: q8_0 }", 1),
    )
    .unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert!(r.code == 1 && r.stderr.contains("give `forge` or `quantize`, not both"), "{}", r.stderr);
    fs::remove_file(&bad).unwrap();
    // `check --make-models` makes them as `run` would (forged ones first, so a quantized
    // model's source can be one of them), once.
    for (f, made) in [("exactness.yaml", &[][..]), ("pdf-pairs.yaml", &["pdf"]), ("tau-sweep.yaml", &["tau-f32", "tau-q4_k_m", "tau-q8_0"])]
    {
        let r = ok(&["campaign", "check", "--make-models", s(&shipped.join(f))]);
        assert_eq!(r.stdout.lines().filter(|l| l.starts_with("made ")).count(), made.len(), "{f}: {}", r.stdout);
        assert!(!r.stdout.contains("is missing"), "{f}: {}", r.stdout);
        for m in made {
            assert!(models.join(format!("{m}.gguf")).is_file(), "{f}: {m}");
        }
        assert!(!ok(&["campaign", "check", "--make-models", s(&shipped.join(f))]).stdout.contains("made "), "{f}: made twice");
    }
    // Shipped campaigns pin this build: a changed patch series must be carried into them, or
    // `campaign run` refuses every one of them.
    let id: serde_json::Value = serde_json::from_str(&ok(&["build-info", "--json"]).stdout).unwrap();
    let pins: Vec<String> = std::iter::once(id["engine"]["tree_sha256"].as_str().unwrap().to_string())
        .chain(id["engine"]["patches"].as_array().unwrap().iter().map(|p| p["sha256"].as_str().unwrap().to_string()))
        .collect();
    for f in &shipped_campaigns() {
        ok(&["campaign", "check", s(&shipped.join(f))]);
        let text = fs::read_to_string(shipped.join(f)).unwrap();
        for pin in &pins {
            assert!(text.contains(pin.as_str()), "{f} does not pin this build's {pin}");
        }
    }
    let text = fs::read_to_string(root.join("campaigns/exactness.yaml")).unwrap();
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() + 1;

    // A typo'd key.
    let bad = t.path().join("typo.yaml");
    fs::write(&bad, text.replacen("  max_interrupted_attempts: 3", "  max_interupted_attempts: 3", 1)).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let want = format!("{}:{}:3: unknown field `max_interupted_attempts`", bad.display(), line_of("max_interrupted_attempts"));
    assert!(r.stderr.starts_with(&want), "got {:?}, want {want:?}", r.stderr);

    // A wrong type: the position of the value.
    fs::write(&bad, text.replacen("  outputs: 16", "  outputs: [16]", 1)).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert_eq!(r.code, 1);
    let want = format!("{}:{}:12: ", bad.display(), line_of("  outputs: 16"));
    assert!(r.stderr.starts_with(&want), "got {:?}, want {want:?}", r.stderr);

    // A reference to an arm that does not exist, at the reference.
    fs::write(&bad, text.replacen("      - [resident-t1, resident]", "      - [resident-t1, residnet]", 1)).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    let want = format!("{}:{}:23: schedule.blocks names arm `residnet`", bad.display(), line_of("[resident-t1, resident]"));
    assert!(r.stderr.starts_with(&want), "got {:?}, want {want:?}", r.stderr);

    {
        // Semantic checks have positions too, and quote the value as given: each at its own line.
        for (what, from, to, at) in [
            ("outputs 0", "  outputs: 16", "  outputs: 0", "  outputs: 16"),
            ("an empty block", "      - [resident-t1, resident]", "      - []", "[resident-t1, resident]"),
            ("max_interrupted_attempts 0", "  max_interrupted_attempts: 3", "  max_interrupted_attempts: 0", "max_interrupted_attempts"),
            (
                "tied_output dbrx",
                "  forge: { preset: tiny, seed: 1 }",
                "  forge: { preset: tiny, seed: 1, arch: dbrx, tied_output: true }",
                "../models/tiny.gguf",
            ),
            (
                "a diffusion model's arch llada-moe",
                "  forge: { preset: tiny, seed: 1 }",
                "  forge: { preset: tiny, seed: 1, arch: llada-moe }",
                "../models/tiny.gguf",
            ),
            (
                "seeded_random count 0",
                "    preordered:\n      - [resident, resident-t1]\n      - [resident-t1, resident]\n      - [resident, resident-t1]\n",
                "    seeded_random: { seed: 1, arms: [resident, resident-t1],\n      count: 0 }\n",
                "    preordered:",
            ),
            (
                "seeded_random count 10^6",
                "    preordered:\n      - [resident, resident-t1]\n      - [resident-t1, resident]\n      - [resident, resident-t1]\n",
                "    seeded_random: { seed: 1, arms: [resident, resident-t1],\n      count: 1000000 }\n",
                "    preordered:",
            ),
        ] {
            let bad = t.path().join("semantic.yaml");
            let edited = text.replacen(from, to, 1);
            assert_ne!(edited, text, "{what}: the edit applied");
            fs::write(&bad, &edited).unwrap();
            let r = run(&["campaign", "check", s(&bad)]);
            assert_eq!(r.code, 1, "{what}: {}{}", r.stdout, r.stderr);
            let line = line_of(at) + usize::from(what.starts_with("seeded_random"));
            let want = format!("{}:{line}:", bad.display());
            assert!(r.stderr.starts_with(&want), "{what}: got {:?}, want {want:?}", r.stderr);
            let value = what.rsplit(' ').next().unwrap().replace("10^6", "1000000");
            assert!(what == "an empty block" || r.stderr.contains(&value), "{what}: the value as given: {}", r.stderr);
        }
        // A missing model with no recipe: at model.path, with the fix (beside the prompts).
        let bad = shipped.join("absent.yaml");
        fs::write(
            &bad,
            text.replacen("../models/tiny.gguf", "../models/absent.gguf", 1).replacen("  forge: { preset: tiny, seed: 1 }\n", "", 1),
        )
        .unwrap();
        let r = run(&["campaign", "check", s(&bad)]);
        let want = format!("{}:{}:9: ", bad.display(), line_of("../models/tiny.gguf"));
        assert!(
            r.stderr.starts_with(&want) && r.stderr.contains("gives no recipe") && r.stderr.lines().count() == 1,
            "got {:?}, want {want:?}",
            r.stderr
        );
        let r = run(&["campaign", "run", s(&bad), "--results", s(&t.path().join("results"))]);
        assert_eq!(r.stderr, format!("error: {}", run(&["campaign", "check", s(&bad)]).stderr));
    }
    // `run` refuses the same file with the same one line, and freezes nothing.
    let res = t.path().join("results");
    let r = run(&["campaign", "run", s(&bad), "--results", s(&res)]);
    assert_one_line_error(&r, &["residnet"]);
    assert!(!res.join("campaigns").exists());
}

/// `campaign check` refuses what `campaign run` refuses before its first cell, with the same
/// one line (`run` adds `error: `), the file named once, at the offending value; and `run`
/// freezes nothing. What is valid passes both alike.
#[test]
fn check_and_run_refuse_the_same_files_with_the_same_line() {
    let st = setup("t-alike", &["[A, B]"], 2);
    let text = fs::read_to_string(&st.file).unwrap();
    let prompt_sha = sha256(&st.dir.join("prompt.txt"));
    let (_, patches) = build_identity();
    let first_patch_sha = patches.lines().nth(1).unwrap().rsplit("sha256: ").next().unwrap().trim_end_matches(" }").to_string();
    // Where `needle`'s line is in the edited file, and the column of `value` on it.
    let pos = |edited: &str, needle: &str, value: &str| {
        let (i, l) = edited.lines().enumerate().find(|(_, l)| l.contains(needle)).unwrap_or_else(|| panic!("{needle}"));
        (i + 1, l.find(value).unwrap_or_else(|| panic!("{value} in {l}")) + 1)
    };
    // Read where it may be (as root), and then refused by its digest; else refused unread.
    let readable = fs::read("/etc/shadow").is_ok();
    let shadow = |path: &'static str| {
        if readable {
            ("prompt_sha256", prompt_sha.clone(), "has sha256")
        } else {
            ("prompt_file", path.to_string(), "cannot read workload.prompt_file")
        }
    };
    let (up, abs) = (shadow("../../../../etc/shadow"), shadow("/etc/shadow"));
    let cases: Vec<(&str, String, (&str, &str), &str)> = vec![
        (
            "a wrong prompt digest",
            text.replacen(&prompt_sha, &"1".repeat(64), 1),
            ("prompt_sha256", "1111"),
            "workload.prompt_sha256: prompt.txt has sha256",
        ),
        (
            "a prompt outside the directory",
            text.replacen("prompt_file: prompt.txt", "prompt_file: ../../../../etc/shadow", 1),
            (up.0, &up.1),
            up.2,
        ),
        ("an absolute prompt path", text.replacen("prompt_file: prompt.txt", "prompt_file: /etc/shadow", 1), (abs.0, &abs.1), abs.2),
        (
            "another patch series",
            text.replacen(&first_patch_sha, &"0".repeat(64), 1),
            ("- { name:", "- { name:"),
            "build.patches: this build's patch series",
        ),
        (
            "a YAML 1.1 boolean",
            text.replacen("ignore_eos: true", "ignore_eos: yes", 1),
            ("ignore_eos", "yes"),
            "invalid boolean (strict mode expects true/false)",
        ),
        ("a custom tag", text.replacen("threads: 2", "threads: !custom 1", 1), ("!custom", "1"), "unsupported tag `!custom`"),
        (
            "a quoted number",
            text.replacen("threads: 2", "threads: \"1\"", 1),
            ("threads: \"1\"", "\"1\""),
            "arms[0].threads: expected a number, got the string \"1\"",
        ),
        (
            "an unbounded count",
            text.replacen("max_interrupted_attempts: 3", "max_interrupted_attempts: 4294967295", 1),
            ("max_interrupted_attempts", "4294967295"),
            "repetition.max_interrupted_attempts 4294967295: expected 1..=100",
        ),
    ];
    for (what, edited, (needle, value), message) in cases {
        assert_ne!(edited, text, "{what}: the edit applied");
        fs::write(&st.file, &edited).unwrap();
        let (line, column) = pos(&edited, needle, value);
        let want = format!("{}:{line}:{column}: ", st.file.display());
        let c = run(&["campaign", "check", s(&st.file)]);
        assert_eq!(c.code, 1, "{what}: {}{}", c.stdout, c.stderr);
        assert_eq!(c.stderr.lines().count(), 1, "{what}: {}", c.stderr);
        assert!(c.stderr.starts_with(&want) && c.stderr.contains(message), "{what}: got {:?}, want {want:?} and {message:?}", c.stderr);
        assert_eq!(c.stderr.matches(&*st.file.display().to_string()).count(), 1, "{what}: the file once: {}", c.stderr);
        let r = run(&["campaign", "run", s(&st.file), "--results", s(&st.results), "--no-progress"]);
        assert_one_line_error(&r, &[message]);
        assert_eq!(r.stderr, format!("error: {}", c.stderr), "{what}");
        assert!(!st.results.join("campaigns").exists(), "{what}: nothing was frozen");
    }
    // Valid spellings pass with the digest of what they say; paths may be absolute.
    let digest = |t: &str| {
        fs::write(&st.file, t).unwrap();
        let r = ok(&["campaign", "check", s(&st.file)]);
        r.stdout.lines().next().unwrap().rsplit("digest ").next().unwrap().to_string()
    };
    let base = digest(&text);
    assert_eq!(digest(&text.replacen("ignore_eos: true", "ignore_eos: True", 1)), base);
    assert_eq!(digest(&text.replacen("id: t-alike", "id: \"t-alike\"", 1).replacen("# test campaign", "# a comment", 1)), base);
    let model = st.dir.join("../tiny.gguf").canonicalize().unwrap();
    let prompt = st.dir.join("prompt.txt").canonicalize().unwrap();
    let abs = text.replacen("path: ../tiny.gguf", &format!("path: {}", model.display()), 1).replacen(
        "prompt_file: prompt.txt",
        &format!("prompt_file: {}", prompt.display()),
        1,
    );
    assert_ne!(digest(&abs), base);
}

/// From a directory holding only the shipped campaign files and their prompts, each shipped
/// campaign (outputs scaled down; the benches' several GiB model aside, tests/it/bench.rs runs
/// their scaled copy) runs by its own command: its models are made from their recipes, every
/// cell settles, and nothing is abandoned. One test per campaign.
mod every_shipped_campaign_runs_by_its_own_command_from_a_clean_directory {
    #[test]
    fn exactness() {
        super::shipped_campaign_runs("exactness.yaml", 16, 4, &["tiny"]);
    }

    #[test]
    fn faults() {
        super::shipped_campaign_runs("faults.yaml", 8, 2, &["tiny"]);
    }

    #[test]
    fn pdf_pairs() {
        super::shipped_campaign_runs("pdf-pairs.yaml", 32, 4, &["pdf"]);
    }

    #[test]
    fn tau_sweep() {
        super::shipped_campaign_runs("tau-sweep.yaml", 64, 4, &["tau-f32", "tau-q4_k_m", "tau-q8_0"]);
    }
}

/// Runs shipped campaign `f` with its `outputs` scaled to `reduced`, from a directory holding
/// only the shipped campaign files and their prompts; `models` are those its recipes make.
fn shipped_campaign_runs(f: &str, outputs: u32, reduced: u32, models: &[&str]) {
    if !cgroups_usable() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let t = tempfile::tempdir().unwrap();
    let shipped = shipped_prompts(t.path());
    let text = fs::read_to_string(root.join("campaigns").join(f)).unwrap();
    let scaled = text
        .replacen(&format!("  outputs: {outputs}"), &format!("  outputs: {reduced}"), 1)
        .replacen(&format!("  horizon: {outputs}"), &format!("  horizon: {reduced}"), 1)
        .replacen("  window: 16\n", &format!("  window: {reduced}\n"), 1);
    assert!(
        scaled.contains(&format!("  outputs: {reduced}")) && scaled.contains(&format!("  horizon: {reduced}")),
        "{f}: outputs and horizon scaled"
    );
    let file = shipped.join(f);
    fs::write(&file, scaled).unwrap();
    let results = t.path().join("results");
    let started = Instant::now();
    let r = ok(&["campaign", "run", s(&file), "--results", s(&results), "--json"]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let n = |k: &str| v[k].as_u64().unwrap();
    assert!(n("cells") > 0 && n("sealed") + n("skipped") == n("cells") && n("abandoned") == 0, "{f}: {v}");
    assert!(n("sealed") > 0, "{f}: {v}");
    eprintln!("{f}: {} cells in {:.1} s", n("cells"), started.elapsed().as_secs_f64());
    for m in models {
        assert!(t.path().join("models").join(format!("{m}.gguf")).is_file(), "{f}: {m} was made from its recipe");
    }
}

#[test]
fn unattended_run_then_verify_replay_tamper_export() {
    let st = setup("t-run", &["[A, B]", "[B, A]", "[A, B]"], 8);
    let started = Instant::now();
    let r = ok(&["campaign", "run", s(&st.file), "--results", s(&st.results), "--json"]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["sealed"], 7, "{v}");
    let j = assert_sealed_exactly_once(&st.results, "t-run", 7);
    assert_eq!(j[0]["event"], "preregistered");
    // The workload names no context: every cell's is its work, the prompt's tokens and outputs.
    for d in record_dirs(&st.results) {
        let r: Value = serde_json::from_str(&fs::read_to_string(d.join("record.json")).unwrap()).unwrap();
        assert_eq!(r["params"]["n_ctx"], 181 + 8, "{}", d.display());
    }
    assert!(events(&j, "cell_discarded").is_empty());
    // The oracle is compared with nothing; every other cell is exact against it (threads 1 vs 2 included).
    let exact: Vec<&Value> = events(&j, "cell_sealed").into_iter().map(|e| &e["exact"]).collect();
    assert_eq!(exact.iter().filter(|e| e.is_null()).count(), 1);
    assert!(exact.iter().filter(|e| !e.is_null()).all(|e| **e == Value::Bool(true)));
    // One log per cell.
    assert_eq!(fs::read_dir(st.results.join("campaigns/t-run/logs")).unwrap().count(), 7);

    // Status: finished, and running again is a no-op.
    let r = ok(&["campaign", "status", s(&st.file), "--results", s(&st.results), "--json"]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["finished"], true);
    assert_eq!(v["counts"]["sealed"], 7);
    let r = ok(&["campaign", "resume", s(&st.file), "--results", s(&st.results), "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap()["ran"], 0);

    // Preregistration: the frozen campaign cannot change under its id.
    let text = fs::read_to_string(&st.file).unwrap();
    fs::write(&st.file, text.replace("outputs: 8", "outputs: 9").replace("horizon: 8", "horizon: 9")).unwrap();
    for verb in ["run", "resume"] {
        let r = run(&["campaign", verb, s(&st.file), "--results", s(&st.results)]);
        assert_one_line_error(&r, &["preregistered", "t-run"]);
    }
    // A comment is not a change to what was preregistered.
    fs::write(&st.file, format!("# reviewed\n{text}")).unwrap();
    ok(&["campaign", "resume", s(&st.file), "--results", s(&st.results)]);
    assert_eq!(record_dirs(&st.results).len(), 7);

    // Export: tables that parse back, a figure, a draft ledger.
    let out = st.dir.join("export");
    let exported = ok(&["export", "--campaign", "t-run", "--results", s(&st.results), "--out", s(&out)]);
    // Each drafted claim is printed with its digest.
    let anchored = exported
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("claim t-run@"))
        .map(|d| format!("t-run@{d}"))
        .expect("export prints the claim's digest");
    let mut rd = csv::Reader::from_path(out.join("cells.csv")).unwrap();
    let h = rd.headers().unwrap().clone();
    let rows: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 7);
    let col = |name: &str| h.iter().position(|c| c == name).unwrap();
    for row in &rows {
        assert_eq!(&row[col("state")], "sealed");
        assert_eq!(row[col("record")].len(), 64);
        assert!(row[col("wall_s")].parse::<f64>().unwrap() > 0.0);
        assert_eq!(&row[col("generated_tokens")], "8");
    }
    assert_eq!(rows.iter().map(|r| r[col("order")].to_string()).collect::<Vec<_>>()[1..3], ["A>B", "A>B"]);
    let mut rd = csv::Reader::from_path(out.join("pairs.csv")).unwrap();
    let pairs: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
    assert_eq!(pairs.len(), 3);
    let ratios: Vec<f64> = pairs.iter().map(|r| r[12].parse().unwrap()).collect();
    // `stats pairs` on the exported table gives the exported summary.
    let r = ok(&["stats", "pairs", "--csv", s(&out.join("pairs.csv")), "--a", "a", "--b", "b", "--json"]);
    let stats: Value = serde_json::from_str(&r.stdout).unwrap();
    let mut rd = csv::Reader::from_path(out.join("pairs_summary.csv")).unwrap();
    let summary = rd.records().next().unwrap().unwrap();
    assert!((stats["ratio"].as_f64().unwrap() - summary[7].parse::<f64>().unwrap()).abs() < 1e-12);
    let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / 3.0).exp();
    assert!((stats["ratio"].as_f64().unwrap() - geo).abs() < 1e-12);
    let png = fs::read(out.join("pairs.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 5000);
    let svg = fs::read_to_string(out.join("pairs.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("pair ratio"));

    // verify and replay of the draft ledger pass: export prints both commands, anchored by the
    // claim's digest; a plain ID from the unsealed draft binds nothing and is refused unless
    // asked for by --unanchored...
    let ledger = out.join("claims.json");
    for verb in ["verify", "replay"] {
        let line = exported
            .stdout
            .lines()
            .find(|l| l.contains(&format!(" {verb} --claim {anchored} --ledger ")))
            .expect("export prints the command");
        assert!(line.ends_with(&format!("--ledger {} --results {}", ledger.display(), st.results.display())), "{line}");
        let r = run(&[verb, "--claim", "t-run", "--ledger", s(&ledger), "--results", s(&st.results)]);
        assert_one_line_error(&r, &["is not anchored", &anchored, "--unanchored"]);
    }
    let r = ok(&["verify", "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);
    assert!(r.stdout.contains("verify passed"));
    let r = ok(&["verify", "--claim", "t-run", "--unanchored", "--ledger", s(&ledger), "--results", s(&st.results)]);
    assert!(r.stdout.contains("verify passed"));
    let r = ok(&["replay", "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);
    assert!(r.stdout.contains("paired ratio") && r.stdout.contains("exactness") && r.stdout.contains("replay passed"), "{}", r.stdout);

    // ...anchored by its digest too; a claim changed after publication is refused by it, and
    // one that asserts nothing is refused as vacuous, anchored or not...
    ok(&["verify", "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);
    let original: Value = serde_json::from_str(&fs::read_to_string(&ledger).unwrap()).unwrap();
    let edited = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut l = original.clone();
        edit(&mut l["claims"]["t-run"]);
        let p = st.dir.join(name);
        fs::write(&p, serde_json::to_string(&l).unwrap()).unwrap();
        p
    };
    let weakened = edited("weakened.json", &|c| c["assertions"].as_array_mut().unwrap().truncate(1));
    let r = run(&["verify", "--claim", &anchored, "--ledger", s(&weakened), "--results", s(&st.results)]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("changed after it was published"), "{}", r.stderr);
    for (name, edit) in [
        (
            "empty.json",
            &(|c: &mut Value| {
                c["assertions"] = Value::Array(vec![]);
                c["replay"] = Value::Array(vec![]);
            }) as &dyn Fn(&mut Value),
        ),
        ("wide.json", &|c: &mut Value| {
            let pr = c["replay"].as_array_mut().unwrap().iter_mut().find(|x| x.get("paired_ratio").is_some()).unwrap();
            pr["paired_ratio"]["expect"]["tolerance"] = 10.0.into();
        }),
    ] {
        let p = edited(name, edit);
        for claim in ["t-run", anchored.as_str()] {
            let r = run(&["verify", "--claim", claim, "--unanchored", "--ledger", s(&p), "--results", s(&st.results)]);
            assert_ne!(r.code, 0, "{name} {claim}");
            assert!(
                r.stderr.contains(if claim == "t-run" { "is vacuous" } else { "changed after it was published" }),
                "{name} {claim}: {}",
                r.stderr
            );
        }
    }
    // ...the frozen preregistration, both files of it, must still hash to the digest every
    // record names, for verify and for replay alike...
    for (file, from, to, says) in [
        ("campaign.json", "\"outputs\":8", "\"outputs\":9", "the frozen preregistration hashes to"),
        ("campaign.yaml", "max_interrupted_attempts: 3", "max_interrupted_attempts: 4", "changed after it was frozen"),
    ] {
        let frozen = st.results.join("campaigns/t-run").join(file);
        let text = fs::read_to_string(&frozen).unwrap();
        let mut perm = fs::metadata(&frozen).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perm.set_readonly(false);
        fs::set_permissions(&frozen, perm.clone()).unwrap();
        fs::write(&frozen, text.replacen(from, to, 1)).unwrap();
        assert_ne!(fs::read_to_string(&frozen).unwrap(), text, "the edit applied");
        for verb in ["verify", "replay"] {
            let r = run(&[verb, "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);
            assert_eq!(r.code, 1, "{file} {verb}: {}", r.stdout);
            assert!(r.stderr.contains(says), "{file} {verb}: {}", r.stderr);
        }
        fs::write(&frozen, &text).unwrap();
    }

    // ...a stated value that the records do not support fails replay...
    let mut l: Value = serde_json::from_str(&fs::read_to_string(&ledger).unwrap()).unwrap();
    let replay = l["claims"]["t-run"]["replay"].as_array_mut().unwrap();
    let pr = replay.iter_mut().find(|x| x.get("paired_ratio").is_some()).unwrap();
    let stated = pr["paired_ratio"]["expect"]["ratio"].as_f64().unwrap();
    pr["paired_ratio"]["expect"]["ratio"] = (stated * 1.001).into();
    let wrong = st.dir.join("wrong.json");
    fs::write(&wrong, serde_json::to_string(&l).unwrap()).unwrap();
    let r = run(&["replay", "--claim", "t-run", "--unanchored", "--ledger", s(&wrong), "--results", s(&st.results)]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("paired ratio"), "{}", r.stderr);

    // ...the ledger export sealed is refused once a byte of it differs from its seal...
    let sealed_ledger = PathBuf::from(
        exported
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("ledger ")?.strip_suffix(" (sealed)"))
            .expect("export prints the sealed ledger"),
    );
    assert_eq!(sealed_ledger.parent().unwrap(), st.results.join("ledgers"));
    let r = ok(&["verify", "--claim", &anchored, "--ledger", s(&sealed_ledger), "--results", s(&st.results), "--json"]);
    let items: Value = serde_json::from_str(&r.stdout).unwrap();
    let item = |v: &Value, what: &str| {
        v["items"].as_array().unwrap().iter().find(|i| i["what"] == what).cloned().unwrap_or_else(|| panic!("no {what} item: {v}"))
    };
    assert!(item(&items, "ledger")["detail"].as_str().unwrap().contains(sealed_ledger.file_name().unwrap().to_str().unwrap()));
    assert_eq!(item(&items, "campaign t-run journal")["ok"], true);
    {
        use std::os::unix::fs::PermissionsExt;
        let f = sealed_ledger.join("ledger.json");
        let text = fs::read_to_string(&f).unwrap();
        fs::set_permissions(&sealed_ledger, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&f, text.replacen("\"tolerance\": ", "\"tolerance\": 1", 1)).unwrap();
        for ledger in [sealed_ledger.clone(), f.clone()] {
            let r = run(&["verify", "--claim", "t-run", "--ledger", s(&ledger), "--results", s(&st.results)]);
            assert_one_line_error(&r, &["changed after it was sealed"]);
        }
        fs::write(&f, text).unwrap();
        ok(&["verify", "--claim", "t-run", "--ledger", s(&sealed_ledger), "--results", s(&st.results)]);
    }

    // ...the journal must agree with the records: a zeroed digest or a deleted journal fails
    // verify and stops export...
    let jpath = st.results.join("campaigns/t-run/journal.jsonl");
    let jtext = fs::read_to_string(&jpath).unwrap();
    let digest3 = events(&j, "cell_sealed")[3]["digest"].as_str().unwrap().to_string();
    let zeroed =
        jtext.replacen(&format!("\"digest\":\"{digest3}\",\"status\""), &format!("\"digest\":\"{}\",\"status\"", "0".repeat(64)), 1);
    assert_ne!(zeroed, jtext, "the edit applied");
    for (name, edit) in [("zeroed", Some(zeroed)), ("deleted", None)] {
        match edit {
            Some(t) => fs::write(&jpath, t).unwrap(),
            None => fs::remove_file(&jpath).unwrap(),
        }
        for verb in ["verify", "replay"] {
            let r = run(&[verb, "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results), "--json"]);
            assert_eq!(r.code, 1, "{name} {verb}: {}", r.stdout);
            let v: Value = serde_json::from_str(&r.stdout).unwrap();
            let detail = item(&v, "campaign t-run journal")["detail"].as_str().unwrap().to_string();
            assert!(detail.contains(if name == "zeroed" { "never sealed it" } else { "no journal" }), "{name} {verb}: {detail}");
        }
        let r = run(&["export", "--campaign", "t-run", "--results", s(&st.results), "--out", s(&st.dir.join("export-2"))]);
        assert_one_line_error(&r, &["the journal and the records disagree"]);
        fs::write(&jpath, &jtext).unwrap();
    }
    // ...a record re-sealed with another wall time and the journal pointed at it: while the
    // original exists the journal disagrees; with the original gone too the campaign agrees
    // again, but the claim exported from it is not the published one.
    let original_dir = st.results.join(&digest3);
    let staging = st.dir.join("resealed");
    fs::create_dir(&staging).unwrap();
    let mut cell: Value = serde_json::from_str(&fs::read_to_string(original_dir.join("cell.json")).unwrap()).unwrap();
    let wall = cell["outcome"]["wall_s"].as_f64().unwrap();
    cell["outcome"]["wall_s"] = (wall * 3.0).into();
    for e in fs::read_dir(&original_dir).unwrap().flatten() {
        let name = e.file_name();
        if name != "manifest.json" && name != "cell.json" {
            fs::copy(e.path(), staging.join(&name)).unwrap();
        }
    }
    fs::write(staging.join("cell.json"), serde_json::to_string(&cell).unwrap()).unwrap();
    let forged = sovereign::record::seal(&staging, &st.results).unwrap();
    let repointed =
        jtext.replace(&digest3, &forged.digest).replacen(&format!("\"wall_s\":{wall}"), &format!("\"wall_s\":{}", wall * 3.0), 1);
    assert!(repointed.contains(&format!("\"wall_s\":{}", wall * 3.0)) && !repointed.contains(&digest3), "the edit applied");
    fs::write(&jpath, &repointed).unwrap();
    let r = run(&["export", "--campaign", "t-run", "--results", s(&st.results), "--out", s(&st.dir.join("export-2"))]);
    assert_one_line_error(&r, &["the journal and the records disagree", &digest3]);
    {
        use std::os::unix::fs::PermissionsExt;
        let hidden = st.dir.join("original-record");
        fs::set_permissions(&original_dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&original_dir, &hidden).unwrap();
        let again = ok(&["export", "--campaign", "t-run", "--results", s(&st.results), "--out", s(&st.dir.join("export-2"))]);
        let new_claim = again.stdout.lines().find_map(|l| l.strip_prefix("claim t-run@")).map(|d| format!("t-run@{d}")).unwrap();
        assert_ne!(new_claim, anchored);
        let r = run(&["verify", "--claim", &anchored, "--ledger", s(&st.dir.join("export-2/claims.json")), "--results", s(&st.results)]);
        assert_one_line_error(&r, &["changed after it was published"]);
        fs::rename(&hidden, &original_dir).unwrap();
        fs::set_permissions(&original_dir, fs::Permissions::from_mode(0o555)).unwrap();
        fs::remove_dir_all(st.results.join(&forged.digest)).unwrap_or_else(|_| {
            fs::set_permissions(st.results.join(&forged.digest), fs::Permissions::from_mode(0o755)).unwrap();
            for e in fs::read_dir(st.results.join(&forged.digest)).unwrap().flatten() {
                fs::set_permissions(e.path(), fs::Permissions::from_mode(0o644)).unwrap();
            }
            fs::remove_dir_all(st.results.join(&forged.digest)).unwrap();
        });
        fs::write(&jpath, &jtext).unwrap();
    }
    ok(&["verify", "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);

    // ...and one flipped byte in a sealed record fails verify, naming the file.
    let sealed = events(&j, "cell_sealed");
    let victim = st.results.join(sealed[3]["digest"].as_str().unwrap());
    let logits = victim.join("logits.bin");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&logits, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&logits).unwrap();
    bytes[1000] ^= 0x01;
    fs::write(&logits, &bytes).unwrap();
    let r = run(&["verify", "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains(&format!("{}", logits.display())) && r.stderr.contains("tampered"), "{}", r.stderr);
    assert!(!r.stderr.contains("record.json:"), "only the tampered file is named: {}", r.stderr);
    let r = run(&["replay", "--claim", &anchored, "--ledger", s(&ledger), "--results", s(&st.results)]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("logits.bin"));
    eprintln!("unattended run + checks: {:.1} s", started.elapsed().as_secs_f64());
}

/// A campaign pinned to another patch series is refused before anything runs, with the pins
/// this build would need, ready to paste.
#[test]
fn a_plan_arm_may_leave_slots_and_policy_to_its_memory_cap() {
    if !cgroups_usable() {
        return;
    }
    let st = setup("t-budget", &["[A, B]"], 4);
    let text = fs::read_to_string(&st.file).unwrap();
    let arm = "  - id: A\n    experts: plan\n    source: f\n    memory_cap_bytes: 314572800\n    threads: 2\n";
    fs::write(&st.file, text.replace("  - id: A\n    experts: resident\n    threads: 2\n", arm)).unwrap();
    let r = ok(&["campaign", "run", s(&st.file), "--results", s(&st.results), "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap()["sealed"], 3, "{}", r.stdout);
    let j = assert_sealed_exactly_once(&st.results, "t-budget", 3);
    assert!(events(&j, "cell_sealed").iter().filter(|e| !e["exact"].is_null()).all(|e| e["exact"] == Value::Bool(true)));
    // The capped Plan arm's record: slots and LRU sized from its 300 MiB cap, with every term.
    let sized: Vec<Value> = record_dirs(&st.results)
        .iter()
        .map(|d| serde_json::from_str::<Value>(&fs::read_to_string(d.join("record.json")).unwrap()).unwrap())
        .filter(|r| r["params"]["experts"]["mode"] == "plan")
        .collect();
    assert_eq!(sized.len(), 1);
    let (e, n) = (&sized[0]["params"]["experts"], |v: &Value| v.as_u64().unwrap());
    let b = &e["budget"];
    let need: u64 = ["weights", "context", "compute", "logits", "margin"].iter().map(|k| n(&b[*k])).sum();
    let slots = ((314572800 - need) / n(&b["per_slot"])).min(16);
    assert_eq!((&b["tier"], n(&b["budget"])), (&Value::from("host"), 314572800), "{e}");
    assert_eq!((n(&e["slots"]), e["policy"].as_str()), (slots, Some(format!("lru:{slots}").as_str())), "{e}");
}

#[test]
fn another_patch_series_is_refused_with_this_builds_pins() {
    let st = setup("t-pins", &["[A, B]"], 4);
    let (_, patches) = build_identity();
    let first = patches.lines().nth(1).expect("a patch line").to_string();
    let sha = first.rsplit("sha256: ").next().unwrap().trim_end_matches(" }").to_string();
    let text = fs::read_to_string(&st.file).unwrap().replacen(&sha, &"0".repeat(64), 1);
    fs::write(&st.file, text).unwrap();
    let r = run(&["campaign", "run", s(&st.file), "--results", s(&st.results), "--no-progress"]);
    assert_ne!(r.code, 0);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    let pin = first.trim().trim_start_matches("- ");
    assert!(lines[0].contains("set `build.patches` to [") && lines[0].contains(pin), "{pin}: {}", lines[0]);
    assert!(!st.results.join("campaigns/t-pins").exists(), "nothing was preregistered");
}

#[test]
fn sigkill_midway_then_resume_seals_every_cell_exactly_once() {
    let st = setup("t-kill", &["[A, B]", "[B, A]", "[A, B]", "[B, A]"], 48);
    let mut child = Reaped::new(
        bin()
            .args(["campaign", "run", s(&st.file), "--results", s(&st.results), "--no-progress"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Kill the runner while a cell is in flight, after at least two cells are sealed.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = journal(&st.results, "t-kill");
        if events(&j, "cell_sealed").len() >= 2 && j.last().is_some_and(|e| e["event"] == "cell_started") {
            child.kill().unwrap(); // SIGKILL
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the runner finished before it could be killed mid-cell");
        assert!(Instant::now() < deadline, "timed out waiting for a cell in flight");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.wait().unwrap();
    // The journal as the kill left it: normally the cell is still in flight; if the kill lost a
    // (microsecond) race with the cell's end, the cell is between sealing events instead.
    let before = journal(&st.results, "t-kill");
    let last = before.last().unwrap().clone();
    let in_flight = (last["event"] == "cell_started").then(|| last["cell"].as_str().unwrap().to_string());
    let sealed_before: Vec<String> = events(&before, "cell_sealed").iter().map(|e| e["cell"].as_str().unwrap().to_string()).collect();
    // The generate child dies with the runner (PR_SET_PDEATHSIG); give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    let r = ok(&["campaign", "status", s(&st.file), "--results", s(&st.results), "--json"]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["finished"], false);
    if in_flight.is_some() {
        assert_eq!(v["counts"]["interrupted"], 1, "{v}");
        // What the killed attempt left is not a record.
        assert_eq!(record_dirs(&st.results).len(), sealed_before.len());
    }

    let r = ok(&["campaign", "resume", s(&st.file), "--results", s(&st.results), "--json"]);
    let summary: Value = serde_json::from_str(&r.stdout).unwrap();
    let j = assert_sealed_exactly_once(&st.results, "t-kill", 9);
    let resumed_at = j.iter().position(|e| e["event"] == "runner_started" && e["mode"] == "resume").unwrap();
    for e in &j[resumed_at..] {
        if e["event"] == "cell_started" {
            assert!(!sealed_before.contains(&e["cell"].as_str().unwrap().to_string()), "a sealed cell ran again: {e}");
        }
    }
    let discarded = events(&j, "cell_discarded");
    if let Some(in_flight) = in_flight {
        // The interrupted attempt is journaled as discarded, and only that cell ran twice.
        assert_eq!(summary["discarded"], 1);
        assert_eq!(discarded.len(), 1);
        assert_eq!(discarded[0]["cell"], in_flight.as_str());
        assert!(discarded[0]["reason"].as_str().unwrap().contains("not an outcome-selected rerun"));
        let sealed = events(&j, "cell_sealed");
        let again = sealed.iter().find(|e| e["cell"] == in_flight.as_str()).unwrap();
        assert_eq!(again["attempt"], 2);
        let cell: Value =
            serde_json::from_str(&fs::read_to_string(st.results.join(again["digest"].as_str().unwrap()).join("cell.json")).unwrap())
                .unwrap();
        assert_eq!(cell["attempt"], 2);
        assert!(cell["cell"]["key"] == in_flight.as_str());
    } else {
        eprintln!("the kill landed between a cell's sealing events; checked the recovery path instead");
        assert!(discarded.is_empty());
    }
    // No machine paths inside records.
    for d in record_dirs(&st.results) {
        for f in ["record.json", "cell.json"] {
            let t = fs::read_to_string(d.join(f)).unwrap();
            assert!(!t.contains(st.results.to_str().unwrap()) && !t.contains(st.dir.to_str().unwrap()), "{f} holds a machine path");
        }
    }
}

/// A worker killed from outside (not the runner: a SIGKILL with no OOM kill and no limit
/// event) is an interrupted attempt: discarded and run again. The runner's summary counts it
/// as `campaign status` does.
#[test]
fn a_worker_killed_from_outside_is_counted_by_the_summary_as_status_counts_it() {
    let st = setup("t-outside", &["[A, B]"], 400);
    let child = Reaped::new(
        bin()
            .args(["campaign", "run", s(&st.file), "--results", s(&st.results), "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The runner's first worker: its child running this binary (`sovereign cell`).
    let (runner, exe) = (child.id(), fs::canonicalize(env!("CARGO_BIN_EXE_sovereign")).unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    let worker = loop {
        let found = fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid: u32 = stat[stat.rfind(')')? + 4..].split(' ').next()?.parse().ok()?;
            let cmdline = fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
            (ppid == runner && fs::read_link(format!("/proc/{pid}/exe")).ok()? == exe && cmdline.split('\0').nth(1) == Some("cell"))
                .then_some(pid)
        });
        if let Some(w) = found {
            break w;
        }
        assert!(Instant::now() < deadline, "no worker of the runner within 120 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    // SAFETY: a plain kill of the worker this test's runner started.
    assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = ok(&["campaign", "status", s(&st.file), "--results", s(&st.results), "--json"]);
    let status: Value = serde_json::from_str(&r.stdout).unwrap();
    let discards: u64 = status["cells"].as_array().unwrap().iter().map(|c| c["discards"].as_u64().unwrap()).sum();
    assert_eq!(discards, 1, "{status}");
    assert_eq!((summary["discarded"].as_u64(), summary["discarded_now"].as_u64()), (Some(discards), Some(1)), "{summary}");
    let j = assert_sealed_exactly_once(&st.results, "t-outside", 3);
    let discarded = events(&j, "cell_discarded");
    assert!(discarded[0]["reason"].as_str().unwrap().contains("signal 9"), "{discarded:?}");
}

#[test]
fn stats_pairs_reproduces_table_6() {
    let t = tempfile::tempdir().unwrap();
    let csv = t.path().join("table6.csv");
    fs::write(
        &csv,
        "Block,Order,D,F\n1,D>F,102.358,32.867\n2,D>F,102.228,32.820\n3,F>D,100.032,32.837\n4,F>D,101.996,32.889\n5,D>F,102.202,32.887\n6,F>D,101.616,32.811\n",
    )
    .unwrap();
    let r = ok(&["stats", "pairs", "--csv", s(&csv), "--a", "D", "--b", "F"]);
    assert!(r.stdout.contains("F/D = 0.3229"), "{}", r.stdout);
    let r = ok(&["stats", "pairs", "--csv", s(&csv), "--a", "D", "--b", "F", "--json"]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(format!("{:.4}", v["ratio"].as_f64().unwrap()), "0.3229");
    assert_eq!(format!("{:.4}", v["lo"].as_f64().unwrap()), "0.3201");
    assert_eq!(format!("{:.4}", v["hi"].as_f64().unwrap()), "0.3258");
    assert_eq!(v["df"], 5);
    let r = run(&["stats", "pairs", "--csv", s(&csv), "--a", "D", "--b", "G"]);
    assert_one_line_error(&r, &["no column \"G\""]);
}

/// Many runners of one campaign started together (`run`, `resume`, and the block task
/// `run-block`), in some rounds each killed at a random point, in others left to finish: every
/// round leaves one journal that `status` reads, that a runner resumes to the end with every
/// cell sealed once, and that `export` accepts. A runner that loses the race says so in one
/// line.
#[test]
fn racing_runners_leave_one_journal_that_resumes_and_exports() {
    use std::process::Stdio;
    let st = setup("t-race", &["[A, B]"], 4);
    const ROUNDS: u64 = 12;
    const RACERS: usize = 5;
    // xorshift64*, fixed seed: the same kill schedule every run (the scheduler varies the rest).
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |bound: u64| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    };
    let (mut lost, mut killed, mut won) = (0, 0, 0);
    for round in 0..ROUNDS {
        let results = st.dir.parent().unwrap().join(format!("results-race-{round}"));
        let kill = round % 2 == 0;
        let spawn = |i: usize| -> Reaped {
            let args: Vec<&str> = match i % RACERS {
                3 => vec!["campaign", "resume", s(&st.file)],
                4 => vec!["campaign", "run-block", s(&st.file), "--block", "0"],
                _ => vec!["campaign", "run", s(&st.file), "--no-progress"],
            };
            Reaped::new(bin().args(&args).args(["--results", s(&results)]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap())
        };
        let mut children: Vec<(Reaped, bool)> = (0..RACERS).map(|i| (spawn(i), false)).collect();
        if kill {
            // Half the kills land in the first 100 ms (preregistration, the journal's first
            // lines), the rest while cells run.
            let mut at: Vec<(u64, usize)> = (0..RACERS).map(|i| (if next(2) == 0 { next(100) } else { 100 + next(2500) }, i)).collect();
            at.sort();
            let t0 = Instant::now();
            for (ms, i) in at {
                let wait = Duration::from_millis(ms).saturating_sub(t0.elapsed());
                std::thread::sleep(wait);
                let (c, k) = &mut children[i];
                if c.try_wait().unwrap().is_none() {
                    c.kill().unwrap();
                    *k = true;
                }
            }
        }
        for (c, was_killed) in children {
            let out = c.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if was_killed {
                killed += 1;
            } else if out.status.success() {
                won += 1;
            } else {
                lost += 1;
                let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
                assert_eq!(lines.len(), 1, "round {round}: a runner that lost the race said:\n{err}");
                assert!(
                    ["being run by another process", "being run by a local runner", "is not preregistered", "are not settled yet"]
                        .iter()
                        .any(|w| lines[0].contains(w)),
                    "round {round}: {}",
                    lines[0]
                );
            }
        }
        // Workers die with their runners; the journal must read as it was left.
        std::thread::sleep(Duration::from_millis(200));
        if results.join("campaigns/t-race/campaign.json").exists() {
            ok(&["campaign", "status", s(&st.file), "--results", s(&results), "--json"]);
        }
        let r = ok(&["campaign", "run", s(&st.file), "--results", s(&results), "--no-progress", "--json"]);
        let summary: Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(summary["sealed"], 3, "round {round}: {summary}");
        let v: Value = serde_json::from_str(&ok(&["campaign", "status", s(&st.file), "--results", s(&results), "--json"]).stdout).unwrap();
        assert_eq!((v["finished"].as_bool(), v["counts"]["sealed"].as_u64()), (Some(true), Some(3)), "round {round}: {v}");
        assert_eq!(record_dirs(&results).len(), 3, "round {round}");
        // The root journal opens with the preregistration, and its sequence is unbroken.
        let j = journal(&results, "t-race");
        assert_eq!(j[0]["event"], "preregistered", "round {round}");
        assert!(j.iter().enumerate().all(|(i, e)| e["seq"] == i as u64), "round {round}: {j:?}");
        let out = st.dir.parent().unwrap().join(format!("export-race-{round}"));
        ok(&["export", "--campaign", "t-race", "--results", s(&results), "--out", s(&out)]);
    }
    eprintln!("racing runners: {} in all, {killed} killed, {won} finished, {lost} lost the race", ROUNDS as usize * RACERS);
    assert!(lost > 0 && killed > 0, "the races never contended: {lost} lost, {killed} killed");
}

/// One Plan setting is one `PlanOptions` field, and each has its `generate` flag and its
/// campaign arm field, both of its name (`budget` aside: the host cap or the device budget
/// gives it). A new field fails to compile here until it is named, and fails this test until
/// both exist.
#[test]
fn every_plan_setting_has_a_flag_and_an_arm_field() {
    use sovereign::plan::budget::{PlanBudget, Tier};
    let every = sovereign::plan::PlanOptions {
        slots: 1,
        policy: "lru:1".parse().unwrap(),
        source: sovereign::plan::SourceKind::F,
        windows: Some(1),
        depth: Some(1),
        layer_buffers: 0,
        fault: sovereign::source::fault::FaultCell::None,
        timeline_token: Some(0),
        token_pass: Some(1),
        prompt_pass: Some(1),
        budget: Some(PlanBudget { bytes: 1 << 30, tier: Tier::Host }),
        verify: Some(sovereign::digests::Verify::Blake3),
    };
    let fields: Vec<String> = serde_json::to_value(&every).unwrap().as_object().unwrap().keys().cloned().collect();
    assert_eq!(fields.len(), 12, "{fields:?}");
    let help = ok(&["generate", "--help"]).stdout;
    let flags: Vec<&str> = help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).filter(|w| w.starts_with("--")).collect();
    let schema: Value = serde_json::from_str(&ok(&["campaign", "schema"]).stdout).unwrap();
    let arm = schema["$defs"]["Arm"]["properties"].as_object().expect("the arm's fields");
    let mut missing = Vec::new();
    for f in fields.iter().filter(|f| *f != "budget") {
        if !flags.contains(&format!("--{}", f.replace('_', "-")).as_str()) {
            missing.push(format!("`{f}` has no generate flag"));
        }
        if !arm.contains_key(f) {
            missing.push(format!("`{f}` has no campaign arm field"));
        }
    }
    assert!(missing.is_empty(), "{missing:?}");
    // Both name the policy in one syntax, parsed by one type: a pin the flag takes, an arm takes.
    let arm_yaml = "id: a\nexperts: plan\nslots: 4\npolicy: lru:2+pin:0/1+prefetch\n";
    let parsed: sovereign::campaign::spec::Arm = sovereign::campaign::spec::from_yaml(arm_yaml).unwrap();
    assert_eq!(parsed.policy.unwrap().to_string(), "lru:2+pin:0/1+prefetch");
}
