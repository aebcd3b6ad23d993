//! Where a step's score lands among a completion's tokens: a reward scores spans of the
//! completion's text (character offsets, as a reward plugin sees the text), and the host credits
//! each span's score to the token that completes the span's last character. The same character
//! ends give a reward that reads tokens each token's text.
//!
//! The characters each token adds come from decoding the tokens incrementally, as inference
//! servers stream text (vLLM's detokenizer): each token's text is the decoding of a short window
//! of the tokens before it and itself, less the window's own text, and a token whose bytes end
//! inside a character (a byte-level tokenizer splitting a multi-byte character) adds nothing
//! until the token that completes it.

use rein_core::StepScore;
use rein_model::lm::LmTokenizer;

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

/// Each step's score on the token that completes its last character (`ends` from
/// [`token_char_ends`]), in the steps' order. The steps were checked against the text the reward
/// saw ([`rein_core::validate_group_scores`]); a step ending past the last token's whole
/// characters (in a text ending inside a character, decoded as U+FFFD) counts on the last token.
pub fn step_token_scores(steps: &[StepScore], ends: &[usize]) -> Vec<(usize, f64)> {
    let Some(last) = ends.len().checked_sub(1) else {
        return Vec::new();
    };
    (steps.iter())
        .map(|step| (ends.partition_point(|&end| end < step.end).min(last), step.score))
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

    fn step(start: usize, end: usize, score: f64) -> StepScore {
        StepScore { start, end, score }
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
    fn a_step_scores_the_token_that_completes_its_last_character() {
        // Tokens end after characters 3, 3 (a split character), 7 and 12.
        let ends = [3, 3, 7, 12];
        let steps = [step(0, 3, 1.0), step(3, 8, -1.0), step(8, 12, 0.5), step(12, 13, 2.0)];
        assert_eq!(
            step_token_scores(&steps, &ends),
            [(0, 1.0), (3, -1.0), (3, 0.5), (3, 2.0)],
            "a step past the last whole character counts on the last token"
        );
        assert!(step_token_scores(&steps, &[]).is_empty(), "no token, no credit");
    }
}
