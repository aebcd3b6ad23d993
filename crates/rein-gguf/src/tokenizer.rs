//! `tokenizer.json` and `tokenizer_config.json` rebuilt from a GGUF file's `tokenizer.*`
//! metadata: a byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with its vocabulary, merges,
//! special tokens, the pre-tokenizer that `tokenizer.ggml.pre` names, and the chat template; or
//! a SentencePiece vocabulary (`"llama"`: Gemma's, Llama 2's, Mistral's) as the BPE with byte
//! fallback that transformers makes of it, its merges recovered from the vocabulary as
//! transformers' GGUF loader recovers them (`generate_merges`: every split of a token into two
//! tokens, best first — Gemma's best is its earliest token, the others' their highest score).
//!
//! The pre-tokenizer follows llama.cpp's table for each `pre` name (the engine GGUF files are
//! made for, and the original `tokenizer.json` they were converted from): `smollm`, for one,
//! isolates every digit before the GPT-2 split. transformers' GGUF loader maps only some names
//! and falls back to plain GPT-2 splitting for the rest, which differs on digits next to
//! whitespace; `tests/fixtures/gguf/gen_gguf.py` counts how often.

use serde_json::{Value as Json, json};

use super::GgufError;
use super::file::{GgufFile, Value};

/// `tokenizer.ggml.token_type` of control tokens (`<|im_end|>`): special, never split.
const CONTROL: i64 = 3;
/// `tokenizer.ggml.token_type` of user-defined tokens (`<think>`): added, not special.
const USER_DEFINED: i64 = 4;

/// Pre-tokenizer families by llama.cpp's `tokenizer.ggml.pre` names.
const DIGITS_THEN_GPT2: [&str; 7] = [
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva",
];
const GPT2: [&str; 5] = ["default", "gpt2", "mpt", "olmo", "jais"];
const LLAMA3: [&str; 6] = ["llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"];
const QWEN2: [&str; 2] = ["qwen2", "deepseek-r1-qwen"];

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `(tokenizer.json, tokenizer_config.json)` for `file`; `max_length` is the model's context.
pub fn build(file: &GgufFile, max_length: usize) -> Result<(Json, Json), GgufError> {
    match file.get_str("tokenizer.ggml.model")? {
        "gpt2" => byte_level(file, max_length),
        "llama" => sentencepiece(file, max_length),
        model => Err(file.metadata_error(
            "tokenizer.ggml.model",
            format!("`{model}` is not supported (supported: gpt2 — byte-level BPE — and llama — SentencePiece)"),
        )),
    }
}

/// A byte-level BPE: GPT-2's byte alphabet, the file's merges, the pre-tokenizer `pre` names.
fn byte_level(file: &GgufFile, max_length: usize) -> Result<(Json, Json), GgufError> {
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let (vocab, added) = vocabulary(&tokens, &token_types(file, tokens.len())?);
    let merges: Vec<Json> = strings(file, "tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            let (a, b) = merge.split_once(' ').ok_or_else(|| {
                file.metadata_error(
                    "tokenizer.ggml.merges",
                    format!("entry {i} `{merge}` is not two tokens"),
                )
            })?;
            Ok(json!([a, b]))
        })
        .collect::<Result<_, GgufError>>()?;
    let pre = file.optional_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(file, pre)?,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    Ok((tokenizer, tokenizer_config(file, &tokens, max_length)?))
}

