//! Qwen2-VL's multimodal positions (M-RoPE, transformers' `get_rope_index`): every token has a
//! temporal, a height and a width position. Text tokens count on from the last position on all
//! three axes; an image's tokens (one per merged patch) start at the next position and add their
//! frame, row and column on the three axes; the text after the image starts past the image's
//! larger side, so an image of `rows × columns` merged patches advances positions by
//! `max(rows, columns)`, not by its token count.
//!
//! ```text
//! text:  (p, p, p), p = next
//! image: (s + frame, s + row, s + column), s = next;  next = s + max(rows, columns)
//! ```

/// One prompt's multimodal positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultimodalPositions {
    /// Each token's `[temporal, height, width]` position.
    pub positions: Vec<[i64; 3]>,
    /// The first position after the prompt (one past its largest): where decoding continues, on
    /// all three axes. Less than the prompt's length when it holds images; transformers keeps
    /// the difference as `rope_deltas`.
    pub next: i64,
}

/// The positions of `tokens`, whose runs of `image_token` hold the images of `grids` (each
/// `(frames, rows, columns)` of patches before merging) in order, `frames · rows · columns /
/// merge²` tokens each. An error when the tokens and the grids do not agree: an image's tokens
/// fewer than its grid needs, image tokens past the last image, or images left over.
pub fn multimodal_positions(
    tokens: &[u32],
    image_token: u32,
    grids: &[(usize, usize, usize)],
    merge: usize,
) -> Result<MultimodalPositions, String> {
    let mut positions = Vec::with_capacity(tokens.len());
    let mut next = 0i64;
    let mut images = grids.iter().enumerate();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] != image_token {
            positions.push([next; 3]);
            next += 1;
            i += 1;
            continue;
        }
        let Some((index, &(frames, rows, columns))) = images.next() else {
            let left = tokens[i..].iter().filter(|&&t| t == image_token).count();
            return Err(format!(
                "{left} image tokens past the last of the {} images",
                grids.len()
            ));
        };
        let (rows, columns) = (rows / merge, columns / merge);
        let count = frames * rows * columns;
        let run = tokens[i..].iter().take_while(|&&t| t == image_token).count();
        if run < count {
            return Err(format!(
                "image {index} has {count} merged patches, but its place in the prompt holds {run} image tokens"
            ));
        }
        for frame in 0..frames {
            for row in 0..rows {
                for column in 0..columns {
                    positions.push([next + frame as i64, next + row as i64, next + column as i64]);
                }
            }
        }
        next += rows.max(columns) as i64;
        i += count;
    }
    if let Some((index, _)) = images.next() {
        return Err(format!(
            "the prompt's image tokens hold {index} of the {} images",
            grids.len()
        ));
    }
    Ok(MultimodalPositions { positions, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: u32 = 9;

    #[test]
    fn text_counts_on_and_an_image_advances_by_its_larger_side() {
        // Two text tokens, an image of 2 × 3 merged patches (4 × 6 patches, merge 2), one text.
        let tokens = [1, 2, IMAGE, IMAGE, IMAGE, IMAGE, IMAGE, IMAGE, 3];
        let got = multimodal_positions(&tokens, IMAGE, &[(1, 4, 6)], 2).unwrap();
        let image: Vec<[i64; 3]> = (0..2).flat_map(|r| (0..3).map(move |c| [2, 2 + r, 2 + c])).collect();
        assert_eq!(got.positions[..2], [[0; 3], [1; 3]]);
        assert_eq!(got.positions[2..8], image[..]);
        assert_eq!(got.positions[8], [5; 3]);
        assert_eq!(got.next, 6);
    }

    #[test]
    fn adjacent_images_take_their_own_grids() {
        // One merged patch, then 2 × 1: three image tokens in a row.
        let got = multimodal_positions(&[IMAGE; 3], IMAGE, &[(1, 2, 2), (1, 4, 2)], 2).unwrap();
        assert_eq!(got.positions, [[0, 0, 0], [1, 1, 1], [1, 2, 1]]);
        assert_eq!(got.next, 3);
    }

    #[test]
    fn tokens_and_grids_that_disagree_are_refused() {
        let err = multimodal_positions(&[IMAGE, IMAGE, 1], IMAGE, &[(1, 4, 4)], 2).unwrap_err();
        assert!(
            err.contains("image 0 has 4 merged patches") && err.contains("holds 2"),
            "{err}"
        );
        let err = multimodal_positions(&[IMAGE, 1, IMAGE], IMAGE, &[(1, 2, 2)], 2).unwrap_err();
        assert!(err.contains("1 image tokens past the last of the 1 images"), "{err}");
        let err = multimodal_positions(&[1, IMAGE], IMAGE, &[(1, 2, 2), (1, 2, 2)], 2).unwrap_err();
        assert!(err.contains("hold 1 of the 2 images"), "{err}");
    }
}
