//! The vocabulary as bytes, for constrained decoding: each token's bytes, and a trie of them
//! so that a mask feeds every shared prefix to the recognizer once instead of once per token.

use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::sync::OnceLock;

/// Every token's bytes, as the recognizer reads them; `None` for special tokens (never
/// allowed inside a constrained output) and tokens without bytes.
pub struct TokenTable {
    bytes: Vec<Option<Box<[u8]>>>,
    /// Built on the first mask.
    trie: OnceLock<Trie>,
}

impl TokenTable {
    pub fn new(tok: &Tokenizer) -> TokenTable {
        let bytes = (0..tok.vocab_size() as u32)
            .map(|id| {
                if tok.is_special(id) {
                    return None;
                }
                tok.token_bytes(id)
                    .filter(|b| !b.is_empty())
                    .map(Vec::into_boxed_slice)
            })
            .collect();
        TokenTable {
            bytes,
            trie: OnceLock::new(),
        }
    }

    /// A table from explicit token bytes (tests, synthetic vocabularies).
    pub fn from_bytes(bytes: Vec<Option<Vec<u8>>>) -> TokenTable {
        TokenTable {
            bytes: bytes
                .into_iter()
                .map(|b| b.filter(|b| !b.is_empty()).map(Vec::into_boxed_slice))
                .collect(),
            trie: OnceLock::new(),
        }
    }

    pub fn get(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).and_then(|b| b.as_deref())
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(crate) fn trie(&self) -> &Trie {
        self.trie.get_or_init(|| Trie::build(&self.bytes))
    }
}

/// One trie node: the byte that leads to it, its children (contiguous) and the tokens whose
/// bytes end here (a range of `Trie::ids`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) byte: u8,
    first_child: u32,
    children: u32,
    first_id: u32,
    ids: u32,
}

/// The tokens' bytes as a trie; node 0 is the root (the empty prefix).
pub(crate) struct Trie {
    nodes: Vec<Node>,
    ids: Vec<u32>,
}

impl Trie {
    fn build(bytes: &[Option<Box<[u8]>>]) -> Trie {
        let mut toks: Vec<(&[u8], u32)> = bytes
            .iter()
            .enumerate()
            .filter_map(|(id, b)| b.as_deref().map(|b| (b, id as u32)))
            .collect();
        toks.sort_unstable();
        let root = Node {
            byte: 0,
            first_child: 0,
            children: 0,
            first_id: 0,
            ids: 0,
        };
        let mut nodes = vec![root];
        // Breadth first, so each node's children are made together (contiguous).
        let mut queue = VecDeque::from([(0usize, 0..toks.len(), 0usize)]);
        while let Some((n, range, depth)) = queue.pop_front() {
            // Sorted: the tokens that end at this depth come first.
            let mut i = range.start;
            while i < range.end && toks[i].0.len() == depth {
                i += 1;
            }
            nodes[n].first_id = range.start as u32;
            nodes[n].ids = (i - range.start) as u32;
            nodes[n].first_child = nodes.len() as u32;
            while i < range.end {
                let b = toks[i].0[depth];
                let mut j = i;
                while j < range.end && toks[j].0[depth] == b {
                    j += 1;
                }
                nodes.push(Node { byte: b, ..root });
                queue.push_back((nodes.len() - 1, i..j, depth + 1));
                i = j;
            }
            nodes[n].children = nodes.len() as u32 - nodes[n].first_child;
        }
        Trie {
            nodes,
            ids: toks.iter().map(|&(_, id)| id).collect(),
        }
    }

    pub(crate) fn root(&self) -> u32 {
        0
    }

    pub(crate) fn node(&self, n: u32) -> Node {
        self.nodes[n as usize]
    }

    /// The children of node `n`, by index.
    pub(crate) fn children(&self, n: u32) -> std::ops::Range<u32> {
        let node = self.nodes[n as usize];
        node.first_child..node.first_child + node.children
    }

    /// The tokens whose bytes end at node `n`.
    pub(crate) fn tokens(&self, n: u32) -> &[u32] {
        let node = self.nodes[n as usize];
        &self.ids[node.first_id as usize..(node.first_id + node.ids) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::TokenTable;

    #[test]
    fn the_trie_holds_every_token_once_under_its_bytes() {
        let words: [&[u8]; 7] = [b"ab", b"a", b"abc", b"b", b"", b"ab", b"\xff"];
        let t = TokenTable::from_bytes(words.iter().map(|w| Some(w.to_vec())).collect());
        let trie = t.trie();
        // Walk every path and collect (bytes, token).
        let mut found = Vec::new();
        let mut stack = vec![(trie.root(), Vec::new())];
        while let Some((n, path)) = stack.pop() {
            for &id in trie.tokens(n) {
                found.push((path.clone(), id));
            }
            for c in trie.children(n) {
                let mut p = path.clone();
                p.push(trie.node(c).byte);
                stack.push((c, p));
            }
        }
        found.sort();
        let mut want: Vec<(Vec<u8>, u32)> = words
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.is_empty())
            .map(|(i, w)| (w.to_vec(), i as u32))
            .collect();
        want.sort();
        assert_eq!(found, want);
        assert!(trie.tokens(trie.root()).is_empty(), "no empty token");
    }
}
