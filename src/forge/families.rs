//! Each family's hyperparameters and tensors, as llama.cpp's loader for it (src/models/*.cpp)
//! creates them: exactly the tensors it asks for (an extra one fails the load), with shapes in
//! ggml order (ne[0] first).

use super::{Arch, Builder, Dims};
use crate::gguf::Value;
use anyhow::{bail, Result};

/// What a family needs of the dimensions beyond [`Dims::check`].
pub(super) fn check(arch: Arch, d: &Dims) -> Result<()> {
    let attention_is_embd = matches!(
        arch,
        Arch::Olmoe
            | Arch::Qwen2moe
            | Arch::Llama
            | Arch::Granitemoe
            | Arch::Grok
            | Arch::Dbrx
            | Arch::Arctic
            | Arch::Bailingmoe2
            | Arch::Phimoe
            | Arch::Jamba
            | Arch::Lfm2moe
            | Arch::Deepseek
    );
    if attention_is_embd && d.heads * d.head_dim != d.embd {
        bail!("--arch {}: attention must span the embedding (heads x {} = {})", arch.name(), d.head_dim, d.embd);
    }
    if matches!(arch, Arch::Qwen3next | Arch::Qwen35moe) && !d.heads.is_multiple_of(d.kv_heads) {
        bail!("--arch {}: the DeltaNet value heads must be a multiple of its key heads", arch.name());
    }
    let dense_lead = matches!(
        arch,
        Arch::Deepseek2
            | Arch::Glm4moe
            | Arch::Ernie45Moe
            | Arch::Dots1
            | Arch::Bailingmoe2
            | Arch::Afmoe
            | Arch::Deepseek32
            | Arch::GlmDsa
            | Arch::Mimo2
            | Arch::Step35
            | Arch::ExaoneMoe
            | Arch::Deepseek
            | Arch::Laguna
            | Arch::Cohere2moe
            | Arch::HyV3
            | Arch::KimiLinear
            | Arch::MinimaxM3
            | Arch::Dots3note
            | Arch::HyV4
    );
    if dense_lead && d.layers < 2 {
        bail!("--arch {}: a dense leading layer and at least one MoE layer need 2 layers", arch.name());
    }
    if arch == Arch::Lfm2moe && d.layers < 3 {
        bail!("--arch lfm2moe: a dense leading layer, a MoE and an attention layer need at least 3 layers");
    }
    if arch == Arch::Jamba && d.layers < 3 {
        bail!("--arch jamba: a Mamba-1, a MoE and an attention layer need at least 3 layers");
    }
    if arch == Arch::NemotronHMoe && d.layers < 3 {
        bail!("--arch nemotron_h_moe: a Mamba-2, a MoE and an attention layer need at least 3 layers");
    }
    if arch == Arch::Llama4 && d.layers < LLAMA4_MOE_STEP {
        bail!("--arch llama4: one MoE layer in every {LLAMA4_MOE_STEP} needs at least {LLAMA4_MOE_STEP} layers");
    }
    // 26 and 27 layers make llama.cpp read a deepseek2 file as DeepSeek-V2-Lite (no q_lora).
    if arch == Arch::Deepseek2 && matches!(d.layers, 26 | 27) {
        bail!("--arch deepseek2: 26 or 27 layers are read as V2-Lite by llama.cpp; choose another count");
    }
    if arch == Arch::Grovemoe && !d.experts.is_multiple_of(GROVEMOE_GROUP) {
        bail!("--arch grovemoe: groups of {GROVEMOE_GROUP} experts need an even expert count");
    }
    if matches!(arch, Arch::Deepseek2 | Arch::Deepseek32) {
        let g = DEEPSEEK2_GROUPS;
        if !d.experts.is_multiple_of(g) || d.experts / g < 2 || d.top_k > DEEPSEEK2_GROUPS_USED * (d.experts / g) {
            bail!(
                "--arch {}: {g} expert groups need a multiple of {g} experts, at least 2 a group, and top-k within {DEEPSEEK2_GROUPS_USED} groups",
                arch.name()
            );
        }
    }
    Ok(())
}

/// Nextn blocks: only where forge writes them, and no more than the trunk has layers (llama.cpp
/// asserts `n_layer_nextn <= n_layer`).
pub(super) fn check_mtp(arch: Arch, d: &Dims, mtp: u64) -> Result<()> {
    if mtp == 0 {
        return Ok(());
    }
    if !super::MTP_FAMILIES.contains(&arch) {
        let names: Vec<&str> = super::MTP_FAMILIES.iter().map(|a| a.name()).collect();
        bail!("--mtp-layers: forge writes nextn blocks for {} only, not {}", names.join(", "), arch.name());
    }
    if mtp > d.layers {
        bail!("--mtp-layers {mtp}: at most the trunk's {} layers", d.layers);
    }
    Ok(())
}

/// deepseek, bailingmoe and mistral3: standard attention keys, then each family's own.
fn hparams_standard_attention(arch: Arch, d: &Dims, b: &mut Builder) {
    if arch == Arch::Mistral3 {
        // Temperature tuning scales queries from the original context on: 16 tokens, so that
        // it bites within the prompts runs use.
        hp_standard(arch, d, b, d.expert_ff, 1_000_000.0);
        b.f32("attention.temperature_scale", 0.1).u32("rope.scaling.original_context_length", MISTRAL3_ORIGINAL_CONTEXT);
        return;
    }
    // Both converters write the routed experts' scale (1.0 in the published models) and two
    // shared experts; DeepSeek-MoE's first layer is dense.
    hp_standard(arch, d, b, 2 * d.expert_ff, 10_000.0);
    b.u32("expert_feed_forward_length", d.expert_ff).u32("expert_shared_count", 2).f32("expert_weights_scale", 1.0);
    if arch == Arch::Deepseek {
        b.u32("leading_dense_block_count", 1);
    } else {
        b.hp("expert_weights_norm", Value::Bool(true));
    }
}

/// mistral3's original context, past which its temperature tuning scales the queries.
const MISTRAL3_ORIGINAL_CONTEXT: u64 = 16;

/// llama4's `interleave_moe_layer_step`, Llama 4 Maverick's: layers 1, 3, 5, ... are MoE.
const LLAMA4_MOE_STEP: u64 = 2;

/// llama4: whether layer `l` is a MoE layer (the loader's `(i + 1) % step == 0`).
fn llama4_is_moe(l: u64) -> bool {
    (l + 1).is_multiple_of(LLAMA4_MOE_STEP)
}

/// dots1's shared experts (dots.llm1's): one shared MLP twice an expert's width.
const DOTS1_SHARED: u64 = 2;

/// deepseek2's expert groups: routing keeps the best 2 groups of 4.
const DEEPSEEK2_GROUPS: u64 = 4;
const DEEPSEEK2_GROUPS_USED: u64 = 2;
/// grovemoe's experts per group: each group shares one chunk expert.
const GROVEMOE_GROUP: u64 = 2;
/// The families' sliding window, shorter than the tests' prompts so that it masks.
const SLIDING_WINDOW: u64 = 32;

/// The keys deepseek32's and glm-dsa's lightning indexer attends each query to: fewer than the
/// tests' prompts, so that it chooses.
const INDEXER_TOP_K: u64 = 16;

/// deepseek2's MLA sizes: q and kv latent ranks, the rotary and non-rotary parts of a head.
struct Mla {
    q_lora: u64,
    kv_lora: u64,
    rope: u64,
    nope: u64,
}

impl Mla {
    fn of(d: &Dims) -> Mla {
        Mla { q_lora: d.embd / 2, kv_lora: d.embd / 2, rope: d.head_dim / 2, nope: d.head_dim / 2 }
    }
}

/// Heads of K and V: olmoe normalises K over the whole embedding and dots1's loader sizes K and
/// V by Q's heads, so they have as many as Q.
fn kv_heads(arch: Arch, d: &Dims) -> u64 {
    if matches!(arch, Arch::Olmoe | Arch::Dots1) {
        d.heads
    } else {
        d.kv_heads
    }
}

/// The hybrid families' full-attention interval: every 4th layer, and at least the last.
fn full_attention_interval(d: &Dims) -> u64 {
    d.layers.min(4)
}

/// gemma4 and maple: sliding-window layers, with every 4th and the last one full.
fn gemma4_is_swa(d: &Dims, l: u64) -> bool {
    !(l + 1).is_multiple_of(4) && l + 1 != d.layers
}

/// The DeltaNet sizes of qwen3next and qwen35moe: key heads (groups), value heads, head size.
struct DeltaNet {
    groups: u64,
    heads: u64,
    state: u64,
}

impl DeltaNet {
    fn of(d: &Dims) -> DeltaNet {
        DeltaNet { groups: d.kv_heads, heads: d.heads, state: d.head_dim }
    }
    fn value_dim(&self) -> u64 {
        self.state * self.heads
    }
    fn conv_dim(&self) -> u64 {
        2 * self.state * self.groups + self.value_dim()
    }
}

