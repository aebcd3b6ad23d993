//! The fused kernels against burn's generic ops, values and gradients.

use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};

use super::{
    ReinBackend, cached_attention_ops, causal_attention_backward_ops, log_prob_entropy_backward_ops,
    log_prob_entropy_ops, rope_ops, varlen_causal_attention_backward_ops, varlen_causal_attention_ops,
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
        let x =
            Tensor::<A, 4>::random([batch, seq, heads, dim], Distribution::Normal(0.0, 1.0), &device).require_grad();
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
/// [`ReinBackend::lora_linear`] (`kernel`) or burn's autodiff of the ops. `W` and `b` get
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
        let values = |t: Option<Tensor<Flex, 2>>| t.map(|t| t.into_data().to_vec::<f32>().unwrap()).unwrap_or_default();
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
    /// [`varlen_causal_attention_ops`]: one `causal_attention` per sequence (what CUDA runs).
    Wrapper,
    /// Each sequence's slice of the inputs through `causal_attention`, by hand.
    Alone,
}

/// Packed attention's output and gradients `[y, ∂q, ∂k, ∂v]` for sequences of `lengths`
/// concatenated end to end, and the gradients of [`varlen_causal_attention_backward_ops`] given the
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
        Packing::Kernel => A::varlen_causal_attention(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), lengths),
        Packing::Wrapper => varlen_causal_attention_ops::<A>(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), lengths),
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
    let (d_q, d_k, d_v) =
        varlen_causal_attention_backward_ops::<Flex>(inner(qt), inner(k.clone()), inner(vt), lengths, inner(weights));
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
        let t = Tensor::<A, 1, Int>::from_data(TensorData::new(self.targets.clone(), [rows]), &device).into_primitive();
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
        let t = Tensor::<Flex, 1, Int>::from_data(TensorData::new(targets.clone(), [rows]), &device).into_primitive();
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
