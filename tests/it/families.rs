//! Every MoE family `forge` writes, through the real engine: resident, then every Plan source
//! and policy with fewer slots than a prefill's distinct experts, each bitwise equal to the
//! resident run on every surface; quantized copies likewise; and valid variants of each family
//! (F16 routers, tied output, optional tensors left out) accepted by `inventory` and `generate`.
//! And the seed's principal experiment's shape (`--preset seed`) with a prompt of over 3,000
//! tokens, streamed by F with LRU under a hard cap, exact and admitted.

use crate::common;

use common::*;
use sovereign::gguf::{Gguf, Value};
use std::path::{Path, PathBuf};

const PROMPT: &str = "Experts move from storage into bounded slots; every output byte must match the resident run.";
const OUTPUTS: u32 = 24;
const SLOTS: &str = "5";

/// Every family `forge` writes, as [`FAMILIES`], and the tests that run each family on its own
/// (one test per family, so the suite spreads them over the cores).
macro_rules! families {
    ($($test:ident: $arch:literal),* $(,)?) => {
        const FAMILIES: &[&str] = &[$($arch),*];

        /// Each family exact under every arm, against its resident run.
        mod every_family_is_exact_under_every_arm {
            $(#[test]
            fn $test() {
                super::every_arm_is_exact($arch)
            })*
        }

        /// Each family's Q8_0 and Q4_K_M copies exact under F and D against their resident runs.
        mod quantized_families_are_exact {
            $(#[test]
            fn $test() {
                super::quantized_are_exact($arch)
            })*
        }
    };
}

families! {
    qwen3moe: "qwen3moe",
    qwen3next: "qwen3next",
    qwen35moe: "qwen35moe",
    gemma4: "gemma4",
    deepseek2: "deepseek2",
    gpt_oss: "gpt-oss",
    olmoe: "olmoe",
    llama: "llama",
    qwen2moe: "qwen2moe",
    granitemoe: "granitemoe",
    glm4moe: "glm4moe",
    llama4: "llama4",
    minimax_m2: "minimax-m2",
    ernie4_5_moe: "ernie4_5-moe",
    grok: "grok",
    dbrx: "dbrx",
    arctic: "arctic",
    dots1: "dots1",
    hunyuan_moe: "hunyuan-moe",
    nemotron_h_moe: "nemotron_h_moe",
    bailingmoe2: "bailingmoe2",
    qwen3vlmoe: "qwen3vlmoe",
    phimoe: "phimoe",
    jamba: "jamba",
    afmoe: "afmoe",
    lfm2moe: "lfm2moe",
    deepseek32: "deepseek32",
    glm_dsa: "glm-dsa",
    mimo2: "mimo2",
    step35: "step35",
    smallthinker: "smallthinker",
    exaone_moe: "exaone-moe",
    grovemoe: "grovemoe",
    maple: "maple",
    deepseek: "deepseek",
    bailingmoe: "bailingmoe",
    mistral3: "mistral3",
    mellum: "mellum",
    laguna: "laguna",
    cohere2moe: "cohere2moe",
    granitehybrid: "granitehybrid",
    hy_v3: "hy_v3",
    granite_swa: "granite_swa",
    kimi_linear: "kimi-linear",
    minimax_01: "minimax-01",
    minimax_m3: "minimax-m3",
    dots3note: "dots3note",
    hy_v4: "hy_v4",
    deepseek4: "deepseek4",
}

fn forge_arch(dir: &Path, arch: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("{arch}{}.gguf", extra.concat()));
    let mut args = vec!["model", "forge", "--arch", arch, "--preset", "tiny", "--seed", "11", "--out", out.to_str().unwrap()];
    args.extend_from_slice(family_layers(arch));
    args.extend_from_slice(extra);
    ok(&args);
    out
}

fn gen(model: &Path, rec: &Path, extra: &[&str]) -> serde_json::Value {
    let r = generate(model, PROMPT, OUTPUTS, rec, extra);
    assert_eq!(r.code, 0, "{} {extra:?}: {}{}", model.display(), r.stdout, r.stderr);
    serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
}

/// llama4 and jamba interleave their MoE layers with dense ones (one in two), nemotron_h_moe
/// with Mamba-2 and attention layers (two in four): 4 layers give each the two MoE layers every
/// family is run with (and jamba its attention layer); mimo2 takes 5 for a full-attention MoE
/// layer (its 5th) beside the sliding ones, and step35 likewise; exaone-moe's 4th layer is its
/// first full one, and mellum's; laguna's and cohere2moe's 5th is their first full MoE layer;
/// the others take the tiny preset's 3.
fn family_layers(arch: &str) -> &'static [&'static str] {
    match arch {
        "llama4" | "nemotron_h_moe" | "jamba" | "mellum" => &["--layers", "4"],
        "mimo2" | "step35" | "exaone-moe" | "laguna" | "cohere2moe" => &["--layers", "5"],
        _ => &[],
    }
}

/// Compares two records; every surface must be exact. Returns the surfaces compared.
fn assert_exact(a: &Path, b: &Path) -> Vec<String> {
    let r = run(&["compare", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 0, "{} vs {}:\n{}{}", a.display(), b.display(), r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v["surfaces"].as_array().unwrap().iter().map(|s| s["surface"].as_str().unwrap().to_string()).collect()
}

/// The families that keep a recurrent state per sequence (DeltaNet, KDA, lightning attention,
/// Mamba or short convolution layers, DeepSeek-V4's key compressors).
const HYBRID: [&str; 9] =
    ["qwen3next", "qwen35moe", "nemotron_h_moe", "jamba", "lfm2moe", "granitehybrid", "kimi-linear", "minimax-01", "deepseek4"];

fn inventory(model: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["inventory", model.to_str().unwrap(), "--json"]).stdout).unwrap()
}

/// The arms every family runs: (name, flags).
fn arms(last_moe_layer: u64) -> Vec<(String, Vec<String>)> {
    let plan = |source: &str, policy: &str, more: &[&str]| {
        let mut v: Vec<String> = ["--experts", "plan", "--slots", SLOTS, "--source", source, "--policy", policy].map(String::from).to_vec();
        v.extend(more.iter().map(|s| s.to_string()));
        v
    };
    let pin = format!("pin:{last_moe_layer}/0+lru:2");
    vec![
        ("p-zero".into(), plan("p", "zero", &[])),
        ("d-lru3".into(), plan("d", "lru:3", &[])),
        ("f-lru5".into(), plan("f", "lru:5", &[])),
        ("f-prefetch".into(), plan("f", "zero+prefetch", &[])),
        ("f-pin".into(), plan("f", &pin, &[])),
        ("f-pass1".into(), plan("f", "zero", &["--depth", "3", "--token-pass", "1"])),
        ("f-pass2-lru".into(), plan("f", "lru:3", &["--depth", "3", "--token-pass", "2"])),
    ]
}

