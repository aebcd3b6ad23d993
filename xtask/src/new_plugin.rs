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

const REWARD_TEMPLATE: &str = r##"//! `{{name}}`: 1 when a completion contains the reference answer, else 0.

use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// The reward.
pub struct {{Type}} {
    ignore_case: bool,
}

impl Reward for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "1 when the completion contains the reference answer, else 0")
        .config(&[ConfigKey::new("ignore_case", "compare without regard to case").default("false")]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self { ignore_case: config.bool_or("ignore_case", false)? })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let Some(reference) = &group.reference else {
            return Ok(vec![Score::not_applicable(); group.completions.len()]);
        };
        let fold = |s: &str| if self.ignore_case { s.to_lowercase() } else { s.to_string() };
        let reference = fold(reference);
        Ok(group.completions.iter().map(|c| Score::from(fold(c).contains(&reference))).collect())
    }
}

rein_pdk::export_reward!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_completions_containing_the_reference() {
        let config = Config::parse(r#"{"ignore_case": true}"#, &{{Type}}::METADATA).unwrap();
        let mut reward = {{Type}}::new(&config).unwrap();
        let group = Group {
            prompt: "Capital of France?".into(),
            completions: vec!["It is PARIS.".into(), "Lyon".into()],
            reference: Some("Paris".into()),
            metadata: String::new(),
        };
        let scores: Vec<_> = reward.score(&group).unwrap().into_iter().map(|s| s.value).collect();
        assert_eq!(scores, vec![Some(1.0), Some(0.0)]);
    }
}
"##;

const JUDGE_REWARD_TEMPLATE: &str = r##"//! `{{name}}`: asks the judge model the recipe grants whether each completion answers the
//! question correctly; 1 for "Yes", 0 otherwise. Grant it a judge in the recipe:
//!
//! ```toml
//! [[reward]]
//! plugin = "{{name}}"
//! judge = { max_new_tokens = 4 }   # the policy's starting model; or model = "<dir>"
//! ```

use rein_pdk::judge::{self, JudgeRequest};
use rein_pdk::{Config, ConfigKey, Group, Message, Metadata, Reward, Score};

/// The reward.
pub struct {{Type}} {
    rubric: String,
}

impl Reward for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "1 when the judge says the completion is correct, else 0")
        .config(&[ConfigKey::new("rubric", "the judge's system message").default("\"Reply Yes or No.\"")]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self { rubric: config.str_or("rubric", "Reply Yes or No.")?.to_string() })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let requests: Vec<JudgeRequest> = (group.completions.iter())
            .map(|c| {
                let question = format!("Question: {}\nAnswer: {c}\nIs the answer correct?", group.prompt);
                JudgeRequest::new(vec![Message::system(self.rubric.clone()), Message::user(question)]).max_new_tokens(4)
            })
            .collect();
        // Every request is answered or refused (a budget spent): the plugin decides what a
        // refusal scores; here it fails the group, which the host counts.
        (judge::ask(&requests).into_iter().enumerate())
            .map(|(c, verdict)| {
                let verdict = verdict.map_err(|e| format!("completion {c}: {e}"))?;
                Ok(Score::from(verdict.text.trim_start().to_lowercase().starts_with("yes")))
            })
            .collect()
    }
}

rein_pdk::export_reward!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_judges_yes_scores_one() {
        // Native tests have no host: the judge answers from a script.
        judge::script(["Yes.", "No"]);
        let mut reward = {{Type}}::new(&Config::default()).unwrap();
        let group = Group {
            prompt: "What is 2 + 3?".into(),
            completions: vec!["5".into(), "6".into()],
            reference: None,
            metadata: String::new(),
        };
        let scores: Vec<_> = reward.score(&group).unwrap().into_iter().map(|s| s.value).collect();
        assert_eq!(scores, vec![Some(1.0), Some(0.0)]);
    }
}
"##;

