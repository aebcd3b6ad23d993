//! A loaded recipe as its algorithm reads it: each algorithm's view holds the sections that
//! algorithm requires (PPO's `[env]`, GRPO's and SFT's `[data]`), not `Option`s, and each
//! algorithm's rules live with its view. [`crate::LoadedRecipe::plan`] gives the view; loading
//! a recipe checks every rule, so training code never checks a section again.

use rein_core::AdvantageKind;

use crate::data::check_data;
use crate::error::{Broken, broken};
use crate::off_policy::{OffPolicyAlgorithm, OffPolicyRecipe};
use crate::schema::{
    Algorithm, DataSection, DpoSection, EnvSection, GrpoSection, LmPpoSection, OnlineDpoSection, PpoSection, Recipe,
    RewardModelSection, SftSection,
};

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
    /// A reward model trained on preference pairs.
    RewardModel(RewardModelRecipe<'a>),
    /// Online DPO on pairs the policy samples.
    OnlineDpo(OnlineDpoRecipe<'a>),
    /// PPO with a critic on a language model.
    LmPpo(LmPpoRecipe<'a>),
    /// SAC or TD3 on vector environments.
    OffPolicy(OffPolicyRecipe<'a>),
}

/// A PPO recipe: its hyperparameters and its environment.
#[derive(Debug, Clone, Copy)]
pub struct PpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub ppo: &'a PpoSection,
    /// `[env]`.
    pub env: &'a EnvSection,
}

/// A GRPO recipe: its hyperparameters and its prompts.
#[derive(Debug, Clone, Copy)]
pub struct GrpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub grpo: &'a GrpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

/// An SFT recipe: its settings and its data.
#[derive(Debug, Clone, Copy)]
pub struct SftRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub sft: &'a SftSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

/// A DPO recipe: its hyperparameters and its preference pairs.
#[derive(Debug, Clone, Copy)]
pub struct DpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub dpo: &'a DpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

/// An online-DPO recipe: its hyperparameters and its prompts.
#[derive(Debug, Clone, Copy)]
pub struct OnlineDpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub online_dpo: &'a OnlineDpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

/// A reward-model recipe: its hyperparameters and its preference pairs.
#[derive(Debug, Clone, Copy)]
pub struct RewardModelRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub reward_model: &'a RewardModelSection,
    /// `[data]`.
    pub data: &'a DataSection,
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
            Algorithm::RewardModel(reward_model) => Plan::RewardModel(RewardModelRecipe {
                recipe,
                reward_model,
                data: data("reward-model training")?,
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
            Plan::RewardModel(rm) => rm.check(),
            Plan::OnlineDpo(online) => online.check(),
            Plan::LmPpo(ppo) => ppo.check(),
            Plan::OffPolicy(off_policy) => off_policy.check(),
        }?;
        match self.data() {
            Some(data) => check_data(
                data.task.as_ref(),
                data.train.as_deref(),
                matches!(self, Plan::Dpo(_) | Plan::RewardModel(_)),
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
            | Plan::RewardModel(RewardModelRecipe { data, .. })
            | Plan::OnlineDpo(OnlineDpoRecipe { data, .. })
            | Plan::LmPpo(LmPpoRecipe { data, .. }) => Some(data),
        }
    }
}

impl OnlineDpoRecipe<'_> {
    /// Rewards to rank with, groups to rank, and DPO's own rules.
    fn check(&self) -> Result<(), Broken> {
        let (r, online) = (self.recipe, self.online_dpo);
        if r.reward.is_empty() {
            return Err(broken(
                "reward",
                "online DPO ranks completions by their rewards: add a [[reward]]",
            ));
        }
        if r.sampler.n < 2 {
            return Err(broken(
                "sampler.n",
                format!(
                    "must be at least 2, got {}: online DPO pairs a group's best completion with its worst",
                    r.sampler.n
                ),
            ));
        }
        if online.steps == 0 || online.prompts_per_step == 0 {
            return Err(broken(
                "algorithm.prompts_per_step",
                "steps and prompts_per_step must be at least 1",
            ));
        }
        if r.sampler.backend == rein_core::SamplerBackend::Http {
            return Err(broken(
                "sampler.backend",
                "online DPO samples in process for now: use backend = \"native\"",
            ));
        }
        check_preference_loss(online.beta, online.loss_type, online.label_smoothing, online.sft_weight)
    }
}

/// β, the label smoothing and the likelihood weight of a DPO-family loss.
fn check_preference_loss(
    beta: f32,
    loss_type: rein_core::DpoLossKind,
    label_smoothing: f32,
    sft_weight: f32,
) -> Result<(), Broken> {
    if !(beta > 0.0 && beta.is_finite()) {
        return Err(broken("algorithm.beta", format!("must be > 0, got {beta}")));
    }
    if !(0.0..0.5).contains(&label_smoothing) {
        return Err(broken(
            "algorithm.label_smoothing",
            format!("must be in [0, 0.5), got {label_smoothing}"),
        ));
    }
    if label_smoothing > 0.0 && loss_type != rein_core::DpoLossKind::Robust {
        return Err(broken(
            "algorithm.label_smoothing",
            format!("only the `robust` loss reads it (TRL's definition); loss_type is `{loss_type:?}`"),
        ));
    }
    if !(sft_weight >= 0.0 && sft_weight.is_finite()) {
        return Err(broken("algorithm.sft_weight", format!("must be ≥ 0, got {sft_weight}")));
    }
    Ok(())
}

impl RewardModelRecipe<'_> {
    /// Sizes and coefficients in range.
    fn check(&self) -> Result<(), Broken> {
        let rm = self.reward_model;
        check_pair_training(rm.steps, rm.batch_size, rm.lr, rm.max_length, rm.max_grad_norm)?;
        if !(rm.center_rewards_coefficient >= 0.0 && rm.center_rewards_coefficient.is_finite()) {
            return Err(broken(
                "algorithm.center_rewards_coefficient",
                format!("must be ≥ 0, got {}", rm.center_rewards_coefficient),
            ));
        }
        if !(rm.init_std > 0.0 && rm.init_std.is_finite()) {
            return Err(broken("algorithm.init_std", "must be positive"));
        }
        Ok(())
    }
}

