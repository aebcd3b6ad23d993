//! Global gradient-norm clipping (Pascanu et al. 2013; `torch.nn.utils.clip_grad_norm_`).
//!
//! ```text
//! ‖g‖ = sqrt(Σ_params Σ g²)        g ← g · min(1, max_norm / (‖g‖ + 1e-6))
//! ```
//!
//! One norm over *all* parameters, not one per tensor: burn's optimiser-level clipping is per
//! tensor, which changes the update direction.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};

/// Clips `grads` (the gradients of `module`'s parameters) to a global norm of `max_norm` and
/// returns the norm before clipping.
pub fn clip_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f32,
) -> f32 {
    struct SquaredNorm<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        total: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let sq = g.powi_scalar(2).sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + sq,
                    None => sq,
                });
            }
        }
    }
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        factor: f32,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.factor));
            }
        }
    }

    let mut norm = SquaredNorm::<B> { grads, total: None };
    module.visit(&mut norm);
    let Some(total) = norm.total else { return 0.0 };
    let total = total.into_scalar().elem::<f64>().sqrt() as f32;
    let factor = max_norm / (total + 1e-6);
    if factor < 1.0 {
        module.visit(&mut Scale { grads, factor });
    }
    total
}
