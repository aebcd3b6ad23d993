//! `{{name}}`: asks the judge model the recipe grants whether each completion answers the
//! question correctly; 1 for "Yes", 0 otherwise. Grant it a judge in the recipe:
//!
//! ```toml
//! [[reward]]
//! plugin = "{{name}}"
//! judge = { max_new_tokens = 4 }   # the policy's starting model; or model = "<dir>"
//! ```

use rein_pdk::judge::{self, JudgeRequest};
use rein_pdk::{Config, ConfigKey, Group, Message, Metadata, Reward, Score};

/// The reward.
pub struct {{Type}} {
    rubric: String,
}

impl Reward for {{Type}} {
    const METADATA: Metadata = Metadata::new("{{name}}", "1 when the judge says the completion is correct, else 0")
        .config(&[ConfigKey::new("rubric", "the judge's system message").default("\"Reply Yes or No.\"")]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self { rubric: config.str_or("rubric", "Reply Yes or No.")?.to_string() })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let requests: Vec<JudgeRequest> = (group.completions.iter())
            .map(|c| {
                let question = format!("Question: {}\nAnswer: {c}\nIs the answer correct?", group.prompt);
                JudgeRequest::new(vec![Message::system(self.rubric.clone()), Message::user(question)]).max_new_tokens(4)
            })
            .collect();
        // Every request is answered or refused (a budget spent): the plugin decides what a
        // refusal scores; here it fails the group, which the host counts.
        (judge::ask(&requests).into_iter().enumerate())
            .map(|(c, verdict)| {
                let verdict = verdict.map_err(|e| format!("completion {c}: {e}"))?;
                Ok(Score::from(verdict.text.trim_start().to_lowercase().starts_with("yes")))
            })
            .collect()
    }
}

rein_pdk::export_reward!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_judges_yes_scores_one() {
        // Native tests have no host: the judge answers from a script.
        judge::script(["Yes.", "No"]);
        let mut reward = {{Type}}::new(&Config::default()).unwrap();
        let group = Group {
            prompt: "What is 2 + 3?".into(),
            completions: vec!["5".into(), "6".into()],
            reference: None,
            ..Group::default()
        };
        let scores: Vec<_> = reward.score(&group).unwrap().into_iter().map(|s| s.value).collect();
        assert_eq!(scores, vec![Some(1.0), Some(0.0)]);
    }
}