/// Every family's hyperparameter keys, in the order its forged file has always written them.
pub(super) fn hparams(arch: Arch, d: &Dims, b: &mut Builder) {
    match arch {
        Arch::Qwen3moe | Arch::Qwen3vlmoe | Arch::LladaMoe => {
            hp_common(d, b);
            b.u32("feed_forward_length", d.expert_ff).u32("expert_feed_forward_length", d.expert_ff);
            hp_experts(d, b);
            hp_attention(arch, d, b, 0);
            b.f32("rope.freq_base", 1_000_000.0);
            if arch == Arch::Qwen3vlmoe {
                // Qwen3-VL's sections (24, 20, 20 of 64) at this head's width, and its three
                // deepstack layers.
                let half = d.head_dim / 2;
                let hw = half * 5 / 16;
                let sections = [half - 2 * hw, hw, hw, 0].map(|x| Value::I32(x as i32)).to_vec();
                b.hp("rope.dimension_sections", Value::Array(sections)).u32("n_deepstack_layers", 3);
            }
        }
        Arch::Phimoe => {
            // Phi-3.5-MoE's experts take their width from feed_forward_length.
            hp_standard(arch, d, b, d.expert_ff, 10_000.0);
        }
        Arch::Qwen3next | Arch::Qwen35moe => hparams_deltanet(arch, d, b),
        Arch::Gemma4 => hparams_gemma4(arch, d, b),
        Arch::Olmoe | Arch::Llama | Arch::Qwen2moe | Arch::Granitemoe => hparams_classic(arch, d, b),
        Arch::Deepseek2 | Arch::Deepseek32 | Arch::GlmDsa => hparams_deepseek2(arch, d, b),
        Arch::GptOss => {
            hp_common(d, b);
            hp_attention(arch, d, b, d.head_dim);
            b.f32("rope.freq_base", 150_000.0).u32("attention.sliding_window", SLIDING_WINDOW);
            hp_experts(d, b);
            b.u32("expert_feed_forward_length", d.expert_ff);
        }
        Arch::Glm4moe | Arch::Bailingmoe2 => {
            // Half of each head rotates, as both converters write GLM-4.5's and Ling 2.0's.
            hp_common(d, b);
            b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
            hp_attention(arch, d, b, d.head_dim / 2);
            b.f32("rope.freq_base", if arch == Arch::Glm4moe { 1_000_000.0 } else { 600_000.0 });
            hp_experts(d, b);
            b.u32("expert_shared_count", 1)
                .u32("expert_feed_forward_length", d.expert_ff)
                .f32("expert_weights_scale", 2.5)
                .hp("expert_weights_norm", Value::Bool(true))
                .u32("expert_gating_func", 2);
            if arch == Arch::Bailingmoe2 {
                b.u32("expert_shared_feed_forward_length", d.expert_ff);
            }
        }
        Arch::Llama4 => {
            // No sliding_window key, as the published files: chunked attention, 3 chunked
            // layers to 1 full, and the full ones unrotated with temperature tuning.
            hp_standard(arch, d, b, 2 * d.expert_ff, 500_000.0);
            b.u32("expert_feed_forward_length", d.expert_ff).u32("interleave_moe_layer_step", LLAMA4_MOE_STEP);
        }
        Arch::MinimaxM2 => {
            // Its experts take their width from feed_forward_length; half of each head rotates.
            hp_common(d, b);
            b.u32("feed_forward_length", d.expert_ff).u32("expert_feed_forward_length", d.expert_ff);
            hp_attention(arch, d, b, d.head_dim / 2);
            b.f32("rope.freq_base", 5_000_000.0);
            hp_experts(d, b);
            b.u32("expert_gating_func", 2);
        }
        Arch::Ernie45Moe => {
            hp_standard(arch, d, b, 2 * d.expert_ff, 500_000.0);
            b.u32("expert_feed_forward_length", d.expert_ff)
                .u32("expert_shared_feed_forward_length", d.expert_ff)
                .u32("interleave_moe_layer_step", 1)
                .u32("leading_dense_block_count", 1);
        }
        Arch::Grok | Arch::Dbrx | Arch::Arctic | Arch::Dots1 | Arch::HunyuanMoe => hparams_more(arch, d, b),
        Arch::NemotronHMoe => hparams_nemotron_h(d, b),
        Arch::Jamba => hparams_jamba(d, b),
        Arch::Lfm2moe => {
            hp_common(d, b);
            b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1).u32("attention.head_count", d.heads);
            b.hp("attention.head_count_kv", kv_where(d, lfm2_attends)).f32("attention.layer_norm_rms_epsilon", 1e-5);
            b.f32("rope.freq_base", 1_000_000.0).u32("shortconv.l_cache", 3);
            hp_experts(d, b);
            b.u32("expert_feed_forward_length", d.expert_ff).u32("expert_gating_func", 2);
        }
        Arch::Mimo2 => hparams_mimo2(d, b),
        Arch::Step35 => hparams_step35(d, b),
        Arch::Smallthinker => {
            // A sliding_window key turns on its sliding layers (the loader sets the window to
            // 4096 whatever the key says) and leaves every 4th layer unrotated.
            hp_standard(arch, d, b, d.expert_ff, 1_500_000.0);
            b.u32("expert_feed_forward_length", d.expert_ff).u32("attention.sliding_window", 4096).u32("expert_gating_func", 1);
        }
        // Every 4th layer full (the loader's default pattern), the others sliding.
        Arch::ExaoneMoe => hparams_sliding_moe(arch, d, b, 1_000_000.0, 2.5),
        Arch::Afmoe => hparams_sliding_moe(arch, d, b, 10_000.0, 2.826),
        Arch::Laguna => {
            // Full layers at every 4th from the first (the loader's pattern); the sliding ones
            // rotate at a base of their own.
            hparams_sliding_moe(arch, d, b, 500_000.0, 2.5);
            b.f32("rope.freq_base_swa", 10_000.0).u32("expert_shared_feed_forward_length", d.expert_ff);
        }
        Arch::Grovemoe => {
            hp_standard(arch, d, b, d.expert_ff, 1_000_000.0);
            b.u32("expert_feed_forward_length", d.expert_ff)
                .u32("expert_chunk_feed_forward_length", d.expert_ff / 2)
                .f32("expert_group_scale", 0.05)
                .u32("experts_per_group", GROVEMOE_GROUP);
        }
        Arch::Deepseek | Arch::Bailingmoe | Arch::Mistral3 => hparams_standard_attention(arch, d, b),
        Arch::Mellum | Arch::Maple => hparams_mellum_maple(arch, d, b),
        Arch::Cohere2moe => hparams_cohere2moe(d, b),
        Arch::Granitehybrid => hparams_granite_hybrid(d, b),
        Arch::HyV3 => hparams_hy_v3(d, b),
        Arch::GraniteSwa => hparams_granite_swa(d, b),
        Arch::KimiLinear => hparams_kimi_linear(d, b),
        Arch::MinimaxM3 => hparams_minimax_m3(d, b),
        Arch::Dots3note => hparams_dots3note(d, b),
        Arch::HyV4 => hparams_hy_v4(d, b),
        Arch::Deepseek4 => hparams_deepseek4(d, b),
        Arch::Minimax01 => hparams_minimax01(d, b),
    }
}

/// minimax-01: partial rotary, the residuals' scale, the softmax layers' interval.
fn hparams_minimax01(d: &Dims, b: &mut Builder) {
    hp_common(d, b);
    b.u32("feed_forward_length", d.expert_ff);
    hp_attention(Arch::Minimax01, d, b, d.head_dim / 2);
    // MiniMax-Text-01's alpha, the scale of the normed input each residual carries.
    b.f32("rope.freq_base", 10_000_000.0).f32("residual_scale", 3.556_558_8);
    b.u32("full_attention_interval", minimax01_interval(d));
    hp_experts(d, b);
}

/// minimax-m3: minimax-m2's attention keys, the sparse attention's indexer, the experts'.
fn hparams_minimax_m3(d: &Dims, b: &mut Builder) {
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    hp_attention(Arch::MinimaxM3, d, b, d.head_dim / 2);
    b.f32("rope.freq_base", 5_000_000.0);
    // One indexer head per group of query heads (MSA's), as many as the KV heads. Blocks of
    // 16 keys, the 2 best and the query's own: a prompt of a few blocks already attends only
    // some of its keys.
    b.u32("attention.indexer.head_count", d.kv_heads)
        .u32("attention.indexer.key_length", d.head_dim)
        .u32("attention.indexer.top_k", 2)
        .u32("attention.indexer.block_size", 16)
        .u32("attention.indexer.local_blocks", 1);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff)
        .u32("expert_shared_count", 1)
        .f32("expert_weights_scale", 2.0)
        .hp("expert_weights_norm", Value::Bool(true))
        .u32("expert_gating_func", 2);
}

/// hy_v4: absorbed MLA, an indexer of its own in every layer, the hyper-connections' keys,
/// routed experts clamped.
fn hparams_hy_v4(d: &Dims, b: &mut Builder) {
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    hp_absorbed_mla(d, b);
    b.f32("attention.layer_norm_rms_epsilon", 1e-6)
        .u32("attention.indexer.head_count", d.heads)
        .u32("attention.indexer.key_length", d.head_dim)
        .u32("attention.indexer.top_k", INDEXER_TOP_K)
        .hp("attention.indexer.types", per_layer(d.layers, |_| 1));
    b.u32("rope.dimension_count", Mla::of(d).rope).f32("rope.freq_base", 10_000.0);
    b.u32("hyper_connection.count", HY_V4_STREAMS).f32("hyper_connection.epsilon", 1e-6).f32("hyper_connection.magnitude", 2.0);
    hp_normed_experts(d, b, 2.5, 2);
    b.f32("swiglu_clamp_exp", 7.0);
}

/// dots3note: deepseek2's absorbed MLA keys, the same geometry for the sliding layers (their
/// own keys, which may differ), and the indexer of the full layers.
fn hparams_dots3note(d: &Dims, b: &mut Builder) {
    let m = Mla::of(d);
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    hp_absorbed_mla(d, b);
    b.u32("attention.kv_lora_rank_swa", m.kv_lora)
        .u32("attention.key_length_mla_swa", m.nope + m.rope)
        .u32("attention.value_length_mla_swa", d.head_dim)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .u32("attention.sliding_window", SLIDING_WINDOW)
        .hp("attention.sliding_window_pattern", sliding_pattern(d.layers, |l| !every_4th_and_last(d, l)))
        .u32("attention.indexer.head_count", d.heads)
        .u32("attention.indexer.key_length", d.head_dim)
        .u32("attention.indexer.top_k", INDEXER_TOP_K)
        .hp("attention.indexer.types", per_layer(d.layers, |l| u64::from(every_4th_and_last(d, l))));
    b.u32("rope.dimension_count", m.rope).f32("rope.freq_base", 1_000_000.0).f32("rope.freq_base_swa", 10_000.0);
    hp_normed_experts(d, b, 2.5, 2);
}

/// The first layer's dense MLP, or the experts with a selection bias beside a shared expert.
fn dense_lead_or_biased_experts(b: &mut Builder, d: &Dims, l: u64) {
    if l == 0 {
        dense_mlp(b, d, l);
        return;
    }
    experts(b, d, l, d.expert_ff);
    b.std(format!("blk.{l}.exp_probs_b.bias"), &[d.experts], 0.01);
    shared_expert(b, d, l, d.expert_ff, false);
}

/// hy_v4's residual streams (its hyper-connections' count).
const HY_V4_STREAMS: u64 = 4;

/// The mixing of hy_v4's streams around a block (`attn` or `ffn`): a projection of the flat
/// streams to their pre and post weights, a base and a scale of each.
fn hyper_connection(b: &mut Builder, d: &Dims, l: u64, block: &str, mix: u64, scales: u64) {
    let hc = HY_V4_STREAMS;
    b.t(format!("blk.{l}.hc_{block}_fn.weight"), &[hc * d.embd, mix]);
    b.std(format!("blk.{l}.hc_{block}_base.weight"), &[mix], 0.1);
    b.t(format!("blk.{l}.hc_{block}_scale.weight"), &[scales]);
}

/// A hy_v4 layer: MLA with sinks and a gate, the indexer, the hyper-connections of attention
/// and MLP; a dense MLP (the first layer) or experts with a selection bias beside a shared one.
fn hy_v4_layer(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    mla_projections(b, d, l, false);
    b.std(n("attn_sinks"), &[d.heads], 0.5);
    b.t(n("attn_gate"), &[d.embd, d.heads * d.head_dim]);
    dsa_indexer(b, d, l);
    hyper_connection(b, d, l, "attn", 2 * HY_V4_STREAMS, 2);
    hyper_connection(b, d, l, "ffn", 2 * HY_V4_STREAMS, 2);
    b.t(n("ffn_norm"), &[d.embd]);
    dense_lead_or_biased_experts(b, d, l);
}

/// deepseek4: the KV head, compression by layer, grouped output projections, hyper-connections
/// mixed by Sinkhorn iterations, the token-id routing of the first layers, the experts'.
fn hparams_deepseek4(d: &Dims, b: &mut Builder) {
    let dk = Deepseek4::of(d);
    hp_common(d, b);
    b.u32("attention.head_count", d.heads)
        .u32("attention.head_count_kv", 1)
        .u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim)
        .u32("attention.q_lora_rank", dk.q_lora)
        .u32("attention.sliding_window", SLIDING_WINDOW)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .u32("attention.indexer.head_count", d.heads)
        .u32("attention.indexer.key_length", dk.indexer_dim)
        .u32("attention.indexer.top_k", INDEXER_TOP_K)
        .u32("attention.output_group_count", dk.out_groups)
        .u32("attention.output_lora_rank", dk.out_lora)
        .f32("attention.compress_rope_freq_base", 160_000.0)
        .hp("attention.compress_ratios", per_layer(d.layers, deepseek4_compression));
    b.u32("rope.dimension_count", d.head_dim / 2).f32("rope.freq_base", 10_000.0);
    b.u32("hyper_connection.count", HY_V4_STREAMS)
        .u32("hyper_connection.sinkhorn_iterations", 20)
        .f32("hyper_connection.epsilon", 1e-6)
        .u32("hash_layer_count", dk.hash_layers);
    hp_normed_experts(d, b, 1.5, 4);
    b.f32("swiglu_clamp_exp", 10.0);
}

