//! `rein plugin …`: inspect a plugin, score groups with it.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use rein_core::{Group, RewardFn};
use rein_plugin::{Access, Import, PluginRuntime};

use crate::LimitArgs;

#[derive(Subcommand)]
pub(crate) enum PluginCommand {
    /// Show a plugin's name, kind, interface version, config keys and imports.
    Inspect {
        /// The plugin (`.wasm` component).
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a plugin's test cases (JSON lines; for rewards {"group", "expected", "config"?,
    /// "name"?, "tolerance"?}, for tools {"arguments", "output" | "error", …}, for text
    /// environments {"start", "turns", "replies", …}); prints pass/fail per case, fails if any
    /// case fails.
    Test {
        /// The reward, tool or text-env plugin.
        file: PathBuf,
        /// The cases.
        #[arg(long, value_name = "FILE")]
        cases: PathBuf,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Score groups of completions with a reward plugin; prints one JSON line per group.
    Score {
        /// The reward plugin.
        file: PathBuf,
        /// JSON lines, one group each: {"prompt", "completions", "reference"?, "metadata"?}.
        #[arg(long, value_name = "FILE")]
        input: PathBuf,
        /// The plugin's config as a JSON object.
        #[arg(long, default_value = "{}")]
        config: String,
        /// Groups per call to the plugin.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

impl PluginCommand {
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            PluginCommand::Inspect { file, json } => inspect(file, json),
            PluginCommand::Test { file, cases, limits } => crate::plugin_conformance::test(&file, &cases, limits),
            PluginCommand::Score {
                file,
                input,
                config,
                batch,
                limits,
            } => score(file, input, &config, batch.max(1), limits),
        }
    }
}

fn inspect(file: PathBuf, json: bool) -> anyhow::Result<()> {
    let runtime = PluginRuntime::default();
    let plugin = match runtime.load(&file, Default::default()) {
        Ok(plugin) => plugin,
        Err(error) => {
            // Show what it imports and what the sandbox gives each, then why it cannot load.
            if let Ok(imports) = runtime.imports(&file) {
                print_imports(&imports);
            }
            return Err(error.into());
        }
    };
    let info = plugin.info();
    if json {
        println!("{}", serde_json::to_string_pretty(info)?);
        return Ok(());
    }
    let m = &info.metadata;
    println!("name:        {}", m.name);
    println!("version:     {}", m.version);
    println!("kind:        {}", info.kind.as_str());
    println!("interface:   rein:plugin@{}", info.interface_version);
    let reads: Vec<&str> = [
        (info.reads_tokens, "the completions' tokens and their log-probabilities"),
        (info.reads_images, "the prompt's images"),
    ]
    .into_iter()
    .filter_map(|(reads, what)| reads.then_some(what))
    .collect();
    if !reads.is_empty() {
        println!("reads:       {}", reads.join("; "));
    }
    println!("description: {}", m.description);
    println!("config keys:");
    if m.config_keys.is_empty() {
        println!("  (none)");
    }
    for key in &m.config_keys {
        let default = key
            .default_value
            .as_deref()
            .map(|d| format!(" (default {d})"))
            .unwrap_or_default();
        println!("  {}{default}: {}", key.name, key.description);
    }
    print_imports(&info.imports);
    Ok(())
}

/// One line per import: the interface, `provided`, `refused` or `MISSING`, and what it gives.
fn print_imports(imports: &[Import]) {
    println!("imports:");
    let width = imports.iter().map(|i| i.name.len()).max().unwrap_or(0);
    for import in imports {
        let access = match import.access {
            Access::Provided => "provided",
            Access::Refused => "refused",
            Access::Granted => "granted",
            Access::Missing => "MISSING",
        };
        println!("  {:width$}  {access:8}  {}", import.name, import.what);
    }
}

fn score(file: PathBuf, input: PathBuf, config: &str, batch: usize, limits: LimitArgs) -> anyhow::Result<()> {
    let groups = read_groups(&input)?;
    let plugin = PluginRuntime::default().load(&file, limits.limits())?;
    let mut reward = plugin.reward(config)?;
    let mut out = std::io::stdout().lock();
    for (chunk_index, chunk) in groups.chunks(batch).enumerate() {
        let scores = reward.score(chunk).with_context(|| {
            let first = chunk_index * batch + 1;
            format!(
                "scoring groups on lines {first}..={} of {}",
                first + chunk.len() - 1,
                input.display()
            )
        })?;
        for group_scores in scores {
            let mut line = serde_json::json!({
                "scores": group_scores.iter().map(|s| s.score).collect::<Vec<_>>(),
                "components": group_scores.iter().map(|s| {
                    s.components.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect::<serde_json::Map<String, serde_json::Value>>()
                }).collect::<Vec<_>>(),
            });
            // A reward that scores steps: each completion's `{start, end, score}` spans.
            if group_scores.iter().any(|s| !s.steps.is_empty()) {
                line["steps"] = serde_json::json!(group_scores.iter().map(|s| &s.steps).collect::<Vec<_>>());
            }
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// Reads JSON-lines groups, naming the file and line of any malformed one.
pub(crate) fn read_groups(path: &PathBuf) -> anyhow::Result<Vec<Group>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut groups = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let group: Group = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}:{}: not a group (expected {{\"prompt\", \"completions\", \"reference\"?, \"metadata\"?}})",
                path.display(),
                i + 1
            )
        })?;
        groups.push(group);
    }
    if groups.is_empty() {
        bail!("{} holds no groups", path.display());
    }
    Ok(groups)
}
