//! PPO's actor-critic on flat buffers ([`FlatLearner`]): the actor and critic as [`FlatMlp`]s,
//! the loss's gradient by hand (rein-optim's `ppo_rows`: the clipped surrogate, the value loss,
//! the heads' `log π` and entropy), global-norm clipping and [`FlatAdam`] — the steps
//! [`BurnLearner`](super::learner::BurnLearner) takes through burn's autodiff, from the same
//! initial weights, without building a graph. The actor's and the critic's passes run side by
//! side on two threads (`rein_kernels::team::join`): the loss couples them only through its sum.

use rein_core::Activation;
use rein_model::safetensors_file::{Tensors, module_tensors};
use rein_model::{ActionHead, ActorCritic, FlatMlp, ReinBackend, Trace};
use rein_optim::{
    FlatAdam, PpoLossConfig, PpoLossValues, Surrogate, categorical_row, categorical_row_backward,
    clipped_surrogate_rows, gaussian_entropy_row, gaussian_row, gaussian_row_backward, value_loss_rows,
};
use rein_recipe::OptimizerSection;

use super::learner::Learner;
use super::rollout::Minibatch;
use crate::ControlError;
use crate::flat_sections::{floats_bytes, non_finite, read_adam, read_floats, read_params};
use rein_run::checkpoint::Checkpoint;
use rein_run::driver::Snapshot;

/// One network, its optimiser, its gradient and the buffers its passes reuse.
#[derive(Debug, Clone)]
struct Trained {
    net: FlatMlp,
    adam: FlatAdam,
    grads: Vec<f32>,
    trace: Trace,
}

impl Trained {
    fn new(net: FlatMlp, optimizer: &OptimizerSection) -> Self {
        Self {
            adam: adam(net.params().len(), optimizer),
            grads: vec![0.0; net.params().len()],
            trace: Trace::default(),
            net,
        }
    }

    /// The output for `rows` rows of `input`, kept for [`Trained::backward`].
    fn forward(&mut self, input: &[f32], rows: usize) -> &[f32] {
        self.trace.input(&self.net, rows).copy_from_slice(input);
        self.net.forward(&mut self.trace);
        self.trace.output()
    }

    /// The parameters' gradient for `∂L/∂output` of the last forward pass.
    fn backward(&mut self, d_output: &[f32]) {
        self.trace.output_grad().copy_from_slice(d_output);
        self.net.backward(&mut self.trace, Some(&mut self.grads), false);
    }
}

/// PPO's actor, critic and Gaussian log-std on flat buffers.
#[derive(Debug, Clone)]
pub(super) struct FlatLearner {
    head: ActionHead,
    actor: Trained,
    critic: Trained,
    /// The Gaussian head's log standard deviations (empty for a categorical head).
    log_std: Vec<f32>,
    log_std_adam: FlatAdam,
    log_std_grads: Vec<f32>,
}

impl FlatLearner {
    /// The learner of `model`'s weights (its MLPs' nonlinearity `activation`), with Adam as
    /// `optimizer` configures it.
    pub(super) fn new<B: ReinBackend>(
        model: &ActorCritic<B>,
        activation: Activation,
        optimizer: &OptimizerSection,
    ) -> Self {
        let tensors = module_tensors(model);
        let net = |prefix| FlatMlp::from_tensors(&tensors, prefix, activation).expect("an actor-critic of MLPs");
        let log_std = tensors.get("log_std").map(|(_, v)| v.clone()).unwrap_or_default();
        Self {
            head: model.head(),
            actor: Trained::new(net("actor."), optimizer),
            critic: Trained::new(net("critic."), optimizer),
            log_std_adam: adam(log_std.len(), optimizer),
            log_std_grads: vec![0.0; log_std.len()],
            log_std,
        }
    }

    /// The first non-finite gradient, named as [`Learner::non_finite_parameter`] names
    /// parameters.
    fn non_finite_gradient(&self) -> Option<String> {
        let first = |t: &Trained| {
            t.grads
                .iter()
                .position(|g| !g.is_finite())
                .map(|at| t.net.param_name(at))
        };
        first(&self.actor)
            .map(|name| format!("actor.{name}"))
            .or_else(|| first(&self.critic).map(|name| format!("critic.{name}")))
            .or_else(|| {
                self.log_std_grads
                    .iter()
                    .any(|g| !g.is_finite())
                    .then(|| "log_std".into())
            })
    }
}

impl Learner for FlatLearner {
    fn forward(&mut self, obs: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
        let out = self.actor.forward(obs, n).to_vec();
        (out, self.critic.forward(obs, n).to_vec())
    }

    fn log_std(&self) -> Vec<f32> {
        self.log_std.clone()
    }

