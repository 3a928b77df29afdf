//! Hyperparameters checked against the tensors before the engine sees the file: llama.cpp
//! asserts, aborts or reads out of bounds on inconsistencies it does not expect.

use super::{expert_role, GgmlType, Gguf, TensorInfo, Value};
use anyhow::{anyhow, bail, Result};
use std::collections::HashSet;

/// Alignments the engine's expert reads accept.
const ALIGNMENT: std::ops::RangeInclusive<u64> = 32..=65536;
/// The engine's own limits (LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS): beyond them it asserts.
const MAX_LAYERS: u64 = 512;
const MAX_EXPERTS: u64 = 1024;
/// Expert objects (layers x experts) the inventory and the Plan hold, each a few hundred bytes
/// in memory however small in the file: ten times the largest MoE models published.
const MAX_EXPERT_OBJECTS: u64 = 1 << 18;

/// `a * b` of two hyperparameters, or an error naming them.
fn mul(a: u64, b: u64, what: &str) -> Result<u64> {
    a.checked_mul(b).ok_or_else(|| anyhow!("{what} ({a} x {b}) overflows"))
}

/// Tokenizer models the engine builds, with the metadata each one needs.
const TOKENIZERS: &[(&str, &[&str])] = &[
    ("gpt2", &["tokenizer.ggml.tokens", "tokenizer.ggml.merges"]),
    ("llama", &["tokenizer.ggml.tokens", "tokenizer.ggml.scores"]),
    ("t5", &["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.precompiled_charsmap"]),
    ("bert", &["tokenizer.ggml.tokens"]),
];

/// Validates `g`; the error names the file and the first problem found.
pub fn check(g: &Gguf) -> Result<()> {
    check_inner(g).map_err(|e| anyhow!("{}: {e}", g.path.display()))
}

