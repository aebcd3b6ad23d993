//! Tokenizers from `tokenizer.json` (the `tokenizers` library) with the special tokens and chat
//! template of `tokenizer_config.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::LoadError;

/// One chat message for [`LmTokenizer::apply_chat_template`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl From<rein_core::Message> for ChatMessage {
    fn from(message: rein_core::Message) -> Self {
        Self {
            role: message.role,
            content: message.content,
        }
    }
}

/// A prompt and its steps as [`LmTokenizer::encode_steps`] lays them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedSteps {
    /// The tokens.
    pub ids: Vec<u32>,
    /// How many of them are the prompt's (with the beginning-of-sequence token).
    pub prompt_len: usize,
    /// The index of each step's last token (its separator's), where the step is judged.
    pub step_ends: Vec<usize>,
}

/// A checkpoint's tokenizer.
#[derive(Clone)]
pub struct LmTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    eos_ids: Vec<u32>,
    pad_id: Option<u32>,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The beginning-of-sequence id, when `tokenizer_config.json`'s `add_bos_token` asks for it
    /// before a plain prompt (Gemma).
    prompt_bos: Option<u32>,
    /// Variables the chat template sees besides the messages (`enable_thinking`).
    template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Whether the chat template is not the one `path`'s directory holds
    /// ([`LmTokenizer::with_chat_template`]), so saving writes it out.
    template_replaced: bool,
}

