//! The online stage: one step in algorithm order is sample prompts (in turn, or by the
//! [`curriculum`]) → generate G completions each → score groups with the reward plugins
//! (resampling groups without signal, DAPO) → learn with the stage's update → log. The update
//! is chosen once, at construction, each in its own file:
//!
//! - the GRPO family (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++; `learn.rs`): outcome
//!   advantages (KL folded into the reward when asked; GiGPO's per-turn ones for multi-turn
//!   episodes) → μ gradient steps on the policy loss against the sampling-time
//!   log-probabilities, split across devices by `split.rs`;
//! - online DPO (`online_dpo.rs`): each group's best completion against its worst;
//! - PPO with a critic (`ppo.rs`, the value model in `critic.rs`).
//!
//! With `[implicit_prm]` a second model learns beside the policy each step, PRIME's implicit
//! PRM (`implicit_prm.rs`), whose token rewards join the process advantage.
//!
//! `sample.rs` samples and scores; this file holds the state and the step.

use std::time::Duration;

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig};
use rein_core::{AdvantageKind, FailureCounts};
use rein_model::ReinAutodiffBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_optim::{DpoConfig, LinearSchedule};
use rein_recipe::{
    CurriculumKind, CurriculumSection, GrpoSection, OptimizerSection, Rollout, SamplerSection, TeacherKl,
};
use rein_sampler::{Generator, NativeGenerator, SeededRng};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::LmError;
use crate::Prompt;
use crate::rewards::WeightedReward;
use crate::rewards::signal::SignalReward;
use crate::rollout::episodes::Agent;
use crate::rollout::source::RolloutSource;
use crate::rollout::tree::TreeJob;
use rein_run::checkpoint::{Checkpoint, learner_sections, module_sections};
use rein_run::driver::{Record, Snapshot, Step, Trainer};
use rein_run::watchdog::Phases;

pub mod critic;
pub(crate) mod curriculum;
mod implicit_prm;
mod learn;
mod online_dpo;
mod ppo;
mod process_credit;
mod sample;
mod split;
pub(crate) mod turn_advantages;

pub use implicit_prm::ImplicitPrm;
pub use ppo::PpoCritic;

/// Where an online run's time went and how it ended.
#[derive(Debug, Clone, Default)]
pub struct OnlineOutcome {
    /// What learned from the samples: `GRPO`, `Online DPO` or `PPO`.
    pub algorithm: &'static str,
    /// Steps performed.
    pub steps: usize,
    /// Sampling completions.
    pub generate: Duration,
    /// Scoring them with the reward plugins.
    pub reward: Duration,
    /// Forward/backward passes and optimiser steps (and the KL reference's forward passes).
    pub train: Duration,
    /// Mean reward over the last 10% of steps.
    pub final_reward: f64,
}

/// Everything the online stage needs besides the model and its update.
pub struct OnlineContext<'a> {
    /// The tokenizer.
    pub tokenizer: &'a LmTokenizer,
    /// Training prompts.
    pub prompts: &'a [Prompt],
    /// Reward functions, weighted.
    pub rewards: &'a mut [WeightedReward],
    /// Label-free rewards computed from the sampler's certainty (the sampler records it when
    /// there is one).
    pub signals: &'a [SignalReward],
    /// The one of `rewards` that judges a completion correct (`eval.accuracy_reward`): a
    /// group's accuracy for `algorithm.difficulty_weight` and the curriculum.
    pub accuracy_reward: usize,
    /// Difficulty pools for drawing prompts (`[curriculum]`); `None`: every prompt in turn.
    pub curriculum: Option<&'a CurriculumSection>,
    /// Its rollouts: steps, prompts per step, how far ahead of training, the lag's correction,
    /// what a failing reward does (the plan's [`rein_recipe::Plan::rollout`]).
    pub rollout: Rollout,
    /// Sampling settings.
    pub sampler: &'a SamplerSection,
    /// Optimiser settings.
    pub optimizer: &'a OptimizerSection,
    /// Seed.
    pub seed: u64,
    /// Tools and a text environment: episodes of several turns instead of one completion.
    pub agent: Option<&'a mut Agent>,
}

