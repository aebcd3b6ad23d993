//! The GRPO family (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, GiGPO): its `[algorithm]`
//! section, its view of a recipe, its rules (the rollouts' are [`crate::rollout`]'s) and the
//! keys it reads.

use rein_core::AdvantageKind;
use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};
use crate::keys::{Keys, LM_MODEL, LM_TRAIN};
use crate::rollout::Rollout;
use crate::schema::{DataSection, Recipe};

/// The GRPO family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoSection {
    /// Optimiser steps (each on one batch of groups).
    pub steps: usize,
    /// Prompts per step (each sampled `sampler.n` times).
    pub prompts_per_step: usize,
    /// `group` (GRPO / Dr. GRPO), `rloo`, `reinforce++`, `gigpo` (multi-turn episodes),
    /// `grpo_passk` or `pass_at_k` (training for pass@k), `process` (step scores and the
    /// outcome as returns over tokens, PRIME's).
    pub advantage: AdvantageKind,
    /// k of `advantage = "pass_at_k"` (1 ≤ k ≤ `sampler.n`); that advantage only.
    pub pass_k: Option<usize>,
    /// `advantage = "process"`: γ of the returns over tokens (default 1, PRIME's).
    pub process_gamma: Option<f32>,
    /// `advantage = "process"`: the weight of the rewards' step scores (default 1).
    pub process_step_weight: Option<f32>,
    /// `advantage = "process"`: the weight of the outcome, the rewards' summed scores (default 1).
    pub process_outcome_weight: Option<f32>,
    /// GiGPO's ω: the weight of the step-level advantage.
    pub step_advantage_weight: f32,
    /// GiGPO's γ: the discount of the step-level returns-to-go.
    pub step_gamma: f32,
    /// Std scaling of group advantages: `group`, `batch` or `none` (Dr. GRPO).
    pub std_scaling: rein_core::StdScaling,
    /// How several `[[reward]]`s become one advantage: `sum_then_normalize` (GRPO: the
    /// weighted sum, normalised) or `normalize_then_sum` (GDPO: each reward normalised within
    /// its group, the weighted sum whitened over the batch).
    pub multi_objective_aggregation: rein_core::MultiObjectiveAggregation,
    /// REINFORCE++: subtract the group mean before batch normalisation.
    pub group_baseline: bool,
    /// `token` ratios (GRPO/DAPO) or `sequence` ratios (GSPO).
    pub ratio_level: rein_core::RatioLevel,
    /// What is maximised per token: `clip` (PPO's clipped surrogate), `cispo` or `sapo`.
    pub objective: rein_core::ObjectiveKind,
    /// CISPO's ε_max, the cap on the importance weight (TRL's `epsilon_high` with
    /// `loss_type = "cispo"`); `objective = "cispo"` only. Default 5 (ScaleRL's).
    pub cispo_max_weight: Option<f32>,
    /// SAPO's gate temperature for positive advantages; `objective = "sapo"` only. Default 1.
    pub sapo_temperature_pos: Option<f32>,
    /// SAPO's gate temperature for the other advantages; `objective = "sapo"` only. Default 1.05.
    pub sapo_temperature_neg: Option<f32>,
    /// ε_low.
    pub clip_low: f32,
    /// ε_high (DAPO's clip-higher: 0.28).
    pub clip_high: f32,
    /// Dual-clip constant for negative advantages.
    pub dual_clip: Option<f32>,
    /// `token-mean` (DAPO), `seq-mean-token-mean` (GRPO), `seq-mean-token-sum-norm` (Dr. GRPO).
    pub aggregation: rein_core::Aggregation,
    /// β: KL to the frozen starting policy (0 = no reference model is kept).
    pub kl_coef: f32,
    /// `k1`, `k2` or `k3`.
    pub kl_estimator: rein_core::KlEstimator,
    /// Fold the KL into the reward instead of the loss.
    pub kl_in_reward: bool,
    /// Weight the KL term by the importance ratio (DeepSeek-V3.2; TRL's default).
    pub kl_importance_weighted: bool,
    /// Entropy bonus coefficient (with `adaptive_entropy`, its starting value).
    pub entropy_coef: f32,
    /// Skywork-OR1's adaptive entropy coefficient: the bonus applies only while the mean token
    /// entropy is at or below `target`, and its coefficient moves by `delta` each update within
    /// `[min, max]`; `None`: a constant `entropy_coef`.
    pub adaptive_entropy: Option<rein_core::AdaptiveEntropy>,
    /// ρ: take the objective only on the share ρ of completion tokens with the highest entropy
    /// ("Beyond the 80/20 rule": 0.2; TRL's `top_entropy_quantile`); 1 keeps every token.
    pub top_entropy_quantile: f32,
    /// Gradient steps per batch (μ), reusing the sampling-time log-probabilities.
    pub updates_per_batch: usize,
    /// DAPO dynamic sampling: replace groups whose rewards are all equal by new prompts.
    pub dynamic_sampling: bool,
    /// Most extra sampling rounds per step for dynamic sampling.
    pub max_resample: usize,
    /// Scale each group's advantages by its prompt's difficulty (GRPO-LEAD's logistic weight of
    /// the group's accuracy, as `eval.accuracy_reward` judges it); `None`: unweighted.
    pub difficulty_weight: Option<rein_core::DifficultyWeight>,
    /// Leave truncated completions (no end-of-sequence token) out of the loss (DAPO).
    pub mask_truncated: bool,
    /// `fail`, `zero` or `skip` when a reward plugin fails.
    pub on_error: rein_core::OnError,
    /// How many policy versions generation may run ahead of training (0: synchronous).
    pub max_staleness: usize,
    /// `none`, `tis` or `icepop`: the loss's correction for the sampler's policy lag and
    /// mismatch.
    pub correction: rein_core::LagCorrection,
    /// `token` or `sequence`: where the correction's ratio is taken.
    pub correction_level: rein_core::RatioLevel,
    /// TIS's cap C on `π_trainer/π_sampler`.
    pub tis_cap: f32,
    /// IcePop's `[low, high]`: tokens whose ratio leaves it are masked.
    pub icepop_bounds: [f32; 2],
    /// A mixture of experts: the trainer routes each token to the experts the sampler chose
    /// (router replay, verl's and slime's R3); off, it routes freely and only measures how often
    /// it would differ (`moe/router_mismatch`).
    pub router_replay: bool,
    /// A mixture of experts: the load-balancing loss's coefficient (default: the model config's
    /// `router_aux_loss_coef`; 0 turns it off).
    pub router_aux_loss_coef: Option<f64>,
}

