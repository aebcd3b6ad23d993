//! SAMPLE and SCORE: a step's groups of completions (or multi-turn episodes), from the rollout
//! source or played in process, scored by the reward plugins; with dynamic sampling (DAPO),
//! groups without reward variance are replaced by new prompts.

use std::collections::BTreeMap;

use burn::module::AutodiffModule;
use rein_core::{Group, StepScore, Token, ToolErrorKind};
use rein_model::ReinAutodiffBackend;
use rein_model::lm::LmTokenizer;
use rein_sampler::{FinishReason, GenerationConfig};
use serde_json::json;

use super::{Stage, curriculum};
use crate::LmError;
use crate::rewards::signal::add_signal_rewards;
use crate::rewards::steps::token_char_ends;
use crate::rewards::{GroupReward, score_groups};
use crate::rollout::episode_tree::grow_episodes;
use crate::rollout::episodes::{Episode, TurnRecord, play};
use crate::rollout::source::Job;
use crate::seeds::generation_seed;
use crate::{Prompt, completion_text};
use rein_run::driver::Record;
use rein_run::watchdog::Phases;

/// One sampled completion, or one multi-turn episode: its opening, then everything after it.
pub(super) struct Rollout {
    pub(super) opening: Vec<u32>,
    pub(super) tokens: Vec<u32>,
    pub(super) logprobs: Vec<f32>,
    /// Which of `tokens` the model sampled (`None`: all of them).
    pub(super) trained: Option<Vec<bool>>,
    pub(super) truncated: bool,
    /// What reward plugins score.
    pub(super) text: String,
    /// The text environment's reward and components.
    pub(super) env_reward: Option<(f64, BTreeMap<String, f64>)>,
    /// The model's turns (`end` counted from the start of `tokens`); empty for single-turn.
    pub(super) turns: Vec<TurnRecord>,
    /// The version of the policy that sampled it.
    pub(super) version: u64,
    /// A mixture of experts' routing while sampling (see [`rein_sampler::Generation::routes`]),
    /// for the trainer to replay.
    pub(super) routes: Option<Vec<Vec<u32>>>,
    /// How sure the policy was at each sampled token, when a signal reward asks (see
    /// [`rein_sampler::Generation::certainty`]); empty otherwise.
    pub(super) certainty: Vec<rein_sampler::TokenCertainty>,
    /// Where each token's text ends in `text`, in characters ([`token_char_ends`]): decoded the
    /// first time a reward's token inputs or the process advantage need it, then kept.
    pub(super) char_ends: std::sync::OnceLock<Vec<usize>>,
    /// The images its tokens show, for a vision-language model (the opening's, then those the
    /// tools and the environment added); empty otherwise.
    pub(super) images: crate::PromptPixels,
    /// In a tree rollout, the completion of its group it branched from (`None`: a trunk, or a
    /// group sampled on its own).
    pub(super) branch: Option<rein_optim::Branch>,
}

/// One sampled, scored group.
pub(super) struct Scored {
    /// The prompt's index in the training prompts.
    pub(super) prompt: usize,
    pub(super) rollouts: Vec<Rollout>,
    pub(super) rewards: Vec<f64>,
    pub(super) components: BTreeMap<String, Vec<f64>>,
    /// Per rollout, the rewards' step scores, weighted (see [`GroupReward::steps`]).
    pub(super) steps: Vec<Vec<StepScore>>,
}

/// What multi-turn episodes did in a step.
#[derive(Default)]
pub(super) struct EpisodeStats {
    pub(super) episodes: usize,
    pub(super) turns: usize,
    pub(super) tool_calls: usize,
    pub(super) tool_errors: BTreeMap<&'static str, usize>,
    pub(super) env_token_share: f64,
    pub(super) truncated: usize,
}

