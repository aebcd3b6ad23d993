//! Multi-turn episodes: the model's turns alternate with tool results or a text environment's
//! messages, every live episode of a batch decoded together, each keeping its KV cache across
//! turns ([`rein_sampler::Session`]).
//!
//! A turn ends at the end-of-turn token, a tool call's close tag or the turn's token limit.
//! Tool calls (Hermes format, [`crate::rollout::tool_calls`]) are answered by the tool plugins, each
//! result or error a `tool` message for the model; a turn without a call goes to the text
//! environment, if there is one, or else ends the episode (its final answer). Episodes also end
//! when the environment says done, after `max_turns` model turns, or when their tokens after
//! the prompt reach `max_tokens`; the limits, and a final turn cut at the turn's token limit,
//! count as truncations.
//!
//! Tokens in, tokens out: each episode is a [`Transcript`] of the ids the model sampled and the
//! ids the template adds for the environment's messages, which the cache extends as they are.

use std::collections::BTreeMap;

use rein_core::{EpisodeStart, TextEnv, Tool, ToolError, ToolErrorKind, Turn};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, ChatMessage, LmTokenizer};
use rein_sampler::{AfterTurn, FinishReason, GenerationConfig, Session};
use serde_json::json;

use crate::LmError;
use crate::rollout::tool_calls::{CLOSE, parse_tool_calls, unknown_tool};
use crate::rollout::transcript::Transcript;
use crate::{Prompt, opening_messages, stop_check};

/// What episodes may use and how long they may last.
pub struct Agent {
    /// The tools the model may call.
    pub tools: Vec<Box<dyn Tool>>,
    /// The text environment that opens episodes and answers turns without tool calls.
    pub env: Option<Box<dyn TextEnv>>,
    /// Most model turns per episode.
    pub max_turns: usize,
    /// Most tokens per episode after its opening.
    pub max_tokens: usize,
    /// The system message before each prompt, without an environment (the data's).
    pub system_prompt: Option<String>,
}

impl Agent {
    /// The tools as chat templates take them (OpenAI function schemas).
    pub fn schemas(&self, names: Option<&[String]>) -> Vec<serde_json::Value> {
        self.tools
            .iter()
            .map(|t| t.spec())
            .filter(|spec| names.is_none_or(|names| names.contains(&spec.name)))
            .map(|spec| {
                let parameters: serde_json::Value = serde_json::from_str(&spec.parameters).unwrap_or(json!({}));
                json!({"type": "function", "function": {
                    "name": spec.name, "description": spec.description, "parameters": parameters,
                }})
            })
            .collect()
    }
}

/// How one episode went.
#[derive(Debug, Clone)]
pub struct Episode {
    /// Its tokens, which of them the model sampled, their log-probabilities.
    pub transcript: Transcript,
    /// Model turns.
    pub turns: usize,
    /// Tool calls the model wrote (well-formed or not).
    pub tool_calls: usize,
    /// Tool calls that came back as errors, by [`rein_core::ToolErrorKind`] name.
    pub tool_errors: BTreeMap<&'static str, usize>,
    /// It hit `max_turns`, `max_tokens` or a turn's token limit before finishing.
    pub truncated: bool,
    /// The environment's rewards, summed over its replies (`None` without an environment or
    /// when it gave none).
    pub env_reward: Option<f64>,
    /// The environment's reward components, summed.
    pub env_components: BTreeMap<String, f64>,
    /// Everything after the opening as text, special tokens left out: what reward plugins
    /// score (filled in once the episode is over).
    pub text: String,
    /// Each model turn: where its tokens end, what the environment gave for it.
    pub turn_log: Vec<TurnRecord>,
    /// The tools it offers.
    offered: Vec<String>,
}

/// One model turn of an episode, for GiGPO's step-level groups.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    /// The transcript's length once the model's tokens of this turn were in.
    pub end: usize,
    /// The environment's reward for this turn (0 when none).
    pub reward: f64,
    /// The environment's state key after this turn, when it gave one.
    pub state_after: Option<String>,
}