impl GrpoSection {
    /// CISPO's ε_max ([`GrpoSection::cispo_max_weight`], default 5).
    pub fn cispo_max_weight(&self) -> f32 {
        self.cispo_max_weight.unwrap_or(5.0)
    }

    /// SAPO's τ_pos (default 1, TRL's and the paper's).
    pub fn sapo_temperature_pos(&self) -> f32 {
        self.sapo_temperature_pos.unwrap_or(1.0)
    }

    /// SAPO's τ_neg (default 1.05, TRL's and the paper's).
    pub fn sapo_temperature_neg(&self) -> f32 {
        self.sapo_temperature_neg.unwrap_or(1.05)
    }

    /// The process advantage's γ (default 1).
    pub fn process_gamma(&self) -> f32 {
        self.process_gamma.unwrap_or(1.0)
    }

    /// The process advantage's weight of step scores (default 1).
    pub fn process_step_weight(&self) -> f32 {
        self.process_step_weight.unwrap_or(1.0)
    }

    /// The process advantage's weight of the outcome (default 1).
    pub fn process_outcome_weight(&self) -> f32 {
        self.process_outcome_weight.unwrap_or(1.0)
    }

    /// k of the pass@k advantage ([`GrpoSection::pass_k`]; the recipe's check requires it).
    pub fn pass_k(&self) -> usize {
        self.pass_k.unwrap_or(1)
    }

    /// Its rollouts: how many, how far ahead of training, how the lag is corrected.
    pub fn rollout(&self) -> Rollout {
        Rollout {
            steps: self.steps,
            prompts_per_step: self.prompts_per_step,
            on_error: self.on_error,
            max_staleness: self.max_staleness,
            correction: self.correction,
            correction_level: self.correction_level,
            tis_cap: self.tis_cap,
            icepop_bounds: self.icepop_bounds,
            tree: None,
        }
    }
}

