//! `cargo xtask new-plugin`: scaffold a reward, judged reward, environment, tool or
//! text-environment plugin (Rust), a reward, judged reward or tool plugin in Python, or a reward
//! plugin in JavaScript.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use crate::guest::Lang;
use crate::workspace::root;

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Kind {
    /// A reward function (world `reward`).
    Reward,
    /// A reward that asks the judge model its recipe grants (world `reward-with-judge`).
    JudgeReward,
    /// An environment (world `environment`).
    Env,
    /// A tool agents call (world `tool`).
    Tool,
    /// A text environment for multi-turn episodes (world `text-env`).
    TextEnv,
}

#[derive(Args)]
pub(crate) struct NewPlugin {
    /// What the plugin is.
    #[arg(long, value_enum)]
    pub(crate) kind: Kind,
    /// The plugin's name, kebab-case (e.g. `contains-answer`).
    pub(crate) name: String,
    /// The language: Rust (any kind), Python (rewards, judged rewards and tools) or JavaScript
    /// (rewards).
    #[arg(long, value_enum, default_value = "rust")]
    pub(crate) lang: Lang,
    /// The plugin workspace to add it to (default: plugins/).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

impl NewPlugin {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let name = &self.name;
        let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.ends_with('-');
        if !valid {
            bail!(
                "plugin name `{name}` must be kebab-case: lowercase letters, digits and dashes, starting with a letter"
            );
        }
        let workspace = self.dir.clone().unwrap_or_else(|| root().join("plugins"));
        if self.lang != Lang::Rust {
            return self.scaffold_guest(&workspace);
        }
        let workspace_manifest = workspace.join("Cargo.toml");
        let manifest = std::fs::read_to_string(&workspace_manifest)
            .with_context(|| format!("cannot read the plugin workspace {}", workspace_manifest.display()))?;
        let dir = workspace.join(name);
        if dir.exists() {
            bail!("{} already exists", dir.display());
        }
        let members_at = manifest
            .find("members = [")
            .context("no `members = [` in the plugin workspace manifest")?;
        let close = members_at
            + manifest[members_at..]
                .find(']')
                .context("unterminated `members` list")?;
        let members = &manifest[members_at + "members = [".len()..close];
        let separator = if members.trim().is_empty() { "" } else { ", " };
        let updated = format!(
            "{}{separator}\"{name}\"{}",
            manifest[..close].trim_end(),
            &manifest[close..]
        );

        std::fs::create_dir_all(dir.join("src"))?;
        std::fs::write(dir.join("Cargo.toml"), cargo_toml(name))?;
        let source = match self.kind {
            Kind::Reward => REWARD_TEMPLATE,
            Kind::JudgeReward => JUDGE_REWARD_TEMPLATE,
            Kind::Env => ENV_TEMPLATE,
            Kind::Tool => TOOL_TEMPLATE,
            Kind::TextEnv => TEXT_ENV_TEMPLATE,
        };
        let cases = match self.kind {
            Kind::Tool => Some(TOOL_CASES),
            Kind::TextEnv => Some(TEXT_ENV_CASES),
            Kind::JudgeReward => Some(JUDGE_CASES),
            Kind::Reward | Kind::Env => None,
        };
        if let Some(cases) = cases {
            std::fs::write(dir.join("cases.jsonl"), cases)?;
        }
        let type_name: String = name
            .split('-')
            .map(|part| {
                let mut chars = part.chars();
                chars
                    .next()
                    .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                    .unwrap_or_default()
            })
            .collect();
        std::fs::write(
            dir.join("src/lib.rs"),
            source.replace("{{name}}", name).replace("{{Type}}", &type_name),
        )?;
        std::fs::write(&workspace_manifest, updated)?;
        println!("created {}", dir.display());
        println!(
            "  test it:   cargo test --manifest-path {} -p {name}",
            workspace_manifest.display()
        );
        if self.dir.is_none() {
            println!("  build it:  cargo xtask build-plugins   (→ target/plugins/{name}.wasm)");
        }
        Ok(())
    }

    /// A Python or JavaScript reward plugin: its module and its test cases.
    fn scaffold_guest(&self, workspace: &Path) -> anyhow::Result<()> {
        let name = &self.name;
        let (template, cases) = match (self.kind, self.lang) {
            (Kind::Reward, Lang::Python) => (PYTHON_REWARD_TEMPLATE, GUEST_CASES),
            (Kind::Reward, _) => (JS_REWARD_TEMPLATE, GUEST_CASES),
            (Kind::JudgeReward, Lang::Python) => (PYTHON_JUDGE_REWARD_TEMPLATE, JUDGE_CASES),
            (Kind::Tool, Lang::Python) => (PYTHON_TOOL_TEMPLATE, TOOL_CASES),
            _ => bail!(
                "the scaffolds in Python are rewards, judged rewards and tools, in JavaScript rewards; write the others in Rust (--lang rust)"
            ),
        };
        let dir = workspace.join(name);
        if dir.exists() {
            bail!("{} already exists", dir.display());
        }
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(self.lang.entry_file()), template.replace("{{name}}", name))?;
        std::fs::write(dir.join("cases.jsonl"), cases)?;
        println!("created {}", dir.display());
        if self.dir.is_none() {
            println!("  build it:  cargo xtask build-plugins   (→ target/plugins/{name}.wasm)");
            println!(
                "  test it:   cargo rein plugin test target/plugins/{name}.wasm --cases plugins/{name}/cases.jsonl"
            );
        }
        Ok(())
    }
}

fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version.workspace = true
edition.workspace = true
rust-version.workspace = true
license.workspace = true
publish.workspace = true

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
rein-pdk.workspace = true
"#
    )
}

const REWARD_TEMPLATE: &str = include_str!("../scaffolds/reward.rs");

const JUDGE_REWARD_TEMPLATE: &str = include_str!("../scaffolds/judge_reward.rs");

/// Test cases of the scaffolded judged rewards: `judge` holds the scripted judge's replies.
const JUDGE_CASES: &str = include_str!("../scaffolds/judge_reward_cases.jsonl");

const PYTHON_JUDGE_REWARD_TEMPLATE: &str = include_str!("../scaffolds/judge_reward.py");

const ENV_TEMPLATE: &str = include_str!("../scaffolds/env.rs");

/// Test cases of the scaffolded Python and JavaScript rewards (`rein plugin test`).
const GUEST_CASES: &str = include_str!("../scaffolds/reward_cases.jsonl");

const PYTHON_REWARD_TEMPLATE: &str = include_str!("../scaffolds/reward.py");

const JS_REWARD_TEMPLATE: &str = include_str!("../scaffolds/reward.js");

const TOOL_TEMPLATE: &str = include_str!("../scaffolds/tool.rs");

const TEXT_ENV_TEMPLATE: &str = include_str!("../scaffolds/text_env.rs");

const PYTHON_TOOL_TEMPLATE: &str = include_str!("../scaffolds/tool.py");

const TOOL_CASES: &str = include_str!("../scaffolds/tool_cases.jsonl");

const TEXT_ENV_CASES: &str = include_str!("../scaffolds/text_env_cases.jsonl");
