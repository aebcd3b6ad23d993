//! `rein generate` with images, for a vision-language model: `--image` files, or each `--input`
//! row's `images` (paths relative to the file, or `{"path", "bytes"}` objects as Hugging Face
//! datasets store them), read and expanded by [`PromptImageReader`] and kept for the model's
//! image side to encode once for the whole batch.

use std::path::Path;

use rein_model::Cpu;
use rein_model::vision::{Idefics3Vision, ProcessedImage};
use rein_posttrain::{ImageSource, PromptImageReader};
use rein_sampler::PromptImages;

/// The prompts' images, read and processed, in prompt order.
pub(super) struct BatchImages {
    reader: PromptImageReader,
    images: Vec<ProcessedImage>,
}

impl BatchImages {
    /// No images yet, for the image side `vision`, whose processor settings are in `dir`.
    pub(super) fn new(vision: &Idefics3Vision<Cpu>, dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            reader: PromptImageReader::load(dir, vision.image_seq_len())?,
            images: Vec::new(),
        })
    }

    /// `text` (one marker per image) expanded for `sources`, which are read and kept; `what`
    /// names the prompt in errors.
    pub(super) fn expand(&mut self, text: &str, sources: &[ImageSource], what: &str) -> anyhow::Result<String> {
        let images = (self.reader.read(sources)).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let expanded = (self.reader.expand(text, &images)).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        self.images.extend(images);
        Ok(expanded)
    }

    /// Every image read, encoded by `vision`.
    pub(super) fn features(&self, vision: &Idefics3Vision<Cpu>) -> PromptImages<Cpu> {
        PromptImages {
            features: vision.image_features(ProcessedImage::stack(&self.images, &Default::default())),
            token: vision.image_token_id(),
        }
    }
}