/// Training prompts in a shuffled order, reshuffled after each pass (epoch).
#[derive(Clone, Serialize, Deserialize)]
struct PromptOrder {
    order: Vec<usize>,
    cursor: usize,
}

impl PromptOrder {
    fn new(prompts: usize, rng: &mut SeededRng) -> Self {
        let mut order: Vec<usize> = (0..prompts).collect();
        rng.shuffle(&mut order);
        Self { order, cursor: 0 }
    }

    fn next(&mut self, rng: &mut SeededRng) -> usize {
        if self.cursor == self.order.len() {
            rng.shuffle(&mut self.order);
            self.cursor = 0;
        }
        self.cursor += 1;
        self.order[self.cursor - 1]
    }
}

/// What a GRPO step carries to the next besides the model and optimiser (a checkpoint's
/// `state` section).
#[derive(Clone, Serialize, Deserialize)]
struct OnlineState {
    rng: SeededRng,
    prompt_order: PromptOrder,
    /// Each step's mean reward.
    rewards: Vec<f64>,
    /// Multi-turn episodes started so far (the text environment's episode ids).
    #[serde(default)]
    episodes: u64,
    /// Updates so far: the version of the policy being trained.
    #[serde(default)]
    version: u64,
    /// Each prompt's running pass rate, with `[curriculum] kind = "pools"`.
    #[serde(default)]
    pools: Option<curriculum::DifficultyPools>,
    /// The sources' recent absolute advantages, with `[curriculum] kind = "ucb"`.
    #[serde(default)]
    sources: Option<curriculum::SourceBandit>,
    /// The adaptive entropy coefficient, with `algorithm.adaptive_entropy`.
    #[serde(default)]
    entropy_coef: Option<rein_optim::EntropyCoefficient>,
}

impl OnlineState {
    /// The next training prompt: from the difficulty pools or the sources' bandit with a
    /// curriculum, else the next of the shuffled order.
    fn next_prompt(&mut self, curriculum: Option<&CurriculumSection>) -> usize {
        match (curriculum, &self.pools, &self.sources) {
            (Some(c), Some(pools), _) => pools.pick(c, &mut self.rng),
            (Some(c), _, Some(sources)) => sources.pick(c, &mut self.rng),
            _ => self.prompt_order.next(&mut self.rng),
        }
    }
}

/// What the online stage learns from each step's scored groups, chosen once at construction,
/// each with its own settings and in its own file.
pub enum Update<'a, B: ReinAutodiffBackend> {
    /// The GRPO family's policy-gradient update on group-relative advantages (`learn.rs`).
    Grpo(&'a GrpoSection),
    /// Online DPO: each group's best completion against its worst, on this DPO loss against the
    /// policy as it started (`online_dpo.rs`).
    OnlineDpo(DpoConfig),
    /// PPO with a critic: token advantages from the critic's values, minibatch updates of both
    /// (`ppo.rs`).
    Ppo(Box<PpoCritic<B>>),
}

impl<B: ReinAutodiffBackend> Update<'_, B> {
    /// The name in progress lines (`grpo step 3/20 | …`), metrics' `stage` and checkpoints.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Grpo(_) => "grpo",
            Self::OnlineDpo(_) => "online-dpo",
            Self::Ppo(_) => "ppo",
        }
    }

    /// The algorithm's name in the run's report.
    fn algorithm(&self) -> &'static str {
        match self {
            Self::Grpo(_) => "GRPO",
            Self::OnlineDpo(_) => "Online DPO",
            Self::Ppo(_) => "PPO",
        }
    }

    /// Whether it keeps the frozen starting policy: for the KL term when its β ≠ 0, and always
    /// for online DPO (DPO's reference).
    fn keeps_reference(&self) -> bool {
        match self {
            Self::Grpo(grpo) => grpo.kl_coef != 0.0,
            Self::OnlineDpo(_) => true,
            Self::Ppo(learner) => learner.settings.kl_coef != 0.0,
        }
    }

    /// The GRPO family's settings, which also shape its sampling (DAPO's resampling, the
    /// curriculum's advantages).
    fn grpo(&self) -> Option<&GrpoSection> {
        match self {
            Self::Grpo(grpo) => Some(grpo),
            _ => None,
        }
    }
}

