//! Where a step's score lands among a completion's tokens: a reward scores spans of the
//! completion's text (character offsets, as a reward plugin sees the text), and the host credits
//! each span's score to the token that completes the span's last character.
//!
//! The characters each token adds come from decoding the tokens incrementally, as inference
//! servers stream text (vLLM's detokenizer): each token's text is the decoding of a short window
//! of the tokens before it and itself, less the window's own text, and a token whose bytes end
//! inside a character (a byte-level tokenizer splitting a multi-byte character) adds nothing
//! until the token that completes it.

use rein_model::lm::LmTokenizer;

/// A score on the characters `start..end` of a completion's text (Unicode scalar values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSpan {
    /// The first character.
    pub start: usize,
    /// One past the last character.
    pub end: usize,
    /// The step's score.
    pub score: f64,
}

/// Why a reward's step spans cannot be placed on its completion's tokens.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepSpanError {
    /// A span that is empty, reversed, or reaches past the completion.
    #[error("step {index} spans characters {start}..{end} of a completion of {len} characters")]
    Outside {
        /// The span's place in the reward's list.
        index: usize,
        /// Its start.
        start: usize,
        /// Its end.
        end: usize,
        /// The completion's length in characters.
        len: usize,
    },
    /// Two spans share characters.
    #[error("steps {first} and {second} overlap (characters {start}..{end} and from {second_start})")]
    Overlapping {
        /// The earlier span.
        first: usize,
        /// The later one.
        second: usize,
        /// The earlier span's start.
        start: usize,
        /// The earlier span's end.
        end: usize,
        /// The later span's start.
        second_start: usize,
    },
    /// The span ends in text no token produced (past a stop string's cut, say).
    #[error("step {index} ends at character {end}, after the completion's last token")]
    NoToken {
        /// The span's place in the reward's list.
        index: usize,
        /// Its end.
        end: usize,
    },
}

/// How many characters of the decoded completion each token completes: `ends[i]` is the length
/// of the text `tokens[..=i]` decode to (special tokens skipped), counting only whole
/// characters.
pub fn token_char_ends(tokenizer: &LmTokenizer, tokens: &[u32]) -> Vec<usize> {
    let decode = |ids: &[u32]| tokenizer.decode(ids, true).unwrap_or_default();
    let ends = incremental_char_ends(tokenizer, tokens);
    // A tokenizer whose windows decode differently from the whole (a decoder that strips a
    // leading space, say) is measured prefix by prefix instead: slower, and exact.
    if ends.last().copied().unwrap_or(0) != decode(tokens).chars().count() {
        return (0..tokens.len()).map(|i| whole_chars(&decode(&tokens[..=i]))).collect();
    }
    ends
}

/// [`token_char_ends`] from windows of a few tokens (see the module docs).
fn incremental_char_ends(tokenizer: &LmTokenizer, tokens: &[u32]) -> Vec<usize> {
    let decode = |ids: &[u32]| tokenizer.decode(ids, true).unwrap_or_default();
    let (mut prefix, mut read, mut emitted) = (0, 0, 0);
    let mut ends = Vec::with_capacity(tokens.len());
    for i in 0..tokens.len() {
        let before = decode(&tokens[prefix..read]);
        let after = decode(&tokens[prefix..=i]);
        let (before_len, after_len) = (before.chars().count(), after.chars().count());
        if after_len > before_len && !after.ends_with('\u{FFFD}') {
            emitted += after_len - before_len;
            (prefix, read) = (read, i + 1);
        }
        ends.push(emitted);
    }
    ends
}

/// The characters of `text`, not counting a trailing incomplete one.
fn whole_chars(text: &str) -> usize {
    text.chars().count() - usize::from(text.ends_with('\u{FFFD}'))
}

