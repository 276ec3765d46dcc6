//! The bytes of activations a forward holds for its backward, counted as layers hold and
//! release them.

/// Bytes of activations held for the backward: current and peak.
#[derive(Clone, Copy, Debug, Default)]
pub struct Meter {
    live: usize,
    pub peak: usize,
}

impl Meter {
    pub(crate) fn hold(&mut self, bytes: usize) {
        self.live += bytes;
        self.peak = self.peak.max(self.live);
    }

    pub(crate) fn release(&mut self, bytes: usize) {
        self.live -= bytes;
    }
}
