//! `guess-number`: a multi-turn game. The model guesses a secret integer; after each guess the
//! environment says "Higher." or "Lower." until the model finds it or runs out of guesses.
//!
//! The secret is the row's reference answer; the range is the row's metadata `low`/`high`
//! (default 1..100), and the row's prompt is the opening user message. The reward is 1 for
//! finding the number, 0 otherwise, with components `found` and `guesses`. A turn without a
//! number counts as a guess and is answered with a reminder. The state key is the range the
//! feedback so far leaves open, so turns of a group that know the same are compared (GiGPO).

use rein_pdk::{Config, ConfigKey, EpisodeStart, Metadata, Opening, Reply, TextEnv, json::Value};

/// The environment.
pub struct GuessNumber {
    max_guesses: u32,
}

/// One game.
pub struct Game {
    secret: i64,
    low: i64,
    high: i64,
    guesses: u32,
}

impl TextEnv for GuessNumber {
    type Episode = Game;

    const METADATA: Metadata = Metadata::new(
        "guess-number",
        "Guess a secret number with higher/lower feedback; reward 1 for finding it",
    )
    .config(&[ConfigKey::new("max_guesses", "Guesses before the episode ends unsolved").default("7")]);

    fn new(config: &Config) -> Result<Self, String> {
        let max_guesses = config.u64_or("max_guesses", 7)?;
        if max_guesses == 0 || max_guesses > 1000 {
            return Err(format!("`max_guesses` must be 1..=1000, not {max_guesses}"));
        }
        Ok(GuessNumber {
            max_guesses: max_guesses as u32,
        })
    }

    fn reset(&mut self, start: &EpisodeStart) -> Result<(Game, Opening), String> {
        let reference = start
            .reference
            .as_deref()
            .ok_or("the row has no reference (the secret)")?;
        let secret: i64 =
            (reference.trim().parse()).map_err(|_| format!("the reference `{reference}` is not an integer"))?;
        let metadata = start.metadata_json()?;
        let bound = |key: &str, default: i64| match metadata.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_i64().ok_or(format!("metadata `{key}` is not an integer")),
        };
        let (low, high) = (bound("low", 1)?, bound("high", 100)?);
        if !(low <= secret && secret <= high) {
            return Err(format!("the secret {secret} is outside {low}..={high}"));
        }
        let game = Game {
            secret,
            low,
            high,
            guesses: 0,
        };
        let opening = Opening {
            messages: vec![rein_pdk::Message::user(start.prompt.clone())],
            tools: Vec::new(),
            images: Vec::new(),
        };
        Ok((game, opening))
    }

    fn step(&mut self, game: &mut Game, content: &str) -> Result<Reply, String> {
        game.guesses += 1;
        let left = self.max_guesses - game.guesses;
        let reply = match last_integer(content) {
            Some(guess) if guess == game.secret => {
                return Ok(Reply::done(1.0)
                    .with("found", 1.0)
                    .with("guesses", f64::from(game.guesses)));
            }
            Some(guess) if guess < game.secret => {
                game.low = game.low.max(guess + 1);
                "Higher."
            }
            Some(guess) => {
                game.high = game.high.min(guess - 1);
                "Lower."
            }
            None => "Answer with a single number.",
        };
        if left == 0 {
            let mut end = Reply::done(0.0)
                .with("found", 0.0)
                .with("guesses", f64::from(game.guesses));
            end.messages.push(rein_pdk::Message::user(format!(
                "{reply} No guesses left: it was {}.",
                game.secret
            )));
            return Ok(end);
        }
        Ok(Reply::user(format!("{reply} {left} guesses left.")).state(format!("{}-{}", game.low, game.high)))
    }
}

rein_pdk::export_text_env!(GuessNumber);

/// The last integer in `text` (the model's final answer when it thinks aloud first).
fn last_integer(text: &str) -> Option<i64> {
    let mut last = None;
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let negative = start > 0 && chars[start - 1] == '-';
            let digits: String = chars[start..i].iter().collect();
            last = digits.parse::<i64>().ok().map(|n| if negative { -n } else { n });
        } else {
            i += 1;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(secret: &str) -> EpisodeStart {
        EpisodeStart {
            prompt: "Guess my number (1-100).".into(),
            reference: Some(secret.into()),
            ..EpisodeStart::default()
        }
    }

    #[test]
    fn feedback_narrows_the_range_until_found() {
        let mut env = GuessNumber { max_guesses: 7 };
        let (mut game, opening) = env.reset(&start("42")).unwrap();
        assert_eq!(opening.messages[0].content, "Guess my number (1-100).");
        let higher = env.step(&mut game, "I guess 50? No wait, 30").unwrap();
        assert_eq!(higher.messages[0].content, "Higher. 6 guesses left.");
        assert_eq!(higher.state_key.as_deref(), Some("31-100"));
        let lower = env.step(&mut game, "50").unwrap();
        assert_eq!(lower.state_key.as_deref(), Some("31-49"));
        assert!(!lower.done);
        let found = env.step(&mut game, "It is 42.").unwrap();
        assert!(found.done);
        assert_eq!(found.reward, Some(1.0));
        assert_eq!(found.components, vec![("found".into(), 1.0), ("guesses".into(), 3.0)]);
    }

    #[test]
    fn running_out_of_guesses_ends_unsolved() {
        let mut env = GuessNumber { max_guesses: 2 };
        let (mut game, _) = env.reset(&start("7")).unwrap();
        let nudge = env.step(&mut game, "no idea").unwrap();
        assert_eq!(
            nudge.messages[0].content,
            "Answer with a single number. 1 guesses left."
        );
        let end = env.step(&mut game, "3").unwrap();
        assert!(end.done);
        assert_eq!(end.reward, Some(0.0));
        assert!(end.messages[0].content.contains("it was 7"));
    }

    #[test]
    fn bad_rows_are_errors() {
        let mut env = GuessNumber { max_guesses: 7 };
        assert!(env.reset(&start("seven")).err().unwrap().contains("not an integer"));
        assert!(env.reset(&start("500")).err().unwrap().contains("outside 1..=100"));
        let no_reference = EpisodeStart::default();
        assert!(env.reset(&no_reference).err().unwrap().contains("no reference"));
        assert_eq!(last_integer("between -5 and 3, say -4"), Some(-4));
    }
}