impl std::fmt::Debug for LmTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmTokenizer")
            .field("path", &self.path)
            .field("vocab", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(m) => m.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

impl LmTokenizer {
    /// Loads `tokenizer.json` and, when present, `tokenizer_config.json` and
    /// `chat_template.jinja` (the template as transformers 4.50 and later save it, preferred to
    /// the config's) from `dir` (or from the conversion of a `.gguf` file). End-of-sequence ids come from the tokenizer config's
    /// `eos_token` plus `extra_eos_ids` (from the model config).
    pub fn load(dir: &Path, extra_eos_ids: &[u32]) -> Result<Self, LoadError> {
        let dir = &super::locate(dir)?;
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| LoadError::Tokenizer {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LoadError::Json {
                path: config_path.clone(),
                reason: e.to_string(),
            })?,
            Err(_) => serde_json::Value::Null,
        };
        let lookup = |key: &str| -> Result<Option<(String, u32)>, LoadError> {
            let Some(text) = config.get(key).and_then(token_text) else {
                return Ok(None);
            };
            let id = inner.token_to_id(&text).ok_or_else(|| LoadError::Tokenizer {
                path: config_path.clone(),
                reason: format!("`{key}` is `{text}`, which is not in the vocabulary"),
            })?;
            Ok(Some((text, id)))
        };
        let eos = lookup("eos_token")?;
        let pad = lookup("pad_token")?;
        let bos = lookup("bos_token")?;
        let mut eos_ids: Vec<u32> = eos
            .iter()
            .map(|(_, id)| *id)
            .chain(extra_eos_ids.iter().copied())
            .collect();
        eos_ids.sort_unstable();
        eos_ids.dedup();
        // transformers 4.50 and later save the template on its own, as `chat_template.jinja`,
        // and prefer it to the config's.
        let jinja = dir.join("chat_template.jinja");
        let chat_template = match std::fs::read_to_string(&jinja) {
            Ok(template) => Some(template),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match config.get("chat_template") {
                Some(serde_json::Value::String(t)) => Some(t.clone()),
                _ => None,
            },
            Err(e) => {
                return Err(LoadError::Io {
                    path: jinja,
                    reason: e.to_string(),
                });
            }
        };
        let add_bos = matches!(config.get("add_bos_token"), Some(serde_json::Value::Bool(true)));
        Ok(Self {
            inner,
            path,
            eos_ids,
            pad_id: pad.map(|(_, id)| id).or(eos.as_ref().map(|(_, id)| *id)),
            chat_template,
            prompt_bos: bos.as_ref().filter(|_| add_bos).map(|(_, id)| *id),
            bos_token: bos.map(|(t, _)| t),
            eos_token: eos.map(|(t, _)| t),
            template_kwargs: serde_json::Map::new(),
            template_replaced: false,
        })
    }

    /// This tokenizer with `template` (Jinja) as its chat template in place of its own, as
    /// transformers' `tokenizer.chat_template = ...` sets it; [`LmTokenizer::save`] writes it as
    /// `chat_template.jinja`.
    pub fn with_chat_template(mut self, template: String) -> Self {
        self.chat_template = Some(template);
        self.template_replaced = true;
        self
    }

    /// This tokenizer with `kwargs` passed to its chat template as variables besides the
    /// messages, as transformers' `apply_chat_template(..., **kwargs)` passes them (Qwen3's
    /// `enable_thinking = false` opens an empty `<think>` block for the model).
    pub fn with_template_kwargs(mut self, kwargs: serde_json::Map<String, serde_json::Value>) -> Self {
        self.template_kwargs = kwargs;
        self
    }

    /// Token ids of a plain prompt (no chat template): [`LmTokenizer::encode`], after the
    /// beginning-of-sequence token when `tokenizer_config.json` sets `add_bos_token` (as
    /// transformers' tokenizer adds it; Gemma's base models need it) and the text does not
    /// start with it already.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, LoadError> {
        let ids = self.encode(text)?;
        Ok(match self.prompt_bos {
            Some(bos) if ids.first() != Some(&bos) => std::iter::once(bos).chain(ids).collect(),
            _ => ids,
        })
    }

    /// Token ids of `text` (special tokens written in the text are recognised; none are added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LoadError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| LoadError::Tokenizer {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// The beginning-of-sequence token's id, when `tokenizer_config.json` names one (whether or
    /// not it asks for it before prompts).
    pub fn bos_id(&self) -> Option<u32> {
        (self.bos_token.as_deref()).and_then(|token| self.inner.token_to_id(token))
    }

    /// `prompt` and its `steps` as a process reward model reads them, laid out as TRL's
    /// `PRMTrainer` does: the beginning-of-sequence token when the tokenizer has one, the
    /// prompt, then each step followed by `separator`, each piece tokenized on its own.
    pub fn encode_steps(
        &self,
        prompt: &str,
        steps: &[impl AsRef<str>],
        separator: &str,
    ) -> Result<EncodedSteps, LoadError> {
        let mut ids: Vec<u32> = self.bos_id().into_iter().collect();
        ids.extend(self.encode(prompt)?);
        let prompt_len = ids.len();
        let separator = self.encode(separator)?;
        let mut step_ends = Vec::with_capacity(steps.len());
        for step in steps {
            ids.extend(self.encode(step.as_ref())?);
            ids.extend(&separator);
            step_ends.push(ids.len().saturating_sub(1));
        }
        Ok(EncodedSteps {
            ids,
            prompt_len,
            step_ends,
        })
    }

    /// Text of `ids`, optionally without special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, LoadError> {
        self.inner.decode(ids, skip_special).map_err(|e| LoadError::Tokenizer {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }

    /// The text of the one token `id`, special tokens included (empty for an unknown id).
    pub fn piece(&self, id: u32) -> String {
        self.decode(&[id], false).unwrap_or_default()
    }

    /// The id of the token whose text is `token` (added tokens included), if there is one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The first difference between this tokenizer's vocabulary and `other`'s (added tokens
    /// included): a token one of them lacks or gives another id, or `None` when they agree.
    pub fn vocabulary_difference(&self, other: &LmTokenizer) -> Option<String> {
        let (mine, theirs) = (self.inner.get_vocab(true), other.inner.get_vocab(true));
        let mut tokens: Vec<(&String, &u32)> = mine.iter().collect();
        tokens.sort_by_key(|&(_, id)| *id);
        for (token, id) in tokens {
            match theirs.get(token) {
                Some(other_id) if other_id == id => {}
                Some(other_id) => return Some(format!("token {token:?} is id {id} here and {other_id} there")),
                None => return Some(format!("token {token:?} (id {id}) is missing there")),
            }
        }
        (theirs.len() != mine.len()).then(|| format!("{} tokens here, {} there", mine.len(), theirs.len()))
    }

    /// Ids that end a sequence.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The padding id (the pad token, else the end-of-sequence token).
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Whether `tokenizer_config.json` has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders `messages` with the chat template (Jinja, as transformers does); `None` when
    /// the tokenizer has no template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Option<String>, LoadError> {
        self.apply_chat_template_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders `messages` with the chat template, offering `tools` (OpenAI function schemas,
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`, as
    /// transformers passes them; templates such as Qwen2.5's list them in the system turn).
    /// With no tools the template sees none, as in transformers.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<Option<String>, LoadError> {
        self.render_chat(minijinja::Value::from_serialize(messages), tools, add_generation_prompt)
    }

    /// Renders `messages` given as JSON — a message's `content` may be a list of parts
    /// (`{"type": "image"}`, `{"type": "text", "text": …}`), as vision-language models' templates
    /// read them — with the chat template, offering `tools` as
    /// [`LmTokenizer::apply_chat_template_with_tools`] does; `None` when the tokenizer has no
    /// template.
    pub fn apply_chat_template_to_json(
        &self,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<Option<String>, LoadError> {
        self.render_chat(minijinja::Value::from_serialize(messages), tools, add_generation_prompt)
    }

    fn render_chat(
        &self,
        messages: minijinja::Value,
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<Option<String>, LoadError> {
        let Some(template) = &self.chat_template else {
            return Ok(None);
        };
        let fail = |e: minijinja::Error| LoadError::Tokenizer {
            path: self.path.with_file_name("tokenizer_config.json"),
            reason: format!("chat template: {e}"),
        };
        // transformers' Jinja environment: block tags take their line's indentation and the
        // newline after them with them, Python's string methods, `raise_exception`, and
        // `tojson` as Python's `json.dumps`.
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", super::tojson::tojson);
        env.add_template("chat", template).map_err(fail)?;
        let rendered = env
            .get_template("chat")
            .map_err(fail)?
            .render(minijinja::context! {
                messages => messages,
                tools => (!tools.is_empty()).then_some(tools),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.clone().unwrap_or_default(),
                eos_token => self.eos_token.clone().unwrap_or_default(),
                ..minijinja::Value::from_serialize(&self.template_kwargs)
            })
            .map_err(fail)?;
        Ok(Some(rendered))
    }

    /// Copies `tokenizer.json` (and `tokenizer_config.json` and `chat_template.jinja` when
    /// present) into `dir`; a chat template that replaced the directory's is written as
    /// `chat_template.jinja`, which transformers prefers to the config's.
    pub fn save(&self, dir: &Path) -> Result<(), LoadError> {
        for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
            let from = self.path.with_file_name(name);
            let replaced = name == "chat_template.jinja" && self.template_replaced;
            if from.is_file() && !replaced {
                let to = dir.join(name);
                if from != to {
                    std::fs::copy(&from, &to).map_err(|e| LoadError::Io {
                        path: to.clone(),
                        reason: e.to_string(),
                    })?;
                }
            }
        }
        if let Some(template) = self.chat_template.as_ref().filter(|_| self.template_replaced) {
            let to = dir.join("chat_template.jinja");
            std::fs::write(&to, template).map_err(|e| LoadError::Io {
                path: to.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
}