/// Plays `config.n` episodes of each prompt (episode `i * n + j` is sample `j` of prompt `i`),
/// `config.max_new_tokens` tokens at most per turn. `first_id` numbers the episodes for the
/// environment (ids must not repeat within a run).
pub fn play<B: ReinBackend>(
    model: &CausalLm<B>,
    tokenizer: &LmTokenizer,
    agent: &mut Agent,
    prompts: &[&Prompt],
    config: &GenerationConfig,
    first_id: u64,
    device: &B::Device,
) -> Result<Vec<Episode>, LmError> {
    let n = config.n.max(1);
    let count = prompts.len() * n;
    let ids: Vec<u64> = (0..count as u64).map(|i| first_id + i).collect();
    let mut episodes = open(tokenizer, agent, prompts, n, &ids)?;
    let prompts: Vec<Vec<u32>> = episodes.iter().map(|e| e.transcript.tokens().to_vec()).collect();
    let per_episode = GenerationConfig { n: 1, ..config.clone() };
    let pad = tokenizer.pad_id().unwrap_or(0);
    let mut session = Session::start(model, &prompts, &per_episode, pad, device);
    let mut live: Vec<usize> = (0..count).collect();
    let close = [CLOSE.to_string()];
    let mut closes_call = stop_check(tokenizer, &close);
    let result = (|| {
        while !live.is_empty() {
            let remaining: Vec<usize> = (0..count)
                .map(|e| agent.max_tokens.saturating_sub(episodes[e].used()))
                .collect();
            let mut stop = |seq: usize, tokens: &[u32]| tokens.len() >= remaining[seq] || closes_call(seq, tokens);
            let outputs = session.turn(&live, AfterTurn::Keep, &mut stop);
            let mut replies: Vec<(usize, Vec<ChatMessage>)> = Vec::new();
            let mut to_env: Vec<(usize, String)> = Vec::new();
            let mut finished: Vec<usize> = Vec::new();
            for (&e, out) in live.iter().zip(outputs) {
                let episode = &mut episodes[e];
                episode.turns += 1;
                let content = episode
                    .transcript
                    .push_model_turn(tokenizer, &out.tokens, &out.logprobs)?;
                episode.turn_log.push(TurnRecord {
                    end: episode.transcript.tokens().len(),
                    reward: 0.0,
                    state_after: None,
                });
                if episode.used() >= agent.max_tokens {
                    episode.truncated = true;
                    finished.push(e);
                    continue;
                }
                // A turn cut at the turn's token limit still goes to the tools (an unclosed call
                // is an error for the model) or the environment.
                let calls = parse_tool_calls(&content);
                if !calls.is_empty() && !episode.offered.is_empty() {
                    let messages = episode.call_tools(&mut agent.tools, calls);
                    replies.push((e, messages));
                } else if agent.env.is_some() {
                    to_env.push((e, content));
                } else {
                    // The final answer, or a turn cut short without one.
                    episode.truncated = out.finish == FinishReason::Length;
                    finished.push(e);
                }
            }
            if let Some(env) = agent.env.as_deref_mut() {
                let turns: Vec<Turn> = (to_env.into_iter())
                    .map(|(e, content)| Turn { id: ids[e], content })
                    .collect();
                let replied = env_replies(env, &turns, first_id, &mut episodes, &mut finished)?;
                replies.extend(replied);
            }
            let additions = admit_replies(tokenizer, agent, replies, &mut episodes, &mut finished)?;
            session.append(&additions);
            session.end(&finished);
            live.retain(|e| !finished.contains(e));
        }
        Ok::<(), LmError>(())
    })();
    if let Some(env) = agent.env.as_deref_mut() {
        env.close(&ids);
    }
    result?;
    for e in &mut episodes {
        e.text = tokenizer.decode(&e.transcript.tokens()[e.transcript.prompt_len()..], true)?;
    }
    Ok(episodes)
}

/// The environment's replies to the model's turns `turns`: rewards, state keys and components
/// recorded on each episode; an episode the environment ends joins `finished`, the others'
/// messages are returned for their next turn.
fn env_replies(
    env: &mut dyn TextEnv,
    turns: &[Turn],
    first_id: u64,
    episodes: &mut [Episode],
    finished: &mut Vec<usize>,
) -> Result<Vec<(usize, Vec<ChatMessage>)>, LmError> {
    let mut replies = Vec::new();
    if turns.is_empty() {
        return Ok(replies);
    }
    for (turn, reply) in turns.iter().zip(env.step(turns)?) {
        let e = (turn.id - first_id) as usize;
        let episode = &mut episodes[e];
        if let Some(reward) = reply.reward {
            *episode.env_reward.get_or_insert(0.0) += reward;
        }
        if let Some(turn) = episode.turn_log.last_mut() {
            turn.reward = reply.reward.unwrap_or(0.0);
            turn.state_after = reply.state_key;
        }
        for (name, value) in reply.components {
            *episode.env_components.entry(name).or_default() += value;
        }
        refuse_images(
            env.name(),
            &format!("its reply to episode {}", turn.id),
            reply.images.len(),
        )?;
        match reply.done {
            true => finished.push(e),
            false => replies.push((e, reply.messages.into_iter().map(ChatMessage::from).collect())),
        }
    }
    Ok(replies)
}

