//! Each layer's input projections concatenated, for inference: `[W_q W_k W_v]` as one matrix
//! product and `[W_gate W_up]` as another, instead of five. A decoding step multiplies a few
//! rows by every weight; one wider product packs its input once and keeps the matrix kernel
//! busier than several narrow ones.
//!
//! Built from a model's current weights (a copy of them) for one generation: the model must
//! not change while it is in use. LoRA adapters on these projections are merged in
//! (`W + (α/r)·A·B`); those on `W_o` and `W_down`, which are not concatenated, stay separate.
//! A tied LM head is copied out of the embeddings' transpose into its own row-major matrix.

use burn::nn::Linear;
use burn::tensor::Tensor;

use super::lora::LayerLora;
use crate::backend::{Backend, affine};

/// The concatenated projections of every layer of a model (`CausalLm::fused_projections`).
#[derive(Debug, Clone)]
pub struct FusedProjections<B: Backend> {
    pub(crate) layers: Vec<FusedLayer<B>>,
    /// The LM head as a row-major `[hidden, vocab]` matrix: a copy when it is tied to the
    /// embeddings, whose transpose is a view the matrix kernel would repack for every token.
    pub(crate) head: Tensor<B, 2>,
}

/// One layer's concatenated projections.
#[derive(Debug, Clone)]
pub(crate) struct FusedLayer<B: Backend> {
    /// `[hidden, (heads + 2·kv_heads)·head_dim]`: queries, keys, values.
    qkv: Tensor<B, 2>,
    /// Their biases (zeros for a projection without one), when any has one.
    qkv_bias: Option<Tensor<B, 1>>,
    /// `[hidden, 2·intermediate]`: gate, then up.
    gate_up: Tensor<B, 2>,
}

impl<B: Backend> FusedLayer<B> {
    /// One layer's attention input projections (`q`, `k`, `v`) and MLP input projections
    /// (`gate`, `up`), concatenated, with their adapters merged in.
    pub(crate) fn new(
        attention: [&Linear<B>; 3],
        gate: &Linear<B>,
        up: &Linear<B>,
        lora: Option<&LayerLora<B>>,
    ) -> Self {
        let weight = |layer: &Linear<B>, name: &str| match lora.and_then(|l| l.get(name)) {
            Some(adapter) => layer.weight.val() + adapter.delta(),
            None => layer.weight.val(),
        };
        let [q, k, v] = attention;
        let qkv = Tensor::cat(vec![weight(q, "q_proj"), weight(k, "k_proj"), weight(v, "v_proj")], 1);
        let qkv_bias = attention
            .iter()
            .any(|l| l.bias.is_some())
            .then(|| Tensor::cat(attention.iter().map(|l| bias_or_zeros(l)).collect(), 0));
        let gate_up = Tensor::cat(vec![weight(gate, "gate_proj"), weight(up, "up_proj")], 1);
        FusedLayer { qkv, qkv_bias, gate_up }
    }
}

fn bias_or_zeros<B: Backend>(layer: &Linear<B>) -> Tensor<B, 1> {
    match &layer.bias {
        Some(bias) => bias.val(),
        None => {
            let weight = layer.weight.val();
            Tensor::zeros([weight.dims()[1]], &weight.device())
        }
    }
}

impl<B: Backend> FusedLayer<B> {
    /// `x · [W_q W_k W_v] + b`: `[rows, hidden]` → `[rows, (heads + 2·kv_heads)·head_dim]`.
    pub(crate) fn qkv(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        affine(x, self.qkv.clone(), self.qkv_bias.clone())
    }

    /// `x · [W_gate W_up]`: `[rows, hidden]` → `[rows, 2·intermediate]`.
    pub(crate) fn gate_up(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        affine(x, self.gate_up.clone(), None)
    }
}
