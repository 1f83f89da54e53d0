//! A recognizer stack that lives inline up to a few positions: copying a state (which a mask
//! does for every prefix it tries) then costs a copy of bytes, not an allocation per stack.

use super::Pos;
use std::cmp::Ordering;

/// Positions held inline; deeper stacks move to the heap.
const INLINE: usize = 6;

#[derive(Clone)]
pub(super) enum Stack {
    Inline { len: u8, items: [Pos; INLINE] },
    Heap(Vec<Pos>),
}

const NONE: Pos = Pos {
    rule: 0,
    alt: 0,
    idx: 0,
};

impl Stack {
    pub(super) fn one(p: Pos) -> Stack {
        let mut items = [NONE; INLINE];
        items[0] = p;
        Stack::Inline { len: 1, items }
    }

    pub(super) fn as_slice(&self) -> &[Pos] {
        match self {
            Stack::Inline { len, items } => &items[..*len as usize],
            Stack::Heap(v) => v,
        }
    }

    pub(super) fn last(&self) -> Option<Pos> {
        self.as_slice().last().copied()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub(super) fn pop(&mut self) -> Option<Pos> {
        match self {
            Stack::Inline { len, items } => {
                let n = len.checked_sub(1)?;
                *len = n;
                Some(items[n as usize])
            }
            Stack::Heap(v) => v.pop(),
        }
    }

    pub(super) fn push(&mut self, p: Pos) {
        match self {
            Stack::Inline { len, items } if (*len as usize) < INLINE => {
                items[*len as usize] = p;
                *len += 1;
            }
            Stack::Inline { len, items } => {
                let mut v = items[..*len as usize].to_vec();
                v.push(p);
                *self = Stack::Heap(v);
            }
            Stack::Heap(v) => v.push(p),
        }
    }
}

// Equal stacks are equal however they are stored.
impl PartialEq for Stack {
    fn eq(&self, other: &Stack) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Stack {}

impl PartialOrd for Stack {
    fn partial_cmp(&self, other: &Stack) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Stack {
    fn cmp(&self, other: &Stack) -> Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl std::hash::Hash for Stack {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h);
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{Pos, Stack, INLINE};

    fn pos(i: u32) -> Pos {
        Pos {
            rule: i,
            alt: i % 3,
            idx: i / 2,
        }
    }

    #[test]
    fn a_stack_moves_to_the_heap_when_deep_and_compares_by_content() {
        let mut s = Stack::one(pos(0));
        let mut want = vec![pos(0)];
        for i in 1..(2 * INLINE as u32) {
            s.push(pos(i));
            want.push(pos(i));
            assert_eq!(s.as_slice(), want.as_slice());
        }
        assert!(matches!(s, Stack::Heap(_)));
        // The same content inline compares equal.
        let mut inline = Stack::one(pos(0));
        while s.len() > 1 {
            assert_eq!(s.pop(), want.pop());
        }
        assert_eq!(s, inline);
        assert_eq!(inline.pop(), Some(pos(0)));
        assert_eq!(inline.pop(), None);
        assert!(inline.is_empty() && inline < s);
    }
}
