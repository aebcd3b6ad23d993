//! The backends rein's modules run on: any burn backend, plus rein's fused kernels where a
//! backend has a faster path than its generic ops.
//!
//! Each kernel is a method of [`ReinBackend`] whose default composes burn's own ops, so any backend
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

mod autodiff;
mod flex;
mod generic;

pub(crate) use generic::*;

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
pub trait ReinBackend: burn::tensor::backend::Backend {
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

    /// The gradients of [`ReinBackend::lora_linear`] with respect to `x`, `A` and `B`, given the
    /// output's and the forward's `down = s·x·A`: with `e = s·∂y·Bᵀ`,
    /// `∂x = ∂y·Wᵀ + e·Aᵀ`, `∂A = xᵀ·e`, `∂B = downᵀ·∂y`.
    ///
    /// # Shapes
    /// - as [`ReinBackend::lora_linear`]'s, `down`: `[rows, r]`, `grad`: `[rows, out]` →
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

    /// Whether [`ReinBackend::packed_linear`] reads packed weights directly (and so is worth using
    /// for inference); the default unpacks them first.
    fn reads_packed_weights() -> bool {
        false
    }

    /// A linear layer whose weight is kept packed, `x · [W₁ W₂ …] + b`: the parts' columns side
    /// by side. The same numbers as [`ReinBackend::fused_linear`] on the unpacked weight.
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

    /// The gradients of [`ReinBackend::swiglu`] given the output's, `(∂gate, ∂up)`:
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

    /// The gradients of [`ReinBackend::rms_norm`] given the output's, `(∂x, ∂w)`: with
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
    /// [`ReinBackend::causal_attention_backward`].
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, seq, head_dim]`, `k`, `v`: `[batch, kv_heads, seq, head_dim]`,
    ///   `padding`: `[batch, seq]` (as for [`ReinBackend::cached_attention`]) → `[batch, seq, heads, head_dim]`
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::cached_attention(q, k, v, 0, padding)
    }

    /// The gradients of [`ReinBackend::causal_attention`] given the output's, `(∂q, ∂k, ∂v)`. With
    /// `P = softmax(q kᵀ/√d)` (masked) per query head and `∂P = ∂O vᵀ`:
    /// `∂v = Pᵀ ∂O`, `∂S = P ⊙ (∂P − rowsum(P ⊙ ∂P))`, `∂q = ∂S k/√d`, `∂k = ∂Sᵀ q/√d`, the key
    /// and value gradients summed over the query heads that share them. `P` is recomputed,
    /// not stored: one more `q kᵀ` costs less than keeping `[batch, heads, seq, seq]` per layer.
    ///
    /// # Shapes
    /// - as [`ReinBackend::causal_attention`]'s inputs, `grad` like its output → like `q`, `k`, `v`
    fn causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        causal_attention_backward_ops::<Self>(q, k, v, padding, grad)
    }

    /// Causal attention of sequences concatenated end to end along the token axis, without padding:
    /// sequence `i` is the `lengths[i]` tokens after those of sequences `0..i`, and attends to
    /// its own tokens only. What [`ReinBackend::causal_attention`] computes for each sequence
    /// alone, without the rows a padded batch spends on padding. Its autodiff version has its
    /// own backward, [`ReinBackend::varlen_causal_attention_backward`].
    ///
    /// # Shapes
    /// - `q`: `[1, heads, total, head_dim]`, `k`, `v`: `[1, kv_heads, total, head_dim]` with
    ///   `total = Σ lengths` → `[1, total, heads, head_dim]`
    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
    ) -> FloatTensor<Self> {
        varlen_causal_attention_ops::<Self>(q, k, v, lengths)
    }

    /// The gradients of [`ReinBackend::varlen_causal_attention`] given the output's: each
    /// sequence's as [`ReinBackend::causal_attention_backward`] gives them.
    ///
    /// # Shapes
    /// - as [`ReinBackend::varlen_causal_attention`]'s inputs, `grad` like its output → like `q`, `k`, `v`
    fn varlen_causal_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        varlen_causal_attention_backward_ops::<Self>(q, k, v, lengths, grad)
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

    /// The gradient of [`ReinBackend::log_prob_entropy`] given its output's, `[g_lp, g_H]` per row:
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

    /// [`ReinBackend::log_prob_entropy`] of the logits `hidden · W`, computed `chunk` rows at a
    /// time: at most `[chunk, vocab]` logits exist at once, never `[rows, vocab]` (6.4 GB for
    /// 64 sequences × 512 tokens × 49,152 tokens of vocabulary). The autodiff version keeps
    /// only `hidden` and `W` and recomputes each chunk's logits in its backward
    /// ([`ReinBackend::head_log_prob_entropy_backward`]).
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

    /// The gradients of [`ReinBackend::head_log_prob_entropy`] given its output's, chunk by chunk
    /// with each chunk's logits recomputed: `∂hidden = ∂Z · Wᵀ` and, when `weight_grad`,
    /// `∂W = Σ_chunks hiddenᵀ · ∂Z` (`∂Z` from [`ReinBackend::log_prob_entropy_backward`]). A frozen
    /// head (LoRA) skips `∂W`, a product as large as the forward one.
    ///
    /// # Shapes
    /// - as [`ReinBackend::head_log_prob_entropy`]'s inputs, `grad`: `[rows, 2]` →
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

/// Set: every kernel of [`ReinBackend`] on Flex takes its default, burn's generic ops.
static GENERIC_OPS: AtomicBool = AtomicBool::new(false);

/// Makes Flex compute every kernel of [`ReinBackend`] with burn's generic ops, as the backends
/// without rein's kernels do (CUDA), instead of rein's fused CPU kernels; process-wide. This
/// is how the CPU tests check the path a GPU run takes: same model, same results within
/// rounding. Not for speed: the generic ops are several times slower.
pub fn use_generic_ops(on: bool) {
    GENERIC_OPS.store(on, Ordering::Relaxed);
}

fn generic_ops() -> bool {
    GENERIC_OPS.load(Ordering::Relaxed)
}

/// A [`ReinBackend`] that records gradients, whose inner backend is a [`ReinBackend`] too.
pub trait ReinAutodiffBackend: ReinBackend + burn::tensor::backend::AutodiffBackend<InnerBackend: ReinBackend> {}

impl<B: burn::tensor::backend::AutodiffBackend<InnerBackend: ReinBackend> + ReinBackend> ReinAutodiffBackend for B {}

#[cfg(feature = "cuda")]
impl ReinBackend for burn::backend::Cuda {}

#[cfg(test)]
mod tests;
