//! A recipe's rewards, built: each `[[reward]]` as a sandboxed plugin (with the judge it is
//! granted: a server, a model, or the policy as it starts), as a reward model or a process
//! reward model; the signals
//! the host computes itself apart.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rein_core::{Judge, RewardFn};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_plugin::{JudgeGrant, PluginRuntime};
use rein_recipe::{JudgeEntry, LoadedRecipe, RewardEntry, RewardModelKind};
use rein_sampler::HttpJudge;

use crate::LmError;
use crate::rewards::signal::SignalReward;
use crate::run::recipe_keys::{invalid, model_path};
use crate::{Renamed, ThinkingStripped, WeightedReward};
use rein_sampler::{ModelReward, NativeJudge, PrmReward};

/// Every `[[reward]]` of the recipe with its weight; `policy` is the judge of grants that name
/// no model.
pub(crate) fn rewards<B: ReinBackend>(
    loaded: &LoadedRecipe,
    runtime: &PluginRuntime,
    plugin_dir: &Path,
    policy: (&CausalLm<B>, &LmTokenizer),
    device: &B::Device,
) -> Result<Vec<WeightedReward>, LmError> {
    (loaded.recipe.reward.iter().enumerate())
        .filter(|(_, entry)| entry.signal.is_none())
        .map(|(i, entry)| {
            let reward = reward::<B>(loaded, i, entry, runtime, plugin_dir, policy, device)?;
            Ok(WeightedReward {
                reward: match entry.strip_thinking {
                    true => Box::new(ThinkingStripped(reward)),
                    false => reward,
                },
                weight: entry.weight,
                isolate: entry.isolate,
            })
        })
        .collect()
}

/// The recipe's `[[reward]] signal = …` entries, which the host computes from the sampler.
pub(crate) fn signals(loaded: &LoadedRecipe) -> Vec<SignalReward> {
    (loaded.recipe.reward.iter())
        .filter_map(|entry| {
            let signal = entry.signal?;
            Some(SignalReward {
                name: entry.name.clone().unwrap_or_else(|| signal.name().to_string()),
                weight: entry.weight,
                signal,
            })
        })
        .collect()
}

/// `reward[i]`: its plugin, loaded into the sandbox (with the judge it is granted), or its
/// reward model, loaded onto `device`. `policy` is the judge when the grant names no model.
fn reward<B: ReinBackend>(
    loaded: &LoadedRecipe,
    i: usize,
    entry: &RewardEntry,
    runtime: &PluginRuntime,
    plugin_dir: &Path,
    policy: (&CausalLm<B>, &LmTokenizer),
    device: &B::Device,
) -> Result<Box<dyn RewardFn>, LmError> {
    if let Some(model) = &entry.model {
        let dir = model_path(loaded, model);
        let name = entry.name.clone().unwrap_or_else(|| {
            let base = dir.file_name().unwrap_or(dir.as_os_str());
            base.to_string_lossy().into_owned()
        });
        let timeout = std::time::Duration::from_secs_f64(loaded.recipe.sampler.request_timeout_s);
        if entry.kind == RewardModelKind::Prm {
            let settings = entry.prm.clone().unwrap_or_default();
            let reward = match &entry.url {
                None => PrmReward::<B>::load(&name, &dir, &settings, device),
                Some(url) => {
                    let served = entry.served_model.as_deref();
                    PrmReward::<B>::served(&name, &dir, &settings, url, served, timeout)
                }
            }
            .map_err(|e| invalid(loaded, &format!("reward[{i}].model"), e.to_string()))?;
            return Ok(Box::new(reward));
        }
        let label = entry.label.as_deref();
        let reward = match &entry.url {
            None => ModelReward::<B>::load(&name, &dir, label, entry.batch_size, device),
            Some(url) => {
                let served = entry.served_model.as_deref();
                ModelReward::<B>::served(&name, &dir, label, entry.batch_size, url, served, timeout)
            }
        }
        .map_err(|e| invalid(loaded, &format!("reward[{i}].model"), e.to_string()))?;
        return Ok(Box::new(reward));
    }
    let plugin = entry.plugin.as_deref().unwrap_or_default();
    let path = loaded.plugin_path(plugin, &format!("reward[{i}].plugin"), plugin_dir)?;
    let config = serde_json::to_string(&entry.config).unwrap_or_else(|_| "{}".into());
    let plugin = runtime.load(&path, entry.limits.clone())?;
    let reward = match &entry.judge {
        None => plugin.reward(&config)?,
        Some(judge) => {
            let grant = JudgeGrant::new(
                judge_model::<B>(loaded, i, judge, policy, device)?,
                judge.limits.clone(),
                loaded.recipe.seed,
            );
            plugin.reward_with_judge(&config, grant)?
        }
    };
    Ok(match &entry.name {
        Some(name) => Box::new(Renamed(name.clone(), reward)),
        None => Box::new(reward),
    })
}

/// The judge `reward[i].judge` names: a server, a model loaded onto `device`, or the policy as
/// it starts.
fn judge_model<B: ReinBackend>(
    loaded: &LoadedRecipe,
    i: usize,
    judge: &JudgeEntry,
    (policy, tokenizer): (&CausalLm<B>, &LmTokenizer),
    device: &B::Device,
) -> Result<Arc<Mutex<dyn Judge>>, LmError> {
    if let Some(url) = &judge.url {
        let model = judge.model.as_deref().unwrap_or("judge");
        let max_prompt_tokens = judge.limits.max_prompt_tokens as usize;
        return Ok(Arc::new(Mutex::new(HttpJudge::new(url, model, max_prompt_tokens))));
    }
    let judge: NativeJudge<B> = match &judge.model {
        None => NativeJudge::new(policy.clone(), tokenizer.clone(), "the policy's starting model", device),
        Some(model) => {
            let dir = model_path(loaded, model);
            let load = || -> Result<_, rein_model::lm::LoadError> {
                let model = rein_model::lm::load::<B>(&dir, device)?;
                let tokenizer = LmTokenizer::load(&rein_model::lm::locate(&dir)?, &[])?;
                Ok((model, tokenizer))
            };
            let (model, tokenizer) =
                load().map_err(|e| invalid(loaded, &format!("reward[{i}].judge.model"), e.to_string()))?;
            NativeJudge::new(model, tokenizer, &dir.display().to_string(), device)
        }
    };
    Ok(Arc::new(Mutex::new(judge)))
}