impl EpisodeStats {
    fn add(&mut self, episode: &Episode) {
        self.episodes += 1;
        self.turns += episode.turns;
        self.tool_calls += episode.tool_calls;
        for (kind, count) in &episode.tool_errors {
            *self.tool_errors.entry(kind).or_default() += count;
        }
        self.env_token_share += episode.transcript.env_token_share();
        self.truncated += usize::from(episode.truncated);
    }

    /// The step's `episode/…` metrics.
    pub(super) fn record(&self, record: &mut Record) {
        let per = |x: f64| x / self.episodes.max(1) as f64;
        record.insert("episode/turns".into(), json!(per(self.turns as f64)));
        record.insert("episode/tool_calls".into(), json!(per(self.tool_calls as f64)));
        record.insert("episode/env_token_share".into(), json!(per(self.env_token_share)));
        record.insert("episode/truncated_frac".into(), json!(per(self.truncated as f64)));
        for kind in ToolErrorKind::ALL {
            let count = self.tool_errors.get(kind.as_str()).copied().unwrap_or(0);
            record.insert(format!("episode/tool_errors/{}", kind.as_str()), json!(count));
        }
    }
}

/// A step's groups and what sampling them took.
#[derive(Default)]
pub(super) struct Sampled {
    pub(super) batch: Vec<Scored>,
    /// Groups whose rewards were all equal (no signal).
    pub(super) degenerate: usize,
    /// Groups sampled, resampled ones included.
    pub(super) groups: usize,
    /// Groups without signal that dynamic sampling dropped and replaced.
    pub(super) resampled: usize,
    /// Tokens the model sampled.
    pub(super) tokens: usize,
    /// Reward failures absorbed by `on_error`.
    pub(super) failures: usize,
    /// What each reward's judge did, by reward name.
    pub(super) judges: std::collections::BTreeMap<String, rein_core::JudgeUsage>,
    /// Multi-turn episodes' figures.
    pub(super) episodes: Option<EpisodeStats>,
    /// Tree rollouts: branch points the rule could not find, taken elsewhere.
    pub(super) fallback_branch_points: usize,
}

