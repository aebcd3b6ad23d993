//! Step credit over a tree rollout (TreeRL, Hou et al. 2025; Tree-GRPO, Ji et al. 2025): a
//! group's leaves share the tokens before their branch points, and each token is credited with
//! how much better the leaves below it did than those of its whole tree.
//!
//! ```text
//! leaf i continues leaf parent(i) after its first at(i) tokens (a trunk has no parent)
//! V(i, t)   = mean reward of the leaves whose path passes through token t of leaf i
//!             (the leaf that sampled it, and every leaf that branched from it after t)
//! S(i, t)   = (V(i, t) − V(i, 0)) / scale            scale: the group's std + ε, the batch's, or 1
//!           = Σ over the branch points above t of (V(below) − V(above)) / scale
//! A(i, t)   = A_i + w · S(i, t)                       A_i: the leaf's outcome advantage (GRPO's)
//! ```
//!
//! A tree without branch points has `S = 0` everywhere: its advantages are GRPO's. `S` depends on
//! the tree, not on the order of its leaves or subtrees.

use rein_core::StdScaling;

use crate::group_advantages::{EPS, std};

/// Where a tree rollout's leaf came from: it continues leaf `parent` of its group, sharing the
/// parent's first `at` tokens and sampling its own from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// The leaf it branched from, an earlier one of its group.
    pub parent: usize,
    /// How many of the parent's tokens it shares.
    pub at: usize,
}

/// `S(i, t)` for every token of every leaf (see the module's formulas), the leaves in groups of
/// `group_size` laid out one after another: `rewards`, `branches` and `lengths` (each leaf's
/// tokens) per leaf, `branches[i]`'s parent counted within `i`'s group.
///
/// # Panics
/// When the lists differ in length, do not split into groups, or a branch's parent is not an
/// earlier leaf of its group whose tokens reach `at`.
pub fn tree_step_advantages(
    rewards: &[f32],
    group_size: usize,
    branches: &[Option<Branch>],
    lengths: &[usize],
    scaling: StdScaling,
) -> Vec<Vec<f32>> {
    assert!(
        rewards.len() == branches.len() && rewards.len() == lengths.len(),
        "{} rewards, {} branches, {} lengths",
        rewards.len(),
        branches.len(),
        lengths.len()
    );
    assert!(
        group_size > 0 && rewards.len().is_multiple_of(group_size),
        "{} leaves do not split into groups of {group_size}",
        rewards.len()
    );
    let batch_std = std(rewards);
    (rewards
        .chunks(group_size)
        .zip(branches.chunks(group_size))
        .zip(lengths.chunks(group_size)))
    .flat_map(|((rewards, branches), lengths)| {
        let scale = match scaling {
            StdScaling::Group => std(rewards) + EPS,
            StdScaling::Batch => batch_std + EPS,
            StdScaling::None => 1.0,
        };
        group_steps(&Tree::new(rewards, branches, lengths), scale)
    })
    .collect()
}

/// One group's leaves.
struct Tree<'a> {
    rewards: &'a [f32],
    branches: &'a [Option<Branch>],
    lengths: &'a [usize],
}

impl<'a> Tree<'a> {
    fn new(rewards: &'a [f32], branches: &'a [Option<Branch>], lengths: &'a [usize]) -> Self {
        for (leaf, branch) in branches.iter().enumerate() {
            if let Some(Branch { parent, at }) = *branch {
                assert!(
                    parent < leaf,
                    "leaf {leaf} branches from leaf {parent}, which is not before it"
                );
                assert!(
                    at <= lengths[parent] && at <= lengths[leaf],
                    "leaf {leaf} shares {at} tokens of leaf {parent} ({} tokens; its own {})",
                    lengths[parent],
                    lengths[leaf]
                );
            }
        }
        Self {
            rewards,
            branches,
            lengths,
        }
    }

    /// The leaf that sampled token `t` of leaf `leaf`'s path.
    fn owner(&self, mut leaf: usize, t: usize) -> usize {
        while let Some(Branch { parent, at }) = self.branches[leaf] {
            if t >= at {
                break;
            }
            leaf = parent;
        }
        leaf
    }

    /// `V(leaf, t)`: the mean reward of the leaves whose path passes through that token.
    fn value(&self, leaf: usize, t: usize) -> f64 {
        let owner = self.owner(leaf, t);
        let (mut sum, mut count) = (0.0, 0usize);
        for j in 0..self.rewards.len() {
            if self.lengths[j] > t && self.owner(j, t) == owner {
                sum += f64::from(self.rewards[j]);
                count += 1;
            }
        }
        sum / count as f64
    }
}