/// One family: resident, then every arm, each exact against resident and cleanly closed.
fn family_is_exact(dir: &Path, arch: &str, model: &Path, arms: &[(String, Vec<String>)]) {
    let inv = inventory(model);
    assert_eq!(inv["architecture"], arch);
    let moe_layers = inv["moe_layers"].as_array().unwrap().len() as u64;
    assert!(moe_layers >= 2, "{arch}: {moe_layers} MoE layers");
    let tag = model.file_stem().unwrap().to_str().unwrap();
    let resident = dir.join(format!("{tag}-resident"));
    gen(model, &resident, &[]);
    for (name, flags) in arms {
        let rec = dir.join(format!("{tag}-{name}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let r = gen(model, &rec, &flags);
        let compared = assert_exact(&resident, &rec);
        // Hybrid families' recurrent state after prefill and every decode step is a surface.
        let recurrent = compared.iter().any(|s| s == "recurrent") && compared.iter().any(|s| s == "recurrent_state");
        assert_eq!(recurrent, HYBRID.contains(&arch), "{tag} {name}: compared {compared:?}");
        if recurrent {
            let states = r["surfaces"]["recurrent"]["bytes"].as_u64().unwrap() / 32;
            assert_eq!(
                states,
                u64::from(OUTPUTS),
                "{tag} {name}: one state after prefill and after each of the {} decode steps",
                OUTPUTS - 1
            );
        }
        let e = &r["experts"];
        assert_eq!(e["clean_closure"], true, "{tag} {name}: {}", e["closure"]);
        let t = &e["telemetry"];
        // The prompt selects more distinct experts in every MoE layer than there are slots, so
        // prefill was served in several passes.
        let objects = t["u_sem_lb"]["objects"].as_u64().unwrap();
        assert!(objects > moe_layers * 5, "{tag} {name}: {objects} distinct experts over {moe_layers} layers");
        assert_eq!((t["u_sem_lb"]["duplicates"].as_u64(), t["u_sem_lb"]["overlaps"].as_u64()), (Some(0), Some(0)));
    }
}

fn every_arm_is_exact(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = forge_arch(dir.path(), arch, &[]);
    let inv = inventory(&model);
    let last = inv["moe_layers"].as_array().unwrap().last().unwrap()["layer"].as_u64().unwrap();
    family_is_exact(dir.path(), arch, &model, &arms(last));
}

fn quantized_are_exact(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = forge_arch(dir.path(), arch, &[]);
    for ty in ["q8_0", "q4_k_m"] {
        let q = dir.path().join(format!("{arch}-{ty}.gguf"));
        ok(&["model", "quantize", "--type", ty, model.to_str().unwrap(), q.to_str().unwrap()]);
        let arms = vec![
            (
                "f-lru3-prefetch".to_string(),
                ["--experts", "plan", "--slots", SLOTS, "--policy", "lru:3+prefetch"].map(String::from).to_vec(),
            ),
            ("d-zero".to_string(), ["--experts", "plan", "--slots", SLOTS, "--source", "d"].map(String::from).to_vec()),
        ];
        family_is_exact(dir.path(), arch, &q, &arms);
    }
}

/// `arch` forged into `dir`, then written to `name` with its key `{arch}.{key}` set to `value`.
fn with_key(dir: &Path, arch: &str, key: &str, value: Value, name: &str) -> PathBuf {
    let base = forge_arch(dir, arch, &[]);
    let key = format!("{arch}.{key}");
    let set = |m: &mut Vec<(String, Value)>| m.iter_mut().find(|(k, _)| *k == key).unwrap().1 = value.clone();
    rewrite(&base, &dir.join(name), set, without(|_| false))
}

/// Every tensor but those `drop` names.
fn without(drop: impl Fn(&str) -> bool) -> impl Fn(&Gguf) -> Rewrite {
    move |g| g.tensors.iter().filter(|t| !drop(&t.name)).map(|t| (t.name.clone(), t.dims.clone(), vec![t.name.clone()])).collect()
}

/// A dense MLP's tensors (`ffn_gate`, `ffn_up`, `ffn_down`, not the experts').
fn dense_mlp(n: &str) -> bool {
    ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"].iter().any(|s| n.ends_with(s))
}

/// Every tensor, those named `.{from}.` renamed `.{to}.` (a name the loader takes for either).
fn renamed(from: &'static str, to: &'static str) -> impl Fn(&Gguf) -> Rewrite {
    move |g| {
        let (from, to) = (format!(".{from}."), format!(".{to}."));
        g.tensors.iter().map(|t| (t.name.replace(&from, &to), t.dims.clone(), vec![t.name.clone()])).collect()
    }
}

/// Q, K and V of every layer fused into one `attn_qkv` (as some converters write them).
fn fused_qkv(g: &Gguf) -> Rewrite {
    let mut out = Vec::new();
    for t in &g.tensors {
        // Only where the layer has K and V (kimi-linear's MLA layers have a query alone).
        let with_kv = |p: &&str| g.tensor(&format!("{p}attn_k.weight")).is_some();
        let Some(prefix) = t.name.strip_suffix("attn_q.weight").filter(with_kv) else {
            if !(t.name.ends_with("attn_k.weight") || t.name.ends_with("attn_v.weight")) {
                out.push((t.name.clone(), t.dims.clone(), vec![t.name.clone()]));
            }
            continue;
        };
        let parts: Vec<String> = ["attn_q", "attn_k", "attn_v"].iter().map(|p| format!("{prefix}{p}.weight")).collect();
        let rows: u64 = parts.iter().map(|p| g.tensor(p).unwrap().dims[1]).sum();
        out.push((format!("{prefix}attn_qkv.weight"), vec![t.dims[0], rows], parts));
    }
    out
}

/// kimi-linear's KDA convolutions and decays as the converter first writes them, with trailing
/// unit dimensions ([d_conv, 1, inner, 1] and [1, heads, 1, 1]); quantizing drops them.
fn kimi_linear_4d(g: &Gguf) -> Rewrite {
    let four = |n: &str| n.contains(".ssm_conv1d_") || n.ends_with(".ssm_a");
    g.tensors
        .iter()
        .map(|t| {
            let mut dims = t.dims.clone();
            if four(&t.name) {
                dims.resize(4, 1);
            }
            (t.name.clone(), dims, vec![t.name.clone()])
        })
        .collect()
}

/// Gate and up of every layer's experts in one `ffn_gate_up_exps` twice as wide (as some
/// converters merge them): a bundle of two roles.
fn merged_gate_up(g: &Gguf) -> Rewrite {
    let mut out = Vec::new();
    for t in &g.tensors {
        let Some(prefix) = t.name.strip_suffix("ffn_gate_exps.weight") else {
            if !t.name.ends_with("ffn_up_exps.weight") {
                out.push((t.name.clone(), t.dims.clone(), vec![t.name.clone()]));
            }
            continue;
        };
        let parts = vec![t.name.clone(), format!("{prefix}ffn_up_exps.weight")];
        out.push((format!("{prefix}ffn_gate_up_exps.weight"), vec![t.dims[0], 2 * t.dims[1], t.dims[2]], parts));
    }
    out
}

/// Laguna's attention gate per element (Laguna-M.1's) instead of per head: the per-head gate's
/// rows repeated a head's width of times, so that it spans the attention's output.
fn gate_per_element(g: &Gguf) -> Rewrite {
    g.tensors
        .iter()
        .map(|t| {
            if !t.name.ends_with("attn_gate.weight") {
                return (t.name.clone(), t.dims.clone(), vec![t.name.clone()]);
            }
            let head_dim = g.tensor(&t.name.replace("attn_gate", "attn_q_norm")).unwrap().dims[0];
            (t.name.clone(), vec![t.dims[0], t.dims[1] * head_dim], vec![t.name.clone(); head_dim as usize])
        })
        .collect()
}

/// Valid files of each family that llama.cpp loads: every one is accepted by `inventory` and
/// runs through `generate`, resident and streamed, exactly.
mod valid_variants_of_every_family_are_accepted {
    use super::*;

    #[test]
    fn f16_routers() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let variants = FAMILIES.iter().map(|arch| (format!("{arch} F16 routers"), forge_arch(d, arch, &["--f16-router"]))).collect();
        variants_are_accepted(d, variants);
    }

    /// Every family but those whose loaders require output.weight: they fall back to the
    /// embedding when it is absent.
    #[test]
    fn tied_output() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let untied: Vec<&str> = sovereign::forge::UNTIED_FAMILIES.iter().map(|a| a.name()).collect();
        let variants: Vec<_> = FAMILIES
            .iter()
            .filter(|arch| !untied.contains(arch))
            .map(|arch| (format!("{arch} tied output"), forge_arch(d, arch, &["--tied-output"])))
            .collect();
        let untied_generated = untied.iter().filter(|a| !not_generated().contains(a)).count();
        assert_eq!(variants.len() + untied_generated, FAMILIES.len(), "every untied family is one forge writes");
        variants_are_accepted(d, variants);
    }

    /// Llama 4 as published: each token routed to one expert beside the shared one.
    #[test]
    fn top_one_routing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        variants_are_accepted(d, vec![("llama4 top-1".into(), forge_arch(d, "llama4", &["--top-k", "1"]))]);
    }

    #[test]
    fn optional_tensors_left_out_and_fused_qkv() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let qkv_bias = |n: &str| n.ends_with("attn_q.bias") || n.ends_with("attn_k.bias") || n.ends_with("attn_v.bias");
        type Edit = Box<dyn Fn(&Gguf) -> Rewrite>;
        let edits: Vec<(&str, &str, Edit)> = vec![
            ("deepseek2", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("ernie4_5-moe", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("dots1", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("bailingmoe2", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("deepseek32", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("glm-dsa", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("mimo2", "no attention sinks", Box::new(without(|n: &str| n.ends_with("attn_sinks.weight")))),
            ("mimo2", "fused attn_qkv", Box::new(fused_qkv)),
            ("step35", "no attention gate", Box::new(without(|n: &str| n.ends_with("attn_gate.weight")))),
            ("step35", "no rotary factors", Box::new(without(|n: &str| n == "rope_freqs.weight"))),
            ("exaone-moe", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b.bias")))),
            ("exaone-moe", "fused attn_qkv", Box::new(fused_qkv)),
            ("smallthinker", "fused attn_qkv", Box::new(fused_qkv)),
            ("maple", "fused attn_qkv", Box::new(fused_qkv)),
            ("mellum", "fused attn_qkv", Box::new(fused_qkv)),
            ("laguna", "fused attn_qkv", Box::new(fused_qkv)),
            ("laguna", "a gate per element", Box::new(gate_per_element)),
            ("cohere2moe", "fused attn_qkv", Box::new(fused_qkv)),
            ("granitehybrid", "fused attn_qkv", Box::new(fused_qkv)),
            ("hy_v3", "fused attn_qkv", Box::new(fused_qkv)),
            ("hy_v3", "no selection bias", Box::new(without(|n: &str| n.ends_with("exp_probs_b")))),
            ("hy_v3", "merged gate_up experts", Box::new(merged_gate_up)),
            ("granite_swa", "fused attn_qkv", Box::new(fused_qkv)),
            ("granite_swa", "merged gate_up experts", Box::new(merged_gate_up)),
            ("granitehybrid", "ungated experts", Box::new(without(|n: &str| n.ends_with("ffn_gate_exps.weight")))),
            ("kimi-linear", "fused attn_qkv", Box::new(fused_qkv)),
            ("kimi-linear", "4D convolutions and decays", Box::new(kimi_linear_4d)),
            ("minimax-01", "fused attn_qkv", Box::new(fused_qkv)),
            ("minimax-m3", "fused attn_qkv", Box::new(fused_qkv)),
            ("minimax-01", "ungated experts", Box::new(without(|n: &str| n.ends_with("ffn_gate_exps.weight")))),
            ("deepseek", "fused attn_qkv", Box::new(fused_qkv)),
            ("bailingmoe", "fused attn_qkv", Box::new(fused_qkv)),
            ("mistral3", "no rotary factors", Box::new(without(|n: &str| n == "rope_freqs.weight"))),
            ("mistral3", "ungated experts", Box::new(without(|n: &str| n.ends_with("ffn_gate_exps.weight")))),
            ("phimoe", "no rotary factors", Box::new(without(|n: &str| n.starts_with("rope_factors_")))),
            ("grok", "Grok-1 without a dense MLP", Box::new(without(dense_mlp))),
            ("grok", "ungated experts", Box::new(without(|n: &str| n.ends_with("ffn_gate_exps.weight")))),
            ("grok", "post_ffw_norm", Box::new(renamed("layer_output_norm", "post_ffw_norm"))),
            ("gpt-oss", "no q/k/v biases", Box::new(without(qkv_bias))),
            ("glm4moe", "no q/k/v biases", Box::new(without(qkv_bias))),
            ("qwen2moe", "no q/k/v biases", Box::new(without(qkv_bias))),
            ("llama", "fused attn_qkv", Box::new(fused_qkv)),
            ("olmoe", "fused attn_qkv", Box::new(fused_qkv)),
        ];
        let mut variants = Vec::new();
        let mut bases = std::collections::HashMap::new();
        for (arch, what, edit) in edits {
            let base = bases.entry(arch).or_insert_with(|| forge_arch(d, arch, &[]));
            let out = d.join(format!("{arch}-{}.gguf", what.replace([' ', '/'], "-")));
            variants.push((format!("{arch} {what}"), rewrite(base, &out, |_| {}, edit)));
        }
        variants_are_accepted(d, variants);
    }

    /// GLM-5.2's layout: `attention.indexer.types` marks the layers with an indexer of their own
    /// (1); the others (0) attend the keys the last one chose and carry no indexer tensors.
    #[test]
    fn shared_indexers() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let base = forge_arch(d, "glm-dsa", &[]);
        let types = |m: &mut Vec<(String, Value)>| {
            m.push(("glm-dsa.attention.indexer.types".into(), Value::Array([1, 0, 1].map(Value::U32).to_vec())));
        };
        let shared = rewrite(&base, &d.join("glm-dsa-shared-indexers.gguf"), types, without(|n: &str| n.starts_with("blk.1.indexer.")));
        variants_are_accepted(d, vec![("glm-dsa shared indexers".into(), shared.clone())]);
        // Layer 1 attends what layer 0's indexer chose, not every key: the output differs.
        let (full, own) = (d.join("glm-dsa-full"), d.join("glm-dsa-shared-indexers-resident"));
        gen(&base, &full, &[]);
        let c = compare_surfaces(&full, &own);
        assert!(c.iter().any(|(s, e)| s == "logits" && !*e), "{c:?}");
    }

    /// SmallThinker's, Mellum's and Laguna's layouts without sliding-window layers (no
    /// `sliding_window` key, as Laguna-M.1): every layer attends every key (and SmallThinker's
    /// rotates, Laguna's at the one base), where the sliding layouts see a window shorter than
    /// the prompt (and leave SmallThinker's first layer unrotated).
    #[test]
    fn without_sliding_layers() {
        let dir = tempfile::tempdir().unwrap();
        for arch in ["smallthinker", "mellum", "laguna"] {
            let key = format!("{arch}.attention.sliding_window");
            metadata_variant_runs_otherwise(dir.path(), arch, "without sliding layers", |m| m.retain(|(k, _)| *k != key));
        }
    }

    /// Hy V4 as its all-full-attention checkpoints (no indexer keys or tensors: every key
    /// attended) and with shared indexers (`indexer.types` 0 on layer 1, which attends the keys
    /// layer 0's indexer chose): both accepted, each with other logits than the forged file's.
    #[test]
    fn hy_v4_without_dsa_and_with_shared_indexers() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let base = forge_arch(d, "hy_v4", &[]);
        let no_keys = |m: &mut Vec<(String, Value)>| m.retain(|(k, _)| !k.starts_with("hy_v4.attention.indexer."));
        let no_dsa = rewrite(&base, &d.join("hy_v4-without-dsa.gguf"), no_keys, without(|n: &str| n.contains(".indexer.")));
        let types = |m: &mut Vec<(String, Value)>| {
            for (k, v) in m.iter_mut() {
                if k == "hy_v4.attention.indexer.types" {
                    *v = Value::Array([1, 0, 1].map(Value::U32).to_vec());
                }
            }
        };
        let shared = rewrite(&base, &d.join("hy_v4-shared-indexers.gguf"), types, without(|n: &str| n.starts_with("blk.1.indexer.")));
        variants_are_accepted(d, vec![("hy_v4 without DSA".into(), no_dsa), ("hy_v4 shared indexers".into(), shared)]);
        let forged = d.join("hy_v4-as-forged");
        gen(&base, &forged, &[]);
        for stem in ["hy_v4-without-dsa", "hy_v4-shared-indexers"] {
            let c = compare_surfaces(&forged, &d.join(format!("{stem}-resident")));
            assert!(c.iter().any(|(s, e)| s == "logits" && !*e), "{stem}: {c:?}");
        }
    }

    /// MiniMax-M3 under flash attention, where its MoE layers attend through MSA (the keys of
    /// the blocks its indexer picks; without flash attention llama.cpp attends every key): exact
    /// streamed, and its indexer's choice is what they attend (every block, other logits).
    #[test]
    fn minimax_m3_sparse_attention_under_flash_attention() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let base = forge_arch(d, "minimax-m3", &[]);
        let (resident, plan) = (d.join("msa-resident"), d.join("msa-plan"));
        gen(&base, &resident, &["--flash-attn"]);
        gen(&base, &plan, &["--flash-attn", "--experts", "plan", "--slots", SLOTS, "--policy", "lru:3"]);
        assert_exact(&resident, &plan);
        let every_block = |m: &mut Vec<(String, Value)>| {
            for (k, v) in m.iter_mut() {
                if k == "minimax-m3.attention.indexer.top_k" {
                    *v = Value::U32(1024);
                }
            }
        };
        let dense = rewrite(&base, &d.join("minimax-m3-every-block.gguf"), every_block, without(|_: &str| false));
        let all = d.join("msa-every-block");
        gen(&dense, &all, &["--flash-attn"]);
        let c = compare_surfaces(&resident, &all);
        assert!(c.iter().any(|(s, e)| s == "logits" && !*e), "{c:?}");
    }

    /// Cohere2-MoE normed by RMS instead of LayerNorm (the loader's choice where an RMS epsilon
    /// is written).
    #[test]
    fn cohere2moe_with_rms_norms() {
        let dir = tempfile::tempdir().unwrap();
        metadata_variant_runs_otherwise(dir.path(), "cohere2moe", "with rms norms", |m| {
            m.push(("cohere2moe.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-5)))
        });
    }

    /// Granite 4.0-H with rotary positions (`rope.scaling.finetuned` absent: the loader's default
    /// rotates), and without its shared expert (Granite 4.0's dense-attention MoE layout).
    #[test]
    fn granitehybrid_with_rotary_positions_and_without_a_shared_expert() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        metadata_variant_runs_otherwise(d, "granitehybrid", "with rotary positions", |m| {
            m.retain(|(k, _)| k != "granitehybrid.rope.scaling.finetuned")
        });
        unshared_runs_otherwise(d, "granitehybrid");
    }

    /// `arch`'s file as forged in `d`, without its shared expert (its width key and tensors):
    /// accepted, with other logits than the forged file's (run as `{arch}-as-forged`).
    fn unshared_runs_otherwise(d: &Path, arch: &str) {
        let key = format!("{arch}.expert_shared_feed_forward_length");
        let unshared = rewrite(
            &d.join(format!("{arch}.gguf")),
            &d.join(format!("{arch}-unshared.gguf")),
            |m| m.retain(|(k, _)| *k != key),
            without(|n: &str| n.contains("_shexp.")),
        );
        variants_are_accepted(d, vec![(format!("{arch} without a shared expert"), unshared)]);
        let c = compare_surfaces(&d.join(format!("{arch}-as-forged")), &d.join(format!("{arch}-unshared-resident")));
        assert!(c.iter().any(|(s, e)| s == "logits" && !*e), "{arch}: {c:?}");
    }

    /// Hy3 routed by softmax (`expert_gating_func` 1) instead of the family's default sigmoid.
    #[test]
    fn hy_v3_routed_by_softmax() {
        let dir = tempfile::tempdir().unwrap();
        metadata_variant_runs_otherwise(dir.path(), "hy_v3", "routed by softmax", |m| {
            m.push(("hy_v3.expert_gating_func".into(), Value::U32(1)))
        });
    }

    /// granite_swa with `attention.rope_pattern` leaving its full layers unrotated (the loader
    /// rotates every layer without the key), and without its shared expert.
    #[test]
    fn granite_swa_with_unrotated_full_layers_and_without_a_shared_expert() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        metadata_variant_runs_otherwise(d, "granite_swa", "with unrotated full layers", |m| {
            let swa = m.iter().find(|(k, _)| k == "granite_swa.attention.sliding_window_pattern").unwrap().1.clone();
            let Value::Array(swa) = swa else { panic!("{swa:?}") };
            let rope = swa.iter().map(|v| Value::U32(u32::from(*v == Value::Bool(true)))).collect();
            m.push(("granite_swa.attention.rope_pattern".into(), Value::Array(rope)))
        });
        unshared_runs_otherwise(d, "granite_swa");
    }

    /// Mellum with a rotary base of its sliding layers' own (`rope.freq_base_swa`), which the
    /// loader reads where present (the pinned graph rotates every layer at the common base).
    #[test]
    fn mellum_with_a_sliding_rotary_base() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let base = forge_arch(d, "mellum", &[]);
        let swa_base = |m: &mut Vec<(String, Value)>| m.push(("mellum.rope.freq_base_swa".into(), Value::F32(10_000.0)));
        let model = rewrite(&base, &d.join("mellum-swa-base.gguf"), swa_base, without(|_: &str| false));
        variants_are_accepted(d, vec![("mellum with a sliding rotary base".into(), model)]);
    }

    /// Maple's SwiGLU clamp as one limit for every layer (the loader takes a value or one a
    /// layer): the clamp bites on forged activations, so the limits change the output.
    #[test]
    fn maple_with_one_clamp_limit() {
        let dir = tempfile::tempdir().unwrap();
        metadata_variant_runs_otherwise(dir.path(), "maple", "with one clamp limit", |m| {
            let limit = m.iter_mut().find(|(k, _)| k == "maple.swiglu_clamp_exp").expect("the clamp key");
            limit.1 = Value::F32(0.5);
        });
    }

    /// Ling 1.0 with its routing weights left as the softmax gives them (`expert_weights_norm`
    /// false, as the loader defaults): the top-k weights no longer sum to one.
    #[test]
    fn bailingmoe_without_normalized_weights() {
        let dir = tempfile::tempdir().unwrap();
        metadata_variant_runs_otherwise(dir.path(), "bailingmoe", "without normalized weights", |m| {
            m.retain(|(k, _)| k != "bailingmoe.expert_weights_norm")
        });
    }

    /// Mistral 3 without temperature tuning (no `attention.temperature_scale`): queries past the
    /// original context are no longer scaled.
    #[test]
    fn mistral3_without_temperature_tuning() {
        let dir = tempfile::tempdir().unwrap();
        metadata_variant_runs_otherwise(dir.path(), "mistral3", "without temperature tuning", |m| {
            m.retain(|(k, _)| k != "mistral3.attention.temperature_scale")
        });
    }

    /// `arch`'s forged file with its metadata edited by `edit`: accepted, exact, and with logits
    /// that differ from the file's as forged (the edit changed what runs).
    fn metadata_variant_runs_otherwise(d: &Path, arch: &str, what: &str, edit: impl Fn(&mut Vec<(String, Value)>)) {
        let base = forge_arch(d, arch, &[]);
        let stem = format!("{arch}-{}", what.replace(' ', "-"));
        let model = rewrite(&base, &d.join(format!("{stem}.gguf")), edit, without(|_: &str| false));
        variants_are_accepted(d, vec![(format!("{arch} {what}"), model)]);
        let forged = d.join(format!("{arch}-as-forged"));
        gen(&base, &forged, &[]);
        let c = compare_surfaces(&forged, &d.join(format!("{stem}-resident")));
        assert!(c.iter().any(|(s, e)| s == "logits" && !*e), "{arch} {what}: {c:?}");
    }

    /// Each variant passes `inventory` and runs resident and streamed, exactly.
    fn variants_are_accepted(d: &Path, variants: Vec<(String, PathBuf)>) {
        for (what, model) in &variants {
            let inv = run(&["inventory", model.to_str().unwrap()]);
            assert_eq!(inv.code, 0, "{what}: inventory refused a valid file: {}", inv.stderr);
            let stem = model.file_stem().unwrap().to_str().unwrap();
            let resident = d.join(format!("{stem}-resident"));
            gen(model, &resident, &[]);
            let plan = d.join(format!("{stem}-plan"));
            gen(model, &plan, &["--experts", "plan", "--slots", SLOTS, "--policy", "lru:3"]);
            assert_exact(&resident, &plan);
        }
        eprintln!("valid variants accepted: {}", variants.len());
    }
}

/// Experts without a gate (`ffn_gate_exps` is optional in the grok, llama and granitemoe
/// loaders: an expert is then act(up), then down): a bundle of two roles, exact under every arm.
#[test]
fn ungated_experts_are_exact_under_every_arm() {
    let dir = tempfile::tempdir().unwrap();
    let base = forge_arch(dir.path(), "grok", &[]);
    let model = rewrite(&base, &dir.path().join("grok-ungated.gguf"), |_| {}, without(|n: &str| n.ends_with("ffn_gate_exps.weight")));
    let inv = inventory(&model);
    for l in inv["moe_layers"].as_array().unwrap() {
        let roles: Vec<&String> = l["tensors"].as_object().unwrap().keys().collect();
        assert_eq!(roles, ["down", "up"], "layer {}", l["layer"]);
    }
    let last = inv["moe_layers"].as_array().unwrap().last().unwrap()["layer"].as_u64().unwrap();
    family_is_exact(dir.path(), "grok", &model, &arms(last));
}

/// Nextn (MTP) blocks that a plain run never runs, as GLM-4.5's, Ling 2.0's and K-EXAONE's
/// files carry them after the trunk: a MoE block's experts are in the inventory, never served
/// (K-EXAONE's block is dense: no expert objects), and every arm is exact.
#[test]
fn unrun_nextn_blocks_are_exact_under_every_arm() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, moe_head) in [("glm4moe", true), ("bailingmoe2", true), ("exaone-moe", false)] {
        let model = forge_arch(dir.path(), arch, &["--mtp-layers", "1"]);
        let inv = inventory(&model);
        let head = inv["mtp_layers"][0].as_u64().unwrap();
        let layers: Vec<u64> = inv["moe_layers"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
        assert_eq!(layers.last() == Some(&head), moe_head, "{arch}: whether the nextn block's experts are a MoE layer of the inventory");
        let trunk: Vec<u64> = layers.iter().copied().filter(|&l| l < head).collect();
        family_is_exact(dir.path(), arch, &model, &arms(trunk[trunk.len() - 1]));
        let rec = dir.path().join(format!("{arch}--mtp-layers1-f-lru5"));
        let k = inv["expert_used_count"].as_u64().unwrap() as usize;
        let events = sovereign::routes::decode(&std::fs::read(rec.join("routes.bin")).unwrap(), k).unwrap();
        assert!(!events.is_empty() && events.iter().all(|e| u64::from(e.layer) < head), "{arch}: the nextn block was routed");
    }
}

