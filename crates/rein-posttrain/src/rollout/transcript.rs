//! A multi-turn episode as token ids: tokens in, tokens out.
//!
//! The model's turns are kept as the exact ids it sampled, with their sampling-time
//! log-probabilities; nothing it generated is decoded and re-tokenised for training (the drift
//! TRL #5224 and verl #6719 report). What the environment adds (tool results, user turns, the
//! next turn's header) is appended as the text the chat template adds after the model's turn,
//! tokenised alone, and masked out of the loss.
//!
//! Appending that text is only right when the template renders each turn as an extension of the
//! conversation before it. Templates that rewrite earlier turns (Qwen3's drops earlier
//! `<think>` blocks) break this; [`check_template_extends_prefixes`] finds out at start-up, and
//! [`Transcript::push_env_messages`] refuses an episode whose rendering drifted.
//!
//! A vision-language model's transcript ([`Transcript::open_with_images`]) also holds the images
//! its messages show: each message is rendered as content parts (an image part per `<image>`
//! marker, as its chat template reads images), and each image's place in the rendered text is
//! expanded to the image's tokens by the model's image processor before it is tokenised. The
//! model's own turns are text: an `<image>` it writes stays text.

use rein_model::lm::{ChatMessage, LmTokenizer, LoadError};
use rein_model::vision::{ImageProcessor, ProcessedImage};

/// Why a transcript cannot be extended.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    /// The tokenizer has no chat template to render turns with.
    #[error("the tokenizer has no chat template; multi-turn episodes need one (tokenizer_config.json `chat_template`)")]
    NoTemplate,
    /// The template rendered an earlier part of the conversation differently once a turn was
    /// added.
    #[error(
        "the chat template does not extend the conversation's prefix unchanged at message {message} \
         ({role}): where it rendered {expected:?} it now renders {found:?}; multi-turn training needs a \
         template that leaves earlier turns as they were (templates that drop earlier <think> blocks do not)"
    )]
    TemplateDrift {
        /// The message after which the prefix changed (1-based).
        message: usize,
        /// Its role.
        role: String,
        /// What was rendered before, from where the two part.
        expected: String,
        /// What is rendered there now.
        found: String,
    },
    /// Tokenising or decoding failed.
    #[error(transparent)]
    Tokenizer(#[from] LoadError),
    /// Messages' images the transcript cannot show: the model reads no images, or the
    /// messages' image markers do not match their images.
    #[error("{0}")]
    Images(String),
}

/// One episode's tokens, which of them the model sampled, and the conversation as text.
#[derive(Debug, Clone)]
pub struct Transcript {
    tokens: Vec<u32>,
    sampled: Vec<bool>,
    log_probs: Vec<f32>,
    prompt_len: usize,
    messages: Vec<ChatMessage>,
    /// The tools offered, as the template takes them.
    tools: Vec<serde_json::Value>,
    /// The template's rendering of `messages` with the generation prompt, then the model's
    /// pending turn as decoded: what `tokens` stands for.
    rendered: String,
    /// The model's last turn, decoded with special tokens, not yet followed by the
    /// environment's messages.
    pending: Option<String>,
    eos_token: Option<String>,
    /// A vision-language model's: the images shown so far, in order, and the processor that
    /// expands their places in the text.
    vision: Option<ShownImages>,
}

/// The images a vision-language model's transcript has shown.
#[derive(Debug, Clone)]
struct ShownImages {
    processor: ImageProcessor,
    images: Vec<ProcessedImage>,
}

