//! Every kernel of `cube/` against burn's own ops on burn-wgpu, values and gradients. Without a
//! GPU, wgpu runs on Mesa's lavapipe (Vulkan on the CPU): this proves the kernels' logic, not
//! their speed. Each test also checks, by [`fused_launches`], that the family's impl launched
//! rein's kernel rather than falling back to burn's ops.

use burn::backend::{Autodiff, Wgpu};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, Int, Tensor, TensorData, TensorMetadata, TensorPrimitive};
use rein_gguf::GateActivation;

use super::fused_launches;
use crate::backend::attention::{
    cached_attention_ops, varlen_causal_attention_backward_ops, varlen_causal_attention_ops,
};
use crate::backend::glu::{glu_backward_ops, glu_ops};
use crate::backend::head::{log_prob_entropy_backward_ops, log_prob_entropy_ops};
use crate::backend::norm::{rms_norm_backward_ops, rms_norm_ops};
use crate::backend::rope::rope_ops;
use crate::backend::testing::{assert_close, rand_like, rope_tables};
use crate::backend::{
    AttentionKernels, GluKernels, HeadKernels, LinearKernels, NormKernels, PackedSequences, RopeKernels, Scoring,
};

type W = Wgpu;
type A = Autodiff<Wgpu>;

fn tensor<B: burn::tensor::backend::Backend, const D: usize>(shape: [usize; D], seed: u64) -> Tensor<B, D> {
    let mut draw = rand_like(seed);
    let values: Vec<f32> = (0..shape.iter().product()).map(|_| draw()).collect();
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

fn raw<B: burn::tensor::backend::Backend, const D: usize>(x: &Tensor<B, D>) -> FloatTensor<B> {
    x.clone().into_primitive().tensor()
}

fn values<B: burn::tensor::backend::Backend>(x: FloatTensor<B>) -> Vec<f32> {
    let elements = x.shape().num_elements();
    let x = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(B::float_reshape(x, [elements].into())));
    x.into_data().to_vec::<f32>().unwrap()
}

/// Runs `kernel`, asserting it launched at least one of rein's kernels on this thread.
fn fused<T>(what: &str, kernel: impl FnOnce() -> T) -> T {
    let before = fused_launches();
    let out = kernel();
    assert!(
        fused_launches() > before,
        "{what}: no rein kernel launched (burn's ops instead?)"
    );
    out
}

#[test]
fn rms_norm_and_its_backward_match_burns_ops() {
    // Rows shorter and longer than a cube's units; more rows than one block of the `∂w` sum.
    for (i, [rows, hidden]) in [[9, 40], [70, 600], [130, 256]].into_iter().enumerate() {
        let seed = 10 * i as u64;
        let (x, w, dy) = (
            tensor::<W, 2>([rows, hidden], seed),
            tensor::<W, 1>([hidden], seed + 1),
            tensor::<W, 2>([rows, hidden], seed + 2),
        );
        let y = fused("rms_norm", || W::rms_norm(raw(&x), raw(&w), 1e-6));
        assert_close(
            "values",
            &values::<W>(y),
            &values::<W>(rms_norm_ops::<W>(raw(&x), raw(&w), 1e-6)),
            1e-5,
        );
        let (d_x, d_w) = fused("rms_norm_backward", || {
            W::rms_norm_backward(raw(&x), raw(&w), raw(&dy), 1e-6)
        });
        let (ops_x, ops_w) = rms_norm_backward_ops::<W>(raw(&x), raw(&w), raw(&dy), 1e-6);
        assert_close("∂x", &values::<W>(d_x), &values::<W>(ops_x), 1e-5);
        assert_close("∂w", &values::<W>(d_w), &values::<W>(ops_w), 1e-4);
    }
}

#[test]
fn rms_norm_gradients_through_autodiff_match_burns_autodiff_of_the_ops() {
    let (x, w, weights) = (
        tensor::<A, 2>([33, 72], 1).require_grad(),
        tensor::<A, 1>([72], 2).require_grad(),
        tensor::<A, 2>([33, 72], 3),
    );
    let run = |kernel: bool| {
        let _graph = crate::one_graph();
        let y = if kernel {
            fused("rms_norm", || A::rms_norm(raw(&x), raw(&w), 1e-5))
        } else {
            rms_norm_ops::<A>(raw(&x), raw(&w), 1e-5)
        };
        let y = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(y));
        let grads = (y * weights.clone()).sum().backward();
        let grad = |t: &Tensor<A, 2>| t.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
        [grad(&x), w.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap()]
    };
    let (kernel, ops) = (run(true), run(false));
    assert_close("∂x", &kernel[0], &ops[0], 1e-5);
    assert_close("∂w", &kernel[1], &ops[1], 1e-4);
}

