//! What step rewards cost a GRPO step, on the default recipe (`recipes/grpo-arithmetic.toml`):
//! its model after its SFT stage, trained by two GRPO trainers from the same weights and seed —
//! the recipe as it is (outcome rewards, group advantages), and the same with the
//! `scratchpad-steps` plugin scoring each step of every completion and `advantage = "process"`
//! crediting the step scores to the steps' tokens (PRIME's estimator). The trainers take their
//! steps in turn, so both see the machine in the same state; each side's figure is the median of
//! its timed steps after [`WARMUP`] untimed ones. Their completions drift apart after the first
//! update, so both sides' mean completion lengths are printed.

use std::path::Path;
use std::time::Instant;

use rein_core::AdvantageKind;
use rein_model::CpuAutodiff;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_plugin::PluginRuntime;
use rein_posttrain::{OnlineContext, OnlineTrainer, Prompt, Update, WeightedReward};
use rein_recipe::{Algorithm, GrpoSection, LoadedRecipe, Recipe};
use rein_run::driver::Trainer;
use rein_run::watchdog::Phases;

use crate::recipe_sft::{AfterSft, after_sft, recipe_rewards};
use crate::report::{Report, Row, median};

const RECIPE: &str = "recipes/grpo-arithmetic.toml";
/// Untimed steps, then timed ones, on each side.
const WARMUP: usize = 1;
const STEPS: usize = 12;

/// The recipe's rewards loaded from `plugin_dir`, and with `steps`, the step checker too.
fn rewards(
    loaded: &LoadedRecipe,
    runtime: &PluginRuntime,
    plugin_dir: &Path,
    steps: bool,
) -> anyhow::Result<Vec<WeightedReward>> {
    let mut rewards = recipe_rewards(loaded, runtime, plugin_dir)?;
    if steps {
        let plugin = runtime.load(plugin_dir.join("scratchpad-steps.wasm"), Default::default())?;
        rewards.push(WeightedReward {
            reward: Box::new(plugin.reward("{}")?),
            weight: 1.0,
            isolate: false,
        });
    }
    Ok(rewards)
}

/// A GRPO trainer from `start` on `prompts` with `rewards` and `grpo`'s settings, the rest the
/// recipe's.
fn grpo_trainer<'a>(
    start: &CausalLm<CpuAutodiff>,
    (tokenizer, prompts): (&'a LmTokenizer, &'a [Prompt]),
    rewards: &'a mut Vec<WeightedReward>,
    grpo: &'a GrpoSection,
    recipe: &'a Recipe,
) -> anyhow::Result<OnlineTrainer<'a, CpuAutodiff>> {
    let ctx = OnlineContext {
        tokenizer,
        prompts,
        rewards,
        signals: &[],
        accuracy_reward: 0,
        curriculum: None,
        rollout: grpo.rollout(),
        sampler: &recipe.sampler,
        optimizer: &recipe.optimizer,
        seed: recipe.seed,
        agent: None,
    };
    Ok(OnlineTrainer::new(
        start.clone(),
        ctx,
        Update::Grpo(grpo),
        &Default::default(),
    )?)
}

pub fn run(plugin_dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let AfterSft {
        loaded,
        tokenizer,
        train,
        model: start,
        ..
    } = after_sft(RECIPE)?;
    let recipe = &loaded.recipe;
    let Algorithm::Grpo(section) = &recipe.algorithm else {
        anyhow::bail!("{RECIPE} is a GRPO recipe");
    };
    println!("  GRPO from it, with and without step rewards…");
    let phases = Phases::new(Default::default(), Default::default());

    let runtime = PluginRuntime::default();
    let process = GrpoSection {
        advantage: AdvantageKind::Process,
        ..section.clone()
    };
    let (mut outcome_rewards, mut step_rewards) = (
        rewards(&loaded, &runtime, plugin_dir, false)?,
        rewards(&loaded, &runtime, plugin_dir, true)?,
    );
    let trainer = |rewards, grpo| grpo_trainer(&start, (&tokenizer, &train), rewards, grpo, recipe);
    let mut sides = [
        trainer(&mut outcome_rewards, section)?,
        trainer(&mut step_rewards, &process)?,
    ];
    let (mut seconds, mut lengths) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for step in 1..=WARMUP + STEPS {
        for (side, trainer) in sides.iter_mut().enumerate() {
            let started = Instant::now();
            let done = trainer.step(step, &phases)?;
            if step > WARMUP {
                seconds[side].push(started.elapsed().as_secs_f64());
                lengths[side].extend(done.record.get("train/completion_length").and_then(|v| v.as_f64()));
            }
        }
    }
    let [plain, steps] = seconds.map(|s| median(&s).unwrap_or(f64::NAN));
    let [plain_len, steps_len] = lengths.map(|l| l.iter().sum::<f64>() / l.len().max(1) as f64);
    println!(
        "  outcome rewards: {plain:.3} s per step, mean completion {plain_len:.1} tokens; with step rewards \
         (scratchpad-steps, advantage = \"process\"): {steps:.3} s, {steps_len:.1} tokens"
    );
    report.push(Row {
        name: format!(
            "GRPO step with step rewards (scratchpad-steps, advantage = \"process\"), {RECIPE} after its SFT"
        ),
        value: steps,
        unit: "s",
        baseline: Some(("the same without them (same run)".into(), plain)),
        target: Some(("≤ 1.05×".into(), steps <= 1.05 * plain)),
    });
    Ok(())
}