impl<B: ReinAutodiffBackend> Stage<'_, B> {
    /// SAMPLE and SCORE: `prompts_per_step` groups of `n` completions, scored; with dynamic
    /// sampling, groups without reward variance are replaced by new prompts (at most
    /// `max_resample` more rounds).
    pub(super) fn sample(
        &mut self,
        step: usize,
        phases: &Phases,
        grpo: Option<&rein_recipe::GrpoSection>,
    ) -> Result<Sampled, LmError> {
        let rollout = self.ctx.rollout;
        // DAPO's dynamic sampling: up to this many extra rounds for groups without signal.
        let resample = grpo.filter(|g| g.dynamic_sampling).map(|g| g.max_resample);
        let mut out = Sampled::default();
        for round in 0..=resample.unwrap_or(0) {
            let want = rollout.prompts_per_step - out.batch.len();
            if want == 0 {
                break;
            }
            let (picked, rollouts) = match self.ctx.agent.is_some() {
                true => self.play_episodes(step, round, want, &mut out, phases)?,
                false => self.take_completions(step, round, want, &mut out.fallback_branch_points, phases)?,
            };
            out.tokens += rollouts.iter().map(Rollout::sampled).sum::<usize>();
            let scores = self.score(step, &picked, &rollouts, &mut out.failures, phases)?;
            self.observe_difficulty(&picked, &scores, grpo);
            for weighted in self.ctx.rewards.iter_mut() {
                if let Some(usage) = weighted.reward.take_judge_usage() {
                    let total = out.judges.entry(weighted.reward.name().to_string()).or_default();
                    *total = total.plus(usage);
                }
            }
            keep_groups(round, &picked, scores, rollouts, resample, self.ctx.sampler.n, &mut out);
        }
        Ok(out)
    }

    /// Curriculum: with pools, each scored group's accuracy joins its prompt's pass rate
    /// (groups dynamic sampling drops too: they say the most about a prompt's difficulty).
    /// With sources, each group's absolute advantages (as `grpo` computes them: a curriculum is
    /// the GRPO family's) join its source's window.
    fn observe_difficulty(
        &mut self,
        picked: &[usize],
        scores: &[GroupReward],
        grpo: Option<&rein_recipe::GrpoSection>,
    ) {
        let Some(c) = self.ctx.curriculum else {
            return;
        };
        let scored = picked.iter().zip(scores).filter(|(_, s)| !s.skipped);
        if let Some(pools) = self.state.pools.as_mut() {
            let reward = self.ctx.rewards[self.ctx.accuracy_reward].reward.name();
            for (&prompt, scored) in scored.clone() {
                let accuracy = curriculum::group_accuracy(&scored.components, scored.total.len(), reward);
                pools.observe(prompt, accuracy, c);
            }
        }
        if let (Some(sources), Some(grpo)) = (self.state.sources.as_mut(), grpo) {
            for (&prompt, scored) in scored {
                let rewards: Vec<f32> = scored.total.iter().map(|&r| r as f32).collect();
                let advantages = curriculum::group_advantages(&rewards, grpo);
                sources.observe(prompt, &advantages, c);
            }
        }
    }

    /// The sampler's settings for round `round` of step `step`.
    fn generation_config(&self, step: usize, round: usize) -> GenerationConfig {
        let sampler = self.ctx.sampler;
        GenerationConfig {
            max_new_tokens: sampler.max_new_tokens,
            temperature: sampler.temperature,
            top_k: sampler.top_k,
            top_p: sampler.top_p,
            min_p: sampler.min_p,
            n: sampler.n,
            stop_token_ids: self.ctx.tokenizer.eos_ids().to_vec(),
            seed: generation_seed(self.ctx.seed, step, round),
            top_logprobs: 0,
            precision: sampler.precision,
            certainty: !self.ctx.signals.is_empty(),
        }
    }

    /// Multi-turn: `want` new prompts' episodes, played in process by the current policy; a
    /// tree rollout's grown by branching after tool calls.
    fn play_episodes(
        &mut self,
        step: usize,
        round: usize,
        want: usize,
        out: &mut Sampled,
        phases: &Phases,
    ) -> Result<(Vec<usize>, Vec<Rollout>), LmError> {
        let (prompts, tokenizer, g) = (self.ctx.prompts, self.ctx.tokenizer, self.ctx.sampler.n);
        let picked: Vec<usize> = (0..want).map(|_| self.state.next_prompt(self.ctx.curriculum)).collect();
        let _generating = phases.enter("generate", format!("sampling {} episodes", want * g));
        let chosen: Vec<&Prompt> = picked.iter().map(|&i| &prompts[i]).collect();
        let first_id = self.state.episodes;
        let policy = self.model.valid();
        let config = self.generation_config(step, round);
        let agent = (self.ctx.agent.as_deref_mut()).expect("multi-turn GRPO has an agent");
        let (episodes, branches) = match &self.tree {
            Some(tree) => {
                let device = &self.device;
                let grown = grow_episodes(
                    &policy,
                    tokenizer,
                    agent,
                    &chosen,
                    &config,
                    first_id,
                    device,
                    &tree.rollout,
                )?;
                out.fallback_branch_points += grown.fallback_branch_points;
                (grown.leaves, grown.branches)
            }
            None => {
                let episodes = play(&policy, tokenizer, agent, &chosen, &config, first_id, &self.device)?;
                let branches = vec![None; episodes.len()];
                (episodes, branches)
            }
        };
        self.state.episodes += episodes.len() as u64;
        let stats = out.episodes.get_or_insert_with(EpisodeStats::default);
        episodes.iter().for_each(|e| stats.add(e));
        let version = self.state.version;
        let rollouts = (episodes.into_iter().zip(branches))
            .map(|(e, branch)| Rollout {
                version,
                branch,
                ..Rollout::from(e)
            })
            .collect();
        Ok((picked, rollouts))
    }

    /// Single-turn: submits the prompts of this step (round 0: of every step up to
    /// `max_staleness` ahead; dynamic sampling's extra rounds, synchronous runs only, right
    /// away) and takes this step's completions from the rollout source.
    fn take_completions(
        &mut self,
        step: usize,
        round: usize,
        want: usize,
        fallback_branch_points: &mut usize,
        phases: &Phases,
    ) -> Result<(Vec<usize>, Vec<Rollout>), LmError> {
        let (rollout, sampler, prompts) = (self.ctx.rollout, self.ctx.sampler, self.ctx.prompts);
        let staleness = self.source.as_ref().map_or(0, |source| source.max_staleness());
        let (first, last) = match round {
            0 => (self.submitted + 1, (step + staleness).min(rollout.steps)),
            _ => (step, step),
        };
        for ahead in first..=last {
            let count = if round == 0 { rollout.prompts_per_step } else { want };
            let picked: Vec<usize> = (0..count)
                .map(|_| self.state.next_prompt(self.ctx.curriculum))
                .collect();
            let job = Job {
                step: ahead,
                prompts: picked.iter().map(|&i| prompts[i].tokens.clone()).collect(),
                images: picked.iter().map(|&i| prompts[i].images.clone()).collect(),
                config: self.generation_config(ahead, round),
                stops: sampler.stop.clone(),
                tree: self.tree.clone(),
            };
            self.source().submit(job);
            self.in_flight.push_back(picked);
            if round == 0 {
                self.submitted = ahead;
            }
        }
        let waiting = format!(
            "waiting for {} completions of step {step} from {}",
            want * sampler.n,
            self.source().describe()
        );
        let _generating = phases.enter("generate", waiting);
        let produced = self.source().take().map_err(|error| LmError::generator(step, error))?;
        debug_assert_eq!(produced.step, step, "completions come back in step order");
        let picked = self.in_flight.pop_front().unwrap_or_default();
        *fallback_branch_points += produced.fallback_branch_points;
        let mut branches = produced.branches.into_iter();
        let rollouts = (produced.generations.into_iter())
            .map(|x| Rollout {
                branch: branches.next().flatten(),
                opening: prompts[picked[x.prompt]].tokens.clone(),
                text: completion_text(self.ctx.tokenizer, &x.tokens, &sampler.stop),
                truncated: x.finish == FinishReason::Length,
                tokens: x.tokens,
                logprobs: x.logprobs,
                trained: None,
                env_reward: None,
                turns: Vec::new(),
                version: produced.version,
                routes: x.routes,
                certainty: x.certainty,
                char_ends: Default::default(),
                images: prompts[picked[x.prompt]].images.clone(),
            })
            .collect();
        Ok((picked, rollouts))
    }

    /// SCORE: the reward plugins on each picked prompt's group (with the text environment's
    /// rewards added); failures the recipe's `on_error` absorbs are reported and counted.
    fn score(
        &mut self,
        step: usize,
        picked: &[usize],
        rollouts: &[Rollout],
        failures: &mut usize,
        phases: &Phases,
    ) -> Result<Vec<GroupReward>, LmError> {
        let (prompts, g, on_error) = (self.ctx.prompts, self.ctx.sampler.n, self.ctx.rollout.on_error);
        let scoring = phases.enter("reward", format!("scoring {} groups", picked.len()));
        let reads_tokens = self.ctx.rewards.iter().any(|r| r.reward.reads_tokens());
        let reads_images = self.ctx.rewards.iter().any(|r| r.reward.reads_images());
        let groups: Vec<Group> = picked
            .iter()
            .zip(rollouts.chunks(g))
            .map(|(&i, group)| Group {
                prompt: prompts[i].text.clone(),
                completions: group.iter().map(|x| x.text.clone()).collect(),
                reference: prompts[i].answer.clone(),
                metadata: with_token_counts(&prompts[i].metadata, group.iter().map(|x| x.tokens.len())),
                tokens: match reads_tokens {
                    true => group.iter().map(|x| x.token_texts(self.ctx.tokenizer)).collect(),
                    false => Vec::new(),
                },
                images: match reads_images {
                    true => prompts[i].image_files.to_vec(),
                    false => Vec::new(),
                },
            })
            .collect();
        let (mut scores, absorbed) =
            score_groups(self.ctx.rewards, &groups, on_error).map_err(|(group, error)| LmError::Reward {
                step,
                prompt: groups[group].prompt.clone(),
                error: Box::new(error),
            })?;
        drop(scoring);
        for failure in &absorbed {
            let prompt = &groups[failure.group].prompt;
            match failure.completion {
                Some(c) => eprintln!(
                    "step {step}: {} (prompt {prompt:?}, completion {c}); scored 0",
                    failure.error
                ),
                None => eprintln!(
                    "step {step}: {} (prompt {prompt:?}); on_error = {on_error:?}",
                    failure.error
                ),
            }
        }
        *failures += absorbed.len();
        add_env_rewards(&mut scores, rollouts, g);
        let certainty = rollouts.iter().map(|x| x.certainty.as_slice());
        add_signal_rewards(&mut scores, certainty, g, self.ctx.signals);
        Ok(scores)
    }
}

