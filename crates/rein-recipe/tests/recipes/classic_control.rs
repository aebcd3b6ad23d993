//! PPO, SAC and TD3 recipes: their keys and ranges.

use super::*;

#[test]
fn invalid_values_are_named() {
    let dir = recipes(&[("run.toml", BASE)]);
    for (set, key) in [
        ("algorithm.num_minibatches=7", "algorithm.num_minibatches"),
        ("algorithm.gamma=1.5", "algorithm.gamma"),
        ("env.num_envs=0", "env.num_envs"),
        ("model.hidden=[64, 0]", "model.hidden"),
        ("env.limits.memory_mib=0", "env.limits.memory_mib"),
        ("optimizer.lr=-1.0", "optimizer.lr"),
    ] {
        let err = load(&dir, "run.toml", &[set]).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, file, .. } if path == key && file == Path::new("--set")),
            "{set}: {err}"
        );
    }
    let err = load(&dir, "run.toml", &["algorithm.name=ddpg"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown variant `ddpg`, expected one of `ppo`, `grpo`, `sft`"),
        "{err}"
    );
}

#[test]
fn sac_and_td3_keys_are_checked_and_named() {
    let root = root().join("recipes");
    let load_shipped = |file: &str, set: &[&str]| load(&root, file, set);
    for (file, set, key, expected) in [
        (
            "sac-pendulum.toml",
            "algorithm.batch_size=0",
            "algorithm.batch_size",
            "at least 1",
        ),
        (
            "sac-pendulum.toml",
            "algorithm.buffer_size=0",
            "algorithm.buffer_size",
            "at least 1",
        ),
        ("sac-pendulum.toml", "algorithm.tau=0", "algorithm.tau", "(0, 1]"),
        (
            "sac-pendulum.toml",
            "algorithm.gamma=1.5",
            "algorithm.gamma",
            "between 0 and 1",
        ),
        ("sac-pendulum.toml", "algorithm.q_lr=0", "algorithm.q_lr", "positive"),
        (
            "sac-pendulum.toml",
            "algorithm.autotune=false",
            "algorithm.target_entropy",
            "only read when `algorithm.autotune = true`",
        ),
        (
            "td3-pendulum.toml",
            "algorithm.policy_frequency=0",
            "algorithm.policy_frequency",
            "at least 1",
        ),
        (
            "td3-pendulum.toml",
            "algorithm.noise_clip=-1",
            "algorithm.noise_clip",
            "≥ 0",
        ),
        (
            "td3-pendulum.toml",
            "optimizer.lr=0.1",
            "optimizer.lr",
            "TD3 does not use [optimizer]",
        ),
        (
            "td3-pendulum.toml",
            "model.activation=\"tanh\"",
            "model.activation",
            "of [model] it reads hidden",
        ),
        (
            "sac-pendulum.toml",
            "algorithm.policy_noise=0.2",
            "algorithm.policy_noise",
            "unknown",
        ),
    ] {
        // `target_entropy` is set here so that turning `autotune` off leaves it unread.
        let with_entropy = ["algorithm.target_entropy=-1.0", set];
        let sets: &[&str] = if key == "algorithm.target_entropy" {
            &with_entropy
        } else {
            &[set]
        };
        let err = load_shipped(file, sets).unwrap_err();
        assert!(
            matches!(&err, RecipeError::Invalid { path, message, .. } if path == key && message.contains(expected))
                || matches!(&err, RecipeError::UnknownKey { .. } if expected == "unknown"),
            "{file} {set}: {err}"
        );
    }
    let no_env = recipes(&[("sac.toml", "[algorithm]\nname = \"sac\"\n")]);
    let err = load(&no_env, "sac.toml", &[]).unwrap_err();
    assert!(
        err.to_string().contains("SAC needs an [env] section with a plugin"),
        "{err}"
    );
}