fn check_inner(g: &Gguf) -> Result<()> {
    let arch = g.architecture().map_err(|_| anyhow!("no general.architecture"))?.to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |k: &str| -> Result<Option<u64>> {
        match g.get(&key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| anyhow!("{} is {v}, not an unsigned integer", key(k))),
        }
    };
    let need = |k: &str| -> Result<u64> { uint(k)?.ok_or_else(|| anyhow!("{} is missing", key(k))) };
    let positive = |k: &str| -> Result<u64> {
        let v = need(k)?;
        if v == 0 {
            bail!("{} is 0", key(k));
        }
        Ok(v)
    };
    let tensor = |n: &str| g.tensor(n);
    let require = |n: &str| tensor(n).ok_or_else(|| anyhow!("tensor `{n}` is missing"));
    let shape = |t: &TensorInfo, want: &[u64]| -> Result<()> {
        if t.dims != want {
            bail!("tensor `{}` has shape {:?}, the hyperparameters say {want:?}", t.name, t.dims);
        }
        Ok(())
    };

    if let Some(v) = g.get("general.alignment") {
        if !matches!(v, Value::U32(_)) {
            bail!("general.alignment is not stored as a 32-bit unsigned integer");
        }
        if !ALIGNMENT.contains(&g.alignment) {
            bail!("general.alignment {} is outside {}..={}", g.alignment, ALIGNMENT.start(), ALIGNMENT.end());
        }
    }

    for t in &g.tensors {
        let integer = matches!(t.ggml_type.0, 24..=28);
        if integer {
            bail!("tensor `{}` has type {}, not a weight type", t.name, t.ggml_type);
        }
        let f32_role = t.name.ends_with("_norm.weight") || t.name.ends_with("ffn_gate_inp.weight") || t.dims.len() == 1;
        if f32_role && t.ggml_type != GgmlType::F32 {
            bail!("tensor `{}` has type {}; its role needs F32", t.name, t.ggml_type);
        }
    }

    let layers = positive("block_count")?;
    if layers > MAX_LAYERS {
        bail!("{} is {layers}, more than {MAX_LAYERS}", key("block_count"));
    }
    let blocks = g
        .tensors
        .iter()
        .filter_map(|t| t.name.strip_prefix("blk.")?.split_once('.')?.0.parse::<u64>().ok())
        .max()
        .map_or(0, |m| m + 1);
    if blocks != layers {
        bail!("{} is {layers} but the tensors have {blocks} layers", key("block_count"));
    }
    positive("context_length")?;
    let embd = positive("embedding_length")?;
    let heads = positive("attention.head_count")?;
    let kv_heads = uint("attention.head_count_kv")?.unwrap_or(heads);
    if kv_heads == 0 || heads % kv_heads != 0 {
        bail!("attention.head_count {heads} is not a multiple of attention.head_count_kv {kv_heads}");
    }
    let k_len = uint("attention.key_length")?.unwrap_or(embd / heads);
    let v_len = uint("attention.value_length")?.unwrap_or(embd / heads);
    if k_len == 0 || v_len == 0 {
        bail!("attention key/value length is 0");
    }
    let float = |name: &str| -> Result<Option<f64>> {
        match g.get(&key(name)) {
            None => Ok(None),
            Some(Value::F32(e)) => Ok(Some(f64::from(*e))),
            Some(Value::F64(e)) => Ok(Some(*e)),
            Some(other) => bail!("{} is {other}, not a float", key(name)),
        }
    };
    if let Some(eps) = float("attention.layer_norm_rms_epsilon")? {
        if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
            bail!("{} is {eps}, not a small positive number", key("attention.layer_norm_rms_epsilon"));
        }
    }
    // A non-finite or non-positive base makes every logit NaN: refuse it before a run is made.
    if let Some(base) = float("rope.freq_base")? {
        if !(base.is_finite() && base > 0.0) {
            bail!("{} is {base}, not a positive number", key("rope.freq_base"));
        }
    }

    let vocab = check_tokenizer(g)?;
    let embd_t = require("token_embd.weight")?;
    shape(embd_t, &[embd, vocab])?;
    require("output_norm.weight").and_then(|t| shape(t, &[embd]))?;
    if let Some(t) = tensor("output.weight") {
        shape(t, &[embd, vocab])?;
    }

    let experts = uint("expert_count")?.unwrap_or(0);
    let used = uint("expert_used_count")?.unwrap_or(0);
    let expert_tensors: Vec<(&TensorInfo, &str)> =
        g.tensors.iter().filter_map(|t| Some((t, expert_role(&t.name)?.1))).collect();
    if let Some((t, _)) = expert_tensors.first().filter(|_| experts == 0) {
        bail!("`{}` is an expert tensor but {} is missing", t.name, key("expert_count"));
    }
    if experts > 0 || used > 0 {
        if experts < 2 || experts > MAX_EXPERTS {
            bail!("{} is {experts} (2 to {MAX_EXPERTS} supported)", key("expert_count"));
        }
        if used == 0 || used > experts {
            bail!("{} is {used}; it must be 1 to {} is {experts}", key("expert_used_count"), key("expert_count"));
        }
        if layers * experts > MAX_EXPERT_OBJECTS {
            bail!("{layers} layers x {experts} experts is more than {MAX_EXPERT_OBJECTS} expert objects");
        }
    }
    let expert_ff = uint("expert_feed_forward_length")?;
    // Every expert tensor, whatever its layer or role: its shape sizes the expert objects.
    for (t, role) in expert_tensors {
        let d = |i: usize| t.dims.get(i).copied().unwrap_or(0);
        let want = match (role, expert_ff) {
            ("down", ff) => [ff.unwrap_or(d(0)), embd, experts],
            ("gate_up", ff) => [embd, mul(2, ff.unwrap_or(d(1) / 2), "2 x expert_feed_forward_length")?, experts],
            (_, ff) => [embd, ff.unwrap_or(d(1)), experts],
        };
        shape(t, &want)?;
    }
    for l in 0..layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        if let Some(q) = tensor(&n("attn_q")) {
            let (q_len, k_all, v_all) = (
                mul(heads, k_len, "head_count x key_length")?,
                mul(kv_heads, k_len, "head_count_kv x key_length")?,
                mul(kv_heads, v_len, "head_count_kv x value_length")?,
            );
            shape(q, &[embd, q_len])?;
            require(&n("attn_k")).and_then(|t| shape(t, &[embd, k_all]))?;
            require(&n("attn_v")).and_then(|t| shape(t, &[embd, v_all]))?;
            require(&n("attn_output")).and_then(|t| shape(t, &[mul(heads, v_len, "head_count x value_length")?, embd]))?;
        }
        for norm in ["attn_q_norm", "attn_k_norm"] {
            if let Some(t) = tensor(&n(norm)) {
                shape(t, &[k_len])?;
            }
        }
        require(&n("attn_norm")).and_then(|t| shape(t, &[embd]))?;
        let router = tensor(&n("ffn_gate_inp"));
        if experts == 0 {
            if router.is_some() {
                bail!("`{}` is present but {} is missing", n("ffn_gate_inp"), key("expert_count"));
            }
            continue;
        }
        shape(router.ok_or_else(|| anyhow!("tensor `{}` is missing", n("ffn_gate_inp")))?, &[embd, experts])?;
    }
    Ok(())
}

