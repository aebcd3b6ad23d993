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
//! A tree rollout also records each episode's [`Fork`]s: a copy of it right after each tool's
//! reply, which branches go on from ([`crate::rollout::episode_tree`]).
//!
//! A vision-language model is shown images: its prompts', a tool's result's (e.g. the crop a
//! "zoom" tool made; its `<image>` markers, or all its images before its text) and the text
//! environment's messages' (one `<image>` marker per image). Each is read within the image
//! limits, its place expanded to its tokens, and its features read once as the cache extends
//! ([`Session::append_with_images`]); the trainer reads the same images at the same tokens. A
//! tool's image that cannot be shown (undecodable, over a limit, markers that do not match, an
//! image token written as text) is an error message for the model, counted; an environment's
//! is an error naming the environment and the episode. A text model is shown no images.

use std::collections::BTreeMap;

use rein_core::{EpisodeStart, Image, TextEnv, Tool, ToolError, ToolErrorKind, Turn, count_markers};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, ChatMessage, LmTokenizer};
use rein_model::vision::ProcessedImage;
use rein_sampler::{
    AfterTurn, FinishReason, GenerationConfig, Prefill, PromptImages, Session, TurnOutput, prompt_seed,
};
use serde_json::json;

use crate::LmError;
use crate::rollout::tool_calls::{CLOSE, parse_tool_calls, unknown_tool};
use crate::rollout::transcript::Transcript;
use crate::{Prompt, PromptImageReader, opening_messages, stop_check, with_markers};

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
    /// A vision-language model's image reader: the images of prompts, tool results and the
    /// environment's messages are shown to the model, read within its limits. `None` for a
    /// text model.
    pub images: Option<PromptImageReader>,
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

/// What the tools or the environment add after a model's turn: messages, and the images they
/// show (one per `<image>` marker of their text, in order).
struct Reply {
    messages: Vec<ChatMessage>,
    images: Vec<ProcessedImage>,
}

/// The images `files` that `texts` show, read for the model: one `<image>` marker per image
/// over the texts, and no image token written as text. An error says what is wrong (the caller
/// names the plugin). A text model (no `reader`) is shown no images; its texts are only text.
fn show(reader: Option<&PromptImageReader>, texts: &[&str], files: &[Image]) -> Result<Vec<ProcessedImage>, String> {
    let Some(reader) = reader else {
        return match files.len() {
            0 => Ok(Vec::new()),
            count => Err(format!("{count} image(s), but the model reads no images")),
        };
    };
    if let Some(token) = texts.iter().find_map(|t| reader.processor.stray_image_token(t)) {
        return Err(format!("its text holds `{token}`, which only an image's place may"));
    }
    let markers = count_markers(texts.iter().copied());
    if markers != files.len() {
        return Err(format!("{markers} `<image>` markers for {} image(s)", files.len()));
    }
    reader.read_files(files)
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
    let ids: Vec<u64> = (0..(prompts.len() * n) as u64).map(|i| first_id + i).collect();
    let mut episodes = open(tokenizer, agent, prompts, n, &ids)?;
    run(model, tokenizer, agent, &mut episodes, config, first_id, device, None)?;
    Ok(episodes)
}

/// A point an episode may branch from (ARPO): right after a tool's reply, before the model's
/// next turn.
#[derive(Debug, Clone)]
pub struct Fork {
    /// The episode as it stood then: a branch goes on from a copy of it, the tool's reply
    /// already in its transcript.
    pub episode: Episode,
    /// The entropy of the model's first token after the reply, once sampled (with
    /// `config.certainty`): how unsure the reply left it.
    pub entropy: Option<f32>,
}

