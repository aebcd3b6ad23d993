//! A GGUF model as a model directory in Hugging Face format: `config.json` from the metadata, weights renamed
//! and dequantised (Q/K rows put back in Hugging Face's order, Gemma's norms back to offsets from
//! one, a mixture of experts' stacked expert tensors split per expert), `tokenizer.json` and
//! `tokenizer_config.json` rebuilt from the vocabulary, merges and chat template.

use std::collections::BTreeMap;
use std::path::Path;

use rein_kernels::PackedMatrix;
use serde_json::Value as Json;

use super::GgufError;
use super::file::{GgufFile, TensorInfo};
use super::tokenizer;
use crate::tensors_file::Tensors;
use crate::{Family, LmConfig, RopeScaling, TokenIds};

/// Architectures whose GGUF layout rein maps (`general.architecture`), with their families.
const ARCHITECTURES: [(&str, Family); 7] = [
    ("llama", Family::Llama),
    ("mistral", Family::Mistral),
    ("qwen2", Family::Qwen2),
    ("qwen3", Family::Qwen3),
    ("qwen3moe", Family::Qwen3Moe),
    ("gemma2", Family::Gemma2),
    ("gemma3", Family::Gemma3),
];

/// llama.cpp stores Llama's and Mistral's query and key rows interleaved for its RoPE.
fn permuted(family: Family) -> bool {
    matches!(family, Family::Llama | Family::Mistral)
}

/// A converted model, ready to be written as a checkpoint directory.
#[derive(Debug)]
pub struct Converted {
    /// The architecture.
    pub config: LmConfig,
    /// Weights under Hugging Face names, f32.
    pub tensors: Tensors,
    /// The quantised weight matrices as they were stored, `[in, out]`, under the same names
    /// (the head as `lm_head.weight`, tied or not): see [`crate::packed_file`].
    pub packed: BTreeMap<String, PackedMatrix>,
    /// `tokenizer.json`.
    pub tokenizer: Json,
    /// `tokenizer_config.json`.
    pub tokenizer_config: Json,
}

impl Converted {
    /// Reads everything from `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, GgufError> {
        let config = config(file)?;
        check_tensor_set(file, &config)?;
        let tensors = tensors(file, &config)?;
        let packed = packed(file, &config)?;
        let (tokenizer, tokenizer_config) = tokenizer::build(file, config.max_position_embeddings)?;
        Ok(Self {
            config,
            tensors,
            packed,
            tokenizer,
            tokenizer_config,
        })
    }

    /// Writes `config.json`, `model.safetensors`, `tokenizer.json` and `tokenizer_config.json`
    /// into `dir` (created if missing), and `model.packed.safetensors` with the quantised ones (if any).
    pub fn write(&self, dir: &Path) -> Result<(), GgufError> {
        let io = |path: &Path, e: std::io::Error| GgufError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let weights = dir.join("model.safetensors");
        crate::tensors_file::write(&weights, &self.tensors, "pt").map_err(|e| io(&weights, e))?;
        let packed = dir.join(crate::packed_file::FILE);
        crate::packed_file::write(&packed, &self.packed).map_err(|e| io(&packed, e))?;
        let files = [
            ("config.json", self.config.to_hf_json()),
            ("tokenizer.json", pretty(&self.tokenizer)),
            ("tokenizer_config.json", pretty(&self.tokenizer_config)),
        ];
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }
}

fn pretty(value: &Json) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

/// Converts the GGUF model `gguf` into a model directory `out` in Hugging Face format.
pub fn convert_file(gguf: &Path, out: &Path) -> Result<LmConfig, GgufError> {
    let file = GgufFile::open(gguf)?;
    let converted = Converted::from_gguf(&file)?;
    converted.write(out)?;
    Ok(converted.config)
}

