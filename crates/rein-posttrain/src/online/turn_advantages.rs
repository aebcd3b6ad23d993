//! GiGPO in a GRPO step: each episode of a group as the turns [`rein_optim::gigpo_advantages`]
//! compares, and each turn's advantage given to the tokens of that turn.
//!
//! A turn's reward is what the text environment gave for it; the rest of the episode's reward
//! (the reward plugins', which see the whole transcript, and a KL penalty folded into the
//! reward) comes at its last turn, so each episode's return is its whole reward, as GRPO's.

use rein_optim::{GigpoConfig, TurnOutcome, gigpo_advantages};

use crate::rollout::episodes::TurnRecord;

/// One episode of a group, as GiGPO needs it.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeTurns<'a> {
    /// Its model turns; `end` counts from the start of the completion (after the opening).
    pub turns: &'a [TurnRecord],
    /// Its whole reward (environment, plugins and folded-in penalties).
    pub reward: f32,
    /// Tokens after the opening.
    pub len: usize,
}

/// The advantage of every completion token of every episode of one group: a token has its
/// turn's advantage (tokens after the last turn's, which are the environment's and carry no
/// loss, have the last turn's). An episode without turns has its episode-level advantage.
pub fn token_advantages(group: &[EpisodeTurns], config: GigpoConfig) -> Vec<Vec<f32>> {
    let outcomes: Vec<Vec<TurnOutcome>> = (group.iter())
        .map(|episode| {
            let mut outcomes: Vec<TurnOutcome> = (episode.turns.iter())
                .map(|t| TurnOutcome {
                    reward: t.reward as f32,
                    state_after: t.state_after.clone(),
                })
                .collect();
            let given: f32 = outcomes.iter().map(|t| t.reward).sum();
            match outcomes.last_mut() {
                Some(last) => last.reward += episode.reward - given,
                None => outcomes.push(TurnOutcome {
                    reward: episode.reward,
                    state_after: None,
                }),
            }
            outcomes
        })
        .collect();
    let advantages = gigpo_advantages(&outcomes, config);
    (group.iter().zip(advantages))
        .map(|(episode, per_turn)| {
            let mut turn = 0;
            (0..episode.len)
                .map(|position| {
                    while turn + 1 < per_turn.len() && position >= episode.turns[turn].end {
                        turn += 1;
                    }
                    per_turn[turn]
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(end: usize, reward: f64, key: Option<&str>) -> TurnRecord {
        TurnRecord {
            end,
            reward,
            state_after: key.map(String::from),
        }
    }

    /// Two episodes of a guessing game, by hand (ω = 1, γ = 1, no std scaling):
    /// episode 0 guesses twice (state "a" after its first guess, found on its second: reward
    /// 1 from the environment plus 0.5 from a plugin), episode 1 guesses once into state "a"
    /// and then gives up (0).
    /// Episode level: returns 1.5 and 0, mean 0.75: A^E = +0.75, −0.75.
    /// Step level: the first turns share the initial state, returns-to-go 1.5 and 0: ±0.75;
    /// the second turns both start from "a", returns-to-go 1.5 and 0: ±0.75.
    #[test]
    fn each_token_gets_its_turns_advantage_as_computed_by_hand() {
        let first = [turn(3, 0.0, Some("a")), turn(7, 1.0, None)];
        let second = [turn(2, 0.0, Some("a")), turn(4, 0.0, None)];
        let group = [
            EpisodeTurns {
                turns: &first,
                reward: 1.5,
                len: 7,
            },
            EpisodeTurns {
                turns: &second,
                reward: 0.0,
                len: 6,
            },
        ];
        let config = GigpoConfig {
            gamma: 1.0,
            step_weight: 1.0,
            scale_by_std: false,
        };
        let a = token_advantages(&group, config);
        assert_eq!(a[0], vec![1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5]);
        assert_eq!(a[1], vec![-1.5, -1.5, -1.5, -1.5, -1.5, -1.5]);

        // With ω = 0.5 and γ = 0.5 the first turns' returns-to-go are 0.75 and 0 (±0.375),
        // the second turns' 1.5 and 0 (±0.75).
        let config = GigpoConfig {
            gamma: 0.5,
            step_weight: 0.5,
            ..config
        };
        let a = token_advantages(&group, config);
        let (e, s1, s2) = (0.75f32, 0.375f32, 0.75f32);
        assert_eq!(
            a[0],
            vec![e + 0.5 * s1; 3]
                .into_iter()
                .chain(vec![e + 0.5 * s2; 4])
                .collect::<Vec<_>>()
        );
        assert_eq!(
            a[1],
            vec![-e - 0.5 * s1; 2]
                .into_iter()
                .chain(vec![-e - 0.5 * s2; 4])
                .collect::<Vec<_>>(),
            "the environment's tokens after the last turn carry the last turn's advantage"
        );
    }

    /// Without turns (no agent), every token has the episode-level GRPO advantage.
    #[test]
    fn episodes_without_turns_get_the_episode_advantage() {
        let group = [
            EpisodeTurns {
                turns: &[],
                reward: 1.0,
                len: 2,
            },
            EpisodeTurns {
                turns: &[],
                reward: 0.0,
                len: 3,
            },
        ];
        let config = GigpoConfig {
            gamma: 0.95,
            step_weight: 1.0,
            scale_by_std: false,
        };
        let a = token_advantages(&group, config);
        // Both start from the initial state with returns 1 and 0: A^E = A^S = ±0.5.
        assert_eq!(a, vec![vec![1.0, 1.0], vec![-1.0, -1.0, -1.0]]);
    }
}
