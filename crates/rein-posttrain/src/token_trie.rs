//! [`TokenTrie`]: a prefix tree over token sequences, laid out as packed segments so that what
//! several sequences share is computed once.

use std::collections::HashMap;

use rein_model::PackedSequences;

/// A prefix tree over token sequences: node `i` holds one token at depth `depth[i]` (0 for a
/// sequence's first), its children in the order they first appeared.
#[derive(Debug, Default)]
pub(crate) struct TokenTrie {
    tokens: Vec<i64>,
    depth: Vec<usize>,
    children: Vec<Vec<usize>>,
    roots: Vec<usize>,
    /// `(parent + 1, or 0 for a root; token)` → node.
    index: HashMap<(usize, i64), usize>,
}

impl TokenTrie {
    /// Adds `sequence`, returning the node of each of its tokens.
    pub(crate) fn insert(&mut self, sequence: &[i64]) -> Vec<usize> {
        let mut parent: Option<usize> = None;
        let mut path = Vec::with_capacity(sequence.len());
        for &token in sequence {
            let key = (parent.map_or(0, |p| p + 1), token);
            let node = match self.index.get(&key) {
                Some(&node) => node,
                None => {
                    let node = self.tokens.len();
                    self.tokens.push(token);
                    self.depth.push(path.len());
                    self.children.push(Vec::new());
                    match parent {
                        Some(p) => self.children[p].push(node),
                        None => self.roots.push(node),
                    }
                    self.index.insert(key, node);
                    node
                }
            };
            path.push(node);
            parent = Some(node);
        }
        path
    }

    /// Node `node`'s token and its depth.
    pub(crate) fn token(&self, node: usize) -> (i64, usize) {
        (self.tokens[node], self.depth[node])
    }

    /// The nodes in depth-first order, each run of nodes without a fork one segment: a root
    /// starts a segment continuing `parent` (the prompt's), as does each child of a node with
    /// several; an only child extends its parent's. The segments are appended to `segments`.
    pub(crate) fn pack(&self, parent: usize, segments: &mut Segments) -> Vec<usize> {
        let mut order = Vec::with_capacity(self.tokens.len());
        let mut segment_of = vec![0; self.tokens.len()];
        let mut stack: Vec<(usize, Option<usize>)> = self.roots.iter().rev().map(|&r| (r, None)).collect();
        while let Some((node, above)) = stack.pop() {
            segment_of[node] = match above {
                // Visited right after its parent (depth first), so its parent's segment is the last.
                Some(p) if self.children[p].len() == 1 => segments.extend_last(),
                Some(p) => segments.push(1, Some(segment_of[p])),
                None => segments.push(1, Some(parent)),
            };
            order.push(node);
            stack.extend(self.children[node].iter().rev().map(|&c| (c, Some(node))));
        }
        order
    }
}

/// Packed segments' lengths and parents, in the order they are laid out.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    lengths: Vec<usize>,
    parents: Vec<Option<usize>>,
}

impl Segments {
    /// Appends a segment of `len` tokens continuing `parent`; returns its index.
    pub(crate) fn push(&mut self, len: usize, parent: Option<usize>) -> usize {
        self.lengths.push(len);
        self.parents.push(parent);
        self.lengths.len() - 1
    }

    /// One more token in the last segment; returns its index.
    fn extend_last(&mut self) -> usize {
        let last = self.lengths.len() - 1;
        self.lengths[last] += 1;
        last
    }

    /// The segments as [`PackedSequences`].
    ///
    /// # Panics
    /// When a segment is empty or its parent is not an earlier segment of its tree (packing
    /// never lays them out so).
    pub(crate) fn into_sequences(self) -> PackedSequences {
        PackedSequences::tree(self.lengths, self.parents).expect("packed rows form valid trees")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_runs_are_one_segment_and_forks_start_new_ones() {
        let mut trie = TokenTrie::default();
        // 8 9 10 and 8 12 13 share 8; 8 9 10 11 continues the first; 14 is a root of its own.
        let paths = [
            trie.insert(&[8, 9, 10]),
            trie.insert(&[8, 12, 13]),
            trie.insert(&[8, 9, 10, 11]),
            trie.insert(&[14]),
        ];
        assert_eq!(paths[2][..3], paths[0][..]);
        assert_eq!(paths[1][0], paths[0][0]);
        let mut segments = Segments::default();
        let prompt = segments.push(3, None);
        let order = trie.pack(prompt, &mut segments);
        let tokens: Vec<i64> = order.iter().map(|&n| trie.token(n).0).collect();
        assert_eq!(tokens, [8, 9, 10, 11, 12, 13, 14]);
        let depths: Vec<usize> = order.iter().map(|&n| trie.token(n).1).collect();
        assert_eq!(depths, [0, 1, 2, 3, 1, 2, 0]);
        // The prompt; 8 (it forks); 9 10 11; 12 13, both continuing 8; 14 continuing the prompt.
        let expected =
            PackedSequences::tree(vec![3, 1, 3, 2, 1], vec![None, Some(0), Some(1), Some(1), Some(0)]).unwrap();
        assert_eq!(segments.into_sequences(), expected);
    }
}
