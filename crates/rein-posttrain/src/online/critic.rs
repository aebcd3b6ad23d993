//! The value model of PPO on a language model: `V(prompt, completion[..t])`, the expected
//! return before each completion token is sampled. Either a model of its own (a decoder and a
//! one-value head: TRL and OpenRLHF, started from a reward model or from the policy) or a
//! one-value head on the policy's own last hidden states (one forward pass gives both the
//! log-probabilities and the values, and the value loss trains the shared trunk too).

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Tensor, TensorData};
use rein_core::{SeededRng, ValueModel};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, SequenceClassifier, load};
use rein_recipe::{LmPpoSection, LoadedRecipe};

use crate::LmError;
use crate::batch::{CompletionOutputs, completion_outputs, completion_values};
use crate::run::recipe_keys::{invalid, model_path};
use crate::token_batch::TokenBatch;

/// The standard deviation of a fresh value head's weights (transformers' `initializer_range`).
const HEAD_INIT_STD: f64 = 0.02;

/// A value model (see the module docs).
#[derive(Module, Debug)]
pub struct Critic<B: ReinBackend> {
    /// A separate value model's decoder; `None` when the head reads the policy's hidden states.
    trunk: Option<CausalLm<B>>,
    /// The value head, `[hidden, 1]`, no bias.
    head: Param<Tensor<B, 2>>,
}

impl<B: ReinBackend> Critic<B> {
    /// A fresh value head on the policy's last hidden states (`hidden` wide).
    pub fn head(hidden: usize, rng: &mut SeededRng, device: &B::Device) -> Self {
        Self {
            trunk: None,
            head: Param::from_tensor(fresh_head(hidden, rng, device)),
        }
    }

    /// A separate value model: `decoder` (its LM head dropped, every weight trainable, LoRA
    /// adapters merged) with a fresh value head.
    pub fn separate(decoder: CausalLm<B>, rng: &mut SeededRng, device: &B::Device) -> Self {
        let hidden = decoder.config().hidden_size;
        let mut trunk = decoder.merged().map(&mut Trainable);
        trunk.lm_head = None;
        Self {
            trunk: Some(trunk),
            head: Param::from_tensor(fresh_head(hidden, rng, device)),
        }
    }

    /// A separate value model started from a reward model: its decoder, and its score head as
    /// the value head (TRL's default: `value_model_path` is the reward model's). The reward
    /// model must have one label.
    pub fn from_reward_model(model: SequenceClassifier<B>) -> Result<Self, String> {
        if model.labels().len() != 1 {
            return Err(format!(
                "has {} labels ({}); a value model starts from a one-score reward model",
                model.labels().len(),
                model.labels().join(", ")
            ));
        }
        let (trunk, score) = model.into_parts();
        Ok(Self {
            trunk: Some(trunk.map(&mut Trainable)),
            head: Param::from_tensor(score.detach().require_grad()),
        })
    }

    /// Whether the values come from the policy's hidden states.
    pub fn shares_policy_trunk(&self) -> bool {
        self.trunk.is_none()
    }

    /// The values of `batch`'s completion tokens, `[rows, C]`, 0 at padding; `policy` is read
    /// only when the head is on its trunk.
    pub fn values(&self, policy: &CausalLm<B>, batch: &TokenBatch, device: &B::Device) -> Tensor<B, 2> {
        let trunk = self.trunk.as_ref().unwrap_or(policy);
        completion_values(trunk, self.head.val(), batch, device)
    }

    /// The policy's log-probabilities (and entropies) of `batch`'s completion tokens and their
    /// values, in one forward pass when the head is on the policy's trunk.
    pub fn evaluate(
        &self,
        policy: &CausalLm<B>,
        batch: &TokenBatch,
        temperature: f32,
        with_entropy: bool,
        device: &B::Device,
    ) -> CompletionOutputs<B> {
        match &self.trunk {
            None => completion_outputs(policy, batch, temperature, with_entropy, Some(self.head.val()), device),
            Some(trunk) => CompletionOutputs {
                values: Some(completion_values(trunk, self.head.val(), batch, device)),
                ..completion_outputs(policy, batch, temperature, with_entropy, None, device)
            },
        }
    }
}

fn fresh_head<B: ReinBackend>(hidden: usize, rng: &mut SeededRng, device: &B::Device) -> Tensor<B, 2> {
    let weights: Vec<f32> = (0..hidden).map(|_| (rng.normal() * HEAD_INIT_STD) as f32).collect();
    Tensor::from_data(TensorData::new(weights, [hidden, 1]), device)
}

