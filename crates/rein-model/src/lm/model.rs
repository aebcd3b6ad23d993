//! The decoder-only transformer of the Llama / Mistral / Qwen2 / Qwen3 / Qwen3-MoE / Gemma 2 /
//! Gemma 3 families (their differences: [`rein_gguf::LmConfig`]'s table).
//!
//! ```text
//! h₀ = E[x] (· √hidden: Gemma)
//! a  = W_o · Attn(RoPE(N_q(W_q RMSNorm(hₗ))), RoPE(N_k(W_k RMSNorm(hₗ))), W_v RMSNorm(hₗ))
//!        (grouped-query, causal, within a window on sliding layers; N_q, N_k per-head RMSNorms: Qwen3, Gemma 3)
//! hₗ' = hₗ + a                          (Gemma: hₗ + RMSNorm(a))
//! m  = W_down (act(W_gate RMSNorm(hₗ')) ⊙ W_up RMSNorm(hₗ'))   (act: SiLU, or GELU-tanh for Gemma;
//!        MoE layers: Σ over the token's top-k experts of its router weight times the expert's m)
//! hₗ₊₁ = hₗ' + m                        (Gemma: hₗ' + RMSNorm(m))
//! logits = W_head RMSNorm(h_L)          (W_head = E when embeddings are tied; Gemma 2: c·tanh(z/c))
//! ```

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::{Bool, Int, Tensor, TensorData, TensorPrimitive};

use rein_core::{ModelDtype, SeededRng};

use super::LmConfig;
use super::cache::{KvCache, LayerCache};
use super::context::Context;
use super::feed_forward::{FeedForward, MlpProducts};
use super::fused::{FusedLayer, FusedProjections, PackedWeights, Projection};
use super::lora::{LayerLora, Lora, LoraAdapters, LoraSpec, adapted};
use super::moe::{MixtureOfExperts, Routing};
use super::rms_norm::RmsNorm;
use super::rope::Rope;
use crate::backend::{Logits, ReinBackend, Scoring, affine};
use crate::vision::ImageSide;

/// At most this many bytes of `f32` logits exist at once in [`CausalLm::log_prob_entropy`]
/// (682 rows of a 49,152-token vocabulary). Each chunk's head product repacks the whole head
/// matrix, so fewer, larger chunks are faster: a SmolLM2 LoRA GRPO step took 21.1 s with
/// 64 MiB chunks, 20.2–20.6 s with these (rein alone, two runs each, on a machine that drifts
/// by about as much), for 0.1 GiB more peak memory.
pub const HEAD_CHUNK_BYTES: usize = 128 << 20;

/// Grouped-query self-attention with rotary embeddings.
#[derive(Module, Debug)]
pub struct Attention<B: ReinBackend> {
    /// `W_q`.
    pub q_proj: Linear<B>,
    /// `W_k`.
    pub k_proj: Linear<B>,
    /// `W_v`.
    pub v_proj: Linear<B>,
    /// `W_o`.
    pub o_proj: Linear<B>,
    /// Qwen3, Gemma 3: an RMSNorm over each query head (`[head_dim]`), before RoPE.
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3, Gemma 3: an RMSNorm over each key head, before RoPE.
    pub k_norm: Option<RmsNorm<B>>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    kv_heads: usize,
    #[module(skip)]
    head_dim: usize,
    /// The scale, window and cap of the scores.
    #[module(skip)]
    scoring: Scoring,
    /// Rotated by the local RoPE tables (Gemma 3's sliding layers).
    #[module(skip)]
    local_rope: bool,
}

/// A decoder layer's MLP: one for every token, or a mixture of experts.
// One per layer: the dense variant's size costs nothing, and boxing it would put every dense
// model's MLP behind a pointer for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum MlpBlock<B: ReinBackend> {
    /// One gated MLP.
    Dense(FeedForward<B>),
    /// Each token through its top-k experts (Qwen3-MoE).
    Experts(MixtureOfExperts<B>),
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: ReinBackend> {
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// Norm before the MLP; with four norms (Gemma), the norm of the attention's output.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Gemma: the norm before the MLP.
    pub pre_feedforward_layernorm: Option<RmsNorm<B>>,
    /// Gemma: the norm of the MLP's output.
    pub post_feedforward_layernorm: Option<RmsNorm<B>>,
    /// The MLP.
    pub mlp: MlpBlock<B>,
}

