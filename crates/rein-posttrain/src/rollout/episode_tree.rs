//! Tree rollouts of multi-turn episodes (ARPO, Dong et al. 2025: branching after tool calls).
//! Each prompt's `trunks` episodes are played first; each round then picks `branch_points` of
//! the tree's [`Fork`]s — the points right after a tool's reply, before the model's next turn —
//! and plays `branches` episodes on from each, every branch a copy of the episode as it stood
//! at the fork, the tool's reply already in it: the tool is called once for all of them. A
//! round picks the forks whose next token the policy was least sure of (the entropy of its
//! first token after the reply, ARPO's signal), only forks of a leaf's own turns (a branch's
//! copy of its parent's are the parent's), and none twice. When the tree has fewer forks than
//! `branch_points` (episodes that called no tool), the rest are new episodes from the opening,
//! counted as fallback branch points. The leaves are the group.
//!
//! Each branch's session prefills its copy of the transcript (once per fork, shared by its
//! branches; no cache is copied). A text environment's state cannot be copied, so trees of
//! episodes are played with tools only (the recipe refuses `[agent] env`).

use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, LmTokenizer};
use rein_optim::Branch;
use rein_recipe::RolloutSection;
use rein_sampler::GenerationConfig;

use crate::rollout::episodes::{Agent, Episode, Fork, open, run};
use crate::rollout::tree::{Grown, round_seed};
use crate::{LmError, Prompt};

/// One leaf of a growing tree, and the forks of its own turns.
struct Leaf {
    episode: Episode,
    branch: Option<Branch>,
    forks: Vec<Fork>,
}

/// Grows a tree of [`RolloutSection::leaves`] episodes for each of `prompts`, numbering them
/// from `first_id` on (`config.n` is not read: the tree's shape is `spec`'s).
#[allow(clippy::too_many_arguments)]
pub fn grow_episodes<B: ReinBackend>(
    model: &CausalLm<B>,
    tokenizer: &LmTokenizer,
    agent: &mut Agent,
    prompts: &[&Prompt],
    config: &GenerationConfig,
    first_id: u64,
    device: &B::Device,
    spec: &RolloutSection,
) -> Result<Grown<Episode>, LmError> {
    // The entropy of each turn's first token: the rule's signal.
    let config = GenerationConfig {
        certainty: true,
        ..config.clone()
    };
    let trunk_ids: Vec<u64> = (0..(prompts.len() * spec.trunks) as u64)
        .map(|i| first_id + i)
        .collect();
    let mut next_id = first_id + trunk_ids.len() as u64;
    let trunks = open(tokenizer, agent, prompts, spec.trunks, &trunk_ids)?;
    let mut trees: Vec<Vec<Leaf>> = (0..prompts.len()).map(|_| Vec::new()).collect();
    let played_trunks = played(model, tokenizer, agent, trunks, &config, first_id, device)?;
    for (e, (episode, forks)) in played_trunks.into_iter().enumerate() {
        trees[e / spec.trunks].push(Leaf {
            episode,
            branch: None,
            forks,
        });
    }
    let mut fallback = 0;
    for round in 0..spec.rounds {
        // Every branch's start: a copy of its fork's episode, or a new opening.
        let mut starts: Vec<(usize, Branch)> = Vec::new();
        let mut episodes: Vec<Episode> = Vec::new();
        for (p, leaves) in trees.iter().enumerate() {
            let (points, missing) = choose(leaves, spec.branch_points);
            fallback += missing;
            for point in points {
                let (start, branch) = match point {
                    Some((parent, f)) => {
                        let fork = &leaves[parent].forks[f];
                        (
                            fork.episode.clone(),
                            Branch {
                                parent,
                                at: fork.episode.used(),
                            },
                        )
                    }
                    None => {
                        let id = next_id + episodes.len() as u64;
                        let opened = open(tokenizer, agent, &prompts[p..=p], 1, &[id])?;
                        let opening = opened.into_iter().next().expect("one episode opened");
                        (opening, Branch { parent: 0, at: 0 })
                    }
                };
                starts.extend(std::iter::repeat_n((p, branch), spec.branches));
                episodes.extend(std::iter::repeat_n(start, spec.branches));
            }
        }
        let round_config = GenerationConfig {
            seed: round_seed(config.seed, round),
            ..config.clone()
        };
        let count = episodes.len() as u64;
        let grown = played(model, tokenizer, agent, episodes, &round_config, next_id, device)?;
        next_id += count;
        for ((p, branch), (episode, forks)) in starts.into_iter().zip(grown) {
            trees[p].push(Leaf {
                episode,
                branch: Some(branch),
                forks,
            });
        }
    }
    let mut grown = Grown {
        leaves: Vec::new(),
        branches: Vec::new(),
        fallback_branch_points: fallback,
    };
    for leaf in trees.into_iter().flatten() {
        grown.leaves.push(leaf.episode);
        grown.branches.push(leaf.branch);
    }
    Ok(grown)
}

