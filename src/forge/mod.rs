//! Deterministic synthetic GGUF models of real llama.cpp architectures.
//!
//! Every tensor is drawn from its own stream, seeded by (seed, tensor name, chunk), so the file
//! is a pure function of the arguments, chunks can be drawn in parallel, and a bench model is
//! written at disk speed.

mod families;
mod tokenizer;

use crate::gguf::{GgmlType, GgufWriter, TensorSpec, Value};
use anyhow::{bail, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::Path;

/// The MoE families `forge` writes, each as llama.cpp's loader for it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    #[default]
    Qwen3moe,
    /// Gated DeltaNet layers with their recurrent state, full attention every 4th layer, a
    /// shared expert with its gate.
    Qwen3next,
    /// Qwen3.5's MoE: the hybrid layout of qwen3next with its own tensor names.
    Qwen35moe,
    /// Sliding and full attention, a dense MLP beside merged gate_up experts, per-expert scales.
    Gemma4,
    /// MLA attention, a dense leading layer, expert groups, a shared expert, selection bias.
    Deepseek2,
    /// Expert and router biases, attention sinks, alternating sliding window.
    #[serde(rename = "gpt-oss")]
    GptOss,
    /// q/k norms over the whole projection.
    Olmoe,
    /// Mixtral-style experts under the `llama` architecture.
    Llama,
    /// A shared expert with its gate, q/k/v biases.
    Qwen2moe,
    /// Granite's embedding, residual, attention and logit multipliers.
    Granitemoe,
    /// A dense leading layer, a shared expert, selection bias.
    Glm4moe,
    /// MoE every 2nd layer between dense ones, an ungated shared expert, router weights applied
    /// to the experts' input, chunked attention with every 4th layer unrotated.
    Llama4,
    /// q/k norms over the whole projection, partial rotary, sigmoid routing with a selection
    /// bias and normalized weights, no shared expert.
    #[serde(rename = "minimax-m2")]
    MinimaxM2,
    /// A dense leading layer, softmax routing with a selection bias, an ungated shared expert.
    #[serde(rename = "ernie4_5-moe")]
    Ernie45Moe,
    /// GELU experts beside a dense MLP, norms after attention and after the MLPs, softcapped
    /// attention, scaled embeddings and logits.
    Grok,
    /// Fused QKV with clamped activations, LayerNorm, no norm before the experts but the
    /// attention output's.
    Dbrx,
    /// A dense residual MLP as wide as the embedding beside experts normed on their own.
    Arctic,
    /// q/k norms per head, a dense leading layer, sigmoid routing with a selection bias, two
    /// shared experts; K and V have as many heads as Q.
    Dots1,
    /// q/k norms after rotation, softmax routing over experts as wide as `feed_forward_length`,
    /// an ungated shared expert.
    #[serde(rename = "hunyuan-moe")]
    HunyuanMoe,
    /// Mamba-2 layers, attention layers and MoE layers of their own; ungated squared-ReLU
    /// experts, sigmoid routing with a selection bias, an ungated shared expert.
    #[serde(rename = "nemotron_h_moe")]
    NemotronHMoe,
    /// Ling 2.0: fused QKV with q/k norms, partial rotary, a dense leading layer, sigmoid
    /// routing with a selection bias, a shared expert; its nextn blocks are never run.
    Bailingmoe2,
    /// Qwen3-VL's language model: qwen3moe's layers with interleaved M-RoPE sections and
    /// deepstack inputs (zero for text) added after the first layers.
    Qwen3vlmoe,
    /// Phi-3.5-MoE: RMS norms with biases, biased attention, an output bias,
    /// long and short rotary factors, softmax routing over 16 experts.
    Phimoe,
    /// Mamba-1 layers with an attention layer among them (no rotary embedding), MoE in every
    /// second layer and a dense MLP in the others.
    Jamba,
    /// Arcee's Trinity: sliding and full attention (three to one) with q/k norms and a sigmoid
    /// gate on the attention output, norms after attention and after the MLPs, a dense leading
    /// layer, sigmoid routing with a selection bias, a shared expert.
    Afmoe,
    /// LFM2's MoE models: short gated convolutions (a recurrent conv state) and attention with
    /// q/k norms, told apart by per-layer KV heads; a dense leading layer, sigmoid routing with
    /// a selection bias, and the output norm stored as `token_embd_norm`.
    Lfm2moe,
    /// DeepSeek-V3.2: deepseek2's MLA layers with a lightning indexer choosing the keys each
    /// query attends (its top-k), expert groups, sigmoid routing with a selection bias.
    Deepseek32,
    /// GLM-5: MLA with a lightning indexer in every layer, a dense leading layer, sigmoid
    /// routing with a selection bias, a shared expert, no expert groups.
    #[serde(rename = "glm-dsa")]
    GlmDsa,
    /// MiMo-V2: sliding-window layers with attention sinks between full ones, each kind with
    /// its own KV heads, values narrower than keys and scaled, a dense leading layer, sigmoid
    /// routing with a selection bias; its nextn blocks are dense.
    Mimo2,
    /// Step-3.5: sliding-window layers with a query-head count of their own between full ones
    /// that rotate half as many dimensions, q/k norms, a gate per head, sigmoid routing with a selection
    /// bias beside a shared expert.
    Step35,
    /// SmallThinker: the router reads the layer's input before attention; sliding-window layers
    /// with every 4th (from the first) full and unrotated; ReLU experts, no shared expert.
    Smallthinker,
    /// K-EXAONE: sliding-window layers with every 4th full and unrotated, q/k norms, a dense
    /// leading layer, sigmoid routing with a selection bias beside a shared expert.
    #[serde(rename = "exaone-moe")]
    ExaoneMoe,
    /// GroveMoE: q/k norms, and beside the experts a second, narrower set (chunk experts, one a
    /// group of experts) that each selected expert's group adds to the output.
    Grovemoe,
    /// Maple: sliding-window layers rotated between full unrotated ones (every 4th and the
    /// last), q/k norms, softmax routing, experts whose SwiGLU is clamped at a limit per layer.
    Maple,
    /// DeepSeek-MoE (V1): standard attention as wide as the embedding, a dense leading layer,
    /// softmax routing beside two shared experts.
    Deepseek,
    /// Ling 1.0: standard attention, every layer MoE with softmax routing over normalized
    /// weights beside two shared experts.
    Bailingmoe,
    /// Mistral 3's MoE layout: standard attention with rotary factors and, past the original
    /// context, Llama-4-style temperature tuning; softmax routing over normalized weights.
    Mistral3,
    /// Mellum: sliding-window layers with every 4th full, q/k norms per head, softmax routing
    /// over normalized weights; the head is never tied.
    Mellum,
    /// Laguna: sliding-window layers rotated at a base of their own between full ones (every
    /// 4th from the first), q/k norms, a softplus gate per head on the attention output, a dense
    /// leading layer, sigmoid routing with a selection bias beside a shared expert.
    Laguna,
    /// Cohere2-MoE: attention and MLP side by side from one LayerNorm, sliding-window layers
    /// between full unrotated ones (every 4th from the first), a dense leading layer, sigmoid
    /// routing beside a shared expert, scaled logits.
    Cohere2moe,
    /// Granite 4.0-H: Mamba-2 layers with attention every 4th from the second, each layer's MLP
    /// experts beside a shared expert, Granite's multipliers, no rotary positions.
    Granitehybrid,
    /// Hy3 (HY V3): q/k norms per head, a dense leading layer, sigmoid routing (the loader's
    /// default) with a selection bias and normalized, scaled weights beside a shared expert.
    #[serde(rename = "hy_v3")]
    HyV3,
    /// Granite with sliding-window attention: Granite-MoE's multipliers, sliding-window layers
    /// between full ones (each with attention sinks), experts beside a shared expert whose gate
    /// and up are one projection.
    #[serde(rename = "granite_swa")]
    GraniteSwa,
    /// LLaDA-MoE: qwen3moe's layers under a diffusion model's non-causal attention, with no KV
    /// cache; llama.cpp loads it, and generation refuses it, since it does not decode left to
    /// right.
    #[serde(rename = "llada-moe")]
    LladaMoe,
    /// Kimi-Linear: Kimi Delta Attention layers (gated delta rule over short convolutions of Q,
    /// K and V, a recurrent state) with MLA every 4th layer, a dense leading layer, sigmoid
    /// routing with a selection bias beside a shared expert.
    #[serde(rename = "kimi-linear")]
    KimiLinear,
    /// MiniMax-Text-01: lightning (linear) attention layers with a recurrent state and a gated,
    /// normed output between softmax attention ones (every 8th and the last), each residual
    /// the normed input scaled; softmax routing, no shared expert.
    #[serde(rename = "minimax-01")]
    Minimax01,
    /// MiniMax-M3: minimax-m2's attention with q/k norms per head and partial rotary, MiniMax
    /// Sparse Attention (an indexer choosing blocks of keys) in its MoE layers, a dense leading
    /// layer, clamped SwiGLU (swiglu-oai) experts, sigmoid routing with a selection bias beside a
    /// shared expert.
    #[serde(rename = "minimax-m3")]
    MinimaxM3,
    /// dots.llm3: absorbed MLA in every layer with a sigmoid gate per head and a normed rotary
    /// key, sliding-window layers between full ones (every 4th and the last), each full layer
    /// with a lightning indexer choosing its keys; a dense leading layer, sigmoid routing with a
    /// selection bias beside a shared expert.
    Dots3note,
    /// Hy V4: absorbed MLA with attention sinks and a sigmoid gate per element, a lightning
    /// indexer in every layer, hyper-connections (four residual streams mixed before and after
    /// each block, collapsed before the head), a dense leading layer, sigmoid routing with a
    /// selection bias and clamped SwiGLU experts beside a shared expert.
    #[serde(rename = "hy_v4")]
    HyV4,
    /// DeepSeek-V4: one KV head shared by keys and values, with attention sinks, a sliding
    /// window and, by layer, keys compressed four to one (chosen by a lightning indexer over
    /// compressed keys of its own) or 128 to one; grouped low-rank output projections,
    /// hyper-connections (four residual streams mixed by Sinkhorn-normalized weights), experts
    /// chosen by a table of the token's id in the first layers and by sqrt-softplus scores with
    /// a selection bias after them, clamped SwiGLU beside a shared expert.
    Deepseek4,
}