/// A causal language model (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`,
/// `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM`), and
/// with an image side ([`CausalLm::vision`]) a vision-language model
/// (`Idefics3ForConditionalGeneration`).
#[derive(Module, Debug)]
pub struct CausalLm<B: ReinBackend> {
    /// Token embeddings, `[vocab, hidden]`.
    pub embed_tokens: Embedding<B>,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final norm.
    pub norm: RmsNorm<B>,
    /// The LM head; `None` when tied to the embeddings.
    pub lm_head: Option<Linear<B>>,
    /// LoRA adapters on the decoder layers' linear layers ([`CausalLm::with_lora`]).
    pub lora: Option<LoraAdapters<B>>,
    /// A vision-language model's image side (Idefics3 / SmolVLM): the features its prompts'
    /// image tokens read; `None` for a text-only model.
    pub vision: Option<ImageSide<B>>,
    #[module(skip)]
    config: LmConfig,
    /// The packed forms its weights were loaded from, if any ([`CausalLm::with_packed`]).
    #[module(skip)]
    packed: Option<std::sync::Arc<PackedWeights>>,
    /// The dtype the decoder layers' linear layers multiply in ([`CausalLm::with_dtype`]).
    #[module(skip)]
    dtype: ModelDtype,
}

/// How one decoder layer multiplies: by its projections arranged for inference or by its own
/// weights, with its LoRA adapters, in the model's dtype.
struct Products<'a, B: ReinBackend> {
    fused: Option<&'a FusedLayer<B>>,
    lora: Option<&'a LayerLora<B>>,
    dtype: ModelDtype,
}

// By hand: derived, they would ask `B: Copy`.
impl<B: ReinBackend> Clone for Products<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: ReinBackend> Copy for Products<'_, B> {}

impl<B: ReinBackend> Attention<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        ctx: &Context<'_, B>,
        products: Products<'_, B>,
        cache: Option<&mut LayerCache<B>>,
        key_padding: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 3> {
        let Products { fused, lora, dtype } = products;
        let [batch, seq, width] = x.dims();
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        // Queries, keys and values as `[batch, seq, heads, head_dim]` (views, not copies).
        let (q, k, v) = match fused {
            Some(fused) => {
                let qkv = fused
                    .qkv(x.reshape([batch * seq, width]))
                    .reshape([batch, seq, h + 2 * kvh, d]);
                let heads = |start: usize, count: usize| qkv.clone().narrow(2, start, count);
                (heads(0, h), heads(h, kvh), heads(h + kvh, kvh))
            }
            None => {
                let split = |t: Tensor<B, 3>, heads: usize| t.reshape([batch, seq, heads, d]);
                let adapter = |name: &str| lora.and_then(|l| l.get(name));
                (
                    split(project(&self.q_proj, adapter("q_proj"), x.clone(), dtype), h),
                    split(project(&self.k_proj, adapter("k_proj"), x.clone(), dtype), kvh),
                    split(project(&self.v_proj, adapter("v_proj"), x, dtype), kvh),
                )
            }
        };
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(q_norm), Some(k_norm)) => (q_norm.forward(q), k_norm.forward(k)),
            _ => (q, k),
        };
        // `[batch, heads, seq, head_dim]`, as the kernels read them.
        let (q, k, v) = (q.swap_dims(1, 2), k.swap_dims(1, 2), v.swap_dims(1, 2));
        let q = ctx.rope.apply(q, &ctx.positions, self.local_rope);
        let k = ctx.rope.apply(k, &ctx.positions, self.local_rope);
        let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
        let scoring = self.scoring;
        let out = match cache {
            // Generation: the backend's kernel reads the cache in place. A window layer's
            // buffers start at the first position they still hold.
            Some(cache) => {
                let offset = cache.len();
                let (k, v) = cache.append(k, v);
                let first = cache.dropped();
                let padding = key_padding.map(|p| p.narrow(1, first, offset + seq - first).into_primitive());
                B::cached_attention(raw(q), raw(k), raw(v), offset - first, padding, scoring)
            }
            // Training and scoring: whole sequences, with gradients on autodiff backends.
            None => match ctx.sequences {
                Some(sequences) => B::varlen_causal_attention(raw(q), raw(k), raw(v), sequences, scoring),
                None => B::causal_attention(raw(q), raw(k), raw(v), key_padding.map(Tensor::into_primitive), scoring),
            },
        };
        let out = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(out));
        let out = out.reshape([batch, seq, h * d]);
        match fused.and_then(|f| f.o.as_ref()) {
            Some(o) => {
                let bias = self.o_proj.bias.as_ref().map(|b| b.val());
                o.forward(out.reshape([batch * seq, h * d]), bias)
                    .reshape([batch, seq, width])
            }
            None => project(&self.o_proj, lora.and_then(|l| l.o_proj.as_ref()), out, dtype),
        }
    }
}

