//! What kind of failure an error is, for callers that must tell them apart: the Python binding
//! raises `ValueError`, `MemoryError`, `TimeoutError` or `RuntimeError` by it, where a sentence
//! alone would leave it guessing from the text.
//!
//! The library keeps `anyhow::Result` and `?` everywhere: an error is marked with its kind where
//! it is made ([`Error::invalid_input`] and its siblings, or [`ErrorKind::mark`] for an error
//! made elsewhere), travels as any `anyhow::Error` through the context callers add, and
//! [`kind_of`] finds the kind again anywhere in the chain. An error nobody marked has no kind.
//! The message is the sentence as it always was: marking changes no text.
//!
//! A leaf: it imports nothing of the crate, so any module may mark its errors.

use std::fmt;

/// What went wrong, as far as a caller deciding what to do about it cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input is wrong (shapes, lengths, masks, addresses, settings): fix the call.
    InvalidInput,
    /// A device or this machine lacks the memory the work needs.
    OutOfMemory,
    /// A peer did not answer in time.
    Timeout,
    /// The GPU or its driver is missing or failed.
    Device,
}

/// An error of a known kind: its sentence and the kind [`kind_of`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An [`ErrorKind::InvalidInput`] error saying `message`.
    pub fn invalid_input(message: impl Into<String>) -> anyhow::Error {
        ErrorKind::InvalidInput.error(message)
    }

    /// An [`ErrorKind::OutOfMemory`] error saying `message`.
    pub fn out_of_memory(message: impl Into<String>) -> anyhow::Error {
        ErrorKind::OutOfMemory.error(message)
    }

    /// An [`ErrorKind::Timeout`] error saying `message`.
    pub fn timeout(message: impl Into<String>) -> anyhow::Error {
        ErrorKind::Timeout.error(message)
    }

    /// An [`ErrorKind::Device`] error saying `message`.
    pub fn device(message: impl Into<String>) -> anyhow::Error {
        ErrorKind::Device.error(message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl ErrorKind {
    /// An error of this kind saying `message`.
    pub fn error(self, message: impl Into<String>) -> anyhow::Error {
        Error {
            kind: self,
            message: message.into(),
        }
        .into()
    }

    /// `e` as an error of this kind, its whole text (`{e:#}`: every context with its cause)
    /// kept as the message: for an error made by code that does not know what it means to
    /// the caller, marked by the code that does.
    pub fn mark(self, e: anyhow::Error) -> anyhow::Error {
        self.error(format!("{e:#}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The kind of `e`: the first marked error in its chain (the outermost), through any context
/// added since; `None` where nothing marked it.
pub fn kind_of(e: &anyhow::Error) -> Option<ErrorKind> {
    e.chain()
        .find_map(|cause| cause.downcast_ref::<Error>())
        .map(Error::kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_marked_error_says_its_sentence_unchanged() {
        let e = Error::invalid_input("the sequence is empty; pass at least one token");
        assert_eq!(
            e.to_string(),
            "the sequence is empty; pass at least one token"
        );
        assert_eq!(
            format!("{e:#}"),
            "the sequence is empty; pass at least one token"
        );
        assert_eq!(kind_of(&e), Some(ErrorKind::InvalidInput));
        let inner = e.downcast_ref::<Error>().expect("an Error inside");
        assert_eq!(inner.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            inner.message(),
            "the sequence is empty; pass at least one token"
        );
    }

    #[test]
    fn each_constructor_gives_its_kind() {
        assert_eq!(
            kind_of(&Error::invalid_input("x")),
            Some(ErrorKind::InvalidInput)
        );
        assert_eq!(
            kind_of(&Error::out_of_memory("x")),
            Some(ErrorKind::OutOfMemory)
        );
        assert_eq!(kind_of(&Error::timeout("x")), Some(ErrorKind::Timeout));
        assert_eq!(kind_of(&Error::device("x")), Some(ErrorKind::Device));
    }

    #[test]
    fn the_kind_is_found_through_added_context() {
        let e = Error::timeout("worker 0 waited 1 s")
            .context("the forward")
            .context("worker 0 failed");
        assert_eq!(kind_of(&e), Some(ErrorKind::Timeout));
        assert_eq!(
            format!("{e:#}"),
            "worker 0 failed: the forward: worker 0 waited 1 s"
        );
        let from_result: anyhow::Result<()> = Err(Error::device("no CUDA driver found"));
        let e = from_result.context("opening GPU 0").unwrap_err();
        assert_eq!(kind_of(&e), Some(ErrorKind::Device));
    }

    #[test]
    fn an_unmarked_error_has_no_kind() {
        let e = anyhow::anyhow!("something else").context("while doing it");
        assert_eq!(kind_of(&e), None);
    }

    #[test]
    fn marking_keeps_the_whole_text_and_sets_the_kind() {
        let e = anyhow::anyhow!("7 GiB free").context("the step would not fit");
        let marked = ErrorKind::OutOfMemory.mark(e);
        assert_eq!(marked.to_string(), "the step would not fit: 7 GiB free");
        assert_eq!(kind_of(&marked), Some(ErrorKind::OutOfMemory));
        // Marking again names the kind the marking code knows.
        let remarked = ErrorKind::InvalidInput.mark(marked);
        assert_eq!(kind_of(&remarked), Some(ErrorKind::InvalidInput));
        assert_eq!(remarked.to_string(), "the step would not fit: 7 GiB free");
    }
}