/// GroveMoE's chunk experts (`ffn_*_chexps`): a second expert set in every layer, chosen from
/// the same router's top-k. They stay loaded, outside the inventory's expert objects; the
/// routes hold one event per token and MoE layer (the layer's own selection, in order), and
/// served through F the chunk experts keep their own ids: every surface exact.
#[test]
fn a_second_expert_set_stays_loaded_and_routes_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = forge_arch(d, "grovemoe", &[]);
    let inv = inventory(&model);
    let layers: Vec<u64> = inv["moe_layers"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
    for l in inv["moe_layers"].as_array().unwrap() {
        let roles: Vec<&String> = l["tensors"].as_object().unwrap().keys().collect();
        assert_eq!(roles, ["down", "gate", "up"], "layer {}", l["layer"]);
    }
    let (resident, f) = (d.join("grovemoe-resident"), d.join("grovemoe-f"));
    let r = gen(&model, &resident, &[]);
    gen(&model, &f, &["--experts", "plan", "--slots", SLOTS, "--source", "f", "--policy", "lru:3"]);
    assert_exact(&resident, &f);
    let k = inv["expert_used_count"].as_u64().unwrap() as usize;
    let events = sovereign::routes::decode(&std::fs::read(resident.join("routes.bin")).unwrap(), k).unwrap();
    let rows = r["counts"]["prompt_tokens"].as_u64().unwrap() + r["counts"]["generated_tokens"].as_u64().unwrap() - 1;
    assert_eq!(events.len() as u64, rows * layers.len() as u64, "one event per token and MoE layer");
    let mut seen = std::collections::BTreeSet::new();
    for e in &events {
        assert!(seen.insert((e.pos, e.layer)), "position {} layer {} routed twice", e.pos, e.layer);
        assert!(u64::from(e.pos) < rows, "position {} past the {rows} rows run", e.pos);
    }
}