/// The online stage on a language model: each step samples groups of completions from the
/// policy (in process or on servers, possibly ahead of training), scores them, and learns
/// from them with its [`Update`]: the GRPO family, online DPO or PPO with a critic.
pub struct OnlineTrainer<'a, B: ReinAutodiffBackend> {
    /// Policy, rollouts and curriculum.
    stage: Stage<'a, B>,
    /// What each step learns with.
    update: Update<'a, B>,
}

/// What every update shares: the policy and its optimiser, where completions come from, the
/// prompts' order and the curriculum.
struct Stage<'a, B: ReinAutodiffBackend> {
    /// The policy being trained.
    model: CausalLm<B>,
    optim: OptimizerAdaptor<AdamW, CausalLm<B>, B>,
    /// The frozen starting policy, for the KL term (none when β = 0).
    reference: Option<CausalLm<B::InnerBackend>>,
    /// On-policy distillation's teacher, the weight of its term and how its KL is estimated.
    teacher: Option<(CausalLm<B::InnerBackend>, f32, TeacherKl)>,
    /// PRIME's implicit PRM, learning beside the policy.
    implicit_prm: Option<ImplicitPrm<B>>,
    ctx: OnlineContext<'a>,
    /// Single-turn completions: the native sampler or inference servers, possibly ahead of
    /// training (multi-turn episodes are played in process).
    source: Option<RolloutSource<B::InnerBackend>>,
    /// The last step whose prompts were submitted to `source`, with the prompts of the steps
    /// submitted and not yet taken.
    submitted: usize,
    in_flight: std::collections::VecDeque<Vec<usize>>,
    lr: LinearSchedule,
    pad: u32,
    state: OnlineState,
    device: B::Device,
    /// The devices each policy update splits the batch's rows across; the first is `device`.
    devices: Vec<B::Device>,
    /// How each group is grown when the rollouts are trees (`[rollout] kind = "tree"`).
    tree: Option<TreeJob>,
}

impl<'a, B: ReinAutodiffBackend> OnlineTrainer<'a, B> {
    /// The online stage from `model` (also the frozen reference when `update` keeps one),
    /// learning with `update`, sampling in process.
    pub fn new(
        model: CausalLm<B>,
        ctx: OnlineContext<'a>,
        update: Update<'a, B>,
        device: &B::Device,
    ) -> Result<Self, LmError> {
        let native = Box::new(NativeGenerator::<B::InnerBackend>::new(ctx.tokenizer.clone(), device));
        Self::with_generator(model, ctx, update, native, device)
    }

    /// The online stage whose single-turn completions come from `generator`, running up to
    /// the rollouts' `max_staleness` steps ahead of training.
    pub fn with_generator(
        model: CausalLm<B>,
        ctx: OnlineContext<'a>,
        update: Update<'a, B>,
        generator: Box<dyn Generator<B::InnerBackend>>,
        device: &B::Device,
    ) -> Result<Self, LmError> {
        let (sampler, optimizer) = (ctx.sampler, ctx.optimizer);
        if let Update::Grpo(grpo) = &update {
            if grpo.advantage == AdvantageKind::Rloo && sampler.n < 2 {
                return Err(LmError::Unsupported("RLOO needs sampler.n ≥ 2".into()));
            }
            if grpo.advantage == AdvantageKind::Gigpo && ctx.agent.is_none() {
                return Err(LmError::Unsupported(
                    "GiGPO's advantages compare the turns of multi-turn episodes: OnlineContext::agent is None".into(),
                ));
            }
        }
        let optim = adamw(optimizer).init::<B, CausalLm<B>>();
        let lr = lr_schedule(optimizer, optimizer.lr, ctx.rollout.steps);
        let mut rng = SeededRng::new(ctx.seed ^ 0x6A09_E667);
        let prompt_order = PromptOrder::new(ctx.prompts.len(), &mut rng);
        let pools = (ctx.curriculum)
            .filter(|c| c.kind == CurriculumKind::Pools)
            .map(|_| curriculum::DifficultyPools::new(ctx.prompts.len()));
        let sources = match ctx.curriculum.filter(|c| c.kind == CurriculumKind::Ucb) {
            Some(c) => Some(curriculum::SourceBandit::new(ctx.prompts, c).map_err(curriculum_error)?),
            None => None,
        };
        let source = match ctx.agent {
            Some(_) => None,
            None => Some(
                RolloutSource::new(generator, &model.valid(), 0, ctx.rollout.max_staleness)
                    .map_err(|error| LmError::generator(0, error))?,
            ),
        };
        let tree = ctx.rollout.tree.map(|rollout| TreeJob::new(rollout, ctx.tokenizer));
        let stage = Stage {
            source,
            submitted: 0,
            in_flight: Default::default(),
            reference: update.keeps_reference().then(|| model.valid()),
            teacher: None,
            implicit_prm: None,
            model,
            optim,
            pad: ctx.tokenizer.pad_id().unwrap_or(0),
            ctx,
            lr,
            state: OnlineState {
                rng,
                prompt_order,
                rewards: Vec::new(),
                episodes: 0,
                version: 0,
                pools,
                sources,
                entropy_coef: None,
            },
            device: device.clone(),
            devices: vec![device.clone()],
            tree,
        };
        Ok(Self { stage, update })
    }