/// `S(i, t)` for each leaf of one group.
fn group_steps(tree: &Tree<'_>, scale: f64) -> Vec<Vec<f32>> {
    (0..tree.rewards.len())
        .map(|leaf| {
            if tree.lengths[leaf] == 0 {
                return Vec::new();
            }
            let trunk = tree.value(leaf, 0);
            (0..tree.lengths[leaf])
                .map(|t| ((tree.value(leaf, t) - trunk) / scale) as f32)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_branch_point_credits_the_side_that_did_better() {
        // Trunk A (reward 1), B branching from A after 2 tokens (0), trunk C (0).
        let branches = [None, Some(Branch { parent: 0, at: 2 }), None];
        let steps = tree_step_advantages(&[1.0, 0.0, 0.0], 3, &branches, &[4, 4, 3], StdScaling::None);
        // A and B share their first two tokens (value ½, as their tree's); after the branch
        // point A's side is worth 1 and B's 0.
        assert_eq!(
            steps,
            vec![vec![0.0, 0.0, 0.5, 0.5], vec![0.0, 0.0, -0.5, -0.5], vec![0.0; 3]]
        );
    }

    #[test]
    fn branches_of_branches_add_their_branch_points_steps() {
        // A (1); B from A after 1 (0); C from B after 3 (1), so tokens 1..3 of B are B's and C's.
        let branches = [
            None,
            Some(Branch { parent: 0, at: 1 }),
            Some(Branch { parent: 1, at: 3 }),
        ];
        let steps = tree_step_advantages(&[1.0, 0.0, 1.0], 3, &branches, &[4, 4, 5], StdScaling::None);
        let third = 2.0 / 3.0;
        // Tree value 2/3; A alone after its first token (1); B's and C's shared run ½; then B (0), C (1).
        let expected = [
            vec![0.0, 1.0 - third, 1.0 - third, 1.0 - third],
            vec![0.0, 0.5 - third, 0.5 - third, -third],
            vec![0.0, 0.5 - third, 0.5 - third, 1.0 - third, 1.0 - third],
        ];
        for (got, want) in steps.iter().zip(&expected) {
            for (g, w) in got.iter().zip(want) {
                assert!((f64::from(*g) - w).abs() < 1e-6, "{steps:?}");
            }
        }
    }

    /// A group of up to 6 leaves, each a trunk or a branch of an earlier leaf at some point.
    fn groups() -> impl Strategy<Value = (Vec<f32>, Vec<Option<Branch>>, Vec<usize>)> {
        proptest::collection::vec((0.0f32..1.0, 1usize..8, 0usize..6, 0usize..8), 1..7).prop_map(|leaves| {
            let lengths: Vec<usize> = leaves.iter().map(|&(_, len, _, _)| len).collect();
            let branches = (leaves.iter().enumerate())
                .map(|(i, &(_, _, parent, at))| {
                    (parent < i).then(|| Branch {
                        parent,
                        at: at.min(lengths[parent]).min(lengths[i]),
                    })
                })
                .collect();
            (leaves.iter().map(|&(r, ..)| r).collect(), branches, lengths)
        })
    }

    proptest! {
        /// One leaf per trunk: no branch point, so no step term, and the advantages are GRPO's.
        #[test]
        fn trunks_alone_get_no_step_term(
            rewards in proptest::collection::vec(0.0f32..1.0, 1..9),
            lengths in proptest::collection::vec(0usize..6, 8),
        ) {
            let n = rewards.len();
            let steps = tree_step_advantages(&rewards, n, &vec![None; n], &lengths[..n], StdScaling::Group);
            prop_assert!(steps.iter().flatten().all(|&s| s == 0.0));
        }

        /// Reversing the order of the leaves (a different order of siblings and subtrees,
        /// parents renumbered and each leaf still after its parent once the tree is relaid out)
        /// leaves every leaf's step terms as they were.
        #[test]
        fn the_order_of_leaves_changes_nothing((rewards, branches, lengths) in groups()) {
            let n = rewards.len();
            let steps = tree_step_advantages(&rewards, n, &branches, &lengths, StdScaling::Group);
            // Lay the leaves out again depth first with children in reverse order: a valid
            // order (parents first) that swaps every set of siblings.
            let mut order = Vec::new();
            let mut stack: Vec<usize> = (0..n).filter(|&i| branches[i].is_none()).collect();
            while let Some(leaf) = stack.pop() {
                order.push(leaf);
                stack.extend((0..n).filter(|&j| branches[j].is_some_and(|b| b.parent == leaf)));
            }
            let position: Vec<usize> = (0..n).map(|leaf| order.iter().position(|&o| o == leaf).unwrap()).collect();
            let relaid: Vec<Option<Branch>> = (order.iter())
                .map(|&leaf| branches[leaf].map(|b| Branch { parent: position[b.parent], ..b }))
                .collect();
            let pick = |values: &[usize]| order.iter().map(|&leaf| values[leaf]).collect::<Vec<_>>();
            let rewards2: Vec<f32> = order.iter().map(|&leaf| rewards[leaf]).collect();
            let steps2 = tree_step_advantages(&rewards2, n, &relaid, &pick(&lengths), StdScaling::Group);
            for (leaf, &at) in position.iter().enumerate() {
                prop_assert_eq!(&steps[leaf], &steps2[at], "leaf {}", leaf);
            }
        }

        /// The terms compare leaves' rewards with each other: a shift of every reward changes
        /// none, and when every leaf did the same every term is 0.
        #[test]
        fn only_differences_in_reward_count((rewards, branches, lengths) in groups(), shift in -3.0f32..3.0) {
            let n = rewards.len();
            let steps = tree_step_advantages(&rewards, n, &branches, &lengths, StdScaling::None);
            let shifted: Vec<f32> = rewards.iter().map(|r| r + shift).collect();
            let steps2 = tree_step_advantages(&shifted, n, &branches, &lengths, StdScaling::None);
            for (a, b) in steps.iter().flatten().zip(steps2.iter().flatten()) {
                prop_assert!((a - b).abs() < 1e-5, "{} vs {}", a, b);
            }
            let same = tree_step_advantages(&vec![0.5; n], n, &branches, &lengths, StdScaling::None);
            prop_assert!(same.iter().flatten().all(|&s| s == 0.0));
        }
    }
}
