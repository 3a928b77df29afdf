//! Temporal amortization (`generate --draft`): a proposer's drafts checked several per target
//! traversal. The committed tokens, response and routes equal the target's one-token greedy
//! run byte for byte. Logits rows come from traversals of several positions, which take other
//! kernels than one-token decodes (llamafile's sgemm serves matrix products of two or more
//! rows, ggml's vec_dot one row), so the rows are held bitwise to the relation that does hold:
//! the same drafted run with its target resident. Recurrent and hybrid targets take rejected
//! positions back through llama.cpp's per-position states (qwen35moe) or a restored snapshot
//! (qwen3next), and their states follow the same relation.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;

const PROMPT: &str = "A proposer drafts, the target checks every draft in one traversal.";
const OUTPUTS: u32 = 24;

fn gen(model: &Path, rec: &Path, extra: &[&str]) -> Value {
    generate_record(model, PROMPT, OUTPUTS, rec, extra)
}

fn assert_all_exact(a: &Path, b: &Path) {
    let c = compare_surfaces(a, b);
    assert!(c.len() >= 4 && c.iter().all(|(_, e)| *e), "{} vs {}: {c:?}", a.display(), b.display());
}

fn assert_exact_surfaces(a: &Path, b: &Path, which: &[&str]) {
    let c = compare_surfaces(a, b);
    for w in which {
        assert!(c.iter().any(|(s, e)| s == w && *e), "{w} of {} vs {}: {c:?}", a.display(), b.display());
    }
}

