//! `rein plugin test`: runs a plugin's cases (JSON lines) and reports pass/fail per case. The
//! case format depends on the plugin's kind:
//! - reward: `{"group", "expected", "config"?, "name"?, "tolerance"?, "judge"?}`: the scores of
//!   the group's completions (`null` = not applicable); `judge` is the list of replies a scripted
//!   judge gives, in order, to a plugin that asks one (`reward-with-judge`);
//! - tool: `{"arguments", "output" | "error", "images"?, "config"?, "name"?}`: the exact output
//!   text (and its exact images, none unless `images` lists them), or a text the error message
//!   (shown to the model) contains;
//! - text-env: `{"start", "turns", "replies", "config"?, "name"?}`: one episode from `start`
//!   (`{"prompt", "reference"?, "metadata"?, "images"?}`) played with the model turns `turns`,
//!   each reply checked against `{"says"?, "done"?, "reward"?, "images"?}` (`says`: a text its
//!   messages contain; `images`: how many images it shows).
//!
//! Images in cases are data URLs (`data:image/png;base64,…`), as in a group's `images`.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use rein_core::{EpisodeStart, Group, Image, JudgeLimits, RewardFn, ScriptedJudge, TextEnv, Tool, Turn};
use rein_plugin::{JudgeGrant, Plugin, PluginKind, PluginRuntime};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::LimitArgs;

/// One case of a reward plugin.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RewardCase {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: Option<serde_json::Value>,
    /// The group to score.
    group: Group,
    /// The expected score of each completion (`null` = not applicable).
    expected: Vec<Option<f64>>,
    /// Allowed absolute difference (default 1e-9).
    #[serde(default)]
    tolerance: Option<f64>,
    /// The replies of the scripted judge granted to a plugin that imports one, in order.
    #[serde(default)]
    judge: Option<Vec<String>>,
}

/// One case of a tool plugin.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCase {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: Option<serde_json::Value>,
    /// The call's arguments (sent as JSON text; need not be an object, to test refusals).
    arguments: serde_json::Value,
    /// The exact output expected.
    #[serde(default)]
    output: Option<String>,
    /// A text the error message must contain.
    #[serde(default)]
    error: Option<String>,
    /// The images the output must show, exactly (none when absent).
    #[serde(default)]
    images: Vec<Image>,
}

/// The row a text-env case starts from.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    prompt: String,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    images: Vec<Image>,
}

/// What one reply of a text-env case must be.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedReply {
    /// A text one of the reply's messages contains.
    #[serde(default)]
    says: Option<String>,
    #[serde(default)]
    done: Option<bool>,
    /// The reward (`null`: none given).
    #[serde(default, deserialize_with = "some")]
    reward: Option<Option<f64>>,
    /// How many images the reply shows.
    #[serde(default)]
    images: Option<usize>,
}

/// Keeps an explicit `null` apart from a missing key.
fn some<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

/// One case of a text-env plugin.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextEnvCase {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: Option<serde_json::Value>,
    start: Row,
    /// The model's turns, in order.
    turns: Vec<String>,
    /// One per turn.
    replies: Vec<ExpectedReply>,
}

/// The case format for plugins of `kind`; `None` for environments, which have no cases.
fn case_format(kind: PluginKind) -> Option<&'static str> {
    match kind {
        PluginKind::Reward => Some(r#"{"group", "expected", "config"?, "name"?, "tolerance"?, "judge"?}"#),
        PluginKind::Tool => Some(r#"{"arguments", "output" | "error", "images"?, "config"?, "name"?}"#),
        PluginKind::TextEnv => Some(r#"{"start", "turns", "replies", "config"?, "name"?}"#),
        PluginKind::Environment => None,
    }
}

pub(crate) fn test(file: &Path, cases_path: &Path, limits: LimitArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(cases_path).with_context(|| format!("cannot open {}", cases_path.display()))?;
    let plugin = PluginRuntime::default().load(file, limits.limits())?;
    let format = case_format(plugin.kind())
        .with_context(|| format!("`rein plugin test` has no cases for {} plugins", plugin.kind().as_str()))?;
    let lines: Vec<(usize, &str)> = (text.lines().enumerate())
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l))
        .collect();
    if lines.is_empty() {
        bail!("{} holds no cases", cases_path.display());
    }
    let mut out = std::io::stdout().lock();
    let mut failed = 0;
    for &(line, case) in &lines {
        let (name, verdict) = match plugin.kind() {
            PluginKind::Tool => {
                let case: ToolCase = parse(cases_path, line, case, format)?;
                (case.name.clone(), tool_case(&case, &plugin))
            }
            PluginKind::TextEnv => {
                let case: TextEnvCase = parse(cases_path, line, case, format)?;
                (case.name.clone(), text_env_case(&case, &plugin))
            }
            _ => {
                let case: RewardCase = parse(cases_path, line, case, format)?;
                (case.name.clone(), reward_case(&case, &plugin))
            }
        };
        match verdict {
            Ok(()) => writeln!(out, "pass  {}", name.unwrap_or_else(|| format!("line {line}")))?,
            Err(why) => {
                failed += 1;
                writeln!(out, "FAIL  {}: {why}", name.unwrap_or_else(|| format!("line {line}")))?;
            }
        }
    }
    writeln!(out, "{} passed, {failed} failed", lines.len() - failed)?;
    if failed > 0 {
        bail!("{failed} of {} cases failed", lines.len());
    }
    Ok(())
}

