//! `reproduce`: shipped campaigns' claims run again on this machine, every surface bitwise equal
//! to the original; a tampered model, a missing model and a different build are refused in one
//! line before anything runs.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `<dir>/campaigns/<name>` (with the shipped prompts) beside `<dir>/models/tiny.gguf`.
fn shipped(dir: &Path, name: &str, text: &str) -> PathBuf {
    let c = dir.join("campaigns");
    fs::create_dir_all(c.join("prompts")).unwrap();
    fs::copy(root().join("campaigns/prompts/demo.txt"), c.join("prompts/demo.txt")).unwrap();
    fs::create_dir_all(dir.join("models")).unwrap();
    if !dir.join("models/tiny.gguf").exists() {
        forge(&dir.join("models"), "tiny.gguf", 1, &[]);
    }
    let file = c.join(name);
    fs::write(&file, text).unwrap();
    file
}

/// The shipped campaign with this build's identity in its `build` section (a shipped pin can
/// lag the patch series; the campaign runner refuses a mismatch either way).
fn with_this_build(text: &str) -> String {
    let v: Value = serde_json::from_str(&ok(&["build-info", "--json"]).stdout).unwrap();
    let e = &v["engine"];
    let mut build = format!("build:\n  engine_tree_sha256: {}\n  patches:", e["tree_sha256"].as_str().unwrap());
    let patches = e["patches"].as_array().unwrap();
    if patches.is_empty() {
        build += " []";
    }
    for p in patches {
        build += &format!("\n    - {{ name: {}, sha256: {} }}", p["name"].as_str().unwrap(), p["sha256"].as_str().unwrap());
    }
    let (start, end) = (text.find("\nbuild:\n").unwrap() + 1, text.find("\narms:\n").unwrap());
    format!("{}{build}{}", &text[..start], &text[end..])
}

fn sha256(p: &Path) -> String {
    sovereign::util::sha256_file(p).unwrap()
}

/// Runs the campaign, exports its draft ledger and returns (results, the sealed ledger's file):
/// a plain claim ID from it is anchored by the seal.
fn run_and_export(dir: &Path, file: &Path, id: &str) -> (PathBuf, PathBuf) {
    let results = dir.join("results");
    ok(&["campaign", "run", s(file), "--results", s(&results), "--no-progress"]);
    let export = dir.join("export");
    let r = ok(&["export", "--campaign", id, "--results", s(&results), "--out", s(&export)]);
    let sealed =
        r.stdout.lines().find_map(|l| l.strip_prefix("ledger ")?.strip_suffix(" (sealed)")).expect("export prints the sealed ledger");
    (results, PathBuf::from(sealed).join("ledger.json"))
}

/// Reproduces, checks the report, and returns it.
fn reproduce_holds(claim: &str, ledger: &Path, results: &Path, out: &Path, extra: &[&str]) -> Value {
    let v = reproduce_judged(claim, ledger, results, out, extra);
    assert_eq!(v["report"]["holds"], true, "{:#}", v["report"]);
    v
}