/// The tokenizer's model and data; returns the vocabulary size.
fn check_tokenizer(g: &Gguf) -> Result<u64> {
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("tokenizer.ggml.model is missing"))?;
    let Some((_, keys)) = TOKENIZERS.iter().find(|(m, _)| *m == model) else {
        bail!("tokenizer.ggml.model {model:?} is not supported");
    };
    for k in *keys {
        if !matches!(g.get(k), Some(Value::Array(_))) {
            bail!("tokenizer.ggml.model {model:?} needs {k}, which is absent");
        }
    }
    let Some(Value::Array(tokens)) = g.get("tokenizer.ggml.tokens") else { unreachable!() };
    let mut seen = HashSet::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let s = t.as_str().ok_or_else(|| anyhow!("tokenizer.ggml.tokens[{i}] is not a string"))?;
        if !seen.insert(s) {
            bail!("tokenizer.ggml.tokens[{i}] {s:?} is a duplicate");
        }
    }
    let vocab = tokens.len() as u64;
    for k in ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"] {
        if let Some(Value::Array(a)) = g.get(k) {
            if a.len() as u64 != vocab {
                bail!("{k} has {} entries for {vocab} tokens", a.len());
            }
        }
    }
    for k in ["eos", "bos", "unknown", "padding", "seperator", "separator"] {
        let k = format!("tokenizer.ggml.{k}_token_id");
        if let Some(id) = g.get(&k).and_then(Value::as_u64) {
            if id >= vocab {
                bail!("{k} {id} is not a token (vocabulary of {vocab})");
            }
        }
    }
    Ok(vocab)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::{forge, Arch, Preset};

    fn tiny() -> (tempfile::TempDir, Gguf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tiny.gguf");
        forge(Arch::Qwen3moe, Preset::Tiny.dims(), 7, &p).unwrap();
        let g = Gguf::open(&p).unwrap();
        (dir, g)
    }

    /// Applies `edit` to a valid tiny model and returns the refusal, which must name the file.
    fn refused(edit: impl FnOnce(&mut Gguf)) -> String {
        let (_d, mut g) = tiny();
        check(&g).expect("the forged model is valid");
        edit(&mut g);
        let e = check(&g).expect_err("the edited model must be refused").to_string();
        assert!(e.starts_with(&g.path.display().to_string()), "{e}");
        assert!(!e.contains('\n'), "{e}");
        e
    }

    fn set(g: &mut Gguf, k: &str, v: Value) {
        g.metadata.insert(k.to_string(), v);
    }

    #[test]
    fn beyond_the_engine_limits() {
        let e = refused(|g| set(g, "qwen3moe.expert_count", Value::U32(1025)));
        assert!(e.contains("expert_count is 1025 (2 to 1024 supported)"), "{e}");
        let e = refused(|g| set(g, "qwen3moe.block_count", Value::U32(513)));
        assert!(e.contains("block_count is 513, more than 512"), "{e}");
    }

    #[test]
    fn expert_used_count_zero() {
        assert!(refused(|g| set(g, "qwen3moe.expert_used_count", Value::U32(0))).contains("expert_used_count"));
    }

    #[test]
    fn block_count_zero() {
        assert!(refused(|g| set(g, "qwen3moe.block_count", Value::U32(0))).contains("block_count is 0"));
    }

    #[test]
    fn expert_count_one_or_beyond_tensors() {
        assert!(refused(|g| set(g, "qwen3moe.expert_count", Value::U32(1))).contains("expert_count is 1"));
        let e = refused(|g| set(g, "qwen3moe.expert_count", Value::U32(17)));
        assert!(e.contains("_exps.weight` has shape [256, 256, 16], the hyperparameters say [256, 256, 17]"), "{e}");
    }

    #[test]
    fn rms_epsilon_nan() {
        let e = refused(|g| set(g, "qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN)));
        assert!(e.contains("NaN"), "{e}");
    }

    #[test]
    fn rope_freq_base_nan() {
        let e = refused(|g| set(g, "qwen3moe.rope.freq_base", Value::F32(f32::NAN)));
        assert!(e.contains("rope.freq_base is NaN"), "{e}");
        let e = refused(|g| set(g, "qwen3moe.rope.freq_base", Value::F32(0.0)));
        assert!(e.contains("rope.freq_base is 0"), "{e}");
    }

    #[test]
    fn router_typed_i32() {
        let e = refused(|g| g.tensors.iter_mut().find(|t| t.name == "blk.1.ffn_gate_inp.weight").unwrap().ggml_type = GgmlType(26));
        assert!(e.contains("blk.1.ffn_gate_inp.weight") && e.contains("I32"), "{e}");
    }

    #[test]
    fn duplicated_token_string() {
        let e = refused(|g| {
            let Some(Value::Array(t)) = g.metadata.get_mut("tokenizer.ggml.tokens") else { panic!() };
            t[5] = t[4].clone();
        });
        assert!(e.contains("tokens[5]") && e.contains("duplicate"), "{e}");
    }

    #[test]
    fn tokenizer_without_its_data() {
        let e = refused(|g| set(g, "tokenizer.ggml.model", Value::Str("llama".into())));
        assert!(e.contains("tokenizer.ggml.scores"), "{e}");
        assert!(refused(|g| set(g, "tokenizer.ggml.model", Value::Str("nonesuch".into()))).contains("not supported"));
    }

    #[test]
    fn alignments() {
        for a in [16u64, 8, 1 << 20] {
            let e = refused(|g| {
                set(g, "general.alignment", Value::U32(a as u32));
                g.alignment = a;
            });
            assert!(e.contains("general.alignment"), "{e}");
        }
        assert!(refused(|g| set(g, "general.alignment", Value::U64(32))).contains("general.alignment"));
    }

    #[test]
    fn expert_tensors_are_sized_by_expert_count() {
        let e = refused(|g| {
            g.metadata.remove("qwen3moe.expert_count");
            g.metadata.remove("qwen3moe.expert_used_count");
        });
        assert!(e.contains("expert_count is missing"), "{e}");
        let e = refused(|g| g.tensors.iter_mut().find(|t| t.name == "blk.2.ffn_up_exps.weight").unwrap().name = "blk.2.ffn_gate_up_exps.weight".into());
        assert!(e.contains("blk.2.ffn_gate_up_exps.weight") && e.contains("[256, 512, 16]"), "{e}");
        let e = refused(|g| {
            g.tensors.iter_mut().find(|t| t.name == "blk.2.attn_norm.weight").unwrap().name = "blk.511.attn_norm.weight".into();
            set(g, "qwen3moe.block_count", Value::U32(512));
            set(g, "qwen3moe.expert_count", Value::U32(1024));
        });
        assert!(e.contains("expert objects"), "{e}");
        let e = refused(|g| set(g, "qwen3moe.attention.key_length", Value::U64(1 << 62)));
        assert!(e.contains("overflows"), "{e}");
    }

    #[test]
    fn heads_and_lengths() {
        assert!(refused(|g| set(g, "qwen3moe.attention.head_count_kv", Value::U32(3))).contains("multiple"));
        assert!(refused(|g| set(g, "qwen3moe.attention.key_length", Value::U32(32))).contains("attn_q"));
        assert!(refused(|g| set(g, "qwen3moe.attention.value_length", Value::U32(32))).contains("attn_v"));
        assert!(refused(|g| set(g, "qwen3moe.embedding_length", Value::U32(128))).contains("token_embd"));
        assert!(refused(|g| set(g, "qwen3moe.expert_used_count", Value::U32(17))).contains("expert_used_count"));
        assert!(refused(|g| set(g, "qwen3moe.block_count", Value::U32(4))).contains("3 layers"));
        assert!(refused(|g| set(g, "qwen3moe.expert_feed_forward_length", Value::U32(128))).contains("exps"));
        let e = refused(|g| {
            let Some(Value::Array(t)) = g.metadata.get_mut("tokenizer.ggml.tokens") else { panic!() };
            t.push(Value::Str("<extra>".into()));
        });
        assert!(e.contains("token_type") || e.contains("token_embd"), "{e}");
    }
}
