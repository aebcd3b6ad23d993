//! The chosen tokens' log-probabilities and the entropies, from logits or from the hidden states
//! and the head, a few rows of logits at a time and recomputed in the backward pass: never
//! `[rows, vocab]` logits, which at a real vocabulary would be gigabytes. Flex computes each
//! row's `[log pₜ, H]` and its gradient in one pass over the row.

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

use super::flex::{exp_f32, f32s, for_rows, indices, shape_2d, tensor, with_avx2};
use super::{LinearKernels, ReinBackend, float, generic_ops};

/// How the head's logits `z = hidden · W` become the distribution: `softmax(scale · cap(z))`,
/// `cap(z) = c·tanh(z/c)` where the model soft-caps its logits (Gemma 2), `z` otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Logits {
    /// The factor on the (capped) logits: `1 / temperature`.
    pub scale: f32,
    /// The cap `c`, if any.
    pub softcap: Option<f32>,
}

impl Logits {
    /// `z` capped: `c·tanh(z/c)`, or `z` itself.
    fn capped<B: burn::tensor::backend::Backend>(&self, z: FloatTensor<B>) -> FloatTensor<B> {
        match self.softcap {
            Some(cap) => B::float_mul_scalar(B::float_tanh(B::float_div_scalar(z, cap.into())), cap.into()),
            None => z,
        }
    }

    /// `∂z` from the gradient of the capped logits `∂cap(z)`: times `1 − tanh²(z/c)`.
    fn through_cap<B: burn::tensor::backend::Backend>(
        &self,
        z: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> FloatTensor<B> {
        match self.softcap {
            Some(cap) => {
                let t = B::float_tanh(B::float_div_scalar(z, cap.into()));
                let slope = B::float_add_scalar(B::float_neg(B::float_powi_scalar(t, 2.into())), 1f32.into());
                B::float_mul(grad, slope)
            }
            None => grad,
        }
    }
}

/// Log-probabilities and entropies of chosen tokens, from logits or through the head.
pub trait HeadKernels: LinearKernels {
    /// Per row of `logits`, the chosen token's log-probability and the entropy of the
    /// distribution `p = softmax(scale · z)`: `[log pₜ, H]` with
    /// `log pₜ = scale·zₜ − log Σⱼ exp(scale·zⱼ)` and `H = −Σⱼ pⱼ log pⱼ`.
    ///
    /// # Shapes
    /// - `logits`: `[rows, vocab]`, `targets`: `[rows]` → `[rows, 2]`
    fn log_prob_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>, scale: f32) -> FloatTensor<Self> {
        log_prob_entropy_ops::<Self>(logits, targets, scale)
    }

    /// The gradient of [`HeadKernels::log_prob_entropy`] given its output's, `[g_lp, g_H]` per row:
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

    /// [`HeadKernels::log_prob_entropy`] of the logits `hidden · W` (capped as `logits` says,
    /// scaled by its scale), computed `chunk` rows at a
    /// time: at most `[chunk, vocab]` logits exist at once, never `[rows, vocab]` (6.4 GB for
    /// 64 sequences × 512 tokens × 49,152 tokens of vocabulary). The autodiff version keeps
    /// only `hidden` and `W` and recomputes each chunk's logits in its backward
    /// ([`HeadKernels::head_log_prob_entropy_backward`]).
    ///
    /// # Shapes
    /// - `hidden`: `[rows, width]`, `weight`: `[width, vocab]`, `targets`: `[rows]` → `[rows, 2]`
    fn head_log_prob_entropy(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        logits: Logits,
        chunk: usize,
    ) -> FloatTensor<Self> {
        let hidden = float::<Self, 2>(hidden);
        let targets = Tensor::<Self, 1, Int>::from_primitive(targets);
        let parts: Vec<Tensor<Self, 2>> = row_chunks(hidden.dims()[0], chunk)
            .map(|(start, rows)| {
                let h = hidden.clone().narrow(0, start, rows).into_primitive().tensor();
                let z = logits.capped::<Self>(Self::fused_linear(h, weight.clone(), None));
                let t = targets.clone().narrow(0, start, rows).into_primitive();
                float(Self::log_prob_entropy(z, t, logits.scale))
            })
            .collect();
        match parts.is_empty() {
            true => Tensor::<Self, 2>::zeros([0, 2], &hidden.device())
                .into_primitive()
                .tensor(),
            false => Tensor::cat(parts, 0).into_primitive().tensor(),
        }
    }