impl DpoRecipe<'_> {
    /// Sizes, β and the smoothing in range.
    fn check(&self) -> Result<(), Broken> {
        let dpo = self.dpo;
        check_pair_training(dpo.steps, dpo.batch_size, dpo.lr, dpo.max_length, dpo.max_grad_norm)?;
        check_preference_loss(dpo.beta, dpo.loss_type, dpo.label_smoothing, dpo.sft_weight)
    }
}

/// The sizes, learning rate and clipping of training on preference pairs (DPO, reward models).
fn check_pair_training(
    steps: usize,
    batch_size: usize,
    lr: f64,
    max_length: usize,
    max_grad_norm: f32,
) -> Result<(), Broken> {
    if steps == 0 || batch_size == 0 {
        return Err(broken(
            "algorithm.batch_size",
            "steps and batch_size must be at least 1",
        ));
    }
    if !(lr > 0.0 && lr.is_finite()) {
        return Err(broken("algorithm.lr", format!("must be positive, got {lr}")));
    }
    if max_length < 2 {
        return Err(broken("algorithm.max_length", "must be at least 2 tokens"));
    }
    if max_grad_norm <= 0.0 || max_grad_norm.is_nan() {
        return Err(broken("algorithm.max_grad_norm", "must be positive"));
    }
    Ok(())
}

