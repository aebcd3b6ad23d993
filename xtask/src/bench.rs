//! `cargo xtask bench`.

use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::workspace::{cargo_run, plugin_dir, root, run};

#[derive(Args)]
pub(crate) struct Bench {
    /// Which benchmark: `plugins`, `ppo`, `generate`, `grpo` or `sft`.
    suite: String,
}

impl Bench {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins::for_running().run()?;
        run(cargo_run("rein-bench", "rein-bench")
            .arg(&self.suite)
            .arg(plugin_dir())
            .current_dir(root()))
    }
}