/// Plays `episodes` to their end, each with the forks of the turns it played.
fn played<B: ReinBackend>(
    model: &CausalLm<B>,
    tokenizer: &LmTokenizer,
    agent: &mut Agent,
    mut episodes: Vec<Episode>,
    config: &GenerationConfig,
    first_id: u64,
    device: &B::Device,
) -> Result<Vec<(Episode, Vec<Fork>)>, LmError> {
    let mut forks = vec![Vec::new(); episodes.len()];
    run(
        model,
        tokenizer,
        agent,
        &mut episodes,
        config,
        first_id,
        device,
        Some(&mut forks),
    )?;
    Ok(episodes.into_iter().zip(forks).collect())
}

/// This round's branch points of one tree: `Some((leaf, fork))`, or `None` for a new episode
/// from the opening where the tree has no fork left; the second value counts those. Forks are
/// taken by the entropy of the model's first token after them, highest first (forks without
/// one last); ties by leaf, then by fork.
fn choose(leaves: &[Leaf], branch_points: usize) -> (Vec<Option<(usize, usize)>>, usize) {
    let taken: Vec<(usize, usize)> = (leaves.iter())
        .filter_map(|l| l.branch)
        .map(|b| (b.parent, b.at))
        .collect();
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for (i, leaf) in leaves.iter().enumerate() {
        candidates.extend(
            (0..leaf.forks.len())
                .filter(|&f| !taken.contains(&(i, leaf.forks[f].episode.used())))
                .map(|f| (i, f)),
        );
    }
    let entropy = |&(i, f): &(usize, usize)| leaves[i].forks[f].entropy.unwrap_or(f32::NEG_INFINITY);
    candidates.sort_by(|a, b| entropy(b).total_cmp(&entropy(a)).then(a.cmp(b)));
    let mut points: Vec<Option<(usize, usize)>> = candidates.into_iter().take(branch_points).map(Some).collect();
    let missing = branch_points - points.len();
    points.extend(std::iter::repeat_n(None, missing));
    (points, missing)
}

#[cfg(test)]
mod tests {
    use rein_model::lm::ChatMessage;

    use super::*;
    use crate::rollout::transcript::Transcript;

    fn tokenizer() -> LmTokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/assets/arithmetic-tokenizer");
        LmTokenizer::load(&dir, &[]).unwrap()
    }

    /// An episode of `turns` model turns, each of `length` tokens and answered by a tool.
    fn called(tokenizer: &LmTokenizer, turns: usize, length: usize) -> Episode {
        let user = ChatMessage {
            role: "user".into(),
            content: "What is 12 * 34?".into(),
        };
        let mut episode = Episode::opened(Transcript::open(tokenizer, vec![user], Vec::new()).unwrap(), Vec::new());
        for _ in 0..turns {
            let ids = vec![40; length];
            episode
                .transcript
                .push_model_turn(tokenizer, &ids, &vec![0.0; length])
                .unwrap();
            let tool = ChatMessage {
                role: "tool".into(),
                content: "408".into(),
            };
            episode.transcript.push_env_messages(tokenizer, vec![tool]).unwrap();
        }
        episode
    }

    fn fork(episode: &Episode, entropy: Option<f32>) -> Fork {
        Fork {
            episode: episode.clone(),
            entropy,
        }
    }

    /// Forks are taken by the entropy after them, highest first and those without one last,
    /// never one a branch was already taken from; a tree short of forks starts new episodes from
    /// the opening, counted.
    #[test]
    fn forks_are_taken_by_entropy_once_each_then_the_opening() {
        let tokenizer = tokenizer();
        let (one, two) = (called(&tokenizer, 1, 3), called(&tokenizer, 2, 3));
        let leaf = |forks: Vec<Fork>, branch: Option<Branch>| Leaf {
            episode: two.clone(),
            branch,
            forks,
        };
        let leaves = [
            leaf(vec![fork(&one, Some(0.5)), fork(&two, Some(2.0))], None),
            leaf(vec![fork(&one, None)], None),
            // Branched from leaf 0's first fork; its own fork after its second call.
            leaf(
                vec![fork(&two, Some(1.0))],
                Some(Branch {
                    parent: 0,
                    at: one.used(),
                }),
            ),
        ];
        assert_eq!(choose(&leaves, 3), (vec![Some((0, 1)), Some((2, 0)), Some((1, 0))], 0));
        assert_eq!(choose(&leaves, 2), (vec![Some((0, 1)), Some((2, 0))], 0));
        let (points, missing) = choose(&leaves, 5);
        assert_eq!((&points[3..], missing), (&[None, None][..], 2));
        // A tree that called no tool: every branch point is a new episode.
        assert_eq!(choose(&[leaf(Vec::new(), None)], 2), (vec![None, None], 2));
    }
}
