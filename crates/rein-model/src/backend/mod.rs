//! The backends rein's modules run on: any burn backend, plus rein's fused kernels where a
//! backend has a faster path than its generic ops.
//!
//! Each kernel is a method of [`Backend`] whose default composes burn's own ops, so any backend
//! qualifies with an empty `impl` (the CUDA one does) and autodiff keeps working (the autodiff
//! backend uses the defaults, except for `tanh`). Flex overrides them in [`flex`]:
//!
//! - `tanh`: burn-flex computes it with libm's scalar `tanhf` and burn's autodiff recomputes it
//!   in the backward pass; with 64-wide PPO networks that was over half of each update. Here it
//!   is one vectorised pass, and its autodiff version keeps the output for a one-pass backward
//!   `g · (1 − y²)`.
//! - `rms_norm`, `rope`, `swiglu`, `cached_attention`, `write_cache`: one pass each instead of
//!   two to ten burn ops; attention (decoding and prefill alike) reads the key/value cache in
//!   place instead of copying its filled prefix and repeating it per query head, and writes its
//!   output in the layout the next projection reads; the cache is written in place.
//! - `causal_attention` (training and scoring): its backward recomputes each query's weights
//!   from `q` and `k` and writes `∂q`, `∂k`, `∂v` in one pass per sequence, where burn's
//!   autodiff of its attention ops kept `[batch, heads, seq, seq]` weights and copied repeated
//!   keys, masks and transposed views several times per layer (over a third of a GRPO step).
//! - `fused_linear`: one `gemm` call with the bias folded in, on both cores from a smaller size than
//!   burn-flex's matmul uses them.
//! - `lora_linear`: a LoRA layer `x·W + b + (s·x·A)·B` as one op whose update is accumulated
//!   into the base product's output, forward and backward: the composed ops allocated, scaled
//!   and added a `[rows, out]` update per adapted layer, about 4% of a SmolLM2 LoRA GRPO step here.
//! - `head_log_prob_entropy` (every backend): the chosen tokens' log-probabilities and the
//!   entropies from the hidden states and the head, a few rows of logits at a time, recomputed
//!   in the backward pass: never `[rows, vocab]` logits, which at a real vocabulary would be
//!   gigabytes. Flex computes each row's `[log pₜ, H]` and its gradient in one pass
//!   (`log_prob_entropy`).
//!
//! These are what decoding a token and a training step spend their time on.

