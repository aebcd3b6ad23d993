//! `math-answer`: 1 when a completion's final answer equals the reference answer, else 0.
//!
//! The completion's answer is found with the configured extraction (`auto`: `<answer>` tag,
//! then `\boxed{}`, then `####`, then the last number). The reference's answer is its
//! `\boxed{}` or `####` part when it has one, else the whole reference. Answers compare
//! exactly as rationals when both are numbers (`0.5` = `1/2` = `\frac{1}{2}`), as normalised
//! text otherwise. Groups without a reference are "not applicable".

use rein_pdk::answer::{Answer, Extraction, extract, extract_after_hashes, extract_boxed};
use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// The reward.
pub struct MathAnswer {
    extraction: Extraction,
    tolerance: f64,
    correct: f64,
    wrong: f64,
    unanswered: f64,
}

impl MathAnswer {
    /// The answer the reference gives.
    pub fn reference_answer(reference: &str) -> Answer {
        Answer::new(
            extract_boxed(reference)
                .or_else(|| extract_after_hashes(reference))
                .unwrap_or(reference),
        )
    }

    /// Scores one completion against a reference answer.
    pub fn score_one(&self, completion: &str, reference: &Answer) -> Score {
        match extract(completion, &self.extraction) {
            Some(answer) => {
                let correct = Answer::new(answer).matches(reference, self.tolerance);
                Score::new(if correct { self.correct } else { self.wrong })
                    .with("correct", f64::from(u8::from(correct)))
                    .with("answered", 1.0)
            }
            None => Score::new(self.unanswered).with("correct", 0.0).with("answered", 0.0),
        }
    }
}

impl Reward for MathAnswer {
    const METADATA: Metadata = Metadata::new(
        "math-answer",
        "1 when the completion's final answer equals the reference answer (numerically or as normalised text), else 0",
    )
    .config(&[
        ConfigKey::new(
            "extract",
            "where the completion's answer is: auto, boxed, hashes, answer, last-number or tag:NAME",
        )
        .default("\"auto\""),
        ConfigKey::new("tolerance", "relative tolerance for numeric answers (0 = exact)").default("0"),
        ConfigKey::new("correct_score", "score of a correct answer").default("1.0"),
        ConfigKey::new("wrong_score", "score of a wrong answer").default("0.0"),
        ConfigKey::new("unanswered_score", "score when no answer can be found").default("0.0"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        Ok(Self {
            extraction: Extraction::parse(config.str_or("extract", "auto")?)?,
            tolerance: config.f64_or("tolerance", 0.0)?,
            correct: config.f64_or("correct_score", 1.0)?,
            wrong: config.f64_or("wrong_score", 0.0)?,
            unanswered: config.f64_or("unanswered_score", 0.0)?,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let Some(reference) = &group.reference else {
            return Ok(vec![Score::not_applicable(); group.completions.len()]);
        };
        let reference = Self::reference_answer(reference);
        Ok(group
            .completions
            .iter()
            .map(|c| self.score_one(c, &reference))
            .collect())
    }
}

rein_pdk::export_reward!(MathAnswer);

#[cfg(test)]
mod tests {
    use super::*;

    fn reward(config: &str) -> MathAnswer {
        MathAnswer::new(&Config::parse(config, &MathAnswer::METADATA).unwrap()).unwrap()
    }

    fn scores(config: &str, reference: Option<&str>, completions: &[&str]) -> Vec<Option<f64>> {
        let group = Group {
            completions: completions.iter().map(|s| s.to_string()).collect(),
            reference: reference.map(String::from),
            ..Group::default()
        };
        reward(config)
            .score(&group)
            .unwrap()
            .into_iter()
            .map(|s| s.value)
            .collect()
    }

    #[test]
    fn correct_wrong_and_unanswered() {
        let got = scores(
            "{}",
            Some("#### 1/2"),
            &[r"\boxed{0.5}", "<answer>2</answer>", "no idea"],
        );
        assert_eq!(got, vec![Some(1.0), Some(0.0), Some(0.0)]);
    }

    #[test]
    fn configured_extraction_and_scores() {
        let config = r#"{"extract": "answer", "wrong_score": -1, "unanswered_score": -2}"#;
        let got = scores(
            config,
            Some("7"),
            &["<answer>7</answer>", "<answer>8</answer>", r"\boxed{7}"],
        );
        assert_eq!(got, vec![Some(1.0), Some(-1.0), Some(-2.0)]);
    }

    #[test]
    fn no_reference_is_not_applicable() {
        assert_eq!(scores("{}", None, &["4", "5"]), vec![None, None]);
    }

    #[test]
    fn bad_config_is_an_error() {
        let config = Config::parse(r#"{"extract": "psychic"}"#, &MathAnswer::METADATA).unwrap();
        assert!(MathAnswer::new(&config).is_err());
    }
}
