//! `rein generate`: sample continuations from a model directory in Hugging Face format; with
//! `--image`, from a vision-language model with images in its prompt ([`images`]).

mod images;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use rein_core::{ModelDtype, SamplerPrecision};
use rein_model::Cpu;
use rein_model::lm::{CausalLm, ChatMessage, LmTokenizer, load};
use rein_posttrain::{ImageSource, row_images};
use rein_run::progress::Progress;
use rein_sampler::{FinishReason, GenerationConfig, PromptImages, generate, generate_with_images};
use rein_sampler::{completion_text, stop_check};

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    /// Checkpoint directory (config.json, model.safetensors, tokenizer.json), a `.gguf` file, or
    /// the name of a model fetched with `cargo xtask model NAME`.
    #[arg(long)]
    model: PathBuf,
    /// One prompt.
    #[arg(long, conflicts_with = "input", required_unless_present = "input")]
    prompt: Option<String>,
    /// An image for a vision-language model's prompt (repeatable; PNG, JPEG, GIF or WebP):
    /// each `<image>` in the prompt takes the next, or all go at its start when it has none.
    /// With `--chat`, the images are image parts of the user message's content. (`--input`
    /// rows carry theirs in an `images` field.)
    #[arg(long = "image", value_name = "FILE", conflicts_with = "input")]
    images: Vec<PathBuf>,
    /// JSON lines with a `prompt` field (one batch), and for a vision-language model an
    /// `images` list: paths relative to the file, or `{"path", "bytes"}` objects (base64).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Samples per prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Top-k filtering.
    #[arg(long)]
    top_k: Option<usize>,
    /// Top-p (nucleus) filtering.
    #[arg(long)]
    top_p: Option<f32>,
    /// Min-p filtering.
    #[arg(long)]
    min_p: Option<f32>,
    /// Most new tokens per sample.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop at this text (repeatable).
    #[arg(long = "stop", value_name = "TEXT")]
    stop: Vec<String>,
    /// Wrap each prompt as a user message in the tokenizer's chat template.
    #[arg(long)]
    chat: bool,
    /// Include per-token log-probabilities.
    #[arg(long)]
    logprobs: bool,
    /// `exact`, or `q8`: a quantised model's products with its activations quantised to 8 bits
    /// per block, as llama.cpp does (faster, not exact).
    #[arg(long, default_value = "exact", value_parser = precision)]
    precision: SamplerPrecision,
    /// `f32`, or `bf16`: the decoder's linear layers multiply in bf16, as a model trained with
    /// `model.dtype = "bf16"` did (mixed precision).
    #[arg(long, default_value = "f32", value_parser = dtype)]
    dtype: ModelDtype,
}

/// `--dtype`'s value.
pub(crate) fn dtype(value: &str) -> Result<ModelDtype, String> {
    match value {
        "f32" => Ok(ModelDtype::F32),
        "bf16" => Ok(ModelDtype::Bf16),
        other => Err(format!("{other:?} is not a dtype: expected f32 or bf16")),
    }
}

/// `--precision`'s value.
pub(crate) fn precision(value: &str) -> Result<SamplerPrecision, String> {
    match value {
        "exact" => Ok(SamplerPrecision::Exact),
        "q8" => Ok(SamplerPrecision::Q8),
        other => Err(format!("{other:?} is not a precision: expected exact or q8")),
    }
}

/// An error when `--precision q8` is asked of a model without quantised codes (it would compute
/// exactly, quietly).
pub(crate) fn q8_has_codes<B: rein_model::ReinBackend>(
    precision: SamplerPrecision,
    model: &rein_model::lm::CausalLm<B>,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    if precision == SamplerPrecision::Q8 && model.packed_weights().is_none() {
        bail!(
            "--precision q8 quantises the activations of products with a quantised model's codes, and {} has none (a .gguf file has them)",
            path.display()
        );
    }
    Ok(())
}

/// An error when `--precision q8` is asked with `--dtype bf16`: q8 reads a quantised model's
/// codes, bf16 the weights rounded.
pub(crate) fn q8_fits_dtype(precision: SamplerPrecision, dtype: ModelDtype) -> anyhow::Result<()> {
    if precision == SamplerPrecision::Q8 && dtype == ModelDtype::Bf16 {
        bail!("--precision q8 reads a quantised model's codes, which --dtype bf16 does not: choose one");
    }
    Ok(())
}

