//! The engine end to end: forge, inventory, quantize, generate, compare, bad inputs.

use crate::common;

use common::*;
use sovereign::engine;
use sovereign::gguf::{GgmlType, Gguf, GgufWriter, TensorSpec, Value};
use sovereign::inventory::Inventory;
use std::fs;

#[test]
fn forge_is_deterministic_per_seed() {
    let dir = tempfile::tempdir().unwrap();
    let a = forge(dir.path(), "a.gguf", 11, &[]);
    let b = forge(dir.path(), "b.gguf", 11, &[]);
    let c = forge(dir.path(), "c.gguf", 12, &[]);
    let (a, b, c) = (fs::read(a).unwrap(), fs::read(b).unwrap(), fs::read(c).unwrap());
    assert!(a == b, "same seed must give a byte-identical file");
    assert_eq!(a.len(), c.len());
    assert!(a != c, "a different seed must give a different file");
    assert!(a.len() <= 64 << 20, "tiny preset is {} bytes", a.len());
}

#[test]
fn forge_overrides_shape_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "o.gguf", 3, &["--layers", "2", "--experts", "8", "--top-k", "2", "--vocab", "300"]);
    let inv = Inventory::of(&m).unwrap();
    assert_eq!(inv.moe_layers.len(), 2);
    assert_eq!(inv.objects.len(), 16);
    assert_eq!(inv.expert_used_count, Some(2));
    assert_eq!(inv.tensors.iter().find(|t| t.name == "output.weight").unwrap().shape, vec![256, 300]);
    let r = run(&["model", "forge", "--preset", "tiny", "--top-k", "9", "--experts", "8", "--out", "/dev/null"]);
    assert_one_line_error(&r, &["--top-k"]);
}

/// Our inventory against ggml's own GGUF reader, tensor by tensor.
fn assert_inventory_matches_ggml(path: &std::path::Path) {
    let inv = Inventory::of(path).unwrap();
    let ggml = engine::gguf_tensors(path).unwrap();
    assert_eq!(ggml.len(), inv.tensors.len());
    for (t, g) in inv.tensors.iter().zip(&ggml) {
        let name = &g.name;
        assert_eq!(&t.name, name);
        assert_eq!(t.offset, g.offset, "{name} offset");
        assert_eq!(t.bytes, g.bytes, "{name} length");
        assert_eq!(t.ggml_type, GgmlType(g.ggml_type as _).name(), "{name} type");
    }
    assert_eq!(inv.extent_duplicates, 0);
    assert_eq!(inv.extent_overlaps, 0);
    assert_eq!(inv.t_repr_bytes, inv.tensors.iter().map(|t| t.bytes).sum::<u64>());
}

#[test]
fn inventory_agrees_with_ggml_reader_f32_and_quantized() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 5, &[]);
    assert_inventory_matches_ggml(&m);
    let q = dir.path().join("q4km.gguf");
    ok(&["model", "quantize", "--type", "q4_k_m", m.to_str().unwrap(), q.to_str().unwrap()]);
    assert_inventory_matches_ggml(&q);
    let inv = Inventory::of(&q).unwrap();
    let exps = inv.tensors.iter().find(|t| t.name == "blk.0.ffn_up_exps.weight").unwrap();
    assert_ne!(exps.ggml_type, "F32", "quantization must change expert types");
}

#[test]
fn type_table_matches_ggml() {
    for ty in GgmlType::all() {
        let (blck, size) = engine::ggml_type_layout(ty.0);
        assert_eq!((ty.block_size().unwrap(), ty.type_size().unwrap()), (blck, size), "{ty}");
    }
}

