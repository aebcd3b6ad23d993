//! `rein generate` with images, for a vision-language model: `--image` files, or each `--input`
//! row's `images` (paths relative to the file, or `{"path", "bytes"}` objects as Hugging Face
//! datasets store them). Images are read within [`ImageLimits`] and processed as the model's
//! image processor does; each prompt's `<image>` markers are expanded to its images' tokens.

use std::path::Path;

use anyhow::{Context, bail};
use rein_model::Cpu;
use rein_model::vision::{IMAGE_TOKEN, Idefics3, Idefics3Processor, ImageLimits, ProcessedImage, decode_rgb};
use rein_posttrain::ImageSource;
use rein_sampler::PromptImages;

/// The prompt `text` with `<image>` markers for `count` images: as written when it has one per
/// image, or with all of them at its start when it has none.
pub(super) fn with_markers(text: &str, count: usize) -> anyhow::Result<String> {
    match text.matches(IMAGE_TOKEN).count() {
        0 => Ok(IMAGE_TOKEN.repeat(count) + text),
        markers if markers == count => Ok(text.to_string()),
        markers => bail!("the prompt has {markers} `{IMAGE_TOKEN}` markers for {count} images"),
    }
}

/// A user message with `text`'s `<image>` markers (one per image) as image parts between its
/// text parts, as a vision-language model's chat template reads it.
pub(super) fn chat_message(text: &str) -> serde_json::Value {
    let mut parts = Vec::new();
    for (i, piece) in text.split(IMAGE_TOKEN).enumerate() {
        if i > 0 {
            parts.push(serde_json::json!({"type": "image"}));
        }
        if !piece.is_empty() {
            parts.push(serde_json::json!({"type": "text", "text": piece}));
        }
    }
    serde_json::json!({"role": "user", "content": parts})
}

/// The prompts' images, read and processed, in prompt order.
pub(super) struct PromptImageReader {
    processor: Idefics3Processor,
    limits: ImageLimits,
    images: Vec<ProcessedImage>,
}

impl PromptImageReader {
    /// A reader for `model`, whose processor settings are in `dir`.
    pub(super) fn new(model: &Idefics3<Cpu>, dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            processor: Idefics3Processor::load(dir, model.image_seq_len())?,
            limits: ImageLimits::default(),
            images: Vec::new(),
        })
    }

    /// `text` (one marker per image) expanded for `sources`, which are read and kept; `what`
    /// names the prompt in errors.
    pub(super) fn expand(&mut self, text: &str, sources: &[ImageSource], what: &str) -> anyhow::Result<String> {
        let mut images = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter().enumerate() {
            let bytes = (source.bytes(self.limits.max_bytes)).map_err(|e| anyhow::anyhow!("{what}: image {i}: {e}"))?;
            let pixels = decode_rgb(&bytes, self.limits).with_context(|| match source {
                ImageSource::Path(path) => format!("{what}: image {i} ({})", path.display()),
                ImageSource::Bytes(_) => format!("{what}: image {i}"),
            })?;
            images.push(self.processor.process(&pixels));
        }
        let expanded = (self.processor.expand_prompt(text, &images)).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        self.images.extend(images);
        Ok(expanded)
    }

    /// Every image read, encoded by `model`'s vision side.
    pub(super) fn features(&self, model: &Idefics3<Cpu>) -> PromptImages<Cpu> {
        PromptImages {
            features: model.image_features(ProcessedImage::stack(&self.images, &Default::default())),
            token: model.image_token_id(),
        }
    }
}