/// The experts' keys beside one shared expert: their weights normalized and scaled by `scale`,
/// scored by `gating` (2: sigmoid, 4: sqrt-softplus).
fn hp_normed_experts(d: &Dims, b: &mut Builder, scale: f32, gating: u64) {
    hp_experts(d, b);
    b.u32("expert_shared_count", 1)
        .u32("expert_feed_forward_length", d.expert_ff)
        .f32("expert_weights_scale", scale)
        .hp("expert_weights_norm", Value::Bool(true))
        .u32("expert_gating_func", gating);
}

/// DeepSeek-V4's shapes beside the common ones.
struct Deepseek4 {
    q_lora: u64,
    /// The indexer's key width: wider than a head, as V4's (128 against 512) differs from it.
    /// Equal widths make the pin's KV cache force a rotation on its cache of no layers, whose
    /// search for a width never ends (a division by zero).
    indexer_dim: u64,
    out_groups: u64,
    out_lora: u64,
    /// The first layers, whose experts a table of the token's id chooses (V4-Flash's three,
    /// leaving at least one routed layer).
    hash_layers: u64,
}

impl Deepseek4 {
    fn of(d: &Dims) -> Deepseek4 {
        Deepseek4 {
            q_lora: d.embd / 2,
            indexer_dim: 2 * d.head_dim,
            out_groups: 2,
            out_lora: d.embd / 4,
            hash_layers: d.layers.saturating_sub(1).min(3),
        }
    }
}

/// A deepseek4 layer's key compression: none (the sliding window alone) in the first, then four
/// to one (with the indexer) and 128 to one in turn.
fn deepseek4_compression(l: u64) -> u64 {
    match l {
        0 => 0,
        _ if l % 2 == 1 => 4,
        _ => 128,
    }
}

/// A deepseek4 layer: attention with sinks over one KV head, its compressors (and the indexer
/// at four to one), the hyper-connections; experts chosen by token id or routed with a
/// selection bias, beside a shared one.
fn deepseek4_layer(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let (dk, hd) = (Deepseek4::of(d), d.head_dim);
    b.t(n("attn_norm"), &[d.embd]);
    b.std(n("attn_sinks"), &[d.heads], 0.5);
    b.t(n("attn_q_a"), &[d.embd, dk.q_lora]);
    b.t(n("attn_q_a_norm"), &[dk.q_lora]);
    b.t(n("attn_q_b"), &[dk.q_lora, d.heads * hd]);
    b.t(n("attn_kv"), &[d.embd, hd]);
    b.t(n("attn_kv_a_norm"), &[hd]);
    b.t(n("attn_output_a"), &[d.heads * hd / dk.out_groups, dk.out_lora * dk.out_groups]);
    b.t(n("attn_output_b"), &[dk.out_groups * dk.out_lora, d.embd]);
    let mix = (2 + HY_V4_STREAMS) * HY_V4_STREAMS;
    hyper_connection(b, d, l, "attn", mix, 3);
    hyper_connection(b, d, l, "ffn", mix, 3);
    let ratio = deepseek4_compression(l);
    if ratio != 0 {
        let width = if ratio == 4 { 2 * hd } else { hd };
        b.t(n("attn_compressor_kv"), &[d.embd, width]);
        b.t(n("attn_compressor_gate"), &[d.embd, width]);
        b.t(n("attn_compressor_ape"), &[width, ratio]);
        b.t(n("attn_compressor_norm"), &[hd]);
    }
    if ratio == 4 {
        b.t(n("indexer.proj"), &[d.embd, d.heads]);
        let id = dk.indexer_dim;
        b.t(n("indexer.attn_q_b"), &[dk.q_lora, d.heads * id]);
        b.t(n("indexer_compressor_kv"), &[d.embd, 2 * id]);
        b.t(n("indexer_compressor_gate"), &[d.embd, 2 * id]);
        b.t(n("indexer_compressor_ape"), &[2 * id, ratio]);
        b.t(n("indexer_compressor_norm"), &[id]);
    }
    b.t(n("ffn_norm"), &[d.embd]);
    experts(b, d, l, d.expert_ff);
    if l < dk.hash_layers {
        b.routes(n("ffn_gate_tid2eid"), &[d.top_k, d.vocab], d.experts);
    } else {
        b.std(format!("blk.{l}.exp_probs_b.bias"), &[d.experts], 0.01);
    }
    shared_expert(b, d, l, d.expert_ff, false);
}

/// A dots3note layer: MLA with a normed rotary key and a sigmoid gate per head, the indexer in
/// full layers; a dense MLP (the first layer) or experts with a selection bias beside a shared
/// one.
fn dots3note_layer(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    mla_projections(b, d, l, false);
    b.t(n("attn_k_norm"), &[Mla::of(d).rope]);
    b.t(n("attn_gate"), &[d.embd, d.heads]);
    b.t(n("ffn_norm"), &[d.embd]);
    if every_4th_and_last(d, l) {
        dsa_indexer(b, d, l);
    }
    dense_lead_or_biased_experts(b, d, l);
}

/// A minimax-m3 layer: attention with q/k norms, then a dense MLP (the first layer) or experts
/// with a selection bias beside a shared one, and the indexer of the layer's sparse attention.
fn minimax_m3_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    qk_normed_attention(b, d, l, q, kv);
    b.t(n("ffn_norm"), &[d.embd]);
    dense_lead_or_biased_experts(b, d, l);
    if l == 0 {
        return;
    }
    b.t(n("indexer.q_proj"), &[d.embd, d.kv_heads * d.head_dim]);
    b.t(n("indexer.k_proj"), &[d.embd, d.head_dim]);
    b.t(n("indexer.q_norm"), &[d.head_dim]);
    b.t(n("indexer.k_norm"), &[d.head_dim]);
}

/// minimax-01: softmax attention every 8th layer (MiniMax-Text-01's), and at least the last.
fn minimax01_interval(d: &Dims) -> u64 {
    d.layers.min(8)
}

/// A minimax-01 layer: softmax attention or lightning attention (Q, K and V from one
/// projection, a norm over its output and a sigmoid gate from the layer's input), then experts.
fn minimax01_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    if (l + 1).is_multiple_of(minimax01_interval(d)) {
        attention(b, d, l, q, kv);
    } else {
        b.t(n("attn_norm_2"), &[q]);
        b.t(n("attn_qkv"), &[d.embd, 3 * q]);
        b.t(n("attn_gate"), &[d.embd, q]);
        b.t(n("attn_output"), &[q, d.embd]);
    }
    b.t(n("ffn_norm"), &[d.embd]);
    experts(b, d, l, d.expert_ff);
}

/// Every 4th layer and the last: kimi-linear's MLA layers (Kimi-Linear-48B's 4th, 8th, ...,
/// 24th and 27th; KDA in the others) and dots3note's full ones.
fn every_4th_and_last(d: &Dims, l: u64) -> bool {
    (l + 1).is_multiple_of(4) || l + 1 == d.layers
}

/// kimi-linear: the loader tells KDA layers by their zero KV heads; MLA layers are absorbed,
/// one K head (the latent and its rotary part) whose latent is V too, as deepseek2's.
fn hparams_kimi_linear(d: &Dims, b: &mut Builder) {
    let m = Mla::of(d);
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    b.u32("attention.head_count", d.heads)
        .hp("attention.head_count_kv", per_layer(d.layers, |l| u64::from(every_4th_and_last(d, l))))
        .u32("attention.key_length", m.kv_lora + m.rope)
        .u32("attention.value_length", m.kv_lora)
        .u32("attention.key_length_mla", m.nope + m.rope)
        .u32("attention.value_length_mla", d.head_dim)
        .u32("attention.kv_lora_rank", m.kv_lora)
        .f32("attention.layer_norm_rms_epsilon", 1e-5);
    b.u32("rope.dimension_count", m.rope).f32("rope.freq_base", 10_000.0);
    b.u32("ssm.conv_kernel", 4).u32("kda.head_dim", d.head_dim);
    hp_experts(d, b);
    b.u32("expert_shared_count", 1)
        .u32("expert_feed_forward_length", d.expert_ff)
        .f32("expert_weights_scale", 2.446)
        .u32("expert_gating_func", 2);
}

/// A kimi-linear layer: MLA without query compression, or KDA (Q, K and V each through a
/// short convolution, a per-channel decay from a low-rank projection, a sigmoid beta, an
/// output gate from another); then a dense MLP (the first layer) or experts beside a shared
/// one with a selection bias.
fn kimi_linear_layer(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    if every_4th_and_last(d, l) {
        let m = Mla::of(d);
        b.t(n("attn_kv_a_norm"), &[m.kv_lora]);
        b.t(n("attn_q"), &[d.embd, d.heads * (m.nope + m.rope)]);
        b.t(n("attn_kv_a_mqa"), &[d.embd, m.kv_lora + m.rope]);
        b.t(n("attn_k_b"), &[m.nope, m.kv_lora, d.heads]);
        b.t(n("attn_v_b"), &[m.kv_lora, d.head_dim, d.heads]);
        b.t(n("attn_output"), &[d.heads * d.head_dim, d.embd]);
    } else {
        let (head, inner) = (d.head_dim, d.heads * d.head_dim);
        for x in ["q", "k", "v"] {
            b.t(n(&format!("ssm_conv1d_{x}")), &[4, 1, inner]);
            b.t(n(&format!("attn_{x}")), &[d.embd, inner]);
        }
        b.t(n("ssm_f_a"), &[d.embd, head]);
        b.t(n("ssm_f_b"), &[head, inner]);
        b.t(n("ssm_beta"), &[d.embd, d.heads]);
        // A = -exp(A_log), as the converter stores it: a decay, negative for the state to
        // stay bounded.
        b.between(format!("blk.{l}.ssm_a"), &[1, d.heads], -16.0, -1.0);
        b.std(format!("blk.{l}.ssm_dt.bias"), &[inner], 0.1);
        b.t(n("ssm_g_a"), &[d.embd, head]);
        b.t(n("ssm_g_b"), &[head, inner]);
        b.t(n("ssm_norm"), &[head]);
        b.t(n("attn_output"), &[inner, d.embd]);
    }
    b.t(n("ffn_norm"), &[d.embd]);
    dense_lead_or_biased_experts(b, d, l);
}

/// granite_swa: Granite-MoE's keys, a shared expert as wide as a routed one, and the sliding
/// layers as gemma4's (every 4th and the last full).
fn hparams_granite_swa(d: &Dims, b: &mut Builder) {
    hp_standard(Arch::GraniteSwa, d, b, d.expert_ff, 10_000.0);
    granite_scales(b, 0.015625);
    b.u32("expert_shared_feed_forward_length", d.expert_ff).u32("attention.sliding_window", SLIDING_WINDOW);
    b.hp("attention.sliding_window_pattern", sliding_pattern(d.layers, |l| gemma4_is_swa(d, l)));
}

/// Granite's multipliers of the embedding, each residual branch, attention and the logits.
fn granite_scales(b: &mut Builder, attention_scale: f32) {
    b.f32("embedding_scale", 12.0).f32("residual_scale", 0.22).f32("attention.scale", attention_scale).f32("logit_scale", 6.0);
}

/// hy_v3: a dense leading layer twice an expert wide; no gating function is written (the
/// loader's default for the family is sigmoid); normalized routing weights, scaled.
fn hparams_hy_v3(d: &Dims, b: &mut Builder) {
    hp_standard(Arch::HyV3, d, b, 2 * d.expert_ff, 10_000.0);
    b.u32("expert_feed_forward_length", d.expert_ff)
        .u32("expert_shared_feed_forward_length", d.expert_ff)
        .hp("expert_weights_norm", Value::Bool(true))
        .f32("expert_weights_scale", 2.5);
}

