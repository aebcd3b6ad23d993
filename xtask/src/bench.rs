//! `cargo xtask bench`.

use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::workspace::{cargo_run, model_dir, plugin_dir, root, run};

#[derive(Args)]
pub(crate) struct Bench {
    /// Which benchmark: `plugins`, `ppo`, `generate`, `grpo`, `sft` or `agent`.
    suite: String,
}

impl Bench {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins::for_running().run()?;
        if matches!(self.suite.as_str(), "generate" | "grpo") {
            // Their second case is the real SmolLM2-135M-Instruct.
            crate::model::ensure("smollm2-135m")?;
        }
        run(cargo_run("rein-bench", "rein-bench")
            .env("REIN_MODEL_DIR", model_dir())
            .arg(&self.suite)
            .arg(plugin_dir())
            .current_dir(root()))
    }
}
