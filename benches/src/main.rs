//! rein's benchmarks: each prints rein's figure, a native-Rust (or peer) figure for the same
//! work, their ratio and the target, and writes `target/bench/<suite>.json`.
//!
//! Run through `cargo xtask bench SUITE`, which builds the plugins first.

mod agent;
mod generate;
mod grpo;
mod peers;
mod plugins;
mod ppo;
mod qwen2_3m;
mod report;
mod serve;
mod sft;

fn main() -> anyhow::Result<()> {
    // As `rein` does.
    rein_train::memory::keep_freed_memory();
    let mut args = std::env::args().skip(1);
    let suite = args.next().unwrap_or_else(|| "plugins".into());
    let plugin_dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "target/plugins".into()));
    let report = match suite.as_str() {
        "plugins" => plugins::run(&plugin_dir)?,
        "ppo" => ppo::run(&plugin_dir)?,
        "generate" => generate::run()?,
        "grpo" => grpo::run(&plugin_dir)?,
        "sft" => sft::run()?,
        "agent" => agent::run(&plugin_dir)?,
        "serve" => serve::run()?,
        other => {
            anyhow::bail!(
                "unknown benchmark suite `{other}` (available: plugins, ppo, generate, grpo, sft, agent, serve)"
            )
        }
    };
    report.finish(&suite)
}
