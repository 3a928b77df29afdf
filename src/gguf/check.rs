//! What must hold before the engine sees a file, independent of its architecture.
//!
//! The reader has already bounded every count, length and shape by the file's bytes, kept
//! offsets inside the data section and refused unknown types. What is left here is of two kinds:
//! hyperparameters that llama.cpp asserts on (an abort, not an error: each rule quotes the
//! assertion it prevents), and values that make every logit NaN. Shapes, per-architecture tensor
//! sets and key types are the engine loader's own checks (it fails with a message); a load that
//! can still abort runs in a worker process, whose death becomes one line.

use super::{expert_role, Gguf, Value};
use anyhow::{anyhow, bail, Result};
use std::collections::HashSet;

/// llama-hparams.h: LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS.
const MAX_LAYERS: u64 = 512;
const MAX_EXPERTS: u64 = 1024;
/// Expert objects (layers x experts) the inventory and the Plan hold, each a few hundred bytes
/// in memory however small in the file: ten times the largest MoE models published.
const MAX_EXPERT_OBJECTS: u64 = 1 << 18;
/// llama-model.cpp LLAMA_ROPE_SCALING_TYPES.
const ROPE_SCALING: &[&str] = &["none", "linear", "yarn", "longrope"];

/// Validates `g`; the error names the file and the first problem found.
pub fn check(g: &Gguf) -> Result<()> {
    check_inner(g).map_err(|e| anyhow!("{}: {e}", g.path.display()))
}

/// A hyperparameter as llama.cpp's `get_key_or_arr` reads it: one unsigned value, or one per
/// layer. `None` when absent or of another type (the loader refuses a wrong type itself).
fn per_layer(v: Option<&Value>) -> Option<Vec<u64>> {
    match v? {
        Value::Array(a) => a.iter().map(Value::as_u64).collect(),
        v => v.as_u64().map(|x| vec![x]),
    }
}

fn float(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::F32(e) => Some(f64::from(*e)),
        Value::F64(e) => Some(*e),
        _ => None,
    }
}

fn check_inner(g: &Gguf) -> Result<()> {
    let arch = g.architecture().map_err(|_| anyhow!("no general.architecture"))?.to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| g.get(&key(k));
    let uint = |k: &str| get(k).and_then(Value::as_u64);

    if let Some(v) = g.get("general.alignment") {
        // gguf.cpp reads it with gguf_get_val_u32.
        if !matches!(v, Value::U32(_)) {
            bail!("general.alignment is not stored as a 32-bit unsigned integer");
        }
    }

    // GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)
    let layers = uint("block_count");
    if let Some(n) = layers {
        if n == 0 || n > MAX_LAYERS {
            bail!("{} is {n}: llama.cpp asserts 0 < n_layer <= LLAMA_MAX_LAYERS ({MAX_LAYERS})", key("block_count"));
        }
    }
    let layers = layers.unwrap_or(0);
    // GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all)
    if let Some(n) = uint("nextn_predict_layers").filter(|&n| n > layers) {
        bail!("{} is {n}, more than {} {layers}: llama.cpp asserts n_layer_nextn <= n_layer", key("nextn_predict_layers"), key("block_count"));
    }
    check_experts(g, &key, layers)?;
    // GGML_ASSERT(hparams.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)
    if let Some(Value::Str(s)) = get("rope.scaling.type") {
        if !ROPE_SCALING.contains(&s.as_str()) {
            bail!("{} is {s:?}: llama.cpp asserts it is one of {}", key("rope.scaling.type"), ROPE_SCALING.join(", "));
        }
    }
    // ggml-cpu's rope with 0 rotary dimensions never returns (seen on qwen3next): a hang, not
    // an error, so it is refused here.
    if uint("rope.dimension_count") == Some(0) {
        bail!("{} is 0: ggml's rope does not finish with no rotary dimensions", key("rope.dimension_count"));
    }
    // Hybrid models take layer indices modulo it: 0 is a division by zero (SIGFPE).
    if uint("full_attention_interval") == Some(0) {
        bail!("{} is 0: llama.cpp takes layer indices modulo it", key("full_attention_interval"));
    }
    // Attention scores broadcast K heads over Q heads: ggml_mul_mat asserts
    // ggml_can_mul_mat (n_head a multiple of n_head_kv) when the graph is built.
    if let (Some(heads), Some(kv)) = (per_layer(get("attention.head_count")), per_layer(get("attention.head_count_kv"))) {
        let at = |v: &[u64], l: usize| if v.len() == 1 { v[0] } else { v.get(l).copied().unwrap_or(0) };
        for l in 0..(layers as usize).max(1) {
            let (h, k) = (at(&heads, l), at(&kv, l));
            if h > 0 && k > 0 && h % k != 0 {
                bail!("attention.head_count {h} is not a multiple of attention.head_count_kv {k} (layer {l}): ggml_can_mul_mat fails in attention");
            }
        }
    }
    // Not aborts, but every logit would be NaN: refused before a run is made of them.
    for k in ["attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"] {
        if let Some(eps) = float(get(k)).filter(|e| !(e.is_finite() && *e >= 0.0)) {
            bail!("{} is {eps}, not a finite non-negative number", key(k));
        }
    }
    if let Some(base) = float(get("rope.freq_base")).filter(|b| !(b.is_finite() && *b > 0.0)) {
        bail!("{} is {base}, not a positive number", key("rope.freq_base"));
    }
    check_tokens(g)
}