    /// The gradients of [`HeadKernels::head_log_prob_entropy`] given its output's, chunk by chunk
    /// with each chunk's logits recomputed: `∂hidden = ∂Z · Wᵀ` and, when `weight_grad`,
    /// `∂W = Σ_chunks hiddenᵀ · ∂Z` (`∂Z` from [`HeadKernels::log_prob_entropy_backward`]). A frozen
    /// head (LoRA) skips `∂W`, a product as large as the forward one.
    ///
    /// # Shapes
    /// - as [`HeadKernels::head_log_prob_entropy`]'s inputs, `grad`: `[rows, 2]` →
    ///   `([rows, width], [width, vocab])`
    fn head_log_prob_entropy_backward(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        logits: Logits,
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
            let z = Self::fused_linear(h.clone(), weight.clone(), None);
            let t = targets.clone().narrow(0, start, rows).into_primitive();
            let g = grad.clone().narrow(0, start, rows).into_primitive().tensor();
            let d_capped = Self::log_prob_entropy_backward(logits.capped::<Self>(z.clone()), t, logits.scale, g);
            let d_logits = logits.through_cap::<Self>(z, d_capped);
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

/// [`HeadKernels::log_prob_entropy`] in burn ops.
pub(super) fn log_prob_entropy_ops<B: burn::tensor::backend::Backend>(
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

/// [`HeadKernels::log_prob_entropy_backward`] in burn ops.
pub(super) fn log_prob_entropy_backward_ops<B: burn::tensor::backend::Backend>(
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

impl HeadKernels for Flex {
    fn log_prob_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>, scale: f32) -> FloatTensor<Self> {
        let index = indices(&targets);
        let (Some(targets), DType::F32, false) = (index, logits.dtype(), generic_ops()) else {
            return log_prob_entropy_ops::<Self>(logits, targets, scale);
        };
        let logits = logits.to_contiguous();
        let [rows, vocab] = shape_2d(&logits);
        let logits = f32s(&logits);
        let mut out = vec![0.0f32; rows * 2];
        for_rows(&mut out, 2, vocab, |r, out| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let moments = softmax_moments(row, scale);
            out[0] = scale * row[targets[r]] - moments.log_normaliser();
            out[1] = moments.entropy();
        });
        tensor(out, &[rows, 2])
    }

    fn log_prob_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let index = indices(&targets);
        let (Some(targets), DType::F32, DType::F32, false) = (index, logits.dtype(), grad.dtype(), generic_ops())
        else {
            return log_prob_entropy_backward_ops::<Self>(logits, targets, scale, grad);
        };
        let (logits, grad) = (logits.to_contiguous(), grad.to_contiguous());
        let [rows, vocab] = shape_2d(&logits);
        let (logits, grad) = (f32s(&logits), f32s(&grad));
        let mut out = vec![0.0f32; rows * vocab];
        for_rows(&mut out, vocab, vocab, |r, d_row| {
            let [g_lp, g_h] = [grad[2 * r], grad[2 * r + 1]];
            log_prob_entropy_gradient_row(d_row, &logits[r * vocab..(r + 1) * vocab], scale, g_lp, g_h);
            d_row[targets[r]] += scale * g_lp;
        });
        tensor(out, &[rows, vocab])
    }
}

/// What a row's log-probabilities and entropy under `softmax(u)`, `u = scale·z`, are computed
/// from: `m = maxⱼ uⱼ`, `S = Σⱼ exp(uⱼ − m)` and `T = Σⱼ exp(uⱼ − m) · (uⱼ − m)` (shifted by
/// `m`, so the entropy does not lose digits subtracting two numbers near `m`).
pub(super) struct SoftmaxMoments {
    pub(super) max: f32,
    pub(super) total: f32,
    pub(super) weighted: f32,
}

impl SoftmaxMoments {
    /// `log Σⱼ exp(uⱼ) = m + ln S`: `log pⱼ = uⱼ − m − ln S`.
    pub(super) fn log_normaliser(&self) -> f32 {
        self.max + self.total.ln()
    }