#[test]
fn glu_gates_and_their_backward_match_burns_ops_on_strided_views() {
    let (rows, width) = (37, 64);
    // The gate and up halves of one `[rows, 2·width]` product (views where their offsets meet
    // the device's alignment, as a model's widths do), and transposed views.
    let gate_up = tensor::<W, 2>([rows, 2 * width], 4).mul_scalar(3.0);
    let halves = (gate_up.clone().narrow(1, 0, width), gate_up.narrow(1, width, width));
    let transposed = (
        tensor::<W, 2>([width, rows], 5).mul_scalar(3.0).swap_dims(0, 1),
        tensor::<W, 2>([width, rows], 6).swap_dims(0, 1),
    );
    let dy = tensor::<W, 2>([rows, width], 7);
    for (layout, (gate, up)) in [("halves", halves), ("transposed", transposed)] {
        for activation in [GateActivation::Silu, GateActivation::GeluTanh] {
            let what = |part: &str| format!("{layout}, {activation:?}: {part}");
            let y = fused("glu", || W::glu(raw(&gate), raw(&up), activation));
            let ops = glu_ops::<W>(raw(&gate), raw(&up), activation);
            assert_close(&what("values"), &values::<W>(y), &values::<W>(ops), 1e-5);
            let (d_gate, d_up) = fused("glu_backward", || {
                W::glu_backward(raw(&gate), raw(&up), raw(&dy), activation)
            });
            let (ops_gate, ops_up) = glu_backward_ops::<W>(raw(&gate), raw(&up), raw(&dy), activation);
            assert_close(&what("∂gate"), &values::<W>(d_gate), &values::<W>(ops_gate), 1e-5);
            assert_close(&what("∂up"), &values::<W>(d_up), &values::<W>(ops_up), 1e-5);
        }
    }
}

#[test]
fn rope_and_its_gradient_match_burns_ops_on_a_transposed_view() {
    let device = Default::default();
    let (batch, seq, heads, dim, positions) = (2, 5, 3, 16, 11);
    let x = tensor::<A, 4>([batch, seq, heads, dim], 6).require_grad();
    let weights = tensor::<A, 4>([batch, heads, seq, dim], 7);
    let (cos, sin) = rope_tables::<A>(positions, dim);
    let at: Vec<i64> = (0..batch * seq).map(|i| (i * 3 % positions) as i64).collect();
    let at = Tensor::<A, 2, Int>::from_data(TensorData::new(at, [batch, seq]), &device);
    let run = |kernel: bool| {
        let _graph = crate::one_graph();
        // [batch, seq, heads, dim] viewed as [batch, heads, seq, dim], as the model passes it.
        let view = x.clone().swap_dims(1, 2);
        let (input, p) = (raw(&view), at.clone().into_primitive());
        let y = if kernel {
            fused("rope", || A::rope(input, p, raw(&cos), raw(&sin)))
        } else {
            rope_ops::<A>(input, p, raw(&cos), raw(&sin))
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

#[test]
fn full_f32_products_match_a_sum_in_f64() {
    let (m, k, n) = (19, 70, 23);
    let (a, b) = (tensor::<W, 3>([2, m, k], 8), tensor::<W, 3>([2, k, n], 9));
    let product = values::<W>(W::matmul(raw(&a), raw(&b)));
    let (a, b) = (values::<W>(raw(&a)), values::<W>(raw(&b)));
    let mut expected = Vec::with_capacity(product.len());
    for batch in 0..2 {
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k)
                    .map(|l| f64::from(a[(batch * m + i) * k + l]) * f64::from(b[(batch * k + l) * n + j]))
                    .sum();
                expected.push(sum as f32);
            }
        }
    }
    assert_close("a · b", &product, &expected, 1e-5);
}

#[test]
fn attention_over_the_cache_matches_burns_ops() {
    let device = Default::default();
    let (batch, kv_heads, capacity) = (3, 2, 40);
    // Decoding (one new token) and prefill (several) after `offset` cached ones; grouped query
    // heads; padding, a window and a soft-cap; a head size above 128 (fewer units per cube).
    let cases = [
        (1, 9, 16, None, None, false),
        (5, 0, 16, None, None, true),
        (4, 20, 32, Some(7), Some(5.0), true),
        (1, 33, 160, None, Some(2.0), true),
    ];
    for (case, (seq, offset, dim, window, softcap, padded)) in cases.into_iter().enumerate() {
        let seed = 100 + 10 * case as u64;
        let heads = 3 * kv_heads;
        let q = tensor::<W, 4>([batch, heads, seq, dim], seed);
        let (k, v) = (
            tensor::<W, 4>([batch, kv_heads, capacity, dim], seed + 1),
            tensor::<W, 4>([batch, kv_heads, capacity, dim], seed + 2),
        );
        let keys = offset + seq;
        // Left padding: sequence b has its first b positions padded.
        let padding = padded.then(|| {
            let flags: Vec<bool> = (0..batch * keys).map(|at| at % keys < at / keys).collect();
            Tensor::<W, 2, Bool>::from_data(TensorData::new(flags, [batch, keys]), &device).into_primitive()
        });
        let scoring = Scoring {
            scale: 1.0 / (dim as f32).sqrt(),
            window,
            softcap,
        };
        let got = fused("cached_attention", || {
            W::cached_attention(raw(&q), raw(&k), raw(&v), offset, padding.clone(), scoring)
        });
        let want = cached_attention_ops::<W>(raw(&q), raw(&k), raw(&v), offset, padding, scoring);
        assert_close(&format!("case {case}"), &values::<W>(got), &values::<W>(want), 1e-5);
    }
}

