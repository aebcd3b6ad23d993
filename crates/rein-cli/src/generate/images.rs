//! `rein generate` with images, for a vision-language model: `--image` files, or each `--input`
//! row's `images` (paths relative to the file, or `{"path", "bytes"}` objects as Hugging Face
//! datasets store them), read and expanded by [`PromptImageReader`] and kept for the model's
//! image side to encode once for the whole batch.

use std::path::Path;

use rein_model::Cpu;
use rein_model::lm::CausalLm;
use rein_model::vision::{ImageSide, ProcessedImage};
use rein_posttrain::{ImageSource, PromptImageReader};
use rein_sampler::PromptImages;

/// The prompts' images, read and processed, prompt by prompt.
pub(super) struct BatchImages {
    reader: PromptImageReader,
    images: Vec<Vec<ProcessedImage>>,
}

impl BatchImages {
    /// No images yet, for the image side `vision`, whose processor settings are in `dir`.
    pub(super) fn new(vision: &ImageSide<Cpu>, dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            reader: PromptImageReader::load(dir, vision)?,
            images: Vec::new(),
        })
    }

    /// The next prompt's `text` (one marker per image) expanded for `sources`, which are read
    /// and kept; `what` names the prompt in errors. A prompt without images keeps its text.
    pub(super) fn expand(&mut self, text: &str, sources: &[ImageSource], what: &str) -> anyhow::Result<String> {
        if sources.is_empty() {
            self.images.push(Vec::new());
            return Ok(text.to_string());
        }
        let images = (self.reader.read(sources)).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let expanded = (self.reader.expand(text, &images)).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        self.images.push(images);
        Ok(expanded)
    }

    /// Every prompt's images encoded by `model`'s image side, with their positions in
    /// `prompts` (each one's token ids, in the order [`BatchImages::expand`] saw them); `None`
    /// when no prompt has an image.
    pub(super) fn prompt_images(
        &self,
        model: &CausalLm<Cpu>,
        prompts: &[Vec<u32>],
    ) -> anyhow::Result<Option<PromptImages<Cpu>>> {
        let images: Vec<&[ProcessedImage]> = self.images.iter().map(Vec::as_slice).collect();
        PromptImages::of_prompts(model.vision.as_ref(), prompts, &images, &Default::default())
            .map_err(anyhow::Error::msg)
    }
}
