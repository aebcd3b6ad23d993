//! Which recipe keys each algorithm reads. A key that a recipe sets and its algorithm does not
//! read is an error, so nothing is silently ignored; `recipe show` prints only the keys in use.

use toml::Table;

use crate::Algorithm;

/// The keys of a section an algorithm reads.
#[derive(Clone, Copy)]
enum Keys {
    All,
    Only(&'static [&'static str]),
}

/// Top-level keys every algorithm reads.
const ALWAYS: &[&str] = &["name", "seed", "device", "algorithm"];

const LM_MODEL: Keys = Keys::Only(&["checkpoint", "architecture", "init_std", "tokenizer"]);
const LM_TRAIN: Keys = Keys::Only(&["runs_dir", "checkpoint_every", "stall_timeout_s"]);

/// The sections `algorithm` reads besides [`ALWAYS`], and which of their keys.
fn sections(algorithm: &Algorithm) -> &'static [(&'static str, Keys)] {
    match algorithm {
        Algorithm::Ppo(_) => &[
            ("env", Keys::All),
            ("model", Keys::Only(&["hidden", "activation", "init_log_std"])),
            (
                "optimizer",
                Keys::Only(&["lr", "anneal_lr", "eps", "beta1", "beta2", "max_grad_norm"]),
            ),
            ("train", Keys::All),
        ],
        Algorithm::Grpo(_) => &[
            ("data", Keys::All),
            ("model", LM_MODEL),
            ("optimizer", Keys::All),
            ("train", LM_TRAIN),
            ("sft", Keys::All),
            ("sampler", Keys::All),
            ("reward", Keys::All),
            ("eval", Keys::All),
        ],
        // SFT has its own learning rate, warm-up and clipping in `[algorithm]`; the sampler's
        // length, stop strings and temperature are what held-out evaluation uses.
        Algorithm::Sft(_) => &[
            ("data", Keys::All),
            ("model", LM_MODEL),
            ("train", LM_TRAIN),
            ("sampler", Keys::Only(&["max_new_tokens", "stop", "temperature"])),
            ("reward", Keys::All),
            ("eval", Keys::All),
        ],
    }
}

/// The algorithm's name as a reader knows it.
pub(crate) fn algorithm_name(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Ppo(_) => "PPO",
        Algorithm::Grpo(_) => "GRPO",
        Algorithm::Sft(_) => "SFT",
    }
}

/// The first key of `table` that `algorithm` does not read, with what it reads instead.
pub(crate) fn first_unused(table: &Table, algorithm: &Algorithm) -> Option<(String, String)> {
    let sections = sections(algorithm);
    let name = algorithm_name(algorithm);
    for (key, value) in table {
        if ALWAYS.contains(&key.as_str()) {
            continue;
        }
        match sections.iter().find(|(section, _)| section == key) {
            None => {
                let known: Vec<String> = ALWAYS[3..]
                    .iter()
                    .chain(sections.iter().map(|(s, _)| s))
                    .map(|s| format!("[{s}]"))
                    .collect();
                // Name the first key set in it: that is where its origin is recorded.
                let first = value.as_table().and_then(|t| t.keys().next());
                return Some((
                    first.map_or(key.clone(), |inner| format!("{key}.{inner}")),
                    format!("{name} does not use [{key}]; it reads {}", known.join(", ")),
                ));
            }
            Some((_, Keys::Only(keys))) => {
                let unused = value
                    .as_table()
                    .and_then(|t| t.keys().find(|k| !keys.contains(&k.as_str())));
                if let Some(inner) = unused {
                    return Some((
                        format!("{key}.{inner}"),
                        format!("{name} does not use this key; of [{key}] it reads {}", keys.join(", ")),
                    ));
                }
            }
            Some((_, Keys::All)) => {}
        }
    }
    None
}

/// Removes from `table` every key `algorithm` does not read.
pub(crate) fn keep_used(table: &mut Table, algorithm: &Algorithm) {
    let sections = sections(algorithm);
    table.retain(|key, value| {
        if ALWAYS.contains(&key) {
            return true;
        }
        match sections.iter().find(|(section, _)| *section == key) {
            None => false,
            Some((_, Keys::All)) => true,
            Some((_, Keys::Only(keys))) => {
                if let Some(inner) = value.as_table_mut() {
                    inner.retain(|k, _| keys.contains(&k));
                }
                true
            }
        }
    });
}
