//! Splitting a completion into steps, for rewards that score each step ([`crate::Score::step`]).
//!
//! A step is a span of the completion's characters (Unicode scalar values: what the host
//! counts, and what Python indexes a `str` by). Each rule returns the steps in order, without
//! overlaps, each trimmed of the whitespace around it, and skips steps that are only
//! whitespace:
//!
//! - [`Split::Lines`]: each line;
//! - [`Split::Marker`]: each part that starts at a line beginning with the marker followed by a
//!   number (`Step 1:`, `Step 2.`), the text before the first such line its own step;
//! - [`Split::Delimiter`]: the parts between occurrences of a delimiter (`\n\n`, `ки`).
//!
//! ```
//! use rein_pdk::steps::{Split, split};
//!
//! let text = "12 + 30 = 42\n42 * 2 = 84\n<answer>84</answer>";
//! let steps = split(text, &Split::Lines);
//! assert_eq!(steps.len(), 3);
//! assert_eq!(steps[1].text, "42 * 2 = 84");
//! assert_eq!((steps[1].start, steps[1].end), (13, 24));
//! ```

/// How to cut a completion into steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    /// One step per line.
    Lines,
    /// A step begins at each line that starts with this marker and a number (`Step`).
    Marker(String),
    /// Steps are separated by this string (not part of any step).
    Delimiter(String),
}

impl Split {
    /// Reads a rule from a config value: `lines`, `marker:TEXT` or `delimiter:TEXT`
    /// (`\n` in TEXT is a newline).
    pub fn parse(value: &str) -> Result<Split, String> {
        let unescape = |s: &str| s.replace("\\n", "\n");
        match value.split_once(':') {
            None if value == "lines" => Ok(Split::Lines),
            Some(("marker", m)) if !m.is_empty() => Ok(Split::Marker(unescape(m))),
            Some(("delimiter", d)) if !d.is_empty() => Ok(Split::Delimiter(unescape(d))),
            _ => Err(format!(
                "steps rule `{value}`: expected `lines`, `marker:TEXT` or `delimiter:TEXT`"
            )),
        }
    }
}

/// One step of a completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<'a> {
    /// Its text (trimmed).
    pub text: &'a str,
    /// Its first character's index in the completion.
    pub start: usize,
    /// One past its last character.
    pub end: usize,
}

/// The steps of `text` under `rule` (see the module docs).
pub fn split<'a>(text: &'a str, rule: &Split) -> Vec<Step<'a>> {
    let parts: Vec<(usize, usize)> = match rule {
        Split::Lines => pieces(text, "\n"),
        Split::Delimiter(delimiter) => pieces(text, delimiter),
        Split::Marker(marker) => {
            let starts = line_starts(text).filter(|&at| begins_step(&text[at..], marker));
            let mut cuts: Vec<usize> = std::iter::once(0).chain(starts).collect();
            cuts.dedup();
            cuts.push(text.len());
            cuts.windows(2).map(|w| (w[0], w[1])).collect()
        }
    };
    parts
        .into_iter()
        .filter_map(|(from, to)| trimmed(text, from, to))
        .collect()
}

/// The byte ranges between occurrences of `delimiter`.
fn pieces(text: &str, delimiter: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    for (at, _) in text.match_indices(delimiter) {
        out.push((from, at));
        from = at + delimiter.len();
    }
    out.push((from, text.len()));
    out
}

/// The byte offset of each line's start after the first.
fn line_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.match_indices('\n').map(|(at, _)| at + 1)
}

/// `line` starts with `marker`, optional spaces, and a digit.
fn begins_step(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .map(|rest| rest.trim_start_matches(' '))
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// The step in bytes `from..to` of `text`, trimmed, with character offsets; `None` when blank.
fn trimmed(text: &str, from: usize, to: usize) -> Option<Step<'_>> {
    let part = &text[from..to];
    let body = part.trim();
    if body.is_empty() {
        return None;
    }
    let lead = part.len() - part.trim_start().len();
    let start = text[..from + lead].chars().count();
    Some(Step {
        text: body,
        start,
        end: start + body.chars().count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(text: &str, rule: &Split) -> Vec<(usize, usize, String)> {
        (split(text, rule).into_iter())
            .map(|s| (s.start, s.end, s.text.to_string()))
            .collect()
    }

    #[test]
    fn offsets_count_characters_and_slice_the_step() {
        let text = "  α = 1 \n\n\tβ = α + 1\n";
        for step in split(text, &Split::Lines) {
            let chars: String = text.chars().skip(step.start).take(step.end - step.start).collect();
            assert_eq!(chars, step.text);
        }
        assert_eq!(
            spans(text, &Split::Lines),
            [(2, 7, "α = 1".into()), (11, 20, "β = α + 1".into())]
        );
    }

    #[test]
    fn markers_start_steps_only_at_line_starts_with_a_number() {
        let text = "Plan first.\nStep 1: 2+3=5\nsee Step 2 below\nStep 2: 5*4=20\nStep two: no";
        assert_eq!(
            spans(text, &Split::Marker("Step".into())),
            [
                (0, 11, "Plan first.".into()),
                (12, 42, "Step 1: 2+3=5\nsee Step 2 below".into()),
                (43, 70, "Step 2: 5*4=20\nStep two: no".into()),
            ]
        );
    }

    #[test]
    fn delimiters_separate_steps_and_belong_to_none() {
        let text = "a=1 ки b=2 ки  ки c=3";
        assert_eq!(
            spans(text, &Split::Delimiter("ки".into())),
            [(0, 3, "a=1".into()), (7, 10, "b=2".into()), (18, 21, "c=3".into())]
        );
    }

    #[test]
    fn rules_parse_from_config_values() {
        assert_eq!(Split::parse("lines"), Ok(Split::Lines));
        assert_eq!(Split::parse("marker:Step"), Ok(Split::Marker("Step".into())));
        assert_eq!(Split::parse("delimiter:\\n\\n"), Ok(Split::Delimiter("\n\n".into())));
        assert!(Split::parse("paragraphs").unwrap_err().contains("paragraphs"));
        assert!(Split::parse("marker:").is_err());
    }
}