/// The report's own arithmetic: every output is a traversal's, acceptance adds up by position.
fn check_report(s: &Value, draft_max: u64) -> (u64, u64) {
    let get = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    let (traversals, outputs, drafted, accepted) = (get("traversals"), get("outputs"), get("drafted"), get("accepted"));
    assert_eq!(outputs, OUTPUTS as u64 - 1, "{s}");
    assert!(traversals >= 1 && traversals <= outputs, "{s}");
    // Each traversal commits its accepted drafts and one token of its own.
    assert_eq!(outputs, accepted + traversals, "{s}");
    assert!(accepted <= drafted && drafted <= traversals * draft_max, "{s}");
    let by: Vec<u64> = s["accepted_by_position"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let offered: Vec<u64> = s["offered_by_position"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(by.len() as u64, draft_max);
    assert_eq!(by.iter().sum::<u64>(), accepted, "{s}");
    assert_eq!(offered.iter().sum::<u64>(), drafted, "{s}");
    // A draft is accepted only after every draft before it was.
    assert!(by.windows(2).all(|w| w[0] >= w[1]), "{s}");
    assert!((s["outputs_per_traversal"].as_f64().unwrap() - outputs as f64 / traversals as f64).abs() < 1e-12);
    (accepted, drafted)
}

#[test]
fn drafted_tokens_are_the_targets_greedy_ones_and_rows_hold_against_the_resident_drafted_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let target = forge_arch(d, "qwen3moe", "1", &[]);
    let base = quantized(d, &target, "q4_k_m");
    let plain = d.join("plain");
    gen(&target, &plain, &[]);

    let drafted = d.join("drafted");
    let r = gen(&target, &drafted, &["--draft", base.to_str().unwrap(), "--draft-max", "4"]);
    assert_exact_surfaces(&plain, &drafted, &["tokens", "response", "routes"]);
    let (accepted, drafted_n) = check_report(&r["speculative"], 4);
    // The quantized base agrees with its target on most tokens: more than one output per
    // traversal, and rejections too (the rollback path runs).
    assert!(accepted > 0 && accepted < drafted_n, "{}", r["speculative"]);
    assert!(r["speculative"]["rollbacks"].as_u64().unwrap() > 0);
    assert_eq!(r["params"]["draft"]["draft_max"], 4);
    assert!(r["params"]["draft"]["model"]["sha256"].as_str().unwrap().len() == 64);
    assert!(r["speculative"]["expert_bytes"].is_null(), "a resident target reads no expert bytes");

    // The target's experts served by the Plan through fewer slots than a traversal selects:
    // every surface equals the resident drafted run's, and the bytes are counted.
    let served = d.join("served");
    let s = gen(&target, &served, &["--draft", base.to_str().unwrap(), "--draft-max", "4", "--experts", "plan", "--slots", "5"]);
    assert_all_exact(&drafted, &served);
    assert_eq!(s["speculative"]["traversals"], r["speculative"]["traversals"]);
    let bytes = s["speculative"]["expert_bytes"].as_u64().unwrap();
    let per = s["speculative"]["expert_bytes_per_output"].as_f64().unwrap();
    assert!(bytes > 0 && (per - bytes as f64 / (OUTPUTS - 1) as f64).abs() < 1e-6, "{}", s["speculative"]);

    // The target proposing for itself: every draft accepted but where batch kernels move a
    // near tie, the most outputs per traversal.
    let own = d.join("own");
    let o = gen(&target, &own, &["--draft", target.to_str().unwrap(), "--draft-max", "4"]);
    assert_exact_surfaces(&plain, &own, &["tokens", "response", "routes"]);
    let (a, n) = check_report(&o["speculative"], 4);
    assert!(a * 10 >= n * 9, "self-drafting accepted {a} of {n}");
}

#[test]
fn an_unrelated_proposer_costs_speed_never_exactness() {
    // Another seed: the same vocabulary, other weights. Nearly every draft is rejected and
    // rolled back; the committed tokens stay the target's.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let target = forge_arch(d, "qwen3moe", "1", &[]);
    let other = forge_arch(d, "qwen3moe", "2", &[]);
    let plain = d.join("plain");
    gen(&target, &plain, &[]);
    let drafted = d.join("drafted");
    let r = gen(&target, &drafted, &["--draft", other.to_str().unwrap(), "--draft-max", "3"]);
    assert_exact_surfaces(&plain, &drafted, &["tokens", "response", "routes"]);
    check_report(&r["speculative"], 3);
    assert!(r["speculative"]["rolled_back_positions"].as_u64().unwrap() > 0);
}

#[test]
fn hybrid_targets_roll_back_their_recurrent_state_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // qwen35moe keeps a recurrent state per position of a ubatch (llama.cpp's n_rs_seq);
    // qwen3next does not, and restores the state snapshotted before the traversal.
    for (arch, counter) in [("qwen35moe", "state_rollbacks"), ("qwen3next", "state_restores")] {
        let target = forge_arch(d, arch, "1", &[]);
        fs::create_dir_all(d.join(arch)).unwrap();
        let base = quantized(&d.join(arch), &target, "q4_k_m");
        let plain = d.join(format!("{arch}-plain"));
        gen(&target, &plain, &[]);
        let drafted = d.join(format!("{arch}-drafted"));
        let r = gen(&target, &drafted, &["--draft", base.to_str().unwrap(), "--draft-max", "4"]);
        assert_exact_surfaces(&plain, &drafted, &["tokens", "response", "routes"]);
        check_report(&r["speculative"], 4);
        assert!(r["speculative"][counter].as_u64().unwrap() > 0, "{arch}: {}", r["speculative"]);
        let served = d.join(format!("{arch}-served"));
        gen(&target, &served, &["--draft", base.to_str().unwrap(), "--draft-max", "4", "--experts", "plan", "--slots", "5"]);
        // The recurrent state after every commit and the last one included.
        assert_exact_surfaces(&drafted, &served, &["recurrent", "recurrent_state"]);
        assert_all_exact(&drafted, &served);
    }
}

#[test]
fn a_proposer_of_another_vocabulary_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let target = forge_arch(d, "qwen3moe", "1", &[]);
    // Sizes further apart than padding explains (llama.cpp's own bound, 128 ids).
    let other = forge_arch(d, "qwen3moe", "1", &["--vocab", "600"]);
    let rec = d.join("r");
    let r = generate(&target, PROMPT, 8, &rec, &["--draft", other.to_str().unwrap()]);
    assert_one_line_error(&r, &["vocabulary", "257 tokens against 600"]);
    // Failed closed, with the reason on record and no output surface.
    let v = record_json(&rec);
    assert_eq!(v["outcome"], "failed");
    assert!(v["error"].as_str().unwrap().contains("vocabulary"));
    assert!(v["surfaces"].get("tokens").is_none());

    // Out of bounds: refused before anything loads.
    for bad in ["0", "100000"] {
        let r = generate(&target, PROMPT, 8, &d.join(format!("b{bad}")), &["--draft", target.to_str().unwrap(), "--draft-max", bad]);
        assert_one_line_error(&r, &["--draft-max"]);
    }
}

