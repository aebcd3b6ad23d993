//! Random initialisation of a [`CausalLm`] from a config, for training from scratch.

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::Tensor;
use rein_core::SeededRng;

use super::LmConfig;
use super::feed_forward::FeedForward;
use super::model::{Attention, CausalLm, DecoderLayer, MlpBlock};
use super::moe::MixtureOfExperts;
use super::rms_norm::RmsNorm;
use crate::backend::ReinBackend;
use crate::random;

/// How to initialise a model from scratch: transformers' scheme, `N(0, std²)` weights, zero
/// biases, norms that multiply by one (weights of one, or of zero where the norm adds one).
#[derive(Debug, Clone, PartialEq)]
pub struct LmInit {
    /// The architecture.
    pub config: LmConfig,
    /// Standard deviation of the weights (`initializer_range`, 0.02 in HF configs).
    pub std: f64,
}

impl LmInit {
    /// Builds the model on `device`, its weights drawn from `rng`: layer by layer (q, k, v, o,
    /// then gate, up, down — or the router, then each expert's gate, up, down), then the
    /// embedding, then the output head when it is not tied.
    pub fn init<B: ReinBackend>(&self, rng: &mut SeededRng, device: &B::Device) -> CausalLm<B> {
        let c = &self.config;
        let std = self.std;
        let linear = |rng: &mut SeededRng, input: usize, output: usize, bias: bool| Linear {
            weight: Param::from_tensor(random::normal::<B>(rng, [input, output], std, device)),
            bias: bias.then(|| Param::from_tensor(Tensor::zeros([output], device))),
        };
        let adds_one = c.family().norm_adds_one();
        let norm_of = |width: usize| {
            let weight = match adds_one {
                true => Tensor::zeros([width], device),
                false => Tensor::ones([width], device),
            };
            RmsNorm::new(weight, c.rms_norm_eps, adds_one)
        };
        let norm = || norm_of(c.hidden_size);
        let (hidden, inter) = (c.hidden_size, c.intermediate_size);
        let (q_out, kv_out) = (c.num_attention_heads * c.head_dim(), c.kv_heads() * c.head_dim());
        let feed_forward = |rng: &mut SeededRng, width: usize| {
            let gate = linear(rng, hidden, width, c.mlp_bias);
            let up = linear(rng, hidden, width, c.mlp_bias);
            let down = linear(rng, width, hidden, c.mlp_bias);
            FeedForward::new(gate, up, down, c.gate_activation())
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let q = linear(rng, hidden, q_out, c.qkv_bias());
            let k = linear(rng, hidden, kv_out, c.qkv_bias());
            let v = linear(rng, hidden, kv_out, c.qkv_bias());
            let o = linear(rng, q_out, hidden, c.o_bias());
            let mlp = match c.moe().filter(|_| c.is_moe_layer(i)) {
                Some(moe) => {
                    let router = linear(rng, hidden, moe.experts, false);
                    let experts = (0..moe.experts)
                        .map(|_| feed_forward(rng, moe.intermediate_size))
                        .collect();
                    MlpBlock::Experts(MixtureOfExperts::new(router, experts, moe.top_k, moe.norm_topk_prob))
                }
                None => MlpBlock::Dense(feed_forward(rng, inter)),
            };
            let norms = c.qk_norm().then(|| (norm_of(c.head_dim()), norm_of(c.head_dim())));
            let sandwich = || c.sandwich_norms().then(norm);
            layers.push(DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention::new([q, k, v, o], norms, c, i),
                post_attention_layernorm: norm(),
                pre_feedforward_layernorm: sandwich(),
                post_feedforward_layernorm: sandwich(),
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
