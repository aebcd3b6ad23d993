//! LoRA adapters in PEFT's format, so `PeftModel.from_pretrained(base, dir)` loads what rein
//! trains and rein loads what PEFT saved: a directory with
//!
//! - `adapter_config.json`: `peft_type = "LORA"`, `r`, `lora_alpha`, `lora_dropout`,
//!   `target_modules`, `use_rslora`, …;
//! - `adapter_model.safetensors`: per adapted layer
//!   `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_A.weight` (`[r, in]`) and
//!   `….lora_B.weight` (`[out, r]`), the transposes of rein's `A` and `B` (torch's `Linear`
//!   stores `[out, in]`). A vision-language model's decoder sits where transformers keeps it
//!   (`model.text_model.layers…` in Idefics3, `model.language_model.layers…` in Qwen2-VL), and
//!   its `target_modules` is a regular expression over the decoder's paths, so PEFT adapts the
//!   decoder's modules and not the vision tower's of the same names; rein reads either form.
//!
//! A vision encoder's adapters (`[lora] vision = true`) are named by the vision tower's paths
//! (`model.vision_model.encoder.layers.{i}.self_attn.q_proj`, `model.visual.blocks.{i}.attn.qkv`)
//! and added to the regular expression; an adapter whose targets select vision modules (PEFT's
//! module names select the vision tower's modules of those names too) loads onto the encoder.
//!
//! Variants rein does not implement (DoRA, biases, per-layer ranks, `fan_in_fan_out`, extra
//! trained modules) are refused with an error naming the field.

use std::path::Path;

use burn::tensor::{Tensor, TensorData};
use serde_json::{Value, json};

use super::LoadError;
use super::lora::{LINEAR_MODULES, LoraSpec};
use super::model::CausalLm;
use super::model_dir::{Weights, read_json};
use crate::backend::ReinBackend;
use crate::vision::ImageSide;

/// The adapter's settings.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Where transformers keeps `model`'s decoder: `model`, or a vision-language model's
/// (`model.language_model`).
fn decoder_path<B: ReinBackend>(model: &CausalLm<B>) -> &'static str {
    model.vision.as_ref().map_or("model", |v| v.decoder_path())
}

/// The transformers path of the module at `path` in decoder layer `layer` of the decoder at
/// `decoder` (`self_attn.q_proj`, `mlp.experts.3.up_proj`): `model.layers.0.self_attn.q_proj`.
fn module_path(decoder: &str, layer: usize, path: &str) -> String {
    format!("{decoder}.layers.{layer}.{path}")
}

/// PEFT's name for factor `A` or `B` of the adapter on the module at the transformers path `module`.
fn factor_name(module: &str, factor: char) -> String {
    format!("base_model.model.{module}.lora_{factor}.weight")
}

/// PEFT's `target_modules`: names (or `all-linear`), or a regular expression.
enum Targets {
    /// Each a whole path or a suffix of one after a dot (`q_proj`, `layers.0.self_attn.q_proj`).
    Names(Vec<String>),
    /// Fully matching the paths it selects.
    Pattern(regex::Regex),
}

impl Targets {
    /// Whether the module at `path` is selected.
    fn selects(&self, path: &str) -> bool {
        match self {
            Targets::Names(names) => names
                .iter()
                .any(|t| t == "all-linear" || path == t || path.ends_with(&format!(".{t}"))),
            Targets::Pattern(pattern) => pattern.is_match(path),
        }
    }
}

