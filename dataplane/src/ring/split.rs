//! Chunk arithmetic: how a buffer is cut into one chunk per rank and each
//! chunk into segments, contiguous and in order, lengths differing by at
//! most one.

/// `len` elements cut into `parts` contiguous parts whose lengths differ by
/// at most one (the first `len % parts` are one longer).
#[derive(Debug, Clone, Copy)]
pub struct Split {
    len: usize,
    parts: usize,
}

impl Split {
    /// The split of `len` into `parts` (at least one).
    pub fn new(len: usize, parts: usize) -> Split {
        Split {
            len,
            parts: parts.max(1),
        }
    }

    /// Start and length of part `i`.
    pub fn part(&self, i: usize) -> (usize, usize) {
        let (q, r) = (self.len / self.parts, self.len % self.parts);
        (i * q + i.min(r), q + usize::from(i < r))
    }

    /// The longest part.
    pub fn max_len(&self) -> usize {
        self.len.div_ceil(self.parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_split_covers_its_range_in_order(len in 0usize..10_000, parts in 1usize..64) {
            let s = Split::new(len, parts);
            let mut at = 0;
            for i in 0..parts {
                let (o, l) = s.part(i);
                prop_assert_eq!(o, at);
                prop_assert!(l == len / parts || l == len / parts + 1);
                prop_assert!(l <= s.max_len());
                at += l;
            }
            prop_assert_eq!(at, len);
        }
    }
}
