//! LoRA (Hu et al., 2021, eq. 3): a frozen linear layer plus a trained low-rank update,
//!
//! ```text
//! y = x·W + (α/r) · dropout(x)·A·B        A: [in, r] (Kaiming-uniform), B: [r, out] (zeros)
//! ```
//!
//! so training starts from the base model exactly and only `r·(in + out)` numbers per layer
//! learn. rsLoRA (Kalajdzievski, 2023) scales by `α/√r` instead. The adapters live beside the
//! base weights ([`LoraAdapters`] in [`super::CausalLm::lora`]), which
//! [`super::CausalLm::with_lora`] freezes: no gradients, no optimiser state for them.
//! [`super::peft`] reads and writes adapters in PEFT's format.

use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::{Distribution, Tensor, TensorPrimitive};

use crate::backend::{Backend, affine, linear};

/// The linear layers of a decoder layer that can carry an adapter, by their Hugging Face names.
pub const LINEAR_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// Which layers get adapters, and their shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    /// `r`, the rank of each update.
    pub rank: usize,
    /// `α`: the update is scaled by `α/r` (`α/√r` with `rslora`).
    pub alpha: f32,
    /// Dropout on the adapter's input while training.
    pub dropout: f64,
    /// Module names from [`LINEAR_MODULES`], or `all-linear` for all of them.
    pub targets: Vec<String>,
    /// Scale by `α/√r` (rsLoRA) instead of `α/r`.
    pub rslora: bool,
}

impl LoraSpec {
    /// The update's scale, `α/r` or `α/√r`.
    pub fn scale(&self) -> f32 {
        match self.rslora {
            true => self.alpha / (self.rank as f32).sqrt(),
            false => self.alpha / self.rank as f32,
        }
    }

    /// Whether the module named `name` (`q_proj`) gets an adapter.
    pub fn targets(&self, name: &str) -> bool {
        self.targets.iter().any(|t| t == name || t == "all-linear")
    }

