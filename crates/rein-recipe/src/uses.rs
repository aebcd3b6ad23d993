//! Which recipe keys each algorithm reads. A key that a recipe sets and its algorithm does not
//! read is an error, so nothing is silently ignored; `recipe show` prints only the keys in use.

use toml::Table;

use crate::keys::Keys;
use crate::{Algorithm, CurriculumKind, RolloutKind};

/// Top-level keys every algorithm reads.
const ALWAYS: &[&str] = &["name", "seed", "device", "algorithm"];

/// The sections `algorithm` reads besides [`ALWAYS`], and which of their keys: each
/// algorithm's file lists its own.
fn sections(algorithm: &Algorithm) -> &'static [(&'static str, Keys)] {
    match algorithm {
        Algorithm::Ppo(_) => crate::ppo::READS,
        Algorithm::Sac(_) | Algorithm::Td3(_) => crate::off_policy::READS,
        Algorithm::Grpo(_) => crate::grpo::READS,
        Algorithm::Sft(_) => crate::sft::READS,
        Algorithm::Dpo(_) => crate::dpo::READS,
        Algorithm::Kto(_) => crate::kto::READS,
        Algorithm::OnlineDpo(_) => crate::online_dpo::READS,
        Algorithm::LmPpo(_) => crate::lm_ppo::READS,
        Algorithm::RewardModel(_) => crate::reward_model::READS,
        Algorithm::Prm(_) => crate::process_reward_model::READS,
    }
}

/// The algorithm's name as a reader knows it.
pub(crate) fn algorithm_name(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Ppo(_) => "PPO",
        Algorithm::Grpo(_) => "GRPO",
        Algorithm::Sft(_) => "SFT",
        Algorithm::Dpo(_) => "DPO",
        Algorithm::Kto(_) => "KTO",
        Algorithm::RewardModel(_) => "reward-model training",
        Algorithm::Prm(_) => "process-reward-model training",
        Algorithm::OnlineDpo(_) => "online DPO",
        Algorithm::LmPpo(_) => "PPO on a language model",
        Algorithm::Sac(_) => "SAC",
        Algorithm::Td3(_) => "TD3",
    }
}

/// Whether `algorithm` reads the top-level `section` and, when given, its `key`.
fn reads(algorithm: &Algorithm, section: &str, key: Option<&str>) -> bool {
    if ALWAYS.contains(&section) {
        return true;
    }
    match sections(algorithm).iter().find(|(name, _)| *name == section) {
        None => false,
        Some((_, Keys::All)) => true,
        Some((_, Keys::Only(keys))) => key.is_none_or(|key| keys.contains(&key)),
    }
}

/// The first key of `table` that `algorithm` does not read, with what it reads instead.
pub(crate) fn first_unused(table: &Table, algorithm: &Algorithm) -> Option<(String, String)> {
    let sections = sections(algorithm);
    let name = algorithm_name(algorithm);
    for (section, value) in table {
        let inner = value.as_table();
        if !reads(algorithm, section, None) {
            let known: Vec<String> = ALWAYS[3..]
                .iter()
                .chain(sections.iter().map(|(s, _)| s))
                .map(|s| format!("[{s}]"))
                .collect();
            // Name the first key set in it: that is where its origin is recorded.
            let first = inner.and_then(|t| t.keys().next());
            return Some((
                first.map_or(section.clone(), |key| format!("{section}.{key}")),
                format!("{name} does not use [{section}]; it reads {}", known.join(", ")),
            ));
        }
        let unused = inner.and_then(|t| t.keys().find(|key| !reads(algorithm, section, Some(key.as_str()))));
        if let (Some(key), Some((_, Keys::Only(keys)))) =
            (unused, sections.iter().find(|(s, _)| *s == section.as_str()))
        {
            return Some((
                format!("{section}.{key}"),
                format!(
                    "{name} does not use this key; of [{section}] it reads {}",
                    keys.join(", ")
                ),
            ));
        }
        if let Some(table) = inner
            && let Some((kind, keys)) = kinded(section, table)
            && let Some(key) = table.keys().find(|key| !keys.contains(&key.as_str()))
        {
            let reads = match keys.len() {
                1 => "only `kind`".to_string(),
                _ => keys[1..].join(", "),
            };
            return Some((
                format!("{section}.{key}"),
                format!("not a key of kind = \"{kind}\"; it reads {reads}"),
            ));
        }
    }
    None
}

/// A section whose `kind` decides its keys (`[curriculum]`, `[rollout]`): the kind `table`
/// names and the keys that kind reads (`kind` first).
fn kinded(section: &str, table: &Table) -> Option<(&'static str, &'static [&'static str])> {
    match section {
        "curriculum" => {
            let kind = CurriculumKind::of(table);
            Some((kind.name(), kind.keys()))
        }
        "rollout" => {
            let kind = RolloutKind::of(table);
            Some((kind.name(), kind.keys()))
        }
        _ => None,
    }
}

/// Removes from `table` every key `algorithm` does not read.
pub(crate) fn keep_used(table: &mut Table, algorithm: &Algorithm) {
    table.retain(|section, value| {
        if let Some(inner) = value.as_table_mut() {
            let keys = kinded(section, inner).map(|(_, keys)| keys);
            inner.retain(|key, _| reads(algorithm, section, Some(key)) && keys.is_none_or(|keys| keys.contains(&key)));
        }
        reads(algorithm, section, None)
    });
}