impl Default for GrpoSection {
    fn default() -> Self {
        let rollout = Rollout::default();
        Self {
            steps: rollout.steps,
            prompts_per_step: rollout.prompts_per_step,
            advantage: AdvantageKind::Group,
            pass_k: None,
            process_gamma: None,
            process_step_weight: None,
            process_outcome_weight: None,
            step_advantage_weight: 1.0,
            step_gamma: 0.95,
            std_scaling: rein_core::StdScaling::Group,
            multi_objective_aggregation: rein_core::MultiObjectiveAggregation::SumThenNormalize,
            group_baseline: true,
            ratio_level: rein_core::RatioLevel::Token,
            objective: rein_core::ObjectiveKind::Clip,
            cispo_max_weight: None,
            sapo_temperature_pos: None,
            sapo_temperature_neg: None,
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            aggregation: rein_core::Aggregation::SeqMeanTokenMean,
            kl_coef: 0.0,
            kl_estimator: rein_core::KlEstimator::K3,
            kl_in_reward: false,
            kl_importance_weighted: true,
            entropy_coef: 0.0,
            adaptive_entropy: None,
            top_entropy_quantile: 1.0,
            updates_per_batch: 1,
            dynamic_sampling: false,
            max_resample: 3,
            difficulty_weight: None,
            mask_truncated: false,
            on_error: rollout.on_error,
            max_staleness: rollout.max_staleness,
            correction: rollout.correction,
            correction_level: rollout.correction_level,
            tis_cap: rollout.tis_cap,
            icepop_bounds: rollout.icepop_bounds,
            router_replay: true,
            router_aux_loss_coef: None,
        }
    }
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

impl GrpoRecipe<'_> {
    /// Its rollouts ([`GrpoSection::rollout`]), as a tree when `[rollout]` asks for one.
    pub fn rollout(&self) -> Rollout {
        Rollout {
            tree: self.recipe.rollout.as_ref().and_then(|r| r.tree()),
            ..self.grpo.rollout()
        }
    }

