//! A run's context is its work: the prompt's tokens plus `--n-predict` (refine: its longest
//! prompt's), up to the model's trained length (`<arch>.context_length`), unless `--ctx` gives
//! it; the record states the context the run took.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;

/// `bytes` bytes of text: the forged tokenizer gives one token a byte.
fn text(bytes: usize) -> String {
    "the river runs north past the stone. ".chars().cycle().take(bytes).collect()
}

fn record(rec: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_prompt_past_4096_tokens_runs_without_ctx_on_a_model_trained_for_it() {
    let t = tempfile::tempdir().unwrap();
    let m = forge(t.path(), "m.gguf", 7, &["--context", "8192"]);
    let prompt = text(4200);
    let resident = t.path().join("resident");
    assert_eq!(generate(&m, &prompt, 2, &resident, &[]).code, 0);
    let v = record(&resident);
    let tokens = v["counts"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 4096, "{tokens} prompt tokens");
    assert_eq!(v["params"]["n_ctx"].as_u64(), Some(tokens + 2), "the context is the work");
    // Experts served by the Plan: the same work, the same context, every surface exact.
    let plan = t.path().join("plan");
    assert_eq!(generate(&m, &prompt, 2, &plan, &["--experts", "plan", "--slots", "4"]).code, 0);
    assert_eq!(record(&plan)["params"]["n_ctx"].as_u64(), Some(tokens + 2));
    let r = ok(&["compare", s(&resident), s(&plan), "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&r.stdout).unwrap()["exact"], true, "{}", r.stdout);
}

#[test]
fn work_past_the_trained_length_or_a_given_ctx_is_refused_naming_ctx() {
    let t = tempfile::tempdir().unwrap();
    // The tiny preset states a trained length of 4096.
    let m = forge(t.path(), "m.gguf", 7, &[]);
    let rec = t.path().join("r");
    let r = generate(&m, &text(4200), 4, &rec, &[]);
    assert_one_line_error(
        &r,
        &["needs a context of 4204", "over the model's trained length of 4096 (qwen3moe.context_length)", "pass --ctx"],
    );
    assert!(!rec.exists());
    // An explicit context the work does not fit: refused, naming it and the trained length.
    let r = generate(&m, "a short prompt", 4, &rec, &["--ctx", "8"]);
    assert_one_line_error(&r, &["prompt (14 tokens) + --n-predict 4 needs a context of 18, over --ctx 8", "trained length is 4096"]);
    assert!(!rec.exists());
    // --ctx is taken as given, below the work's size and past the trained length alike.
    assert_eq!(generate(&m, "a short prompt", 4, &rec, &["--ctx", "600"]).code, 0);
    assert_eq!(record(&rec)["params"]["n_ctx"], 600);
}

#[test]
fn refine_sizes_the_context_to_its_longest_prompt() {
    let t = tempfile::tempdir().unwrap();
    let long = forge(t.path(), "long.gguf", 7, &["--context", "8192"]);
    let short = forge(t.path(), "short.gguf", 7, &[]);
    let prompts = t.path().join("prompts.txt");
    fs::write(&prompts, format!("a short prompt\n{}\n", text(4200))).unwrap();
    let rec = t.path().join("r");
    let refine = |m: &Path| {
        run(&[
            "refine",
            "--mode",
            "base",
            "--n-predict",
            "2",
            "--base",
            s(m),
            "--verifier",
            s(m),
            "--prompts",
            s(&prompts),
            "--record",
            s(&rec),
        ])
    };
    let r = refine(&short);
    assert_one_line_error(
        &r,
        &["prompt 2 (4200 tokens) + --n-predict 2 needs a context of 4202", "trained length of 4096 (qwen3moe.context_length)", "--ctx"],
    );
    assert!(!rec.exists());
    let r = refine(&long);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = record(&rec);
    let each: Vec<u64> = v["counts"]["prompt_tokens_each"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert_eq!(each, [14, 4200]);
    assert_eq!(v["params"]["exec"]["n_ctx"], 4202);
}