#[test]
fn vocabularies_padded_to_other_sizes_are_the_same_vocabulary() {
    // Converters pad vocabularies to other sizes; the common ids mean the same, so such a
    // proposer is valid either way round. Drafts past the target's ids end a draft; a target
    // token past the proposer's ends drafting; the tokens stay the target's.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let small = forge_arch(d, "qwen3moe", "1", &[]);
    let padded = forge_arch(d, "qwen3moe", "1", &["--vocab", "300"]);
    for (target, proposer) in [(&small, &padded), (&padded, &small)] {
        let name = |s: &str| d.join(format!("{s}-{}", target.file_stem().unwrap().to_str().unwrap()));
        gen(target, &name("plain"), &[]);
        let r = gen(target, &name("drafted"), &["--draft", proposer.to_str().unwrap(), "--draft-max", "4"]);
        assert_exact_surfaces(&name("plain"), &name("drafted"), &["tokens", "response", "routes"]);
        check_report(&r["speculative"], 4);
    }
}

#[test]
fn plan_simulate_estimates_a_drafted_targets_bytes_from_one_token_routes() {
    // `plan simulate --draft-max` regroups a one-token run's decode positions into traversals
    // of K + 1, every draft accepted. A target drafting for itself accepts (nearly) every
    // draft: then its Plan read exactly the estimate; any rejection only adds bytes.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let target = forge_arch(d, "qwen3moe", "1", &[]);
    let plain = d.join("plain");
    gen(&target, &plain, &["--experts", "plan", "--slots", "8"]);
    let drafted = d.join("drafted");
    let r = gen(&target, &drafted, &["--draft", target.to_str().unwrap(), "--draft-max", "4", "--experts", "plan", "--slots", "8"]);
    let s = &r["speculative"];
    let r = ok(&[
        "plan",
        "simulate",
        "--routes",
        plain.to_str().unwrap(),
        "--model",
        target.to_str().unwrap(),
        "--slots",
        "8",
        "--policy",
        "zero",
        "--draft-max",
        "4",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let rows = v["drafted"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "K = 0..=4");
    assert_eq!(rows[0]["ratio"], 1.0);
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(row["draft"], k as u64);
        assert_eq!(row["outputs"], OUTPUTS as u64 - 1);
        assert_eq!(row["traversals"], (OUTPUTS as u64 - 1).div_ceil(k as u64 + 1));
    }
    // More positions per traversal share experts: never more bytes per output than K - 1.
    assert!(rows.windows(2).all(|w| w[1]["bytes_per_output"].as_f64() <= w[0]["bytes_per_output"].as_f64()), "{rows:?}");
    let estimate = rows[4]["bytes_read"].as_u64().unwrap();
    let read = s["expert_bytes"].as_u64().unwrap();
    if s["accepted"] == s["drafted"] {
        assert_eq!(read, estimate, "{s}");
        assert_eq!(s["traversals"], rows[4]["traversals"]);
    } else {
        assert!(read > estimate, "{read} bytes read, below the every-draft-accepted bound {estimate}: {s}");
    }
}

/// A campaign's `draft` arms: the proposer pinned under `proposers` (made by its quantize
/// recipe when missing), a resident drafted oracle and a Plan-served drafted arm, exact on
/// every surface and admitted, with the speculative report in the exported cells table. An
/// arm that decodes otherwise than its `all_surfaces` oracle is refused before anything runs;
/// under `relation: tokens` the same arms are a valid campaign.
#[test]
fn a_campaign_arm_drafts_through_the_plan_against_a_drafted_oracle() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("campaigns");
    fs::create_dir_all(&dir).unwrap();
    let target = forge(t.path(), "tiny.gguf", 1, &[]);
    fs::create_dir_all(t.path().join("q")).unwrap();
    let pinned = quantized(&t.path().join("q"), &target, "q4_k_m");
    let prompt = dir.join("prompt.txt");
    fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("campaigns/prompts/demo.txt"), &prompt).unwrap();
    let sha = |p: &Path| sovereign::util::sha256_file(p).unwrap();
    let (tree, patches) = build_identity();
    let text = format!(
        "id: draft-1\n\
model:\n  path: ../tiny.gguf\n  sha256: {model}\n\
proposers:\n  base:\n    path: ../base.gguf\n    sha256: {base}\n    quantize: {{ from: ../tiny.gguf, type: q4_k_m }}\n\
workload:\n  prompt_file: prompt.txt\n  prompt_sha256: {prompt}\n  prompt_tokens: 181\n  outputs: 12\n  ignore_eos: true\n\
build:\n  engine_tree_sha256: {tree}\n{patches}\
arms:\n  - {{ id: R-draft, experts: resident, threads: 2, draft: base, draft_max: 3 }}\n  - {{ id: F-draft, experts: plan, slots: 8, policy: zero, source: f, threads: 2, draft: base, draft_max: 3 }}\n\
schedule:\n  lead: [R-draft]\n  blocks:\n    preordered:\n      - [F-draft]\n\
oracle:\n  arm: R-draft\n  relation: all_surfaces\n  horizon: 12\n\
{CAMPAIGN_TAIL}",
        model = sha(&target),
        base = sha(&pinned),
        prompt = sha(&prompt),
    );
    let file = dir.join("draft.yaml");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // An arm decoding one token per traversal beside a drafted all_surfaces oracle, a proposer
    // that is not defined, and draft_max without draft: each refused at check, in one line.
    let plain = "  - { id: F, experts: plan, slots: 8, policy: zero, source: f, threads: 2 }\n";
    let tokens = text.replacen("relation: all_surfaces", "relation: tokens", 1);
    for (edit, needle) in [
        (text.replacen("schedule:", &format!("{plain}schedule:"), 1), "`relation: all_surfaces` cannot hold"),
        (
            tokens.replacen("draft: base, draft_max: 3 }\n  - { id: F-draft", "draft: other, draft_max: 3 }\n  - { id: F-draft", 1),
            "proposer `other`",
        ),
        (
            tokens.replacen("draft: base, draft_max: 3 }\n  - { id: F-draft", "draft_max: 3 }\n  - { id: F-draft", 1),
            "`draft_max` needs `draft`",
        ),
    ] {
        assert_ne!(edit, text);
        fs::write(&file, &edit).unwrap();
        let r = run(&["campaign", "check", &s(&file)]);
        assert_eq!(r.code, 1, "{needle}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(needle) && r.stderr.lines().count() == 1, "{needle}: {}\n{edit}", r.stderr);
    }
    // Under `relation: tokens`, a plain arm and drafted ones are one valid campaign.
    fs::write(&file, tokens.replacen("schedule:", &format!("{plain}schedule:"), 1)).unwrap();
    let r = ok(&["campaign", "check", &s(&file)]);
    assert!(r.stdout.contains("proposers.base") && r.stdout.contains("`campaign run` makes it from its recipe"), "{}", r.stdout);
    assert!(!t.path().join("base.gguf").exists(), "check makes nothing");

    fs::write(&file, &text).unwrap();
    let results = t.path().join("results");
    let out = t.path().join("export");
    let claim = run_and_export(&file, "draft-1", &results, &out, 2);
    assert!(t.path().join("base.gguf").is_file(), "run made the proposer from its recipe");
    let table = Table::read(&out.join("cells.csv"));
    let col = |name: &str| table.col(name);
    let rows = &table.rows;
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(&row[col("status")], "completed");
        assert_eq!(&row[col("valid")], "true", "{row:?}");
        assert_eq!(&row[col("draft")], "base");
        assert_eq!(&row[col("draft_max")], "3");
        let per: f64 = row[col("outputs_per_traversal")].parse().unwrap();
        assert!(per > 1.0 && per <= 4.0, "a Q4_K_M base of the target agrees often: {per}");
        let (drafted, accepted): (u64, u64) = (row[col("drafted")].parse().unwrap(), row[col("accepted")].parse().unwrap());
        assert!(accepted > 0 && accepted <= drafted);
    }
    let f = rows.iter().find(|r| &r[col("arm")] == "F-draft").unwrap();
    assert_eq!(&f[col("exact")], "true", "the Plan-served drafted arm against the resident drafted oracle, every surface");
    assert_eq!(&f[col("admission")], "true");
    assert!(f[col("expert_bytes_per_output")].parse::<f64>().unwrap() > 0.0);
    let r = rows.iter().find(|r| &r[col("arm")] == "R-draft").unwrap();
    assert_eq!(&r[col("expert_bytes_per_output")], "", "a resident target reads no expert bytes");
    // The claim reproduces from its pinned inputs, the proposer found by its digest.
    let report = reproduce_claim(&claim, &out.join("claims.json"), &results, &t.path().join("repro"), &file);
    assert_eq!(report["holds"], true, "{report:#}");
    assert_eq!(report["records"].as_array().unwrap().len(), 2);
}
