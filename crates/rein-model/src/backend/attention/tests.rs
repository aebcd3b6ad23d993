//! Attention's kernels against burn's generic ops and finite differences, values and gradients.

use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{Bool, Distribution, Tensor, TensorData, TensorPrimitive};

use super::*;
use crate::backend::testing::{A, assert_close, assert_tensors_close, central_difference, random, raw};

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
    scoring: Scoring,
}

/// `1/√dim`, or Gemma's choices: another scale, a window of `window` keys (none for 0), a cap.
fn scoring(dim: usize, window: usize, softcap: bool) -> Scoring {
    let standard = Scoring::standard(dim);
    Scoring {
        scale: if softcap { 0.3 } else { standard.scale },
        window: (window > 0).then_some(window),
        softcap: softcap.then_some(1.5),
    }
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
            scoring: Scoring::standard(dim),
        }
    }

    fn with_scoring(mut self, scoring: Scoring) -> Self {
        self.scoring = scoring;
        self
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
            A::causal_attention(q, k, v, padding, self.scoring)
        } else {
            cached_attention_ops::<A>(q, k, v, 0, padding, self.scoring)
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
            self.scoring,
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
        window in 0usize..6,
        softcap in proptest::bool::ANY,
    ) {
        let pad = (left.min(seq - 1), right.min(seq - 1));
        let case = AttentionCase::new(batch, kv_heads * group, kv_heads, seq, 2 * half_dim, pad)
            .with_scoring(scoring(2 * half_dim, window, softcap));
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
    /// [`varlen_causal_attention_ops`]: masked attention over blocks of sequences (what CUDA
    /// runs; the sequences here fit one block).
    Wrapper,
    /// The same with blocks of at most 5 tokens: several blocks, longer sequences alone.
    SmallBlocks,
    /// Each sequence's rows (its prefix's, then its own) gathered from the inputs, through
    /// `causal_attention`, by hand.
    Alone,
}

/// Packed attention's output and gradients `[y, ∂q, ∂k, ∂v]` for `sequences` concatenated end
/// to end, and the gradients of [`varlen_causal_attention_backward_ops`] given the same output
/// gradient.
fn packed_attention(
    sequences: &PackedSequences,
    heads: usize,
    kv_heads: usize,
    dim: usize,
    scoring: Scoring,
    how: Packing,
) -> [Vec<f32>; 7] {
    let _graph = crate::one_graph();
    let device = Default::default();
    let total = sequences.total();
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
        Packing::Kernel => {
            A::varlen_causal_attention(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), sequences, scoring)
        }
        Packing::Wrapper => {
            varlen_causal_attention_ops::<A>(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), sequences, scoring)
        }
        Packing::SmallBlocks => {
            blocked_attention_ops::<A>(raw(qt.clone()), raw(k.clone()), raw(vt.clone()), sequences, scoring, 5)
        }
        Packing::Alone => {
            let starts = sequences.starts();
            let mut outputs = Vec::new();
            for (i, &len) in sequences.lengths().iter().enumerate() {
                let rows: Vec<i64> = (sequences.prefix_rows(i, &starts).into_iter())
                    .chain(starts[i]..starts[i] + len)
                    .map(|row| row as i64)
                    .collect();
                let keys = rows.len();
                let rows = Tensor::<A, 1, burn::tensor::Int>::from_data(TensorData::new(rows, [keys]), &device);
                let part = |t: &Tensor<A, 4>| raw(t.clone().select(2, rows.clone()));
                let y = A::causal_attention(part(&qt), part(&k), part(&vt), None, scoring);
                let y = Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y));
                outputs.push(y.narrow(1, keys - len, len));
            }
            raw(Tensor::cat(outputs, 1))
        }
    };
    let y = Tensor::<A, 4>::from_primitive(TensorPrimitive::Float(y));
    let grads = (y.clone() * weights.clone()).sum().backward();
    let values = |t: Tensor<Flex, 4>| t.into_data().to_vec::<f32>().unwrap();
    let inner = |t: Tensor<A, 4>| t.inner().into_primitive().tensor();
    let (d_q, d_k, d_v) = match how {
        Packing::SmallBlocks => blocked_attention_backward_ops::<Flex>(
            inner(qt),
            inner(k.clone()),
            inner(vt),
            sequences,
            scoring,
            inner(weights),
            5,
        ),
        _ => varlen_causal_attention_backward_ops::<Flex>(
            inner(qt),
            inner(k.clone()),
            inner(vt),
            sequences,
            scoring,
            inner(weights),
        ),
    };
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

    /// Each packed sequence attends to its own tokens only, as it would alone, in the kernel
    /// and in the blocks of burn ops other backends run.
    #[test]
    fn packed_attention_equals_each_sequence_alone(
        lengths in proptest::collection::vec(1usize..9, 1..5),
        kv_heads in 1usize..3,
        group in 1usize..4,
        half_dim in 1usize..9,
        window in 0usize..6,
        softcap in proptest::bool::ANY,
    ) {
        let (heads, dim) = (kv_heads * group, 2 * half_dim);
        let scoring = scoring(dim, window, softcap);
        assert_packed_attention_equals_each_sequence_alone(&PackedSequences::new(lengths), heads, kv_heads, dim, scoring);
    }

    /// A segment continuing others (a prompt stored once for its completions, a branch of a
    /// branch) attends as its whole sequence would alone, and its prefix's gradients are the
    /// sum of what each sequence through it gives them.
    #[test]
    fn packed_trees_attend_as_each_sequence_alone(
        segments in proptest::collection::vec((1usize..9, 0usize..4), 1..7),
        kv_heads in 1usize..3,
        group in 1usize..4,
        half_dim in 1usize..9,
        window in 0usize..6,
        softcap in proptest::bool::ANY,
    ) {
        let (heads, dim) = (kv_heads * group, 2 * half_dim);
        let scoring = scoring(dim, window, softcap);
        assert_packed_attention_equals_each_sequence_alone(&random_tree(&segments), heads, kv_heads, dim, scoring);
    }
}