/// Keeps each scored group in the batch, except skipped ones and, with dynamic sampling (up to
/// `resample` extra rounds), those without reward variance while resampling rounds remain.
fn keep_groups(
    round: usize,
    prompts: &[usize],
    scores: Vec<GroupReward>,
    rollouts: Vec<Rollout>,
    resample: Option<usize>,
    g: usize,
    out: &mut Sampled,
) {
    let mut rollouts = rollouts.into_iter();
    for (&prompt, scored) in prompts.iter().zip(scores) {
        let group: Vec<Rollout> = rollouts.by_ref().take(g).collect();
        out.groups += 1;
        if scored.skipped {
            continue;
        }
        let totals: Vec<f32> = scored.total.iter().map(|&r| r as f32).collect();
        let is_degenerate = rein_optim::zero_variance(&totals);
        out.degenerate += usize::from(is_degenerate);
        if is_degenerate && resample.is_some_and(|rounds| round < rounds) {
            out.resampled += 1;
            continue;
        }
        out.batch.push(Scored {
            prompt,
            rollouts: group,
            rewards: scored.total,
            components: scored.components,
            steps: scored.steps,
        });
    }
}

impl Rollout {
    /// [`Rollout::char_ends`], decoded on first use.
    pub(super) fn char_ends(&self, tokenizer: &LmTokenizer) -> &[usize] {
        self.char_ends.get_or_init(|| token_char_ends(tokenizer, &self.tokens))
    }

