//! The networks of off-policy actor-critics for continuous actions (SAC, TD3), as CleanRL's
//! `sac_continuous_action.py` and `td3_continuous_action.py` build them: MLPs with ReLU between
//! layers and PyTorch's own `nn.Linear` initialisation.
//!
//! - [`QNetwork`]: `Q(s, a)`, the MLP over the observation and action side by side.
//! - [`GaussianActor`]: the mean and raw log-standard-deviation of SAC's squashed Gaussian, one
//!   MLP whose last layer has both heads (CleanRL's `fc_mean` and `fc_logstd`, side by side).
//! - [`DeterministicActor`]: TD3's `μ(s) = s_a tanh(·) + b_a`.
//!
//! The losses these feed are rein-optim's; the squashing and sampling too.

use burn::module::Module;
use burn::tensor::Tensor;
use rein_core::{Activation, SeededRng};

use crate::backend::ReinBackend;
use crate::mlp::{Mlp, MlpConfig, MlpInit};

/// The sizes of an off-policy agent's networks.
#[derive(Debug, Clone, PartialEq)]
pub struct OffPolicyConfig {
    /// Observation features.
    pub obs_dim: usize,
    /// Action dimensions.
    pub act_dim: usize,
    /// Hidden layer widths (CleanRL: `[256, 256]`).
    pub hidden: Vec<usize>,
}

impl OffPolicyConfig {
    fn mlp(&self, input: usize, output: usize) -> MlpConfig {
        MlpConfig {
            input,
            hidden: self.hidden.clone(),
            output,
            activation: Activation::Relu,
            init: MlpInit::FanInUniform,
        }
    }

    /// A critic `Q(s, a)`.
    pub fn q_network<B: ReinBackend>(&self, rng: &mut SeededRng, device: &B::Device) -> QNetwork<B> {
        QNetwork {
            mlp: self.mlp(self.obs_dim + self.act_dim, 1).init(rng, device),
        }
    }

    /// SAC's actor.
    pub fn gaussian_actor<B: ReinBackend>(&self, rng: &mut SeededRng, device: &B::Device) -> GaussianActor<B> {
        GaussianActor {
            mlp: self.mlp(self.obs_dim, 2 * self.act_dim).init(rng, device),
            act_dim: self.act_dim,
        }
    }

    /// TD3's actor.
    pub fn deterministic_actor<B: ReinBackend>(
        &self,
        rng: &mut SeededRng,
        device: &B::Device,
    ) -> DeterministicActor<B> {
        DeterministicActor {
            mlp: self.mlp(self.obs_dim, self.act_dim).init(rng, device),
        }
    }
}

/// A critic `Q(s, a)`: an MLP over `[s, a]`.
#[derive(Module, Debug)]
pub struct QNetwork<B: ReinBackend> {
    mlp: Mlp<B>,
}

impl<B: ReinBackend> QNetwork<B> {
    /// # Shapes
    /// - `obs`: `[batch, obs_dim]`, `actions`: `[batch, act_dim]` → `[batch]`
    pub fn forward(&self, obs: Tensor<B, 2>, actions: Tensor<B, 2>) -> Tensor<B, 1> {
        self.mlp.forward(Tensor::cat(vec![obs, actions], 1)).squeeze_dim::<1>(1)
    }
}

/// SAC's actor: the squashed Gaussian's mean and raw log-standard-deviation (before
/// `rein_optim::bounded_log_std`).
#[derive(Module, Debug)]
pub struct GaussianActor<B: ReinBackend> {
    mlp: Mlp<B>,
    #[module(skip)]
    act_dim: usize,
}

impl<B: ReinBackend> GaussianActor<B> {
    /// Observation features.
    pub fn obs_dim(&self) -> usize {
        self.mlp.input_width()
    }

    /// # Shapes
    /// - `obs`: `[batch, obs_dim]` → (`mean`, `raw_log_std`), `[batch, act_dim]` each
    pub fn forward(&self, obs: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let out = self.mlp.forward(obs);
        (
            out.clone().narrow(1, 0, self.act_dim),
            out.narrow(1, self.act_dim, self.act_dim),
        )
    }
}

/// TD3's actor: `μ(s) = s_a tanh(MLP(s)) + b_a`.
#[derive(Module, Debug)]
pub struct DeterministicActor<B: ReinBackend> {
    mlp: Mlp<B>,
}

impl<B: ReinBackend> DeterministicActor<B> {
    /// Observation features.
    pub fn obs_dim(&self) -> usize {
        self.mlp.input_width()
    }

    /// # Shapes
    /// - `obs`: `[batch, obs_dim]`, `scale`, `bias`: `[act_dim]` (half the action box's width
    ///   and its centre) → `[batch, act_dim]`
    pub fn forward(&self, obs: Tensor<B, 2>, scale: Tensor<B, 1>, bias: Tensor<B, 1>) -> Tensor<B, 2> {
        self.mlp.forward(obs).tanh() * scale.unsqueeze::<2>() + bias.unsqueeze::<2>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cpu;
    use burn::tensor::TensorData;

    fn config() -> OffPolicyConfig {
        OffPolicyConfig {
            obs_dim: 3,
            act_dim: 2,
            hidden: vec![8, 8],
        }
    }

    #[test]
    fn shapes_and_the_actors_bounds() {
        let device = Default::default();
        let mut rng = SeededRng::new(3);
        let obs = Tensor::<Cpu, 2>::from_data(TensorData::new(vec![0.5f32; 12], [4, 3]), &device);
        let actions = Tensor::<Cpu, 2>::zeros([4, 2], &device);
        let q = config()
            .q_network::<Cpu>(&mut rng, &device)
            .forward(obs.clone(), actions);
        assert_eq!(q.dims(), [4]);
        let (mean, raw) = config().gaussian_actor::<Cpu>(&mut rng, &device).forward(obs.clone());
        assert_eq!((mean.dims(), raw.dims()), ([4, 2], [4, 2]));
        let scale = Tensor::from_data(TensorData::new(vec![2.0f32, 0.5], [2]), &device);
        let bias = Tensor::from_data(TensorData::new(vec![0.0f32, 1.0], [2]), &device);
        let mu: Vec<f32> = config()
            .deterministic_actor::<Cpu>(&mut rng, &device)
            .forward(obs, scale, bias)
            .into_data()
            .to_vec()
            .unwrap();
        for row in mu.chunks(2) {
            assert!(row[0].abs() <= 2.0 && (0.5..=1.5).contains(&row[1]), "{row:?}");
        }
    }

    /// PyTorch's `nn.Linear` init: every weight and bias within `1/√fan_in`.
    #[test]
    fn weights_start_within_the_fan_in_bound() {
        let device = Default::default();
        let q = config().q_network::<Cpu>(&mut SeededRng::new(1), &device);
        let tensors = crate::safetensors_file::module_tensors(&q);
        for (name, (shape, values)) in &tensors {
            let fan_in = if name.starts_with("mlp.layers.0") { 5.0 } else { 8.0f32 };
            let bound = 1.0 / fan_in.sqrt();
            assert!(values.iter().all(|v| v.abs() <= bound), "{name} {shape:?}");
            assert!(values.iter().any(|v| v.abs() > bound / 2.0), "{name} spans its range");
        }
    }
}