/// granitehybrid (Granite 4.0-H): the loader tells a Mamba-2 layer by its zero KV heads; the
/// experts are `feed_forward_length` wide; Granite's multipliers; no rotary positions
/// (`rope.scaling.finetuned` false, as the published models' converter writes it).
fn hparams_granite_hybrid(d: &Dims, b: &mut Builder) {
    let m = Mamba2::of(d);
    hp_common(d, b);
    b.u32("feed_forward_length", d.expert_ff).u32("attention.head_count", d.heads);
    b.hp("attention.head_count_kv", kv_where(d, granite_attends));
    b.u32("attention.key_length", d.head_dim).u32("attention.value_length", d.head_dim).f32("attention.layer_norm_rms_epsilon", 1e-5);
    m.keys(b);
    hp_experts(d, b);
    b.u32("expert_shared_feed_forward_length", 2 * d.expert_ff);
    granite_scales(b, 0.0078125);
    b.hp("rope.scaling.finetuned", Value::Bool(false));
}

/// granitehybrid: attention at every 4th layer from the second, Mamba-2 elsewhere.
fn granite_attends(l: u64) -> bool {
    l % 4 == 1
}

/// cohere2moe: LayerNorm (the loader picks it where no RMS epsilon is written), full layers at
/// every 4th from the first (the loader's pattern), a dense leading layer, sigmoid routing with
/// normalized weights beside one shared expert, and a logit scale.
fn hparams_cohere2moe(d: &Dims, b: &mut Builder) {
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    b.u32("attention.head_count", d.heads)
        .u32("attention.head_count_kv", d.kv_heads)
        .u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim)
        .f32("attention.layer_norm_epsilon", 1e-5);
    b.f32("rope.freq_base", 50_000.0).u32("attention.sliding_window", SLIDING_WINDOW).f32("logit_scale", 0.25);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff)
        .u32("expert_shared_count", 1)
        .u32("expert_gating_func", 2)
        .hp("expert_weights_norm", Value::Bool(true));
}

/// mellum and maple: q/k-normed attention with sliding-window layers, softmax routing.
fn hparams_mellum_maple(arch: Arch, d: &Dims, b: &mut Builder) {
    hp_standard(arch, d, b, d.expert_ff, if arch == Arch::Mellum { 500_000.0 } else { 1_000_000.0 });
    b.u32("expert_feed_forward_length", d.expert_ff).u32("attention.sliding_window", SLIDING_WINDOW);
    if arch == Arch::Mellum {
        // The key turns on the sliding layers; the loader's default pattern leaves every 4th
        // layer full.
        return;
    }
    b.hp("attention.sliding_window_pattern", sliding_pattern(d.layers, |l| gemma4_is_swa(d, l)));
    // A limit of its own in each layer, low enough that forged activations reach it.
    let limits = (0..d.layers).map(|l| Value::F32(0.25 * (1 + l % 3) as f32)).collect();
    b.hp("swiglu_clamp_exp", Value::Array(limits));
}

/// afmoe and exaone-moe: a dense leading layer, sliding-window layers, sigmoid routing with
/// normalized and scaled weights beside one shared expert.
fn hparams_sliding_moe(arch: Arch, d: &Dims, b: &mut Builder, freq_base: f32, weights_scale: f32) {
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    hp_attention(arch, d, b, d.head_dim);
    b.f32("rope.freq_base", freq_base).u32("attention.sliding_window", SLIDING_WINDOW);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff)
        .u32("expert_shared_count", 1)
        .u32("expert_gating_func", 2)
        .f32("expert_weights_scale", weights_scale)
        .hp("expert_weights_norm", Value::Bool(true));
}

/// What a nemotron_h_moe layer is: every 4th from the first a Mamba-2 layer, every 4th from
/// the third an attention layer, the others MoE (Nemotron 3's interleaving, compressed).
#[derive(PartialEq)]
enum NemotronLayer {
    Mamba,
    Moe,
    Attention,
}

fn nemotron_layer(l: u64) -> NemotronLayer {
    match l % 4 {
        0 => NemotronLayer::Mamba,
        2 => NemotronLayer::Attention,
        _ => NemotronLayer::Moe,
    }
}

/// The Mamba-2 sizes of nemotron_h_moe: inner width, state size, heads, groups.
struct Mamba2 {
    inner: u64,
    state: u64,
    heads: u64,
    groups: u64,
}

impl Mamba2 {
    fn of(d: &Dims) -> Mamba2 {
        let inner = 2 * d.embd;
        Mamba2 { inner, state: 128, heads: inner / d.head_dim, groups: 2 }
    }
    /// The mixer's `ssm.*` keys.
    fn keys(&self, b: &mut Builder) {
        b.u32("ssm.conv_kernel", 4)
            .u32("ssm.inner_size", self.inner)
            .u32("ssm.state_size", self.state)
            .u32("ssm.time_step_rank", self.heads)
            .u32("ssm.group_count", self.groups);
    }
    /// The convolved x, B and C.
    fn conv_dim(&self) -> u64 {
        self.inner + 2 * self.groups * self.state
    }
}

/// A key of one value for each of `layers` layers, `f` of the layer's index (a loader reading one
/// per layer wants one per block, nextn blocks included).
fn per_layer(layers: u64, f: impl Fn(u64) -> u64) -> Value {
    Value::Array((0..layers).map(|l| Value::U32(f(l) as u32)).collect())
}

/// `attention.sliding_window_pattern`: for each of `layers` layers, whether it attends to a
/// sliding window.
fn sliding_pattern(layers: u64, is_swa: impl Fn(u64) -> bool) -> Value {
    Value::Array((0..layers).map(|l| Value::Bool(is_swa(l))).collect())
}

/// `head_count_kv` per layer for hybrids whose loaders tell an attention layer by its KV heads
/// (the others have none).
fn kv_where(d: &Dims, attends: impl Fn(u64) -> bool) -> Value {
    per_layer(d.layers, |l| if attends(l) { d.kv_heads } else { 0 })
}

/// Nemotron-H MoE: the loader tells a layer's kind by its feed-forward width and KV heads, each
/// one value per layer (a Mamba-2 layer has neither, an attention layer no feed-forward).
fn hparams_nemotron_h(d: &Dims, b: &mut Builder) {
    let m = Mamba2::of(d);
    hp_common(d, b);
    b.hp("feed_forward_length", per_layer(d.layers, |l| if nemotron_layer(l) == NemotronLayer::Moe { d.expert_ff } else { 0 }));
    b.u32("attention.head_count", d.heads);
    b.hp("attention.head_count_kv", kv_where(d, |l| nemotron_layer(l) == NemotronLayer::Attention));
    b.u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim)
        .f32("attention.layer_norm_epsilon", 1e-5)
        .f32("attention.layer_norm_rms_epsilon", 1e-5);
    m.keys(b);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff)
        .u32("expert_shared_feed_forward_length", 2 * d.expert_ff)
        .hp("expert_weights_norm", Value::Bool(true))
        .f32("expert_weights_scale", 2.5);
}

/// grok, dbrx, arctic, dots1 and hunyuan-moe.
fn hparams_more(arch: Arch, d: &Dims, b: &mut Builder) {
    match arch {
        Arch::Grok => {
            // Grok-2's layout: experts of their own width beside the dense MLP. The scales are
            // written for this width, not left to the loader's Grok-1 defaults.
            hp_standard(arch, d, b, 2 * d.expert_ff, 10_000.0);
            b.u32("expert_feed_forward_length", d.expert_ff)
                .f32("embedding_scale", (d.embd as f32).sqrt())
                .f32("logit_scale", 0.5)
                .f32("attention.output_scale", 1.0 / (d.head_dim as f32).sqrt())
                .f32("attn_logit_softcapping", 30.0)
                .f32("router_logit_softcapping", 30.0)
                .f32("final_logit_softcapping", 50.0);
        }
        Arch::Dbrx => {
            hp_common(d, b);
            b.u32("feed_forward_length", d.expert_ff)
                .u32("attention.head_count", d.heads)
                .u32("attention.head_count_kv", d.kv_heads)
                .f32("attention.layer_norm_epsilon", 1e-5)
                .f32("attention.clamp_kqv", 8.0)
                .f32("rope.freq_base", 500_000.0);
            hp_experts(d, b);
        }
        Arch::Arctic => hp_standard(arch, d, b, d.expert_ff, 10_000.0),
        Arch::Dots1 => {
            hp_common(d, b);
            b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
            hp_attention(arch, d, b, d.head_dim);
            b.f32("rope.freq_base", 10_000.0);
            hp_experts(d, b);
            b.u32("expert_shared_count", DOTS1_SHARED)
                .u32("expert_feed_forward_length", d.expert_ff)
                .f32("expert_weights_scale", 2.5)
                .hp("expert_weights_norm", Value::Bool(true))
                .u32("expert_gating_func", 2);
        }
        _ => {
            // hunyuan-moe: its experts take their width from feed_forward_length.
            hp_standard(arch, d, b, d.expert_ff, 10_000.0);
            b.u32("expert_feed_forward_length", d.expert_ff).u32("expert_shared_feed_forward_length", d.expert_ff);
        }
    }
}

/// The keys most families write in this order: the common ones, the dense feed-forward width
/// `ff`, fully rotary attention, the rotary base, the expert counts.
fn hp_standard(arch: Arch, d: &Dims, b: &mut Builder, ff: u64, freq_base: f32) {
    hp_common(d, b);
    b.u32("feed_forward_length", ff);
    hp_attention(arch, d, b, d.head_dim);
    b.f32("rope.freq_base", freq_base);
    hp_experts(d, b);
}

/// `block_count` counts the nextn blocks too (llama.cpp's `n_layer_all`).
fn hp_common(d: &Dims, b: &mut Builder) {
    let mtp = b.variant.mtp_layers;
    b.u32("context_length", d.context).u32("embedding_length", d.embd).u32("block_count", d.layers + mtp);
    if mtp > 0 {
        b.u32("nextn_predict_layers", mtp);
    }
}

/// Standard multi-head attention keys; `rot` rotary dimensions (0: the key is left out).
fn hp_attention(arch: Arch, d: &Dims, b: &mut Builder, rot: u64) {
    b.u32("attention.head_count", d.heads)
        .u32("attention.head_count_kv", kv_heads(arch, d))
        .u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim);
    if rot != 0 {
        b.u32("rope.dimension_count", rot);
    }
    b.f32("attention.layer_norm_rms_epsilon", 1e-6);
}

fn hp_experts(d: &Dims, b: &mut Builder) {
    b.u32("expert_count", d.experts).u32("expert_used_count", d.top_k);
}

/// Qwen3-Next and Qwen3.5-MoE: gated DeltaNet layers between full-attention ones.
fn hparams_deltanet(arch: Arch, d: &Dims, b: &mut Builder) {
    let dn = DeltaNet::of(d);
    // Partial rotary, as the published models (a quarter of each head).
    let rot = d.head_dim / 4;
    hp_common(d, b);
    hp_attention(arch, d, b, rot);
    b.f32("rope.freq_base", 10_000_000.0);
    if arch == Arch::Qwen35moe {
        // Interleaved M-RoPE sections (t, h, w, e), half the rotary dimensions in all.
        let half = rot / 2;
        let s = half * 3 / 8;
        let sections = [s, s, half - 2 * s, 0].map(|x| Value::I32(x as i32)).to_vec();
        b.hp("rope.dimension_sections", Value::Array(sections));
    }
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff).u32("expert_shared_feed_forward_length", 2 * d.expert_ff);
    b.u32("ssm.conv_kernel", 4)
        .u32("ssm.inner_size", dn.value_dim())
        .u32("ssm.state_size", dn.state)
        .u32("ssm.time_step_rank", dn.heads)
        .u32("ssm.group_count", dn.groups)
        .u32("full_attention_interval", full_attention_interval(d));
}