impl GenerateArgs {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let device = Default::default();
        let model = &self.load()?;
        q8_has_codes(self.precision, model, &self.model)?;
        q8_fits_dtype(self.precision, self.dtype)?;
        let tokenizer = LmTokenizer::load(&self.model, &model.config().eos_ids())?;
        let Encoded { prompts, images } = self.encode(model, &tokenizer)?;
        let config = GenerationConfig {
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            n: self.n.max(1),
            stop_token_ids: tokenizer.eos_ids().to_vec(),
            seed: self.seed,
            top_logprobs: 0,
            precision: self.precision,
            certainty: false,
        };
        let mut stop_text = stop_check(&tokenizer, &self.stop);
        let sequences = prompts.len() * config.n;
        let (mut progress, start, mut tokens) = (Progress::new(None), Instant::now(), 0usize);
        // Called once per sampled token that is not a stop token: it also counts them.
        let mut stop = |sequence: usize, generated: &[u32]| {
            tokens += 1;
            let elapsed = start.elapsed().as_secs_f64();
            let line = format!(
                "generating {sequences} sequences: {tokens} tokens, {:.0} tokens/s",
                tokens as f64 / elapsed.max(1e-9)
            );
            progress.show(tokens as u64, &line, false);
            stop_text(sequence, generated)
        };
        let pad = tokenizer.pad_id().unwrap_or(0);
        let generations = match images {
            Some(images) => generate_with_images(model, &prompts, images, &config, pad, &mut stop, &device)
                .map_err(anyhow::Error::msg)?,
            None => generate(model, &prompts, &config, pad, &mut stop, &device),
        };
        progress.finish();
        let mut out = std::io::stdout().lock();
        for g in generations {
            let completion = completion_text(&tokenizer, &g.tokens, &self.stop);
            let finish = match g.finish {
                FinishReason::StopToken => "stop_token",
                FinishReason::StopCondition => "stop_string",
                FinishReason::Length => "length",
            };
            let mut line = serde_json::json!({
                "prompt": g.prompt,
                "sample": g.sample,
                "completion": completion,
                "finish": finish,
                "tokens": g.tokens,
            });
            if self.logprobs {
                line["logprobs"] = serde_json::json!(g.logprobs);
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    }

    /// The model: a causal LM, or a vision-language model (which images need).
    fn load(&self) -> anyhow::Result<CausalLm<Cpu>> {
        let device = &Default::default();
        let loading = || format!("loading {}", self.model.display());
        let model = load::<Cpu>(&self.model, device).with_context(loading)?;
        Ok(model.with_dtype(self.dtype))
    }

    /// The prompts' token ids, in the chat template with `--chat`, and a vision-language model's
    /// images' features (`--image`, or the `--input` rows' `images`).
    fn encode(&self, model: &CausalLm<Cpu>, tokenizer: &LmTokenizer) -> anyhow::Result<Encoded> {
        let mut reader = match &model.vision {
            Some(vision) => Some(images::BatchImages::new(vision, &self.model)?),
            None => None,
        };
        let mut prompts = Vec::new();
        for PromptInput { what, text, images } in self.prompts()? {
            let mut text = match images.is_empty() {
                true => text,
                false => rein_posttrain::with_markers(&text, images.len())
                    .map_err(anyhow::Error::msg)
                    .with_context(|| what.clone())?,
            };
            if self.chat {
                // With images, the message's content is a list of image and text parts.
                let rendered = match images.is_empty() {
                    true => {
                        let message = ChatMessage {
                            role: "user".into(),
                            content: text,
                        };
                        tokenizer.apply_chat_template(&[message], true)?
                    }
                    false => {
                        tokenizer.apply_chat_template_to_json(&[rein_posttrain::chat_message(&text)], &[], true)?
                    }
                };
                text = rendered.with_context(|| format!("--chat: {} has no chat template", self.model.display()))?;
            }
            text = match (reader.as_mut(), images.is_empty()) {
                (Some(reader), _) => reader.expand(&text, &images, &what)?,
                (None, true) => text,
                (None, false) => bail!(
                    "{what} has images, and {} is not a vision-language model rein runs \
                     (Idefics3ForConditionalGeneration, Qwen2VLForConditionalGeneration, \
                     Qwen2_5_VLForConditionalGeneration)",
                    self.model.display()
                ),
            };
            let ids = tokenizer.encode_prompt(&text)?;
            if ids.is_empty() {
                bail!("prompt {:?} encodes to no tokens", text);
            }
            prompts.push(ids);
        }
        let images = match reader {
            Some(reader) => reader.prompt_images(model, &prompts)?,
            None => None,
        };
        Ok(Encoded { prompts, images })
    }

    /// The prompts: `--prompt` with the `--image` files, or each `--input` row's `prompt` with
    /// its `images`.
    fn prompts(&self) -> anyhow::Result<Vec<PromptInput>> {
        if let Some(p) = &self.prompt {
            return Ok(vec![PromptInput {
                what: "--prompt".into(),
                text: p.clone(),
                images: self.images.iter().cloned().map(ImageSource::Path).collect(),
            }]);
        }
        let path = self.input.as_ref().context("give --prompt TEXT or --input FILE")?;
        let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        let mut prompts = Vec::new();
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let what = format!("{}:{}", path.display(), i + 1);
            let mut value: serde_json::Value =
                serde_json::from_str(&line).with_context(|| format!("{what}: not JSON"))?;
            let prompt = (value["prompt"].as_str()).with_context(|| format!("{what}: no string `prompt` field"))?;
            let text = prompt.to_string();
            let images =
                row_images(value["images"].take(), dir).map_err(|e| anyhow::anyhow!("{what}: `images`: {e}"))?;
            prompts.push(PromptInput { what, text, images });
        }
        if prompts.is_empty() {
            bail!("{} holds no prompts", path.display());
        }
        Ok(prompts)
    }
}

/// One prompt as given: where it came from (for errors), its text and its images.
struct PromptInput {
    what: String,
    text: String,
    images: Vec<ImageSource>,
}

/// The prompts' token ids, and their images' features for a vision-language model.
struct Encoded {
    prompts: Vec<Vec<u32>>,
    images: Option<PromptImages<Cpu>>,
}