impl PpoRecipe<'_> {
    /// Sizes that must divide, coefficients in range, the environment's plugin limits.
    fn check(&self) -> Result<(), Broken> {
        let (ppo, env) = (self.ppo, self.env);
        if env.num_envs == 0 {
            return Err(broken("env.num_envs", "must be at least 1"));
        }
        if ppo.num_steps == 0 {
            return Err(broken("algorithm.num_steps", "must be at least 1"));
        }
        let batch = env.num_envs * ppo.num_steps;
        if ppo.num_minibatches == 0 || batch % ppo.num_minibatches != 0 {
            return Err(broken(
                "algorithm.num_minibatches",
                format!("must divide the batch of num_envs × num_steps = {batch}"),
            ));
        }
        if ppo.update_epochs == 0 {
            return Err(broken("algorithm.update_epochs", "must be at least 1"));
        }
        for (key, value) in [("algorithm.gamma", ppo.gamma), ("algorithm.gae_lambda", ppo.gae_lambda)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(broken(key, format!("must be between 0 and 1, got {value}")));
            }
        }
        if ppo.clip_coef <= 0.0 {
            return Err(broken("algorithm.clip_coef", "must be positive"));
        }
        for (key, value) in [("algorithm.ent_coef", ppo.ent_coef), ("algorithm.vf_coef", ppo.vf_coef)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be ≥ 0, got {value}")));
            }
        }
        env.limits
            .validate()
            .map_err(|e| broken(&format!("env.limits.{}", e.key), e.reason))?;
        Ok(())
    }
}