/// A linear layer (and its adapter) on `[batch, seq, in]` as one `[batch·seq, in] × [in, out]`
/// matrix product. burn's `Linear` on a 3-D input runs a batched product with one small matrix
/// per sequence (a matrix-vector product per sequence when decoding), which wastes the weights'
/// reuse.
fn project<B: ReinBackend>(
    layer: &Linear<B>,
    adapter: Option<&Lora<B>>,
    x: Tensor<B, 3>,
    dtype: ModelDtype,
) -> Tensor<B, 3> {
    let [batch, seq, width] = x.dims();
    let y = adapted(layer, adapter, x.reshape([batch * seq, width]), dtype);
    let out = y.dims()[1];
    y.reshape([batch, seq, out])
}

impl<B: ReinBackend> MlpBlock<B> {
    /// The gated MLPs: the one of a dense layer, or every expert.
    pub fn feed_forwards(&self) -> Vec<&FeedForward<B>> {
        match self {
            MlpBlock::Dense(mlp) => vec![mlp],
            MlpBlock::Experts(moe) => moe.experts.iter().collect(),
        }
    }

    fn feed_forwards_mut(&mut self) -> Vec<&mut FeedForward<B>> {
        match self {
            MlpBlock::Dense(mlp) => vec![mlp],
            MlpBlock::Experts(moe) => moe.experts.iter_mut().collect(),
        }
    }

    fn forward(
        &self,
        x: Tensor<B, 3>,
        products: Products<'_, B>,
        layer: usize,
        routing: Option<&Routing<B>>,
    ) -> Tensor<B, 3> {
        let Products { fused, lora, dtype } = products;
        let [batch, seq, width] = x.dims();
        let x = x.reshape([batch * seq, width]);
        // The `i`-th gated MLP (the dense one, or expert `i`) as it multiplies.
        let expert = |i: usize| MlpProducts {
            fused: fused.map(|f| &f.mlp[i]),
            adapters: lora.map_or([None; 3], |l| l.mlp_adapters(i)),
            dtype,
        };
        let out = match self {
            MlpBlock::Dense(mlp) => mlp.forward(x, expert(0)),
            MlpBlock::Experts(moe) => moe.forward(x, expert, layer, routing),
        };
        out.reshape([batch, seq, width])
    }
}

impl<B: ReinBackend> DecoderLayer<B> {
    /// Every linear layer with its Hugging Face path within the layer (`self_attn.q_proj`,
    /// `mlp.down_proj`, `mlp.experts.3.up_proj`): attention's four, then the MLP's, expert by
    /// expert. The router of a mixture of experts is not among them.
    pub fn linears(&self) -> Vec<(String, &Linear<B>)> {
        let attn = &self.self_attn;
        let mut linears: Vec<(String, &Linear<B>)> = [
            ("q_proj", &attn.q_proj),
            ("k_proj", &attn.k_proj),
            ("v_proj", &attn.v_proj),
            ("o_proj", &attn.o_proj),
        ]
        .into_iter()
        .map(|(name, linear)| (format!("self_attn.{name}"), linear))
        .collect();
        let experts = matches!(self.mlp, MlpBlock::Experts(_));
        for (e, mlp) in self.mlp.feed_forwards().into_iter().enumerate() {
            for (name, linear) in mlp.linears() {
                let path = match experts {
                    true => format!("mlp.experts.{e}.{name}"),
                    false => format!("mlp.{name}"),
                };
                linears.push((path, linear));
            }
        }
        linears
    }