/// A SentencePiece vocabulary as transformers' GGUF loader builds it: `GemmaTokenizer` for the
/// Gemma architectures (spaces normalised to `▁`, no prefix space, merges by token order, a run
/// of spaces spelled as `▁`s), `LlamaTokenizer` otherwise (a `▁` prefix, merges by score); both
/// BPE with byte fallback, control tokens special, user-defined ones added.
fn sentencepiece(file: &GgufFile, max_length: usize) -> Result<(Json, Json), GgufError> {
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let types = token_types(file, tokens.len())?;
    let gemma = file.get_str("general.architecture")?.starts_with("gemma");
    let spelled: Vec<String> = match gemma {
        true => tokens
            .iter()
            .map(|t| match t.contains(' ') && t.trim().is_empty() {
                true => "\u{2581}".repeat(t.chars().count()),
                false => t.clone(),
            })
            .collect(),
        false => tokens.clone(),
    };
    let merges = match gemma {
        true => merges_from_vocabulary(&spelled, |i| -(i as f64)),
        false => {
            let scores = floats(file, "tokenizer.ggml.scores", tokens.len())?;
            merges_from_vocabulary(&spelled, |i| scores[i])
        }
    };
    let mut vocab = serde_json::Map::new();
    for (id, token) in spelled.iter().enumerate() {
        vocab.insert(token.clone(), json!(id));
    }
    let mut added = Vec::new();
    for (id, (token, kind)) in tokens.iter().zip(&types).enumerate() {
        // transformers adds a user-defined token only under the spelling it looks up.
        let user_defined = *kind == USER_DEFINED && vocab.contains_key(token);
        if *kind == CONTROL || user_defined {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *kind == CONTROL,
            }));
        }
    }
    let unk = file
        .optional_usize("tokenizer.ggml.unknown_token_id")?
        .and_then(|id| tokens.get(id).cloned());
    let spm_decoder = |strip: bool| {
        let mut steps = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if strip {
            steps.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        json!({"type": "Sequence", "decoders": steps})
    };
    let (normalizer, pre_tokenizer, decoder) = match gemma {
        true => (
            json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
            spm_decoder(false),
        ),
        false => {
            let prefix = !matches!(
                file.metadata.get("tokenizer.ggml.add_space_prefix"),
                Some(Value::Bool(false))
            );
            let scheme = if prefix { "first" } else { "never" };
            (
                Json::Null,
                json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": scheme, "split": false}),
                spm_decoder(prefix),
            )
        }
    };
    let merges: Vec<Json> = merges.into_iter().map(|(a, b)| json!([a, b])).collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": decoder,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    Ok((tokenizer, tokenizer_config(file, &tokens, max_length)?))
}

/// The merges a vocabulary implies, as transformers' `generate_merges` orders them: for each
/// token (first spelling wins its place, the last its id), every split into two tokens of the
/// vocabulary, sorted by the pieces' ids; then all by `(score of the merged token, length of the
/// left piece, length of the right)`, highest first, ties kept in that order.
fn merges_from_vocabulary(tokens: &[String], score: impl Fn(usize) -> f64) -> Vec<(String, String)> {
    let mut ids: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        if ids.insert(token.as_str(), id).is_none() {
            order.push(token);
        }
    }
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    for merged in order {
        let merged_score = score(ids[merged]);
        let mut local: Vec<(usize, usize, &str, &str)> = Vec::new();
        for (at, _) in merged.char_indices().skip(1) {
            let (left, right) = merged.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                local.push((l, r, left, right));
            }
        }
        local.sort_by_key(|&(l, r, _, _)| (l, r));
        for (_, _, left, right) in local {
            merges.push((merged_score, left.chars().count(), right.chars().count(), left, right));
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| b.1.cmp(&a.1))
            .then_with(|| b.2.cmp(&a.2))
    });
    merges
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

/// The numbers of the array at `key`, `len` of them.
fn floats(file: &GgufFile, key: &str, len: usize) -> Result<Vec<f64>, GgufError> {
    let items = file
        .get(key)?
        .as_array()
        .ok_or_else(|| file.metadata_error(key, "expected an array of numbers"))?;
    if items.len() != len {
        return Err(file.metadata_error(key, format!("{} entries for {len} tokens", items.len())));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f64()
                .ok_or_else(|| file.metadata_error(key, format!("entry {i} is not a number")))
        })
        .collect()
}

/// Each token's type (`tokenizer.ggml.token_type`; all normal when absent).
fn token_types(file: &GgufFile, tokens: usize) -> Result<Vec<i64>, GgufError> {
    let Some(value) = file.metadata.get("tokenizer.ggml.token_type") else {
        return Ok(vec![1; tokens]);
    };
    let items = value
        .as_array()
        .ok_or_else(|| file.metadata_error("tokenizer.ggml.token_type", "expected an array"))?;
    if items.len() != tokens {
        return Err(file.metadata_error(
            "tokenizer.ggml.token_type",
            format!("{} entries for {tokens} tokens", items.len()),
        ));
    }
    items
        .iter()
        .map(|v| match v {
            Value::Signed(t) => Ok(*t),
            Value::Unsigned(t) => Ok(*t as i64),
            other => Err(file.metadata_error("tokenizer.ggml.token_type", format!("entry {other:?}"))),
        })
        .collect()
}