    fn gradients(&mut self, mb: Minibatch, config: &PpoLossConfig) -> PpoLossValues {
        let Self {
            head,
            actor,
            critic,
            log_std,
            log_std_grads,
            ..
        } = self;
        let ((surrogate, entropy), value) = rein_kernels::team::join(
            || actor_gradients((actor, *head), (log_std, log_std_grads), &mb, config),
            || critic_gradients(critic, &mb, config),
        );
        PpoLossValues::from_parts(surrogate, value, entropy, config)
    }

    fn apply(&mut self, update: usize, lr: f64, max_norm: f32) -> Result<f32, ControlError> {
        let squares = |g: &[f32]| g.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        let total = squares(&self.actor.grads) + squares(&self.critic.grads) + squares(&self.log_std_grads);
        let norm = total.sqrt() as f32;
        if !norm.is_finite() {
            return Err(rein_run::RunError::non_finite_gradient(update, norm, self.non_finite_gradient()).into());
        }
        // g ← g · min(1, max_norm / (‖g‖ + 10⁻⁶)), as `rein_optim::clip_grad_norm`.
        let factor = max_norm / (norm + 1e-6);
        let grads = [&mut self.actor.grads, &mut self.critic.grads, &mut self.log_std_grads];
        if factor < 1.0 {
            grads.into_iter().flatten().for_each(|g| *g *= factor);
        }
        for t in [&mut self.actor, &mut self.critic] {
            t.adam.step(lr, t.net.params_mut(), &t.grads);
        }
        self.log_std_adam.step(lr, &mut self.log_std, &self.log_std_grads);
        Ok(norm)
    }

    fn snapshot(&self) -> Snapshot {
        let mut sections = vec![
            ("actor".to_string(), floats_bytes(self.actor.net.params())),
            ("actor_optimizer".into(), self.actor.adam.to_bytes()),
            ("critic".into(), floats_bytes(self.critic.net.params())),
            ("critic_optimizer".into(), self.critic.adam.to_bytes()),
        ];
        if !self.log_std.is_empty() {
            sections.push(("log_std".into(), floats_bytes(&self.log_std)));
            sections.push(("log_std_optimizer".into(), self.log_std_adam.to_bytes()));
        }
        Box::new(move || sections)
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ControlError> {
        // Into a copy, so that a section of another size leaves the learner as it was.
        let mut restored = self.clone();
        for (t, name) in [(&mut restored.actor, "actor"), (&mut restored.critic, "critic")] {
            read_params(checkpoint, name, &mut t.net)?;
            read_adam(checkpoint, &format!("{name}_optimizer"), &mut t.adam)?;
        }
        if !restored.log_std.is_empty() {
            read_floats(checkpoint, "log_std", &mut restored.log_std)?;
            read_adam(checkpoint, "log_std_optimizer", &mut restored.log_std_adam)?;
        }
        *self = restored;
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        non_finite(&self.actor.net, "actor.")
            .or_else(|| non_finite(&self.critic.net, "critic."))
            .or_else(|| self.log_std.iter().any(|p| !p.is_finite()).then(|| "log_std".into()))
    }

    fn tensors(&self) -> Tensors {
        let mut tensors = self.actor.net.to_tensors("actor.");
        tensors.extend(self.critic.net.to_tensors("critic."));
        if !self.log_std.is_empty() {
            tensors.insert("log_std".into(), (vec![self.log_std.len()], self.log_std.clone()));
        }
        tensors
    }
}

/// The actor's side of the loss for `mb`: the surrogate's statistics and `mean(H)`; the actor's
/// gradient, and the log-std's into `d_log_std`.
fn actor_gradients(
    (actor, head): (&mut Trained, ActionHead),
    (log_std, d_log_std): (&[f32], &mut [f32]),
    mb: &Minibatch,
    config: &PpoLossConfig,
) -> (Surrogate, f32) {
    let n = mb.log_probs.len();
    let width = head.outputs();
    let out = actor.forward(&mb.obs, n).to_vec();
    let (mut log_prob, mut entropy) = (vec![0.0; n], vec![0.0; n]);
    for i in 0..n {
        let row = &out[i * width..(i + 1) * width];
        (log_prob[i], entropy[i]) = match head {
            ActionHead::Categorical(_) => categorical_row(row, mb.actions[i] as usize),
            ActionHead::Gaussian(d) => (gaussian_row(row, log_std, &mb.actions[i * d..(i + 1) * d]), 0.0),
        };
    }
    let mean_entropy = match head {
        ActionHead::Categorical(_) => entropy.iter().sum::<f32>() / n as f32,
        ActionHead::Gaussian(_) => gaussian_entropy_row(log_std),
    };
    let mut d_log_prob = vec![0.0; n];
    let surrogate = clipped_surrogate_rows(
        &log_prob,
        &mb.log_probs,
        &mb.advantages,
        config.clip_coef,
        &mut d_log_prob,
    );
    // ∂L/∂Hᵢ = −c_ent / n; a Gaussian's entropy is one value whose ∂/∂σ̃ is 1 per dimension.
    let d_entropy = -config.ent_coef / n as f32;
    let mut d_out = vec![0.0; out.len()];
    d_log_std.fill(-config.ent_coef);
    for (i, d) in d_out.chunks_exact_mut(width).enumerate() {
        let row = &out[i * width..(i + 1) * width];
        match head {
            ActionHead::Categorical(_) => {
                categorical_row_backward(row, mb.actions[i] as usize, (d_log_prob[i], d_entropy), d)
            }
            ActionHead::Gaussian(dims) => {
                let action = &mb.actions[i * dims..(i + 1) * dims];
                gaussian_row_backward(row, log_std, action, d_log_prob[i], d, d_log_std)
            }
        }
    }
    actor.backward(&d_out);
    (surrogate, mean_entropy)
}

/// The critic's side of the loss for `mb`: `L_value`; the critic's gradient of `c_v · L_value`.
fn critic_gradients(critic: &mut Trained, mb: &Minibatch, config: &PpoLossConfig) -> f32 {
    let n = mb.log_probs.len();
    let clip = config.clip_vloss.then_some(config.clip_coef);
    let values = critic.forward(&mb.obs, n).to_vec();
    let mut d_values = vec![0.0; n];
    let value = value_loss_rows(&values, &mb.values, &mb.returns, clip, &mut d_values);
    d_values.iter_mut().for_each(|d| *d *= config.vf_coef);
    critic.backward(&d_values);
    value
}

/// Adam as the recipe's `[optimizer]` configures burn's.
fn adam(len: usize, optimizer: &OptimizerSection) -> FlatAdam {
    FlatAdam::with(len, [optimizer.beta1, optimizer.beta2], optimizer.eps)
}

#[cfg(test)]
mod tests {
    use rein_core::SeededRng;
    use rein_model::{ActorCriticConfig, CpuAutodiff};

