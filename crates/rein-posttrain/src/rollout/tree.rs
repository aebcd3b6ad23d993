//! Tree rollouts (TreeRL's EPTree, Tree-GRPO): a group grown as a tree (multi-turn episodes
//! branch after tool calls instead: [`crate::rollout::episode_tree`]). Each prompt's `trunks`
//! whole completions come first; each round then picks `branch_points` tokens among the tree's
//! leaves by the rule and samples `branches` continuations from each — a branch keeps its
//! parent's tokens before the branch point and draws its own from there, the token at the point
//! included. The leaves are the group.
//!
//! A branch is sampled as a continuation of the prompt and its parent's tokens before the point:
//! its prefill recomputes them (once per branch point, shared by its branches; no cache is
//! copied), and its tokens come from the policy exactly as a whole completion's would. Training
//! packs the tree back into one copy of each shared run of tokens ([`crate::TokenBatch`]).

use std::sync::Arc;

use rein_model::ReinBackend;
use rein_model::lm::LmTokenizer;
use rein_model::vision::ProcessedImage;
use rein_optim::Branch;
use rein_recipe::{BranchRule, RolloutSection};
use rein_sampler::{FinishReason, Generation, GenerationConfig, Generator, GeneratorError};

/// What a job grows its groups as trees with.
#[derive(Debug, Clone)]
pub struct TreeJob {
    /// The tree's settings.
    pub rollout: RolloutSection,
    /// `rule = "lines"`: per token id, whether its text ends a line (the rule branches after
    /// those); empty for the other rules.
    pub line_ends: Arc<Vec<bool>>,
}

impl TreeJob {
    /// The job for `rollout`'s trees; `rule = "lines"` decodes `tokenizer`'s vocabulary once
    /// for the tokens that end a line.
    pub fn new(rollout: RolloutSection, tokenizer: &LmTokenizer) -> Self {
        let line_ends = match rollout.rule {
            BranchRule::Lines => (0..tokenizer.vocab_size() as u32)
                .map(|id| tokenizer.decode(&[id], false).is_ok_and(|text| text.contains('\n')))
                .collect(),
            BranchRule::Entropy | BranchRule::Interval | BranchRule::ToolCalls => Vec::new(),
        };
        Self {
            rollout,
            line_ends: Arc::new(line_ends),
        }
    }
}

/// A job's groups: [`RolloutSection::leaves`] per prompt, in prompt order, and where each leaf
/// branched from. Leaves are completions ([`Generation`]) or, grown by
/// [`crate::rollout::episode_tree`], multi-turn episodes.
pub struct Grown<L = Generation> {
    /// The leaves, each group's in order.
    pub leaves: Vec<L>,
    /// Per leaf, the leaf of its group it branched from (`None`: a trunk), `at` counting the
    /// completion's tokens (an episode's after its opening) it shares with it; empty for groups
    /// sampled on their own.
    pub branches: Vec<Option<Branch>>,
    /// Branch points the rule could not find and that were taken elsewhere: the remaining
    /// tokens of highest entropy, or for episodes, new episodes from the opening.
    pub fallback_branch_points: usize,
}

/// One leaf of a growing tree.
struct Leaf {
    generation: Generation,
    branch: Option<Branch>,
}