/// Gemma 4: sliding-window layers in a pattern, softcapped logits.
fn hparams_gemma4(arch: Arch, d: &Dims, b: &mut Builder) {
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("embedding_length_per_layer_input", 0);
    b.u32("attention.head_count", d.heads)
        .u32("attention.head_count_kv", kv_heads(arch, d))
        .u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim)
        .u32("attention.key_length_swa", d.head_dim)
        .u32("attention.value_length_swa", d.head_dim)
        .u32("attention.sliding_window", SLIDING_WINDOW);
    b.hp("attention.sliding_window_pattern", sliding_pattern(d.layers, |l| gemma4_is_swa(d, l)));
    b.f32("attention.layer_norm_rms_epsilon", 1e-6)
        .f32("rope.freq_base", 1_000_000.0)
        .f32("rope.freq_base_swa", 10_000.0)
        .f32("final_logit_softcapping", 30.0);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff);
}

/// OLMoE, Llama, Qwen2-MoE and Granite-MoE: full rotary attention, each with
/// its own few extra keys.
fn hparams_classic(arch: Arch, d: &Dims, b: &mut Builder) {
    hp_standard(arch, d, b, d.expert_ff, 10_000.0);
    match arch {
        Arch::Llama => {
            b.u32("vocab_size", d.vocab);
        }
        Arch::Qwen2moe => {
            b.u32("expert_feed_forward_length", d.expert_ff).u32("expert_shared_feed_forward_length", d.expert_ff);
        }
        Arch::Granitemoe => {
            granite_scales(b, 0.015625);
            b.u32("expert_shared_feed_forward_length", d.expert_ff);
        }
        _ => {}
    }
}

/// Absorbed MLA is multi-query over the latent: one K/V head, K the latent and its rotary
/// part, V the latent.
fn hp_absorbed_mla(d: &Dims, b: &mut Builder) {
    let m = Mla::of(d);
    b.u32("attention.head_count", d.heads)
        .u32("attention.head_count_kv", 1)
        .u32("attention.key_length", m.kv_lora + m.rope)
        .u32("attention.value_length", m.kv_lora)
        .u32("attention.key_length_mla", m.nope + m.rope)
        .u32("attention.value_length_mla", d.head_dim)
        .u32("attention.q_lora_rank", m.q_lora)
        .u32("attention.kv_lora_rank", m.kv_lora);
}

/// DeepSeek-V2: absorbed MLA, a leading dense block, grouped expert selection. DeepSeek-V3.2
/// adds its lightning indexer (as many heads as attention, each a head wide); GLM-5 too, and
/// routes without groups.
fn hparams_deepseek2(arch: Arch, d: &Dims, b: &mut Builder) {
    let m = Mla::of(d);
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("leading_dense_block_count", 1);
    hp_absorbed_mla(d, b);
    b.f32("attention.layer_norm_rms_epsilon", 1e-6);
    if arch != Arch::Deepseek2 {
        b.u32("attention.indexer.head_count", d.heads)
            .u32("attention.indexer.key_length", d.head_dim)
            .u32("attention.indexer.top_k", INDEXER_TOP_K);
    }
    b.u32("rope.dimension_count", m.rope).f32("rope.freq_base", 10_000.0);
    hp_experts(d, b);
    b.u32("expert_shared_count", 1).u32("expert_feed_forward_length", d.expert_ff);
    if arch != Arch::GlmDsa {
        b.u32("expert_group_count", DEEPSEEK2_GROUPS).u32("expert_group_used_count", DEEPSEEK2_GROUPS_USED);
    }
    b.f32("expert_weights_scale", 2.5).hp("expert_weights_norm", Value::Bool(true)).u32("expert_gating_func", 2);
}

pub(super) fn tensors(arch: Arch, d: &Dims, b: &mut Builder) {
    // LFM2's converters store the output norm under this name, and its loader reads it so.
    b.head(d, if arch == Arch::Lfm2moe { "token_embd_norm" } else { "output_norm" });
    globals(arch, d, b);
    let (q, kv) = (d.heads * d.head_dim, kv_heads(arch, d) * d.head_dim);
    for l in 0..d.layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        match arch {
            Arch::Qwen3moe | Arch::Qwen3vlmoe | Arch::LladaMoe | Arch::Maple | Arch::Mellum => {
                qk_normed_attention(b, d, l, q, kv);
                b.t(n("ffn_norm"), &[d.embd]);
                experts(b, d, l, d.expert_ff);
            }
            Arch::Qwen3next | Arch::Qwen35moe => {
                b.t(n("attn_norm"), &[d.embd]);
                b.t(n("post_attention_norm"), &[d.embd]);
                if (l + 1) % full_attention_interval(d) != 0 {
                    delta_net(arch, b, d, l);
                } else {
                    // Gated attention: the query projection holds query and gate.
                    b.t(n("attn_q"), &[d.embd, 2 * q]);
                    b.t(n("attn_k"), &[d.embd, kv]);
                    b.t(n("attn_v"), &[d.embd, kv]);
                    b.t(n("attn_output"), &[q, d.embd]);
                    b.t(n("attn_q_norm"), &[d.head_dim]);
                    b.t(n("attn_k_norm"), &[d.head_dim]);
                }
                experts(b, d, l, d.expert_ff);
                shared_expert(b, d, l, 2 * d.expert_ff, true);
            }
            Arch::Gemma4 => {
                qk_normed_attention(b, d, l, q, kv);
                b.t(n("post_attention_norm"), &[d.embd]);
                b.t(n("layer_output_scale"), &[1]);
                b.t(n("ffn_norm"), &[d.embd]);
                let ff = 2 * d.expert_ff;
                b.t(n("ffn_gate"), &[d.embd, ff]);
                b.t(n("ffn_up"), &[d.embd, ff]);
                b.t(n("ffn_down"), &[ff, d.embd]);
                b.t(n("post_ffw_norm"), &[d.embd]);
                b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
                b.t(format!("blk.{l}.ffn_gate_inp.scale"), &[d.embd]);
                b.t(n("pre_ffw_norm_2"), &[d.embd]);
                b.t(n("post_ffw_norm_1"), &[d.embd]);
                b.t(n("post_ffw_norm_2"), &[d.embd]);
                b.t(n("ffn_gate_up_exps"), &[d.embd, 2 * d.expert_ff, d.experts]);
                b.t(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts]);
                // Scales that differ from expert to expert: one read under a slot id instead
                // of the expert id changes the output.
                b.between(format!("blk.{l}.ffn_down_exps.scale"), &[d.experts], 0.5, 1.5);
            }
            Arch::Olmoe | Arch::Llama | Arch::Qwen2moe | Arch::Granitemoe | Arch::Mistral3 => classic_layer(arch, b, d, l, q, kv),
            Arch::Deepseek2 | Arch::Deepseek32 | Arch::GlmDsa => {
                mla_attention(arch, b, d, l, false);
                sparse_or_dense(b, d, l, true);
            }
            Arch::GptOss => {
                let bias = |b: &mut Builder, s: &str, dims: &[u64]| b.std(format!("blk.{l}.{s}.bias"), dims, 0.02);
                b.t(n("attn_norm"), &[d.embd]);
                biased_attention(b, d, l, q, kv, true);
                b.std(n("attn_sinks"), &[d.heads], 0.1);
                b.t(n("post_attention_norm"), &[d.embd]);
                b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
                bias(b, "ffn_gate_inp", &[d.experts]);
                // Per-expert biases, indexed by the original expert ids (ggml_add_id).
                b.t(n("ffn_gate_exps"), &[d.embd, d.expert_ff, d.experts]);
                bias(b, "ffn_gate_exps", &[d.expert_ff, d.experts]);
                b.t(n("ffn_up_exps"), &[d.embd, d.expert_ff, d.experts]);
                bias(b, "ffn_up_exps", &[d.expert_ff, d.experts]);
                b.t(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts]);
                bias(b, "ffn_down_exps", &[d.embd, d.experts]);
            }
            Arch::Glm4moe => {
                b.t(n("attn_norm"), &[d.embd]);
                biased_attention(b, d, l, q, kv, false);
                b.t(n("post_attention_norm"), &[d.embd]);
                sparse_or_dense(b, d, l, true);
            }
            Arch::Llama4 | Arch::MinimaxM2 | Arch::Ernie45Moe => norm_attention_moe(arch, b, d, l, q, kv),
            Arch::Grok | Arch::Dbrx | Arch::Arctic | Arch::Dots1 | Arch::HunyuanMoe => layer_more(arch, b, d, l, q, kv),
            Arch::NemotronHMoe => nemotron_h_layer(b, d, l, q, kv),
            Arch::Bailingmoe2 => bailing_layer(b, d, l, q, kv),
            Arch::Phimoe => phimoe_layer(b, d, l, q, kv),
            Arch::Jamba => jamba_layer(b, d, l, q, kv),
            Arch::Afmoe => afmoe_layer(b, d, l, q, kv),
            Arch::Lfm2moe => lfm2_layer(b, d, l, q, kv),
            Arch::Mimo2 => mimo2_layer(b, d, l),
            Arch::Step35 => step35_layer(b, d, l, kv),
            Arch::Smallthinker => {
                b.t(n("attn_norm"), &[d.embd]);
                attention(b, d, l, q, kv);
                b.t(n("ffn_norm"), &[d.embd]);
                experts(b, d, l, d.expert_ff);
            }
            Arch::Grovemoe => grovemoe_layer(b, d, l, q, kv),
            Arch::ExaoneMoe | Arch::Laguna | Arch::HyV3 => {
                qk_normed_attention(b, d, l, q, kv);
                if arch == Arch::Laguna {
                    // One gate a head (Laguna-XS.2's), from the attention's input.
                    b.t(n("attn_gate"), &[d.embd, d.heads]);
                }
                b.t(n("ffn_norm"), &[d.embd]);
                sparse_or_dense(b, d, l, true);
            }
            Arch::Deepseek | Arch::Bailingmoe => two_shared_layer(arch, b, d, l, q, kv),
            Arch::Cohere2moe => cohere2moe_layer(b, d, l, q, kv),
            Arch::Granitehybrid => granite_hybrid_layer(b, d, l, q, kv),
            Arch::GraniteSwa => granite_swa_layer(b, d, l, q, kv),
            Arch::KimiLinear => kimi_linear_layer(b, d, l),
            Arch::Minimax01 => minimax01_layer(b, d, l, q, kv),
            Arch::MinimaxM3 => minimax_m3_layer(b, d, l, q, kv),
            Arch::Dots3note => dots3note_layer(b, d, l),
            Arch::HyV4 => hy_v4_layer(b, d, l),
            Arch::Deepseek4 => deepseek4_layer(b, d, l),
        }
    }
    nextn_blocks(arch, b, d, q, kv);
}

/// cohere2moe: one norm before attention and the MLP, which run side by side; the first layer's
/// MLP is dense, the others' are experts beside a shared one.
fn cohere2moe_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    attention(b, d, l, q, kv);
    if l == 0 {
        dense_mlp(b, d, l);
        return;
    }
    experts(b, d, l, d.expert_ff);
    shared_expert(b, d, l, d.expert_ff, false);
}

/// grovemoe: qwen3moe's layer with the chunk experts beside the experts, one a group, half as
/// wide.
fn grovemoe_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    qk_normed_attention(b, d, l, q, kv);
    b.t(n("ffn_norm"), &[d.embd]);
    experts(b, d, l, d.expert_ff);
    let (ff, chunks) = (d.expert_ff / 2, d.experts / GROVEMOE_GROUP);
    b.t(n("ffn_gate_chexps"), &[d.embd, ff, chunks]);
    b.t(n("ffn_up_chexps"), &[d.embd, ff, chunks]);
    b.t(n("ffn_down_chexps"), &[ff, d.embd, chunks]);
}