mod flex;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::TensorMetadata;
use burn::tensor::ops::{AttentionModuleOptions, BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_autodiff::{Autodiff, NodeId};
use rein_kernels::PackedMatrix;

/// A burn backend with rein's fused kernels. The defaults use burn's own ops, so any backend
/// qualifies with an empty `impl`.
pub trait Backend: burn::tensor::backend::Backend {
    /// Element-wise `tanh`.
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_tanh(x)
    }

    /// `grad · (1 − output²)`, the gradient of `tanh` from its output.
    fn tanh_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        tanh_backward_ops::<Self>(output, grad)
    }

    /// Into how many shards, each decoded by its own thread with its own key/value cache, to
    /// split a decoding batch of `rows` sequences. One (the default) on backends that
    /// parallelise each op themselves.
    fn decode_shards(rows: usize) -> usize {
        let _ = rows;
        1
    }

    /// A linear layer, `x · W + b`.
    ///
    /// # Shapes
    /// - `x`: `[rows, in]`, `weight`: `[in, out]`, `bias`: `[out]` → `[rows, out]`
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        linear_ops::<Self>(x, weight, bias)
    }

    /// A linear layer with a LoRA update, `y = x·W + b + (s·x·A)·B`, and the adapter's scaled
    /// projection `s·x·A` (which its gradients need). On Flex the update is accumulated into
    /// the base product's output: no `[rows, out]` temporaries for the update, its scale or
    /// the sum.
    ///
    /// # Shapes
    /// - `x`: `[rows, in]`, `weight`: `[in, out]`, `bias`: `[out]`, `a`: `[in, r]`,
    ///   `b`: `[r, out]` → (`[rows, out]`, `[rows, r]`)
    fn lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        lora_linear_ops::<Self>(x, weight, bias, a, b, scale)
    }

    /// The gradients of [`Backend::lora_linear`] with respect to `x`, `A` and `B`, given the
    /// output's and the forward's `down = s·x·A`: with `e = s·∂y·Bᵀ`,
    /// `∂x = ∂y·Wᵀ + e·Aᵀ`, `∂A = xᵀ·e`, `∂B = downᵀ·∂y`.
    ///
    /// # Shapes
    /// - as [`Backend::lora_linear`]'s, `down`: `[rows, r]`, `grad`: `[rows, out]` →
    ///   (`[rows, in]`, `[in, r]`, `[r, out]`)
    #[allow(clippy::too_many_arguments)]
    fn lora_linear_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        down: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        lora_linear_backward_ops::<Self>(x, weight, a, b, down, grad, scale)
    }

    /// Whether [`Backend::packed_linear`] reads packed weights directly (and so is worth using
    /// for inference); the default unpacks them first.
    fn reads_packed_weights() -> bool {
        false
    }

    /// A linear layer whose weight is kept packed, `x · [W₁ W₂ …] + b`: the parts' columns side
    /// by side. The same numbers as [`Backend::fused_linear`] on the unpacked weight.
    ///
    /// # Shapes
    /// - `x`: `[rows, in]`, each part `[in, outᵢ]`, `bias`: `[Σ outᵢ]` → `[rows, Σ outᵢ]`
    fn packed_linear(
        x: FloatTensor<Self>,
        parts: &[&PackedMatrix],
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        packed_linear_ops::<Self>(x, parts, bias)
    }

    /// Whether `weight` (`[in, out]`) holds exactly the values of `packed`. Flex remembers the
    /// weights it found equal and answers again without comparing while they are unchanged.
    fn equals_packed(weight: FloatTensor<Self>, packed: &Arc<PackedMatrix>) -> bool {
        equals_packed_ops::<Self>(weight, packed)
    }

    /// A matrix product `a · b` (views of transposes welcome).
    ///
    /// # Shapes
    /// - `a`: `[rows, inner]`, `b`: `[inner, cols]` → `[rows, cols]`
    fn matmul(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(a, b)
    }

    /// The SwiGLU gate, `silu(gate) ⊙ up`, element-wise.
    ///
    /// # Shapes
    /// - `gate`, `up`: `[rows, width]` → `[rows, width]`
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        swiglu_ops::<Self>(gate, up)
    }

    /// The gradients of [`Backend::swiglu`] given the output's, `(∂gate, ∂up)`:
    /// `∂up = ∂y ⊙ silu(gate)`, `∂gate = ∂y ⊙ up ⊙ σ(gate) ⊙ (1 + gate ⊙ (1 − σ(gate)))`.
    ///
    /// # Shapes
    /// - `gate`, `up`, `grad`: `[rows, width]` → two `[rows, width]`
    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        swiglu_backward_ops::<Self>(gate, up, grad)
    }

    /// RMSNorm of each row, as transformers computes it: `w ⊙ x / sqrt(mean(x²) + ε)`.
    ///
    /// # Shapes
    /// - `x`: `[rows, hidden]`, `weight`: `[hidden]` → `[rows, hidden]`
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        rms_norm_ops::<Self>(x, weight, eps)
    }

    /// The gradients of [`Backend::rms_norm`] given the output's, `(∂x, ∂w)`: with
    /// `r = 1/sqrt(mean(x²) + ε)` per row and `x̂ = x r`, `∂w = Σ_rows ∂y ⊙ x̂` and
    /// `∂x = r (g − x̂ mean(g ⊙ x̂))` where `g = ∂y ⊙ w`.
    ///
    /// # Shapes
    /// - `x`, `grad`: `[rows, hidden]`, `weight`: `[hidden]` → `[rows, hidden]` and `[hidden]`
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        rms_norm_backward_ops::<Self>(x, weight, grad, eps)
    }

    /// Rotary embedding in the "rotate half" layout: `x · cos[p] + rotate_half(x) · sin[p]` with
    /// `rotate_half([a, b]) = [−b, a]` and `p` each token's position.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `positions`: `[batch, seq]`,
    ///   `cos`, `sin`: `[max_len, head_dim]` → like `x`
    fn rope(
        x: FloatTensor<Self>,
        positions: IntTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        rope_ops::<Self>(x, positions, cos, sin)
    }

    /// Writes `values` into `buffer` at positions `start..` of axis 2 and returns the buffer.
    /// In place when the buffer is not shared (burn-flex's `slice_assign` copies the whole
    /// buffer first, which made every decoding step copy the key/value cache).
    ///
    /// # Shapes
    /// - `buffer`: `[batch, heads, capacity, head_dim]`, `values`: `[batch, heads, seq, head_dim]`
    fn write_cache(buffer: FloatTensor<Self>, values: FloatTensor<Self>, start: usize) -> FloatTensor<Self> {
        write_cache_ops::<Self>(buffer, values, start)
    }

    /// Causal scaled dot-product attention of `seq` new tokens per sequence over a key/value
    /// cache whose first `offset + seq` positions are filled (the new tokens' own keys and
    /// values last), the query heads of each key/value head sharing it.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, seq, head_dim]`, `heads` a multiple of `kv_heads`
    /// - `k`, `v`: `[batch, kv_heads, capacity, head_dim]`, positions `offset + seq..` unused
    /// - `padding`: `[batch, offset + seq]`, `true` where a key is padding (a padding token still
    ///   attends to itself, so no row is empty)
    /// - → `[batch, seq, heads, head_dim]`
    fn cached_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        offset: usize,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        cached_attention_ops::<Self>(q, k, v, offset, padding)
    }

    /// Causal attention of whole sequences (training and scoring, no cache): attention over
    /// keys and values of the same `seq` tokens. Its autodiff version has its own backward,
    /// [`Backend::causal_attention_backward`].
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, seq, head_dim]`, `k`, `v`: `[batch, kv_heads, seq, head_dim]`,
    ///   `padding`: `[batch, seq]` (as for [`Backend::cached_attention`]) → `[batch, seq, heads, head_dim]`
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::cached_attention(q, k, v, 0, padding)
    }

    /// The gradients of [`Backend::causal_attention`] given the output's, `(∂q, ∂k, ∂v)`. With
    /// `P = softmax(q kᵀ/√d)` (masked) per query head and `∂P = ∂O vᵀ`:
    /// `∂v = Pᵀ ∂O`, `∂S = P ⊙ (∂P − rowsum(P ⊙ ∂P))`, `∂q = ∂S k/√d`, `∂k = ∂Sᵀ q/√d`, the key
    /// and value gradients summed over the query heads that share them. `P` is recomputed,
    /// not stored: one more `q kᵀ` costs less than keeping `[batch, heads, seq, seq]` per layer.
    ///
    /// # Shapes
    /// - as [`Backend::causal_attention`]'s inputs, `grad` like its output → like `q`, `k`, `v`
    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        causal_attention_backward_ops::<Self>(q, k, v, padding, grad)
    }

    /// Causal attention of sequences packed end to end along the token axis, without padding:
    /// sequence `i` is the `lengths[i]` tokens after those of sequences `0..i`, and attends to
    /// its own tokens only. What [`Backend::causal_attention`] computes for each sequence
    /// alone, without the rows a padded batch spends on padding. Its autodiff version has its
    /// own backward, [`Backend::packed_causal_attention_backward`].
    ///
    /// # Shapes
    /// - `q`: `[1, heads, total, head_dim]`, `k`, `v`: `[1, kv_heads, total, head_dim]` with
    ///   `total = Σ lengths` → `[1, total, heads, head_dim]`
    fn packed_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
    ) -> FloatTensor<Self> {
        packed_causal_attention_ops::<Self>(q, k, v, lengths)
    }

    /// The gradients of [`Backend::packed_causal_attention`] given the output's: each
    /// sequence's as [`Backend::causal_attention_backward`] gives them.
    ///
    /// # Shapes
    /// - as [`Backend::packed_causal_attention`]'s inputs, `grad` like its output → like `q`, `k`, `v`
    fn packed_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        packed_causal_attention_backward_ops::<Self>(q, k, v, lengths, grad)
    }

    /// Per row of `logits`, the chosen token's log-probability and the entropy of the
    /// distribution `p = softmax(scale · z)`: `[log pₜ, H]` with
    /// `log pₜ = scale·zₜ − log Σⱼ exp(scale·zⱼ)` and `H = −Σⱼ pⱼ log pⱼ`.
    ///
    /// # Shapes
    /// - `logits`: `[rows, vocab]`, `targets`: `[rows]` → `[rows, 2]`
    fn log_prob_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>, scale: f32) -> FloatTensor<Self> {
        log_prob_entropy_ops::<Self>(logits, targets, scale)
    }

    /// The gradient of [`Backend::log_prob_entropy`] given its output's, `[g_lp, g_H]` per row:
    /// `∂zⱼ = scale · (g_lp · (1[j = t] − pⱼ) − g_H · pⱼ · (log pⱼ + H))`.
    ///
    /// # Shapes
    /// - `logits`: `[rows, vocab]`, `targets`: `[rows]`, `grad`: `[rows, 2]` → `[rows, vocab]`
    fn log_prob_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        log_prob_entropy_backward_ops::<Self>(logits, targets, scale, grad)
    }

    /// [`Backend::log_prob_entropy`] of the logits `hidden · W`, computed `chunk` rows at a
    /// time: at most `[chunk, vocab]` logits exist at once, never `[rows, vocab]` (6.4 GB for
    /// 64 sequences × 512 tokens × 49,152 tokens of vocabulary). The autodiff version keeps
    /// only `hidden` and `W` and recomputes each chunk's logits in its backward
    /// ([`Backend::head_log_prob_entropy_backward`]).
    ///
    /// # Shapes
    /// - `hidden`: `[rows, width]`, `weight`: `[width, vocab]`, `targets`: `[rows]` → `[rows, 2]`
    fn head_log_prob_entropy(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        chunk: usize,
    ) -> FloatTensor<Self> {
        let hidden = float::<Self, 2>(hidden);
        let targets = Tensor::<Self, 1, Int>::from_primitive(targets);
        let parts: Vec<Tensor<Self, 2>> = row_chunks(hidden.dims()[0], chunk)
            .map(|(start, rows)| {
                let h = hidden.clone().narrow(0, start, rows).into_primitive().tensor();
                let logits = Self::fused_linear(h, weight.clone(), None);
                let t = targets.clone().narrow(0, start, rows).into_primitive();
                float(Self::log_prob_entropy(logits, t, scale))
            })
            .collect();
        match parts.is_empty() {
            true => Tensor::<Self, 2>::zeros([0, 2], &hidden.device())
                .into_primitive()
                .tensor(),
            false => Tensor::cat(parts, 0).into_primitive().tensor(),
        }
    }

    /// The gradients of [`Backend::head_log_prob_entropy`] given its output's, chunk by chunk
    /// with each chunk's logits recomputed: `∂hidden = ∂Z · Wᵀ` and, when `weight_grad`,
    /// `∂W = Σ_chunks hiddenᵀ · ∂Z` (`∂Z` from [`Backend::log_prob_entropy_backward`]). A frozen
    /// head (LoRA) skips `∂W`, a product as large as the forward one.
    ///
    /// # Shapes
    /// - as [`Backend::head_log_prob_entropy`]'s inputs, `grad`: `[rows, 2]` →
    ///   `([rows, width], [width, vocab])`
    fn head_log_prob_entropy_backward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        chunk: usize,
        grad: FloatTensor<Self>,
        weight_grad: bool,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>) {
        let hidden = float::<Self, 2>(hidden);
        let (targets, grad) = (Tensor::<Self, 1, Int>::from_primitive(targets), float::<Self, 2>(grad));
        let weight_t = Self::float_transpose(weight.clone());
        let mut d_hidden = Vec::new();
        let mut d_weight: Option<FloatTensor<Self>> = None;
        for (start, rows) in row_chunks(hidden.dims()[0], chunk) {
            let h = hidden.clone().narrow(0, start, rows).into_primitive().tensor();
            let logits = Self::fused_linear(h.clone(), weight.clone(), None);
            let t = targets.clone().narrow(0, start, rows).into_primitive();
            let g = grad.clone().narrow(0, start, rows).into_primitive().tensor();
            let d_logits = Self::log_prob_entropy_backward(logits, t, scale, g);
            d_hidden.push(float::<Self, 2>(Self::matmul(d_logits.clone(), weight_t.clone())));
            if weight_grad {
                let d_w = Self::matmul(Self::float_transpose(h), d_logits);
                d_weight = Some(match d_weight {
                    Some(sum) => Self::float_add(sum, d_w),
                    None => d_w,
                });
            }
        }
        let d_hidden = match d_hidden.is_empty() {
            true => hidden.zeros_like(),
            false => Tensor::cat(d_hidden, 0),
        };
        let d_weight = match (weight_grad, d_weight) {
            (true, None) => Some(float::<Self, 2>(weight).zeros_like().into_primitive().tensor()),
            (_, d_weight) => d_weight,
        };
        (d_hidden.into_primitive().tensor(), d_weight)
    }
}

/// `(start, rows)` of consecutive blocks of at most `chunk` rows covering `0..rows`.
fn row_chunks(rows: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..rows)
        .step_by(chunk)
        .map(move |start| (start, chunk.min(rows - start)))
}

/// Set: every kernel of [`Backend`] on Flex takes its default, burn's generic ops.
static GENERIC_OPS: AtomicBool = AtomicBool::new(false);

/// Makes Flex compute every kernel of [`Backend`] with burn's generic ops, as the backends
/// without rein's kernels do (CUDA), instead of rein's fused CPU kernels; process-wide. This
/// is how the CPU tests check the path a GPU run takes: same model, same results within
/// rounding. Not for speed: the generic ops are several times slower.
pub fn use_generic_ops(on: bool) {
    GENERIC_OPS.store(on, Ordering::Relaxed);
}

fn generic_ops() -> bool {
    GENERIC_OPS.load(Ordering::Relaxed)
}

/// `grad · (1 − output²)` in burn ops: [`Backend::tanh_backward`]'s default.
fn tanh_backward_ops<B: burn::tensor::backend::Backend>(
    output: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let one_minus_sq = B::float_add_scalar(B::float_neg(B::float_powi_scalar(output, 2.into())), 1f32.into());
    B::float_mul(grad, one_minus_sq)
}

/// `layer` on `[rows, in]`, through [`Backend::fused_linear`].
pub(crate) fn linear<B: Backend>(layer: &burn::nn::Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    affine(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

/// `x · W + b` on `[rows, in]` with `W` `[in, out]` (a transposed view is fine), through
/// [`Backend::fused_linear`].
pub(crate) fn affine<B: Backend>(x: Tensor<B, 2>, weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 2> {
    let y = B::fused_linear(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
    );
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// [`Backend::packed_linear`] by unpacking the weight: [`Backend::fused_linear`] on its dense copy.
pub(crate) fn packed_linear_ops<B: Backend>(
    x: FloatTensor<B>,
    parts: &[&PackedMatrix],
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let device = B::float_device(&x);
    let input = parts.first().map_or(0, |p| p.shape()[0]);
    let columns: usize = parts.iter().map(|p| p.shape()[1]).sum();
    let mut weight = vec![0.0f32; input * columns];
    let mut at = 0;
    for part in parts {
        let (values, width) = (part.to_dense(), part.shape()[1]);
        for (dst, src) in weight.chunks_exact_mut(columns).zip(values.chunks_exact(width)) {
            dst[at..at + width].copy_from_slice(src);
        }
        at += width;
    }
    let weight = Tensor::<B, 2>::from_data(burn::tensor::TensorData::new(weight, [input, columns]), &device);
    B::fused_linear(x, weight.into_primitive().tensor(), bias)
}

/// [`Backend::equals_packed`] through the weight's data.
pub(crate) fn equals_packed_ops<B: burn::tensor::backend::Backend>(
    weight: FloatTensor<B>,
    packed: &PackedMatrix,
) -> bool {
    let weight = float::<B, 2>(weight);
    weight.dims() == packed.shape()
        && weight
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .is_ok_and(|values| packed.equals(&values))
}

fn float<B: burn::tensor::backend::Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// [`Backend::fused_linear`] in burn ops.
pub(crate) fn linear_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    burn::tensor::module::linear(float::<B, 2>(x), float::<B, 2>(weight), bias.map(float::<B, 1>))
        .into_primitive()
        .tensor()
}

/// [`Backend::lora_linear`] in burn ops.
pub(crate) fn lora_linear_ops<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    scale: f32,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let down = B::float_mul_scalar(B::matmul(x.clone(), a), scale.into());
    let update = B::matmul(down.clone(), b);
    (B::float_add(B::fused_linear(x, weight, bias), update), down)
}

/// [`Backend::lora_linear_backward`] in burn ops.
pub(crate) fn lora_linear_backward_ops<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    down: FloatTensor<B>,
    grad: FloatTensor<B>,
    scale: f32,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let e = B::float_mul_scalar(B::matmul(grad.clone(), B::float_transpose(b)), scale.into());
    let d_x = B::float_add(
        B::matmul(grad.clone(), B::float_transpose(weight)),
        B::matmul(e.clone(), B::float_transpose(a)),
    );
    let d_a = B::matmul(B::float_transpose(x), e);
    let d_b = B::matmul(B::float_transpose(down), grad);
    (d_x, d_a, d_b)
}

/// [`Backend::swiglu`] in burn ops.
pub(crate) fn swiglu_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    (burn::tensor::activation::silu(float::<B, 2>(gate)) * float::<B, 2>(up))
        .into_primitive()
        .tensor()
}

/// Registers the gradients of a two-input op's inputs, those that track gradients.
fn register_inputs<B: Backend, const N: usize>(
    inputs: [Option<NodeId>; N],
    grads: &mut Gradients,
    values: [FloatTensor<B>; N],
) {
    for (id, grad) in inputs.into_iter().zip(values) {
        if let Some(id) = id {
            grads.register::<B>(id, grad);
        }
    }
}

/// [`Backend::swiglu_backward`] in burn ops.
pub(crate) fn swiglu_backward_ops<B: burn::tensor::backend::Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (gate, up, grad) = (float::<B, 2>(gate), float::<B, 2>(up), float::<B, 2>(grad));
    let sigmoid = burn::tensor::activation::sigmoid(gate.clone());
    let d_up = grad.clone() * gate.clone() * sigmoid.clone();
    let slope = sigmoid.clone() * (gate * (sigmoid.neg().add_scalar(1.0))).add_scalar(1.0);
    let d_gate = grad * up * slope;
    (d_gate.into_primitive().tensor(), d_up.into_primitive().tensor())
}

/// [`Backend::rms_norm`] in burn ops.
pub(crate) fn rms_norm_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    eps: f64,
) -> FloatTensor<B> {
    let x = float::<B, 2>(x);
    let rms = x.clone().powi_scalar(2).mean_dim(1).add_scalar(eps).sqrt();
    ((x / rms) * float::<B, 1>(weight).unsqueeze::<2>())
        .into_primitive()
        .tensor()
}

/// [`Backend::rms_norm_backward`] in burn ops.
pub(crate) fn rms_norm_backward_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    eps: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, weight, grad) = (float::<B, 2>(x), float::<B, 1>(weight), float::<B, 2>(grad));
    let r = x.clone().powi_scalar(2).mean_dim(1).add_scalar(eps).sqrt().recip();
    let normed = x * r.clone();
    let d_weight = (grad.clone() * normed.clone()).sum_dim(0).squeeze_dim::<1>(0);
    let g = grad * weight.unsqueeze::<2>();
    let projection = (g.clone() * normed.clone()).mean_dim(1);
    let d_x = (g - normed * projection) * r;
    (d_x.into_primitive().tensor(), d_weight.into_primitive().tensor())
}

/// [`Backend::rope`] in burn ops.
pub(crate) fn rope_ops<B: burn::tensor::backend::Backend>(
    x: FloatTensor<B>,
    positions: IntTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let x = float::<B, 4>(x);
    let [batch, _, seq, dim] = x.dims();
    let half = dim / 2;
    let flat = Tensor::<B, 2, Int>::from_primitive(positions).reshape([batch * seq]);
    let cos = float::<B, 2>(cos).select(0, flat.clone()).reshape([batch, 1, seq, dim]);
    let sin = float::<B, 2>(sin).select(0, flat).reshape([batch, 1, seq, dim]);
    let first = x.clone().narrow(3, 0, half);
    let second = x.clone().narrow(3, half, half);
    let rotated = Tensor::cat(vec![second.neg(), first], 3);
    (x * cos + rotated * sin).into_primitive().tensor()
}

/// [`Backend::write_cache`] in burn ops.
pub(crate) fn write_cache_ops<B: burn::tensor::backend::Backend>(
    buffer: FloatTensor<B>,
    values: FloatTensor<B>,
    start: usize,
) -> FloatTensor<B> {
    let values = float::<B, 4>(values);
    let [batch, heads, seq, dim] = values.dims();
    float::<B, 4>(buffer)
        .slice_assign([0..batch, 0..heads, start..start + seq, 0..dim], values)
        .into_primitive()
        .tensor()
}

/// [`Backend::cached_attention`] in burn ops (and so with gradients, on an autodiff backend).
pub(crate) fn cached_attention_ops<B: burn::tensor::backend::Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    offset: usize,
    padding: Option<BoolTensor<B>>,
) -> FloatTensor<B> {
    let q = float::<B, 4>(q);
    let [batch, heads, seq, dim] = q.dims();
    let kv_heads = float::<B, 4>(k.clone()).dims()[1];
    let keys = offset + seq;
    let rep = heads / kv_heads;
    // Each key/value head repeated for the query heads that share it.
    let repeat = |t: FloatTensor<B>| {
        let t = float::<B, 4>(t).narrow(2, 0, keys);
        if rep == 1 {
            t
        } else {
            t.unsqueeze_dim::<5>(2)
                .expand([batch, kv_heads, rep, keys, dim])
                .reshape([batch, heads, keys, dim])
        }
    };
    let padding = padding.map(Tensor::<B, 2, Bool>::from_primitive);
    let mask = attention_mask::<B>(batch, seq, keys, offset, padding, &q.device());
    burn::tensor::module::attention(
        q,
        repeat(k),
        repeat(v),
        Some(mask.expand([batch, heads, seq, keys])),
        None,
        AttentionModuleOptions::default(),
    )
    .swap_dims(1, 2)
    .into_primitive()
    .tensor()
}

/// [`Backend::causal_attention_backward`] in burn ops.
pub(crate) fn causal_attention_backward_ops<B: burn::tensor::backend::Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    padding: Option<BoolTensor<B>>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let [batch, heads, seq, dim] = q.dims();
    let kv_heads = k.dims()[1];
    let rep = heads / kv_heads;
    let scale = 1.0 / (dim as f64).sqrt();
    let repeat = |t: Tensor<B, 4>| {
        t.unsqueeze_dim::<5>(2)
            .expand([batch, kv_heads, rep, seq, dim])
            .reshape([batch, heads, seq, dim])
    };
    // The key/value heads' gradients: the sum over the query heads sharing each.
    let fold = |t: Tensor<B, 4>| {
        t.reshape([batch, kv_heads, rep, seq, dim])
            .sum_dim(2)
            .reshape([batch, kv_heads, seq, dim])
    };
    let (k, v) = (repeat(k), repeat(v));
    let padding = padding.map(Tensor::<B, 2, Bool>::from_primitive);
    let mask = attention_mask::<B>(batch, seq, seq, 0, padding, &q.device()).expand([batch, heads, seq, seq]);
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)).mul_scalar(scale);
    let p = burn::tensor::activation::softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 3);
    let d_out = float::<B, 4>(grad).swap_dims(1, 2);
    let d_v = p.clone().swap_dims(2, 3).matmul(d_out.clone());
    let d_p = d_out.matmul(v.swap_dims(2, 3));
    let d_s = p.clone() * (d_p.clone() - (p * d_p).sum_dim(3));
    let d_q = d_s.clone().matmul(k).mul_scalar(scale);
    let d_k = d_s.swap_dims(2, 3).matmul(q).mul_scalar(scale);
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    (raw(d_q), raw(fold(d_k)), raw(fold(d_v)))
}

/// Where each packed sequence starts, and its length.
pub(crate) fn packed_spans(lengths: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    lengths.iter().scan(0, |start, &len| {
        *start += len;
        Some((*start - len, len))
    })
}

/// [`Backend::packed_causal_attention`] as one [`Backend::causal_attention`] per sequence.
pub(crate) fn packed_causal_attention_ops<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    lengths: &[usize],
) -> FloatTensor<B> {
    let (q, k, v) = (float::<B, 4>(q), float::<B, 4>(k), float::<B, 4>(v));
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let outputs = packed_spans(lengths)
        .map(|(start, len)| {
            let part = |t: &Tensor<B, 4>| raw(t.clone().narrow(2, start, len));
            float::<B, 4>(B::causal_attention(part(&q), part(&k), part(&v), None))
        })
        .collect();
    raw(Tensor::cat(outputs, 1))
}

/// [`Backend::packed_causal_attention_backward`] as one [`Backend::causal_attention_backward`]
/// per sequence.
pub(crate) fn packed_causal_attention_backward_ops<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    lengths: &[usize],
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (q, k, v, grad) = (
        float::<B, 4>(q),
        float::<B, 4>(k),
        float::<B, 4>(v),
        float::<B, 4>(grad),
    );
    let raw = |t: Tensor<B, 4>| t.into_primitive().tensor();
    let (mut d_q, mut d_k, mut d_v) = (Vec::new(), Vec::new(), Vec::new());
    for (start, len) in packed_spans(lengths) {
        let part = |t: &Tensor<B, 4>| raw(t.clone().narrow(2, start, len));
        let grad = raw(grad.clone().narrow(1, start, len));
        let (q, k, v) = B::causal_attention_backward(part(&q), part(&k), part(&v), None, grad);
        d_q.push(float::<B, 4>(q));
        d_k.push(float::<B, 4>(k));
        d_v.push(float::<B, 4>(v));
    }
    (
        raw(Tensor::cat(d_q, 2)),
        raw(Tensor::cat(d_k, 2)),
        raw(Tensor::cat(d_v, 2)),
    )
}

/// [`Backend::log_prob_entropy`] in burn ops.
pub(crate) fn log_prob_entropy_ops<B: burn::tensor::backend::Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    scale: f32,
) -> FloatTensor<B> {
    let logits = float::<B, 2>(logits);
    let rows = logits.dims()[0];
    let targets = Tensor::<B, 1, Int>::from_primitive(targets).reshape([rows, 1]);
    let log_p = burn::tensor::activation::log_softmax(logits.mul_scalar(scale), 1);
    let chosen = log_p.clone().gather(1, targets);
    let entropy = (log_p.clone().exp() * log_p).sum_dim(1).neg();
    Tensor::cat(vec![chosen, entropy], 1).into_primitive().tensor()
}

/// [`Backend::log_prob_entropy_backward`] in burn ops.
pub(crate) fn log_prob_entropy_backward_ops<B: burn::tensor::backend::Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    scale: f32,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let logits = float::<B, 2>(logits);
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    let targets = Tensor::<B, 1, Int>::from_primitive(targets)
        .reshape([rows, 1])
        .expand([rows, vocab]);
    let tokens = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device)
        .reshape([1, vocab])
        .expand([rows, vocab]);
    let chosen = tokens.equal(targets).float();
    let log_p = burn::tensor::activation::log_softmax(logits.mul_scalar(scale), 1);
    let p = log_p.clone().exp();
    let entropy = (p.clone() * log_p.clone()).sum_dim(1).neg();
    let grad = float::<B, 2>(grad).mul_scalar(scale);
    let (g_lp, g_h) = (grad.clone().narrow(1, 0, 1), grad.narrow(1, 1, 1));
    ((chosen - p.clone()) * g_lp - p * (log_p + entropy) * g_h)
        .into_primitive()
        .tensor()
}

/// `true` where a query may not attend: future keys, and padding keys other than itself (a
/// padding query keeps itself so no row is fully masked).
///
/// # Shapes
/// → `[batch, 1, seq, keys]`; queries are the last `seq` of `keys` positions.
fn attention_mask<B: burn::tensor::backend::Backend>(
    batch: usize,
    seq: usize,
    keys: usize,
    offset: usize,
    key_padding: Option<Tensor<B, 2, Bool>>,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let query_pos = Tensor::<B, 1, Int>::arange(offset as i64..(offset + seq) as i64, device).reshape([1, 1, seq, 1]);
    let key_pos = Tensor::<B, 1, Int>::arange(0..keys as i64, device).reshape([1, 1, 1, keys]);
    let future = key_pos.clone().greater(query_pos.clone());
    let Some(padding) = key_padding else {
        return future.expand([batch, 1, seq, keys]);
    };
    let other = key_pos.not_equal(query_pos);
    let padded = padding.reshape([batch, 1, 1, keys]);
    future
        .expand([batch, 1, seq, keys])
        .bool_or(padded.bool_and(other.expand([batch, 1, seq, keys])))
}

/// How the sequences of a whole-sequence attention lie in its inputs.
#[derive(Debug, Clone)]
enum Sequences<B: Backend> {
    /// One per batch entry, with its padding ([`Backend::causal_attention`]).
    Padded(Option<BoolTensor<B>>),
    /// End to end in one entry, of these lengths ([`Backend::packed_causal_attention`]).
    Packed(Vec<usize>),
}

impl<B: Backend> Sequences<B> {
    fn attention(&self, q: FloatTensor<B>, k: FloatTensor<B>, v: FloatTensor<B>) -> FloatTensor<B> {
        match self {
            Sequences::Padded(padding) => B::causal_attention(q, k, v, padding.clone()),
            Sequences::Packed(lengths) => B::packed_causal_attention(q, k, v, lengths),
        }
    }

    fn backward(
        self,
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        match self {
            Sequences::Padded(padding) => B::causal_attention_backward(q, k, v, padding, grad),
            Sequences::Packed(lengths) => B::packed_causal_attention_backward(q, k, v, &lengths, grad),
        }
    }
}

/// Whole-sequence attention on the autodiff backend: the inner backend's, with the inner
/// backend's own backward (which recomputes the attention weights instead of keeping them).
fn tracked_attention<B: Backend, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    sequences: Sequences<B>,
) -> FloatTensor<Autodiff<B, C>> {
    #[derive(Debug)]
    struct Attention;

    impl<B: Backend> Backward<B, 3> for Attention {
        /// `q`, `k`, `v` and where the sequences are.
        type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, Sequences<B>);

        fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (q, k, v, sequences) = ops.state;
            let grad = grads.consume::<B>(&ops.node);
            let inputs = ops.parents.map(|node| node.map(|n| n.id));
            let (d_q, d_k, d_v) = sequences.backward(q, k, v, grad);
            register_inputs::<B, 3>(inputs, grads, [d_q, d_k, d_v]);
        }
    }

    match Attention
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let output = sequences.attention(q.primitive.clone(), k.primitive.clone(), v.primitive.clone());
            prep.finish((q.primitive, k.primitive, v.primitive, sequences), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(sequences.attention(q.primitive, k.primitive, v.primitive)),
    }
}

/// A [`Backend`] that records gradients, whose inner backend is a [`Backend`] too.
pub trait AutodiffBackend: Backend + burn::tensor::backend::AutodiffBackend<InnerBackend: Backend> {}

impl<B: burn::tensor::backend::AutodiffBackend<InnerBackend: Backend> + Backend> AutodiffBackend for B {}

#[cfg(feature = "cuda")]
impl Backend for burn::backend::Cuda {}

impl<B: Backend, C: CheckpointStrategy> Backend for Autodiff<B, C> {
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Tanh;

        impl<B: Backend> Backward<B, 1> for Tanh {
            /// The forward output.
            type State = FloatTensor<B>;

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let output = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| B::tanh_backward(output, grad));
            }
        }

        match Tanh.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let output = B::tanh(x.primitive);
                prep.finish(output.clone(), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::tanh(x.primitive)),
        }
    }

    /// RMSNorm with its own backward ([`Backend::rms_norm_backward`], one pass on Flex).
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RmsNorm;

        impl<B: Backend> Backward<B, 2> for RmsNorm {
            /// `x`, `w` and ε.
            type State = (FloatTensor<B>, FloatTensor<B>, f64);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (x, weight, eps) = ops.state;
                let grad = grads.consume::<B>(&ops.node);
                let inputs = ops.parents.map(|node| node.map(|n| n.id));
                let (d_x, d_weight) = B::rms_norm_backward(x, weight, grad, eps);
                register_inputs::<B, 2>(inputs, grads, [d_x, d_weight]);
            }
        }

        match RmsNorm
            .prepare::<C>([x.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (x.primitive.clone(), weight.primitive.clone(), eps);
                prep.finish(state, B::rms_norm(x.primitive, weight.primitive, eps))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rms_norm(x.primitive, weight.primitive, eps)),
        }
    }

    /// SwiGLU with its own backward ([`Backend::swiglu_backward`], one pass on Flex).
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Swiglu;

        impl<B: Backend> Backward<B, 2> for Swiglu {
            /// `gate` and `up`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (gate, up) = ops.state;
                let grad = grads.consume::<B>(&ops.node);
                let inputs = ops.parents.map(|node| node.map(|n| n.id));
                let (d_gate, d_up) = B::swiglu_backward(gate, up, grad);
                register_inputs::<B, 2>(inputs, grads, [d_gate, d_up]);
            }
        }

        match Swiglu
            .prepare::<C>([gate.node.clone(), up.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (gate.primitive.clone(), up.primitive.clone());
                prep.finish(state, B::swiglu(gate.primitive, up.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu(gate.primitive, up.primitive)),
        }
    }

    /// Rotary embedding with its own backward on the inner backend's kernel. RoPE rotates
    /// each pair `(xᵢ, xᵢ₊ₕ)` by the angle `θ` of its position; with the tables' two halves
    /// equal (how [`crate::lm::Rope`] builds them) the transpose of that rotation is the
    /// rotation by `−θ`: `∂x = rope(∂y, cos, −sin)`.
    fn rope(
        x: FloatTensor<Self>,
        positions: IntTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Rope;

        impl<B: Backend> Backward<B, 1> for Rope {
            /// Positions, cos and sin tables.
            type State = (IntTensor<B>, FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (positions, cos, sin) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::rope(grad, positions, cos, B::float_neg(sin))
                });
            }
        }

        let (cos, sin) = (cos.primitive, sin.primitive);
        match Rope.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let state = (positions.clone(), cos.clone(), sin.clone());
                prep.finish(state, B::rope(x.primitive, positions, cos, sin))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rope(x.primitive, positions, cos, sin)),
        }
    }

    /// Whole-sequence attention with its own backward ([`Backend::causal_attention_backward`], which
    /// recomputes the attention weights instead of keeping them).
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        tracked_attention::<B, C>(q, k, v, Sequences::Padded(padding))
    }

    /// Packed attention with its own backward ([`Backend::packed_causal_attention_backward`]).
    fn packed_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
    ) -> FloatTensor<Self> {
        tracked_attention::<B, C>(q, k, v, Sequences::Packed(lengths.to_vec()))
    }

    /// The head's log-probabilities and entropies with their own backward
    /// ([`Backend::head_log_prob_entropy_backward`], which recomputes the logits chunk by chunk).
    fn head_log_prob_entropy(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        chunk: usize,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct HeadLogProbEntropy;

        impl<B: Backend> Backward<B, 2> for HeadLogProbEntropy {
            /// The hidden states, head weight, targets, scale and chunk size.
            type State = (FloatTensor<B>, FloatTensor<B>, IntTensor<B>, f32, usize);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [hidden_node, weight_node] = ops.parents.map(|node| node.map(|n| n.id));
                let (hidden, weight, targets, scale, chunk) = ops.state;
                let (d_hidden, d_weight) = B::head_log_prob_entropy_backward(
                    hidden,
                    weight,
                    targets,
                    scale,
                    chunk,
                    grad,
                    weight_node.is_some(),
                );
                if let Some(id) = hidden_node {
                    grads.register::<B>(id, d_hidden);
                }
                if let (Some(id), Some(d_weight)) = (weight_node, d_weight) {
                    grads.register::<B>(id, d_weight);
                }
            }
        }

        match HeadLogProbEntropy
            .prepare::<C>([hidden.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let state = (
                    hidden.primitive.clone(),
                    weight.primitive.clone(),
                    targets.clone(),
                    scale,
                    chunk,
                );
                prep.finish(
                    state,
                    B::head_log_prob_entropy(hidden.primitive, weight.primitive, targets, scale, chunk),
                )
            }
            OpsKind::UnTracked(prep) => prep.finish(B::head_log_prob_entropy(
                hidden.primitive,
                weight.primitive,
                targets,
                scale,
                chunk,
            )),
        }
    }

    /// [`Backend::lora_linear`] with its own backward ([`Backend::lora_linear_backward`]; `∂W`
    /// and `∂b` only when the base layer is trained too, which LoRA's is not).
    fn lora_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        #[derive(Debug)]
        struct LoraLinear;

        /// `x`, `W`, `A`, `B`, `down = s·x·A` and `s`.
        type State<B> = (
            FloatTensor<B>,
            FloatTensor<B>,
            FloatTensor<B>,
            FloatTensor<B>,
            FloatTensor<B>,
            f32,
        );

        /// Registers the gradients of `x`, `W`, `A` and `B` (parents 0, 1, 3 and 4).
        fn backward_inputs<B: Backend>(
            [x_node, w_node, a_node, b_node]: [Option<NodeId>; 4],
            (x, weight, a, b, down, scale): State<B>,
            grad: &FloatTensor<B>,
            grads: &mut Gradients,
        ) {
            if let Some(id) = w_node {
                grads.register::<B>(id, B::matmul(B::float_transpose(x.clone()), grad.clone()));
            }
            let (d_x, d_a, d_b) = B::lora_linear_backward(x, weight, a, b, down, grad.clone(), scale);
            register_inputs::<B, 3>([x_node, a_node, b_node], grads, [d_x, d_a, d_b]);
        }

        impl<B: Backend> Backward<B, 4> for LoraLinear {
            type State = State<B>;

            fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let nodes = ops.parents.map(|node| node.map(|n| n.id));
                backward_inputs::<B>(nodes, ops.state, &grad, grads);
            }
        }

        impl<B: Backend> Backward<B, 5> for LoraLinear {
            type State = State<B>;

            fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w, bias, a, b] = ops.parents.map(|node| node.map(|n| n.id));
                if let Some(id) = bias {
                    let columns = grad.shape()[1];
                    let sum = B::float_sum_dim(grad.clone(), 0);
                    grads.register::<B>(id, B::float_reshape(sum, [columns].into()));
                }
                backward_inputs::<B>([x, w, a, b], ops.state, &grad, grads);
            }
        }

        let (y, down) = B::lora_linear(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            a.primitive.clone(),
            b.primitive.clone(),
            scale,
        );
        let state = (
            x.primitive,
            weight.primitive,
            a.primitive,
            b.primitive,
            down.clone(),
            scale,
        );
        let y = match bias {
            Some(bias) => match LoraLinear
                .prepare::<C>([x.node, weight.node, bias.node, a.node, b.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, y),
                OpsKind::UnTracked(prep) => prep.finish(y),
            },
            None => match LoraLinear
                .prepare::<C>([x.node, weight.node, a.node, b.node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, y),
                OpsKind::UnTracked(prep) => prep.finish(y),
            },
        };
        (y, <Self as burn::tensor::backend::AutodiffBackend>::from_inner(down))
    }

    /// `y = x·W + b` with its own backward on the inner backend's kernels:
    /// `∂x = ∂y·Wᵀ`, `∂W = xᵀ·∂y`, `∂b = Σ_rows ∂y`.
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Linear;

        /// Registers the gradients of `x` and `W` (parents 0 and 1).
        fn backward_x_w<B: Backend>(
            [x_node, w_node]: [Option<NodeId>; 2],
            (x, weight): (FloatTensor<B>, FloatTensor<B>),
            grad: &FloatTensor<B>,
            grads: &mut Gradients,
        ) {
            if let Some(id) = x_node {
                grads.register::<B>(id, B::matmul(grad.clone(), B::float_transpose(weight)));
            }
            if let Some(id) = w_node {
                grads.register::<B>(id, B::matmul(B::float_transpose(x), grad.clone()));
            }
        }

        impl<B: Backend> Backward<B, 2> for Linear {
            /// `x` and `W`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w] = ops.parents.map(|node| node.map(|n| n.id));
                backward_x_w::<B>([x, w], ops.state, &grad, grads);
            }
        }

        impl<B: Backend> Backward<B, 3> for Linear {
            /// `x` and `W`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w, bias] = ops.parents.map(|node| node.map(|n| n.id));
                backward_x_w::<B>([x, w], ops.state, &grad, grads);
                if let Some(id) = bias {
                    let columns = grad.shape()[1];
                    let sum = B::float_sum_dim(grad, 0);
                    grads.register::<B>(id, B::float_reshape(sum, [columns].into()));
                }
            }
        }

        let forward =
            |x: &Self::FloatTensorPrimitive, w: &Self::FloatTensorPrimitive, b: Option<&Self::FloatTensorPrimitive>| {
                B::fused_linear(x.primitive.clone(), w.primitive.clone(), b.map(|b| b.primitive.clone()))
            };
        let state = (x.primitive.clone(), weight.primitive.clone());
        match bias {
            Some(bias) => match Linear
                .prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, forward(&x, &weight, Some(&bias))),
                OpsKind::UnTracked(prep) => prep.finish(forward(&x, &weight, Some(&bias))),
            },
            None => match Linear
                .prepare::<C>([x.node.clone(), weight.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, forward(&x, &weight, None)),
                OpsKind::UnTracked(prep) => prep.finish(forward(&x, &weight, None)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::ops::{FloatTensor, FloatTensorOps};
    use burn::tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};

    use super::{
        Backend, cached_attention_ops, causal_attention_backward_ops, log_prob_entropy_backward_ops,
        log_prob_entropy_ops, packed_causal_attention_backward_ops, packed_causal_attention_ops, rope_ops,
    };

    type A = Autodiff<Flex>;

    /// Each element of the kernel's result within `tolerance` (relative above 1) of burn's.
    fn assert_close(what: &str, kernel: &[f32], ops: &[f32], tolerance: f32) {
        assert_eq!(kernel.len(), ops.len(), "{what}");
        for (i, (a, b)) in kernel.iter().zip(ops).enumerate() {
            assert!(
                (a - b).abs() <= tolerance * (1.0 + b.abs()),
                "{what}[{i}]: kernel {a} vs burn ops {b}"
            );
        }
    }

    /// RoPE tables with equal halves, as `lm::Rope` builds them: `[positions, dim]`.
    fn tables(positions: usize, dim: usize) -> (Tensor<A, 2>, Tensor<A, 2>) {
        let half = dim / 2;
        let angle = |p: usize, i: usize| p as f32 * (0.3 + i as f32 * 0.7);
        let table = |f: fn(f32) -> f32| {
            let values: Vec<f32> = (0..positions)
                .flat_map(|p| (0..dim).map(move |j| f(angle(p, j % half))))
                .collect();
            Tensor::<A, 2>::from_data(TensorData::new(values, [positions, dim]), &Default::default())
        };
        (table(f32::cos), table(f32::sin))
    }

    #[test]
    fn rope_backward_equals_burns_autodiff_of_the_ops() {
        let device = Default::default();
        // The last shape is large enough to be split across threads.
        for (batch, seq, heads, dim) in [(2, 3, 4, 8), (1, 5, 2, 16), (4, 33, 8, 32)] {
            let x = Tensor::<A, 4>::random([batch, seq, heads, dim], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let weights = Tensor::<A, 4>::random([batch, heads, seq, dim], Distribution::Normal(0.0, 1.0), &device);
            let positions: Vec<i64> = (0..batch * seq).map(|i| (i * 3 % 11) as i64).collect();
            let positions = Tensor::<A, 2, Int>::from_data(TensorData::new(positions, [batch, seq]), &device);
            let (cos, sin) = tables(11, dim);
            let raw = |t: Tensor<A, 2>| t.into_primitive().tensor();
            let run = |kernel: bool| {
                let _graph = crate::one_graph();
                // A transposed view, as the model passes it (a new graph each run).
                let view = x.clone().swap_dims(1, 2);
                let (input, p) = (view.into_primitive().tensor(), positions.clone().into_primitive());
                let y = if kernel {
                    A::rope(input, p, raw(cos.clone()), raw(sin.clone()))
                } else {
                    rope_ops::<A>(input, p, raw(cos.clone()), raw(sin.clone()))
                };
                let y = Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y));
                let grads = (y.clone() * weights.clone()).sum().backward();
                let grad = x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
                (y.into_data().to_vec::<f32>().unwrap(), grad)
            };
            let ((y_kernel, g_kernel), (y_ops, g_ops)) = (run(true), run(false));
            assert_close("values", &y_kernel, &y_ops, 1e-5);
            assert_close("gradients", &g_kernel, &g_ops, 1e-5);
        }
    }

    #[test]
    fn swiglu_backward_equals_burns_autodiff_of_the_ops() {
        // The second shape is large enough to be split across threads (a ragged last block).
        for shape in [[7, 45], [300, 130]] {
            swiglu_case(shape);
        }
    }

    /// `[y, ∂x, ∂W, ∂b, ∂A, ∂B]` of `Σ weights ⊙ (x·W + b + (s·x·A)·B)`, through
    /// [`Backend::lora_linear`] (`kernel`) or burn's autodiff of the ops. `W` and `b` get
    /// gradients only when `train_base` (they are frozen under LoRA); absent gradients are empty.
    fn lora_linear_case([rows, inputs, outputs, rank]: [usize; 4], bias: bool, train_base: bool, seed: u64) {
        let device = Default::default();
        let random = |shape: [usize; 2], salt: u64| {
            <A as burn::tensor::backend::Backend>::seed(&device, seed * 8 + salt);
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.0, 1.0), &device)
        };
        let x = random([rows, inputs], 1).require_grad();
        let weight = random([inputs, outputs], 2).set_require_grad(train_base);
        let b_vec = random([1, outputs], 3).reshape([outputs]).set_require_grad(train_base);
        let (a, b) = (
            random([inputs, rank], 4).require_grad(),
            random([rank, outputs], 5).require_grad(),
        );
        let weights = random([rows, outputs], 6);
        let scale = 0.5 + (seed % 5) as f32;
        let run = |kernel: bool| {
            let _graph = crate::one_graph();
            let raw = |t: &Tensor<A, 2>| t.clone().into_primitive().tensor();
            let bias_raw = bias.then(|| b_vec.clone().into_primitive().tensor());
            let args = (raw(&x), raw(&weight), bias_raw, raw(&a), raw(&b));
            let y = if kernel {
                A::lora_linear(args.0, args.1, args.2, args.3, args.4, scale).0
            } else {
                super::lora_linear_ops::<A>(args.0, args.1, args.2, args.3, args.4, scale).0
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * weights.clone()).sum().backward();
            let values =
                |t: Option<Tensor<Flex, 2>>| t.map(|t| t.into_data().to_vec::<f32>().unwrap()).unwrap_or_default();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                values(x.grad(&grads)),
                values(weight.grad(&grads)),
                b_vec
                    .grad(&grads)
                    .map(|g| g.into_data().to_vec::<f32>().unwrap())
                    .unwrap_or_default(),
                values(a.grad(&grads)),
                values(b.grad(&grads)),
            ]
        };
        let (kernel, ops) = (run(true), run(false));
        assert_eq!(kernel[1].len(), rows * inputs, "∂x is missing");
        assert_eq!(kernel[4].len(), inputs * rank, "∂A is missing");
        assert_eq!(kernel[2].is_empty(), !train_base, "∂W present only when W is trained");
        for (what, (k, o)) in ["values", "∂x", "∂W", "∂b", "∂A", "∂B"]
            .iter()
            .zip(kernel.iter().zip(&ops))
        {
            assert_eq!(k.len(), o.len(), "{what}: one side has no gradient");
            assert_close(what, k, o, 1e-4);
        }
    }

    fn swiglu_case(shape: [usize; 2]) {
        let device = Default::default();
        let random = |seed| {
            <A as burn::tensor::backend::Backend>::seed(&device, seed);
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.0, 3.0), &device).require_grad()
        };
        let (gate, up, weights) = (random(1), random(2), random(3));
        let run = |kernel: bool| {
            let _graph = crate::one_graph();
            let (g, u) = (
                gate.clone().into_primitive().tensor(),
                up.clone().into_primitive().tensor(),
            );
            let y = if kernel {
                A::swiglu(g, u)
            } else {
                super::swiglu_ops::<A>(g, u)
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * weights.clone()).sum().backward();
            let values = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                values(gate.grad(&grads).unwrap()),
                values(up.grad(&grads).unwrap()),
            ]
        };
        let (kernel, ops) = (run(true), run(false));
        for (what, (a, b)) in ["values", "∂gate", "∂up"].iter().zip(kernel.iter().zip(&ops)) {
            assert_close(what, a, b, 1e-5);
        }
    }

    #[test]
    fn rms_norm_backward_equals_burns_autodiff_of_the_ops() {
        // The second shape is large enough to be split across threads (a ragged last block).
        for [rows, hidden] in [[9, 40], [300, 130]] {
            rms_norm_case(rows, hidden);
        }
    }

    fn rms_norm_case(rows: usize, hidden: usize) {
        let device = Default::default();
        let random = |shape: [usize; 2], seed| {
            <A as burn::tensor::backend::Backend>::seed(&device, seed);
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.5, 2.0), &device)
        };
        let (x, weights) = (random([rows, hidden], 1).require_grad(), random([rows, hidden], 3));
        let w = random([1, hidden], 2).reshape([hidden]).require_grad();
        let run = |kernel: bool| {
            let _graph = crate::one_graph();
            let (xp, wp) = (x.clone().into_primitive().tensor(), w.clone().into_primitive().tensor());
            let y = if kernel {
                A::rms_norm(xp, wp, 1e-6)
            } else {
                super::rms_norm_ops::<A>(xp, wp, 1e-6)
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * weights.clone()).sum().backward();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
                w.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
            ]
        };
        let (kernel, ops) = (run(true), run(false));
        for (what, (a, b)) in ["values", "∂x", "∂w"].iter().zip(kernel.iter().zip(&ops)) {
            assert_close(what, a, b, 1e-4);
        }
    }

    /// Attention inputs in both layouts the kernels read: `q` and `v` transposed views of
    /// `[batch, seq, heads, dim]` (as training passes them), `k` contiguous `[batch, kv_heads,
    /// seq, dim]` (as a key/value cache is).
    struct AttentionCase {
        /// `[batch, seq, heads, dim]`: the attention's `q` is this, transposed.
        q: Tensor<A, 4>,
        k: Tensor<A, 4>,
        /// `[batch, seq, kv_heads, dim]`: the model's `v` is this, transposed.
        v: Tensor<A, 4>,
        padding: Option<Tensor<A, 2, burn::tensor::Bool>>,
        /// Weights of the scalar loss `Σ y ⊙ weights`.
        weights: Tensor<A, 4>,
    }

    impl AttentionCase {
        /// `left` padding tokens before and `right` after each sequence's real ones (only the
        /// first sequence padded on the left, so rows differ).
        fn new(batch: usize, heads: usize, kv_heads: usize, seq: usize, dim: usize, pad: (usize, usize)) -> Self {
            let device = Default::default();
            let random = |shape: [usize; 4], seed| {
                <A as burn::tensor::backend::Backend>::seed(&device, seed);
                Tensor::<A, 4>::random(shape, Distribution::Normal(0.0, 1.5), &device)
            };
            let padding = (pad != (0, 0)).then(|| {
                let flags: Vec<bool> = (0..batch * seq)
                    .map(|i| {
                        let (b, t) = (i / seq, i % seq);
                        (b == 0 && t < pad.0) || t >= seq - pad.1
                    })
                    .collect();
                Tensor::<A, 2, burn::tensor::Bool>::from_data(TensorData::new(flags, [batch, seq]), &device)
            });
            Self {
                q: random([batch, seq, heads, dim], 1).require_grad(),
                k: random([batch, kv_heads, seq, dim], 2).require_grad(),
                v: random([batch, seq, kv_heads, dim], 3).require_grad(),
                padding,
                weights: random([batch, seq, heads, dim], 4),
            }
        }

        /// The output and the loss's gradients `[y, ∂q, ∂k, ∂v]`, through rein's op with its
        /// own backward (`kernel`) or burn's autodiff of its attention ops.
        fn run(&self, kernel: bool) -> [Vec<f32>; 4] {
            let _graph = crate::one_graph();
            let raw = |t: Tensor<A, 4>| t.into_primitive().tensor();
            let (q, k, v) = (
                raw(self.q.clone().swap_dims(1, 2)),
                raw(self.k.clone()),
                raw(self.v.clone().swap_dims(1, 2)),
            );
            let padding = self.padding.clone().map(Tensor::into_primitive);
            let y = if kernel {
                A::causal_attention(q, k, v, padding)
            } else {
                cached_attention_ops::<A>(q, k, v, 0, padding)
            };
            let y = Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y));
            let grads = (y.clone() * self.weights.clone()).sum().backward();
            let values = |t: Tensor<Flex, 4>| t.into_data().to_vec::<f32>().unwrap();
            [
                values(y.inner()),
                values(self.q.grad(&grads).unwrap()),
                values(self.k.grad(&grads).unwrap()),
                values(self.v.grad(&grads).unwrap()),
            ]
        }

        /// `[∂q, ∂k, ∂v]` from the burn-ops backward (what CUDA runs), without autodiff.
        fn generic_backward(&self) -> [Vec<f32>; 3] {
            let raw = |t: Tensor<A, 4>| t.inner().into_primitive().tensor();
            let padding = self.padding.clone().map(|p| p.inner().into_primitive());
            let (d_q, d_k, d_v) = causal_attention_backward_ops::<Flex>(
                raw(self.q.clone().swap_dims(1, 2)),
                raw(self.k.clone()),
                raw(self.v.clone().swap_dims(1, 2)),
                padding,
                raw(self.weights.clone()),
            );
            let values = |t| {
                Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t))
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap()
            };
            // ∂q and ∂v come back as `[batch, heads, seq, dim]`; the case's are transposed.
            let transposed = |t| Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t)).swap_dims(1, 2);
            let [d_q, d_v] = [d_q, d_v].map(|t| transposed(t).into_data().to_vec::<f32>().unwrap());
            [d_q, values(d_k), d_v]
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        #[test]
        fn causal_attention_backward_equals_burns_autodiff_of_the_ops(
            batch in 1usize..4,
            kv_heads in 1usize..3,
            group in 1usize..4,
            seq in 1usize..10,
            half_dim in 1usize..9,
            left in 0usize..4,
            right in 0usize..4,
        ) {
            let pad = (left.min(seq - 1), right.min(seq - 1));
            let case = AttentionCase::new(batch, kv_heads * group, kv_heads, seq, 2 * half_dim, pad);
            let (kernel, ops) = (case.run(true), case.run(false));
            for (what, (a, b)) in ["values", "∂q", "∂k", "∂v"].iter().zip(kernel.iter().zip(&ops)) {
                assert_close(what, a, b, 1e-4);
            }
            for (what, (a, b)) in ["generic ∂q", "generic ∂k", "generic ∂v"].iter().zip(case.generic_backward().iter().zip(&ops[1..])) {
                assert_close(what, a, b, 1e-4);
            }
        }
    }

    /// How [`packed_attention`] computes packed attention.
    #[derive(Clone, Copy)]
    enum Packing {
        /// The packed op, with its own backward.
        Kernel,
        /// [`packed_causal_attention_ops`]: one `causal_attention` per sequence (what CUDA runs).
        Wrapper,
        /// Each sequence's slice of the inputs through `causal_attention`, by hand.
        Alone,
    }

    /// Packed attention's output and gradients `[y, ∂q, ∂k, ∂v]` for sequences of `lengths`
    /// packed end to end, and the gradients of [`packed_causal_attention_backward_ops`] given the
    /// same output gradient.
    fn packed_attention(lengths: &[usize], heads: usize, kv_heads: usize, dim: usize, how: Packing) -> [Vec<f32>; 7] {
        let _graph = crate::one_graph();
        let device = Default::default();
        let total: usize = lengths.iter().sum();
        // Not burn's random tensors: its generator is global, and tests running alongside
        // would reseed it between the ways this compares.
        let random = |shape: [usize; 4], seed: u64| {
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let values: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
                })
                .collect();
            Tensor::<A, 4>::from_data(TensorData::new(values, shape), &device).require_grad()
        };
        // As the model lays them out: `q` and `v` transposed views of `[1, total, heads, dim]`.
        let (q, k, v) = (
            random([1, total, heads, dim], 1),
            random([1, kv_heads, total, dim], 2),
            random([1, total, kv_heads, dim], 3),
        );
        let weights = random([1, total, heads, dim], 4);
        let raw = |t: Tensor<A, 4>| t.into_primitive().tensor();
        let (qt, vt) = (q.clone().swap_dims(1, 2), v.clone().swap_dims(1, 2));
        let y = match how {
            Packing::Kernel => A::packed_causal_attention(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), lengths),
            Packing::Wrapper => {
                packed_causal_attention_ops::<A>(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), lengths)
            }
            Packing::Alone => {
                let mut outputs = Vec::new();
                let mut start = 0;
                for &len in lengths {
                    let part = |t: &Tensor<A, 4>| raw(t.clone().narrow(2, start, len));
                    let y = A::causal_attention(part(&qt), part(&k), part(&vt), None);
                    outputs.push(Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y)));
                    start += len;
                }
                raw(Tensor::cat(outputs, 1))
            }
        };
        let y = Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y));
        let grads = (y.clone() * weights.clone()).sum().backward();
        let values = |t: Tensor<Flex, 4>| t.into_data().to_vec::<f32>().unwrap();
        let inner = |t: Tensor<A, 4>| t.inner().into_primitive().tensor();
        let (d_q, d_k, d_v) = packed_causal_attention_backward_ops::<Flex>(
            inner(qt),
            inner(k.clone()),
            inner(vt),
            lengths,
            inner(weights),
        );
        let back = |t: FloatTensor<Flex>| values(Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t)));
        let swapped = |t: FloatTensor<Flex>| Flex::float_swap_dims(t, 1, 2);
        [
            values(y.inner()),
            values(q.grad(&grads).unwrap()),
            values(k.grad(&grads).unwrap()),
            values(v.grad(&grads).unwrap()),
            back(swapped(d_q)),
            back(d_k),
            back(swapped(d_v)),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]

        /// Each packed sequence attends to its own tokens only, exactly as it would alone, in
        /// the kernel and in the per-sequence versions other backends run.
        #[test]
        fn packed_attention_equals_each_sequence_alone(
            lengths in proptest::collection::vec(1usize..9, 1..5),
            kv_heads in 1usize..3,
            group in 1usize..4,
            half_dim in 1usize..9,
        ) {
            let (heads, dim) = (kv_heads * group, 2 * half_dim);
            let run = |how| packed_attention(&lengths, heads, kv_heads, dim, how);
            let (kernel, wrapper, alone) = (run(Packing::Kernel), run(Packing::Wrapper), run(Packing::Alone));
            let names = ["values", "∂q", "∂k", "∂v", "backward ∂q", "backward ∂k", "backward ∂v"];
            for (i, what) in names.iter().enumerate() {
                assert_close(what, &kernel[i], &alone[i], 1e-6);
                assert_close(what, &wrapper[i], &alone[i], 1e-6);
            }
            // The backward alone, against the gradients autodiff found.
            for i in 0..3 {
                assert_close(names[4 + i], &kernel[4 + i], &kernel[1 + i], 1e-6);
            }
        }
    }

    /// The kernel's gradients against central differences of the loss, element by element
    /// (f32: step 1e-2, tolerance 2 %).
    #[test]
    fn causal_attention_gradients_match_finite_differences() {
        let case = AttentionCase::new(2, 4, 2, 5, 6, (2, 1));
        let [_, d_q, d_k, d_v] = case.run(true);
        let loss = |q: &Tensor<A, 4>, k: &Tensor<A, 4>, v: &Tensor<A, 4>| {
            let raw = |t: Tensor<A, 4>| t.inner().into_primitive().tensor();
            let padding = case.padding.clone().map(|p| p.inner().into_primitive());
            let y = Flex::causal_attention(
                raw(q.clone().swap_dims(1, 2)),
                raw(k.clone()),
                raw(v.clone().swap_dims(1, 2)),
                padding,
            );
            let y = Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(y));
            f64::from((y * case.weights.clone().inner()).sum().into_scalar())
        };
        for (which, grad) in [d_q, d_k, d_v].iter().enumerate() {
            let input = [&case.q, &case.k, &case.v][which];
            let values = input.clone().into_data().to_vec::<f32>().unwrap();
            for i in (0..grad.len()).step_by(7) {
                let numeric = central_difference(&values, i, |nudged| {
                    let mut inputs = [case.q.clone(), case.k.clone(), case.v.clone()];
                    inputs[which] = Tensor::from_data(TensorData::new(nudged, input.dims()), &Default::default());
                    loss(&inputs[0], &inputs[1], &inputs[2])
                });
                assert!(
                    (numeric - grad[i]).abs() <= 2e-2 * (1.0 + grad[i].abs()),
                    "input {which} element {i}: kernel {} vs finite difference {numeric}",
                    grad[i]
                );
            }
        }
    }

    /// `∂loss/∂values[i]` by central differences, step 1e-2 (f32 inputs, f64 loss).
    fn central_difference(values: &[f32], i: usize, loss: impl Fn(Vec<f32>) -> f64) -> f32 {
        const STEP: f32 = 1e-2;
        let (mut up, mut down) = (values.to_vec(), values.to_vec());
        up[i] += STEP;
        down[i] -= STEP;
        ((loss(up) - loss(down)) / (2.0 * f64::from(STEP))) as f32
    }

    /// Per-row weights `[w_lp, w_H]` of the loss `Σ w_lp·log pₜ + w_H·H` the gradient tests take.
    fn loss_weights(rows: usize, seed: u64) -> Vec<f32> {
        (0..2 * rows)
            .map(|i| ((i as u64 * 37 + seed) % 17) as f32 / 8.0 - 1.0)
            .collect()
    }

    fn targets_for(rows: usize, vocab: usize, seed: u64) -> Vec<i64> {
        (0..rows)
            .map(|r| ((r as u64 * 7 + seed) % vocab as u64) as i64)
            .collect()
    }

    /// `[values, ∂logits]` of `Σ weights ⊙ log_prob_entropy(logits, targets, scale)`, through
    /// rein's kernels (`kernel`: the head op with one chunk, whose backward is the kernel's) or
    /// burn's autodiff of `log_softmax`, `gather` and the entropy sum.
    fn log_prob_entropy_case(
        logits: &Tensor<A, 2>,
        targets: &[i64],
        weights: &[f32],
        scale: f32,
        kernel: bool,
    ) -> [Vec<f32>; 2] {
        let _graph = crate::one_graph();
        let device = Default::default();
        let [rows, vocab] = logits.dims();
        let t = Tensor::<A, 1, Int>::from_data(TensorData::new(targets.to_vec(), [rows]), &device).into_primitive();
        let y = if kernel {
            // Logits through an identity head: `hidden · I`.
            let identity = Tensor::<A, 2>::eye(vocab, &device).into_primitive().tensor();
            A::head_log_prob_entropy(logits.clone().into_primitive().tensor(), identity, t, scale, rows)
        } else {
            log_prob_entropy_ops::<A>(logits.clone().into_primitive().tensor(), t, scale)
        };
        let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
        let w = Tensor::<A, 2>::from_data(TensorData::new(weights.to_vec(), [rows, 2]), &device);
        let grads = (y.clone() * w).sum().backward();
        [
            y.into_data().to_vec::<f32>().unwrap(),
            logits.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
        ]
    }

    /// A head to score: `hidden` `[rows, width]`, `W` `[width, vocab]` (stored as an embedding
    /// table `[vocab, width]` and used through its transposed view when `tied`, as a tied head
    /// is), and the loss `Σ weights ⊙ [log pₜ, H]`.
    struct HeadCase {
        hidden: Vec<f32>,
        table: Vec<f32>,
        shape: [usize; 3],
        tied: bool,
        targets: Vec<i64>,
        weights: Vec<f32>,
        scale: f32,
    }

    impl HeadCase {
        /// `[values, ∂hidden, ∂W]`: chunked through the head op (`Some(chunk)`) or all at once
        /// through burn's ops (`None`).
        fn run(&self, chunk: Option<usize>) -> [Vec<f32>; 3] {
            let _graph = crate::one_graph();
            let device = Default::default();
            let [rows, width, vocab] = self.shape;
            let hidden =
                Tensor::<A, 2>::from_data(TensorData::new(self.hidden.clone(), [rows, width]), &device).require_grad();
            let shape = if self.tied { [vocab, width] } else { [width, vocab] };
            let table = Tensor::<A, 2>::from_data(TensorData::new(self.table.clone(), shape), &device).require_grad();
            let weight = if self.tied {
                table.clone().transpose()
            } else {
                table.clone()
            };
            let t =
                Tensor::<A, 1, Int>::from_data(TensorData::new(self.targets.clone(), [rows]), &device).into_primitive();
            let y = match chunk {
                Some(chunk) => A::head_log_prob_entropy(
                    hidden.clone().into_primitive().tensor(),
                    weight.into_primitive().tensor(),
                    t,
                    self.scale,
                    chunk,
                ),
                None => {
                    let logits = hidden.clone().matmul(weight);
                    log_prob_entropy_ops::<A>(logits.into_primitive().tensor(), t, self.scale)
                }
            };
            let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
            let w = Tensor::<A, 2>::from_data(TensorData::new(self.weights.clone(), [rows, 2]), &device);
            let grads = (y.clone() * w).sum().backward();
            let values = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
            [
                y.into_data().to_vec::<f32>().unwrap(),
                values(hidden.grad(&grads).unwrap()),
                values(table.grad(&grads).unwrap()),
            ]
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        #[test]
        fn log_prob_entropy_and_its_backward_equal_burns_autodiff_of_the_ops(
            rows in 1usize..12,
            vocab in 1usize..70,
            scale in 0.3f32..3.0,
            seed in 0u64..1000,
        ) {
            let device = Default::default();
            <A as burn::tensor::backend::Backend>::seed(&device, seed);
            let logits = Tensor::<A, 2>::random([rows, vocab], Distribution::Normal(0.0, 4.0), &device).require_grad();
            let targets = targets_for(rows, vocab, seed);
            let weights = loss_weights(rows, seed);
            let kernel = log_prob_entropy_case(&logits, &targets, &weights, scale, true);
            let ops = log_prob_entropy_case(&logits, &targets, &weights, scale, false);
            assert_close("values", &kernel[0], &ops[0], 1e-5);
            assert_close("∂logits", &kernel[1], &ops[1], 1e-5);
            // The burn-ops backward (what CUDA runs), called directly.
            let t = Tensor::<Flex, 1, Int>::from_data(TensorData::new(targets, [rows]), &device).into_primitive();
            let g = Tensor::<Flex, 2>::from_data(TensorData::new(weights, [rows, 2]), &device).into_primitive().tensor();
            let generic = log_prob_entropy_backward_ops::<Flex>(logits.clone().inner().into_primitive().tensor(), t, scale, g);
            let generic = Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(generic)).into_data().to_vec::<f32>().unwrap();
            assert_close("generic ∂logits", &generic, &ops[1], 1e-5);
        }

        /// The LoRA linear layer's values and gradients (and the frozen base's, when it is
        /// trained) equal burn's autodiff of its ops, with and without a bias.
        #[test]
        fn lora_linear_and_its_backward_equal_burns_autodiff_of_the_ops(
            rows in 1usize..40,
            inputs in 1usize..40,
            outputs in 1usize..40,
            rank in 1usize..9,
            bias: bool,
            train_base: bool,
            seed in 0u64..1000,
        ) {
            lora_linear_case([rows, inputs, outputs, rank], bias, train_base, seed);
        }

        /// The chunked head (values and both gradients) equals the logits computed whole, for
        /// any chunk size.
        #[test]
        fn chunked_head_equals_the_whole_logits(
            rows in 1usize..20,
            width in 1usize..24,
            vocab in 1usize..90,
            chunk in 1usize..25,
            tied: bool,
            scale in 0.5f32..2.0,
            seed in 0u64..1000,
        ) {
            let normal = |n: usize, salt: u64| -> Vec<f32> {
                let mut rng = rand_like(seed ^ salt);
                (0..n).map(|_| rng()).collect()
            };
            let case = HeadCase {
                hidden: normal(rows * width, 1),
                table: normal(width * vocab, 2),
                shape: [rows, width, vocab],
                tied,
                targets: targets_for(rows, vocab, seed),
                weights: loss_weights(rows, seed),
                scale,
            };
            let (chunked, whole) = (case.run(Some(chunk)), case.run(None));
            for (what, i) in [("values", 0), ("∂hidden", 1), ("∂W", 2)] {
                assert_close(what, &chunked[i], &whole[i], 1e-5);
            }
        }
    }

    /// Standard normal draws from a seed (Box–Muller over a 64-bit LCG), the same on every run
    /// whatever else seeds burn's generator concurrently.
    fn rand_like(seed: u64) -> impl FnMut() -> f32 {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut uniform = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        move || {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        }
    }

    /// The kernel's gradient against central differences of the loss (f32: step 1e-2, 1 %).
    #[test]
    fn log_prob_entropy_gradients_match_finite_differences() {
        let device = Default::default();
        let (rows, vocab, scale) = (3, 11, 1.0 / 0.7);
        <A as burn::tensor::backend::Backend>::seed(&device, 5);
        let logits = Tensor::<A, 2>::random([rows, vocab], Distribution::Normal(0.0, 2.0), &device).require_grad();
        let targets = vec![4i64, 0, 10];
        let weights = vec![1.0f32, 0.3, -0.5, 0.0, 2.0, -1.0];
        let [_, grad] = log_prob_entropy_case(&logits, &targets, &weights, scale, true);
        let values = logits.clone().into_data().to_vec::<f32>().unwrap();
        let loss = |values: Vec<f32>| {
            let z = Tensor::<Flex, 2>::from_data(TensorData::new(values, [rows, vocab]), &device)
                .into_primitive()
                .tensor();
            let t =
                Tensor::<Flex, 1, Int>::from_data(TensorData::new(targets.clone(), [rows]), &device).into_primitive();
            let y = Flex::log_prob_entropy(z, t, scale);
            let y = Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(y))
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            y.iter().zip(&weights).map(|(y, w)| f64::from(y * w)).sum::<f64>()
        };
        assert_eq!(grad.len(), rows * vocab);
        for (i, &g) in grad.iter().enumerate() {
            let numeric = central_difference(&values, i, loss);
            assert!(
                (numeric - g).abs() <= 1e-2 * (1.0 + g.abs()),
                "element {i}: kernel {g} vs finite difference {numeric}"
            );
        }
    }
}
