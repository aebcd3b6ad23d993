//! `{{name}}`: a word game over several turns. The model must say the row's reference word;
//! after each miss it hears how many letters it got in the right place, until it says the word
//! (reward 1) or runs out of tries (reward 0).

use rein_pdk::{Config, ConfigKey, EpisodeStart, Message, Metadata, Opening, Reply, TextEnv};

/// The environment.
pub struct {{Type}} {
    tries: u32,
}

/// One episode.
pub struct Game {
    word: String,
    tries: u32,
}

impl TextEnv for {{Type}} {
    type Episode = Game;

    const METADATA: Metadata = Metadata::new("{{name}}", "Say the secret word; hints after each miss")
        .config(&[ConfigKey::new("tries", "turns before the episode ends unsolved").default("3")]);

    fn new(config: &Config) -> Result<Self, String> {
        match config.u64_or("tries", 3)? {
            0 => Err("`tries` must be at least 1".into()),
            tries => Ok(Self { tries: tries as u32 }),
        }
    }

    /// A new episode from a dataset row: its state and the opening messages.
    fn reset(&mut self, start: &EpisodeStart) -> Result<(Game, Opening), String> {
        let word = start.reference.clone().ok_or("the row has no reference (the word)")?;
        let opening = Opening {
            messages: vec![Message::user(start.prompt.clone())],
            tools: Vec::new(),
            images: Vec::new(),
        };
        Ok((Game { word: word.trim().to_lowercase(), tries: 0 }, opening))
    }

    /// The model's turn: the next messages, or the end with a reward.
    fn step(&mut self, game: &mut Game, content: &str) -> Result<Reply, String> {
        game.tries += 1;
        let said = content.trim().to_lowercase();
        if said.split_whitespace().any(|w| w.trim_matches(|c: char| !c.is_alphanumeric()) == game.word) {
            return Ok(Reply::done(1.0).with("tries", f64::from(game.tries)));
        }
        if game.tries == self.tries {
            return Ok(Reply::done(0.0).with("tries", f64::from(game.tries)));
        }
        let right = said.chars().zip(game.word.chars()).filter(|(a, b)| a == b).count();
        // The state key: turns that heard the same hint after as many tries are compared (GiGPO).
        Ok(Reply::user(format!("No. {right} letters in the right place.")).state(format!("{}:{right}", game.tries)))
    }
}

rein_pdk::export_text_env!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_game_ends_when_the_word_is_said_or_the_tries_run_out() {
        let config = Config::parse("{}", &{{Type}}::METADATA).unwrap();
        let mut env = {{Type}}::new(&config).unwrap();
        let start = EpisodeStart { prompt: "Say the word.".into(), reference: Some("Paris".into()), ..EpisodeStart::default() };
        let (mut game, opening) = env.reset(&start).unwrap();
        assert_eq!(opening.messages.len(), 1);
        let miss = env.step(&mut game, "pairs").unwrap();
        assert!(!miss.done && miss.messages[0].content.contains("3 letters"));
        let hit = env.step(&mut game, "It is Paris.").unwrap();
        assert_eq!((hit.done, hit.reward), (true, Some(1.0)));
    }
}
