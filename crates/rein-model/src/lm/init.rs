//! Random initialisation of a [`CausalLm`] from a config, for training from scratch.

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::{Distribution, Tensor};

use super::config::LmConfig;
use super::model::{Attention, CausalLm, DecoderLayer, Mlp, RmsNorm};
use crate::backend::Backend;

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
    /// Builds the model on `device` from the backend's (seeded) generator.
    pub fn init<B: Backend>(&self, device: &B::Device) -> CausalLm<B> {
        let c = &self.config;
        let normal = |shape: [usize; 2]| Tensor::<B, 2>::random(shape, Distribution::Normal(0.0, self.std), device);
        let linear = |input: usize, output: usize, bias: bool| Linear {
            weight: Param::from_tensor(normal([input, output])),
            bias: bias.then(|| Param::from_tensor(Tensor::zeros([output], device))),
        };
        let norm = || RmsNorm::new(Tensor::ones([c.hidden_size], device), c.rms_norm_eps);
        let (hidden, inter) = (c.hidden_size, c.intermediate_size);
        let (q_out, kv_out) = (c.num_attention_heads * c.head_dim(), c.kv_heads() * c.head_dim());
        let layers = (0..c.num_hidden_layers)
            .map(|_| DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention::new(
                    linear(hidden, q_out, c.qkv_bias()),
                    linear(hidden, kv_out, c.qkv_bias()),
                    linear(hidden, kv_out, c.qkv_bias()),
                    linear(q_out, hidden, c.o_bias()),
                    c,
                ),
                post_attention_layernorm: norm(),
                mlp: Mlp {
                    gate_proj: linear(hidden, inter, c.mlp_bias),
                    up_proj: linear(hidden, inter, c.mlp_bias),
                    down_proj: linear(inter, hidden, c.mlp_bias),
                },
            })
            .collect();
        let embed_tokens = Embedding {
            weight: Param::from_tensor(normal([c.vocab_size, hidden])),
        };
        let lm_head = (!c.tie_word_embeddings).then(|| linear(hidden, c.vocab_size, false));
        CausalLm::from_parts(c.clone(), embed_tokens, layers, norm(), lm_head)
    }
}