/// Runs `reproduce` and checks all it can whether or not the claim held: exit status 0 exactly
/// when the report holds, the report holds exactly when every assertion does, every record
/// bitwise equal to its original, the report sealed.
fn reproduce_judged(claim: &str, ledger: &Path, results: &Path, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["reproduce", "--claim", claim, "--ledger", s(ledger), "--results", s(results), "--out", s(out), "--json"];
    args.extend_from_slice(extra);
    let r = run(&args);
    let v: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {args:?}\n{}\n{}", r.stdout, r.stderr));
    let report = &v["report"];
    let all = report["assertions"].as_array().unwrap().iter().all(|a| a["holds"] == true);
    assert_eq!(report["holds"], all, "{report:#}");
    assert_eq!(r.code == 0, all, "exit {} for {report:#}\n{}", r.code, r.stderr);
    // Every record ran again under a new digest, every surface bitwise equal to the original's.
    for p in report["records"].as_array().unwrap() {
        let (o, n) = (p["original"].as_str().unwrap(), p["reproduced"].as_str().unwrap());
        assert_ne!(o, n);
        sovereign::record::verify_record(&out.join(n)).unwrap();
        let surfaces = p["surfaces"].as_object().unwrap();
        assert_eq!(surfaces.len(), sovereign::oracle::SURFACES.len(), "{p}");
        assert!(surfaces.values().all(|x| x == "exact"), "{p}");
        // And, independently of the report, by bytes.
        for f in ["tokens.bin", "logits.bin"] {
            let (a, b) = (fs::read(results.join(o).join(f)), fs::read(out.join(n).join(f)));
            assert!(a.is_ok() && a.ok() == b.ok(), "{f} of {o} and {n}");
        }
    }
    // The report is sealed like a record.
    let sealed = PathBuf::from(v["sealed"].as_str().unwrap());
    sovereign::record::verify_record(&sealed).unwrap();
    let back: Value = serde_json::from_str(&fs::read_to_string(sealed.join("reproduction.json")).unwrap()).unwrap();
    assert_eq!(&back, report);
    let verdict = if all { "reproduction holds" } else { "reproduction FAILED" };
    assert!(fs::read_to_string(sealed.join("reproduction.txt")).unwrap().contains(verdict));
    v
}

/// The interval of a paired ratio as the report shows it: `RATIO [LO, HI]`.
fn shown_interval(v: &Value) -> (f64, f64) {
    let text = v.as_str().unwrap();
    let inner = text.split_once('[').and_then(|(_, r)| r.strip_suffix(']')).unwrap_or_else(|| panic!("no interval in {text:?}"));
    let (lo, hi) = inner.split_once(", ").unwrap();
    (lo.parse().unwrap(), hi.parse().unwrap())
}

fn kinds(report: &Value) -> Vec<String> {
    report["assertions"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap().to_string()).collect()
}

