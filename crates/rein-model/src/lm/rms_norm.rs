//! RMSNorm (Zhang & Sennrich 2019) as transformers computes it, through the backend's fused
//! kernel: the decoder's norms, Qwen3's and Gemma 3's per-head ones, Qwen2.5-VL's vision norms.

use burn::module::{Module, Param};
use burn::tensor::{Tensor, TensorPrimitive};

use crate::backend::ReinBackend;

/// RMSNorm as transformers computes it: `w ⊙ x / sqrt(mean(x²) + ε)`, or Gemma's
/// `(1 + w) ⊙ x / sqrt(mean(x²) + ε)` (its weights are stored as offsets from one).
#[derive(Module, Debug)]
pub struct RmsNorm<B: ReinBackend> {
    /// `[hidden]`.
    pub weight: Param<Tensor<B, 1>>,
    #[module(skip)]
    eps: f64,
    #[module(skip)]
    adds_one: bool,
}

impl<B: ReinBackend> RmsNorm<B> {
    /// A norm over `weight.len()` features, multiplying by `1 + weight` when `adds_one` (Gemma).
    pub fn new(weight: Tensor<B, 1>, eps: f64, adds_one: bool) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            eps,
            adds_one,
        }
    }

    /// The factor the normalised rows are multiplied by: `w`, or `1 + w`.
    fn scale(&self) -> Tensor<B, 1> {
        match self.adds_one {
            true => self.weight.val().add_scalar(1.0),
            false => self.weight.val(),
        }
    }

    /// # Shapes
    /// `[.., hidden]` → same
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let shape = x.dims();
        let hidden = shape[D - 1];
        let rows = x.reshape([shape.iter().product::<usize>() / hidden.max(1), hidden]);
        let normed = B::rms_norm(
            rows.into_primitive().tensor(),
            self.scale().into_primitive().tensor(),
            self.eps,
        );
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(normed)).reshape(shape)
    }
}
