//! Memory at a real vocabulary: a policy's log-probabilities and entropies, forward and
//! backward, never hold `[rows × vocab]` logits. Its own test binary, whose global allocator
//! counts the bytes allocated and their peak, on any platform (no `/proc` needed).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::backend::{Autodiff, Flex};
use rein_model::lm::{CausalLm, HEAD_CHUNK_BYTES, LmConfig, LmInit};
use rein_posttrain::{TokenBatch, completion_log_probs};

type B = Autodiff<Flex>;

/// The system allocator, counting the bytes live now and their peak since [`Counting::reset`].
struct Counting {
    live: AtomicUsize,
    peak: AtomicUsize,
}

#[global_allocator]
static HEAP: Counting = Counting {
    live: AtomicUsize::new(0),
    peak: AtomicUsize::new(0),
};

impl Counting {
    fn reset(&self) -> usize {
        let live = self.live.load(Ordering::SeqCst);
        self.peak.store(live, Ordering::SeqCst);
        live
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    fn grew(&self, bytes: usize) {
        let live = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(live, Ordering::SeqCst);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) };
        self.live.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            self.live.fetch_sub(layout.size(), Ordering::SeqCst);
            self.grew(new_size);
        }
        p
    }
}

/// SmolLM2's vocabulary on a one-layer, 32-wide model: the logits dominate everything else.
fn small_model_with_a_large_vocabulary() -> CausalLm<B> {
    let config = LmConfig::from_json(serde_json::json!({
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "tie_word_embeddings": true
    }))
    .unwrap();
    LmInit { config, std: 0.02 }.init::<B>(&mut rein_core::SeededRng::new(1), &Default::default())
}

/// 64 completions of 128 tokens: 8,192 rows, whose logits alone would be 1.6 GB in `f32` (and
/// as much again for their gradient). Forward and backward together stay under 40 % of that.
#[test]
fn log_probs_and_entropy_never_hold_the_whole_logits() {
    let model = small_model_with_a_large_vocabulary();
    let device = Default::default();
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..64u32)
        .map(|r| {
            let prompt = vec![1 + r, 2, 3, 4];
            let completion = (0..128u32).map(|t| (r * 977 + t * 131) % 49152).collect();
            (prompt, completion)
        })
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = pairs.iter().map(|(p, c)| (p.as_slice(), c.as_slice())).collect();
    let batch = TokenBatch::new(&pairs, 0);
    let whole_logits_mib = (batch.rows * batch.completion_width * 49152 * 4) as f64 / (1 << 20) as f64;
    assert!(whole_logits_mib > 1500.0);

    let before = HEAP.reset();
    let (log_prob, entropy) = completion_log_probs(&model, &batch, 0.7, true, &device);
    let loss = log_prob.sum() + entropy.expect("asked for").sum().mul_scalar(0.01);
    let grads = loss.backward();
    let embedding_grad = model.embed_tokens.weight.grad(&grads).expect("the head is trained");
    assert_eq!(embedding_grad.dims(), [49152, 32]);
    let grown = (HEAP.peak() - before) as f64 / (1 << 20) as f64;
    let chunk_mib = (HEAD_CHUNK_BYTES >> 20) as f64;
    assert!(
        grown < 0.4 * whole_logits_mib,
        "peak grew {grown:.0} MiB for {whole_logits_mib:.0} MiB of logits ({chunk_mib} MiB chunks)"
    );
}