/// Plays opened `episodes` (episode `e` numbered `first_id + e` for the environment) to their
/// end, each from where its transcript stands: a fresh opening, or a [`Fork`]'s copy. With
/// `forks`, each episode's forks are recorded in its entry, in order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<B: ReinBackend>(
    model: &CausalLm<B>,
    tokenizer: &LmTokenizer,
    agent: &mut Agent,
    episodes: &mut [Episode],
    config: &GenerationConfig,
    first_id: u64,
    device: &B::Device,
    mut forks: Option<&mut [Vec<Fork>]>,
) -> Result<(), LmError> {
    let count = episodes.len();
    let ids: Vec<u64> = (0..count as u64).map(|i| first_id + i).collect();
    let mut session = start_session(model, tokenizer, episodes, config, device)?;
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
            if let Some(forks) = forks.as_deref_mut() {
                note_entropies(forks, &live, &outputs);
            }
            let mut replies: Vec<(usize, Reply)> = Vec::new();
            let mut to_env: Vec<(usize, String)> = Vec::new();
            let mut finished: Vec<usize> = Vec::new();
            for (&e, out) in live.iter().zip(outputs) {
                let episode = &mut episodes[e];
                let content = episode.push_turn(tokenizer, &out)?;
                if episode.used() >= agent.max_tokens {
                    episode.truncated = true;
                    finished.push(e);
                    continue;
                }
                // A turn cut at the turn's token limit still goes to the tools (an unclosed call
                // is an error for the model) or the environment.
                let calls = parse_tool_calls(&content);
                if !calls.is_empty() && !episode.offered.is_empty() {
                    let reply = episode.call_tools(&mut agent.tools, agent.images.as_ref(), calls);
                    replies.push((e, reply));
                } else if agent.env.is_some() {
                    to_env.push((e, content));
                } else {
                    // The final answer, or a turn cut short without one.
                    episode.truncated = out.finish == FinishReason::Length;
                    finished.push(e);
                }
            }
            let from_tools: Vec<usize> = replies.iter().map(|&(e, _)| e).collect();
            if let Some(env) = agent.env.as_deref_mut() {
                let turns: Vec<Turn> = (to_env.into_iter())
                    .map(|(e, content)| Turn { id: ids[e], content })
                    .collect();
                let reader = agent.images.as_ref();
                let replied = env_replies(env, reader, &turns, first_id, episodes, &mut finished)?;
                replies.extend(replied);
            }
            let appended = admit_replies(tokenizer, agent, replies, episodes, &mut finished)?;
            if let Some(forks) = forks.as_deref_mut() {
                for &(e, ..) in appended.iter().filter(|(e, ..)| from_tools.contains(e)) {
                    forks[e].push(Fork {
                        episode: episodes[e].clone(),
                        entropy: None,
                    });
                }
            }
            // Each addition's images: the last its transcript took in.
            let shown: Vec<&[ProcessedImage]> = (appended.iter())
                .map(|&(e, _, count)| {
                    let images = episodes[e].transcript.images();
                    &images[images.len() - count..]
                })
                .collect();
            let additions: Vec<(usize, Vec<u32>)> = appended.into_iter().map(|(e, tokens, _)| (e, tokens)).collect();
            session
                .append_with_images(&additions, &shown)
                .map_err(|e| LmError::Unsupported(format!("multi-turn episodes: {e}")))?;
            session.end(&finished);
            live.retain(|e| !finished.contains(e));
        }
        Ok::<(), LmError>(())
    })();
    if let Some(env) = agent.env.as_deref_mut() {
        env.close(&ids);
    }
    result?;
    for e in episodes {
        e.text = tokenizer.decode(&e.transcript.tokens()[e.transcript.prompt_len()..], true)?;
    }
    Ok(())
}

/// Each episode's fork awaiting the model's next turn (its last, until its entropy is known)
/// takes the entropy of that turn's first token.
fn note_entropies(forks: &mut [Vec<Fork>], live: &[usize], outputs: &[TurnOutput]) {
    for (&e, out) in live.iter().zip(outputs) {
        if let (Some(fork), Some(first)) = (forks[e].last_mut(), out.certainty.first())
            && fork.entropy.is_none()
        {
            fork.entropy = Some(first.entropy);
        }
    }
}