/// Makes every float parameter a new trainable leaf with a new id: a copy of the policy's
/// decoder would otherwise share the policy's tensors, and the value loss's gradients would
/// flow into the policy (a merged or loaded decoder's weights may also be frozen).
pub(crate) struct Trainable;

impl<B: burn::tensor::backend::Backend> ModuleMapper<B> for Trainable {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        Param::from_tensor(param.val().detach().require_grad())
    }
}

/// The value model a recipe asks for (`algorithm.value_model`, `algorithm.value_model_path`)
/// beside `policy`: a head on the policy's trunk, a copy of the policy with a fresh head, or
/// the model at `value_model_path` (a reward model's score head kept, a causal LM's replaced).
pub(crate) fn critic_for<B: ReinBackend>(
    loaded: &LoadedRecipe,
    ppo: &LmPpoSection,
    policy: &CausalLm<B>,
    device: &B::Device,
) -> Result<Critic<B>, LmError> {
    let mut rng = SeededRng::new(loaded.recipe.seed ^ 0x5EED_C217);
    let Some(path) = ppo.value_model_path.as_deref() else {
        return Ok(match ppo.value_model {
            ValueModel::Head => Critic::head(policy.config().hidden_size, &mut rng, device),
            ValueModel::Separate => Critic::separate(policy.clone(), &mut rng, device),
        });
    };
    let key = "algorithm.value_model_path";
    let dir = model_path(loaded, path);
    if SequenceClassifier::<B>::is_classifier(&dir) {
        let model = SequenceClassifier::open(&dir, device).map_err(|e| invalid(loaded, key, e.to_string()))?;
        return Critic::from_reward_model(model)
            .map_err(|why| invalid(loaded, key, format!("{}: {why}", dir.display())));
    }
    let decoder = load::<B>(&dir, device).map_err(|e| invalid(loaded, key, e.to_string()))?;
    Ok(Critic::separate(decoder, &mut rng, device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::online::tiny_policy as policy;
    use burn::backend::{Autodiff, Flex};
    use burn::optim::GradientsParams;

    type B = Autodiff<Flex>;

    fn batch() -> TokenBatch {
        TokenBatch::new(&[(&[1, 2, 3], &[4, 5]), (&[6], &[7, 8, 9])], 0)
    }

    /// The value loss of a separate critic reaches its own weights only; the policy's copy in
    /// it is a different set of tensors.
    #[test]
    fn a_separate_critic_shares_no_tensor_with_the_policy() {
        let (policy, device) = (policy(), Default::default());
        let critic = Critic::separate(policy.clone(), &mut SeededRng::new(2), &device);
        let values = critic.values(&policy, &batch(), &device);
        let mut grads = values.sum().backward();
        let policy_grads = GradientsParams::from_module(&mut grads, &policy);
        let critic_grads = GradientsParams::from_module(&mut grads, &critic);
        assert!(
            policy_grads.is_empty(),
            "{} policy tensors got gradients",
            policy_grads.len()
        );
        // Every weight of the critic learns (the head and the decoder, but not the LM head it dropped).
        let mut tensors = Tensors(0);
        critic.visit(&mut tensors);
        assert_eq!(critic_grads.len(), tensors.0);
    }

    /// Counts float parameter tensors.
    struct Tensors(usize);

    impl burn::module::ModuleVisitor<B> for Tensors {
        fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<B, D>>) {
            self.0 += 1;
        }
    }

    /// A head on the policy's trunk: one forward pass gives the policy's log-probabilities and
    /// the values, the same values [`Critic::values`] reads, and the value's gradient reaches the
    /// policy's trunk.
    #[test]
    fn a_value_head_reads_the_policys_hidden_states() {
        let (policy, device) = (policy(), Default::default());
        let critic = Critic::head(8, &mut SeededRng::new(2), &device);
        assert!(critic.shares_policy_trunk());
        let out = critic.evaluate(&policy, &batch(), 1.0, false, &device);
        let alone: Vec<f32> = critic.values(&policy, &batch(), &device).into_data().to_vec().unwrap();
        let values = out.values.unwrap();
        assert_eq!(values.clone().into_data().to_vec::<f32>().unwrap(), alone);
        // Padding (row 0's third completion slot) is 0; the tokens' values are not.
        assert_eq!(alone[2], 0.0);
        assert!(alone.iter().enumerate().all(|(i, v)| i == 2 || *v != 0.0), "{alone:?}");
        let mut grads = values.sum().backward();
        assert!(!GradientsParams::from_module(&mut grads, &policy).is_empty());
    }
}