    use super::*;
    use crate::ppo::learner::BurnLearner;
    use rein_run::checkpoint::{CheckpointDir, read};

    fn model(head: ActionHead, hidden: usize, seed: u64) -> ActorCritic<CpuAutodiff> {
        let config = ActorCriticConfig {
            obs_dim: 3,
            head,
            hidden: vec![hidden, hidden],
            activation: Activation::Tanh,
            init_log_std: -0.3,
        };
        config.init(&mut SeededRng::new(seed), &Default::default())
    }

    /// CleanRL's PPO settings: β = (0.9, 0.999), ε = 10⁻⁵.
    fn optimizer() -> OptimizerSection {
        OptimizerSection::default()
    }

    /// A minibatch of `n` rows with actions of `head`, and advantages far enough from zero for
    /// some ratios to clip after a step.
    fn minibatch(head: ActionHead, n: usize, rng: &mut SeededRng) -> Minibatch {
        let mut normals = |k: usize, scale: f32| (0..k).map(|_| rng.normal() as f32 * scale).collect::<Vec<f32>>();
        let actions = match head {
            ActionHead::Categorical(k) => (0..n).map(|i| (i % k) as f32).collect(),
            ActionHead::Gaussian(d) => normals(n * d, 1.0),
        };
        Minibatch {
            obs: normals(n * 3, 1.0),
            actions,
            log_probs: normals(n, 0.3).iter().map(|x| x - 1.0).collect(),
            advantages: normals(n, 1.0),
            values: normals(n, 0.5),
            returns: normals(n, 1.0),
        }
    }

    fn clone_minibatch(mb: &Minibatch) -> Minibatch {
        Minibatch {
            obs: mb.obs.clone(),
            actions: mb.actions.clone(),
            log_probs: mb.log_probs.clone(),
            advantages: mb.advantages.clone(),
            values: mb.values.clone(),
            returns: mb.returns.clone(),
        }
    }