    /// The policy being trained.
    pub fn model(&self) -> &CausalLm<B> {
        &self.stage.model
    }

    /// The trained policy.
    pub fn into_model(self) -> CausalLm<B> {
        self.stage.model
    }

    /// Data parallelism (`train.devices`): each policy update splits the batch's rows across
    /// `devices`, the first being the policy's own ([`crate::data_parallel::devices`] numbers
    /// them); a batch with fewer rows than devices uses as many devices as it has rows. Online
    /// DPO, PPO with a critic, the full teacher KL and a mixture of experts train on one
    /// device: with more than one this is an error, before any step.
    pub fn with_devices(mut self, devices: Vec<B::Device>) -> Result<Self, LmError> {
        if !devices.is_empty() {
            self.stage.devices = devices;
        }
        self.fits_the_devices()?;
        Ok(self)
    }

    /// Whether what this run learns with can be split across its devices: the policy-gradient
    /// updates can; online DPO, PPO with a critic and the full teacher KL (its vocabulary-wide
    /// logits) train on one device.
    fn fits_the_devices(&self) -> Result<(), LmError> {
        let stage = &self.stage;
        if stage.devices.len() < 2 {
            return Ok(());
        }
        let single = match (&self.update, &stage.teacher) {
            (Update::OnlineDpo(_), _) => "online DPO",
            (Update::Ppo(_), _) => "PPO with a critic",
            (Update::Grpo(_), Some((_, _, TeacherKl::Full))) => {
                "the full reverse KL to a teacher (`teacher.kl = \"full\"`)"
            }
            // The load-balancing loss is a product of means over the whole batch: no share of
            // it is a share of the batch's.
            _ if stage.model.config().moe().is_some() => "a mixture of experts (its load-balancing loss)",
            _ => return Ok(()),
        };
        Err(LmError::Unsupported(format!(
            "data parallelism ({} devices, `train.devices`) splits the policy-gradient updates of the \
             GRPO family; {single} trains on one device",
            stage.devices.len()
        )))
    }

    /// On-policy distillation: each sampled token's advantage gains
    /// `coef · (log π_teacher − log π_student)` ([`rein_optim::add_teacher_advantages`]), or
    /// with [`TeacherKl::Full`] the loss gains `coef ·` the reverse KL over the vocabulary
    /// ([`rein_optim::full_reverse_kl`]). The teacher must share the policy's tokenizer (the
    /// caller checks). The full KL trains on one device: with more this is an error.
    pub fn with_teacher(
        mut self,
        teacher: CausalLm<B::InnerBackend>,
        coef: f32,
        kl: TeacherKl,
    ) -> Result<Self, LmError> {
        self.stage.teacher = Some((teacher, coef, kl));
        self.fits_the_devices()?;
        Ok(self)
    }

