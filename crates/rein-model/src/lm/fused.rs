//! Each layer's projections arranged for inference: `[W_q W_k W_v]` as one matrix product and
//! `[W_gate W_up]` as another, instead of five. A decoding step multiplies a few rows by every
//! weight; one wider product packs its input once and keeps the matrix kernel busier than
//! several narrow ones.
//!
//! Built from a model's current weights for one generation: the model must not change while it
//! is in use. A weight goes one of two ways:
//!
//! - **Packed**, when the model was loaded with the packed form of a quantised file
//!   ([`PackedWeights`]), that form still equals the weight exactly (checked here, every time:
//!   a fine-tuned weight no longer does) and the backend reads packed weights
//!   ([`ReinBackend::reads_packed_weights`]). The product reads 4–8 bits per weight instead of 32
//!   and gives the same bits; `W_o`, `W_down` and the head are packed too, and LoRA adapters
//!   stay separate (`x·W + (α/r)·x·A·B`, as in training). A sampler may ask for the products
//!   with activations quantised to 8 bits instead ([`FusedProjections::with_precision`]):
//!   faster, not exact.
//! - **Dense** otherwise: a copy, adapters merged in (`W + (α/r)·A·B`); `W_o` and `W_down`,
//!   not concatenated, are the layer's own. A tied LM head is copied out of the embeddings'
//!   transpose into its own row-major matrix.

use std::collections::BTreeMap;
use std::sync::Arc;

use burn::nn::Linear;
use burn::tensor::{Tensor, TensorPrimitive};
use rein_core::{ModelDtype, SamplerPrecision};
use rein_kernels::PackedMatrix;

use super::lora::{LayerLora, Lora};
use crate::backend::{ReinBackend, affine, held_in};

/// Packed forms of a model's weight matrices (`[in, out]`) under their Hugging Face names (the
/// head as `lm_head.weight`, tied or not): see [`rein_gguf::packed_file`].
pub type PackedWeights = BTreeMap<String, Arc<PackedMatrix>>;

/// The projections of every layer of a model arranged for inference
/// (`CausalLm::fused_projections`).
#[derive(Debug, Clone)]
pub struct FusedProjections<B: ReinBackend> {
    pub(crate) layers: Vec<FusedLayer<B>>,
    /// The LM head, `[hidden, vocab]`: packed, or a row-major copy when it is tied to the
    /// embeddings (whose transpose is a view the matrix kernel would repack for every token).
    pub(crate) head: Projection<B>,
}

impl<B: ReinBackend> FusedProjections<B> {
    /// How many weight matrices are read packed.
    pub fn packed_matrices(&self) -> usize {
        let count = |p: &Projection<B>| match p {
            Projection::Dense(_) => 0,
            Projection::Packed { parts, .. } => parts.len(),
        };
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let mlp: usize = l
                    .mlp
                    .iter()
                    .map(|m| count(&m.gate_up) + m.down.iter().map(count).sum::<usize>())
                    .sum();
                count(&l.qkv) + l.o.iter().map(count).sum::<usize>() + mlp
            })
            .sum();
        layers + count(&self.head)
    }

    /// These projections with their packed products at `precision` (all exact when built):
    /// [`SamplerPrecision::Q8`] quantises the activations of products with packed weights.
    pub fn with_precision(mut self, precision: SamplerPrecision) -> Self {
        let set = |p: &mut Projection<B>| {
            if let Projection::Packed { precision: at, .. } = p {
                *at = precision;
            }
        };
        for layer in &mut self.layers {
            set(&mut layer.qkv);
            layer.o.iter_mut().for_each(set);
            for mlp in &mut layer.mlp {
                set(&mut mlp.gate_up);
                mlp.down.iter_mut().for_each(set);
            }
        }
        set(&mut self.head);
        self
    }
}

/// One layer's projections.
#[derive(Debug, Clone)]
pub(crate) struct FusedLayer<B: ReinBackend> {
    /// `[hidden, (heads + 2·kv_heads)·head_dim]`: queries, keys, values.
    qkv: Projection<B>,
    /// Their biases (zeros for a projection without one), when any has one.
    qkv_bias: Option<Tensor<B, 1>>,
    /// `W_o`, when packed (otherwise the layer's own).
    pub(crate) o: Option<Projection<B>>,
    /// The gated MLPs: the dense one, or each expert's.
    pub(crate) mlp: Vec<FusedMlp<B>>,
}

/// One gated MLP's projections.
#[derive(Debug, Clone)]
pub(crate) struct FusedMlp<B: ReinBackend> {
    /// `[hidden, 2·intermediate]`: gate, then up.
    gate_up: Projection<B>,
    /// `W_down`, when packed (otherwise the MLP's own).
    pub(crate) down: Option<Projection<B>>,
}

/// A weight matrix as inference multiplies by it.
#[derive(Debug, Clone)]
pub(crate) enum Projection<B: ReinBackend> {
    /// One dense matrix, adapters merged in.
    Dense(Tensor<B, 2>),
    /// Column blocks side by side, each packed, each with its adapter, multiplied at `precision`.
    Packed {
        parts: Vec<(Arc<PackedMatrix>, Option<Lora<B>>)>,
        precision: SamplerPrecision,
    },
}

/// A linear layer of a decoder layer: its path in the layer (`self_attn.q_proj`), its weights
/// and its adapter.
type LinearPart<'a, B> = (&'a str, &'a Linear<B>, Option<&'a Lora<B>>);