/// The BPE vocabulary (tokens spelled in the byte alphabet) and the added tokens (control and
/// user-defined ones).
fn vocabulary(tokens: &[String], types: &[i64]) -> (serde_json::Map<String, Json>, Vec<Json>) {
    let alphabet = byte_alphabet();
    let byte_level = |token: &str| token.chars().all(|c| alphabet.contains(&c));
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (token, kind)) in tokens.iter().zip(types).enumerate() {
        let spelled = if byte_level(token) {
            token.clone()
        } else {
            token.bytes().map(|b| alphabet[usize::from(b)]).collect()
        };
        vocab.entry(spelled).or_insert(json!(id));
        // A control token outside the byte alphabet is a llama.cpp mislabel (transformers skips
        // it too): it is an ordinary token.
        let special = *kind == CONTROL && byte_level(token);
        if special || *kind == USER_DEFINED {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            }));
        }
    }
    (vocab, added)
}

/// `tokenizer_config.json`: special tokens, BOS/EOS switches and the chat template.
fn tokenizer_config(file: &GgufFile, tokens: &[String], max_length: usize) -> Result<Json, GgufError> {
    let token_at = |key: &str| -> Result<Json, GgufError> {
        let Some(id) = file.optional_usize(key)? else {
            return Ok(Json::Null);
        };
        tokens
            .get(id)
            .map(|t| json!(t))
            .ok_or_else(|| file.metadata_error(key, format!("id {id} is outside the {} tokens", tokens.len())))
    };
    let flag = |key: &str| matches!(file.metadata.get(key), Some(Value::Bool(true)));
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "add_bos_token": flag("tokenizer.ggml.add_bos_token"),
        "add_eos_token": flag("tokenizer.ggml.add_eos_token"),
        "bos_token": token_at("tokenizer.ggml.bos_token_id")?,
        "eos_token": token_at("tokenizer.ggml.eos_token_id")?,
        "unk_token": token_at("tokenizer.ggml.unknown_token_id")?,
        "pad_token": token_at("tokenizer.ggml.padding_token_id")?,
    });
    if let Some(template) = file.optional_str("tokenizer.chat_template")? {
        config["chat_template"] = json!(template);
    }
    Ok(config)
}

/// The strings of the array at `key`.
fn strings(file: &GgufFile, key: &str) -> Result<Vec<String>, GgufError> {
    let items = file
        .get(key)?
        .as_array()
        .ok_or_else(|| file.metadata_error(key, "expected an array of strings"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(String::from)
                .ok_or_else(|| file.metadata_error(key, format!("entry {i} is not a string")))
        })
        .collect()
}

/// The `tokenizers` pre-tokenizer for llama.cpp's pre-tokenizer name `pre`.
fn pre_tokenizer(file: &GgufFile, pre: &str) -> Result<Json, GgufError> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split_then_bytes = |regex: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    Ok(if DIGITS_THEN_GPT2.contains(&pre) {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]})
    } else if GPT2.contains(&pre) {
        byte_level(true)
    } else if LLAMA3.contains(&pre) {
        split_then_bytes(LLAMA3_SPLIT)
    } else if QWEN2.contains(&pre) {
        split_then_bytes(QWEN2_SPLIT)
    } else {
        let known = [&DIGITS_THEN_GPT2[..], &GPT2, &LLAMA3, &QWEN2].concat().join(", ");
        return Err(file.metadata_error(
            "tokenizer.ggml.pre",
            format!("pre-tokenizer `{pre}` is not supported (supported: {known})"),
        ));
    })
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the other 68 are
/// shifted to U+0100 and up, so every byte is a visible character.
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut shifted = 0;
    (0u32..256)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            char::from_u32(code).unwrap_or('?')
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let alphabet = byte_alphabet();
        assert_eq!(alphabet[usize::from(b' ')], 'Ġ');
        assert_eq!(alphabet[usize::from(b'\n')], 'Ċ');
        assert_eq!(alphabet[usize::from(b'a')], 'a');
        assert_eq!(alphabet[0], 'Ā');
        let mut distinct = alphabet.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 256);
    }
}