/// The session every episode's turns are decoded in, one sequence per episode drawing from
/// the stream of prompt `e` of `config.seed`. Each distinct opening (its tokens and images) is
/// prefilled once — a group's episodes usually open alike — its images read once, for a
/// vision-language model; the episodes that share it start from copies of its cache rows.
fn start_session<'m, B: ReinBackend>(
    model: &'m CausalLm<B>,
    tokenizer: &LmTokenizer,
    episodes: &[Episode],
    config: &GenerationConfig,
    device: &B::Device,
) -> Result<Session<'m, B>, LmError> {
    let mut openings: Vec<&Transcript> = Vec::new();
    let mut streams = Vec::with_capacity(episodes.len());
    for (e, episode) in episodes.iter().enumerate() {
        let t = &episode.transcript;
        let same = |o: &&Transcript| o.tokens() == t.tokens() && o.images() == t.images();
        let row = openings.iter().position(same).unwrap_or_else(|| {
            openings.push(t);
            openings.len() - 1
        });
        streams.push((row, prompt_seed(config.seed, e), 0));
    }
    let prompts: Vec<Vec<u32>> = openings.iter().map(|t| t.tokens().to_vec()).collect();
    let images: Vec<&[ProcessedImage]> = openings.iter().map(|t| t.images()).collect();
    let pad = tokenizer.pad_id().unwrap_or(0);
    let prefill = Prefill::of_streams(model, &prompts, &streams, config, pad, usize::MAX, device);
    let unusable = |e: String| LmError::Unsupported(format!("multi-turn episodes: {e}"));
    let prefill = match PromptImages::of_prompts(model.vision.as_ref(), &prompts, &images, device).map_err(unusable)? {
        Some(images) => prefill.with_images(images).map_err(unusable)?,
        None => prefill,
    };
    Ok(prefill.into_session())
}

/// The environment's replies to the model's turns `turns`: rewards, state keys and components
/// recorded on each episode; an episode the environment ends joins `finished`, the others'
/// messages are returned for their next turn.
fn env_replies(
    env: &mut dyn TextEnv,
    reader: Option<&PromptImageReader>,
    turns: &[Turn],
    first_id: u64,
    episodes: &mut [Episode],
    finished: &mut Vec<usize>,
) -> Result<Vec<(usize, Reply)>, LmError> {
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
        if reply.done {
            finished.push(e);
            continue;
        }
        let texts: Vec<&str> = reply.messages.iter().map(|m| m.content.as_str()).collect();
        let images = show(reader, &texts, &reply.images)
            .map_err(|e| unshowable(env.name(), &format!("its reply to episode {}", turn.id), e))?;
        let messages = reply.messages.into_iter().map(ChatMessage::from).collect();
        replies.push((e, Reply { messages, images }));
    }
    Ok(replies)
}

/// The error for images the text environment `env` gave in `what` that cannot be shown.
fn unshowable(env: &str, what: &str, error: String) -> LmError {
    LmError::Unsupported(format!("text environment `{env}`: {what} cannot be shown: {error}"))
}

/// Appends the tools' and environment's messages to their episodes' transcripts; returns, per
/// episode that goes on, the tokens its next turn starts from and how many images they show
/// (the last of its transcript's). An episode out of turns or tokens joins `finished`, truncated.
fn admit_replies(
    tokenizer: &LmTokenizer,
    agent: &Agent,
    replies: Vec<(usize, Reply)>,
    episodes: &mut [Episode],
    finished: &mut Vec<usize>,
) -> Result<Vec<(usize, Vec<u32>, usize)>, LmError> {
    let mut appended = Vec::with_capacity(replies.len());
    for (e, Reply { messages, images }) in replies {
        let episode = &mut episodes[e];
        if episode.turns >= agent.max_turns {
            episode.truncated = true;
            finished.push(e);
            continue;
        }
        let shown = images.len();
        let added = (episode.transcript)
            .push_env_messages_with_images(tokenizer, messages, images)?
            .to_vec();
        if episode.used() >= agent.max_tokens {
            episode.truncated = true;
            finished.push(e);
            continue;
        }
        appended.push((e, added, shown));
    }
    Ok(appended)
}