#[test]
fn exactness_claim_reproduces_bitwise_and_what_differs_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let id = "exactness-resident-1";
    let file = shipped(t.path(), "exactness.yaml", &with_this_build(&fs::read_to_string(root().join("campaigns/exactness.yaml")).unwrap()));
    let (results, ledger) = run_and_export(t.path(), &file, id);
    let out = t.path().join("repro");

    // A record says it ran with other CPU features: a warning, recorded, not a refusal.
    let (ledger, results) = altered(t.path(), &results, &ledger, id, "b01-p0-resident", "other-cpu", |r, _| {
        r["build"]["cpu_features"] = serde_json::json!(["NOT-THIS-CPU"]);
    });
    let v = reproduce_holds(id, &ledger, &results, &out, &["--campaign", s(&file), "--unanchored"]);
    let report = &v["report"];
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].as_str().unwrap().contains("CPU features") && warnings[0].as_str().unwrap().contains("NOT-THIS-CPU"));
    let k = kinds(report);
    assert_eq!(k.iter().filter(|k| *k == "surfaces").count(), 7);
    assert_eq!(k.iter().filter(|k| *k == "exactness").count(), 6);
    assert_eq!(k.iter().filter(|k| *k == "timing").count(), 1, "{k:?}");
    assert!(report["timing_rule"].as_str().unwrap().contains("overlaps"));

    // A rerun resumes: nothing runs again and the same report is the same sealed record.
    let r = ok(&[
        "reproduce",
        "--claim",
        id,
        "--unanchored",
        "--ledger",
        s(&ledger),
        "--results",
        s(&results),
        "--out",
        s(&out),
        "--campaign",
        s(&file),
        "--json",
    ]);
    let again: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(again["sealed"], v["sealed"]);
    assert!(r.stderr.contains("0 ran now"), "{}", r.stderr);

    // The text form prints original, reproduced and the verdict per assertion.
    let r = ok(&[
        "reproduce",
        "--claim",
        id,
        "--unanchored",
        "--ledger",
        s(&ledger),
        "--results",
        s(&results),
        "--out",
        s(&out),
        "--campaign",
        s(&file),
    ]);
    assert!(r.stdout.contains("holds timing") && r.stdout.contains("original") && r.stdout.contains("reproduced"), "{}", r.stdout);
    assert!(r.stdout.contains("reproduction holds"), "{}", r.stdout);

    // A record whose logits are not what this build computes: the reproduction does not hold,
    // names the surface, and exits 1 (the cells are not run again: the same --out resumes).
    let (forged, forged_results) = altered(t.path(), &results, &ledger, id, "b02-p1-resident", "forged-logits", |r, dir| {
        let f = dir.join("logits.bin");
        let mut bytes = fs::read(&f).unwrap();
        let n = bytes.len();
        bytes[n - 2] ^= 0x40;
        fs::write(&f, &bytes).unwrap();
        r["surfaces"]["logits"]["sha256"] = sovereign::util::sha256(&bytes).into();
    });
    let r = run(&[
        "reproduce",
        "--claim",
        id,
        "--unanchored",
        "--ledger",
        s(&forged),
        "--results",
        s(&forged_results),
        "--out",
        s(&out),
        "--campaign",
        s(&file),
    ]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("FAILS surfaces   record b02-p1-resident: ") && r.stdout.contains("differs in logits"), "{}", r.stdout);
    assert!(r.stdout.contains("holds timing") && r.stdout.contains("reproduction FAILED"), "{}", r.stdout);
    assert!(r.stderr.contains("reproduce failed: record b02-p1-resident"), "{}", r.stderr);
    assert!(r.stderr.contains("0 ran now"), "{}", r.stderr);

    let model = t.path().join("models/tiny.gguf");
    let digest = sha256(&model);
    let fresh = t.path().join("refused");
    let refused_in = |extra: &[&str], ledger: &Path, results: &Path, needles: &[&str]| {
        let mut args = vec!["reproduce", "--claim", id, "--unanchored", "--ledger", s(ledger), "--results", s(results), "--out", s(&fresh)];
        args.extend_from_slice(extra);
        assert_one_line_error(&run(&args), needles);
        assert!(!fresh.join("campaigns").exists(), "a refused reproduction ran something");
    };
    let refused = |extra: &[&str], ledger: &Path, needles: &[&str]| refused_in(extra, ledger, &results, needles);

    // A tampered model, given by digest.
    let tampered = t.path().join("tampered.gguf");
    let mut bytes = fs::read(&model).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    fs::write(&tampered, bytes).unwrap();
    let given = format!("{digest}={}", tampered.display());
    refused(&["--campaign", s(&file), "--model", &given], &ledger, &["tampered.gguf", "sha256", &digest]);

    // A missing model: the campaign file copied where no models are beside it.
    let elsewhere = t.path().join("elsewhere/campaigns");
    fs::create_dir_all(elsewhere.join("prompts")).unwrap();
    fs::copy(&file, elsewhere.join("exactness.yaml")).unwrap();
    fs::copy(root().join("campaigns/prompts/demo.txt"), elsewhere.join("prompts/demo.txt")).unwrap();
    refused(&["--campaign", s(&elsewhere.join("exactness.yaml"))], &ledger, &["tiny.gguf", "cannot read"]);
    // Nor is anything found without a campaign file or the model's digest.
    refused(&[], &ledger, &["model", &digest, "--campaign"]);

    // A different build: one record's engine tree digest altered and the record sealed again.
    let alias = "b01-p1-resident-t1";
    let (other, other_results) = altered(t.path(), &results, &ledger, id, alias, "other-build", |r, _| {
        r["build"]["engine"]["tree_sha256"] = "0".repeat(64).into();
    });
    refused_in(&["--campaign", s(&file)], &other, &other_results, &[alias, "engine tree digest", &"0".repeat(64)]);

    // The originals' own directory is not a place for a reproduction.
    let r = run(&[
        "reproduce",
        "--claim",
        id,
        "--unanchored",
        "--ledger",
        s(&ledger),
        "--results",
        s(&results),
        "--out",
        s(&results),
        "--campaign",
        s(&file),
    ]);
    assert_one_line_error(&r, &["--out"]);

    // Nor is a claim whose own records no longer verify.
    let l: Value = serde_json::from_str(&fs::read_to_string(&ledger).unwrap()).unwrap();
    let victim = results.join(l["claims"][id]["records"]["b03-p0-resident"].as_str().unwrap()).join("tokens.bin");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&victim).unwrap();
    bytes[0] ^= 1;
    fs::write(&victim, bytes).unwrap();
    refused(&["--campaign", s(&file)], &ledger, &["does not verify", "tokens.bin"]);
}

