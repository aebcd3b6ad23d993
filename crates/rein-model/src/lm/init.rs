//! Random initialisation of a [`CausalLm`] from a config, for training from scratch.

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::Tensor;
use rein_core::SeededRng;

use super::LmConfig;
use super::model::{Attention, CausalLm, DecoderLayer, FeedForward, RmsNorm};
use crate::backend::ReinBackend;
use crate::random;

/// How to initialise a model from scratch: transformers' scheme, `N(0, std²)` weights, zero
/// biases, unit norms.
#[derive(Debug, Clone, PartialEq)]
pub struct LmInit {
    /// The architecture.
    pub config: LmConfig,
    /// Standard deviation of the weights (`initializer_range`, 0.02 in HF configs).
    pub std: f64,
}

impl LmInit {
    /// Builds the model on `device`, its weights drawn from `rng`: layer by layer (q, k, v, o,
    /// gate, up, down), then the embedding, then the output head when it is not tied.
    pub fn init<B: ReinBackend>(&self, rng: &mut SeededRng, device: &B::Device) -> CausalLm<B> {
        let c = &self.config;
        let std = self.std;
        let linear = |rng: &mut SeededRng, input: usize, output: usize, bias: bool| Linear {
            weight: Param::from_tensor(random::normal::<B>(rng, [input, output], std, device)),
            bias: bias.then(|| Param::from_tensor(Tensor::zeros([output], device))),
        };
        let norm = || RmsNorm::new(Tensor::ones([c.hidden_size], device), c.rms_norm_eps);
        let (hidden, inter) = (c.hidden_size, c.intermediate_size);
        let (q_out, kv_out) = (c.num_attention_heads * c.head_dim(), c.kv_heads() * c.head_dim());
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for _ in 0..c.num_hidden_layers {
            let q = linear(rng, hidden, q_out, c.qkv_bias());
            let k = linear(rng, hidden, kv_out, c.qkv_bias());
            let v = linear(rng, hidden, kv_out, c.qkv_bias());
            let o = linear(rng, q_out, hidden, c.o_bias());
            let mlp = FeedForward {
                gate_proj: linear(rng, hidden, inter, c.mlp_bias),
                up_proj: linear(rng, hidden, inter, c.mlp_bias),
                down_proj: linear(rng, inter, hidden, c.mlp_bias),
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention::new(q, k, v, o, c),
                post_attention_layernorm: norm(),
                mlp,
            });
        }
        let embed_tokens = Embedding {
            weight: Param::from_tensor(random::normal::<B>(rng, [c.vocab_size, hidden], std, device)),
        };
        let lm_head = (!c.tie_word_embeddings).then(|| linear(rng, hidden, c.vocab_size, false));
        CausalLm::from_parts(c.clone(), embed_tokens, layers, norm(), lm_head)
    }
}