/// Opens every episode: from the environment's openings when there is one, else from the
/// prompt (after the system prompt, its images shown) with every tool offered.
pub(crate) fn open(
    tokenizer: &LmTokenizer,
    agent: &mut Agent,
    prompts: &[&Prompt],
    n: usize,
    ids: &[u64],
) -> Result<Vec<Episode>, LmError> {
    let all_tools: Vec<String> = agent.tools.iter().map(|t| t.spec().name.clone()).collect();
    let reader = agent.images.as_ref();
    let opened: Vec<(Vec<ChatMessage>, Vec<String>, Vec<ProcessedImage>)> = match agent.env.as_deref_mut() {
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
                    let texts: Vec<&str> = o.messages.iter().map(|m| m.content.as_str()).collect();
                    let images = show(reader, &texts, &o.images)
                        .map_err(|e| unshowable(env.name(), &format!("the opening of episode {}", start.id), e))?;
                    let messages = o.messages.into_iter().map(ChatMessage::from).collect();
                    Ok((messages, o.tools, images))
                })
                .collect::<Result<_, LmError>>()?
        }
        None => (0..prompts.len() * n)
            .map(|e| {
                let prompt = prompts[e / n];
                let text = match prompt.images.len() {
                    0 => prompt.text.clone(),
                    count => with_markers(&prompt.text, count).map_err(LmError::Unsupported)?,
                };
                let messages = opening_messages(&text, agent.system_prompt.as_deref());
                Ok((messages, all_tools.clone(), prompt.images.to_vec()))
            })
            .collect::<Result<_, LmError>>()?,
    };
    opened
        .into_iter()
        .map(|(messages, offered, images)| {
            if let Some(unknown) = offered.iter().find(|name| !all_tools.contains(name)) {
                return Err(LmError::Unsupported(format!(
                    "the text environment offers the tool `{unknown}`, which is not among the recipe's [[tool]]s ({})",
                    all_tools.join(", ")
                )));
            }
            let schemas = agent.schemas(Some(&offered));
            let transcript = match &agent.images {
                Some(reader) => Transcript::open_with_images(tokenizer, messages, schemas, &reader.processor, images)?,
                None => Transcript::open(tokenizer, messages, schemas)?,
            };
            Ok(Episode::opened(transcript, offered))
        })
        .collect()
}

impl Episode {
    /// An episode that has only its opening, offered the tools `offered`.
    pub(crate) fn opened(transcript: Transcript, offered: Vec<String>) -> Self {
        Self {
            transcript,
            turns: 0,
            tool_calls: 0,
            tool_errors: BTreeMap::new(),
            truncated: false,
            env_reward: None,
            env_components: BTreeMap::new(),
            text: String::new(),
            turn_log: Vec::new(),
            offered,
        }
    }

    /// Tokens after the opening.
    pub(crate) fn used(&self) -> usize {
        self.transcript.tokens().len() - self.transcript.prompt_len()
    }

    /// Takes in a model turn's tokens; returns its text.
    fn push_turn(&mut self, tokenizer: &LmTokenizer, out: &TurnOutput) -> Result<String, LmError> {
        self.turns += 1;
        let content = self.transcript.push_model_turn(tokenizer, &out.tokens, &out.logprobs)?;
        self.turn_log.push(TurnRecord {
            end: self.transcript.tokens().len(),
            reward: 0.0,
            state_after: None,
        });
        Ok(content)
    }