/// `messages` rendered by the chat template, as content parts when `parts` (a vision-language
/// model's template; the model's turns one text part each).
fn render(
    tokenizer: &LmTokenizer,
    messages: &[ChatMessage],
    tools: &[serde_json::Value],
    generation_prompt: bool,
    parts: bool,
) -> Result<String, TranscriptError> {
    let rendered = match parts {
        false => tokenizer.apply_chat_template_with_tools(messages, tools, generation_prompt)?,
        true => {
            let messages: Vec<serde_json::Value> = (messages.iter())
                .map(|m| match m.role.as_str() {
                    "assistant" => serde_json::json!({
                        "role": "assistant", "content": [{"type": "text", "text": m.content}],
                    }),
                    role => crate::message_parts(role, &m.content),
                })
                .collect();
            tokenizer.apply_chat_template_to_json(&messages, tools, generation_prompt)?
        }
    };
    rendered.ok_or(TranscriptError::NoTemplate)
}

/// The error for a rendering `after` that does not start with `before`: 40 characters of each
/// from a little before where they part.
fn drift(message: usize, role: &str, before: &str, after: &str) -> TranscriptError {
    let common = before.bytes().zip(after.bytes()).take_while(|(a, b)| a == b).count();
    let excerpt = |text: &str| {
        let from = (0..=common.saturating_sub(8))
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text[from..].chars().take(40).collect()
    };
    TranscriptError::TemplateDrift {
        message,
        role: role.to_string(),
        expected: excerpt(before),
        found: excerpt(after),
    }
}

impl Transcript {
    /// An episode opening with `messages` and offering `tools` (OpenAI function schemas),
    /// rendered with the generation prompt; all of it is prompt (no loss).
    pub fn open(
        tokenizer: &LmTokenizer,
        messages: Vec<ChatMessage>,
        tools: Vec<serde_json::Value>,
    ) -> Result<Self, TranscriptError> {
        Self::opening(tokenizer, messages, tools, None, Vec::new())
    }

    /// [`Transcript::open`] for a vision-language model whose image processor is `processor`,
    /// the messages showing `images` (one per `<image>` marker of their text, in order); an
    /// error when the markers and the images disagree.
    pub fn open_with_images(
        tokenizer: &LmTokenizer,
        messages: Vec<ChatMessage>,
        tools: Vec<serde_json::Value>,
        processor: &ImageProcessor,
        images: Vec<ProcessedImage>,
    ) -> Result<Self, TranscriptError> {
        Self::opening(tokenizer, messages, tools, Some(processor), images)
    }

    fn opening(
        tokenizer: &LmTokenizer,
        messages: Vec<ChatMessage>,
        tools: Vec<serde_json::Value>,
        processor: Option<&ImageProcessor>,
        images: Vec<ProcessedImage>,
    ) -> Result<Self, TranscriptError> {
        let rendered = render(tokenizer, &messages, &tools, true, processor.is_some())?;
        let eos_token = (tokenizer.eos_ids().first())
            .map(|&id| tokenizer.decode(&[id], false))
            .transpose()?;
        let mut transcript = Self {
            tokens: Vec::new(),
            sampled: Vec::new(),
            log_probs: Vec::new(),
            prompt_len: 0,
            messages,
            tools,
            rendered: rendered.clone(),
            pending: None,
            eos_token,
            vision: processor.map(|processor| ShownImages {
                processor: processor.clone(),
                images: Vec::new(),
            }),
        };
        transcript.tokens = transcript.encode_shown(tokenizer, &rendered, images)?;
        transcript.prompt_len = transcript.tokens.len();
        transcript.sampled = vec![false; transcript.prompt_len];
        transcript.log_probs = vec![0.0; transcript.prompt_len];
        Ok(transcript)
    }

    /// The ids of `text`, which shows `images` (a vision-language model's transcript: each
    /// image's place expanded to its tokens; the images join those shown); an error when the
    /// transcript cannot show them.
    fn encode_shown(
        &mut self,
        tokenizer: &LmTokenizer,
        text: &str,
        images: Vec<ProcessedImage>,
    ) -> Result<Vec<u32>, TranscriptError> {
        let Some(vision) = &mut self.vision else {
            return match images.len() {
                0 => Ok(tokenizer.encode(text)?),
                count => Err(TranscriptError::Images(format!(
                    "{count} image(s) for a model that reads no images"
                ))),
            };
        };
        let expanded = (vision.processor)
            .expand_prompt(text, &images)
            .map_err(TranscriptError::Images)?;
        vision.images.extend(images);
        Ok(tokenizer.encode(&expanded)?)
    }

