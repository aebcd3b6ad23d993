//! CleanRL's PPO agent: separate actor and critic MLPs.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use rein_core::SeededRng;

use crate::backend::ReinBackend;

use crate::mlp::{Activation, Mlp, MlpConfig, MlpInit};

/// What the actor outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionHead {
    /// Logits over `n` discrete actions.
    Categorical(usize),
    /// Means of a diagonal Gaussian over `dim` continuous actions, with a learned
    /// state-independent log standard deviation.
    Gaussian(usize),
}

impl ActionHead {
    /// Width of the actor's output layer.
    pub fn outputs(self) -> usize {
        match self {
            ActionHead::Categorical(n) | ActionHead::Gaussian(n) => n,
        }
    }
}

/// Configuration of an [`ActorCritic`].
#[derive(Debug, Clone, PartialEq)]
pub struct ActorCriticConfig {
    /// Observation features.
    pub obs_dim: usize,
    /// The action head.
    pub head: ActionHead,
    /// Hidden layer widths, for both actor and critic.
    pub hidden: Vec<usize>,
    /// Nonlinearity.
    pub activation: Activation,
    /// Initial log standard deviation of the Gaussian head (0 in CleanRL).
    pub init_log_std: f32,
}

/// Actor `π(a|s)` and critic `V(s)` as two MLPs (no shared trunk), initialised as in CleanRL:
/// hidden layers orthogonal with gain √2, actor output gain 0.01, critic output gain 1, biases
/// zero; the Gaussian head's log-std is a parameter independent of the state.
#[derive(Module, Debug)]
pub struct ActorCritic<B: ReinBackend> {
    actor: Mlp<B>,
    critic: Mlp<B>,
    log_std: Option<Param<Tensor<B, 1>>>,
    #[module(skip)]
    head: ActionHead,
}

impl ActorCriticConfig {
    /// Builds the agent on `device`, its weights drawn from `rng` (the actor's, then the
    /// critic's).
    pub fn init<B: ReinBackend>(&self, rng: &mut SeededRng, device: &B::Device) -> ActorCritic<B> {
        let mlp = |output, output_gain| MlpConfig {
            input: self.obs_dim,
            hidden: self.hidden.clone(),
            output,
            activation: self.activation,
            init: MlpInit::Orthogonal {
                hidden_gain: std::f64::consts::SQRT_2,
                output_gain,
            },
        };
        let log_std = match self.head {
            ActionHead::Gaussian(dim) => Some(Param::from_tensor(Tensor::full([dim], self.init_log_std, device))),
            ActionHead::Categorical(_) => None,
        };
        ActorCritic {
            actor: mlp(self.head.outputs(), 0.01).init(rng, device),
            critic: mlp(1, 1.0).init(rng, device),
            log_std,
            head: self.head,
        }
    }
}

impl<B: ReinBackend> ActorCritic<B> {
    /// The actor's output: logits (categorical) or means (Gaussian).
    ///
    /// # Shapes
    /// - `obs`: `[batch, obs_dim]` → `[batch, actions]`
    pub fn actor(&self, obs: Tensor<B, 2>) -> Tensor<B, 2> {
        self.actor.forward(obs)
    }

    /// The critic's value estimates.
    ///
    /// # Shapes
    /// - `obs`: `[batch, obs_dim]` → `[batch]`
    pub fn value(&self, obs: Tensor<B, 2>) -> Tensor<B, 1> {
        self.critic.forward(obs).squeeze_dim(1)
    }

    /// The Gaussian head's log standard deviations, `[action_dim]`; `None` for categorical.
    pub fn log_std(&self) -> Option<Tensor<B, 1>> {
        self.log_std.as_ref().map(Param::val)
    }

    /// The action head.
    pub fn head(&self) -> ActionHead {
        self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cpu;

    #[test]
    fn heads_have_the_right_shapes_and_small_initial_outputs() {
        let device = Default::default();
        for head in [ActionHead::Categorical(3), ActionHead::Gaussian(2)] {
            let config = ActorCriticConfig {
                obs_dim: 4,
                head,
                hidden: vec![16, 16],
                activation: Activation::Tanh,
                init_log_std: -0.5,
            };
            let agent = config.init::<Cpu>(&mut SeededRng::new(1), &device);
            let obs = Tensor::<Cpu, 2>::ones([5, 4], &device);
            let out = agent.actor(obs.clone());
            assert_eq!(out.dims(), [5, head.outputs()]);
            // Output gain 0.01 keeps the initial policy close to uniform / zero-mean.
            let max = out.abs().max().into_scalar();
            assert!(max < 0.1, "{max}");
            assert_eq!(agent.value(obs).dims(), [5]);
            match head {
                ActionHead::Gaussian(_) => {
                    assert_eq!(
                        agent.log_std().unwrap().into_data().to_vec::<f32>().unwrap(),
                        vec![-0.5, -0.5]
                    )
                }
                ActionHead::Categorical(_) => assert!(agent.log_std().is_none()),
            }
        }
    }
}
