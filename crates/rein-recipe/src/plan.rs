//! A loaded recipe as its algorithm reads it: each algorithm's view holds the sections that
//! algorithm requires (PPO's `[env]`, GRPO's and SFT's `[data]`), not `Option`s. Each algorithm's
//! section, view, rules and keys live in its own file (`ppo.rs`, `grpo.rs`, …; the online
//! algorithms' shared rollouts in `rollout.rs`); [`crate::LoadedRecipe::plan`] gives the view,
//! and loading a recipe checks every rule, so training code never checks a section again.

use crate::data::check_data;
use crate::dpo::DpoRecipe;
use crate::error::{Broken, broken};
use crate::grpo::GrpoRecipe;
use crate::kto::KtoRecipe;
use crate::lm_ppo::LmPpoRecipe;
use crate::off_policy::{OffPolicyAlgorithm, OffPolicyRecipe};
use crate::online_dpo::OnlineDpoRecipe;
use crate::ppo::PpoRecipe;
use crate::process_reward_model::ProcessRewardModelRecipe;
use crate::reward_model::RewardModelRecipe;
use crate::rollout::Rollout;
use crate::schema::{Algorithm, DataSection, Recipe};
use crate::sft::SftRecipe;

/// A recipe's algorithm with the sections it requires.
#[derive(Debug, Clone, Copy)]
pub enum Plan<'a> {
    /// PPO on vector environments.
    Ppo(PpoRecipe<'a>),
    /// The GRPO family on a language model.
    Grpo(GrpoRecipe<'a>),
    /// Supervised fine-tuning only.
    Sft(SftRecipe<'a>),
    /// The DPO family on preference pairs.
    Dpo(DpoRecipe<'a>),
    /// KTO on labelled completions.
    Kto(KtoRecipe<'a>),
    /// A reward model trained on preference pairs.
    RewardModel(RewardModelRecipe<'a>),
    /// A process reward model trained on step labels.
    Prm(ProcessRewardModelRecipe<'a>),
    /// Online DPO on pairs the policy samples.
    OnlineDpo(OnlineDpoRecipe<'a>),
    /// PPO with a critic on a language model.
    LmPpo(LmPpoRecipe<'a>),
    /// SAC or TD3 on vector environments.
    OffPolicy(OffPolicyRecipe<'a>),
}

impl<'a> Plan<'a> {
    /// The view of `recipe`'s algorithm; the error names the section it lacks.
    pub(crate) fn of(recipe: &'a Recipe) -> Result<Self, Broken> {
        let env = |algorithm: &str| {
            (recipe.env.as_ref())
                .ok_or_else(|| broken("env", format!("{algorithm} needs an [env] section with a plugin")))
        };
        let data = |algorithm: &str| {
            (recipe.data.as_ref()).ok_or_else(|| broken("data", format!("{algorithm} needs a [data] section")))
        };
        Ok(match &recipe.algorithm {
            Algorithm::Ppo(ppo) => Plan::Ppo(PpoRecipe {
                recipe,
                ppo,
                env: env("PPO")?,
            }),
            Algorithm::Grpo(grpo) => Plan::Grpo(GrpoRecipe {
                recipe,
                grpo,
                data: data("GRPO")?,
            }),
            Algorithm::Sft(sft) => Plan::Sft(SftRecipe {
                recipe,
                sft,
                data: data("SFT")?,
            }),
            Algorithm::Dpo(dpo) => Plan::Dpo(DpoRecipe {
                recipe,
                dpo,
                data: data("DPO")?,
            }),
            Algorithm::Kto(kto) => Plan::Kto(KtoRecipe {
                recipe,
                kto,
                data: data("KTO")?,
            }),
            Algorithm::RewardModel(reward_model) => Plan::RewardModel(RewardModelRecipe {
                recipe,
                reward_model,
                data: data("reward-model training")?,
            }),
            Algorithm::Prm(prm) => Plan::Prm(ProcessRewardModelRecipe {
                recipe,
                prm,
                data: data("process-reward-model training")?,
            }),
            Algorithm::OnlineDpo(online_dpo) => Plan::OnlineDpo(OnlineDpoRecipe {
                recipe,
                online_dpo,
                data: data("online DPO")?,
            }),
            Algorithm::LmPpo(ppo) => Plan::LmPpo(LmPpoRecipe {
                recipe,
                ppo,
                data: data("PPO on a language model")?,
            }),
            Algorithm::Sac(sac) => Plan::OffPolicy(OffPolicyRecipe {
                recipe,
                algorithm: OffPolicyAlgorithm::Sac(sac),
                env: env("SAC")?,
            }),
            Algorithm::Td3(td3) => Plan::OffPolicy(OffPolicyRecipe {
                recipe,
                algorithm: OffPolicyAlgorithm::Td3(td3),
                env: env("TD3")?,
            }),
        })
    }

    /// The algorithm's own rules.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        match self {
            Plan::Ppo(ppo) => ppo.check(),
            Plan::Grpo(grpo) => grpo.check(),
            Plan::Sft(_) => Ok(()),
            Plan::Dpo(dpo) => dpo.check(),
            Plan::Kto(kto) => kto.check(),
            Plan::RewardModel(rm) => rm.check(),
            Plan::Prm(prm) => prm.check(),
            Plan::OnlineDpo(online) => online.check(),
            Plan::LmPpo(ppo) => ppo.check(),
            Plan::OffPolicy(off_policy) => off_policy.check(),
        }?;
        match self.data() {
            Some(data) => check_data(
                (data.task.as_ref(), data.shapes_task.as_ref()),
                data.train.as_deref(),
                matches!(self, Plan::Dpo(_) | Plan::Kto(_) | Plan::RewardModel(_) | Plan::Prm(_)),
            ),
            None => Ok(()),
        }
    }

    /// The `[data]` section (every language-model algorithm has one).
    pub fn data(&self) -> Option<&'a DataSection> {
        match self {
            Plan::Ppo(_) | Plan::OffPolicy(_) => None,
            Plan::Grpo(GrpoRecipe { data, .. })
            | Plan::Sft(SftRecipe { data, .. })
            | Plan::Dpo(DpoRecipe { data, .. })
            | Plan::Kto(KtoRecipe { data, .. })
            | Plan::RewardModel(RewardModelRecipe { data, .. })
            | Plan::Prm(ProcessRewardModelRecipe { data, .. })
            | Plan::OnlineDpo(OnlineDpoRecipe { data, .. })
            | Plan::LmPpo(LmPpoRecipe { data, .. }) => Some(data),
        }
    }

    /// The rollouts of an online algorithm (GRPO, PPO on a language model, online DPO).
    pub fn rollout(&self) -> Option<Rollout> {
        match self {
            Plan::Grpo(grpo) => Some(grpo.rollout()),
            Plan::LmPpo(ppo) => Some(ppo.rollout()),
            Plan::OnlineDpo(online) => Some(online.rollout()),
            Plan::Ppo(_)
            | Plan::Sft(_)
            | Plan::Dpo(_)
            | Plan::Kto(_)
            | Plan::RewardModel(_)
            | Plan::Prm(_)
            | Plan::OffPolicy(_) => None,
        }
    }
}
