//! rein's benchmarks: each prints rein's figure, a native-Rust (or peer) figure for the same
//! work, their ratio and the target it must meet, and writes `target/bench/<suite>.json`.
//!
//! Run through `cargo xtask bench SUITE [--threads N] [--allow-missing-peers]`, which builds the
//! plugins first. Every side runs with the same thread count; a peer that cannot run is a row
//! that says NOT MEASURED, and then the bench fails unless `--allow-missing-peers`.

mod agent;
mod curriculum;
mod generate;
mod grpo;
mod lm_ppo;
mod machine;
mod off_policy;
mod peers;
mod plugins;
mod ppo;
mod preference;
mod python_package;
mod qwen2_3m;
mod recipe_sft;
mod report;
mod rewards;
mod serve;
mod sft;
mod shared_prefix;
mod step_rewards;

/// `rein-bench SUITE [PLUGIN_DIR] [--threads N] [--allow-missing-peers]`.
fn main() -> anyhow::Result<()> {
    // As `rein` does.
    rein_run::memory::keep_freed_memory();
    let (mut positional, mut threads, mut allow_missing_peers) = (Vec::new(), 2, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            _ if arg == "--threads" || arg.starts_with("--threads=") => {
                let value = match arg.strip_prefix("--threads=") {
                    Some(value) => value.to_string(),
                    None => args.next().unwrap_or_default(),
                };
                threads = value
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| anyhow::anyhow!("--threads takes a positive number, not `{value}`"))?;
            }
            "--allow-missing-peers" => allow_missing_peers = true,
            _ => positional.push(arg),
        }
    }
    let mut positional = positional.into_iter();
    let suite = positional.next().unwrap_or_else(|| "plugins".into());
    let plugin_dir = std::path::PathBuf::from(positional.next().unwrap_or_else(|| "target/plugins".into()));
    peers::set_threads(threads)?;
    let machine = machine::Machine::here(threads);
    println!("{}", machine.line());
    let report = match suite.as_str() {
        "plugins" => plugins::run(&plugin_dir)?,
        "ppo" => ppo::run(&plugin_dir)?,
        "sac" | "td3" => off_policy::run(&suite, &plugin_dir)?,
        "generate" => generate::run()?,
        "grpo" => {
            let mut report = grpo::run(&plugin_dir)?;
            step_rewards::run(&plugin_dir, &mut report)?;
            shared_prefix::run(&plugin_dir, &mut report)?;
            report
        }
        // The shared-prefix case of `grpo` alone.
        "grpo-shared-prefix" => {
            let mut report = report::Report::default();
            shared_prefix::run(&plugin_dir, &mut report)?;
            report
        }
        "curriculum" => curriculum::run(&plugin_dir)?,
        "sft" => sft::run()?,
        "agent" => agent::run(&plugin_dir)?,
        "serve" => serve::run()?,
        "rewards" => rewards::run(&plugin_dir)?,
        "preferences" => {
            let mut report = preference::run()?;
            lm_ppo::run(&mut report)?;
            report
        }
        other => {
            anyhow::bail!(
                "unknown benchmark suite `{other}` (available: plugins, ppo, sac, td3, generate, grpo, grpo-shared-prefix, curriculum, sft, agent, serve, rewards, preferences)"
            )
        }
    };
    report.finish(&suite, &machine, allow_missing_peers)
}
