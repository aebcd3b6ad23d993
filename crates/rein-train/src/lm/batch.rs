//! Turning prompts and completions into training tensors and per-token log-probabilities.
//!
//! Layout: each row is its prompt left-padded to the batch's longest prompt `P`, followed by
//! its completion right-padded to the longest completion `C`. Completion tokens therefore sit in
//! columns `P..P+C` of every row, and the logits that predict them in columns `P−1..P+C−1`.
//! Positions count from each row's first real token, so padding changes nothing.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use rein_model::Backend;
use rein_model::lm::{CausalLm, Context};

/// Prompts and completions laid out for one forward pass.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// `[rows, P + C]`.
    pub tokens: Vec<i64>,
    /// `[rows, P + C]`.
    pub positions: Vec<i64>,
    /// `[rows, P + C]`, true on padding.
    pub padding: Vec<bool>,
    /// `[rows, C]`, 1 on completion tokens that count in the loss.
    pub completion_mask: Vec<f32>,
    /// `[rows, C]`, the completion tokens (padding 0).
    pub targets: Vec<i64>,
    /// Rows.
    pub rows: usize,
    /// Longest prompt.
    pub prompt_width: usize,
    /// Longest completion.
    pub completion_width: usize,
}

impl TokenBatch {
    /// Lays out `pairs` of (prompt tokens, completion tokens). `pad_id` fills padding.
    pub fn new(pairs: &[(&[u32], &[u32])], pad_id: u32) -> Self {
        let rows = pairs.len();
        let p = pairs.iter().map(|(prompt, _)| prompt.len()).max().unwrap_or(0).max(1);
        let c = pairs
            .iter()
            .map(|(_, completion)| completion.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let width = p + c;
        let mut batch = TokenBatch {
            tokens: Vec::with_capacity(rows * width),
            positions: Vec::with_capacity(rows * width),
            padding: Vec::with_capacity(rows * width),
            completion_mask: Vec::with_capacity(rows * c),
            targets: Vec::with_capacity(rows * c),
            rows,
            prompt_width: p,
            completion_width: c,
        };
        for (prompt, completion) in pairs {
            let pad = p - prompt.len();
            let mut position = 0i64;
            for j in 0..width {
                let token = if j < pad {
                    None
                } else if j < p {
                    Some(prompt[j - pad])
                } else {
                    completion.get(j - p).copied()
                };
                batch.tokens.push(i64::from(token.unwrap_or(pad_id)));
                batch.positions.push(position);
                batch.padding.push(token.is_none());
                if token.is_some() {
                    position += 1;
                }
            }
            for j in 0..c {
                batch.completion_mask.push(if j < completion.len() { 1.0 } else { 0.0 });
                batch.targets.push(completion.get(j).map_or(0, |&t| i64::from(t)));
            }
        }
        batch
    }

    /// Leaves out of the loss the completion tokens of `row` where `kept` is false (tokens a
    /// tool or an environment added to a multi-turn episode).
    pub fn keep_in_loss(&mut self, row: usize, kept: &[bool]) {
        let c = self.completion_width;
        for (mask, &keep) in self.completion_mask[row * c..(row + 1) * c].iter_mut().zip(kept) {
            if !keep {
                *mask = 0.0;
            }
        }
    }

    /// The completion mask as a tensor, `[rows, C]`.
    pub fn mask<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(self.completion_mask.clone(), [self.rows, self.completion_width]),
            device,
        )
    }

    /// A `[rows, C]` float tensor from per-row values of varying length (padded with 0).
    pub fn per_token<B: Backend>(&self, values: &[&[f32]], device: &B::Device) -> Tensor<B, 2> {
        let flat = self.per_token_values(values);
        Tensor::from_data(TensorData::new(flat, [self.rows, self.completion_width]), device)
    }

    /// Per-row values of varying length laid out `[rows, C]` (padded with 0).
    pub fn per_token_values(&self, values: &[&[f32]]) -> Vec<f32> {
        let mut flat = Vec::with_capacity(self.rows * self.completion_width);
        for row in values {
            flat.extend((0..self.completion_width).map(|j| row.get(j).copied().unwrap_or(0.0)));
        }
        flat
    }
}

/// Per-token log-probabilities of the completion tokens under `softmax(logits / temperature)`,
/// and optionally the entropy of that distribution at each completion position.
///
/// # Shapes
/// → `[rows, C]` each (padding positions hold meaningless values; use the mask)
pub fn completion_log_probs<B: Backend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    with_entropy: bool,
    device: &B::Device,
) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
    let (rows, p, c) = (batch.rows, batch.prompt_width, batch.completion_width);
    let width = p + c;
    let rope = model.rope(width, device);
    let padding: Tensor<B, 2, Bool> = Tensor::<B, 2, Int>::from_data(
        TensorData::new(
            batch.padding.iter().map(|&b| i64::from(b)).collect::<Vec<_>>(),
            [rows, width],
        ),
        device,
    )
    .bool();
    let ctx = Context {
        rope: &rope,
        positions: Tensor::from_data(TensorData::new(batch.positions.clone(), [rows, width]), device),
        padding: Some(padding),
        fused: None,
    };
    let tokens = Tensor::from_data(TensorData::new(batch.tokens.clone(), [rows, width]), device);
    let hidden = model.hidden(tokens, &ctx, None).narrow(1, p - 1, c);
    let width = hidden.dims()[2];
    let scale = if temperature != 1.0 && temperature > 0.0 {
        1.0 / temperature
    } else {
        1.0
    };
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(batch.targets.clone(), [rows * c]), device);
    let out = model.log_prob_entropy(hidden.reshape([rows * c, width]), targets, scale);
    let log_prob = out.clone().narrow(1, 0, 1).reshape([rows, c]);
    let entropy = with_entropy.then(|| out.narrow(1, 1, 1).reshape([rows, c]));
    (log_prob, entropy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_left_pads_prompts_and_right_pads_completions() {
        let batch = TokenBatch::new(&[(&[5, 6, 7], &[8]), (&[9], &[10, 11])], 0);
        assert_eq!((batch.prompt_width, batch.completion_width), (3, 2));
        assert_eq!(batch.tokens, vec![5, 6, 7, 8, 0, 0, 0, 9, 10, 11]);
        assert_eq!(batch.positions, vec![0, 1, 2, 3, 4, 0, 0, 0, 1, 2]);
        assert_eq!(
            batch.padding,
            vec![false, false, false, false, true, true, true, false, false, false]
        );
        assert_eq!(batch.completion_mask, vec![1.0, 0.0, 1.0, 1.0]);
        assert_eq!(batch.targets, vec![8, 0, 10, 11]);
    }
}
