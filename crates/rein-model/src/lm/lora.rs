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
//!
//! Dropout's masks come from the run, not from burn's process-wide generator: the trainer sets
//! a key for each step ([`super::CausalLm::set_dropout_key`]), and the `n`-th mask an adapter
//! draws after that comes from a generator seeded with the key, the adapter's place in the
//! model and `n`. Masks then depend on the run's seed and step alone, also after a resume.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use rein_core::{ModelDtype, SeededRng};

use crate::backend::{ReinBackend, affine, linear, linear_in};
use crate::random;

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
    /// A vision-language model's vision encoder gets adapters too, on every linear layer of its
    /// blocks ([`crate::vision::BlockLora`]).
    pub vision: bool,
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
        if self.targets.is_empty() && !self.vision {
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
pub struct Lora<B: ReinBackend> {
    /// `A`, `[in, r]`.
    pub a: Param<Tensor<B, 2>>,
    /// `B`, `[r, out]`.
    pub b: Param<Tensor<B, 2>>,
    #[module(skip)]
    dropout: f64,
    #[module(skip)]
    masks: MaskStream,
    #[module(skip)]
    scale: f32,
}

/// Where an adapter's dropout masks come from (see the module's doc).
#[derive(Clone, Debug, Default)]
pub(crate) struct MaskStream {
    /// The adapter's place in the model, fixed: layer · 7 + module (in [`LINEAR_MODULES`]
    /// order) for attention and dense MLPs, `2³²` + (layer · experts + expert) · 3 + module
    /// for experts.
    place: u64,
    /// The key the trainer set for this step.
    key: Arc<AtomicU64>,
    /// Masks drawn since the key was set.
    drawn: Arc<AtomicU64>,
}

impl MaskStream {
    fn set_key(&self, key: u64) {
        self.key.store(key, Ordering::Relaxed);
        self.drawn.store(0, Ordering::Relaxed);
    }

    /// The next mask of `len` values: 0 with probability `p`, else `1/(1 − p)`.
    fn next(&self, len: usize, p: f64) -> Vec<f32> {
        let n = self.drawn.fetch_add(1, Ordering::Relaxed);
        let key = self.key.load(Ordering::Relaxed);
        let mut rng = SeededRng::new(
            key ^ self.place.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xD1B5_4A32_D192_ED03),
        );
        let kept = (1.0 / (1.0 - p)) as f32;
        (0..len).map(|_| if rng.uniform() < p { 0.0 } else { kept }).collect()
    }
}

impl<B: ReinBackend> Lora<B> {
    /// A fresh adapter as PEFT initialises one: `A` Kaiming-uniform (`U(±1/√in)`), `B` zero, so
    /// the layer's output is unchanged.
    /// `A` is drawn from `rng`.
    pub fn new(input: usize, output: usize, spec: &LoraSpec, rng: &mut SeededRng, device: &B::Device) -> Self {
        let bound = 1.0 / (input as f64).sqrt();
        let a = random::uniform(rng, [input, spec.rank], bound, device);
        Self::from_factors(a, Tensor::zeros([spec.rank, output], device), spec)
    }

    /// An adapter with the given factors (`A` `[in, r]`, `B` `[r, out]`).
    pub fn from_factors(a: Tensor<B, 2>, b: Tensor<B, 2>, spec: &LoraSpec) -> Self {
        Self {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            dropout: spec.dropout,
            masks: MaskStream::default(),
            scale: spec.scale(),
        }
    }

    /// This adapter with other factors (`A` `[in, r]`, `B` `[r, out]`), at the same place.
    pub(crate) fn with_factors(&self, a: Tensor<B, 2>, b: Tensor<B, 2>) -> Self {
        Self {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            dropout: self.dropout,
            masks: MaskStream {
                place: self.masks.place,
                ..MaskStream::default()
            },
            scale: self.scale,
        }
    }

    /// This adapter at `place` in its model (a different mask stream for each place).
    pub(crate) fn at(mut self, place: u64) -> Self {
        self.masks.place = place;
        self
    }

    /// Starts this step's masks (see the module's doc).
    pub(crate) fn set_dropout_key(&self, key: u64) {
        self.masks.set_key(key);
    }

    /// `x` with dropout applied (only where gradients are recorded, as in training).
    fn dropout(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if self.dropout == 0.0 || !B::ad_enabled(&x.device()) {
            return x;
        }
        let (shape, device) = (x.dims(), x.device());
        let mask = self.masks.next(shape[0] * shape[1], self.dropout);
        x * Tensor::from_data(TensorData::new(mask, shape), &device)
    }