/// A copy of the results and of the ledger in which one record is replaced by a copy of it,
/// edited by `edit` (its record.json, and the directory) and sealed again, the original gone
/// and the journal pointed at the new one: a consistent history that verifies (only the
/// claim's published digest tells it apart). Returns the ledger and the results.
fn altered(
    dir: &Path,
    results: &Path,
    ledger: &Path,
    id: &str,
    alias: &str,
    name: &str,
    edit: impl FnOnce(&mut Value, &Path),
) -> (PathBuf, PathBuf) {
    let copy = dir.join(format!("{name}.results"));
    copy_writable(results, &copy);
    let mut l: Value = serde_json::from_str(&fs::read_to_string(ledger).unwrap()).unwrap();
    let orig = l["claims"][id]["records"][alias].as_str().unwrap().to_string();
    let staging = dir.join(format!("{name}.staging"));
    copy_writable(&copy.join(&orig), &staging);
    fs::remove_file(staging.join("manifest.json")).unwrap();
    let mut rec: Value = serde_json::from_str(&fs::read_to_string(staging.join("record.json")).unwrap()).unwrap();
    edit(&mut rec, &staging);
    fs::write(staging.join("record.json"), serde_json::to_string_pretty(&rec).unwrap()).unwrap();
    let sealed = sovereign::record::seal(&staging, &copy).unwrap();
    fs::remove_dir_all(copy.join(&orig)).unwrap();
    for j in journal_files(&copy.join("campaigns").join(id)) {
        let text = fs::read_to_string(&j).unwrap();
        fs::write(&j, text.replace(&orig, &sealed.digest)).unwrap();
    }
    l["claims"][id]["records"][alias] = sealed.digest.clone().into();
    if name == "forged-logits" {
        // A claim that states no exactness or admission for the forged record (else its own
        // replay fails first): only the surfaces can tell.
        l["claims"][id]["replay"].as_array_mut().unwrap().retain(|r| r.get("paired_ratio").is_some());
    }
    let out = dir.join(format!("{name}.json"));
    fs::write(&out, serde_json::to_string_pretty(&l).unwrap()).unwrap();
    ok(&["verify", "--claim", id, "--unanchored", "--ledger", s(&out), "--results", s(&copy)]);
    (out, copy)
}

/// The journal files of a campaign directory: `journal.jsonl` and a cluster run's `journals/`.
fn journal_files(campaign: &Path) -> Vec<PathBuf> {
    let mut v = vec![campaign.join("journal.jsonl")];
    if let Ok(rd) = fs::read_dir(campaign.join("journals")) {
        v.extend(rd.flatten().map(|e| e.path()));
    }
    v.into_iter().filter(|p| p.is_file()).collect()
}

fn copy_writable(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_writable(&e.path(), &dst);
        } else {
            fs::write(&dst, fs::read(e.path()).unwrap()).unwrap();
        }
    }
}