    /// The linear layers of [`DecoderLayer::linears`], in its order, mutable.
    fn linears_mut(&mut self) -> Vec<&mut Linear<B>> {
        let attn = &mut self.self_attn;
        let mut linears: Vec<&mut Linear<B>> =
            vec![&mut attn.q_proj, &mut attn.k_proj, &mut attn.v_proj, &mut attn.o_proj];
        for mlp in self.mlp.feed_forwards_mut() {
            linears.extend(mlp.linears_mut());
        }
        linears
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: Tensor<B, 3>,
        ctx: &Context<'_, B>,
        products: Products<'_, B>,
        cache: Option<&mut LayerCache<B>>,
        key_padding: Option<Tensor<B, 2, Bool>>,
        layer: usize,
    ) -> Tensor<B, 3> {
        let normed = self.input_layernorm.forward(x.clone());
        let attended = self.self_attn.forward(normed, ctx, products, cache, key_padding);
        let mlp = |x: Tensor<B, 3>| self.mlp.forward(x, products, layer, ctx.routing);
        match (&self.pre_feedforward_layernorm, &self.post_feedforward_layernorm) {
            // Gemma: each block's output normed before the residual sum.
            (Some(pre), Some(post)) => {
                let x = x + self.post_attention_layernorm.forward(attended);
                x.clone() + post.forward(mlp(pre.forward(x)))
            }
            _ => {
                let x = x + attended;
                x.clone() + mlp(self.post_attention_layernorm.forward(x))
            }
        }
    }
}