    /// Answers each of a turn's calls: a `tool` message with the result, or with the error the
    /// model is shown (malformed call, unknown tool, a failure inside the tool).
    fn call_tools(
        &mut self,
        tools: &mut [Box<dyn Tool>],
        reader: Option<&PromptImageReader>,
        calls: Vec<Result<crate::rollout::tool_calls::ToolCall, ToolError>>,
    ) -> Reply {
        let offered: Vec<&str> = self.offered.iter().map(String::as_str).collect();
        let mut images = Vec::new();
        let messages = calls
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
                let result = result.and_then(|output| {
                    let cannot = |e: String| {
                        ToolError::new(ToolErrorKind::Host, format!("the tool's output cannot be shown: {e}"))
                    };
                    let text = match (output.images.len(), reader) {
                        (0, _) | (_, None) => output.text,
                        (count, Some(_)) => with_markers(&output.text, count).map_err(cannot)?,
                    };
                    Ok((show(reader, &[&text], &output.images).map_err(cannot)?, text))
                });
                let content = match result {
                    Ok((shown, text)) => {
                        images.extend(shown);
                        text
                    }
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
            .collect();
        Reply { messages, images }
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
        let transcript = Transcript::open(&tokenizer, vec![user], Vec::new()).unwrap();
        Episode {
            turns: 1,
            ..Episode::opened(transcript, offered.iter().map(|s| s.to_string()).collect())
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
        let Reply { messages, images } = episode.call_tools(&mut tools, None, parse_tool_calls(turn));
        assert!(images.is_empty());
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
            "error: the tool's output cannot be shown: 1 image(s), but the model reads no images"
        );
        assert!(contents[5].contains("not closed"), "{}", contents[5]);
        assert_eq!(episode.tool_calls, 6);
        let expected: BTreeMap<&str, usize> =
            [("host", 1), ("malformed", 2), ("timeout", 1), ("unknown_tool", 1)].into();
        assert_eq!(episode.tool_errors, expected);
    }

    /// Returns what its arguments say: `{"text": …, "images": [file names]}`.
    struct Camera(ToolSpec);

    impl Tool for Camera {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        fn call(&mut self, arguments: &str) -> Result<ToolOutput, ToolError> {
            let args: serde_json::Value = serde_json::from_str(arguments).unwrap();
            let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vlm/images");
            let images = (args["images"].as_array().unwrap().iter())
                .map(|name| match name.as_str().unwrap() {
                    "broken.png" => rein_core::Image::new(b"\x89PNG\r\n\x1a\nbroken".to_vec()).unwrap(),
                    name => rein_core::Image::new(std::fs::read(fixtures.join(name)).unwrap()).unwrap(),
                })
                .collect();
            Ok(ToolOutput {
                text: args["text"].as_str().unwrap().into(),
                images,
            })
        }
    }

    /// A vision-language model is shown a tool's images: all before its text when it marks
    /// none, where it marks them otherwise. An image that cannot be decoded or is over the
    /// limits, markers that do not match the images, or Qwen2-VL's image token written as text
    /// are error messages for the model, counted, and show nothing.
    #[test]
    fn a_tools_images_are_shown_to_a_vision_language_model_or_refused_to_it() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vlm/qwen2_vl_model");
        let model: CausalLm<burn::backend::Flex> = rein_model::lm::load(&dir, &Default::default()).unwrap();
        let mut reader = PromptImageReader::load(&dir, model.vision.as_ref().unwrap()).unwrap();
        reader.limits.max_pixels = 1_000;
        let spec = ToolSpec {
            name: "camera".into(),
            description: "shows".into(),
            parameters: "{}".into(),
        };
        let mut tools: Vec<Box<dyn Tool>> = vec![Box::new(Camera(spec))];
        let mut episode = playing(&["camera"]);
        let call = |text: &str, images: &[&str]| {
            let arguments = json!({"text": text, "images": images});
            format!(r#"<tool_call>{{"name": "camera", "arguments": {arguments}}}</tool_call>"#)
        };
        let turn = [
            call("a crop", &["grey.png"]),
            call("left <image> right <image>", &["grey.png", "small_rgba.png"]),
            call("one <image>", &["grey.png", "grey.png"]),
            call("no image <image>", &[]),
            call("text <|image_pad|>", &[]),
            call("bad", &["broken.png"]),
            call("large", &["wide.png", "tall.png"]),
        ]
        .concat();
        let Reply { messages, images } = episode.call_tools(&mut tools, Some(&reader), parse_tool_calls(&turn));
        let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(contents[0], "<image>a crop");
        assert_eq!(contents[1], "left <image> right <image>");
        assert_eq!(images.len(), 3, "the shown images, in order");
        let refused = [
            "1 `<image>` markers for 2 images",
            "1 `<image>` markers for 0 image(s)",
            "holds `<|image_pad|>`, which only an image's place may",
            "image 0 (image/png)",
            "image 1 (image/png): the image is 31x50 pixels, over the limit of 1000 pixels",
        ];
        for (content, reason) in contents[2..].iter().zip(refused) {
            assert!(
                content.starts_with("error: the tool's output cannot be shown: ") && content.contains(reason),
                "{content}"
            );
        }
        assert_eq!(episode.tool_errors, [("host", 5)].into());
    }
}
