//! `cargo xtask bench`.

use clap::Args;

use crate::build_plugins::BuildPlugins;
use crate::workspace::{cargo, cargo_run, model_dir, plugin_dir, root, run, target_dir};

#[derive(Args)]
pub(crate) struct Bench {
    /// Which benchmark: `plugins`, `ppo`, `sac`, `td3`, `generate`, `grpo` (`grpo-shared-prefix`:
    /// its long shared prompt case alone), `curriculum`, `sft`, `agent`, `serve`, `rewards` or
    /// `preferences`.
    suite: String,
    /// Threads for rein and for every peer alike.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Finish (exit 0) even when a peer could not be measured; its rows say NOT MEASURED.
    #[arg(long)]
    allow_missing_peers: bool,
}

impl Bench {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        BuildPlugins::for_running().run()?;
        if matches!(self.suite.as_str(), "generate" | "grpo" | "serve" | "rewards") {
            // The real SmolLM2-135M-Instruct: the second case of generate and grpo, serve's only one,
            // and the judge of rewards.
            crate::model::ensure("smollm2-135m")?;
        }
        // `serve` starts `rein serve` processes.
        run(cargo().args(["build", "--quiet", "-p", "rein-cli"]).current_dir(root()))?;
        let rein = target_dir()
            .join("debug")
            .join(format!("rein{}", std::env::consts::EXE_SUFFIX));
        let mut bench = cargo_run("rein-bench", "rein-bench");
        bench
            .env("REIN_MODEL_DIR", model_dir())
            .env("REIN_BIN", rein)
            .env("REIN_DOWNLOADS_DIR", target_dir().join("downloads"))
            .arg(&self.suite)
            .arg(plugin_dir())
            .arg(format!("--threads={}", self.threads))
            .current_dir(root());
        if self.suite == "plugins" {
            // The Python package's rows: the wheel and math-verify, each in its own folder.
            let (sandbox, math_verify) = crate::wheel::bench_packages()?;
            bench
                .env("REIN_SANDBOX_PYTHONPATH", sandbox)
                .env("REIN_MATH_VERIFY_PYTHONPATH", math_verify);
        }
        if self.allow_missing_peers {
            bench.arg("--allow-missing-peers");
        }
        run(&mut bench)
    }
}