/// Test cases of the scaffolded judged rewards: `judge` holds the scripted judge's replies.
const JUDGE_CASES: &str = r#"{"name": "the judge's yes scores 1", "group": {"prompt": "What is 2 + 3?", "completions": ["5", "6"]}, "judge": ["Yes", "No"], "expected": [1.0, 0.0]}
{"name": "case and spaces do not matter", "group": {"prompt": "What is 2 + 3?", "completions": ["five"]}, "judge": ["  yes, five is right"], "expected": [1.0]}
{"name": "a custom rubric", "config": {"rubric": "Be strict. Reply Yes or No."}, "group": {"prompt": "What is 2 + 3?", "completions": ["about 5"]}, "judge": ["No"], "expected": [0.0]}
"#;

const PYTHON_JUDGE_REWARD_TEMPLATE: &str = r##""""`{{name}}`: asks the judge model the recipe grants whether each completion answers the
question correctly; 1 for "Yes", 0 otherwise.

A rein reward plugin in Python for the `reward-with-judge` world (it imports `judge`).
`cargo xtask build-plugins` compiles it with componentize-py into target/plugins/{{name}}.wasm.
Grant it a judge in the recipe: `judge = { max_new_tokens = 4 }` (the policy's starting
model) or `judge = { model = "<dir>" }`. Its test cases, with the scripted judge's replies,
are in cases.jsonl:

    cargo rein plugin test target/plugins/{{name}}.wasm --cases plugins/{{name}}/cases.jsonl
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore
from wit_world.imports import judge
from wit_world.imports.types import ConfigKey, Message, PluginError, PluginMetadata

NAME = "{{name}}"
DESCRIPTION = "1 when the judge says the completion is correct, else 0"
CONFIG_KEYS = [ConfigKey("rubric", "the judge's system message", '"Reply Yes or No."')]

# componentize-py creates a new `RewardApi` for every call: what `init` sets lives here.
RUBRIC = "Reply Yes or No."


def score_group(group):
    """Asks about every completion at once; a refused request fails the group."""
    requests = [
        judge.JudgeRequest(
            [Message("system", RUBRIC), Message("user", f"Question: {group.prompt}\nAnswer: {c}\nIs the answer correct?")],
            4,  # max_new_tokens
            None,  # temperature: the grant's
            [],  # stop strings
            0,  # top_logprobs
        )
        for c in group.completions
    ]
    scores = []
    for i, verdict in enumerate(judge.judge(requests)):
        if isinstance(verdict, Err):
            raise Err(PluginError(f"completion {i}: the judge refused: {verdict.value}"))
        yes = verdict.value.text.strip().lower().startswith("yes")
        scores.append(CompletionScore(1.0 if yes else 0.0, []))
    return scores


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata(NAME, "0.1.0", DESCRIPTION, CONFIG_KEYS)

    def init(self, config):
        global RUBRIC
        try:
            values = json.loads(config) if config.strip() else {}
            unknown = sorted(set(values) - {"rubric"})
            if unknown:
                raise ValueError(f"unknown config key `{unknown[0]}` for plugin `{NAME}` (accepted: rubric)")
            RUBRIC = values.get("rubric", RUBRIC)
            if not isinstance(RUBRIC, str):
                raise ValueError("config key `rubric` must be a string")
        except (ValueError, AttributeError) as e:
            raise Err(PluginError(str(e)))

    def score(self, groups):
        return [score_group(group) for group in groups]
"##;

const ENV_TEMPLATE: &str = r##"//! `{{name}}`: a corridor of `length` cells; walk left (0) or right (1) and reach the right end.
//! Reward 1 on arrival (terminated), −0.01 per step otherwise; truncated after `max_episode_steps`.

use rein_pdk::{Action, Config, ConfigKey, EnvSpec, Environment, Metadata, Observation, Rng, Space, Transition};

/// The environment.
pub struct {{Type}} {
    length: u32,
    max_episode_steps: u32,
    position: u32,
    steps: u32,
    rng: Rng,
}