impl<B: ReinBackend> CausalLm<B> {
    /// Assembles a model from its parts (see [`super::checkpoint`] for loading and
    /// [`super::init`] for random initialisation).
    pub(crate) fn from_parts(
        config: LmConfig,
        embed_tokens: Embedding<B>,
        layers: Vec<DecoderLayer<B>>,
        norm: RmsNorm<B>,
        lm_head: Option<Linear<B>>,
    ) -> Self {
        Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            lora: None,
            vision: None,
            config,
            packed: None,
            dtype: ModelDtype::F32,
        }
    }

    /// This model with the packed forms of its weights (from a quantised file): inference
    /// multiplies by them wherever they still equal the weights exactly, reading a fraction of
    /// the bytes for the same results ([`FusedProjections`]). Training never uses them.
    pub fn with_packed(mut self, packed: PackedWeights) -> Self {
        self.packed = (!packed.is_empty()).then(|| std::sync::Arc::new(packed));
        self
    }

    /// This model without the packed forms of its weights: it computes with its `f32` weights
    /// (for a quantised file, the codes decoded), as a model loaded from `f32` safetensors.
    pub fn without_packed(mut self) -> Self {
        self.packed = None;
        self
    }

    /// This model multiplying in `dtype` at its decoder layers' linear layers, in training and
    /// inference ([`ModelDtype`]). Its weights stay as they are (`f32`): with
    /// [`ModelDtype::Bf16`] each product rounds its weight and input to bf16, so a trainer's
    /// gradients and updates are of the `f32` weights (mixed precision's master weights). The
    /// packed forms of a quantised file are not read in bf16: inference multiplies by the
    /// weights, rounded.
    pub fn with_dtype(mut self, dtype: ModelDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// The dtype its decoder layers' linear layers multiply in ([`CausalLm::with_dtype`]).
    pub fn dtype(&self) -> ModelDtype {
        self.dtype
    }

    /// The packed forms of its weights, if it has any.
    pub fn packed_weights(&self) -> Option<&PackedWeights> {
        self.packed.as_deref()
    }

    /// Starts a training step's LoRA dropout masks from `key` ([`LoraAdapters::set_dropout_key`]);
    /// nothing without adapters.
    pub fn set_dropout_key(&self, key: u64) {
        if let Some(lora) = &self.lora {
            lora.set_dropout_key(key);
        }
        if let Some(vision) = &self.vision {
            vision.set_dropout_key(key);
        }
    }

    /// The architecture.
    pub fn config(&self) -> &LmConfig {
        &self.config
    }

    /// This model with fresh LoRA adapters on the layers `spec` targets ([`Lora::new`]: the
    /// outputs are unchanged) and every base weight frozen: only the adapters get gradients,
    /// so only they get optimiser state. Replaces any adapters it had. The adapters' `A`
    /// factors are drawn from `rng`, layer by layer; with `spec.vision`, a vision-language
    /// model's encoder blocks get adapters too ([`ImageSide::with_lora`]), drawn after the
    /// decoder's.
    pub fn with_lora(self, spec: &LoraSpec, rng: &mut SeededRng, device: &B::Device) -> Self {
        let mut model = self.no_grad();
        let layers = model
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                let experts = layer.mlp.feed_forwards().len();
                let slots = layer
                    .linears()
                    .into_iter()
                    .enumerate()
                    .map(|(slot, (path, linear))| {
                        let [input, output] = linear.weight.dims();
                        // Attention's and a dense MLP's places are layer · 7 + slot, as
                        // before experts existed (so seeded runs keep their masks).
                        let place = match matches!(layer.mlp, MlpBlock::Experts(_)) && slot >= 4 {
                            false => (i * 7 + slot) as u64,
                            true => (1 << 32) + ((i * experts) * 3 + slot - 4) as u64,
                        };
                        let name = path.rsplit('.').next().unwrap_or_default();
                        let adapter = spec
                            .targets(name)
                            .then(|| Lora::new(input, output, spec, rng, device).at(place));
                        (path, adapter)
                    })
                    .collect();
                LayerLora::from_slots(slots)
            })
            .collect();
        model.lora = Some(LoraAdapters::new(layers, spec.clone()));
        if spec.vision {
            model.vision = model.vision.map(|vision| vision.with_lora(spec, rng, device));
        }
        model
    }

    /// This model with its adapters merged into the base weights (`W + (α/r)·A·B`) and removed:
    /// the same function as one plain checkpoint. Without adapters, the model itself.
    pub fn merged(&self) -> Self {
        let mut model = self.clone();
        model.vision = model.vision.map(ImageSide::merged);
        let Some(lora) = model.lora.take() else {
            return model;
        };
        for (layer, adapters) in model.layers.iter_mut().zip(&lora.layers) {
            for (linear, (_, adapter)) in layer.linears_mut().into_iter().zip(adapters.adapters()) {
                if let Some(adapter) = adapter {
                    let weight = (linear.weight.val() + adapter.delta()).detach();
                    linear.weight = Param::from_tensor(weight).set_require_grad(false);
                }
            }
        }
        model
    }

    /// The layers' projections arranged for inference, for [`Context::fused`].
    pub fn fused_projections(&self) -> FusedProjections<B> {
        let packed_form = |name: &str, weight: Tensor<B, 2>| {
            let exact = B::reads_packed_weights() && self.dtype == ModelDtype::F32;
            let packed = self.packed.as_ref().filter(|_| exact)?.get(name)?;
            B::equals_packed(weight.into_primitive().tensor(), packed).then(|| packed.clone())
        };
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                let packed = |path: &str, linear: &Linear<B>| {
                    packed_form(&format!("model.layers.{i}.{path}.weight"), linear.weight.val())
                };
                FusedLayer::new(
                    &layer.linears(),
                    self.lora.as_ref().map(|l| &l.layers[i]),
                    &packed,
                    self.dtype,
                )
            })
            .collect();
        let head = match packed_form("lm_head.weight", self.head_weight()) {
            Some(packed) => Projection::packed(vec![(packed, None)]),
            None => Projection::Dense(match &self.lm_head {
                Some(head) => head.weight.val(),
                None => {
                    let weight = self.embed_tokens.weight.val();
                    let ([vocab, hidden], device) = (weight.dims(), weight.device());
                    let data = weight.into_data();
                    let dtype = data.dtype;
                    let values = data.convert::<f32>().to_vec::<f32>().unwrap_or_default();
                    let head = TensorData::new(rein_kernels::transposed(&values, vocab, hidden), [hidden, vocab]);
                    Tensor::from_data(head.convert_dtype(dtype), &device)
                }
            }),
        };
        FusedProjections { layers, head }
    }

    /// Rotary tables for positions `0..max_len` (both bases, for Gemma 3).
    pub fn rope(&self, max_len: usize, device: &B::Device) -> Rope<B> {
        Rope::new(&self.config, max_len, device)
    }

    /// The final hidden states (after the last norm).
    ///
    /// With a cache, the new keys and values are appended to it and attention covers everything
    /// cached so far; `ctx.padding` then describes the new tokens only.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]` → `[batch, seq, hidden]`
    pub fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        ctx: &Context<'_, B>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.hidden_of_embeddings(self.embed(tokens), ctx, cache)
    }

    /// The tokens' input embeddings (scaled where the family scales them).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]` → `[batch, seq, hidden]`
    pub fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = self.embed_tokens.forward(tokens);
        match self.config.embedding_scale() {
            Some(scale) => x.mul_scalar(scale),
            None => x,
        }
    }

    /// [`CausalLm::hidden`] of input embeddings: [`CausalLm::embed`]'s, or a vision-language
    /// model's with image features in place of its image tokens.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, hidden]` → `[batch, seq, hidden]`
    pub fn hidden_of_embeddings(
        &self,
        mut x: Tensor<B, 3>,
        ctx: &Context<'_, B>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let key_padding = match cache.as_deref_mut() {
            Some(cache) => cache.push_padding(ctx.padding.clone(), [batch, seq]),
            None => ctx.padding.clone(),
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|c| c.layer(i));
            let products = Products {
                fused: ctx.fused.map(|f| &f.layers[i]),
                lora: self.lora.as_ref().map(|l| &l.layers[i]),
                dtype: self.dtype,
            };
            x = layer.forward(x, ctx, products, layer_cache, key_padding.clone(), i);
        }
        if let Some(cache) = cache {
            cache.commit();
        }
        self.norm.forward(x)
    }

    /// The final hidden states of `sequences` batched together, right-padded with `pad` to the
    /// longest, `[sequences.len(), longest, hidden]`: each sequence attends to its own tokens
    /// only, at positions from 0, as transformers runs a right-padded batch with its attention
    /// mask (one sequence, or several of one length, run unpadded). The padding's rows are not
    /// meaningful.
    pub fn padded_hidden<S: AsRef<[u32]>>(&self, sequences: &[S], pad: u32, device: &B::Device) -> Tensor<B, 3> {
        let batch = sequences.len();
        let seq = sequences.iter().map(|ids| ids.as_ref().len()).max().unwrap_or(0);
        let tokens: Vec<i64> = (sequences.iter())
            .flat_map(|ids| (0..seq).map(move |t| i64::from(ids.as_ref().get(t).copied().unwrap_or(pad))))
            .collect();
        let padding = sequences.iter().any(|ids| ids.as_ref().len() < seq).then(|| {
            let flags: Vec<bool> = (sequences.iter())
                .flat_map(|ids| (0..seq).map(move |t| t >= ids.as_ref().len()))
                .collect();
            Tensor::<B, 2, Bool>::from_data(TensorData::new(flags, [batch, seq]), device)
        });
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let rope = self.rope(seq, device);
        let ctx = Context {
            rope: &rope,
            positions,
            padding,
            sequences: None,
            fused: None,
            routing: None,
        };
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [batch, seq]), device);
        self.hidden(tokens, &ctx, None)
    }

    /// [`CausalLm::padded_hidden`] read at the tokens `at` (`(sequence, position)` pairs),
    /// `[at.len(), hidden]`; a position past its sequence's end reads the padding's row.
    ///
    /// # Panics
    /// When a pair names a sequence that does not exist, or a position past the longest.
    pub fn hidden_at<S: AsRef<[u32]>>(
        &self,
        sequences: &[S],
        pad: u32,
        at: &[(usize, usize)],
        device: &B::Device,
    ) -> Tensor<B, 2> {
        let longest = sequences.iter().map(|ids| ids.as_ref().len()).max().unwrap_or(0);
        for &(row, position) in at {
            assert!(
                row < sequences.len() && position < longest,
                "token ({row}, {position}) is not in the {} sequences of up to {longest} tokens",
                sequences.len()
            );
        }
        let width = self.config.hidden_size;
        if at.is_empty() {
            return Tensor::zeros([0, width], device);
        }
        let hidden = self.padded_hidden(sequences, pad, device);
        let rows: Vec<i64> = at
            .iter()
            .map(|&(row, position)| (row * longest + position) as i64)
            .collect();
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [at.len()]), device);
        hidden.reshape([sequences.len() * longest, width]).select(0, rows)
    }

    /// Logits over the vocabulary.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, hidden]` → `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, width] = hidden.dims();
        let logits = affine(hidden.reshape([batch * seq, width]), self.head_weight(), None);
        self.capped(logits).reshape([batch, seq, self.config.vocab_size])
    }

    /// [`CausalLm::logits`] through the head kept in `fused` (the same numbers, read faster).
    pub fn fused_logits(&self, hidden: Tensor<B, 3>, fused: &FusedProjections<B>) -> Tensor<B, 3> {
        let [batch, seq, width] = hidden.dims();
        let logits = fused.head.forward(hidden.reshape([batch * seq, width]), None);
        self.capped(logits).reshape([batch, seq, self.config.vocab_size])
    }

    /// The logits soft-capped, `c·tanh(z/c)`, where the config caps them (Gemma 2).
    fn capped(&self, logits: Tensor<B, 2>) -> Tensor<B, 2> {
        match self.logit_softcap() {
            Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
            None => logits,
        }
    }

    /// The cap of the logits (`final_logit_softcapping`), if any.
    pub fn logit_softcap(&self) -> Option<f32> {
        self.config.final_logit_softcapping.map(|c| c as f32)
    }

    /// The head as a `[hidden, vocab]` matrix: `W_head`, or the embeddings' transpose (a view)
    /// when tied. Heads have no bias (neither the loader nor the initialiser gives them one).
    pub fn head_weight(&self) -> Tensor<B, 2> {
        match &self.lm_head {
            Some(head) => head.weight.val(),
            None => self.embed_tokens.weight.val().transpose(),
        }
    }

    /// Per row of `hidden`, the log-probability of its target token and the entropy of the
    /// next-token distribution `softmax(scale · logits)`, as `[log pₜ, H]`. The logits are
    /// computed a few rows at a time and never kept ([`HeadKernels::head_log_prob_entropy`](crate::HeadKernels::head_log_prob_entropy)): at
    /// most [`HEAD_CHUNK_BYTES`] of them exist at once, in the forward and backward passes.
    ///
    /// # Shapes
    /// - `hidden`: `[rows, hidden]`, `targets`: `[rows]` → `[rows, 2]`
    pub fn log_prob_entropy(&self, hidden: Tensor<B, 2>, targets: Tensor<B, 1, Int>, scale: f32) -> Tensor<B, 2> {
        let chunk = (HEAD_CHUNK_BYTES / (4 * self.config.vocab_size.max(1))).max(1);
        let out = B::head_log_prob_entropy(
            hidden.into_primitive().tensor(),
            self.head_weight().into_primitive().tensor(),
            targets.into_primitive(),
            Logits {
                scale,
                softcap: self.logit_softcap(),
            },
            chunk,
        );
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    /// `logits(hidden(tokens))`.
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        ctx: &Context<'_, B>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        self.logits(self.hidden(tokens, ctx, cache))
    }
}

impl<B: ReinBackend> Attention<B> {
    /// Layer `layer`'s attention of a `config` model: these projections, and the per-head norms
    /// of queries and keys where the family has them.
    pub(crate) fn new(
        [q, k, v, o]: [Linear<B>; 4],
        norms: Option<(RmsNorm<B>, RmsNorm<B>)>,
        config: &LmConfig,
        layer: usize,
    ) -> Self {
        let (q_norm, k_norm) = norms.unzip();
        let window = config.layer_attention().get(layer).and_then(|a| a.window());
        Self {
            q_proj: q,
            k_proj: k,
            v_proj: v,
            o_proj: o,
            q_norm,
            k_norm,
            heads: config.num_attention_heads,
            kv_heads: config.kv_heads(),
            head_dim: config.head_dim(),
            scoring: Scoring {
                scale: config.attention_scale(),
                window,
                softcap: config.attn_logit_softcapping.map(|c| c as f32),
            },
            local_rope: config.layer_uses_local_rope(layer),
        }
    }

    /// Which keys each query sees, and how its scores are formed.
    pub fn scoring(&self) -> Scoring {
        self.scoring
    }
}
