//! `majority-vote`: TTRL's label-free reward (Zuo et al. 2025). The group's majority answer
//! stands in for the missing reference: a completion scores 1 when its answer agrees with the
//! majority, 0 otherwise. No reference answer is needed.
//!
//! Answers are grouped by equivalence (`0.5` and `1/2` vote together). Ties go to the answer
//! seen first. Completions without an answer score 0 and do not vote. When fewer than
//! `min_share` of the group agree with the majority, the group is "not applicable" (too
//! uncertain to label).

use rein_pdk::answer::{Answer, Extraction, extract};
use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

/// The reward.
pub struct MajorityVote {
    extraction: Extraction,
    tolerance: f64,
    min_share: f64,
}

impl MajorityVote {
    /// The majority answer (the first-seen member of the largest class of equivalent answers)
    /// and its vote count. `None` entries do not vote.
    pub fn majority<'a>(&self, answers: &'a [Option<Answer>]) -> Option<(&'a Answer, usize)> {
        let mut classes: Vec<(&Answer, usize)> = Vec::new();
        for answer in answers.iter().flatten() {
            match classes.iter_mut().find(|(rep, _)| rep.matches(answer, self.tolerance)) {
                Some((_, count)) => *count += 1,
                None => classes.push((answer, 1)),
            }
        }
        // `max_by_key` keeps the last maximum; reversing keeps the first-seen one.
        classes.into_iter().rev().max_by_key(|(_, count)| *count)
    }
}

impl Reward for MajorityVote {
    const METADATA: Metadata = Metadata::new(
        "majority-vote",
        "TTRL: 1 when the completion's answer agrees with the group's majority answer, else 0 (no reference needed)",
    )
    .config(&[
        ConfigKey::new(
            "extract",
            "where the answer is: auto, boxed, hashes, answer, last-number or tag:NAME",
        )
        .default("\"auto\""),
        ConfigKey::new("tolerance", "relative tolerance for numeric answers (0 = exact)").default("0"),
        ConfigKey::new(
            "min_share",
            "minimum fraction of the group agreeing with the majority, else not applicable",
        )
        .default("0"),
    ]);

    fn new(config: &Config) -> Result<Self, String> {
        let min_share = config.f64_or("min_share", 0.0)?;
        if !(0.0..=1.0).contains(&min_share) {
            return Err(format!(
                "config key `min_share` must be between 0 and 1, got {min_share}"
            ));
        }
        Ok(Self {
            extraction: Extraction::parse(config.str_or("extract", "auto")?)?,
            tolerance: config.f64_or("tolerance", 0.0)?,
            min_share,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let answers: Vec<Option<Answer>> = group
            .completions
            .iter()
            .map(|c| extract(c, &self.extraction).map(Answer::new))
            .collect();
        let n = answers.len().max(1) as f64;
        let Some((majority, votes)) = self.majority(&answers) else {
            return Ok(vec![Score::new(0.0).with("agreement", 0.0); answers.len()]);
        };
        let share = votes as f64 / n;
        if share < self.min_share {
            return Ok(vec![
                Score::not_applicable().with("majority_share", share);
                answers.len()
            ]);
        }
        Ok(answers
            .iter()
            .map(|answer| {
                let agrees = answer.as_ref().is_some_and(|a| a.matches(majority, self.tolerance));
                Score::from(agrees)
                    .with("agreement", f64::from(u8::from(agrees)))
                    .with("majority_share", share)
            })
            .collect())
    }
}

rein_pdk::export_reward!(MajorityVote);

#[cfg(test)]
mod tests {
    use super::*;

    fn values(config: &str, completions: &[&str]) -> Vec<Option<f64>> {
        let mut reward = MajorityVote::new(&Config::parse(config, &MajorityVote::METADATA).unwrap()).unwrap();
        let group = Group {
            completions: completions.iter().map(|s| s.to_string()).collect(),
            ..Group::default()
        };
        reward.score(&group).unwrap().into_iter().map(|s| s.value).collect()
    }

    #[test]
    fn agreement_with_the_majority_is_rewarded() {
        let got = values("{}", &[r"\boxed{1/2}", r"\boxed{0.5}", r"\boxed{3}", "no answer"]);
        assert_eq!(got, vec![Some(1.0), Some(1.0), Some(0.0), Some(0.0)]);
    }

    #[test]
    fn ties_go_to_the_first_answer_seen() {
        assert_eq!(values("{}", &["#### 2", "#### 3"]), vec![Some(1.0), Some(0.0)]);
    }

    #[test]
    fn uncertain_groups_are_not_applicable() {
        assert_eq!(
            values(r#"{"min_share": 0.6}"#, &["#### 1", "#### 1", "#### 2", "#### 3"]),
            vec![None; 4]
        );
        assert_eq!(values("{}", &["none", "either"]), vec![Some(0.0), Some(0.0)]);
    }
}