impl Environment for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "walk a corridor to its right end").config(&[
        ConfigKey::new("length", "number of cells").default("8"),
        ConfigKey::new("max_episode_steps", "truncate after this many steps").default("100"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let length = config.u64_or("length", 8)?.clamp(2, 1 << 20) as u32;
        let max_episode_steps = config.u64_or("max_episode_steps", 100)?.clamp(1, 1 << 30) as u32;
        Ok(Self { length, max_episode_steps, position: 0, steps: 0, rng: Rng::new(0) })
    }

    fn spec(&self) -> EnvSpec {
        EnvSpec { observation: Space::Box { low: vec![0.0], high: vec![1.0] }, action: Space::Discrete(2) }
    }

    fn reset(&mut self, seed: Option<u64>) {
        if let Some(seed) = seed {
            self.rng = Rng::new(seed);
        }
        // Start somewhere in the left half.
        self.position = (self.rng.next_u64() % u64::from(self.length / 2)) as u32;
        self.steps = 0;
    }

    fn step(&mut self, action: Action<'_>) -> Result<Transition, String> {
        let Action::Discrete(action) = action else { return Err("expected a discrete action".into()) };
        self.position = if action == 1 { self.position + 1 } else { self.position.saturating_sub(1) };
        self.steps += 1;
        let terminated = self.position == self.length - 1;
        Ok(Transition {
            reward: if terminated { 1.0 } else { -0.01 },
            terminated,
            truncated: !terminated && self.steps >= self.max_episode_steps,
        })
    }

    fn observation(&self) -> Observation {
        Observation::Vector(vec![self.position as f32 / (self.length - 1) as f32])
    }
}

rein_pdk::export_environment!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walking_right_reaches_the_end() {
        let mut env = {{Type}}::new(&Config::parse(r#"{"length": 4}"#, &{{Type}}::METADATA).unwrap()).unwrap();
        env.reset(Some(0));
        let mut last = None;
        for _ in 0..4 {
            let t = env.step(Action::Discrete(1)).unwrap();
            last = Some(t);
            if t.terminated {
                break;
            }
        }
        assert_eq!(last.map(|t| (t.reward, t.terminated)), Some((1.0, true)));
        assert_eq!(env.observation(), Observation::Vector(vec![1.0]));
    }
}
"##;

/// Test cases of the scaffolded Python and JavaScript rewards (`rein plugin test`).
const GUEST_CASES: &str = r#"{"name": "contains the reference", "group": {"prompt": "Capital of France?", "completions": ["It is Paris.", "Lyon"], "reference": "Paris"}, "expected": [1.0, 0.0]}
{"name": "ignore_case", "config": {"ignore_case": true}, "group": {"prompt": "Capital of France?", "completions": ["PARIS!", "paris", "Rome"], "reference": "Paris"}, "expected": [1.0, 1.0, 0.0]}
{"name": "no reference: not applicable", "group": {"prompt": "Say hi", "completions": ["hi"]}, "expected": [null]}
"#;

const PYTHON_REWARD_TEMPLATE: &str = r##""""`{{name}}`: 1 when a completion contains the reference answer, else 0.

A rein reward plugin in Python. `cargo xtask build-plugins` compiles it with componentize-py
into target/plugins/{{name}}.wasm, a component for rein's `reward` world that runs in the same
sandbox as Rust plugins (no files, no network, memory and time limits per call). The standard
library is available. Its test cases are in cases.jsonl:

    cargo rein plugin test target/plugins/{{name}}.wasm --cases plugins/{{name}}/cases.jsonl
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.reward_api import CompletionScore
from wit_world.imports.types import ConfigKey, PluginError, PluginMetadata

NAME = "{{name}}"
DESCRIPTION = "1 when the completion contains the reference answer, else 0"
CONFIG_KEYS = [ConfigKey("ignore_case", "compare without regard to case", "false")]

# componentize-py creates a new `RewardApi` for every call: what `init` sets lives here.
IGNORE_CASE = False


def parse_config(text):
    """The config as a dict; raises ValueError naming an unknown key or a wrong type."""
    values = json.loads(text) if text.strip() else {}
    if not isinstance(values, dict):
        raise ValueError(f"config must be a JSON object, got {text}")
    accepted = [key.name for key in CONFIG_KEYS]
    for key in sorted(values):
        if key not in accepted:
            raise ValueError(f"unknown config key `{key}` for plugin `{NAME}` (accepted: {', '.join(accepted)})")
    if not isinstance(values.get("ignore_case", False), bool):
        raise ValueError(f"config key `ignore_case` must be a boolean, got {json.dumps(values['ignore_case'])}")
    return values


def score_group(group):
    """One score per completion; none (not applicable) when there is no reference."""
    if group.reference is None:
        return [CompletionScore(None, []) for _ in group.completions]
    fold = str.lower if IGNORE_CASE else str
    reference = fold(group.reference)
    return [CompletionScore(1.0 if reference in fold(c) else 0.0, []) for c in group.completions]


class RewardApi(exports.RewardApi):
    def metadata(self):
        return PluginMetadata(NAME, "0.1.0", DESCRIPTION, CONFIG_KEYS)

    def init(self, config):
        global IGNORE_CASE
        try:
            IGNORE_CASE = parse_config(config).get("ignore_case", False)
        except ValueError as e:  # json.JSONDecodeError is one too
            raise Err(PluginError(str(e)))

    def score(self, groups):
        return [score_group(group) for group in groups]
"##;

const JS_REWARD_TEMPLATE: &str = r##"// `{{name}}`: 1 when a completion contains the reference answer, else 0.
//
// A rein reward plugin in JavaScript. `cargo xtask build-plugins` compiles it with
// componentize-js into target/plugins/{{name}}.wasm, a component for rein's `reward` world that
// runs in the same sandbox as Rust plugins (no files, no network, memory and time limits per
// call). Its test cases are in cases.jsonl:
//
//     cargo rein plugin test target/plugins/{{name}}.wasm --cases plugins/{{name}}/cases.jsonl

const NAME = "{{name}}";
const DESCRIPTION = "1 when the completion contains the reference answer, else 0";
const CONFIG_KEYS = [{ name: "ignore_case", description: "compare without regard to case", defaultValue: "false" }];

let ignoreCase = false;

/** The config as an object; throws an Error naming an unknown key or a wrong type. */
function parseConfig(text) {
  const values = text.trim() === "" ? {} : JSON.parse(text);
  if (values === null || typeof values !== "object" || Array.isArray(values)) {
    throw new Error(`config must be a JSON object, got ${text}`);
  }
  const accepted = CONFIG_KEYS.map((key) => key.name);
  for (const key of Object.keys(values).sort()) {
    if (!accepted.includes(key)) {
      throw new Error(`unknown config key \`${key}\` for plugin \`${NAME}\` (accepted: ${accepted.join(", ")})`);
    }
  }
  if ("ignore_case" in values && typeof values.ignore_case !== "boolean") {
    throw new Error(`config key \`ignore_case\` must be a boolean, got ${JSON.stringify(values.ignore_case)}`);
  }
  return values;
}

/** One score per completion; none (not applicable) when there is no reference. */
function scoreGroup(group) {
  if (group.reference === undefined) {
    return group.completions.map(() => ({ score: undefined, components: [] }));
  }
  const fold = (s) => (ignoreCase ? s.toLowerCase() : s);
  const reference = fold(group.reference);
  return group.completions.map((c) => ({ score: fold(c).includes(reference) ? 1 : 0, components: [] }));
}

export const rewardApi = {
  metadata() {
    return { name: NAME, version: "0.1.0", description: DESCRIPTION, configKeys: CONFIG_KEYS };
  },

  init(config) {
    try {
      ignoreCase = parseConfig(config).ignore_case ?? false;
    } catch (e) {
      throw { message: e.message }; // the `plugin-error` record
    }
  },

  score(groups) {
    return groups.map(scoreGroup);
  },
};
"##;

const TOOL_TEMPLATE: &str = r##"//! `{{name}}`: a tool that counts the words and characters of a text.

use rein_pdk::json::{Map, Value, json};
use rein_pdk::{Config, ConfigKey, Metadata, Tool, ToolSpec};

/// The tool.
pub struct {{Type}} {
    max_chars: usize,
}

impl Tool for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "Counts the words and characters of a text")
        .config(&[ConfigKey::new("max_chars", "longest text accepted").default("10000")]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self { max_chars: config.u64_or("max_chars", 10_000)? as usize })
    }

    /// What the model sees (an OpenAI function schema).
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "{{name}}".into(),
            description: "Count the words and characters of a text.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The text to count"}},
                "required": ["text"],
            }),
        }
    }

    /// `Ok` is the result the model reads; `Err` an error message it reads instead.
    fn call(&mut self, arguments: &Map<String, Value>) -> Result<String, String> {
        let Some(Value::String(text)) = arguments.get("text") else {
            return Err("`text` must be a string".into());
        };
        if text.chars().count() > self.max_chars {
            return Err(format!("the text is longer than {} characters", self.max_chars));
        }
        Ok(format!("{} words, {} characters", text.split_whitespace().count(), text.chars().count()))
    }
}