/// deepseek and bailingmoe: standard attention, then experts beside two shared ones (stored as
/// one twice as wide); DeepSeek-MoE's first layer is dense.
fn two_shared_layer(arch: Arch, b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    attention(b, d, l, q, kv);
    b.t(n("ffn_norm"), &[d.embd]);
    if arch == Arch::Deepseek && l == 0 {
        dense_mlp(b, d, l);
    } else {
        experts(b, d, l, d.expert_ff);
        shared_expert(b, d, l, 2 * d.expert_ff, false);
    }
}

/// jamba: every 4th layer from the third attends (Jamba's one in 8, compressed), the others are
/// Mamba-1 layers; every second layer from the second is MoE (Jamba's `expert_layer_period`).
fn jamba_attends(l: u64) -> bool {
    l % 4 == 2
}

/// The Mamba-1 sizes of jamba: inner width (twice the embedding, the only expansion llama.cpp
/// takes), state size, the time step's rank.
fn jamba_ssm(d: &Dims) -> (u64, u64, u64) {
    (2 * d.embd, 16, d.embd.div_ceil(16))
}

/// Jamba: the loader tells an attention layer by its KV heads, one value per layer.
fn hparams_jamba(d: &Dims, b: &mut Builder) {
    let (inner, state, rank) = jamba_ssm(d);
    hp_common(d, b);
    b.u32("feed_forward_length", d.expert_ff).u32("attention.head_count", d.heads);
    b.hp("attention.head_count_kv", kv_where(d, jamba_attends)).f32("attention.layer_norm_rms_epsilon", 1e-6);
    b.u32("ssm.conv_kernel", 4).u32("ssm.inner_size", inner).u32("ssm.state_size", state).u32("ssm.time_step_rank", rank);
    hp_experts(d, b);
}

/// A jamba layer: a Mamba-1 mixer or attention, then experts or a dense MLP.
fn jamba_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let (inner, state, rank) = jamba_ssm(d);
    b.t(n("attn_norm"), &[d.embd]);
    if jamba_attends(l) {
        attention(b, d, l, q, kv);
    } else {
        b.t(n("ssm_in"), &[d.embd, 2 * inner]);
        b.t(n("ssm_conv1d"), &[4, inner]);
        b.std(format!("blk.{l}.ssm_conv1d.bias"), &[inner], 0.1);
        b.t(n("ssm_x"), &[inner, rank + 2 * state]);
        b.t(n("ssm_dt_norm"), &[rank]);
        b.t(n("ssm_dt"), &[rank, inner]);
        b.std(format!("blk.{l}.ssm_dt.bias"), &[inner], 0.1);
        b.t(n("ssm_b_norm"), &[state]);
        b.t(n("ssm_c_norm"), &[state]);
        // A = -exp(A_log): a decay, negative for the state to stay bounded.
        b.between(format!("blk.{l}.ssm_a"), &[state, inner], -4.0, -0.5);
        b.between(format!("blk.{l}.ssm_d"), &[inner], 0.5, 1.5);
        b.t(n("ssm_out"), &[inner, d.embd]);
    }
    b.t(n("ffn_norm"), &[d.embd]);
    if l % 2 == 1 {
        experts(b, d, l, d.expert_ff);
    } else {
        b.t(n("ffn_gate"), &[d.embd, d.expert_ff]);
        b.t(n("ffn_up"), &[d.embd, d.expert_ff]);
        b.t(n("ffn_down"), &[d.expert_ff, d.embd]);
    }
}

/// An afmoe layer: normed before and after attention (whose output a per-channel sigmoid gates)
/// and before and after the MLPs; layer 0 dense, the others experts beside a shared one.
fn afmoe_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    b.t(n("post_attention_norm"), &[d.embd]);
    attention(b, d, l, q, kv);
    b.t(n("attn_q_norm"), &[d.head_dim]);
    b.t(n("attn_k_norm"), &[d.head_dim]);
    b.t(n("attn_gate"), &[d.embd, q]);
    b.t(n("ffn_norm"), &[d.embd]);
    b.t(n("post_ffw_norm"), &[d.embd]);
    sparse_or_dense(b, d, l, true);
}

/// lfm2moe: every 4th layer from the third attends (LFM2's 6 in 24, compressed), the others
/// are short convolutions.
fn lfm2_attends(l: u64) -> bool {
    l % 4 == 2
}

/// An lfm2moe layer: the MLP's norm and experts (a dense MLP in layer 0), then the operator's
/// norm and a short convolution or attention with q/k norms.
fn lfm2_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("ffn_norm"), &[d.embd]);
    if l == 0 {
        dense_mlp(b, d, l);
    } else {
        experts(b, d, l, d.expert_ff);
        b.std(format!("blk.{l}.exp_probs_b.bias"), &[d.experts], 0.01);
    }
    b.t(n("attn_norm"), &[d.embd]);
    if lfm2_attends(l) {
        b.t(n("attn_q_norm"), &[d.head_dim]);
        b.t(n("attn_k_norm"), &[d.head_dim]);
        attention(b, d, l, q, kv);
    } else {
        b.t(n("shortconv.conv"), &[3, d.embd]);
        b.t(n("shortconv.in_proj"), &[d.embd, 3 * d.embd]);
        b.t(n("shortconv.out_proj"), &[d.embd, d.embd]);
    }
}

/// The tensors a family has beside its head and layers.
fn globals(arch: Arch, d: &Dims, b: &mut Builder) {
    if matches!(arch, Arch::Gemma4 | Arch::Step35 | Arch::Mistral3) {
        // One global tensor, read by the full-attention layers (every layer in mistral3).
        b.t("rope_freqs.weight".into(), &[d.head_dim / 2]);
    }
    if matches!(arch, Arch::HyV4 | Arch::Deepseek4) {
        // The head's collapse of the residual streams into one.
        let hc = HY_V4_STREAMS;
        b.t("output_hc_fn.weight".into(), &[hc * d.embd, hc]);
        b.std("output_hc_base.weight".into(), &[hc], 0.1);
        b.t("output_hc_scale.weight".into(), &[1]);
    }
    if arch == Arch::Phimoe {
        // The output's norm and projection have biases; the rotary factors (LongRoPE) are
        // global, short ones within the original context and long ones beyond it.
        b.std("output_norm.bias".into(), &[d.embd], 0.02);
        if !b.variant.tied_output {
            b.std("output.bias".into(), &[d.vocab], 0.02);
        }
        b.between("rope_factors_long.weight".into(), &[d.head_dim / 2], 1.0, 1.5);
        b.between("rope_factors_short.weight".into(), &[d.head_dim / 2], 1.0, 1.1);
    }
}

/// mimo2: every 4th layer from the first attends to every key (MiMo-V2's one in six,
/// compressed), the others, nextn blocks included, to a sliding window.
fn mimo2_full(d: &Dims, l: u64) -> bool {
    l < d.layers && l.is_multiple_of(4)
}

/// mimo2's KV heads: fewer in full-attention layers than in sliding ones, as MiMo-V2-Flash's
/// (4 against 8).
fn mimo2_kv_heads(d: &Dims, l: u64) -> u64 {
    if mimo2_full(d, l) {
        d.kv_heads
    } else {
        d.heads
    }
}

/// MiMo-V2: the pattern, KV heads and values (half a key's width, scaled) of its hybrid
/// attention, one value per layer, nextn blocks included, as its loader reads them.
fn hparams_mimo2(d: &Dims, b: &mut Builder) {
    let all = d.layers + b.variant.mtp_layers;
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff).u32("attention.head_count", d.heads);
    b.hp("attention.head_count_kv", per_layer(all, |l| mimo2_kv_heads(d, l)));
    b.u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim / 2)
        .f32("attention.layer_norm_rms_epsilon", 1e-5)
        .u32("attention.sliding_window", SLIDING_WINDOW);
    b.hp("attention.sliding_window_pattern", sliding_pattern(all, |l| !mimo2_full(d, l)));
    b.f32("attention.value_scale", 0.707)
        .u32("rope.dimension_count", d.head_dim / 2)
        .f32("rope.freq_base", 5_000_000.0)
        .f32("rope.freq_base_swa", 10_000.0);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff);
}

/// A mimo2 layer's attention: Q, K and V (fused in a nextn block, as its MTP graph requires),
/// the output from values half a key wide, and sinks in the sliding-window layers only.
fn mimo2_attention(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let kv = mimo2_kv_heads(d, l);
    let (q, k, v) = (d.heads * d.head_dim, kv * d.head_dim, kv * d.head_dim / 2);
    let o = d.heads * d.head_dim / 2;
    if l < d.layers {
        b.t(n("attn_q"), &[d.embd, q]);
        b.t(n("attn_k"), &[d.embd, k]);
        b.t(n("attn_v"), &[d.embd, v]);
        b.t(n("attn_output"), &[o, d.embd]);
    } else {
        b.t(n("attn_qkv"), &[d.embd, q + k + v]);
        b.std(n("attn_output"), &[o, d.embd], 0.02 / (o as f32).sqrt());
    }
    b.t(n("attn_norm"), &[d.embd]);
    if !mimo2_full(d, l) {
        b.std(n("attn_sinks"), &[d.heads], 0.1);
    }
    b.t(n("ffn_norm"), &[d.embd]);
}

/// A mimo2 layer: its attention, then a dense MLP (layer 0) or sigmoid-routed experts with a
/// selection bias and no shared expert.
fn mimo2_layer(b: &mut Builder, d: &Dims, l: u64) {
    mimo2_attention(b, d, l);
    sparse_or_dense(b, d, l, false);
}

/// A mimo2 nextn block, as MiMo-V2's files carry it: sliding-window attention with fused QKV,
/// a dense MLP (no experts), the nextn projection and norms. Its outputs are drawn small.
fn mimo2_nextn_block(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    mimo2_attention(b, d, l);
    let ff = 2 * d.expert_ff;
    b.t(n("ffn_gate"), &[d.embd, ff]);
    b.t(n("ffn_up"), &[d.embd, ff]);
    b.std(n("ffn_down"), &[ff, d.embd], 0.02 / (ff as f32).sqrt());
    b.t(n("nextn.eh_proj"), &[2 * d.embd, d.embd]);
    b.t(n("nextn.enorm"), &[d.embd]);
    b.t(n("nextn.hnorm"), &[d.embd]);
    b.t(n("nextn.shared_head_norm"), &[d.embd]);
}

/// step35: every 4th layer from the first attends to every key, the others to a sliding
/// window (Step-3.5's 3 sliding to 1 full, compressed).
fn step35_full(l: u64) -> bool {
    l.is_multiple_of(4)
}

/// step35's query heads, one count per layer as its loader reads them: half again as many in
/// the sliding-window layers as in the full ones.
fn step35_heads(d: &Dims, l: u64) -> u64 {
    if step35_full(l) {
        d.heads
    } else {
        d.heads + d.heads / 2
    }
}

/// Step-3.5: query heads one value per layer, the pattern of sliding and full layers, a full
/// rotary base and a sliding one (full layers rotate half as many dimensions, as its loader
/// halves them), sigmoid routing with normalized weights beside a shared expert.
fn hparams_step35(d: &Dims, b: &mut Builder) {
    hp_common(d, b);
    b.u32("feed_forward_length", 2 * d.expert_ff);
    b.hp("attention.head_count", per_layer(d.layers, |l| step35_heads(d, l)));
    b.u32("attention.head_count_kv", d.kv_heads)
        .u32("attention.key_length", d.head_dim)
        .u32("attention.value_length", d.head_dim)
        .f32("attention.layer_norm_rms_epsilon", 1e-5)
        .u32("attention.sliding_window", SLIDING_WINDOW);
    b.hp("attention.sliding_window_pattern", sliding_pattern(d.layers, |l| !step35_full(l)));
    b.u32("rope.dimension_count", d.head_dim).f32("rope.freq_base", 5_000_000.0).f32("rope.freq_base_swa", 10_000.0);
    hp_experts(d, b);
    b.u32("expert_feed_forward_length", d.expert_ff)
        .u32("expert_shared_feed_forward_length", d.expert_ff)
        .hp("expert_weights_norm", Value::Bool(true))
        .f32("expert_weights_scale", 3.0);
}

