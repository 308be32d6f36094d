//! Errors the storage layer answers with, shared by the log and the journal (neither owns the other's).

/// Why an append failed. Nothing of a failed append is ever readable or acknowledged.
#[derive(Debug, Clone)]
pub enum AppendError {
    /// The write or sync failed; the text is the OS error.
    Io(String),
    /// The write failed for lack of space; rolled back, so a later append can succeed once space returns.
    NoSpace,
    /// A sync failed earlier: the page cache can no longer be trusted, so the log refuses appends until a restart
    /// rescans it from disk (never retry a failed fsync into a false success).
    Poisoned,
    /// The log is closing.
    Closed,
    /// The replica stopped leading while the append waited its turn to be written (a replicated partition
    /// deposed): it was not written, as a follower's log grows only by what its leader ships.
    NotLeading,
}
