//! Language models against Hugging Face transformers ([`transformers`]), loading and saving
//! ([`loading`]), and the generator's invariants ([`generation`]).
//!
//! Fixtures: `tests/fixtures/lm/`, written by `gen_checkpoints.py` (transformers 5.23): tiny
//! random Qwen2 (GQA with q/k/v biases; tied embeddings with one KV head) and Llama (llama3 RoPE
//! scaling; bf16, sharded, linear RoPE scaling, tied) checkpoints, with transformers' logits and
//! greedy continuations; by `gen_families.py` (transformers 5.24): Qwen3 (its own head_dim;
//! tied, with a sliding window from its second layer), Qwen3-MoE (8 experts, top 2, a dense
//! layer between two sparse ones, with each layer's router choices and the load-balancing loss),
//! Gemma 3 (local and global layers, two RoPE bases, a window of 3), Gemma 2 (soft-capping) and
//! a Mistral with a window of 3 — every window shorter than the test sequences;
//! `chat_templates.json`, written by `gen_chat_templates.py`, holds transformers' renderings of
//! four chat templates. `tests/fixtures/vlm/`, written by `gen_idefics3.py` (transformers 5.25,
//! Pillow 13): a tiny random Idefics3 with its processor, PNG images and transformers' pixel
//! values, token ids, image features, logits and greedy continuations ([`vision`]); by
//! `gen_qwen2_vl_processor.py` (transformers 5.25, Pillow 13): Qwen2-VL's image processor's patches,
//! grids and expanded prompts for the same images ([`qwen2_vl_processor`]); by `gen_qwen2_vl.py`
//! (transformers 5.25): a tiny random Qwen2-VL with transformers' multimodal positions, image
//! features, logits and greedy continuations ([`qwen2_vl`]). Images shown in the middle of a
//! conversation read as the whole transcript does ([`images_mid_conversation`]). By
//! `gen_vision_lora.py` (PEFT 0.21.2): LoRA adapters on the vision encoders ([`vision_lora`]).

#[path = "../common/logits.rs"]
mod logits;
#[path = "../common/tiny_lm.rs"]
mod tiny_lm;

mod generation;
mod images_mid_conversation;
mod loading;
mod qwen2_vl;
mod qwen2_vl_processor;
mod transformers;
mod vision;
mod vision_lora;

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use logits::logits;
use proptest::prelude::*;
use rein_model::lm::{CausalLm, Context, KvCache, LmTokenizer, LoadError, Routing, load, save};
use rein_sampler::{GenerationConfig, generate};
use safetensors::SafeTensors;
use tiny_lm::{FAMILIES, tiny_family, tiny_model};

type B = Flex;

const CHECKPOINTS: [&str; 10] = [
    "qwen2-gqa",
    "qwen2-tied",
    "llama",
    "llama-bf16-sharded",
    "qwen3",
    "qwen3-window",
    "qwen3-moe",
    "gemma3",
    "gemma2",
    "mistral-window",
];

/// The checkpoints with bf16 reference logits (`gen_bf16_logits.py`).
const BF16_CHECKPOINTS: [&str; 4] = ["qwen2-gqa", "qwen2-tied", "llama", "llama-bf16-sharded"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm")
}

fn model(name: &str) -> CausalLm<B> {
    model_at(&fixtures().join(name))
}

fn model_at(dir: &Path) -> CausalLm<B> {
    load::<B>(dir, &Default::default()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A tensor from the `.expected.safetensors` file of `name`, as (shape, values).
fn expected(name: &str, tensor: &str) -> (Vec<usize>, Vec<f64>) {
    fixture_tensor(&format!("{name}.expected"), tensor)
}

/// A tensor from the safetensors file `{file}.safetensors` of the fixtures, as (shape, values).
fn fixture_tensor(file: &str, tensor: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(fixtures().join(format!("{file}.safetensors"))).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor(tensor).unwrap();
    let values = match view.dtype() {
        safetensors::Dtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        safetensors::Dtype::I64 => view
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("unexpected dtype {other:?}"),
    };
    (view.shape().to_vec(), values)
}

fn int_tensor(values: &[f64], shape: [usize; 2]) -> Tensor<B, 2, Int> {
    Tensor::from_data(
        TensorData::new(values.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape),
        &Default::default(),
    )
}
