//! A run of sequence positions: what every module names a chunk, a block's side or a shard by
//! (a leaf, so `mask` builds on it beside the other shapes).

/// A run of consecutive sequence positions `[start, start + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
}

impl Span {
    pub fn end(&self) -> usize {
        self.start + self.len
    }

    /// The positions `[start, end)`, empty (at `start`) when `end ≤ start`.
    pub fn between(start: usize, end: usize) -> Span {
        Span {
            start,
            len: end.saturating_sub(start),
        }
    }

    /// The positions of `self` inside `within`, counted from `within.start` (a block's local
    /// column indices); empty when they do not meet.
    pub fn relative_to(&self, within: Span) -> Span {
        let start = self.start.max(within.start);
        let end = self.end().min(within.end());
        Span::between(start - within.start, end.saturating_sub(within.start))
    }
}
