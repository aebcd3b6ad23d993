//! Naming the tensor that went NaN or infinite, so a run that stops on a non-finite loss or
//! gradient norm says where it started (`layers.2.mlp.up.weight`), not only that it happened.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};

/// The path of the first parameter of `module` holding a NaN or infinity.
pub fn non_finite_parameter<B: Backend, M: Module<B>>(module: &M) -> Option<String> {
    struct Find(FirstFound);
    impl<B: Backend> ModuleVisitor<B> for Find {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.check(|| all_finite(&param.val()));
        }
    }
    let mut find = Find(FirstFound::default());
    module.visit(&mut find);
    find.0.found
}

/// The path of the first parameter of `module` whose gradient in `grads` holds a NaN or
/// infinity.
pub fn non_finite_gradient<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> Option<String> {
    struct Find<'a>(&'a GradientsParams, FirstFound);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Find<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.1.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.1.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grads = self.0;
            self.1.check(|| {
                grads
                    .get::<B::InnerBackend, D>(param.id)
                    .is_none_or(|grad| all_finite(&grad))
            });
        }
    }
    let mut find = Find(grads, FirstFound::default());
    module.visit(&mut find);
    find.1.found
}

/// The path of the parameter being visited (burn enters a "module" for every field, the
/// parameter's own name last), and the first that failed a check.
#[derive(Default)]
struct FirstFound {
    path: Vec<String>,
    found: Option<String>,
}

impl FirstFound {
    fn check(&mut self, finite: impl FnOnce() -> bool) {
        if self.found.is_none() && !finite() {
            self.found = Some(self.path.join("."));
        }
    }
}

/// Whether every element is finite: a finite sum proves it; a non-finite sum may be an
/// overflow of finite values, so then the elements are checked one by one.
fn all_finite<B: Backend, const D: usize>(tensor: &Tensor<B, D>) -> bool {
    tensor.clone().sum().into_scalar().elem::<f64>().is_finite()
        || tensor.to_data().convert::<f64>().iter::<f64>().all(f64::is_finite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Param;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::TensorData;

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Two<B: Backend> {
        first: Linear<B>,
        second: Linear<B>,
    }

    #[test]
    fn the_broken_parameter_and_gradient_are_named() {
        let device = Default::default();
        let mut model = Two::<B> {
            first: LinearConfig::new(3, 3).init(&device),
            second: LinearConfig::new(3, 1).init(&device),
        };
        assert_eq!(non_finite_parameter(&model), None);
        // Large finite values whose sum overflows are still finite.
        let big = Tensor::<B, 2>::from_data(TensorData::new(vec![f32::MAX; 3], [3, 1]), &device);
        model.second.weight = Param::from_tensor(big);
        assert_eq!(non_finite_parameter(&model), None);

        let x = Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32, f32::NAN, 0.0], [1, 3]), &device);
        let loss = model.first.forward(x).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        assert_eq!(non_finite_gradient(&model, &grads).as_deref(), Some("first.weight"));

        let nan = Tensor::<B, 1>::from_data(TensorData::new(vec![0.0f32, f32::INFINITY, 0.0], [3]), &device);
        model.first.bias = Some(Param::from_tensor(nan));
        assert_eq!(non_finite_parameter(&model).as_deref(), Some("first.bias"));
    }
}