/// Refuses `count` images from the text environment `env` (in `what`): an episode is a
/// conversation of text, so the model could not see them.
fn refuse_images(env: &str, what: &str, count: usize) -> Result<(), LmError> {
    match count {
        0 => Ok(()),
        _ => Err(LmError::Unsupported(format!(
            "text environment `{env}` returned {count} image(s) in {what}, but multi-turn episodes are \
             conversations of text: the model would not see them"
        ))),
    }
}

/// Appends the tools' and environment's messages to their episodes' transcripts; returns the
/// tokens each episode's next turn starts from. An episode out of turns or tokens joins
/// `finished`, truncated.
fn admit_replies(
    tokenizer: &LmTokenizer,
    agent: &Agent,
    replies: Vec<(usize, Vec<ChatMessage>)>,
    episodes: &mut [Episode],
    finished: &mut Vec<usize>,
) -> Result<Vec<(usize, Vec<u32>)>, LmError> {
    let mut additions = Vec::with_capacity(replies.len());
    for (e, messages) in replies {
        let episode = &mut episodes[e];
        if episode.turns >= agent.max_turns {
            episode.truncated = true;
            finished.push(e);
            continue;
        }
        let added = episode.transcript.push_env_messages(tokenizer, messages)?.to_vec();
        if episode.used() >= agent.max_tokens {
            episode.truncated = true;
            finished.push(e);
            continue;
        }
        additions.push((e, added));
    }
    Ok(additions)
}

/// Opens every episode: from the environment's openings when there is one, else from the
/// prompt (after the system prompt) with every tool offered.
fn open(
    tokenizer: &LmTokenizer,
    agent: &mut Agent,
    prompts: &[&Prompt],
    n: usize,
    ids: &[u64],
) -> Result<Vec<Episode>, LmError> {
    let all_tools: Vec<String> = agent.tools.iter().map(|t| t.spec().name.clone()).collect();
    let opened: Vec<(Vec<ChatMessage>, Vec<String>)> = match agent.env.as_deref_mut() {
        Some(env) => {
            let starts: Vec<EpisodeStart> = (0..prompts.len() * n)
                .map(|e| {
                    let p = prompts[e / n];
                    EpisodeStart {
                        id: ids[e],
                        group: (e / n) as u32,
                        prompt: p.text.clone(),
                        reference: p.answer.clone(),
                        metadata: p.metadata.clone(),
                        images: p.image_files.to_vec(),
                    }
                })
                .collect();
            let from_env = env.reset(&starts)?;
            (from_env.into_iter().zip(&starts))
                .map(|(o, start)| {
                    refuse_images(
                        env.name(),
                        &format!("the opening of episode {}", start.id),
                        o.images.len(),
                    )?;
                    Ok((o.messages.into_iter().map(ChatMessage::from).collect(), o.tools))
                })
                .collect::<Result<_, LmError>>()?
        }
        None => (0..prompts.len() * n)
            .map(|e| {
                let messages = opening_messages(&prompts[e / n].text, agent.system_prompt.as_deref());
                (messages, all_tools.clone())
            })
            .collect(),
    };
    opened
        .into_iter()
        .map(|(messages, offered)| {
            if let Some(unknown) = offered.iter().find(|name| !all_tools.contains(name)) {
                return Err(LmError::Unsupported(format!(
                    "the text environment offers the tool `{unknown}`, which is not among the recipe's [[tool]]s ({})",
                    all_tools.join(", ")
                )));
            }
            let schemas = agent.schemas(Some(&offered));
            Ok(Episode {
                transcript: Transcript::open(tokenizer, messages, schemas)?,
                turns: 0,
                tool_calls: 0,
                tool_errors: BTreeMap::new(),
                truncated: false,
                env_reward: None,
                env_components: BTreeMap::new(),
                text: String::new(),
                turn_log: Vec::new(),
                offered,
            })
        })
        .collect()
}

impl Episode {
    /// Tokens after the opening.
    fn used(&self) -> usize {
        self.transcript.tokens().len() - self.transcript.prompt_len()
    }

