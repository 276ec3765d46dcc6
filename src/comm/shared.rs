//! Whole tensors that worker threads of one process use together: rank 0 gathers one copy for
//! all of them and lends it, the others see it through views ([`Buffer::views`]). Held in a
//! [`Shared`], which never frees memory that another rank may still read.

use super::Buffer;

/// Whole tensors from [`super::Communicator::all_gather_shared`], held in a container `C` (the
/// gathered `Vec`, or a layer's weights built from it), given back with
/// [`super::Communicator::release_shared`]. They are this rank's own copies; or, between
/// worker threads sharing memory, rank 0's one copy, lent to the other ranks, which hold views
/// of it. Rank 0 frees its copy only once every other rank has given its views back; dropped
/// without that (a failing job), a lent copy and the views are let go of unfreed
/// ([`Buffer::forget`]), so no rank's queued read of them meets freed memory.
pub struct Shared<C, T: Buffer> {
    whole: Option<C>,
    /// Takes `C` apart into its tensors, for release or for letting go of them.
    split: fn(C) -> Vec<T>,
    role: Role,
}

/// Whose memory a [`Shared`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// This rank's own copies: freed when done.
    Own,
    /// Rank 0's copies, lent to the other ranks: freed once they have given them back.
    Lender,
    /// Views of rank 0's copies: never freed here.
    Views,
}

impl<T: Buffer> Shared<Vec<T>, T> {
    /// Gathered tensors held as `role` says.
    pub(super) fn new(whole: Vec<T>, role: Role) -> Self {
        Shared {
            whole: Some(whole),
            split: |v| v,
            role,
        }
    }

    /// The tensors and whose memory they are, for [`super::Communicator::release_shared`],
    /// which must free, keep or forget them as `role` says.
    pub(super) fn into_parts(mut self) -> (Vec<T>, Role) {
        let whole = self.whole.take().expect("held until taken apart");
        (whole, self.role)
    }
}

impl<C, T: Buffer> Shared<C, T> {
    /// The tensors, for the one use they were gathered for.
    pub fn get(&self) -> &C {
        self.whole.as_ref().expect("held until taken apart")
    }

    /// The same tensors in another container: `build` makes it from `C` (it must not drop any
    /// tensor), `split` takes it apart again.
    pub fn map<D>(mut self, build: impl FnOnce(C) -> D, split: fn(D) -> Vec<T>) -> Shared<D, T> {
        let whole = self.whole.take().expect("held until taken apart");
        Shared {
            whole: Some(build(whole)),
            split,
            role: self.role,
        }
    }
}

impl<C, T: Buffer> Drop for Shared<C, T> {
    fn drop(&mut self) {
        let Some(whole) = self.whole.take() else {
            return;
        };
        let tensors = (self.split)(whole);
        if self.role == Role::Own {
            return drop(tensors);
        }
        for t in tensors {
            t.forget();
        }
    }
}
