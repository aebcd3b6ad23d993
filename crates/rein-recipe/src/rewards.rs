//! A recipe's `[[reward]]` entries: each a sandboxed plugin, a reward model (a classifier or a
//! process reward model) or a signal the host computes from the sampler, with only the keys its
//! kind reads.

use crate::{LoadedRecipe, RecipeError, RewardEntry, RewardModelKind};

impl LoadedRecipe {
    /// `reward[i]`: a plugin, a model or a signal, and only the keys that kind uses.
    pub(crate) fn validate_reward(&self, i: usize, entry: &RewardEntry) -> Result<(), RecipeError> {
        let key = |k: &str| format!("reward[{i}].{k}");
        let not_http = |url: &str| !(url.starts_with("http://") || url.starts_with("https://"));
        if entry.signal.is_some() {
            return self.validate_signal(i, entry);
        }
        match (&entry.plugin, &entry.model) {
            (Some(_), Some(_)) => {
                return Err(self.invalid(&key("model"), "set either `plugin` or `model`, not both"));
            }
            (None, None) => {
                return Err(self.invalid(
                    &format!("reward[{i}]"),
                    "set `plugin` (a sandboxed reward), `model` (a reward model) or `signal` (the sampler's own \
                     certainty)",
                ));
            }
            (Some(_), None) => {
                if let Some(judge) = &entry.judge {
                    if let Some(url) = &judge.url
                        && not_http(url)
                    {
                        return Err(self.invalid(&key("judge.url"), format!("`{url}` is not an http(s) URL")));
                    }
                    judge
                        .limits
                        .validate()
                        .map_err(|e| self.invalid(&key(&format!("judge.{}", e.key)), e.reason))?;
                }
                if entry.label.is_some() {
                    return Err(self.invalid(
                        &key("label"),
                        "`label` chooses a reward model's output; this reward is a plugin",
                    ));
                }
                if entry.kind != RewardModelKind::Classifier || entry.prm.is_some() {
                    let which = if entry.prm.is_some() { "prm" } else { "kind" };
                    return Err(self.invalid(&key(which), "says what a reward model is; this reward is a plugin"));
                }
                if entry.url.is_some() || entry.served_model.is_some() {
                    return Err(self.invalid(
                        &key(if entry.url.is_some() { "url" } else { "served_model" }),
                        "a server scores reward models; this reward is a plugin (a plugin's judge takes `judge.url`)",
                    ));
                }
            }
            (None, Some(_)) => {
                match (entry.kind, &entry.prm) {
                    (RewardModelKind::Classifier, Some(_)) => {
                        return Err(self.invalid(&key("prm"), "only a `kind = \"prm\"` reward model reads it"));
                    }
                    (RewardModelKind::Prm, Some(prm)) if prm.separator.is_empty() || prm.tag.is_empty() => {
                        let which = if prm.separator.is_empty() { "separator" } else { "tag" };
                        return Err(self.invalid(&key(&format!("prm.{which}")), "must not be empty"));
                    }
                    (RewardModelKind::Prm, _) if entry.label.is_some() => {
                        return Err(self.invalid(
                            &key("label"),
                            "a process reward model reads its positive label (a token classifier's label 1, or a \
                             causal LM's `prm.good` token against `prm.bad`)",
                        ));
                    }
                    _ => {}
                }
                if !entry.config.is_empty() {
                    return Err(self.invalid(&key("config"), "`config` is passed to plugins; this reward is a model"));
                }
                if entry.isolate {
                    return Err(self.invalid(&key("isolate"), "`isolate` retries plugins; this reward is a model"));
                }
                if entry.judge.is_some() {
                    return Err(self.invalid(&key("judge"), "a judge is granted to plugins; this reward is a model"));
                }
                if entry.batch_size == 0 {
                    return Err(self.invalid(&key("batch_size"), "must be at least 1"));
                }
                match &entry.url {
                    Some(url) if not_http(url) => {
                        return Err(self.invalid(&key("url"), format!("`{url}` is not an http(s) URL")));
                    }
                    None if entry.served_model.is_some() => {
                        return Err(self.invalid(&key("served_model"), "names the model on a server: set `url` too"));
                    }
                    _ => {}
                }
            }
        }
        entry
            .limits
            .validate()
            .map_err(|e| self.invalid(&key(&format!("limits.{}", e.key)), e.reason))
    }

    /// `reward[i]` with a `signal`: computed by the host from the native sampler's statistics of
    /// each single-turn completion, so no plugin or model keys, no server and no episodes.
    fn validate_signal(&self, i: usize, entry: &RewardEntry) -> Result<(), RecipeError> {
        let key = |k: &str| format!("reward[{i}].{k}");
        let others = [
            ("plugin", entry.plugin.is_some()),
            ("model", entry.model.is_some()),
            ("config", !entry.config.is_empty()),
            ("judge", entry.judge.is_some()),
            ("label", entry.label.is_some()),
            ("kind", entry.kind != RewardModelKind::Classifier),
            ("prm", entry.prm.is_some()),
            ("url", entry.url.is_some()),
            ("served_model", entry.served_model.is_some()),
            ("isolate", entry.isolate),
            ("strip_thinking", entry.strip_thinking),
            ("limits", entry.limits != rein_core::SandboxLimits::default()),
        ];
        if let Some((name, _)) = others.iter().find(|(_, set)| *set) {
            return Err(self.invalid(
                &key(name),
                "this reward is a `signal`, computed by the host from the sampler: set `signal` alone \
                 (with `name` and `weight`)",
            ));
        }
        if self.recipe.sampler.backend != rein_core::SamplerBackend::Native {
            return Err(self.invalid(
                &key("signal"),
                "the sampler's certainty comes from rein's own sampler; sampler.backend = \"http\" sends \
                 generation to servers, which do not report it",
            ));
        }
        if self.recipe.agent.is_some() {
            return Err(self.invalid(
                &key("signal"),
                "signals score single-turn completions; an [agent] recipe's episodes have none",
            ));
        }
        if self.plan()?.rollout().is_none() {
            return Err(self.invalid(
                &key("signal"),
                "signals score the completions an online algorithm samples (grpo, ppo, online-dpo); this \
                 algorithm samples none to train on",
            ));
        }
        let signal = entry.signal.expect("a signal reward");
        let name = entry.name.as_deref().unwrap_or(signal.name());
        if self.recipe.eval.accuracy_reward.as_deref() == Some(name) {
            return Err(self.invalid(
                "eval.accuracy_reward",
                format!("`{name}` is the sampler's certainty, not a judge of correct answers"),
            ));
        }
        Ok(())
    }
}