    /// Three minibatch steps (loss, clipped gradient, Adam) of the flat learner land where the
    /// burn module's steps through autodiff land, for both heads, with the gradients clipped.
    #[test]
    fn steps_equal_the_burn_learners() {
        let config = PpoLossConfig {
            clip_coef: 0.2,
            clip_vloss: true,
            ent_coef: 0.01,
            vf_coef: 0.5,
        };
        for head in [ActionHead::Categorical(3), ActionHead::Gaussian(2)] {
            let model = model(head, 16, 1);
            let mut flat = FlatLearner::new(&model, Activation::Tanh, &optimizer());
            let mut burn = BurnLearner::new(model, &optimizer(), 3, &Default::default());
            assert_eq!(flat.tensors(), burn.tensors(), "{head:?}: the same initial weights");
            let mut rng = SeededRng::new(7);
            for step in 1..=3 {
                let mb = minibatch(head, 64, &mut rng);
                let (ours, theirs) = (
                    flat.gradients(clone_minibatch(&mb), &config),
                    burn.gradients(mb, &config),
                );
                let pairs = [
                    (ours.loss, theirs.loss),
                    (ours.policy, theirs.policy),
                    (ours.value, theirs.value),
                    (ours.entropy, theirs.entropy),
                    (ours.approx_kl, theirs.approx_kl),
                    (ours.clip_frac, theirs.clip_frac),
                ];
                for (a, b) in pairs {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{head:?} step {step}: {ours:?} vs {theirs:?}"
                    );
                }
                let (a, b) = (
                    flat.apply(step, 1e-2, 0.1).unwrap(),
                    burn.apply(step, 1e-2, 0.1).unwrap(),
                );
                assert!(
                    a > 0.1 && (a - b).abs() <= 1e-5 * b,
                    "{head:?}: norms {a} vs {b}, clipped"
                );
                for (name, (shape, theirs)) in burn.tensors() {
                    let (our_shape, ours) = &flat.tensors()[&name];
                    assert_eq!(our_shape, &shape);
                    for (x, y) in ours.iter().zip(&theirs) {
                        assert!((x - y).abs() <= 2e-6, "{head:?} step {step}: `{name}` {x} vs {y}");
                    }
                }
            }
        }
    }

    /// A trained learner's checkpoint restores it exactly into a fresh one; one of networks of
    /// another size is refused by section, leaving the learner as it was.
    #[test]
    fn checkpoints_restore_exactly_and_refuse_other_sizes() {
        let head = ActionHead::Gaussian(2);
        let mut trained = FlatLearner::new(&model(head, 8, 1), Activation::Tanh, &optimizer());
        let config = PpoLossConfig {
            clip_coef: 0.2,
            clip_vloss: false,
            ent_coef: 0.0,
            vf_coef: 0.5,
        };
        let mut rng = SeededRng::new(2);
        for update in 1..=3 {
            trained.gradients(minibatch(head, 16, &mut rng), &config);
            trained.apply(update, 1e-3, 0.5).unwrap();
        }
        let sections = trained.snapshot()();
        let dir = std::env::temp_dir().join(format!("rein-flat-ppo-{}", std::process::id()));
        let borrowed: Vec<(&str, &[u8])> = sections.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        let path = CheckpointDir::of_run(&dir).save(3, &borrowed).unwrap();
        let checkpoint = read(&path).unwrap();

        let mut fresh = FlatLearner::new(&model(head, 8, 3), Activation::Tanh, &optimizer());
        fresh.restore(&checkpoint).unwrap();
        assert_eq!(fresh.tensors(), trained.tensors());
        assert_eq!(
            (&fresh.actor.adam, &fresh.critic.adam, &fresh.log_std_adam),
            (&trained.actor.adam, &trained.critic.adam, &trained.log_std_adam)
        );

        let mut other = FlatLearner::new(&model(head, 4, 3), Activation::Tanh, &optimizer());
        let before = other.tensors();
        let error = other.restore(&checkpoint).unwrap_err().to_string();
        assert!(
            error.contains("section `actor` holds 488 bytes; the network has 46 parameters (184 bytes)"),
            "{error}"
        );
        assert_eq!(other.tensors(), before);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A NaN gradient stops the step, names its parameter and changes nothing.
    #[test]
    fn a_non_finite_gradient_is_named_and_not_applied() {
        let head = ActionHead::Categorical(2);
        let mut learner = FlatLearner::new(&model(head, 4, 1), Activation::Tanh, &optimizer());
        let mut mb = minibatch(head, 8, &mut SeededRng::new(3));
        mb.returns[5] = f32::NAN;
        let config = PpoLossConfig {
            clip_coef: 0.2,
            clip_vloss: true,
            ent_coef: 0.0,
            vf_coef: 0.5,
        };
        let before = learner.tensors();
        assert!(learner.gradients(mb, &config).loss.is_nan());
        let error = learner.apply(4, 1e-3, 0.5).unwrap_err().to_string();
        assert!(
            error.starts_with("step 4: gradient norm (first non-finite: the gradient of `critic.layers.0.weight`)"),
            "{error}"
        );
        assert_eq!(learner.tensors(), before);
    }
}