#[test]
fn identical_runs_are_exact_and_a_different_prompt_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 1, &[]);
    let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    let prompt = "Experts are served from storage through bounded slots.";
    assert_eq!(generate(&m, prompt, 24, &a, &[]).code, 0);
    assert_eq!(generate(&m, prompt, 24, &b, &[]).code, 0);
    assert_eq!(generate(&m, "A different prompt entirely.", 24, &c, &[]).code, 0);

    let same = run(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(same.code, 0, "{}", same.stdout);
    for s in ["tokens", "logits", "response", "routes"] {
        assert!(same.stdout.lines().any(|l| l.starts_with(s) && l.contains("exact")), "{s}: {}", same.stdout);
    }
    for f in ["tokens.bin", "logits.bin", "response.bin", "routes.bin"] {
        assert_eq!(fs::read(a.join(f)).unwrap(), fs::read(b.join(f)).unwrap(), "{f}");
    }

    let diff = run(&["compare", a.to_str().unwrap(), c.to_str().unwrap(), "--json"]);
    assert_eq!(diff.code, 1);
    let v: serde_json::Value = serde_json::from_str(&diff.stdout).unwrap();
    assert_eq!(v["exact"], false);
    let tokens = v["surfaces"].as_array().unwrap().iter().find(|s| s["surface"] == "tokens").unwrap();
    assert_eq!(tokens["status"], "differs");
    // "Experts..." and "A different..." differ in their first byte token.
    assert_eq!(tokens["unit"], 0);
}

#[test]
fn record_holds_every_row_and_route() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 2, &[]);
    let r = dir.path().join("r");
    let prompt = "route every row";
    assert_eq!(generate(&m, prompt, 16, &r, &[]).code, 0);
    let rec: serde_json::Value = serde_json::from_str(&fs::read_to_string(r.join("record.json")).unwrap()).unwrap();
    let c = &rec["counts"];
    let (np, ng, nv) = (c["prompt_tokens"].as_u64().unwrap(), c["generated_tokens"].as_u64().unwrap(), c["n_vocab"].as_u64().unwrap());
    assert_eq!(np, prompt.len() as u64, "byte-level tokenizer: one token per byte");
    assert_eq!(ng, 16);
    let rows = np + ng - 1;
    assert_eq!(fs::metadata(r.join("logits.bin")).unwrap().len(), rows * nv * 4);
    assert_eq!(rec["surfaces"]["logits"]["unit_sha256"].as_array().unwrap().len() as u64, rows);
    // tiny: 3 MoE layers, top-4; one route event per row and layer.
    assert_eq!(c["route_k"], 4);
    assert_eq!(c["route_events"].as_u64().unwrap(), rows * 3);
    assert_eq!(fs::metadata(r.join("routes.bin")).unwrap().len(), rows * 3 * (16 + 4 * 4));
    assert_eq!(fs::metadata(r.join("tokens.bin")).unwrap().len(), (np + ng) * 4);
    assert!(rec["build"]["engine"]["tree_sha256"].as_str().unwrap().len() == 64);
    assert!(!fs::read_to_string(r.join("record.json")).unwrap().contains(dir.path().to_str().unwrap()), "no absolute paths in records");

    // Write-once: the same record directory is refused.
    let again = generate(&m, prompt, 16, &r, &[]);
    assert_one_line_error(&again, &["already exists"]);
}

#[test]
fn compare_rejects_a_tampered_surface() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 4, &[]);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    assert_eq!(generate(&m, "tamper", 8, &a, &[]).code, 0);
    assert_eq!(generate(&m, "tamper", 8, &b, &[]).code, 0);
    let mut bytes = fs::read(b.join("logits.bin")).unwrap();
    bytes[100] ^= 1;
    fs::write(b.join("logits.bin"), bytes).unwrap();
    let r = run(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_one_line_error(&r, &["logits.bin", "tampered"]);
}

#[test]
fn quantized_models_generate() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 6, &[]);
    for ty in ["q8_0", "q4_0", "q4_k_m", "f16"] {
        let q = dir.path().join(format!("{ty}.gguf"));
        ok(&["model", "quantize", "--type", ty, m.to_str().unwrap(), q.to_str().unwrap()]);
        let r = dir.path().join(format!("r-{ty}"));
        let g = generate(&q, "quantized", 8, &r, &["--json"]);
        assert_eq!(g.code, 0, "{ty}: {}", g.stderr);
        assert!(!dir.path().join(format!("{ty}.partial")).exists());
    }
}

