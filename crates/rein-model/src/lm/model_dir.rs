//! Reading and writing model directories in Hugging Face format (`config.json`, safetensors,
//! tokenizer files): what transformers, PEFT, vLLM and SGLang load. Not a training checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::{Embedding, LayerNorm, LayerNormConfig, Linear};
use burn::tensor::{Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use super::LmConfig;
use super::LoadError;
use super::feed_forward::FeedForward;
use super::model::{Attention, CausalLm, DecoderLayer, MlpBlock};
use super::moe::MixtureOfExperts;
use super::rms_norm::RmsNorm;
use crate::backend::ReinBackend;

/// The weights of a checkpoint: every safetensors file's bytes and which file holds each name.
pub(crate) struct Weights {
    files: Vec<(PathBuf, Vec<u8>)>,
    index: HashMap<String, usize>,
    used: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl Weights {
    pub(crate) fn open(dir: &Path) -> Result<Self, LoadError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if single.is_file() {
            vec![single]
        } else if index_path.is_file() {
            let index = read_json(&index_path)?;
            let map = index["weight_map"].as_object().ok_or_else(|| LoadError::Json {
                path: index_path.clone(),
                reason: "no `weight_map` object".into(),
            })?;
            let mut shards: Vec<PathBuf> = map.values().filter_map(|v| v.as_str()).map(|s| dir.join(s)).collect();
            shards.sort();
            shards.dedup();
            shards
        } else {
            return Err(LoadError::Io {
                path: dir.to_path_buf(),
                reason: "no model.safetensors or model.safetensors.index.json".into(),
            });
        };
        Self::from_files(names)
    }

    /// The tensors of the safetensors files `names`.
    pub(super) fn from_files(names: Vec<PathBuf>) -> Result<Self, LoadError> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for path in names {
            let bytes = read(&path)?;
            let parsed = SafeTensors::deserialize(&bytes).map_err(|e| LoadError::Safetensors {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            for name in parsed.names() {
                index.insert(name.to_string(), files.len());
            }
            files.push((path, bytes));
        }
        Ok(Self {
            files,
            index,
            used: Default::default(),
        })
    }

    /// The shape of tensor `name`, if there is one.
    pub(super) fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let (_, bytes) = &self.files[*self.index.get(name)?];
        Some(
            SafeTensors::deserialize(bytes)
                .ok()?
                .tensor(name)
                .ok()?
                .shape()
                .to_vec(),
        )
    }

    /// Every tensor name, sorted.
    pub(super) fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.index.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The tensor `name` as f32, checked against `shape`.
    pub(crate) fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let Some(&file) = self.index.get(name) else {
            return Err(LoadError::MissingTensor {
                name: name.into(),
                files: self
                    .files
                    .iter()
                    .map(|(p, _)| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
                    .collect(),
            });
        };
        let (path, bytes) = &self.files[file];
        let parsed = SafeTensors::deserialize(bytes).map_err(|e| LoadError::Safetensors {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let view = parsed.tensor(name).map_err(|e| LoadError::Safetensors {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if view.shape() != shape {
            return Err(LoadError::Shape {
                name: name.into(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        self.used.borrow_mut().insert(name.to_string());
        let data = view.data();
        let values = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()) as f32)
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(LoadError::Dtype {
                    name: name.into(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(values)
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Tensors never read, except ones known to be redundant.
    pub(crate) fn unused(&self, tied: bool) -> Vec<String> {
        let used = self.used.borrow();
        let mut names: Vec<String> = self
            .index
            .keys()
            .filter(|n| !(used.contains(*n) || n.ends_with("rotary_emb.inv_freq") || tied && *n == "lm_head.weight"))
            .cloned()
            .collect();
        names.sort();
        names.truncate(10);
        names
    }
}

pub(crate) use super::json_file::{read, read_json};

/// Reads `config.json` (transformers 4 and 5 layouts).
pub(crate) fn read_config(dir: &Path) -> Result<(LmConfig, serde_json::Value), LoadError> {
    let path = dir.join("config.json");
    let raw = read_json(&path)?;
    let config = LmConfig::from_json(raw.clone()).map_err(|e| LoadError::Json { path, reason: e })?;
    config.validate()?;
    Ok((config, raw))
}

/// Loads the causal LM in the located model directory `dir` onto `device`.
pub(crate) fn load_causal_lm<B: ReinBackend>(dir: &Path, device: &B::Device) -> Result<CausalLm<B>, LoadError> {
    let (config, _) = read_config(dir)?;
    let weights = Weights::open(dir)?;
    let Decoder {
        embed_tokens,
        layers,
        norm,
    } = Decoder::read(&weights, &config, "model", device)?;
    let tied = config.tie_word_embeddings || !weights.has("lm_head.weight");
    let lm_head = if tied {
        None
    } else {
        Some(weights.linear("lm_head", config.hidden_size, config.vocab_size, false, device)?)
    };
    let unused = weights.unused(tied);
    if !unused.is_empty() {
        return Err(LoadError::UnexpectedTensors { names: unused });
    }
    let mut config = config;
    config.tie_word_embeddings = tied;
    let model = CausalLm::from_parts(config, embed_tokens, layers, norm, lm_head);
    // A quantised file's weights as stored (a converted GGUF model): inference reads them.
    let packed = dir.join(rein_gguf::packed_file::FILE);
    if !packed.is_file() {
        return Ok(model);
    }
    let matrices = rein_gguf::packed_file::read(&packed).map_err(|reason| LoadError::Io { path: packed, reason })?;
    Ok(model.with_packed(
        matrices
            .into_iter()
            .map(|(name, m)| (name, std::sync::Arc::new(m)))
            .collect(),
    ))
}

/// The decoder every model of the family shares (`model.*`): embeddings, layers, final norm.
pub(crate) struct Decoder<B: ReinBackend> {
    pub(crate) embed_tokens: Embedding<B>,
    pub(crate) layers: Vec<DecoderLayer<B>>,
    pub(crate) norm: RmsNorm<B>,
}

impl<B: ReinBackend> Decoder<B> {
    /// Reads the `{root}.*` tensors of `weights` (`model` in a causal LM's checkpoint), shaped by
    /// `config`.
    pub(crate) fn read(
        weights: &Weights,
        config: &LmConfig,
        root: &str,
        device: &B::Device,
    ) -> Result<Self, LoadError> {
        let (hidden, inter) = (config.hidden_size, config.intermediate_size);
        let head_dim = config.head_dim();
        let (q_out, kv_out) = (config.num_attention_heads * head_dim, config.kv_heads() * head_dim);
        let linear = |prefix: &str, input: usize, output: usize, bias: bool| {
            weights.linear::<B>(prefix, input, output, bias, device)
        };
        let adds_one = config.family().norm_adds_one();
        let norm_of = |name: &str, width: usize| -> Result<RmsNorm<B>, LoadError> {
            Ok(RmsNorm::new(
                weights.vector(name, width, device)?,
                config.rms_norm_eps,
                adds_one,
            ))
        };
        let norm = |name: &str| norm_of(name, hidden);
        let activation = config.gate_activation();
        let feed_forward = |prefix: &str, width: usize| -> Result<FeedForward<B>, LoadError> {
            Ok(FeedForward::new(
                linear(&format!("{prefix}.gate_proj"), hidden, width, config.mlp_bias)?,
                linear(&format!("{prefix}.up_proj"), hidden, width, config.mlp_bias)?,
                linear(&format!("{prefix}.down_proj"), width, hidden, config.mlp_bias)?,
                activation,
            ))
        };
        let embed = weights.get(&format!("{root}.embed_tokens.weight"), &[config.vocab_size, hidden])?;
        let embed_tokens = Embedding {
            weight: Param::from_tensor(Tensor::from_data(
                TensorData::new(embed, [config.vocab_size, hidden]),
                device,
            )),
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("{root}.layers.{i}");
            let norms = match config.qk_norm() {
                true => Some((
                    norm_of(&format!("{p}.self_attn.q_norm.weight"), head_dim)?,
                    norm_of(&format!("{p}.self_attn.k_norm.weight"), head_dim)?,
                )),
                false => None,
            };
            let attn = Attention::new(
                [
                    linear(&format!("{p}.self_attn.q_proj"), hidden, q_out, config.qkv_bias())?,
                    linear(&format!("{p}.self_attn.k_proj"), hidden, kv_out, config.qkv_bias())?,
                    linear(&format!("{p}.self_attn.v_proj"), hidden, kv_out, config.qkv_bias())?,
                    linear(&format!("{p}.self_attn.o_proj"), q_out, hidden, config.o_bias())?,
                ],
                norms,
                config,
                i,
            );
            let mlp = match config.moe().filter(|_| config.is_moe_layer(i)) {
                Some(moe) => {
                    let experts = (0..moe.experts)
                        .map(|e| feed_forward(&format!("{p}.mlp.experts.{e}"), moe.intermediate_size))
                        .collect::<Result<_, _>>()?;
                    let router = linear(&format!("{p}.mlp.gate"), hidden, moe.experts, false)?;
                    MlpBlock::Experts(MixtureOfExperts::new(router, experts, moe.top_k, moe.norm_topk_prob))
                }
                None => MlpBlock::Dense(feed_forward(&format!("{p}.mlp"), inter)?),
            };
            let sandwich = |name: &str| {
                config
                    .sandwich_norms()
                    .then(|| norm(&format!("{p}.{name}.weight")))
                    .transpose()
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(&format!("{p}.input_layernorm.weight"))?,
                self_attn: attn,
                post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
                pre_feedforward_layernorm: sandwich("pre_feedforward_layernorm")?,
                post_feedforward_layernorm: sandwich("post_feedforward_layernorm")?,
                mlp,
            });
        }
        Ok(Self {
            embed_tokens,
            layers,
            norm: norm(&format!("{root}.norm.weight"))?,
        })
    }
}

impl Weights {
    /// The `[n]` tensor `name`.
    pub(crate) fn vector<B: ReinBackend>(
        &self,
        name: &str,
        n: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, LoadError> {
        Ok(Tensor::from_data(TensorData::new(self.get(name, &[n])?, [n]), device))
    }

    /// The LayerNorm `name` (`{name}.weight` and `{name}.bias`, both `[width]`) of epsilon `eps`.
    pub(crate) fn layer_norm<B: ReinBackend>(
        &self,
        name: &str,
        width: usize,
        eps: f64,
        device: &B::Device,
    ) -> Result<LayerNorm<B>, LoadError> {
        let mut norm = LayerNormConfig::new(width).with_epsilon(eps).init(device);
        norm.gamma = Param::from_tensor(self.vector(&format!("{name}.weight"), width, device)?);
        norm.beta = Some(Param::from_tensor(self.vector(
            &format!("{name}.bias"),
            width,
            device,
        )?));
        Ok(norm)
    }

    /// The linear layer `prefix` (`{prefix}.weight`, and `{prefix}.bias` when `bias`). HF linear
    /// weights are `[out, in]`; burn's are `[in, out]`, stored so: the matrix kernel reads a
    /// row-major weight in place when few rows multiply it (decoding), where a transposed view
    /// would be repacked by every product.
    pub(crate) fn linear<B: ReinBackend>(
        &self,
        prefix: &str,
        input: usize,
        output: usize,
        bias: bool,
        device: &B::Device,
    ) -> Result<Linear<B>, LoadError> {
        let w = self.get(&format!("{prefix}.weight"), &[output, input])?;
        let w = rein_kernels::transposed(&w, output, input);
        let weight = Tensor::<B, 2>::from_data(TensorData::new(w, [input, output]), device);
        let bias = if bias {
            Some(Param::from_tensor(self.vector(
                &format!("{prefix}.bias"),
                output,
                device,
            )?))
        } else {
            None
        };
        Ok(Linear {
            weight: Param::from_tensor(weight),
            bias,
        })
    }
}

/// The decoder of the classifier in `dir` (no LM head) on `config`, and its head as `head`
/// reads it from the weights; any tensor left unread is an error.
pub(super) fn read_classifier<B: ReinBackend, H>(
    dir: &Path,
    config: LmConfig,
    head: impl FnOnce(&Weights, &LmConfig) -> Result<H, LoadError>,
    device: &B::Device,
) -> Result<(CausalLm<B>, H), LoadError> {
    let weights = Weights::open(dir)?;
    let Decoder {
        embed_tokens,
        layers,
        norm,
    } = Decoder::read(&weights, &config, "model", device)?;
    let head = head(&weights, &config)?;
    let unused = weights.unused(true);
    if !unused.is_empty() {
        return Err(LoadError::UnexpectedTensors { names: unused });
    }
    let config = LmConfig {
        tie_word_embeddings: true,
        ..config
    };
    Ok((CausalLm::from_parts(config, embed_tokens, layers, norm, None), head))
}

/// Writes the merged causal LM `model` (its decoder and head) to `dir` in Hugging Face format.
pub(crate) fn save_causal_lm<B: ReinBackend>(model: &CausalLm<B>, dir: &Path) -> Result<(), LoadError> {
    let mut tensors = decoder_tensors(model);
    if let Some(head) = &model.lm_head {
        tensors.insert("lm_head.weight".into(), linear_weight(head));
    }
    write_model_dir(dir, &tensors, &model.config().to_hf_json())
}

/// The tensors of `model`'s decoder (`model.*`) by their Hugging Face names, `[out, in]`
/// linear weights, with their real shapes. Its LoRA adapters, if any, are left out: merge first.
pub(crate) fn decoder_tensors<B: ReinBackend>(model: &CausalLm<B>) -> crate::safetensors_file::Tensors {
    let mut tensors = crate::safetensors_file::Tensors::new();
    let mut vector = |name: String, t: Tensor<B, 1>| {
        tensors.insert(name, vector_tensor(t));
    };
    vector("model.norm.weight".into(), model.norm.weight.val());
    let mut linears = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let attn = &layer.self_attn;
        let norms = [
            ("input_layernorm", Some(&layer.input_layernorm)),
            ("post_attention_layernorm", Some(&layer.post_attention_layernorm)),
            ("pre_feedforward_layernorm", layer.pre_feedforward_layernorm.as_ref()),
            ("post_feedforward_layernorm", layer.post_feedforward_layernorm.as_ref()),
            ("self_attn.q_norm", attn.q_norm.as_ref()),
            ("self_attn.k_norm", attn.k_norm.as_ref()),
        ];
        for (name, norm) in norms {
            if let Some(norm) = norm {
                vector(format!("{p}.{name}.weight"), norm.weight.val());
            }
        }
        if let MlpBlock::Experts(moe) = &layer.mlp {
            linears.push((format!("{p}.mlp.gate.weight"), linear_weight(&moe.gate)));
        }
        for (name, linear) in layer.linears() {
            if let Some(b) = &linear.bias {
                vector(format!("{p}.{name}.bias"), b.val());
            }
            linears.push((format!("{p}.{name}.weight"), linear_weight(linear)));
        }
    }
    let embed = model.embed_tokens.weight.val();
    tensors.insert(
        "model.embed_tokens.weight".into(),
        (embed.dims().to_vec(), floats(embed)),
    );
    tensors.extend(linears);
    tensors
}

/// A vector (a norm's weight, a bias) as a safetensors entry: its shape and values.
pub(crate) fn vector_tensor<B: ReinBackend>(t: Tensor<B, 1>) -> (Vec<usize>, Vec<f32>) {
    (t.dims().to_vec(), floats(t))
}

/// A linear layer's weight as Hugging Face stores it: `[out, in]`.
pub(crate) fn linear_weight<B: ReinBackend>(linear: &Linear<B>) -> (Vec<usize>, Vec<f32>) {
    let t = linear.weight.val().transpose();
    (t.dims().to_vec(), floats(t))
}

pub(crate) fn floats<B: ReinBackend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap_or_default()
}

/// Writes `tensors` (`model.safetensors`, f32) and `config` (`config.json`) into `dir`.
pub(crate) fn write_model_dir(
    dir: &Path,
    tensors: &crate::safetensors_file::Tensors,
    config: &str,
) -> Result<(), LoadError> {
    let io = |path: &Path, e: std::io::Error| LoadError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join("model.safetensors");
    crate::safetensors_file::write(&path, tensors, "pt").map_err(|e| LoadError::Safetensors {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config).map_err(|e| io(&config_path, e))?;
    Ok(())
}
