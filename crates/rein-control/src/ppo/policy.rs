//! Acting with the actor's outputs: actions for a batch of envs, and the deterministic
//! policy's evaluation.

use rein_core::BatchActions;
use rein_model::ActionHead;
use rein_optim::RunningMeanStd;
use rein_recipe::{PpoSection, Recipe};
use rein_sampler::{SeededRng, sample_categorical, sample_gaussian};

use super::learner::Learner;
use crate::ControlError;
use crate::environments::{EnvFactory, episodes};

/// Samples one action per row of actor outputs `out` (the mode when `deterministic`): writes
/// the actions (`act_dim` each) into `actions` and their log-probabilities into `log_probs`, and
/// returns what the environments get (continuous actions clipped to `bounds`).
#[allow(clippy::too_many_arguments)]
pub(super) fn act(
    head: ActionHead,
    out: &[f32],
    log_std: &[f32],
    bounds: Option<&(Vec<f32>, Vec<f32>)>,
    rng: &mut SeededRng,
    deterministic: bool,
    actions: &mut [f32],
    log_probs: &mut [f32],
) -> BatchActions {
    let width = head.outputs();
    for (i, log_prob) in log_probs.iter_mut().enumerate() {
        let row = &out[i * width..(i + 1) * width];
        *log_prob = match head {
            ActionHead::Categorical(_) => {
                let (a, logp) = sample_categorical(row, rng, deterministic);
                actions[i] = a as f32;
                logp
            }
            ActionHead::Gaussian(d) => {
                let mut a = Vec::with_capacity(d);
                let logp = sample_gaussian(row, log_std, rng, deterministic, &mut a);
                actions[i * d..(i + 1) * d].copy_from_slice(&a);
                logp
            }
        };
    }
    match head {
        ActionHead::Categorical(_) => BatchActions::Discrete(actions.iter().map(|&a| a as u32).collect()),
        ActionHead::Gaussian(d) => {
            let (low, high) = bounds.expect("box actions have bounds");
            let clipped = actions
                .iter()
                .enumerate()
                .map(|(j, &a)| a.clamp(low[j % d], high[j % d]))
                .collect();
            BatchActions::Continuous(clipped)
        }
    }
}

/// Mean return of the deterministic policy (argmax / mean action) over `eval_episodes`
/// episodes, on fresh environments seeded away from the training seeds.
pub(super) fn evaluate(
    (learner, head): (&mut dyn Learner, ActionHead),
    make_env: &EnvFactory<'_>,
    recipe: &Recipe,
    obs_stats: Option<&RunningMeanStd>,
    ppo: &PpoSection,
    bounds: Option<&(Vec<f32>, Vec<f32>)>,
) -> Result<f64, ControlError> {
    let mut rng = SeededRng::new(0);
    let log_std = learner.log_std();
    let act_dim = match head {
        ActionHead::Categorical(_) => 1,
        ActionHead::Gaussian(d) => d,
    };
    let mut deterministic = |mut obs: Vec<f32>, n: usize| {
        if let Some(stats) = obs_stats {
            stats.normalize(&mut obs, ppo.clip_obs);
        }
        let (out, _) = learner.forward(&obs, n);
        let (mut actions, mut log_probs) = (vec![0.0; n * act_dim], vec![0.0; n]);
        act(
            head,
            &out,
            &log_std,
            bounds,
            &mut rng,
            true,
            &mut actions,
            &mut log_probs,
        )
    };
    episodes::evaluate(make_env, recipe.seed, recipe.train.eval_episodes, &mut deterministic)
}
