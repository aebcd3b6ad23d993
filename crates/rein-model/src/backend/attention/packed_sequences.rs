//! [`PackedSequences`]: how sequences lie end to end along the token axis of one packed batch
//! row, each whole or continuing another's tokens (a shared prefix, stored once).

use std::ops::Range;

/// Sequences concatenated end to end along the token axis of one batch row, as packed
/// attention reads them. Segment `i` holds the `lengths[i]` tokens after those of segments
/// `0..i`. A segment with a parent continues it: its tokens come after the parent's (and the
/// parent's ancestors') in its sequence, attend to them, and sit at positions after them. A
/// GRPO group's prompt is one segment and each completion a child of it, so the prompt's tokens
/// are computed once for the group: every root-to-leaf path attends as that sequence alone.
///
/// A segment's parent comes before it, in the same tree: a tree's segments are consecutive
/// (its root, then its descendants).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackedSequences {
    lengths: Vec<usize>,
    parents: Vec<Option<usize>>,
}

impl PackedSequences {
    /// Independent sequences of these lengths.
    pub fn new(lengths: Vec<usize>) -> Self {
        let parents = vec![None; lengths.len()];
        Self { lengths, parents }
    }

    /// Segments of these lengths, segment `i` continuing `parents[i]` where it has one.
    ///
    /// # Errors
    /// When the two lists differ in length, a segment is empty, or a parent does not come
    /// before its child in the child's tree.
    pub fn tree(lengths: Vec<usize>, parents: Vec<Option<usize>>) -> Result<Self, String> {
        if lengths.len() != parents.len() {
            return Err(format!(
                "{} segment lengths but {} parents",
                lengths.len(),
                parents.len()
            ));
        }
        if let Some(i) = lengths.iter().position(|&len| len == 0) {
            return Err(format!("segment {i} is empty"));
        }
        let mut root = 0;
        for (i, parent) in parents.iter().enumerate() {
            match *parent {
                None => root = i,
                Some(p) if (root..i).contains(&p) => {}
                Some(p) => {
                    return Err(format!(
                        "segment {i}'s parent {p} is not an earlier segment of its tree (segments {root}..{i})"
                    ));
                }
            }
        }
        Ok(Self { lengths, parents })
    }

    /// Each segment's token count.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Each segment's parent, if it continues one.
    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// Whether some segment continues another.
    pub fn shares_prefixes(&self) -> bool {
        self.parents.iter().any(Option::is_some)
    }

    /// The tokens of all segments.
    pub fn total(&self) -> usize {
        self.lengths.iter().sum()
    }

    /// Each segment's first token.
    pub fn starts(&self) -> Vec<usize> {
        self.lengths
            .iter()
            .scan(0, |start, &len| {
                *start += len;
                Some(*start - len)
            })
            .collect()
    }

    /// The packed rows segment `i`'s tokens follow in its sequence: its ancestors' tokens, the
    /// root's first (empty for a segment without a parent).
    pub fn prefix_rows(&self, i: usize, starts: &[usize]) -> Vec<usize> {
        let mut chain = Vec::new();
        let mut at = self.parents[i];
        while let Some(p) = at {
            chain.push(p);
            at = self.parents[p];
        }
        (chain.iter().rev())
            .flat_map(|&p| starts[p]..starts[p] + self.lengths[p])
            .collect()
    }

    /// The trees, as ranges of segments: a segment without a parent and the descendants after it.
    pub fn trees(&self) -> Vec<Range<usize>> {
        let mut trees: Vec<Range<usize>> = Vec::new();
        for (i, parent) in self.parents.iter().enumerate() {
            match (parent, trees.last_mut()) {
                (Some(_), Some(tree)) => tree.end = i + 1,
                _ => trees.push(i..i + 1),
            }
        }
        trees
    }

    /// The segments `range` (whole trees) as sequences of their own, parents renumbered.
    pub fn slice(&self, range: Range<usize>) -> Self {
        let first = range.start;
        Self {
            lengths: self.lengths[range.clone()].to_vec(),
            parents: self.parents[range].iter().map(|p| p.map(|p| p - first)).collect(),
        }
    }

    /// Each token's position in its sequence: the tokens of its ancestors come before it.
    pub fn positions(&self) -> Vec<usize> {
        let mut depth = vec![0; self.lengths.len()];
        let mut positions = Vec::with_capacity(self.total());
        for (i, &len) in self.lengths.iter().enumerate() {
            depth[i] = self.parents[i].map_or(0, |p| depth[p] + self.lengths[p]);
            positions.extend(depth[i]..depth[i] + len);
        }
        positions
    }
}

#[cfg(test)]
mod tests {
    use super::PackedSequences;

    #[test]
    fn a_prompt_and_its_completions_are_one_tree() {
        // A prompt of 3 tokens, completions of 2 and 1, a completion continuing the first, then
        // a sequence of its own.
        let packed = PackedSequences::tree(vec![3, 2, 1, 2, 4], vec![None, Some(0), Some(0), Some(1), None]).unwrap();
        assert_eq!(packed.starts(), [0, 3, 5, 6, 8]);
        assert_eq!(packed.trees(), [0..4, 4..5]);
        assert_eq!(packed.prefix_rows(3, &packed.starts()), [0, 1, 2, 3, 4]);
        assert_eq!(packed.prefix_rows(2, &packed.starts()), [0, 1, 2]);
        assert!(packed.prefix_rows(4, &packed.starts()).is_empty());
        assert_eq!(packed.positions(), [0, 1, 2, 3, 4, 3, 5, 6, 0, 1, 2, 3]);
        assert_eq!(packed.slice(4..5), PackedSequences::new(vec![4]));
        assert!(packed.shares_prefixes() && !PackedSequences::new(vec![2, 3]).shares_prefixes());
    }

    #[test]
    fn a_parent_outside_the_tree_or_after_its_child_is_refused() {
        let err = |lengths: Vec<usize>, parents| PackedSequences::tree(lengths, parents).unwrap_err();
        assert_eq!(
            err(vec![1, 1, 1], vec![None, None, Some(0)]),
            "segment 2's parent 0 is not an earlier segment of its tree (segments 1..2)"
        );
        assert!(err(vec![1, 1], vec![Some(1), None]).contains("segment 0's parent 1"));
        assert_eq!(err(vec![1, 0], vec![None, Some(0)]), "segment 1 is empty");
        assert_eq!(err(vec![1], vec![]), "1 segment lengths but 0 parents");
    }
}
