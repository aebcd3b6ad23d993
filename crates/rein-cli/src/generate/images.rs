//! `rein generate --image`: a vision-language model's prompt with its images — files decoded
//! within [`ImageLimits`], processed as the model's image processor does, each `<image>` marker
//! expanded to the image's tokens, the features from the vision encoder.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rein_model::Cpu;
use rein_model::vision::{IMAGE_TOKEN, Idefics3, Idefics3Processor, ImageLimits, ProcessedImage, decode_rgb};
use rein_sampler::PromptImages;

/// The prompt `text` with `<image>` markers for `count` images: as written when it has one per
/// image, or with all of them at its start when it has none.
pub(super) fn with_markers(text: &str, count: usize) -> anyhow::Result<String> {
    match text.matches(IMAGE_TOKEN).count() {
        0 => Ok(IMAGE_TOKEN.repeat(count) + text),
        markers if markers == count => Ok(text.to_string()),
        markers => bail!("the prompt has {markers} `{IMAGE_TOKEN}` markers for {count} --image files"),
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

/// `text` (with one marker per image) expanded for `files`, and the images' features.
pub(super) fn prompt_images(
    model: &Idefics3<Cpu>,
    dir: &Path,
    text: &str,
    files: &[PathBuf],
) -> anyhow::Result<(String, PromptImages<Cpu>)> {
    let processor = Idefics3Processor::load(dir, model.image_seq_len())?;
    let limits = ImageLimits::default();
    let mut images = Vec::with_capacity(files.len());
    for file in files {
        let size = std::fs::metadata(file)
            .with_context(|| format!("--image {}", file.display()))?
            .len();
        if size > limits.max_bytes as u64 {
            bail!(
                "--image {}: {size} bytes, over the limit of {} bytes",
                file.display(),
                limits.max_bytes
            );
        }
        let bytes = std::fs::read(file).with_context(|| format!("--image {}", file.display()))?;
        let pixels = decode_rgb(&bytes, limits).with_context(|| format!("--image {}", file.display()))?;
        images.push(processor.process(&pixels));
    }
    let expanded = processor.expand_prompt(text, &images).map_err(anyhow::Error::msg)?;
    let pixels = ProcessedImage::stack(&images, &Default::default());
    let images = PromptImages {
        features: model.image_features(pixels),
        token: model.image_token_id(),
    };
    Ok((expanded, images))
}