/// Segments of the given lengths, each with a link choosing its parent: 0 none (a new tree),
/// otherwise an earlier segment of the current tree.
fn random_tree(segments: &[(usize, usize)]) -> PackedSequences {
    let mut root = 0;
    let parents = (segments.iter().enumerate())
        .map(|(i, &(_, link))| match link {
            0 => {
                root = i;
                None
            }
            _ if i == root => None,
            _ => Some(root + link % (i - root)),
        })
        .collect();
    let lengths = segments.iter().map(|&(len, _)| len).collect();
    PackedSequences::tree(lengths, parents).expect("a valid tree")
}

fn assert_packed_attention_equals_each_sequence_alone(
    sequences: &PackedSequences,
    heads: usize,
    kv_heads: usize,
    dim: usize,
    scoring: Scoring,
) {
    let run = |how| packed_attention(sequences, heads, kv_heads, dim, scoring, how);
    let (kernel, wrapper, alone) = (run(Packing::Kernel), run(Packing::Wrapper), run(Packing::Alone));
    let blocks = run(Packing::SmallBlocks);
    let names = ["values", "∂q", "∂k", "∂v", "backward ∂q", "backward ∂k", "backward ∂v"];
    // The kernel against itself on slices: the same arithmetic. The burn-op paths (what CUDA
    // runs) against the kernel: this file's kernel-versus-ops tolerance, as rounding differs
    // where ∂S's rowsum cancels (a wrong mask is off by tenths, not by 1e-4).
    // The `backward` entries are the burn-op backward in every variant.
    for (i, what) in names.iter().enumerate() {
        let kernel_tolerance = if i < 4 { 1e-6 } else { 1e-4 };
        assert_close(what, &kernel[i], &alone[i], kernel_tolerance);
        assert_close(what, &wrapper[i], &alone[i], 1e-4);
        assert_close(what, &blocks[i], &alone[i], 1e-4);
    }
    // The backward alone, against the gradients autodiff found through the kernel.
    for i in 0..3 {
        assert_close(names[4 + i], &kernel[4 + i], &kernel[1 + i], 1e-4);
    }
}

#[test]
fn packed_blocks_group_consecutive_sequences_up_to_the_limit() {
    let lengths = |blocks: Vec<(usize, PackedSequences)>| -> Vec<(usize, Vec<usize>)> {
        (blocks.into_iter())
            .map(|(start, block)| (start, block.lengths().to_vec()))
            .collect()
    };
    let blocks = packed_blocks(&PackedSequences::new(vec![3, 2, 7, 1, 1, 4]), 5);
    // 3 + 2 fit; 7 is over the limit alone; 1 + 1 fit and 4 would not.
    let expected = vec![(0, vec![3, 2]), (5, vec![7]), (12, vec![1, 1]), (14, vec![4])];
    assert_eq!(lengths(blocks), expected);
    assert_eq!(
        lengths(packed_blocks(&PackedSequences::new(vec![2, 2]), 1024)),
        [(0, vec![2, 2])]
    );
    assert!(packed_blocks(&PackedSequences::new(vec![]), 8).is_empty());
    // A tree stays whole: a prefix of 3 and its two continuations are one block, over the limit.
    let tree = PackedSequences::tree(vec![1, 3, 2, 2, 1], vec![None, None, Some(1), Some(1), None]).unwrap();
    assert_eq!(
        lengths(packed_blocks(&tree, 5)),
        [(0, vec![1]), (1, vec![3, 2, 2]), (8, vec![1])]
    );
}

