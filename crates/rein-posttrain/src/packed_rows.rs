//! [`ConcatenatedRows`]: a [`TokenBatch`]'s rows packed end to end for one forward pass,
//! without their padding, and what several rows share computed once.

use burn::tensor::Tensor;
use rein_model::lm::{CausalLm, Routing, UNROUTED};
use rein_model::vision::{image_slots, with_image_features};
use rein_model::{PackedSequences, ReinBackend};

use crate::token_batch::TokenBatch;
use crate::token_trie::{Segments, TokenTrie};

/// A [`TokenBatch`]'s rows concatenated end to end without their padding, for one forward pass
/// over `[1, Σ lengths]` tokens ([`Context::packed`]): every row's tokens up to its last
/// completion token (which predicts nothing, so it is left out), and for each completion token
/// the packed index of the hidden state that predicts it. A padded batch spends its rows on the
/// padding too: GRPO's completions, right-padded to the longest, are a quarter padding when they
/// stop at end-of-sequence (SmolLM2 on the benchmark's arithmetic, 46.5 of 64 tokens).
///
/// Rows whose prompts are the same tokens are packed as a prefix tree ([`TokenBatch::share_prompts`]):
/// the prompt once, then every run of completion tokens that several rows begin with (a tree
/// rollout's trunk, a group's common opening) once, each row's own tokens continuing what it
/// shares ([`PackedSequences`]); a completion token is predicted by the packed token before it
/// on its row's path (the prompt's last, for the first).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConcatenatedRows {
    pub(crate) tokens: Vec<i64>,
    pub(crate) positions: Vec<i64>,
    /// The packed sequences: a row's tokens (an empty prompt's padding slot is a sequence of
    /// its own, followed by the rest of its row; rows with none are left out), or a shared
    /// prompt and the runs of completion tokens continuing it.
    pub(crate) sequences: PackedSequences,
    /// Packed index of the hidden state predicting each completion token, in `[rows, C]` order.
    pub(crate) predictors: Vec<i64>,
    /// Where each of those goes in `[rows, C]`.
    pub(crate) slots: Vec<i64>,
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
    pub(crate) fn new(batch: &TokenBatch, image_token: Option<u32>, dense: bool) -> Self {
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
                        _ => packed.push_group(batch, &rows, &mut segments),
                    }
                }
            }
            false => (0..batch.rows).for_each(|row| packed.push_row(batch, row, image_token, &mut segments)),
        }
        packed.sequences = segments.into_sequences();
        packed
    }

    /// Packs `row` as a sequence of its own: its tokens up to its last completion token.
    fn push_row(&mut self, batch: &TokenBatch, row: usize, image_token: Option<u32>, segments: &mut Segments) {
        let (p, c) = (batch.prompt_width, batch.completion_width);
        let width = p + c;
        // The first real token; an empty prompt keeps the padding slot before its
        // completion, which predicts the completion's first token, as a sequence of its own
        // (in the padded batch it attends to itself only, and nothing attends to it).
        let (real, completion) = batch.extent(row);
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
    /// not empty, as a prefix tree ([`TokenTrie`]): the prompt once, then the rows' completion
    /// tokens but their last, each run that several rows share once.
    fn push_group(&mut self, batch: &TokenBatch, rows: &[usize], segments: &mut Segments) {
        let (p, c) = (batch.prompt_width, batch.completion_width);
        let width = p + c;
        let (real, _) = batch.extent(rows[0]);
        let prompt = segments.push(p - real, None);
        for col in real..p {
            self.tokens.push(batch.tokens[rows[0] * width + col]);
            self.positions.push(batch.positions[rows[0] * width + col]);
            self.reads_images.push(false);
        }
        let last_prompt_token = self.tokens.len() - 1;
        let mut trie = TokenTrie::default();
        let paths: Vec<Vec<usize>> = (rows.iter())
            .map(|&row| {
                let (_, completion) = batch.extent(row);
                trie.insert(&batch.tokens[row * width + p..row * width + p + completion - 1])
            })
            .collect();
        let order = trie.pack(prompt, segments);
        let mut packed_at = vec![0; order.len()];
        for node in order {
            let (token, depth) = trie.token(node);
            packed_at[node] = self.tokens.len();
            self.tokens.push(token);
            self.positions.push((p - real + depth) as i64);
            self.reads_images.push(false);
        }
        for (&row, path) in rows.iter().zip(&paths) {
            for j in 0..=path.len() {
                let predictor = match j {
                    0 => last_prompt_token,
                    _ => packed_at[path[j - 1]],
                };
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
    pub(crate) fn with_images<B: ReinBackend>(
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
    pub(crate) fn multimodal_positions<B: ReinBackend>(
        &self,
        model: &CausalLm<B>,
        batch: &TokenBatch,
    ) -> Option<(Vec<[i64; 3]>, [usize; 3])> {
        let vision = model.vision.as_ref()?;
        let section = vision.mrope_section()?;
        let (p, width) = (batch.prompt_width, batch.prompt_width + batch.completion_width);
        let mut cells = Vec::with_capacity(self.tokens.len());
        for (row, &(count, padded_slot)) in self.rows.iter().enumerate() {
            let (real, completion) = batch.extent(row);
            let end = p + completion;
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
    pub(crate) fn targets(&self, batch: &TokenBatch) -> Vec<i64> {
        (self.slots.iter()).map(|&slot| batch.targets[slot as usize]).collect()
    }

    /// The routing of a forward pass over these tokens by a mixture of experts with `layers`
    /// layers and `k` experts per token: the sampler's choices, packed (a token it did not
    /// route — an empty prompt's padding slot, a row without a record or with a record of
    /// another length — [`UNROUTED`]), replayed or compared as the batch asks; free routing
    /// when no row has a record.
    pub(crate) fn routing<B: ReinBackend>(&self, batch: &TokenBatch, layers: usize, k: usize) -> Routing<B> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn completions_that_begin_alike_share_what_they_begin_with() {
        // A trunk 8 9 and two branches from it (10 x, 12 13 x), and a branch after 8 alone.
        let prompt: &[u32] = &[5, 6];
        let pairs: [(&[u32], &[u32]); 3] = [
            (prompt, &[8, 9, 10, 1]),
            (prompt, &[8, 9, 12, 13, 1]),
            (prompt, &[8, 14, 1]),
        ];
        let batch = TokenBatch::new(&pairs, 0);
        let packed = ConcatenatedRows::new(&batch, None, true);
        // The prompt; 8 (where the third forks); 9 (where the first two fork); 10; 12 13; 14.
        assert_eq!(packed.tokens, vec![5, 6, 8, 9, 10, 12, 13, 14]);
        assert_eq!(packed.positions, vec![0, 1, 2, 3, 4, 4, 5, 3]);
        let tree = PackedSequences::tree(
            vec![2, 1, 1, 1, 2, 1],
            vec![None, Some(0), Some(1), Some(2), Some(2), Some(1)],
        )
        .unwrap();
        assert_eq!(packed.sequences, tree);
        // Each token is predicted by the one before it on its row's path.
        assert_eq!(packed.predictors, vec![1, 2, 3, 4, 1, 2, 3, 5, 6, 1, 2, 7]);
        assert_eq!(packed.targets(&batch), vec![8, 9, 10, 1, 8, 9, 12, 13, 1, 8, 14, 1]);
    }
}
