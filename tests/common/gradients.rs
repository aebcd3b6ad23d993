//! Every float parameter's gradient, by the parameter's path in its module, for tests that
//! compare gradients.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use rein_model::safetensors_file::Tensors;

/// Each float parameter of `module` with its gradient in `grads`: path (as
/// [`rein_model::safetensors_file::module_tensors`] names parameters) → (shape, values).
///
/// # Panics
/// If a parameter has no gradient there.
pub fn gradients<B: AutodiffBackend, M: Module<B>>(module: &M, grads: &B::Gradients) -> Tensors {
    struct Collect<'a, B: AutodiffBackend> {
        path: Vec<String>,
        grads: &'a B::Gradients,
        out: Tensors,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let path = self.path.join(".");
            let grad = (param.val().grad(self.grads)).unwrap_or_else(|| panic!("{path} has no gradient"));
            let shape = grad.dims().to_vec();
            let values = grad.into_data().convert::<f32>().to_vec().unwrap();
            self.out.insert(path, (shape, values));
        }
    }
    let mut collect = Collect::<B> {
        path: Vec::new(),
        grads,
        out: Tensors::new(),
    };
    module.visit(&mut collect);
    collect.out
}
