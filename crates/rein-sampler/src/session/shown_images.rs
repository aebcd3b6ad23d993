//! Images shown in the middle of a conversation ([`Session::append_with_images`]): a tool's
//! result or an environment's message that holds images, appended after a model's turn.
//!
//! Each appended image token reads its image's feature in place of its embedding, as a
//! prompt's do when it is prefilled; the cache then holds the images' keys and values. For a
//! decoder with multimodal positions (Qwen2-VL) the addition's tokens take the positions its
//! images give them, counted on from where the sequence stands (the positions of a sequence
//! are one scan over its tokens, so an addition's are the same scan started there), and the
//! sequence decodes on from one past the addition's largest position.
//!
//! [`Session::append_with_images`]: super::Session::append_with_images

use burn::tensor::Tensor;
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, Rope};
use rein_model::vision::ProcessedImage;

use super::Feed;

/// The images one appended row shows.
pub(super) struct ShownImages<B: ReinBackend> {
    /// `[image tokens, hidden]`.
    features: Tensor<B, 2>,
    /// The multimodal position of each appended token (after the pending token), for a decoder
    /// that reads them.
    positions: Option<Vec<[i64; 3]>>,
    /// The sequence's position after the addition.
    pub(super) next: i64,
}

impl<B: ReinBackend> ShownImages<B> {
    /// The images `images` that `tokens`, appended at position `start`, show; `None` when they
    /// show none. An error when the model reads no images but is shown some, or when the tokens'
    /// image tokens do not match the images (each image token of an addition reads an image:
    /// a sampler and a trainer could not otherwise agree on which do).
    pub(super) fn of(
        model: &CausalLm<B>,
        tokens: &[u32],
        images: &[ProcessedImage],
        start: i64,
        device: &B::Device,
    ) -> Result<Option<Self>, String> {
        let Some(vision) = model.vision.as_ref() else {
            return match images.len() {
                0 => Ok(None),
                count => Err(format!("{count} image(s) shown to a model that reads no images")),
            };
        };
        let token = vision.image_token_id();
        let image_tokens = tokens.iter().filter(|&&t| t == token).count();
        match (images.len(), image_tokens) {
            (0, 0) => return Ok(None),
            (0, tokens) => return Err(format!("{tokens} image tokens, but no images")),
            _ => {}
        }
        let positions = (vision.positions(tokens, images)).transpose()?.map(|p| {
            (
                p.positions
                    .iter()
                    .map(|&[t, h, w]| [start + t, start + h, start + w])
                    .collect(),
                start + p.next,
            )
        });
        let features = vision.image_features(images, device);
        let [rows, _] = features.dims();
        if rows != image_tokens {
            return Err(format!(
                "{image_tokens} image tokens for {} image(s) of {rows} features",
                images.len()
            ));
        }
        let (positions, next) = match positions {
            Some((positions, next)) => (Some(positions), next),
            None => (None, start + tokens.len() as i64),
        };
        Ok(Some(Self {
            features,
            positions,
            next,
        }))
    }
}

/// What one shard's feed of appended rows reads for its images: the features of every row's
/// images (row after row), each cell's feature, and for multimodal positions a rotary row per
/// cell (the feed's positions then number its cells).
pub(super) struct FeedImages<B: ReinBackend> {
    pub(super) features: Tensor<B, 2>,
    pub(super) slots: Vec<Option<usize>>,
    pub(super) rope: Option<Rope<B>>,
}

impl<B: ReinBackend> FeedImages<B> {
    /// The images of `feed`, whose row `r` is `shown[r]`'s tokens after `pending[r]` slots (0 or
    /// 1: the sequence's last sampled token, text) and left padding; `None` when no row shows any.
    /// `starts[r]` is where row `r`'s first real token sits.
    pub(super) fn of_feed(
        model: &CausalLm<B>,
        feed: &mut Feed,
        rows: &[(Option<&ShownImages<B>>, usize, i64)],
        device: &B::Device,
    ) -> Option<Self> {
        if rows.iter().all(|(shown, _, _)| shown.is_none()) {
            return None;
        }
        let vision = model
            .vision
            .as_ref()
            .expect("images are shown to a vision-language model");
        let token = vision.image_token_id();
        let width = feed.width;
        let mut slots = Vec::with_capacity(feed.tokens.len());
        let mut cells = Vec::with_capacity(feed.tokens.len());
        let mut features = Vec::new();
        let mut next_slot = 0;
        for (r, &(shown, pending, start)) in rows.iter().enumerate() {
            let row = r * width..(r + 1) * width;
            let real = feed.padding[row.clone()].iter().filter(|&&p| !p).count();
            let pad = width - real;
            let mut position = start;
            for (j, (&t, &padding)) in feed.tokens[row.clone()].iter().zip(&feed.padding[row]).enumerate() {
                let appended = j >= pad + pending;
                let reads = !padding && appended && shown.is_some() && t as u32 == token;
                slots.push(reads.then(|| {
                    next_slot += 1;
                    next_slot - 1
                }));
                let multimodal = shown
                    .and_then(|s| s.positions.as_ref())
                    .filter(|_| appended && !padding)
                    .map(|p| p[j - pad - pending]);
                cells.push(match (padding, multimodal) {
                    (true, _) => [0; 3],
                    (false, Some(cell)) => cell,
                    (false, None) => [position; 3],
                });
                if !padding {
                    position += 1;
                }
            }
            features.extend(shown.map(|s| s.features.clone()));
        }
        let rope = vision.mrope_section().map(|section| {
            feed.positions = (0..cells.len() as i64).collect();
            Rope::multimodal(model.config(), &cells, section, device)
        });
        Some(Self {
            features: Tensor::cat(features, 0),
            slots,
            rope,
        })
    }
}
