//! The gated MLP of every family, `W_down (act(W_gate x) ⊙ W_up x)`: SwiGLU, or GeGLU with the
//! tanh-approximated GELU (Gemma). A dense layer has one; a mixture-of-experts layer one per
//! expert.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorPrimitive};
use rein_core::ModelDtype;
use rein_gguf::GateActivation;

use super::fused::FusedMlp;
use super::lora::{Lora, adapted};
use crate::backend::ReinBackend;

/// The gated MLP, `W_down (act(W_gate x) ⊙ W_up x)`: SwiGLU, or GeGLU (Gemma).
#[derive(Module, Debug)]
pub struct FeedForward<B: ReinBackend> {
    /// `W_gate`.
    pub gate_proj: Linear<B>,
    /// `W_up`.
    pub up_proj: Linear<B>,
    /// `W_down`.
    pub down_proj: Linear<B>,
    #[module(skip)]
    activation: GateActivation,
}

/// How one gated MLP multiplies: by its projections arranged for inference or by its own
/// weights, with its adapters (`gate_proj`, `up_proj`, `down_proj`), in the model's dtype.
pub(crate) struct MlpProducts<'a, B: ReinBackend> {
    pub(crate) fused: Option<&'a FusedMlp<B>>,
    pub(crate) adapters: [Option<&'a Lora<B>>; 3],
    pub(crate) dtype: ModelDtype,
}

// By hand: derived, they would ask `B: Copy`.
impl<B: ReinBackend> Clone for MlpProducts<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: ReinBackend> Copy for MlpProducts<'_, B> {}

impl<B: ReinBackend> FeedForward<B> {
    /// A gated MLP of these projections.
    pub fn new(gate_proj: Linear<B>, up_proj: Linear<B>, down_proj: Linear<B>, activation: GateActivation) -> Self {
        Self {
            gate_proj,
            up_proj,
            down_proj,
            activation,
        }
    }

    /// # Shapes
    /// - `x`: `[rows, hidden]` → `[rows, hidden]`
    pub(crate) fn forward(&self, x: Tensor<B, 2>, products: MlpProducts<'_, B>) -> Tensor<B, 2> {
        let MlpProducts {
            fused,
            adapters: [gate_adapter, up_adapter, down_adapter],
            dtype,
        } = products;
        let (gate, up) = match fused {
            Some(fused) => {
                let gate_up = fused.gate_up(x);
                let half = gate_up.dims()[1] / 2;
                (gate_up.clone().narrow(1, 0, half), gate_up.narrow(1, half, half))
            }
            None => (
                adapted(&self.gate_proj, gate_adapter, x.clone(), dtype),
                adapted(&self.up_proj, up_adapter, x, dtype),
            ),
        };
        let (gate, up) = (gate.into_primitive().tensor(), up.into_primitive().tensor());
        let hidden = Tensor::from_primitive(TensorPrimitive::Float(B::glu(gate, up, self.activation)));
        match fused.and_then(|f| f.down.as_ref()) {
            Some(down) => down.forward(hidden, self.down_proj.bias.as_ref().map(|b| b.val())),
            None => adapted(&self.down_proj, down_adapter, hidden, dtype),
        }
    }

    /// `[gate_proj, up_proj, down_proj]` with their names.
    pub fn linears(&self) -> [(&'static str, &Linear<B>); 3] {
        [
            ("gate_proj", &self.gate_proj),
            ("up_proj", &self.up_proj),
            ("down_proj", &self.down_proj),
        ]
    }

    pub(super) fn linears_mut(&mut self) -> [&mut Linear<B>; 3] {
        [&mut self.gate_proj, &mut self.up_proj, &mut self.down_proj]
    }
}
