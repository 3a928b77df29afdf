//! Temporal amortization with the model's own multi-token-prediction head (`generate --draft
//! mtp`, seed 000 A.1): qwen35moe (hybrid: its recurrent states are rebased), glm4moe,
//! deepseek32 and glm-dsa (attention only, as GLM-4.5's, DeepSeek-V3.2's and GLM-5's files
//! with their nextn block; the last two with a lightning indexer) and mimo2 (a dense head),
//! each with one nextn block,
//! resident and through F with LRU. The committed tokens, response and routes are the target's
//! one-token greedy ones; every surface (all logits rows, every recurrent state) equals the same
//! MTP-drafted run with the target resident.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

const PROMPT: &str = "A head drafts from the target's own hidden state, several tokens a traversal.";
const OUTPUTS: u32 = 32;

/// qwen35moe at the tiny preset, seed 1, with `extra` (`--mtp-layers N`).
fn forge_mtp(dir: &Path, extra: &[&str]) -> PathBuf {
    forge_arch(dir, "qwen35moe", "1", extra)
}

/// Whether a family keeps recurrent states (its drafted positions are rebased, not trimmed).
fn hybrid(arch: &str) -> bool {
    arch == "qwen35moe"
}

fn gen(model: &Path, rec: &Path, extra: &[&str]) -> Value {
    generate_record(model, PROMPT, OUTPUTS, rec, extra)
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn the_mtp_head_drafts_the_targets_greedy_tokens_and_f_with_lru_holds_every_surface() {
    head_drafts("qwen35moe");
}

#[test]
fn a_glm4moe_head_drafts_the_targets_greedy_tokens_and_f_with_lru_holds_every_surface() {
    head_drafts("glm4moe");
}

/// DeepSeek-V3.2's head: MLA without the trunk's lightning indexer, its KV cache apart from the
/// target's indexed one.
#[test]
fn a_deepseek32_head_drafts_the_targets_greedy_tokens_and_f_with_lru_holds_every_surface() {
    head_drafts("deepseek32");
}

#[test]
fn a_glm_dsa_head_drafts_the_targets_greedy_tokens_and_f_with_lru_holds_every_surface() {
    head_drafts("glm-dsa");
}

/// MiMo-V2's head: a dense block (fused QKV, sliding window with sinks), so the Plan serves
/// only the target's experts while it drafts.
#[test]
fn a_mimo2_dense_head_drafts_the_targets_greedy_tokens_and_f_with_lru_holds_every_surface() {
    head_drafts("mimo2");
}

/// Hy3's head: its trunk's MoE block (q/k norms, sigmoid routing with a selection bias beside a
/// shared expert) behind the projections, its own norm before the model's head.
#[test]
fn a_hy_v3_head_drafts_the_targets_greedy_tokens_and_f_with_lru_holds_every_surface() {
    head_drafts("hy_v3");
}

/// Whether a family's nextn block is dense (no experts, no routes of its own).
fn dense_head(arch: &str) -> bool {
    arch == "mimo2"
}

/// `arch` at the tiny preset (three trunk layers) with one nextn block: it drafts the target's
/// greedy tokens, resident and through F with LRU, and a plain run never touches its slots.
fn head_drafts(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = forge_arch(d, arch, "1", &["--mtp-layers", "1"]);
    // The inventory names the nextn block: its layer, its tensors and expert objects.
    let inv: Value = serde_json::from_str(&ok(&["inventory", model.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(inv["mtp_layers"], serde_json::json!([3]));
    assert!(inv["tensors"].as_array().unwrap().iter().any(|t| t["name"] == "blk.3.nextn.eh_proj.weight"));
    let head_objects = if dense_head(arch) { 0 } else { 16 };
    assert_eq!(inv["objects"].as_array().unwrap().iter().filter(|o| o["layer"] == 3).count(), head_objects);
    let text = ok(&["inventory", model.to_str().unwrap()]).stdout;
    assert!(text.contains("MTP        layer 3 (nextn block)"), "{text}");

    let plain = d.join("plain");
    gen(&model, &plain, &[]);
    let drafted = d.join("drafted");
    let r = gen(&model, &drafted, &["--draft", "mtp", "--draft-max", "3"]);
    let c = compare_surfaces(&plain, &drafted);
    for w in ["tokens", "response", "routes"] {
        assert!(c.iter().any(|(s, e)| s == w && *e), "{w}: {c:?}");
    }
    // A run that drafted with a MoE head has the head's routes; the plain run has none.
    assert_eq!(c.iter().any(|(s, e)| s == "mtp_routes" && !*e), !dense_head(arch), "{c:?}");
    let s = &r["speculative"];
    let (traversals, accepted, drafted_n) = (u(s, "traversals"), u(s, "accepted"), u(s, "drafted"));
    assert_eq!(u(s, "outputs"), u64::from(OUTPUTS) - 1);
    assert_eq!(u(s, "outputs"), accepted + traversals, "{s}");
    // The head agrees often and not always: both the accepted and the rebased paths run.
    assert!(accepted > 0 && accepted < drafted_n, "{s}");
    assert!(s["outputs_per_traversal"].as_f64().unwrap() > 1.0, "{s}");
    if hybrid(arch) {
        // The state ledger: a state staged for every fed position, one winner per traversal,
        // the rest rebased onto it; qwen35moe takes rejected positions back per position.
        let fed = traversals + drafted_n;
        assert_eq!(u(s, "state_stages"), fed, "{s}");
        assert_eq!(u(s, "winner_commits"), traversals, "{s}");
        assert_eq!(u(s, "loser_rebases"), fed - traversals, "{s}");
        assert!(u(s, "state_rollbacks") > 0, "{s}");
    } else {
        // No recurrent state: rejected drafts leave the KV cache by trimming alone.
        assert_eq!((u(s, "state_stages"), u(s, "loser_rebases")), (0, 0), "{s}");
        assert!(u(s, "rollbacks") > 0 && u(s, "rolled_back_positions") >= u(s, "rollbacks"), "{s}");
    }
    assert!(s["expert_bytes"].is_null(), "a resident target reads no expert bytes");
    let p = &r["params"]["draft"];
    assert_eq!(p["proposer"], "mtp");
    assert_eq!(p["head_layer"], 3);
    assert_eq!(p["draft_max"], 3);
    assert_eq!(p["model"]["sha256"], r["model"]["sha256"]);

    // F with LRU through fewer slots than the layers have experts, the head's layer included:
    // every surface equals the resident MTP-drafted run's, and the head's reads are counted.
    let served = d.join("served");
    let f = gen(&model, &served, &["--draft", "mtp", "--draft-max", "3", "--experts", "plan", "--slots", "8", "--policy", "lru:8"]);
    let c = compare_surfaces(&drafted, &served);
    assert!(c.len() >= 4 && c.iter().all(|(_, e)| *e), "{c:?}");
    // The head's own routing, every decode of its block, is a surface of its own and exact too.
    assert_eq!(c.iter().any(|(s, _)| s == "mtp_routes"), !dense_head(arch), "{c:?}");
    assert_eq!(c.iter().any(|(s, _)| s == "recurrent_state"), hybrid(arch), "{c:?}");
    let fs_ = &f["speculative"];
    assert_eq!(fs_["traversals"], s["traversals"]);
    let (bytes, head) = (u(fs_, "expert_bytes"), u(fs_, "proposer_expert_bytes"));
    assert!(head < bytes && (head == 0) == dense_head(arch), "{fs_}");
    assert_eq!(f["experts"]["closure"]["active_tickets"], 0, "{}", f["experts"]);
    // The drafting run's prefill is its prompt alone: its traversals feed several tokens too.
    assert_eq!(f["experts"]["prefill"]["tokens"], f["counts"]["prompt_tokens"], "{}", f["experts"]["prefill"]);
    // `plan simulate --draft-max` replays the target's routes; the head's own reads, which
    // the routes leave out, are named beside the bounds as the run measured them.
    let (routes, m) = (served.to_str().unwrap(), model.to_str().unwrap());
    let sim =
        ok(&["plan", "simulate", "--routes", routes, "--model", m, "--draft-max", "3", "--slots", "8", "--policy", "lru:8", "--json"]);
    let sim: Value = serde_json::from_str(&sim.stdout).unwrap();
    assert_eq!(sim["mtp_head"]["layer"], 3, "{}", sim["mtp_head"]);
    let per = sim["mtp_head"]["bytes_per_output"].as_f64().unwrap();
    assert!((per - head as f64 / u(fs_, "outputs") as f64).abs() < 1e-6, "{per}");
    assert_eq!(sim["drafted"].as_array().unwrap().len(), 4);

    // Without drafts the head's layer is never run (its slots stay empty): the plain run
    // through F holds to the resident plain run.
    let plain_f = d.join("plain-f");
    gen(&model, &plain_f, &["--experts", "plan", "--slots", "8", "--policy", "lru:8"]);
    assert!(compare_surfaces(&plain, &plain_f).iter().all(|(_, e)| *e));
}

#[test]
fn a_model_without_a_head_a_non_finite_draft_and_a_fault_fail_closed_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Forge writes nextn blocks only where it knows the loader's.
    let r = run(&[
        "model",
        "forge",
        "--arch",
        "qwen3moe",
        "--preset",
        "tiny",
        "--mtp-layers",
        "1",
        "--out",
        d.join("x.gguf").to_str().unwrap(),
    ]);
    assert_one_line_error(&r, &["--mtp-layers", "qwen35moe"]);

    // No nextn block: refused once the run started, a failed record saying why.
    let none = forge_mtp(d, &[]);
    let rec = d.join("none");
    let r = generate(&none, PROMPT, 8, &rec, &["--draft", "mtp"]);
    assert_one_line_error(&r, &["--draft mtp", "no MTP"]);
    let v = record_json(&rec);
    assert_eq!(v["outcome"], "failed");
    assert!(v["surfaces"].get("tokens").is_none());

    // Nextn blocks the pin has no graph for (Ling 2.0's, K-EXAONE's): refused in one line, a
    // failed record.
    for arch in ["bailingmoe2", "exaone-moe"] {
        let model = forge_arch(d, arch, "1", &["--mtp-layers", "1"]);
        let rec = d.join(format!("{arch}-draft"));
        let r = generate(&model, PROMPT, 8, &rec, &["--draft", "mtp"]);
        assert_one_line_error(&r, &["--draft mtp", arch, "not driven"]);
        assert_eq!(record_json(&rec)["outcome"], "failed", "{arch}");
    }

    // Two nextn blocks: llama.cpp's qwen35moe head asserts one; refused, never an abort.
    let two = forge_mtp(d, &["--mtp-layers", "2"]);
    let r = generate(&two, PROMPT, 8, &d.join("two"), &["--draft", "mtp"]);
    assert_one_line_error(&r, &["--draft mtp", "one nextn block", "2"]);

    // A head whose rows are NaN drafts nothing: the run fails closed naming the head.
    let model = forge_mtp(d, &["--mtp-layers", "1"]);
    let nan = with_nan(&model, "blk.3.nextn.eh_proj.weight", &d.join("nan.gguf"));
    let rec = d.join("nan");
    let r = generate(&nan, PROMPT, 8, &rec, &["--ignore-eos", "--draft", "mtp"]);
    assert_one_line_error(&r, &["MTP head logits", "not finite"]);
    let v = record_json(&rec);
    assert_eq!(v["outcome"], "failed");
    assert!(v["surfaces"].get("tokens").is_none());

    // K beyond a traversal's ubatch: refused before anything loads.
    let r = generate(&model, PROMPT, 8, &d.join("k"), &["--draft", "mtp", "--draft-max", "100000"]);
    assert_one_line_error(&r, &["--draft-max"]);

    // A fatal fault cell in a run that drafts through the Plan: it fires at the first read (the
    // prompt's), once, and nothing is committed. A fault inside a drafted traversal needs a cell
    // that fires at a later read, which the fault cells do not take.
    let rec = d.join("fault");
    let r = generate(
        &model,
        PROMPT,
        OUTPUTS,
        &rec,
        &["--ignore-eos", "--draft", "mtp", "--experts", "plan", "--slots", "8", "--policy", "lru:8", "--fault", "corrupt_byte"],
    );
    assert_ne!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let v = record_json(&rec);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(
        (v["experts"]["fault"]["cell"].as_str(), v["experts"]["fault"]["fired"].as_u64()),
        (Some("corrupt_byte"), Some(1)),
        "{}",
        v["experts"]
    );
    assert!(v["surfaces"].get("tokens").is_none() && v["surfaces"].get("logits").is_none(), "{}", v["surfaces"]);
}

/// `draft: mtp` in a campaign: the model's own head drafts, a Plan-served arm held to the
/// resident MTP-drafted oracle on every surface, the proposer on record as the model's head,
/// and the claim reproduced from its pinned inputs.
#[test]
fn a_campaign_arm_drafts_with_the_models_own_head() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("campaigns");
    fs::create_dir_all(&dir).unwrap();
    let model = forge_mtp(t.path(), &["--mtp-layers", "1"]);
    let prompt = dir.join("prompt.txt");
    fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("campaigns/prompts/demo.txt"), &prompt).unwrap();
    let sha = |p: &Path| sovereign::util::sha256_file(p).unwrap();
    let (tree, patches) = build_identity();
    let text = format!(
        "id: mtp-1\n\
model:\n  path: ../qwen35moe-1--mtp-layers1.gguf\n  sha256: {model}\n  forge: {{ arch: qwen35moe, preset: tiny, seed: 1, mtp_layers: 1 }}\n\
workload:\n  prompt_file: prompt.txt\n  prompt_sha256: {prompt}\n  prompt_tokens: 181\n  outputs: 16\n  ignore_eos: true\n\
build:\n  engine_tree_sha256: {tree}\n{patches}\
arms:\n  - {{ id: R-mtp, experts: resident, threads: 2, draft: mtp, draft_max: 3 }}\n  - {{ id: F-mtp, experts: plan, slots: 8, policy: lru:8, source: f, threads: 2, draft: mtp, draft_max: 3 }}\n\
schedule:\n  lead: [R-mtp]\n  blocks:\n    preordered:\n      - [F-mtp]\n\
oracle:\n  arm: R-mtp\n  relation: all_surfaces\n  horizon: 16\n\
{CAMPAIGN_TAIL}",
        model = sha(&model),
        prompt = sha(&prompt),
    );
    let file = dir.join("mtp.yaml");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // `mtp` is the head's name: a proposer may not take it.
    let taken = text.replacen(
        "workload:",
        "proposers:\n  mtp:\n    path: ../x.gguf\n    sha256: 0000000000000000000000000000000000000000000000000000000000000000\nworkload:",
        1,
    );
    fs::write(&file, &taken).unwrap();
    let r = run(&["campaign", "check", &s(&file)]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("proposer name `mtp`"), "{}", r.stderr);

    fs::write(&file, &text).unwrap();
    let results = t.path().join("results");
    let out = t.path().join("export");
    let claim = run_and_export(&file, "mtp-1", &results, &out, 2);
    let cells = Table::read(&out.join("cells.csv"));
    let col = |name: &str| cells.col(name);
    assert_eq!(cells.rows.len(), 2);
    for row in &cells.rows {
        assert_eq!(&row[col("status")], "completed");
        assert_eq!(&row[col("valid")], "true", "{row:?}");
        assert_eq!(&row[col("draft")], "mtp");
        let per: f64 = row[col("outputs_per_traversal")].parse().unwrap();
        assert!(per > 1.0 && per <= 4.0, "{per}");
    }
    let f = cells.rows.iter().find(|r| &r[col("arm")] == "F-mtp").unwrap();
    assert_eq!(&f[col("exact")], "true", "the Plan-served MTP arm against the resident MTP oracle, every surface");
    assert!(f[col("expert_bytes_per_output")].parse::<f64>().unwrap() > 0.0);
    let report = reproduce_claim(&claim, &out.join("claims.json"), &results, &t.path().join("repro"), &file);
    assert_eq!(report["holds"], true, "{report:#}");
}

/// A glm4moe file whose nextn block was stripped and its key kept (`nextn_predict_layers` 1, no
/// `blk.3.*`), as some published quantizations are: llama.cpp loads the trunk alone, so the
/// plain run through F is the full file's, and drafting with the missing head is refused in one
/// line, never an abort in its graph.
#[test]
fn a_glm4moe_file_without_its_nextn_tensors_runs_its_trunk_and_refuses_to_draft() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let full = forge_arch(d, "glm4moe", "1", &["--mtp-layers", "1"]);
    let trunk = rewrite(
        &full,
        &d.join("trunk.gguf"),
        |_| {},
        |g| {
            let kept = g.tensors.iter().filter(|t| !t.name.starts_with("blk.3."));
            kept.map(|t| (t.name.clone(), t.dims.clone(), vec![t.name.clone()])).collect()
        },
    );
    let inv: Value = serde_json::from_str(&ok(&["inventory", trunk.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(inv["objects"].as_array().unwrap().iter().filter(|o| o["layer"] == 3).count(), 0);

    let plain = d.join("plain");
    gen(&full, &plain, &[]);
    let served = d.join("served");
    gen(&trunk, &served, &["--experts", "plan", "--slots", "8", "--policy", "lru:8"]);
    let c = compare_surfaces(&plain, &served);
    assert!(c.len() >= 4 && c.iter().all(|(_, e)| *e), "{c:?}");

    let rec = d.join("draft");
    let r = generate(&trunk, PROMPT, 8, &rec, &["--draft", "mtp"]);
    assert_one_line_error(&r, &["--draft mtp", "blk.3.nextn.eh_proj.weight"]);
    assert_eq!(record_json(&rec)["outcome"], "failed");
}
