//! `cargo xtask bench curriculum`: how soon GRPO reaches a held-out accuracy on arithmetic of
//! mixed difficulty (`recipes/grpo-arithmetic-mixed.toml`: 1-, 2- and 3-digit operands, three
//! data sources), from one SFT'd model, with each way of choosing a batch's prompts: plain
//! GRPO (the shuffled order), dynamic sampling (DAPO: groups without reward variance replaced
//! by new prompts, after paying for them), difficulty pools, and the UCB curriculum over the
//! sources (DUMP). Each runs the recipe's steps on three seeds; the held-out greedy accuracy is
//! measured every [`EVAL_EVERY`] steps, outside the timed training.
//!
//! The figure of each arm is the median, over seeds, of the training seconds until the held-out
//! accuracy first reaches plain GRPO's final one (the median of its seeds' last evaluations);
//! a seed that never reaches it counts as its whole run, so the median is never flattered.

use std::path::Path;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use rein_core::RewardFn;
use rein_model::CpuAutodiff;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_plugin::PluginRuntime;
use rein_posttrain::Update;
use rein_posttrain::{EvalReport, EvalSettings, OnlineContext, OnlineTrainer, Prompt, WeightedReward, evaluate};
use rein_recipe::{Algorithm, CurriculumKind, CurriculumSection, GrpoSection, LoadedRecipe};
use rein_run::driver::Trainer;
use rein_run::watchdog::Phases;

use crate::recipe_sft::{AfterSft, after_sft, recipe_rewards};
use crate::report::{Report, Row, median};

const RECIPE: &str = "recipes/grpo-arithmetic-mixed.toml";
const SEEDS: [u64; 3] = [1, 2, 3];
/// Steps between held-out evaluations.
const EVAL_EVERY: usize = 10;

/// One way of choosing prompts.
struct Arm {
    name: &'static str,
    dynamic_sampling: bool,
    curriculum: Option<CurriculumKind>,
}

const ARMS: [Arm; 4] = [
    Arm {
        name: "plain GRPO",
        dynamic_sampling: false,
        curriculum: None,
    },
    Arm {
        name: "dynamic sampling",
        dynamic_sampling: true,
        curriculum: None,
    },
    Arm {
        name: "difficulty pools",
        dynamic_sampling: false,
        curriculum: Some(CurriculumKind::Pools),
    },
    Arm {
        name: "UCB over sources",
        dynamic_sampling: false,
        curriculum: Some(CurriculumKind::Ucb),
    },
];

/// One run of an arm: (training seconds, held-out report) after every evaluation.
struct Curve(Vec<(f64, EvalReport)>);

impl Curve {
    fn last(&self) -> &EvalReport {
        &self.0.last().expect("a curve starts with the SFT model's evaluation").1
    }

    /// Training seconds until the accuracy first reaches `target`; the whole run if never.
    fn seconds_to(&self, target: f64) -> (f64, bool) {
        match self.0.iter().find(|(_, r)| r.greedy_accuracy >= target) {
            Some((seconds, _)) => (*seconds, true),
            None => (self.0.last().map_or(f64::NAN, |(s, _)| *s), false),
        }
    }
}

/// What every run shares: the recipe, its data and the SFT'd model.
struct Setup {
    loaded: LoadedRecipe,
    tokenizer: LmTokenizer,
    train: Vec<Prompt>,
    test: Vec<Prompt>,
    start: CausalLm<CpuAutodiff>,
    runtime: PluginRuntime,
}

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let setup = Setup::new()?;
    let recipe = &setup.loaded.recipe;
    let Algorithm::Grpo(section) = &recipe.algorithm else {
        anyhow::bail!("{RECIPE} is a GRPO recipe");
    };
    let before = setup.evaluate(&setup.start, setup.judge(plugin_dir)?.as_mut())?;
    println!("{RECIPE}: after SFT, {}", before.one_line());
    let mut curves: Vec<Vec<Curve>> = Vec::new();
    for arm in &ARMS {
        let mut runs = Vec::new();
        for seed in SEEDS {
            let curve = setup.grpo(arm, section, seed, &before, plugin_dir)?;
            println!(
                "  {} seed {seed}: {:.1} s of training, held-out {}",
                arm.name,
                curve.0.last().map_or(0.0, |(s, _)| *s),
                curve.last().one_line()
            );
            runs.push(curve);
        }
        curves.push(runs);
    }
    let finals: Vec<f64> = curves[0].iter().map(|c| c.last().greedy_accuracy).collect();
    let target = median(&finals).unwrap_or(f64::NAN);
    println!(
        "target: plain GRPO's final held-out greedy accuracy, {:.1}% (median of seeds {SEEDS:?})",
        100.0 * target
    );
    let mut report = Report::default();
    let times: Vec<Vec<(f64, bool)>> = (curves.iter())
        .map(|runs| runs.iter().map(|c| c.seconds_to(target)).collect())
        .collect();
    let median_time = |arm: usize| median(&times[arm].iter().map(|t| t.0).collect::<Vec<_>>()).unwrap_or(f64::NAN);
    for (a, arm) in ARMS.iter().enumerate() {
        let reached = times[a].iter().filter(|t| t.1).count();
        let finals: Vec<f64> = curves[a].iter().map(|c| c.last().greedy_accuracy).collect();
        let seconds: Vec<String> = times[a].iter().map(|t| format!("{:.1}", t.0)).collect();
        println!(
            "  {}: reached it on {reached} of {} seeds (after {} s); final accuracy median {:.1}%",
            arm.name,
            SEEDS.len(),
            seconds.join(", "),
            100.0 * median(&finals).unwrap_or(f64::NAN)
        );
        report.push(Row {
            name: format!("{}: s to plain's final accuracy", arm.name),
            value: median_time(a),
            unit: "s",
            baseline: (a > 0).then(|| ("plain GRPO".to_string(), median_time(0))),
            target: None,
        });
    }
    Ok(report)
}

