//! Margins and margin-gated deferred refinement on forged models: one checkpoint at F32
//! (reference), Q4_K_M (base) and Q8_0 (verifier).

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

struct Models {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    f32: PathBuf,
    q4: PathBuf,
    q8: PathBuf,
    prompts: PathBuf,
}

fn models() -> Models {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let f32 = forge(&dir, "f32.gguf", 3, &[]);
    let (q4, q8) = (dir.join("q4.gguf"), dir.join("q8.gguf"));
    ok(&["model", "quantize", "--type", "q4_k_m", s(&f32), s(&q4)]);
    ok(&["model", "quantize", "--type", "q8_0", s(&f32), s(&q8)]);
    let prompts = dir.join("prompts.txt");
    let text: String = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("campaigns/prompts/tau.txt"))
        .unwrap()
        .lines()
        .take(6)
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&prompts, text).unwrap();
    Models { _tmp: tmp, dir, f32, q4, q8, prompts }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn refine(m: &Models, name: &str, extra: &[&str]) -> (Value, PathBuf) {
    let rec = m.dir.join(name);
    let mut args = vec![
        "refine",
        "--base",
        s(&m.q4),
        "--verifier",
        s(&m.q8),
        "--reference",
        s(&m.f32),
        "--prompts",
        s(&m.prompts),
        "--n-predict",
        "24",
        "--window",
        "8",
        "--record",
        s(&rec),
    ];
    args.extend_from_slice(extra);
    ok(&args);
    // Sealed where it was written, as every record sovereign writes.
    sovereign::record::verify_sealed(&rec).unwrap_or_else(|e| panic!("{e:#}"));
    let v: Value = serde_json::from_str(&fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    (v, rec)
}

fn ints(p: &Path) -> Vec<i32> {
    fs::read(p).unwrap().chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn floats(p: &Path) -> Vec<f32> {
    fs::read(p).unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn margins_predict_disagreement_and_write_every_position() {
    let m = models();
    let csv = m.dir.join("m.csv");
    let r = ok(&[
        "margins",
        "--reference",
        s(&m.f32),
        "--candidate",
        s(&m.q4),
        "--prompts",
        s(&m.prompts),
        "--n-predict",
        "32",
        "--csv",
        s(&csv),
        "--json",
    ]);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["positions"], 6 * 32);
    let agreement = v["agreement"].as_f64().unwrap();
    assert!(agreement > 0.3 && agreement < 1.0, "a Q4 base disagrees somewhere, not everywhere: {agreement}");
    // Low margins must flag disagreements better than chance on this checkpoint.
    assert!(v["auroc"].as_f64().unwrap() > 0.6, "{v}");
    let share = v["escalation"]["share"].as_f64().unwrap();
    assert!(share > 0.0 && share <= 1.0);

    // The CSV holds every position; escalating every margin below τ reaches the target.
    let mut rd = csv::Reader::from_path(&csv).unwrap();
    let rows: Vec<(f32, bool)> = rd
        .records()
        .map(|r| {
            let r = r.unwrap();
            (r[4].parse().unwrap(), r[5].parse().unwrap())
        })
        .collect();
    assert_eq!(rows.len(), 6 * 32);
    assert_eq!(rows.iter().filter(|r| r.1).count() as f64 / rows.len() as f64, agreement);
    let tau = v["escalation"]["tau"].as_f64().map(|t| t as f32).unwrap_or(f32::INFINITY);
    let after = rows.iter().filter(|r| r.1 || r.0 < tau).count() as f64 / rows.len() as f64;
    assert!(after >= 0.99, "escalating margins < {tau} leaves agreement {after}");
    let escalated = rows.iter().filter(|r| r.0 < tau).count() as f64 / rows.len() as f64;
    assert_eq!(escalated, share);

    // Q8 agrees more often than Q4.
    let r8 = ok(&["margins", "--reference", s(&m.f32), "--candidate", s(&m.q8), "--prompts", s(&m.prompts), "--n-predict", "32", "--json"]);
    let v8: Value = serde_json::from_str(&r8.stdout).unwrap();
    assert!(v8["agreement"].as_f64().unwrap() > agreement, "{v8}");
}

#[test]
fn refinement_checks_deferred_decisions_and_rolls_back_flips() {
    let m = models();
    let (base, base_dir) = refine(&m, "base", &["--mode", "base"]);
    let (zero, zero_dir) = refine(&m, "tau0", &["--tau", "0"]);
    let (tau, tau_dir) = refine(&m, "tau1", &["--tau", "1"]);
    let (all, all_dir) = refine(&m, "all", &["--verify-all"]);

    // τ = 0 defers nothing: no sweep, and the base's own output, byte for byte.
    assert_eq!(zero["refine"]["counters"]["sweeps"], 0);
    assert_eq!(zero["refine"]["verification_bytes_logical"], 0);
    assert_eq!(fs::read(zero_dir.join("tokens.bin")).unwrap(), fs::read(base_dir.join("tokens.bin")).unwrap());
    assert_eq!(base["counts"]["generated_tokens"], 6 * 24);

    // Every decision the verifier did not check had a margin of at least τ; with verify-all,
    // every output was checked (confirmed or replaced).
    let margins = floats(&tau_dir.join("margins.bin"));
    let decisions = fs::read(tau_dir.join("decisions.bin")).unwrap();
    assert_eq!(margins.len(), 6 * 24);
    assert!(decisions.iter().zip(&margins).all(|(&d, &mg)| d != 0 || mg >= 1.0));
    assert!(tau["refine"]["counters"]["rollbacks"].as_u64().unwrap() > 0, "Q4 flips somewhere: {}", tau["refine"]);
    // Verify-all is drafted decoding with the base as proposer: every output is an accepted
    // draft (1), the verifier's token for a rejected one (2) or its own where none was offered
    // (3), and the tokens are the verifier's own greedy ones, byte for byte, in fewer passes.
    let all_decisions = fs::read(all_dir.join("decisions.bin")).unwrap();
    assert!(all_decisions.iter().all(|&d| (1..=3).contains(&d)), "{all_decisions:?}");
    assert!(all_decisions.iter().filter(|&&d| d == 1).count() > all_decisions.len() / 2, "a Q4_K_M base agrees mostly: {all_decisions:?}");
    let (ver, ver_dir) = refine(&m, "verifier", &["--mode", "verifier"]);
    assert_eq!(fs::read(all_dir.join("tokens.bin")).unwrap(), fs::read(ver_dir.join("tokens.bin")).unwrap());
    let c = &all["refine"]["counters"];
    let n = |k: &str| c[k].as_u64().unwrap();
    assert!(n("sweeps") < ver["refine"]["counters"]["sweeps"].as_u64().unwrap(), "{c}");
    assert_eq!(n("checked"), n("deferred"), "{c}");
    assert!(n("rollbacks") <= n("sweeps"), "{c}");

    // Bytes: one verifier checkpoint per sweep, ordered base < τ < verify-all.
    let bytes = |v: &Value| v["refine"]["verification_bytes_per_token"].as_f64().unwrap();
    let sweeps = all["refine"]["counters"]["sweeps"].as_u64().unwrap();
    let ver = all["verifier"]["t_repr_bytes"].as_u64().unwrap();
    assert_eq!(all["refine"]["verification_bytes_logical"].as_u64().unwrap(), sweeps * ver);
    assert!(bytes(&base) == 0.0 && bytes(&tau) > 0.0 && bytes(&all) >= bytes(&tau));

    // Quality is scored by the reference and recorded with its identity.
    for v in [&base, &tau, &all] {
        let q = v["quality"]["mean_logprob"].as_f64().unwrap();
        assert!(q < 0.0 && q.is_finite());
        assert_eq!(v["reference"]["sha256"], sovereign::util::sha256_file(&m.f32).unwrap());
    }
    // Verify-all follows the verifier: its output agrees with the reference at least as often.
    let agree = |v: &Value| v["quality"]["reference_agreement"].as_f64().unwrap();
    assert!(agree(&all) >= agree(&base), "{} vs {}", all["quality"], base["quality"]);

    // The token surface is prompt + outputs per prompt, and the outputs match the response.
    let tokens = ints(&tau_dir.join("tokens.bin"));
    let each: Vec<u64> = tau["counts"]["prompt_tokens_each"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(tokens.len() as u64, each.iter().sum::<u64>() + 6 * 24);
}

#[test]
fn a_streamed_verifier_changes_no_byte_of_the_output() {
    let m = models();
    let (res, res_dir) = refine(&m, "resident", &["--tau", "1"]);
    let (st, st_dir) =
        refine(&m, "streamed", &["--tau", "1", "--verifier-experts", "plan", "--slots", "3", "--policy", "zero", "--source", "f"]);
    for f in ["tokens.bin", "margins.bin", "decisions.bin", "response.bin"] {
        assert_eq!(fs::read(res_dir.join(f)).unwrap(), fs::read(st_dir.join(f)).unwrap(), "{f}");
    }
    // Layer by layer through two shared buffers, whole layers at a time: the same bytes again.
    let (lb, lb_dir) = refine(
        &m,
        "layers",
        &["--tau", "1", "--verifier-experts", "plan", "--slots", "16", "--layer-buffers", "2", "--policy", "zero+prefetch"],
    );
    for f in ["tokens.bin", "margins.bin", "decisions.bin"] {
        assert_eq!(fs::read(res_dir.join(f)).unwrap(), fs::read(lb_dir.join(f)).unwrap(), "{f}");
    }
    assert_eq!(lb["experts"]["manifest"]["layer_buffers"], 2);
    assert_eq!(lb["experts"]["clean_closure"], true);
    assert_eq!(res["refine"]["counters"]["sweeps"], st["refine"]["counters"]["sweeps"]);
    assert_eq!(res["quality"]["mean_logprob"], st["quality"]["mean_logprob"]);
    // The verifier's experts came from storage, and the Plan closed clean.
    assert_eq!(st["experts"]["clean_closure"], true);
    assert!(st["refine"]["served_bytes_per_token"].as_f64().unwrap() > 0.0);
    assert_eq!(st["params"]["verifier"]["streamed"]["slots"], 3);
    assert!(res["refine"]["served_bytes_per_token"].is_null());
}

#[test]
fn kv_trim_then_redecode_is_bitwise_identical() {
    let m = models();
    sovereign::engine::init();
    let model = sovereign::engine::Model::load(&m.q8).unwrap();
    let exec = sovereign::exec::ExecParams { n_ctx: 256, n_batch: 64, n_ubatch: 64, threads: 2, threads_batch: None, flash_attn: false };
    let mut ctx = sovereign::engine::Context::new(&model, exec, false).unwrap();
    let toks = model.tokenize(b"rollback must not change a bit", true).unwrap();
    let mut first = Vec::new();
    for &t in &toks {
        ctx.decode(&[t], true, &mut first).unwrap();
    }
    let keep = toks.len() as i32 / 2;
    ctx.trim(keep).unwrap();
    assert_eq!(ctx.n_past(), keep);
    let mut again = Vec::new();
    for &t in &toks[keep as usize..] {
        ctx.decode(&[t], true, &mut again).unwrap();
    }
    let n = model.n_vocab();
    let tail = &first[keep as usize * n..];
    assert!(tail.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert_eq!(tail.len(), again.len());
    assert!(ctx.trim(ctx.n_past() + 1).is_err());
}

#[test]
fn bad_input_is_one_line() {
    let m = models();
    let rec = m.dir.join("r");
    let trunc = m.dir.join("trunc.gguf");
    fs::write(&trunc, &fs::read(&m.q8).unwrap()[..4096]).unwrap();
    let base = ["refine", "--base", s(&m.q4), "--prompts", s(&m.prompts), "--record", s(&rec)];
    let r = run(&[&base[..], &["--verifier", s(&trunc)]].concat());
    assert_one_line_error(&r, &["trunc.gguf"]);
    let r = run(&[&base[..], &["--verifier", s(&m.q8), "--window", "0"]].concat());
    assert_one_line_error(&r, &["--window"]);
    let r = run(&[&base[..], &["--verifier", s(&m.q8), "--tau=-1"]].concat());
    assert_one_line_error(&r, &["--tau"]);
    let other = forge(&m.dir, "other.gguf", 4, &["--experts", "8"]);
    let r = run(&["margins", "--reference", s(&m.f32), "--candidate", s(&other), "--prompts", s(&m.dir.join("none.txt"))]);
    assert_one_line_error(&r, &["none.txt"]);
    assert!(!rec.exists());
}

fn build_block() -> String {
    let v: Value = serde_json::from_str(&ok(&["build-info", "--json"]).stdout).unwrap();
    let patches: String = v["engine"]["patches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("    - {{ name: {}, sha256: {} }}\n", p["name"].as_str().unwrap(), p["sha256"].as_str().unwrap()))
        .collect();
    format!("build:\n  engine_tree_sha256: {}\n  patches:\n{patches}", v["engine"]["tree_sha256"].as_str().unwrap())
}

#[test]
fn a_tau_sweep_campaign_runs_unattended_and_exports_the_curve() {
    let m = models();
    let sha = |p: &Path| sovereign::util::sha256_file(p).unwrap();
    let (base, _) = refine(&m, "count", &["--mode", "base"]);
    let prompt_tokens = base["counts"]["prompt_tokens"].as_u64().unwrap();
    let capped = cgroups_usable();
    let cap = if capped { " memory_cap_bytes: 268435456," } else { "" };
    let streamed = format!(
        "- {{ id: all-streamed, experts: plan, slots: 3, policy: zero, source: f, windows: 4, depth: 4,{cap} refine: {{ verify_all: true }}, threads: 2 }}\n"
    );
    let text = format!(
        "id: t-tau\n\
model: {{ path: q4.gguf, sha256: {} }}\n\
refine:\n  verifier: {{ path: q8.gguf, sha256: {} }}\n  reference: {{ path: f32.gguf, sha256: {} }}\n  window: 8\n\
workload: {{ prompt_file: prompts.txt, prompt_sha256: {}, prompt_tokens: {prompt_tokens}, outputs: 24, ignore_eos: true }}\n\
{}\
arms:\n\
  - {{ id: verifier, experts: resident, refine: {{ mode: verifier }}, threads: 2 }}\n\
  - {{ id: base, experts: resident, refine: {{ mode: base }}, threads: 2 }}\n\
  - {{ id: tau-1, experts: resident, refine: {{ tau: 1.0 }}, threads: 2 }}\n\
  - {{ id: all, experts: resident, refine: {{ verify_all: true }}, threads: 2 }}\n\
{streamed}\
schedule:\n  lead: [verifier, base]\n  blocks:\n    preordered:\n      - [tau-1, all, all-streamed]\n\
oracle: {{ arm: verifier, relation: tokens, horizon: 24 }}\n\
admission: {{ require_exact: false, min_headroom_bytes: 1, max_limit_events: 0 }}\n\
stop: {{ arm_after_admission_failure: false, campaign_after_oracle_failure: true }}\n\
repetition: {{ outcome_selected_reruns: none, max_interrupted_attempts: 3 }}\n",
        sha(&m.q4),
        sha(&m.q8),
        sha(&m.f32),
        sha(&m.prompts),
        build_block(),
    );
    let file = m.dir.join("tau.yaml");
    fs::write(&file, &text).unwrap();
    let results = m.dir.join("results");
    ok(&["campaign", "run", s(&file), "--results", s(&results)]);
    let out = m.dir.join("export");
    ok(&["export", "--campaign", "t-tau", "--results", s(&results), "--out", s(&out)]);
    let mut rd = csv::Reader::from_path(out.join("refine.csv")).unwrap();
    let head = rd.headers().unwrap().clone();
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 5);
    let row = |arm: &str| rows.iter().find(|r| &r[col("arm")] == arm).unwrap();
    let bytes = |arm: &str| row(arm)[col("verification_bytes_per_token")].parse::<f64>().unwrap();
    assert_eq!(bytes("base"), 0.0);
    assert!(bytes("tau-1") > 0.0 && bytes("tau-1") <= bytes("all") && bytes("all") < bytes("verifier"));
    // Streaming the verifier changes bytes read, not outputs or quality.
    assert_eq!(row("all")[col("mean_logprob")], row("all-streamed")[col("mean_logprob")]);
    assert_eq!(&row("all-streamed")[col("verifier")], "streamed");
    if capped {
        assert_eq!(&row("all-streamed")[col("limit_events")], "0");
        assert_eq!(&row("all-streamed")[col("admitted")], "true");
    }
    for f in ["quality_bytes.svg", "quality_bytes.png"] {
        assert!(fs::metadata(out.join(f)).unwrap().len() > 1000, "{f}");
    }

    // A refinement campaign is checked like any other: a refine arm without τ, the wrong relation.
    let bad = m.dir.join("bad.yaml");
    fs::write(&bad, text.replace("refine: { tau: 1.0 }", "refine: { mode: refine }")).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert!(r.stderr.contains("arm `tau-1`: mode refine needs `tau`"), "{}", r.stderr);
    fs::write(&bad, text.replace("relation: tokens", "relation: all_surfaces")).unwrap();
    let r = run(&["campaign", "check", s(&bad)]);
    assert!(r.stderr.contains("use `relation: tokens`"), "{}", r.stderr);
}

#[test]
fn nan_logits_of_base_verifier_or_reference_fail_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = forge(dir, "f32.gguf", 3, &[]);
    let nan = with_nan(&good, "token_embd.weight", &dir.join("nan.gguf"));
    let prompts = dir.join("prompts.txt");
    fs::write(&prompts, "The verifier checks every decision.\n").unwrap();
    for (name, base, verifier, reference, needle) in [
        ("base", &nan, &good, &good, "base logits from position"),
        ("verifier", &good, &nan, &good, "verifier logits from position"),
        ("reference", &good, &good, &nan, "reference logits from position"),
    ] {
        let rec = dir.join(name);
        let r = run(&[
            "refine",
            "--base",
            s(base),
            "--verifier",
            s(verifier),
            "--reference",
            s(reference),
            "--prompts",
            s(&prompts),
            "--n-predict",
            "6",
            "--window",
            "3",
            "--verify-all",
            "--record",
            s(&rec),
        ]);
        assert_ne!(r.code, 0, "{name}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(needle) && r.stderr.contains("logits row 0 is not finite"), "{name}: {}", r.stderr);
        let v: Value = serde_json::from_str(&fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
        assert_eq!(v["outcome"], "failed", "{name}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{name}: {v}");
        assert!(!rec.join("tokens.bin").exists() && !dir.join(format!("{name}.partial")).exists(), "{name}");
    }
}