fn adapter_error(path: &Path, reason: impl Into<String>) -> LoadError {
    LoadError::Adapter {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Writes `model`'s adapters to `dir` in PEFT's format; `base_model` goes into the config's
/// `base_model_name_or_path`.
pub fn save_adapter<B: ReinBackend>(model: &CausalLm<B>, dir: &Path, base_model: &str) -> Result<(), LoadError> {
    let Some(lora) = &model.lora else {
        return Err(adapter_error(dir, "the model has no LoRA adapters to save"));
    };
    std::fs::create_dir_all(dir).map_err(|e| adapter_error(dir, e.to_string()))?;
    let decoder = decoder_path(model);
    let mut tensors = crate::safetensors_file::Tensors::new();
    let mut put = |name: String, t: Tensor<B, 2>| {
        let dims = t.dims().to_vec();
        let values = t.into_data().convert::<f32>().to_vec::<f32>().unwrap_or_default();
        tensors.insert(name, (dims, values));
    };
    let decoder_adapters = (lora.layers.iter().enumerate()).flat_map(|(i, layer)| {
        layer
            .adapters()
            .into_iter()
            .map(move |(m, a)| (module_path(decoder, i, &m), a))
    });
    let vision_adapters = model.vision.iter().flat_map(|v| v.adapters());
    for (module, adapter) in decoder_adapters.chain(vision_adapters) {
        if let Some(adapter) = adapter {
            put(factor_name(&module, 'A'), adapter.a.val().transpose());
            put(factor_name(&module, 'B'), adapter.b.val().transpose());
        }
    }
    let weights = dir.join(WEIGHTS_FILE);
    crate::safetensors_file::write(&weights, &tensors, "pt").map_err(|e| adapter_error(&weights, e.to_string()))?;
    let spec = lora.spec();
    // A vision-language model's vision tower may have modules of the same names: the targets
    // are the decoder's paths.
    let targets = match &model.vision {
        None => json!(spec.target_modules()),
        Some(vision) => {
            let mut pattern = format!(
                r"{}\.layers\.\d+\.(self_attn|mlp)(\.experts\.\d+)?\.({})",
                regex::escape(decoder),
                spec.target_modules().join("|")
            );
            if let Some(adapted) = vision_pattern(vision) {
                pattern = format!("{pattern}|{adapted}");
            }
            json!(pattern)
        }
    };
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": targets,
        "use_rslora": spec.rslora,
        "use_dora": false,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    let path = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config).map_err(|e| adapter_error(&path, e.to_string()))?;
    std::fs::write(&path, text + "\n").map_err(|e| adapter_error(&path, e.to_string()))
}

/// A regular expression over the transformers paths of the vision encoder's adapted modules
/// (`model\.visual\.blocks\.\d+\.(attn\.qkv|…)`); `None` when it has no adapters.
fn vision_pattern<B: ReinBackend>(vision: &ImageSide<B>) -> Option<String> {
    let blocks = vision.block_path();
    let mut modules: Vec<String> = (vision.adapters().into_iter())
        .filter(|(_, adapter)| adapter.is_some())
        .filter_map(|(path, _)| {
            let within = path.strip_prefix(blocks)?.strip_prefix('.')?;
            let (_, module) = within.split_once('.')?;
            Some(regex::escape(module))
        })
        .collect();
    modules.sort();
    modules.dedup();
    (!modules.is_empty()).then(|| format!(r"{}\.\d+\.({})", regex::escape(blocks), modules.join("|")))
}

/// The spec an `adapter_config.json` describes for `model`, and its `target_modules` as written
/// (PEFT writes `all-linear` out as every layer's path; a regular expression selects the
/// modules of `model`'s decoder whose paths it matches).
fn read_spec<B: ReinBackend>(path: &Path, model: &CausalLm<B>) -> Result<(LoraSpec, Targets), LoadError> {
    let config = read_json(path)?;
    let field = |name: &str, reason: String| adapter_error(path, format!("`{name}`: {reason}"));
    if config["peft_type"] != "LORA" {
        return Err(field("peft_type", format!("{} is not \"LORA\"", config["peft_type"])));
    }
    let is_set = |name: &str| match &config[name] {
        Value::Null | Value::Bool(false) => false,
        Value::Object(map) => !map.is_empty(),
        Value::Array(list) => !list.is_empty(),
        Value::String(s) => s != "none",
        _ => true,
    };
    let unsupported = [
        ("use_dora", "DoRA"),
        ("fan_in_fan_out", "transposed (Conv1D) layers"),
        ("bias", "trained biases"),
        ("rank_pattern", "per-layer ranks"),
        ("alpha_pattern", "per-layer alphas"),
        ("layers_to_transform", "adapting only some layers"),
        ("modules_to_save", "fully trained extra modules"),
    ];
    for (name, what) in unsupported {
        if is_set(name) {
            return Err(field(name, format!("{what} are not supported ({})", config[name])));
        }
    }
    let rank = config["r"]
        .as_u64()
        .ok_or_else(|| field("r", format!("{} is not a positive integer", config["r"])))?;
    let alpha = config["lora_alpha"]
        .as_f64()
        .ok_or_else(|| field("lora_alpha", format!("{} is not a number", config["lora_alpha"])))?;
    let targets = match &config["target_modules"] {
        Value::Array(list) => Targets::Names(list.iter().filter_map(|v| v.as_str().map(String::from)).collect()),
        Value::String(s) if s == "all-linear" => Targets::Names(vec![s.clone()]),
        Value::String(s) => Targets::Pattern(
            regex::Regex::new(&format!("^(?:{s})$")).map_err(|e| field("target_modules", e.to_string()))?,
        ),
        other => {
            return Err(field(
                "target_modules",
                format!("{other} is not a list of module names, \"all-linear\" or a regular expression"),
            ));
        }
    };
    // The module names the paths end in: the names', or those of the decoder's modules the
    // pattern selects.
    let mut modules: Vec<String> = match &targets {
        Targets::Names(names) => (names.iter())
            .map(|t| t.rsplit('.').next().unwrap_or(t).to_string())
            .collect(),
        Targets::Pattern(_) => {
            let decoder = decoder_path(model);
            (model.layers.iter().enumerate())
                .flat_map(|(i, layer)| layer.linears().into_iter().map(move |(path, _)| (i, path)))
                .filter(|(i, path)| targets.selects(&module_path(decoder, *i, path)))
                .map(|(_, path)| path.rsplit('.').next().unwrap_or_default().to_string())
                .collect()
        }
    };
    modules.sort();
    modules.dedup();
    // A vision encoder whose modules the targets select gets adapters too (PEFT's module names
    // select the vision tower's modules of those names as well); names only the vision
    // encoder has (`qkv`, `fc1`) are not the decoder's.
    let vision_paths: Vec<String> = (model.vision.iter())
        .flat_map(|v| v.adaptable_linears().into_iter().flatten().map(|(path, _)| path))
        .collect();
    let vision = vision_paths.iter().any(|path| targets.selects(path));
    modules.retain(|m| {
        let vision_only =
            !LINEAR_MODULES.contains(&m.as_str()) && vision_paths.iter().any(|p| p.ends_with(&format!(".{m}")));
        !vision_only
    });
    let spec = LoraSpec {
        rank: rank as usize,
        alpha: alpha as f32,
        dropout: config["lora_dropout"].as_f64().unwrap_or(0.0),
        targets: modules,
        rslora: config["use_rslora"].as_bool().unwrap_or(false),
        vision,
    };
    spec.validate().map_err(|(name, reason)| field(name, reason))?;
    Ok((spec, targets))
}

/// `model` with the adapter in `dir` (PEFT's format) attached, base weights frozen
/// ([`CausalLm::with_lora`]). Every tensor of the file must belong to an adapted layer of
/// this architecture, with the shape the config's rank implies.
pub fn load_adapter<B: ReinBackend>(
    model: CausalLm<B>,
    dir: &Path,
    device: &B::Device,
) -> Result<CausalLm<B>, LoadError> {
    let (spec, targets) = read_spec(&dir.join(CONFIG_FILE), &model)?;
    let decoder = decoder_path(&model);
    let path = dir.join(WEIGHTS_FILE);
    if !path.is_file() {
        return Err(adapter_error(&path, "no such file (an adapter directory holds it)"));
    }
    let weights = Weights::from_files(vec![path.clone()])?;
    // Every factor is replaced by the file's below: the draw does not matter.
    let mut model = model.with_lora(&spec, &mut rein_core::SeededRng::new(0), device);
    let mut used = std::collections::HashSet::new();
    let Some(lora) = model.lora.as_mut() else {
        return Err(adapter_error(dir, "no adapters were made"));
    };
    let mut slots: Vec<(String, &mut Option<super::lora::Lora<B>>)> = (lora.layers.iter_mut().enumerate())
        .flat_map(|(i, layer)| {
            (layer.adapters_mut().into_iter()).map(move |(module, slot)| (module_path(decoder, i, &module), slot))
        })
        .collect();
    slots.extend(model.vision.iter_mut().flat_map(|v| v.adapters_mut()));
    for (module, slot) in slots {
        if !targets.selects(&module) {
            *slot = None;
        }
        let Some(fresh) = slot.as_ref() else { continue };
        let [input, rank] = fresh.a.dims();
        let output = fresh.b.dims()[1];
        let factor = |factor: char, shape: [usize; 2]| -> Result<Tensor<B, 2>, LoadError> {
            let name = factor_name(&module, factor);
            match weights.shape(&name) {
                Some(found) if found != shape => Err(adapter_error(
                    &path,
                    format!("tensor `{name}` has shape {found:?}, but r = {rank} and the layer imply {shape:?}"),
                )),
                _ => {
                    let values = weights.get(&name, &shape)?;
                    Ok(Tensor::<B, 2>::from_data(TensorData::new(values, shape), device).transpose())
                }
            }
        };
        let (a, b) = (factor('A', [rank, input])?, factor('B', [output, rank])?);
        used.extend([factor_name(&module, 'A'), factor_name(&module, 'B')]);
        *slot = Some(fresh.with_factors(a, b));
    }
    let unused: Vec<&str> = weights.names().into_iter().filter(|n| !used.contains(*n)).collect();
    if !unused.is_empty() {
        return Err(adapter_error(
            &path,
            format!(
                "tensors for layers this model or the config's target_modules do not have: {}",
                unused.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    Ok(model)
}