/// The architecture from `{arch}.*` metadata, as transformers' GGUF loader derives it.
fn config(file: &GgufFile) -> Result<LmConfig, GgufError> {
    let arch = file.get_str("general.architecture")?;
    let Some(&(_, family)) = ARCHITECTURES.iter().find(|(name, _)| *name == arch) else {
        let known: Vec<&str> = ARCHITECTURES.iter().map(|(name, _)| *name).collect();
        return Err(file.metadata_error(
            "general.architecture",
            format!("`{arch}` is not supported (supported: {})", known.join(", ")),
        ));
    };
    let meta = ArchMetadata { file, arch };
    let hidden = file.get_usize(&meta.key("embedding_length"))?;
    let heads = file.get_usize(&meta.key("attention.head_count"))?;
    if heads == 0 {
        return Err(file.metadata_error(&meta.key("attention.head_count"), "is 0"));
    }
    let kv_heads = meta.usize_or("attention.head_count_kv", heads)?;
    let head_dim = meta.usize_or("attention.key_length", hidden / heads)?;
    let rotary = meta.usize_or("rope.dimension_count", head_dim)?;
    if rotary != head_dim {
        return Err(file.metadata_error(
            &meta.key("rope.dimension_count"),
            format!("partial rotary embeddings ({rotary} of {head_dim} dimensions) are not supported"),
        ));
    }
    let embedding = file
        .tensor("token_embd.weight")
        .ok_or_else(|| file.tensor_error("token_embd.weight", "missing"))?;
    let vocab_size = meta.usize_or("vocab_size", embedding.shape()[0])?;
    let token_id = |k: &str| -> Result<Option<u32>, GgufError> { Ok(file.optional_usize(k)?.map(|id| id as u32)) };
    let mut config = LmConfig {
        model_type: family.model_type().into(),
        vocab_size,
        hidden_size: hidden,
        intermediate_size: meta.usize_or("feed_forward_length", 0)?,
        num_hidden_layers: file.get_usize(&meta.key("block_count"))?,
        num_attention_heads: heads,
        num_key_value_heads: Some(kv_heads),
        head_dim: Some(head_dim),
        rms_norm_eps: meta.float_or("attention.layer_norm_rms_epsilon", 1e-6)?,
        rope_theta: meta.float_or("rope.freq_base", 10_000.0)?,
        rope_scaling: rope_scaling(&meta)?,
        max_position_embeddings: meta.usize_or("context_length", 2048)?,
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        attention_bias: family != Family::Qwen2 && file.tensor("blk.0.attn_q.bias").is_some(),
        bos_token_id: token_id("tokenizer.ggml.bos_token_id")?,
        eos_token_id: token_id("tokenizer.ggml.eos_token_id")?.map(TokenIds::One),
        torch_dtype: Some("float32".into()),
        ..LmConfig::default()
    };
    family_settings(&meta, family, &mut config)?;
    config
        .validate()
        .map_err(|e| file.metadata_error(&meta.key("*"), e.to_string()))?;
    Ok(config)
}

/// A GGUF file's `{arch}.*` metadata keys.
struct ArchMetadata<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl ArchMetadata<'_> {
    /// The full name of the architecture's key `k`: `{arch}.{k}`.
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn usize_or(&self, k: &str, default: usize) -> Result<usize, GgufError> {
        Ok(self.file.optional_usize(&self.key(k))?.unwrap_or(default))
    }

    fn float_or(&self, k: &str, default: f64) -> Result<f64, GgufError> {
        self.optional_float(k).map(|v| v.unwrap_or(default))
    }

    fn optional_float(&self, k: &str) -> Result<Option<f64>, GgufError> {
        let key = self.key(k);
        match self.file.metadata.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.file
                    .metadata_error(&key, format!("expected a number, found {v:?}"))
            }),
        }
    }
}