    /// Appends a turn the model sampled: its ids exactly, with their log-probabilities. Returns
    /// the turn's text without the end-of-turn token (what tool-call parsing and the
    /// environment read).
    pub fn push_model_turn(
        &mut self,
        tokenizer: &LmTokenizer,
        ids: &[u32],
        log_probs: &[f32],
    ) -> Result<String, TranscriptError> {
        assert_eq!(ids.len(), log_probs.len(), "one log-probability per sampled token");
        let raw = tokenizer.decode(ids, false)?;
        self.tokens.extend_from_slice(ids);
        self.sampled.extend(std::iter::repeat_n(true, ids.len()));
        self.log_probs.extend_from_slice(log_probs);
        let pending = self.pending.get_or_insert_with(String::new);
        pending.push_str(&raw);
        let pending = pending.clone();
        Ok(self.content(&pending))
    }

    /// The model's text without a trailing end-of-turn token.
    fn content(&self, raw: &str) -> String {
        let eos = self.eos_token.as_deref().unwrap_or_default();
        match raw.strip_suffix(eos).filter(|_| !eos.is_empty()) {
            Some(content) => content.to_string(),
            None => raw.to_string(),
        }
    }

    /// Appends the environment's `messages` after the model's last turn: the text the chat
    /// template adds (closing the model's turn, the messages, the next turn's header), tokenised
    /// alone and masked out of the loss. Returns the ids appended.
    pub fn push_env_messages(
        &mut self,
        tokenizer: &LmTokenizer,
        messages: Vec<ChatMessage>,
    ) -> Result<&[u32], TranscriptError> {
        self.push_env_messages_with_images(tokenizer, messages, Vec::new())
    }

    /// [`Transcript::push_env_messages`] where the messages show `images` (one per `<image>`
    /// marker of their text, in order; a vision-language model's transcript only); an error,
    /// before anything is appended, when they cannot be shown.
    pub fn push_env_messages_with_images(
        &mut self,
        tokenizer: &LmTokenizer,
        messages: Vec<ChatMessage>,
        images: Vec<ProcessedImage>,
    ) -> Result<&[u32], TranscriptError> {
        let raw = self.pending.clone().unwrap_or_default();
        let prefix = format!("{}{raw}", self.rendered);
        let assistant = ChatMessage {
            role: "assistant".into(),
            content: self.content(&raw),
        };
        let turn = self.messages.len() + 1;
        let mut conversation = self.messages.clone();
        conversation.push(assistant);
        conversation.extend(messages);
        let full = render(tokenizer, &conversation, &self.tools, true, self.vision.is_some())?;
        let Some(added) = full.strip_prefix(prefix.as_str()) else {
            return Err(drift(turn, "assistant", &prefix, &full));
        };
        let ids = self.encode_shown(tokenizer, added, images)?;
        self.pending = None;
        self.messages = conversation;
        let start = self.tokens.len();
        self.sampled.extend(std::iter::repeat_n(false, ids.len()));
        self.log_probs.extend(std::iter::repeat_n(0.0, ids.len()));
        self.tokens.extend(ids);
        self.rendered = full;
        Ok(&self.tokens[start..])
    }

    /// Every token, prompt included.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether the model sampled each token: the loss mask.
    pub fn sampled(&self) -> &[bool] {
        &self.sampled
    }

    /// The sampling-time log-probability of each token (0 where not sampled).
    pub fn log_probs(&self) -> &[f32] {
        &self.log_probs
    }

    /// The images the transcript shows, in order (a vision-language model's; empty otherwise).
    pub fn images(&self) -> &[ProcessedImage] {
        self.vision.as_ref().map_or(&[], |v| &v.images)
    }

