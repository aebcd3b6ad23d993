//! What the online algorithms share: their rollouts. GRPO, PPO on a language model and online
//! DPO each give a [`Rollout`] view of their own `[algorithm]` section — how many steps of how
//! many prompts, how far generation may run ahead of training and how its lag is corrected,
//! what a failing reward does — and its rules are checked here once, with where the completions
//! come from (in process or inference servers) and how the policy reaches them.

use crate::error::{Broken, broken};
use crate::keys::{Keys, LM_MODEL, LM_TRAIN};
use crate::schema::Recipe;

/// An online algorithm's rollouts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rollout {
    /// Optimiser steps, each on one batch of groups.
    pub steps: usize,
    /// Prompts per step, each sampled `sampler.n` times.
    pub prompts_per_step: usize,
    /// What a failing reward plugin does.
    pub on_error: rein_core::OnError,
    /// How many policy versions generation may run ahead of training (0: synchronous).
    pub max_staleness: usize,
    /// The loss's correction for the sampler's policy lag and mismatch.
    pub correction: rein_core::LagCorrection,
    /// Where the correction's ratio is taken.
    pub correction_level: rein_core::RatioLevel,
    /// TIS's cap on `π_trainer/π_sampler`.
    pub tis_cap: f32,
    /// IcePop's `[low, high]`.
    pub icepop_bounds: [f32; 2],
    /// Sample each group as a tree (`[rollout] kind = "tree"`), not as independent completions.
    pub tree: Option<crate::RolloutSection>,
}

/// The defaults of the online algorithms' rollout keys, the same for each: 100 steps of 8
/// prompts, synchronous, no correction (TIS's cap 2 and IcePop's bounds `[0.5, 2]` when one
/// is chosen), a failing reward failing the run.
impl Default for Rollout {
    fn default() -> Self {
        Self {
            steps: 100,
            prompts_per_step: 8,
            on_error: rein_core::OnError::Fail,
            max_staleness: 0,
            correction: rein_core::LagCorrection::None,
            correction_level: rein_core::RatioLevel::Token,
            tis_cap: 2.0,
            icepop_bounds: [0.5, 2.0],
            tree: None,
        }
    }
}

impl Rollout {
    /// Rollouts sampled within their step from the policy being trained: no lag, so no
    /// correction (online DPO's).
    pub fn synchronous(steps: usize, prompts_per_step: usize, on_error: rein_core::OnError) -> Self {
        Self {
            steps,
            prompts_per_step,
            on_error,
            ..Self::default()
        }
    }

    /// The sizes, where completions come from and how far generation may run ahead, for
    /// `recipe`.
    pub(crate) fn check(&self, r: &Recipe) -> Result<(), Broken> {
        let sampler = &r.sampler;
        if self.steps == 0 || self.prompts_per_step == 0 {
            return Err(broken(
                "algorithm.prompts_per_step",
                "steps and prompts_per_step must be at least 1",
            ));
        }
        servers(r)?;
        if self.max_staleness > 0 && r.agent.is_some() {
            return Err(broken(
                "algorithm.max_staleness",
                "asynchronous GRPO is single-turn: remove [agent] or set 0",
            ));
        }
        if sampler.sync_every == 0 || sampler.sync_every > self.max_staleness + 1 {
            return Err(broken(
                "sampler.sync_every",
                format!(
                    "must be in 1..={} (max_staleness + 1), or generation would wait for a version never written",
                    self.max_staleness + 1
                ),
            ));
        }
        if sampler.sync == rein_core::PolicySync::Adapter && r.lora.is_none() {
            return Err(broken(
                "sampler.sync",
                "`adapter` syncs the LoRA adapter: the recipe has no [lora]",
            ));
        }
        if !(self.tis_cap >= 1.0 && self.tis_cap.is_finite()) {
            return Err(broken(
                "algorithm.tis_cap",
                format!("must be ≥ 1, got {}", self.tis_cap),
            ));
        }
        let [low, high] = self.icepop_bounds;
        if !(low > 0.0 && low < 1.0 && high > 1.0 && high.is_finite()) {
            return Err(broken(
                "algorithm.icepop_bounds",
                format!("must be [low, high] with 0 < low < 1 < high, got [{low}, {high}]"),
            ));
        }
        Ok(())
    }
}

/// Where completions come from: in process, or inference servers reached over plain HTTP.
fn servers(r: &Recipe) -> Result<(), Broken> {
    let sampler = &r.sampler;
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

/// The sections online DPO and PPO on a language model read: they sample and score as
/// single-turn GRPO does, then learn from pairs or with a critic.
pub(crate) const SINGLE_TURN_READS: &[(&str, Keys)] = &[
    ("data", Keys::All),
    ("model", LM_MODEL),
    ("optimizer", Keys::All),
    ("train", LM_TRAIN),
    ("sft", Keys::All),
    ("sampler", Keys::All),
    ("reward", Keys::All),
    ("eval", Keys::All),
    ("lora", Keys::All),
];