/// `rope.scaling.*`: none or linear (per-frequency factors are refused).
fn rope_scaling(meta: &ArchMetadata) -> Result<Option<RopeScaling>, GgufError> {
    let file = meta.file;
    let scaling = match file.metadata.get(&meta.key("rope.scaling.type")) {
        None => None,
        Some(kind) => match kind.as_str() {
            Some("none") => None,
            Some("linear") => Some(RopeScaling {
                rope_theta: None,
                rope_type: "linear".into(),
                factor: meta.float_or("rope.scaling.factor", 1.0)?,
                low_freq_factor: None,
                high_freq_factor: None,
                original_max_position_embeddings: None,
            }),
            _ => {
                return Err(file.metadata_error(
                    &meta.key("rope.scaling.type"),
                    format!("{kind:?} is not supported (none, linear)"),
                ));
            }
        },
    };
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(file.tensor_error(
            "rope_freqs.weight",
            "per-frequency RoPE factors (Llama 3.1 scaling) are not supported",
        ));
    }
    Ok(scaling)
}

/// What one family adds to the common settings: Gemma's activation, scale, soft-caps and
/// windows, Qwen3-MoE's experts, Mistral's window.
fn family_settings(meta: &ArchMetadata, family: Family, config: &mut LmConfig) -> Result<(), GgufError> {
    let file = meta.file;
    let window = file.optional_usize(&meta.key("attention.sliding_window"))?;
    match family {
        Family::Gemma2 | Family::Gemma3 => {
            config.hidden_activation = Some("gelu_pytorch_tanh".into());
            config.sliding_window = window;
            // llama.cpp scales scores by 1/√head_dim, or 1/√(hidden/heads) for Gemma 3 27B (62 layers).
            let head_dim = config.head_dim();
            let scalar = match family == Family::Gemma3 && config.num_hidden_layers == 62 {
                true => config.hidden_size / config.num_attention_heads,
                false => head_dim,
            };
            config.query_pre_attn_scalar = Some(scalar as f64);
            config.attn_logit_softcapping = meta.optional_float("attn_logit_softcapping")?;
            config.final_logit_softcapping = meta.optional_float("final_logit_softcapping")?;
            if family == Family::Gemma3 {
                // Not in the metadata of most files: llama.cpp's fixed values for Gemma 3.
                config.sliding_window_pattern = Some(meta.usize_or("attention.sliding_window_pattern", 6)?);
                config.rope_local_base_freq = Some(10_000.0);
            }
        }
        Family::Qwen3Moe => {
            config.num_experts = Some(file.get_usize(&meta.key("expert_count"))?);
            config.num_experts_per_tok = Some(file.get_usize(&meta.key("expert_used_count"))?);
            config.moe_intermediate_size = Some(file.get_usize(&meta.key("expert_feed_forward_length"))?);
            // llama.cpp renormalises the chosen experts' weights for Qwen3-MoE (transformers'
            // GGUF loader sets the same).
            config.norm_topk_prob = true;
            config.router_aux_loss_coef = Some(0.001);
        }
        Family::Mistral => config.sliding_window = window,
        _ => {}
    }
    Ok(())
}