    /// The update as one matrix, `(α/r) · A·B` (`[in, out]`), to merge into `W`.
    pub fn delta(&self) -> Tensor<B, 2> {
        affine(self.a.val(), self.b.val(), None).mul_scalar(self.scale)
    }

    /// `(α/r) · dropout(x)·A·B` (dropout only where gradients are recorded).
    ///
    /// # Shapes
    /// - `x`: `[rows, in]` → `[rows, out]`
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let down = affine(self.dropout(x), self.a.val(), None);
        affine(down, self.b.val(), None).mul_scalar(self.scale)
    }
}

/// `x·W + b`, plus the adapter's update when there is one: one [`ReinBackend::lora_linear`], or,
/// while dropout changes the adapter's input or the base product is not `f32` (`dtype`), the
/// base layer and [`Lora::forward`] apart.
///
/// # Shapes
/// - `x`: `[rows, in]` → `[rows, out]`
pub(crate) fn adapted<B: ReinBackend>(
    layer: &Linear<B>,
    adapter: Option<&Lora<B>>,
    x: Tensor<B, 2>,
    dtype: ModelDtype,
) -> Tensor<B, 2> {
    if dtype != ModelDtype::F32 {
        // The base product in `dtype`; the adapter's (small) products stay `f32`.
        let base = linear_in(layer, x.clone(), dtype);
        return match adapter {
            Some(adapter) => base + adapter.forward(x),
            None => base,
        };
    }
    match adapter {
        Some(adapter) if adapter.dropout > 0.0 && B::ad_enabled(&x.device()) => {
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

/// The adapters of one decoder layer, one per adapted linear layer: attention's, and the MLP's
/// (a dense layer's in `gate_proj`, `up_proj`, `down_proj`; a mixture of experts' per expert
/// in `experts`).
#[derive(Module, Debug)]
pub struct LayerLora<B: ReinBackend> {
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
    /// On each expert's `W_gate`, `W_up`, `W_down` (a mixture-of-experts layer; empty otherwise).
    pub experts: Vec<ExpertLora<B>>,
}

/// The adapters of one expert's gated MLP.
#[derive(Module, Debug)]
pub struct ExpertLora<B: ReinBackend> {
    /// On `W_gate`.
    pub gate_proj: Option<Lora<B>>,
    /// On `W_up`.
    pub up_proj: Option<Lora<B>>,
    /// On `W_down`.
    pub down_proj: Option<Lora<B>>,
}

impl<B: ReinBackend> LayerLora<B> {
    /// The adapters of a layer whose linear layers are at `paths` (as
    /// [`super::DecoderLayer::linears`] names them), in that order.
    pub(crate) fn from_slots(slots: Vec<(String, Option<Lora<B>>)>) -> Self {
        let mut layer = LayerLora {
            q_proj: None,
            k_proj: None,
            v_proj: None,
            o_proj: None,
            gate_proj: None,
            up_proj: None,
            down_proj: None,
            experts: Vec::new(),
        };
        for (path, adapter) in slots {
            let (module, name) = path.rsplit_once('.').unwrap_or(("", &path));
            if let Some(expert) = module
                .strip_prefix("mlp.experts.")
                .and_then(|e| e.parse::<usize>().ok())
            {
                while layer.experts.len() <= expert {
                    layer.experts.push(ExpertLora {
                        gate_proj: None,
                        up_proj: None,
                        down_proj: None,
                    });
                }
                let e = &mut layer.experts[expert];
                match name {
                    "gate_proj" => e.gate_proj = adapter,
                    "up_proj" => e.up_proj = adapter,
                    _ => e.down_proj = adapter,
                }
                continue;
            }
            if let Some((_, slot)) = layer.slots_mut().into_iter().find(|(n, _)| *n == name) {
                *slot = adapter;
            }
        }
        layer
    }

    /// The adapter on the attention or dense-MLP module named `name` (one of [`LINEAR_MODULES`]).
    pub fn get(&self, name: &str) -> Option<&Lora<B>> {
        self.slots().into_iter().find(|(n, _)| *n == name)?.1.as_ref()
    }

    /// The adapters of the `i`-th gated MLP: the dense one (`i = 0`), or expert `i`.
    pub fn mlp_adapters(&self, i: usize) -> [Option<&Lora<B>>; 3] {
        match self.experts.get(i) {
            Some(e) => [e.gate_proj.as_ref(), e.up_proj.as_ref(), e.down_proj.as_ref()],
            None => [self.gate_proj.as_ref(), self.up_proj.as_ref(), self.down_proj.as_ref()],
        }
    }

    /// Each attention and dense-MLP module name with its slot, mutable, in [`LINEAR_MODULES`] order.
    fn slots_mut(&mut self) -> [(&'static str, &mut Option<Lora<B>>); 7] {
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

    /// Each attention and dense-MLP module name with its slot, in [`LINEAR_MODULES`] order.
    fn slots(&self) -> [(&'static str, &Option<Lora<B>>); 7] {
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

    /// Every slot with the path of its linear layer, in [`super::DecoderLayer::linears`]'s
    /// order: attention's four, then the dense MLP's three or each expert's.
    pub fn adapters(&self) -> Vec<(String, &Option<Lora<B>>)> {
        let [q, k, v, o, gate, up, down] = self.slots();
        let mut slots: Vec<(String, &Option<Lora<B>>)> = [q, k, v, o]
            .into_iter()
            .map(|(n, a)| (format!("self_attn.{n}"), a))
            .collect();
        if self.experts.is_empty() {
            slots.extend([gate, up, down].into_iter().map(|(n, a)| (format!("mlp.{n}"), a)));
        }
        for (e, expert) in self.experts.iter().enumerate() {
            for (n, a) in [
                ("gate_proj", &expert.gate_proj),
                ("up_proj", &expert.up_proj),
                ("down_proj", &expert.down_proj),
            ] {
                slots.push((format!("mlp.experts.{e}.{n}"), a));
            }
        }
        slots
    }

    /// [`LayerLora::adapters`], mutable.
    pub fn adapters_mut(&mut self) -> Vec<(String, &mut Option<Lora<B>>)> {
        let dense = self.experts.is_empty();
        let LayerLora {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            gate_proj,
            up_proj,
            down_proj,
            experts,
        } = self;
        let mut slots: Vec<(String, &mut Option<Lora<B>>)> = [
            ("q_proj", q_proj),
            ("k_proj", k_proj),
            ("v_proj", v_proj),
            ("o_proj", o_proj),
        ]
        .into_iter()
        .map(|(n, a)| (format!("self_attn.{n}"), a))
        .collect();
        if dense {
            for (n, a) in [("gate_proj", gate_proj), ("up_proj", up_proj), ("down_proj", down_proj)] {
                slots.push((format!("mlp.{n}"), a));
            }
        }
        for (e, expert) in experts.iter_mut().enumerate() {
            for (n, a) in [
                ("gate_proj", &mut expert.gate_proj),
                ("up_proj", &mut expert.up_proj),
                ("down_proj", &mut expert.down_proj),
            ] {
                slots.push((format!("mlp.experts.{e}.{n}"), a));
            }
        }
        slots
    }
}

/// Every layer's adapters and the spec they were made with.
#[derive(Module, Debug)]
pub struct LoraAdapters<B: ReinBackend> {
    /// Per decoder layer.
    pub layers: Vec<LayerLora<B>>,
    #[module(skip)]
    spec: LoraSpec,
}

impl<B: ReinBackend> LoraAdapters<B> {
    /// Adapters over every decoder layer, made with `spec`.
    pub(crate) fn new(layers: Vec<LayerLora<B>>, spec: LoraSpec) -> Self {
        Self { layers, spec }
    }

    /// The spec.
    pub fn spec(&self) -> &LoraSpec {
        &self.spec
    }

    /// Starts a step's dropout masks: every adapter's next masks come from `key` (and its
    /// place and how many it has drawn since). Trainers call this before each step's forward
    /// passes with a key from the run's own generator.
    pub fn set_dropout_key(&self, key: u64) {
        for layer in &self.layers {
            for (_, adapter) in layer.adapters() {
                if let Some(adapter) = adapter {
                    adapter.set_dropout_key(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(place: u64) -> MaskStream {
        MaskStream {
            place,
            ..MaskStream::default()
        }
    }

    #[test]
    fn dropout_masks_depend_on_the_key_the_place_and_the_draw_alone() {
        let (a, b) = (stream(3), stream(3));
        a.set_key(11);
        b.set_key(11);
        let first = a.next(4096, 0.25);
        assert_eq!(first, b.next(4096, 0.25), "same key, place and draw");
        assert_ne!(first, a.next(4096, 0.25), "the next draw");
        let other_place = stream(4);
        other_place.set_key(11);
        assert_ne!(first, other_place.next(4096, 0.25), "another place");
        a.set_key(12);
        assert_ne!(first, a.next(4096, 0.25), "another key");
        a.set_key(11);
        assert_eq!(first, a.next(4096, 0.25), "setting the key again restarts the draws");
        // Inverted dropout: a quarter dropped, the rest scaled by 4/3.
        let dropped = first.iter().filter(|&&m| m == 0.0).count() as f64 / 4096.0;
        assert!((dropped - 0.25).abs() < 0.03, "dropped {dropped}");
        assert!(first.iter().all(|&m| m == 0.0 || (m - 4.0 / 3.0).abs() < 1e-6));
    }
}