/// A step35 layer: q/k norms, a sigmoid gate per head on the attention output, then a dense MLP
/// (layer 0) or experts with a selection bias beside an ungated shared expert.
fn step35_layer(b: &mut Builder, d: &Dims, l: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let q = step35_heads(d, l) * d.head_dim;
    b.t(n("attn_norm"), &[d.embd]);
    b.t(n("attn_q_norm"), &[d.head_dim]);
    b.t(n("attn_k_norm"), &[d.head_dim]);
    attention(b, d, l, q, kv);
    b.t(n("attn_gate"), &[d.embd, step35_heads(d, l)]);
    b.t(n("ffn_norm"), &[d.embd]);
    sparse_or_dense(b, d, l, true);
}

/// A phimoe layer: norms with biases, biased attention, experts without a shared one.
fn phimoe_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let bias = |b: &mut Builder, s: &str| b.std(format!("blk.{l}.{s}.bias"), &[d.embd], 0.02);
    b.t(n("attn_norm"), &[d.embd]);
    bias(b, "attn_norm");
    biased_attention(b, d, l, q, kv, true);
    b.t(n("ffn_norm"), &[d.embd]);
    bias(b, "ffn_norm");
    experts(b, d, l, d.expert_ff);
}

/// A bailingmoe2 layer; past the trunk, a nextn block: a MoE layer with the projection of the
/// normed token embedding beside the normed hidden state and a norm of its output.
fn bailing_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    b.t(n("attn_qkv"), &[d.embd, q + 2 * kv]);
    b.t(n("attn_output"), &[q, d.embd]);
    b.t(n("attn_q_norm"), &[d.head_dim]);
    b.t(n("attn_k_norm"), &[d.head_dim]);
    b.t(n("ffn_norm"), &[d.embd]);
    sparse_or_dense(b, d, l, true);
    if l >= d.layers {
        b.t(n("nextn.eh_proj"), &[2 * d.embd, d.embd]);
        b.t(n("nextn.enorm"), &[d.embd]);
        b.t(n("nextn.hnorm"), &[d.embd]);
        b.t(n("layer_output_norm"), &[d.embd]);
    }
}

/// olmoe, llama, qwen2moe, granitemoe and mistral3: attention, then experts with the
/// family's shared one where it has one.
fn classic_layer(arch: Arch, b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    if arch == Arch::Qwen2moe {
        biased_attention(b, d, l, q, kv, false);
    } else {
        attention(b, d, l, q, kv);
    }
    if arch == Arch::Olmoe {
        // OLMoE normalises q and k over the whole projection, not per head.
        b.t(n("attn_q_norm"), &[q]);
        b.t(n("attn_k_norm"), &[kv]);
    }
    b.t(n("ffn_norm"), &[d.embd]);
    experts(b, d, l, d.expert_ff);
    match arch {
        Arch::Qwen2moe => shared_expert(b, d, l, d.expert_ff, true),
        Arch::Granitemoe => shared_expert(b, d, l, d.expert_ff, false),
        _ => {}
    }
}

/// llama4, minimax-m2 and ernie4_5-moe: a normed standard attention, then the layer's MLP: dense
/// where the family's layout says so, else experts with the family's extras.
fn norm_attention_moe(arch: Arch, b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    attention(b, d, l, q, kv);
    if arch == Arch::MinimaxM2 {
        b.t(n("attn_q_norm"), &[q]);
        b.t(n("attn_k_norm"), &[kv]);
    }
    b.t(n("ffn_norm"), &[d.embd]);
    let dense = match arch {
        Arch::Llama4 => !llama4_is_moe(l),
        Arch::Ernie45Moe => l == 0,
        _ => false,
    };
    if dense {
        dense_mlp(b, d, l);
        return;
    }
    experts(b, d, l, d.expert_ff);
    if matches!(arch, Arch::MinimaxM2 | Arch::Ernie45Moe) {
        b.std(format!("blk.{l}.exp_probs_b.bias"), &[d.experts], 0.01);
    }
    if matches!(arch, Arch::Llama4 | Arch::Ernie45Moe) {
        shared_expert(b, d, l, d.expert_ff, false);
    }
}

/// A layer of grok, dbrx, arctic, dots1 or hunyuan-moe.
fn layer_more(arch: Arch, b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    if arch == Arch::Dbrx {
        b.t(n("attn_qkv"), &[d.embd, q + 2 * kv]);
        b.t(n("attn_output"), &[q, d.embd]);
    } else {
        attention(b, d, l, q, kv);
    }
    if matches!(arch, Arch::Dots1 | Arch::HunyuanMoe) {
        b.t(n("attn_q_norm"), &[d.head_dim]);
        b.t(n("attn_k_norm"), &[d.head_dim]);
    }
    if matches!(arch, Arch::Grok | Arch::Dbrx) {
        b.t(n("attn_output_norm"), &[d.embd]);
    }
    if arch != Arch::Dbrx {
        b.t(n("ffn_norm"), &[d.embd]);
    }
    match arch {
        Arch::Grok => {
            dense_mlp(b, d, l);
            experts(b, d, l, d.expert_ff);
            b.t(n("layer_output_norm"), &[d.embd]);
        }
        Arch::Dbrx => experts(b, d, l, d.expert_ff),
        Arch::Arctic => {
            // The residual MLP is as wide as the embedding.
            b.t(n("ffn_gate"), &[d.embd, d.embd]);
            b.t(n("ffn_up"), &[d.embd, d.embd]);
            b.t(n("ffn_down"), &[d.embd, d.embd]);
            b.t(n("ffn_norm_exps"), &[d.embd]);
            experts(b, d, l, d.expert_ff);
        }
        Arch::Dots1 if l == 0 => dense_mlp(b, d, l),
        Arch::Dots1 => {
            experts(b, d, l, d.expert_ff);
            b.std(format!("blk.{l}.exp_probs_b.bias"), &[d.experts], 0.01);
            shared_expert(b, d, l, DOTS1_SHARED * d.expert_ff, false);
        }
        _ => {
            experts(b, d, l, d.expert_ff);
            shared_expert(b, d, l, d.expert_ff, false);
        }
    }
}

/// A nemotron_h_moe layer: a norm, then a Mamba-2 mixer, attention, or ungated experts beside
/// an ungated shared expert.
fn nemotron_h_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    match nemotron_layer(l) {
        NemotronLayer::Mamba => mamba2_mixer(b, d, l),
        NemotronLayer::Attention => attention(b, d, l, q, kv),
        NemotronLayer::Moe => {
            b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
            b.std(format!("blk.{l}.exp_probs_b.bias"), &[d.experts], 0.01);
            b.t(n("ffn_up_exps"), &[d.embd, d.expert_ff, d.experts]);
            b.t(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts]);
            b.t(n("ffn_up_shexp"), &[d.embd, 2 * d.expert_ff]);
            b.t(n("ffn_down_shexp"), &[2 * d.expert_ff, d.embd]);
        }
    }
}

/// granitehybrid: attention or a Mamba-2 mixer, then experts beside a shared expert.
fn granite_hybrid_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    b.t(format!("blk.{l}.attn_norm.weight"), &[d.embd]);
    if granite_attends(l) {
        attention(b, d, l, q, kv);
    } else {
        mamba2_mixer(b, d, l);
    }
    b.t(format!("blk.{l}.ffn_norm.weight"), &[d.embd]);
    experts(b, d, l, d.expert_ff);
    shared_expert(b, d, l, 2 * d.expert_ff, false);
}

/// granite_swa: attention with sinks on every layer, sliding or full; the shared expert's gate
/// and up are one projection, gate first.
fn granite_swa_layer(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    attention(b, d, l, q, kv);
    b.std(n("attn_sinks"), &[d.heads], 0.1);
    b.t(n("ffn_norm"), &[d.embd]);
    experts(b, d, l, d.expert_ff);
    b.t(n("ffn_up_shexp"), &[d.embd, 2 * d.expert_ff]);
    b.t(n("ffn_down_shexp"), &[d.expert_ff, d.embd]);
}

/// A Mamba-2 mixer (nemotron_h_moe's and granitehybrid's).
fn mamba2_mixer(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let m = Mamba2::of(d);
    b.t(n("ssm_in"), &[d.embd, 2 * m.inner + 2 * m.groups * m.state + m.heads]);
    b.t(n("ssm_conv1d"), &[4, m.conv_dim()]);
    b.std(format!("blk.{l}.ssm_conv1d.bias"), &[m.conv_dim()], 0.1);
    b.std(format!("blk.{l}.ssm_dt.bias"), &[m.heads], 0.1);
    // A = -exp(A_log): a decay, negative for the state to stay bounded.
    b.between(format!("blk.{l}.ssm_a"), &[1, m.heads], -4.0, -0.5);
    b.between(format!("blk.{l}.ssm_d"), &[1, m.heads], 0.5, 1.5);
    b.t(n("ssm_norm"), &[m.inner / m.groups, m.groups]);
    b.t(n("ssm_out"), &[m.inner, d.embd]);
}

/// The variant's nextn blocks, after the trunk's layers.
fn nextn_blocks(arch: Arch, b: &mut Builder, d: &Dims, q: u64, kv: u64) {
    for l in d.layers..d.layers + b.variant.mtp_layers {
        match arch {
            Arch::Glm4moe => glm4moe_nextn_block(b, d, l, q, kv),
            Arch::Deepseek32 | Arch::GlmDsa => mla_nextn_block(arch, b, d, l),
            Arch::Mimo2 => mimo2_nextn_block(b, d, l),
            Arch::Bailingmoe2 => bailing_layer(b, d, l, q, kv),
            Arch::ExaoneMoe => exaone_nextn_block(b, d, l, q, kv),
            Arch::HyV3 => hy_v3_nextn_block(b, d, l, q, kv),
            _ => nextn_block(b, d, l, q, kv),
        }
    }
}

/// A glm4moe nextn block, as GLM-4.5's files carry it: the trunk's MoE layer (biased attention,
/// sigmoid routing with a selection bias, one shared expert), the projection of the normed token
/// embedding beside the normed hidden state, and the head's own norm (`shared_head_norm`; the
/// head itself is the model's). Its output projections are drawn at a fiftieth of their scale.
fn glm4moe_nextn_block(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let small = |fan_in: u64| 0.02 / (fan_in as f32).sqrt();
    b.t(n("attn_norm"), &[d.embd]);
    for (s, ne) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
        b.t(n(s), &[d.embd, ne]);
        b.std(format!("blk.{l}.{s}.bias"), &[ne], 0.02);
    }
    b.std(n("attn_output"), &[q, d.embd], small(q));
    b.t(n("post_attention_norm"), &[d.embd]);
    nextn_moe(b, d, l);
}

/// An exaone-moe nextn block, as K-EXAONE's files carry it: the trunk's attention with its q/k
/// norms, a dense MLP, the projection of the normed token embedding beside the normed hidden
/// state and the head's own norm. The loader skips it (the pin has no graph for it).
fn exaone_nextn_block(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    qk_normed_attention(b, d, l, q, kv);
    b.t(n("ffn_norm"), &[d.embd]);
    dense_mlp(b, d, l);
    b.t(n("nextn.eh_proj"), &[2 * d.embd, d.embd]);
    b.t(n("nextn.enorm"), &[d.embd]);
    b.t(n("nextn.hnorm"), &[d.embd]);
    b.t(n("nextn.shared_head_norm"), &[d.embd]);
}