/// Grows a tree of [`RolloutSection::leaves`] completions for each of `prompts` on `generator`.
pub fn grow<B: ReinBackend>(
    generator: &mut dyn Generator<B>,
    prompts: &[Vec<u32>],
    images: &[&[ProcessedImage]],
    config: &GenerationConfig,
    stops: &[String],
    tree: &TreeJob,
) -> Result<Grown, GeneratorError> {
    let spec = tree.rollout;
    let entropy = spec.rule != BranchRule::Interval;
    let trunk_config = GenerationConfig {
        n: spec.trunks,
        // The entropy of each sampled token's distribution: the `entropy` rule's signal, and
        // `lines`' choice among line starts.
        certainty: config.certainty || entropy,
        ..config.clone()
    };
    let mut trees: Vec<Vec<Leaf>> = (0..prompts.len()).map(|_| Vec::new()).collect();
    for generation in generator.generate_with_images(prompts, images, &trunk_config, stops)? {
        trees[generation.prompt].push(Leaf {
            generation,
            branch: None,
        });
    }
    let mut fallback = 0;
    for round in 0..spec.rounds {
        // Every prompt's branch points, each a prompt of its own: the prompt and the parent's
        // tokens before the point.
        let mut forks = Vec::new();
        for (p, leaves) in trees.iter().enumerate() {
            let (points, missing) = choose(leaves, &spec, &tree.line_ends);
            fallback += missing;
            forks.extend(points.into_iter().map(|(parent, at)| (p, parent, at)));
        }
        let fork_prompts: Vec<Vec<u32>> = (forks.iter())
            .map(|&(p, parent, at)| [&prompts[p][..], &trees[p][parent].generation.tokens[..at]].concat())
            .collect();
        // A prompt's images are its branches' too (none given, none passed).
        let fork_images: Vec<&[ProcessedImage]> = match images.is_empty() {
            true => Vec::new(),
            false => forks.iter().map(|&(p, ..)| images[p]).collect(),
        };
        let shortest_prefix = forks.iter().map(|&(.., at)| at).min().unwrap_or(0);
        let branch_config = GenerationConfig {
            n: spec.branches,
            // Each branch is cut to the tokens its prefix leaves it.
            max_new_tokens: config.max_new_tokens - shortest_prefix,
            seed: round_seed(config.seed, round),
            ..trunk_config.clone()
        };
        let branches = generator.generate_with_images(&fork_prompts, &fork_images, &branch_config, stops)?;
        for branch in branches {
            let (p, parent, at) = forks[branch.prompt];
            let generation = joined(&trees[p][parent].generation, at, branch, config.max_new_tokens);
            trees[p].push(Leaf {
                generation,
                branch: Some(Branch { parent, at }),
            });
        }
    }
    let mut grown = Grown {
        leaves: Vec::new(),
        branches: Vec::new(),
        fallback_branch_points: fallback,
    };
    for (p, leaves) in trees.into_iter().enumerate() {
        for (sample, leaf) in leaves.into_iter().enumerate() {
            grown.leaves.push(Generation {
                prompt: p,
                sample,
                ..leaf.generation
            });
            grown.branches.push(leaf.branch);
        }
    }
    Ok(grown)
}

