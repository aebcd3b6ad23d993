//! [`TokenBatch`]: prompts and completions laid out as training rows.
//!
//! Layout: each row is its prompt left-padded to the batch's longest prompt `P`, followed by
//! its completion right-padded to the longest completion `C`. Completion tokens therefore sit in
//! columns `P..P+C` of every row, and the logits that predict them in columns `P−1..P+C−1`.
//! Positions count from each row's first real token, so padding changes nothing.

use burn::tensor::{Tensor, TensorData};
use rein_model::ReinBackend;

use crate::PromptPixels;

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
    /// Per row, a mixture of experts' routing while sampling (per decoder layer, `tokens × k`
    /// over the row's prompt and completion but its last token: see
    /// [`rein_sampler::Generation::routes`]); empty when no row has one.
    pub routes: Vec<Option<Vec<Vec<u32>>>>,
    /// Route the forward passes by [`TokenBatch::routes`] (router replay), not only count where
    /// they differ.
    pub replay_routes: bool,
    /// Per row, the images it shows for a vision-language model, in order: its prompt's, then
    /// those a multi-turn episode's tools and environment added (their features take the image
    /// tokens' places there); empty for a text row, or no entries at all.
    pub images: Vec<PromptPixels>,
    /// Compute what several rows share once: rows with the same prompt are packed as a prefix
    /// tree (see [`crate::completion_log_probs`]), the prompt and every run of completion tokens
    /// they begin with once, each row attending to its own copy. Rows that show images, and
    /// every row of a mixture of experts (its load-balancing loss counts each row's prompt
    /// tokens), are packed one by one.
    pub share_prompts: bool,
    /// `[rows, C]`, true on completion tokens a tool or an environment added to a multi-turn
    /// episode ([`TokenBatch::keep_in_loss`]): not the model's, so their image tokens read
    /// images as the prompt's do (the model's own image tokens are text).
    pub added: Vec<bool>,
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
            routes: Vec::new(),
            replay_routes: false,
            images: Vec::new(),
            share_prompts: true,
            added: vec![false; rows * c],
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
    /// tool or an environment added to a multi-turn episode), and marks them
    /// [`TokenBatch::added`].
    pub fn keep_in_loss(&mut self, row: usize, kept: &[bool]) {
        let c = self.completion_width;
        let cells = self.completion_mask[row * c..(row + 1) * c].iter_mut();
        for ((mask, added), &keep) in cells.zip(&mut self.added[row * c..(row + 1) * c]).zip(kept) {
            if !keep && *mask != 0.0 {
                *mask = 0.0;
                *added = true;
            }
        }
    }

    /// Whether column `col` of `row` reads an image where it holds an image token: a real token
    /// of a row that shows images, its prompt's or added (not the model's).
    pub(crate) fn reads_images(&self, row: usize) -> impl Fn(usize) -> bool + '_ {
        let (p, c) = (self.prompt_width, self.completion_width);
        let shows = self.images.get(row).is_some_and(|i| !i.is_empty());
        move |col| shows && !self.padding[row * (p + c) + col] && (col < p || self.added[row * c + col - p])
    }

    /// The completion mask as a tensor, `[rows, C]`.
    pub fn mask<B: ReinBackend>(&self, device: &B::Device) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(self.completion_mask.clone(), [self.rows, self.completion_width]),
            device,
        )
    }

    /// The batch of `rows` (indices into this batch, in that order), laid out with this batch's
    /// widths so that `[rows, C]` values select row by row ([`select_rows`]).
    pub fn select_rows(&self, rows: &[usize]) -> TokenBatch {
        let (c, width) = (self.completion_width, self.prompt_width + self.completion_width);
        TokenBatch {
            tokens: select_rows(&self.tokens, rows, width),
            positions: select_rows(&self.positions, rows, width),
            padding: select_rows(&self.padding, rows, width),
            completion_mask: select_rows(&self.completion_mask, rows, c),
            targets: select_rows(&self.targets, rows, c),
            rows: rows.len(),
            prompt_width: self.prompt_width,
            completion_width: c,
            routes: match self.routes.is_empty() {
                true => Vec::new(),
                false => rows.iter().map(|&r| self.routes[r].clone()).collect(),
            },
            replay_routes: self.replay_routes,
            images: match self.images.is_empty() {
                true => Vec::new(),
                false => rows.iter().map(|&r| self.images[r].clone()).collect(),
            },
            share_prompts: self.share_prompts,
            added: select_rows(&self.added, rows, c),
        }
    }

    /// Where row `row`'s prompt starts (the width of its left padding: `P` for an empty prompt),
    /// and how many completion tokens it has.
    pub(crate) fn extent(&self, row: usize) -> (usize, usize) {
        let (p, width) = (self.prompt_width, self.prompt_width + self.completion_width);
        let padding = &self.padding[row * width..(row + 1) * width];
        let start = padding[..p].iter().take_while(|&&pad| pad).count();
        (start, padding[p..].iter().take_while(|&&pad| !pad).count())
    }

    /// The rows grouped by their prompts, in the order each prompt first appears: rows with the
    /// same non-empty prompt and a non-empty completion together, every other row alone.
    pub(crate) fn rows_by_prompt(&self) -> Vec<Vec<usize>> {
        let (p, width) = (self.prompt_width, self.prompt_width + self.completion_width);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_prompt: std::collections::HashMap<&[i64], usize> = std::collections::HashMap::new();
        for row in 0..self.rows {
            let (start, completion) = self.extent(row);
            let group = match start < p && completion > 0 {
                true => *by_prompt
                    .entry(&self.tokens[row * width + start..row * width + p])
                    .or_insert(groups.len()),
                false => groups.len(),
            };
            match groups.get_mut(group) {
                Some(rows) => rows.push(row),
                None => groups.push(vec![row]),
            }
        }
        groups
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

/// The rows `rows` of `values`, laid out `[_, width]`.
pub fn select_rows<T: Copy>(values: &[T], rows: &[usize], width: usize) -> Vec<T> {
    (rows.iter())
        .flat_map(|&row| values[row * width..(row + 1) * width].iter().copied())
        .collect()
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