impl Setup {
    /// The recipe's data, and its model after the recipe's SFT stage.
    fn new() -> anyhow::Result<Self> {
        let AfterSft {
            loaded,
            tokenizer,
            train,
            test,
            model,
        } = after_sft(RECIPE)?;
        Ok(Self {
            start: model,
            runtime: PluginRuntime::default(),
            loaded,
            tokenizer,
            train,
            test,
        })
    }

    /// The recipe's rewards, loaded from `plugin_dir`.
    fn rewards(&self, plugin_dir: &Path) -> anyhow::Result<Vec<WeightedReward>> {
        recipe_rewards(&self.loaded, &self.runtime, plugin_dir)
    }

    /// The recipe's first reward, which judges held-out answers.
    fn judge(&self, plugin_dir: &Path) -> anyhow::Result<Box<dyn RewardFn>> {
        Ok(self.rewards(plugin_dir)?.swap_remove(0).reward)
    }

    /// Greedy held-out accuracy (by source too), judged by `judge`.
    fn evaluate(&self, model: &CausalLm<CpuAutodiff>, judge: &mut dyn RewardFn) -> anyhow::Result<EvalReport> {
        let recipe = &self.loaded.recipe;
        let settings = EvalSettings {
            k: 0,
            temperature: 0.0,
            max_new_tokens: recipe.sampler.max_new_tokens,
            batch: 64,
            seed: recipe.seed,
            stop: &recipe.sampler.stop,
        };
        let device = Default::default();
        Ok(evaluate(
            &model.valid(),
            &self.tokenizer,
            &self.test,
            judge,
            None,
            None,
            &settings,
            &device,
        )?)
    }

    /// GRPO from the SFT'd model as `arm` chooses prompts, evaluated every [`EVAL_EVERY`] steps.
    fn grpo(
        &self,
        arm: &Arm,
        section: &GrpoSection,
        seed: u64,
        before: &EvalReport,
        plugin_dir: &Path,
    ) -> anyhow::Result<Curve> {
        let recipe = &self.loaded.recipe;
        let grpo = GrpoSection {
            dynamic_sampling: arm.dynamic_sampling,
            ..section.clone()
        };
        let curriculum = arm.curriculum.map(|kind| CurriculumSection {
            kind,
            ..recipe.curriculum.clone().unwrap_or_default()
        });
        let (mut rewards, mut judge) = (self.rewards(plugin_dir)?, self.judge(plugin_dir)?);
        let ctx = OnlineContext {
            tokenizer: &self.tokenizer,
            prompts: &self.train,
            rewards: &mut rewards,
            signals: &[],
            accuracy_reward: 0,
            curriculum: curriculum.as_ref(),
            rollout: grpo.rollout(),
            sampler: &recipe.sampler,
            optimizer: &recipe.optimizer,
            seed,
            agent: None,
        };
        let device = Default::default();
        let mut trainer = OnlineTrainer::new(self.start.clone(), ctx, Update::Grpo(&grpo), &device)?;
        let phases = Phases::new(Default::default(), Default::default());
        let mut curve = Curve(vec![(0.0, before.clone())]);
        let mut trained = Duration::ZERO;
        for step in 1..=grpo.steps {
            let started = Instant::now();
            trainer.step(step, &phases)?;
            trained += started.elapsed();
            if step % EVAL_EVERY == 0 || step == grpo.steps {
                let report = self.evaluate(trainer.model(), judge.as_mut())?;
                curve.0.push((trained.as_secs_f64(), report));
            }
        }
        Ok(curve)
    }
}
