//! rein's burn modules: the networks that are trained.
//!
//! - [`Mlp`]: a multilayer perceptron, orthogonal or PyTorch-default initialisation.
//! - [`ActorCritic`]: separate actor and critic MLPs with a categorical or diagonal-Gaussian
//!   action head (CleanRL's PPO agent).
//! - [`QNetwork`], [`GaussianActor`], [`DeterministicActor`]: SAC's and TD3's networks
//!   (CleanRL's).
//! - [`FlatMlp`]: the same MLP in one flat `f32` buffer, run forward and backward by hand on
//!   rein-kernels' products (no autodiff, no tensors) with the module's values and gradients
//!   bit for bit: the small networks of SAC and TD3 train through it.
//! - [`lm::CausalLm`]: Llama / Qwen2 / Mistral / SmolLM causal language models, loaded from and
//!   saved to model directories in Hugging Face format, with their tokenizers ([`lm::LmTokenizer`]).
//! - GGUF files are read and converted by `rein-gguf`, which owns every plain checkpoint file
//!   (`config.json`, safetensors writing, quantised codes); this crate loads the result.
//! - [`lm::lora`]: LoRA adapters on a model's linear layers (base frozen), and [`lm::peft`]:
//!   them in PEFT's format.
//! - [`vision`]: vision-language models (Idefics3 / SmolVLM): image decoding and processing as
//!   transformers does it, the SigLIP encoder, image features in a causal LM's embeddings.
//! - [`random`]: initial weights drawn from the caller's own generator, never from burn's
//!   process-wide one.
//!
//! **Architecture invariant:** modules are generic over the burn backend (`Autodiff<Flex>` on
//! the CPU by default; the `cuda` feature adds burn-cuda). This crate knows nothing about
//! environments, plugins, rewards or training loops: it maps tensors to tensors (and text to
//! tokens, images to pixel values).

mod actor_critic;
mod backend;
mod flat_mlp;
pub mod lm;
mod mlp;
mod off_policy;
mod one_graph;
pub mod random;
pub mod safetensors_file;
pub mod vision;

pub use actor_critic::{ActionHead, ActorCritic, ActorCriticConfig};
pub use backend::{
    AttentionKernels, CudaMatmul, GluKernels, HeadKernels, LinearKernels, LoraKernels, NormKernels, PackedSequences,
    ReinAutodiffBackend, ReinBackend, RopeKernels, Scoring, TanhKernels, affine, cuda_matmul, generic_ops, held_in,
    set_cuda_matmul, use_generic_ops,
};
#[cfg(feature = "cuda")]
pub use backend::{cublas_calls, cublas_library};
pub use flat_mlp::{FlatMlp, Trace};
pub use mlp::{Activation, Mlp, MlpConfig, MlpInit};
pub use off_policy::{DeterministicActor, GaussianActor, OffPolicyConfig, QNetwork};
pub use one_graph::one_graph;

/// The default CPU backend for inference.
pub type Cpu = burn::backend::Flex;
/// The default CPU backend for training.
pub type CpuAutodiff = burn::backend::Autodiff<burn::backend::Flex>;
