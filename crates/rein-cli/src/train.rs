//! `rein run` and `rein recipe`: train from a recipe, or show / check one.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use rein_recipe::LoadedRecipe;
use rein_train::{RunOutcome, TrainError};

/// Where a recipe is and how to change it.
#[derive(Args, Debug, Clone)]
pub(crate) struct RecipeArgs {
    /// The recipe file.
    recipe: PathBuf,
    /// Override a key: `--set algorithm.clip_coef=0.3` (repeatable; values are TOML).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Where built plugins are (`<name>.wasm`).
    #[arg(long, default_value = "target/plugins")]
    plugin_dir: PathBuf,
}

impl RecipeArgs {
    fn load(&self) -> anyhow::Result<LoadedRecipe> {
        Ok(LoadedRecipe::load(&self.recipe, &self.overrides)?)
    }
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Continue the run in this directory (`runs/<name>-<timestamp>`) from its newest intact
    /// checkpoint; the recipe and `--set` overrides must resolve to the ones it started with.
    #[arg(long, value_name = "RUN_DIR")]
    resume: Option<PathBuf>,
}

impl RunArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let loaded = self.recipe.load()?;
        stop_on_interrupt();
        let outcome = match &self.resume {
            None => {
                eprintln!("training {} (seed {})", loaded.name(), loaded.recipe.seed);
                rein_train::run(&loaded, &self.recipe.plugin_dir, true)
            }
            Some(dir) => rein_train::resume(&loaded, &self.recipe.plugin_dir, dir),
        };
        let outcome = naming_the_recipe(outcome, "training", &self.recipe.recipe)?;
        let run_dir = match &outcome {
            RunOutcome::Env(outcome) => outcome.run_dir.clone(),
            RunOutcome::Lm(outcome) => outcome.run_dir.clone(),
        };
        match outcome {
            RunOutcome::Env(outcome) => report_env(&loaded, &outcome),
            RunOutcome::Lm(outcome) => report_lm(&outcome),
        }
        if let Some(dir) = run_dir {
            crate::plot::after_run(&dir);
        }
        Ok(())
    }
}

/// The first Ctrl-C (or SIGTERM) asks the training loop to write a checkpoint after the
/// current step and stop; a second one exits at once.
fn stop_on_interrupt() {
    let handler = ctrlc::set_handler(|| {
        if rein_run::checkpoint::stop_requested() {
            eprintln!("\ninterrupted again: exiting without a checkpoint");
            std::process::exit(130);
        }
        eprintln!("\ninterrupted: saving a checkpoint after this step (Ctrl-C again to quit at once)");
        rein_run::checkpoint::request_stop();
    });
    if let Err(e) = handler {
        eprintln!("warning: cannot catch Ctrl-C ({e}); an interrupted run resumes from its last periodic checkpoint");
    }
}

fn report_env(loaded: &LoadedRecipe, outcome: &rein_control::EnvOutcome) {
    let t = &outcome.timings;
    if let Some(dir) = &outcome.run_dir {
        eprintln!("run directory: {}", dir.display());
    }
    let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    eprintln!(
        "{} updates, {} env steps, {} episodes in {:.1} s | last-{} mean return {} | eval return {}",
        outcome.updates,
        outcome.env_steps,
        outcome.episodes,
        t.total.as_secs_f64(),
        loaded.recipe.train.return_window,
        fmt(outcome.mean_return),
        fmt(outcome.eval_return),
    );
    if let Some((steps, secs)) = outcome.solved_at {
        eprintln!("reached the target return after {steps} env steps, {secs:.2} s");
    }
    eprintln!(
        "time: env {:.2} s, inference {:.2} s, backward {:.2} s, optimizer {:.2} s",
        t.env.as_secs_f64(),
        t.inference.as_secs_f64(),
        t.backward.as_secs_f64(),
        t.optimizer.as_secs_f64()
    );
}

fn report_lm(outcome: &rein_posttrain::LmOutcome) {
    if let Some(dir) = &outcome.run_dir {
        eprintln!("run directory: {} (report.md, metrics.jsonl, final/)", dir.display());
    }
    for (label, report) in [("before RL", &outcome.before), ("after RL ", &outcome.after)] {
        if let Some(r) = report {
            eprintln!("held-out {label}: {}", r.one_line());
        }
    }
    if let Some(g) = &outcome.grpo {
        eprintln!(
            "{}: {} steps | generate {:.1} s, reward {:.1} s, train {:.1} s",
            g.algorithm,
            g.steps,
            g.generate.as_secs_f64(),
            g.reward.as_secs_f64(),
            g.train.as_secs_f64()
        );
    }
    eprintln!(
        "{:.0} s in total (SFT {:.0} s)",
        outcome.total_seconds, outcome.sft_seconds
    );
}

#[derive(Args, Debug)]
pub(crate) struct EvalArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Evaluate this Hugging Face model directory instead of the recipe's model (e.g.
    /// `runs/<run>/final`).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
}

impl EvalArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let loaded = self.recipe.load()?;
        let report = rein_posttrain::evaluate_recipe(&loaded, &self.recipe.plugin_dir, self.model.as_deref());
        let report = naming_the_recipe(report.map_err(TrainError::from), "evaluating", &self.recipe.recipe)?;
        eprintln!("{}", report.one_line());
        println!("{}", serde_json::to_string(&report)?);
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum RecipeCommand {
    /// Print the resolved recipe (extends merged, overrides applied, defaults filled in).
    Show(RecipeArgs),
    /// Validate a recipe: every check `run` makes before its first step without opening a
    /// model (its plugins exist, a language model's weights and tokenizer are named).
    Check(RecipeArgs),
}

impl RecipeCommand {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        match self {
            RecipeCommand::Show(args) => {
                print!("{}", args.load()?.to_toml());
                Ok(())
            }
            RecipeCommand::Check(args) => {
                let loaded = args.load()?;
                loaded.check(&args.plugin_dir)?;
                println!("{}: ok", args.recipe.display());
                Ok(())
            }
        }
    }
}

/// `result`, its error prefixed with `what RECIPE` unless it is the recipe's own, which names
/// the file and key already.
fn naming_the_recipe<T>(result: Result<T, TrainError>, what: &str, recipe: &Path) -> anyhow::Result<T> {
    match result {
        Err(TrainError::Recipe(error)) => Err(error.into()),
        other => other.with_context(|| format!("{what} {}", recipe.display())),
    }
}