    /// `H = −Σⱼ pⱼ log pⱼ = ln S − T/S`.
    pub(super) fn entropy(&self) -> f32 {
        self.total.ln() - self.weighted / self.total
    }
}

with_avx2!(fn softmax_moments(row: &[f32], scale: f32) -> SoftmaxMoments => softmax_moments_kernel);

with_avx2!(fn log_prob_entropy_gradient_row(out: &mut [f32], row: &[f32], scale: f32, g_lp: f32, g_h: f32) => log_prob_entropy_gradient_kernel);

#[inline(always)]
pub(super) fn softmax_moments_kernel(row: &[f32], scale: f32) -> SoftmaxMoments {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &z| m.max(scale * z));
    let (mut total, mut weighted) = ([0.0f32; 8], [0.0f32; 8]);
    let (body, tail) = row.split_at(row.len() / 8 * 8);
    for chunk in body.chunks_exact(8) {
        for i in 0..8 {
            let shifted = scale * chunk[i] - max;
            let e = exp_f32(shifted);
            total[i] += e;
            weighted[i] += e * shifted;
        }
    }
    let (mut total_tail, mut weighted_tail) = (0.0f32, 0.0f32);
    for &z in tail {
        let shifted = scale * z - max;
        let e = exp_f32(shifted);
        total_tail += e;
        weighted_tail += e * shifted;
    }
    SoftmaxMoments {
        max,
        total: total.iter().sum::<f32>() + total_tail,
        weighted: weighted.iter().sum::<f32>() + weighted_tail,
    }
}

/// `out ← −scale · pⱼ · (g_lp + g_H · (log pⱼ + H))`, the gradient of `g_lp·log pₜ + g_H·H`
/// with respect to `z` except the chosen token's `+scale·g_lp`. With
/// `log pⱼ + H = (uⱼ − m) − T/S` that is `−scale · pⱼ · (c + g_H·(uⱼ − m))`, `c = g_lp − g_H·T/S`.
#[inline(always)]
pub(super) fn log_prob_entropy_gradient_kernel(out: &mut [f32], row: &[f32], scale: f32, g_lp: f32, g_h: f32) {
    let moments = softmax_moments_kernel(row, scale);
    let c = g_lp - g_h * moments.weighted / moments.total;
    let factor = -scale / moments.total;
    for (o, &z) in out.iter_mut().zip(row) {
        let shifted = scale * z - moments.max;
        *o = factor * exp_f32(shifted) * (c + g_h * shifted);
    }
}

impl<B: ReinBackend, C: CheckpointStrategy> HeadKernels for Autodiff<B, C> {
    /// The head's log-probabilities and entropies with their own backward
    /// ([`HeadKernels::head_log_prob_entropy_backward`], which recomputes the logits chunk by chunk).
    fn head_log_prob_entropy(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        logits: Logits,
        chunk: usize,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct HeadLogProbEntropy;

        impl<B: ReinBackend> Backward<B, 2> for HeadLogProbEntropy {
            /// The hidden states, head weight, targets, how logits are formed and the chunk size.
            type State = (FloatTensor<B>, FloatTensor<B>, IntTensor<B>, Logits, usize);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [hidden_node, weight_node] = ops.parents.map(|node| node.map(|n| n.id));
                let (hidden, weight, targets, logits, chunk) = ops.state;
                let (d_hidden, d_weight) = B::head_log_prob_entropy_backward(
                    hidden,
                    weight,
                    targets,
                    logits,
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
                    logits,
                    chunk,
                );
                prep.finish(
                    state,
                    B::head_log_prob_entropy(hidden.primitive, weight.primitive, targets, logits, chunk),
                )
            }
            OpsKind::UnTracked(prep) => prep.finish(B::head_log_prob_entropy(
                hidden.primitive,
                weight.primitive,
                targets,
                logits,
                chunk,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};

    use super::*;
    use crate::backend::testing::{A, assert_close, central_difference, rand_like};

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
            let how = Logits { scale, softcap: None };
            A::head_log_prob_entropy(logits.clone().into_primitive().tensor(), identity, t, how, rows)
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
        logits: Logits,
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
                    self.logits,
                    chunk,
                ),
                None => {
                    let logits = hidden.clone().matmul(weight);
                    let logits = match self.logits.softcap {
                        Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
                        None => logits,
                    };
                    log_prob_entropy_ops::<A>(logits.into_primitive().tensor(), t, self.logits.scale)
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

        /// The chunked head (values and both gradients) equals the logits computed whole, for
        /// any chunk size, soft-capped or not.
        #[test]
        fn chunked_head_equals_the_whole_logits(
            rows in 1usize..20,
            width in 1usize..24,
            vocab in 1usize..90,
            chunk in 1usize..25,
            tied: bool,
            scale in 0.5f32..2.0,
            capped: bool,
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
                logits: Logits { scale, softcap: capped.then_some(1.3) },
            };
            let (chunked, whole) = (case.run(Some(chunk)), case.run(None));
            for (what, i) in [("values", 0), ("∂hidden", 1), ("∂W", 2)] {
                assert_close(what, &chunked[i], &whole[i], 1e-5);
            }
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