/// pdf-pairs.yaml scaled down: the tiny model, D and F under a memory cap, two counterbalanced
/// pairs of 8 outputs (the fewest with an interval); its paired F/D ratio is reproduced within
/// its interval.
#[test]
fn paired_ratio_claim_of_pdf_pairs_reproduces_under_its_cap() {
    if !cgroups_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let id = "pdf-pairs-repro";
    let text = with_this_build(&fs::read_to_string(root().join("campaigns/pdf-pairs.yaml")).unwrap());
    let blocks = "      - [D, F]\n      - [D, F]\n      - [F, D]\n      - [F, D]\n      - [D, F]\n      - [F, D]\n";
    assert!(text.contains("ef110610cc8fd99f2a6b7451b1f7b312de9ae5bce45aa3e79adf66c6a6f510ea") && text.contains("      - [D, F]"));
    let dir = t.path();
    let file = shipped(dir, "pdf-pairs.yaml", "");
    let tiny = sha256(&dir.join("models/tiny.gguf"));
    let scaled = text
        .replace("id: pdf-pairs-tiny-1", &format!("id: {id}"))
        .replace("../models/pdf.gguf", "../models/tiny.gguf")
        .replace("  forge: { preset: tiny, seed: 1, layers: 4, experts: 32 }\n", "")
        .replace("ef110610cc8fd99f2a6b7451b1f7b312de9ae5bce45aa3e79adf66c6a6f510ea", &tiny)
        .replace("outputs: 32", "outputs: 8")
        .replace("horizon: 32", "horizon: 8")
        .replace("lead: [oracle, P]", "lead: [oracle]")
        .replace("50331648", "67108864");
    // P's page-cache charge is not what this test reproduces: only D and F, in two pairs.
    let scaled = scaled.replace(&scaled[scaled.find("  - id: P\n").unwrap()..scaled.find("  - id: D\n").unwrap()], "");
    let scaled = scaled.replace(blocks, "      - [D, F]\n      - [F, D]\n");
    fs::write(&file, &scaled).unwrap();
    let (results, ledger) = run_and_export(dir, &file, id);
    let l: Value = serde_json::from_str(&fs::read_to_string(&ledger).unwrap()).unwrap();
    assert!(l["claims"][id]["replay"].as_array().unwrap().iter().any(|r| r.get("paired_ratio").is_some()), "{l:#}");

    // Inputs by digest this time, not through the campaign file; the frozen campaign beside the
    // records says what ran.
    let model = format!("{tiny}={}", dir.join("models/tiny.gguf").display());
    let prompt = dir.join("campaigns/prompts/demo.txt");
    let prompt = format!("{}={}", sha256(&prompt), prompt.display());
    let out = dir.join("repro");
    // Whether two pairs timed on the suite's busy cores land in the original's interval is the
    // machine's business: every other assertion must hold, and the timing verdict must be the
    // timing rule applied to the two intervals the report shows.
    let v = reproduce_judged(id, &ledger, &results, &out, &["--model", &model, "--prompt", &prompt]);
    let report = &v["report"];
    let (timing, rest): (Vec<&Value>, Vec<&Value>) = report["assertions"].as_array().unwrap().iter().partition(|a| a["kind"] == "timing");
    assert!(!rest.is_empty() && rest.iter().all(|a| a["holds"] == true), "{report:#}");
    assert_eq!(timing.len(), 1);
    assert!(timing[0]["what"].as_str().unwrap().contains("over 2 pairs"), "{}", timing[0]);
    let (a, b) = (shown_interval(&timing[0]["original"]), shown_interval(&timing[0]["reproduced"]));
    assert!(a.0 <= a.1 && b.0 <= b.1, "{}", timing[0]);
    assert_eq!(timing[0]["holds"], a.0.max(b.0) <= a.1.min(b.1), "{}", timing[0]);
    // The same cap: every reproduced cell ran under it.
    for p in report["records"].as_array().unwrap() {
        let cell: Value =
            serde_json::from_str(&fs::read_to_string(out.join(p["reproduced"].as_str().unwrap()).join("cell.json")).unwrap()).unwrap();
        if cell["cell"]["arm"]["id"] != "oracle" {
            assert_eq!(cell["cell"]["arm"]["memory_cap_bytes"], 67108864);
            assert_eq!(cell["admission"]["passed"], true, "{cell:#}");
        }
    }
}

