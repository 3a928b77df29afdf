//! What must hold before the engine sees a file, independent of its architecture.
//!
//! The reader has already bounded every count, length and shape by the file's bytes, kept
//! offsets inside the data section and refused unknown types. What is left here is of two kinds:
//! hyperparameters, layouts, vocabularies and weight types that llama.cpp or ggml abort on (not
//! an error: each rule quotes the code it prevents), and values that make every logit NaN.
//! Shapes, per-architecture tensor sets and key types are the engine loader's own checks (it
//! fails with a message); a load that can still abort runs in a worker process, whose death
//! becomes one line.

use super::{expert_role, GgmlType, Gguf, Value};
use anyhow::{anyhow, bail, Result};
use std::collections::HashSet;

/// llama-hparams.h: LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS.
const MAX_LAYERS: u64 = 512;
const MAX_EXPERTS: u64 = 1024;
/// Expert objects (layers x experts) the inventory and the Plan hold, each a few hundred bytes
/// in memory however small in the file: ten times the largest MoE models published.
const MAX_EXPERT_OBJECTS: u64 = 1 << 18;
/// ggml-impl.h TENSOR_ALIGNMENT.
const TENSOR_ALIGNMENT: u64 = 32;
/// ggml-cpu.c `type_traits_cpu` gives these types no `vec_dot`, the row kernel
/// ggml_compute_forward_mul_mat(_id) calls unchecked: a weight of one is a call through a null
/// pointer (SIGSEGV). The CPU backend's supports_op takes any weight type with F32 activations,
/// so the loader places such a weight without complaint.
const NO_CPU_MATMUL: &[&str] = &["Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"];
/// Tensors llama-arch.cpp's LLM_TENSOR_INFOS marks GGML_OP_MUL_MAT (`blk.N.ROLE.weight`), besides
/// `output.weight` and the experts (GGML_OP_MUL_MAT_ID).
const MATMUL_ROLES: &[&str] = &[
    "ffn_gate_inp",
    "ffn_gate_inp_shexp",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "attn_gate",
    "attn_q_a",
    "attn_q_b",
    "attn_kv_a_mqa",
    "attn_kv_b",
    "attn_k_b",
    "attn_v_b",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
    "ssm_out",
    "ssm_ba",
];
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
    // ggml-backend.cpp ggml_backend_cpu_buffer_from_ptr:
    //   GGML_ASSERT((uintptr_t)ptr % TENSOR_ALIGNMENT == 0 && "buffer pointer must be aligned")
    // A mapped load hands the CPU backend buffers that start at a tensor's bytes in the file;
    // which tensor starts one depends on placement, so each must. Alignments of 32 and more
    // guarantee it; smaller ones only where the layout happens to.
    if let Some(t) = g.tensors.iter().find(|t| t.offset % TENSOR_ALIGNMENT != 0) {
        bail!(
            "general.alignment is {}: tensor `{}` starts at byte {}, not a multiple of {TENSOR_ALIGNMENT}, and ggml asserts a CPU buffer pointer is aligned to TENSOR_ALIGNMENT ({TENSOR_ALIGNMENT})",
            g.alignment,
            t.name,
            t.offset
        );
    }
    check_weight_types(g)?;

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
        bail!(
            "{} is {n}, more than {} {layers}: llama.cpp asserts n_layer_nextn <= n_layer",
            key("nextn_predict_layers"),
            key("block_count")
        );
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
            bail!(
                "{} or {} is set but {ek} is 0 or missing: llama.cpp asserts both are 0 without experts",
                key("expert_used_count"),
                key("expert_group_count")
            );
        }
        if let Some(t) = g.tensors.iter().find(|t| expert_role(&t.name).is_some()) {
            bail!("`{}` is an expert tensor but {ek} is 0 or missing", t.name);
        }
    }
    Ok(())
}

/// Whether llama.cpp multiplies by tensor `name` (mul_mat or mul_mat_id).
fn is_matmul_weight(name: &str) -> bool {
    if name == "output.weight" || expert_role(name).is_some() {
        return true;
    }
    let role = name.strip_prefix("blk.").and_then(|r| r.split_once('.')).and_then(|(_, r)| r.strip_suffix(".weight"));
    role.is_some_and(|r| MATMUL_ROLES.contains(&r))
}

