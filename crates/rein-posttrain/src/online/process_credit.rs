//! The process advantage's inputs (`advantage = "process"`): where each completion's step scores
//! and its outcome land among its tokens, as the sources of
//! [`rein_optim::process_advantages`] (PRIME's advantages, with its equations).
//!
//! The step scores of every reward (already scaled by the reward's weight) are credited to the
//! token completing each step's last character ([`crate::rewards::steps`]); steps of several
//! rewards ending on one token add up. The outcome, the rewards' weighted sum (with −β·KL folded
//! in when the recipe asks), sits on each completion's last token. An implicit PRM's token
//! rewards ([`super::implicit_prm`]) are a third source, over every completion token as verl's
//! PRIME masks them.

use rein_core::StepScore;
use rein_model::lm::LmTokenizer;
use rein_optim::{TokenRewards, process_advantages};

use super::sample::Rollout;
use crate::rewards::steps::step_token_scores;

/// One completion: its rollout, the step scores on its text, and its outcome.
pub(super) struct Completion<'a> {
    pub(super) rollout: &'a Rollout,
    pub(super) steps: &'a [StepScore],
    pub(super) outcome: f32,
}

/// The settings of the process advantage.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProcessCredit {
    pub(super) gamma: f32,
    pub(super) step_weight: f32,
    pub(super) outcome_weight: f32,
}

/// The process advantages `[rows, width]` of `completions` (rows in groups of `g`), and the
/// mean number of step scores a completion got; `token_rewards`, `[rows, width]` with their
/// weight, join the sources on the tokens of `mask`.
pub(super) fn advantages(
    completions: &[Completion<'_>],
    token_rewards: Option<(&[f32], f32)>,
    tokenizer: &LmTokenizer,
    mask: &[f32],
    width: usize,
    g: usize,
    credit: ProcessCredit,
) -> (Vec<f32>, f64) {
    let size = completions.len() * width;
    let (mut step_rewards, mut step_mask) = (vec![0.0f32; size], vec![0.0f32; size]);
    let (mut outcome_rewards, mut outcome_mask) = (vec![0.0f32; size], vec![0.0f32; size]);
    let mut steps = 0usize;
    for (row, completion) in completions.iter().enumerate() {
        let Some(last) = completion.rollout.tokens.len().min(width).checked_sub(1) else {
            continue;
        };
        outcome_rewards[row * width + last] = completion.outcome;
        outcome_mask[row * width + last] = 1.0;
        if completion.steps.is_empty() {
            continue;
        }
        let ends = completion.rollout.char_ends(tokenizer);
        for (token, score) in step_token_scores(completion.steps, ends) {
            if token < width {
                step_rewards[row * width + token] += score as f32;
                step_mask[row * width + token] = 1.0;
                steps += 1;
            }
        }
    }
    let mut sources = vec![
        TokenRewards {
            rewards: &step_rewards,
            mask: &step_mask,
            weight: credit.step_weight,
        },
        TokenRewards {
            rewards: &outcome_rewards,
            mask: &outcome_mask,
            weight: credit.outcome_weight,
        },
    ];
    if let Some((rewards, weight)) = token_rewards {
        sources.push(TokenRewards { rewards, mask, weight });
    }
    let (advantages, _returns) = process_advantages(&sources, mask, width, g, credit.gamma);
    (advantages, steps as f64 / completions.len().max(1) as f64)
}