impl GrpoRecipe<'_> {
    /// Rewards, group sizes, coefficients, multi-turn settings, and where completions come from.
    fn check(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        let env_rewards = r.agent.as_ref().is_some_and(|a| a.env.is_some());
        if r.reward.is_empty() && !env_rewards {
            return Err(broken(
                "reward",
                "GRPO needs at least one [[reward]] (or a text environment, agent.env, that rewards)",
            ));
        }
        if grpo.prompts_per_step == 0 || grpo.steps == 0 {
            return Err(broken(
                "algorithm.prompts_per_step",
                "steps and prompts_per_step must be at least 1",
            ));
        }
        let single_allowed = grpo.advantage == AdvantageKind::ReinforcePp && !grpo.group_baseline;
        if r.sampler.n < 2 && !single_allowed {
            return Err(broken(
                "sampler.n",
                format!(
                    "must be at least 2, got {}: the GRPO family compares the completions of a prompt \
                     with each other, and with one per prompt every advantage is 0",
                    r.sampler.n
                ),
            ));
        }
        if r.sampler.n == 0 {
            return Err(broken("sampler.n", "must be at least 1"));
        }
        if let Some(teacher) = &r.teacher
            && !(teacher.coef > 0.0 && teacher.coef.is_finite())
        {
            return Err(broken("teacher.coef", format!("must be > 0, got {}", teacher.coef)));
        }
        if grpo.kl_coef < 0.0 || !grpo.kl_coef.is_finite() {
            return Err(broken(
                "algorithm.kl_coef",
                format!("must be ≥ 0, got {}", grpo.kl_coef),
            ));
        }
        if !grpo.entropy_coef.is_finite() {
            return Err(broken("algorithm.entropy_coef", "must be a finite number"));
        }
        if grpo.updates_per_batch == 0 {
            return Err(broken("algorithm.updates_per_batch", "must be at least 1"));
        }
        if grpo.clip_low <= 0.0 || grpo.clip_high <= 0.0 {
            return Err(broken("algorithm.clip_low", "clip ranges must be positive"));
        }
        if let Some(agent) = &r.agent {
            if r.tool.is_empty() && agent.env.is_none() {
                return Err(broken(
                    "agent",
                    "multi-turn episodes need tools ([[tool]]) or a text environment (agent.env)",
                ));
            }
            if agent.max_turns == 0 || agent.max_tokens == 0 {
                return Err(broken("agent.max_turns", "max_turns and max_tokens must be at least 1"));
            }
        }
        if grpo.dual_clip.is_some_and(|c| c <= 1.0) {
            return Err(broken(
                "algorithm.dual_clip",
                "the dual-clip constant must be greater than 1",
            ));
        }
        self.generation()?;
        self.gigpo()
    }

    /// A UCB curriculum over a generated task draws among its digit lengths: at least two, and
    /// every source it names among them (a data file's sources are checked when it is read).
    fn curriculum_sources(&self) -> Result<(), Broken> {
        let (Some(c), Some(task)) = (&self.recipe.curriculum, &self.data.task) else {
            return Ok(());
        };
        if c.kind != crate::CurriculumKind::Ucb {
            return Ok(());
        }
        let sources: Vec<String> = task.operand_ranges().into_iter().filter_map(|r| r.source).collect();
        if sources.len() < 2 {
            return Err(broken(
                "curriculum.kind",
                "`ucb` draws among the data's sources, and data.task makes one: \
                 list two or more operand lengths in data.task.digits",
            ));
        }
        if let Some(missing) = c.sources.iter().find(|s| !sources.contains(s)) {
            return Err(broken(
                "curriculum.sources",
                format!(
                    "{missing:?} has no rows: data.task's sources are {}",
                    sources.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// GiGPO compares the turns of multi-turn episodes.
    fn gigpo(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        if grpo.advantage == AdvantageKind::Gigpo {
            if r.agent.is_none() {
                return Err(broken(
                    "algorithm.advantage",
                    "`gigpo` compares the turns of multi-turn episodes: it needs an [agent] section",
                ));
            }
            if grpo.std_scaling == rein_core::StdScaling::Batch {
                return Err(broken(
                    "algorithm.std_scaling",
                    "`gigpo` normalises within groups: use `group` or `none`, not `batch`",
                ));
            }
            if !(0.0..=1.0).contains(&grpo.step_gamma) || !grpo.step_advantage_weight.is_finite() {
                return Err(broken(
                    "algorithm.step_gamma",
                    "step_gamma must be in [0, 1] and step_advantage_weight finite",
                ));
            }
        }
        Ok(())
    }

    /// Where GRPO's completions come from and how far generation may run ahead.
    pub(crate) fn generation(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        let sampler = &r.sampler;
        self.servers()?;
        if grpo.max_staleness > 0 && r.agent.is_some() {
            return Err(broken(
                "algorithm.max_staleness",
                "asynchronous GRPO is single-turn: remove [agent] or set 0",
            ));
        }
        if let Some((key, message)) = r.curriculum.as_ref().and_then(|c| c.invalid()) {
            return Err(broken(key, message));
        }
        self.curriculum_sources()?;
        if let Some(w) = &grpo.difficulty_weight {
            let valid = w.low > 0.0 && w.high >= w.low && (0.0..=1.0).contains(&w.center) && w.steepness > 0.0;
            if !valid || ![w.low, w.high, w.center, w.steepness].iter().all(|x| x.is_finite()) {
                return Err(broken(
                    "algorithm.difficulty_weight",
                    format!(
                        "needs 0 < low ≤ high, center in [0, 1] and steepness > 0 (got low {}, high {}, center {}, steepness {})",
                        w.low, w.high, w.center, w.steepness
                    ),
                ));
            }
        }
        if grpo.max_staleness > 0 && grpo.dynamic_sampling {
            return Err(broken(
                "algorithm.max_staleness",
                "dynamic sampling resamples within a step, which asynchronous generation cannot: set one of them off",
            ));
        }
        if sampler.sync_every == 0 || sampler.sync_every > grpo.max_staleness + 1 {
            return Err(broken(
                "sampler.sync_every",
                format!(
                    "must be in 1..={} (max_staleness + 1), or generation would wait for a version never written",
                    grpo.max_staleness + 1
                ),
            ));
        }
        if sampler.sync == rein_core::PolicySync::Adapter && r.lora.is_none() {
            return Err(broken(
                "sampler.sync",
                "`adapter` syncs the LoRA adapter: the recipe has no [lora]",
            ));
        }
        if !(grpo.tis_cap >= 1.0 && grpo.tis_cap.is_finite()) {
            return Err(broken(
                "algorithm.tis_cap",
                format!("must be ≥ 1, got {}", grpo.tis_cap),
            ));
        }
        let [low, high] = grpo.icepop_bounds;
        if !(low > 0.0 && low < 1.0 && high > 1.0 && high.is_finite()) {
            return Err(broken(
                "algorithm.icepop_bounds",
                format!("must be [low, high] with 0 < low < 1 < high, got [{low}, {high}]"),
            ));
        }
        Ok(())
    }

    /// Where completions come from: in process, or inference servers reached over plain HTTP.
    fn servers(&self) -> Result<(), Broken> {
        let (r, sampler) = (self.recipe, &self.recipe.sampler);
        let http = sampler.backend == rein_core::SamplerBackend::Http;
        if http && sampler.urls.is_empty() {
            return Err(broken("sampler.urls", "backend = \"http\" needs the servers' URLs"));
        }
        if http && sampler.precision != rein_core::SamplerPrecision::Exact {
            return Err(broken(
                "sampler.precision",
                "is for backend = \"native\" (servers choose their own)",
            ));
        }
        if !http && !sampler.urls.is_empty() {
            return Err(broken(
                "sampler.urls",
                "urls are for backend = \"http\"; the sampler is native",
            ));
        }
        if let Some(url) = sampler.urls.iter().find(|u| !u.starts_with("http://")) {
            return Err(broken(
                "sampler.urls",
                format!("{url:?} is not an http:// URL (plain HTTP to servers on the cluster's network)"),
            ));
        }
        if http && r.agent.is_some() {
            return Err(broken(
                "sampler.backend",
                "multi-turn episodes keep each episode's KV cache in process: use backend = \"native\" with [agent]",
            ));
        }
        if http && sampler.api == rein_core::ServerApi::Vllm && sampler.sync != rein_core::PolicySync::Adapter {
            return Err(broken(
                "sampler.sync",
                "vLLM loads a new policy over HTTP only as a LoRA adapter: set sync = \"adapter\" (with [lora])",
            ));
        }
        for (key, value) in [
            ("sampler.request_timeout_s", sampler.request_timeout_s),
            ("sampler.backoff_s", sampler.backoff_s),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(broken(
                    key,
                    format!("must be a positive number of seconds, got {value}"),
                ));
            }
        }
        Ok(())
    }
}

impl LmPpoSection {
    /// The GRPO settings that sample, score and clip as this PPO does: rein's PPO on a language
    /// model shares GRPO's rollouts and policy loss, and replaces its advantages.
    pub fn grpo_section(&self) -> GrpoSection {
        GrpoSection {
            steps: self.steps,
            prompts_per_step: self.prompts_per_step,
            clip_low: self.clip_coef,
            clip_high: self.clip_coef,
            dual_clip: None,
            aggregation: self.aggregation,
            kl_coef: self.kl_coef,
            kl_estimator: self.kl_estimator,
            kl_in_reward: self.kl_in_reward,
            kl_importance_weighted: false,
            entropy_coef: self.ent_coef,
            updates_per_batch: self.update_epochs,
            dynamic_sampling: false,
            mask_truncated: false,
            on_error: self.on_error,
            max_staleness: self.max_staleness,
            correction: self.correction,
            correction_level: self.correction_level,
            tis_cap: self.tis_cap,
            icepop_bounds: self.icepop_bounds,
            ..GrpoSection::default()
        }
    }
}

/// A language-model PPO recipe: its hyperparameters and its prompts.
#[derive(Debug, Clone, Copy)]
pub struct LmPpoRecipe<'a> {
    /// The whole recipe.
    pub recipe: &'a Recipe,
    /// `[algorithm]`.
    pub ppo: &'a LmPpoSection,
    /// `[data]`.
    pub data: &'a DataSection,
}

impl LmPpoRecipe<'_> {
    /// Rewards, sizes, coefficients in range, the value model, and where completions come from
    /// (as GRPO's).
    fn check(&self) -> Result<(), Broken> {
        let (r, ppo) = (self.recipe, self.ppo);
        if r.reward.is_empty() {
            return Err(broken(
                "reward",
                "PPO on a language model needs at least one [[reward]] to score completions",
            ));
        }
        if ppo.steps == 0 || ppo.prompts_per_step == 0 {
            return Err(broken(
                "algorithm.prompts_per_step",
                "steps and prompts_per_step must be at least 1",
            ));
        }
        if r.sampler.n == 0 {
            return Err(broken("sampler.n", "must be at least 1"));
        }
        if ppo.update_epochs == 0 {
            return Err(broken("algorithm.update_epochs", "must be at least 1"));
        }
        let completions = ppo.prompts_per_step * r.sampler.n;
        if ppo.num_minibatches == 0 || ppo.num_minibatches > completions {
            return Err(broken(
                "algorithm.num_minibatches",
                format!(
                    "must be in 1..={completions} (prompts_per_step × sampler.n completions per step), got {}",
                    ppo.num_minibatches
                ),
            ));
        }
        for (key, value) in [("algorithm.gamma", ppo.gamma), ("algorithm.gae_lambda", ppo.gae_lambda)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(broken(key, format!("must be in [0, 1], got {value}")));
            }
        }
        for (key, value) in [
            ("algorithm.clip_coef", ppo.clip_coef),
            ("algorithm.value_clip", ppo.value_clip),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be > 0, got {value}")));
            }
        }
        for (key, value) in [("algorithm.vf_coef", ppo.vf_coef), ("algorithm.kl_coef", ppo.kl_coef)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be ≥ 0, got {value}")));
            }
        }
        if !ppo.ent_coef.is_finite() {
            return Err(broken("algorithm.ent_coef", "must be a finite number"));
        }
        if let Some(lr) = ppo.critic_lr
            && !(lr > 0.0 && lr.is_finite())
        {
            return Err(broken("algorithm.critic_lr", format!("must be > 0, got {lr}")));
        }
        if ppo.critic_warmup_steps >= ppo.steps {
            return Err(broken(
                "algorithm.critic_warmup_steps",
                format!(
                    "is {} of {} steps: the policy would never learn",
                    ppo.critic_warmup_steps, ppo.steps
                ),
            ));
        }
        if ppo.value_model == rein_core::ValueModel::Head && ppo.value_model_path.is_some() {
            return Err(broken(
                "algorithm.value_model_path",
                "a value head reads the policy's hidden states and has no model of its own: \
                 set value_model = \"separate\" or remove value_model_path",
            ));
        }
        let grpo = ppo.grpo_section();
        GrpoRecipe {
            recipe: r,
            grpo: &grpo,
            data: self.data,
        }
        .generation()
    }
}

impl OnlineDpoSection {
    /// The GRPO settings that sample and score as online DPO does (no KL reference: DPO's
    /// reference is its own).
    pub fn grpo_section(&self) -> GrpoSection {
        GrpoSection {
            steps: self.steps,
            prompts_per_step: self.prompts_per_step,
            on_error: self.on_error,
            kl_coef: 0.0,
            ..GrpoSection::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PPO on a language model shares GRPO's asynchronous-rollout keys and their defaults.
    #[test]
    fn lm_ppo_defaults_its_correction_as_grpo_does() {
        let (ppo, grpo) = (LmPpoSection::default().grpo_section(), GrpoSection::default());
        assert_eq!(
            (ppo.correction, ppo.correction_level, ppo.tis_cap, ppo.icepop_bounds),
            (grpo.correction, grpo.correction_level, grpo.tis_cap, grpo.icepop_bounds)
        );
        assert_eq!((ppo.max_staleness, ppo.on_error), (grpo.max_staleness, grpo.on_error));
    }
}