rein_pdk::export_tool!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn counts_words_and_refuses_bad_arguments() {
        let config = Config::parse(r#"{"max_chars": 20}"#, &{{Type}}::METADATA).unwrap();
        let mut tool = {{Type}}::new(&config).unwrap();
        assert_eq!(tool.call(&arguments(json!({"text": "two  words"}))), Ok("2 words, 10 characters".into()));
        assert!(tool.call(&arguments(json!({"text": 3}))).is_err());
        assert!(tool.call(&arguments(json!({"text": "x".repeat(21)}))).is_err());
    }
}
"##;

const TEXT_ENV_TEMPLATE: &str = r##"//! `{{name}}`: a word game over several turns. The model must say the row's reference word;
//! after each miss it hears how many letters it got in the right place, until it says the word
//! (reward 1) or runs out of tries (reward 0).

use rein_pdk::{Config, ConfigKey, EpisodeStart, Message, Metadata, Opening, Reply, TextEnv};

/// The environment.
pub struct {{Type}} {
    tries: u32,
}

/// One episode.
pub struct Game {
    word: String,
    tries: u32,
}

impl TextEnv for {{Type}} {
    type Episode = Game;

    const METADATA: Metadata = Metadata::new("{{name}}", "Say the secret word; hints after each miss")
        .config(&[ConfigKey::new("tries", "turns before the episode ends unsolved").default("3")]);