/// Matmul weights (routers, experts, projections) of a type the CPU has no product for.
fn check_weight_types(g: &Gguf) -> Result<()> {
    let no_product = |ty: GgmlType| NO_CPU_MATMUL.contains(&ty.name());
    if let Some(t) = g.tensors.iter().find(|t| no_product(t.ggml_type) && is_matmul_weight(&t.name)) {
        bail!(
            "tensor `{}` is {}: ggml's CPU backend has no matrix product for {} (type_traits_cpu has no vec_dot), and mul_mat would call a null kernel",
            t.name,
            t.ggml_type,
            t.ggml_type
        );
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
    // llama-vocab.cpp, the SPM tokenizer's resegment: text not in the vocabulary goes out as
    // byte tokens, `byte_to_token` -> `token_to_id.at("<0xXX>")`, or `.at` of the byte itself.
    // An out_of_range from `at` crosses llama_tokenize and aborts. Prompts are UTF-8, so every
    // byte UTF-8 text can hold (all but 0xC0, 0xC1, 0xF5..) may need its token.
    if g.get("tokenizer.ggml.model").and_then(Value::as_str) == Some("llama") {
        for b in (0..=255u8).filter(|b| !matches!(b, 0xC0 | 0xC1 | 0xF5..)) {
            let hex = format!("<0x{b:02X}>");
            // The byte itself is looked up as a C string: byte 0 as "".
            let plain = b.is_ascii().then(|| if b == 0 { String::new() } else { char::from(b).to_string() });
            if !seen.contains(hex.as_str()) && !plain.as_deref().is_some_and(|p| seen.contains(p)) {
                bail!(
                    "tokenizer.ggml.model is \"llama\" but byte {b:#04x} has no token ({hex:?} or the byte itself): llama.cpp's SPM tokenizer looks byte tokens up with unordered_map::at, which aborts"
                );
            }
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
        // Below 32 where every tensor still starts on 32 in the file: the buffers are aligned.
        for a in [8u32, 16, 32, 64, 4096, 1 << 20] {
            accepted(|g| {
                set(g, "general.alignment", Value::U32(a));
                g.alignment = u64::from(a);
            });
        }
    }

    fn retype(g: &mut Gguf, suffix: &str, ty: GgmlType) {
        let mut n = 0;
        for t in g.tensors.iter_mut().filter(|t| t.name.ends_with(suffix)) {
            t.ggml_type = ty;
            n += 1;
        }
        assert!(n > 0, "no tensor ends with {suffix}");
    }

    #[test]
    fn a_tensor_off_the_cpu_buffer_alignment_is_refused() {
        for a in [1u32, 16] {
            let e = refused(|g| {
                set(g, "general.alignment", Value::U32(a));
                g.alignment = u64::from(a);
                let t = g.tensors.iter_mut().find(|t| t.name == "blk.1.attn_k.weight").unwrap();
                t.offset += 16;
                t.rel_offset += 16;
            });
            assert!(e.contains(&format!("general.alignment is {a}: tensor `blk.1.attn_k.weight` starts at byte")), "{e}");
            assert!(e.contains("TENSOR_ALIGNMENT (32)"), "{e}");
        }
    }

    #[test]
    fn weights_the_cpu_cannot_multiply_are_refused() {
        for ty in [26u32, 24, 25, 27, 28, 9, 15] {
            let ty = GgmlType(ty);
            let e = refused(|g| retype(g, "blk.1.ffn_gate_inp.weight", ty));
            assert!(e.contains(&format!("tensor `blk.1.ffn_gate_inp.weight` is {ty}: ggml's CPU backend has no matrix product")), "{e}");
        }
        let e = refused(|g| retype(g, "blk.0.ffn_down_exps.weight", GgmlType(26)));
        assert!(e.contains("`blk.0.ffn_down_exps.weight` is I32"), "{e}");
        assert!(refused(|g| retype(g, "blk.2.attn_q.weight", GgmlType(28))).contains("`blk.2.attn_q.weight` is F64"));
        assert!(refused(|g| retype(g, "output.weight", GgmlType(15))).contains("`output.weight` is Q8_K"));
    }

    /// Every type ggml-cpu multiplies by, as llama.cpp writes or quantizes weights.
    #[test]
    fn weights_of_types_the_cpu_multiplies_are_accepted() {
        for ty in [0u32, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 20, 23, 29, 34, 35, 39] {
            let ty = GgmlType(ty);
            assert!(!NO_CPU_MATMUL.contains(&ty.name()), "{ty}");
            accepted(|g| {
                retype(g, "ffn_gate_inp.weight", ty);
                retype(g, "_exps.weight", ty);
                retype(g, "attn_q.weight", ty);
            });
        }
        // Not a matmul weight: the rule is about products, not every tensor.
        assert!(!is_matmul_weight("token_embd.weight") && !is_matmul_weight("blk.0.attn_norm.weight"));
        assert!(is_matmul_weight("blk.3.ffn_gate_inp_shexp.weight") && is_matmul_weight("blk.0.ffn_gate_up_exps.weight"));
    }

    fn byte_vocab(g: &mut Gguf, text: impl Fn(u8) -> String) {
        let Some(Value::Array(t)) = g.metadata.get_mut("tokenizer.ggml.tokens") else { panic!() };
        for b in 0..=255u8 {
            t[b as usize] = Value::Str(text(b));
        }
        set(g, "tokenizer.ggml.model", Value::Str("llama".into()));
    }

    #[test]
    fn an_spm_vocabulary_without_byte_tokens_is_refused() {
        // The forged GPT-2 byte vocabulary under the SPM tokenizer: byte 0 is "Ā", not "<0x00>".
        let e = refused(|g| set(g, "tokenizer.ggml.model", Value::Str("llama".into())));
        assert!(e.contains("tokenizer.ggml.model is \"llama\" but byte 0x00 has no token (\"<0x00>\""), "{e}");
        assert!(e.contains("unordered_map::at"), "{e}");
        let e = refused(|g| byte_vocab(g, |b| if b == 0xE2 { "x".into() } else { format!("<0x{b:02X}>") }));
        assert!(e.contains("byte 0xe2 has no token"), "{e}");
        // A byte above 0x7f has no one-byte token to fall back on.
        let e = refused(|g| byte_vocab(g, |b| if b == 0x80 { "€".into() } else { format!("<0x{b:02X}>") }));
        assert!(e.contains("byte 0x80"), "{e}");
    }

    #[test]
    fn an_spm_vocabulary_with_every_byte_is_accepted() {
        accepted(|g| byte_vocab(g, |b| format!("<0x{b:02X}>")));
        // Bytes no UTF-8 text holds are never looked up.
        accepted(|g| byte_vocab(g, |b| if matches!(b, 0xC0 | 0xC1 | 0xF5..) { format!("<unused {b}>") } else { format!("<0x{b:02X}>") }));
        // ASCII bytes as themselves (byte 0 as ""), the rest as <0xXX>.
        accepted(|g| {
            byte_vocab(g, |b| match b {
                0 => String::new(),
                1..=0x7f => char::from(b).to_string(),
                _ => format!("<0x{b:02X}>"),
            })
        });
        // The same GPT-2 vocabulary under its own tokenizer never looks byte tokens up with at.
        accepted(|g| set(g, "tokenizer.ggml.model", Value::Str("gpt2".into())));
    }

    /// Every family forge writes passes, with F16 routers and at other alignments too.
    #[test]
    fn every_forged_family_is_accepted() {
        use crate::forge::{forge_variant, Variant};
        let dir = tempfile::tempdir().unwrap();
        for arch in Arch::ALL {
            for (i, (alignment, f16_router)) in [(32, false), (64, true), (4096, false)].into_iter().enumerate() {
                let p = dir.path().join(format!("{}-{i}.gguf", arch.name()));
                let mut dims = Preset::Tiny.dims();
                dims.alignment = alignment;
                forge_variant(arch, dims, Variant { f16_router, ..Variant::default() }, 3, &p).unwrap();
                let g = Gguf::open(&p).unwrap();
                if let Err(e) = check(&g) {
                    panic!("forged {} (alignment {alignment}, f16 router {f16_router}) refused: {e}", arch.name());
                }
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
}
