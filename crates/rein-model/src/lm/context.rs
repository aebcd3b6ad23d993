//! [`Context`]: what one forward pass of a causal LM uses besides its tokens — rotary tables,
//! positions, padding, packed sequence lengths, fused projections, expert routing.

use burn::tensor::{Bool, Int, Tensor};

use super::fused::FusedProjections;
use super::moe::Routing;
use super::rope::Rope;
use crate::backend::{PackedSequences, ReinBackend};

/// What one forward pass uses besides its tokens.
pub struct Context<'a, B: ReinBackend> {
    /// Rotary tables covering every position used.
    pub rope: &'a Rope<B>,
    /// Position of each token, `[batch, seq]` (left-padded rows start at 0 on their first real token).
    pub positions: Tensor<B, 2, Int>,
    /// `true` where a token is padding, `[batch, seq]`; `None` when there is none.
    pub padding: Option<Tensor<B, 2, Bool>>,
    /// The sequences when the batch is one row of sequences concatenated end to end (no
    /// padding, each attending to its own tokens and those of the prefix it continues: see
    /// [`AttentionKernels::varlen_causal_attention`](crate::AttentionKernels::varlen_causal_attention));
    /// `None` for a batch of one sequence per row. Training only: a cache holds one sequence
    /// per row.
    pub sequences: Option<&'a PackedSequences>,
    /// The model's projections concatenated (for inference; same results, fewer matrix
    /// products), or `None` to use its own weights (always, when training).
    pub fused: Option<&'a FusedProjections<B>>,
    /// Where a mixture-of-experts model records the experts it chooses and its router
    /// probabilities, or takes the experts from ([`Routing`]); `None` to route freely and
    /// record nothing (dense models ignore it).
    pub routing: Option<&'a Routing<B>>,
}

impl<'a, B: ReinBackend> Context<'a, B> {
    /// One unpadded sequence's `len` tokens at positions `start..start + len` (a prefill from
    /// 0, or decoding after `start` cached tokens), the model's own weights, free routing.
    pub fn single(rope: &'a Rope<B>, start: usize, len: usize, device: &B::Device) -> Self {
        Self {
            rope,
            positions: Tensor::<B, 1, Int>::arange(start as i64..(start + len) as i64, device).unsqueeze::<2>(),
            padding: None,
            sequences: None,
            fused: None,
            routing: None,
        }
    }
}