impl Arch {
    /// `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3moe => "qwen3moe",
            Arch::Qwen3next => "qwen3next",
            Arch::Qwen35moe => "qwen35moe",
            Arch::Gemma4 => "gemma4",
            Arch::Deepseek2 => "deepseek2",
            Arch::GptOss => "gpt-oss",
            Arch::Olmoe => "olmoe",
            Arch::Llama => "llama",
            Arch::Qwen2moe => "qwen2moe",
            Arch::Granitemoe => "granitemoe",
            Arch::Glm4moe => "glm4moe",
            Arch::Llama4 => "llama4",
            Arch::MinimaxM2 => "minimax-m2",
            Arch::Ernie45Moe => "ernie4_5-moe",
            Arch::Grok => "grok",
            Arch::Dbrx => "dbrx",
            Arch::Arctic => "arctic",
            Arch::Dots1 => "dots1",
            Arch::HunyuanMoe => "hunyuan-moe",
            Arch::NemotronHMoe => "nemotron_h_moe",
            Arch::Bailingmoe2 => "bailingmoe2",
            Arch::Qwen3vlmoe => "qwen3vlmoe",
            Arch::Phimoe => "phimoe",
            Arch::Jamba => "jamba",
            Arch::Afmoe => "afmoe",
            Arch::Lfm2moe => "lfm2moe",
            Arch::Deepseek32 => "deepseek32",
            Arch::GlmDsa => "glm-dsa",
            Arch::Mimo2 => "mimo2",
            Arch::Step35 => "step35",
            Arch::Smallthinker => "smallthinker",
            Arch::ExaoneMoe => "exaone-moe",
            Arch::Grovemoe => "grovemoe",
            Arch::Maple => "maple",
            Arch::Deepseek => "deepseek",
            Arch::Bailingmoe => "bailingmoe",
            Arch::Mistral3 => "mistral3",
            Arch::Mellum => "mellum",
            Arch::Laguna => "laguna",
            Arch::Cohere2moe => "cohere2moe",
            Arch::Granitehybrid => "granitehybrid",
            Arch::HyV3 => "hy_v3",
            Arch::GraniteSwa => "granite_swa",
            Arch::LladaMoe => "llada-moe",
            Arch::KimiLinear => "kimi-linear",
            Arch::Minimax01 => "minimax-01",
            Arch::MinimaxM3 => "minimax-m3",
            Arch::Dots3note => "dots3note",
            Arch::HyV4 => "hy_v4",
            Arch::Deepseek4 => "deepseek4",
        }
    }

    pub const ALL: [Arch; 50] = [
        Arch::Qwen3moe,
        Arch::Qwen3next,
        Arch::Qwen35moe,
        Arch::Gemma4,
        Arch::Deepseek2,
        Arch::GptOss,
        Arch::Olmoe,
        Arch::Llama,
        Arch::Qwen2moe,
        Arch::Granitemoe,
        Arch::Glm4moe,
        Arch::Llama4,
        Arch::MinimaxM2,
        Arch::Ernie45Moe,
        Arch::Grok,
        Arch::Dbrx,
        Arch::Arctic,
        Arch::Dots1,
        Arch::HunyuanMoe,
        Arch::NemotronHMoe,
        Arch::Bailingmoe2,
        Arch::Qwen3vlmoe,
        Arch::Phimoe,
        Arch::Jamba,
        Arch::Afmoe,
        Arch::Lfm2moe,
        Arch::Deepseek32,
        Arch::GlmDsa,
        Arch::Mimo2,
        Arch::Step35,
        Arch::Smallthinker,
        Arch::ExaoneMoe,
        Arch::Grovemoe,
        Arch::Maple,
        Arch::Deepseek,
        Arch::Bailingmoe,
        Arch::Mistral3,
        Arch::Mellum,
        Arch::Laguna,
        Arch::Cohere2moe,
        Arch::Granitehybrid,
        Arch::HyV3,
        Arch::GraniteSwa,
        Arch::LladaMoe,
        Arch::KimiLinear,
        Arch::Minimax01,
        Arch::MinimaxM3,
        Arch::Dots3note,
        Arch::HyV4,
        Arch::Deepseek4,
    ];
}

