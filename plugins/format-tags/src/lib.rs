//! `format-tags`: 1 when a completion is laid out in the configured tags, in order
//! (by default `<think>…</think><answer>…</answer>`, DeepSeek-R1's format reward), else 0.

use rein_pdk::format::{tag_balance, tags_in_order};
use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// The reward.
pub struct FormatTags {
    tags: Vec<String>,
    strict: bool,
    partial: bool,
}

impl FormatTags {
    /// Scores one completion.
    pub fn score_one(&self, completion: &str) -> Score {
        let tags: Vec<&str> = self.tags.iter().map(String::as_str).collect();
        let ok = tags_in_order(completion, &tags, self.strict);
        let balance = tag_balance(completion, &tags);
        let score = if ok {
            1.0
        } else if self.partial {
            0.5 * balance
        } else {
            0.0
        };
        Score::new(score)
            .with("format", f64::from(u8::from(ok)))
            .with("tag_balance", balance)
    }
}

impl Reward for FormatTags {
    const METADATA: Metadata = Metadata::new(
        "format-tags",
        "1 when the completion consists of the configured tags in order, each once and non-empty, else 0",
    )
    .config(&[
        ConfigKey::new("tags", "the tags, in order").default("[\"think\", \"answer\"]"),
        ConfigKey::new("strict", "allow only whitespace outside the tags").default("true"),
        ConfigKey::new(
            "partial",
            "give 0.5 × the fraction of tag markers present once when the format fails",
        )
        .default("false"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let tags = config.strings_or("tags", &["think", "answer"])?;
        if tags.is_empty() || tags.iter().any(|t| t.is_empty() || t.contains(['<', '>', '/'])) {
            return Err("config key `tags` must be a non-empty list of tag names without <, > or /".into());
        }
        Ok(Self {
            tags,
            strict: config.bool_or("strict", true)?,
            partial: config.bool_or("partial", false)?,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        Ok(group.completions.iter().map(|c| self.score_one(c)).collect())
    }
}

rein_pdk::export_reward!(FormatTags);

#[cfg(test)]
mod tests {
    use super::*;

    fn reward(config: &str) -> FormatTags {
        FormatTags::new(&Config::parse(config, &FormatTags::METADATA).unwrap()).unwrap()
    }

    #[test]
    fn well_formed_scores_one() {
        let r = reward("{}");
        assert_eq!(r.score_one("<think>2+2</think>\n<answer>4</answer>").value, Some(1.0));
        assert_eq!(r.score_one("4").value, Some(0.0));
        assert_eq!(r.score_one("so <think>x</think><answer>4</answer>").value, Some(0.0));
    }

    #[test]
    fn lenient_partial_and_custom_tags() {
        assert_eq!(
            reward(r#"{"strict": false}"#)
                .score_one("so <think>x</think><answer>4</answer>")
                .value,
            Some(1.0)
        );
        assert_eq!(
            reward(r#"{"partial": true}"#).score_one("<think>x</think>").value,
            Some(0.25)
        );
        assert_eq!(
            reward(r#"{"tags": ["answer"]}"#).score_one("<answer>4</answer>").value,
            Some(1.0)
        );
        assert!(FormatTags::new(&Config::parse(r#"{"tags": []}"#, &FormatTags::METADATA).unwrap()).is_err());
    }
}