    fn new(config: &Config) -> Result<Self, String> {
        match config.u64_or("tries", 3)? {
            0 => Err("`tries` must be at least 1".into()),
            tries => Ok(Self { tries: tries as u32 }),
        }
    }

    /// A new episode from a dataset row: its state and the opening messages.
    fn reset(&mut self, start: &EpisodeStart) -> Result<(Game, Opening), String> {
        let word = start.reference.clone().ok_or("the row has no reference (the word)")?;
        let opening = Opening {
            messages: vec![Message::user(start.prompt.clone())],
            tools: Vec::new(),
        };
        Ok((Game { word: word.trim().to_lowercase(), tries: 0 }, opening))
    }

    /// The model's turn: the next messages, or the end with a reward.
    fn step(&mut self, game: &mut Game, content: &str) -> Result<Reply, String> {
        game.tries += 1;
        let said = content.trim().to_lowercase();
        if said.split_whitespace().any(|w| w.trim_matches(|c: char| !c.is_alphanumeric()) == game.word) {
            return Ok(Reply::done(1.0).with("tries", f64::from(game.tries)));
        }
        if game.tries == self.tries {
            return Ok(Reply::done(0.0).with("tries", f64::from(game.tries)));
        }
        let right = said.chars().zip(game.word.chars()).filter(|(a, b)| a == b).count();
        // The state key: turns that heard the same hint after as many tries are compared (GiGPO).
        Ok(Reply::user(format!("No. {right} letters in the right place.")).state(format!("{}:{right}", game.tries)))
    }
}