/// Each span's score on the token that completes its last character (`ends` from
/// [`token_char_ends`], `len` the length of the text the reward saw), in the spans' order.
pub fn step_token_scores(spans: &[StepSpan], ends: &[usize], len: usize) -> Result<Vec<(usize, f64)>, StepSpanError> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].start, spans[i].end));
    for (index, span) in spans.iter().enumerate() {
        if span.start >= span.end || span.end > len {
            let (start, end) = (span.start, span.end);
            return Err(StepSpanError::Outside { index, start, end, len });
        }
    }
    for pair in order.windows(2) {
        let (a, b) = (&spans[pair[0]], &spans[pair[1]]);
        if b.start < a.end {
            return Err(StepSpanError::Overlapping {
                first: pair[0],
                second: pair[1],
                start: a.start,
                end: a.end,
                second_start: b.start,
            });
        }
    }
    (spans.iter().enumerate())
        .map(|(index, span)| {
            let token = ends.partition_point(|&end| end < span.end);
            match token < ends.len() {
                true => Ok((token, span.score)),
                false => Err(StepSpanError::NoToken { index, end: span.end }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn tokenizer(dir: &str) -> LmTokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir);
        LmTokenizer::load(&dir, &[]).unwrap()
    }

    fn span(start: usize, end: usize, score: f64) -> StepSpan {
        StepSpan { start, end, score }
    }

    /// Each token's end equals the length of what its prefix decodes to, on a byte-level BPE
    /// with multi-byte characters split across tokens and on the arithmetic task's tokenizer;
    /// the windows alone get it right (no prefix-by-prefix fallback).
    #[test]
    fn token_ends_count_the_characters_each_prefix_decodes_to() {
        for (dir, text) in [
            (
                "tests/fixtures/lm/qwen2-gqa",
                "Step 1: 12+30=42 ✓\nStep 2: naïve → 42 × 2 = 84 🎉",
            ),
            (
                "recipes/assets/arithmetic-tokenizer",
                "47 + 38 = 85\n<answer>85</answer>",
            ),
        ] {
            let t = tokenizer(dir);
            let tokens = t.encode(text).unwrap();
            let ends = token_char_ends(&t, &tokens);
            assert_eq!(
                ends,
                incremental_char_ends(&t, &tokens),
                "{dir}: the windows alone are exact"
            );
            assert_eq!(ends.len(), tokens.len());
            if dir.contains("qwen2") {
                let split = ends.windows(2).any(|w| w[0] == w[1]);
                assert!(
                    split,
                    "a token that completes no character: a multi-byte character split"
                );
            }
            assert_eq!(
                *ends.last().unwrap(),
                t.decode(&tokens, true).unwrap().chars().count(),
                "{dir}"
            );
            for i in 0..tokens.len() {
                assert_eq!(
                    ends[i],
                    whole_chars(&t.decode(&tokens[..=i], true).unwrap()),
                    "{dir}: token {i}"
                );
            }
        }
    }

    #[test]
    fn a_span_scores_the_token_that_completes_its_last_character() {
        // Tokens end after characters 3, 3 (a split character), 7 and 12.
        let ends = [3, 3, 7, 12];
        let spans = [span(0, 3, 1.0), span(3, 8, -1.0), span(8, 12, 0.5)];
        assert_eq!(
            step_token_scores(&spans, &ends, 12).unwrap(),
            [(0, 1.0), (3, -1.0), (3, 0.5)]
        );
    }

    #[test]
    fn spans_outside_their_completion_or_overlapping_are_refused_by_index() {
        let ends = [4, 8];
        let outside = step_token_scores(&[span(0, 4, 1.0), span(6, 9, 1.0)], &ends, 8).unwrap_err();
        assert_eq!(
            outside.to_string(),
            "step 1 spans characters 6..9 of a completion of 8 characters"
        );
        assert!(matches!(
            step_token_scores(&[span(3, 3, 1.0)], &ends, 8),
            Err(StepSpanError::Outside { index: 0, .. })
        ));
        let overlap = step_token_scores(&[span(4, 8, 1.0), span(0, 5, 1.0)], &ends, 8).unwrap_err();
        assert_eq!(
            overlap.to_string(),
            "steps 1 and 0 overlap (characters 0..5 and from 4)"
        );
        let beyond = step_token_scores(&[span(0, 8, 1.0)], &[4, 6], 8).unwrap_err();
        assert_eq!(beyond, StepSpanError::NoToken { index: 0, end: 8 });
    }
}