/// Valid variations of a family's file that llama.cpp loads as well.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Variant {
    /// Routers (`ffn_gate_inp`) stored as F16 instead of F32.
    pub f16_router: bool,
    /// No `output.weight`: the head is tied to `token_embd`.
    pub tied_output: bool,
    /// Zipf exponent of router skew (0: none). Real routers send most selections to a few
    /// experts; forged ones are nearly uniform. Each layer ranks its experts by a permutation
    /// of its own and biases expert `e`'s logit by a few logits times `(rank(e) + 1)^-skew`.
    pub router_skew: f32,
    /// Multi-token-prediction (nextn) blocks after the trunk's layers, each a full-attention
    /// MoE decoder block with its nextn projection and norms (`<arch>.nextn_predict_layers`).
    /// The target never runs them; an MTP context does. A trained head follows its trunk; a
    /// drawn one would agree with nothing, so a model forged with one writes its trunk layers'
    /// outputs into the residual stream at a tenth of their scale (the next token then leans on
    /// the current one), and its head passes the token's normed embedding through its
    /// projection and writes its own block's outputs small: its drafts agree often, not always.
    pub mtp_layers: u64,
}

/// The families whose nextn blocks forge writes: qwen35moe's (`load_block_mtp`), glm4moe's,
/// deepseek32's, glm-dsa's, mimo2's and hy_v3's (GLM-4.5's, DeepSeek-V3.2's, GLM-5's, MiMo-V2's
/// and Hy3's published files carry them), and bailingmoe2's and exaone-moe's (Ling 2.0's and
/// K-EXAONE's; llama.cpp has no graph for them, so they are never run). The pin's deepseek2,
/// step35 and dots3note loaders take nextn blocks too; forge leaves them out.
pub const MTP_FAMILIES: [Arch; 8] =
    [Arch::Qwen35moe, Arch::Glm4moe, Arch::Bailingmoe2, Arch::Deepseek32, Arch::GlmDsa, Arch::Mimo2, Arch::ExaoneMoe, Arch::HyV3];

