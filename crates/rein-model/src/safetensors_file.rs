//! A burn module's parameters as `f32` safetensors, written by rein-gguf's deterministic writer
//! ([`write()`]: the bytes depend only on the tensors).

use std::path::Path;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

pub use rein_gguf::tensors_file::{Tensors, write};

/// Every float parameter of `module` under its path (`actor.layers.0.weight`), as
/// [`write()`] takes them.
pub fn module_tensors<B: Backend, M: Module<B>>(module: &M) -> Tensors {
    struct Collect {
        path: Vec<String>,
        tensors: Tensors,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let shape = value.dims().to_vec();
            let values = value.into_data().convert::<f32>().to_vec::<f32>().unwrap_or_default();
            self.tensors.insert(self.path.join("."), (shape, values));
        }
    }
    let mut collect = Collect {
        path: Vec::new(),
        tensors: Tensors::new(),
    };
    module.visit(&mut collect);
    collect.tensors
}

/// `module` with every float parameter set from `tensors` at its path (as [`module_tensors`]
/// names them), each keeping its parameter id. The error names the first parameter missing
/// from `tensors` or of another shape there; tensors no parameter reads are ignored.
pub fn with_tensors<B: Backend, M: Module<B>>(module: M, tensors: &Tensors) -> Result<M, String> {
    struct Set<'a> {
        path: Vec<String>,
        tensors: &'a Tensors,
        error: Option<String>,
    }
    impl<B: Backend> ModuleMapper<B> for Set<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let path = self.path.join(".");
            let tensor = match self.tensors.get(&path) {
                Some((shape, values)) if shape[..] == tensor.dims()[..] => {
                    let new = Tensor::from_data(TensorData::new(values.clone(), shape.clone()), &tensor.device());
                    if tensor.is_require_grad() {
                        new.require_grad()
                    } else {
                        new
                    }
                }
                found => {
                    let found = found.map_or("missing".to_string(), |(shape, _)| format!("of shape {shape:?}"));
                    self.error.get_or_insert(format!(
                        "parameter `{path}` of shape {:?}: {found} in the tensors given",
                        tensor.dims()
                    ));
                    tensor
                }
            };
            Param::from_mapped_value(id, tensor, mapper)
        }
    }
    let mut set = Set {
        path: Vec::new(),
        tensors,
        error: None,
    };
    let module = module.map(&mut set);
    set.error.map_or(Ok(module), Err)
}

/// Writes every float parameter of `module` to `path` (metadata `{"format": "pt"}`).
pub fn save_module<B: Backend, M: Module<B>>(module: &M, path: &Path) -> std::io::Result<()> {
    write(path, &module_tensors(module), "pt")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, Cpu, MlpConfig, MlpInit};

    #[test]
    fn the_same_module_gives_the_same_bytes() {
        let device = Default::default();
        let mlp = MlpConfig {
            input: 3,
            hidden: vec![4],
            output: 2,
            activation: Activation::Tanh,
            init: MlpInit::FanInUniform,
        }
        .init::<Cpu>(&mut rein_core::SeededRng::new(1), &device);
        let dir = std::env::temp_dir().join(format!("rein-safetensors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
        save_module(&mlp, &a).unwrap();
        save_module(&mlp, &b).unwrap();
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert_eq!(a, b);
        let parsed = safetensors::SafeTensors::deserialize(&a).unwrap();
        let mut names = parsed.names();
        names.sort();
        assert_eq!(
            names,
            ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tensors_read_back_into_a_module_and_a_wrong_shape_is_named() {
        let device = Default::default();
        let config = MlpConfig {
            input: 3,
            hidden: vec![4],
            output: 2,
            activation: Activation::Tanh,
            init: MlpInit::FanInUniform,
        };
        let (a, b) = (
            config.init::<Cpu>(&mut rein_core::SeededRng::new(1), &device),
            config.init::<Cpu>(&mut rein_core::SeededRng::new(2), &device),
        );
        let mut tensors = module_tensors(&a);
        let loaded = with_tensors(b, &tensors).unwrap();
        assert_eq!(module_tensors(&loaded), tensors);
        tensors.insert("layers.1.bias".into(), (vec![3], vec![0.0; 3]));
        let error = with_tensors(loaded, &tensors).unwrap_err();
        assert!(error.contains("`layers.1.bias` of shape [2]: of shape [3]"), "{error}");
    }
}
