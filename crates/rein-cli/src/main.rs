//! `rein`: the command-line front end. Usable on any `.wasm` plugin:
//! `rein plugin inspect`, `rein plugin score`, `rein env rollout`; and training:
//! `rein run RECIPE`, `rein recipe show|check RECIPE`; models: `rein generate`,
//! `rein convert gguf`, `rein serve`.
//!
//! Errors go to stderr with a non-zero exit code and name the plugin and the limit or field.

mod convert;
mod env;
mod generate;
mod merge_lora;
mod plot;
mod plugin;
mod plugin_conformance;
mod serve;
mod train;
mod watch;

use clap::{Args, Parser, Subcommand};
use rein_plugin::SandboxLimits;

/// rein: reinforcement learning with sandboxed WebAssembly rewards and environments.
#[derive(Parser)]
#[command(name = "rein", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with plugin files.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Run environment plugins.
    #[command(subcommand)]
    Env(env::EnvCommand),
    /// Train: run a recipe.
    Run(train::RunArgs),
    /// Evaluate a language model on a recipe's held-out split: greedy pass@1, pass@k, maj@k.
    Eval(train::EvalArgs),
    /// Convert a model file into a model directory in Hugging Face format.
    #[command(subcommand)]
    Convert(convert::ConvertCommand),
    /// Merge a LoRA adapter (PEFT's format) into its base model, as one checkpoint.
    MergeLora(merge_lora::MergeLoraArgs),
    /// Generate text with a model directory in Hugging Face format (or a `.gguf` file).
    Generate(generate::GenerateArgs),
    /// Serve a model over HTTP: OpenAI-compatible completions and chat, SGLang's `/generate`
    /// and weight updates.
    Serve(serve::ServeArgs),
    /// Show or check a recipe.
    #[command(subcommand)]
    Recipe(train::RecipeCommand),
    /// Draw a run directory's metrics as PNG and SVG charts (`plots/`) and write `summary.md`.
    Plot(plot::PlotArgs),
    /// Watch a run in the terminal: state, step, ETA, phase, metrics with sparklines, the last
    /// samples; refreshed as it writes (also for finished or stopped runs).
    Watch(watch::WatchArgs),
}

/// Sandbox limits settable on the command line (defaults: 256 MiB, 2000 ms, no fuel).
#[derive(Args, Debug, Clone)]
pub(crate) struct LimitArgs {
    /// Memory limit in MiB.
    #[arg(long, value_name = "N")]
    memory_mib: Option<u64>,
    /// Wall-clock limit per call in milliseconds.
    #[arg(long, value_name = "N")]
    timeout_ms: Option<u64>,
    /// Fuel per call (deterministic instruction budget).
    #[arg(long, value_name = "N")]
    fuel: Option<u64>,
}

impl LimitArgs {
    pub(crate) fn limits(&self) -> SandboxLimits {
        let mut limits = SandboxLimits::default();
        if let Some(m) = self.memory_mib {
            limits.memory_mib = m;
        }
        if let Some(t) = self.timeout_ms {
            limits.timeout_ms = t;
        }
        limits.fuel = self.fuel;
        limits
    }
}

/// The exit code of a run the watchdog stopped (`train.stall_timeout_s`).
const STALLED_EXIT_CODE: i32 = 3;

fn main() -> std::process::ExitCode {
    rein_run::memory::keep_freed_memory();
    // The watchdog has saved the last completed step; the stalled thread cannot be unwound.
    rein_run::driver::on_stall(|error| {
        eprintln!("\nerror: {error}");
        std::process::exit(STALLED_EXIT_CODE);
    });
    let cli = Cli::parse();
    // A bad `REIN_CPU` is reported before any kernel runs (the kernels would ignore it).
    if let Err(error) = rein_kernels::isa::from_env() {
        eprintln!("error: {error}");
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Plugin(command) => command.run(),
        Command::Env(command) => command.run(),
        Command::Run(args) => args.run(),
        Command::Convert(command) => command.run(),
        Command::MergeLora(args) => args.run(),
        Command::Generate(args) => args.run(),
        Command::Serve(args) => args.run(),
        Command::Eval(args) => args.run(),
        Command::Recipe(command) => command.run(),
        Command::Plot(args) => args.run(),
        Command::Watch(args) => args.run(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
