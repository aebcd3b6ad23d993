//! Format checks for tagged completions such as `<think>…</think><answer>…</answer>`.

/// Whether `text` consists of the given tags, each exactly once, in order, each non-empty.
///
/// `strict`: nothing but whitespace outside the tags (DeepSeek-R1's format reward).
/// Otherwise text before, between and after the tags is allowed.
pub fn tags_in_order(text: &str, tags: &[&str], strict: bool) -> bool {
    let mut rest = text;
    for tag in tags {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        if text.matches(&open).count() != 1 || text.matches(&close).count() != 1 {
            return false;
        }
        let Some(start) = rest.find(&open) else { return false };
        if strict && !rest[..start].trim().is_empty() {
            return false;
        }
        let after_open = &rest[start + open.len()..];
        let Some(end) = after_open.find(&close) else {
            return false;
        };
        if after_open[..end].trim().is_empty() {
            return false;
        }
        rest = &after_open[end + close.len()..];
    }
    !strict || rest.trim().is_empty()
}

/// Partial credit for tag hygiene: the fraction of the `2 × tags.len()` open and close markers
/// that appear exactly once (TRL's `count_xml`-style shaping). 1.0 for a well-formed completion.
pub fn tag_balance(text: &str, tags: &[&str]) -> f64 {
    if tags.is_empty() {
        return 1.0;
    }
    let once = tags
        .iter()
        .flat_map(|t| [format!("<{t}>"), format!("</{t}>")])
        .filter(|marker| text.matches(marker.as_str()).count() == 1)
        .count();
    once as f64 / (2 * tags.len()) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: &[&str] = &["think", "answer"];

    #[test]
    fn strict_format_allows_only_whitespace_outside_tags() {
        assert!(tags_in_order("<think>a</think>\n<answer>4</answer>\n", TAGS, true));
        assert!(!tags_in_order("hi <think>a</think><answer>4</answer>", TAGS, true));
        assert!(!tags_in_order("<think>a</think><answer>4</answer> bye", TAGS, true));
        assert!(tags_in_order(
            "hi <think>a</think> so <answer>4</answer> bye",
            TAGS,
            false
        ));
    }

    #[test]
    fn order_emptiness_and_duplicates_fail() {
        assert!(!tags_in_order("<answer>4</answer><think>a</think>", TAGS, false));
        assert!(!tags_in_order("<think> </think><answer>4</answer>", TAGS, false));
        assert!(!tags_in_order(
            "<think>a</think><answer>4</answer><answer>5</answer>",
            TAGS,
            false
        ));
        assert!(!tags_in_order("<think>a<answer>4</answer></think>", TAGS, true));
    }

    #[test]
    fn balance_counts_markers_seen_once() {
        assert_eq!(tag_balance("<think>a</think><answer>4</answer>", TAGS), 1.0);
        assert_eq!(tag_balance("<think>a</think>", TAGS), 0.5);
        assert_eq!(tag_balance("<think><think>", TAGS), 0.0);
    }
}