/// The families whose loaders require `output.weight` (no fallback to `token_embd`), so a tied
/// head is a file llama.cpp refuses: forge refuses `--tied-output` for them.
pub const UNTIED_FAMILIES: [Arch; 19] = [
    Arch::GptOss,
    Arch::Olmoe,
    Arch::Qwen2moe,
    Arch::MinimaxM2,
    Arch::Dbrx,
    Arch::Dots1,
    Arch::Bailingmoe2,
    Arch::Phimoe,
    Arch::Mimo2,
    Arch::Step35,
    Arch::ExaoneMoe,
    Arch::Maple,
    Arch::Bailingmoe,
    Arch::Mellum,
    Arch::LladaMoe,
    Arch::KimiLinear,
    Arch::MinimaxM3,
    Arch::HyV4,
    Arch::Deepseek4,
];

/// The families forge writes whose contexts llama.cpp gives no memory (no KV cache, no
/// recurrent state): generation refuses them, and a campaign that forges one is refused at its
/// check. They are written for `inventory`, the Plan's offline tools and that refusal's tests.
pub const STATELESS_FAMILIES: [Arch; 1] = [Arch::LladaMoe];

/// Whether `arch` may be forged with a tied head (`tied`); why not where it may not.
pub fn tied_output_allowed(arch: Arch, tied: bool) -> Result<(), String> {
    match tied && UNTIED_FAMILIES.contains(&arch) {
        true => Err(format!("the {} loader requires output.weight, so llama.cpp would refuse the file", arch.name())),
        false => Ok(()),
    }
}

/// The largest router skew forge takes: beyond it every token picks the same experts.
pub const MAX_ROUTER_SKEW: f32 = 8.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// At most 64 MiB: unit tests.
    Tiny,
    /// About 256 MiB, 64 experts per layer: CI campaigns.
    Small,
    /// Several GiB: larger than the memory caps used in benchmarks.
    Bench,
    /// The seed's principal experiment's topology at small widths, about 1.2 GiB: qwen3next
    /// unless another architecture is named, 48 layers x 512 experts (24,576 expert objects),
    /// top-10, full attention every 4th layer, a trained context of 32K tokens.
    Seed,
}

/// Model dimensions. Multiples of 256 keep every k-quant free of fallback types (`seed`'s widths
/// are not: it is forged for its shape, at F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Dims {
    pub layers: u64,
    pub experts: u64,
    pub top_k: u64,
    pub embd: u64,
    pub expert_ff: u64,
    pub vocab: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub context: u64,
    /// Tensor data alignment in the file.
    pub alignment: u64,
}

impl Preset {
    /// The architecture a preset forges when none is named: the seed's experiment is Qwen3-Next.
    pub fn arch(self) -> Arch {
        match self {
            Preset::Seed => Arch::Qwen3next,
            Preset::Tiny | Preset::Small | Preset::Bench => Arch::Qwen3moe,
        }
    }

    pub fn dims(self) -> Dims {
        let base = Dims {
            layers: 3,
            experts: 16,
            top_k: 4,
            embd: 256,
            expert_ff: 256,
            vocab: tokenizer::MIN_VOCAB,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            context: 4096,
            alignment: crate::gguf::DEFAULT_ALIGNMENT,
        };
        match self {
            Preset::Tiny => base,
            Preset::Small => Dims { layers: 5, experts: 64, top_k: 8, ..base },
            Preset::Bench => Dims { layers: 12, experts: 128, top_k: 8, embd: 512, expert_ff: 512, heads: 8, ..base },
            // Widths in Qwen3-Next's 4:1 ratio of embedding to expert FFN, two heads of 64
            // (DeltaNet: one key group, two value heads): each expert 48 KiB at F32.
            Preset::Seed => {
                Dims { layers: 48, experts: 512, top_k: 10, embd: 128, expert_ff: 32, heads: 2, kv_heads: 1, context: 32_768, ..base }
            }
        }
    }
}