#[test]
fn log_probs_entropies_and_their_gradient_match_burns_ops() {
    let device = Default::default();
    // A vocabulary smaller and one larger than a cube's units; logits a transposed view and
    // large enough that an unshifted exp would overflow.
    for (case, (rows, vocab, scale)) in [(7, 50, 1.0f32), (19, 1000, 0.7)].into_iter().enumerate() {
        let seed = 200 + 10 * case as u64;
        let logits = tensor::<W, 2>([vocab, rows], seed).mul_scalar(40.0).swap_dims(0, 1);
        let chosen: Vec<i64> = (0..rows).map(|r| ((r * 37) % vocab) as i64).collect();
        let targets = Tensor::<W, 1, Int>::from_data(TensorData::new(chosen, [rows]), &device);
        let grad = tensor::<W, 2>([rows, 2], seed + 1);
        let t = || targets.clone().into_primitive();
        let got = fused("log_prob_entropy", || W::log_prob_entropy(raw(&logits), t(), scale));
        let want = log_prob_entropy_ops::<W>(raw(&logits), t(), scale);
        assert_close(
            &format!("case {case} [log p, H]"),
            &values::<W>(got),
            &values::<W>(want),
            1e-5,
        );
        let got = fused("log_prob_entropy_backward", || {
            W::log_prob_entropy_backward(raw(&logits), t(), scale, raw(&grad))
        });
        let want = log_prob_entropy_backward_ops::<W>(raw(&logits), t(), scale, raw(&grad));
        assert_close(
            &format!("case {case} ∂logits"),
            &values::<W>(got),
            &values::<W>(want),
            1e-5,
        );
    }
}

#[test]
fn packed_attention_and_its_backward_match_burns_ops() {
    // Whole sequences; a prompt shared by three completions, one continued twice more (a tree
    // three levels deep) beside a sequence of its own; a window and a soft-cap; a head size
    // above 64 (fewer units per cube).
    let cases = [
        (PackedSequences::new(vec![5, 1, 9]), 16, None, None),
        (
            PackedSequences::tree(
                vec![6, 4, 3, 5, 2, 2, 7],
                vec![None, Some(0), Some(0), Some(0), Some(3), Some(3), None],
            )
            .unwrap(),
            16,
            Some(4),
            Some(3.0),
        ),
        (
            PackedSequences::tree(vec![3, 5, 4], vec![None, Some(0), Some(1)]).unwrap(),
            96,
            None,
            None,
        ),
    ];
    for (case, (sequences, dim, window, softcap)) in cases.into_iter().enumerate() {
        let seed = 300 + 10 * case as u64;
        let (heads, kv_heads, total) = (6, 2, sequences.total());
        let q = tensor::<W, 4>([1, heads, total, dim], seed);
        let (k, v) = (
            tensor::<W, 4>([1, kv_heads, total, dim], seed + 1),
            tensor::<W, 4>([1, kv_heads, total, dim], seed + 2),
        );
        let grad = tensor::<W, 4>([1, total, heads, dim], seed + 3);
        let scoring = Scoring {
            scale: 1.0 / (dim as f32).sqrt(),
            window,
            softcap,
        };
        let got = fused("varlen_causal_attention", || {
            W::varlen_causal_attention(raw(&q), raw(&k), raw(&v), &sequences, scoring)
        });
        let want = varlen_causal_attention_ops::<W>(raw(&q), raw(&k), raw(&v), &sequences, scoring);
        assert_close(
            &format!("case {case} values"),
            &values::<W>(got),
            &values::<W>(want),
            1e-5,
        );
        let got = fused("varlen_causal_attention_backward", || {
            W::varlen_causal_attention_backward(raw(&q), raw(&k), raw(&v), &sequences, scoring, raw(&grad))
        });
        let want =
            varlen_causal_attention_backward_ops::<W>(raw(&q), raw(&k), raw(&v), &sequences, scoring, raw(&grad));
        for (what, (a, b)) in ["∂q", "∂k", "∂v"]
            .iter()
            .zip([(got.0, want.0), (got.1, want.1), (got.2, want.2)])
        {
            assert_close(&format!("case {case} {what}"), &values::<W>(a), &values::<W>(b), 1e-4);
        }
    }
}
