//! `cargo xtask run RECIPE` and `cargo xtask recipe show|check RECIPE`: build the plugins,
//! then hand over to the `rein` binary (`rein run`, `rein recipe …`).

use clap::{Args, Subcommand};

use crate::build_plugins::BuildPlugins;
use crate::workspace::{cargo_run, model_dir, plugin_dir, run};

#[derive(Args)]
pub(crate) struct Run {
    /// The recipe, then `rein run` options (`--set key=value`, …).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    args: Vec<String>,
}

impl Run {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins::for_running().run()?;
        // Ctrl-C reaches the whole process group: `rein` saves a checkpoint and stops, and this
        // process waits for it rather than returning to the prompt first.
        let _ = ctrlc::set_handler(|| {});
        rein(&["run"], &self.args)
    }
}

#[derive(Args)]
pub(crate) struct Eval {
    /// The recipe, then `rein eval` options (`--model DIR`, `--set key=value`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    args: Vec<String>,
}

impl Eval {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins::for_running().run()?;
        rein(&["eval"], &self.args)
    }
}

#[derive(Args)]
pub(crate) struct Plot {
    /// The run directory (`runs/<recipe>-<timestamp>`).
    run_dir: String,
}

impl Plot {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        run(cargo_run("rein-cli", "rein").arg("plot").arg(&self.run_dir))
    }
}

#[derive(Args)]
pub(crate) struct Watch {
    /// The run directory, then `rein watch` options (`--once`, `--interval S`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    args: Vec<String>,
}

impl Watch {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        run(cargo_run("rein-cli", "rein").arg("watch").args(&self.args))
    }
}

#[derive(Subcommand)]
pub(crate) enum Recipe {
    /// Print the resolved recipe.
    Show {
        /// The recipe, then `--set key=value` overrides.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
    /// Validate a recipe (building the plugins first, so plugin names can be checked).
    Check {
        /// The recipe, then `--set key=value` overrides.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
}

impl Recipe {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        match self {
            Recipe::Show { args } => rein(&["recipe", "show"], args),
            Recipe::Check { args } => {
                BuildPlugins::for_running().run()?;
                rein(&["recipe", "check"], args)
            }
        }
    }
}

/// Runs `rein <command> <args> --plugin-dir <target>/plugins` from the current directory, with
/// `REIN_MODEL_DIR` pointing at the models `cargo xtask model` fetched.
fn rein(command: &[&str], args: &[String]) -> anyhow::Result<()> {
    run(cargo_run("rein-cli", "rein")
        .env("REIN_MODEL_DIR", model_dir())
        .args(command)
        .args(args)
        .arg("--plugin-dir")
        .arg(plugin_dir()))
}
