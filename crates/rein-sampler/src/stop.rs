//! Stop strings: ending a completion once its text contains one, and cutting its text there.

use rein_model::lm::LmTokenizer;

/// A stop check for [`crate::generate`]: true once the decoded completion contains
/// one of `stops`.
pub fn stop_check<'a>(tokenizer: &'a LmTokenizer, stops: &'a [String]) -> impl FnMut(usize, &[u32]) -> bool + 'a {
    move |_, tokens| {
        !stops.is_empty()
            && tokenizer
                .decode(tokens, false)
                .is_ok_and(|t| stops.iter().any(|s| t.contains(s.as_str())))
    }
}

/// The completion's text without special tokens, cut at the first stop string.
pub fn completion_text(tokenizer: &LmTokenizer, tokens: &[u32], stops: &[String]) -> String {
    let mut text = tokenizer.decode(tokens, true).unwrap_or_default();
    if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
        text.truncate(at);
    }
    text
}