    /// Answers each of a turn's calls: a `tool` message with the result, or with the error the
    /// model is shown (malformed call, unknown tool, a failure inside the tool).
    fn call_tools(
        &mut self,
        tools: &mut [Box<dyn Tool>],
        calls: Vec<Result<crate::rollout::tool_calls::ToolCall, ToolError>>,
    ) -> Vec<ChatMessage> {
        let offered: Vec<&str> = self.offered.iter().map(String::as_str).collect();
        calls
            .into_iter()
            .map(|call| {
                self.tool_calls += 1;
                let result = call.and_then(|call| {
                    match (tools.iter_mut())
                        .find(|t| t.spec().name == call.name && offered.contains(&call.name.as_str()))
                    {
                        Some(tool) => tool.call(&call.arguments),
                        None => Err(unknown_tool(&call.name, &offered)),
                    }
                });
                let result = result.and_then(|output| match output.images.len() {
                    0 => Ok(output.text),
                    count => Err(ToolError::new(
                        ToolErrorKind::Host,
                        format!(
                            "the tool's output holds {count} image(s), which this conversation of text cannot show"
                        ),
                    )),
                });
                let content = match result {
                    Ok(output) => output,
                    Err(error) => {
                        *self.tool_errors.entry(error.kind.as_str()).or_default() += 1;
                        format!("error: {}", error.message)
                    }
                };
                ChatMessage {
                    role: "tool".into(),
                    content,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{ToolOutput, ToolSpec};

    use super::*;

    /// Adds two numbers, or draws (`{"draw": true}`: an image); bad numbers stand for a trap
    /// the sandbox turned into an error.
    struct Adder(ToolSpec);

    impl Tool for Adder {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        fn call(&mut self, arguments: &str) -> Result<ToolOutput, ToolError> {
            let args: serde_json::Value = serde_json::from_str(arguments).unwrap();
            if args["draw"] == true {
                let png = rein_core::Image::new(b"\x89PNG\r\n\x1a\n".to_vec()).unwrap();
                return Ok(ToolOutput {
                    text: "<image>".into(),
                    images: vec![png],
                });
            }
            match (args["a"].as_i64(), args["b"].as_i64()) {
                (Some(a), Some(b)) => Ok((a + b).to_string().into()),
                _ => Err(ToolError::new(
                    ToolErrorKind::Timeout,
                    "execution timed out after 1000 ms",
                )),
            }
        }
    }

    fn playing(offered: &[&str]) -> Episode {
        let tokenizer = LmTokenizer::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer"),
            &[],
        )
        .unwrap();
        let user = ChatMessage {
            role: "user".into(),
            content: "1+2?".into(),
        };
        Episode {
            transcript: Transcript::open(&tokenizer, vec![user], Vec::new()).unwrap(),
            turns: 1,
            tool_calls: 0,
            tool_errors: BTreeMap::new(),
            truncated: false,
            env_reward: None,
            env_components: BTreeMap::new(),
            text: String::new(),
            turn_log: Vec::new(),
            offered: offered.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Malformed calls, unknown tools, failures inside a tool and images the model cannot see
    /// all come back as `tool` messages for the model, counted by kind; the well-formed call in
    /// the same turn still runs.
    #[test]
    fn every_bad_call_becomes_a_message_for_the_model() {
        let spec = |name: &str| ToolSpec {
            name: name.into(),
            description: "adds".into(),
            parameters: "{}".into(),
        };
        let mut tools: Vec<Box<dyn Tool>> = vec![Box::new(Adder(spec("add"))), Box::new(Adder(spec("hidden")))];
        let mut episode = playing(&["add"]);
        let turn = r#"<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>
            <tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>
            <tool_call>{"name": "hidden", "arguments": {}}</tool_call>
            <tool_call>{name: add}</tool_call>
            <tool_call>{"name": "add", "arguments": {"draw": true}}</tool_call>
            <tool_call>{"name": "add""#;
        let messages = episode.call_tools(&mut tools, parse_tool_calls(turn));
        let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        assert!(messages.iter().all(|m| m.role == "tool"));
        assert_eq!(contents[0], "3");
        assert_eq!(contents[1], "error: execution timed out after 1000 ms");
        assert_eq!(contents[2], "error: unknown tool `hidden` (available: add)");
        assert!(
            contents[3].starts_with("error: the tool call is not valid JSON"),
            "{}",
            contents[3]
        );
        // A text model cannot be shown a tool's images.
        assert_eq!(
            contents[4],
            "error: the tool's output holds 1 image(s), which this conversation of text cannot show"
        );
        assert!(contents[5].contains("not closed"), "{}", contents[5]);
        assert_eq!(episode.tool_calls, 6);
        let expected: BTreeMap<&str, usize> =
            [("host", 1), ("malformed", 2), ("timeout", 1), ("unknown_tool", 1)].into();
        assert_eq!(episode.tool_errors, expected);
    }
}
