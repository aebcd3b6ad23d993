//! Where completions come from: the [`Generator`] trait and its in-process implementation.
//!
//! A trainer asks a generator for `n` completions of a batch of token-id prompts and hands it
//! each new policy. [`NativeGenerator`] runs the batched KV-cache sampler on the policy it was
//! last given; [`crate::HttpGenerator`] sends the ids to inference servers (vLLM, SGLang,
//! `rein serve`) and syncs the policy through files. Either way the answer is token ids with
//! their sampling log-probabilities and the policy version that produced them, so nothing a
//! model generated is ever decoded and re-tokenised.

use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_model::vision::ProcessedImage;

use crate::batch_decode::{Generation, generate, generate_with_images};
use crate::session::PromptImages;
use crate::stop::stop_check;
use crate::token_choice::GenerationConfig;

/// Why a generator could not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GeneratorError {
    /// Every server stopped answering.
    #[error("no inference server is left: {} stopped answering (last error: {last})", urls.join(", "))]
    NoServers {
        /// The servers the generator was given.
        urls: Vec<String>,
        /// The last error seen.
        last: String,
    },
    /// A server answered something rein cannot use.
    #[error("{url}: {message}")]
    BadResponse {
        /// The server.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// Writing the policy for the servers failed.
    #[error("writing the policy to {path} for the servers failed: {reason}")]
    Weights {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// The generator has no policy yet.
    #[error("the generator was given no policy")]
    NoPolicy,
    /// Prompts with images for a generator or policy that cannot read them.
    #[error("{0}")]
    Images(String),
}

/// A source of completions for a policy that changes as it trains.
pub trait Generator<B: ReinBackend>: Send {
    /// `config.n` completions of each prompt, in the order `prompt * n + sample`; prompt `p`'s
    /// samples draw from the stream of [`crate::prompt_seed`]`(config.seed, p)`. A completion
    /// ends at a stop token (`config.stop_token_ids`), once its text contains one of `stops`,
    /// or at `config.max_new_tokens`.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        stops: &[String],
    ) -> Result<Vec<Generation>, GeneratorError>;

    /// [`Generator::generate`] for prompts with images: `images[p]` are prompt `p`'s, processed
    /// for the policy's image side, one `<image>` token per feature row in its prompt (a prompt
    /// without images has none). The default answers prompts without images and refuses the
    /// others.
    fn generate_with_images(
        &mut self,
        prompts: &[Vec<u32>],
        images: &[&[ProcessedImage]],
        config: &GenerationConfig,
        stops: &[String],
    ) -> Result<Vec<Generation>, GeneratorError> {
        if images.iter().any(|i| !i.is_empty()) {
            return Err(GeneratorError::Images(format!(
                "the {} generator cannot sample prompts with images",
                self.describe()
            )));
        }
        self.generate(prompts, config, stops)
    }

    /// From now on, sample from `policy`, which is version `version` (the number of updates
    /// it has had).
    fn update(&mut self, policy: &CausalLm<B>, version: u64) -> Result<(), GeneratorError>;

    /// The version of the policy the next completions come from.
    fn version(&self) -> u64;

    /// What it is, for logs ("native", "http: url, url").
    fn describe(&self) -> String;
}

/// The in-process batched KV-cache sampler ([`generate`]) on the last policy it was given.
pub struct NativeGenerator<B: ReinBackend> {
    policy: Option<CausalLm<B>>,
    version: u64,
    tokenizer: LmTokenizer,
    pad_id: u32,
    device: B::Device,
}

impl<B: ReinBackend> NativeGenerator<B> {
    /// A generator with no policy yet (call [`Generator::update`] first).
    pub fn new(tokenizer: LmTokenizer, device: &B::Device) -> Self {
        Self {
            policy: None,
            version: 0,
            pad_id: tokenizer.pad_id().unwrap_or(0),
            tokenizer,
            device: device.clone(),
        }
    }
}

impl<B: ReinBackend> Generator<B> for NativeGenerator<B>
where
    CausalLm<B>: Send,
{
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        stops: &[String],
    ) -> Result<Vec<Generation>, GeneratorError> {
        let policy = self.policy.as_ref().ok_or(GeneratorError::NoPolicy)?;
        let mut stop = stop_check(&self.tokenizer, stops);
        Ok(generate(policy, prompts, config, self.pad_id, &mut stop, &self.device))
    }

    fn generate_with_images(
        &mut self,
        prompts: &[Vec<u32>],
        images: &[&[ProcessedImage]],
        config: &GenerationConfig,
        stops: &[String],
    ) -> Result<Vec<Generation>, GeneratorError> {
        let policy = self.policy.as_ref().ok_or(GeneratorError::NoPolicy)?;
        let mut stop = stop_check(&self.tokenizer, stops);
        let prompts = PromptsWithImages { prompts, images };
        generate_prompts(policy, prompts, config, self.pad_id, &mut stop, &self.device)
    }

    fn update(&mut self, policy: &CausalLm<B>, version: u64) -> Result<(), GeneratorError> {
        self.policy = Some(policy.clone());
        self.version = version;
        Ok(())
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn describe(&self) -> String {
        "native".into()
    }
}

/// Prompts, and each one's images (processed for the policy's image side; empty for a text
/// prompt).
pub struct PromptsWithImages<'a> {
    /// The prompts' token ids.
    pub prompts: &'a [Vec<u32>],
    /// `images[p]` are prompt `p`'s.
    pub images: &'a [&'a [ProcessedImage]],
}

/// [`generate`] of `prompts`, through [`generate_with_images`] when some have images (their
/// features computed once, for the whole batch, by `policy`'s image side). An error when they
/// have images and the policy reads none, or their image tokens do not match the features.
pub fn generate_prompts<B: ReinBackend>(
    policy: &CausalLm<B>,
    PromptsWithImages { prompts, images }: PromptsWithImages<'_>,
    config: &GenerationConfig,
    pad_id: u32,
    stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    device: &B::Device,
) -> Result<Vec<Generation>, GeneratorError> {
    match PromptImages::of_prompts(policy.vision.as_ref(), prompts, images, device).map_err(GeneratorError::Images)? {
        Some(images) => {
            generate_with_images(policy, prompts, images, config, pad_id, stop, device).map_err(GeneratorError::Images)
        }
        None => Ok(generate(policy, prompts, config, pad_id, stop, device)),
    }
}