fn parse<C: DeserializeOwned>(path: &Path, line: usize, text: &str, format: &str) -> anyhow::Result<C> {
    serde_json::from_str(text)
        .with_context(|| format!("{}:{line}: not a test case (expected {format})", path.display()))
}

/// A case's config as JSON text (`{}` when it has none).
fn config_text(config: &Option<serde_json::Value>) -> String {
    config.as_ref().map_or("{}".to_string(), |c| c.to_string())
}

fn reward_case(case: &RewardCase, plugin: &Plugin) -> Result<(), String> {
    let config = config_text(&case.config);
    let reward = match (&case.judge, plugin.imports_judge()) {
        (Some(replies), _) => {
            let judge = Arc::new(Mutex::new(ScriptedJudge::new(replies.clone())));
            plugin.reward_with_judge(&config, JudgeGrant::new(judge, JudgeLimits::default(), 0))
        }
        (None, true) => return Err("the plugin asks a judge: give the case its replies (`judge`)".into()),
        (None, false) => plugin.reward(&config),
    };
    let scores = reward
        .and_then(|mut reward| reward.score(std::slice::from_ref(&case.group)))
        .map_err(|e| format!("error: {e}"))?;
    let got: Vec<Option<f64>> = scores[0].iter().map(|s| s.score).collect();
    let tolerance = case.tolerance.unwrap_or(1e-9);
    let same = got.len() == case.expected.len()
        && got.iter().zip(&case.expected).all(|(g, e)| match (g, e) {
            (Some(g), Some(e)) => (g - e).abs() <= tolerance,
            (None, None) => true,
            _ => false,
        });
    match same {
        true => Ok(()),
        false => Err(format!("expected {:?}, got {got:?}", case.expected)),
    }
}

fn tool_case(case: &ToolCase, plugin: &Plugin) -> Result<(), String> {
    let mut tool = plugin
        .tool(&config_text(&case.config))
        .map_err(|e| format!("error: {e}"))?;
    let result = tool.call(&case.arguments.to_string());
    match (&case.output, &case.error, result) {
        (Some(expected), _, Ok(output)) if output.text == *expected && output.images == case.images => Ok(()),
        (None, Some(part), Err(error)) if error.message.contains(part.as_str()) => Ok(()),
        (_, _, Ok(output)) => Err(format!("got the output {output:?}")),
        (_, _, Err(error)) => Err(format!("got the {} error {:?}", error.kind.as_str(), error.message)),
    }
}

fn text_env_case(case: &TextEnvCase, plugin: &Plugin) -> Result<(), String> {
    if case.turns.len() != case.replies.len() {
        return Err(format!("{} turns but {} replies", case.turns.len(), case.replies.len()));
    }
    let mut env = plugin
        .text_env(&config_text(&case.config))
        .map_err(|e| format!("error: {e}"))?;
    let start = EpisodeStart {
        id: 0,
        group: 0,
        prompt: case.start.prompt.clone(),
        reference: case.start.reference.clone(),
        metadata: case.start.metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
        images: case.start.images.clone(),
    };
    env.reset(std::slice::from_ref(&start))
        .map_err(|e| format!("reset: {e}"))?;
    for (i, (content, expected)) in case.turns.iter().zip(&case.replies).enumerate() {
        let turn = Turn {
            id: 0,
            content: content.clone(),
        };
        let reply = env
            .step(std::slice::from_ref(&turn))
            .map_err(|e| format!("turn {}: {e}", i + 1))?
            .remove(0);
        let said: Vec<&str> = reply.messages.iter().map(|m| m.content.as_str()).collect();
        let wrong = |what: String| Err(format!("turn {}: {what} (reply: {said:?})", i + 1));
        if let Some(says) = &expected.says
            && !said.iter().any(|m| m.contains(says.as_str()))
        {
            return wrong(format!("expected a message containing {says:?}"));
        }
        if let Some(done) = expected.done
            && done != reply.done
        {
            return wrong(format!("expected done = {done}, got {}", reply.done));
        }
        if let Some(reward) = expected.reward
            && reward != reply.reward
        {
            return wrong(format!("expected the reward {reward:?}, got {:?}", reply.reward));
        }
        if let Some(images) = expected.images
            && images != reply.images.len()
        {
            return wrong(format!("expected {images} images, got {}", reply.images.len()));
        }
    }
    Ok(())
}