/// Optional overrides of a preset's dimensions.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub layers: Option<u64>,
    pub experts: Option<u64>,
    pub top_k: Option<u64>,
    pub embd: Option<u64>,
    pub expert_ff: Option<u64>,
    pub vocab: Option<u64>,
    /// Tensor data alignment (`general.alignment`); absent: GGUF's default of 32.
    pub alignment: Option<u64>,
    /// The trained context length (`<arch>.context_length`).
    pub context: Option<u64>,
}

impl Dims {
    pub fn with(mut self, o: &Overrides) -> Result<Dims> {
        self.layers = o.layers.unwrap_or(self.layers);
        self.experts = o.experts.unwrap_or(self.experts);
        self.top_k = o.top_k.unwrap_or(self.top_k);
        self.embd = o.embd.unwrap_or(self.embd);
        self.expert_ff = o.expert_ff.unwrap_or(self.expert_ff);
        self.vocab = o.vocab.unwrap_or(self.vocab);
        self.alignment = o.alignment.unwrap_or(self.alignment);
        self.context = o.context.unwrap_or(self.context);
        if o.embd.is_some() {
            self.heads = (self.embd / self.head_dim).max(1);
            self.kv_heads = (self.heads / 2).max(1);
        }
        self.check()?;
        Ok(self)
    }

    fn check(&self) -> Result<()> {
        if !self.alignment.is_power_of_two() || !(32..=65_536).contains(&self.alignment) {
            bail!("--alignment must be a power of two from 32 to 65536");
        }
        if self.context == 0 || self.context > u64::from(crate::bounds::MAX_CTX) {
            bail!("--context must be from 1 to {} tokens", crate::bounds::MAX_CTX);
        }
        if self.layers == 0 || self.experts < 2 {
            bail!("need at least 1 layer and 2 experts");
        }
        if self.top_k == 0 || self.top_k > self.experts {
            bail!("--top-k must be between 1 and the number of experts ({})", self.experts);
        }
        if !self.embd.is_multiple_of(32) || !self.expert_ff.is_multiple_of(32) || self.embd == 0 || self.expert_ff == 0 {
            bail!("--embd and --expert-ff must be positive multiples of 32 (256 for k-quants)");
        }
        if !self.embd.is_multiple_of(self.head_dim) {
            bail!("--embd must be a multiple of the head size {}", self.head_dim);
        }
        if self.vocab < tokenizer::MIN_VOCAB {
            bail!("--vocab must be at least {} (256 byte tokens and an end token)", tokenizer::MIN_VOCAB);
        }
        // The experts' and the embeddings' F32 bytes, in a width no count can overflow.
        let (l, e, d, f, v) = (self.layers as u128, self.experts as u128, self.embd as u128, self.expert_ff as u128, self.vocab as u128);
        let bytes = l * e * 3 * d * f * 4 + 2 * v * d * 4;
        if bytes > u128::from(crate::bounds::MAX_FORGED_BYTES) {
            bail!(
                "{} layers x {} experts of {} x {} and a vocabulary of {} are {bytes} bytes at F32, over the {}-byte limit of a forged model",
                self.layers,
                self.experts,
                self.embd,
                self.expert_ff,
                self.vocab,
                crate::bounds::MAX_FORGED_BYTES
            );
        }
        Ok(())
    }

    /// Bytes of one expert's gate, up and down matrices at F32.
    pub fn expert_bytes(&self) -> u64 {
        3 * self.embd * self.expert_ff * 4
    }
}

/// What a forge run wrote.
#[derive(Debug, Serialize)]
pub struct Forged {
    pub arch: Arch,
    pub seed: u64,
    pub dims: Dims,
    pub variant: Variant,
    /// Bytes of the file, or of every shard.
    pub bytes: u64,
    /// The file's SHA-256, or the set's (`gguf::set::set_sha256`).
    pub sha256: String,
    /// The shard set's files, in order (empty: one file).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<std::path::PathBuf>,
}

/// Standard deviations of the drawn weights, chosen so that the router spreads tokens across
/// experts and the output head gives greedy decisions a wide range of top-1 margins.
mod scale {
    pub const EMBED: f32 = 1.0;
    pub const ROUTER: f32 = 1.5;
    pub const OUTPUT: f32 = 4.0;
    /// How much of the target's hidden state a forged MTP head mixes in beside the token.
    pub const NEXTN_STATE: f32 = 0.5;
    /// The trunk's output projections of a model forged with an MTP head.
    pub const MTP_TRUNK_WRITE: f32 = 0.1;
}