/// The expert hyperparameters llama-model.cpp asserts on, and the inventory's own bound.
fn check_experts(g: &Gguf, key: &dyn Fn(&str) -> String, layers: u64) -> Result<()> {
    let uint = |k: &str| g.get(&key(k)).and_then(Value::as_u64).unwrap_or(0);
    let experts = uint("expert_count");
    let groups = uint("expert_group_count");
    let group_used = uint("expert_group_used_count");
    let used = per_layer(g.get(&key("expert_used_count"))).unwrap_or_default();
    let used_max = used.iter().take(layers.max(1) as usize).copied().max().unwrap_or(0);
    let ek = key("expert_count");
    // GGML_ASSERT(hparams.n_expert <= LLAMA_MAX_EXPERTS)
    if experts > MAX_EXPERTS {
        bail!("{ek} is {experts}: llama.cpp asserts n_expert <= LLAMA_MAX_EXPERTS ({MAX_EXPERTS})");
    }
    // GGML_ASSERT(n_expert_used_max <= hparams.n_expert)
    if used_max > experts {
        bail!("{} is {used_max}, more than {ek} {experts}: llama.cpp asserts n_expert_used <= n_expert", key("expert_used_count"));
    }
    if experts > 0 {
        // GGML_ASSERT(n_expert_used_max > 0)
        if used_max == 0 {
            bail!("{} is 0 or missing with {ek} {experts}: llama.cpp asserts n_expert_used > 0", key("expert_used_count"));
        }
        // GGML_ASSERT(hparams.n_expert_groups < hparams.n_expert) and, with groups,
        // n_expert % n_expert_groups == 0, 0 < n_group_used < n_expert_groups.
        if groups >= experts {
            bail!("{} is {groups}, not fewer than {ek} {experts}: llama.cpp asserts n_expert_groups < n_expert", key("expert_group_count"));
        }
        if groups > 1 && (experts % groups != 0 || group_used == 0 || group_used >= groups) {
            bail!(
                "{} {groups} with {} {group_used} and {ek} {experts}: llama.cpp asserts n_expert % n_expert_groups == 0 and 0 < n_group_used < n_expert_groups",
                key("expert_group_count"),
                key("expert_group_used_count")
            );
        }
        if layers.saturating_mul(experts) > MAX_EXPERT_OBJECTS {
            bail!("{layers} layers x {experts} experts is more than {MAX_EXPERT_OBJECTS} expert objects");
        }
    } else {
        // GGML_ASSERT(n_expert_used_max == 0) and GGML_ASSERT(hparams.n_expert_groups == 0)
        if used_max > 0 || groups > 0 {
            bail!("{} or {} is set but {ek} is 0 or missing: llama.cpp asserts both are 0 without experts", key("expert_used_count"), key("expert_group_count"));
        }
        if let Some(t) = g.tensors.iter().find(|t| expert_role(&t.name).is_some()) {
            bail!("`{}` is an expert tensor but {ek} is 0 or missing", t.name);
        }
    }
    Ok(())
}