/// A hy_v3 nextn block, as Hy3's files carry it: the trunk's MoE layer (q/k norms per head,
/// sigmoid routing with a selection bias beside a shared expert), the projection of the normed
/// token embedding beside the normed hidden state and the head's own norm. Its output
/// projections are drawn at a fiftieth of their scale.
fn hy_v3_nextn_block(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    b.t(n("attn_q"), &[d.embd, q]);
    b.t(n("attn_k"), &[d.embd, kv]);
    b.t(n("attn_v"), &[d.embd, kv]);
    b.std(n("attn_output"), &[q, d.embd], 0.02 / (q as f32).sqrt());
    b.t(n("attn_q_norm"), &[d.head_dim]);
    b.t(n("attn_k_norm"), &[d.head_dim]);
    b.t(n("ffn_norm"), &[d.embd]);
    nextn_moe(b, d, l);
}

/// A deepseek32 or glm-dsa nextn block, as DeepSeek-V3.2's and GLM-5's files carry it: the
/// trunk's MoE layer (its indexer too, which the head's graph never runs), the projection of the
/// normed token embedding beside the normed hidden state, and the head's own norm. Its output
/// projections are drawn at a fiftieth of their scale.
fn mla_nextn_block(arch: Arch, b: &mut Builder, d: &Dims, l: u64) {
    mla_attention(arch, b, d, l, true);
    nextn_moe(b, d, l);
}

/// The MoE half of glm4moe's, deepseek32's, glm-dsa's and hy_v3's nextn blocks (sigmoid routing
/// with a selection bias, one shared expert, its down projections small), then the projection
/// of the normed token embedding beside the normed hidden state and the head's own norm.
fn nextn_moe(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let small = |fan_in: u64| 0.02 / (fan_in as f32).sqrt();
    b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
    b.std(selection_bias(b, l), &[d.experts], 0.01);
    b.t(n("ffn_gate_exps"), &[d.embd, d.expert_ff, d.experts]);
    b.t(n("ffn_up_exps"), &[d.embd, d.expert_ff, d.experts]);
    b.std(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts], small(d.expert_ff));
    b.t(n("ffn_gate_shexp"), &[d.embd, d.expert_ff]);
    b.t(n("ffn_up_shexp"), &[d.embd, d.expert_ff]);
    b.std(n("ffn_down_shexp"), &[d.expert_ff, d.embd], small(d.expert_ff));
    b.t(n("nextn.eh_proj"), &[2 * d.embd, d.embd]);
    b.t(n("nextn.enorm"), &[d.embd]);
    b.t(n("nextn.hnorm"), &[d.embd]);
    b.t(n("nextn.shared_head_norm"), &[d.embd]);
}

/// Absorbed MLA (deepseek2's layer up to its feed-forward norm), then deepseek32's and glm-dsa's
/// lightning indexer: its query from the q latent, one key a token (LayerNorm with a bias), and
/// a weight per indexer head. A nextn block's output projection is drawn at a fiftieth of its
/// scale.
fn mla_attention(arch: Arch, b: &mut Builder, d: &Dims, l: u64, nextn: bool) {
    mla_projections(b, d, l, nextn);
    b.t(format!("blk.{l}.ffn_norm.weight"), &[d.embd]);
    if arch != Arch::Deepseek2 {
        dsa_indexer(b, d, l);
    }
}

/// Absorbed MLA's norms and projections (a nextn block's output drawn small).
fn mla_projections(b: &mut Builder, d: &Dims, l: u64, nextn: bool) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let m = Mla::of(d);
    b.t(n("attn_norm"), &[d.embd]);
    b.t(n("attn_q_a_norm"), &[m.q_lora]);
    b.t(n("attn_kv_a_norm"), &[m.kv_lora]);
    b.t(n("attn_q_a"), &[d.embd, m.q_lora]);
    b.t(n("attn_q_b"), &[m.q_lora, d.heads * (m.nope + m.rope)]);
    b.t(n("attn_kv_a_mqa"), &[d.embd, m.kv_lora + m.rope]);
    b.t(n("attn_k_b"), &[m.nope, m.kv_lora, d.heads]);
    b.t(n("attn_v_b"), &[m.kv_lora, d.head_dim, d.heads]);
    let o = d.heads * d.head_dim;
    if nextn {
        b.std(n("attn_output"), &[o, d.embd], 0.02 / (o as f32).sqrt());
    } else {
        b.t(n("attn_output"), &[o, d.embd]);
    }
}

/// The lightning indexer of a DSA layer: as many heads as attention, each a head wide.
fn dsa_indexer(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("indexer.k_norm"), &[d.head_dim]);
    b.std(format!("blk.{l}.indexer.k_norm.bias"), &[d.head_dim], 0.02);
    b.t(n("indexer.proj"), &[d.embd, d.heads]);
    b.t(n("indexer.attn_k"), &[d.embd, d.head_dim]);
    b.t(n("indexer.attn_q_b"), &[Mla::of(d).q_lora, d.heads * d.head_dim]);
}

/// A qwen35moe nextn block (`load_block_mtp`): a gated full-attention MoE decoder block, and the
/// projection of the normed token embedding beside the normed hidden state (`eh_proj`,
/// [2 x embd, embd]). Its head is the model's own (no `shared_head_*`, no `embed_tokens`). Its
/// output projections are drawn at a fiftieth of their scale (see `Variant::mtp_layers`).
fn nextn_block(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    b.t(n("post_attention_norm"), &[d.embd]);
    b.t(n("attn_q"), &[d.embd, 2 * q]);
    b.t(n("attn_k"), &[d.embd, kv]);
    b.t(n("attn_v"), &[d.embd, kv]);
    b.std(n("attn_output"), &[q, d.embd], 0.02 / (q as f32).sqrt());
    b.t(n("attn_q_norm"), &[d.head_dim]);
    b.t(n("attn_k_norm"), &[d.head_dim]);
    b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
    b.t(n("ffn_gate_exps"), &[d.embd, d.expert_ff, d.experts]);
    b.t(n("ffn_up_exps"), &[d.embd, d.expert_ff, d.experts]);
    b.std(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts], 0.02 / (d.expert_ff as f32).sqrt());
    b.t(n("ffn_gate_inp_shexp"), &[d.embd]);
    b.t(n("ffn_gate_shexp"), &[d.embd, 2 * d.expert_ff]);
    b.t(n("ffn_up_shexp"), &[d.embd, 2 * d.expert_ff]);
    b.std(n("ffn_down_shexp"), &[2 * d.expert_ff, d.embd], 0.02 / (2.0 * d.expert_ff as f32).sqrt());
    b.t(n("nextn.eh_proj"), &[2 * d.embd, d.embd]);
    b.t(n("nextn.enorm"), &[d.embd]);
    b.t(n("nextn.hnorm"), &[d.embd]);
}

/// deepseek2, deepseek32, glm-dsa, glm4moe, bailingmoe2, afmoe, step35, exaone-moe, hy_v3 and
/// mimo2: layer 0 is a dense MLP; the others a sigmoid-routed MoE with a selection bias, and one
/// shared expert where the family has it (all but mimo2).
fn sparse_or_dense(b: &mut Builder, d: &Dims, l: u64, shared: bool) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    if l == 0 {
        dense_mlp(b, d, l);
        return;
    }
    b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
    b.std(selection_bias(b, l), &[d.experts], 0.01);
    b.t(n("ffn_gate_exps"), &[d.embd, d.expert_ff, d.experts]);
    b.t(n("ffn_up_exps"), &[d.embd, d.expert_ff, d.experts]);
    b.t(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts]);
    if shared {
        shared_expert(b, d, l, d.expert_ff, false);
    }
}

/// Layer `l`'s selection bias: hy_v3's loader names it without a suffix.
fn selection_bias(b: &Builder, l: u64) -> String {
    if b.arch == Arch::HyV3.name() {
        format!("blk.{l}.exp_probs_b")
    } else {
        format!("blk.{l}.exp_probs_b.bias")
    }
}

/// A dense layer's MLP, twice an expert's width.
fn dense_mlp(b: &mut Builder, d: &Dims, l: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let ff = 2 * d.expert_ff;
    b.t(n("ffn_gate"), &[d.embd, ff]);
    b.t(n("ffn_up"), &[d.embd, ff]);
    b.t(n("ffn_down"), &[ff, d.embd]);
}

/// Q, K, V and output projections.
fn attention(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_q"), &[d.embd, q]);
    b.t(n("attn_k"), &[d.embd, kv]);
    b.t(n("attn_v"), &[d.embd, kv]);
    b.t(n("attn_output"), &[q, d.embd]);
}

/// The attention norm, Q, K, V and the output projection, and the per-head norms of Q and K.
fn qk_normed_attention(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_norm"), &[d.embd]);
    attention(b, d, l, q, kv);
    b.t(n("attn_q_norm"), &[d.head_dim]);
    b.t(n("attn_k_norm"), &[d.head_dim]);
}

/// Q, K, V with biases, and the output projection (with its bias where the family has one).
fn biased_attention(b: &mut Builder, d: &Dims, l: u64, q: u64, kv: u64, output_bias: bool) {
    for (s, ne) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
        b.t(format!("blk.{l}.{s}.weight"), &[d.embd, ne]);
        b.std(format!("blk.{l}.{s}.bias"), &[ne], 0.02);
    }
    b.t(format!("blk.{l}.attn_output.weight"), &[q, d.embd]);
    if output_bias {
        b.std(format!("blk.{l}.attn_output.bias"), &[d.embd], 0.02);
    }
}

/// A gated DeltaNet layer (linear attention with a recurrent state and a conv state).
fn delta_net(arch: Arch, b: &mut Builder, d: &Dims, l: u64) {
    let dn = DeltaNet::of(d);
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("attn_qkv"), &[d.embd, dn.conv_dim()]);
    b.t(n("attn_gate"), &[d.embd, dn.value_dim()]);
    b.t(n("ssm_conv1d"), &[4, dn.conv_dim()]);
    b.std(format!("blk.{l}.ssm_dt.bias"), &[dn.heads], 0.1);
    // A = -exp(A_log): a decay, negative for the state to stay bounded.
    b.between(format!("blk.{l}.ssm_a"), &[dn.heads], -16.0, -1.0);
    if arch == Arch::Qwen35moe {
        b.t(n("ssm_beta"), &[d.embd, dn.heads]);
        b.t(n("ssm_alpha"), &[d.embd, dn.heads]);
    } else {
        b.t(n("ssm_ba"), &[d.embd, 2 * dn.heads]);
    }
    b.t(n("ssm_norm"), &[dn.state]);
    b.t(n("ssm_out"), &[dn.value_dim(), d.embd]);
}

/// The router and separate gate, up and down experts of layer `l`.
fn experts(b: &mut Builder, d: &Dims, l: u64, ff: u64) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    b.t(n("ffn_gate_inp"), &[d.embd, d.experts]);
    b.t(n("ffn_gate_exps"), &[d.embd, ff, d.experts]);
    b.t(n("ffn_up_exps"), &[d.embd, ff, d.experts]);
    b.t(n("ffn_down_exps"), &[ff, d.embd, d.experts]);
}

/// The shared expert, with its sigmoid gate where the family has one.
fn shared_expert(b: &mut Builder, d: &Dims, l: u64, ff: u64, gated: bool) {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    if gated {
        b.t(n("ffn_gate_inp_shexp"), &[d.embd]);
    }
    b.t(n("ffn_gate_shexp"), &[d.embd, ff]);
    b.t(n("ffn_up_shexp"), &[d.embd, ff]);
    b.t(n("ffn_down_shexp"), &[ff, d.embd]);
}
