//! The agent a recipe asks for ([`agent`]): SAC or TD3, on flat networks or (with
//! `model.autodiff`, or on a GPU) as burn modules, from the same initial weights.

use rein_core::{BoxSpace, SeededRng};
use rein_model::{OffPolicyConfig, ReinAutodiffBackend};
use rein_recipe::{OffPolicyAlgorithm, SacSection, Td3Section};

use super::flat::sac::FlatSac;
use super::flat::td3::FlatTd3;
use super::learner::Learner;
use super::sac::{Sac, SacSettings, TwinCritics};
use super::td3::{Td3, Td3Settings};

/// The recipe's agent, its networks initialised from `rng`: with `flat` on flat buffers
/// ([`FlatSac`], [`FlatTd3`]), else as burn modules on `device`; the same initial weights
/// either way.
pub(crate) fn agent<B: ReinAutodiffBackend>(
    algorithm: OffPolicyAlgorithm<'_>,
    config: &OffPolicyConfig,
    bounds: &BoxSpace,
    flat: bool,
    rng: &mut SeededRng,
    device: &B::Device,
) -> Box<dyn Learner<B>> {
    let twin = |rng: &mut SeededRng| TwinCritics {
        q1: config.q_network(rng, device),
        q2: config.q_network(rng, device),
    };
    match algorithm {
        OffPolicyAlgorithm::Sac(section) => {
            let actor = config.gaussian_actor(rng, device);
            let settings = sac_settings(section, config.act_dim);
            let critics = twin(rng);
            match flat {
                true => Box::new(FlatSac::new(&actor, &critics, None, bounds, settings)),
                false => Box::new(Sac::new(actor, critics, None, bounds, settings, device)),
            }
        }
        OffPolicyAlgorithm::Td3(section) => {
            let actor = config.deterministic_actor(rng, device);
            let (critics, settings) = (twin(rng), td3_settings(section));
            match flat {
                true => Box::new(FlatTd3::new((&actor, None), &critics, None, bounds, settings)),
                false => Box::new(Td3::new(actor, critics, None, None, bounds, settings, device)),
            }
        }
    }
}

/// SAC's settings from its section: with `autotune`, α starts at 1 and learns toward
/// `target_entropy` (default `−act_dim`), as CleanRL's `autotune` does.
fn sac_settings(s: &SacSection, act_dim: usize) -> SacSettings {
    SacSettings {
        gamma: s.gamma,
        tau: s.tau,
        policy_lr: s.policy_lr,
        q_lr: s.q_lr,
        policy_frequency: s.policy_frequency,
        target_network_frequency: s.target_network_frequency,
        target_entropy: s.autotune.then(|| s.target_entropy.unwrap_or(-(act_dim as f32))),
        alpha: if s.autotune { 1.0 } else { s.alpha },
    }
}

fn td3_settings(t: &Td3Section) -> Td3Settings {
    Td3Settings {
        gamma: t.gamma,
        tau: t.tau,
        learning_rate: t.learning_rate,
        policy_noise: t.policy_noise,
        noise_clip: t.noise_clip,
        policy_frequency: t.policy_frequency,
        exploration_noise: t.exploration_noise,
    }
}