/// llama-vocab.cpp maps token strings to ids and asserts
/// `id_to_token.size() == token_to_id.size()`: a repeated string aborts the load.
fn check_tokens(g: &Gguf) -> Result<()> {
    let Some(Value::Array(tokens)) = g.get("tokenizer.ggml.tokens") else { return Ok(()) };
    let mut seen = HashSet::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let Some(s) = t.as_str() else { return Ok(()) };
        if !seen.insert(s) {
            bail!("tokenizer.ggml.tokens[{i}] {s:?} is a duplicate: llama.cpp asserts every token string is unique");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::{forge, Arch, Preset};
    use crate::gguf::GgmlType;

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

    /// Applies `edit` to a valid tiny model; the check must still accept it.
    fn accepted(edit: impl FnOnce(&mut Gguf)) {
        let (_d, mut g) = tiny();
        edit(&mut g);
        if let Err(e) = check(&g) {
            panic!("a variant llama.cpp loads was refused: {e}");
        }
    }

    fn set(g: &mut Gguf, k: &str, v: Value) {
        g.metadata.insert(k.to_string(), v);
    }

    #[test]
    fn beyond_the_engine_limits() {
        let e = refused(|g| set(g, "qwen3moe.expert_count", Value::U32(1025)));
        assert!(e.contains("LLAMA_MAX_EXPERTS"), "{e}");
        let e = refused(|g| set(g, "qwen3moe.block_count", Value::U32(513)));
        assert!(e.contains("LLAMA_MAX_LAYERS"), "{e}");
        assert!(refused(|g| set(g, "qwen3moe.block_count", Value::U32(0))).contains("block_count is 0"));
        let e = refused(|g| set(g, "qwen3moe.nextn_predict_layers", Value::U32(4)));
        assert!(e.contains("n_layer_nextn"), "{e}");
    }

    #[test]
    fn expert_counts_llama_cpp_asserts_on() {
        assert!(refused(|g| set(g, "qwen3moe.expert_used_count", Value::U32(0))).contains("n_expert_used > 0"));
        assert!(refused(|g| set(g, "qwen3moe.expert_used_count", Value::U32(17))).contains("n_expert_used <= n_expert"));
        let per_layer = |v: &[u32]| Value::Array(v.iter().map(|&x| Value::U32(x)).collect());
        assert!(refused(|g| set(g, "qwen3moe.expert_used_count", per_layer(&[4, 17, 4]))).contains("n_expert_used <= n_expert"));
        assert!(refused(|g| set(g, "qwen3moe.expert_group_count", Value::U32(16))).contains("n_expert_groups < n_expert"));
        assert!(refused(|g| set(g, "qwen3moe.expert_group_count", Value::U32(3))).contains("n_expert % n_expert_groups"));
        let e = refused(|g| {
            g.metadata.remove("qwen3moe.expert_count");
        });
        assert!(e.contains("n_expert_used <= n_expert"), "{e}");
        let e = refused(|g| {
            g.metadata.remove("qwen3moe.expert_count");
            g.metadata.remove("qwen3moe.expert_used_count");
        });
        assert!(e.contains("is an expert tensor but qwen3moe.expert_count is 0 or missing"), "{e}");
        assert!(refused(|g| set(g, "qwen3moe.expert_group_count", Value::U32(4))).contains("0 < n_group_used"));
        let e = refused(|g| {
            g.tensors.iter_mut().find(|t| t.name == "blk.2.attn_norm.weight").unwrap().name = "blk.511.attn_norm.weight".into();
            set(g, "qwen3moe.block_count", Value::U32(512));
            set(g, "qwen3moe.expert_count", Value::U32(1024));
        });
        assert!(e.contains("expert objects"), "{e}");
    }

    #[test]
    fn values_that_make_every_logit_nan() {
        let e = refused(|g| set(g, "qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN)));
        assert!(e.contains("NaN"), "{e}");
        assert!(refused(|g| set(g, "qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(-1e-6))).contains("non-negative"));
        let e = refused(|g| set(g, "qwen3moe.rope.freq_base", Value::F32(f32::NAN)));
        assert!(e.contains("rope.freq_base is NaN"), "{e}");
        let e = refused(|g| set(g, "qwen3moe.rope.freq_base", Value::F32(0.0)));
        assert!(e.contains("rope.freq_base is 0"), "{e}");
    }

    #[test]
    fn tokens_and_heads_llama_cpp_asserts_on() {
        let e = refused(|g| {
            let Some(Value::Array(t)) = g.metadata.get_mut("tokenizer.ggml.tokens") else { panic!() };
            t[5] = t[4].clone();
        });
        assert!(e.contains("tokens[5]") && e.contains("duplicate"), "{e}");
        assert!(refused(|g| set(g, "qwen3moe.attention.head_count_kv", Value::U32(3))).contains("multiple"));
        let e = refused(|g| set(g, "qwen3moe.rope.scaling.type", Value::Str("spline".into())));
        assert!(e.contains("rope.scaling.type") && e.contains("yarn"), "{e}");
        assert!(refused(|g| set(g, "general.alignment", Value::U64(32))).contains("general.alignment"));
        assert!(refused(|g| set(g, "qwen3moe.rope.dimension_count", Value::U32(0))).contains("rope.dimension_count is 0"));
        assert!(refused(|g| set(g, "qwen3moe.full_attention_interval", Value::U32(0))).contains("modulo"));
    }

    /// What the engine's loader decides (shapes, tensor sets, tokenizer data) or computes
    /// (F16 routers and norms) is not pre-empted here.
    #[test]
    fn variants_the_engine_decides_are_accepted() {
        accepted(|g| {
            for t in g.tensors.iter_mut().filter(|t| t.name.ends_with("ffn_gate_inp.weight")) {
                t.ggml_type = GgmlType::F16;
            }
        });
        accepted(|g| set(g, "qwen3moe.attention.key_length", Value::U32(32)));
        accepted(|g| set(g, "qwen3moe.expert_used_count", Value::Array(vec![Value::U32(4); 3])));
        accepted(|g| set(g, "qwen3moe.attention.head_count", Value::Array(vec![Value::U32(4); 3])));
        accepted(|g| set(g, "qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(0.0)));
        accepted(|g| {
            set(g, "qwen3moe.expert_group_count", Value::U32(4));
            set(g, "qwen3moe.expert_group_used_count", Value::U32(2));
        });
        accepted(|g| set(g, "qwen3moe.rope.scaling.type", Value::Str("yarn".into())));
        accepted(|g| {
            g.tensors.retain(|t| t.name != "blk.0.ffn_gate_inp.weight" && t.name != "output.weight");
        });
        accepted(|g| set(g, "tokenizer.ggml.model", Value::Str("llama".into())));
        for a in [8u32, 16, 1 << 20] {
            accepted(|g| {
                set(g, "general.alignment", Value::U32(a));
                g.alignment = u64::from(a);
            });
        }
    }
}
