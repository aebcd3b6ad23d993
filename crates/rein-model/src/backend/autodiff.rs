//! [`ReinBackend`] on burn's autodiff backend: each kernel the inner backend's, with its backward
//! registered (whole-sequence attention keeps no weights: its backward recomputes them).

#![allow(clippy::wildcard_imports)]

use super::*;

/// How the sequences of a whole-sequence attention lie in its inputs.
#[derive(Debug, Clone)]
enum Sequences<B: ReinBackend> {
    /// One per batch entry, with its padding ([`ReinBackend::causal_attention`]).
    Padded(Option<BoolTensor<B>>),
    /// End to end in one entry, of these lengths ([`ReinBackend::varlen_causal_attention`]).
    Packed(Vec<usize>),
}

impl<B: ReinBackend> Sequences<B> {
    fn attention(&self, q: FloatTensor<B>, k: FloatTensor<B>, v: FloatTensor<B>) -> FloatTensor<B> {
        match self {
            Sequences::Padded(padding) => B::causal_attention(q, k, v, padding.clone()),
            Sequences::Packed(lengths) => B::varlen_causal_attention(q, k, v, lengths),
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
            Sequences::Packed(lengths) => B::varlen_causal_attention_backward(q, k, v, &lengths, grad),
        }
    }
}

/// Whole-sequence attention on the autodiff backend: the inner backend's, with the inner
/// backend's own backward (which recomputes the attention weights instead of keeping them).
fn tracked_attention<B: ReinBackend, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    sequences: Sequences<B>,
) -> FloatTensor<Autodiff<B, C>> {
    #[derive(Debug)]
    struct Attention;

    impl<B: ReinBackend> Backward<B, 3> for Attention {
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

impl<B: ReinBackend, C: CheckpointStrategy> ReinBackend for Autodiff<B, C> {
    fn tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Tanh;

        impl<B: ReinBackend> Backward<B, 1> for Tanh {
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

    /// RMSNorm with its own backward ([`ReinBackend::rms_norm_backward`], one pass on Flex).
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RmsNorm;

        impl<B: ReinBackend> Backward<B, 2> for RmsNorm {
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

    /// SwiGLU with its own backward ([`ReinBackend::swiglu_backward`], one pass on Flex).
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Swiglu;

        impl<B: ReinBackend> Backward<B, 2> for Swiglu {
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

        impl<B: ReinBackend> Backward<B, 1> for Rope {
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

    /// Whole-sequence attention with its own backward ([`ReinBackend::causal_attention_backward`], which
    /// recomputes the attention weights instead of keeping them).
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        padding: Option<BoolTensor<Self>>,
    ) -> FloatTensor<Self> {
        tracked_attention::<B, C>(q, k, v, Sequences::Padded(padding))
    }

    /// Packed attention with its own backward ([`ReinBackend::varlen_causal_attention_backward`]).
    fn varlen_causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        lengths: &[usize],
    ) -> FloatTensor<Self> {
        tracked_attention::<B, C>(q, k, v, Sequences::Packed(lengths.to_vec()))
    }

    /// The head's log-probabilities and entropies with their own backward
    /// ([`ReinBackend::head_log_prob_entropy_backward`], which recomputes the logits chunk by chunk).
    fn head_log_prob_entropy(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
        chunk: usize,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct HeadLogProbEntropy;

        impl<B: ReinBackend> Backward<B, 2> for HeadLogProbEntropy {
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

    /// [`ReinBackend::lora_linear`] with its own backward ([`ReinBackend::lora_linear_backward`]; `∂W`
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
        fn backward_inputs<B: ReinBackend>(
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

        impl<B: ReinBackend> Backward<B, 4> for LoraLinear {
            type State = State<B>;

            fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let nodes = ops.parents.map(|node| node.map(|n| n.id));
                backward_inputs::<B>(nodes, ops.state, &grad, grads);
            }
        }

        impl<B: ReinBackend> Backward<B, 5> for LoraLinear {
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
        fn backward_x_w<B: ReinBackend>(
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

        impl<B: ReinBackend> Backward<B, 2> for Linear {
            /// `x` and `W`.
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let [x, w] = ops.parents.map(|node| node.map(|n| n.id));
                backward_x_w::<B>([x, w], ops.state, &grad, grads);
            }
        }

        impl<B: ReinBackend> Backward<B, 3> for Linear {
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