    /// PRIME's implicit PRM: each step it learns from the completions' outcome labels and its
    /// token rewards join the process advantage with its weight. The GRPO family with
    /// `advantage = "process"` only (else an error); it trains on the first device.
    pub fn with_implicit_prm(mut self, prm: ImplicitPrm<B>) -> Result<Self, LmError> {
        if !self
            .update
            .grpo()
            .is_some_and(|grpo| grpo.advantage == AdvantageKind::Process)
        {
            return Err(LmError::Unsupported(
                "the implicit PRM's token rewards are a source of the process advantage: it needs the GRPO \
                 family with advantage = \"process\""
                    .into(),
            ));
        }
        self.stage.implicit_prm = Some(prm);
        Ok(self)
    }

    /// The run's outcome once the driver is done, with its phase timings.
    pub fn outcome(&self, steps: usize, phases: &std::collections::BTreeMap<String, Duration>) -> OnlineOutcome {
        let phase = |name: &str| phases.get(name).copied().unwrap_or_default();
        let rewards = &self.stage.state.rewards;
        let tail = (rewards.len() / 10).max(1);
        OnlineOutcome {
            algorithm: self.update.algorithm(),
            steps,
            generate: phase("generate"),
            reward: phase("reward"),
            train: phase("reference")
                + phase("values")
                + phase("teacher")
                + phase("implicit_prm")
                + phase("forward")
                + phase("backward")
                + phase("optimizer"),
            final_reward: rewards.iter().rev().take(tail).sum::<f64>() / tail as f64,
        }
    }
}

impl<B: ReinAutodiffBackend> Stage<'_, B> {
    /// The first completion of each of the step's first [`SAMPLES_LOGGED`] groups, with its
    /// prompt and reward (what `rein watch` shows of a step).
    fn samples(&self, batch: &[sample::Scored]) -> serde_json::Value {
        let samples: Vec<serde_json::Value> = (batch.iter().take(SAMPLES_LOGGED))
            .filter_map(|group| {
                let prompt = &self.ctx.prompts.get(group.prompt)?.text;
                Some(json!({
                    "prompt": prompt,
                    "completion": group.rollouts.first()?.text,
                    "reward": group.rewards.first()?,
                }))
            })
            .collect();
        json!(samples)
    }

    /// The rollout source of single-turn GRPO.
    fn source(&mut self) -> &mut RolloutSource<B::InnerBackend> {
        (self.source.as_mut()).expect("single-turn GRPO has a rollout source")
    }

    /// Hands the generator the policy after step `step` when it will sample again from it
    /// (every `sampler.sync_every` steps, and never after the last).
    fn publish(&mut self, step: usize, phases: &Phases) -> Result<(), LmError> {
        let Some(source) = self.source.as_mut() else {
            return Ok(());
        };
        if step >= self.ctx.rollout.steps || !step.is_multiple_of(self.ctx.sampler.sync_every) {
            return Ok(());
        }
        let _sync = phases.enter(
            "sync",
            format!("handing policy version {step} to {}", source.describe()),
        );
        (source.publish(&self.model.valid(), step as u64)).map_err(|error| LmError::generator(step, error))
    }
}

