//! `{{name}}`: 1 when a completion contains the reference answer, else 0.

use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// The reward.
pub struct {{Type}} {
    ignore_case: bool,
}

impl Reward for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "1 when the completion contains the reference answer, else 0")
        .config(&[ConfigKey::new("ignore_case", "compare without regard to case").default("false")]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self { ignore_case: config.bool_or("ignore_case", false)? })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let Some(reference) = &group.reference else {
            return Ok(vec![Score::not_applicable(); group.completions.len()]);
        };
        let fold = |s: &str| if self.ignore_case { s.to_lowercase() } else { s.to_string() };
        let reference = fold(reference);
        Ok(group.completions.iter().map(|c| Score::from(fold(c).contains(&reference))).collect())
    }
}

rein_pdk::export_reward!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_completions_containing_the_reference() {
        let config = Config::parse(r#"{"ignore_case": true}"#, &{{Type}}::METADATA).unwrap();
        let mut reward = {{Type}}::new(&config).unwrap();
        let group = Group {
            prompt: "Capital of France?".into(),
            completions: vec!["It is PARIS.".into(), "Lyon".into()],
            reference: Some("Paris".into()),
            ..Group::default()
        };
        let scores: Vec<_> = reward.score(&group).unwrap().into_iter().map(|s| s.value).collect();
        assert_eq!(scores, vec![Some(1.0), Some(0.0)]);
    }
}
