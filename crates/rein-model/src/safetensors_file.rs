//! A burn module's parameters as `f32` safetensors, written by rein-gguf's deterministic writer
//! ([`write`]: the bytes depend only on the tensors).

use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

pub use rein_gguf::tensors_file::{Tensors, write};

/// Every float parameter of `module` under its path (`actor.layers.0.weight`), as
/// [`write`] takes them.
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

/// Writes every float parameter of `module` to `path` (metadata `{"format": "pt"}`).
pub fn save_module<B: Backend, M: Module<B>>(module: &M, path: &Path) -> std::io::Result<()> {
    write(path, &module_tensors(module), "pt")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, Cpu, MlpConfig};

    #[test]
    fn the_same_module_gives_the_same_bytes() {
        let device = Default::default();
        let mlp = MlpConfig {
            input: 3,
            hidden: vec![4],
            output: 2,
            activation: Activation::Tanh,
            hidden_gain: 1.0,
            output_gain: 1.0,
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
}