impl<B: ReinAutodiffBackend> Trainer for OnlineTrainer<'_, B> {
    type Error = LmError;

    fn total_steps(&self) -> usize {
        self.stage.ctx.rollout.steps
    }

    fn step(&mut self, step: usize, phases: &Phases) -> Result<Step, LmError> {
        let stage = &mut self.stage;
        let started = phases.elapsed();
        let sampled = stage.sample(step, phases, self.update.grpo())?;
        let mut record = match sampled.batch.is_empty() {
            true => {
                eprintln!("step {step}: every group was skipped; nothing to learn from");
                Record::new()
            }
            false => match &mut self.update {
                Update::Grpo(grpo) => stage.learn(grpo, step, &sampled.batch, phases)?,
                Update::OnlineDpo(config) => stage.learn_preferences(step, &sampled.batch, config, phases)?,
                Update::Ppo(learner) => stage.learn_ppo(learner, step, &sampled.batch, phases)?,
            },
        };
        // The policy after step k is version k (a step without groups leaves it unchanged).
        stage.state.version = step as u64;
        stage.publish(step, phases)?;
        let seconds = (phases.elapsed() - started).as_secs_f64();
        record.insert("step".into(), json!(step));
        record.insert(
            "train/zero_variance_frac".into(),
            json!(sampled.degenerate as f64 / sampled.groups.max(1) as f64),
        );
        record.insert("train/resampled_groups".into(), json!(sampled.resampled));
        if stage.tree.is_some() {
            record.insert(
                "rollout/fallback_branch_points".into(),
                json!(sampled.fallback_branch_points),
            );
        }
        if let (Some(c), Some(pools)) = (stage.ctx.curriculum, &stage.state.pools) {
            for (pool, size) in ["easy", "normal", "hard"].into_iter().zip(pools.sizes(c)) {
                record.insert(format!("train/curriculum/{pool}_prompts"), json!(size));
            }
        }
        if let (Some(c), Some(sources)) = (stage.ctx.curriculum, &stage.state.sources) {
            let (weights, learnability) = (sources.weights(c), sources.learnability());
            for (j, name) in sources.names().iter().enumerate() {
                let name = crate::source_label(name);
                record.insert(format!("train/curriculum/{name}/weight"), json!(weights[j]));
                record.insert(format!("train/curriculum/{name}/abs_advantage"), json!(learnability[j]));
            }
        }
        record.insert("train/reward_failures".into(), json!(sampled.failures));
        record.insert("train/sampled_tokens".into(), json!(sampled.tokens));
        record.insert(
            "train/tokens_per_s".into(),
            json!(sampled.tokens as f64 / seconds.max(1e-9)),
        );
        for (name, value) in sample::component_means(&sampled.batch) {
            record.insert(format!("train/reward/{name}"), json!(value));
        }
        for (name, usage) in &sampled.judges {
            record.insert(format!("train/reward/{name}/judge_calls"), json!(usage.calls));
            record.insert(format!("train/reward/{name}/judge_tokens"), json!(usage.tokens));
            record.insert(format!("train/reward/{name}/judge_ms"), json!(usage.ms));
            record.insert(format!("train/reward/{name}/judge_failures"), json!(usage.failures));
        }
        if let Some(stats) = &sampled.episodes {
            stats.record(&mut record);
        }
        record.insert("samples".into(), stage.samples(&sampled.batch));
        let reward = match sampled.batch.is_empty() {
            true => f64::NAN,
            false => stage.state.rewards.last().copied().unwrap_or(f64::NAN),
        };
        let name = self.update.name();
        let progress = format!(
            "{name} step {step}/{} | reward {reward:.3} | {seconds:.2} s/step",
            stage.ctx.rollout.steps
        );
        Ok(Step {
            record,
            done: false,
            progress,
        })
    }

    fn snapshot(&self) -> Snapshot {
        let stage = &self.stage;
        let (model, optim, state) = (stage.model.clone(), stage.optim.clone(), stage.state.clone());
        let critic = match &self.update {
            Update::Ppo(learner) => Some((learner.critic.clone(), learner.optim.clone())),
            _ => None,
        };
        let implicit_prm = (stage.implicit_prm.as_ref()).map(|prm| (prm.model.clone(), prm.optim.clone()));
        Box::new(move || {
            let mut sections = learner_sections::<B, CausalLm<B>, _, _>(&state, &model, &optim);
            if let Some((critic, optim)) = &critic {
                sections.extend(module_sections::<B, _, _>(CRITIC_SECTIONS, critic, optim));
            }
            if let Some((prm, optim)) = &implicit_prm {
                sections.extend(module_sections::<B, _, _>(IMPLICIT_PRM_SECTIONS, prm, optim));
            }
            sections
        })
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), LmError> {
        let stage = &mut self.stage;
        // The KL reference stays the model the stage started from, as in the first run.
        (stage.state, stage.model, stage.optim) =
            checkpoint.load_learner(stage.model.clone(), stage.optim.clone(), &stage.device)?;
        if let Update::Ppo(learner) = &mut self.update {
            (learner.critic, learner.optim) = checkpoint.load_module_sections(
                CRITIC_SECTIONS,
                learner.critic.clone(),
                learner.optim.clone(),
                &stage.device,
            )?;
        }
        // The implicit PRM's reference stays the model it started from, as in the first run.
        if let Some(prm) = &mut stage.implicit_prm {
            (prm.model, prm.optim) = checkpoint.load_module_sections(
                IMPLICIT_PRM_SECTIONS,
                prm.model.clone(),
                prm.optim.clone(),
                &stage.device,
            )?;
        }
        // A checkpoint without pass rates (taken before the recipe had a curriculum, or with
        // other prompts) starts the pools afresh; the sources' bandit likewise.
        let prompts = stage.ctx.prompts.len();
        match stage.ctx.curriculum.map(|c| (c, c.kind)) {
            Some((_, CurriculumKind::Pools)) if stage.state.pools.as_ref().is_none_or(|p| p.len() != prompts) => {
                stage.state.pools = Some(curriculum::DifficultyPools::new(prompts));
            }
            Some((c, CurriculumKind::Ucb)) => {
                let saved = stage.state.sources.take();
                let bandit = curriculum::SourceBandit::resumed(saved, stage.ctx.prompts, c);
                stage.state.sources = Some(bandit.map_err(curriculum_error)?);
            }
            _ => {}
        }
        // Older checkpoints have no version: one update per step.
        stage.state.version = stage.state.version.max(stage.state.rewards.len() as u64);
        let version = stage.state.version;
        stage.submitted = version as usize;
        if let Some(source) = stage.source.as_mut() {
            let error = |error| LmError::generator(version as usize, error);
            source.publish(&stage.model.valid(), version).map_err(error)?;
        }
        Ok(())
    }

    fn non_finite_parameter(&self) -> Option<String> {
        rein_optim::non_finite_parameter(&self.stage.model)
    }

    fn plugin_failures(&self) -> Vec<(String, FailureCounts)> {
        let mut out: Vec<(String, FailureCounts)> = Vec::new();
        for weighted in self.stage.ctx.rewards.iter() {
            let name = weighted.reward.name().to_string();
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, counts)) => *counts = counts.plus(weighted.reward.failures()),
                None => out.push((name, weighted.reward.failures())),
            }
        }
        out
    }
}

