//! `judge-match`: asks the judge model the recipe grants whether each completion's answer
//! matches the reference, and scores the verdict.
//!
//! One request per completion, all of a group's at once: a system rubric, then the question,
//! the reference and the completion, asking for one word, `Yes` or `No`. The score is
//! - `verdict` (default): 1 when the answer's first word is "yes", 0 otherwise;
//! - `probability`: P(Yes) / (P(Yes) + P(No)) at the answer's first token, read from its
//!   most likely tokens (`top_logprobs`); 0 when neither is among them.
//!
//! A group without a reference is not scored (`None`). A request the judge refuses (a budget
//! spent, the judge failing) fails the group with the judge's error, which the host counts.

use rein_pdk::judge::{self, JudgeRequest, Judgement};
use rein_pdk::{Config, ConfigKey, Group, Message, Metadata, Reward, Score};

const RUBRIC: &str = "You grade answers. Reply with one word: Yes if the student's final answer equals the \
                      reference answer, No otherwise.";

/// How a verdict becomes a score.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Verdict,
    Probability,
}

/// The reward.
pub struct JudgeMatch {
    mode: Mode,
    rubric: String,
    top_logprobs: u32,
}

impl JudgeMatch {
    /// The request for one completion.
    pub fn request(&self, group: &Group, reference: &str, completion: &str) -> JudgeRequest {
        let question = format!(
            "Question: {}\nReference answer: {reference}\nStudent's answer: {completion}\nDoes the student's \
             final answer equal the reference? Answer Yes or No.",
            group.prompt
        );
        let request = JudgeRequest::new(vec![Message::system(self.rubric.clone()), Message::user(question)]);
        match self.mode {
            Mode::Verdict => request.max_new_tokens(4),
            Mode::Probability => request.max_new_tokens(1).top_logprobs(self.top_logprobs),
        }
    }

    /// The score of one verdict.
    pub fn score_of(&self, judgement: &Judgement) -> f64 {
        match self.mode {
            Mode::Verdict => {
                let first = judgement.text.split_whitespace().next().unwrap_or_default();
                let word: String = first.chars().filter(|c| c.is_alphabetic()).collect();
                f64::from(u8::from(word.eq_ignore_ascii_case("yes")))
            }
            Mode::Probability => {
                let (yes, no) = (judgement.probability(0, "yes"), judgement.probability(0, "no"));
                if yes + no > 0.0 { yes / (yes + no) } else { 0.0 }
            }
        }
    }
}

impl Reward for JudgeMatch {
    const METADATA: Metadata = Metadata::new(
        "judge-match",
        "1 when a judge model says the completion's answer equals the reference",
    )
    .config(&[
        ConfigKey::new(
            "mode",
            "`verdict` (the judge's Yes/No) or `probability` (P(Yes) among Yes and No)",
        )
        .default("\"verdict\""),
        ConfigKey::new("rubric", "the judge's system message").default("\"You grade answers. …\""),
        ConfigKey::new(
            "top_logprobs",
            "tokens read at the verdict's position in `probability` mode",
        )
        .default("10"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let mode = match config.str_or("mode", "verdict")? {
            "verdict" => Mode::Verdict,
            "probability" => Mode::Probability,
            other => return Err(format!("`mode` must be `verdict` or `probability`, got `{other}`")),
        };
        let top_logprobs = config.u64_or("top_logprobs", 10)?;
        if !(1..=20).contains(&top_logprobs) {
            return Err(format!("`top_logprobs` must be 1 to 20, got {top_logprobs}"));
        }
        Ok(Self {
            mode,
            rubric: config.str_or("rubric", RUBRIC)?.to_string(),
            top_logprobs: top_logprobs as u32,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let Some(reference) = &group.reference else {
            return Ok(group.completions.iter().map(|_| Score::not_applicable()).collect());
        };
        let requests: Vec<JudgeRequest> = (group.completions.iter())
            .map(|c| self.request(group, reference, c))
            .collect();
        (judge::ask(&requests).into_iter().enumerate())
            .map(|(c, verdict)| match verdict {
                Ok(judgement) => Ok(Score::new(self.score_of(&judgement))),
                Err(error) => Err(format!("completion {c}: {error}")),
            })
            .collect()
    }
}

rein_pdk::export_reward!(JudgeMatch);

#[cfg(test)]
mod tests {
    use super::*;

    fn reward(mode: &str) -> JudgeMatch {
        let config = Config::parse(&format!(r#"{{"mode": "{mode}"}}"#), &JudgeMatch::METADATA).unwrap();
        JudgeMatch::new(&config).unwrap()
    }

    fn group(completions: &[&str], reference: Option<&str>) -> Group {
        Group {
            prompt: "What is 2 + 3?".into(),
            completions: completions.iter().map(|c| c.to_string()).collect(),
            reference: reference.map(str::to_string),
            ..Group::default()
        }
    }

    #[test]
    fn verdicts_score_one_for_yes_only() {
        judge::script(["Yes.", " no", "YES, it matches", "Maybe"]);
        let scores = reward("verdict")
            .score(&group(&["5", "6", "five", "?"], Some("5")))
            .unwrap();
        let values: Vec<_> = scores.iter().map(|s| s.value).collect();
        assert_eq!(values, [Some(1.0), Some(0.0), Some(1.0), Some(0.0)]);
    }

    #[test]
    fn the_question_carries_the_reference_and_the_completion() {
        let request = reward("probability").request(&group(&[], None), "5", "<answer>5</answer>");
        assert_eq!(request.messages[0].role, "system");
        assert!(request.messages[1].content.contains("Reference answer: 5"));
        assert!(
            request.messages[1]
                .content
                .contains("Student's answer: <answer>5</answer>")
        );
        assert_eq!((request.max_new_tokens, request.top_logprobs), (Some(1), 10));
    }

    #[test]
    fn a_judge_error_fails_the_group_naming_the_completion() {
        judge::script(["Yes"]);
        let error = reward("verdict").score(&group(&["5", "6"], Some("5"))).unwrap_err();
        assert!(error.starts_with("completion 1: the judge failed"), "{error}");
    }

    #[test]
    fn groups_without_a_reference_are_not_scored() {
        let scores = reward("verdict").score(&group(&["5"], None)).unwrap();
        assert_eq!(scores[0].value, None);
    }

    #[test]
    fn bad_config_is_refused() {
        let parse = |text: &str| JudgeMatch::new(&Config::parse(text, &JudgeMatch::METADATA).unwrap());
        assert!(parse(r#"{"mode": "vibes"}"#).is_err());
        assert!(parse(r#"{"top_logprobs": 0}"#).is_err());
    }
}
