//! A byte-level GPT-2 tokenizer with no merges: every byte is one token, so any prompt
//! tokenizes and every generated token decodes to bytes.

use crate::gguf::{GgufWriter, Value};

/// Token id of the end-of-text control token.
pub const EOS: u64 = 256;
/// 256 byte tokens and the end token.
pub const MIN_VOCAB: u64 = 257;

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// GPT-2's reversible map from bytes to printable code points.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("valid code point")
}

pub fn add(w: &mut GgufWriter, vocab: u64) {
    let mut tokens = Vec::with_capacity(vocab as usize);
    let mut types = Vec::with_capacity(vocab as usize);
    for b in 0..=255u8 {
        tokens.push(Value::Str(byte_char(b).to_string()));
        types.push(Value::I32(NORMAL));
    }
    tokens.push(Value::Str("<|endoftext|>".into()));
    types.push(Value::I32(CONTROL));
    for i in MIN_VOCAB..vocab {
        tokens.push(Value::Str(format!("<|extra_{i}|>")));
        types.push(Value::I32(NORMAL));
    }
    w.kv("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::Str("default".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(tokens))
        .kv("tokenizer.ggml.token_type", Value::Array(types))
        .kv("tokenizer.ggml.merges", Value::Array(Vec::new()))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(EOS as u32))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(EOS as u32))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn byte_tokens_are_unique_and_printable() {
        let set: HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(set.len(), 256);
        assert_eq!(byte_char(b'A'), 'A');
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'\n'), '\u{10A}');
    }
}
