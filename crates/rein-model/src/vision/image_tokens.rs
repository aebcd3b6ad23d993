//! A prompt's image tokens: its markers expanded to each image's tokens in the text
//! ([`expand_markers`]), which feature each position reads ([`image_slots`]) and the input
//! embeddings with the features put there ([`with_image_features`]), as transformers'
//! `masked_scatter` of the features over the image tokens' embeddings.

use burn::tensor::{Int, Tensor, TensorData};

use crate::backend::ReinBackend;

/// `text` with each `marker` replaced by `expansion` of the image it stands for, in order; an
/// error when the markers are not one per image.
pub(crate) fn expand_markers<T>(
    text: &str,
    marker: &str,
    images: &[T],
    expansion: impl Fn(&T) -> String,
) -> Result<String, String> {
    let markers = text.matches(marker).count();
    if markers != images.len() {
        return Err(format!(
            "the prompt has {markers} `{marker}` markers for {} images",
            images.len()
        ));
    }
    let mut pieces = text.split(marker);
    let mut out = pieces.next().unwrap_or_default().to_string();
    for (piece, image) in pieces.zip(images) {
        out += &expansion(image);
        out += piece;
    }
    Ok(out)
}

/// For each of `tokens`, the index of the image feature it reads — the image tokens numbered in
/// order — or `None` for a text token.
pub fn image_slots(tokens: impl IntoIterator<Item = u32>, image_token: u32) -> Vec<Option<usize>> {
    let mut next = 0;
    (tokens.into_iter())
        .map(|t| {
            (t == image_token).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// `embeddings` with each position that has a slot reading that row of `features` instead;
/// gradients reach the features there and the embeddings elsewhere.
///
/// # Panics
/// When `slots` does not have one entry per position, or names a row `features` lacks.
///
/// # Shapes
/// - `embeddings`: `[batch, seq, hidden]`, `features`: `[n, hidden]` → `[batch, seq, hidden]`
pub fn with_image_features<B: ReinBackend>(
    embeddings: Tensor<B, 3>,
    slots: &[Option<usize>],
    features: Tensor<B, 2>,
) -> Tensor<B, 3> {
    let [batch, seq, hidden] = embeddings.dims();
    let [rows, _] = features.dims();
    assert_eq!(slots.len(), batch * seq, "one slot per position");
    if slots.iter().all(Option::is_none) {
        return embeddings;
    }
    // A table of the embeddings and then the features; each position reads its row of it.
    let order: Vec<i64> = (slots.iter().enumerate())
        .map(|(i, slot)| match *slot {
            Some(feature) => {
                assert!(feature < rows, "image feature {feature} of {rows}");
                (batch * seq + feature) as i64
            }
            None => i as i64,
        })
        .collect();
    let device = embeddings.device();
    let table = Tensor::cat(vec![embeddings.reshape([batch * seq, hidden]), features], 0);
    let order = Tensor::<B, 1, Int>::from_data(TensorData::new(order, [batch * seq]), &device);
    table.select(0, order).reshape([batch, seq, hidden])
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    #[test]
    fn image_positions_read_the_features_in_order() {
        let device = Default::default();
        let slots = image_slots([5, 9, 9, 7, 9], 9);
        assert_eq!(slots, [None, Some(0), Some(1), None, Some(2)]);
        let embeddings = Tensor::<Flex, 1, Int>::arange(0..5, &device).float().reshape([1, 5, 1]);
        let features = Tensor::<Flex, 1>::from_floats([10.0, 11.0, 12.0], &device).reshape([3, 1]);
        let out: Vec<f32> = with_image_features(embeddings, &slots, features)
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(out, [0.0, 10.0, 11.0, 3.0, 12.0]);
    }
}