    /// The module names that get adapters, in [`LINEAR_MODULES`] order.
    pub fn target_modules(&self) -> Vec<&'static str> {
        LINEAR_MODULES.into_iter().filter(|m| self.targets(m)).collect()
    }

    /// Checks the numbers and names; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.rank == 0 {
            return Err(("rank", "must be at least 1".into()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(("alpha", format!("must be a positive number, not {}", self.alpha)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(("dropout", format!("must be in [0, 1), not {}", self.dropout)));
        }
        if self.targets.is_empty() {
            return Err(("targets", "name at least one module".into()));
        }
        for target in &self.targets {
            if target != "all-linear" && !LINEAR_MODULES.contains(&target.as_str()) {
                return Err((
                    "targets",
                    format!(
                        "`{target}` is not a linear layer rein can adapt; use `all-linear` or any of {}",
                        LINEAR_MODULES.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// One layer's update `(α/r) · dropout(x)·A·B`.
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `A`, `[in, r]`.
    pub a: Param<Tensor<B, 2>>,
    /// `B`, `[r, out]`.
    pub b: Param<Tensor<B, 2>>,
    dropout: Dropout,
    #[module(skip)]
    scale: f32,
}

impl<B: Backend> Lora<B> {
    /// A fresh adapter as PEFT initialises one: `A` Kaiming-uniform (`U(±1/√in)`), `B` zero, so
    /// the layer's output is unchanged.
    pub fn new(input: usize, output: usize, spec: &LoraSpec, device: &B::Device) -> Self {
        let bound = 1.0 / (input as f64).sqrt();
        let a = Tensor::random([input, spec.rank], Distribution::Uniform(-bound, bound), device);
        Self::from_factors(a, Tensor::zeros([spec.rank, output], device), spec)
    }

    /// An adapter with the given factors (`A` `[in, r]`, `B` `[r, out]`).
    pub fn from_factors(a: Tensor<B, 2>, b: Tensor<B, 2>, spec: &LoraSpec) -> Self {
        Self {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            dropout: DropoutConfig::new(spec.dropout).init(),
            scale: spec.scale(),
        }
    }

    /// The update as one matrix, `(α/r) · A·B` (`[in, out]`), to merge into `W`.
    pub fn delta(&self) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val()).mul_scalar(self.scale)
    }

    /// `(α/r) · dropout(x)·A·B` (dropout only where gradients are recorded).
    ///
    /// # Shapes
    /// - `x`: `[rows, in]` → `[rows, out]`
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let down = affine(self.dropout.forward(x), self.a.val(), None);
        affine(down, self.b.val(), None).mul_scalar(self.scale)
    }
}

/// `x·W + b`, plus the adapter's update when there is one: one [`Backend::lora_linear`], or,
/// while dropout changes the adapter's input, the base layer and [`Lora::forward`] apart.
///
/// # Shapes
/// - `x`: `[rows, in]` → `[rows, out]`
pub(crate) fn adapted<B: Backend>(layer: &Linear<B>, adapter: Option<&Lora<B>>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    match adapter {
        Some(adapter) if adapter.dropout.prob > 0.0 && B::ad_enabled(&x.device()) => {
            linear(layer, x.clone()) + adapter.forward(x)
        }
        Some(adapter) => {
            let (y, _) = B::lora_linear(
                x.into_primitive().tensor(),
                layer.weight.val().into_primitive().tensor(),
                layer.bias.as_ref().map(|b| b.val().into_primitive().tensor()),
                adapter.a.val().into_primitive().tensor(),
                adapter.b.val().into_primitive().tensor(),
                adapter.scale,
            );
            Tensor::from_primitive(TensorPrimitive::Float(y))
        }
        None => linear(layer, x),
    }
}

/// The adapters of one decoder layer, one per adapted linear layer.
#[derive(Module, Debug)]
pub struct LayerLora<B: Backend> {
    /// On `W_q`.
    pub q_proj: Option<Lora<B>>,
    /// On `W_k`.
    pub k_proj: Option<Lora<B>>,
    /// On `W_v`.
    pub v_proj: Option<Lora<B>>,
    /// On `W_o`.
    pub o_proj: Option<Lora<B>>,
    /// On `W_gate`.
    pub gate_proj: Option<Lora<B>>,
    /// On `W_up`.
    pub up_proj: Option<Lora<B>>,
    /// On `W_down`.
    pub down_proj: Option<Lora<B>>,
}

impl<B: Backend> LayerLora<B> {
    /// The adapter on the module named `name` (one of [`LINEAR_MODULES`]).
    pub fn get(&self, name: &str) -> Option<&Lora<B>> {
        self.slots().into_iter().find(|(n, _)| *n == name)?.1.as_ref()
    }

    /// Each module name with its slot, mutable, in [`LINEAR_MODULES`] order.
    pub fn slots_mut(&mut self) -> [(&'static str, &mut Option<Lora<B>>); 7] {
        [
            ("q_proj", &mut self.q_proj),
            ("k_proj", &mut self.k_proj),
            ("v_proj", &mut self.v_proj),
            ("o_proj", &mut self.o_proj),
            ("gate_proj", &mut self.gate_proj),
            ("up_proj", &mut self.up_proj),
            ("down_proj", &mut self.down_proj),
        ]
    }

    /// Each module name with its slot, in [`LINEAR_MODULES`] order.
    pub fn slots(&self) -> [(&'static str, &Option<Lora<B>>); 7] {
        [
            ("q_proj", &self.q_proj),
            ("k_proj", &self.k_proj),
            ("v_proj", &self.v_proj),
            ("o_proj", &self.o_proj),
            ("gate_proj", &self.gate_proj),
            ("up_proj", &self.up_proj),
            ("down_proj", &self.down_proj),
        ]
    }
}

/// Every layer's adapters and the spec they were made with.
#[derive(Module, Debug)]
pub struct LoraAdapters<B: Backend> {
    /// Per decoder layer.
    pub layers: Vec<LayerLora<B>>,
    #[module(skip)]
    spec: LoraSpec,
}

impl<B: Backend> LoraAdapters<B> {
    /// Adapters over every decoder layer, made with `spec`.
    pub(crate) fn new(layers: Vec<LayerLora<B>>, spec: LoraSpec) -> Self {
        Self { layers, spec }
    }

    /// The spec.
    pub fn spec(&self) -> &LoraSpec {
        &self.spec
    }
}