/// A curriculum the training prompts cannot feed, naming the recipe key.
fn curriculum_error((key, message): (&'static str, String)) -> LmError {
    LmError::Unsupported(format!("{key}: {message}"))
}

/// AdamW with `[optimizer]`'s settings (the policy's, and PPO's value model's).
fn adamw(optimizer: &OptimizerSection) -> AdamWConfig {
    AdamWConfig::new()
        .with_beta_1(optimizer.beta1)
        .with_beta_2(optimizer.beta2)
        .with_epsilon(optimizer.eps)
        .with_weight_decay(optimizer.weight_decay)
}

/// The learning rate over `steps` steps from `start`: annealed linearly to 0 with
/// `optimizer.anneal_lr`, else constant.
fn lr_schedule(optimizer: &OptimizerSection, start: f64, steps: usize) -> LinearSchedule {
    match optimizer.anneal_lr {
        Some(true) => LinearSchedule {
            start,
            end: 0.0,
            updates: steps,
        },
        _ => LinearSchedule::constant(start),
    }
}

/// Completions per step kept in the metrics record (`samples`).
const SAMPLES_LOGGED: usize = 3;

/// The checkpoint sections of PPO's critic and its optimiser.
const CRITIC_SECTIONS: [&str; 2] = ["critic", "critic_optimizer"];

/// The checkpoint sections of the implicit PRM and its optimiser.
const IMPLICIT_PRM_SECTIONS: [&str; 2] = ["implicit_prm", "implicit_prm_optimizer"];

/// The mean of `values` (0 when empty).
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// A tiny random Qwen2-shaped policy (one layer, a vocabulary of 16) for the online stage's unit
/// tests.
#[cfg(test)]
pub(crate) fn tiny_policy() -> CausalLm<burn::backend::Autodiff<burn::backend::Flex>> {
    let config = rein_model::lm::LmConfig::from_json(serde_json::json!({
        "model_type": "qwen2", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16
    }))
    .unwrap();
    let init = rein_model::lm::LmInit { config, std: 0.1 };
    init.init(&mut SeededRng::new(1), &Default::default())
}