/// The tensors a `config` model's GGUF file holds, by llama.cpp's names (biases aside).
fn expected_tensors(config: &LmConfig) -> Vec<String> {
    let family = config.family();
    let mut names = vec!["token_embd.weight".to_string(), "output_norm.weight".to_string()];
    if !config.tie_word_embeddings {
        names.push("output.weight".into());
    }
    for i in 0..config.num_hidden_layers {
        let mut parts = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"];
        if config.qk_norm() {
            parts.extend(["attn_q_norm", "attn_k_norm"]);
        }
        if family.norm_adds_one() {
            parts.extend(["post_attention_norm", "post_ffw_norm"]);
        }
        match config.is_moe_layer(i) {
            true => parts.extend(["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]),
            false => parts.extend(["ffn_gate", "ffn_up", "ffn_down"]),
        }
        names.extend(parts.iter().map(|part| format!("blk.{i}.{part}.weight")));
    }
    names
}

/// Refuses a file whose tensors are not those its architecture has: the first one missing, or
/// the first one no layer of it has (a bias is accepted on any projection).
fn check_tensor_set(file: &GgufFile, config: &LmConfig) -> Result<(), GgufError> {
    let expected = expected_tensors(config);
    let arch = file.get_str("general.architecture")?;
    if let Some(missing) = expected.iter().find(|name| file.tensor(name).is_none()) {
        return Err(file.tensor_error(
            missing,
            format!(
                "missing: a `{arch}` model of {} layers has it",
                config.num_hidden_layers
            ),
        ));
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(String::as_str).collect();
    let bias = |name: &str| {
        name.strip_suffix(".bias")
            .is_some_and(|base| known.contains(format!("{base}.weight").as_str()))
    };
    if let Some(extra) = file
        .tensors
        .iter()
        .find(|t| !known.contains(t.name.as_str()) && !bias(&t.name))
    {
        return Err(file.tensor_error(
            &extra.name,
            format!(
                "unexpected: a `{arch}` model of {} layers has no such tensor",
                config.num_hidden_layers
            ),
        ));
    }
    Ok(())
}

/// The Hugging Face name of GGUF tensor `name` (llama.cpp's `tensor_mapping.py`, reversed) in a
/// `family` model; a stacked expert tensor (`ffn_gate_exps`) names its expert `{expert}`.
fn hf_name(name: &str, family: Family) -> Option<String> {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(fixed) = fixed {
        return Some(fixed.into());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    // Gemma's four norms: llama.cpp's `ffn_norm` is the one before the MLP.
    let sandwich = family.norm_adds_one();
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" if sandwich => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" if sandwich => "post_attention_layernorm",
        "post_ffw_norm" if sandwich => "post_feedforward_layernorm",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "ffn_gate_inp" if family == Family::Qwen3Moe => "mlp.gate",
        "ffn_gate_exps" if family == Family::Qwen3Moe => "mlp.experts.{expert}.gate_proj",
        "ffn_up_exps" if family == Family::Qwen3Moe => "mlp.experts.{expert}.up_proj",
        "ffn_down_exps" if family == Family::Qwen3Moe => "mlp.experts.{expert}.down_proj",
        _ => return None,
    };
    matches!(suffix, "weight" | "bias").then(|| format!("model.layers.{layer}.{module}.{suffix}"))
}

/// The matrices of GGUF tensor `info` under their Hugging Face names: itself, or (a stacked
/// expert tensor, `[experts, out, in]`) one per expert, each a view of its slice of the bytes.
fn matrices(file: &GgufFile, info: &TensorInfo, family: Family) -> Result<Vec<(String, TensorInfo)>, GgufError> {
    let name = hf_name(&info.name, family).ok_or_else(|| {
        file.tensor_error(
            &info.name,
            format!("has no Hugging Face counterpart in a `{}` model", family.model_type()),
        )
    })?;
    if !name.contains("{expert}") {
        return Ok(vec![(name, info.clone())]);
    }
    let [experts, rows, cols] = <[usize; 3]>::try_from(info.shape())
        .map_err(|_| file.tensor_error(&info.name, "a stacked expert tensor must have three dimensions"))?;
    let per_expert = rows * cols;
    if !per_expert.is_multiple_of(info.kind.block_size()) {
        return Err(file.tensor_error(&info.name, "an expert's slice does not split into whole blocks"));
    }
    let bytes = per_expert / info.kind.block_size() * info.kind.block_bytes();
    Ok((0..experts)
        .map(|e| {
            let start = info.bytes.start + e * bytes;
            let slice = TensorInfo {
                name: format!("{}[{e}]", info.name),
                dims: vec![cols, rows],
                kind: info.kind,
                bytes: start..start + bytes,
            };
            (name.replace("{expert}", &e.to_string()), slice)
        })
        .collect())
}

/// Every tensor dequantised under its Hugging Face name; llama.cpp's Q/K row interleaving
/// undone for the architectures it applies it to, and the `+ 1` it folds into Gemma's norms.
fn tensors(file: &GgufFile, config: &LmConfig) -> Result<Tensors, GgufError> {
    let family = config.family();
    let mut out = Tensors::new();
    for (name, info) in file
        .tensors
        .iter()
        .map(|info| matrices(file, info, family))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
    {
        let info = &info;
        let shape = info.shape();
        let mut values = file.dequantize(info);
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(file.tensor_error(&info.name, format!("element {bad} is {}", values[bad])));
        }
        if family.norm_adds_one() && name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        if permuted(family) && (info.name.contains(".attn_q.") || info.name.contains(".attn_k.")) {
            let heads = match info.name.contains(".attn_q.") {
                true => config.num_attention_heads,
                false => config.kv_heads(),
            };
            let rows = shape[0];
            if !rows.is_multiple_of(2 * heads) {
                return Err(file.tensor_error(
                    &info.name,
                    format!("{rows} rows do not split into {heads} heads of pairs"),
                ));
            }
            values = unpermute_rows(&values, rows, heads);
        }
        out.insert(name, (shape, values));
    }
    Ok(out)
}

/// The quantised weight matrices, as codes and block scales transposed to `[in, out]` (Q/K
/// rows unpermuted as in [`tensors`]): exactly the values [`tensors`] dequantises.
fn packed(file: &GgufFile, config: &LmConfig) -> Result<BTreeMap<String, PackedMatrix>, GgufError> {
    let family = config.family();
    let mut out = BTreeMap::new();
    for info in &file.tensors {
        let matrices = match info.name.as_str() {
            "token_embd.weight" if config.tie_word_embeddings => vec![("lm_head.weight".to_string(), info.clone())],
            // The router multiplies by its own (dequantised) weights: no packed form.
            name if name.contains("ffn_gate_inp") => continue,
            name if name.ends_with(".weight") && !name.contains("norm") && name != "token_embd.weight" => {
                match hf_name(name, family) {
                    Some(_) => matrices(file, info, family)?,
                    None => continue,
                }
            }
            _ => continue,
        };
        for (name, info) in matrices {
            if let Some(packed) = packed_matrix(file, &info, config)? {
                out.insert(name, packed);
            }
        }
    }
    Ok(out)
}

/// One tensor's codes and scales, `[in, out]`, or `None` for a float type.
fn packed_matrix(file: &GgufFile, info: &TensorInfo, config: &LmConfig) -> Result<Option<PackedMatrix>, GgufError> {
    let Some(layout) = info.kind.codes() else {
        return Ok(None);
    };
    let shape = info.shape();
    let (rows, cols) = (shape[0], shape.get(1).copied().unwrap_or(1));
    let sub = layout.sub_block;
    if !cols.is_multiple_of(info.kind.block_size()) {
        return Err(file.tensor_error(&info.name, format!("rows of {cols} do not split into blocks")));
    }
    // Row-major `[out, in]` as stored: codes, and one scale (offset) per sub-block of a row.
    let (mut codes, mut scales, mut offsets) = (
        vec![0i8; rows * cols],
        vec![0.0f32; rows * cols / sub],
        vec![0.0f32; rows * cols / sub],
    );
    let per_block = info.kind.block_size() / sub;
    let blocks = file.data(info).chunks_exact(info.kind.block_bytes());
    for (b, block) in blocks.enumerate() {
        let (c, s) = (b * info.kind.block_size(), b * per_block);
        info.kind.block_codes(
            block,
            &mut codes[c..][..info.kind.block_size()],
            &mut scales[s..][..per_block],
            &mut offsets[s..][..per_block],
        );
    }
    if permuted(config.family()) && (info.name.contains(".attn_q.") || info.name.contains(".attn_k.")) {
        let heads = match info.name.contains(".attn_q.") {
            true => config.num_attention_heads,
            false => config.kv_heads(),
        };
        codes = reorder_rows(&codes, rows, heads, true);
        scales = reorder_rows(&scales, rows, heads, true);
        offsets = reorder_rows(&offsets, rows, heads, true);
    }
    use rein_kernels::transposed;
    let offsets = layout.offsets.then(|| transposed(&offsets, rows, cols / sub));
    let (codes, scales) = (transposed(&codes, rows, cols), transposed(&scales, rows, cols / sub));
    PackedMatrix::new([cols, rows], sub, &codes, scales, offsets)
        .map(Some)
        .map_err(|e| file.tensor_error(&info.name, e.to_string()))
}

/// Undoes llama.cpp's `permute` of Q/K projection rows: within each head, GGUF stores rotary
/// pairs interleaved (row `2i + t`) where Hugging Face keeps halves (row `t · half + i`).
/// `values` is `rows × cols` row-major (a bias is `rows × 1`).
fn unpermute_rows(values: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    reorder_rows(values, rows, heads, true)
}

/// Moves each head's rows between the interleaved and the halves order.
fn reorder_rows<T: Copy + Default>(values: &[T], rows: usize, heads: usize, to_halves: bool) -> Vec<T> {
    let cols = values.len() / rows.max(1);
    let head_rows = rows / heads;
    let half = head_rows / 2;
    let mut out = vec![T::default(); values.len()];
    for h in 0..heads {
        for i in 0..half {
            for t in 0..2 {
                let interleaved = h * head_rows + 2 * i + t;
                let halves = h * head_rows + t * half + i;
                let (from, to) = if to_halves {
                    (interleaved, halves)
                } else {
                    (halves, interleaved)
                };
                out[to * cols..(to + 1) * cols].copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_map_to_hugging_face() {
        let llama = |name| hf_name(name, Family::Llama);
        assert_eq!(
            llama("blk.12.attn_q.weight").as_deref(),
            Some("model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(
            llama("blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(
            llama("blk.3.attn_v.bias").as_deref(),
            Some("model.layers.3.self_attn.v_proj.bias")
        );
        assert_eq!(llama("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(llama("blk.x.attn_q.weight"), None);
        assert_eq!(llama("rope_freqs.weight"), None);
        assert_eq!(llama("blk.0.post_ffw_norm.weight"), None, "Gemma's norm in a Llama");
        // Gemma's four norms.
        let gemma = |name| hf_name(name, Family::Gemma3);
        assert_eq!(
            gemma("blk.1.ffn_norm.weight").as_deref(),
            Some("model.layers.1.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            gemma("blk.1.post_attention_norm.weight").as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(
            gemma("blk.1.attn_k_norm.weight").as_deref(),
            Some("model.layers.1.self_attn.k_norm.weight")
        );
        let moe = |name| hf_name(name, Family::Qwen3Moe);
        assert_eq!(
            moe("blk.2.ffn_gate_inp.weight").as_deref(),
            Some("model.layers.2.mlp.gate.weight")
        );
        assert_eq!(
            moe("blk.2.ffn_down_exps.weight").as_deref(),
            Some("model.layers.2.mlp.experts.{expert}.down_proj.weight")
        );
        assert_eq!(hf_name("blk.2.ffn_down_exps.weight", Family::Qwen3), None);
    }

    #[test]
    fn unpermute_matches_the_reference_reshape() {
        // llama.cpp: w.reshape(heads, 2, rows/heads/2, cols).swapaxes(1, 2).reshape(rows, cols),
        // for 2 heads of 4 rows, one column: HF rows [a0 a1 b0 b1 | …] become [a0 b0 a1 b1 | …].
        let hf: Vec<f32> = (0..8).map(|v| v as f32).collect();
        assert_eq!(reorder_rows(&hf, 8, 2, false), vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    }

    proptest! {
        #[test]
        fn permutation_round_trips(heads in 1usize..5, half in 1usize..5, cols in 1usize..4) {
            let rows = heads * half * 2;
            let values: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
            let there = reorder_rows(&values, rows, heads, false);
            prop_assert_eq!(unpermute_rows(&there, rows, heads), values);
        }
    }
}