    /// Tokens of the opening prompt.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// The conversation as messages (the model's pending turn not included).
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The share of the tokens after the prompt that the environment added.
    pub fn env_token_share(&self) -> f64 {
        let after = &self.sampled[self.prompt_len..];
        match after.len() {
            0 => 0.0,
            n => after.iter().filter(|&&s| !s).count() as f64 / n as f64,
        }
    }
}

/// Checks at start-up that `tokenizer`'s chat template renders every turn of a sample agent
/// conversation (system, user, an assistant turn with a `<think>` block and a tool call, a
/// tool result, a final assistant turn) as an extension of the conversation before it; as
/// content parts for a vision-language model (`parts`).
pub fn check_template_extends_prefixes(tokenizer: &LmTokenizer, parts: bool) -> Result<(), TranscriptError> {
    let message = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
    };
    let conversation = [
        message("system", "You can use tools."),
        message("user", "What is 12 * 34?"),
        message(
            "assistant",
            "<think>I should compute it.</think>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call>",
        ),
        message("tool", "408"),
        message("assistant", "<think>The tool says 408.</think>\n<answer>408</answer>"),
    ];
    for k in 1..conversation.len() {
        let next_is_model = conversation[k].role == "assistant";
        let before = render(tokenizer, &conversation[..k], &[], next_is_model, parts)?;
        let after = render(tokenizer, &conversation[..=k], &[], false, parts)?;
        if !after.starts_with(&before) {
            return Err(drift(k + 1, &conversation[k].role, &before, &after));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use proptest::prelude::*;

    use super::*;

    fn assets() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer")
    }

    /// The tiny ChatML tokenizer of the default recipe.
    fn chatml() -> LmTokenizer {
        LmTokenizer::load(&assets(), &[]).unwrap()
    }

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn chatml_extends_every_prefix() {
        check_template_extends_prefixes(&chatml(), false).unwrap();
    }

    #[test]
    fn a_template_that_drops_earlier_thinking_is_refused_naming_the_turn() {
        let dir = std::env::temp_dir().join(format!("rein-drop-think-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(assets().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
        // Qwen3's habit: an assistant turn before the last loses its <think> block.
        let template = "{% for message in messages %}{% set content = message['content'] %}\
            {% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}\
            {{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}\
            {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
        let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let tokenizer = LmTokenizer::load(&dir, &[]).unwrap();
        let error = check_template_extends_prefixes(&tokenizer, false).unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, TranscriptError::TemplateDrift { message: 4, .. }),
            "{text}"
        );
        assert!(text.contains("<think>"), "{text}");
        // The same drift, met while extending an episode, is refused too: once the tool's answer
        // follows the model's turn, that turn is no longer the last and loses its thinking.
        let mut transcript = Transcript::open(&tokenizer, vec![message("user", "12*34?")], Vec::new()).unwrap();
        let ids = tokenizer.encode("<think>hmm</think><tool_call>x</tool_call>").unwrap();
        transcript
            .push_model_turn(&tokenizer, &ids, &vec![-0.5; ids.len()])
            .unwrap();
        let drift = transcript.push_env_messages(&tokenizer, vec![message("tool", "408")]);
        let Err(TranscriptError::TemplateDrift {
            message: 2,
            expected,
            found,
            ..
        }) = drift
        else {
            panic!("{drift:?}");
        };
        assert!(
            expected.contains("<think>hmm") && !found.contains("<think>"),
            "{expected:?} {found:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn model_tokens_stay_as_sampled_and_env_tokens_are_masked() {
        let tokenizer = chatml();
        let opening = vec![message("system", "Use the calculator."), message("user", "12*34?")];
        let mut transcript = Transcript::open(&tokenizer, opening.clone(), Vec::new()).unwrap();
        let prompt = transcript.tokens().to_vec();
        let call = tokenizer
            .encode("<tool_call>{\"name\": \"calculator\"}</tool_call>")
            .unwrap();
        let text = transcript
            .push_model_turn(&tokenizer, &call, &vec![-1.0; call.len()])
            .unwrap();
        assert_eq!(text, "<tool_call>{\"name\": \"calculator\"}</tool_call>");
        transcript
            .push_env_messages(&tokenizer, vec![message("tool", "408")])
            .unwrap();
        let answer = tokenizer.encode("408<|im_end|>").unwrap();
        let text = transcript
            .push_model_turn(&tokenizer, &answer, &vec![-2.0; answer.len()])
            .unwrap();
        assert_eq!(text, "408");

        let tokens = transcript.tokens();
        assert_eq!(&tokens[..prompt.len()], &prompt[..]);
        assert_eq!(&tokens[prompt.len()..prompt.len() + call.len()], &call[..]);
        assert_eq!(&tokens[tokens.len() - answer.len()..], &answer[..]);
        let sampled: Vec<u32> = (tokens.iter().zip(transcript.sampled()))
            .filter(|(_, s)| **s)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(sampled, [call.clone(), answer.clone()].concat());
        // The environment's tokens close the call's turn, carry the tool result and open the
        // next turn, exactly as the template renders the whole conversation.
        let env: Vec<u32> = tokens[prompt.len() + call.len()..tokens.len() - answer.len()].to_vec();
        assert!(
            transcript.sampled()[prompt.len() + call.len()..tokens.len() - answer.len()]
                .iter()
                .all(|s| !s)
        );
        assert_eq!(
            tokenizer.decode(&env, false).unwrap(),
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        let mut conversation = opening;
        conversation.push(message(
            "assistant",
            "<tool_call>{\"name\": \"calculator\"}</tool_call>",
        ));
        conversation.push(message("tool", "408"));
        conversation.push(message("assistant", "408"));
        let whole = tokenizer.apply_chat_template(&conversation, false).unwrap().unwrap();
        assert!(whole.starts_with(&tokenizer.decode(tokens, false).unwrap()));
        assert!(
            transcript
                .log_probs()
                .iter()
                .zip(transcript.sampled())
                .all(|(lp, s)| *s || *lp == 0.0)
        );
        let share = env.len() as f64 / (tokens.len() - prompt.len()) as f64;
        assert_eq!(transcript.env_token_share(), share);
    }

    proptest! {
        /// Over random episodes (random sampled ids, random environment text), the loss mask
        /// marks exactly the sampled ids, in order, with their log-probabilities, and nothing
        /// the environment added.
        #[test]
        fn the_loss_mask_is_exactly_the_sampled_tokens(
            turns in prop::collection::vec(
                (prop::collection::vec(0u32..500, 1..12), "[a-z0-9 <>/]{0,20}"),
                1..5,
            ),
        ) {
            let tokenizer = chatml();
            let mut transcript = Transcript::open(&tokenizer, vec![message("user", "go")], Vec::new()).unwrap();
            let prompt_len = transcript.prompt_len();
            let (mut sampled_ids, mut env_count) = (Vec::new(), 0usize);
            for (i, (ids, env_text)) in turns.iter().enumerate() {
                let log_probs: Vec<f32> = (0..ids.len()).map(|j| -1.0 - (i * 100 + j) as f32).collect();
                transcript.push_model_turn(&tokenizer, ids, &log_probs).unwrap();
                sampled_ids.extend(ids.iter().copied().zip(log_probs));
                let before = transcript.tokens().len();
                transcript.push_env_messages(&tokenizer, vec![message("user", env_text)]).unwrap();
                env_count += transcript.tokens().len() - before;
            }
            let got: Vec<(u32, f32)> = (0..transcript.tokens().len())
                .filter(|&i| transcript.sampled()[i])
                .map(|i| (transcript.tokens()[i], transcript.log_probs()[i]))
                .collect();
            prop_assert_eq!(got, sampled_ids);
            let unsampled_after_prompt = transcript.sampled()[prompt_len..].iter().filter(|s| !**s).count();
            prop_assert_eq!(unsampled_after_prompt, env_count);
            prop_assert!(transcript.sampled()[..prompt_len].iter().all(|s| !s));
        }
    }
}