impl<B: ReinBackend> Projection<B> {
    /// `layers` (with their adapters) side by side: packed when every one has a packed form
    /// equal to its weight (`packed(name, layer)`), else one dense matrix with the adapters
    /// merged in, held in `dtype` (its products are in the weight's dtype: [`affine`]).
    pub(crate) fn new(
        layers: &[LinearPart<'_, B>],
        packed: &impl Fn(&str, &Linear<B>) -> Option<Arc<PackedMatrix>>,
        dtype: ModelDtype,
    ) -> Self {
        let parts: Option<Vec<_>> = layers
            .iter()
            .map(|(path, layer, adapter)| packed(path, layer).map(|m| (m, adapter.cloned())))
            .collect();
        if let Some(parts) = parts {
            return Projection::packed(parts);
        }
        let weight = |(_, layer, adapter): &(&str, &Linear<B>, Option<&Lora<B>>)| match adapter {
            Some(adapter) => layer.weight.val() + adapter.delta(),
            None => layer.weight.val(),
        };
        let dense = match layers {
            [one] => weight(one),
            _ => Tensor::cat(layers.iter().map(weight).collect(), 1),
        };
        Projection::Dense(held_in(dense, dtype))
    }

    /// Packed `parts`, multiplied exactly.
    pub(crate) fn packed(parts: Vec<(Arc<PackedMatrix>, Option<Lora<B>>)>) -> Self {
        Projection::Packed {
            parts,
            precision: SamplerPrecision::Exact,
        }
    }

    /// `x · W + b` (plus the adapters' updates): `[rows, in]` → `[rows, out]`.
    pub(crate) fn forward(&self, x: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 2> {
        let (parts, precision) = match self {
            Projection::Dense(weight) => return affine(x, weight.clone(), bias),
            Projection::Packed { parts, precision } => (parts, *precision),
        };
        let matrices: Vec<&PackedMatrix> = parts.iter().map(|(m, _)| m.as_ref()).collect();
        let y = B::packed_linear(
            x.clone().into_primitive().tensor(),
            &matrices,
            bias.map(|b| b.into_primitive().tensor()),
            precision,
        );
        let y = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y));
        if parts.iter().all(|(_, adapter)| adapter.is_none()) {
            return y;
        }
        let rows = x.dims()[0];
        let updates = parts
            .iter()
            .map(|(m, adapter)| match adapter {
                Some(adapter) => adapter.forward(x.clone()),
                None => Tensor::zeros([rows, m.shape()[1]], &x.device()),
            })
            .collect();
        y + Tensor::cat(updates, 1)
    }
}

impl<B: ReinBackend> FusedLayer<B> {
    /// One layer's projections: `[q k v]`, each MLP's `[gate up]` (held in `dtype` when dense),
    /// and `o`, each `down` when packed. `linears` are the layer's linear layers with their
    /// paths, in `DecoderLayer::linears`' order; `packed(path, layer)` is the packed form of the
    /// linear layer at `path` in the layer (`self_attn.q_proj`), if it has one.
    pub(crate) fn new(
        linears: &[(String, &Linear<B>)],
        lora: Option<&LayerLora<B>>,
        packed: &impl Fn(&str, &Linear<B>) -> Option<Arc<PackedMatrix>>,
        dtype: ModelDtype,
    ) -> Self {
        let adapters = lora.map(|l| l.adapters());
        let parts: Vec<LinearPart<'_, B>> = linears
            .iter()
            .enumerate()
            .map(|(i, (path, linear))| {
                let adapter = adapters.as_ref().and_then(|a| a[i].1.as_ref());
                (path.as_str(), *linear, adapter)
            })
            .collect();
        let attention = [parts[0].1, parts[1].1, parts[2].1];
        let qkv_bias = attention
            .iter()
            .any(|l| l.bias.is_some())
            .then(|| Tensor::cat(attention.iter().map(|l| bias_or_zeros(l)).collect(), 0));
        let alone =
            |part: &LinearPart<'_, B>| packed(part.0, part.1).map(|m| Projection::packed(vec![(m, part.2.cloned())]));
        let mlp = parts[4..]
            .chunks_exact(3)
            .map(|gate_up_down| FusedMlp {
                gate_up: Projection::new(&gate_up_down[..2], packed, dtype),
                down: alone(&gate_up_down[2]),
            })
            .collect();
        FusedLayer {
            qkv: Projection::new(&parts[..3], packed, dtype),
            qkv_bias,
            o: alone(&parts[3]),
            mlp,
        }
    }

    /// `x · [W_q W_k W_v] + b`: `[rows, hidden]` → `[rows, (heads + 2·kv_heads)·head_dim]`.
    pub(crate) fn qkv(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.qkv.forward(x, self.qkv_bias.clone())
    }
}

impl<B: ReinBackend> FusedMlp<B> {
    /// `x · [W_gate W_up]`: `[rows, hidden]` → `[rows, 2·intermediate]`.
    pub(crate) fn gate_up(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.gate_up.forward(x, None)
    }
}

fn bias_or_zeros<B: ReinBackend>(layer: &Linear<B>) -> Tensor<B, 1> {
    match &layer.bias {
        Some(bias) => bias.val(),
        None => {
            let weight = layer.weight.val();
            Tensor::zeros([weight.dims()[1]], &weight.device())
        }
    }
}
