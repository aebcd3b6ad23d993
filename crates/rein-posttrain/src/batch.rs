//! Turning prompts and completions into training tensors and per-token log-probabilities.
//!
//! Layout: each row is its prompt left-padded to the batch's longest prompt `P`, followed by
//! its completion right-padded to the longest completion `C`. Completion tokens therefore sit in
//! columns `P..P+C` of every row, and the logits that predict them in columns `P−1..P+C−1`.
//! Positions count from each row's first real token, so padding changes nothing.

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, Context, Rope, Routing};

use crate::PromptPixels;
use crate::packed_rows::ConcatenatedRows;

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
    /// Compute a prompt that several rows share once ([`ConcatenatedRows`]): a GRPO group's
    /// completions then attend to one copy of it. Rows that show images, and every row of a
    /// mixture of experts (its load-balancing loss counts each row's prompt tokens), are packed
    /// one by one.
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

    /// The rows grouped by their prompts, in the order each prompt first appears: rows with the
    /// same non-empty prompt and a non-empty completion together, every other row alone.
    pub(crate) fn rows_by_prompt(&self) -> Vec<Vec<usize>> {
        let (p, width) = (self.prompt_width, self.prompt_width + self.completion_width);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_prompt: std::collections::HashMap<&[i64], usize> = std::collections::HashMap::new();
        for row in 0..self.rows {
            let cells = row * width..row * width + p;
            let real = cells.start + self.padding[cells.clone()].iter().take_while(|&&pad| pad).count();
            let shareable = real < cells.end && !self.padding[cells.end];
            let group = match shareable {
                true => *by_prompt.entry(&self.tokens[real..cells.end]).or_insert(groups.len()),
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

/// The final hidden state that predicts each completion token, `[predicted, hidden]`, computed
/// over the rows concatenated end to end ([`ConcatenatedRows`]): the same values as over the
/// padded batch, without computing the padding; for a mixture of experts, with its routing
/// (what it chose, its router probabilities, how often it differed from the sampler's).
/// `None` when the batch has no completion token.
fn completion_hidden<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Option<(Tensor<B, 2>, ConcatenatedRows, Option<Routing<B>>)> {
    let image_token = model.vision.as_ref().map(|v| v.image_token_id());
    let packed = ConcatenatedRows::new(batch, image_token, model.config().moe().is_none());
    if packed.predictors.is_empty() {
        return None;
    }
    let total = packed.tokens.len();
    // Multimodal positions (Qwen2-VL): one rotary row per packed token, read in order.
    let (rope, positions) = match packed.multimodal_positions(model, batch) {
        Some((cells, section)) => (
            Rope::multimodal(model.config(), &cells, section, device),
            (0..total as i64).collect(),
        ),
        None => (
            model.rope(batch.prompt_width + batch.completion_width, device),
            packed.positions.clone(),
        ),
    };
    let config = model.config();
    let routing = (config.moe()).map(|moe| packed.routing(batch, config.num_hidden_layers, moe.top_k));
    let ctx = Context {
        rope: &rope,
        positions: Tensor::from_data(TensorData::new(positions, [1, total]), device),
        padding: None,
        sequences: Some(&packed.sequences),
        fused: None,
        routing: routing.as_ref(),
    };
    let tokens = Tensor::from_data(TensorData::new(packed.tokens.clone(), [1, total]), device);
    let embeddings = match batch.images.iter().any(|i| !i.is_empty()) {
        true => packed.with_images(model, model.embed(tokens), batch, device),
        false => model.embed(tokens),
    };
    let hidden = model.hidden_of_embeddings(embeddings, &ctx, None);
    let width = hidden.dims()[2];
    let hidden = hidden
        .reshape([total, width])
        .select(0, int_index(&packed.predictors, device));
    Some((hidden, packed, routing))
}

fn int_index<B: ReinBackend>(values: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// `1 / temperature`, the scale of the logits that sampling at `temperature` draws from (1 for
/// greedy decoding).
fn logit_scale(temperature: f32) -> f32 {
    if temperature != 1.0 && temperature > 0.0 {
        1.0 / temperature
    } else {
        1.0
    }
}

/// Per-token log-probabilities of the completion tokens under `softmax(logits / temperature)`,
/// and optionally the entropy of that distribution at each completion position. The model
/// runs over the rows concatenated end to end ([`ConcatenatedRows`]): the same values as over the padded
/// batch, without computing the padding.
///
/// # Shapes
/// → `[rows, C]` each (0 at padding positions)
pub fn completion_log_probs<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    with_entropy: bool,
    device: &B::Device,
) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
    let out = completion_outputs(model, batch, temperature, with_entropy, None, device);
    (out.log_prob, out.entropy)
}

/// What one forward pass of the policy gives for each completion token, `[rows, C]` each (0 at
/// padding positions).
pub struct CompletionOutputs<B: ReinBackend> {
    /// The token's log-probability under `softmax(logits / temperature)`.
    pub log_prob: Tensor<B, 2>,
    /// The entropy of that distribution, when asked for.
    pub entropy: Option<Tensor<B, 2>>,
    /// A value head's output on the same hidden state, when one was given.
    pub values: Option<Tensor<B, 2>>,
    /// A mixture of experts' routing in this pass (its load-balancing loss, how often it
    /// differed from the sampler's); `None` for a dense model.
    pub routing: Option<Routing<B>>,
}

/// [`completion_log_probs`], and a value head `[hidden, 1]` read on the same hidden states
/// (the state before each completion token), from one forward pass.
pub fn completion_outputs<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    with_entropy: bool,
    value_head: Option<Tensor<B, 2>>,
    device: &B::Device,
) -> CompletionOutputs<B> {
    let (rows, c) = (batch.rows, batch.completion_width);
    let Some((hidden, packed, routing)) = completion_hidden(model, batch, device) else {
        // No completion tokens at all: nothing to score.
        let zeros = || Tensor::zeros([rows, c], device);
        return CompletionOutputs {
            log_prob: zeros(),
            entropy: with_entropy.then(zeros),
            values: value_head.map(|_| zeros()),
            routing: None,
        };
    };
    let values = value_head.map(|head| per_slot(rein_model::affine(hidden.clone(), head, None), &packed, [rows, c]));
    let targets = packed.targets(batch);
    let out = model.log_prob_entropy(hidden, int_index(&targets, device), logit_scale(temperature));
    let out = Tensor::<B, 2>::zeros([rows * c, 2], device).select_assign(
        0,
        int_index(&packed.slots, device),
        out,
        IndexingUpdateOp::Add,
    );
    let log_prob = out.clone().narrow(1, 0, 1).reshape([rows, c]);
    let entropy = with_entropy.then(|| out.narrow(1, 1, 1).reshape([rows, c]));
    CompletionOutputs {
        log_prob,
        entropy,
        values,
        routing,
    }
}

/// A value head `[hidden, 1]` read on `trunk`'s final hidden state before each completion token
/// (a separate value model's decoder), `[rows, C]`, 0 at padding.
pub fn completion_values<B: ReinBackend>(
    trunk: &CausalLm<B>,
    head: Tensor<B, 2>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Tensor<B, 2> {
    let shape = [batch.rows, batch.completion_width];
    match completion_hidden(trunk, batch, device) {
        Some((hidden, packed, _)) => per_slot(rein_model::affine(hidden, head, None), &packed, shape),
        None => Tensor::zeros(shape, device),
    }
}

/// One value per predicted completion token, `[predicted, 1]`, laid out `[rows, C]`.
fn per_slot<B: ReinBackend>(values: Tensor<B, 2>, packed: &ConcatenatedRows, [rows, c]: [usize; 2]) -> Tensor<B, 2> {
    let device = values.device();
    Tensor::<B, 2>::zeros([rows * c, 1], &device)
        .select_assign(0, int_index(&packed.slots, &device), values, IndexingUpdateOp::Add)
        .reshape([rows, c])
}

/// The logits over the whole vocabulary at each completion position, scaled by
/// `1 / temperature`, one row per completion token in `[rows, C]` order (padding left out); see
/// [`CompletionLogits::per_token`] to lay per-row values back out. Every row of vocabulary-wide
/// logits is kept: `completion tokens × vocab` floats, and their gradients.
pub fn completion_logits<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    device: &B::Device,
) -> CompletionLogits<B> {
    let [rows, width] = [batch.rows, batch.completion_width];
    let vocab = model.config().vocab_size;
    let Some((hidden, packed, _)) = completion_hidden(model, batch, device) else {
        return CompletionLogits {
            logits: Tensor::zeros([0, vocab], device),
            slots: Vec::new(),
            targets: Vec::new(),
            shape: [rows, width],
        };
    };
    let logits = model.logits(hidden.unsqueeze_dim(0)).squeeze_dim(0);
    let targets = packed.targets(batch);
    CompletionLogits {
        logits: logits.mul_scalar(logit_scale(temperature)),
        slots: packed.slots,
        targets,
        shape: [rows, width],
    }
}

/// [`completion_logits`]'s result.
pub struct CompletionLogits<B: ReinBackend> {
    /// `[completion tokens, vocab]`.
    pub logits: Tensor<B, 2>,
    /// Where each row goes in the batch's `[rows, C]` grid.
    slots: Vec<i64>,
    /// The completion token each row predicts.
    targets: Vec<i64>,
    shape: [usize; 2],
}

impl<B: ReinBackend> CompletionLogits<B> {
    /// One value per completion token (`[completion tokens]`, in [`Self::logits`]' row order)
    /// laid out as the batch's `[rows, C]` grid, 0 at padding.
    pub fn per_token(&self, values: Tensor<B, 1>) -> Tensor<B, 2> {
        let [rows, width] = self.shape;
        let device = values.device();
        if self.slots.is_empty() {
            return Tensor::zeros([rows, width], &device);
        }
        Tensor::<B, 1>::zeros([rows * width], &device)
            .select_assign(0, int_index(&self.slots, &device), values, IndexingUpdateOp::Add)
            .reshape([rows, width])
    }

    /// [`completion_log_probs`] from these logits: each completion token's log-probability and,
    /// when asked, the entropy at its position, `[rows, C]` each. The same numbers up to
    /// rounding (these go through burn's `log_softmax`, not the chunked head kernel).
    pub fn log_probs(&self, with_entropy: bool) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
        let device = self.logits.device();
        let log_softmax = burn::tensor::activation::log_softmax(self.logits.clone(), 1);
        let predicted = self.targets.len();
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(self.targets.clone(), [predicted, 1]), &device);
        let log_prob = self.per_token(log_softmax.clone().gather(1, targets).reshape([predicted]));
        let entropy = with_entropy.then(|| {
            let h = (log_softmax.clone().exp() * log_softmax)
                .sum_dim(1)
                .neg()
                .reshape([predicted]);
            self.per_token(h)
        });
        (log_prob, entropy)
    }
}

/// A 1-D tensor's values.
pub(crate) fn floats<B: burn::tensor::backend::Backend>(tensor: Tensor<B, 1>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().expect("f32 values")
}

/// The mean of `values` (0 when there are none).
pub(crate) fn mean(values: &[f32]) -> f64 {
    values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len().max(1) as f64
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