rein_pdk::export_text_env!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_game_ends_when_the_word_is_said_or_the_tries_run_out() {
        let config = Config::parse("{}", &{{Type}}::METADATA).unwrap();
        let mut env = {{Type}}::new(&config).unwrap();
        let start = EpisodeStart { prompt: "Say the word.".into(), reference: Some("Paris".into()), ..EpisodeStart::default() };
        let (mut game, opening) = env.reset(&start).unwrap();
        assert_eq!(opening.messages.len(), 1);
        let miss = env.step(&mut game, "pairs").unwrap();
        assert!(!miss.done && miss.messages[0].content.contains("3 letters"));
        let hit = env.step(&mut game, "It is Paris.").unwrap();
        assert_eq!((hit.done, hit.reward), (true, Some(1.0)));
    }
}
"##;

const PYTHON_TOOL_TEMPLATE: &str = r##""""`{{name}}`: a tool that counts the words and characters of a text.

A rein tool plugin in Python. `cargo xtask build-plugins` compiles it with componentize-py into
target/plugins/{{name}}.wasm; it runs in the sandbox (no files, no network, a deadline and a
memory cap per call). Whatever goes wrong in a call reaches the model as a message.
"""

import json
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.tool_api import ToolError, ToolSpec
from wit_world.imports.types import ConfigKey, PluginError, PluginMetadata

NAME = "{{name}}"
PARAMETERS = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The text to count"}},
    "required": ["text"],
}

# componentize-py makes a new `ToolApi` for every call: the config lives in the module.
MAX_CHARS: Optional[int] = None


class ToolApi(exports.ToolApi):
    def metadata(self) -> PluginMetadata:
        return PluginMetadata(
            name=NAME,
            version="0.1.0",
            description="Counts the words and characters of a text",
            config_keys=[ConfigKey("max_chars", "longest text accepted", "10000")],
        )

    def init(self, config: str) -> ToolSpec:
        global MAX_CHARS
        values = json.loads(config or "{}")
        unknown = sorted(set(values) - {"max_chars"})
        if unknown:
            raise Err(PluginError(f"unknown config key `{unknown[0]}` (accepted: max_chars)"))
        MAX_CHARS = values.get("max_chars", 10000)
        return ToolSpec(name=NAME, description="Count the words and characters of a text.",
                        parameters=json.dumps(PARAMETERS))

    def call(self, arguments: str) -> str:
        text = json.loads(arguments).get("text")
        if not isinstance(text, str):
            raise Err(ToolError("`text` must be a string"))
        if MAX_CHARS is not None and len(text) > MAX_CHARS:
            raise Err(ToolError(f"the text is longer than {MAX_CHARS} characters"))
        return f"{len(text.split())} words, {len(text)} characters"
"##;

const TOOL_CASES: &str = r#"{"name": "counts words", "arguments": {"text": "two  words"}, "output": "2 words, 10 characters"}
{"name": "refuses a number", "arguments": {"text": 3}, "error": "must be a string"}
{"name": "max_chars", "config": {"max_chars": 3}, "arguments": {"text": "four"}, "error": "longer than 3"}
"#;

const TEXT_ENV_CASES: &str = r#"{"name": "said on the second try", "start": {"prompt": "Say the word.", "reference": "Paris"}, "turns": ["pairs", "It is Paris."], "replies": [{"says": "3 letters in the right place", "done": false}, {"done": true, "reward": 1.0}]}
{"name": "out of tries", "config": {"tries": 2}, "start": {"prompt": "Say the word.", "reference": "cat"}, "turns": ["dog", "cow"], "replies": [{"says": "No.", "done": false}, {"done": true, "reward": 0.0}]}
{"name": "punctuation around the word", "start": {"prompt": "Say the word.", "reference": "yes"}, "turns": ["\"Yes!\""], "replies": [{"done": true, "reward": 1.0}]}
"#;