#[test]
fn a_packed_mask_keeps_each_query_to_its_own_sequence_and_past() {
    for window in [None, Some(2)] {
        let mask: Vec<bool> = packed_mask::<Flex>(&PackedSequences::new(vec![2, 4]), window, &Default::default())
            .into_data()
            .to_vec()
            .unwrap();
        let allowed = |q: usize, k: usize| !mask[q * 6 + k];
        let same = |q: usize, k: usize| (q < 2) == (k < 2);
        let within = |q: usize, k: usize| window.is_none_or(|w| q - k < w);
        for q in 0..6 {
            for k in 0..6 {
                let expected = same(q, k) && k <= q && within(q, k);
                assert_eq!(allowed(q, k), expected, "window {window:?}, query {q}, key {k}");
            }
        }
    }
}

/// The kernel's gradients against central differences of the loss, element by element
/// (f32: step 1e-2, tolerance 2 %).
#[test]
fn causal_attention_gradients_match_finite_differences() {
    for scoring in [Scoring::standard(6), scoring(6, 3, true)] {
        attention_gradients_match_finite_differences(scoring);
    }
}

fn attention_gradients_match_finite_differences(scoring: Scoring) {
    let case = AttentionCase::new(2, 4, 2, 5, 6, (2, 1)).with_scoring(scoring);
    let [_, d_q, d_k, d_v] = case.run(true);
    let loss = |q: &Tensor<A, 4>, k: &Tensor<A, 4>, v: &Tensor<A, 4>| {
        let raw = |t: Tensor<A, 4>| t.inner().into_primitive().tensor();
        let padding = case.padding.clone().map(|p| p.inner().into_primitive());
        let y = Flex::causal_attention(
            raw(q.clone().swap_dims(1, 2)),
            raw(k.clone()),
            raw(v.clone().swap_dims(1, 2)),
            padding,
            case.scoring,
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
                "{scoring:?}: input {which} element {i}: kernel {} vs finite difference {numeric}",
                grad[i]
            );
        }
    }
}

#[test]
fn cached_attention_matches_burn_ops_with_padding() {
    let device = Default::default();
    // 4 query heads over 2 key/value heads; a cache of capacity 7.
    let (k, v) = (random([3, 2, 7, 8], 7), random([3, 2, 7, 8], 8));
    // Decoding one token, prefilling five, and three more after two cached.
    for (seq, offset) in [(1, 4), (5, 0), (3, 2)] {
        let keys = offset + seq;
        // A transposed view, as the model's queries are.
        let q = random([3, seq, 4, 8], 6 + seq as u64).swap_dims(1, 2);
        let flags: Vec<bool> = (0..3 * keys).map(|i| i % keys < i / keys).collect();
        let padding = Tensor::<Flex, 1, Bool>::from_data(flags.as_slice(), &device).reshape([3, keys]);
        for padding in [None, Some(padding)] {
            for scoring in [Scoring::standard(8), scoring(8, 2, true), scoring(8, 3, false)] {
                let padding = padding.clone().map(Tensor::into_primitive);
                assert_tensors_close(
                    Flex::cached_attention(raw(&q), raw(&k), raw(&v), offset, padding.clone(), scoring),
                    cached_attention_ops::<Flex>(raw(&q), raw(&k), raw(&v), offset, padding, scoring),
                );
            }
        }
    }
}

#[test]
fn write_cache_matches_slice_assign_and_writes_in_place() {
    let buffer = random([2, 3, 6, 4], 9);
    // A transposed view, as the model's values are.
    let values = random([2, 2, 3, 4], 10).swap_dims(1, 2);
    let expected = write_cache_ops::<Flex>(raw(&buffer), raw(&values), 3);
    let buffer = buffer.into_primitive().tensor();
    let address = buffer.bytes().as_ptr();
    let written = Flex::write_cache(buffer, raw(&values), 3);
    assert_eq!(written.bytes().as_ptr(), address, "the buffer was copied");
    assert_tensors_close(written, expected);
}
