//! Deterministic synthetic GGUF models of real llama.cpp architectures.
//!
//! Every tensor is drawn from its own stream, seeded by (seed, tensor name, chunk), so the file
//! is a pure function of the arguments, chunks can be drawn in parallel, and a bench model is
//! written at disk speed.

mod tokenizer;

use crate::gguf::{GgmlType, GgufWriter, TensorSpec, Value};
use anyhow::{bail, Result};
use clap::ValueEnum;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Qwen3moe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// At most 64 MiB: unit tests.
    Tiny,
    /// About 256 MiB, 64 experts per layer: CI campaigns.
    Small,
    /// Several GiB: larger than the memory caps used in benchmarks.
    Bench,
}

/// Model dimensions. Multiples of 256 keep every k-quant free of fallback types.
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
        if self.layers == 0 || self.experts < 2 {
            bail!("need at least 1 layer and 2 experts");
        }
        if self.top_k == 0 || self.top_k > self.experts {
            bail!("--top-k must be between 1 and the number of experts ({})", self.experts);
        }
        if self.embd % 32 != 0 || self.expert_ff % 32 != 0 || self.embd == 0 || self.expert_ff == 0 {
            bail!("--embd and --expert-ff must be positive multiples of 32 (256 for k-quants)");
        }
        if self.embd % self.head_dim != 0 {
            bail!("--embd must be a multiple of the head size {}", self.head_dim);
        }
        if self.vocab < tokenizer::MIN_VOCAB {
            bail!("--vocab must be at least {} (256 byte tokens and an end token)", tokenizer::MIN_VOCAB);
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
    pub bytes: u64,
    pub sha256: String,
}

/// Standard deviations of the drawn weights, chosen so that the router spreads tokens across
/// experts and the output head gives greedy decisions a wide range of top-1 margins.
mod scale {
    pub const EMBED: f32 = 1.0;
    pub const ROUTER: f32 = 1.5;
    pub const OUTPUT: f32 = 4.0;
}

pub fn forge(arch: Arch, dims: Dims, seed: u64, out: &Path) -> Result<Forged> {
    let Arch::Qwen3moe = arch;
    let d = dims;
    let mut w = GgufWriter::default();
    let a = "qwen3moe";
    w.kv("general.architecture", Value::Str(a.into()))
        .kv("general.name", Value::Str(format!("sovereign forge {a} seed {seed}")))
        .kv("general.file_type", Value::U32(0))
        .kv(format!("{a}.context_length"), Value::U32(d.context as u32))
        .kv(format!("{a}.embedding_length"), Value::U32(d.embd as u32))
        .kv(format!("{a}.block_count"), Value::U32(d.layers as u32))
        .kv(format!("{a}.feed_forward_length"), Value::U32(d.expert_ff as u32))
        .kv(format!("{a}.expert_feed_forward_length"), Value::U32(d.expert_ff as u32))
        .kv(format!("{a}.expert_count"), Value::U32(d.experts as u32))
        .kv(format!("{a}.expert_used_count"), Value::U32(d.top_k as u32))
        .kv(format!("{a}.attention.head_count"), Value::U32(d.heads as u32))
        .kv(format!("{a}.attention.head_count_kv"), Value::U32(d.kv_heads as u32))
        .kv(format!("{a}.attention.key_length"), Value::U32(d.head_dim as u32))
        .kv(format!("{a}.attention.value_length"), Value::U32(d.head_dim as u32))
        .kv(format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv(format!("{a}.rope.freq_base"), Value::F32(1_000_000.0))
        .kv("sovereign.forge.seed", Value::U64(seed));
    // Only when asked: files forged before keep their bytes.
    if d.alignment != crate::gguf::DEFAULT_ALIGNMENT {
        w.kv("general.alignment", Value::U32(d.alignment as u32));
    }
    tokenizer::add(&mut w, d.vocab);

    let f32t = |name: String, dims: &[u64]| TensorSpec::new(name, GgmlType::F32, dims);
    w.tensor(f32t("token_embd.weight".into(), &[d.embd, d.vocab]));
    w.tensor(f32t("output_norm.weight".into(), &[d.embd]));
    w.tensor(f32t("output.weight".into(), &[d.embd, d.vocab]));
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    for l in 0..d.layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        w.tensor(f32t(n("attn_norm"), &[d.embd]));
        w.tensor(f32t(n("attn_q"), &[d.embd, q]));
        w.tensor(f32t(n("attn_k"), &[d.embd, kv]));
        w.tensor(f32t(n("attn_v"), &[d.embd, kv]));
        w.tensor(f32t(n("attn_output"), &[q, d.embd]));
        w.tensor(f32t(n("attn_q_norm"), &[d.head_dim]));
        w.tensor(f32t(n("attn_k_norm"), &[d.head_dim]));
        w.tensor(f32t(n("ffn_norm"), &[d.embd]));
        w.tensor(f32t(n("ffn_gate_inp"), &[d.embd, d.experts]));
        w.tensor(f32t(n("ffn_gate_exps"), &[d.embd, d.expert_ff, d.experts]));
        w.tensor(f32t(n("ffn_up_exps"), &[d.embd, d.expert_ff, d.experts]));
        w.tensor(f32t(n("ffn_down_exps"), &[d.expert_ff, d.embd, d.experts]));
    }

    let eos = tokenizer::EOS as usize;
    let sha256 = w.write(out, |_, t, buf| {
        let vals: &mut [f32] = bytemuck_f32(buf);
        let kind = t.name.rsplit('.').nth(1).unwrap_or("");
        let fan_in = t.dims[0] as f32;
        let std = match kind {
            "attn_norm" | "ffn_norm" | "output_norm" | "attn_q_norm" | "attn_k_norm" => {
                vals.fill(1.0);
                return;
            }
            "token_embd" => scale::EMBED,
            "ffn_gate_inp" => scale::ROUTER / fan_in.sqrt(),
            "output" => scale::OUTPUT / fan_in.sqrt(),
            _ => 1.0 / fan_in.sqrt(),
        };
        draw(seed, &t.name, vals, std);
        if kind == "output" {
            // The end token's logit is exactly 0 while 256 others spread around 0 with a large
            // standard deviation: greedy decoding practically never ends early.
            vals[eos * t.dims[0] as usize..(eos + 1) * t.dims[0] as usize].fill(0.0);
        }
    })?;
    let bytes = std::fs::metadata(out)?.len();
    Ok(Forged { arch, seed, dims, bytes, sha256 })
}

/// Views a byte buffer the writer allocated as f32 (it is a fresh Vec<u8>; alignment checked).
fn bytemuck_f32(buf: &mut [u8]) -> &mut [f32] {
    assert!(buf.as_ptr() as usize % 4 == 0 && buf.len() % 4 == 0);
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