    /// Rewards, group sizes, coefficients, multi-turn settings, and where completions come from.
    pub(crate) fn check(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        let env_rewards = r.agent.as_ref().is_some_and(|a| a.env.is_some());
        if r.reward.is_empty() && !env_rewards {
            return Err(broken(
                "reward",
                "GRPO needs at least one [[reward]] (or a text environment, agent.env, that rewards)",
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
        if !(grpo.top_entropy_quantile > 0.0 && grpo.top_entropy_quantile <= 1.0) {
            return Err(broken(
                "algorithm.top_entropy_quantile",
                format!(
                    "must be in (0, 1] (the share of tokens kept; 1 keeps all), got {}",
                    grpo.top_entropy_quantile
                ),
            ));
        }
        if let Some(a) = &grpo.adaptive_entropy {
            let valid = a.target >= 0.0 && a.delta > 0.0 && 0.0 <= a.min && a.min <= a.max;
            if !valid || ![a.target, a.delta, a.min, a.max].iter().all(|x| x.is_finite()) {
                return Err(broken(
                    "algorithm.adaptive_entropy",
                    format!(
                        "needs target ≥ 0, delta > 0 and 0 ≤ min ≤ max (got target {}, delta {}, min {}, max {})",
                        a.target, a.delta, a.min, a.max
                    ),
                ));
            }
            if grpo.top_entropy_quantile < 1.0 {
                return Err(broken(
                    "algorithm.adaptive_entropy",
                    "measures the mean entropy of every completion token, and top_entropy_quantile below 1 \
                     trains on a share of them: use one of the two",
                ));
            }
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
        self.objective()?;
        self.aggregation_of_rewards()?;
        self.pass_at_k()?;
        self.process()?;
        crate::implicit_prm::check(r.implicit_prm.as_ref(), grpo.advantage)?;
        self.rollout().check(r)?;
        self.tree_rollout()?;
        self.curriculum()?;
        self.gigpo()
    }

    /// A tree rollout's sizes against the group's, and what a tree cannot be combined with.
    fn tree_rollout(&self) -> Result<(), Broken> {
        let (r, advantage) = (self.recipe, self.grpo.advantage);
        let Some(tree) = r.rollout.as_ref().and_then(|rollout| rollout.tree()) else {
            return Ok(());
        };
        for (key, value) in [
            ("rollout.trunks", tree.trunks),
            ("rollout.branch_points", tree.branch_points),
            ("rollout.branches", tree.branches),
            ("rollout.rounds", tree.rounds),
            ("rollout.interval", tree.interval),
        ] {
            if value == 0 {
                return Err(broken(key, "must be at least 1"));
            }
        }
        if r.sampler.n != tree.leaves() {
            return Err(broken(
                "sampler.n",
                format!(
                    "a tree of {} trunks and {} rounds of {} branch points × {} branches has {} leaves, \
                     the group's completions: set sampler.n = {} (it is {})",
                    tree.trunks,
                    tree.rounds,
                    tree.branch_points,
                    tree.branches,
                    tree.leaves(),
                    tree.leaves(),
                    r.sampler.n
                ),
            ));
        }
        if tree.rule == crate::BranchRule::Interval && tree.interval >= r.sampler.max_new_tokens {
            return Err(broken(
                "rollout.interval",
                format!(
                    "branch points every {} tokens: no completion of at most sampler.max_new_tokens = {} \
                     tokens has one",
                    tree.interval, r.sampler.max_new_tokens
                ),
            ));
        }
        if !(tree.step_weight.is_finite() && tree.step_weight >= 0.0) {
            return Err(broken(
                "rollout.step_weight",
                format!("must be finite and ≥ 0, got {}", tree.step_weight),
            ));
        }
        if tree.rule == crate::BranchRule::Entropy && r.sampler.backend == rein_core::SamplerBackend::Http {
            return Err(broken(
                "rollout.rule",
                "\"entropy\" reads the native sampler's next-token entropies, which servers do not report: \
                 use rule = \"interval\" or \"lines\" with backend = \"http\"",
            ));
        }
        match (&r.agent, tree.rule) {
            (None, crate::BranchRule::ToolCalls) => {
                return Err(broken(
                    "rollout.rule",
                    "\"tool_calls\" branches multi-turn episodes after a tool's reply, and this recipe has no \
                     [agent]: use \"entropy\", \"interval\" or \"lines\"",
                ));
            }
            (Some(_), rule) if rule != crate::BranchRule::ToolCalls => {
                return Err(broken(
                    "rollout.rule",
                    "multi-turn episodes ([agent]) branch after a tool's reply: use rule = \"tool_calls\"",
                ));
            }
            (Some(agent), _) if agent.env.is_some() => {
                return Err(broken(
                    "agent.env",
                    "a text environment's state cannot be copied into a branch: trees of episodes branch \
                     after tool calls, with tools only ([[tool]]); sample an environment's episodes as \
                     groups",
                ));
            }
            _ => {}
        }
        if matches!(advantage, AdvantageKind::Process | AdvantageKind::Gigpo) {
            return Err(broken(
                "algorithm.advantage",
                "the process and GiGPO advantages credit steps their own way: a tree's step advantage \
                 joins the group, rloo, reinforce_pp, grpo_passk and pass_at_k advantages",
            ));
        }
        Ok(())
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

    /// Each objective's settings are positive, and set only for the objective that reads them.
    fn objective(&self) -> Result<(), Broken> {
        use rein_core::ObjectiveKind::{Cispo, Clip, Sapo};
        let grpo = self.grpo;
        let settings = [
            ("algorithm.cispo_max_weight", grpo.cispo_max_weight, Cispo),
            ("algorithm.sapo_temperature_pos", grpo.sapo_temperature_pos, Sapo),
            ("algorithm.sapo_temperature_neg", grpo.sapo_temperature_neg, Sapo),
        ];
        for (key, value, reader) in settings {
            let Some(value) = value else { continue };
            if grpo.objective != reader {
                return Err(broken(
                    key,
                    format!(
                        "is read only with objective = {:?}, and this recipe's objective is {:?}",
                        objective_name(reader),
                        objective_name(grpo.objective)
                    ),
                ));
            }
            if !(value > 0.0 && value.is_finite()) {
                return Err(broken(key, format!("must be > 0, got {value}")));
            }
        }
        if grpo.objective != Clip && grpo.dual_clip.is_some() {
            return Err(broken(
                "algorithm.dual_clip",
                format!(
                    "bounds the clipped objective; objective = {:?} has no clip to bound",
                    objective_name(grpo.objective)
                ),
            ));
        }
        Ok(())
    }

    /// GDPO replaces GRPO's normalisation of the summed reward, so it is the group advantage,
    /// with its own scaling, on rewards that the KL is not folded into.
    fn aggregation_of_rewards(&self) -> Result<(), Broken> {
        let grpo = self.grpo;
        if grpo.multi_objective_aggregation == rein_core::MultiObjectiveAggregation::SumThenNormalize {
            return Ok(());
        }
        let conflict = if grpo.advantage != AdvantageKind::Group {
            Some(("algorithm.advantage", "it is a group advantage of its own: use `group`"))
        } else if grpo.std_scaling != rein_core::StdScaling::Group {
            Some((
                "algorithm.std_scaling",
                "it scales each reward by its group's deviation and the sum by the batch's: leave `group`",
            ))
        } else if grpo.kl_in_reward {
            Some((
                "algorithm.kl_in_reward",
                "it normalises each [[reward]] on its own, and a KL folded into their sum would be left out",
            ))
        } else {
            None
        };
        match conflict {
            Some((key, why)) => Err(broken(
                key,
                format!("cannot be combined with multi_objective_aggregation = \"normalize_then_sum\": {why}"),
            )),
            None => Ok(()),
        }
    }

    /// The pass@k advantages: k within the group, set only for `pass_at_k`, each with the
    /// scaling it defines, and a reward that says which completions are correct.
    fn pass_at_k(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        let scaling = grpo.std_scaling;
        match (grpo.advantage, grpo.pass_k) {
            (AdvantageKind::PassAtK, None) => Err(broken(
                "algorithm.pass_k",
                format!(
                    "`pass_at_k` trains for pass@k: set k, from 1 to sampler.n = {}",
                    r.sampler.n
                ),
            )),
            (AdvantageKind::PassAtK, Some(k)) if !(1..=r.sampler.n).contains(&k) => Err(broken(
                "algorithm.pass_k",
                format!(
                    "must be from 1 to sampler.n = {} (k of a group's samples), got {k}",
                    r.sampler.n
                ),
            )),
            (AdvantageKind::PassAtK, _) if scaling != rein_core::StdScaling::Group => Err(broken(
                "algorithm.std_scaling",
                "`pass_at_k` scales by its own σ = √(R(1 − R)): leave `group`",
            )),
            (AdvantageKind::PassAtK, _) if !r.judges_answers() => Err(broken(
                "reward",
                "`pass_at_k` counts the completions eval.accuracy_reward judges correct: it needs a [[reward]] \
                 with a plugin or a model",
            )),
            (AdvantageKind::GrpoPassk, _) if scaling == rein_core::StdScaling::Batch => Err(broken(
                "algorithm.std_scaling",
                "`grpo_passk` divides the best completion's margin by its group's deviation (`group`) or not at all (`none`)",
            )),
            (advantage, Some(_)) if advantage != AdvantageKind::PassAtK => Err(broken(
                "algorithm.pass_k",
                "is read only with advantage = \"pass_at_k\"",
            )),
            _ => Ok(()),
        }
    }

    /// The process advantage's settings are set only for it, γ in [0, 1] and the weights finite;
    /// its step scores come from a reward plugin or model.
    fn process(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        let settings = [
            ("algorithm.process_gamma", grpo.process_gamma),
            ("algorithm.process_step_weight", grpo.process_step_weight),
            ("algorithm.process_outcome_weight", grpo.process_outcome_weight),
        ];
        for (key, value) in settings {
            let Some(value) = value else { continue };
            if grpo.advantage != AdvantageKind::Process {
                return Err(broken(key, "is read only with advantage = \"process\""));
            }
            if !value.is_finite() {
                return Err(broken(key, format!("must be finite, got {value}")));
            }
        }
        if grpo.advantage != AdvantageKind::Process {
            return Ok(());
        }
        if !(0.0..=1.0).contains(&grpo.process_gamma()) {
            let gamma = grpo.process_gamma();
            return Err(broken(
                "algorithm.process_gamma",
                format!("must be in [0, 1], got {gamma}"),
            ));
        }
        if !r.judges_answers() {
            return Err(broken(
                "reward",
                "`process` trains on the step scores of a reward plugin or model: it needs a [[reward]] with a \
                 plugin or a model",
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

    /// The curriculum's settings and sources, the difficulty weight, and dynamic sampling's
    /// conflict with generation ahead of training.
    fn curriculum(&self) -> Result<(), Broken> {
        let (r, grpo) = (self.recipe, self.grpo);
        if let Some((key, message)) = r.curriculum.as_ref().and_then(|c| c.invalid()) {
            return Err(broken(key, message));
        }
        self.curriculum_sources()?;
        if let Some(w) = &grpo.difficulty_weight {
            if !r.judges_answers() {
                return Err(broken(
                    "algorithm.difficulty_weight",
                    "weighs each group by the accuracy eval.accuracy_reward judges: it needs a [[reward]] with a \
                     plugin or a model (a `signal` judges no answer)",
                ));
            }
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
        Ok(())
    }
}

/// An objective as the recipe names it.
fn objective_name(kind: rein_core::ObjectiveKind) -> &'static str {
    match kind {
        rein_core::ObjectiveKind::Clip => "clip",
        rein_core::ObjectiveKind::Cispo => "cispo",
        rein_core::ObjectiveKind::Sapo => "sapo",
    }
}

/// The sections the GRPO family reads.
pub(crate) const READS: &[(&str, Keys)] = &[
    ("data", Keys::All),
    ("model", LM_MODEL),
    ("optimizer", Keys::All),
    ("train", LM_TRAIN),
    ("sft", Keys::All),
    ("sampler", Keys::All),
    ("reward", Keys::All),
    ("eval", Keys::All),
    ("lora", Keys::All),
    ("tool", Keys::All),
    ("agent", Keys::All),
    ("teacher", Keys::All),
    ("implicit_prm", Keys::All),
    ("curriculum", Keys::All),
    ("rollout", Keys::All),
];