/// A campaign whose model is a shard set, pinned by the set's SHA-256: its cells read the set
/// (resident and through F under a cap), its claim verifies, and `reproduce` lays the whole set
/// out from the first shard given by digest and holds bitwise.
#[test]
fn a_campaign_on_a_shard_set_runs_verifies_and_reproduces() {
    let t = tempfile::tempdir().unwrap();
    let id = "exactness-set-1";
    let shipped_text = with_this_build(&fs::read_to_string(root().join("campaigns/exactness.yaml")).unwrap());
    let file = shipped(t.path(), "set.yaml", &shipped_text);
    let models = t.path().join("models");
    let split = ok(&["model", "split", s(&models.join("tiny.gguf")), s(&models.join("tiny-set")), "--max-tensors", "10", "--json"]);
    let set: Value = serde_json::from_str(&split.stdout).unwrap();
    let digest = set["sha256"].as_str().unwrap().to_string();
    assert_eq!(set["shards"].as_array().unwrap().len(), 4);
    let text = shipped_text
        .replace("id: exactness-resident-1", &format!("id: {id}"))
        .replace("path: ../models/tiny.gguf", "path: ../models/tiny-set-00001-of-00004.gguf")
        .replace("  forge: { preset: tiny, seed: 1 }\n", "")
        .replace(&shipped_sha(&shipped_text), &digest)
        .replace(
            "  - id: resident-t1\n    experts: resident\n    threads: 1\n",
            "  - id: resident-t1\n    experts: plan\n    slots: 8\n    policy: \"lru:4\"\n    source: f\n    memory_cap_bytes: 268435456\n    threads: 2\n",
        );
    // No timing claim: what is reproduced here is the set's bytes, not how long the suite's
    // busy cores took (the timing rule has tests of its own).
    let analysis = text.find("analysis:\n").expect("the shipped campaign's analysis");
    let text = text[..analysis].to_string();
    fs::write(&file, &text).unwrap();
    let (results, ledger) = run_and_export(t.path(), &file, id);
    let journal = fs::read_to_string(results.join("campaigns").join(id).join("journal.jsonl")).unwrap();
    let sealed = journal
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "cell_sealed" && e["cell"].as_str().unwrap().ends_with("resident-t1"))
        .unwrap();
    assert_eq!(sealed["exact"], true, "{sealed}");
    let rec: Value =
        serde_json::from_str(&fs::read_to_string(results.join(sealed["digest"].as_str().unwrap()).join("record.json")).unwrap()).unwrap();
    assert!(rec["experts"]["telemetry"]["q_run"]["reads"].as_u64().unwrap() > 0, "the arm read the set through the Plan");
    assert_eq!(rec["model"]["sha256"], digest.as_str(), "{}", rec["model"]);
    assert_eq!(rec["model"]["shards"].as_array().map(Vec::len), Some(4));
    ok(&["verify", "--claim", id, "--ledger", s(&ledger), "--results", s(&results)]);
    // Given by digest from elsewhere: the set is found from its first shard and laid out whole.
    let elsewhere = t.path().join("moved");
    fs::create_dir_all(&elsewhere).unwrap();
    for i in 1..=4 {
        let name = format!("tiny-set-{i:05}-of-00004.gguf");
        fs::rename(models.join(&name), elsewhere.join(&name)).unwrap();
    }
    let given = format!("{digest}={}", elsewhere.join("tiny-set-00001-of-00004.gguf").display());
    let out = t.path().join("repro");
    let v = reproduce_holds(id, &ledger, &results, &out, &["--campaign", s(&file), "--model", &given]);
    assert!(kinds(&v["report"]).iter().any(|k| k == "surfaces"));
    // A shard of the set altered: refused before anything runs, naming the set's digest.
    let third = elsewhere.join("tiny-set-00003-of-00004.gguf");
    let mut bytes = fs::read(&third).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    fs::write(&third, bytes).unwrap();
    let r = run(&[
        "reproduce",
        "--claim",
        id,
        "--ledger",
        s(&ledger),
        "--results",
        s(&results),
        "--out",
        s(&t.path().join("refused")),
        "--campaign",
        s(&file),
        "--model",
        &given,
    ]);
    // (A line before it says why the altered shard's manifest is built again.)
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    let last = r.stderr.lines().last().unwrap();
    assert!(last.contains("tiny-set-00001-of-00004.gguf") && last.contains(&digest) && !r.stderr.contains("panicked"), "{}", r.stderr);
    assert!(!t.path().join("refused/campaigns").exists(), "a refused reproduction ran something");
}

/// The model pin of a shipped campaign text.
fn shipped_sha(text: &str) -> String {
    let at = text.find("\nmodel:\n").unwrap();
    text[at..].lines().find_map(|l| l.trim().strip_prefix("sha256: ")).unwrap().to_string()
}
