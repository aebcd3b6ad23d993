//! A multilayer perceptron.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorPrimitive};

use rein_core::SeededRng;

use crate::backend::{ReinBackend, linear};
use crate::random::{orthogonal, uniform};
pub use rein_core::Activation;

/// Configuration of an [`Mlp`].
#[derive(Debug, Clone, PartialEq)]
pub struct MlpConfig {
    /// Input features.
    pub input: usize,
    /// Width of each hidden layer.
    pub hidden: Vec<usize>,
    /// Output features.
    pub output: usize,
    /// Nonlinearity after each hidden layer.
    pub activation: Activation,
    /// How the weights start.
    pub init: MlpInit,
}

/// How an [`Mlp`]'s weights start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MlpInit {
    /// Orthogonal weights with these gains and zero biases (Saxe et al. 2013; the
    /// "orthogonal initialization" detail of PPO implementations, as CleanRL's `ppo.py`).
    Orthogonal {
        /// Gain of the hidden layers (√2 in CleanRL).
        hidden_gain: f64,
        /// Gain of the output layer (0.01 for policy logits, 1 for values).
        output_gain: f64,
    },
    /// PyTorch's own `nn.Linear` initialisation: weights and biases `U(−1/√fan_in, 1/√fan_in)`
    /// (kaiming-uniform with `a = √5`), as CleanRL's SAC and TD3 networks start.
    FanInUniform,
}

/// `x → Lₖ(σ(… σ(L₁ x)))`: linear layers with an activation between them, none after the last.
#[derive(Module, Debug)]
pub struct Mlp<B: ReinBackend> {
    layers: Vec<Linear<B>>,
    #[module(skip)]
    activation: Activation,
}

impl MlpConfig {
    /// Builds the MLP on `device`, its weights drawn from `rng`.
    pub fn init<B: ReinBackend>(&self, rng: &mut SeededRng, device: &B::Device) -> Mlp<B> {
        let widths: Vec<usize> = std::iter::once(self.input).chain(self.hidden.iter().copied()).collect();
        let (hidden_gain, output_gain) = match self.init {
            MlpInit::Orthogonal {
                hidden_gain,
                output_gain,
            } => (Some(hidden_gain), Some(output_gain)),
            MlpInit::FanInUniform => (None, None),
        };
        let mut layers: Vec<Linear<B>> = widths
            .windows(2)
            .map(|w| init_linear(rng, w[0], w[1], hidden_gain, device))
            .collect();
        layers.push(init_linear(
            rng,
            *widths.last().unwrap_or(&self.input),
            self.output,
            output_gain,
            device,
        ));
        Mlp {
            layers,
            activation: self.activation,
        }
    }
}

/// An orthogonal layer with `gain` and a zero bias, or with `None` PyTorch's fan-in uniform
/// weights and bias.
fn init_linear<B: ReinBackend>(
    rng: &mut SeededRng,
    input: usize,
    output: usize,
    gain: Option<f64>,
    device: &B::Device,
) -> Linear<B> {
    let (weight, bias) = match gain {
        Some(gain) => (
            orthogonal(rng, [input, output], gain, device),
            Tensor::zeros([output], device),
        ),
        None => {
            let bound = 1.0 / (input as f64).sqrt();
            let weight = uniform(rng, [input, output], bound, device);
            (weight, uniform(rng, [1, output], bound, device).reshape([output]))
        }
    };
    Linear {
        weight: Param::from_tensor(weight),
        bias: Some(Param::from_tensor(bias)),
    }
}

impl<B: ReinBackend> Mlp<B> {
    /// # Shapes
    /// - `x`: `[batch, input]` → `[batch, output]`
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let last = self.layers.len() - 1;
        self.layers.iter().enumerate().fold(x, |x, (i, layer)| {
            let y = linear(layer, x);
            match (i == last, self.activation) {
                (true, _) => y,
                (false, Activation::Tanh) => tanh(y),
                (false, Activation::Relu) => burn::tensor::activation::relu(y),
            }
        })
    }

    /// Input features.
    pub fn input_width(&self) -> usize {
        self.layers[0].weight.dims()[0]
    }

    /// Number of linear layers.
    pub fn depth(&self) -> usize {
        self.layers.len()
    }
}

/// `tanh` through rein's fused kernel (see [`ReinBackend::tanh`]).
fn tanh<B: ReinBackend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::tanh(x.into_primitive().tensor())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cpu;

    fn config(hidden: Vec<usize>) -> MlpConfig {
        MlpConfig {
            input: 3,
            hidden,
            output: 2,
            activation: Activation::Tanh,
            init: MlpInit::Orthogonal {
                hidden_gain: 2f64.sqrt(),
                output_gain: 1.0,
            },
        }
    }

    #[test]
    fn shapes_follow_the_config() {
        let device = Default::default();
        let mlp = config(vec![8, 5]).init::<Cpu>(&mut SeededRng::new(1), &device);
        assert_eq!(mlp.depth(), 3);
        let y = mlp.forward(Tensor::zeros([4, 3], &device));
        assert_eq!(y.dims(), [4, 2]);
        // Zero input and zero biases give exactly zero output.
        assert_eq!(y.into_data().to_vec::<f32>().unwrap(), vec![0.0; 8]);
    }

    #[test]
    fn fused_tanh_matches_libm_tanh() {
        let device = Default::default();
        let xs: Vec<f32> = (-400..=400).map(|i| i as f32 / 40.0).collect();
        let n = xs.len();
        let got = tanh(Tensor::<Cpu, 2>::from_data(
            burn::tensor::TensorData::new(xs.clone(), [1, n]),
            &device,
        ));
        for (x, y) in xs.iter().zip(got.into_data().to_vec::<f32>().unwrap()) {
            assert!((x.tanh() - y).abs() < 5e-7, "tanh({x}) = {} but got {y}", x.tanh());
        }
    }

    #[test]
    fn weights_are_orthogonal_with_the_gain() {
        let device = Default::default();
        let mlp = MlpConfig {
            input: 16,
            hidden: vec![16],
            ..config(vec![])
        }
        .init::<Cpu>(&mut SeededRng::new(1), &device);
        let w = mlp.layers[0].weight.val();
        let gram = w.clone().transpose().matmul(w).into_data().to_vec::<f32>().unwrap();
        for i in 0..16 {
            for j in 0..16 {
                let expected = if i == j { 2.0 } else { 0.0 };
                assert!(
                    (gram[i * 16 + j] - expected).abs() < 1e-4,
                    "W^T W [{i},{j}] = {}",
                    gram[i * 16 + j]
                );
            }
        }
    }
}