    /// Its tokens as a reward that reads them sees them: the characters of `text` each token
    /// completes ([`token_char_ends`]), the last one also any rest (a character its bytes end
    /// inside, decoded as U+FFFD), so that they add up to `text`; with the sampler's
    /// log-probabilities.
    fn token_texts(&self, tokenizer: &LmTokenizer) -> Vec<Token> {
        let ends = self.char_ends(tokenizer);
        let (mut chars, mut at, last) = (self.text.chars(), 0, ends.len().saturating_sub(1));
        (ends.iter().zip(&self.logprobs).enumerate())
            .map(|(i, (&end, &logprob))| {
                let text: String = match i == last {
                    true => chars.by_ref().collect(),
                    false => chars.by_ref().take(end.saturating_sub(at)).collect(),
                };
                at = at.max(end);
                Token { text, logprob }
            })
            .collect()
    }

    /// Tokens the model sampled (not those a tool or the environment added, nor a tree
    /// branch's copy of its parent's).
    fn sampled(&self) -> usize {
        let own = self.branch.map_or(0, |b| b.at);
        match &self.trained {
            Some(trained) => trained[own..].iter().filter(|&&t| t).count(),
            None => self.tokens.len() - own,
        }
    }
}

impl From<Episode> for Rollout {
    fn from(episode: Episode) -> Self {
        let transcript = &episode.transcript;
        let at = transcript.prompt_len();
        Self {
            opening: transcript.tokens()[..at].to_vec(),
            tokens: transcript.tokens()[at..].to_vec(),
            logprobs: transcript.log_probs()[at..].to_vec(),
            trained: Some(transcript.sampled()[at..].to_vec()),
            truncated: episode.truncated,
            text: episode.text,
            env_reward: episode.env_reward.map(|r| (r, episode.env_components)),
            turns: (episode.turn_log.into_iter())
                .map(|t| TurnRecord { end: t.end - at, ..t })
                .collect(),
            version: 0,
            routes: None,
            certainty: Vec::new(),
            char_ends: Default::default(),
            images: transcript.images().into(),
            branch: None,
        }
    }
}