#[test]
fn small_preset_loads_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("small.gguf");
    ok(&["model", "forge", "--preset", "small", "--seed", "7", "--out", out.to_str().unwrap()]);
    let inv = Inventory::of(&out).unwrap();
    assert!(inv.moe_layers.iter().all(|l| l.experts >= 64));
    let mib = inv.file_bytes >> 20;
    assert!((192..=320).contains(&mib), "small is {mib} MiB");
    let r = dir.path().join("r");
    assert_eq!(generate(&out, "small model", 8, &r, &[]).code, 0);
}

fn dense_model(path: &std::path::Path) {
    let mut w = GgufWriter::default();
    w.kv("general.architecture", Value::Str("llama".into()));
    w.kv("llama.block_count", Value::U32(1));
    w.tensor(TensorSpec::new("token_embd.weight", GgmlType::F32, &[64, 32]));
    w.tensor(TensorSpec::new("blk.0.ffn_up.weight", GgmlType::F32, &[64, 128]));
    w.write(path, |_, _, buf| buf.fill(0)).unwrap();
}

#[test]
fn bad_models_give_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 8, &[]);
    let bytes = fs::read(&m).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let header_cut = dir.path().join("header-cut.gguf");
    fs::write(&header_cut, &bytes[..1000]).unwrap();
    let text = dir.path().join("notes.gguf");
    fs::write(&text, "this is not a model\n").unwrap();
    let dense = dir.path().join("dense.gguf");
    dense_model(&dense);
    assert!(Gguf::open(&dense).is_ok(), "the dense file itself is valid GGUF");
    let missing = dir.path().join("missing.gguf");

    let cases = [
        (&truncated, "truncated"),
        (&header_cut, "truncated"),
        (&text, "not a GGUF file"),
        (&dense, "no Mixture-of-Experts"),
        (&missing, "cannot open"),
    ];
    for (path, what) in cases {
        let p = path.to_str().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_one_line_error(&run(&["inventory", p]), &[name, what]);
        let g = generate(path, "x", 4, &dir.path().join(format!("rec-{name}")), &[]);
        assert_one_line_error(&g, &[name, what]);
        assert!(!dir.path().join(format!("rec-{name}")).exists(), "no record for a refused model");
        let q = run(&["model", "quantize", "--type", "q8_0", p, dir.path().join("out.gguf").to_str().unwrap()]);
        assert_one_line_error(&q, &[name, what]);
    }
}

#[test]
fn build_info_names_the_pin() {
    let r = ok(&["build-info", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["engine"]["package"], "llama-cpp-sys-2");
    assert_eq!(v["engine"]["version"], "0.1.161");
    let pin = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/vendor/llama.cpp.pin")).unwrap();
    let pin = sovereign::engine::pin::Pin::parse(&pin).unwrap();
    assert_eq!(v["engine"]["tree_sha256"], pin.tree_sha256.as_str());
    assert!(v["engine"]["cmake_options"].as_array().unwrap().iter().any(|o| o == "GGML_CPU_REPACK=OFF"));
    let exe = sovereign::util::sha256_file(std::path::Path::new(env!("CARGO_BIN_EXE_sovereign"))).unwrap();
    assert_eq!(v["binary_sha256"], exe.as_str());
}

#[test]
fn a_prompt_longer_than_the_batch_keeps_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 9, &[]);
    let prompt = "a prompt of forty bytes, five batches..";
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    assert_eq!(generate(&m, prompt, 8, &a, &["--batch", "8"]).code, 0);
    let rec: serde_json::Value = serde_json::from_str(&fs::read_to_string(a.join("record.json")).unwrap()).unwrap();
    assert_eq!(rec["counts"]["logits_rows"].as_u64().unwrap(), prompt.len() as u64 + 8 - 1);
    // The same batching through the Plan is exact.
    assert_eq!(generate(&m, prompt, 8, &b, &["--batch", "8", "--experts", "plan", "--slots", "3"]).code, 0);
    assert_eq!(run(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]).code, 0);
}
