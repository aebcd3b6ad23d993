//! Turning prompts and completions into training tensors and per-token log-probabilities.
//!
//! Layout: each row is its prompt left-padded to the batch's longest prompt `P`, followed by
//! its completion right-padded to the longest completion `C`. Completion tokens therefore sit in
//! columns `P..P+C` of every row, and the logits that predict them in columns `P−1..P+C−1`.
//! Positions count from each row's first real token, so padding changes nothing.

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use rein_model::lm::{CausalLm, Context, Rope, Routing, UNROUTED};
use rein_model::vision::{image_slots, with_image_features};
use rein_model::{PackedSequences, ReinBackend};

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
    fn reads_images(&self, row: usize) -> impl Fn(usize) -> bool + '_ {
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
    fn rows_by_prompt(&self) -> Vec<Vec<usize>> {
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

/// Packed segments' lengths and parents, as [`ConcatenatedRows`] lays them out.
#[derive(Debug, Default)]
struct Segments {
    lengths: Vec<usize>,
    parents: Vec<Option<usize>>,
}

impl Segments {
    fn push(&mut self, len: usize, parent: Option<usize>) {
        self.lengths.push(len);
        self.parents.push(parent);
    }
}

/// The rows `rows` of `values`, laid out `[_, width]`.
pub fn select_rows<T: Copy>(values: &[T], rows: &[usize], width: usize) -> Vec<T> {
    (rows.iter())
        .flat_map(|&row| values[row * width..(row + 1) * width].iter().copied())
        .collect()
}

/// A [`TokenBatch`]'s rows concatenated end to end without their padding, for one forward pass
/// over `[1, Σ lengths]` tokens ([`Context::packed`]): every row's tokens up to its last
/// completion token (which predicts nothing, so it is left out), and for each completion token
/// the packed index of the hidden state that predicts it. A padded batch spends its rows on the
/// padding too: GRPO's completions, right-padded to the longest, are a quarter padding when they
/// stop at end-of-sequence (SmolLM2 on the benchmark's arithmetic, 46.5 of 64 tokens).
///
/// Rows whose prompts are the same tokens share one copy of it ([`TokenBatch::share_prompts`]):
/// the prompt is a segment of its own, each completion a segment continuing it
/// ([`PackedSequences`]), and a completion's first token is predicted by the prompt's last.
#[derive(Debug, Clone, PartialEq)]
struct ConcatenatedRows {
    tokens: Vec<i64>,
    positions: Vec<i64>,
    /// The packed sequences: a row's tokens (an empty prompt's padding slot is a sequence of
    /// its own, followed by the rest of its row; rows with none are left out), or a shared
    /// prompt and the completions continuing it.
    sequences: PackedSequences,
    /// Packed index of the hidden state predicting each completion token, in `[rows, C]` order.
    predictors: Vec<i64>,
    /// Where each of those goes in `[rows, C]`.
    slots: Vec<i64>,
    /// Per packed token, whether its row shows images and it is not the model's (a prompt's, or
    /// added by a tool or the environment): only such image tokens read images.
    reads_images: Vec<bool>,
    /// The image tokens that read images in the rows whole (a row's last token, which is not
    /// packed, may be one): how many features the rows' images must give.
    image_tokens: usize,
    /// Per batch row: its packed tokens, and whether the first is an empty prompt's padding
    /// slot (rows packed one by one only: their routing and multimodal positions are read
    /// row by row).
    rows: Vec<(usize, bool)>,
}

impl ConcatenatedRows {
    /// The rows of `batch` packed, for a dense model when `dense` ([`TokenBatch::share_prompts`]);
    /// `image_token` counts [`Self::image_tokens`] (a vision-language model's).
    fn new(batch: &TokenBatch, image_token: Option<u32>, dense: bool) -> Self {
        let mut packed = ConcatenatedRows {
            tokens: Vec::new(),
            positions: Vec::new(),
            sequences: PackedSequences::default(),
            predictors: Vec::new(),
            slots: Vec::new(),
            reads_images: Vec::new(),
            image_tokens: 0,
            rows: Vec::new(),
        };
        let mut segments = Segments::default();
        let images = batch.images.iter().any(|i| !i.is_empty());
        match batch.share_prompts && dense && !images {
            true => {
                for rows in batch.rows_by_prompt() {
                    match rows.len() {
                        1 => packed.push_row(batch, rows[0], image_token, &mut segments),
                        _ => packed.push_shared_prompt(batch, &rows, &mut segments),
                    }
                }
            }
            false => (0..batch.rows).for_each(|row| packed.push_row(batch, row, image_token, &mut segments)),
        }
        packed.sequences =
            PackedSequences::tree(segments.lengths, segments.parents).expect("packed rows form valid trees");
        packed
    }

    /// Packs `row` as a sequence of its own: its tokens up to its last completion token.
    fn push_row(&mut self, batch: &TokenBatch, row: usize, image_token: Option<u32>, segments: &mut Segments) {
        let (p, c) = (batch.prompt_width, batch.completion_width);
        let width = p + c;
        let padding = &batch.padding[row * width..(row + 1) * width];
        let completion = padding[p..].iter().take_while(|&&pad| !pad).count();
        // The first real token; an empty prompt keeps the padding slot before its
        // completion, which predicts the completion's first token, as a sequence of its own
        // (in the padded batch it attends to itself only, and nothing attends to it).
        let real = padding.iter().position(|&pad| !pad).unwrap_or(width);
        let first = real.min(p - 1);
        let end = p + completion - 1;
        let start = self.tokens.len();
        let reads = batch.reads_images(row);
        for col in first..end {
            self.tokens.push(batch.tokens[row * width + col]);
            self.positions.push(batch.positions[row * width + col]);
            self.reads_images.push(reads(col));
        }
        if let Some(token) = batch.images.get(row).filter(|i| !i.is_empty()).and(image_token) {
            let cells = (real..p + completion).filter(|&col| reads(col));
            self.image_tokens += cells
                .filter(|&col| batch.tokens[row * width + col] == i64::from(token))
                .count();
        }
        if first < real && end > first {
            segments.push(1, None);
        }
        if end > real {
            segments.push(end - real.max(first), None);
        }
        self.rows.push((end.saturating_sub(first), first < real && end > first));
        for j in 0..completion {
            self.predictors.push((start + p + j - 1 - first) as i64);
            self.slots.push((row * c + j) as i64);
        }
    }

    /// Packs `rows`, whose prompts are the same (non-empty) tokens and whose completions are
    /// not empty, as one copy of the prompt and each completion continuing it: the prompt's
    /// last token predicts every completion's first.
    fn push_shared_prompt(&mut self, batch: &TokenBatch, rows: &[usize], segments: &mut Segments) {
        let (p, c) = (batch.prompt_width, batch.completion_width);
        let width = p + c;
        let real = (batch.padding[rows[0] * width..rows[0] * width + p].iter())
            .take_while(|&&pad| pad)
            .count();
        let prompt = segments.lengths.len();
        segments.push(p - real, None);
        for col in real..p {
            self.tokens.push(batch.tokens[rows[0] * width + col]);
            self.positions.push(batch.positions[rows[0] * width + col]);
            self.reads_images.push(false);
        }
        let last_prompt_token = self.tokens.len() - 1;
        for &row in rows {
            let padding = &batch.padding[row * width + p..(row + 1) * width];
            let completion = padding.iter().take_while(|&&pad| !pad).count();
            let start = self.tokens.len();
            for col in p..p + completion - 1 {
                self.tokens.push(batch.tokens[row * width + col]);
                self.positions.push(batch.positions[row * width + col]);
                self.reads_images.push(false);
            }
            if completion > 1 {
                segments.push(completion - 1, Some(prompt));
            }
            for j in 0..completion {
                let predictor = if j == 0 { last_prompt_token } else { start + j - 1 };
                self.predictors.push(predictor as i64);
                self.slots.push((row * c + j) as i64);
            }
        }
    }

    /// `embeddings` of these tokens with the features of the batch's images (every row's, in
    /// row order) in place of the prompts' image tokens, computed by `model`'s image side so
    /// that its gradients reach it.
    ///
    /// # Panics
    /// When the model reads no images, or the prompts hold another number of image tokens than
    /// the images give features (the prompts were expanded for another processor).
    fn with_images<B: ReinBackend>(
        &self,
        model: &CausalLm<B>,
        embeddings: Tensor<B, 3>,
        batch: &TokenBatch,
        device: &B::Device,
    ) -> Tensor<B, 3> {
        let vision = model
            .vision
            .as_ref()
            .expect("a batch with images trains a vision-language model");
        let token = vision.image_token_id();
        let cells = (self.tokens.iter().zip(&self.reads_images)).map(|(&t, &reads)| match reads {
            true => t as u32,
            false => u32::MAX,
        });
        let slots = image_slots(cells, token);
        let features = vision.image_features(batch.images.iter().flat_map(|i| i.iter()), device);
        let (tokens, [rows, _]) = (self.image_tokens, features.dims());
        assert_eq!(
            tokens, rows,
            "the rows hold {tokens} image tokens for {rows} image features"
        );
        with_image_features(embeddings, &slots, features)
    }

    /// Each packed token's multimodal position, for a model whose decoder reads them (Qwen2-VL):
    /// one scan over each row's tokens, as the sampler's prefill, decoding and appended turns
    /// number them (the image tokens that read images at the positions their images give them,
    /// every other token — the model's own image tokens, those of a row without images — as
    /// text), an empty prompt's padding slot at 0; with how the decoder's rotary frequencies
    /// split over the three axes. `None` for a model whose positions are the tokens' indices.
    ///
    /// # Panics
    /// When a row's image tokens do not match its images (the sampler refuses such a row
    /// before it is trained on).
    fn multimodal_positions<B: ReinBackend>(
        &self,
        model: &CausalLm<B>,
        batch: &TokenBatch,
    ) -> Option<(Vec<[i64; 3]>, [usize; 3])> {
        let vision = model.vision.as_ref()?;
        let section = vision.mrope_section()?;
        let (p, width) = (batch.prompt_width, batch.prompt_width + batch.completion_width);
        let mut cells = Vec::with_capacity(self.tokens.len());
        for (row, &(count, padded_slot)) in self.rows.iter().enumerate() {
            let padding = &batch.padding[row * width..(row + 1) * width];
            let real = padding.iter().position(|&pad| !pad).unwrap_or(width).min(p);
            let end = p + padding[p..].iter().take_while(|&&pad| !pad).count();
            let positions = match batch.images.get(row).filter(|i| !i.is_empty()) {
                None => Vec::new(),
                Some(images) => {
                    let reads = batch.reads_images(row);
                    let tokens: Vec<u32> = (real..end)
                        .map(|col| match reads(col) {
                            true => batch.tokens[row * width + col] as u32,
                            false => u32::MAX,
                        })
                        .collect();
                    (vision.positions(&tokens, images))
                        .expect("a side with multimodal positions gives them")
                        .unwrap_or_else(|e| panic!("row {row}: {e}"))
                        .positions
                }
            };
            if padded_slot {
                cells.push([0; 3]);
            }
            // A row without images counts from 0, as its tokens' indices do.
            let real_tokens = count - usize::from(padded_slot);
            let text = (0..).map(|position| [position; 3]);
            match positions.is_empty() {
                true => cells.extend(text.take(real_tokens)),
                false => cells.extend(positions.into_iter().take(real_tokens)),
            }
        }
        Some((cells, section))
    }

    /// The completion token each packed predictor predicts, in [`Self::slots`] order.
    fn targets(&self, batch: &TokenBatch) -> Vec<i64> {
        (self.slots.iter()).map(|&slot| batch.targets[slot as usize]).collect()
    }

    /// The routing of a forward pass over these tokens by a mixture of experts with `layers`
    /// layers and `k` experts per token: the sampler's choices, packed (a token it did not
    /// route — an empty prompt's padding slot, a row without a record or with a record of
    /// another length — [`UNROUTED`]), replayed or compared as the batch asks; free routing
    /// when no row has a record.
    fn routing<B: ReinBackend>(&self, batch: &TokenBatch, layers: usize, k: usize) -> Routing<B> {
        if batch.routes.iter().all(Option::is_none) {
            return Routing::record();
        }
        let mut by_layer: Vec<Vec<u32>> = vec![Vec::with_capacity(self.tokens.len() * k); layers];
        for (row, &(tokens, padded_slot)) in self.rows.iter().enumerate() {
            let recorded = batch.routes.get(row).and_then(Option::as_ref);
            let real = tokens - usize::from(padded_slot);
            for (layer, out) in by_layer.iter_mut().enumerate() {
                if padded_slot {
                    out.extend(std::iter::repeat_n(UNROUTED, k));
                }
                match recorded.and_then(|r| r.get(layer)).filter(|r| r.len() == real * k) {
                    Some(r) => out.extend_from_slice(r),
                    None => out.extend(std::iter::repeat_n(UNROUTED, real * k)),
                }
            }
        }
        match batch.replay_routes {
            true => Routing::replay(by_layer),
            false => Routing::compare(by_layer),
        }
    }
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

    #[test]
    fn packing_drops_padding_and_last_tokens_and_finds_each_predictor() {
        // Rows: [5 6 7 | 8 _], [_ _ 9 | 10 11], and an empty prompt [_ _ _ | 12 _].
        let batch = TokenBatch::new(&[(&[5, 6, 7], &[8]), (&[9], &[10, 11]), (&[], &[12])], 0);
        let packed = ConcatenatedRows::new(&batch, None, true);
        // Row 0 keeps 5 6 7 (8 predicts nothing); row 1 keeps 9 10; row 2 keeps the padding
        // slot before its completion, which predicts 12, alone.
        assert_eq!(packed.tokens, vec![5, 6, 7, 9, 10, 0]);
        assert_eq!(packed.positions, vec![0, 1, 2, 0, 1, 0]);
        assert_eq!(packed.sequences, PackedSequences::new(vec![3, 2, 1]));
        assert_eq!(packed.predictors, vec![2, 3, 4, 5]);
        assert_eq!(packed.slots, vec![0, 2, 3, 4]);
        // An empty prompt before two completion tokens: the slot, then the first token alone.
        let batch = TokenBatch::new(&[(&[5], &[8]), (&[], &[12, 13, 14])], 0);
        let packed = ConcatenatedRows::new(&batch, None, true);
        assert_eq!(packed.tokens, vec![5, 0, 12, 13]);
        assert_eq!(packed.sequences, PackedSequences::new(vec![1, 1, 2]));
        assert_eq!(packed.predictors, vec![0, 1, 2, 3]);
    }

    #[test]
    fn rows_with_one_prompt_share_one_copy_of_it() {
        // Rows: [5 6 7 | 8 9 _], [5 6 7 | 10 _ _], [_ _ 9 | 11 12 _], [5 6 7 | 13 14 15].
        let prompt: &[u32] = &[5, 6, 7];
        let pairs: [(&[u32], &[u32]); 4] = [
            (prompt, &[8, 9]),
            (prompt, &[10]),
            (&[9], &[11, 12]),
            (prompt, &[13, 14, 15]),
        ];
        let mut batch = TokenBatch::new(&pairs, 0);
        let packed = ConcatenatedRows::new(&batch, None, true);
        // The prompt once, then what each completion adds before its last token (8; none;
        // 13 14), then row 2 alone.
        assert_eq!(packed.tokens, vec![5, 6, 7, 8, 13, 14, 9, 11]);
        assert_eq!(packed.positions, vec![0, 1, 2, 3, 3, 4, 0, 1]);
        let tree = PackedSequences::tree(vec![3, 1, 2, 2], vec![None, Some(0), Some(0), None]).unwrap();
        assert_eq!(packed.sequences, tree);
        // The prompt's last token (2) predicts each completion's first.
        assert_eq!(packed.predictors, vec![2, 3, 2, 2, 4, 5, 6, 7]);
        assert_eq!(packed.slots, vec![0, 1, 3, 9, 10, 11, 6, 7]);
        assert_eq!(packed.targets(&batch), vec![8, 9, 10, 13, 14, 15, 11, 12]);
        // Unshared, each row is packed alone.
        batch.share_prompts = false;
        let alone = ConcatenatedRows::new(&batch, None, true);
        assert_eq!(alone.sequences, PackedSequences::new(vec![4, 3, 2, 5]));
    }
}