pub fn forge(arch: Arch, dims: Dims, seed: u64, out: &Path) -> Result<Forged> {
    forge_variant(arch, dims, Variant::default(), seed, out)
}

pub fn forge_variant(arch: Arch, dims: Dims, variant: Variant, seed: u64, out: &Path) -> Result<Forged> {
    forge_into(arch, dims, variant, seed, out, None, &mut |_, _| {})
}

/// Forges into one file `out`, or with `split` into the shard set `out-NNNNN-of-NNNNN.gguf`
/// (`out` is then the prefix), as gguf-split would cut the same file. `progress(done, total)`
/// is told the tensor bytes written after each tensor.
pub fn forge_into(
    arch: Arch,
    dims: Dims,
    variant: Variant,
    seed: u64,
    out: &Path,
    split: Option<crate::gguf::set::SplitBy>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Forged> {
    let d = dims;
    families::check(arch, &d)?;
    families::check_mtp(arch, &d, variant.mtp_layers)?;
    if let Err(why) = tied_output_allowed(arch, variant.tied_output) {
        anyhow::bail!("--tied-output: {why}");
    }
    if !(variant.router_skew.is_finite() && (0.0..=MAX_ROUTER_SKEW).contains(&variant.router_skew)) {
        anyhow::bail!("router skew {}: expected 0..={MAX_ROUTER_SKEW}", variant.router_skew);
    }
    let a = arch.name();
    let mut b = Builder { w: GgufWriter::default(), init: Vec::new(), arch: a, variant };
    b.w.kv("general.architecture", Value::Str(a.into()))
        .kv("general.name", Value::Str(format!("sovereign forge {a} seed {seed}")))
        .kv("general.file_type", Value::U32(0));
    families::hparams(arch, &d, &mut b);
    b.w.kv("sovereign.forge.seed", Value::U64(seed));
    if variant.router_skew > 0.0 {
        b.w.kv("sovereign.forge.router_skew", Value::F32(variant.router_skew));
    }
    // Only when asked: files forged before keep their bytes.
    if d.alignment != crate::gguf::DEFAULT_ALIGNMENT {
        b.w.kv("general.alignment", Value::U32(d.alignment as u32));
    }
    tokenizer::add(&mut b.w, d.vocab);
    families::tensors(arch, &d, &mut b);

    let Builder { w, init, .. } = b;
    let eos = tokenizer::EOS as usize;
    let mut vals: Vec<f32> = Vec::new();
    let skew = Skew::new(seed, d.embd as usize, variant.router_skew);
    let total: u64 = w.tensors.iter().map(TensorSpec::bytes).sum();
    let mut done = 0u64;
    let fill = |i: usize, t: &TensorSpec, buf: &mut [u8]| {
        let n: usize = t.dims.iter().product::<u64>() as usize;
        vals.clear();
        vals.resize(n, 0.0);
        match init[i] {
            Init::Const(c) => vals.fill(c),
            Init::Uniform(std) => {
                draw(seed, &t.name, &mut vals, std);
                if let Some(k) = skew.as_ref().filter(|_| t.name == "token_embd.weight") {
                    k.embed(&mut vals);
                }
            }
            Init::Router(std) => {
                draw(seed, &t.name, &mut vals, std);
                if let Some(k) = &skew {
                    k.router(seed, &t.name, &mut vals);
                }
            }
            Init::PassToken(std) => {
                draw(seed, &t.name, &mut vals, std);
                let inputs = t.dims[0] as usize;
                for (j, row) in vals.chunks_exact_mut(inputs).enumerate() {
                    row[..inputs / 2].fill(0.0);
                    row[j] = 1.0;
                }
            }
            Init::Between(lo, hi) => {
                draw(seed, &t.name, &mut vals, (hi - lo) / 12f32.sqrt());
                vals.iter_mut().for_each(|v| *v += (lo + hi) / 2.0);
            }
            Init::Routes(experts) => routes(seed, &t.name, t.dims[0] as usize, experts, &mut vals),
            Init::Head(std) => {
                draw(seed, &t.name, &mut vals, std);
                // The end token's logit is exactly 0 while 256 others spread around 0 with a
                // large standard deviation: greedy decoding practically never ends early.
                vals[eos * t.dims[0] as usize..(eos + 1) * t.dims[0] as usize].fill(0.0);
            }
        }
        match t.ggml_type {
            GgmlType::F16 => {
                for (o, v) in buf.chunks_exact_mut(2).zip(&vals) {
                    o.copy_from_slice(&f16_bits(*v).to_le_bytes());
                }
            }
            GgmlType::I32 => {
                for (o, v) in buf.chunks_exact_mut(4).zip(&vals) {
                    o.copy_from_slice(&(*v as i32).to_le_bytes());
                }
            }
            _ => bytemuck_f32(buf).copy_from_slice(&vals),
        }
        done += buf.len() as u64;
        progress(done, total);
    };
    let (sha256, files) = match split {
        None => (w.write(out, fill)?, vec![out.to_path_buf()]),
        Some(by) => {
            let written = w.write_split(out, by, fill)?;
            (written.sha256(), written.shards.into_iter().map(|(p, _)| p).collect())
        }
    };
    let bytes = files.iter().map(|p| std::fs::metadata(p).map(|m| m.len())).sum::<std::io::Result<u64>>()?;
    let shards = if split.is_some() { files } else { Vec::new() };
    Ok(Forged { arch, seed, dims, variant, bytes, sha256, shards })
}

/// How a forged tensor's values are made.
#[derive(Debug, Clone, Copy)]
enum Init {
    Const(f32),
    /// Uniform with this standard deviation, drawn from the tensor's own stream.
    Uniform(f32),
    /// The output head: uniform, with the end token's row zeroed.
    Head(f32),
    /// Uniform between two values (a decay held negative, a scale around 1).
    Between(f32, f32),
    /// A router: uniform, each expert's row then scaled by the variant's skew.
    Router(f32),
    /// A nextn projection [2 x embd, embd]: the token's normed embedding passed through, the
    /// hidden state's half drawn at this standard deviation.
    PassToken(f32),
    /// A table of expert ids (I32) by token: each row as many distinct experts, below this
    /// count, as the row is long.
    Routes(u64),
}

/// Fills `vals` with rows of `row` distinct expert ids below `experts`, drawn from the
/// tensor's own stream (a partial shuffle per row).
fn routes(seed: u64, name: &str, row: usize, experts: u64, vals: &mut [f32]) {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(name.as_bytes());
    let mut rng = SplitMix64(u64::from_le_bytes(h.finalize()[..8].try_into().unwrap()));
    let mut ids: Vec<u32> = (0..experts as u32).collect();
    for out in vals.chunks_exact_mut(row) {
        for (i, o) in out.iter_mut().enumerate() {
            let j = i + (rng.next() % (experts - i as u64)) as usize;
            ids.swap(i, j);
            *o = ids[i] as f32;
        }
    }
}

/// Router skew: a direction `u` shared by every token embedding (so every hidden state keeps a
/// component along it through the residual stream) and, in each router, expert `e`'s row moved
/// along `u` by `(rank(e) + 1)^-skew` times a few logits, ranks a per-layer permutation: a
/// logit bias the architectures without a router bias can carry.
struct Skew {
    u: Vec<f32>,
    z: f32,
}

/// The embedding's share along `u`, and the logit shift of the expert ranked first.
const SKEW_EMBED: f32 = 0.5;
const SKEW_LOGIT: f32 = 12.0;

impl Skew {
    fn new(seed: u64, embd: usize, z: f32) -> Option<Skew> {
        if z <= 0.0 || embd == 0 {
            return None;
        }
        let mut u = vec![0f32; embd];
        draw(seed, "sovereign.forge.router_skew", &mut u, 1.0);
        let norm = u.iter().map(|v| v * v).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
        u.iter_mut().for_each(|v| *v /= norm);
        Some(Skew { u, z })
    }

    /// Each embedding row gains `SKEW_EMBED * sqrt(embd)` along `u` (its own norm is about
    /// `sqrt(embd)`).
    fn embed(&self, vals: &mut [f32]) {
        let a = SKEW_EMBED * (self.u.len() as f32).sqrt();
        for row in vals.chunks_exact_mut(self.u.len()) {
            row.iter_mut().zip(&self.u).for_each(|(v, u)| *v += a * u);
        }
    }

    /// Each router row moves along `u` so that a normalized hidden state's component along it
    /// (about `SKEW_EMBED / sqrt(1 + SKEW_EMBED^2) * sqrt(embd)`) shifts the expert's logit by
    /// `SKEW_LOGIT * (rank + 1)^-z`.
    fn router(&self, seed: u64, name: &str, vals: &mut [f32]) {
        let embd = self.u.len();
        let n = vals.len() / embd;
        let mut rank: Vec<usize> = (0..n).collect();
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(name.as_bytes());
        h.update(b"router skew");
        let mut rng = SplitMix64(u64::from_le_bytes(h.finalize()[..8].try_into().unwrap()));
        for i in (1..n).rev() {
            rank.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let along = SKEW_EMBED / (1.0 + SKEW_EMBED * SKEW_EMBED).sqrt() * (embd as f32).sqrt();
        for (row, r) in vals.chunks_exact_mut(embd).zip(&rank) {
            let beta = SKEW_LOGIT * ((*r + 1) as f32).powf(-self.z) / along;
            row.iter_mut().zip(&self.u).for_each(|(v, u)| *v += beta * u);
        }
    }
}

/// A model being described: its metadata, tensors and how each tensor is filled.
struct Builder {
    w: GgufWriter,
    init: Vec<Init>,
    arch: &'static str,
    variant: Variant,
}

impl Builder {
    /// An architecture key, `{arch}.{k}`.
    fn hp(&mut self, k: &str, v: Value) -> &mut Self {
        self.w.kv(format!("{}.{k}", self.arch), v);
        self
    }

    fn u32(&mut self, k: &str, v: u64) -> &mut Self {
        self.hp(k, Value::U32(v as u32))
    }

    fn f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.hp(k, Value::F32(v))
    }

    fn push(&mut self, name: String, ty: GgmlType, dims: &[u64], init: Init) {
        self.w.tensor(TensorSpec::new(name, ty, dims));
        self.init.push(init);
    }

    /// A tensor filled by its role: norms and scales 1, the embedding at the embedding scale,
    /// routers and the head at theirs, everything else at 1/sqrt(fan-in).
    fn t(&mut self, name: String, dims: &[u64]) {
        let kind = name.rsplit('.').nth(1).unwrap_or("");
        let fan_in = dims[0] as f32;
        let ones = name.ends_with(".scale")
            || kind.ends_with("norm")
            || kind.ends_with("_scale")
            || kind == "rope_freqs"
            || kind == "ffn_norm_exps";
        let (ty, init) = if ones {
            (GgmlType::F32, Init::Const(1.0))
        } else {
            match kind {
                "token_embd" => (GgmlType::F32, Init::Uniform(scale::EMBED)),
                "ffn_gate_inp" if self.variant.f16_router => (GgmlType::F16, Init::Router(scale::ROUTER / fan_in.sqrt())),
                "ffn_gate_inp" => (GgmlType::F32, Init::Router(scale::ROUTER / fan_in.sqrt())),
                "output" => (GgmlType::F32, Init::Head(scale::OUTPUT / fan_in.sqrt())),
                "eh_proj" => (GgmlType::F32, Init::PassToken(scale::NEXTN_STATE / fan_in.sqrt())),
                "attn_output" | "ssm_out" | "ffn_down" | "ffn_down_exps" | "ffn_down_shexp" if self.variant.mtp_layers > 0 => {
                    (GgmlType::F32, Init::Uniform(scale::MTP_TRUNK_WRITE / fan_in.sqrt()))
                }
                _ => (GgmlType::F32, Init::Uniform(1.0 / fan_in.sqrt())),
            }
        };
        self.push(name, ty, dims, init);
    }

    /// A tensor drawn uniformly between `lo` and `hi`.
    fn between(&mut self, name: String, dims: &[u64], lo: f32, hi: f32) {
        self.push(name, GgmlType::F32, dims, Init::Between(lo, hi));
    }

    /// A tensor drawn at this standard deviation.
    fn std(&mut self, name: String, dims: &[u64], std: f32) {
        self.push(name, GgmlType::F32, dims, Init::Uniform(std));
    }

    /// A table of expert ids by token ([ids per token, vocab], I32), below `experts`.
    fn routes(&mut self, name: String, dims: &[u64], experts: u64) {
        self.push(name, GgmlType::I32, dims, Init::Routes(experts));
    }

    /// token_embd, the output norm (`norm` names it) and (unless tied) output.
    fn head(&mut self, d: &Dims, norm: &str) {
        self.t("token_embd.weight".into(), &[d.embd, d.vocab]);
        self.t(format!("{norm}.weight"), &[d.embd]);
        if !self.variant.tied_output {
            self.t("output.weight".into(), &[d.embd, d.vocab]);
        }
    }
}

/// The IEEE half nearest to `v` (ties to even); what llama.cpp's own conversion gives.
fn f16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && h & 1 == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// Views a byte buffer the writer allocated as f32 (it is a fresh Vec<u8>; alignment checked).
fn bytemuck_f32(buf: &mut [u8]) -> &mut [f32] {
    assert!((buf.as_ptr() as usize).is_multiple_of(4) && buf.len().is_multiple_of(4));
    // SAFETY: alignment and length checked; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut f32, buf.len() / 4) }
}

const CHUNK: usize = 1 << 18;

/// Fills `vals` uniformly with the given standard deviation, chunk by chunk, in parallel.
fn draw(seed: u64, name: &str, vals: &mut [f32], std: f32) {
    let amp = std * 3f32.sqrt();
    let base = {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(name.as_bytes());
        u64::from_le_bytes(h.finalize()[..8].try_into().unwrap())
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    let chunks: Vec<(usize, &mut [f32])> = vals.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [f32])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|s| {
        for group in groups {
            s.spawn(move || {
                for (i, chunk) in group {
                    let mut rng = SplitMix64(base ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    for v in chunk.iter_mut() {
                        let u = (rng.next() >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
                        *v = (2.0 * u - 1.0) * amp;
                    }
                }
            });
        }
    });
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::f16_bits;

    #[test]
    fn halves_round_to_nearest_even() {
        for (v, h) in [
            (1.0f32, 0x3c00u16),
            (-2.0, 0xc000),
            (0.1, 0x2e66),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00),
            (1e-8, 0),
            (6e-8, 0x0001),
            (6.1035156e-5, 0x0400),
            (1.0 + 1.0 / 2048.0, 0x3c00),
            (1.0 + 3.0 / 2048.0, 0x3c02),
            (f32::INFINITY, 0x7c00),
        ] {
            assert_eq!(f16_bits(v), h, "{v}");
        }
        assert_eq!(f16_bits(f32::NAN) & 0x7e00, 0x7e00);
    }
}