/// The sampler's seed for the branches of round `round`: their own streams, apart from the
/// trunks' and every other round's.
pub(crate) fn round_seed(seed: u64, round: usize) -> u64 {
    seed ^ ((round as u64 + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// The leaf a branch makes: its parent's first `at` tokens and the branch's own, at most
/// `max_new_tokens` in all (a longer branch is cut, and ends by length).
fn joined(parent: &Generation, at: usize, branch: Generation, max_new_tokens: usize) -> Generation {
    let keep = branch.tokens.len().min(max_new_tokens - at);
    let cut = keep < branch.tokens.len();
    // Per-token values the sampler records only when asked (top log-probabilities,
    // certainty): joined when both sides have them.
    fn asked<T: Clone>(parent: &[T], at: usize, branch: &[T], keep: usize) -> Vec<T> {
        match parent.is_empty() || branch.is_empty() {
            true => Vec::new(),
            false => [&parent[..at], &branch[..keep]].concat(),
        }
    }
    Generation {
        prompt: branch.prompt,
        sample: branch.sample,
        tokens: [&parent.tokens[..at], &branch.tokens[..keep]].concat(),
        logprobs: [&parent.logprobs[..at], &branch.logprobs[..keep]].concat(),
        top_logprobs: asked(&parent.top_logprobs, at, &branch.top_logprobs, keep),
        certainty: asked(&parent.certainty, at, &branch.certainty, keep),
        finish: if cut { FinishReason::Length } else { branch.finish },
        // The branch's routing covers the parent's tokens as its prompt: not one record.
        routes: None,
    }
}

/// This round's branch points of one tree, `(leaf, at)`: the branch keeps leaf `leaf`'s first
/// `at` tokens (at least one) and samples its own from there. Only tokens a leaf sampled itself
/// are candidates (a branch's copy of its parent's tokens is the parent's), and none already
/// branched from. `entropy`: the candidates of highest entropy. `interval`: positions `k·interval`,
/// spread over the candidates. `lines`: the first tokens of lines, by entropy. When the rule
/// finds fewer than `branch_points`, the rest are the remaining candidates of highest entropy
/// (or spread, without entropies), counted as the second value; a tree with no candidate at all
/// branches from the prompt (`at = 0`).
fn choose(leaves: &[Leaf], spec: &RolloutSection, line_ends: &[bool]) -> (Vec<(usize, usize)>, usize) {
    let taken: Vec<(usize, usize)> = (leaves.iter())
        .filter_map(|l| l.branch.map(|b| (b.parent, b.at)))
        .collect();
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for (i, leaf) in leaves.iter().enumerate() {
        let own = leaf.branch.map_or(1, |b| b.at.max(1));
        candidates.extend(
            (own..leaf.generation.tokens.len())
                .map(|t| (i, t))
                .filter(|c| !taken.contains(c)),
        );
    }
    let entropy = |&(i, t): &(usize, usize)| leaves[i].generation.certainty.get(t).map(|c| c.entropy);
    let by_entropy = |mut picks: Vec<(usize, usize)>| {
        // Highest first; ties and missing entropies by position.
        picks.sort_by(|a, b| {
            let (ea, eb) = (
                entropy(a).unwrap_or(f32::NEG_INFINITY),
                entropy(b).unwrap_or(f32::NEG_INFINITY),
            );
            eb.total_cmp(&ea).then(a.cmp(b))
        });
        picks
    };
    let ruled: Vec<(usize, usize)> = match spec.rule {
        BranchRule::Entropy => by_entropy(candidates.clone()),
        BranchRule::Interval => spread(
            candidates
                .iter()
                .copied()
                .filter(|&(_, t)| t % spec.interval == 0)
                .collect(),
            spec.branch_points,
        ),
        BranchRule::Lines => by_entropy(
            (candidates.iter().copied())
                .filter(|&(i, t)| {
                    line_ends
                        .get(leaves[i].generation.tokens[t - 1] as usize)
                        .copied()
                        .unwrap_or(false)
                })
                .collect(),
        ),
        // Single-turn completions call no tools (the recipe pairs this rule with [agent]).
        BranchRule::ToolCalls => Vec::new(),
    };
    let mut points: Vec<(usize, usize)> = ruled.into_iter().take(spec.branch_points).collect();
    let missing = spec.branch_points - points.len();
    if missing > 0 {
        let rest: Vec<(usize, usize)> = candidates.into_iter().filter(|c| !points.contains(c)).collect();
        let rest = match rest.iter().any(|c| entropy(c).is_some()) {
            true => by_entropy(rest),
            false => spread(rest, missing),
        };
        points.extend(rest.into_iter().take(missing));
        // Nothing left to branch from: new samples of the prompt.
        points.extend(std::iter::repeat_n((0, 0), spec.branch_points - points.len()));
    }
    (points, missing)
}

/// `count` of `candidates` spread evenly over them (sorted by position, then leaf).
fn spread(mut candidates: Vec<(usize, usize)>, count: usize) -> Vec<(usize, usize)> {
    candidates.sort_by_key(|&(leaf, t)| (t, leaf));
    if candidates.len() <= count {
        return candidates;
    }
    (0..count).map(|k| candidates[k * candidates.len() / count]).collect()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use rein_model::lm::CausalLm;
    use rein_sampler::TokenCertainty;

    use super::*;

    /// Up to 6 tokens per completion, from the prompt, the sample and the seed: token 1 (a line
    /// break) third; the entropy rises along the completion, highest at its fourth token.
    struct Scripted;

    impl Generator<Flex> for Scripted {
        fn generate(
            &mut self,
            prompts: &[Vec<u32>],
            config: &GenerationConfig,
            _: &[String],
        ) -> Result<Vec<Generation>, GeneratorError> {
            let mut out = Vec::new();
            for (prompt, tokens) in prompts.iter().enumerate() {
                let base = tokens.iter().sum::<u32>() + (config.seed % 5) as u32;
                for sample in 0..config.n {
                    let len = config.max_new_tokens.min(6);
                    let token = |k: usize| {
                        if k == 2 {
                            1
                        } else {
                            2 + (base + 7 * sample as u32 + 3 * k as u32) % 40
                        }
                    };
                    let entropy = |k: usize| k as f32 * 0.1 + if k == 3 { 1.0 } else { 0.0 };
                    out.push(Generation {
                        prompt,
                        sample,
                        tokens: (0..len).map(token).collect(),
                        logprobs: (0..len).map(|k| -(k as f32)).collect(),
                        top_logprobs: Vec::new(),
                        certainty: match config.certainty {
                            true => (0..len)
                                .map(|k| TokenCertainty {
                                    entropy: entropy(k),
                                    self_certainty: 0.0,
                                })
                                .collect(),
                            false => Vec::new(),
                        },
                        finish: FinishReason::Length,
                        routes: None,
                    });
                }
            }
            Ok(out)
        }

        fn update(&mut self, _: &CausalLm<Flex>, _: u64) -> Result<(), GeneratorError> {
            Ok(())
        }

        fn version(&self) -> u64 {
            0
        }

        fn describe(&self) -> String {
            "scripted".into()
        }
    }

    fn grown(rule: BranchRule, branch_points: usize, interval: usize) -> Grown {
        grown_in(rule, branch_points, interval, 2, 1)
    }

    fn grown_in(rule: BranchRule, branch_points: usize, interval: usize, trunks: usize, rounds: usize) -> Grown {
        let tree = TreeJob {
            rollout: RolloutSection {
                kind: rein_recipe::RolloutKind::Tree,
                trunks,
                branch_points,
                branches: 2,
                rounds,
                rule,
                interval,
                step_weight: 1.0,
            },
            line_ends: Arc::new((0..64).map(|id| id == 1).collect()),
        };
        let config = GenerationConfig {
            max_new_tokens: 6,
            seed: 3,
            ..GenerationConfig::default()
        };
        grow(&mut Scripted, &[vec![5, 6], vec![9]], &[], &config, &[], &tree).unwrap()
    }

    /// Each prompt's leaves: `(branch, tokens)`.
    fn trees(grown: &Grown) -> Vec<Vec<(Option<Branch>, Vec<u32>)>> {
        let mut trees = vec![Vec::new(), Vec::new()];
        for (g, &branch) in grown.leaves.iter().zip(&grown.branches) {
            assert_eq!(g.sample, trees[g.prompt].len(), "leaves in order");
            trees[g.prompt].push((branch, g.tokens.clone()));
        }
        trees
    }

    /// Every branch keeps its parent's tokens before its point and samples its own after.
    fn assert_branches_share_their_prefix(trees: &[Vec<(Option<Branch>, Vec<u32>)>]) {
        for leaves in trees {
            for (branch, tokens) in leaves {
                if let Some(Branch { parent, at }) = branch {
                    assert_eq!(tokens[..*at], leaves[*parent].1[..*at]);
                    // (One token may match by chance; the scripted sampler's runs of two or
                    // more do not.)
                    if tokens.len() > at + 1 {
                        assert_ne!(
                            tokens[*at..],
                            leaves[*parent].1[*at..],
                            "the branch sampled its own tokens"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn entropy_branches_from_the_least_sure_tokens() {
        let grown = grown(BranchRule::Entropy, 2, 4);
        let trees = trees(&grown);
        for leaves in &trees {
            assert_eq!(leaves.len(), 2 + 2 * 2);
            let branches: Vec<Option<Branch>> = leaves.iter().map(|(b, _)| *b).collect();
            // Both trunks are least sure at their fourth token (ties in leaf order).
            let expected = [None, None]
                .into_iter()
                .chain([(0, 3), (0, 3), (1, 3), (1, 3)].map(|(parent, at)| Some(Branch { parent, at })));
            assert_eq!(branches, expected.collect::<Vec<_>>());
            assert!(leaves.iter().all(|(_, tokens)| tokens.len() == 6));
        }
        assert_branches_share_their_prefix(&trees);
        assert_eq!(grown.fallback_branch_points, 0);
    }

    #[test]
    fn interval_branches_spread_over_multiples_of_the_interval() {
        let trees = trees(&grown(BranchRule::Interval, 2, 2));
        // Candidates (leaf, t): (0, 2), (1, 2), (0, 4), (1, 4); two spread over them.
        let points: Vec<(usize, usize)> = (trees[0].iter())
            .filter_map(|(b, _)| b.map(|b| (b.parent, b.at)))
            .collect();
        assert_eq!(points, [(0, 2), (0, 2), (0, 4), (0, 4)]);
        assert_branches_share_their_prefix(&trees);
    }

    #[test]
    fn lines_branch_after_line_breaks_and_count_what_they_could_not_find() {
        let grown = grown(BranchRule::Lines, 3, 4);
        let trees = trees(&grown);
        // Each trunk has one line start (after its third token); the third point is the rest's
        // least sure token, the sixth of leaf 0: its branches, sampled for 3 tokens beside the
        // others, are cut to the 1 token the budget of 6 leaves them.
        let points: Vec<(usize, usize)> = (trees[0].iter())
            .filter_map(|(b, _)| b.map(|b| (b.parent, b.at)))
            .collect();
        assert_eq!(points, [(0, 3), (0, 3), (1, 3), (1, 3), (0, 5), (0, 5)]);
        assert_eq!(grown.fallback_branch_points, 2, "one per prompt");
        let cut = &grown.leaves[6];
        assert_eq!((cut.tokens.len(), cut.finish), (6, FinishReason::Length));
        assert_branches_share_their_prefix(&trees);
    }

    #[test]
    fn a_second_round_branches_from_the_first_rounds_leaves_too() {
        // One trunk; round 1 branches twice from its token 4; round 2 from the first candidate
        // of the multiples of 4 left: a branch's own token 4 (the trunk's is taken).
        let grown = grown_in(BranchRule::Interval, 1, 4, 1, 2);
        let trees = trees(&grown);
        let branches: Vec<Option<Branch>> = trees[0].iter().map(|(b, _)| *b).collect();
        let at = |parent, at| Some(Branch { parent, at });
        assert_eq!(branches, [None, at(0, 4), at(0, 4), at(1, 4), at(1, 4)]);
        assert_branches_share_their_prefix(&trees);
        // Each round samples from its own seed: round 2's branches are not round 1's again.
        assert_ne!(trees[0][3].1, trees[0][1].1);
    }
}