/// Nemotron 3's heterogeneous models route a different number of experts in each layer:
/// `expert_used_count` holds one value per layer. Exact under every arm, token passes included,
/// and the routes surface (each event padded to the most any layer selects) replays whole.
#[test]
fn per_layer_top_k_is_exact_under_every_arm() {
    let dir = tempfile::tempdir().unwrap();
    // Layers 1 and 3 are the MoE layers: 4 and 2 experts a token.
    let top_k = Value::Array([4, 4, 4, 2].map(Value::U32).to_vec());
    let model = with_key(dir.path(), "nemotron_h_moe", "expert_used_count", top_k, "nemotron_h_moe-per-layer-top-k.gguf");
    let inv = inventory(&model);
    let used: Vec<(u64, u64)> =
        inv["moe_layers"].as_array().unwrap().iter().map(|l| (l["layer"].as_u64().unwrap(), l["expert_used"].as_u64().unwrap())).collect();
    assert_eq!(used, [(1, 4), (3, 2)]);
    assert_eq!(inv["expert_used_count"], 4, "the most any layer selects");
    let last = used.last().unwrap().0;
    family_is_exact(dir.path(), "nemotron_h_moe", &model, &arms(last));
    // Every event of the token-passed run replays: 24 prompt rows and 23 decode steps, of 4 ids
    // in layer 1 and 2 in layer 3.
    let rec = dir.path().join("nemotron_h_moe-per-layer-top-k-f-pass1");
    let (r, m) = (rec.to_str().unwrap(), model.to_str().unwrap());
    let out = ok(&["plan", "simulate", "--routes", r, "--model", m, "--slots", "5", "--policy", "lru:S", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let row = v["rows"].as_array().unwrap().iter().find(|r| r["policy"] == "lru:S").unwrap();
    assert_eq!(row["refused"], serde_json::Value::Null, "{row}");
    let routes = std::fs::read(rec.join("routes.bin")).unwrap();
    let events = sovereign::routes::decode(&routes, 4).unwrap();
    let per_layer =
        |layer: u32| events.iter().filter(|e| e.layer == layer).map(|e| e.experts.len()).collect::<std::collections::BTreeSet<_>>();
    assert_eq!((per_layer(1), per_layer(3)), ([4].into(), [2].into()));
}

/// A file our checks pass but llama.cpp asserts on while it builds the graph (deepseek2 with a
/// rotary part as large as the whole head): the worker dies, and the run is one line quoting
/// the engine's assertion, a failed record, and no staging left behind.
#[test]
fn an_engine_abort_is_one_line_and_a_failed_record() {
    let dir = tempfile::tempdir().unwrap();
    let bad = with_key(dir.path(), "deepseek2", "rope.dimension_count", Value::U32(160), "bad.gguf");
    assert_eq!(run(&["inventory", bad.to_str().unwrap()]).code, 0, "the file passes the checks that are ours");
    let rec = dir.path().join("rec");
    let r = generate(&bad, PROMPT, 4, &rec, &[]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("GGML_ASSERT(n_embd_head_qk_nope >= 1)") && lines[0].contains("SIGABRT"), "{}", lines[0]);
    assert!(lines[0].contains(bad.to_str().unwrap()) && lines[0].contains(rec.to_str().unwrap()), "{}", lines[0]);
    assert!(!dir.path().join("rec.partial").exists());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    assert_eq!(v["outcome"], "failed");
    assert!(v["error"].as_str().unwrap().contains("GGML_ASSERT(n_embd_head_qk_nope >= 1)"), "{}", v["error"]);
    // Under --json, stdout is the failed record's document.
    let rec = dir.path().join("rec-json");
    let r = generate(&bad, PROMPT, 4, &rec, &["--json"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", r.stdout));
    assert_eq!((doc["outcome"].as_str(), doc["record"].as_str()), (Some("failed"), rec.to_str()));
    assert!(doc["error"].as_str().unwrap().contains("GGML_ASSERT(n_embd_head_qk_nope >= 1)"), "{doc}");
}

/// The families whose loaders require output.weight: llama.cpp refuses their files without it
/// (so the list is no wider than the loaders'), and forge refuses to write one, in one line.
#[test]
fn a_tied_head_is_refused_where_the_loader_requires_output_weight() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for arch in sovereign::forge::UNTIED_FAMILIES.map(|a| a.name()) {
        let out = d.join(format!("{arch}-tied.gguf"));
        let mut args = vec!["model", "forge", "--arch", arch, "--preset", "tiny", "--tied-output", "--out", out.to_str().unwrap()];
        args.extend_from_slice(family_layers(arch));
        let r = run(&args);
        assert_ne!(r.code, 0, "{arch}: {}", r.stdout);
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines.len() == 1 && lines[0].contains("--tied-output") && lines[0].contains("output.weight"), "{arch}: {}", r.stderr);
        assert!(!out.exists(), "{arch}: nothing is written");
        let base = forge_arch(d, arch, &[]);
        let headless = rewrite(&base, &d.join(format!("{arch}-no-output.gguf")), |_| {}, without(|n: &str| n == "output.weight"));
        let r = generate(&headless, PROMPT, 1, &d.join(format!("{arch}-no-output")), &[]);
        assert_ne!(r.code, 0, "{arch}: llama.cpp loaded a file without output.weight");
        assert!(r.stderr.contains("output.weight"), "{arch}: {}", r.stderr);
    }
}

/// The families forge writes that generation refuses: llama.cpp loads them and gives their
/// contexts no KV cache or recurrent state.
fn not_generated() -> Vec<&'static str> {
    sovereign::forge::STATELESS_FAMILIES.iter().map(|a| a.name()).collect()
}

#[test]
fn every_family_forge_writes_is_generated_or_refused_by_name() {
    let mut listed: Vec<&str> = FAMILIES.iter().copied().chain(not_generated()).collect();
    listed.sort_unstable();
    let mut all: Vec<&str> = sovereign::forge::Arch::ALL.iter().map(|a| a.name()).collect();
    all.sort_unstable();
    assert_eq!(listed, all);
}

/// LLaDA-MoE, a diffusion model (non-causal attention, no KV cache), is a valid file: inventory
/// reads its experts, and generation refuses it in one line before generating anything,
/// resident and streamed; under a memory limit the worker's line is the failed record's error
/// and the admission's.
#[test]
fn a_diffusion_model_is_refused_by_generation_in_one_line() {
    assert_eq!(not_generated(), ["llada-moe"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = forge_arch(d, "llada-moe", &[]);
    let inv = inventory(&m);
    assert_eq!(inv["architecture"], "llada-moe");
    assert!(inv["expert_bytes"].as_u64().unwrap() > 0, "{inv}");
    let why = ["llada-moe is a diffusion model", "no KV cache", "one token after another"];
    for (tag, extra) in [("resident", &[][..]), ("streamed", &["--experts", "plan", "--slots", "4", "--policy", "zero"][..])] {
        let rec = d.join(tag);
        assert_one_line_error(&generate(&m, PROMPT, 2, &rec, extra), &why);
        assert!(!rec.exists(), "{tag}: a record was written");
    }
    let rec = d.join("limited");
    let r = generate(&m, PROMPT, 2, &rec, &["--experts", "plan", "--memory-max", "1G", "--json"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["outcome"], "failed");
    let error = v["error"].as_str().unwrap();
    assert!(why.iter().all(|w| error.contains(w)), "{error}");
    let exited = v["admission"]["conjuncts"].as_array().unwrap().iter().find(|c| c["name"] == "worker exited 0").unwrap();
    assert_eq!((&exited["passed"], &exited["value"]), (&serde_json::json!(false), &serde_json::json!("the worker exited with code 2")));
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    assert_eq!((&stored["outcome"], &stored["error"]), (&v["outcome"], &v["error"]));
}

/// DeepSeek-V4's first layers take their experts from a table by the token's id
/// (`ffn_gate_tid2eid`), not from the router: streamed, every route of those layers is its
/// token's row of the table, in order. A table naming an expert the layer lacks is refused in
/// one line quoting the engine's assertion, resident, streamed and under a limit, and with
/// `--json` stdout holds nothing but JSON.
#[test]
fn deepseek4_routes_its_first_layers_by_the_token_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = forge_arch(d, "deepseek4", &[]);
    let g = Gguf::open(&m).unwrap();
    let key = |k: &str| g.metadata[&format!("deepseek4.{k}")].as_u64().unwrap();
    let (hash, k, experts) = (key("hash_layer_count"), key("expert_used_count") as usize, key("expert_count"));
    assert!(hash >= 1 && hash < g.metadata["deepseek4.block_count"].as_u64().unwrap(), "{hash} hash layers");
    let bytes = std::fs::read(&m).unwrap();
    let table = |l: u64| -> (u64, Vec<i32>) {
        let t = g.tensor(&format!("blk.{l}.ffn_gate_tid2eid.weight")).unwrap();
        let raw = &bytes[t.offset as usize..(t.offset + t.bytes) as usize];
        (t.offset, raw.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
    };
    let tables: Vec<Vec<i32>> = (0..hash).map(|l| table(l).1).collect();
    let rec = d.join("streamed");
    gen(&m, &rec, &["--experts", "plan", "--slots", SLOTS, "--policy", "lru:3"]);
    let tokens: Vec<usize> = std::fs::read(rec.join("tokens.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    let events = sovereign::routes::decode(&std::fs::read(rec.join("routes.bin")).unwrap(), k).unwrap();
    let (mut by_table, mut routed) = (0, 0);
    for e in &events {
        let t = tokens[e.pos as usize];
        match tables.get(e.layer as usize) {
            Some(ids) => {
                assert_eq!(e.experts, ids[t * k..(t + 1) * k], "layer {} pos {} token {t}", e.layer, e.pos);
                by_table += 1;
            }
            None => routed += 1,
        }
    }
    assert!(by_table > 0 && routed > 0, "{by_table} routes by the table, {routed} by the router");

    // The prompt's first token names, first in its row of layer 0, an expert past the last.
    let at = table(0).0 as usize + 4 * tokens[0] * k;
    let mut bad = bytes.clone();
    bad[at..at + 4].copy_from_slice(&(experts as i32).to_le_bytes());
    let bad_path = d.join("deepseek4-bad-table.gguf");
    std::fs::write(&bad_path, &bad).unwrap();
    let limited = ["--experts", "plan", "--memory-max", "1G", "--json"];
    for (tag, extra) in
        [("resident", &["--json"][..]), ("streamed", &["--experts", "plan", "--slots", SLOTS, "--json"]), ("limited", &limited)]
    {
        let r = generate(&bad_path, PROMPT, 2, &d.join(format!("bad-{tag}")), extra);
        assert_eq!(r.code, 1, "{tag}: {}{}", r.stdout, r.stderr);
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{tag}: {}", r.stderr);
        assert!(lines[0].contains("llama.cpp aborted:") && lines[0].contains("GGML_ASSERT"), "{tag}: {}", lines[0]);
        if !r.stdout.trim().is_empty() {
            let v: serde_json::Value =
                serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{tag}: stdout is not JSON ({e}): {}", r.stdout));
            assert!(v["error"].as_str().unwrap().contains("GGML_ASSERT"), "{tag}: {v}");
        }
    }
}

/// Same arguments, same bytes; another seed, other bytes: for every family and its variants.
#[test]
fn forging_is_deterministic_for_every_family() {
    let dir = tempfile::tempdir().unwrap();
    let sha = |arch: &str, seed: &str, extra: &[&str], name: &str| -> String {
        let out = dir.path().join(name);
        let mut args = vec!["model", "forge", "--arch", arch, "--preset", "tiny", "--seed", seed, "--out", out.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        let v: serde_json::Value = serde_json::from_str(&ok(&args).stdout).unwrap();
        std::fs::remove_file(&out).unwrap();
        v["sha256"].as_str().unwrap().to_string()
    };
    for arch in FAMILIES {
        let a = sha(arch, "3", &[], "a.gguf");
        assert_eq!(a, sha(arch, "3", &[], "b.gguf"), "{arch}: the same seed gave other bytes");
        assert_ne!(a, sha(arch, "4", &[], "c.gguf"), "{arch}: another seed gave the same bytes");
        let f16 = sha(arch, "3", &["--f16-router"], "d.gguf");
        assert_ne!(a, f16, "{arch}: --f16-router changed nothing");
        assert_eq!(f16, sha(arch, "3", &["--f16-router"], "e.gguf"), "{arch}: F16 routers are not deterministic");
    }
}

/// llama_model_quantize keeps a source's general.alignment but pads to 32 bytes: the file it
/// writes from a 4096-aligned model opens nowhere. It is read back and refused, never named.
#[test]
fn a_quantized_file_that_is_not_valid_gguf_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge_arch(dir.path(), "qwen3moe", &["--alignment", "4096"]);
    let q = dir.path().join("q.gguf");
    let r = run(&["model", "quantize", "--type", "f16", m.to_str().unwrap(), q.to_str().unwrap()]);
    assert_one_line_error(&r, &["llama_model_quantize wrote an invalid file", "not aligned to 4096"]);
    assert!(!q.exists() && !dir.path().join("q.partial").exists());
}

/// Each layer's share of selections taken by its `top` most selected experts, from a record's
/// routes (per event: ubatch, row, pos, layer as u32 LE, then k ids as i32 LE).
fn top_share(rec: &Path, top: usize) -> Vec<f64> {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    let k = r["counts"]["route_k"].as_u64().unwrap() as usize;
    let bytes = std::fs::read(rec.join("routes.bin")).unwrap();
    let mut per: std::collections::BTreeMap<u32, std::collections::HashMap<i32, u64>> = Default::default();
    for unit in bytes.chunks_exact(16 + 4 * k) {
        let layer = u32::from_le_bytes(unit[12..16].try_into().unwrap());
        for id in unit[16..].chunks_exact(4) {
            *per.entry(layer).or_default().entry(i32::from_le_bytes(id.try_into().unwrap())).or_default() += 1;
        }
    }
    per.values()
        .map(|c| {
            let mut n: Vec<u64> = c.values().copied().collect();
            n.sort_unstable_by(|a, b| b.cmp(a));
            n.iter().take(top).sum::<u64>() as f64 / n.iter().sum::<u64>() as f64
        })
        .collect()
}

/// `--router-skew` sends most of a layer's selections to a few experts (forged routers spread
/// them), deterministically, and a Plan run on the skewed model stays bitwise exact.
#[test]
fn router_skew_concentrates_selections_and_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let plain = forge_arch(dir.path(), "qwen3moe", &[]);
    let skewed = forge_arch(dir.path(), "qwen3moe", &["--router-skew", "1"]);
    let again = dir.path().join("again.gguf");
    ok(&["model", "forge", "--preset", "tiny", "--seed", "11", "--router-skew", "1", "--out", again.to_str().unwrap()]);
    assert_eq!(sovereign::util::sha256_file(&skewed).unwrap(), sovereign::util::sha256_file(&again).unwrap(), "skew is deterministic");
    let g = Gguf::open(&skewed).unwrap();
    assert!(matches!(g.get("sovereign.forge.router_skew"), Some(Value::F32(z)) if *z == 1.0));
    assert!(Gguf::open(&plain).unwrap().get("sovereign.forge.router_skew").is_none(), "an unskewed file keeps its bytes");

    // tiny: 16 experts, top-4; the 4 most selected experts of each layer.
    let (a, b) = (dir.path().join("plain"), dir.path().join("skewed"));
    gen(&plain, &a, &[]);
    gen(&skewed, &b, &[]);
    let (pa, pb) = (top_share(&a, 4), top_share(&b, 4));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(mean(&pb) > mean(&pa) + 0.15 && pb.iter().all(|&s| s > 0.5), "plain {pa:?}, skewed {pb:?}");

    let f = dir.path().join("skewed-f");
    let r = gen(&skewed, &f, &["--experts", "plan", "--slots", SLOTS, "--source", "f", "--policy", "lru:5"]);
    assert_exact(&b, &f);
    assert!(r["experts"]["telemetry"]["hits"].as_u64().unwrap() > 0);
    for bad in ["-1", "9", "nan"] {
        let out = dir.path().join(format!("bad{bad}.gguf"));
        let r = run(&["model", "forge", "--preset", "tiny", "--router-skew", bad, "--out", out.to_str().unwrap()]);
        assert_ne!(r.code, 0, "--router-skew {bad}");
        assert!(!out.exists());
    }
}

/// A prompt of `bytes` bytes (the forged tokenizer makes each byte one token).
fn long_prompt(bytes: usize) -> String {
    let mut p = String::new();
    let mut i = 0;
    while p.len() < bytes {
        p += &format!("Expert {i} streams from storage into slot {}, and the output stays exact. ", i * 37 % 101);
        i += 1;
    }
    p
}

/// The seed's principal experiment's topology (`--preset seed`: qwen3next, 48 layers x 512
/// experts, top-10, full attention every 4th layer) with a prompt of over 3,000 tokens: F with
/// LRU, contained under a hard cap well below the model's size, is bitwise equal to the resident
/// run on every surface, and admitted.
#[test]
fn seed_scale_f_with_lru_under_a_cap_is_exact_and_admitted() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // This model's digest manifest (14 MB) goes with the test, not into the shared cache.
    let cache = d.join("cache");
    let sov = |args: &[&str]| -> Run {
        let out = bin().env("SOVEREIGN_CACHE", &cache).args(args).output().expect("spawn sovereign");
        let r = Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        };
        assert_eq!(r.code, 0, "sovereign {args:?}:\n{}{}", r.stdout, r.stderr);
        r
    };
    let model = d.join("seed.gguf");
    let m = model.to_str().unwrap();
    let forged: serde_json::Value =
        serde_json::from_str(&sov(&["model", "forge", "--preset", "seed", "--seed", "11", "--out", m, "--json"]).stdout).unwrap();
    assert_eq!(
        (forged["arch"].as_str(), forged["dims"]["layers"].as_u64(), forged["dims"]["experts"].as_u64(), forged["dims"]["top_k"].as_u64()),
        (Some("qwen3next"), Some(48), Some(512), Some(10))
    );
    let bytes = forged["bytes"].as_u64().unwrap();
    assert!((1 << 30..3 << 29).contains(&bytes), "the seed preset is about 1.2 GiB, not {bytes} bytes");
    let g = Gguf::open(&model).unwrap();
    assert_eq!(g.arch_u64("full_attention_interval"), Some(4));
    let inv: serde_json::Value = serde_json::from_str(&sov(&["inventory", m, "--json"]).stdout).unwrap();
    assert_eq!(
        (inv["moe_layers"].as_array().unwrap().len(), inv["objects"].as_array().unwrap().len(), inv["expert_used_count"].as_u64()),
        (48, 24_576, Some(10))
    );

    let prompt = d.join("prompt.txt");
    std::fs::write(&prompt, long_prompt(3_100)).unwrap();
    // One thread: on two shared cores OpenMP's spinning barriers made two threads several times
    // slower; both runs take the same flags, so the comparison is the same either way.
    let run_with = |rec: &Path, extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt-file",
            prompt.to_str().unwrap(),
            "--n-predict",
            "8",
            "--threads",
            "1",
            "--record",
            rec.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        sov(&args);
        serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
    };
    // Resident first: uncontained, it builds the digest manifest and brings the binary's pages in.
    let resident = d.join("resident");
    let r = run_with(&resident, &[]);
    assert!(r["counts"]["prompt_tokens"].as_u64().unwrap() >= 3_000, "{}", r["counts"]);
    let cap: u64 = 512 << 20;
    assert!(cap < bytes / 2, "the cap is well below the model");
    let f = d.join("f-lru");
    let r = run_with(&f, &["--experts", "plan", "--source", "f", "--slots", "64", "--policy", "lru:64", "--memory-max", "512M"]);
    assert_eq!(r["outcome"], "completed", "{}", r["error"]);
    let res = &r["resources"];
    assert_eq!(res["host"]["limit"], cap);
    assert_eq!(res["host"]["limit_events"], 0, "{}", res["host"]);
    assert_eq!(res["admission"]["admitted"], true, "{}", res["admission"]);
    let e = &r["experts"];
    assert_eq!(e["clean_closure"], true, "{}", e["closure"]);
    let t = &e["telemetry"];
    assert_eq!(t["policy"], "lru:64");
    // The prompt selects far more experts than the slots hold, and LRU kept some for reuse.
    assert!(t["u_sem_lb"]["objects"].as_u64().unwrap() > 48 * 64 * 4, "{}", t["u_sem_lb"]);
    assert!(t["hits"].as_u64().unwrap() > 0 && t["misses"].as_u64().unwrap() > 24_576, "{}", t);

    let cmp = sov(&["compare", resident.to_str().unwrap(), f.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&cmp.stdout).unwrap();
    assert_eq!(v["exact"], true, "{v}");
    let surfaces: Vec<(&str, &str)> =
        v["surfaces"].as_array().unwrap().iter().map(|s| (s["surface"].as_str().unwrap(), s["status"].as_str().unwrap())).collect();
    let every = ["tokens", "logits", "response", "routes", "recurrent", "recurrent_state"];
    assert_eq!(surfaces, every.map(|s| (s, "exact")).to_vec());
}
