//! A prompt's images made ready for a vision-language model: each image read within
//! [`ImageLimits`] and processed as the model's image processor does, and the prompt's
//! `<image>` markers (one per image, or all of them at its start when it has none) expanded to
//! the image tokens the processor's tiling gives, before the chat template or after it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rein_core::Image;
use rein_model::ReinBackend;
use rein_model::lm::LoadError;
use rein_model::vision::{IMAGE_TOKEN, ImageLimits, ImageProcessor, ImageSide, ProcessedImage, decode_rgb};
use serde_json::{Value, json};

use super::images::ImageSource;

/// The prompt `text` with `<image>` markers for `count` images: as written when it has one per
/// image, or with all of them at its start when it has none.
pub fn with_markers(text: &str, count: usize) -> Result<String, String> {
    match text.matches(IMAGE_TOKEN).count() {
        0 => Ok(IMAGE_TOKEN.repeat(count) + text),
        markers if markers == count => Ok(text.to_string()),
        markers => Err(format!(
            "the prompt has {markers} `{IMAGE_TOKEN}` markers for {count} images"
        )),
    }
}

/// A user message with `text`'s `<image>` markers (one per image) as image parts between its
/// text parts, as a vision-language model's chat template reads it.
pub fn chat_message(text: &str) -> Value {
    message_parts("user", text)
}

/// A message of `role` as content parts: `text`'s `<image>` markers as image parts between its
/// text parts (the form every vision-language model's chat template reads).
pub fn message_parts(role: &str, text: &str) -> Value {
    let mut parts = Vec::new();
    for (i, piece) in text.split(IMAGE_TOKEN).enumerate() {
        if i > 0 {
            parts.push(json!({"type": "image"}));
        }
        if !piece.is_empty() {
            parts.push(json!({"type": "text", "text": piece}));
        }
    }
    json!({"role": role, "content": parts})
}

/// The files of a model directory that hold its image processor's settings.
const PROCESSOR_FILES: [&str; 2] = ["preprocessor_config.json", "processor_config.json"];

/// Reads and processes prompts' images for one model's image processor.
#[derive(Debug, Clone)]
pub struct PromptImageReader {
    /// The model's image processor.
    pub processor: ImageProcessor,
    /// The bounds every image is read within.
    pub limits: ImageLimits,
    /// The model directory the processor's settings came from.
    dir: PathBuf,
}

impl PromptImageReader {
    /// The reader of the processor whose settings are in the model directory `dir`, for the
    /// image side `side`, within the default limits.
    pub fn load<B: ReinBackend>(dir: &Path, side: &ImageSide<B>) -> Result<Self, LoadError> {
        Ok(Self {
            processor: ImageProcessor::load(dir, side)?,
            limits: ImageLimits::default(),
            dir: dir.to_path_buf(),
        })
    }

    /// Copies the processor's settings files into `to` (a model directory being written), so
    /// that the model saved there reads images as this one does.
    pub fn copy_settings(&self, to: &Path) -> Result<(), LoadError> {
        for name in PROCESSOR_FILES {
            let source = self.dir.join(name);
            if source.is_file() {
                std::fs::copy(&source, to.join(name)).map_err(|e| LoadError::Io {
                    path: to.join(name),
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// `sources` read, decoded and processed, in order; an error names the image (its index,
    /// and its file when it has one) and what was wrong or which limit it passed.
    pub fn read(&self, sources: &[ImageSource]) -> Result<Vec<ProcessedImage>, String> {
        self.read_with_files(sources).map(|(images, _)| images)
    }

    /// [`PromptImageReader::read`], with each image's file as read (what a reward plugin that
    /// reads the prompt's images receives).
    pub fn read_with_files(&self, sources: &[ImageSource]) -> Result<(Vec<ProcessedImage>, Vec<Image>), String> {
        let mut images = Vec::with_capacity(sources.len());
        let mut files = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter().enumerate() {
            let name = match source {
                ImageSource::Path(path) => format!("image {i} ({})", path.display()),
                ImageSource::Bytes(_) => format!("image {i}"),
            };
            let bytes = source
                .bytes(self.limits.max_bytes)
                .map_err(|e| format!("image {i}: {e}"))?;
            let pixels = decode_rgb(&bytes, self.limits).map_err(|e| format!("{name}: {e}"))?;
            images.push(self.processor.process(&pixels).map_err(|e| format!("{name}: {e}"))?);
            files.push(Image::new(bytes).map_err(|e| format!("{name}: {e}"))?);
        }
        Ok((images, files))
    }

    /// `images` (files a plugin returned) decoded within the limits and processed, in order; an
    /// error names the image (its index and media type) and what was wrong or which limit it
    /// passed.
    pub fn read_files(&self, images: &[Image]) -> Result<Vec<ProcessedImage>, String> {
        (images.iter().enumerate())
            .map(|(i, image)| {
                let name = format!("image {i} ({})", image.media_type());
                let pixels = decode_rgb(image.bytes(), self.limits).map_err(|e| format!("{name}: {e}"))?;
                self.processor.process(&pixels).map_err(|e| format!("{name}: {e}"))
            })
            .collect()
    }

    /// `text`, whose `<image>` markers stand one for each of `images`, with each marker
    /// expanded to its image's tokens.
    pub fn expand(&self, text: &str, images: &[ProcessedImage]) -> Result<String, String> {
        self.processor.expand_prompt(text, images)
    }
}

/// A prompt's processed images, shared by every row that samples or trains on it.
pub type PromptPixels = Arc<[ProcessedImage]>;

/// A prompt's images as their files hold them, for the rewards that read them.
pub type PromptImageFiles = Arc<[Image]>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_kept_one_per_image_or_put_first() {
        assert_eq!(with_markers("what?", 2).unwrap(), "<image><image>what?");
        assert_eq!(with_markers("a <image> b", 1).unwrap(), "a <image> b");
        let error = with_markers("a <image> b", 2).unwrap_err();
        assert!(error.contains("1 `<image>` markers for 2 images"), "{error}");
    }

    #[test]
    fn a_chat_message_has_an_image_part_per_marker() {
        let message = chat_message("<image>How many?");
        assert_eq!(
            message["content"],
            json!([{"type": "image"}, {"type": "text", "text": "How many?"}])
        );
    }
}