/// Adds the text environment's rewards to the plugins' (groups of `g` rollouts in order), its
/// components as `env/<name>`.
fn add_env_rewards(scores: &mut [GroupReward], rollouts: &[Rollout], g: usize) {
    for (scored, group) in scores.iter_mut().zip(rollouts.chunks(g)) {
        for (c, rollout) in group.iter().enumerate() {
            let Some((reward, components)) = &rollout.env_reward else {
                continue;
            };
            scored.total[c] += reward;
            for (name, value) in components {
                let values = (scored.components)
                    .entry(format!("env/{name}"))
                    .or_insert_with(|| vec![f64::NAN; group.len()]);
                values[c] = *value;
            }
        }
    }
}

/// Each reward component's mean over the batch's completions (NaN entries, where a reward did
/// not apply, left out); `None` when no completion had one.
pub(super) fn component_means(batch: &[Scored]) -> std::collections::BTreeMap<String, Option<f64>> {
    let mut sums: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    for scored in batch {
        for (name, values) in &scored.components {
            let entry = sums.entry(name.clone()).or_default();
            for v in values.iter().filter(|v| v.is_finite()) {
                entry.0 += v;
                entry.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(name, (sum, count))| (name, (count > 0).then(|| sum / count as f64)))
        .collect()
}

/// Adds `completion_tokens` (each completion's length in tokens) to a group's metadata, for
/// rewards that count tokens (the `length-penalty` plugin's `unit = "tokens"`). The metadata is
/// empty or the compact JSON object the data loader wrote, so the key is spliced in without
/// parsing it again; only a row that already has the key is parsed (its value is replaced).
fn with_token_counts(metadata: &str, lengths: impl Iterator<Item = usize>) -> String {
    let counts = json!(lengths.collect::<Vec<_>>());
    match metadata.strip_suffix('}') {
        _ if metadata.contains("\"completion_tokens\"") => {
            let mut value = match serde_json::from_str::<serde_json::Value>(metadata) {
                Ok(serde_json::Value::Object(map)) => serde_json::Value::Object(map),
                _ => json!({}),
            };
            value["completion_tokens"] = counts;
            value.to_string()
        }
        Some("{") | None => format!("{{\"completion_tokens\":{counts}}}"),
        Some(fields) => format!("{fields},\"completion_tokens\":{counts}}}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_join_the_metadata_as_parsing_would() {
        let parsed = |metadata: &str, counts: &[usize]| {
            let mut value = serde_json::from_str::<serde_json::Value>(metadata).unwrap_or(json!({}));
            value["completion_tokens"] = json!(counts);
            value.to_string()
        };
        for metadata in [
            "",
            "{}",
            r#"{"level":3}"#,
            r#"{"a":"}","b":[1,{"c":null}]}"#,
            r#"{"completion_tokens":1,"z":2}"#,
        ] {
            let spliced = with_token_counts(metadata, [4, 0, 17].into_iter());
            assert_eq!(spliced, parsed(metadata, &[4, 0, 17]), "{metadata}");
        }
    }
}
