//! PPO with a critic on a language model, end to end on the tiny Qwen2: an SFT stage, then PPO
//! with a separate value model or a value head on the policy's trunk, started fresh or from a
//! reward model; what it logs and reports.

#[path = "common/mod.rs"]
mod common;

use std::path::Path;

use common::{plugin_dir, root, stage_records};

use rein_recipe::{Algorithm, LoadedRecipe};
use rein_train::RunOutcome;

/// `recipe`, shrunk to seconds, run into `runs`.
fn tiny(recipe: &str, runs: &Path, extra: &[&str]) -> LoadedRecipe {
    let overrides: Vec<String> = [
        "data.task.train=400",
        "data.task.test=8",
        "sft.steps=12",
        "sft.batch_size=8",
        "algorithm.steps=3",
        "algorithm.prompts_per_step=4",
        "sampler.n=2",
        "sampler.max_new_tokens=12",
        "eval.k=2",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .chain([format!("train.runs_dir={:?}", runs.display().to_string())])
    .collect();
    LoadedRecipe::load(&root().join(recipe), &overrides).unwrap()
}

/// `algorithm.name = "ppo"` with `[data]` is PPO on a language model; each kind of value model
/// trains, logs the critic's losses and the KL penalty, and the report names PPO.
#[test]
fn ppo_with_either_value_model_trains_logs_and_reports() {
    for value_model in ["separate", "head"] {
        let runs = common::scratch(&format!("lm-ppo-{value_model}"));
        let recipe = tiny(
            "recipes/ppo-arithmetic.toml",
            &runs,
            &[
                &format!("algorithm.value_model={value_model:?}"),
                "algorithm.update_epochs=2",
                "algorithm.num_minibatches=3",
            ],
        );
        assert!(matches!(recipe.recipe.algorithm, Algorithm::LmPpo(_)));
        assert!(recipe.to_toml().contains("name = \"ppo\""), "{}", recipe.to_toml());
        let RunOutcome::Lm(outcome) = rein_train::run(&recipe, &plugin_dir(), true).unwrap() else {
            panic!("a language-model outcome")
        };
        assert!(outcome.after.is_some());
        let records = stage_records(&runs, "ppo");
        assert_eq!(records.len(), 3, "{value_model}");
        for r in &records {
            for key in [
                "train/loss",
                "train/policy_loss",
                "train/value_loss",
                "train/grad_norm",
                "train/critic_grad_norm",
                "train/values_mean",
                "train/returns_mean",
                "train/kl",
                "train/kl_penalty",
                "train/reward",
            ] {
                assert!(
                    r[key].as_f64().is_some_and(f64::is_finite),
                    "{value_model}: {key} in {r}"
                );
            }
            assert!(r["train/value_loss"].as_f64() > Some(0.0), "{r}");
            assert!(r["train/critic_grad_norm"].as_f64() > Some(0.0), "{r}");
            assert!(r["train/kl"].as_f64().unwrap().abs() < 1.0, "{r}");
        }
        // The first step's policy is the SFT model: no KL yet to the reference.
        assert!(records[0]["train/kl"].as_f64().unwrap().abs() < 1e-4, "{}", records[0]);
        let report = std::fs::read_to_string(outcome.run_dir.unwrap().join("report.md")).unwrap();
        assert!(report.contains("PPO: 3 steps"), "{report}");
    }
}

/// During `critic_warmup_steps` only the critic learns: the policy's samples of the next step
/// come from the unchanged SFT model, so its KL to the reference stays 0, and only once the
/// policy steps does it move.
#[test]
fn the_policy_waits_for_the_critic_during_its_warm_up() {
    let runs = common::scratch("lm-ppo-warmup");
    let recipe = tiny(
        "recipes/ppo-arithmetic.toml",
        &runs,
        &[
            "algorithm.critic_warmup_steps=2",
            "algorithm.steps=4",
            "optimizer.lr=1e-3",
        ],
    );
    rein_train::run(&recipe, &plugin_dir(), true).unwrap();
    let records = stage_records(&runs, "ppo");
    let kl: Vec<f64> = records.iter().map(|r| r["train/kl"].as_f64().unwrap()).collect();
    assert_eq!(kl.len(), 4);
    assert!(
        kl[..3].iter().all(|k| k.abs() < 1e-4),
        "frozen through step 2, sampled unchanged at 3: {kl:?}"
    );
    assert!(kl[3].abs() > 1e-4, "the policy moved at step 3: {kl:?}");
}

/// The value model can start from a reward model (its score head as the value head), which
/// must have one score and read the policy's tokens: anything else is refused before
/// training, naming the key.
#[test]
fn a_value_model_starts_from_a_one_score_reward_model_with_the_policys_tokenizer() {
    let fixture = |name: &str| root().join("tests/fixtures/lm").join(name);
    let value_model = |dir: &Path| format!("algorithm.value_model_path={:?}", dir.display().to_string());
    let runs = common::scratch("lm-ppo-rm-critic");
    let recipe = tiny(
        "recipes/ppo-arithmetic.toml",
        &runs,
        &[&value_model(&fixture("llama-rm"))],
    );
    rein_train::run(&recipe, &plugin_dir(), true).unwrap();
    let records = stage_records(&runs, "ppo");
    assert_eq!(records.len(), 3);
    assert!(
        records
            .iter()
            .all(|r| r["train/value_loss"].as_f64().is_some_and(f64::is_finite))
    );

    // Three labels.
    let recipe = tiny(
        "recipes/ppo-arithmetic.toml",
        &common::scratch("lm-ppo-rm3"),
        &[&value_model(&fixture("qwen2-rm"))],
    );
    let error = rein_train::run(&recipe, &plugin_dir(), true).unwrap_err().to_string();
    assert!(
        error.contains("algorithm.value_model_path") && error.contains("has 3 labels"),
        "{error}"
    );

    // Another vocabulary (two tokens' ids swapped).
    let other = common::scratch("lm-ppo-other-vocabulary").join("rm");
    std::fs::create_dir_all(&other).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer_config.json"] {
        std::fs::copy(fixture("llama-rm").join(file), other.join(file)).unwrap();
    }
    let tokenizer = std::fs::read_to_string(fixture("llama-rm").join("tokenizer.json")).unwrap();
    let mut tokenizer: serde_json::Value = serde_json::from_str(&tokenizer).unwrap();
    tokenizer["model"]["vocab"]["!"] = 4.into();
    tokenizer["model"]["vocab"]["\""] = 3.into();
    std::fs::write(other.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let recipe = tiny(
        "recipes/ppo-arithmetic.toml",
        &common::scratch("lm-ppo-rm-vocab"),
        &[&value_model(&other)],
    );
    let error = rein_train::run(&recipe, &plugin_dir(), true).unwrap_err().to_string();
    assert!(error.contains("algorithm.value_model_path"), "{error}");
    assert!(
        error.contains("the value model") && error.contains("must share the policy's tokenizer"),
        "{error}"
    );
}

/// Asynchronous PPO (AReaL's staleness-bounded rollouts): generation samples the next step while
/// this one trains, never more than `max_staleness` versions behind, and with a correction the
/// ratio's denominator is the trainer's own log-probabilities (decoupled PPO), the mismatch
/// measured.
#[test]
fn asynchronous_ppo_trains_on_completions_at_most_one_version_old() {
    let runs = common::scratch("lm-ppo-async");
    let recipe = tiny(
        "recipes/ppo-arithmetic.toml",
        &runs,
        &[
            "algorithm.steps=5",
            "algorithm.max_staleness=1",
            "algorithm.correction=\"tis\"",
        ],
    );
    rein_train::run(&recipe, &plugin_dir(), true).unwrap();
    let records = stage_records(&runs, "ppo");
    assert_eq!(records.len(), 5);
    let lags: Vec<f64> = records
        .iter()
        .map(|r| r["train/policy_lag_max"].as_f64().unwrap())
        .collect();
    assert_eq!(lags[0], 0.0, "step 1 samples the starting policy");
    assert!(lags.iter().all(|&lag| lag <= 1.0), "{lags:?}");
    assert!(
        lags.contains(&1.0),
        "never one version behind (lags {lags:?}): the run was synchronous"
    );
    for r in &records {
        assert!(r["train/mismatch_kl"].as_f64().is_some_and(|kl| kl >= 0.0), "{r}");
        assert!(r["train/correction_capped_frac"].is_number(), "{r}");
    }
}
